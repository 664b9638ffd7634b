"""Stage 4 against the replay where vLLM preempts: a burst of `rl-rollout` lengths on one H100.

Qwen3.5-27B FP8 weights and KV cache, TP1, 1,024 requests of uniform 3,000 +- 30% prompt and
6,000 +- 50% output tokens, all at once, at several `max_num_seqs` / `max_num_batched_tokens`
settings: output tok/s by `predict --method analytical` (stage 4, which prices no preemption) and
by the replay, with the replay's preemptions as its status names them (from 1% of the requests on).
The table in docs/accuracy.md ("KV-starved closed loops") is this script's output:

    python bench/bench_preemption.py             # about a minute on the 2-core VM
"""

from __future__ import annotations

import re

from jaxplan.prediction import predict_rows, replay_predict_rows

ROW = dict(model="qwen3.5-27b", gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
           weight_dtype="fp8", kv_cache_dtype="fp8", isl=3000, osl=6000, request_rate=float("inf"), num_prompts=1024,
           isl_distribution="uniform", isl_spread=0.3, osl_distribution="uniform", osl_spread=0.5)
SETTINGS = ((64, 512), (96, 512), (128, 512), (128, 8192), (192, 256), (192, 1024), (192, 2048), (192, 8192))


def main() -> None:
    rows = [dict(ROW, max_num_seqs=seqs, max_num_batched_tokens=budget) for seqs, budget in SETTINGS]
    analytical, replayed = predict_rows(rows), replay_predict_rows(rows)
    print(f"KV cache {replayed[0]['kv_cache_tokens']:,} tokens a replica")
    print("| max_num_seqs / budget | stage 4 tok/s | replay tok/s | stage 4 / replay | replay preemptions |")
    print("|---|---:|---:|---:|---:|")
    for (seqs, budget), a, r in zip(SETTINGS, analytical, replayed):
        preempted = re.search(r"preempted ([\d,]+) times", r["status"])
        print(f"| {seqs} / {budget:,} | {a['output_tok_s']:,.0f} | {r['output_tok_s']:,.0f} | {a['output_tok_s'] / r['output_tok_s']:.2f} | "
              f"{preempted.group(1) if preempted else 'under 1%'} |")


if __name__ == "__main__":
    main()
