"""The run's config: one frozen object built from the flags, the TOML file and the
defaults, every problem of the settings reported at once, shared by ``run`` and
``plan``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dpstream.cli import build_parser
from dpstream.run.checks import SettingsError
from dpstream.run.config import RunConfig
from dpstream.run.options import MECH_OPTS, PLAN_OPTS, RUN_OPTS


def _config(argv: list[str], command: str = "run") -> RunConfig:
    return RunConfig.from_args(build_parser().parse_args([command, *argv]), command=command)


def test_every_problem_of_the_flags_and_the_toml_file_is_reported_at_once(tmp_path):
    """Problems that come from the TOML file (a mechanism that needs --max-items, a
    stream name with '~') and from the flags (no budget, no key) are one error."""
    toml = tmp_path / "run.toml"
    toml.write_text('mechanism = "unknown"\nstream = "a~b"\nhorizon = 5\n')
    with pytest.raises(SettingsError) as err:
        _config(["--config", str(toml), "-T", "10", "--user-field", "user"])
    assert err.value.problems == [
        "give a privacy budget: --epsilon E --delta D, or --rho R (or --tau for the noise "
        "scale itself)",
        "--mechanism unknown needs --max-items N (the most items an event holds)",
        "--user-field needs --max-items-per-user and --max-count-per-item (how much of the "
        "stream one user may contribute)",
        "--stream 'a~b': a stream name may not contain '~' (the run adds it, with a tag of "
        "the input settings)",
        "no key: pass --key-file PATH (create one with `dpstream keygen PATH`; keep it secret)",
    ]


def test_flags_override_the_toml_file_which_overrides_the_defaults(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(
        'horizon = 5\nmax-items = 3\nthreshold-delta = 1e-6\n[run]\nrho = 0.5\nkey-file = "k.key"\n'
    )
    cfg = _config(["--config", str(toml), "-m", "unknown", "-T", "10"])
    # a relative path of the file is relative to the file's folder
    assert (cfg.horizon, cfg.max_items, cfg.rho) == (10, 3, 0.5)
    assert cfg.key_file == str(tmp_path / "k.key")
    assert cfg.threshold_delta == 1e-6
    assert (cfg.mechanism, cfg.stream, cfg.on_invalid, cfg.clamp) == (
        "unknown",
        "default",
        "skip",
        True,
    )
    assert cfg.config_file == str(toml) and cfg.last_step == 10 and cfg.clock is None
    # every option of the table is a field, with the table's default when nothing sets it
    for opt in MECH_OPTS + RUN_OPTS:
        assert opt.dest in cfg.options()
        if opt.dest not in (
            "horizon",
            "max_items",
            "rho",
            "key_file",
            "mechanism",
            "threshold_delta",
        ):
            assert cfg.options()[opt.dest] == opt.default, opt.dest
    assert set(cfg.options()) == {o.dest for o in MECH_OPTS + RUN_OPTS}


def test_the_config_is_frozen_and_changes_make_a_copy(tmp_path):
    cfg = _config(["-m", "unknown", "-T", "10", "--max-items", "2", "--epsilon", "1",
                   "--delta", "1e-6", "--key-file", "k.key"])  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.horizon = 20  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.options()["horizon"] = 20  # type: ignore[index]
    later = cfg.with_options(noise_version=2, base=8)
    assert (cfg.noise_version, cfg.base) == (None, None)
    assert (later.noise_version, later.base, later.horizon) == (2, 8, 10)
    assert later.options()["base"] == 8


def test_plan_builds_the_same_object_from_a_config_written_for_run(tmp_path):
    """``plan`` reads a TOML file written for ``run`` (its run options ignored) into the
    same RunConfig, with the plan's options instead of the run's."""
    toml = tmp_path / "run.toml"
    toml.write_text(
        'mechanism = "unknown"\nmax-items = 2\nthreshold-delta = 1e-6\nkey-file = "k"\nuntil = 3\n'
    )
    cfg = _config(["--config", str(toml), "-T", "10", "--rho", "1", "--json"], "plan")
    assert isinstance(cfg, RunConfig) and cfg.command == "plan"
    # --key-file is a plan option too (with --dataset: the dataset's budget); --until is not
    assert (cfg.mechanism, cfg.max_items, cfg.json, cfg.key_file, cfg.until) == (
        "unknown", 2, True, str(tmp_path / "k"), None,
    )  # fmt: skip
    assert set(cfg.options()) == {o.dest for o in MECH_OPTS + PLAN_OPTS}
    with pytest.raises(SettingsError) as err:  # the same check as run's
        _config(["-m", "unknown", "-T", "10", "--rho", "1"], "plan")
    assert err.value.problems == [
        "--mechanism unknown needs --max-items N (the most items an event holds)",
        "--mechanism unknown with --rho needs --threshold-delta D (the delta of the "
        "threshold that hides rare items)",
    ]


def test_a_time_mode_that_lets_the_data_move_steps_is_refused_when_built():
    with pytest.raises(ValueError, match="two ways to give steps"):
        _config(["-m", "unknown", "-T", "10", "--max-items", "2", "--rho", "1",
                 "--threshold-delta", "1e-6", "--key-file", "k", "--implicit-time",
                 "--time-field", "ts", "--step", "1h", "--start", "2026-01-01T00:00Z"])  # fmt: skip


def test_follow_without_the_public_clock_is_refused_when_built():
    """Refused with the config, before the state, the output or the ledger is made (the
    run refused it only once it had made them)."""
    base = ["-m", "unknown", "-T", "10", "--max-items", "2", "--rho", "1",
            "--threshold-delta", "1e-6", "--key-file", "k", "--follow"]  # fmt: skip
    with pytest.raises(ValueError, match="--follow needs the public clock"):
        _config(base)
    with pytest.raises(ValueError, match="--follow reads JSON Lines"):
        _config([*base, "-i", "ev.csv", "--time-field", "ts", "--step", "1h",
                 "--start", "2026-01-01T00:00Z"])  # fmt: skip


def test_follow_of_a_stream_with_no_planned_end_is_built():
    """Review 83: `--follow` without --horizon or --until was refused for every --step
    ("step 1099511627776 ... would end past the year 9999"): the check took the no-end
    limit as the last step. A followed step falls due on the wall clock, so none past
    the year 9999 ever comes; a run that names its end is still checked."""
    base = ["-m", "unknown", "--max-items", "2", "--epsilon", "1", "--delta", "1e-6",
            "--key-file", "k", "-i", "ev.jsonl", "-o", "r.jsonl", "--state", "s.sqlite",
            "--time-field", "ts", "--step", "1h", "--start", "2026-03-01T00:00Z"]  # fmt: skip
    cfg = _config([*base, "--follow"])
    assert cfg.follow and cfg.horizon is None
    with pytest.raises(ValueError, match="past the year 9999"):
        _config([*base, "--follow", "--until", str(2**39)])


def test_min_value_must_be_a_finite_number(capsys):
    for bad in ("nan", "inf", "-inf"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", f"--min-value={bad}"])
        assert "expected a finite number" in capsys.readouterr().err
    assert build_parser().parse_args(["run", "--min-value=-2.5"]).min_value == -2.5


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (
            "budgetcap = 1.5",
            r"^config file: unknown option 'budgetcap' \(did you mean 'budget-cap'\?\)$",
        ),
        ("foo = 1", r"^config file: unknown option 'foo'$"),
        (
            'force = "false"',
            r"^config file: --force must be true or false \(a bool, not text\), got 'false'$",
        ),
        ('top = "2"', "^config file: --top must be a number, not text, got '2'$"),
        ('eta = "auto"', None),
        ("noise-version = 2.5", "^config file: --noise-version: invalid literal for int"),
    ],
)
def test_a_config_files_values_are_checked_as_release_frames(tmp_path, line, match):
    """One check for a config file's values and release_frame's keywords (the same
    words, the name as written): a number given as text is refused in both."""
    toml = tmp_path / "run.toml"
    toml.write_text(
        'mechanism = "unknown"\nhorizon = 5\nmax-items = 2\nthreshold-delta = 1e-6\n'
        f'key-file = "k.key"\nrho = 1\n{line}\n'
    )
    if match is None:
        assert _config(["--config", str(toml)]).eta == "auto"
        return
    with pytest.raises(ValueError, match=match):
        _config(["--config", str(toml)])


@pytest.mark.parametrize(
    "text,match",
    [
        (
            "max-items = 2\nmax_items = 50\n",
            r"sets 'max_items' twice \('max-items' and 'max_items'\)",
        ),
        ("rho = 1\n[run]\nrho = 5\n", r"sets 'rho' twice \('rho' and 'rho' in \[run\]\)"),
        ('domain = ["a", true]\n', "an item must be a string or an integer, got true"),
        ('domain = ["a", 1.5]\n', "an item must be a string or an integer, got 1.5"),
        ('domain = ["a", ["b"]]\n', "an item must be a string or an integer"),
        ('domain = ["a", "a"]\n', "lists 'a' twice"),
        ("x = '" + "y" * (16 << 20) + "'\n", "larger than 16 MB"),
    ],
)
def test_a_config_file_that_says_one_thing_twice_or_a_domain_of_non_items_is_refused(
    tmp_path, text, match
):
    """Review 90: both spellings of a key were taken (the later one won), [run] silently
    overrode the top, and an inline domain made items of true, 1.5 and ["a"] (a domain
    file refuses them); a file as large as a device was read whole."""
    toml = tmp_path / "run.toml"
    toml.write_text('mechanism = "known"\nhorizon = 5\nkey-file = "k.key"\n' + text)
    with pytest.raises(ValueError, match=match):
        cfg = _config(["--config", str(toml), "--rho", "1", "--max-items", "2"])
        from dpstream.run.options.merge import domain_option

        domain_option({"domain": cfg.domain})


def test_every_option_of_a_number_is_known_as_one():
    """An option's parser is a number's (text refused in a config file or a keyword)
    or a text's: a new number parser must join NUMBER_TYPES."""
    from dpstream.run.options.base import NUMBER_TYPES, _share, _size

    for opt in MECH_OPTS + RUN_OPTS + PLAN_OPTS:
        assert opt.type in (None, str, _share, _size) or opt.type in NUMBER_TYPES, opt.dest


