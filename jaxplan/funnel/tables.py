"""Streaming reductions that keep memory bounded by the tables, not the grid.

`BestTable` keeps, per segment (a layout, or a frontier bin), the best score
seen and the digits of the candidate that scored it. Ties go to the smallest
grid index (digits compare lexicographically in index order), so the result
is the same whatever the chunk size, the device count or the merge order.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -jnp.inf


class BestTable(NamedTuple):
    score: jnp.ndarray  # [S] float32, -inf where empty
    digits: jnp.ndarray  # [S, A] int32, -1 where empty


def empty_table(num_segments: int, num_axes: int) -> BestTable:
    return BestTable(jax.device_put(np.full((num_segments,), -np.inf, np.float32)), jax.device_put(np.full((num_segments, num_axes), -1, np.int32)))


def merge_chunk(table: BestTable, segment: jnp.ndarray, score: jnp.ndarray, digits: jnp.ndarray) -> BestTable:
    """Fold a chunk (segment [C], score [C] with -inf for rejected, digits [C, A] in ascending index
    order) into the table; ties resolve to the lowest grid index."""
    num_segments = table.score.shape[0]
    chunk_best = jax.ops.segment_max(score, segment, num_segments=num_segments)
    position = jnp.arange(score.shape[0], dtype=jnp.int32)
    is_best = (score == chunk_best[segment]) & (score > NEG_INF)
    first = jax.ops.segment_min(jnp.where(is_best, position, score.shape[0]), segment, num_segments=num_segments)
    found = first < score.shape[0]
    chunk_digits = digits[jnp.clip(first, 0, score.shape[0] - 1)]
    return merge_tables(table, BestTable(jnp.where(found, chunk_best, NEG_INF), chunk_digits))


def lex_less(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """[S] bool: digits a [S, A] come before b [S, A] in grid-index order."""
    less = jnp.zeros(a.shape[:-1], bool)
    equal = jnp.ones(a.shape[:-1], bool)
    for axis in range(a.shape[-1]):
        less = less | (equal & (a[..., axis] < b[..., axis]))
        equal = equal & (a[..., axis] == b[..., axis])
    return less


def merge_tables(old: BestTable, new: BestTable) -> BestTable:
    """Entry-wise best of two tables (higher score; equal scores: lower grid index)."""
    better = (new.score > old.score) | ((new.score == old.score) & (new.score > NEG_INF) & lex_less(new.digits, old.digits))
    return BestTable(jnp.where(better, new.score, old.score), jnp.where(better[..., None], new.digits, old.digits))
