"""Arrow's JSON reader over a chunk's screened JSON Lines, and Arrow arrays read as NumPy.

Layer 6 of dpstream (an edge). :mod:`dpstream.io.jsonl` gives :func:`arrow_rows`
only the lines that passed its screen (see its docstring); Arrow parses them
with the schema ``t: int64, items: list<string>`` (and the ``--user-field``
as a string) in one call. The buffer
readers :func:`arrow_ints` and :func:`arrow_valid` read Arrow's memory directly
(``to_numpy`` imports pandas on its first call when it is installed).
"""

from __future__ import annotations

import io as _io
from typing import Any

import numpy as np

__all__ = ["arrow_rows", "event_rows", "arrow_ints", "arrow_valid"]


def arrow_rows(
    buf: bytes,
    starts: np.ndarray,
    ends: np.ndarray,
    fast: np.ndarray,
    user_field: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any, Any] | None:
    """Parse the fast lines with Arrow: (t, t given, items usable, offsets, values,
    users), or None (no pyarrow, or the reader refused the chunk: parse it line by
    line). With ``user_field`` the schema also reads that field as a string (any
    other type makes the reader refuse the chunk), ``users`` is the column, and a
    row without a non-empty user id is not usable (the per-line parser words it);
    else ``users`` is None."""
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:
        return None
    idx = np.flatnonzero(fast)
    if idx.size == fast.size:
        data = buf
    else:
        mv = memoryview(buf)
        data = b"\n".join(
            mv[a:b] for a, b in zip(starts[idx].tolist(), ends[idx].tolist(), strict=True)
        )
    fields = [("t", pa.int64()), ("items", pa.list_(pa.string()))]
    if user_field is not None:
        fields.append((user_field, pa.string()))
    schema = pa.schema(fields)
    try:
        table = pj.read_json(
            _io.BytesIO(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 64),
            parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != idx.size:
        return None
    users = None if user_field is None else table.column(user_field).combine_chunks()
    return event_rows(
        table.column("t").combine_chunks(), table.column("items").combine_chunks(), users
    )


def event_rows(
    tcol: Any, icol: Any, users: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any, Any]:
    """Events from their Arrow columns (int64 steps, lists of strings, string user ids or
    None): (t, t given, items usable, offsets, values, users). A row is usable when it
    has a step >= 1, a list of items none of them null and (with users) a non-empty user
    id; why another is not, the per-line parser words."""
    t_given = arrow_valid(tcol)
    t = np.where(t_given, arrow_ints(tcol), 0)
    usable = arrow_valid(icol)
    offsets = arrow_ints(icol.offsets)
    values = icol.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    if values.null_count:
        null_at = np.flatnonzero(~arrow_valid(values))
        usable[np.searchsorted(offsets, null_at, side="right") - 1] = False
    usable &= t_given & (t >= 1)
    if users is not None:
        import pyarrow.compute as pc

        usable &= arrow_valid(users) & (arrow_ints(pc.binary_length(users)) > 0)
    return t, t_given, usable, offsets, values, users


def arrow_ints(arr: Any) -> np.ndarray:
    """The value slots of a signed-integer Arrow array as int64 (a null's slot holds
    anything), read from its data buffer.

    ``to_numpy`` would do, but its first call in a process imports pandas when it
    is installed (~0.3 s of every command's start); reading the buffer does not.
    """
    import pyarrow as pa

    if not pa.types.is_signed_integer(arr.type):
        raise TypeError(f"expected a signed-integer Arrow array, got {arr.type}")
    n = len(arr)
    data = arr.buffers()[1]
    if n == 0 or data is None:
        return np.zeros(n, dtype=np.int64)
    dtype = np.dtype(f"=i{arr.type.bit_width // 8}")  # Arrow's memory: the machine's order
    return np.frombuffer(data, dtype=dtype, count=arr.offset + n)[arr.offset :].astype(np.int64)


def arrow_valid(arr: Any) -> np.ndarray:
    """Which entries of an Arrow array are not null, as a bool array (its validity
    bitmap unpacked; see :func:`arrow_ints` for why not ``is_null().to_numpy()``)."""
    import pyarrow as pa

    n = len(arr)
    if pa.types.is_null(arr.type):  # no buffers: every entry is null
        return np.zeros(n, dtype=bool)
    bitmap = arr.buffers()[0]
    if arr.null_count == 0 or bitmap is None:
        return np.ones(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[arr.offset : arr.offset + n].astype(bool)
