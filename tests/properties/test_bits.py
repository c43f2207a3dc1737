"""The property tests' bit comparator (bits.py) sees what == does not, and names the first difference."""

from __future__ import annotations

import numpy as np
import pytest
from bits import assert_rows_same_bits, assert_same_bits, first_difference


def test_equal_bits_pass_including_the_same_nan():
    a = np.array([[1.0, -0.0, np.nan]], np.float32)
    assert first_difference(a, a.copy()) is None


def test_the_sign_of_zero_and_one_flipped_bit_are_differences_named_by_their_first_index():
    a = np.zeros((3, 4), np.float32)
    b = a.copy()
    b[1, 2] = -0.0  # == calls it equal
    b[2, 0] = np.nextafter(np.float32(0), np.float32(1))
    assert first_difference(a, b) == ("2 of 12 elements differ; the first at (1, 2): "
                                      "0.0 (bits 0x0) != -0.0 (bits 0x80000000)")


@pytest.mark.parametrize("b", [np.zeros((2, 3), np.float64), np.zeros((3, 2), np.float32)], ids=["dtype", "shape"])
def test_a_different_dtype_or_shape_is_a_difference(b):
    with pytest.raises(AssertionError, match="dtype|shape"):
        assert_same_bits(np.zeros((2, 3), np.float32), b)


def test_recorded_rows_are_compared_array_by_array_and_the_failing_one_named():
    full = {("block 0", "K"): np.arange(6, dtype=np.float32).reshape(3, 2)}
    assert_rows_same_bits(full, {("block 0", "K"): full["block 0", "K"][:2].copy()}, slice(0, 2))
    with pytest.raises(AssertionError, match=r"\('block 0', 'K'\): 1 of 4 elements differ; the first at \(1, 1\)"):
        assert_rows_same_bits(full, {("block 0", "K"): np.array([[0, 1], [2, 4]], np.float32)}, slice(0, 2))
