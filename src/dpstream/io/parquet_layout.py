"""Which columns of a Parquet input hold what: the layout a run reads a file with.

Layer 6 of dpstream (an edge; :mod:`dpstream.io.parquet` reads with it). One row
per event (a time column and a list column of items) or one row per item (an
event id column), the time as integers, timestamps, dates or text, and a user
id column; a column that is missing or of another type is refused here, with
the file's columns named, before anything is read. Epoch seconds are integers or
float64: a float32 (or float16) time column cannot hold them exactly, and is
refused too.
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
    item_column: str | None,
    event_column: str,
    time_field: str | None,
    clock: StepClock | None,
    user_field: str | None,
) -> _Layout:
    """The columns of a file's ``schema`` the run reads, each checked for its type.

    ``item_column`` None: the item column was not named, so ``items`` (a list column)
    or else ``item`` (one row per item); a file with both is refused (which one counts
    is not guessed). A --time-field column of float32 or float16 is refused: it cannot
    hold epoch seconds exactly (cast it to float64 or int64 seconds)."""
    import pyarrow as pa

    names = schema.names

    def need(name: str, flag: str) -> Any:
        if name not in names:
            listed = ", ".join(shorten(n) for n in names) or "none"
            raise ValueError(f"{where}: no column {name!r} ({flag}); its columns: {listed}")
        if names.count(name) > 1:  # which one to read is not guessed
            raise ValueError(
                f"{where}: {names.count(name)} columns are named {name!r} ({flag}): "
                "rename all but one, so that it is clear which one to read"
            )
        return _value_type(schema.field(name).type)

    def wrong(name: str, flag: str, typ: Any, expected: str) -> ValueError:
        return ValueError(f"{where}: column {name!r} ({flag}) is {typ}, expected {expected}")

    if item_column is not None:
        items = item_column
    elif "items" in names and "item" in names:
        # two layouts at once: which one counts is the caller's to say, not a guess
        raise ValueError(
            f"{where}: both a column 'items' (a list of items per event) and a column "
            "'item' (one row per item); name the one to count: --item-column items or "
            "--item-column item (release_frame: items='items' or items='item')"
        )
    elif "items" in names:
        items = "items"  # the JSON Lines layout, by default
    elif "item" in names:
        items = "item"
    else:
        listed = ", ".join(shorten(n) for n in names) or "none"
        raise ValueError(
            f"{where}: no column 'items' (a list of items per event) or 'item' (one row per "
            f"item, with an event id column; --item-column names another); its columns: {listed}"
        )
    itype = need(items, "--item-column")
    event = None
    if is_list_type(itype):
        # a list of nulls: a frame whose every event holds no item (pandas and polars
        # write no element type for lists that are all empty)
        if not (_is_item_type(itype.value_type) or pa.types.is_null(itype.value_type)):
            raise wrong(items, "--item-column", itype, "a list of strings or integers")
    elif _is_item_type(itype) or pa.types.is_null(itype):  # null: every item is null
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
        if pa.types.is_float16(ttype) or pa.types.is_float32(ttype):
            # a float32 has 24 bits: epoch seconds of today are off by up to 64 s (a
            # float16 holds none), so events would move to another step without a word
            bits = 16 if pa.types.is_float16(ttype) else 32
            raise ValueError(
                f"{where}: column {time!r} ({flag}) is float{bits}, which cannot hold epoch "
                "seconds exactly (events would move to another step): cast it to float64 "
                "or to int64 epoch seconds"
            )
    else:
        time, flag = time_column or "t", "--time-column"
        ttype = need(time, flag)
        if not pa.types.is_integer(ttype):
            raise wrong(
                time, flag, ttype,
                "integer time steps (or --time-field with --step and --start for timestamps)",
            )  # fmt: skip
    # with a clock a row is parsed as the JSON Lines object {TIME: .., "items": ..,
    # USER: ..}: a user or time column named "items" that is not the item column would
    # overwrite it (review 117: every record "malformed")
    if clock is not None and time == "items" and items != "items":
        raise ValueError(
            f"{where}: --time-field 'items' is a column other than the items "
            f"({items!r}): the reader gives the items that name; rename the time column"
        )
    if user_field is not None:
        if user_field in (time, items, event):
            raise ValueError(
                f"{where}: --user-field {user_field!r} is the time, item or event column"
            )
        if clock is not None and user_field == "items":
            raise ValueError(
                f"{where}: --user-field {user_field!r} is a name the reader gives the "
                "time or the items of an event: rename the user column"
            )
        utype = need(user_field, "--user-field")
        if not (pa.types.is_string(utype) or pa.types.is_large_string(utype)):
            raise wrong(user_field, "--user-field", utype, "strings (user ids)")
    return _Layout(time, items, event, user_field, clock)


def _value_type(typ: Any) -> Any:
    """A column's type, a dictionary-encoded one (a pandas categorical) as its values'."""
    import pyarrow as pa

    return typ.value_type if pa.types.is_dictionary(typ) else typ


def is_list_type(typ: Any) -> bool:
    """A list column's type: a list, a large list or a fixed-size list (a polars Array)."""
    import pyarrow as pa

    typ = _value_type(typ)
    return bool(
        pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
    )


def item_column_type(typ: Any) -> Any | None:
    """The type a read casts an item column of type ``typ`` to, or None to keep it: a
    fixed-size list as a list, a list of nulls as a list of strings (all empty or
    null), a column of nulls as strings (every item null)."""
    import pyarrow as pa

    if is_list_type(typ):
        value = typ.value_type
        if pa.types.is_null(value):
            value = pa.string()
        if pa.types.is_large_list(typ):
            return None if value == typ.value_type else pa.large_list(value)
        if pa.types.is_fixed_size_list(typ) or value != typ.value_type:
            return pa.list_(value)
        return None
    return pa.string() if pa.types.is_null(typ) else None


def _is_item_type(typ: Any) -> bool:
    import pyarrow as pa

    typ = _value_type(typ)
    return bool(
        pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_integer(typ)
    )
