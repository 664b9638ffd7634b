"""jaxplan: plan LLM serving deployments on a CPU with JAX.

A cost-inverted funnel: millions of (GPU type, TP, PP, DP, max_num_seqs,
max_num_batched_tokens, weight dtype, KV dtype) candidates pass cheap batched
sieves and a roofline cost model; a few finalists reach a step-by-step replay.
"""

__version__ = "0.1.0"