def test_numpy_settings_keep_their_values() -> None:
    """A NumPy number is checked as the number it is (review 75): np.float32(0.1) is the
    float64 0.10000000149... a caller passing it got before the settings were checked,
    not 0.1 (its str); a NumPy int is an int and a NumPy bool a flag."""
    np = pytest.importorskip("numpy")
    from dpstream.run.options import MECH_OPTS, RUN_OPTS
    from dpstream.run.options.merge import check_values

    got = check_values(
        {"epsilon": np.float32(0.1), "top": np.int64(3), "force": np.True_},
        [*MECH_OPTS, *RUN_OPTS],
        where="release_frame",
        keywords=True,
    )
    assert got["epsilon"] == float(np.float32(0.1)) != 0.1
    assert got["top"] == 3 and type(got["top"]) is int
    assert got["force"] is True


@pytest.mark.parametrize(
    "clock, message",
    [
        (["--step", "1M", "--start", "2026-01-01"], "ambiguous"),
        (["--start", "2026-01-31", "--step", "1mo"], "day 1 to 28"),
        (["--step", "2x", "--start", "2026-01-01"], "a duration is written like"),
        (["--start", "2026-01-01"], "go together"),
    ],
)
def test_plan_refuses_the_clock_a_run_refuses(clock, message):
    """Review 83: `plan` accepted a --step or --start that `run` refuses (the docs say a
    plan is only for what a run accepts); only --end made it parse them."""
    base = ["-m", "unknown", "--max-items", "2", "--epsilon", "1", "--delta", "1e-6",
            "--horizon", "12"]  # fmt: skip
    with pytest.raises(ValueError, match=message):
        _config([*base, *clock], command="plan")
    assert _config([*base, "--start", "2026-01-01", "--step", "1h"], command="plan").horizon == 12


