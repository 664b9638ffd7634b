"""SearchSpace: the axes of the candidate grid and the constraints shared by all candidates."""

from __future__ import annotations

import dataclasses
import math

from jaxplan.errors import bad_value
from jaxplan.specs.formats import EXPERT_ONLY, FORMATS, NVFP4

WEIGHT_DTYPES = tuple(f.name for f in FORMATS)  # bf16, fp8, nvfp4, mxfp4, int4 (physics.formats)
DEFAULT_WEIGHT_DTYPES = ("bf16", "fp8")  # NVFP4 costs accuracy that FP8 does not: opt in by naming it
KV_CACHE_DTYPES = ("auto", "fp8")
NVFP4_BYTES_PER_PARAM = NVFP4.expert_bytes_per_param
# Bytes per parameter of the weights other than routed experts (all of a dense model's), and of a KV element.
DTYPE_BYTES = {**{f.name: f.other_bytes_per_param for f in FORMATS}, "auto": 2}
# How a MoE model's replicas are laid out (vLLM's flags; `physics.shapes.Layout`):
#   tp     one server per replica, experts tensor-parallel over its TP GPUs (vLLM's default)
#   ep     one server per replica with --enable-expert-parallel: whole experts per GPU (EP = TP)
#   dp     --data-parallel-size: DP ranks step together, experts sliced over DP x TP GPUs
#   dp_ep  --data-parallel-size --enable-expert-parallel: data-parallel attention, EP = DP x TP
# A dense model has only `tp` (its DP ranks are independent replicas).
LAYOUT_KINDS = ("tp", "ep", "dp", "dp_ep")
LOCKSTEP_KINDS = frozenset({"dp", "dp_ep"})
EXPERT_PARALLEL_KINDS = frozenset({"ep", "dp_ep"})


def parse_kind_label(label: str) -> tuple[str, int]:
    """A grid layout-kind label ('tp', 'ep', 'dp:4', 'dp_ep:8') -> (kind, lock-step ranks)."""
    kind, _, ranks = label.partition(":")
    return kind, int(ranks or 1)
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # KV-cache block sizes (tokens) vLLM accepts
VLLM_DEFAULT_BLOCK_SIZE_TOKENS = 16  # what vLLM uses without --block-size

