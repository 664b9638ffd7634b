"""Small array helpers tuned for XLA:CPU (integer division by a static block size, cumsum)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

I32 = jnp.int32
F32 = jnp.float32


def cdiv(a, b: int):
    """ceil(a / b) for a >= 0 and a static b (a shift when b is a power of two)."""
    return div(a + (b - 1), b)


def div(a, b: int):
    """a // b for a >= 0 and a static b."""
    if b & (b - 1) == 0:
        return a >> (b.bit_length() - 1)
    return a // b


def mod(a, b: int):
    """a % b for a static b (also right for negative a)."""
    if b & (b - 1) == 0:
        return a & (b - 1)
    return a % b


def cumsum(x):
    """Inclusive cumulative sum along the last axis, as one matmul with a triangular matrix.

    XLA:CPU lowers jnp.cumsum to an O(n^2) reduce-window; a float32 dot is a
    single fast op. Integer inputs are exact while every partial sum stays
    below 2**24 (callers only compare partial sums against smaller bounds,
    and a sum of non-negative terms that is exact below 2**24 stays above it
    once it passes it).
    """
    n = x.shape[-1]
    upper = jnp.triu(jnp.ones((n, n), F32))
    out = jnp.matmul(x.astype(F32), upper, precision=jax.lax.Precision.HIGHEST)
    return out.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.integer) else out


def materialize(*xs):
    """Compute these arrays once: XLA would otherwise re-run their producers inside
    every consumer fusion (e.g. once per field of a scatter)."""
    return jax.lax.optimization_barrier(xs)
