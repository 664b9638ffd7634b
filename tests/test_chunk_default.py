"""The chunk a sweep streams when the caller names none: 65,536 on a CPU; on an accelerator about 4
million, halved until it fits a quarter of the device's memory; and on an accelerator the chunk's
bytes are the device's, not the host's, in the up-front memory estimate."""

from __future__ import annotations

import jax

from jaxplan.funnel.budget import ACCELERATOR_CHUNK, CHUNK_BYTES, CPU_CHUNK, default_chunk, effective_chunk, estimate_sweep
from jaxplan.grid import Grid
from jaxplan.specs import load_space, parse_gpu_list

GIB = 1024**3


def test_cpu_and_accelerator_defaults_by_hand():
    assert (CPU_CHUNK, ACCELERATOR_CHUNK, CHUNK_BYTES) == (65_536, 4_194_304, 2048)
    assert default_chunk("cpu") == 65_536
    assert default_chunk("gpu") == 4_194_304  # memory unknown: not halved
    assert default_chunk("gpu", int(0.75 * 141e9)) == 4_194_304  # an H200's JAX limit: 8 GiB of 26 GiB
    assert default_chunk("gpu", 16 * GIB) == 2_097_152  # 4 GiB allowed: 4 Mi x 2 KiB = 8 GiB is too much, 2 Mi fits exactly
    assert default_chunk("tpu", 12 * GIB) == 1_048_576  # 3 GiB allowed: 2 Mi (4 GiB) too much, 1 Mi (2 GiB) fits
    assert default_chunk("gpu", 1 * GIB) == 131_072  # 256 MiB allowed: 128 Ki x 2 KiB fits exactly
    assert default_chunk("gpu", GIB // 4) == 65_536  # never below the CPU's chunk


def test_this_process_uses_its_backends_default():
    platform = jax.local_devices()[0].platform
    assert default_chunk() == (CPU_CHUNK if platform == "cpu" else default_chunk(platform, (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")))


def test_the_chunk_counts_against_the_host_only_on_a_cpu():
    grid = Grid(parse_gpu_list("h100_sxm,h200_sxm"), load_space("huge"))
    chunk = effective_chunk(grid, ACCELERATOR_CHUNK, 1)
    host = estimate_sweep(grid, ACCELERATOR_CHUNK, 1, on_host=True)
    device = estimate_sweep(grid, ACCELERATOR_CHUNK, 1, on_host=False)
    assert host.memory_bytes - device.memory_bytes == chunk * CHUNK_BYTES
    assert estimate_sweep(grid, ACCELERATOR_CHUNK, 1).memory_bytes == (host if jax.local_devices()[0].platform == "cpu" else device).memory_bytes


def test_a_sweep_without_a_chunk_streams_the_default():
    from jaxplan.funnel import run_sweep
    from jaxplan.specs import load_model, load_workload

    gpus, space = parse_gpu_list("h100_sxm"), load_space("small")
    result = run_sweep(load_model("llama-3.1-8b"), gpus, load_workload("chat"), space, top_k=3)
    devices = result.num_devices
    assert result.chunk_size == effective_chunk(result.grid, default_chunk(), devices)


def test_small_grids_stream_one_bucketed_chunk_by_hand():
    """A grid smaller than the chunk streams one chunk of a power of two of DP runs, at least
    SMALL_CHUNK candidates (shared by small grids of other sizes); a larger grid streams the chunk it
    asked for, rounded up to whole DP runs per device; a chunk asked below the grid is kept."""
    from jaxplan.funnel.budget import SMALL_CHUNK

    small = Grid(parse_gpu_list("h100_sxm"), load_space("small"))  # DP 1, 2, 4, 8: runs of 4
    assert SMALL_CHUNK == 8192 and small.sizes[-1] == 4 and small.size < SMALL_CHUNK
    assert effective_chunk(small, CPU_CHUNK, 1) == 8192
    assert effective_chunk(small, CPU_CHUNK, 3) == 12 * 683  # 768 candidates: 64 runs of 3 x 4, raised to the 683 that hold 8,192
    assert effective_chunk(small, 1000, 1) == 1000  # the caller's smaller chunk, whole runs
    assert effective_chunk(small, 1001, 1) == 1004
    wide = load_space("small").replace(max_num_seqs=tuple(range(1, 401)))  # 400 x more: 230,400 candidates
    large = Grid(parse_gpu_list("h100_sxm,h200_sxm"), wide)
    assert large.size > CPU_CHUNK and effective_chunk(large, CPU_CHUNK, 1) == CPU_CHUNK
    assert effective_chunk(large, 1 << 20, 1) == 256 * 1024  # 57,600 runs of 4 -> 65,536 runs


def test_a_shared_kernels_layout_table_is_padded_and_a_large_grids_is_exact():
    from jaxplan.funnel.sweep import SHARED_TABLE_ROWS, table_shape

    grid = Grid(parse_gpu_list("h100_sxm,h200_sxm"), load_space("small"))
    assert grid.num_layouts == 2 * 4 * 2 * 1 * 4 and SHARED_TABLE_ROWS == 2048
    assert table_shape(grid, 4096, shared=True) == (2048, 2048)
    assert table_shape(grid, 4096, shared=False) == (grid.num_layouts, grid.layout_window(4096))
    one, three = (Grid(parse_gpu_list(g), load_space("default")) for g in ("a100_sxm", "h100_sxm,h200_sxm,b200_sxm"))
    assert (one.num_layouts, three.num_layouts) == (20 * 128, 60 * 128)
    assert table_shape(one, 65536, shared=True) == table_shape(three, 65536, shared=True) == (32768, 2048)  # as 8 GPUs: 20,480 rows; a window of 384
    dp = load_space("small").replace(data_parallel_size=tuple(range(1, 3001)))  # 48,000 layouts; as 8 GPUs, 192,000: too many
    long = Grid(parse_gpu_list("h100_sxm,h200_sxm"), dp)
    rows, window = table_shape(long, 65536, shared=True)
    assert rows == 65536 and window == min(65536, 1 << (long.layout_window(65536) - 1).bit_length()) >= long.layout_window(65536)