def test_a_device_as_the_config_or_the_domain_is_refused() -> None:
    """Review 90: --config /dev/zero or --domain /dev/zero were read whole (a MemoryError
    traceback, or all the memory); a character device is refused by what it is."""
    from dpstream.io import read_domain
    from dpstream.run.options.merge import load_config

    with pytest.raises(ValueError, match="is a device, not a TOML file"):
        load_config("/dev/zero")
    with pytest.raises(ValueError, match="is a device, not a file of items"):
        read_domain("/dev/zero")


def test_a_config_files_relative_paths_are_relative_to_its_folder(tmp_path, monkeypatch):
    """Review 102: a cron job started in another folder than the config file's resolved
    its relative paths there, made a new state, output and ledger, and released the
    stream's first steps again under the same noise. Absolute paths, stdin/stdout and
    URIs (a Spark output) are kept as they are."""
    conf = tmp_path / "conf"
    conf.mkdir()
    toml = conf / "stream.toml"
    toml.write_text(
        'key-file = "keys/k.key"\nstate = "s.sqlite"\noutput = "hdfs://nn/out"\n'
        'ledger = "../shared/led"\ninput = "-"\ndomain = "/etc/dom.txt"\n'
    )
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    flags = ["-m", "known", "--max-items", "1", "-T", "4", "--rho", "1"]
    cfg = _config(["--config", "../conf/stream.toml", *flags])
    assert cfg.key_file == str(conf / "keys" / "k.key")
    assert cfg.state == str(conf / "s.sqlite")
    assert cfg.ledger == str(conf / "../shared/led")
    assert (cfg.output, cfg.input, cfg.domain) == ("hdfs://nn/out", "-", "/etc/dom.txt")
    toml.write_text('input = "file:/data/ev.jsonl"\nkey-file = "k"\ndomain = "/d"\n')  # a URI
    assert _config(["--config", str(toml), *flags]).input == "file:/data/ev.jsonl"
    # a flag's relative path is the shell's, as always
    cfg = _config(["--config", str(toml), *flags, "--state", "x"])
    assert cfg.state == "x"


