"""Fit the physics' efficiency parameters with optax: kernels first, then end-to-end serving.

Parameters live in an unconstrained space (a scaled logistic for fractions,
a log for latencies) so that every step stays inside `params.BOUNDS`. The
loss is the mean squared log error of TTFT and TPOT over measured rows plus
a pull towards the kernel-level values (the prior), so the fit cannot buy
TTFT accuracy with an implausible GEMM efficiency.

Stage 1 (`kernel_priors`, closed form over NVIDIA's per-kernel tables):
GEMM FLOP efficiency from compute-bound GEMMs (FP8 ones less the quantisation
of their input, whose bytes per element come from a least-squares split of
the compute-bound FP8 GEMMs' times; NVFP4 GEMMs, where the GPU has FP4 tensor
cores, the same way against the FP4 peak), bandwidth efficiency from
weight-streaming GEMMs (few tokens, big weights) and the bytes an NVFP4 one streams
per weight from its time over the FP8 one's on the same shape, attention efficiency from
long-context prefill attention, the cost of reading an FP8 KV cache from decode
attention timed with FP8 and BF16 caches, all-reduce latency from small messages
and bandwidth from prefill-sized ones as vLLM runs them (in groups of 8 GPUs, and
the ratio of groups of 2 to that) from the collective tables.
Stage 2 (`fit_serving`): optax Adam on the e2e rows.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxplan import vllm_release
from jaxplan.buckets import bucket_size, pad_rows
from jaxplan.calibrate.moe_kernels import moe_kernel_prior
from jaxplan.physics.params import BOUNDS, DEFAULTS
from jaxplan.physics.shapes import Hardware, hardware_table, take, traced
from jaxplan.physics.steady_state import as_finite_run, estimate, prepare
from jaxplan.prediction import RowBatch, row_batches
from jaxplan.row_gpu import GPU_OVERRIDES
from jaxplan.specs import load_gpu
from jaxplan.xla_options import jit_with_options

FIT_FIELDS = (
    "gemm_flops_efficiency",
    "fp8_quant_bytes_per_element",
    "memory_bandwidth_efficiency",
    "attention_flops_efficiency",
    "layer_latency_s",
    "allreduce_latency_s",
    "allreduce_bandwidth_efficiency",
    "allreduce_two_gpu_ratio",
    "per_seq_overhead_s",
    "request_overhead_s",
    "pipeline_seq_overhead_s",
)
FRACTIONS = {f for f in FIT_FIELDS if f.endswith("efficiency") or f.endswith("fraction")}
# Fitted in linear units of their upper bound, not log: a cost whose prior is near 0 (none where vLLM
# hides it) has no gradient in log space there, so a log-space fit could never find it. The free value's
# magnitude is the cost (reflected at 0, not clipped): a step that overshoots below 0 keeps a gradient
# and comes back, where a clip held it at 0 for good.
LINEAR = {"pipeline_seq_overhead_s"}
LATENCY_FLOOR_S = 1e-7  # log-space latencies need a floor above BOUNDS' 0
PRIOR_WEIGHT = 0.05  # per unconstrained unit, relative to the squared log error of one row
STEPS = 400
LEARNING_RATE = 0.05


# ---- parameter transforms -------------------------------------------------------------

def to_free(field: str, value: float) -> float:
    _, low, high = BOUNDS[field]
    if field in FRACTIONS:
        x = (min(max(value, low + 1e-6), high - 1e-6) - low) / (high - low)
        return math.log(x / (1.0 - x))
    if field in LINEAR:
        return min(max(value, low), high) / high
    return math.log(max(value, LATENCY_FLOOR_S))


def from_free(field: str, z):
    _, low, high = BOUNDS[field]
    if field in FRACTIONS:
        return low + (high - low) * jax.nn.sigmoid(z)
    if field in LINEAR:
        return jnp.clip(jnp.abs(z), low / high, 1.0) * high
    return jnp.clip(jnp.exp(z), LATENCY_FLOOR_S, high)


def free_vector(values: dict[str, float]) -> np.ndarray:
    return np.array([to_free(f, values[f]) for f in FIT_FIELDS], np.float32)


def values_of(z) -> dict[str, float]:
    return {f: float(from_free(f, z[i])) for i, f in enumerate(FIT_FIELDS)}


# ---- stage 1: kernels ---------------------------------------------------------------------

def has_kernel_tables(gpu: str, data_root=None) -> bool:
    """Whether NVIDIA's GEMM table for `gpu` is on disk (without it `kernel_priors` is DEFAULTS)."""
    from jaxplan.calibrate import kernels

    try:
        return bool(kernels.kernel_versions(gpu, "gemm", data_root))
    except Exception:  # noqa: BLE001 - an unknown GPU or no data folder
        return False



