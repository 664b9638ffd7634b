"""The candidate grid: mixed-radix decoding inside jit against Python's exact integer `divmod`.

The reference for every check is plain Python integer arithmetic (arbitrary precision), never the
code under test: the digits of an index are peeled off innermost-first with `divmod`, exactly as
one writes a number in a mixed radix by hand.
"""

from __future__ import annotations

import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxplan.grid import AXES, LAYOUT_AXES, Grid, decode, layout_index
from jaxplan.specs import load_gpu, load_space, parse_gpu_list
from jaxplan.specs.space import DTYPE_BYTES, SearchSpace

CHUNK = 512  # offsets per decoded chunk; one compiled shape for every test of this module


def python_digits(index: int, sizes) -> list[int]:
    """Mixed-radix digits, outermost first, by repeated divmod on Python ints (exact at any size)."""
    digits = []
    for size in reversed(sizes):
        index, digit = divmod(index, size)
        digits.append(digit)
    assert index == 0, "index beyond the grid"
    return digits[::-1]


@pytest.fixture(scope="module")
def grid() -> Grid:
    # 3 GPU types x the small space (4 TP x 2 PP x 4 DP x 3 seqs x 2 budgets x 2 x 2) = 2,304 candidates.
    return Grid(tuple(load_gpu(n) for n in ("h100_sxm", "a100_sxm", "l40s")), load_space("small"))


@pytest.fixture(scope="module")
def decode_jit():
    return jax.jit(decode)


def decode_at(decode_jit, grid: Grid, start: int, offsets: np.ndarray):
    sizes = jnp.asarray(grid.sizes, jnp.int32)
    return jax.device_get(decode_jit(grid.axis_arrays(), sizes, jnp.asarray(grid.digits_of(start)), jnp.asarray(offsets, jnp.int32)))


def check_chunk(grid: Grid, start: int, offsets: np.ndarray, c) -> None:
    """Every decoded candidate equals the divmod digits of start + offset; beyond the grid, invalid."""
    labels = grid.labels
    for i, offset in enumerate(offsets):
        index = start + int(offset)
        if index >= grid.size:
            assert not c.valid[i], f"index {index} is past the grid of {grid.size} but decoded as valid"
            continue
        assert c.valid[i], f"index {index} is inside the grid but decoded as padding"
        expected = python_digits(index, grid.sizes)
        assert c.digits[i].tolist() == expected, f"index {index}"
        # The decoded values are the axis values at those digits (GPU: its index; dtypes: bytes).
        value = dict(zip(AXES, expected))
        assert c.gpu_index[i] == value["gpu"]
        for field, axis in (
            ("tensor_parallel_size", "tensor_parallel_size"), ("pipeline_parallel_size", "pipeline_parallel_size"),
            ("data_parallel_size", "data_parallel_size"), ("max_num_seqs", "max_num_seqs"),
            ("max_num_batched_tokens", "max_num_batched_tokens"),
        ):
            assert getattr(c, field)[i] == labels[axis][value[axis]], (index, field)
        assert c.weight_bytes_per_param[i] == DTYPE_BYTES[labels["weight_dtype"][value["weight_dtype"]]]
        assert c.kv_bytes_per_element[i] == DTYPE_BYTES[labels["kv_cache_dtype"][value["kv_cache_dtype"]]]


def test_sizes_and_size(grid: Grid):
    # 3 x 4 x 2 x 4 x 3 x 2 x 2 x 2 = 2,304 whatever the axis order.
    assert grid.size == 2304 == math.prod(grid.sizes)
    assert sorted(grid.sizes) == sorted([3, 4, 2, 1, 4, 3, 2, 2, 2])  # one layout kind (tp)
    # Layouts: GPU x TP x PP x DP = 3 x 4 x 2 x 4.
    assert grid.num_layouts == 96


def test_digits_of_and_index_of_match_divmod(grid: Grid):
    for index in [0, 1, grid.size - 1, *random.Random(0).sample(range(grid.size), 200)]:
        digits = grid.digits_of(index)
        assert digits.tolist() == python_digits(index, grid.sizes)
        assert grid.index_of(digits) == index
    for outside in (-1, grid.size):
        with pytest.raises(IndexError):
            grid.digits_of(outside)


