"""JSON Lines events read by Spark with the local engine's decisions.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.events`. Spark reads
the lines (its text reader, in splits) and marks each with its split and row
(:mod:`dpstream.spark.order`); one ``mapInArrow`` pass then gives each line's
bytes, a batch at a time, to the local engine's own decisions, in the Python
workers:

* the local one-line parser :func:`dpstream.io.jsonl.parse_jsonl_line` decides
  every line (and words its message), decoded as the local reader decodes it
  (UTF-8 with ``surrogateescape``);
* except a plain event, which is taken as it is: a line of at most
  ``_FAST_MAX_CHARS`` bytes and ``_FAST_MAX_BRACKETS`` brackets that orjson
  parses (valid UTF-8, JSON whitespace only around it) into an object whose
  ``"t"`` is an integer >= 1 and whose ``"items"`` is an array of strings (and,
  with ``--user-field``, whose user id is a non-empty string), every string
  free of lone surrogates. ``parse_jsonl_line`` parses such a line with orjson
  too (same text, same bounds) and gives that very record, so skipping it
  changes nothing but the time (:func:`plain_event`).

With ``--time-field`` or ``--implicit-time`` every line takes the one-line
parser. Spark's text reader drops a byte-order mark at the start of a file, as
the local reader does. Nothing but the lines' bytes and the records cross
between the JVM and Python (Arrow batches, no pandas).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from ..io.chunks import INT64_MAX
from ..io.jsonl import _FAST_MAX_BRACKETS, _FAST_MAX_CHARS, parse_jsonl_line
from ..io.records import valid_text
from .order import numbered, split_marks
from .paths import input_files, literal_path, strict_reader

_orjson: Any
try:  # the parser the local engine tries first (a dependency)
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = [
    "EVENT_SCHEMA",
    "ZONE_RULES_MISMATCH",
    "parsed_lines",
    "plain_event",
    "read_events_jsonl",
    "zone_rules",
]

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

#: Compressed files Spark's text reader inflates but the local engine reads as they are
#: (it inflates ``.gz`` only, in any case): refused, so that both engines read the same
#: lines. Where Spark runs on a JVM, Hadoop's own codec lookup is asked instead, which
#: also knows the codecs an operator registers (``io.compression.codecs``).
_OTHER_CODECS = (".bz2", ".xz", ".zst", ".lz4", ".snappy", ".deflate", ".br")


def _check_files(spark: SparkSession, path: str, files: list[str]) -> None:
    """Refuse an input Spark would read differently from the local engine: no file at
    all (Spark skips names that begin with ``_`` or ``.`` even when given by name), or
    a compression the local engine does not inflate."""
    if not files:
        fix = (  # the local engine reads no JSON Lines folder
            "rename its files"
            if os.path.isdir(path)
            else "rename the input or run it on the local engine"
        )
        raise ValueError(
            f"--engine spark finds no file to read in {path!r}: Spark skips files whose "
            f"names begin with '_' or '.'; {fix}"
        )
    other = [f for f in files if _compressed_otherwise(spark, f)]
    if other:
        raise ValueError(
            f"--engine spark reads plain or .gz JSON Lines, as the local engine does; "
            f"{other[0]!r} is compressed otherwise: decompress it (or use gzip)"
        )


def input_text(spark: SparkSession, path: str) -> DataFrame:
    """The input's lines as Spark's text reader gives them (``value``), read by the file's
    or folder's own name and failing on a corrupt file (:mod:`dpstream.spark.paths`),
    after :func:`_check_files` has refused what the local engine would read otherwise.

    A local directory's files are listed here (:func:`dpstream.spark.paths.input_files`)
    and Spark is given that list: no partition discovery, so a ``key=value`` folder
    neither hides the files beside it nor fails beside a plain folder. A path on
    another file system is listed by Spark, recursively (which infers no partitions)."""
    files = input_files(path)
    if files == []:
        _check_files(spark, path, files)  # refuses: an empty folder
    reader = strict_reader(spark)
    if files is None:
        text = reader.option("recursiveFileLookup", "true").text(literal_path(path))
    else:
        text = reader.text([literal_path(f) for f in files])
    read = text.inputFiles()
    if files and read and len(read) != len(files):
        raise ValueError(
            f"--engine spark would read {len(read)} of the {len(files)} files of "
            f"{path!r} (Spark skips some names, such as '*._COPYING_'); rename them"
        )
    _check_files(spark, path, read)
    return text


def _compressed_otherwise(spark: SparkSession, uri: str) -> bool:
    """Whether Spark would inflate ``uri`` with a codec other than gzip: by Hadoop's
    codec lookup (its suffixes, in any case, and the codecs the configuration
    registers), or by :data:`_OTHER_CODECS` where there is no JVM (Spark Connect)."""
    try:
        jvm: Any = spark.sparkContext._jvm
        factory = jvm.org.apache.hadoop.io.compress.CompressionCodecFactory(
            spark.sparkContext._jsc.hadoopConfiguration()
        )
        codec = factory.getCodec(jvm.org.apache.hadoop.fs.Path(uri))
    except Exception:  # no SparkContext (Spark Connect) or no JVM view
        return uri.lower().endswith(_OTHER_CODECS)
    return codec is not None and codec.getClass().getName() != _GZIP_CODEC


#: Hadoop's gzip codec: the one compression both engines inflate.
_GZIP_CODEC = "org.apache.hadoop.io.compress.GzipCodec"


def read_events_jsonl(
    spark: SparkSession,
    path: str,
    *,
    time_field: str | None = None,
    clock: Any = None,
    implicit: bool = False,
    user_field: str | None = None,
    through: int | None = None,
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
    event without a valid one is an error row). With ``through`` (the last step the
    run releases) and a clock whose steps follow a named zone's rules, every
    worker's time zone database must date steps 1..``through`` as the driver's does
    (:func:`zone_rules`), or the job fails; such a clock needs ``through``.

    One pass reads, parses and caches the lines with their splits
    (:mod:`dpstream.spark.order`); the line numbers are then found from that cache.
    """
    rows = parsed_lines(
        spark,
        path,
        time_field=time_field,
        clock=clock,
        implicit=implicit,
        user_field=user_field,
        through=through,
    ).persist()
    try:
        out = numbered(spark, rows, path)
        if implicit:
            out = out.withColumn("t", F.col("pos") + 1)
        out = out.select("pos", "t", "items", "error", "user").cache()
        out.count()
    finally:
        rows.unpersist()
    return out


