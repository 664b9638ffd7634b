"""The streaming best-per-segment tables: scores within a few ulps tie, ties go to the lowest grid index,
and the answer does not depend on how the candidates are chunked."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxplan.funnel.tables import SCORE_BITS_DROPPED, empty_table, merge_chunk, merge_tables, rank_key


def test_rank_key_hand_computed():
    # 1 + 2^-23 (one ulp above 1) and 1 + 63 ulps share 1's bucket; 1 + 64 ulps is the next bucket.
    ulp = 2.0**-23
    x = np.array([1.0, 1.0 + ulp, 1.0 + 63 * ulp, 1.0 + 64 * ulp, np.inf, -np.inf, 0.0], np.float32)
    key = rank_key(x)
    np.testing.assert_array_equal(key, np.array([1.0, 1.0, 1.0, 1.0 + 64 * ulp, np.inf, -np.inf, 0.0], np.float32))
    assert SCORE_BITS_DROPPED == 6
    np.testing.assert_array_equal(np.asarray(rank_key(jnp.asarray(x))), key)  # jax and numpy agree


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.floats(-1e6, 1e6, width=32, allow_subnormal=False), min_size=2, max_size=40))
def test_rank_key_is_monotone_and_close(values):
    x = np.sort(np.array(values, np.float32))
    key = rank_key(x)
    assert (np.diff(key) >= 0).all()  # never reverses an order
    np.testing.assert_allclose(key, x, rtol=2.0**-17, atol=0)  # and moves a score by < 2^-17 of it


def table_of(scores, digits, chunk):
    """Fold one segment's candidates [N] in chunks of `chunk`."""
    table = empty_table(1, 1)
    for start in range(0, len(scores), chunk):
        s = jnp.asarray(scores[start : start + chunk], jnp.float32)
        table = merge_chunk(table, jnp.zeros(s.shape, jnp.int32), s, jnp.asarray(digits[start : start + chunk, None], jnp.int32))
    return table


def test_near_ties_go_to_the_lowest_index_whatever_the_chunking():
    """Two candidates one ulp apart (as differently fused kernels give): the lower grid index wins,
    with its own score, whether the higher score comes first, last, or in another chunk."""
    ulp = np.float32(2.0**-23) * np.float32(5.0)
    scores = np.array([1.0, 5.0, 2.0, 5.0 + ulp, 3.0], np.float32)  # index 3 is one ulp above index 1
    digits = np.arange(5)
    for chunk in (1, 2, 3, 5):
        table = table_of(scores, digits, chunk)
        assert int(table.digits[0, 0]) == 1 and float(table.score[0]) == 5.0, chunk
    clear = np.array([1.0, 5.0, 2.0, 5.0 * (1 + 2.0**-15), 3.0], np.float32)  # far enough apart: the higher wins
    assert int(table_of(clear, digits, 2).digits[0, 0]) == 3


def test_merge_tables_is_order_free():
    ulp = np.float32(2.0**-23) * np.float32(5.0)
    a = table_of(np.array([5.0 + ulp], np.float32), np.array([4]), 1)
    b = table_of(np.array([5.0], np.float32), np.array([2]), 1)
    for first, second in ((a, b), (b, a)):
        merged = merge_tables(first, second)
        assert int(merged.digits[0, 0]) == 2 and float(merged.score[0]) == 5.0
