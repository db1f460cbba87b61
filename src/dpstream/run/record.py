"""The stream on record: what the state file and the output's sidecar say a run goes on
with, and whether this run may go on with it.

Layer 6 of dpstream (a run's setup, before anything is written). A stream never changes
its noise version or counter half-way (:func:`noise_version_of`,
:func:`recorded_tree_base`); a resumed run must share every parameter of the run in
the state (:func:`run_params`, :func:`open_run`); a stream that goes on from a
snapshot brings new input, or the same input to finish a batch (:func:`go_on`); an
end step already reached does nothing (:func:`check_until`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import StateError
from ..registry import _MECH_KWARGS

if TYPE_CHECKING:
    from ..mechanisms.protocol import ContinualMechanism
    from ..noise import NoiseKey
    from ..state import Checkpoint, RunRecord, StateDigests
    from .config import RunConfig

__all__ = [
    "GoOn",
    "check_until",
    "domain_sha256",
    "go_on",
    "input_mac",
    "noise_version_of",
    "open_run",
    "recorded_tree_base",
    "run_params",
    "snapshot_context",
]


def noise_version_of(opts: Mapping[str, Any]) -> int:
    """The noise version of this run: ``--noise-version`` if given; else the version of
    the stream this run goes on with or writes over, so that a stream never changes
    version (which would publish independent noise for steps already released):

    * with ``--engine spark``: the newest version, as for any new stream (a Spark run
      keeps no state, so it cannot see what an earlier run drew: a run of a stream
      begun at version 1, which the ledger lets through only with ``--force``, passes
      ``--noise-version 1``);
    * the run on record in ``--state`` (one that released steps; a state without a
      version was written by dpstream 0.1: version 1);
    * else, with ``--force`` (the same stream again, its release never published),
      the output file's metadata sidecar, when the output exists (a sidecar without a
      version: 1); an output that holds releases but has no sidecar is refused: its
      version is unknown. ``--overwrite`` alone replaces the file with a new stream,
      whose settings are its own (review 116: it took the replaced stream's);
    * else, a new stream: the newest version.
    """
    from ..noise import NOISE_VERSION
    from ..state import recorded_params
    from .meta import read_run_meta, sidecar_path

    if opts.get("noise_version") is not None:
        return int(opts["noise_version"])
    if opts.get("engine", "local") != "local":
        return NOISE_VERSION
    if opts.get("state"):
        params = recorded_params(opts["state"], allow_readable=opts["allow_readable_state"])
        if params is not None:
            return int(params.get("noise_version", 1))
    output = opts.get("output")
    if output and output != "-" and os.path.exists(output) and not _overwrite_only(opts):
        try:
            meta = read_run_meta(sidecar_path(output))
        except ValueError:
            meta = None
        if meta is not None:
            return _sidecar_int(meta, "noise_version", 1, sidecar_path(output))
        if opts.get("force") and os.path.getsize(output) > 0:
            raise ValueError(
                f"output file {output!r} holds releases but no metadata sidecar "
                "says which noise version drew them: pass --noise-version (1 for "
                "releases of dpstream 0.1, or the version of the run that wrote "
                "it); another version would publish independent noise for the "
                "same steps"
            )
    return NOISE_VERSION


def recorded_tree_base(cfg: RunConfig) -> int | None:
    """The tree base of the unknown-domain stream this run goes on with, or None.

    UnkBase's default counter is BLT; a stream that began with the tree (the
    run on record in ``--state``, else the output's metadata sidecar when the
    output exists) must not switch counters half-way (its releases would mix
    independent noises of two counters). So ``-m unknown`` without ``--counter``,
    ``--blt-buffers`` or ``--base`` takes the recorded tree base (``--base r``
    records exactly what a stream begun with the tree by default recorded). An
    explicit flag that differs from the record is refused by the parameter check as for any option.
    """
    from ..state import recorded_params
    from .meta import read_run_meta, sidecar_path

    if cfg.mechanism != "unknown" or any(
        v is not None for v in (cfg.counter, cfg.blt_buffers, cfg.base)
    ):
        return None
    if cfg.state:
        params = recorded_params(cfg.state, allow_readable=cfg.allow_readable_state)
        if params is not None:
            if (
                params.get("mechanism") == "unknown"
                and "blt" not in params
                and params.get("counter") is None
                and params.get("base")
            ):
                return int(params["base"])
            return None
    output = cfg.output
    if output and output != "-" and os.path.exists(output) and not _overwrite_only(cfg.options()):
        try:
            meta = read_run_meta(sidecar_path(output))
        except ValueError:
            meta = None
        if (
            meta is not None
            and meta.get("mechanism") == "unknown"
            and meta.get("counter", "tree") == "tree"
            and meta.get("base")
        ):
            return _sidecar_int(meta, "base", None, sidecar_path(output))
    return None


def _overwrite_only(opts: Mapping[str, Any]) -> bool:
    """Whether the output is replaced by a new stream (``--overwrite`` without
    ``--force``): its sidecar is the replaced stream's, which decides nothing here."""
    return bool(opts.get("overwrite")) and not opts.get("force")


