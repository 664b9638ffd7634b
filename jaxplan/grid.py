"""The candidate grid: a mixed-radix product of axes, decoded inside jit.

A candidate is its index in the product (outermost axis first: GPU type,
TP, PP, layout kind, max_num_seqs, max_num_batched_tokens, weight dtype, KV dtype, DP).
DP is innermost: everything but the demand per replica is shared by a run of
|DP| consecutive candidates, so the funnel evaluates it once per run.
Chunks are given by the digits of their first index (computed on the host
with Python ints, so grids beyond 2^31 work) plus int32 offsets [C]; digits
are added with carries inside jit. Nothing of size `grid.size` is ever built.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.buckets import MIN_BUCKET_ROWS, bucket_size, pad_rows
from jaxplan.specs.gpu import GpuSpec
from jaxplan.specs.formats import BY_NAME, OTHER_BYTES
from jaxplan.specs.space import DTYPE_BYTES, LAYOUT_KINDS, SearchSpace, parse_kind_label

AXES = (
    "gpu",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "layout_kind",
    "max_num_seqs",
    "max_num_batched_tokens",
    "weight_dtype",
    "kv_cache_dtype",
    "data_parallel_size",
)
DP_AXIS = AXES.index("data_parallel_size")  # innermost
LAYOUT_AXES = tuple(AXES.index(a) for a in ("gpu", "tensor_parallel_size", "pipeline_parallel_size", "layout_kind", "data_parallel_size"))
# The layout axes are the outermost ones plus DP (innermost), so a layout's index is
# prefix x |DP| + DP digit, and a contiguous run of candidates touches a contiguous run of layouts.
LAYOUT_PREFIX = LAYOUT_AXES[:-1]
assert LAYOUT_PREFIX == tuple(range(len(LAYOUT_PREFIX))) and LAYOUT_AXES[-1] == DP_AXIS == len(AXES) - 1


class Candidates(NamedTuple):
    """A chunk of candidates; every field [C]."""

    digits: jnp.ndarray  # [C, A] int32: index of each axis value
    valid: jnp.ndarray  # [C] bool: inside the grid (the last chunk is padded)
    gpu_index: jnp.ndarray  # int32
    tensor_parallel_size: jnp.ndarray  # float32
    pipeline_parallel_size: jnp.ndarray
    data_parallel_size: jnp.ndarray  # replicas (engine ranks): the DP axis value x lockstep_ranks
    max_num_seqs: jnp.ndarray
    max_num_batched_tokens: jnp.ndarray
    weight_bytes_per_param: jnp.ndarray  # every weight but the routed experts
    kv_bytes_per_element: jnp.ndarray
    expert_weight_format: jnp.ndarray  # routed experts' format code (specs.formats)
    lockstep_ranks: jnp.ndarray  # DP for the lock-step kinds (dp, dp_ep), else 1
    expert_parallel: jnp.ndarray  # 1.0 for the EP kinds (ep, dp_ep)


@dataclasses.dataclass(frozen=True)
class Grid:
    """Axis values (numeric, float32) for one sweep; `labels` keep the original values for display."""

    gpus: tuple[GpuSpec, ...]
    space: SearchSpace

    # Computed once per grid: the layout-kind axis scans the DP values, and decoding, tables and checks
    # ask for the sizes per chunk (a DP range of 1e5 made that most of a huge grid's decoding).
    @functools.cached_property
    def _labels(self) -> dict[str, tuple]:
        return {"gpu": tuple(g.name for g in self.gpus), **self.space.axis_values()}

    @property
    def labels(self) -> dict[str, tuple]:
        return dict(self._labels)  # a copy: the cached one is shared by every caller

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(self._labels[a]) for a in AXES)

    @functools.cached_property
    def size(self) -> int:
        return math.prod(self.sizes)

    @property
    def num_layouts(self) -> int:
        return math.prod(self.sizes[a] for a in LAYOUT_AXES)

    def layout_window(self, run: int) -> int:
        """Rows of the [num_layouts] table that `run` consecutive candidates starting at a multiple of
        |DP| can touch (whole prefixes of |DP| rows each; never more than the table).

        The run spans ceil(run / |DP|) DP-less configurations; consecutive configurations share a
        layout prefix in blocks of `knobs` (the axes between the prefix and DP), so they meet at most
        ceil((configurations - 1) / knobs) + 1 prefixes."""
        num_dp = self.sizes[DP_AXIS]
        knobs = math.prod(self.sizes[len(LAYOUT_PREFIX) : DP_AXIS])
        configurations = max(1, -(-run // num_dp))
        prefixes = -(-(configurations - 1) // knobs) + 1
        return min(prefixes, math.prod(self.sizes[a] for a in LAYOUT_PREFIX)) * num_dp

    def kernel_axis_arrays(self) -> tuple[jnp.ndarray, ...]:
        """`axis_arrays` as the kernels take them: every axis but DP padded to `bucket_size` entries
        (its last value repeated), so that grids whose axes differ in length share compiled programs.
        Digits never reach the padding (decoding counts with `sizes`); DP stays exact, because the
        chunk kernel factorises over its length."""
        return tuple(jax.device_put(v if axis == DP_AXIS else padded_axis(v)) for axis, v in enumerate(self._axis_values()))

    def axis_arrays(self) -> tuple[jnp.ndarray, ...]:
        """Numeric value of every axis entry (GPU: its index; weight dtype: its format code; KV dtype:
        bytes per element; layout kind: `kind_value`)."""
        return tuple(jax.device_put(v) for v in self._axis_values())  # on the host: no XLA program

    def _axis_values(self) -> list[np.ndarray]:
        out = []
        for axis in AXES:
            labels = self.labels[axis]
            if axis == "gpu":
                values = np.arange(len(labels))
            elif axis == "weight_dtype":
                values = np.array([BY_NAME[v].code for v in labels])
            elif axis == "kv_cache_dtype":
                values = np.array([DTYPE_BYTES[v] for v in labels])
            elif axis == "layout_kind":
                values = np.array([kind_value(*parse_kind_label(v)) for v in labels])
            else:
                values = np.array(labels)
            out.append(np.asarray(values, np.float32))
        return out

    def digits_of(self, index: int) -> np.ndarray:
        """Mixed-radix digits of a (Python int) candidate index, outermost first."""
        if not 0 <= index < max(self.size, 1):
            raise IndexError(index)
        digits = []
        for size in reversed(self.sizes):
            index, digit = divmod(index, size)
            digits.append(digit)
        return np.array(digits[::-1], np.int32)

    def index_of(self, digits) -> int:
        index = 0
        for digit, size in zip(digits, self.sizes):
            index = index * size + int(digit)
        return index

    def describe(self, digits) -> dict:
        """Human-readable axis values of one candidate."""
        return {axis: self.labels[axis][int(d)] for axis, d in zip(AXES, digits)}


def padded_axis(values, minimum: int = MIN_BUCKET_ROWS) -> np.ndarray:
    """An axis's values [n] padded to `bucket_size(n, minimum)` entries, its last value repeated (no
    digit reaches the padding), so that axes of other lengths in one bucket share compiled programs."""
    num = len(values)
    return np.asarray(pad_rows(np.asarray(values), num, bucket_size(num, minimum)))


def decode(axis_values: tuple[jnp.ndarray, ...], sizes: jnp.ndarray, base_digits: jnp.ndarray, offsets: jnp.ndarray) -> Candidates:
    """Candidates at `base + offsets`, with carries across axes (innermost first)."""
    digits, valid = decode_digits(sizes, base_digits, offsets)
    return candidates_from_digits(axis_values, digits, valid)


def decode_digits(sizes: jnp.ndarray, base_digits: jnp.ndarray, offsets: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(digits [C, A], valid [C]) of the indices base + offsets over axes of `sizes` [A]."""
    num_axes = sizes.shape[0]
    remaining = offsets.astype(jnp.int32)
    carry = jnp.zeros_like(remaining)
    digits = [None] * num_axes
    for axis in reversed(range(num_axes)):
        size = sizes[axis]
        total = base_digits[axis] + remaining % size + carry
        digits[axis] = total % size
        carry = total // size
        remaining = remaining // size
    valid = (carry == 0) & (remaining == 0)
    return jnp.stack(digits, axis=-1), valid