def parsed_lines(
    spark: SparkSession,
    path: str,
    *,
    time_field: str | None = None,
    clock: Any = None,
    implicit: bool = False,
    user_field: str | None = None,
    through: int | None = None,
) -> DataFrame:
    """The input's lines parsed (not cached), each with its marks instead of ``pos``
    (``_file``, ``_block``, ``_row``: :func:`dpstream.spark.order.split_marks`), ``t``
    null with ``implicit``; :func:`read_events_jsonl` numbers them (and says what
    ``through`` checks)."""
    rules = zone_rules(clock, through)
    lines = split_marks(input_text(spark, path)).select(
        "_file", "_block", "_row", F.col("value").cast("binary").alias("value")
    )
    return lines.mapInArrow(_arrow_parser(time_field, clock, implicit, user_field, rules), _MARKED)


#: The parsed lines with their marks (:func:`dpstream.spark.order.split_marks`).
_MARKED = T.StructType(
    [
        T.StructField("_file", T.StringType(), True),
        T.StructField("_block", T.LongType(), True),
        T.StructField("_row", T.LongType(), True),
        *(f for f in EVENT_SCHEMA.fields if f.name != "pos"),
    ]
)


#: The words that begin the error of a worker whose zone database disagrees with the
#: driver's (the driver finds them in Spark's exception and says them as they are).
ZONE_RULES_MISMATCH = "this Spark worker's time zone database"

#: The (clock, through, digest) a worker process has checked (once per process).
_zone_rules_checked: set[tuple[Any, int, str]] = set()


def zone_rules(clock: Any, through: int | None) -> tuple[int, str] | None:
    """On the driver: (through, digest of the instants where steps 1..through begin and
    end, by the driver's zone database), for a clock whose steps follow a named zone's
    rules (:meth:`dpstream.clock.StepClock.zone_rules_digest`); None otherwise.

    Each worker dates events by its own time zone database. Where it holds other
    rules than the driver's (another ``tzdata``, other system zone files), an event
    near a boundary would be counted in one step while the output dates that step by
    the driver's rules: the workers check this digest before they parse a line."""
    if clock is None or clock.zone_rules_digest(0) is None:
        return None
    if through is None:
        raise ValueError(
            f"a clock whose steps follow the time zone {clock.named_zone}'s rules needs "
            "through= (the last step the run releases), so that the workers can check "
            "their time zone database against the driver's"
        )
    return through, clock.zone_rules_digest(through)