def kernel_priors(gpu: str, data_root=None) -> dict[str, float]:
    """Efficiencies read off NVIDIA's per-kernel measurements of `gpu` (DEFAULTS where absent)."""
    from jaxplan.calibrate import kernels

    spec = load_gpu(gpu)
    prior = dict(DEFAULTS)
    try:
        gemm = kernels.load_gemm(gpu, dtypes=("bf16", "fp8"), data_root=data_root)
    except Exception:  # noqa: BLE001 - no table for this GPU: keep the defaults
        return prior
    fp8 = (gemm.dtype == "fp8") & bool(spec.fp8_flops_per_s)
    peak = np.where(fp8, spec.fp8_flops_per_s or spec.bf16_flops_per_s, spec.bf16_flops_per_s)
    weight_bytes = gemm.n * gemm.k * np.where(gemm.dtype == "fp8", 1.0, 2.0)
    streaming = weight_streaming(gemm, weight_bytes)
    if streaming.any():
        prior["memory_bandwidth_efficiency"] = float(np.median(weight_bytes[streaming] / gemm.latency_s[streaming] / spec.hbm_bandwidth_bytes_per_s))
    bytes_per_s = spec.hbm_bandwidth_bytes_per_s * prior["memory_bandwidth_efficiency"]
    quant_s = np.zeros_like(gemm.latency_s)
    compute = fp8 & (gemm.m >= 1024) & (gemm.n >= 1024) & (gemm.k >= 1024)
    if compute.sum() >= 2:
        prior["fp8_quant_bytes_per_element"], quant_s = fp8_quant_prior(gemm, compute, peak, bytes_per_s)
        quant_s = np.where(fp8, quant_s, 0.0)
    big = (gemm.m >= 4096) & (gemm.n >= 4096) & (gemm.k >= 4096)
    if big.any():
        prior["gemm_flops_efficiency"] = net_gemm_efficiency(gemm, quant_s, peak, big)
    if spec.fp4_flops_per_s:
        prior.update(nvfp4_gemm_prior(gpu, spec, bytes_per_s, gemm, data_root))
    prior.update(gemm_floor_prior(gpu, data_root))
    try:
        ctx = kernels.load_context_attention(gpu, data_root=data_root)
        long = ctx.isl_tokens >= 4096
        if long.any():
            attn_flops = 4.0 * ctx.batch * ctx.num_heads * ctx.head_dim * ctx.isl_tokens.astype(np.float64) ** 2 / 2.0
            prior["attention_flops_efficiency"] = float(np.median(attn_flops[long] / ctx.latency_s[long] / spec.bf16_flops_per_s))
    except Exception:  # noqa: BLE001
        pass
    try:
        fp8_kv = fp8_kv_read_prior(kernels.load_generation_attention(gpu, data_root=data_root))
        if fp8_kv is not None:
            prior["fp8_kv_read_bytes_per_element"] = fp8_kv
    except Exception:  # noqa: BLE001
        pass
    prior.update(allreduce_prior(gpu, spec, data_root))
    prior.update(moe_kernel_prior(gpu, spec, data_root))
    # Fractions stay just inside their bounds (the fit's logit needs it); a latency may be its bound, 0.
    return {f: float(np.clip(v, BOUNDS[f][1] + (1e-6 if f in FRACTIONS else 0.0), BOUNDS[f][2])) for f, v in prior.items()}


ALLREDUCE_LATENCY_MAX_BYTES = 64 * 2**10  # a decode step's all-reduce of a few sequences is this small
# A prefill step's all-reduce: 1k-8k tokens x hidden 8192 x 2 B (2k-16k tokens at hidden 4096).
PREFILL_ALLREDUCE_MIN_BYTES = 16 * 2**20
PREFILL_ALLREDUCE_MAX_BYTES = 128 * 2**20


