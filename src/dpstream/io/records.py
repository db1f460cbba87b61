"""One input record and the rules every input format shares.

Layer 6 of dpstream (an edge). A :class:`RawEvent` is what each reader of
:mod:`dpstream.io` yields per record: its line, its step, its items (or why it
is invalid), its user id and its raw bytes. The rules here are the same for
JSON Lines and CSV, so that a CSV and a JSON Lines file of the same stream give
the same releases:

* items are strings: a JSON integer item ``5`` is read as ``"5"``;
* inputs are UTF-8, with or without a byte-order mark; a line that is not valid
  UTF-8, or an item holding a lone surrogate (a JSON ``"\\ud800"``), is an
  invalid record (:func:`open_input` keeps invalid bytes as lone surrogates so
  that the parsers reject the one record that holds them);
* a ``.gz`` input is decompressed on the fly; a truncated or corrupt one is an
  error naming the last line read (:func:`guard_lines`);
* a time step is an integer >= 1, or a timestamp on the public clock;
* with ``--user-field NAME`` (user-level privacy) every event holds a non-empty
  string user id; an event without one is an invalid record.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO, TypedDict

from ..clock import StepClock, parse_timestamp

__all__ = [
    "RawEvent",
    "open_input",
    "text_stream",
    "guard_lines",
    "MAX_LINE_BYTES",
    "OverlongLine",
    "overlong_message",
    "OVERLONG_HEAD",
    "raw_bytes",
    "valid_text",
    "shorten",
    "parse_items",
    "parse_t",
    "timestamp_step",
    "parse_user",
]


@dataclass(frozen=True)
class RawEvent:
    """One input record, parsed or not.

    Attributes:
        line: 1-based line number in the input (for CSV, the event's first row).
        t: the time step the record gives, or ``None``.
        items: the event's items as strings (possibly with repeats), or
            ``None`` when the record is malformed.
        error: what is wrong with the record, or ``None``.
        user: the event's user id (``--user-field``), or ``None`` at event level.
        raw: the record's bytes as read (its line or lines, without the line
            terminator): what the keyed digest of a step's input reads.
    """

    line: int
    t: int | None
    items: tuple[str, ...] | None
    error: str | None = None
    user: str | None = None
    raw: bytes | None = field(default=None, repr=False, compare=False)


class _TextDecoding(TypedDict):
    """The keyword arguments of :func:`open` that decode an input's text."""

    encoding: str
    errors: str


#: Text decoding of every input: UTF-8 with an optional byte-order mark; bytes
#: that are not UTF-8 become lone surrogates, which the parsers reject per record.
_ENCODING: _TextDecoding = dict(encoding="utf-8-sig", errors="surrogateescape")


def open_input(path: str) -> TextIO:
    """A text stream for ``path``: ``-`` is stdin, ``*.gz`` (``.GZ``...) is decompressed.

    The text is UTF-8 with an optional byte-order mark; invalid bytes are kept
    as lone surrogates (``surrogateescape``) so that the parsers can reject
    the one record that holds them instead of stopping the whole input.
    """
    if path == "-":
        if sys.stdin is None:  # started with stdin closed (`<&-`)
            raise ValueError("--input -: stdin is closed; give the input's path")
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is None:
            return sys.stdin
        return text_stream(buffer)
    if str(path).lower().endswith(".gz"):  # any case, as Hadoop's codecs (--engine spark)
        return gzip.open(path, "rt", newline="", **_ENCODING)
    return open(path, newline="", **_ENCODING)  # noqa: SIM115 - caller closes


def text_stream(binary: Any) -> TextIO:
    """``binary`` (a buffered byte stream) read as an input's text, as :func:`open_input`
    reads it: UTF-8 with an optional byte-order mark, invalid bytes kept as lone
    surrogates, lines split as they are written (no newline translation)."""
    return io.TextIOWrapper(binary, newline="", **_ENCODING)


