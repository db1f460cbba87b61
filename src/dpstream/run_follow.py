"""``dpstream run --follow``: a growing input, steps closed by the public clock.

Layer 6 of dpstream (an edge), used by :mod:`dpstream.run_command`. The run
loop hands over its ``release`` and ``note`` functions; this module decides
*when* each step is released (the clock, and the reader having caught up),
never what it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .errors import StateError
from .run_settings import clock_from_options

__all__ = ["follow", "input_records_from"]


def _utcnow() -> Any:
    """The wall clock the follower reads (one seam, so tests can drive time)."""
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc)


_IDLE = object()  # the follower has read everything there is for now
_EOF = object()  # the input has ended (stdin closed)


def follow(
    infile: Any,
    opts: dict[str, Any],
    input_format: str,
    note: Any,
    release: Any,
    *,
    mech: Any,
    until: int,
    validator: Any,
    past: Any,
    resume_t: int,
    ckpt: Any,
    start_t: int = 0,
    key: Any = None,
) -> None:
    """``--follow``: read a growing input and release each step when the clock says.

    Step t is released once it is due on the public clock (its window has
    ended, plus ``--lateness``) and the reader has caught up with the input:
    a backlog is read to its end first, so which events make a step does not
    depend on how fast they were read, nor on the order of the backlog. (A
    step does not close when an event of a later step is read: one event put
    early in a backlog would then make the events after it late, so its
    presence would change other events' counts.) An event that arrives after
    its step was released is late and goes to ``--on-invalid``. A resumed run
    closes the steps on record at the input line each one closed at the first
    time (kept in the state), so late events stay late and the replay is exact.
    """
    import queue
    import threading

    from .io import guard_lines
    from .state import StateDigests

    clock = clock_from_options(opts)
    if clock is None:
        raise ValueError("--follow needs the public clock: --time-field, --step and --start")
    if input_format != "jsonl":
        raise ValueError("--follow reads JSON Lines input")
    poll = 0.2
    q: queue.Queue = queue.Queue(maxsize=10_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def lines() -> Iterator[str]:
        partial = ""
        while not stop.is_set():
            line = infile.readline()
            if line == "":
                if opts["input"] == "-":
                    return
                q.put(_IDLE)
                stop.wait(poll)
                continue
            partial += line
            if partial.endswith("\n"):
                yield partial
                partial = ""

    def reader() -> None:
        try:
            for rec in input_records_from(guard_lines(lines(), opts["input"]), opts, input_format):
                q.put(rec)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)
        q.put(_EOF)

    thread = threading.Thread(target=reader, name="dpstream-follow", daemon=True)
    thread.start()
    pending: dict[int, list[Any]] = {}
    caught_up = ended = False
    latest_line = 0  # the latest input line read
    # steps on record close where they closed the first time
    mask = StateDigests(key).mask if key is not None else (lambda t: 0)
    boundary = {t: ckpt.step(t).input_line ^ mask(t) for t in range(start_t + 1, resume_t + 1)}
    late = "time step {} was already released (a late event)"
    try:
        while mech.t < until:
            t = mech.t + 1
            now = _utcnow()
            if t in boundary:
                if caught_up and latest_line < boundary[t]:
                    raise StateError(
                        f"the input ends at line {latest_line}, but step {t} "
                        f"closed after line {boundary[t]} the first time: is it "
                        "the same input?"
                    )
                ready = (
                    ended or latest_line > boundary[t] or (caught_up and latest_line == boundary[t])
                )
            else:
                ready = clock.due(now) >= t and (caught_up or ended)
            if ready:
                recs = pending.pop(t, [])
                cut = boundary.get(t, latest_line)
                release(t, [r for r in recs if r.line <= cut])
                validator.events([r for r in recs if r.line > cut], past=late.format(t))
                continue
            wait = (clock.end_of(t) + clock.lateness - now).total_seconds()
            if ended:
                stop.wait(max(min(wait, 1.0), 0.01))
                continue
            try:
                item = q.get(timeout=max(min(wait, poll), 0.01))
            except queue.Empty:
                continue
            if item is _IDLE:
                caught_up = True
            elif item is _EOF:
                ended = True
                if errors:
                    raise errors[0]
            else:
                rec = note(item)
                caught_up, latest_line = False, rec.line
                if rec.error is not None or rec.t is None:
                    validator.events([rec])
                elif rec.t <= mech.t:
                    validator.events([rec], past=late.format(rec.t))
                elif rec.t > until:
                    validator.events([rec], past=past(rec.t))
                else:
                    pending.setdefault(rec.t, []).append(rec)
    finally:
        stop.set()


def input_records_from(
    lines: Iterable[str], opts: dict[str, Any], input_format: str
) -> Iterator[Any]:
    from .io import read_events

    clock = clock_from_options(opts)
    return read_events(
        lines,
        input_format,
        time_field=opts["time_field"],
        clock=clock,
        user_field=opts.get("user_field"),
    )
