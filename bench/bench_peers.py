"""jaxplan against aiconfigurator on the same question, in the same run: wall time, space covered, answer.

The question is `jaxplan sweep --model llama-3.1-70b --gpus h200_sxm --workload coding`: Llama-3.1-70B
on H200 SXM, the bundled `coding` traffic (ISL 8,000, OSL 300, Poisson 8 req/s, p99 TTFT <= 5 s,
p99 TPOT <= 100 ms); jaxplan answers with the cheapest deployment that sustains it. aiconfigurator
(NVIDIA, `pip install aiconfigurator`, its own venv) is asked the same with vLLM as backend (TRT-LLM
where vLLM is not supported), offline (HF_HUB_OFFLINE=1; it ships the model's config.json):

  * `cli default --target-request-rate R` (its "recommend" mode: fewest GPUs for the rate within
    --ttft/--tpot), with its BF16 checkpoint (meta-llama/Meta-Llama-3.1-70B) and with the FP8 one
    (nvidia/Llama-3.1-70B-Instruct-FP8: FP8 weights and KV cache, as jaxplan may choose);
  * `cli default --total-gpus N` with N = the GPU count jaxplan picked (best use of the same GPUs);
  * `cli estimate` of jaxplan's winner (its TP, PP, max_num_seqs as batch size, token budget as
    context tokens, its dtypes), one replica; and again at jaxplan's predicted operating point
    (batch size = requests in flight per replica / PP; aiconfigurator's concurrency is bs x PP).

jaxplan is timed as a subprocess too (`--no-replay`, and the whole command with the stage-7 replay),
and with a BF16-only copy of its default space for the like-for-like BF16 row. Space covered:
jaxplan's `grid_size` from `--json`; aiconfigurator's counts come from one extra run at
`--log-level DEBUG` (untimed): agg engine evaluations (one per parallel layout x batch size x context
tokens, a `ctx_tokens: ..., b: ...` line each), the parallel layouts tried, and the SLA-feasible
results it reports. Its disaggregated workers' batch points are not logged one by one.

    python bench/bench_peers.py --aiconfigurator /tmp/helper_bench/aic-venv/bin/aiconfigurator --repeat 3
    python bench/bench_peers.py --skip-replay --repeat 1          # quicker
    python bench/bench_peers.py                                    # no aiconfigurator: jaxplan only, says so

Every figure is wall time of the whole command (process start, imports, data loading, compile).
jaxplan keeps compiled kernels in a persistent cache (jaxplan/compile_cache.py); each jaxplan row
gets a fresh cache directory, so its first run is "cold" (compiles everything) and the others are
"warm" (a user's second run of the same command); both are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import add_repo_root, median, print_end, print_start

add_repo_root()

from jaxplan.specs import load_workload

ROOT = Path(__file__).resolve().parent.parent
AIC_MODELS = {"bf16": "meta-llama/Meta-Llama-3.1-70B", "fp8": "nvidia/Llama-3.1-70B-Instruct-FP8"}
JAXPLAN = [sys.executable, "-c", "import sys; from jaxplan.cli import main; sys.exit(main())"]


def timed(cmd: list[str], env=None, log: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    seconds = time.perf_counter() - t0
    if log:
        log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    return seconds, proc


# ---- jaxplan ------------------------------------------------------------------------------------------------
def bf16_space(tmp: Path) -> Path:
    text = (ROOT / "jaxplan/configs/spaces/default.toml").read_text()
    text = re.sub(r'(?m)^weight_dtype\s*=.*$', 'weight_dtype = ["bf16"]', text)
    text = re.sub(r'(?m)^kv_cache_dtype\s*=.*$', 'kv_cache_dtype = ["auto"]', text)
    path = tmp / "default-bf16.toml"
    path.write_text(text)
    return path


def run_jaxplan(args, tmp: Path, label: str, extra: list[str], repeat: int) -> dict:
    out = tmp / f"jaxplan-{label}.json"
    cmd = JAXPLAN + ["sweep", "--model", args.model, "--gpus", args.gpu, "--workload", args.workload, "--json", str(out), *extra]
    # A fresh compilation cache per label: the first run compiles (cold), the later ones load the
    # compiled kernels from it (warm), as a user's second run of the same command does.
    env = dict(os.environ, JAXPLAN_CACHE_DIR=str(tmp / f"xla-cache-{label}"))
    times = []
    for i in range(repeat):
        seconds, proc = timed(cmd, env=env, log=tmp / f"jaxplan-{label}-{i}.log")
        if proc.returncode != 0:
            raise SystemExit(f"jaxplan {label} failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
        times.append(seconds)
    data = json.loads(out.read_text())
    w = data.get("winner") or {}
    replay = {k: v for k, v in w.items() if "replay" in k}
    return {
        "tool": "jaxplan", "label": label, "cmd": " ".join(["jaxplan", *cmd[len(JAXPLAN):]]).replace(str(out), "OUT.json"),
        "wall_s": median(times), "runs": times, "cold_s": times[0], "warm_s": median(times[1:]) if len(times) > 1 else None, "space": f"{data['grid_size']:,} candidates (grid_size)",
        "layout": f"TP{w.get('tensor_parallel_size')} x PP{w.get('pipeline_parallel_size')} x DP{w.get('data_parallel_size')}, "
                  f"seqs {w.get('max_num_seqs')}, budget {w.get('max_num_batched_tokens')}, {w.get('weight_dtype')}/{w.get('kv_cache_dtype')}",
        "gpus": w.get("num_gpus"), "tok_s_gpu": w.get("output_tokens_per_s_per_gpu"), "req_s": w.get("requests_per_s"),
        "ttft_ms": 1e3 * w["ttft_p99_s"] if "ttft_p99_s" in w else None, "tpot_ms": 1e3 * w["tpot_p99_s"] if "tpot_p99_s" in w else None,
        "metric_note": "p99 (stage 4)", "winner": w, "replay": replay, "compile_s": data.get("compile_s"), "run_s": data.get("run_s"),
    }


# ---- aiconfigurator --------------------------------------------------------------------------------------------
def aic_env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NO_COLOR="1")
    return env


def pick_backend(aic: str, model: str, gpu: str) -> str:
    """vllm where aiconfigurator's support matrix says YES for agg, else trtllm."""
    _, proc = timed([aic, "cli", "support", "--model", model, "--system", gpu, "--backend", "all", "--no-color"], env=aic_env())
    for line in proc.stdout.splitlines():
        cells = line.split()
        if cells and cells[0] == gpu and len(cells) >= 7:
            return "vllm" if cells[5] == "YES" else "trtllm"  # columns: trtllm agg/disagg, sglang agg/disagg, vllm agg/disagg
    return "vllm"


