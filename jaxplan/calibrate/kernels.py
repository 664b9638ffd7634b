"""Per-kernel timings from NVIDIA AIConfigurator's database, as tidy numpy tables.

Source: `<data_root>/kernels_aiconfigurator/<gpu>/<op>/<framework>/<version>/*.parquet`
(aiconfigurator-core 0.12.0, Apache-2.0; see that folder's SOURCE.txt). Each
loader returns a NamedTuple of equal-length 1-D numpy arrays (shape [N], one
entry per timed kernel call), in SI units: latencies in seconds, message sizes
in bytes. Head counts are per GPU (the collector times one TP shard).

Units, checked against physics (not only the SOURCE.txt claim "latency in ms"):
the parquet `latency` column is milliseconds. Read as ms, the best bf16 GEMM
reaches 93-97 % of the dense peak on every GPU (H100 956 of 989 TFLOP/s; a
4096^3 bf16 GEMM takes 0.166 ms = 828 TFLOP/s) and large decode-attention KV
reads reach 85-95 % of HBM bandwidth; read as microseconds every GEMM would
beat the peak ~1000x, read as seconds the best would reach 0.1 %. NCCL and
vLLM `message_size` is in ELEMENTS: at equal message_size an fp16 all-gather
takes ~1.9x the int8 one, and fp16 at 2^28 elements times the same as int8 at
2^29 (both 512 MiB). It is converted here with the element size.

Tables with a working set that fits in L2 (e.g. L40S, 96 MB L2) can beat HBM
bandwidth; 8-GPU NVLink all-reduce on H100/H200 shows a ring-equivalent bus
bandwidth up to 1.05x the 450 GB/s link figure (NVLink SHARP reduces in the
switch), still above the (n-1)/n x bytes / link-bandwidth lower bound.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path
from typing import NamedTuple

import numpy as np

from jaxplan.calibrate._data import import_pyarrow_parquet, require_file, resolve_root, version_key
from jaxplan.errors import PlanError, bad_value, unknown_name

KERNEL_DIR = "kernels_aiconfigurator"
GPUS_WITH_KERNELS = ("a100_sxm", "b200_sxm", "h100_sxm", "h200_sxm", "l40s")
MS_TO_S = 1e-3

# Source dtype label -> jaxplan label.
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
COMM_DTYPES = {"half": "fp16", "bfloat16": "bf16", "int8": "int8"}
COMM_ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "int8": 1}
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")

# family -> (path under <gpu>/, parquet file name)
FAMILIES = {
    "gemm": ("gemm/vllm", "gemm_perf.parquet"),
    "context_attention": ("attention/vllm", "context_attention_perf.parquet"),
    "generation_attention": ("attention/vllm", "generation_attention_perf.parquet"),
    "nccl": ("comm/nccl", "nccl_perf.parquet"),
    "custom_allreduce": ("comm/vllm", "custom_allreduce_perf.parquet"),
    "moe": ("moe/vllm", "moe_perf.parquet"),
}
# The MoE tables' expert formats, kept under their source labels: w4a16 (weight-only, bf16 activations)
# and w4a8 (MXFP8 activations) MXFP4 are different kernels.
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8", "int4_wo")


class GemmTable(NamedTuple):
    """Timed GEMMs C[m, n] = A[m, k] @ W[k, n] (vLLM linear kernels); arrays of shape [N].

    FLOPs of a row: 2 * m * n * k (see `gemm_flops`).
    """

    m: np.ndarray  # int64: rows of the activation (tokens in the batch)
    n: np.ndarray  # int64: output features
    k: np.ndarray  # int64: input features (reduction dimension)
    dtype: np.ndarray  # str: 'bf16' | 'fp8' (per-tensor scaled) | 'fp8_block' | 'nvfp4'
    kernel_source: np.ndarray  # str: e.g. 'torch.nn.functional.linear', 'CutlassFP8ScaledMMLinearKernel'
    latency_s: np.ndarray  # float64: seconds per call


class ContextAttentionTable(NamedTuple):
    """Timed prefill attention: `batch` sequences of `isl_tokens` each, no cached prefix; arrays [N]."""

    batch: np.ndarray  # int64: sequences in the call
    isl_tokens: np.ndarray  # int64: prompt tokens per sequence (query = key length)
    num_heads: np.ndarray  # int64: query heads on this GPU
    num_kv_heads: np.ndarray  # int64: key/value heads on this GPU
    head_dim: np.ndarray  # int64
    kv_dtype: np.ndarray  # str: 'bf16' | 'fp8'
    window_tokens: np.ndarray  # int64: sliding window (0 = full attention)
    kernel_source: np.ndarray  # str: e.g. 'vllm_flash_attn_fa3'
    latency_s: np.ndarray  # float64: seconds per call (one layer)


class GenerationAttentionTable(NamedTuple):
    """Timed decode attention: `batch` sequences, one new query token each; arrays [N].

    `context_tokens` = tokens in each sequence's KV cache including the new
    one (= source isl 1 + step: the collector logs step = seq_len - 1).
    """

    batch: np.ndarray  # int64
    context_tokens: np.ndarray  # int64: KV length read per sequence
    num_heads: np.ndarray  # int64: query heads on this GPU
    num_kv_heads: np.ndarray  # int64
    head_dim: np.ndarray  # int64
    kv_dtype: np.ndarray  # str: 'bf16' | 'fp8'
    window_tokens: np.ndarray  # int64 (0 = full attention)
    kernel_source: np.ndarray  # str
    latency_s: np.ndarray  # float64: seconds per call (one layer)


class CommTable(NamedTuple):
    """Timed collectives inside one node; arrays [N]. `message_bytes` is the per-GPU buffer size."""

    op: np.ndarray  # str: 'all_reduce' | 'all_gather' | 'reduce_scatter' | 'alltoall'
    implementation: np.ndarray  # str: 'nccl' | 'vllm_custom_graph' | 'vllm_custom_eager'
    num_gpus: np.ndarray  # int64: GPUs in the group
    dtype: np.ndarray  # str: 'fp16' | 'bf16' | 'int8'
    message_bytes: np.ndarray  # int64: elements * element size
    latency_s: np.ndarray  # float64: seconds per call


class MoeTable(NamedTuple):
    """Timed fused-MoE layers (routing, both expert GEMMs and the activation, vLLM's kernels) on one GPU
    of an expert group of moe_tp x moe_ep GPUs; arrays [N]."""

    tokens: np.ndarray  # int64: tokens entering the layer
    hidden_size: np.ndarray  # int64
    intermediate_size: np.ndarray  # int64: one expert's FFN width (before TP slicing)
    top_k: np.ndarray  # int64: experts per token
    num_experts: np.ndarray  # int64: routed experts of the layer (all GPUs)
    moe_tp: np.ndarray  # int64: ways each expert is sliced
    moe_ep: np.ndarray  # int64: ways the experts are dealt out
    dtype: np.ndarray  # str: one of MOE_DTYPES
    distribution: np.ndarray  # str: token routing, 'balanced' | 'power_law_<alpha>'
    kernel_source: np.ndarray  # str ('' where the table does not say)
    latency_s: np.ndarray  # float64: seconds per call


KernelTable = GemmTable | ContextAttentionTable | GenerationAttentionTable | CommTable
TABLE_TYPES = (GemmTable, ContextAttentionTable, GenerationAttentionTable, CommTable)
STRING_FIELDS = frozenset({"dtype", "kernel_source", "kv_dtype", "op", "implementation"})


def gemm_flops(table: GemmTable) -> np.ndarray:
    """FLOPs per row, 2 * m * n * k, float64 [N]."""
    return 2.0 * table.m.astype(np.float64) * table.n.astype(np.float64) * table.k.astype(np.float64)


def check_gpu(gpu: str) -> str:
    name = gpu.lower().replace("-", "_")
    if name not in GPUS_WITH_KERNELS:
        raise unknown_name("GPU with kernel tables", gpu, GPUS_WITH_KERNELS)
    return name


def kernel_versions(gpu: str, family: str, data_root: str | Path | None = None) -> list[str]:
    """Framework versions with a table of this family for this GPU, oldest first.

    family: 'gemm' | 'context_attention' | 'generation_attention' | 'nccl' | 'custom_allreduce'.
    """
    if family not in FAMILIES:
        raise unknown_name("kernel family", family, FAMILIES)
    sub, filename = FAMILIES[family]
    base = resolve_root(data_root) / KERNEL_DIR / check_gpu(gpu) / sub
    found = [p.parent.name for p in base.glob(f"*/{filename}")] if base.is_dir() else []
    return sorted(found, key=version_key)


def table_path(gpu: str, family: str, version: str | None = None, data_root: str | Path | None = None) -> Path:
    """Path of one parquet table; version None = the newest directory that has it."""
    versions = kernel_versions(gpu, family, data_root)
    if not versions:
        raise PlanError(f"no {family} table for GPU {gpu!r} under {resolve_root(data_root) / KERNEL_DIR}; GPUs with tables: {', '.join(GPUS_WITH_KERNELS)}")
    if version is None:
        version = versions[-1]
    elif version not in versions:
        raise bad_value("version", version, f"{family} tables for {gpu} exist for versions {', '.join(versions)}")
    sub, filename = FAMILIES[family]
    return require_file(resolve_root(data_root) / KERNEL_DIR / check_gpu(gpu) / sub / version / filename)


@functools.cache
def _read_columns(path: str, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Selected parquet columns as read-only numpy arrays (strings as str arrays), cached per file."""
    pq = import_pyarrow_parquet()
    table = pq.read_table(path, columns=list(columns))
    out = {}
    for name in columns:
        array = table.column(name).to_numpy(zero_copy_only=False)
        if array.dtype == object:
            array = array.astype(str)
        array.flags.writeable = False
        out[name] = array
    return out


@functools.cache
def _column_names(path: str) -> frozenset[str]:
    return frozenset(import_pyarrow_parquet().read_schema(path).names)


def _columns(path: Path, wanted: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    present = _column_names(str(path))
    missing = [c for c in wanted if c not in present]
    if missing:
        raise PlanError(f"{path}: missing column(s) {', '.join(missing)}; the kernel table schema changed, see SOURCE.txt")
    return _read_columns(str(path), wanted + tuple(c for c in optional if c in present))


def _map_labels(values: np.ndarray, mapping: dict[str, str], where: Path, field: str) -> np.ndarray:
    unknown = sorted(set(np.unique(values)) - set(mapping))
    if unknown:
        raise PlanError(f"{where}: unexpected {field} value(s) {unknown}; add them to jaxplan.calibrate.kernels")
    out = np.empty(values.shape, dtype=object)
    for src, dst in mapping.items():
        out[values == src] = dst
    return out.astype(str)


def _check_choice(field: str, chosen, allowed) -> tuple:
    chosen = (chosen,) if isinstance(chosen, str) else tuple(chosen)
    bad = [c for c in chosen if c not in allowed]
    if bad or not chosen:
        raise bad_value(field, list(chosen), f"choose from {sorted(set(allowed))}")
    return chosen


def subsample(table, max_rows: int | None, seed: int = 0):
    """At most `max_rows` rows, chosen uniformly without replacement with `seed`, original order kept."""
    if max_rows is None:
        return table
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise bad_value("max_rows", max_rows, "must be a positive integer or None")
    size = len(table[0])
    if size <= max_rows:
        return table
    keep = np.sort(np.random.default_rng(seed).choice(size, size=max_rows, replace=False))
    return type(table)(*(column[keep] for column in table))


def load_gemm(
    gpu: str,
    *,
    dtypes=("bf16", "fp8"),
    version: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    data_root: str | Path | None = None,
) -> GemmTable:
    """GEMM timings of one GPU (vLLM linear kernels), newest vLLM version by default.

    dtypes: any of 'bf16', 'fp8' (per-tensor), 'fp8_block', 'nvfp4' (B200 only).
    Rows (h100_sxm, vLLM 0.24.0): 35,742 bf16 + 35,742 fp8 + 35,704 fp8_block.
    """
    dtypes = _check_choice("dtypes", dtypes, GEMM_DTYPES.values())
    path = table_path(gpu, "gemm", version, data_root)
    cols = _columns(path, ("m", "n", "k", "gemm_dtype", "kernel_source", "latency"))
    dtype = _map_labels(cols["gemm_dtype"], GEMM_DTYPES, path, "gemm_dtype")
    keep = np.isin(dtype, dtypes)
    table = GemmTable(
        m=cols["m"][keep].astype(np.int64),
        n=cols["n"][keep].astype(np.int64),
        k=cols["k"][keep].astype(np.int64),
        dtype=dtype[keep],
        kernel_source=cols["kernel_source"][keep],
        latency_s=cols["latency"][keep].astype(np.float64) * MS_TO_S,
    )
    return subsample(table, max_rows, seed)


def load_moe(gpu: str, *, version: str | None = None, data_root: str | Path | None = None) -> MoeTable:
    """Fused-MoE timings of one GPU, newest vLLM version by default (every dtype and routing)."""
    path = table_path(gpu, "moe", version, data_root)
    wanted = ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "moe_dtype", "distribution", "latency")
    cols = _columns(path, wanted, optional=("kernel_source",))
    unknown = sorted(set(np.unique(cols["moe_dtype"])) - set(MOE_DTYPES))
    if unknown:
        raise PlanError(f"{path}: unexpected moe_dtype value(s) {unknown}; add them to jaxplan.calibrate.kernels.MOE_DTYPES")
    size = len(cols["latency"])
    ints = {name: cols[column].astype(np.int64) for name, column in (
        ("tokens", "num_tokens"), ("hidden_size", "hidden_size"), ("intermediate_size", "inter_size"), ("top_k", "topk"),
        ("num_experts", "num_experts"), ("moe_tp", "moe_tp_size"), ("moe_ep", "moe_ep_size"))}
    return MoeTable(**ints, dtype=cols["moe_dtype"], distribution=cols["distribution"],
                    kernel_source=cols.get("kernel_source", np.full(size, "")), latency_s=cols["latency"].astype(np.float64) * MS_TO_S)


def _attention_columns(gpu: str, family: str, version, data_root, kv_dtypes, window_tokens):
    kv_dtypes = _check_choice("kv_dtypes", kv_dtypes, KV_DTYPES.values())
    path = table_path(gpu, family, version, data_root)
    wanted = ("batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype", "kernel_source", "latency")
    cols = _columns(path, wanted, optional=("window_size",))
    window = cols["window_size"].astype(np.int64) if "window_size" in cols else np.zeros(len(cols["latency"]), np.int64)
    kv = _map_labels(cols["kv_cache_dtype"], KV_DTYPES, path, "kv_cache_dtype")
    keep = np.isin(kv, kv_dtypes)
    if window_tokens is not None:
        keep &= window == int(window_tokens)
    return cols, kv, window, keep


def load_context_attention(
    gpu: str,
    *,
    kv_dtypes=("bf16", "fp8"),
    window_tokens: int | None = 0,
    version: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    data_root: str | Path | None = None,
) -> ContextAttentionTable:
    """Prefill (context) attention timings; window_tokens=0 keeps full attention only, None keeps all windows."""
    cols, kv, window, keep = _attention_columns(gpu, "context_attention", version, data_root, kv_dtypes, window_tokens)
    table = ContextAttentionTable(
        batch=cols["batch_size"][keep].astype(np.int64),
        isl_tokens=cols["isl"][keep].astype(np.int64),
        num_heads=cols["num_heads"][keep].astype(np.int64),
        num_kv_heads=cols["num_key_value_heads"][keep].astype(np.int64),
        head_dim=cols["head_dim"][keep].astype(np.int64),
        kv_dtype=kv[keep],
        window_tokens=window[keep],
        kernel_source=cols["kernel_source"][keep],
        latency_s=cols["latency"][keep].astype(np.float64) * MS_TO_S,
    )
    return subsample(table, max_rows, seed)


def load_generation_attention(
    gpu: str,
    *,
    kv_dtypes=("bf16", "fp8"),
    window_tokens: int | None = 0,
    version: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    data_root: str | Path | None = None,
) -> GenerationAttentionTable:
    """Decode (generation) attention timings; context_tokens = source isl (1) + step."""
    cols, kv, window, keep = _attention_columns(gpu, "generation_attention", version, data_root, kv_dtypes, window_tokens)
    table = GenerationAttentionTable(
        batch=cols["batch_size"][keep].astype(np.int64),
        context_tokens=(cols["isl"][keep] + cols["step"][keep]).astype(np.int64),
        num_heads=cols["num_heads"][keep].astype(np.int64),
        num_kv_heads=cols["num_key_value_heads"][keep].astype(np.int64),
        head_dim=cols["head_dim"][keep].astype(np.int64),
        kv_dtype=kv[keep],
        window_tokens=window[keep],
        kernel_source=cols["kernel_source"][keep],
        latency_s=cols["latency"][keep].astype(np.float64) * MS_TO_S,
    )
    return subsample(table, max_rows, seed)


def _comm_table(op, implementation, num_gpus, dtype, elements, latency_ms) -> CommTable:
    element_bytes = np.array([COMM_ELEMENT_BYTES[d] for d in dtype], dtype=np.int64) if len(dtype) else np.zeros(0, np.int64)
    return CommTable(
        op=np.asarray(op, dtype=str),
        implementation=np.asarray(implementation, dtype=str),
        num_gpus=num_gpus.astype(np.int64),
        dtype=dtype,
        message_bytes=elements.astype(np.int64) * element_bytes,
        latency_s=latency_ms.astype(np.float64) * MS_TO_S,
    )


def load_nccl(
    gpu: str,
    *,
    ops=("all_reduce",),
    dtypes=("fp16", "int8"),
    version: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    data_root: str | Path | None = None,
) -> CommTable:
    """NCCL collectives (nccl-tests) on 2/4/8 GPUs of one node; newest NCCL version by default.

    Note: the oldest H100/H200 folder (NCCL 2.23) has no all_reduce rows, and
    the h100 '2.27.3' / h200 '2.26.2' / b200 '2.27.3' folders hold repeated
    runs whose version column says 2.29.2 (2-3 rows per configuration).
    """
    ops = _check_choice("ops", ops, NCCL_OPS)
    dtypes = _check_choice("dtypes", dtypes, ("fp16", "int8"))
    path = table_path(gpu, "nccl", version, data_root)
    cols = _columns(path, ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency"))
    dtype = _map_labels(cols["nccl_dtype"], COMM_DTYPES, path, "nccl_dtype")
    keep = np.isin(cols["op_name"], ops) & np.isin(dtype, dtypes)
    table = _comm_table(cols["op_name"][keep], np.full(int(keep.sum()), "nccl"), cols["num_gpus"][keep], dtype[keep], cols["message_size"][keep], cols["latency"][keep])
    return subsample(table, max_rows, seed)


def load_custom_allreduce(
    gpu: str,
    *,
    modes=("graph",),
    version: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    data_root: str | Path | None = None,
) -> CommTable:
    """vLLM custom all-reduce (bf16) on 2/4/8 GPUs; mode 'graph' (CUDA graph, what serving uses) or 'eager'."""
    modes = _check_choice("modes", modes, ("graph", "eager"))
    path = table_path(gpu, "custom_allreduce", version, data_root)
    cols = _columns(path, ("op_name", "kernel_source", "allreduce_dtype", "num_gpus", "message_size", "latency"))
    source_for = {"graph": "vLLM_custom_graph", "eager": "vLLM_custom_eager"}
    keep = np.isin(cols["kernel_source"], [source_for[m] for m in modes]) & (cols["op_name"] == "all_reduce")
    dtype = _map_labels(cols["allreduce_dtype"], COMM_DTYPES, path, "allreduce_dtype")
    implementation = np.char.lower(cols["kernel_source"][keep])  # vllm_custom_graph | vllm_custom_eager
    table = _comm_table(cols["op_name"][keep], implementation, cols["num_gpus"][keep], dtype[keep], cols["message_size"][keep], cols["latency"][keep])
    return subsample(table, max_rows, seed)


def load_allreduce(gpu: str, *, max_rows: int | None = None, seed: int = 0, data_root: str | Path | None = None) -> CommTable:
    """All-reduce timings: NCCL fp16 plus vLLM custom all-reduce (graph mode, bf16), newest versions."""
    parts = (load_nccl(gpu, ops=("all_reduce",), dtypes=("fp16",), data_root=data_root), load_custom_allreduce(gpu, data_root=data_root))
    table = CommTable(*(np.concatenate(columns) for columns in zip(*parts)))
    return subsample(table, max_rows, seed)


# --- CSV round trip (test fixtures) ---------------------------------------------------------------


def write_kernel_csv(table: KernelTable, path: str | Path) -> None:
    """Write a kernel table as CSV: header = the NamedTuple's field names, one row per entry."""
    if not isinstance(table, TABLE_TYPES):
        raise bad_value("table", type(table).__name__, f"pass one of {', '.join(t.__name__ for t in TABLE_TYPES)}")
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(table._fields)
        for row in zip(*table):
            writer.writerow([repr(float(v)) if isinstance(v, np.floating) else v for v in row])


def read_kernel_csv(path: str | Path) -> KernelTable:
    """Read a CSV written by `write_kernel_csv`; the header decides the table type."""
    path = Path(path)
    try:
        with open(path, newline="") as handle:
            rows = list(csv.reader(handle))
    except OSError as err:
        raise PlanError(f"{path}: cannot read ({err.strerror})") from None
    if not rows:
        raise PlanError(f"{path}: empty file; expected a header naming the columns of a kernel table")
    header = tuple(rows[0])
    kinds = {t._fields: t for t in TABLE_TYPES}
    if header not in kinds:
        raise PlanError(f"{path}: header {','.join(header)} matches no kernel table; expected the fields of one of {', '.join(t.__name__ for t in TABLE_TYPES)}")
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise PlanError(f"{path}: row {number} has {len(row)} cells, the header has {len(header)}; fix or regenerate the file")
    columns = []
    for index, field in enumerate(header):
        values = [r[index] for r in rows[1:]]
        try:
            if field in STRING_FIELDS:
                columns.append(np.array(values, dtype=str))
            elif field.endswith("_s"):
                columns.append(np.array(values, dtype=np.float64))
            else:
                columns.append(np.array(values, dtype=np.int64))
        except ValueError:
            raise PlanError(f"{path}: column {field} holds a non-number; rewrite the file with write_kernel_csv") from None
    return kinds[header](*columns)
