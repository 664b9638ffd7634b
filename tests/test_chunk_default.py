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