def allreduce_prior(gpu: str, spec, data_root=None) -> dict[str, float]:
    """All-reduce fields from the GPU's collective tables ({} without them):
    `allreduce_latency_s`, the median time of all-reduces <= ALLREDUCE_LATENCY_MAX_BYTES (NCCL and vLLM's
    custom all-reduce in CUDA graphs, as decode runs it); `allreduce_bandwidth_efficiency`, the median
    ring-equivalent fraction of the link reached by 8 GPUs over prefill-sized messages
    (PREFILL_ALLREDUCE_MIN_BYTES..MAX) in NCCL's table. A prefill step is larger than any captured CUDA
    graph, and vLLM sends an all-reduce that size to NCCL unless torch's symmetric-memory all-reduce
    takes it (vLLM's default flipped in 2025: on from 2025-09-17, PR #25070, off on main from 2025-10-15,
    PR #26925). NVIDIA's `vLLM_custom_eager` table times vLLM 0.19's dispatch, up to 1.4x faster than
    NCCL at these sizes on B200; the fitted campaign (2025-10-29) names no version, and both serving
    fits land nearer NCCL's fractions (docs/accuracy.md). `allreduce_two_gpu_ratio`, 2 GPUs' median
    fraction over the 8-GPU one. A field whose rows are missing keeps its default."""
    from jaxplan.calibrate import kernels

    found = {}
    try:
        comm = kernels.load_allreduce(gpu, data_root=data_root)
    except Exception:  # noqa: BLE001 - no collective tables for this GPU
        return found
    small = comm.message_bytes <= ALLREDUCE_LATENCY_MAX_BYTES
    if small.any():
        found["allreduce_latency_s"] = float(np.median(comm.latency_s[small]))
    comm = kernels.load_nccl(gpu, ops=("all_reduce",), dtypes=("fp16",), data_root=data_root)  # read above too
    n = comm.num_gpus.astype(np.float64)
    fraction = 2.0 * (n - 1.0) / n * comm.message_bytes / comm.latency_s / spec.intra_node_bandwidth_bytes_per_s
    prefill = (comm.message_bytes >= PREFILL_ALLREDUCE_MIN_BYTES) & (comm.message_bytes <= PREFILL_ALLREDUCE_MAX_BYTES)
    pair, eight = prefill & (n == 2), prefill & (n == 8)
    if eight.any():
        found["allreduce_bandwidth_efficiency"] = float(np.median(fraction[eight]))
        if pair.any():
            found["allreduce_two_gpu_ratio"] = float(np.median(fraction[pair]) / found["allreduce_bandwidth_efficiency"])
    return found


STREAMING_MAX_TOKENS = 16  # a weight-streaming GEMM: few tokens (decode) ...
STREAMING_MIN_WEIGHT_BYTES = 64e6  # ... over big weights (bytes stored in bf16 / FP8)


def weight_streaming(gemm, weight_bytes) -> np.ndarray:
    """Rows [N] bool of GEMMs that stream their weights: <= STREAMING_MAX_TOKENS tokens over
    `weight_bytes` [N] >= STREAMING_MIN_WEIGHT_BYTES."""
    return (gemm.m <= STREAMING_MAX_TOKENS) & (weight_bytes >= STREAMING_MIN_WEIGHT_BYTES)


def nvfp4_gemm_prior(gpu: str, spec, bytes_per_s: float, fp8_gemm, data_root=None) -> dict[str, float]:
    """`fp4_gemm_flops_efficiency` and `fp4_quant_bytes_per_element` from the GPU's NVFP4 GEMM
    table, read as the FP8 pair is (the same split of compute-bound GEMMs into FLOPs at the FP4 peak
    and input quantisation at `bytes_per_s`, then the median efficiency net of it over GEMMs with
    m, n, k >= 4096); and `fp4_weight_read_bytes_per_param` against `fp8_gemm`, the GPU's FP8 GEMM
    table (`fp4_weight_read_prior`). {} without an NVFP4 table."""
    from jaxplan.calibrate import kernels

    try:
        gemm = kernels.load_gemm(gpu, dtypes=("nvfp4",), data_root=data_root)
    except Exception:  # noqa: BLE001 - no NVFP4 timings for this GPU: keep the defaults
        return {}
    read_bytes = fp4_weight_read_prior(fp8_gemm, gemm)
    found = {} if read_bytes is None else {"fp4_weight_read_bytes_per_param": read_bytes}
    peak = np.full(gemm.m.shape, float(spec.fp4_flops_per_s))
    compute = (gemm.m >= 1024) & (gemm.n >= 1024) & (gemm.k >= 1024)
    big = (gemm.m >= 4096) & (gemm.n >= 4096) & (gemm.k >= 4096)
    if compute.sum() < 2 or not big.any():
        return found
    quant_bytes, quant_s = fp8_quant_prior(gemm, compute, peak, bytes_per_s)
    return {**found, "fp4_gemm_flops_efficiency": net_gemm_efficiency(gemm, quant_s, peak, big), "fp4_quant_bytes_per_element": quant_bytes}


