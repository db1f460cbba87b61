"""The release ledger at a run's start: the noise scope a run draws under, refused when
another run released under it, and the ledger checked against the state.

Layer 6 of dpstream (a run's setup). Every run, with a state or without, records its
noise scope in the release ledger (:mod:`dpstream.ledger`) before its first release;
a new run whose scope another run already released under is refused before anything
is written (``--force`` overrides: the operator's word that the earlier release was
never published). A state behind its ledger releases the steps the ledger holds only
from the same input (:func:`ledger_precheck`).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import StateError
from ..ledger import BudgetCapError, LedgerError, ReleaseLedger, ledger_path, scope_refusal

if TYPE_CHECKING:
    from ..budget import DatasetSpend
    from ..mechanisms.protocol import ContinualMechanism
    from ..noise import NoiseKey
    from ..privacy import BudgetCap
    from ..state import Checkpoint, RunRecord, StateDigests
    from .config import RunConfig

__all__ = ["ledger_precheck", "new_run_scope", "noise_scope", "open_ledger"]

_log = logging.getLogger("dpstream.run")


def noise_scope(mech: ContinualMechanism, stream: str) -> str:
    """The purpose a mechanism draws its noise under (its stream name, the input settings
    of :func:`~dpstream.run.settings.scoped_stream`, the noise version and every setting
    that shapes the noise): two runs under one key draw the same noise exactly when these
    are equal. A mechanism that names none gets its stream name, which is coarser (more
    runs share it)."""
    for part in (mech, getattr(mech, "histogram", None)):  # top-k by KnownBase: its histogram
        for attr in ("noise_scope", "noise_purpose", "tree_purpose"):
            value = getattr(part, attr, None)
            if isinstance(value, str):
                return value
    return stream


def new_run_scope(
    cfg: RunConfig,
    key: NoiseKey,
    scope: str,
    own: str,
    *,
    replaced: Iterable[str] = (),
    budget: DatasetSpend | None = None,
    cap: BudgetCap | None = None,
) -> tuple[ReleaseLedger, frozenset[str]]:
    """Open the ledger for a new run (one that no state resumes) and refuse it
    (:class:`LedgerError`, before anything is written) when another run released steps
    under the same noise scope; with ``--force``, warn and go on.

    ``own``: the run id a state left with no step on record (``""``: none);
    ``replaced``: the run ids the state recorded before it and replaced, none with a
    step on record (:meth:`~dpstream.state.Checkpoint.replaced_runs`). The ledger may
    hold the scope and the first step of each (a kill between the ledger and the state,
    once or several times in a row): they are let through, and returned to be allowed
    when the scope line of the new run is appended; one with later steps on record is
    not (the state forgot steps it released: a backup, not a kill).
    Returns the ledger (open under ``own`` or a fresh run id) and the run ids allowed.
    ``budget`` and ``cap``: the run's cost on its dataset and the dataset's cap; a run the
    cap does not allow is refused here (:class:`BudgetCapError`), before anything.
    """
    ledger = ReleaseLedger(
        ledger_path(cfg.options(), record=True),
        key,
        own or secrets.token_hex(16),
        fsync=bool(cfg.fsync),
        scope=scope,
        check_scope=not cfg.force,
        budget=budget,
        cap=cap,
    )
    try:
        _check_dataset(cfg, ledger)
        problem = ledger.budget_problem()
        if problem is not None:
            raise BudgetCapError(problem)
        foreign = ledger.other_keys() if cap is not None else 0
        if foreign:
            _log.warning(
                f"the release ledger {ledger.path} holds {foreign} budget "
                "line(s) of other keys, which --budget-cap does not count (their datasets "
                "and costs are sealed under their keys): a dataset's budget is one key's, "
                "so keep the streams of a dataset under one key"
            )
        kept = [run for run in (own, *replaced) if run and ledger.in_scope(run)]
        allow = frozenset(run for run in kept if ledger.last_of(run) <= 1)
        others = [run for run in ledger.others() if run not in allow]
        if own in kept and own not in allow:  # the state forgot steps it released
            others.append(own)
        if others and not cfg.force:
            raise LedgerError(scope_refusal(ledger.path, len(others), spark=cfg.engine == "spark"))
        if others:
            _log.warning(
                f"--force: the release ledger {ledger.path} records "
                f"{len(others)} earlier run(s) that released steps with the same "
                "key and settings; this run draws the same noise from its data, "
                "which is safe only if those releases were never published"
            )
        return ledger, allow
    except BaseException:
        ledger.close()
        raise


def open_ledger(
    cfg: RunConfig,
    key: NoiseKey,
    ckpt: Checkpoint,
    record: RunRecord | None,
    *,
    scope: str | None = None,
    check_scope: bool = False,
    allow: frozenset[str] = frozenset(),
    budget: DatasetSpend | None = None,
    cap: BudgetCap | None = None,
) -> ReleaseLedger:
    """The release ledger of the run in the state, checked against it.

    The state's last step must be the ledger's; steps the state holds and the
    ledger lacks (a state written by a dpstream without a ledger, or a ledger
    restored from a backup) are appended. A state behind the ledger (restored
    from a backup, or killed between the two) is let through with a warning:
    the steps the ledger holds are then released again only from the same
    input (:func:`ledger_precheck`, and :meth:`ReleaseLedger.record`).
    """
    ledger = ReleaseLedger(
        ledger_path(cfg.options(), record=True),
        key,
        ckpt.run_id(),
        fsync=bool(cfg.fsync),
        scope=scope,
        check_scope=check_scope,
        allow=allow,
        budget=budget,
        cap=cap,
        same_first=bool(allow) and not (cfg.force or cfg.replace_unfinished),
    )
    try:
        _check_dataset(cfg, ledger)
        last = record.last_t if record is not None else 0
        _check_common_step(cfg, ckpt, ledger, last)
        _check_other_runs(cfg, ledger, last)
        _catch_up(cfg, ckpt, ledger, last)
        if last:  # a run released before the ledger kept scopes: its scope, now
            ledger.claim_scope()
    except BaseException:
        ledger.close()
        raise
    return ledger


def _check_dataset(cfg: RunConfig, ledger: ReleaseLedger) -> None:
    """A stream's cost is counted on the dataset its first batch named, and its later
    batches go on there (their files may have other names). A later batch given another
    ``--dataset`` is refused: kept silently on the first, it would be checked against a
    ``--budget-cap`` of a dataset it is not counted on."""
    given = cfg.dataset
    on_record = ledger.dataset_name()
    if given and on_record is not None and on_record != given:
        raise LedgerError(
            f"--dataset {given!r}: this stream's cost is counted on dataset {on_record!r} "
            "(its first batch's), where its later batches go on; leave out --dataset, or "
            f"give --dataset {on_record!r} (a stream on another dataset is a new stream)"
        )
    if given and ledger.needs_budget_line():  # a run not yet counted on any dataset
        problem = dataset_slip(given, {line.dataset for _, line in ledger.spends()})
        if problem is not None:
            raise LedgerError(problem)


def dataset_slip(given: str, names: set[str]) -> str | None:
    """Why ``--dataset given`` is refused when the ledger holds ``names``: a name not on
    record that differs from one on record only in case, spaces or Unicode form, or by
    a ``./`` or a data file's suffix (review 113: ``./sales.jsonl``, ``sales`` and the
    default name of ``-i sales.jsonl`` made three budgets): a slip that would start a
    fresh budget beside that one's, past its cap; None when fine. ``dpstream plan``
    asks the same question, so that it refuses what a run refuses."""
    plain = _plain(given)
    near = sorted(n for n in names if n != given and _plain(n) == plain)
    if not near or given in names:
        return None
    return (
        f"--dataset {given!r} is not on record, but {near[0]!r} is: dataset names "
        "are exact, and these differ only in case, spaces or Unicode form, a './' or "
        f"a file suffix, so this run would start a budget beside {near[0]!r}'s (and its "
        f"cap). Give --dataset {near[0]!r} for the same data, or a name that differs by "
        "more for other data"
    )


#: The suffixes of the files a run reads (the default dataset name is the file's).
_DATA_SUFFIXES = (".gz", ".jsonl", ".ndjson", ".json", ".csv", ".parquet", ".txt")


def _plain(name: str) -> str:
    """A dataset name as :func:`_folded` reads it, its path normalised and without a
    data file's suffixes (``./in//Sales.jsonl.gz`` reads ``in/sales``; ``2026/sales``
    and ``2027/sales`` stay apart)."""
    import posixpath

    text = _folded(name)
    if "/" in text:
        text = posixpath.normpath(text)
    while text.endswith(_DATA_SUFFIXES) and "." in text[1:]:
        text = text[: text.rindex(".")]
    return text


#: Characters that show nothing outside the format (Cf) and mark (Mn) categories:
#: Hangul fillers and the blank Braille pattern.
_BLANKS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _invisible(char: str, category: str) -> bool:
    """Whether a character shows nothing of its own: a format character (a zero-width
    space), a mark left after NFKC (a variation selector, the combining grapheme
    joiner), or a blank letter."""
    return category in ("Cf", "Mn") or char in _BLANKS


def _folded(name: str) -> str:
    """A dataset name as it reads (to catch a slip): its compatibility form (NFKC: a
    full-width letter, an accent written apart), without invisible format characters
    (a zero-width space), without case, and with its spaces collapsed."""
    import unicodedata

    text = unicodedata.normalize("NFKC", name)
    text = "".join(c for c in text if not _invisible(c, unicodedata.category(c)))
    return " ".join(unicodedata.normalize("NFKC", text.casefold()).split())


def _check_common_step(cfg: RunConfig, ckpt: Any, ledger: ReleaseLedger, last: int) -> None:
    """The last step both the state and the ledger hold must be the same in both."""
    common = min(last, ledger.last_t)
    if common:
        ours, theirs = _step_on_record(cfg, ckpt, common), ledger.entry(common)
        if (
            theirs is None
            or not ours.input_mac.startswith(theirs.input_mac)
            or not ours.release_mac.startswith(theirs.release_mac)
        ):
            raise LedgerError(
                f"the release ledger {ledger.path!r} records step {common} of the run in "
                f"{cfg.state} otherwise than the state does: refusing to go on"
            )


def _check_other_runs(cfg: RunConfig, ledger: ReleaseLedger, last: int) -> None:
    """Refuse a state (its last step ``last``) whose next steps another run of the same
    noise scope would have drawn the same noise for (``--force``: the operator's word
    that the other's releases were never published; a stream begun again with --force
    says it again until it is past them):

    * another run released steps after the one this run goes on from (review 100: a
      state given the run id of another run of its scope went on that way);
    * the ledger holds none of the state's steps while another run released under its
      scope (review 99: the state's run id is not sealed, so an edited or swapped state
      is that run's stream under another id, or a second stream of the scope)."""
    if cfg.force:
        return
    goes_on = max(last, ledger.last_t)  # the step this run goes on from
    ahead = ledger.others_ahead(goes_on)
    if ahead:
        raise LedgerError(
            f"the release ledger {ledger.path!r} records {len(ahead)} other run(s) of the "
            f"same key and settings that released steps after step {goes_on}, where the "
            f"run in {cfg.state} goes on: it would "
            "release those steps again under the same noise over its own data (a state "
            "edited, or a stream begun twice?). If their releases were never published, "
            "--force says so"
        )
    others = ledger.others() if last and not ledger.last_t else []
    if others:
        raise LedgerError(
            f"the run in {cfg.state} is not in the release ledger {ledger.path!r}, which "
            f"records {len(others)} other run(s) that released steps with the same key "
            "and settings: its next steps would draw their noise again over other data (a "
            "state edited, or one from another copy of the stream?). Resume the stream "
            "with the state its first run kept; if the other releases were never "
            "published, --force says so"
        )


def _step_on_record(cfg: RunConfig, ckpt: Any, t: int) -> Any:
    """Step t of the state, which holds every step up to its last (a gap: refused)."""
    step = ckpt.step(t)
    if step is None:  # (review 99: a state edited by hand)
        raise StateError(
            f"the state {cfg.state} lacks step {t}, though it holds later steps "
            "(edited or damaged?): refusing to go on"
        )
    return step


def _catch_up(cfg: RunConfig, ckpt: Any, ledger: ReleaseLedger, last: int) -> None:
    """Append to the ledger the steps the state holds and it lacks; warn when the state
    is behind it."""
    if ledger.last_t < last:
        had = ledger.last_t
        steps = (
            (t, s.input_mac, s.release_mac)
            for t, s in (
                (t, _step_on_record(cfg, ckpt, t)) for t in range(ledger.last_t + 1, last + 1)
            )
        )
        ledger.adopt(steps)
        if had:
            _log.warning(
                f"the release ledger {ledger.path} ended at step {had} of the run "
                f"in {cfg.state}, which has released {last}: restored from a "
                "backup? the steps were added from the state; keep the ledger "
                "on storage that is never rolled back"
            )
        else:  # review 87: another, empty ledger took the stream without a word
            _log.warning(
                f"the release ledger {ledger.path} held none of the {last} steps the run "
                f"in {cfg.state} released: is it the ledger the stream's earlier runs "
                "kept (a --ledger given otherwise, or relative to another folder)? the "
                "steps were added from the state; a run of the same key and stream is "
                "refused only by a ledger that holds them"
            )
    elif ledger.last_t > last:
        _log.warning(
            f"the state {cfg.state} is behind the release ledger "
            f"{ledger.path}: steps {last + 1}..{ledger.last_t} were released "
            "after it was saved (restored from a backup, or a kill between the "
            "two); they are released again only from the same input"
        )


def ledger_precheck(
    steps: Iterable[Any],
    ledger: ReleaseLedger,
    digests: StateDigests,
    cfg: RunConfig,
    *,
    after: int,
    through: int,
) -> Iterator[Any]:
    """``steps``, once the input of steps after+1..through (released by an earlier run,
    which the state does not remember) was found the same as the ledger records.

    A batch run reads its input to the end before it releases, so this costs no extra
    read: it holds those steps (their input is held anyway) and refuses a changed one
    before a byte is written or the state is touched.
    """
    from ..io.chunks import records_step

    held: list[Any] = []
    want = after + 1

    def check(t: int, step: Any) -> None:
        if not ledger.same(t, digests.step_input(t, step.lines, step.lengths, step.raw_pieces())):
            raise LedgerError(
                f"the state {cfg.state} is behind the release ledger {ledger.path}: step "
                f"{t} was released (after the state was saved) from other input than this "
                "run's; releasing it again from other data would publish the exact "
                "difference of the true counts. Give this run the input those steps were "
                f"released from (steps {after + 1}..{through}), or the state that recorded "
                "them"
            )

    it = iter(steps)
    for step in it:
        held.append(step)
        if step.t is None or step.t <= after or step.t > through:
            continue
        for t in range(want, step.t):  # steps without records (none in a batch run)
            check(t, records_step(t, []))
        check(step.t, step)
        want = step.t + 1
        if want > through:
            break
    for t in range(want, through + 1):  # the steps after the input's last record
        check(t, records_step(t, []))
    return itertools.chain(held, it)
