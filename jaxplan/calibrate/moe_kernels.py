"""The fused-MoE kernel fields of a GPU, read off NVIDIA's MoE kernel tables (`kernels.load_moe`).

vLLM runs a MoE layer's routed experts as one fused kernel per layer (routing, token alignment, both
grouped GEMMs and the activation), whose cost is not that of dense GEMMs: the tables time it on a
least time per layer (tens of microseconds, whatever the tokens), a streaming rate of the touched
experts' weights that depends on the format's kernel (vLLM 0.19's Marlin INT4 kernel streams at a fifth
of what its FP8 kernel does), and a grouped-GEMM rate well below a dense GEMM's. For each expert format
the fields are, with `physics.moe` reading them:

  moe_<format>_floor_s         seconds of the layer however few tokens and bytes
  moe_<format>_hbm_fraction    fraction of the HBM peak at which the touched experts' stored bytes stream
  moe_<format>_flops_fraction  fraction of the format's peak (`physics.moe.expert_peak_flops_per_s`)
                               at which the routed experts' FLOPs run

read by relative least squares of latency = floor + bytes / (hbm_fraction x HBM peak) + FLOPs /
(flops_fraction x peak), all three terms kept >= 0, over the table's balanced-routing rows of one GPU
per expert (moe_ep = 1: EP is priced by the physics' busiest GPU), each shape at its fastest kernel
(vLLM picks its backend per GPU; the table times the candidates), newest vLLM version. Bytes and FLOPs
count the experts the table's balanced routing touches: min(E, T k) of them, T k token-expert pairs.
"""

from __future__ import annotations

import numpy as np

from jaxplan.specs import formats as table

# jaxplan expert format -> the table's moe_dtype: MoE FP8 checkpoints (DeepSeek, Qwen3, MiniMax) are
# block-scaled; MXFP4 runs as w4a8 (MXFP8 activations) on GPUs with MX tensor cores, else weight-only.
TABLE_DTYPE = {"bf16": "bfloat16", "fp8": "fp8_block", "nvfp4": "nvfp4", "int4": "int4_wo"}
MXFP4_TABLE_DTYPE = {True: "w4a8_mxfp4_mxfp8", False: "w4a16_mxfp4"}
FIELDS = ("floor_s", "hbm_fraction", "flops_fraction")
MIN_ROWS = 8  # fewer timed shapes than this and a format keeps its defaults


def field_name(fmt: str, what: str) -> str:
    return f"moe_{fmt}_{what}"


def all_fields() -> tuple[str, ...]:
    return tuple(field_name(f.name, what) for f in table.FORMATS for what in FIELDS)


def table_dtype(fmt: str, mx_tensor_cores: bool) -> str:
    return MXFP4_TABLE_DTYPE[mx_tensor_cores] if fmt == "mxfp4" else TABLE_DTYPE[fmt]


def expert_bytes_and_flops(moe, stored_bytes_per_param: float) -> tuple[np.ndarray, np.ndarray]:
    """(stored bytes of the experts the rows' balanced routing touches on one GPU, FLOPs of their
    token-expert pairs there) [N] of a `kernels.MoeTable`: min(E / ep, T k / ep) experts of 3 h I / tp
    parameters, 2 x T k / ep pairs x 3 h I / tp."""
    params = 3.0 * moe.hidden_size * moe.intermediate_size.astype(np.float64) / moe.moe_tp
    pairs = moe.tokens * moe.top_k.astype(np.float64) / moe.moe_ep
    touched = np.minimum(moe.num_experts / moe.moe_ep, np.ceil(pairs))
    return touched * params * stored_bytes_per_param, 2.0 * pairs * params


def fastest_per_shape(moe, rows: np.ndarray) -> np.ndarray:
    """Indices of `rows` [N] bool keeping, per distinct shape, the row of least latency."""
    index = np.flatnonzero(rows)
    shape = np.stack([moe.tokens, moe.hidden_size, moe.intermediate_size, moe.top_k, moe.num_experts, moe.moe_tp, moe.moe_ep], 1)[index]
    order = np.lexsort((moe.latency_s[index],) + tuple(shape.T[::-1]))
    shape, index = shape[order], index[order]
    first = np.r_[True, np.any(shape[1:] != shape[:-1], axis=1)]
    return index[first]


