"""Releases of a data frame of timed events, as a data frame: :func:`release_frame`.

Layer 6 of dpstream (an edge, beside the command line). A pandas or polars
frame, an Arrow table, or a Parquet file or directory of events goes through
``dpstream run`` itself: the frame is written to a private temporary Parquet
file, read by the Parquet reader of :mod:`dpstream.io.parquet`, and released by
the run's pipeline (:func:`dpstream.run.command.run_config`: the same config,
checks, validation, mechanism, post-processing and release ledger) into a
Parquet long table, which comes back as the caller's kind of frame. So a frame
and ``dpstream run -i events.parquet`` give the same releases for the same key,
stream and settings (tests/test_frames.py compares them). pandas and polars are
imported only when a frame of theirs is given or asked for.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from typing import Any

__all__ = ["release_frame"]

#: The settings a frame run always has (the releases go to a Parquet long table).
_FIXED = ("input", "output", "output_format", "key_file", "mechanism", "state", "follow", "view")
#: The settings that name a column the run reads.
_COLUMN_SETTINGS = ("item_column", "event_column", "user_field", "time_field", "time_column")
#: The temporary folders of frames' copies (``<prefix><pid>-<random>``).
_TMP_PREFIX = "dpstream-frame-"


def release_frame(
    events: Any,
    mechanism: str,
    *,
    key: str | os.PathLike[str],
    time: str = "t",
    items: str | None = None,
    event: str | None = None,
    user: str | None = None,
    **settings: Any,
) -> Any:
    """Release every step of a frame of timed events, as ``dpstream run`` would.

    Args:
        events: a pandas or polars DataFrame, a ``pyarrow.Table``, or the path of
            a Parquet file or directory; one row per event (a list column of
            items) or one row per item with an event-id column (``event``), as
            ``dpstream run`` reads Parquet (docs/frames.md).
        mechanism: ``--mechanism``: ``known``, ``unknown``, ``top-k``, ...
        key: the path of the secret key file (``dpstream keygen PATH``); the
            release ledger beside the file it resolves to (links followed) records
            this run like any other, so a second release of the same stream under the
            same key is refused (``force=True`` says it was never published).
        time: the time column: integer steps, or with ``step`` and ``start`` the
            timestamps on that public clock (``--time-field``).
        items: the item column (``--item-column``; default: ``items``, a list
            column, else ``item``, one row per item).
        event: the event-id column of one row per item (``--event-column``).
        user: the user-id column (``--user-field``: user-level privacy).
        **settings: any other option of ``dpstream run`` by its name with ``_``
            for ``-`` (``horizon=10``, ``epsilon=1.0``, ``delta=1e-6``,
            ``max_items=3``, ``domain=[...]``, ``step="1d"``, ``start=...``,
            ``stream=...``, ``quiet=False``, ...). Their defaults are the command's
            (``None`` is the default). Each is checked as a ``--config`` file's value
            is, before anything is read or written: an unknown name, ``"false"`` for
            ``force`` or ``"2"`` for ``top`` is refused.

    Returns:
        The long release table (``t``, ``item``, ``value``, ``noise_std``, and
        ``step_start`` and ``step_end`` when the run has a clock) as the kind of ``events``: a
        pandas or polars DataFrame, else a ``pyarrow.Table``.

    Raises:
        ValueError: an unknown setting, a setting the command refuses, a missing
            column or one of the wrong type (before any release); the errors of
            ``dpstream run``.

    Warns:
        UserWarning: when the run skipped or truncated invalid events (``on_invalid``,
            by default ``skip`` up to ``max_invalid``): how many, and why; the
            command prints the same counts in its summary.
    """
    from .run.command import load_key, run_config
    from .run.config import RunConfig
    from .run.options import MECH_OPTS, RUN_OPTS, check_values
    from .run.output import check_paths

    if not isinstance(key, (str, os.PathLike)):  # a NoiseKey object has no ledger beside it
        raise TypeError(
            f"release_frame: key= is the path of a key file (the release ledger that "
            f"records the run lives beside it), got {type(key).__name__}; save a "
            "NoiseKey with key.save(path) and pass the path"
        )
    fixed = sorted(set(settings) & set(_FIXED))
    if fixed:
        raise ValueError(
            f"release_frame sets {', '.join(fixed)} itself (the frame in, a frame out)"
        )
    kind = _frame_kind(events)
    # every setting checked as a config file's values are, before anything is read or
    # written: an unknown name, "false" for a flag or text for a number is refused
    allowed = tuple(
        o for o in MECH_OPTS + RUN_OPTS if o.dest == "mechanism" or o.dest not in _FIXED
    )
    given = check_values(
        {"mechanism": mechanism, **settings}, allowed, where="release_frame", keywords=True
    )
    columns = {"item_column": items, "event_column": event, "user_field": user}
    if given.get("step") is not None or given.get("start") is not None:
        columns["time_field"] = time
    elif time != "t":
        columns["time_column"] = time
    named = {"item_column": "items", "event_column": "event", "user_field": "user"}
    named.update(time_field="time", time_column="time")
    columns = check_values(columns, allowed, where="release_frame", keywords=True, written=named)
    opts: dict[str, Any] = {"key_file": os.fspath(key), "quiet": True, **columns, **given}
    from .run.fold import remove_stale

    root = tempfile.gettempdir()
    remove_stale(root, _TMP_PREFIX)  # a frame's copy a killed process left (review 117)
    prefix = f"{_TMP_PREFIX}{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=root) as tmp:  # mode 0700
        if kind == "path":
            opts["input"], opts["input_format"] = os.fspath(events), "parquet"
        else:
            # the columns the run may read, however named (review 117: named through
            # item_column= and the like, a column of sets passed the check of read
            # columns; and every other column was copied to the temporary file too)
            names = (time, items or "items", "item", event or "event", user)
            names += tuple(opts.get(k) for k in _COLUMN_SETTINGS)
            read = {str(n) for n in names if n}
            opts["input"] = _write_events(events, kind, tmp, read)
            opts["input_format"] = "parquet"
            # its budget's dataset is not the temporary file's name, which every frame
            # has: unnamed frames count on "frame" (a cap needs the name given)
            if not opts.get("dataset") and opts.get("budget_cap") is None:
                opts["dataset"] = "frame"
        out = os.path.join(tmp, "releases.parquet")
        opts.update(output=out, output_format="parquet")
        cfg = RunConfig.from_args(argparse.Namespace(**opts))
        try:
            check_paths(cfg)
            # warned once the input is read, before the first release: a warning the
            # caller turns into an error (-W error) releases nothing
            run_config(cfg, load_key(cfg), on_summary=_warn_of_invalid)
        except (ValueError, TypeError) as exc:
            if kind != "path" and exc.args and isinstance(exc.args[0], str):
                exc.args = (_in_frame_words(exc.args[0], opts["input"]), *exc.args[1:])
            raise
        import pyarrow.parquet as pq

        table = pq.read_table(out)
    return _as_kind(table, kind)


def _warn_of_invalid(counts: dict[str, Any]) -> None:
    """A :class:`UserWarning` naming how many events the run skipped (by reason) or
    truncated, nothing when it counted every event whole: a library adds no log handler
    of its own, so without it a frame's invalid rows would vanish unseen (review 89).
    Counts only, as the command's summary: never an item or a row's content."""
    skipped, truncated = counts.get("skipped", 0), counts.get("truncated", 0)
    if not skipped and not truncated:
        return
    reasons = sorted((counts.get("skipped_by_reason") or {}).items(), key=lambda rn: -rn[1])
    why = ", ".join(f"{n} {r}" for r, n in reasons)
    level = 1  # the warning points at release_frame's caller
    frame: Any = sys._getframe(0)
    while frame is not None and frame.f_code is not release_frame.__code__:
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"release_frame: {skipped} invalid events skipped"
        + (f" ({why})" if why else "")
        + f", {truncated} truncated; on_invalid='error' refuses a frame with any "
        "invalid event instead",
        UserWarning,
        stacklevel=level + 1,
    )


#: The command's words in a message, and what a caller of release_frame gave instead.
_FRAME_WORDS = (
    ("--item-column", "items="),
    ("--event-column", "event="),
    ("--user-field", "user="),
    ("--time-column", "time="),
    ("--time-field", "time="),
    ("input line", "frame row"),
)


def _in_frame_words(message: str, path: str) -> str:
    """A run's message about the frame (written to the temporary Parquet file ``path``,
    gone when the caller reads it) in the words of the call: "the frame", its rows, the
    keywords for the command's options (``--on-invalid`` as ``on_invalid=``)."""
    import re

    message = message.replace(f"the Parquet input {path!r}", "the frame")
    message = message.replace(repr(path), "the frame")
    for words, ours in _FRAME_WORDS:
        message = message.replace(words, ours)
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_") + "=", message)


