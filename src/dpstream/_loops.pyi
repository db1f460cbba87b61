"""Types of the optional C module ``dpstream._loops`` (built from _loops.c; see dpstream.compiled).

Arrays must be C-contiguous with the dtype named; ``out`` and the other written
arrays are filled in place. ``data``, ``offsets`` and ``slots`` are an item table's
(see dpstream.mechanisms.item_table): bytes, offsets uint32 or int64, slots uint32
or uint64.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]
_U64 = npt.NDArray[np.uint64]
_Array = npt.NDArray[Any]

def ziggurat(
    blocks: _U64,
    out: _F64,
    scaled: _F64,
    limit: _F64,
    bottom: _F64,
    rise: _F64,
    pending: _I64,
    close: _I64,
    tail_probability: float,
    /,
) -> tuple[int, int, int]: ...
def item_lookup(
    items: Sequence[object], key: _U64, data: _Array, offsets: _Array, slots: _Array, out: _I64, /
) -> None: ...
def item_insert(
    key: _U64, data: _Array, offsets: _Array, slots: _Array, first: int, last: int, /
) -> None: ...
def item_prefix_equals(
    items: Sequence[object], data: _Array, offsets: _Array, n: int, /
) -> bool: ...
def item_strings(data: _Array, offsets: _Array, positions: _I64, /) -> list[str]: ...
def join_rows(
    data: _Array,
    offsets: _Array,
    values: _I64,
    head: Buffer,
    mid: Buffer,
    tail: Buffer,
    sep: Buffer,
    first: Buffer = ...,
    last: Buffer = ...,
    /,
) -> bytes: ...
def set_ndtri(capsule: object, /) -> None: ...
def ndtri_into(p: _F64, out: _F64, /) -> None: ...
def ziggurat_restarts(words: _U64, pending: _I64, out: _F64, /) -> None: ...
def unique_codes(codes: _I64, scratch: _I64, used: _I64, inverse: _I64, /) -> int: ...
def flatten_events(
    events: Sequence[Sequence[object]], offsets: _I64, /
) -> list[str | int | bytes] | None: ...
def siphash13(key: Buffer, data: Buffer, /) -> int: ...
def sha256_sum(
    items: Sequence[object], prefix: Buffer, encode: Callable[[Any], bytes], /
) -> tuple[int, int]: ...
def blake2b_ids(
    items: Sequence[object], key: Buffer, encode: Callable[[Any], bytes], out: _U64, /
) -> None: ...
def sha256_portable(flag: bool, /) -> bool: ...
def blt_step(theta: _F64, omega: _F64, buffers: _F64, total: _F64, z: _F64, /) -> None: ...
def event_duplicates(cols: _I64, offsets: _I64, keep: _Array, distinct: _I64, /) -> int: ...
def top_k(values: _F64, out: _I64, /) -> bool: ...
def user_bound(
    keys: _I64,
    counts: _Array,
    n_users: int,
    n_items: int,
    uidx: _I64,
    user_of: _I64,
    iidx: _I64,
    codes: _I64,
    offsets: _I64,
    first: _Array | None,
    l0: int,
    linf: int,
    held: _I64,
    keep: _Array,
    pair_user: _I64,
    pair_code: _I64,
    pair_count: _I64,
    pair_before: _I64,
    /,
) -> tuple[int, int, int, int]: ...
def pair_store(
    keys: _I64, counts: _Array, new_keys: _I64, new_counts: _I64, filled: int, /
) -> int: ...