def test_decode_contiguous_chunks_cover_the_grid(grid: Grid, decode_jit):
    """Streaming the grid in chunks of CHUNK from 0 hits every index once; the last chunk is padded
    (2,304 = 4 x 512 + 256: the last 256 offsets are past the end)."""
    offsets = np.arange(CHUNK)
    seen = 0
    for start in range(0, grid.size, CHUNK):
        c = decode_at(decode_jit, grid, start, offsets)
        check_chunk(grid, start, offsets, c)
        seen += int(c.valid.sum())
    assert seen == grid.size
    last = decode_at(decode_jit, grid, 2048, offsets)
    assert int(last.valid.sum()) == 256 and not last.valid[256:].any()


def test_decode_random_starts_and_offsets(grid: Grid, decode_jit):
    """Random starts, random (unsorted, repeated) offsets up to 2 x the grid: carries across any axis."""
    rng = np.random.default_rng(1)
    for _ in range(8):
        start = int(rng.integers(0, grid.size))
        offsets = rng.integers(0, 2 * grid.size, CHUNK)
        check_chunk(grid, start, offsets, decode_at(decode_jit, grid, start, offsets))


def test_decode_carries_through_every_axis(grid: Grid, decode_jit):
    """Starts whose inner digits are all at their maximum: offset 1 carries through every inner axis
    at once (e.g. ..., 1, 1, 1 + 1 -> ..., 0, 0, 0 with the outer digit incremented)."""
    for outer_axes in range(1, len(AXES)):
        digits = [0] * len(AXES)
        for axis in range(outer_axes, len(AXES)):
            digits[axis] = grid.sizes[axis] - 1
        start = grid.index_of(digits)
        offsets = np.arange(CHUNK)
        check_chunk(grid, start, offsets, decode_at(decode_jit, grid, start, offsets))


@settings(max_examples=50, deadline=None)
@given(start=st.integers(0, 2303), offset=st.integers(0, 5000))
def test_decode_hypothesis(grid: Grid, decode_jit, start: int, offset: int):
    offsets = (offset + np.arange(CHUNK) * 7) % 6000  # strided: crosses several axis boundaries
    check_chunk(grid, start, offsets, decode_at(decode_jit, grid, start, offsets))


def test_layout_index_is_the_mixed_radix_of_gpu_tp_pp_kind_dp(grid: Grid):
    rng = np.random.default_rng(2)
    indices = rng.integers(0, grid.size, 300)
    digits = np.stack([grid.digits_of(int(i)) for i in indices])
    got = np.asarray(layout_index(jnp.asarray(digits), jnp.asarray(grid.sizes, jnp.int32)))
    layout_axes = [AXES.index(a) if isinstance(a, str) else a for a in LAYOUT_AXES]
    names = [AXES[a] for a in layout_axes]
    assert names == ["gpu", "tensor_parallel_size", "pipeline_parallel_size", "layout_kind", "data_parallel_size"]
    for d, g in zip(digits, got):
        expected = 0
        for a in layout_axes:
            expected = expected * grid.sizes[a] + int(d[a])
        assert g == expected
    assert got.max() < grid.num_layouts


