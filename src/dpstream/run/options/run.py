"""The clock, input, output, state and engine options of ``dpstream run``, and the
options of ``plan`` alone.

Layer 6 of dpstream (the command line's options, :mod:`dpstream.run.options`).
"""

from __future__ import annotations

from ...registry import CLAMP_DEFAULT, MONOTONE_DEFAULT
from .base import Opt, _finite_float, _positive_float, _positive_int, _share, _size, _unit_float

CLOCK_OPTS: tuple[Opt, ...] = (
    Opt(
        ("--step",),
        "step",
        "with --time-field: the width of a time step: s, m or min, h, "
        "d, w (e.g. 1h, 15min, 2h30m, 1w), or mo for calendar months (1mo: step t begins on "
        "--start's day and time, t - 1 months later; --start on day 1-28); 'M' is refused "
        "(minutes or months?)",
        None,
        str,
        metavar="DURATION",
    ),
    Opt(
        ("--start",),
        "start",
        "with --time-field: when step 1 begins (ISO-8601, e.g. "
        "2026-03-01T00:00Z, or epoch seconds; its UTC offset is the clock's time zone, or "
        "a named zone with daylight saving: 2026-03-01T00:00[Europe/Paris], where day, "
        "week and month steps begin at that wall-clock time); public, never read from the data",
        None,
        str,
        metavar="TIMESTAMP",
    ),
    Opt(
        ("--end",),
        "end",
        "with --start and --step: when the last step ends, instead of "
        "--horizon (T is the number of steps from --start to --end; --end must fall where a "
        "step ends; both given must agree)",
        None,
        str,
        metavar="TIMESTAMP",
        default_text="none: --horizon",
    ),
)