def _sidecar_int(meta: dict[str, Any], name: str, default: int | None, path: Any) -> int:
    """A whole number the output's metadata sidecar records (``noise_version``, ``base``),
    refused in words when it is anything else: a sidecar edited by hand, or damaged,
    must not choose the noise of a stream's next steps (``1.7`` was read as 1)."""
    value = meta.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"the metadata sidecar {str(path)!r} records {name} {value!r}, not a whole "
            "number >= 1: it was edited or damaged; restore it, or pass the value the "
            f"stream's first run used (--{name.replace('_', '-')})"
        )
    return value


def domain_sha256(domain: list[str] | None) -> str | None:
    """The fingerprint of ``--domain`` a resumed run must match (None without one)."""
    if domain is None:
        return None
    return hashlib.sha256(json.dumps(domain, ensure_ascii=True).encode()).hexdigest()


def run_params(
    cfg: RunConfig, mech: ContinualMechanism, domain_fingerprint: str | None
) -> dict[str, Any]:
    """The parameters a resumed run must share (canonical JSON in the state)."""
    opts = cfg.options()
    params = {k: opts[k] for k in _MECH_KWARGS if k in opts}
    # noise version 1 is not recorded, so that states written before versions existed resume
    version = params.pop("noise_version", None)
    if version not in (None, 1):
        params["noise_version"] = version
    params.update(
        mechanism=cfg.mechanism,
        horizon=cfg.horizon,  # None: no planned end
        base=None if mech.base is None else int(mech.base),
        tau=float(mech.tau),
        domain_sha256=domain_fingerprint,
        input_format=cfg.input_kind,
        output_format=cfg.output_kind,
        round=bool(cfg.round),
        clamp=bool(cfg.clamp),
        monotone=bool(cfg.monotone),
        on_invalid=cfg.on_invalid,
    )
    if cfg.horizon is None:  # recorded: a resume cannot switch to or from a horizon
        params["unbounded"] = True
    if cfg.on_invalid == "truncate":  # the rule that picks the kept items
        from ..mechanisms.truncation import METHOD

        params["truncation"] = METHOD
    if cfg.input_kind in ("csv", "parquet"):
        from .settings import recorded_item_column

        params.update(
            item_column=recorded_item_column(cfg.input_kind, cfg.item_column),
            event_column=cfg.event_column,
            time_column=cfg.time_column,
        )
    if cfg.user_field is not None:
        params.update(user_field=cfg.user_field)
    if mech.strategy is not None:  # the BLT's exact parameters
        params.update(counter="blt", blt=mech.strategy.fingerprint())
    if isinstance(params.get("eta"), float):
        params["eta"] = float(params["eta"])
    params["implicit_time"] = bool(cfg.implicit_time)
    from .settings import scoped_stream

    scoped = scoped_stream(opts)
    if scoped != str(opts["stream"]):  # the input settings' text, as the noise scope has it
        params["stream_scope"] = scoped
    clock = cfg.clock
    if clock is not None:
        params.update(
            time_field=cfg.time_field,
            start=clock.start.isoformat(),
            step_seconds=clock.step.total_seconds(),
            lateness_seconds=clock.lateness.total_seconds(),
            follow=bool(cfg.follow),
        )
        if clock.months:  # calendar months, in the offset (or named zone) of --start
            params.update(step_months=clock.months, time_zone=clock.zone_text())
        elif clock.named_zone is not None:  # days follow the zone's daylight saving
            params.update(time_zone=clock.zone_text())
    return params


