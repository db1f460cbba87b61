"""Which columns of a Parquet input hold what: the layout a run reads a file with.

Layer 6 of dpstream (an edge; :mod:`dpstream.io.parquet` reads with it). One row
per event (a time column and a list column of items) or one row per item (an
event id column), the time as integers, timestamps, dates or text, and a user
id column; a column that is missing or of another type is refused here, with
the file's columns named, before anything is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..clock import StepClock
from .records import shorten


@dataclass(frozen=True)
class _Layout:
    """Which columns a run reads, and how: ``per_item`` (one row per item, grouped by
    ``event``) or one row per event (``items`` a list column)."""

    time: str
    items: str
    event: str | None
    user: str | None
    clock: StepClock | None

    @property
    def per_item(self) -> bool:
        return self.event is not None

    def columns(self) -> list[str]:
        cols = [self.time, self.items, self.event, self.user]
        return list(dict.fromkeys(c for c in cols if c is not None))


def _layout(
    schema: Any,
    where: str,
    *,
    time_column: str | None,
    item_column: str,
    event_column: str,
    time_field: str | None,
    clock: StepClock | None,
    user_field: str | None,
) -> _Layout:
    """The columns of a file's ``schema`` the run reads, each checked for its type."""
    import pyarrow as pa

    names = schema.names

    def need(name: str, flag: str) -> Any:
        if name not in names:
            listed = ", ".join(shorten(n) for n in names) or "none"
            raise ValueError(f"{where}: no column {name!r} ({flag}); its columns: {listed}")
        return _value_type(schema.field(name).type)

    def wrong(name: str, flag: str, typ: Any, expected: str) -> ValueError:
        return ValueError(f"{where}: column {name!r} ({flag}) is {typ}, expected {expected}")

    items = item_column
    if item_column == "item" and "item" not in names and "items" in names:
        items = "items"  # the JSON Lines layout, by default
    elif item_column == "item" and "item" not in names:
        listed = ", ".join(shorten(n) for n in names) or "none"
        raise ValueError(
            f"{where}: no column 'items' (a list of items per event) or 'item' (one row per "
            f"item, with an event id column; --item-column names another); its columns: {listed}"
        )
    itype = need(items, "--item-column")
    event = None
    if pa.types.is_list(itype) or pa.types.is_large_list(itype):
        if not _is_item_type(itype.value_type):
            raise wrong(items, "--item-column", itype, "a list of strings or integers")
    elif _is_item_type(itype):
        event = event_column
        etype = need(event, "--event-column")
        if not _is_item_type(etype):
            raise wrong(event, "--event-column", etype, "strings or integers")
    else:
        raise wrong(
            items, "--item-column", itype,
            "a list of strings or integers (one row per event) or strings or integers "
            "(one row per item, with --event-column)",
        )  # fmt: skip
    if clock is not None:
        assert time_field is not None
        time, flag = time_field, "--time-field"
        ttype = need(time, flag)
        if not (
            pa.types.is_timestamp(ttype)
            or pa.types.is_date(ttype)
            or pa.types.is_integer(ttype)
            or pa.types.is_floating(ttype)
            or pa.types.is_string(ttype)
            or pa.types.is_large_string(ttype)
        ):
            raise wrong(time, flag, ttype, "timestamps, dates, epoch seconds or ISO-8601 strings")
    else:
        time, flag = time_column or "t", "--time-column"
        ttype = need(time, flag)
        if not pa.types.is_integer(ttype):
            raise wrong(
                time, flag, ttype,
                "integer time steps (or --time-field with --step and --start for timestamps)",
            )  # fmt: skip
    if user_field is not None:
        if user_field in (time, items, event):
            raise ValueError(
                f"{where}: --user-field {user_field!r} is the time, item or event column"
            )
        utype = need(user_field, "--user-field")
        if not (pa.types.is_string(utype) or pa.types.is_large_string(utype)):
            raise wrong(user_field, "--user-field", utype, "strings (user ids)")
    return _Layout(time, items, event, user_field, clock)


def _value_type(typ: Any) -> Any:
    """A column's type, a dictionary-encoded one (a pandas categorical) as its values'."""
    import pyarrow as pa

    return typ.value_type if pa.types.is_dictionary(typ) else typ


def _is_item_type(typ: Any) -> bool:
    import pyarrow as pa

    typ = _value_type(typ)
    return bool(
        pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_integer(typ)
    )