def fp4_weight_read_prior(fp8_gemm, nvfp4_gemm) -> float | None:
    """HBM bytes per weight an NVFP4 GEMM streams, in units of the FP8 GEMM's 1 byte: the median over
    the weight-streaming shapes (`weight_streaming`, FP8 bytes) timed in both formats of
    1 B x t(NVFP4) / t(FP8), each shape at its fastest kernel. None without such pairs."""
    def fastest(table, dtype):
        """(shape codes [S] sorted, least latency [S]) of `dtype`'s weight-streaming rows."""
        rows = (table.dtype == dtype) & weight_streaming(table, table.n * table.k * 1.0)
        code = (table.m[rows] << 40) | (table.n[rows] << 20) | table.k[rows]  # m, n, k < 2^20
        order = np.argsort(code, kind="stable")
        code, latency = code[order], table.latency_s[rows][order]
        if not code.size:
            return code, latency
        starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
        return code[starts], np.minimum.reduceat(latency, starts)

    fp8_code, fp8_s = fastest(fp8_gemm, "fp8")
    nvfp4_code, nvfp4_s = fastest(nvfp4_gemm, "nvfp4")
    _, at_fp8, at_nvfp4 = np.intersect1d(fp8_code, nvfp4_code, assume_unique=True, return_indices=True)
    ratios = nvfp4_s[at_nvfp4] / fp8_s[at_fp8]
    return float(np.median(ratios)) if ratios.size else None


def net_gemm_efficiency(gemm, quant_s, peak, rows) -> float:
    """Median over `rows` [N] bool of FLOPs / (latency less its input quantisation `quant_s`) / `peak`
    (the quantisation never taken as more than 95% of a GEMM's time)."""
    from jaxplan.calibrate import kernels

    compute_s = np.maximum(gemm.latency_s - quant_s, 0.05 * gemm.latency_s)
    return float(np.median(kernels.gemm_flops(gemm)[rows] / compute_s[rows] / peak[rows]))


GEMM_FLOOR_MAX_TOKENS = 16
GEMM_FLOOR_MAX_WEIGHT_BYTES = 2**20


def gemm_floor_prior(gpu: str, data_root=None) -> dict[str, float]:
    """`gemm_floor_s`, `fp8_gemm_floor_s`, `fp4_gemm_floor_s`: the median time of the GEMMs of each dtype
    in the GPU's tables that multiply <= 16 tokens by <= 1 MiB of weights (their bytes would take
    < 0.5 us: what is left is the kernels' own least time); a dtype without such GEMMs keeps its default."""
    from jaxplan.calibrate import kernels
    from jaxplan.specs.space import DTYPE_BYTES

    floors = {"bf16": "gemm_floor_s", "fp8": "fp8_gemm_floor_s", "nvfp4": "fp4_gemm_floor_s"}
    try:
        gemm = kernels.load_gemm(gpu, dtypes=tuple(floors), data_root=data_root)  # one read for the three
    except Exception:  # noqa: BLE001 - no GEMM table for this GPU
        return {}
    found = {}
    for dtype, field in floors.items():
        tiny = (gemm.dtype == dtype) & (gemm.m <= GEMM_FLOOR_MAX_TOKENS) & (gemm.n * gemm.k * DTYPE_BYTES[dtype] <= GEMM_FLOOR_MAX_WEIGHT_BYTES)
        if tiny.any():
            found[field] = float(np.median(gemm.latency_s[tiny]))
    return found


FP8_KV_PRIOR_MIN_BF16_BYTES = 512 * 2**20  # a BF16 cache read this large is memory-bound: launch costs < 5%


