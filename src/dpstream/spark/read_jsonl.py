"""JSON Lines events read by Spark with the local engine's decisions.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.events`. As the local
chunked reader (:mod:`dpstream.io.jsonl`) does with Arrow, a line is parsed in
the JVM (Spark's ``from_json``, Jackson) only when it provably parses the same
way there as in ``json.loads`` under the local rules; every other line goes, in
batches of such lines only, through the local one-line parser
:func:`dpstream.io.jsonl.parse_jsonl_line`, which decides it and words its
message.

The fast path
-------------
A line is taken by Spark SQL when all of these hold (integer steps ``"t"`` or
``--implicit-time``; with ``--time-field`` every line takes the local parser):

* the whole line matches :data:`FAST_LINE`: one object, written without white
  space other than spaces, whose values are strings, integers of at most 18
  digits without leading zeros (no fraction, no exponent), ``true``,
  ``false``, ``null`` or arrays of strings; no string holds a backslash (no
  escape), a control character or U+FFFD (which Spark reads for bytes that are
  not UTF-8, and which the local reader refuses as such). That is a regular
  subset of JSON on which Jackson and ``json.loads`` agree value for value
  (no trailing text, no single quotes, no ``NaN``, no leading zeros);
* no string holds a quote, so the keys are the matches of ``"KEY" *:``: the key
  ``"t"`` is there once with an integer value (none with implicit time),
  ``"items"`` once with an array value, the user field once with a non-empty
  string value (duplicate keys would pick the last value in one parser and
  maybe not in the other);
* Jackson's row then holds a step >= 1, items and a user id.

Everything else (blank lines, plain arrays, escapes, floats, integer items,
nested values, null items, a step below 1, invalid UTF-8...) takes the local
parser, as a pandas UDF over the bytes of those lines only (a null for every
line the fast path took: one pass over the input, nothing else crosses to
Python), from the line's bytes
(decoded as the local reader decodes them: UTF-8 with ``surrogateescape``).
Spark's text reader drops a byte-order mark at the start of a file, as the
local reader does.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ..io.chunks import INT64_MAX
from ..io.jsonl import parse_jsonl_line
from .order import numbered, split_marks

try:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["EVENT_SCHEMA", "FAST_LINE", "read_events_jsonl"]

#: What a reader gives: a record per line (pos from 0; error "" for a blank line that
#: is no record, null for an event).
EVENT_SCHEMA = T.StructType(
    [
        T.StructField("pos", T.LongType(), False),
        T.StructField("t", T.LongType(), True),
        T.StructField("items", T.ArrayType(T.StringType(), True), True),
        T.StructField("error", T.StringType(), True),
        T.StructField("user", T.StringType(), True),
    ]
)

_STRING = r'"[^"\\\x00-\x1f\x{fffd}]*+"'
_INT = r"-?+(?:0|[1-9][0-9]{0,17}+)"
_VALUE = rf"(?:{_STRING}|{_INT}|true|false|null|\[ *+(?:{_STRING}(?: *+, *+{_STRING})*+)?+ *+\])"
_PAIR = rf"{_STRING} *+: *+{_VALUE}"
#: A line the fast path may take (Java regex; see the module docstring).
FAST_LINE = rf"^\{{ *+(?:{_PAIR}(?: *+, *+{_PAIR})*+)?+ *+\}}$"


def _java_quote(text: str) -> str:
    """``text`` as a literal in a Java regex (every non-alphanumeric character escaped)."""
    return "".join(c if c.isalnum() and c.isascii() else f"\\x{{{ord(c):x}}}" for c in text)


def _key_count(key: str, value: str = "") -> Column:
    """How many times ``"key" :`` (followed by the regex ``value``) is in the line."""
    return F.regexp_count(F.col("value"), F.lit(f'"{_java_quote(key)}" *+:' + value))


def _fast_key(name: str | None) -> bool:
    """Whether a key is written the same in JSON as in the text (no escape needed)."""
    return name is not None and json.dumps(name, ensure_ascii=False)[1:-1] == name


def _fast_rule(implicit: bool, user_field: str | None) -> tuple[Column, Column]:
    """(the line may take the fast path, Jackson's row of it)."""
    fields = [
        T.StructField("t", T.LongType(), True),
        T.StructField("items", T.ArrayType(T.StringType(), True), True),
    ]
    if user_field is not None:
        fields.append(T.StructField(user_field, T.StringType(), True))
    parsed = F.from_json(F.col("value"), T.StructType(fields))
    ok = F.col("value").rlike(FAST_LINE)
    ok = ok & (_key_count("items") == 1) & (_key_count("items", r" *+\[") == 1)
    if implicit:
        ok = ok & (_key_count("t") == 0)
    else:
        ok = ok & (_key_count("t") == 1) & (_key_count("t", " *+-?+[0-9]") == 1)
    if user_field is not None:
        ok = ok & (_key_count(user_field) == 1) & (_key_count(user_field, ' *+"[^"]') == 1)
    return ok, parsed


#: Compressed files Spark's text reader inflates but the local engine reads as they are
#: (it inflates ``.gz`` only): refused, so that both engines read the same lines.
_OTHER_CODECS = (".bz2", ".xz", ".zst", ".lz4", ".snappy", ".deflate", ".br")


def _check_files(path: str, files: list[str]) -> None:
    """Refuse an input Spark would read differently from the local engine: no file at
    all (Spark skips names that begin with ``_`` or ``.`` even when given by name, and
    subfolders that are not ``key=value`` partitions), or a compression the local
    engine does not inflate."""
    if not files:
        raise ValueError(
            f"--engine spark finds no file to read in {path!r}: Spark skips files whose "
            "names begin with '_' or '.' and subfolders that are not key=value "
            "partitions; rename the input or run it on the local engine"
        )
    other = [f for f in files if f.lower().endswith(_OTHER_CODECS)]
    if other:
        raise ValueError(
            f"--engine spark reads plain or .gz JSON Lines, as the local engine does; "
            f"{other[0]!r} is compressed otherwise: decompress it (or use gzip)"
        )


def read_events_jsonl(
    spark: SparkSession,
    path: str,
    *,
    time_field: str | None = None,
    clock: Any = None,
    implicit: bool = False,
    user_field: str | None = None,
) -> DataFrame:
    """Parse a JSON Lines events file or directory (``*.gz`` too) as the local engine
    does (see the module docstring); the frame is cached (the caller unpersists it).

    Returns (pos, t, items, error, user): ``pos`` the line's place in the input
    (from 0; a directory's files in the order of their paths), ``error`` the parse
    problem (``""`` for a blank line, null for an event). With ``time_field`` and
    ``clock`` (a :class:`dpstream.clock.StepClock`), ``t`` is the step of the
    event's timestamp on that public clock; with ``implicit``, every line is a
    step: ``t`` is its line number (blank and broken lines too, as invalid records
    of their steps). With ``user_field``, ``user`` is each event's user id (an
    event without a valid one is an error row).

    One pass reads, parses and caches the lines with their splits
    (:mod:`dpstream.spark.order`); the line numbers are then found from that cache.
    """
    text = spark.read.text(path)
    _check_files(path, text.inputFiles())
    lines = split_marks(text)
    marks = ["_file", "_block", "_row"]
    slow_parse = _slow_udf(time_field, clock, implicit, user_field)
    raw = F.col("value").cast("binary")
    # Spark resolves field names ignoring case: a user field "T" or "Items" would be
    # ambiguous beside "t" and "items" in the fast path's schema (the parser decides)
    if clock is None and (
        user_field is None
        or (user_field.lower() not in ("", "t", "items") and _fast_key(user_field))
    ):
        ok, parsed = _fast_rule(implicit, user_field)
        staged = lines.select(*marks, "value", F.when(ok, parsed).alias("_j"))
        usable = F.col("_j.items").isNotNull()
        if not implicit:
            usable = usable & (F.col("_j.t") >= 1)
        if user_field is not None:
            uid = F.col("_j").getField(user_field)
            usable = usable & uid.isNotNull() & (F.length(uid) > 0)
        staged = staged.withColumn("_fast", F.coalesce(usable, F.lit(False)))
        staged = staged.select(
            *marks, "_fast", "_j", slow_parse(F.when(~F.col("_fast"), raw)).alias("_s")
        )

        def pick(name: str, fast: Any) -> Any:
            return F.when(F.col("_fast"), fast).otherwise(F.col(f"_s.{name}")).alias(name)

        user = F.col("_j").getField(user_field) if user_field else F.lit(None).cast("string")
        rows = staged.select(
            *marks,
            pick("t", F.col("_j.t")),
            pick("items", F.col("_j.items")),
            pick("error", F.lit(None).cast("string")),
            pick("user", user),
        )
    else:
        rows = lines.select(*marks, slow_parse(raw).alias("_s")).select(*marks, "_s.*")
    rows = rows.persist()
    try:
        out = numbered(spark, rows, path)
        if implicit:
            out = out.withColumn("t", F.col("pos") + 1)
        out = out.select("pos", "t", "items", "error", "user").cache()
        out.count()
    finally:
        rows.unpersist()
    return out


def _slow_udf(time_field: str | None, clock: Any, implicit: bool, user_field: str | None) -> Any:
    """A pandas UDF: each line's bytes (null: a line the fast path took) through the
    local engine's one-line parser, as (t, items, error, user)."""
    from pyspark.sql.functions import pandas_udf

    out_type = T.StructType([f for f in EVENT_SCHEMA.fields if f.name != "pos"])

    def parse(raw: pd.Series) -> pd.DataFrame:
        return _parse_lines(raw, time_field, clock, implicit, user_field)

    return pandas_udf(parse, out_type)  # type: ignore[call-overload]


def _parse_lines(
    raws: pd.Series,
    time_field: str | None,
    clock: Any,
    implicit: bool,
    user_field: str | None,
) -> pd.DataFrame:
    """Each line (its bytes; None: not this parser's) through the local engine's
    one-line parser (with implicit time, a line's step is its place in the input, set
    by the caller; the line number of a record is not used here)."""
    n = len(raws)
    ts: list[Any] = [None] * n
    items: list[Any] = [None] * n
    errors: list[Any] = [None] * n
    users: list[Any] = [None] * n
    for i, raw in enumerate(raws.tolist()):
        if raw is None:
            continue
        line = bytes(raw).decode("utf-8", "surrogateescape")
        rec = parse_jsonl_line(
            line,
            1,
            time_field=time_field,
            clock=clock,
            implicit=implicit,
            user_field=user_field,
        )
        if rec is None:  # a blank line
            errors[i] = ""
            continue
        # a step past int64 is past any horizon: kept as the largest (still invalid)
        ts[i] = None if rec.t is None else min(rec.t, INT64_MAX)
        items[i] = None if rec.items is None else list(rec.items)
        errors[i] = rec.error
        users[i] = rec.user
    return pd.DataFrame(
        {
            "t": pd.array(ts, dtype="Int64"),
            "items": items,
            "error": errors,
            "user": users,
        }
    )
