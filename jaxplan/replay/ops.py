"""Small array helpers tuned for XLA:CPU (integer division by a static block size, cumsum)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

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
    """Inclusive cumulative sum along the last axis, as one matmul with a triangular matrix (past
    SINGLE_MATMUL_MAX, two smaller ones: `_blocked_cumsum`).

    XLA:CPU lowers jnp.cumsum to an O(n^2) reduce-window; a float32 dot is a
    single fast op. Integer inputs are exact while every partial sum stays
    below 2**24 (callers only compare partial sums against smaller bounds,
    and a sum of non-negative terms that is exact below 2**24 stays above it
    once it passes it).
    """
    n = x.shape[-1]
    if n > SINGLE_MATMUL_MAX and n % CUMSUM_BLOCK == 0:
        out = _blocked_cumsum(x.astype(F32))
    else:
        upper = jnp.triu(jnp.ones((n, n), F32))
        out = jnp.matmul(x.astype(F32), upper, precision=jax.lax.Precision.HIGHEST)
    return out.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.integer) else out


# One n x n triangular matmul costs n^2 per row: cheapest up to 128 slot rows; past that (256, 512
# rows) the sums within blocks of 16, plus the running sum of the block totals, cost n x 16 + (n/16)^2.
SINGLE_MATMUL_MAX = 128
CUMSUM_BLOCK = 16


def _blocked_cumsum(x):
    """Inclusive cumsum along the last axis (n a multiple of CUMSUM_BLOCK): within blocks, then the
    blocks' running totals added in. The same integer results as the single matmul while partial
    sums stay below 2**24 (every partial sum is a sum of the same non-negative terms)."""
    n = x.shape[-1]
    blocks = x.reshape(x.shape[:-1] + (n // CUMSUM_BLOCK, CUMSUM_BLOCK))
    within = jnp.matmul(blocks, jnp.triu(jnp.ones((CUMSUM_BLOCK, CUMSUM_BLOCK), F32)), precision=jax.lax.Precision.HIGHEST)
    totals = within[..., -1]
    before = jnp.matmul(totals, jnp.triu(jnp.ones((n // CUMSUM_BLOCK,) * 2, F32), k=1), precision=jax.lax.Precision.HIGHEST)
    return (within + before[..., None]).reshape(x.shape)


def materialize(*xs):
    """Compute these arrays once: XLA would otherwise re-run their producers inside
    every consumer fusion (e.g. once per field of a scatter)."""
    return jax.lax.optimization_barrier(xs)


def div_small(a, b):
    """a // b elementwise for 0 <= a < 2**24 and b >= 1 (arrays): a float32 division with an exact
    integer correction (XLA:CPU has no vector integer division)."""
    q = jnp.floor(a.astype(F32) / b.astype(F32)).astype(I32)
    q = q - (q * b > a).astype(I32)
    return q + ((q + 1) * b <= a).astype(I32)


def euclid_rounds(m: int) -> int:
    """Most Euclid steps of gcd(m, a) over 0 <= a < m (a static bound for `ceil_sum`'s loop)."""
    worst = 0
    for a in range(m):
        x, y, steps = m, a, 0
        while y:
            x, y, steps = y, x % y, steps + 1
        worst = max(worst, steps)
    return worst


# Largest remainder table (bs x bs x (max_k + 1) int32 entries) `ceil_sum` builds; past it, Euclid.
CEIL_SUM_TABLE_MAX_ENTRIES = 1 << 18


def ceil_sum(k, c, g, bs: int, max_k: int | None = None):
    """sum_{j=1..k} ceil((c + j*g) / bs) elementwise (int32 arrays k, c, g >= 0; static bs >= 1).

    With a static bound `max_k` >= k and a small enough table, the remainders' part is looked up
    (`_ceil_sum_table`); otherwise it is computed by `_ceil_sum_euclid`. The same integers either way.
    """
    if max_k is not None and bs * bs * (max_k + 1) <= CEIL_SUM_TABLE_MAX_ENTRIES:
        return _ceil_sum_table(k, c, g, bs, max_k)
    return _ceil_sum_euclid(k, c, g, bs)


def remainder_ceil_sums(bs: int, max_k: int) -> np.ndarray:
    """T[cr, gr, k] = sum_{j=1..k} ceil((cr + j*gr) / bs) for 0 <= cr, gr < bs, 0 <= k <= max_k (int32)."""
    cr, gr, j = np.ogrid[:bs, :bs, 1 : max_k + 1]
    terms = -(-(cr + j * gr) // bs)
    return np.concatenate([np.zeros((bs, bs, 1), np.int64), np.cumsum(terms, axis=2)], axis=2).astype(np.int32)


def _ceil_sum_table(k, c, g, bs: int, max_k: int):
    """With c = cq bs + cr and g = gq bs + gr, each term is cq + j gq + ceil((cr + j gr) / bs): the
    quotients sum in closed form and the remainders' sum is one lookup. One gather per element
    instead of Euclid's unrolled rounds (the replay's jump pays this for every slot row)."""
    cq, gq = div(c, bs), div(g, bs)
    cr, gr = c - cq * bs, g - gq * bs
    table = jnp.asarray(remainder_ceil_sums(bs, max_k).reshape(-1))
    return k * cq + div(k * (k + 1), 2) * gq + table[(cr * bs + gr) * (max_k + 1) + k]


def _ceil_sum_euclid(k, c, g, bs: int):
    """sum_{j=1..k} ceil((c + j*g) / bs) for any k >= 0.

    The floor sum sum_{i<n} floor((a*i + b) / m) of AtCoder's library (Euclid-like: each round
    swaps the divisor for the slope), unrolled for the most rounds a divisor <= bs needs. The first
    round divides by the static bs; later ones see numbers below bs * (k + 2) (float32-exact).
    """
    n, a, b = k, g, c + g + (bs - 1)
    qa, qb = div(a, bs), div(b, bs)
    a, b = a - qa * bs, b - qb * bs
    total = (n * (n - 1) // 2) * qa + n * qb
    m = jnp.full_like(n, bs)
    live = n > 0
    for _ in range(euclid_rounds(bs) + 1):
        y = a * n + b
        live = live & (y >= m)
        m_safe = jnp.maximum(m, 1)
        n_new = div_small(y, m_safe)
        n, b, m, a = (jnp.where(live, new, old) for new, old in ((n_new, n), (y - n_new * m_safe, b), (a, m), (m, a)))
        m_safe = jnp.maximum(m, 1)
        qa, qb = div_small(a, m_safe), div_small(b, m_safe)
        total = total + jnp.where(live, (n * (n - 1) // 2) * qa + n * qb, 0)
        a, b = jnp.where(live, a - qa * m_safe, a), jnp.where(live, b - qb * m_safe, b)
    return total
