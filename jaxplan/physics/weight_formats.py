"""The weight-format table (`specs.formats`) read inside jit: format codes to bytes and kinds."""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.specs.formats import BF16, EXPERT_BYTES, FP8, NVFP4, WeightFormat


def code_of_bytes(weight_bytes_per_param):
    """The format code of a layout given only its (uniform) weight bytes: bf16, fp8 or nvfp4.
    Elementwise; for layouts given only their weight bytes (every weight in one format)."""
    b = jnp.asarray(weight_bytes_per_param, jnp.float32)
    return jnp.where(b < 0.75, float(NVFP4.code), jnp.where(b < 1.5, float(FP8.code), float(BF16.code)))


def expert_bytes_per_param(code):
    """Stored bytes per routed-expert parameter of format `code` (float array, any shape)."""
    return jnp.asarray(EXPERT_BYTES)[jnp.asarray(code).astype(jnp.int32)]


def is_format(code, fmt: WeightFormat):
    return jnp.asarray(code) == float(fmt.code)
