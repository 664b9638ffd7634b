"""Synthetic step-time models for tests and benchmarks (the real physics lives elsewhere).

`affine_step_time(params, batch[, group_batch_tokens])` with params = (overhead_s,
s_per_prefill_token, s_per_decode_token, s_per_context_token[, s_per_attention_pair,
s_per_prefill_seq[, s_per_group_token[, s_per_prefill_context_token]]]) (the group's tokens: the
lock-step group's, default the step's own, as the expert layers of a MoE model see them);
`affine_step_time_py(params)` is the
same model as a plain-Python `batch dict -> seconds` for the reference scheduler.
With dyadic coefficients (powers of two) every sum the replay forms is exact in
float32, so the JAX replay and the float64 reference see identical times.
"""

from __future__ import annotations

import numpy as np


def affine_step_time(params, batch, group_batch_tokens=None):
    """Seconds for one step: params[0] + params[1]*prefill + params[2]*decode + params[3]*context
    (+ params[4]*attention pairs + params[5]*prefill sequences, when params has 6 entries;
    + params[6]*group tokens, when it has 7; + params[7]*prefill chunks' cached context, when 8)."""
    t = params[0] + params[1] * batch.prefill_tokens + params[2] * batch.decode_tokens + params[3] * batch.decode_context_tokens
    if params.shape[-1] >= 6:
        t = t + params[4] * batch.prefill_attention_pairs + params[5] * batch.prefill_seqs
    if params.shape[-1] >= 7:
        group = batch.prefill_tokens + batch.decode_tokens if group_batch_tokens is None else group_batch_tokens
        t = t + params[6] * group
    if params.shape[-1] >= 8:
        t = t + params[7] * batch.prefill_context_tokens
    return t


def affine_step_time_py(params):
    """The same model for `jaxplan.replay.reference` (a batch dict -> float seconds)."""
    p = [float(x) for x in np.asarray(params, np.float64)] + [0.0] * 4

    def step_time(b):
        group = b.get("group_batch_tokens", b["prefill_tokens"] + b["decode_tokens"])
        return p[0] + p[1] * b["prefill_tokens"] + p[2] * b["decode_tokens"] + p[3] * b["decode_context_tokens"] + p[4] * b["prefill_attention_pairs"] + p[5] * b["prefill_seqs"] + p[6] * group + p[7] * b["prefill_context_tokens"]

    return step_time


def dyadic_params(rng: np.random.Generator, num: int, attention_seed: int | None = None) -> np.ndarray:
    """[num, 4] random affine parameters that are powers of two (exact float32 sums); with
    `attention_seed`, [num, 6]: the attention-pair and per-sequence terms too, drawn from their own
    generator (the first four columns stay as they were)."""
    exps = np.stack([rng.integers(4, 8, num), rng.integers(10, 14, num), rng.integers(8, 11, num), rng.integers(13, 17, num)], 1)
    if attention_seed is not None:
        extra = np.random.default_rng(attention_seed)
        exps = np.concatenate([exps, np.stack([extra.integers(15, 18, num), extra.integers(6, 10, num)], 1)], 1)
    return (2.0**-exps).astype(np.float32)
