"""records/arrays.py reads Arrow arrays as pyarrow's own conversion does, without pandas."""

import numpy as np
import pyarrow as pa
import pytest

from kvscope.records.arrays import flags, numbers

KINDS = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint32(), pa.uint64(), pa.float32(),
         pa.float64()]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_numbers_equal_pyarrows_own_conversion_sliced_or_whole(kind: pa.DataType) -> None:
    array = pa.array([0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89], kind)
    for piece in (array, array.slice(3), array.slice(2, 5), array.slice(11)):
        got = numbers(piece)
        assert got.dtype == piece.to_numpy().dtype
        np.testing.assert_array_equal(got, piece.to_numpy())


def test_nulls_take_the_fill_or_are_refused() -> None:
    array = pa.array([1.5, None, 3.0, None, 7.0]).slice(1)
    got = numbers(array, fill=np.nan)
    np.testing.assert_array_equal(got, [np.nan, 3.0, np.nan, 7.0])
    np.testing.assert_array_equal(numbers(pa.array([4, None, 6], pa.int32()), fill=0), [4, 0, 6])
    np.testing.assert_array_equal(numbers(pa.nulls(3, pa.float64()), fill=-1.0), [-1, -1, -1])
    with pytest.raises(ValueError, match="nulls"):
        numbers(array)


def test_other_types_are_refused() -> None:
    with pytest.raises(ValueError, match="not a fixed-width number array"):
        numbers(pa.array(["a"]))
    with pytest.raises(ValueError, match="not a boolean array"):
        flags(pa.array([1]))


def test_flags_unpack_a_sliced_bitmap() -> None:
    values = [i % 3 == 0 or i == 10 for i in range(21)]
    array = pa.array(values)
    for lo, hi in ((0, 21), (3, 21), (5, 14), (9, 10), (21, 21)):
        got = flags(array.slice(lo, hi - lo))
        assert got.dtype == bool
        assert got.tolist() == values[lo:hi]