@pytest.mark.parametrize("flag", ["force", "replace-unfinished"])
def test_a_flag_that_speaks_for_one_run_is_refused_in_a_config_file(tmp_path, flag):
    """Review 102: `force = true` in a config file made every run of it reuse the noise
    over other data with a warning; it is the operator's word about one run."""
    toml = tmp_path / "run.toml"
    base = 'mechanism = "unknown"\nhorizon = 5\nmax-items = 2\nthreshold-delta = 1e-6\n'
    base += 'key-file = "k.key"\nrho = 1\n'
    toml.write_text(f"{base}{flag} = true\n")
    with pytest.raises(ValueError, match=f"sets '{flag}': it speaks for one run only"):
        _config(["--config", str(toml)])
    toml.write_text(f"{base}{flag} = false\n")  # the default, said: harmless
    assert not getattr(_config(["--config", str(toml)]), flag.replace("-", "_"))


#: What a run is told for each CSV or Parquet column option given with JSON Lines input.
JSONL_COLUMN_PROBLEMS = {
    "--item-column": (
        "--item-column does not apply to JSON Lines input: an event's items are its "
        '"items" field (drop --item-column, or give the input as CSV or Parquet)'
    ),
    "--event-column": (
        "--event-column does not apply to JSON Lines input: each line is one event "
        "(drop --event-column, or give the input as CSV or Parquet)"
    ),
    "--time-column": (
        "--time-column does not apply to JSON Lines input: an event's time step is its "
        '"t" field (drop --time-column; for timestamps in another field, --time-field '
        "with --step and --start)"
    ),
}