def parse_best(text: str) -> dict:
    """The chosen experiment's rank-1 row and the 'Overall Best Configuration' figures."""
    out: dict = {}
    m = re.search(r"Best Experiment Chosen: (\w+)", text)
    chosen = m.group(1) if m else "agg"
    out["mode"] = chosen
    for key, pattern in (
        ("tok_s_gpu", r"Per-GPU Throughput: ([\d,.]+)"), ("req_s", r"Request Rate: ([\d,.]+)"),
        ("ttft_ms", r"- TTFT: ([\d,.]+)ms"), ("tpot_ms", r"- TPOT: ([\d,.]+)ms"),
    ):
        m = re.search(pattern, text)
        out[key] = float(m.group(1).replace(",", "")) if m else None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"{chosen} Top Configurations"):
            header = [c.strip() for c in lines[i + 2].strip().strip("|").split("|")]
            row = [c.strip() for c in lines[i + 4].strip().strip("|").split("|")]
            cells = dict(zip(header, row))
            out["row"] = cells
            used = re.search(r"\((\d+)=", cells.get("total_gpus (used)", ""))
            out["gpus"] = int(used.group(1)) if used else None
            if chosen == "agg":
                out["layout"] = f"{cells.get('parallel')} x {cells.get('replicas')} replicas, bs {cells.get('bs')}"
            else:
                out["layout"] = (f"disagg {cells.get('replicas')} x [{cells.get('(p)workers')} x P {cells.get('(p)parallel')} bs {cells.get('(p)bs')}"
                                 f" + {cells.get('(d)workers')} x D {cells.get('(d)parallel')} bs {cells.get('(d)bs')}]")
            break
    m = re.search(r"agg GPUs needed: (\d+)", text)
    if m and chosen == "agg":
        out["gpus"] = int(m.group(1))
    return out


def parse_counts(text: str) -> dict:
    return {
        "agg_points": len(re.findall(r"ctx_tokens: \d+, b: \d+", text)),
        "agg_layouts": len(re.findall(r"sweep_agg: parallel tp=", text)),
        "prefill_layouts": len(re.findall(r"sweep_disagg/prefill: candidate parallel", text)),
        "decode_layouts": len(re.findall(r"sweep_disagg/decode: candidate parallel", text)),
        "feasible": {m.group(1): int(m.group(2)) for m in re.finditer(r"Experiment (\w+) completed with (\d+) results", text)},
    }


