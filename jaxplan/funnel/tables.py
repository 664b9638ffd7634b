"""Streaming reductions that keep memory bounded by the tables, not the grid.

`BestTable` keeps, per segment (a layout, or a frontier bin), the best score
seen and the digits of the candidate that scored it. Scores are compared by
`rank_key`: float32 with the last SCORE_BITS_DROPPED mantissa bits cleared, so
two candidates closer than 2^-17 relative tie (differently shaped kernels, for
other chunk sizes or device counts, round the same physics differently by a
few ulps, ~1e-7). Ties go to the smallest grid index (digits compare
lexicographically in index order), so the result is the same whatever the
chunk size, the device count or the merge order. The table keeps the winner's
own score.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -jnp.inf
SCORE_BITS_DROPPED = 6  # of float32's 23 mantissa bits: scores within 2^-17 (7.6e-6) relative tie


def rank_key(score):
    """What the tables compare: `score` (float32, any shape; numpy or jax) with its last
    SCORE_BITS_DROPPED mantissa bits cleared. Monotone (never reverses an order), +-inf unchanged."""
    mask = ~((1 << SCORE_BITS_DROPPED) - 1)
    if isinstance(score, np.ndarray):
        return (np.asarray(score, np.float32).view(np.int32) & np.int32(mask)).view(np.float32)
    bits = jax.lax.bitcast_convert_type(jnp.asarray(score, jnp.float32), jnp.int32)
    return jax.lax.bitcast_convert_type(bits & jnp.int32(mask), jnp.float32)


class BestTable(NamedTuple):
    score: jnp.ndarray  # [S] float32, -inf where empty
    digits: jnp.ndarray  # [S, A] int32, -1 where empty


def empty_table(num_segments: int, num_axes: int) -> BestTable:
    return BestTable(jax.device_put(np.full((num_segments,), -np.inf, np.float32)), jax.device_put(np.full((num_segments, num_axes), -1, np.int32)))


def merge_chunk(table: BestTable, segment: jnp.ndarray, score: jnp.ndarray, digits: jnp.ndarray) -> BestTable:
    """Fold a chunk (segment [C], score [C] with -inf for rejected, digits [C, A] in ascending index
    order) into the table; ties resolve to the lowest grid index."""
    num_segments = table.score.shape[0]
    key = rank_key(score)
    chunk_best = jax.ops.segment_max(key, segment, num_segments=num_segments)
    position = jnp.arange(score.shape[0], dtype=jnp.int32)
    is_best = (key == chunk_best[segment]) & (score > NEG_INF)
    first = jax.ops.segment_min(jnp.where(is_best, position, score.shape[0]), segment, num_segments=num_segments)
    found = first < score.shape[0]
    winner = jnp.clip(first, 0, score.shape[0] - 1)
    return merge_tables(table, BestTable(jnp.where(found, score[winner], NEG_INF), digits[winner]))


def lex_less(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """[S] bool: digits a [S, A] come before b [S, A] in grid-index order."""
    less = jnp.zeros(a.shape[:-1], bool)
    equal = jnp.ones(a.shape[:-1], bool)
    for axis in range(a.shape[-1]):
        less = less | (equal & (a[..., axis] < b[..., axis]))
        equal = equal & (a[..., axis] == b[..., axis])
    return less


def merge_tables(old: BestTable, new: BestTable) -> BestTable:
    """Entry-wise best of two tables (higher `rank_key`; equal keys: lower grid index)."""
    new_key, old_key = rank_key(new.score), rank_key(old.score)
    better = (new_key > old_key) | ((new_key == old_key) & (new.score > NEG_INF) & lex_less(new.digits, old.digits))
    return BestTable(jnp.where(better, new.score, old.score), jnp.where(better[..., None], new.digits, old.digits))