def fp8_kv_read_prior(gen) -> float | None:
    """Bytes per element decode attention spends reading an FP8 KV cache: the median over the calls
    timed with both caches (same batch, context, heads, head size and kernel) whose BF16 cache reads
    at least FP8_KV_PRIOR_MIN_BF16_BYTES, of 2 B x t(FP8) / t(BF16). None without such pairs."""
    kv_bytes_bf16 = 2.0 * gen.num_kv_heads * gen.head_dim * gen.context_tokens * gen.batch.astype(np.float64) * 2.0

    def key(i):
        return (gen.batch[i], gen.context_tokens[i], gen.num_heads[i], gen.num_kv_heads[i], gen.head_dim[i], gen.kernel_source[i], gen.window_tokens[i])

    bf16 = {key(i): gen.latency_s[i] for i in np.flatnonzero(gen.kv_dtype == "bf16")}
    ratios = [2.0 * gen.latency_s[i] / bf16[key(i)] for i in np.flatnonzero((gen.kv_dtype == "fp8") & (kv_bytes_bf16 >= FP8_KV_PRIOR_MIN_BF16_BYTES)) if key(i) in bf16]
    return float(np.median(ratios)) if ratios else None


def fp8_quant_prior(gemm, rows, peak, bytes_per_s):
    """(bytes per input element, quantisation seconds per row [N]) of FP8 (or NVFP4) GEMMs: least
    squares on the relative error of latency = FLOPs / (e x peak) + m x k x bytes / bandwidth over the
    compute-bound rows `rows` [N] bool of one dtype (two unknowns, 1 / e and bytes; both kept >= 0)."""
    from scipy.optimize import nnls

    flops = 2.0 * gemm.m * gemm.n * gemm.k.astype(np.float64)
    elements = gemm.m * gemm.k.astype(np.float64)
    design = np.stack([flops / peak, elements / bytes_per_s], axis=1)[rows] / gemm.latency_s[rows, None]
    (_, per_element), _ = nnls(design, np.ones(int(rows.sum())))
    return float(per_element), elements * per_element / bytes_per_s


# ---- stage 2: end-to-end rows ----------------------------------------------------------------

class FitData(NamedTuple):
    batches: tuple  # RowBatch per model (gpu_index refers to the fit's GPU list)
    ttft_s: tuple  # [N] measured per batch
    tpot_s: tuple
    peaks: tuple  # per batch, a [N] array per GPU_OVERRIDES field: the spec value each row was measured on
    v0_pipeline: tuple  # per batch, [N] 1.0 where the row's vLLM release serves PP on V0 (`vllm_release`)


def fit_data(rows: list[dict], gpus: list[str]) -> FitData:
    """Row batches whose gpu_index refers to `gpus` (the order of the parameter table); rows measured on
    a variant of a GPU (`row_gpu.GPU_OVERRIDES` columns) keep their own spec values in `peaks`."""
    usable = [r for r in rows if r.get("measured_ttft_ms_mean") and r.get("measured_tpot_ms_mean")]
    batches, ttft, tpot, peaks, v0 = [], [], [], [], []
    for batch in row_batches(usable, "measurements"):
        names = [g.name for g in batch.gpus]
        index = np.array([gpus.index(names[i]) for i in batch.gpu_index], np.int32)
        peaks.append(tuple(np.array([getattr(batch.gpus[i], field) for i in batch.gpu_index], np.float32) for field in GPU_OVERRIDES.values()))
        batches.append(batch._replace(gpu_index=index, gpus=tuple(load_gpu(g) for g in gpus)))
        ttft.append(np.array([usable[i]["measured_ttft_ms_mean"] for i in batch.row_ids], np.float32) * 1e-3)
        tpot.append(np.array([usable[i]["measured_tpot_ms_mean"] for i in batch.row_ids], np.float32) * 1e-3)
        v0.append(np.array([vllm_release.pipeline_on_v0(r) for r in batch.releases], np.float32))
    return FitData(tuple(batches), tuple(ttft), tuple(tpot), tuple(peaks), tuple(v0))


def hardware_from_free(base: Hardware, z) -> Hardware:
    """`base` [G] (spec peaks; see `base_table`) with the fitted fields taken from z [G, P]."""
    return base._replace(**{f: from_free(f, z[:, i]) for i, f in enumerate(FIT_FIELDS)})