def test_csv_and_parquet_column_options_are_refused_with_json_lines_input(tmp_path):
    """Attack 08: --item-column, --time-column and --event-column were ignored with JSON
    Lines input (the run counted "items" in the steps of "t", exit 0, while the operator
    meant other fields). Each is refused, given as a flag or in the config file, even
    with the default's value; with CSV and Parquet input they are read as before."""
    base = ["-m", "known", "--domain", "d.txt", "-T", "2", "--max-items", "1",
            "--rho", "1", "--key-file", "k"]  # fmt: skip
    flags = ["--item-column", "category", "--event-column", "item", "--time-column", "hour"]
    for src in ("ev.jsonl", "ev.jsonl.gz", "-"):
        with pytest.raises(SettingsError) as err:
            _config([*base, "-i", src, *flags])
        assert err.value.problems == list(JSONL_COLUMN_PROBLEMS.values())
    for flag, problem in JSONL_COLUMN_PROBLEMS.items():
        default = "item" if flag == "--item-column" else "event"  # their defaults' values
        with pytest.raises(SettingsError) as err:
            _config([*base, "-i", "ev.jsonl", flag, default])
        assert err.value.problems == [problem]
        with pytest.raises(SettingsError) as err:  # --input-format says JSON Lines
            _config([*base, "-i", "ev.csv", "--input-format", "jsonl", flag, default])
        assert err.value.problems == [problem]
    toml = tmp_path / "run.toml"
    toml.write_text('[run]\nitem-column = "category"\n')
    with pytest.raises(SettingsError) as err:
        _config([*base, "-i", "ev.jsonl", "--config", str(toml)])
    assert err.value.problems == [JSONL_COLUMN_PROBLEMS["--item-column"]]
    # JSON Lines without them, and CSV and Parquet with them, are built as before
    assert _config([*base, "-i", "ev.jsonl"]).item_column == "item"
    for src in ("ev.csv", "ev.parquet"):
        cfg = _config([*base, "-i", src, *flags])
        assert (cfg.item_column, cfg.event_column, cfg.time_column) == ("category", "item", "hour")


def test_a_column_option_with_json_lines_input_writes_nothing(tmp_path, capsys):
    """The refusal of attack 08 on the command line: a usage error (exit status 2) on
    one line, before the output, its sidecar or the ledger is made."""
    from dpstream.cli import main

    from .conftest import fixed_key

    key = tmp_path / "k.key"
    fixed_key("jsonl-columns").save(key)
    (tmp_path / "d.txt").write_text("a\nb\n")
    src = tmp_path / "ev.jsonl"
    src.write_text('{"items": ["a"], "category": ["b"], "t": 1, "hour": 2}\n')
    out = tmp_path / "rel.jsonl"
    argv = ["run", "-q", "-m", "known", "--domain", str(tmp_path / "d.txt"), "-T", "2",
            "--max-items", "1", "--tau", "0.0001", "--key-file", str(key), "-i", str(src),
            "-o", str(out), "--item-column", "category"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "dpstream: error: " + JSONL_COLUMN_PROBLEMS["--item-column"] + "\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.txt", "ev.jsonl", "k.key"]
    assert main(argv[:-2]) == 0  # without it, the run counts "items"
    assert json.loads(out.read_text().splitlines()[0])["released"] == {"a": 1, "b": 0}


def test_a_config_file_nested_too_deeply_is_one_line(tmp_path):
    """Review 103: arrays nested 5,000 deep ended in a RecursionError traceback."""
    toml = tmp_path / "deep.toml"
    toml.write_text("horizon = " + "[" * 5000 + "1" + "]" * 5000 + "\n")
    with pytest.raises(ValueError, match="nested too deeply to read"):
        _config(["--config", str(toml)])


@pytest.mark.parametrize("line", ["a" + ".a" * 20_000 + " = 1", "[" + "a." * 20_000 + "a]"])
def test_a_config_files_dotted_key_of_20000_parts_is_refused_before_it_is_read(tmp_path, line):
    """Review 103: tomllib reads a dotted key of n parts in time quadratic in n (20,000
    parts, 40 KB: 12 s); the line is refused before tomllib sees it. 1,000 dots pass."""
    toml = tmp_path / "dots.toml"
    toml.write_text(line + "\n")
    with pytest.raises(ValueError, match="line 1 holds more than 1000 dots"):
        _config(["--config", str(toml)])
    toml.write_text("a" + ".a" * 1000 + " = 1\n")  # read, then refused as no setting
    with pytest.raises(ValueError) as caught:
        _config(["--config", str(toml)])
    assert "dots" not in str(caught.value)