INT_AXES = (
    "lockstep_sizes",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
)


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Axis values (tuples, ascending) plus shared settings.

    The grid is the Cartesian product of the axes and the GPU types; its size
    is `size(num_gpu_types)`. `gpu_budget` caps TP x PP x DP.
    """

    name: str
    tensor_parallel_size: tuple[int, ...]
    pipeline_parallel_size: tuple[int, ...]
    data_parallel_size: tuple[int, ...]
    max_num_seqs: tuple[int, ...]
    max_num_batched_tokens: tuple[int, ...]
    weight_dtype: tuple[str, ...] = DEFAULT_WEIGHT_DTYPES
    kv_cache_dtype: tuple[str, ...] = KV_CACHE_DTYPES
    layout_kind: tuple[str, ...] = ()  # empty: every kind the model has (`for_model`)
    lockstep_sizes: tuple[int, ...] = ()  # DP ranks of a lock-step server; empty: the powers of two among the DP values
    gpu_budget: int = 64
    gpu_memory_utilization: float = 0.9
    block_size_tokens: int = VLLM_DEFAULT_BLOCK_SIZE_TOKENS
    enable_prefix_caching: bool = True  # vLLM's default; false: served with --no-enable-prefix-caching
    allow_multi_node: bool = True
    description: str = ""

    def __post_init__(self) -> None:
        where = f"space {self.name!r}"
        for axis in INT_AXES:
            values = tuple(getattr(self, axis))
            if not values and axis != "lockstep_sizes":
                raise bad_value(axis, [], "needs at least one value", where=where)
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
                    raise bad_value(axis, value, "values must be integers in 1..10,000,000", where=where)
            if len(set(values)) != len(values):
                raise bad_value(axis, list(values), "has duplicate values", where=where)
            object.__setattr__(self, axis, tuple(sorted(values)))
        for axis, allowed in (("weight_dtype", WEIGHT_DTYPES), ("kv_cache_dtype", KV_CACHE_DTYPES), ("layout_kind", LAYOUT_KINDS)):
            values = tuple(getattr(self, axis))
            bad = [v for v in values if v not in allowed]
            if (not values and axis != "layout_kind") or bad or len(set(values)) != len(values):
                raise bad_value(axis, list(values), f"values must be distinct, from {list(allowed)}", where=where)
            object.__setattr__(self, axis, values)
        if isinstance(self.gpu_budget, bool) or not isinstance(self.gpu_budget, int) or not 1 <= self.gpu_budget <= 1_000_000:
            raise bad_value("gpu_budget", self.gpu_budget, "must be an integer in 1..1,000,000", where=where)
        if isinstance(self.gpu_memory_utilization, bool) or not isinstance(self.gpu_memory_utilization, (int, float)) or not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise bad_value("gpu_memory_utilization", self.gpu_memory_utilization, "must be in [0.05, 1.0]", where=where)
        if isinstance(self.block_size_tokens, bool) or not isinstance(self.block_size_tokens, int) or self.block_size_tokens not in BLOCK_SIZES:
            raise bad_value("block_size_tokens", self.block_size_tokens, f"use one of {', '.join(map(str, BLOCK_SIZES))}", where=where)
        if not isinstance(self.enable_prefix_caching, bool):
            raise bad_value("enable_prefix_caching", self.enable_prefix_caching, "must be true or false", where=where)

    def for_model(self, model) -> "SearchSpace":
        """This space for `model` (a ModelSpec): the layout kinds default to every kind a MoE model has
        and `tp` for a dense one; a dense model refuses expert layouts and expert-only formats, and a
        checkpoint stored as MXFP4 or INT4 (gpt-oss, Kimi-K2.5), or a quantised one the user named (by
        its id or config.json), is planned in its stored format unless the space names others (vLLM
        serves such a checkpoint as it is stored; a BF16 one it may also quantise to FP8 as it loads)."""
        where = f"space {self.name!r} for model {model.name!r}"
        kinds = self.layout_kind or (LAYOUT_KINDS if model.is_moe else ("tp",))
        dtypes = self.weight_dtype
        if not model.is_moe:
            if set(kinds) != {"tp"}:
                raise bad_value("layout_kind", list(kinds), "expert and data-parallel-attention layouts need a mixture-of-experts model; use tp", where=where)
            expert_only = [d for d in dtypes if d in EXPERT_ONLY]
            if expert_only:
                raise bad_value("weight_dtype", expert_only[0], "quantises only a MoE model's experts; use bf16, fp8 or nvfp4", where=where)
        stored = model.checkpoint_weight_format
        priceable = stored in WEIGHT_DTYPES and stored != "bf16" and (model.is_moe or stored not in EXPERT_ONLY)
        if dtypes == DEFAULT_WEIGHT_DTYPES and priceable and (model.named_checkpoint or stored in EXPERT_ONLY):
            dtypes = (stored,)
        resolved = self.replace(layout_kind=tuple(kinds), weight_dtype=dtypes)
        if not resolved.layout_kind_labels():
            raise bad_value("layout_kind", list(kinds), "lock-step kinds need a data_parallel_size above 1; add tp or ep, or DP values > 1", where=where)
        return resolved

    def layout_kind_labels(self) -> tuple[str, ...]:
        """The grid's layout-kind axis: `tp` and `ep` as they are, and each lock-step kind once per
        lock-step size D (`lockstep_sizes`; by default the powers of two above 1 among the DP values,
        the sizes expert groups take in practice), as 'dp:D' / 'dp_ep:D'. The DP axis then counts
        the servers of a lock-step kind, each of D ranks (so its replicas number D x DP)."""
        sizes = self.lockstep_sizes or [d for d in self.data_parallel_size if d > 1 and d & (d - 1) == 0]
        labels = []
        for kind in self.layout_kind or ("tp",):
            labels.extend([f"{kind}:{d}" for d in sizes] if kind in LOCKSTEP_KINDS else [kind])
        return tuple(labels)

    def axis_values(self) -> dict[str, tuple]:
        """Ordered axes (outermost first); the GPU axis is added by the grid."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "layout_kind": self.layout_kind_labels(),
            "data_parallel_size": self.data_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "weight_dtype": self.weight_dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
        }

    def size(self, num_gpu_types: int) -> int:
        return num_gpu_types * math.prod(len(v) for v in self.axis_values().values())

    def replace(self, **changes) -> "SearchSpace":
        return dataclasses.replace(self, **changes)