def base_table(gpus: list[str], fixed: dict[str, dict[str, float]] | None = None) -> Hardware:
    """[G] Hardware of `gpus` that the fit's parameters replace: spec peaks, and the fields it does not
    fit at each GPU's `fixed` values (its kernel priors: the values it is evaluated and shipped with),
    DEFAULTS where none are given."""
    fixed = fixed or {}
    return hardware_table(tuple(load_gpu(g) for g in gpus), {g: {**DEFAULTS, **fixed.get(g, {})} for g in gpus})


def predict_batch(batch: RowBatch, hw_table: Hardware, peaks: tuple, v0_pipeline):
    """Stage 4 for a fit batch: [G] `hw_table` gathered per row, with the rows' own spec values (`peaks`).
    A row whose release serves PP on V1 (`v0_pipeline` [N] 0) takes V1's pipeline host cost, not the
    fitted one, which is V0's (`vllm_release`)."""
    hw = take(hw_table, jnp.asarray(batch.gpu_index))
    hw = hw._replace(**{field: jnp.asarray(value) for field, value in zip(GPU_OVERRIDES.values(), peaks)})
    v1_cost = jnp.float32(vllm_release.v1_pipeline_seq_overhead_s())
    hw = hw._replace(pipeline_seq_overhead_s=jnp.where(jnp.asarray(v0_pipeline) > 0, hw.pipeline_seq_overhead_s, v1_cost))
    # Measured runs are finite: an overloaded Poisson run whose requests all get a slot is one wave, as
    # `predict_rows` predicts it (else its TTFT is infinite and the fit flees the parameters that cause it).
    prep = prepare(batch.model, hw, batch.layout, batch.workload, batch.gpu_memory_utilization)
    workload = as_finite_run(batch.workload, batch.layout, prep)
    return estimate(batch.model, hw, batch.layout, workload, batch.gpu_memory_utilization, prepared=prep)


def log_errors(data: FitData, hw_table: Hardware):
    """Concatenated log(pred/measured) for TTFT and TPOT over all rows: ([N], [N])."""
    ttft_err, tpot_err = [], []
    for batch, ttft, tpot, peaks, v0_pipeline in zip(data.batches, data.ttft_s, data.tpot_s, data.peaks, data.v0_pipeline):
        est = predict_batch(batch, hw_table, peaks, v0_pipeline)
        ttft_err.append(jnp.log(jnp.maximum(est.ttft_mean_s, 1e-6) / ttft))
        tpot_err.append(jnp.log(jnp.maximum(est.tpot_mean_s, 1e-6) / tpot))
    return jnp.concatenate(ttft_err), jnp.concatenate(tpot_err)


# The fit's program is compiled per (GPUs, models, row bucket of each), ~10 s each on 2 cores; small
# fits (a user's few measurements, tests) share one program from these floors up, at the cost of
# padding rows and GPUs that carry no weight.
MIN_FIT_ROWS = 32
MIN_FIT_GPUS = 2


def _padded(data: FitData, min_rows: int = 0) -> tuple:
    """Per batch: its traced model shape, its arrays padded to `buckets.bucket_size` rows (of at least
    `min_rows` and MIN_FIT_ROWS) and a weight per row (1 real, 0 padding). Everything is an array, so
    the fit's program depends on row buckets only."""
    out = []
    for b, ttft, tpot, peaks, v0_pipeline in zip(data.batches, data.ttft_s, data.tpot_s, data.peaks, data.v0_pipeline):
        num = len(ttft)
        size = bucket_size(max(num, min_rows), MIN_FIT_ROWS)
        weight = (np.arange(size) < num).astype(np.float32)
        fraction = np.broadcast_to(np.asarray(b.gpu_memory_utilization, np.float32), (num,))
        out.append((traced(b.model), pad_rows((b.gpu_index, b.layout, b.workload, ttft, tpot, peaks, fraction, v0_pipeline), num, size), weight))
    return tuple(out)