RUN_OPTS: tuple[Opt, ...] = (
    Opt(
        ("--key-file",),
        "key_file",
        "the secret noise key (create one with `dpstream keygen PATH`)",
        None,
        str,
        metavar="PATH",
        default_text="none, required",
    ),
    Opt(
        ("--noise-version",),
        "noise_version",
        "how Gaussian noise is drawn from the key: 2 "
        "(the ziggurat method) or 1 (the inverse CDF), only to go on with a stream that "
        "drew version 1 (dpstream 0.1; --engine spark of 0.2); the two give independent "
        "noise of the same distribution",
        None,
        int,
        choices=(1, 2),
        metavar="V",
        default_text="2 for a new run; a resumed run keeps the version it began with",
    ),
    Opt(
        ("--input", "-i"),
        "input",
        "events to read, '-' for stdin; *.gz is decompressed",
        "-",
        str,
        metavar="PATH",
    ),
    Opt(
        ("--input-format",),
        "input_format",
        "jsonl, csv or parquet (a file or a directory of *.parquet files, read in "
        "sorted order; see docs/operations.md); auto = csv for *.csv[.gz], parquet for "
        "*.parquet and a directory, else jsonl",
        "auto",
        str,
        choices=("auto", "jsonl", "csv", "parquet"),
    ),
    Opt(
        ("--item-column",),
        "item_column",
        "CSV input: the item column; Parquet: a list column of items (one row per event), "
        "or an item column (one row per item, with --event-column)",
        "item",
        str,
        default_text="item (Parquet: items, else item)",
    ),
    Opt(
        ("--event-column",),
        "event_column",
        "CSV (or Parquet, one row per item) input: the event-id column; an event is "
        "every row of one id in one time step, wherever the rows stand in the input (an id "
        "in two steps is two events)",
        "event",
        str,
    ),
    Opt(
        ("--time-column",),
        "time_column",
        "CSV or Parquet input: the time-step column (integers)",
        None,
        str,
        default_text="none; CSV input needs it, or --time-field for timestamps; Parquet: t",
    ),
    Opt(
        ("--implicit-time",),
        "implicit_time",
        "JSON Lines without time steps: every line "
        "is a step of its own, blank and broken lines too (then the guarantee hides what a "
        "line holds, not whether it exists; not for a stream that goes on over several runs)",
        False,
        kind="flag",
    ),
    Opt(
        ("--time-field",),
        "time_field",
        "the JSON field (or CSV or Parquet column) holding each "
        "event's timestamp, ISO-8601 or epoch seconds: steps then come from the public "
        'clock --start/--step, not from "t"',
        None,
        str,
        metavar="NAME",
    ),
    *CLOCK_OPTS,
    Opt(
        ("--follow",),
        "follow",
        "with --time-field: follow a growing --input (like tail -f; "
        "stdin until it closes) and release each step when the clock has passed its end "
        "(plus --lateness), with events or without; an event for a step already released "
        "is late (see --on-invalid)",
        False,
        kind="flag",
    ),
    Opt(
        ("--lateness",),
        "lateness",
        "with --follow: how long after a step's end its events may still arrive, e.g. 5m",
        None,
        str,
        metavar="DURATION",
        default_text="0s",
    ),
    Opt(
        ("--output", "-o"),
        "output",
        "where to write the releases, '-' for stdout "
        "(exactly-once with --state needs a file; not compressed, and not the input, key, "
        "domain, config or state file; for a table, prefer .parquet to .csv: see "
        "--output-format)",
        "-",
        str,
        metavar="PATH",
    ),
    Opt(
        ("--output-format",),
        "output_format",
        "jsonl (one line per step), or a long "
        "table with one row per released item per step and the columns t, item, value, "
        "noise_std (and step_start, step_end, ISO-8601, with --start/--step): csv, jsonl-long or "
        "parquet (needs pyarrow; not with --state); auto = by the --output suffix (.csv, "
        ".parquet), else jsonl. In csv, a step that releases no item is a row with an empty "
        "item, and pandas' read_csv also reads items named NA, null or None as empty (NaN): "
        "prefer parquet, or read with keep_default_na=False, na_values=['']",
        "auto",
        str,
        choices=("auto", "jsonl", "csv", "jsonl-long", "parquet"),
    ),
    Opt(
        ("--top",),
        "top",
        "write only the N largest released counts of each step "
        "(post-processing of the release: free; e.g. for a large known domain)",
        None,
        _positive_int,
        metavar="N",
        default_text="all",
    ),
    Opt(
        ("--min-value",),
        "min_value",
        "write only the counts of at least this value "
        "(post-processing: free; e.g. 1 to leave out items the noise made small)",
        None,
        _finite_float,
        metavar="V",
        default_text="all",
    ),
    Opt(
        ("--round",),
        "round",
        "write counts rounded to integers (the default, and the safe "
        "choice: the low-order bits of floating-point noise can leak the true count; "
        "rounding is free post-processing); --no-round writes the exact floats",
        True,
        kind="bool",
    ),
    Opt(
        ("--clamp",),
        "clamp",
        "publish a count below 0 as 0 (post-processing; see docs/utility.md for its bias)",
        CLAMP_DEFAULT,
        kind="bool",
    ),
    Opt(
        ("--monotone",),
        "monotone",
        "never publish a count below the last one published for "
        "the same item: running counts do not go down (post-processing; see docs/utility.md "
        "for its bias)",
        MONOTONE_DEFAULT,
        kind="bool",
    ),
    Opt(
        ("--on-invalid",),
        "on_invalid",
        "what to do with an event with more than --max-items items, an item outside "
        "--domain, a malformed line or a step past --until/--horizon: skip (drop the event, "
        "count it in the summary; the releases stay on the public clock), truncate (keep "
        "--max-items items chosen by the keyed PRF, drop items outside the domain; skip what "
        "cannot be truncated) or error (a batch run writes nothing and names the record; "
        "--follow stops at it: the output then ends where the bad event was, which "
        "publishing it would reveal)",
        "skip",
        str,
        choices=("error", "truncate", "skip"),
    ),
    Opt(
        ("--max-invalid",),
        "max_invalid",
        "a batch run writes nothing and exits with an "
        "error when more than this share of its input records are invalid (a missing time "
        "field, a --step typo, a wrong --domain...), counted before the first release: a "
        "share from 0 to 1 or a percentage (0.05 or 5%; 0: no invalid record, 1: no limit); "
        "a decision on the raw data, for the operator (docs/privacy.md)",
        "0.05",
        _share,
        metavar="SHARE",
    ),
    Opt(
        ("--allow-empty",),
        "allow_empty",
        "release the steps up to --until although the input holds no record for them "
        "(an empty file, or records all for later steps): refused by default, as most "
        "often a failed export or another day's file (the steps, released with no "
        "events, could never count their events later); give it when they truly had none",
        False,
        kind="flag",
    ),
    Opt(
        ("--verbose-errors",),
        "verbose_errors",
        "let error messages quote the offending "
        "record's content (items are private data: off by default)",
        False,
        kind="flag",
    ),
    Opt(
        ("--until",),
        "until",
        "the last time step this run releases (a public end step, "
        "for a stream that is still going: run again with the same --state and a later "
        "--until to go on); every step up to it is released, with events or without",
        None,
        _positive_int,
        metavar="N",
        default_text="--horizon",
    ),
    Opt(
        ("--overwrite",),
        "overwrite",
        "replace an --output that already holds releases (a run of the same key and "
        "settings that the release ledger records is still refused: --force speaks for "
        "that)",
        False,
        kind="flag",
    ),
    Opt(
        ("--force",),
        "force",
        "start a new run even though the release ledger records a run of the same key "
        "and settings: your statement that the earlier release was never published (the "
        "same noise on other data publishes the difference; what was published still "
        "counts against the budget); replaces --output too",
        False,
        kind="flag",
    ),
    Opt(
        ("--allow-readable-key",),
        "allow_readable_key",
        "use a --key-file that other users "
        "can read (refused by default: anyone who reads the key can remove the noise)",
        False,
        kind="flag",
    ),
    Opt(
        ("--replace-unfinished",),
        "replace_unfinished",
        "with --state: go on although the stream's last run, reading another input, "
        "stopped before it released a step (killed while reading): its events are then "
        "never counted (refused by default: run that input first); or finish a run "
        "that stopped after some steps from a corrected input (those steps checked "
        "against it)",
        False,
        kind="flag",
    ),
    Opt(
        ("--allow-readable-state",),
        "allow_readable_state",
        "use a --state file that other "
        "users can read (refused by default: the state is as private as the input)",
        False,
        kind="flag",
    ),
    Opt(
        ("--state",),
        "state",
        "SQLite checkpoint: commit every step, resume after a crash, "
        "refuse another key or parameters",
        None,
        str,
        metavar="FILE.sqlite",
    ),
    Opt(
        ("--ledger",),
        "ledger",
        "the release ledger: an append-only record of every run's "
        "noise scope (a new run of the same key and settings is refused) and, with --state, "
        "of every step each run released, checked and extended at every step, so that a "
        "state restored from a backup cannot release a step again from other input; keep it "
        "on storage that is never rolled back (docs/operations.md)",
        None,
        str,
        metavar="PATH",
        default_text="KEY-FILE.ledger, beside the file --key-file resolves to",
    ),
    Opt(
        ("--dataset",),
        "dataset",
        "the name of the data this run releases from: every run on one dataset (any "
        "stream, any mechanism) adds to one privacy budget, recorded in the release "
        "ledger before the first release; `dpstream budget` prints the totals",
        None,
        str,
        metavar="NAME",
        default_text="the input's file or directory name",
    ),
    Opt(
        ("--budget-cap",),
        "budget_cap",
        "the most epsilon the dataset may spend in all (at --budget-cap-delta): a run "
        "that would take the dataset's total past it is refused before anything is "
        "released; needs --dataset",
        None,
        _positive_float,
        metavar="EPSILON",
        default_text="no cap",
    ),
    Opt(
        ("--budget-cap-delta",),
        "budget_cap_delta",
        "the delta of --budget-cap",
        1e-6,
        _unit_float,
        metavar="DELTA",
    ),
    Opt(
        ("--fsync",),
        "fsync",
        "with --state, fsync the output and the state at every step: "
        "durable against power loss, but it costs about 8 ms per step on a typical disk "
        "(a 10,000-step run spends over a minute in fsync). --no-fsync is still safe "
        "against a killed process (kill -9, out of memory, Ctrl-C): use it when power loss "
        "or an OS crash is not the concern",
        True,
        kind="bool",
    ),
    Opt(
        ("--quiet", "-q"),
        "quiet",
        "no progress and no summary on stderr (warnings and errors only)",
        False,
        kind="flag",
    ),
    Opt(
        ("--log-format",),
        "log_format",
        "stderr lines as text or as one JSON object per line (for log collectors)",
        "text",
        str,
        choices=("text", "json"),
    ),
    Opt(
        ("--progress-every",),
        "progress_every",
        "when stderr is not a terminal, log a "
        "progress line (step, events/s, time left) every this many seconds",
        10.0,
        _positive_float,
        metavar="SECONDS",
    ),
    Opt(
        ("--memory",),
        "memory",
        "a batch run folds its input into each step's counts as it reads it; past this "
        "many bytes of counts (e.g. 512M, 2G) it writes them to a temporary file (in a "
        "private directory under TMPDIR, removed when the run ends), so an input larger "
        "than memory still runs; --follow holds the records of steps not yet due within "
        "it the same way",
        None,
        _size,
        metavar="SIZE",
        default_text="512M",
    ),
    Opt(
        ("--engine",),
        "engine",
        "local (NumPy, one machine) or spark (PySpark, the "
        "`dpstream[spark]` extra; known and unknown mechanisms; see docs/spark.md)",
        "local",
        str,
        choices=("local", "spark"),
    ),
    Opt(("--master",), "master", "Spark master URL (with --engine spark)", "local[*]", str),
    Opt(
        ("--view",),
        "view",
        "serve a live web page of the releases while the run writes "
        "them (needs --output FILE.jsonl; the address is printed; after the run the page "
        "stays until Ctrl-C; see `dpstream view`)",
        False,
        kind="flag",
    ),
)

PLAN_OPTS: tuple[Opt, ...] = (
    *CLOCK_OPTS,
    Opt(
        ("--key-file",),
        "key_file",
        "with --dataset: the noise key whose release ledger says what the dataset has "
        "spent (the plan shows its total with this run, against --budget-cap)",
        None,
        str,
        metavar="PATH",
    ),
    *(o for o in RUN_OPTS if o.dest in ("ledger", "dataset", "budget_cap", "budget_cap_delta")),
    Opt(
        ("--domain-size",),
        "domain_size",
        "size of the known domain when --domain is not given (placeholder items are used)",
        None,
        _positive_int,
        metavar="D",
    ),
    Opt(
        ("--target-error",),
        "target_error",
        "give the budget needed for this half-width "
        "of a 95% interval of a count at the worst step (instead of a budget)",
        None,
        _positive_float,
        metavar="E",
    ),
    Opt(("--json",), "json", "print the plan as JSON", False, kind="flag"),
    Opt(
        ("--explain",),
        "explain",
        "also say where each number comes from, with the paper's "
        "algorithms, theorems and equations",
        False,
        kind="flag",
    ),
)
