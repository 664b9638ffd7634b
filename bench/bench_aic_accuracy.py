"""aiconfigurator's prediction error on the measured serving rows jaxplan is calibrated against.

aiconfigurator (NVIDIA, `pip install aiconfigurator`) is a peer tool, run from its own venv as a
subprocess, offline (HF_HUB_OFFLINE=1). The rows are jaxplan's vLLM Llama-3.1-70B silicon rows
(`jaxplan.calibrate.serving.load_silicon_rows`: H200 FP8, B200 FP8, B200 NVFP4; one replica, pure TP,
closed loop at a fixed concurrency). Each row gets one `aiconfigurator cli estimate` in its default
aggregated (in-flight batching) mode with batch size = the row's concurrency:

    --model meta-llama/Meta-Llama-3.1-70B --system <gpu> --backend vllm --isl I --osl O --tp T --pp 1
    --bs <concurrency> --gemm-quant-mode <fp8|nvfp4> --kvcache-quant-mode fp8 --no-color

(the Llama-3.1-70B config aiconfigurator ships for offline use; quantization given explicitly; its
context-token budget left at its default, = ISL; its default vLLM perf database). Printed per group
(GPU x weight dtype) and overall: n, MAPE of TTFT and TPOT (mean |pred/measured - 1|), the geometric
mean of pred/measured, and the rows aiconfigurator refused or failed (with the first message); then
jaxplan's stage-4 predictions of the rows aiconfigurator answered, with the shipped fit (in sample) and
with each GPU held out of the fit (`held_out_params` of docs/calibration_report.json), for a
like-for-like comparison. These rows ship inside aiconfigurator-core (silicon_sample.csv), which NVIDIA
scores it against: for aiconfigurator they are not held out.

    python -m venv /tmp/aicbench/venv && /tmp/aicbench/venv/bin/pip install aiconfigurator
    python bench/bench_aic_accuracy.py --aiconfigurator /tmp/aicbench/venv/bin/aiconfigurator --keep /tmp/aicbench/out
    python bench/bench_aic_accuracy.py --aiconfigurator ... --limit 12      # a seeded sample, quicker
    python bench/bench_aic_accuracy.py --from-json /tmp/aicbench/out/aic_predictions.json   # re-score a run
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_peers import aic_env, parse_estimate
from machine import load

from jaxplan.calibrate.serving import load_silicon_rows

AIC_MODEL = "meta-llama/Meta-Llama-3.1-70B"
INSTALL = ("aiconfigurator: not found ({}). Install it in its own venv:\n"
           "  python -m venv /tmp/aicbench/venv && /tmp/aicbench/venv/bin/pip install aiconfigurator\n"
           "  then pass --aiconfigurator /tmp/aicbench/venv/bin/aiconfigurator")


def select_rows(limit: int | None) -> list[dict]:
    rows = [r for r in load_silicon_rows() if r["backend"] == "vllm" and r["model"] == "llama-3.1-70b"]
    key = lambda r: (r["gpu"], r["weight_dtype"], r["tensor_parallel_size"], r["isl"], r["osl"], r["concurrency"], r["source_id"])
    rows.sort(key=key)
    if limit is not None and limit < len(rows):
        rows = sorted(random.Random(0).sample(rows, limit), key=key)
    return rows


def estimate_args(row: dict) -> list[str]:
    assert row["pipeline_parallel_size"] == 1 and row["data_parallel_size"] == 1
    return ["estimate", "--model", AIC_MODEL, "--system", row["gpu"], "--backend", "vllm",
            "--isl", f"{row['isl']:g}", "--osl", f"{row['osl']:g}", "--tp", str(row["tensor_parallel_size"]), "--pp", "1",
            "--bs", str(row["concurrency"]), "--gemm-quant-mode", row["weight_dtype"],
            "--kvcache-quant-mode", row["kv_cache_dtype"], "--no-color"]


def first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"(Error|error:)", ln):
            return ln[:300]
    return (lines[-1] if lines else "no output")[:300]


def predict(aic: str, row: dict, timeout: float) -> dict:
    args = estimate_args(row)
    out = {k: row[k] for k in ("source_id", "gpu", "weight_dtype", "kv_cache_dtype", "tensor_parallel_size", "isl", "osl", "concurrency",
                               "measured_ttft_ms_mean", "measured_tpot_ms_mean")}
    out["cmd"] = " ".join(["aiconfigurator", "cli", *args])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([aic, "cli", *args], capture_output=True, text=True, env=aic_env(), timeout=timeout, check=False)
        text = proc.stdout + proc.stderr
        parsed = parse_estimate(text) if proc.returncode == 0 else {}
        if proc.returncode != 0 or parsed.get("ttft_ms") is None or parsed.get("tpot_ms") is None:
            out["error"] = first_error(text)
        else:
            out.update(pred_ttft_ms=parsed["ttft_ms"], pred_tpot_ms=parsed["tpot_ms"])
            m = re.search(r"Backend:\s+vllm \(([^)]+)\)", text)
            out["perf_db"] = m.group(1) if m else None
    except subprocess.TimeoutExpired:
        out["error"] = f"timed out after {timeout:g} s"
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def summarize(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    failed = [r for r in results if "error" in r]
    s = {"n": len(results), "ok": len(ok), "failed": len(failed), "first_error": failed[0]["error"] if failed else None}
    for m in ("ttft", "tpot"):
        ratios = [r[f"pred_{m}_ms"] / r[f"measured_{m}_ms_mean"] for r in ok]
        s[f"{m}_mape"] = sum(abs(x - 1) for x in ratios) / len(ratios) if ratios else None
        s[f"{m}_geo"] = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    return s


def jaxplan_rows(results: list[dict], which: str) -> list[dict]:
    """The rows aiconfigurator answered, with jaxplan's stage-4 TTFT/TPOT in its place: `which` is
    "in sample" (the shipped fit) or "held out" (each GPU priced by the fit that did not see it)."""
    from jaxplan.physics.params import validate
    from jaxplan.prediction import predict_rows

    report = json.loads((Path(__file__).resolve().parent.parent / "docs" / "calibration_report.json").read_text())
    efficiency = {g: validate(g, v, "report") for g, v in report["held_out_params"].items()} if which == "held out" else None
    ok = [r for r in results if "error" not in r]
    by_id = {r["source_id"]: r for r in load_silicon_rows()}
    predicted = predict_rows([by_id[r["source_id"]] for r in ok], efficiency=efficiency)
    return [dict(r, pred_ttft_ms=p["ttft_ms_mean"], pred_tpot_ms=p["tpot_ms_mean"]) for r, p in zip(ok, predicted)]


def print_table(title: str, results: list[dict]) -> dict:
    groups = {}
    for r in results:
        groups.setdefault(f"{r['gpu']} {r['weight_dtype']}", []).append(r)
    table = {g: summarize(rs) for g, rs in sorted(groups.items())}
    table["overall"] = summarize(results)
    print(f"\n{title}\n{'group':<16}{'n':>5}{'ok':>5}{'TTFT MAPE':>11}{'TPOT MAPE':>11}{'TTFT geo':>10}{'TPOT geo':>10}  failed")
    for g, s in table.items():
        print(f"{g:<16}{s['n']:>5}{s['ok']:>5}{fmt(s['ttft_mape'], '>11.1%')}{fmt(s['tpot_mape'], '>11.1%')}"
              f"{fmt(s['ttft_geo'], '>10.3f')}{fmt(s['tpot_geo'], '>10.3f')}  {s['failed']}")
    return table


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def score(results: list[dict]) -> dict:
    """Print aiconfigurator's table, then jaxplan's on the rows it answered; returns aiconfigurator's."""
    table = print_table("aiconfigurator (cli estimate)", results)
    for which in ("in sample", "held out"):
        print_table(f"jaxplan stage 4, {which}, the same rows", jaxplan_rows(results, which))
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aiconfigurator", default=shutil.which("aiconfigurator"), help="aiconfigurator executable (its own venv)")
    p.add_argument("--limit", type=int, default=None, help="a seeded sample of N rows (default: all 180)")
    p.add_argument("--keep", type=Path, default=None, help="write every row's prediction to DIR/aic_predictions.json")
    p.add_argument("--jobs", type=int, default=2, help="estimates run at once (default 2)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per estimate")
    p.add_argument("--from-json", type=Path, default=None, help="re-score the predictions of an earlier run (its --keep JSON)")
    args = p.parse_args()
    if args.from_json:
        results = json.loads(args.from_json.read_text())["rows"]
        score(results)
        return

    aic = args.aiconfigurator
    if not aic or not Path(aic).exists():
        print(INSTALL.format(aic or "not on PATH"))
        return
    ver = subprocess.run([aic, "version"], capture_output=True, text=True, env=aic_env(), check=False)
    version = (ver.stdout + ver.stderr).strip().splitlines()[-1] if (ver.stdout + ver.stderr).strip() else "?"
    rows = select_rows(args.limit)
    print(f"aiconfigurator: {aic} ({version}); model {AIC_MODEL}; {len(rows)} rows; jobs {args.jobs}; load at start {load()}", flush=True)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda r: predict(aic, r, args.timeout), rows))
    wall = time.perf_counter() - t0

    table = score(results)
    if table["overall"]["first_error"]:
        print(f"first failure: {table['overall']['first_error']}")
    ok = [r for r in results if "error" not in r]
    worst = sorted(ok, key=lambda r: -max(abs(math.log(r["pred_ttft_ms"] / r["measured_ttft_ms_mean"])),
                                          abs(math.log(r["pred_tpot_ms"] / r["measured_tpot_ms_mean"]))))[:5]
    print("\nfarthest off (pred/measured):")
    for r in worst:
        print(f"  {r['gpu']} {r['weight_dtype']} tp{r['tensor_parallel_size']} {r['isl']:g}x{r['osl']:g} c{r['concurrency']}: "
              f"TTFT {r['pred_ttft_ms'] / r['measured_ttft_ms_mean']:.2f}, TPOT {r['pred_tpot_ms'] / r['measured_tpot_ms_mean']:.2f}")
    print(f"\nperf databases: {sorted({r.get('perf_db') for r in ok} - {None})}; wall {wall:.0f} s; load at end {load()}")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        out = args.keep / "aic_predictions.json"
        out.write_text(json.dumps({"aiconfigurator": version, "model": AIC_MODEL, "wall_s": round(wall, 1), "summary": table, "rows": results}, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
