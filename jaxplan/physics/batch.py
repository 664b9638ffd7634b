"""StepBatch: what one scheduler step (one forward pass of a replica) holds.

Every field is per replica and may be a scalar or an array of any shape
(candidates [C], finalists [F], ...); all fields broadcast together.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp


class StepBatch(NamedTuple):
    prefill_tokens: jnp.ndarray  # tokens of prompt chunks computed this step
    decode_tokens: jnp.ndarray  # running requests each producing one token this step
    decode_context_tokens: jnp.ndarray  # sum over decoding requests of their KV length (tokens read)
    prefill_attention_pairs: jnp.ndarray  # sum over prefill chunks of chunk * (cached_prefix + chunk / 2)
    prefill_seqs: jnp.ndarray  # number of requests with a prompt chunk this step
    prefill_context_tokens: jnp.ndarray  # sum over prefill chunks of cached_prefix (tokens already in KV)

    @staticmethod
    def decode_only(decode_tokens, decode_context_tokens) -> "StepBatch":
        zero = jnp.zeros_like(jnp.asarray(decode_tokens, jnp.float32))
        return StepBatch(zero, decode_tokens, decode_context_tokens, zero, zero, zero)

    @staticmethod
    def prefill_chunk(chunk_tokens, cached_prefix_tokens=0.0) -> "StepBatch":
        """One request's prompt chunk of `chunk_tokens` after `cached_prefix_tokens` already in KV."""
        chunk = jnp.asarray(chunk_tokens, jnp.float32)
        zero = jnp.zeros_like(chunk)
        pairs = chunk * (cached_prefix_tokens + chunk / 2.0)
        return StepBatch(chunk, zero, zero, pairs, jnp.ones_like(chunk), cached_prefix_tokens + zero)

    def merged(self, other: "StepBatch") -> "StepBatch":
        """Both batches in one step (field-wise sum)."""
        return StepBatch(*(a + b for a, b in zip(self, other)))