def _check_zone_rules(clock: Any, rules: tuple[int, str] | None) -> None:
    """In a worker: raise ValueError unless its zone database gives the driver's digest."""
    if rules is None:
        return
    through, digest = rules
    if (clock, through, digest) in _zone_rules_checked:
        return
    if clock.zone_rules_digest(through) != digest:
        import socket

        raise ValueError(
            f"{ZONE_RULES_MISMATCH} (on {socket.gethostname()}) puts the steps 1 to "
            f"{through} of the time zone {clock.named_zone} at other times than the "
            "driver's does: events would be counted in other steps than the ones the "
            "output dates. Give the driver and every worker the same time zone database "
            "(the same `tzdata` package, or PYTHONTZPATH)."
        )
    _zone_rules_checked.add((clock, through, digest))


def _arrow_parser(
    time_field: str | None,
    clock: Any,
    implicit: bool,
    user_field: str | None,
    rules: tuple[int, str] | None = None,
) -> Any:
    """The ``mapInArrow`` function: each batch's lines (``value``, their bytes) parsed
    (:func:`parse_lines`), their marks passed through; first, with ``rules``, the
    worker's zone database checked (:func:`zone_rules`)."""

    def parse(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        _check_zone_rules(clock, rules)
        for batch in batches:
            ts, items, errors, users = parse_lines(
                batch.column("value").to_pylist(),
                time_field,
                clock,
                implicit,
                user_field,
            )
            yield pa.RecordBatch.from_arrays(
                [
                    batch.column("_file"),
                    batch.column("_block"),
                    batch.column("_row"),
                    pa.array(ts, pa.int64()),
                    pa.array(items, pa.list_(pa.string())),
                    pa.array(errors, pa.string()),
                    pa.array(users, pa.string()),
                ],
                names=_MARKED.names,
            )

    return parse


def plain_event(raw: bytes, user_field: str | None = None) -> tuple[int, list, Any] | None:
    """(t, items, user) of a plain event line (see the module docstring), which
    :func:`parse_jsonl_line` would give as that record; None: let it decide."""
    size = len(raw)  # a line of at most _FAST_MAX_BRACKETS bytes has no more brackets
    if _orjson is None or (
        size > _FAST_MAX_BRACKETS
        and (size > _FAST_MAX_CHARS or raw.count(b"[") + raw.count(b"{") > _FAST_MAX_BRACKETS)
    ):
        return None
    try:
        obj = _orjson.loads(raw)
    except _orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    t, items = obj.get("t"), obj.get("items")
    if type(t) is not int or t < 1 or type(items) is not list:
        return None
    for x in items:
        if type(x) is not str:
            return None
    user = None
    if user_field is not None:
        user = obj.get(user_field)
        if type(user) is not str or not user:
            return None
    if b"\\u" in raw and not all(valid_text(x) for x in (*items, user or "")):
        return None  # a lone surrogate escape: the parser words it
    return (t if t <= INT64_MAX else INT64_MAX), items, user


def parse_lines(
    raws: list[Any],
    time_field: str | None,
    clock: Any,
    implicit: bool,
    user_field: str | None,
) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """Each line (its bytes) as the local engine decides it: (t, items, error, user)
    lists (error ``""`` for a blank line; with implicit time, a line's step is its
    place in the input, set by the caller; the line number of a record is not used
    here)."""
    n = len(raws)
    ts: list[Any] = [None] * n
    items: list[Any] = [None] * n
    errors: list[Any] = [None] * n
    users: list[Any] = [None] * n
    plain = clock is None and not implicit
    for i, raw in enumerate(raws):
        if plain:
            got = plain_event(raw, user_field)
            if got is not None:
                ts[i], items[i], users[i] = got
                continue
        line = raw.decode("utf-8", "surrogateescape")
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
    return ts, items, errors, users