def open_run(
    ckpt: Checkpoint,
    cfg: RunConfig,
    mech: ContinualMechanism,
    domain_fingerprint: str | None,
    key: NoiseKey,
) -> tuple[RunRecord | None, dict[str, str] | None]:
    """Check that this run continues the one recorded in the state file.

    Returns ``(record, None)`` to resume the recorded run, or ``(None, ident)``
    for a new run, to be recorded (:meth:`Checkpoint.start`) once the output
    is open. A recorded run with no step on record wrote nothing (a step is
    recorded before its release is written), so it is replaced by this one,
    new parameters and all.
    """
    from ..io import resolve_path
    from ..state import canonical_json

    fields = run_params(cfg, mech, domain_fingerprint)
    params = canonical_json(fields)
    ident = dict(
        params=params,
        key_fingerprint=key.fingerprint(),
        input=resolve_path(cfg.input),
        output=resolve_path(cfg.output),
    )
    record = ckpt.load()
    if record is None or (record.steps == 0 and not record.finished):
        return None, ident
    _check_truncation_rule(ckpt.path, record.params)
    ident_check: dict[str, Any] = dict(ident)
    if "stream_scope" not in json.loads(record.params):  # a state begun before it was
        ident_check["params"] = canonical_json(  # recorded: compared without it
            {k: v for k, v in fields.items() if k != "stream_scope"}
        )
    if ckpt.snapshot() is not None or cfg.replace_unfinished:  # a stream that goes on:
        ident_check["input"] = None  # each run brings its own input; or a corrected one
        # (review 101: a first batch's corrected file was refused, naming the first)
    ckpt.verify(record, **ident_check)
    _check_zone_rules(ckpt.path, record, cfg)
    return record, None


def _check_zone_rules(path: str, record: RunRecord, cfg: RunConfig) -> None:
    """Refuse to go on when the named zone's rules moved a step already released (a new
    time zone database, or another machine's): the same boundaries, or no run."""
    held = (record.summary or {}).get("zone_rules")
    if not isinstance(held, dict) or cfg.clock is None:
        return
    through = held.get("through")
    if not isinstance(through, int) or through < 0:
        return
    if cfg.clock.zone_rules_digest(through) != held.get("digest"):
        raise StateError(
            f"the time zone {cfg.clock.named_zone}'s rules on this machine put the steps "
            f"already released (1 to {through}, in {path}) at other times than the run "
            "that released them did: its time zone database changed (or this is another "
            "machine's). Going on would move released steps (events near a boundary "
            "counted twice, or dropped as late). Run it where the zone database matches, "
            "e.g. with the same `tzdata` package and PYTHONTZPATH"
        )


def _check_truncation_rule(path: str, recorded: str) -> None:
    """Refuse a state whose run truncated by another rule (a state without ``truncation``
    on record keyed the kept items on input line numbers): its stream must not switch
    rules half-way."""
    try:
        params = json.loads(recorded)
    except (ValueError, RecursionError):  # (review 103: nested too deeply)
        params = None
    if not isinstance(params, dict):  # (review 99: a state edited by hand)
        raise StateError(f"state file {path!r} holds no run parameters (edited or damaged?)")
    if params.get("on_invalid") == "truncate" and "truncation" not in params:
        raise StateError(
            f"state file {path!r} belongs to a run with --on-invalid truncate by an older "
            "rule (the kept items keyed on input line numbers, which made daily runs differ "
            "from one run); this dpstream keys them on each event's step and items. Finish "
            "that stream with the dpstream that began it, or begin a new one (a new --state "
            "and --output)"
        )


def snapshot_context(ckpt: Checkpoint, params: str, t: int) -> bytes:
    """What a snapshot is bound to: the run's parameters, its random id and the step."""
    return f"{params}\0{ckpt.run_id()}\0{t}".encode()


@dataclass
class GoOn:
    """A stream that goes on from the mechanism saved after step ``t`` of an earlier run.

    ``continues``: that run finished its steps, and this one brings the next
    events; otherwise that run stopped early, and this one replays its steps
    after ``t`` (from the same input) before going on. ``offset``: where step
    t's release ends in the output.
    """

    mechanism: Any
    publish: Any
    t: int
    offset: int
    continues: bool
    batch: int | None


