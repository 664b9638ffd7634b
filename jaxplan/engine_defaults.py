"""vLLM's defaults for the batching flags a `vllm serve` command leaves out, as `predict` and
`simulate` take them for a row that leaves them blank.

vLLM's API server picks `--max-num-batched-tokens` and `--max-num-seqs` by GPU
(`EngineArgs.get_batch_defaults`, vllm/engine/arg_utils.py): 8,192 and 1,024 on a GPU with 70 GiB or
more that is not an A100, else 2,048 and 256 (vLLM measured larger budgets lowering A100
throughput, vllm PR #17885). Releases up to 0.8 keyed the large values on an H100 or H200 name
instead; every GPU with measured rows here gets the same values either way (docs/usage.md). Given
only a token budget, vLLM caps its default `--max-num-seqs` at that budget (the same function), so
a command that lowers the budget alone still starts.
"""

from __future__ import annotations

LARGE_GPU_BYTES = 70 * 1024**3
LARGE_GPU_KNOBS = (1024, 8192)  # (max_num_seqs, max_num_batched_tokens)
OTHER_GPU_KNOBS = (256, 2048)


def default_batch_knobs(gpu) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) that `vllm serve` takes on `gpu` (a GpuSpec) when given
    neither flag."""
    large = gpu.hbm_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name
    return LARGE_GPU_KNOBS if large else OTHER_GPU_KNOBS


def batch_knobs(gpu, max_num_seqs: float | None = None, max_num_batched_tokens: float | None = None) -> tuple[float, float]:
    """(max_num_seqs, max_num_batched_tokens) a `vllm serve` command on `gpu` runs with, given the flags
    it states (None: left out): the GPU's defaults for those left out, the default sequences capped at
    a stated budget."""
    seqs, budget = default_batch_knobs(gpu)
    budget = budget if max_num_batched_tokens is None else max_num_batched_tokens
    seqs = min(seqs, budget) if max_num_seqs is None else max_num_seqs
    return seqs, budget