def test_layout_window_covers_every_run_and_no_more(grid: Grid):
    """A run of candidates starting at a multiple of |DP| only touches the `layout_window` rows of the
    table from its first candidate's layout on (shifted back to end at the table's end); for every run
    length some start needs the whole window. Reference: layouts from divmod digits, index by index."""
    num_dp, num_layouts = grid.sizes[AXES.index("data_parallel_size")], grid.num_layouts
    layout_axes = list(LAYOUT_AXES)
    layouts = []
    for index in range(grid.size):
        digits, row = python_digits(index, grid.sizes), 0
        for a in layout_axes:
            row = row * grid.sizes[a] + digits[a]
        layouts.append(row)
    layouts = np.array(layouts)
    for run in range(num_dp, grid.size + num_dp, num_dp):
        window = grid.layout_window(run)
        assert window % num_dp == 0 and num_dp <= window <= num_layouts
        widest = 0
        for start in range(0, grid.size, num_dp):
            touched = layouts[start : start + run]
            first = min(layouts[start], num_layouts - window)
            assert first <= touched.min() and touched.max() < first + window, (run, start, window)
            widest = max(widest, touched.max() // num_dp - touched.min() // num_dp + 1)
        assert widest * num_dp == window, (run, window, widest)
    # One DP run (the whole share of a device in the largest grids) touches one prefix's rows.
    assert grid.layout_window(num_dp) == num_dp < num_layouts


def test_describe_names_the_axis_values(grid: Grid):
    index = grid.size - 1  # every digit at its maximum: the last value of every axis
    row = grid.describe(grid.digits_of(index))
    assert row["gpu"] == "l40s"
    assert row["tensor_parallel_size"] == 8 and row["pipeline_parallel_size"] == 2 and row["data_parallel_size"] == 8
    assert row["max_num_seqs"] == 1024 and row["max_num_batched_tokens"] == 8192
    assert row["weight_dtype"] == "fp8" and row["kv_cache_dtype"] == "fp8"


# ---- grids beyond int32 -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def huge_grid() -> Grid:
    # 2 GPU types x 4 TP x 2 PP x 100,000 DP x 1,000 seqs x 2 budgets x 2 x 2
    # = 16 x 1e5 x 1e3 x 8 = 12,800,000,000 candidates (> 2^33).
    space = SearchSpace(
        name="huge-test",
        tensor_parallel_size=(1, 2, 4, 8),
        pipeline_parallel_size=(1, 2),
        data_parallel_size=tuple(range(1, 100_001)),
        max_num_seqs=tuple(range(1, 1001)),
        max_num_batched_tokens=(2048, 8192),
        gpu_budget=1_000_000,
    )
    return Grid((load_gpu("h100_sxm"), load_gpu("h200_sxm")), space)


def test_huge_grid_round_trip_with_python_ints(huge_grid: Grid):
    assert huge_grid.size == 12_800_000_000 > 2**33
    rng = random.Random(3)
    probes = [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 3_000_000_000, huge_grid.size - 1]
    probes += [rng.randrange(2**31, huge_grid.size) for _ in range(200)]
    for index in probes:
        digits = huge_grid.digits_of(index)
        assert digits.tolist() == python_digits(index, huge_grid.sizes)
        assert huge_grid.index_of(digits) == index  # Python int, no wrap-around


def test_huge_grid_decode_in_jit_near_3e9(huge_grid: Grid, decode_jit):
    """Chunks starting past 2^31 decode exactly: the base is given as digits, offsets stay small."""
    offsets = np.arange(CHUNK)
    for start in (3_000_000_000 - 100, 2**31 - 7, 2**32 - 3, huge_grid.size - 300):
        c = decode_at(decode_jit, huge_grid, start, offsets)
        check_chunk(huge_grid, start, offsets, c)
    # Exactly 300 valid candidates before the end of the grid, then padding.
    tail = decode_at(decode_jit, huge_grid, huge_grid.size - 300, offsets)
    assert int(tail.valid.sum()) == 300


def test_kernel_axis_arrays_pad_every_axis_but_dp_with_its_last_value():
    """The kernels' axis arrays (`Grid.kernel_axis_arrays`): the grid's values first, then the last
    value repeated up to a power of two of at least 8 entries; DP exact (the kernel factorises over it)."""
    space = load_space("small").replace(max_num_seqs=tuple(range(1, 10)))  # 9 entries -> 16
    grid = Grid(parse_gpu_list("h100_sxm,a100_sxm,h200_sxm"), space)
    exact, padded = [np.asarray(a) for a in grid.axis_arrays()], [np.asarray(a) for a in grid.kernel_axis_arrays()]
    for axis, (e, p) in enumerate(zip(exact, padded)):
        if AXES[axis] == "data_parallel_size":
            np.testing.assert_array_equal(p, e)
            continue
        assert len(p) == max(8, 1 << (len(e) - 1).bit_length()), AXES[axis]
        np.testing.assert_array_equal(p[: len(e)], e)
        assert (p[len(e):] == e[-1]).all()
    assert len(padded[AXES.index("max_num_seqs")]) == 16 and list(padded[0][:4]) == [0, 1, 2, 2]
