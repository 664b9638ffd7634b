"""GpuSpec: one accelerator type and the node it sits in, in SI units."""

from __future__ import annotations

import dataclasses
import math

from jaxplan.errors import bad_value

# Field -> (lowest sane, highest sane) value; guards against unit slips (GB typed as bytes, ...).
SANE_RANGES = {
    "hbm_bytes": (1e9, 1e13),
    "hbm_bandwidth_bytes_per_s": (1e10, 1e14),
    "bf16_flops_per_s": (1e12, 1e17),
    "intra_node_bandwidth_bytes_per_s": (1e9, 1e13),
    "inter_node_bandwidth_bytes_per_s": (1e8, 1e13),
    "price_usd_per_hour": (0.0, 1e4),
}


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """Peak (spec-sheet) numbers; achievable fractions come from calibration.

    fp8_flops_per_s is 0 where the GPU has no FP8 tensor cores (A100), and
    fp4_flops_per_s where it has no NVFP4 ones (every GPU before Blackwell, and AMD's): FP8 and
    NVFP4 weights are rejected there by the structure sieve.

    mxfp4_flops_per_s is the dense peak for OCP MXFP4 (32-element blocks, E8M0 scales: gpt-oss's
    checkpoint format, and the FP4 of AMD's CDNA 4). MXFP4 experts run on it where it is not 0
    (Blackwell, CDNA 4) and weight-only elsewhere; fp4_flops_per_s stays the NVFP4 peak that
    `nvfp4` weights need.

    compute_capability decides what vLLM's CUDA kernels refuse: MXFP4 and INT4 (Marlin) experts
    need 8.0 (vLLM's `Mxfp4Config.get_min_capability`).

    visible_hbm_fraction is the share of hbm_bytes the runtime reports to PyTorch, which vLLM sizes
    its KV cache from. CUDA reports less than the nominal size (PyTorch's total capacity: H100
    79.15-79.18 of 80 GiB, H200 139.72-139.83 of 141, B200 178.35-178.36 of 180; 0.99 is within
    0.2 GiB of each), ROCm next to nothing (MI300X 191.69 of 192 GiB).
    """

    name: str
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    fp8_flops_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    gpus_per_node: int
    price_usd_per_hour: float
    fp4_flops_per_s: float = 0.0
    mxfp4_flops_per_s: float = 0.0
    compute_capability: float = 0.0  # CUDA compute capability (8.0 A100, 9.0 H100); 0: not CUDA or not stated
    # GPUs one host (one OS, one vLLM process tree) holds where fewer than the NVLink domain (GB200 NVL72:
    # 4 per compute tray of a 72-GPU domain); 0: the node is the host. Launch commands split by it.
    gpus_per_host: int = 0
    visible_hbm_fraction: float = 0.99
    display_name: str = ""
    # Other names it goes by: what nvidia-smi / amd-smi print (`NVIDIA H100 80GB HBM3`), which benchmark
    # logs record, and short names that name one part only (`b200`; not `h100`, which has a PCIe part).
    aliases: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        where = f"gpu {self.name!r}"
        for field, (low, high) in SANE_RANGES.items():
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise bad_value(field, value, "must be a finite number", where=where)
            if not low <= value <= high or (value == 0 and field != "price_usd_per_hour"):
                raise bad_value(field, value, f"must lie in [{low:g}, {high:g}] (SI units: bytes, bytes/s, FLOP/s, USD/h)", where=where)
        low, high = SANE_RANGES["bf16_flops_per_s"]  # FP8 and FP4 peaks share the BF16 scale (1x-4x of it)
        for field, label in (("fp8_flops_per_s", "FP8"), ("fp4_flops_per_s", "FP4"), ("mxfp4_flops_per_s", "MXFP4")):
            peak = getattr(self, field)
            if not isinstance(peak, (int, float)) or isinstance(peak, bool) or not (peak == 0 or low <= peak <= high):
                raise bad_value(field, peak, f"must be 0 (no {label}) or a FLOP/s figure in [{low:g}, {high:g}]", where=where)
        if isinstance(self.compute_capability, bool) or not isinstance(self.compute_capability, (int, float)) or not 0 <= self.compute_capability < 100:
            raise bad_value("compute_capability", self.compute_capability, "must be 0 (not CUDA) or a CUDA compute capability such as 9.0", where=where)
        if isinstance(self.visible_hbm_fraction, bool) or not isinstance(self.visible_hbm_fraction, (int, float)) or not 0.9 <= self.visible_hbm_fraction <= 1.0:
            raise bad_value("visible_hbm_fraction", self.visible_hbm_fraction, "must be the share of hbm_bytes the runtime reports, in [0.9, 1.0] (CUDA: 0.99)", where=where)
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or not 1 <= self.gpus_per_node <= 1024:
            raise bad_value("gpus_per_node", self.gpus_per_node, "must be an integer in 1..1024", where=where)
        if isinstance(self.gpus_per_host, bool) or not isinstance(self.gpus_per_host, int) or not 0 <= self.gpus_per_host <= self.gpus_per_node:
            raise bad_value("gpus_per_host", self.gpus_per_host, f"must be 0 (the node is one host) or an integer in 1..gpus_per_node ({self.gpus_per_node})", where=where)

    @property
    def launch_gpus_per_host(self) -> int:
        """GPUs one vLLM launch command can address on one host: `gpus_per_host`, else the node."""
        return self.gpus_per_host or self.gpus_per_node

    def tensor_core_flops_per_s(self, weight_dtype: str) -> float:
        """Dense peak of the tensor cores that run `weight_dtype`'s GEMMs (bf16 | fp8 | nvfp4 | mxfp4 |
        int4); 0 where the GPU has none for it (then vLLM runs them weight-only, at the bf16 peak; INT4
        always: vLLM's INT4 MoE kernels dequantise into bf16 GEMMs)."""
        return {"bf16": self.bf16_flops_per_s, "fp8": self.fp8_flops_per_s, "nvfp4": self.fp4_flops_per_s,
                "mxfp4": self.mxfp4_flops_per_s, "int4": 0.0}[weight_dtype]

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_flops_per_s > 0

    def with_price(self, price_usd_per_hour: float) -> "GpuSpec":
        return dataclasses.replace(self, price_usd_per_hour=price_usd_per_hour)