#: The longest line an input's reader takes (bytes): a longer one is the invalid record
#: :func:`overlong_message`, read past without being held (a stream of text, which
#: has no bytes to read past, gives it whole to the parser, which refuses it). An
#: event that long is no event (--max-items bounds what it may hold), and a ``.gz`` of
#: 1 MB held a 1 GB line, 6.4 GB of memory to parse it.
MAX_LINE_BYTES = 1 << 24


class OverlongLine(str):
    """A line longer than :data:`MAX_LINE_BYTES`: its start (the text), and its
    ``length`` in bytes (UTF-8, without its terminator)."""

    length: int

    def __new__(cls, head: str, length: int) -> OverlongLine:
        line = super().__new__(cls, head)
        line.length = length
        return line


def overlong_message(length: int) -> str:
    """The message of a record whose line is too long to read."""
    return f"line too long ({length:,} bytes, more than {MAX_LINE_BYTES:,}): not read"


#: What an overlong line keeps of its start (the bytes its record's digest reads).
OVERLONG_HEAD = 256


def guard_lines(stream: Iterable[str], name: str) -> Iterator[str]:
    """The lines of ``stream``, with a truncated or corrupt ``.gz`` as a one-line error.

    Raises:
        ValueError: the compressed stream ends early or is corrupt (naming the
            last line read in full).
    """
    lineno = 0
    it = iter(stream)
    while True:
        try:
            line = next(it)
        except StopIteration:
            return
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(
                f"input {name!r}: the compressed file is truncated or corrupt "
                f"after line {lineno} ({exc})"
            ) from None
        lineno += 1
        yield line


def valid_text(text: str) -> bool:
    """False if ``text`` holds a lone surrogate (invalid UTF-8 input, or a JSON escape)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shorten(text: str, limit: int = 40) -> str:
    """``text`` cut for an error message."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _item(value: object) -> str | None:
    """A JSON value as a command-line item: strings as they are, integers as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def parse_items(values: object) -> tuple[tuple[str, ...] | None, str | None]:
    """A JSON array of items as text (strings, integers as their decimal text), or
    why it is not one: (items, None) or (None, message)."""
    if not isinstance(values, list):
        return None, f"items must be a JSON array, got {type(values).__name__}"
    out = []
    for v in values:
        item = _item(v)
        if item is None:
            return None, (
                f"an item must be a string or an integer, got {shorten(json.dumps(v, default=str))}"
            )
        if not valid_text(item):
            return None, "an item is not valid UTF-8 text (it holds a lone surrogate)"
        out.append(item)
    return tuple(out), None


def parse_t(value: object) -> tuple[int | None, str | None]:
    """A record's ``"t"``: an integer >= 1, None when absent, or why it is neither."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int):
        return None, f'"t" must be an integer, got {shorten(json.dumps(value))}'
    if value < 1:
        return None, f'"t" must be >= 1, got {shorten(str(value))}'
    return value, None


def timestamp_step(value: object, clock: StepClock, what: str) -> tuple[int | None, str | None]:
    """The step of a timestamp on the public clock, or why there is none."""
    try:
        t = clock.step_of(parse_timestamp(value))
    except (TypeError, ValueError) as exc:
        return None, f"{what}: {exc}"
    if t < 1:
        return None, f"{what} is before --start"
    return t, None


def raw_bytes(text: str) -> bytes:
    """The bytes a line of text was read from (``surrogateescape`` restores invalid
    UTF-8 bytes; any other lone surrogate, from a caller's own text, passes through)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def parse_user(obj: dict, user_field: str) -> tuple[str | None, str | None]:
    """The user id of an event object (``--user-field``), or why there is none."""
    if user_field not in obj:
        return None, f'an event needs a "{user_field}" user id (--user-field)'
    value = obj[user_field]
    if not isinstance(value, str) or not value:
        return None, (
            f'the user id "{user_field}" must be a non-empty string, got '
            f"{shorten(json.dumps(value, default=str))}"
        )
    if not valid_text(value):
        return None, "the user id is not valid UTF-8 text (it holds a lone surrogate)"
    return value, None
