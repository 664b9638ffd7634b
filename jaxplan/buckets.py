"""Row counts padded to buckets, so that jitted kernels over a few rows compile once per bucket.

A kernel over N independent rows (predict's stage 4, the calibration fit) is
compiled for its exact N; CSVs, folds and shortlists of other sizes would each compile again
(seconds per program on CPU). Padding every [N, ...] leaf to `bucket_size(N)` rows by repeating
the last row (a valid row, so no NaN appears) lets sizes in one bucket share the program; the
caller drops (or weights to zero) the padding rows.
"""

from __future__ import annotations

import jax
import numpy as np

MIN_BUCKET_ROWS = 8


def bucket_size(num: int, minimum: int = MIN_BUCKET_ROWS) -> int:
    """The next power of two >= num, and at least `minimum`."""
    return max(minimum, 1 << max(num - 1, 0).bit_length())


def pad_rows(tree, num: int, size: int):
    """Every leaf with a leading axis of `num` rows padded to `size` rows (its last row repeated);
    other leaves (scalars, per-GPU tables) kept. Returns NumPy arrays for the padded leaves."""

    def pad(x):
        if np.ndim(x) == 0 or np.shape(x)[0] != num or size == num:
            return x
        x = np.asarray(x)
        return np.concatenate([x, np.repeat(x[-1:], size - num, axis=0)])

    return jax.tree.map(pad, tree)


def unpad_rows(tree, num: int, size: int):
    """Leaves with a leading axis of `size` rows cut back to their first `num`."""
    return jax.tree.map(lambda x: x[:num] if np.ndim(x) and np.shape(x)[0] == size else x, tree)
