"""A few items' counts out of a release line, without parsing its other items.

Layer 6 of dpstream (an edge). Filling an item's history reads every line that
may hold it; a line of 10^6 items parsed in full is a dict of 10^6 entries (ten
times the line), for the one count wanted. :func:`extract_items` reads a line
written in dpstream's own layout (``json.dumps`` with its default separators,
keys ``t``, ``released``, ``meta`` in that order, names without escapes) with
one regular expression that checks the whole line, keeping nothing but the
counts asked for; any other line (escapes in a name, other spacing, numbers
beyond the plain range) is left to :func:`~dpstream.view.model.parse_release`
(``None``). Both give the same result for every line: the expression accepts
only lines that ``json.loads`` reads as a release whose counts are all finite and
below :data:`~dpstream.view.model.MAX_MAGNITUDE`.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["extract_items"]

#: A JSON string without escapes (every quote in such text is a string's first or last).
_STRING = r'"[^"\\\x00-\x1f]*"'
#: A JSON number below 1e100 in magnitude: up to 99 digits before the point, or one
#: digit before an exponent up to 89 (any negative exponent).
_NUMBER = r"-?(?:(?:0|[1-9]\d{0,98})(?:\.\d+)?|(?:0|[1-9])(?:\.\d+)?[eE](?:-\d+|\+?[0-8]?\d))"
_LINE = re.compile(
    (
        rf'\{{"t": ([1-9]\d{{0,18}}), "released": \{{((?:{_STRING}: {_NUMBER}'
        rf"(?:, {_STRING}: {_NUMBER})*+)?)\}}"
        rf'(?:, "meta": (\{{.*\}}))?\}}[ \t\n\r]*'
    ).encode(),
    re.DOTALL,
)
#: A count in the released object: followed by the next pair or by its end.
_VALUE = re.compile(rf"{_NUMBER}(?=, |\Z)".encode())
_MAX_T = 2**63 - 1  # :data:`dpstream.view.model.MAX_T` (which imports this module)
#: Bytes decoded at a time to check that a line is UTF-8 (as ``json.loads`` requires).
_CHUNK = 1 << 16


def _utf8(data: bytes) -> bool:
    """Whether ``data`` is UTF-8, checked a chunk at a time (no copy of the whole line)."""
    if data.isascii():
        return True
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        for start in range(0, len(data), _CHUNK):
            decoder.decode(data[start : start + _CHUNK])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def extract_items(
    data: bytes, items: Sequence[str]
) -> tuple[int, dict[str, int | float], dict[str, Any]] | None:
    """``(t, {item: count}, meta)`` of a release line in dpstream's layout, else ``None``.

    ``{item: count}`` holds those of ``items`` that the release holds (the last
    occurrence of a name, as ``json.loads`` keeps it). ``None``: the line is not
    in that layout (or is no release): parse it in full to know.
    """
    if not _utf8(data):
        return None
    match = _LINE.fullmatch(data)
    if match is None:
        return None
    t = int(match.group(1))
    meta: dict[str, Any] = {}
    if match.group(3) is not None:
        try:
            meta = json.loads(match.group(3))
        except (ValueError, RecursionError):  # e.g. a key after "meta": the line decides
            return None
    if t > _MAX_T:
        return None
    begin, stop = match.span(2)  # the released object's pairs (not copied)
    found: dict[str, int | float] = {}
    for item in items:
        value = _value_of(data, begin, stop, item)
        if value is not None:
            found[item] = value
    return t, found, meta


def _value_of(data: bytes, begin: int, stop: int, item: str) -> int | float | None:
    """The count of ``item`` among the pairs in ``data[begin:stop]`` (matched by ``_LINE``)."""
    name = json.dumps(item, ensure_ascii=False)
    if name[1:-1] != item:
        return None  # its name has escapes; no name in this text has any
    try:
        key = f"{name}: ".encode()
    except UnicodeEncodeError:  # a lone surrogate: in no UTF-8 text
        return None
    end = stop
    while (at := data.rfind(key, begin, end)) >= 0:
        if data.count(b'"', begin, at) % 2 == 0:  # a name's opening quote: this is the key
            number = _VALUE.match(data, at + len(key), stop)
            if number is None:  # cannot happen in matched text
                return None
            digits = number.group()
            return float(digits) if any(c in digits for c in b".eE") else int(digits)
        end = at + len(key) - 1  # an earlier occurrence, which may overlap this one
    return None