def input_mac(cfg: RunConfig, digests: StateDigests) -> str | None:
    """A keyed digest of the whole input file (None for stdin and for an empty file: two
    quiet days may well bring the same empty input); a directory of Parquet files: a
    digest of its files' paths and bytes. None with ``--follow``: a followed file grows
    between runs, so its whole bytes tell nothing; each step it released is bound to
    its own records instead (the state's and the ledger's digests, and the line it
    closed at), and its timestamps fix its events' steps, so a file read again adds no
    event to a step released before."""
    if cfg.follow:
        return None
    if cfg.input != "-" and os.path.isdir(cfg.input):
        from ..io.parquet import parquet_files

        return digests.files(cfg.input, parquet_files(cfg.input))
    if cfg.input == "-" or os.path.getsize(cfg.input) == 0:
        return None
    return digests.file(cfg.input)


def go_on(
    ckpt: Checkpoint, record: RunRecord, cfg: RunConfig, key: NoiseKey, digests: StateDigests
) -> GoOn | None:
    """How this run goes on from the state's snapshot, or None (no snapshot: replay all)."""
    from ..snapshot import load_snapshot

    snap = ckpt.snapshot()
    if snap is None:
        return None
    t, blob = snap
    batches = ckpt.batches()
    open_batch = batches[-1] if batches and batches[-1][4] is None else None
    mac = input_mac(cfg, digests)
    # the last run finished its steps, or stopped before releasing one (kill -9 at its
    # start): either way this run goes on after step t, from its own input
    continues = t == record.last_t
    if continues:  # an open batch released nothing: begin_batch forgets it
        for n, _, seen, first, last in batches:
            if last is not None and mac is not None and seen == mac:
                raise StateError(
                    f"this input was already fed to the stream in {cfg.state} (run {n}, "
                    f"steps {first}..{last}): refusing to release its events twice"
                )
    elif (
        open_batch is not None
        and mac is not None
        and open_batch[2] not in (None, mac)
        and not cfg.replace_unfinished
    ):
        raise StateError(
            f"the run in {cfg.state} stopped at step {record.last_t} while "
            f"reading another input ({open_batch[1]!r}): give it the same input "
            "to finish its steps; for an input that replaces it (a corrected file), add "
            "--replace-unfinished: the steps already released are checked against it, "
            "and its steps after them are counted from it"
        )
    saved = load_snapshot(blob, key, snapshot_context(ckpt, record.params, t))
    if not (isinstance(saved, tuple) and len(saved) == 2):
        raise StateError(
            f"the state's snapshot in {cfg.state} holds no post-processing "
            "state (--clamp/--monotone): go on with the version that wrote it"
        )
    mechanism, publish = saved
    step = ckpt.step(t)
    if step is None:  # (review 99: a state edited by hand)
        raise StateError(
            f"the state {cfg.state} holds a snapshot after step {t} but no record of that "
            "step (edited or damaged?): refusing to go on"
        )
    return GoOn(
        mechanism=mechanism,
        publish=publish,
        t=t,
        offset=step.end,
        continues=continues,
        batch=None if continues or open_batch is None else open_batch[0],
    )


def check_until(
    ckpt: Checkpoint, record: RunRecord, until: int, cfg: RunConfig, digests: StateDigests
) -> bool:
    """Refuse an end step before the steps already released, or one that adds nothing.

    Returns True for the command of the batch that ended last run again (the same
    ``--until``, the same input file; with ``--follow``, the same ``--until``): it has
    nothing to do. A batch still open whose steps are all written (killed before its
    end was recorded: state 3 in :mod:`dpstream.state`) is neither: this run finishes it.
    """
    if until < record.last_t:
        raise StateError(
            f"--until {until} is before step {record.last_t}, which the run in "
            f"{cfg.state} has already released"
        )
    if until != record.last_t or cfg.output == "-":
        return False
    try:
        if os.path.getsize(cfg.output) < record.last_end:
            return False
    except OSError:
        return False
    batches = ckpt.batches()
    if batches and batches[-1][4] is None and batches[-1][3] <= record.last_t:
        return False  # the open batch released steps: finish it (its input is checked)
    ended = [b for b in batches if b[4] is not None]
    unsure = ""
    if ended and ended[-1][4] == until:
        if cfg.follow:  # the same steps again from a file that grew: nothing to release
            return True
        mac = input_mac(cfg, digests)
        if mac is not None and ended[-1][2] == mac:
            return True
        if mac is None:
            unsure = (
                " (from stdin or an empty file the input cannot be told apart: if "
                "this repeats a run that was killed, that run had completed)"
            )
    raise StateError(
        f"the run in {cfg.state} has released every step up to --until "
        f"{until} already{unsure}: give a later --until to release more steps"
    )