def _weighted_loss(padded: tuple, hw_table: Hardware):
    """Weighted mean squared log error of TTFT plus that of TPOT over all rows of `_padded` batches
    (a non-finite error counts as 5)."""
    batches = tuple(RowBatch(model, (), index, layout, workload, None, fraction) for model, (index, layout, workload, *_, fraction, _v0), _ in padded)
    data = FitData(batches, *(tuple(p[1][k] for p in padded) for k in (3, 4, 5, 7)))
    ttft_err, tpot_err = log_errors(data, hw_table)
    w = jnp.concatenate([p[2] for p in padded])
    mean = lambda e: jnp.sum(w * jnp.where(jnp.isfinite(e), e, 5.0) ** 2) / jnp.sum(w)  # noqa: E731
    return mean(ttft_err) + mean(tpot_err)


def fit_serving(data: FitData, gpus: list[str], prior: np.ndarray, *, fixed: dict[str, dict[str, float]] | None = None,
                shared: bool = False, steps: int = STEPS, min_rows: int = 0):
    """Adam on the log errors; prior [G, P] (free space). shared=True fits one vector for all GPUs.
    `fixed` gives each GPU's values of the fields outside FIT_FIELDS (`base_table`; DEFAULTS without).
    A GPU of `gpus` with no row in `data` has no say in the fit, its prior included (a held-out GPU
    listed so that the fit shares the program of the fit on every GPU); unshared, it keeps its prior.
    min_rows: pad each model's rows to the bucket of at least this many (`_padded`), e.g. to that of
    the complete fit, whose program a fit on fewer rows then reuses.

    Compiled once per (`buckets.bucket_size` of the number of GPUs, at least MIN_FIT_GPUS; number of
    models; `_padded`'s row bucket of each): a fit of other rows, models, GPUs or steps in the same
    buckets, shared or not, reuses the program (held-out GPUs and folds, tests, a user's
    measurements); the GPUs that pad the list are listed GPUs without rows. Returns (z [G, P], final loss)."""
    padded = jax.tree.map(jnp.asarray, _padded(data, min_rows))
    num_gpus = len(gpus)
    size = bucket_size(num_gpus, MIN_FIT_GPUS)
    listed = list(gpus) + [gpus[-1]] * (size - num_gpus)
    prior = np.asarray(pad_rows(np.asarray(prior), num_gpus, size))
    seen = np.zeros(size, np.float32)
    for batch in data.batches:
        seen[np.asarray(batch.gpu_index)] = 1.0
    z0 = np.broadcast_to((seen @ prior) / max(seen.sum(), 1.0), prior.shape) if shared else prior
    weight = seen if seen.any() else (np.arange(size) < num_gpus).astype(np.float32)
    z, loss = _fit(jnp.asarray(z0, jnp.float32), jnp.asarray(prior), jnp.asarray(weight), jnp.bool_(shared), padded, base_table(listed, fixed), jnp.int32(steps))
    return np.asarray(z)[:num_gpus], float(loss)


# The fit's one program compiles at XLA's -O0: the same HLO and float semantics (the parameters come out
# the same to the file's 6 digits), ~20 s less compilation with an empty cache for ~9 s more Adam steps
# with a warm one, on the 2-core VM (bench/README.md, "Calibration").
FIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


@jit_with_options(FIT_COMPILER_OPTIONS)
def _fit(z0, prior, prior_weight, shared, padded, base: Hardware, steps):
    """z0, prior [G, P]; prior_weight [G] (0: a GPU with no rows, left out of the prior term); shared:
    one vector for all GPUs (z0's rows equal, and every row takes the summed gradient, i.e. the gradient
    of one vector broadcast to all, so they stay equal)."""

    def loss_fn(z):
        prior_term = jnp.sum(prior_weight[:, None] * (z - prior) ** 2) / (jnp.sum(prior_weight) * prior.shape[1])
        return _weighted_loss(padded, hardware_from_free(base, z)) + PRIOR_WEIGHT * prior_term

    optimizer = optax.adam(LEARNING_RATE)

    def step(_, carry):
        z, opt_state, _ = carry
        loss, grad = jax.value_and_grad(loss_fn)(z)
        grad = jnp.where(jnp.isfinite(grad), grad, 0.0)
        grad = jnp.where(shared, jnp.broadcast_to(jnp.sum(grad, axis=0, keepdims=True), grad.shape), grad)
        updates, opt_state = optimizer.update(grad, opt_state, z)
        return optax.apply_updates(z, updates), opt_state, loss

    z, _, loss = jax.lax.fori_loop(0, steps, step, (z0, optimizer.init(z0), jnp.float32(jnp.nan)))
    return z, loss