def _frame_kind(events: Any) -> str:
    """``pandas``, ``polars``, ``arrow`` or ``path`` (by the type's module: nothing is
    imported to ask)."""
    if isinstance(events, (str, os.PathLike)):
        return "path"
    module = type(events).__module__.split(".")[0]
    if module in ("pandas", "polars") and type(events).__name__ == "DataFrame":
        return module
    if module == "pyarrow" and type(events).__name__ in ("Table", "RecordBatch"):
        return "arrow"
    raise TypeError(
        "events must be a pandas or polars DataFrame, a pyarrow Table or the path of a "
        f"Parquet file or directory, got {type(events).__name__}"
    )


def _write_events(events: Any, kind: str, tmp: str, read: set[str]) -> str:
    """The frame as a Parquet file in ``tmp`` (private), for the run's reader; ``read``:
    the names of the columns the run may read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind == "pandas":
        table = _from_pandas(events[[c for c in events.columns if str(c) in read]], read)
    elif kind == "polars":
        table = events.select([c for c in events.columns if str(c) in read]).to_arrow()
    else:
        table = pa.Table.from_batches([events]) if isinstance(events, pa.RecordBatch) else events
        table = table.select([c for c in table.column_names if str(c) in read])
    path = os.path.join(tmp, "events.parquet")
    pq.write_table(table, path)
    return path


def _from_pandas(events: Any, read: set[str]) -> Any:
    """A pandas frame as an Arrow table. A list column whose lists mix integers and
    strings (which Arrow cannot type) holds its integers as their decimal text, as JSON
    Lines reads them; any other column Arrow cannot convert is refused naming the column
    and its problem, never a value (docs/privacy.md: messages carry no record content)."""
    import pyarrow as pa

    if not events.columns.is_unique:
        twice = sorted({str(n) for n in events.columns[events.columns.duplicated()]})
        raise ValueError(
            f"the frame has more than one column named {twice[0]!r}: rename all but one"
        )
    for name in events.columns:  # sets: their order is the process's hash seed's
        values = events[name]
        if str(name) not in read or values.dtype != object:
            continue
        if any(isinstance(v, (set, frozenset)) for v in values.tolist()):
            raise ValueError(
                f"the frame's column {str(name)!r} holds sets: their order changes from "
                "one Python process to the next, and which items an event or a user "
                "keeps first would change with it; give lists (in the events' order)"
            )
    # OverflowError: a Python int past int64 (Arrow's conversion raises it bare);
    # UnicodeEncodeError: a lone surrogate in a string (review 117: raised as it was)
    unreadable = (
        pa.ArrowInvalid,
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        OverflowError,
        UnicodeEncodeError,
    )
    try:
        return pa.Table.from_pandas(events, preserve_index=False)
    except unreadable:
        pass
    columns = {}
    for name in events.columns:
        values = events[name]
        try:
            columns[name] = pa.Table.from_pandas(values.to_frame(), preserve_index=False)
            continue
        except unreadable as exc:
            problem = type(exc).__name__
        texts = None if problem == "UnicodeEncodeError" else _items_as_text(values)
        if texts is None:
            raise ValueError(
                f"the frame's column {str(name)!r} cannot be read: its values are not all "
                f"of one type that the column may have (pyarrow: {problem}; the values "
                "are not shown)"
                + (
                    ", or a string holds a lone surrogate (not valid text)"
                    if problem == "UnicodeEncodeError"
                    else ""
                )
            ) from None
        columns[name] = pa.table({name: pa.array(texts, pa.list_(pa.string()))})
    return pa.Table.from_arrays(
        [columns[name].column(0) for name in events.columns],
        names=[str(name) for name in events.columns],
    )


def _items_as_text(values: Any) -> list[Any] | None:
    """A column of item lists that mix integers and strings, each integer as its decimal
    text (as JSON Lines reads ``[7, "tea"]``), or None when it is not such a column (a
    null list or item stays null: the run says what JSON Lines says of it)."""
    import numpy as np
    import pandas as pd

    out: list[Any] = []
    for row in values.tolist():
        if not isinstance(row, (list, tuple, np.ndarray)):
            if row is None or pd.isna(row):  # None, NaN, pd.NA: a null list
                out.append(None)
                continue
            return None
        items: list[Any] = []
        for v in row.tolist() if isinstance(row, np.ndarray) else row:
            if isinstance(v, (bool, np.bool_)):
                return None
            if isinstance(v, (int, np.integer)):
                items.append(str(int(v)))
            elif v is None or isinstance(v, str):
                items.append(v)
            else:
                return None
        out.append(items)
    return out


def _as_kind(table: Any, kind: str) -> Any:
    """The release table as the caller's kind of frame."""
    if kind == "pandas":
        return table.to_pandas()
    if kind == "polars":
        import polars as pl

        return pl.from_arrow(table)
    return table
