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