def fit_latency(bytes_: np.ndarray, flops: np.ndarray, latency_s: np.ndarray) -> tuple[float, float, float]:
    """(floor_s, s per byte, s per FLOP) >= 0 minimising the relative squared error of
    latency = floor + bytes x s_per_byte + flops x s_per_flop ([N] each): least squares on every
    subset of the three terms, the best one whose coefficients are all >= 0 (an active-set NNLS, exact
    for three unknowns)."""
    columns = np.stack([np.ones_like(latency_s), bytes_, flops], 1) / latency_s[:, None]
    target = np.ones_like(latency_s)
    best, best_error = np.zeros(3), np.inf
    for mask in range(1, 8):
        use = [i for i in range(3) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(columns[:, use], target, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(3)
        full[use] = coef
        error = float(np.sum((columns @ full - target) ** 2))
        if error < best_error:
            best, best_error = full, error
    return float(best[0]), float(best[1]), float(best[2])


def moe_kernel_fields(moe, hbm_bandwidth_bytes_per_s: float, peak_flops_per_s: dict[str, float], mx_tensor_cores: bool) -> dict[str, float]:
    """The fields of every expert format the `kernels.MoeTable` `moe` times (module docstring);
    `peak_flops_per_s`: format name -> the peak its flops fraction is of. A format with fewer than
    MIN_ROWS balanced shapes, or whose fit leaves a term at 0, is left out (it keeps its defaults)."""
    found = {}
    for fmt in table.FORMATS:
        rows = (moe.dtype == table_dtype(fmt.name, mx_tensor_cores)) & (moe.distribution == "balanced") & (moe.moe_ep == 1)
        if rows.sum() < MIN_ROWS:
            continue
        best = fastest_per_shape(moe, rows)
        bytes_, flops = expert_bytes_and_flops(moe, fmt.expert_bytes_per_param)
        floor_s, s_per_byte, s_per_flop = fit_latency(bytes_[best], flops[best], moe.latency_s[best])
        if min(floor_s, s_per_byte, s_per_flop) <= 0.0:
            continue
        found[field_name(fmt.name, "floor_s")] = floor_s
        found[field_name(fmt.name, "hbm_fraction")] = 1.0 / (s_per_byte * hbm_bandwidth_bytes_per_s)
        found[field_name(fmt.name, "flops_fraction")] = 1.0 / (s_per_flop * peak_flops_per_s[fmt.name])
    return found


def moe_kernel_prior(gpu: str, spec, data_root=None) -> dict[str, float]:
    """`moe_kernel_fields` of `gpu` (its `GpuSpec` `spec`) from its newest MoE table; {} without one."""
    from jaxplan.calibrate import kernels

    try:
        moe = kernels.load_moe(gpu, data_root=data_root)
    except Exception:  # noqa: BLE001 - no MoE table for this GPU: keep the defaults
        return {}
    return moe_kernel_fields(moe, spec.hbm_bandwidth_bytes_per_s, expert_peaks(spec), bool(spec.mxfp4_flops_per_s))


def expert_peaks(spec) -> dict[str, float]:
    """Format name -> the peak FLOP/s of `spec` (a `GpuSpec`) its routed experts' GEMMs run against:
    `physics.moe.expert_peak_flops_per_s` on the spec's numbers."""
    from types import SimpleNamespace

    from jaxplan.physics.moe import expert_peak_flops_per_s

    peaks = SimpleNamespace(**{f"{kind}_flops_per_s": getattr(spec, f"{kind}_flops_per_s") or 0.0 for kind in ("bf16", "fp8", "fp4", "mxfp4")})
    return {fmt.name: float(expert_peak_flops_per_s(peaks, float(fmt.code))) for fmt in table.FORMATS}
