"""Where ``dpstream run`` writes: the output file, checked, resumed and never overwritten.

Layer 6 of dpstream (the output of the sink stage, :mod:`dpstream.run.sink`):
refusing an output that is another file or already holds releases, positioning a
resumed output where its last step on record begins (after checking every
byte the state vouches for), closing it without hiding an error, and the formatter
of its releases (:func:`release_formatter`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from ..errors import StateError
from .lock import (
    check_target,
    local_path,
    lock_path,
    refuse_foreign_link,
    regular_or_new,
    same_file,
)

if TYPE_CHECKING:
    from ..mechanisms.protocol import ContinualMechanism
    from .config import RunConfig

__all__ = [
    "Resume",
    "ParquetFormatter",
    "check_new_output",
    "check_paths",
    "closing_quietly_on_error",
    "holds_release",
    "long_layout_clock",
    "open_output",
    "run_files",
    "release_formatter",
    "same_file",
]


class ParquetFormatter:
    """Hands each release to a Parquet writer; the byte output is unused."""

    name = "parquet"

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def header(self) -> bytes:
        return b""

    def format(self, release: Any) -> bytes:
        self.writer.write(release)
        return b""


#: Suffixes of compressed files: an output named so is refused (review 122: ``out.bz2``
#: was written uncompressed under a name that says otherwise).
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4", ".snappy", ".deflate")


def long_layout_clock(path: str, fmt: str) -> tuple[str, ...] | None:
    """The clock's columns (``step_start``, ``step_end``) of the long output (``csv``,
    ``jsonl-long``) at ``path`` that a stream began, or None when there is none to go
    on with (no such file, an empty one, another format). A stream that goes on keeps
    its file's layout, begun by a dpstream that wrote fewer of these columns, so the
    bytes the state vouches for stay the same."""
    if path == "-" or fmt not in ("csv", "jsonl-long") or not regular_or_new(path):
        return None
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 16).rstrip(b"\r\n")
    except OSError:
        return None
    if not first:
        return None
    if fmt == "csv":
        names = tuple(first.decode("utf-8", "replace").split(","))
    else:
        import json

        try:
            row = json.loads(first)
        except ValueError:
            return None
        names = tuple(row) if isinstance(row, dict) else ()
    if "noise_std" not in names:
        return None
    return tuple(n for n in ("step_start", "step_end") if n in names)


@dataclass
class Resume:
    """Where a resumed run picks up: the last step on record and its state in the output."""

    last_t: int = 0
    begin: int = 0  # where the last step's release starts in the output
    written: bytes = b""  # the bytes of it already in the output (maybe partial)


def open_output(
    path: str, resume: Resume | None, *, ckpt: Any, digests: Any, header: bytes, go_on: Any = None
) -> IO[bytes]:
    """The output as binary; on resume, checked and positioned where the last step starts.

    Before anything is changed, the header and the release of the step before
    the last one on record must be the bytes the state recorded (the file is
    the run's output, unchanged), and the file must not reach past the end of
    the last step's release (a file that holds only the start of the header, when
    the first step is the last on record, gets its header again: the run stopped
    before writing it); if it holds all of it, those bytes must be the
    recorded release too. The bytes of the last step already written are kept
    in ``resume.written``: the replay checks that they are a prefix of the
    recomputed release, and only then truncates the file there and writes the
    release again.
    """
    if path == "-":
        return sys.stdout.buffer
    check_target(path)  # its name still leads where the run's lock is
    if go_on is not None and go_on.continues:  # after the last step of an earlier run
        resume = Resume(last_t=go_on.t, begin=ckpt.step(go_on.t).begin)
        fh = open_output(path, resume, ckpt=ckpt, digests=digests, header=header)
        if len(resume.written) != go_on.offset - resume.begin:
            fh.close()
            raise StateError(
                f"output file {path!r} does not hold all of step {go_on.t}, "
                f"which {ckpt.path!r} records as written: refusing to go on"
            )
        fh.seek(go_on.offset)
        return fh
    if resume is None:
        return open(path, "wb")  # noqa: SIM115 - closed by the caller
    try:
        fh = open(path, "r+b")  # noqa: SIM115
    except FileNotFoundError:
        raise StateError(
            f"output file {path!r} is missing, but the state records "
            f"releases written to it (up to step {resume.last_t}): put it back (a copy "
            "of it, or the releases it held, byte for byte) and run again; the state "
            "checks its bytes"
        ) from None
    try:
        size = os.fstat(fh.fileno()).st_size
        last = ckpt.step(resume.last_t)
        fh.seek(0)
        bad = None
        head = fh.read(len(header))
        if head != header and size < len(header) == resume.begin and header.startswith(head):
            # stopped after the state recorded the first step, before the whole header
            # reached the file: nothing of a release is there, the header is written again
            fh.seek(0)
            fh.write(header)
            size = len(header)
        elif head != header:
            bad = "the header"
        elif not len(header) <= resume.begin <= size <= last.end:
            bad = f"the release of step {resume.last_t}"
        elif resume.last_t > 1:
            before = ckpt.step(resume.last_t - 1)
            fh.seek(before.begin)
            if (
                before.end != resume.begin
                or digests.release(fh.read(before.end - before.begin)) != before.release_mac
            ):
                bad = f"the release of step {resume.last_t - 1}"
        if bad is None:
            fh.seek(resume.begin)
            resume.written = fh.read(size - resume.begin)
            if size == last.end and digests.release(resume.written) != last.release_mac:
                bad = f"the release of step {resume.last_t}"
        if bad is not None:
            raise StateError(
                f"output file {path!r} does not hold {bad} that {ckpt.path!r} records as "
                "written: was it changed or replaced? refusing to resume"
            )
        fh.seek(resume.begin)
    except BaseException:
        fh.close()
        raise
    return fh


def holds_release(path: str, header: bytes) -> bool:
    """Whether output file ``path`` holds anything beyond the formatter's header (a pipe
    or a device holds nothing: reading one would wait for a writer)."""
    if not regular_or_new(path):
        return False
    try:
        with open(path, "rb") as fh:
            data = fh.read(len(header) + 1)
    except FileNotFoundError:
        return False
    return not (len(data) <= len(header) and header.startswith(data))


FileList = list[tuple[str, str | None]]

#: The role of a file SQLite writes, and deletes, beside the state (``STATE-wal``, ...).
STATE_SIDE = "--state's SQLite side file"


def run_files(cfg: RunConfig) -> tuple[FileList, FileList]:
    """A run's files besides its output, by option (None: not given): those it reads
    (input, key, domain, config) and those it records in (the state and the files
    SQLite writes beside it, the ledger: a text file, none beside it). No output may be
    one of them (:func:`check_paths`), nor may a Spark output directory that ``--force``
    replaces hold one (:mod:`dpstream.spark.output`)."""
    from ..ledger import ledger_path
    from ..state import side_files

    domain = cfg.domain
    reads = [
        ("--input", cfg.input if cfg.input != "-" else None),
        ("--key-file", cfg.key_file),
        ("--domain", domain if isinstance(domain, str) else None),
        ("--config", cfg.config_file),
    ]
    records: FileList = [("--state", cfg.state)]
    if cfg.state:
        records += [(STATE_SIDE, side) for side in side_files(cfg.state)]
    # (the registry's lock not waited for here: a run checks it again, waiting, once its
    # batch is marked as begun, so a kill during the wait leaves the mark; review 110)
    return reads, [*records, ("--ledger", ledger_path(cfg.options(), wait=False))]


def check_paths(cfg: RunConfig) -> None:
    """Refuse, before opening anything, an output, sidecar, state or ledger file that is
    another file.

    Writing the releases (or the sidecar) over the input, the key, the domain, the
    config, the state or the ledger file would destroy it (and a key overwritten with
    releases is lost for good); so would SQLite, which writes the state's side files
    (``STATE-wal``, ``STATE-shm``, ``STATE-journal``) and deletes them when it closes.
    """
    from .meta import sidecar_path

    output = cfg.output
    if cfg.engine == "local" and cfg.input != "-" and not os.path.exists(str(cfg.input)):
        # before the ledger: a missing input is not a replay of the stream's noise
        raise FileNotFoundError(2, "No such file or directory", str(cfg.input))
    if cfg.engine == "local" and output != "-" and str(output).lower().endswith(_COMPRESSED):
        raise ValueError(
            f"--output {output!r}: compressed output is not supported (a resumed "
            "run truncates the output to its last committed step); write an "
            "uncompressed file and compress it once the run has finished"
        )
    if cfg.engine == "local" and cfg.state and output != "-" and not regular_or_new(str(output)):
        raise ValueError(
            f"--output {output!r} is not a regular file (a pipe or a device): a run with "
            "--state commits each step to its output file and a resumed run rewrites its "
            "last step there; write to a file, or to stdout with -o -"
        )
    local_file = cfg.engine == "local" and output != "-"  # (Spark writes a directory)
    if local_file and (str(output).endswith(os.sep) or os.path.isdir(str(output))):
        raise ValueError(  # (a sidecar beside it would be written, then the output fail)
            f"--output {output!r} is a directory: give the path of a file"
        )
    if output != "-":
        refuse_foreign_link(str(output), "--output")
        _refuse_registry(str(output))
    others, records = run_files(cfg)
    targets: FileList = [("--output", output if output != "-" else None)]
    if cfg.engine == "local" and output != "-":
        targets.append(("--output's sidecar", str(sidecar_path(output))))
        targets.append(("--output's lock file", lock_path(str(output))))
    elif output != "-" and (local := local_path(str(output))) is not None:  # Spark's lock
        targets.append(("--output's lock file", lock_path(local)))
    targets += records
    for n, (name, path) in enumerate(targets):
        if path is None:
            continue
        for other_name, other in others + targets[:n]:
            if other is not None and same_file(path, other):
                why = "refusing to overwrite it"
                if STATE_SIDE in (name, other_name):
                    why = "SQLite writes it beside the state and deletes it: refusing to run"
                raise ValueError(
                    f"{name} {path!r} is the same file as {other_name} {other!r}: {why}"
                )
    _refuse_domain_of_another_role(cfg, others)
    refuse_other_kind(cfg)  # (after: this run's own key or state is named as such)


def _refuse_registry(output: str) -> None:
    """Refuse an output in the key registry's folder (review 122: ``-o`` naming a key's
    entry there, with --overwrite, replaced the record of the key's ledger with
    releases, and every later run of the key was refused)."""
    from ..ledger_registry import registry_dir

    folder = registry_dir()
    if folder is None:
        return
    where = os.path.realpath(os.path.dirname(os.path.abspath(output)))
    if where == os.path.realpath(folder):
        raise ValueError(
            f"--output {output!r} is in the key registry's folder {folder!r}, which records "
            "where each key's ledger is: write the output elsewhere"
        )


def _refuse_csv_header(cfg: RunConfig, domain: str) -> None:
    """Refuse a ``--domain`` whose first line is a CSV header naming the run's item and
    time columns (review 104: another day's CSV input given as the domain published its
    rows, user ids included, as items)."""
    if not os.path.isfile(domain):
        return
    with open(domain, "rb") as fh:
        first = fh.readline(1 << 16).decode("utf-8", "replace").lstrip("\ufeff").strip()
    names = {n.strip() for n in first.split(",")}
    wanted = {str(cfg.item_column or "item"), str(cfg.time_column or cfg.time_field or "t")}
    if len(names) > 1 and wanted <= names:
        raise ValueError(
            f"--domain {domain!r} starts with a CSV header naming the item and time columns "
            f"({', '.join(sorted(wanted))}): an input file, not a domain; a release would "
            "publish its rows. Give the file of the items to release"
        )


def _refuse_domain_of_another_role(cfg: RunConfig, reads: FileList) -> None:
    """Refuse a ``--domain`` that is the key or the input: every release of a known
    domain names each of its lines as an item, so it would publish the key (and the
    noise of every stream under it) or the input's records. (The state and the ledger,
    which a run writes, no file it reads may be: :func:`check_paths`.)"""
    domain = cfg.domain
    if not isinstance(domain, str) or domain == "-" or not os.path.exists(domain):
        return
    _refuse_csv_header(cfg, domain)
    for name, path in reads:
        if name in ("--domain", "--config") or path is None or path == "-":
            continue
        if os.path.exists(path) and same_file(domain, path):
            raise ValueError(
                f"--domain {domain!r} is the same file as {name} {path!r}: a release "
                "names every item of the domain, so it would publish that file's lines; "
                "give the file of the items to release"
            )


def closing_quietly_on_error(fh: IO[bytes]) -> Any:
    """An exit callback closing ``fh``; a failed close (say, a full disk flushing the
    rest of a buffer) does not hide the error that is already on its way."""

    def exit_(exc_type: object, exc: object, tb: object) -> bool:
        try:
            fh.close()
        except OSError:
            if exc_type is None:
                raise
        return False

    return exit_


def check_new_output(cfg: RunConfig, header: bytes) -> None:
    """Refuse to start a new run over an output that already holds releases (unless
    --overwrite or --force).

    Such a file is most likely the output of an earlier run of the same
    stream: starting again (with another stream name, say) would publish its
    steps a second time with fresh noise.
    """
    path = cfg.output
    if path == "-" or cfg.replaces_output or not holds_release(path, header):
        return  # (a state, a ledger or a key: refused by check_paths, --force or not)
    hint = (  # (review 113: it said --force, which also lets a replay of the noise through)
        "resume it with its --state file, or pass --overwrite to replace it (a release "
        "already published from it still counts against the budget)"
    )
    raise StateError(f"output file {path!r} already holds releases: {hint}")


def _what_else(path: str) -> str | None:
    """What a file that is surely not releases is, in words: a SQLite database or a
    SQLite write-ahead log (a stream's state), a release ledger, or a key file (what
    :meth:`dpstream.noise.NoiseKey.load` reads: one line of 64 hex digits, in any case,
    spaces around); None for anything else."""
    from ..ledger_file import opens_ledger
    from ..noise import is_key_text

    with open(path, "rb") as fh:
        head = fh.read(4097)
    if head.startswith(b"SQLite format 3\x00"):
        return "a SQLite database (a stream's --state?)"
    if head[:4] in (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83"):
        return "a SQLite write-ahead log (beside a stream's --state?)"
    if opens_ledger(head):
        return "a release ledger"
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        return None
    return "a secret key file" if is_key_text(text) else None


def refuse_other_kind(cfg: RunConfig) -> None:
    """Refuse an output file that is a state, a ledger or a key (:func:`_what_else`),
    with or without ``--overwrite``/``--force``: they replace an earlier output only."""
    output = str(cfg.output)
    if cfg.engine != "local" or output == "-" or not os.path.isfile(output):
        return  # (Spark writes a directory; a pipe or a device is not read here)
    other = _what_else(output)
    if other is not None:
        raise StateError(
            f"output file {output!r} is {other}, not releases: give -o another path "
            "(--overwrite replaces an earlier output only)"
        )


def release_formatter(cfg: RunConfig, mech: ContinualMechanism) -> tuple[Any, Any]:
    """The release formatter (each release's meta with its step's ``noise_std``), and the
    Parquet writer behind it (``--output-format parquet``) or None."""
    from ..io import make_formatter
    from .meta import NoiseStdFormatter

    output_format = cfg.output_kind
    clock = cfg.clock
    step_start = None if clock is None else (lambda t: clock.iso(clock.start_of(t)))
    step_end = None if clock is None else (lambda t: clock.iso(clock.end_of(t)))
    if clock is not None and cfg.state and not cfg.replaces_output:
        begun = long_layout_clock(cfg.output, output_format)
        if begun is not None:  # a stream goes on with the clock's columns its file has
            step_start = step_start if "step_start" in begun else None
            step_end = step_end if "step_end" in begun and step_start else None
    parquet = None
    if output_format == "parquet":
        if cfg.output == "-" or cfg.state:
            raise ValueError(
                "--output-format parquet needs --output FILE and no --state (a "
                "Parquet file cannot be resumed): write jsonl or csv with --state"
            )
        if not cfg.replaces_output and os.path.exists(cfg.output):
            raise StateError(f"output file {cfg.output!r} exists: pass --overwrite to replace it")
        from ..io import ParquetWriter

        check_target(cfg.output)
        parquet = ParquetWriter(
            cfg.output,
            cfg.round,
            step_start=step_start,
            step_end=step_end,
            before_open=lambda: check_target(cfg.output),  # the file is made at the first rows
        )
        base_formatter: Any = ParquetFormatter(parquet)
    else:
        base_formatter = make_formatter(output_format, cfg.round, step_start, step_end)
    return NoiseStdFormatter(base_formatter, mech), parquet
