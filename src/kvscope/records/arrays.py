"""Arrow arrays as numpy arrays, read from their buffers: no pandas.

pyarrow's own conversions (Array.to_numpy, np.asarray on an Array, pa.array) pass through its
pandas bridge, which imports pandas where it is installed: ~0.3 s of CPU and ~45 MB the first
time in a process, paid by a replay or a reader that never needs pandas. These read what they
need straight from the array's buffers:

- `numbers(array, fill)`: a fixed-width integer or floating array, as a read-only zero-copy
  view of its data buffer where it has no nulls; with nulls, a copy with `fill` in their
  place (a `ValueError` without a `fill`, or for another type);
- `flags(array)`: a boolean array without nulls, its bits unpacked.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def numbers(array: pa.Array, fill: float | None = None) -> np.ndarray:
    """The values of a fixed-width integer or floating array; nulls as `fill` (see above)."""
    kind = array.type
    if pa.types.is_integer(kind):
        dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(kind) else 'u'}{kind.bit_width // 8}")
    elif pa.types.is_floating(kind) and kind.bit_width in (32, 64):
        dtype = np.dtype(f"f{kind.bit_width // 8}")
    else:
        raise ValueError(f"not a fixed-width number array: {kind}")
    if array.null_count and fill is None:
        raise ValueError(f"{array.null_count} nulls")
    data = array.buffers()[1]
    if data is None or not len(array):
        return np.full(len(array), fill, dtype) if len(array) else np.zeros(0, dtype)
    values = np.frombuffer(data, dtype)[array.offset : array.offset + len(array)]
    if array.null_count:
        values = np.where(flags(array.is_valid()), values, np.array(fill).astype(dtype))
    return values


def flags(array: pa.Array) -> np.ndarray:
    """The values of a boolean array without nulls."""
    if not pa.types.is_boolean(array.type):
        raise ValueError(f"not a boolean array: {array.type}")
    if array.null_count:
        raise ValueError(f"{array.null_count} nulls")
    data = array.buffers()[1]
    if data is None or not len(array):
        return np.zeros(0, bool)
    bits = np.unpackbits(
        np.frombuffer(data, np.uint8), count=array.offset + len(array), bitorder="little"
    )
    return bits[array.offset :].view(bool)