def candidates_from_digits(axis_values: tuple[jnp.ndarray, ...], digits: jnp.ndarray, valid: jnp.ndarray) -> Candidates:
    """Candidates from their digits [C, A] (in AXES order)."""
    value = lambda name: axis_values[AXES.index(name)][digits[:, AXES.index(name)]]  # noqa: E731
    code = value("weight_dtype")
    kind, lockstep_ranks = kind_of_value(value("layout_kind"))
    expert_parallel = (kind == LAYOUT_KINDS.index("ep")) | (kind == LAYOUT_KINDS.index("dp_ep"))
    return Candidates(
        digits, valid, digits[:, 0],
        value("tensor_parallel_size"), value("pipeline_parallel_size"), value("data_parallel_size") * lockstep_ranks,
        value("max_num_seqs"), value("max_num_batched_tokens"), jnp.asarray(OTHER_BYTES)[code.astype(jnp.int32)], value("kv_cache_dtype"),
        code, lockstep_ranks, expert_parallel.astype(jnp.float32),
    )


def kind_value(kind: str, lockstep_ranks: int) -> int:
    """The numeric value of a layout-kind label: lock-step ranks x |kinds| + the kind's index."""
    return lockstep_ranks * len(LAYOUT_KINDS) + LAYOUT_KINDS.index(kind)


def kind_of_value(value):
    """(kind index, lock-step ranks) of `kind_value` values (float arrays)."""
    ranks = jnp.floor(value / len(LAYOUT_KINDS))
    return value - ranks * len(LAYOUT_KINDS), ranks


def layout_index(digits: jnp.ndarray, sizes: jnp.ndarray) -> jnp.ndarray:
    """Index of a candidate's (GPU, TP, PP, kind, DP) layout in [num_layouts]."""
    index = jnp.zeros(digits.shape[:-1], jnp.int32)
    for axis in LAYOUT_AXES:
        index = index * sizes[axis] + digits[..., axis]
    return index

