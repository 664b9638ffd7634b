"""The replay's small integer helpers against plain-Python brute force."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.replay.ops import ceil_sum, div_small, euclid_rounds


def _brute(k, c, g, bs):
    return [sum(-(-(cc + j * gg) // bs) for j in range(1, kk + 1)) for kk, cc, gg in zip(k, c, g)]


@pytest.mark.parametrize("bs", [1, 2, 3, 7, 13, 16, 64, 100])
def test_ceil_sum_matches_brute_force(bs):
    rng = np.random.default_rng(bs)
    n = 1500
    k = rng.integers(0, 160, n)
    c = rng.integers(0, 200_000, n)
    g = rng.integers(0, 9000, n)
    small = rng.random(n) < 0.4  # slopes near the block size exercise the Euclid rounds
    g[small] = rng.integers(0, 3 * bs, small.sum())
    k[:3], g[3:6], c[6:9] = 0, 0, 0  # edges: no steps, no growth, empty KV
    got = jax.jit(lambda k, c, g: ceil_sum(k, c, g, bs))(*(jnp.asarray(x, jnp.int32) for x in (k, c, g)))
    np.testing.assert_array_equal(np.asarray(got), _brute(k, c, g, bs))


@pytest.mark.parametrize("bs, max_k", [(1, 128), (7, 40), (16, 128), (32, 64)])
def test_ceil_sum_table_matches_brute_force_and_euclid(bs, max_k):
    """With a bound on k the remainders' sum is looked up (the replay's jump, k <= window): the same
    integers as brute force and as the Euclid path, k = max_k and remainders bs - 1 included."""
    from jaxplan.replay.ops import CEIL_SUM_TABLE_MAX_ENTRIES, _ceil_sum_euclid, _ceil_sum_table

    assert bs * bs * (max_k + 1) <= CEIL_SUM_TABLE_MAX_ENTRIES
    rng = np.random.default_rng(bs + max_k)
    n = 2000
    k = rng.integers(0, max_k + 1, n)
    c = rng.integers(0, 200_000, n)
    g = rng.integers(0, 9000, n)
    small = rng.random(n) < 0.4
    g[small] = rng.integers(0, 3 * bs, small.sum())
    k[:3], g[3:6], c[6:9] = 0, 0, 0
    k[9:12], c[9:12], g[9:12] = max_k, bs - 1, bs - 1  # the table's last entries
    args = tuple(jnp.asarray(x, jnp.int32) for x in (k, c, g))
    table = jax.jit(lambda k, c, g: _ceil_sum_table(k, c, g, bs, max_k))(*args)
    np.testing.assert_array_equal(np.asarray(table), _brute(k, c, g, bs))
    np.testing.assert_array_equal(np.asarray(table), np.asarray(_ceil_sum_euclid(*args, bs)))
    np.testing.assert_array_equal(np.asarray(ceil_sum(*args, bs, max_k=max_k)), np.asarray(table))


def test_ceil_sum_large_block_falls_back_to_euclid():
    """A block size whose table would pass CEIL_SUM_TABLE_MAX_ENTRIES takes the Euclid path: no
    table of that size is built, and the sums stay exact."""
    from jaxplan.replay import ops

    bs, max_k = 256, 128
    assert bs * bs * (max_k + 1) > ops.CEIL_SUM_TABLE_MAX_ENTRIES
    built = []
    original = ops.remainder_ceil_sums
    ops.remainder_ceil_sums = lambda *a: built.append(a) or original(*a)
    try:
        k, c, g = np.array([0, 5, 128]), np.array([3, 1000, 70_000]), np.array([1, 300, 255])
        got = ceil_sum(*(jnp.asarray(x, jnp.int32) for x in (k, c, g)), bs, max_k=max_k)
    finally:
        ops.remainder_ceil_sums = original
    assert built == []
    np.testing.assert_array_equal(np.asarray(got), _brute(k, c, g, bs))


def test_ceil_sum_worst_case_euclid_pairs():
    """Consecutive Fibonacci numbers need the most Euclid rounds: slope 8 against block 13."""
    assert euclid_rounds(13) == 5 and euclid_rounds(16) == 4
    k, c, g = np.arange(1, 200), np.arange(199) * 7, np.full(199, 8)
    got = ceil_sum(jnp.asarray(k, jnp.int32), jnp.asarray(c, jnp.int32), jnp.asarray(g, jnp.int32), 13)
    np.testing.assert_array_equal(np.asarray(got), _brute(k, c, g, 13))


def test_div_small_is_exact_floor_division():
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.integers(0, 1 << 24, 20_000), np.arange(0, 5000)])
    b = np.concatenate([rng.integers(1, 5000, 20_000), np.full(5000, 7)])
    np.testing.assert_array_equal(np.asarray(div_small(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))), a // b)


@pytest.mark.parametrize("n", [64, 128, 256, 512, 1024])
def test_cumsum_matches_numpy_on_both_paths(n):
    """One triangular matmul up to 128 slot rows, blocks of 16 past that: both give the exact integer
    running sums (here up to ~2**22) and the same floats for integer-valued float32 input."""
    from jaxplan.replay.ops import CUMSUM_BLOCK, SINGLE_MATMUL_MAX, cumsum

    rng = np.random.default_rng(n)
    x = rng.integers(0, 4096, (2, 3, n)).astype(np.int32)
    x[0, 0, : n // 2] = 0  # runs of zeros and a block boundary inside them
    got = np.asarray(cumsum(jnp.asarray(x)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.cumsum(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(cumsum(jnp.asarray(x.astype(np.float32)))), np.cumsum(x, axis=-1).astype(np.float32))
    assert (n > SINGLE_MATMUL_MAX) == (n >= 2 * SINGLE_MATMUL_MAX) and n % CUMSUM_BLOCK == 0


def test_gather_rows_places_each_part_and_leaves_the_rest_empty():
    """The replay's table compaction against a plain loop: rows of two parts sent to distinct
    destinations (num_slots: dropped), the rows nothing is sent to as `empty_rows` makes them."""
    from jaxplan.replay.state import NF, NI, K, empty_rows, gather_rows

    rng = np.random.default_rng(3)
    num_s = 12
    parts = [(rng.integers(0, 99, (num_s, NI)).astype(np.int32), rng.random((num_s, NF)).astype(np.float32)) for _ in range(2)]
    order = rng.permutation(num_s)
    dests = [np.full(num_s, num_s), np.full(num_s, num_s)]  # num_s: not sent anywhere
    dests[0][:5], dests[1][:4] = order[:5], order[5:9]
    want_i, want_f = (np.array(x) for x in empty_rows(num_s))
    for (ints, floats), dest in zip(parts, dests):
        for j, d in enumerate(dest):
            if d < num_s:
                want_i[d], want_f[d] = ints[j], floats[j]
    got_i, got_f = jax.jit(lambda p, d: gather_rows(p, d, num_s))([tuple(map(jnp.asarray, p)) for p in parts], [jnp.asarray(d, jnp.int32) for d in dests])
    np.testing.assert_array_equal(np.asarray(got_i), want_i)
    np.testing.assert_array_equal(np.asarray(got_f), want_f)
    assert int((np.asarray(got_i)[:, K] == -1).sum()) == num_s - 9  # K = -1 marks the 3 empty rows


def test_stream_rows_are_the_rows_requests_enter_with_and_widen_keeps_positions():
    """Row j of `stream_rows` is stream position j - S with its prompt, output and hit tokens and
    nothing computed; widening by `extra` adds empty requests at both ends and keeps every row's position."""
    from jaxplan.replay.state import COMP, HIT, NI, NPRE, OSL, OUT, PROMPT, STEP_FIRST, K, stream_rows, widen_stream_rows

    stream = np.array([[100, 7, 16], [50, 3, 0]], np.int32)  # two requests: (prompt, osl, hit)
    rows = np.asarray(stream_rows(jnp.asarray(stream), 2))
    assert rows.shape == (2 + 2 + 2, NI)
    np.testing.assert_array_equal(rows[:, K], [-2, -1, 0, 1, 2, 3])
    np.testing.assert_array_equal(rows[2:4][:, [PROMPT, OSL, HIT]], stream)
    np.testing.assert_array_equal(rows[[0, 1, 4, 5]][:, [PROMPT, OSL, HIT]], 0)
    np.testing.assert_array_equal(rows[:, [COMP, OUT, NPRE]], 0)
    np.testing.assert_array_equal(rows[:, STEP_FIRST], -1)
    wide = np.asarray(widen_stream_rows(jnp.asarray(np.stack([rows, rows])), 2, 3))  # a leading lane axis
    assert wide.shape == (2, 3 + 6 + 3, NI)
    np.testing.assert_array_equal(wide[1], np.asarray(stream_rows(jnp.asarray(stream), 5)))
