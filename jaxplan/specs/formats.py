"""Weight formats: one table for the grid, `predict`'s rows and the physics.

A weight dtype names the format of a model's routed experts; the other weights (attention,
dense FFN, shared experts, router) keep it too for bf16, fp8 and nvfp4, and stay bf16 for the two
formats that checkpoints only ever apply to experts: gpt-oss's MXFP4 (`quantization_config
.modules_to_not_convert` lists self_attn, router, embeddings and LM head) and Kimi-K2.5's INT4
(compressed-tensors `ignore` lists self_attn, shared_experts and the dense MLPs).

Bytes per parameter, stored:
  bf16   2
  fp8    1 (E4M3; block or channel scales are negligible)
  nvfp4  0.5 + 1/16: an E2M1 value plus one E4M3 scale per 16 (NVIDIA ModelOpt, vLLM `modelopt_fp4`)
  mxfp4  0.5 + 1/32: an E2M1 value plus one E8M0 scale per 32 (OCP MX; gpt-oss)
  int4   0.5 + 2/32: a 4-bit integer plus one bf16 scale per group of 32 (Kimi-K2.5's
         compressed-tensors `group_size: 32`, symmetric)

The `code` of a format is what the physics carries (`Layout.expert_weight_format`, a float32;
`physics.weight_formats` reads it inside jit).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class WeightFormat(NamedTuple):
    name: str
    code: int
    expert_bytes_per_param: float  # routed experts
    other_bytes_per_param: float  # every other weight (attention, dense FFN, shared experts)
    weight_only: bool  # never on low-precision tensor cores: dequantised into bf16 GEMMs (INT4: Marlin / triton)


BF16 = WeightFormat("bf16", 0, 2.0, 2.0, False)
FP8 = WeightFormat("fp8", 1, 1.0, 1.0, False)
NVFP4 = WeightFormat("nvfp4", 2, 0.5 + 1.0 / 16.0, 0.5 + 1.0 / 16.0, False)
MXFP4 = WeightFormat("mxfp4", 3, 0.5 + 1.0 / 32.0, 2.0, False)
INT4 = WeightFormat("int4", 4, 0.5 + 2.0 / 32.0, 2.0, True)
FORMATS = (BF16, FP8, NVFP4, MXFP4, INT4)
BY_NAME = {f.name: f for f in FORMATS}
# Formats that only quantise a MoE model's experts: meaningless for a dense model.
EXPERT_ONLY = frozenset({"mxfp4", "int4"})

# [5] tables indexed by code, for use inside jit.
EXPERT_BYTES = np.array([f.expert_bytes_per_param for f in FORMATS], np.float32)
OTHER_BYTES = np.array([f.other_bytes_per_param for f in FORMATS], np.float32)