def parse_estimate(text: str) -> dict:
    out = {}
    for key, pattern in (("ttft_ms", r"TTFT:\s+([\d.]+) ms"), ("tpot_ms", r"TPOT:\s+([\d.]+) ms"), ("tok_s_gpu", r"tokens/s/gpu:\s+([\d.]+)"),
                         ("req_s", r"seq/s:\s+([\d.]+)"), ("concurrency", r"Concurrency:\s+(\d+)"), ("memory_gb", r"Memory \(GPU\):\s+([\d.]+)")):
        m = re.search(pattern, text)
        out[key] = float(m.group(1)) if m else None
    return out


def run_aic(aic: str, tmp: Path, label: str, cmd_args: list[str], repeat: int, count: bool) -> dict:
    cmd = [aic, "cli", *cmd_args, "--no-color"]
    times, proc = [], None
    for i in range(repeat):
        seconds, proc = timed(cmd, env=aic_env(), log=tmp / f"aic-{label}-{i}.log")
        if proc.returncode != 0:
            return {"tool": "aiconfigurator", "label": label, "cmd": " ".join(["aiconfigurator", "cli", *cmd_args]), "error": (proc.stdout + proc.stderr)[-1500:]}
        times.append(seconds)
    text = proc.stdout + proc.stderr
    result = {"tool": "aiconfigurator", "label": label, "cmd": " ".join(["aiconfigurator", "cli", *cmd_args]), "wall_s": median(times), "runs": times}
    if cmd_args[0] == "estimate":
        result.update(parse_estimate(text), space="1 configuration", metric_note="its static-batch estimate")
        return result
    result.update(parse_best(text), metric_note="its SLA view (per-batch, no queueing)")
    if count:
        _, dbg = timed(cmd + ["--log-level", "DEBUG"], env=aic_env(), log=tmp / f"aic-{label}-debug.log")
        c = parse_counts(dbg.stdout + dbg.stderr)
        result["counts"] = c
        feasible = ", ".join(f"{k} {v}" for k, v in c["feasible"].items())
        result["space"] = (f"{c['agg_points']} agg evaluations over {c['agg_layouts']} layouts; disagg {c['prefill_layouts']} prefill x "
                           f"{c['decode_layouts']} decode layouts; SLA-feasible: {feasible}")
    return result


# ---- report --------------------------------------------------------------------------------------------------
def fmt(x, spec=",.0f"):
    return "-" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiconfigurator", default=shutil.which("aiconfigurator"), help="path of the aiconfigurator executable (its own venv)")
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--gpu", default="h200_sxm")
    parser.add_argument("--workload", default="coding")
    parser.add_argument("--repeat", type=int, default=3, help="median of N runs of every timed command")
    parser.add_argument("--skip-replay", action="store_true", help="do not time jaxplan's full command (with the stage-7 replay)")
    parser.add_argument("--keep", default="", help="directory to keep the logs and JSON in (default: a temporary one)")
    args = parser.parse_args()
    print_start()
    w = load_workload(args.workload)
    print(f"question: {args.model} on {args.gpu}, workload {w.name}: ISL {w.isl_mean_tokens:g}, OSL {w.osl_mean_tokens:g}, "
          f"{w.arrival.value} {w.request_rate_per_s:g} req/s, p{w.slo_percentile:g} TTFT <= {w.ttft_slo_s:g} s, p{w.slo_percentile:g} TPOT <= {w.tpot_slo_s * 1e3:g} ms; medians of {args.repeat}")
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_peers_"))
    tmp.mkdir(parents=True, exist_ok=True)

    rows = [run_jaxplan(args, tmp, "no-replay", ["--no-replay"], args.repeat)]
    print(f"  jaxplan --no-replay: {rows[-1]['wall_s']:.1f} s (cold cache {rows[-1]['cold_s']:.1f} s, warm {fmt(rows[-1]['warm_s'], '.1f')} s)", flush=True)
    if not args.skip_replay:
        rows.append(run_jaxplan(args, tmp, "with-replay", [], args.repeat))
        print(f"  jaxplan (with replay): {rows[-1]['wall_s']:.1f} s (cold cache {rows[-1]['cold_s']:.1f} s, warm {fmt(rows[-1]['warm_s'], '.1f')} s)", flush=True)
    rows.append(run_jaxplan(args, tmp, "bf16-only", ["--no-replay", "--space", str(bf16_space(tmp))], args.repeat))
    print(f"  jaxplan BF16-only space --no-replay: {rows[-1]['wall_s']:.1f} s", flush=True)
    winner = rows[0]["winner"]

    aic = args.aiconfigurator
    if not aic or not Path(aic).exists():
        print(f"aiconfigurator: not found ({aic or 'not on PATH'}); skipping the peer. Install it in its own venv:\n"
              "  python -m venv /tmp/helper_bench/aic-venv && /tmp/helper_bench/aic-venv/bin/pip install aiconfigurator\n"
              "  then pass --aiconfigurator /tmp/helper_bench/aic-venv/bin/aiconfigurator")
    else:
        _, version = timed([aic, "version"], env=aic_env())
        print(f"aiconfigurator: {aic} ({(version.stdout + version.stderr).strip().splitlines()[-1] if (version.stdout + version.stderr).strip() else '?'})")
        backend = pick_backend(aic, AIC_MODELS["bf16"], args.gpu)
        common = ["--system", args.gpu, "--backend", backend, "--isl", f"{w.isl_mean_tokens:g}", "--osl", f"{w.osl_mean_tokens:g}"]
        sla = ["--ttft", f"{w.ttft_slo_s * 1e3:g}", "--tpot", f"{w.tpot_slo_s * 1e3:g}"]
        for dtype, model in AIC_MODELS.items():
            rows.append(run_aic(aic, tmp, f"rate-{dtype}", ["default", "--model", model, *common, *sla, "--target-request-rate", f"{w.request_rate_per_s:g}"], args.repeat, True))
            print(f"  aiconfigurator default --target-request-rate ({dtype}): {rows[-1].get('wall_s', float('nan')):.1f} s", flush=True)
        for dtype, model in AIC_MODELS.items():
            rows.append(run_aic(aic, tmp, f"gpus-{dtype}", ["default", "--model", model, *common, *sla, "--total-gpus", str(winner["num_gpus"])], args.repeat, True))
            print(f"  aiconfigurator default --total-gpus {winner['num_gpus']} ({dtype}): {rows[-1].get('wall_s', float('nan')):.1f} s", flush=True)
        quant = ["--gemm-quant-mode", "fp8" if winner["weight_dtype"] == "fp8" else "bfloat16", "--kvcache-quant-mode", "fp8" if winner["kv_cache_dtype"] == "fp8" else "bfloat16"]
        rows.append(run_aic(aic, tmp, "estimate-jaxplan-winner", [
            "estimate", "--model", AIC_MODELS["bf16"], *common, "--tp", str(winner["tensor_parallel_size"]), "--pp", str(winner["pipeline_parallel_size"]),
            "--bs", str(winner["max_num_seqs"]), "--ctx-tokens", str(winner["max_num_batched_tokens"]), *quant], args.repeat, False))
        print(f"  aiconfigurator estimate (jaxplan's winner, one replica): {rows[-1].get('wall_s', float('nan')):.1f} s", flush=True)
        # The same replica at jaxplan's predicted operating point: b requests in flight per replica, which
        # aiconfigurator counts per pipeline stage (its concurrency = bs x PP).
        bs = max(1, round(winner["concurrency_per_replica"] / winner["pipeline_parallel_size"]))
        rows.append(run_aic(aic, tmp, f"estimate-jaxplan-winner-at-b{bs}", [
            "estimate", "--model", AIC_MODELS["bf16"], *common, "--tp", str(winner["tensor_parallel_size"]), "--pp", str(winner["pipeline_parallel_size"]),
            "--bs", str(bs), "--ctx-tokens", str(winner["max_num_batched_tokens"]), *quant], args.repeat, False))
        print(f"  aiconfigurator estimate (jaxplan's winner at its operating point, bs {bs}): {rows[-1].get('wall_s', float('nan')):.1f} s", flush=True)

    print()
    print("| tool | run | wall s (median) | space covered | recommends | GPUs | tok/s/GPU | req/s | TTFT ms | TPOT ms | metrics are |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['tool']} | {r['label']} | failed | | {r['error'].splitlines()[-1][:120]} | | | | | | |")
            continue
        wall = f"{r['cold_s']:.1f} cold, {fmt(r['warm_s'], '.1f')} warm" if "cold_s" in r else f"{r['wall_s']:.1f}"
        print(f"| {r['tool']} | {r['label']} | {wall} | {r.get('space', '')} | {r.get('layout', '-')} | {fmt(r.get('gpus'), 'd') if isinstance(r.get('gpus'), int) else '-'} "
              f"| {fmt(r.get('tok_s_gpu'))} | {fmt(r.get('req_s'), '.2f')} | {fmt(r.get('ttft_ms'))} | {fmt(r.get('tpot_ms'), '.1f')} | {r.get('metric_note', '')} |")
    print()
    for r in rows:
        if r["tool"] == "jaxplan" and r["replay"]:
            print(f"jaxplan {r['label']} winner, replayed: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r["replay"].items()))
    print("commands (wall times: " + "; ".join(f"{r['label']} " + "/".join(f"{t:.1f}" for t in r.get("runs", [])) for r in rows) + "):")
    for r in rows:
        print(f"  {r['cmd']}")
    print(f"logs: {tmp}")
    print_end()


if __name__ == "__main__":
    main()
