"""The README's `jaxplan sweep` as a user runs it: cold (empty compilation cache) and warm.

Each run is a fresh process (`jaxplan sweep --model llama-3.1-70b --gpus h100_sxm,h200_sxm
--workload coding`, or the arguments after `--`). Reported per run: wall time, CPU time (user +
sys, both cores), and from inside the process, JAX's own monitoring events: seconds spent
tracing, lowering to MLIR, compiling in XLA, loading from the persistent cache and loading the
program cache's stored executables (sums over every program and thread: with compilation on
worker threads they overlap each other and the run), the peak RSS, plus the command's own stage
times (stages 1-4 streaming, the replay).

    python bench/bench_first_run.py --repeat 3
    python bench/bench_first_run.py --repeat 2 -- sweep --no-replay
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_SWEEP = ["sweep", "--model", "llama-3.1-70b", "--gpus", "h100_sxm,h200_sxm", "--workload", "coding"]

# Runs inside the measured process: sum JAX's duration events, then run the CLI.
CHILD = r"""
import atexit, collections, json, os, resource, sys, time
sys.path.insert(0, os.environ["PYTHONPATH"])  # this tree's jaxplan, not the one in the working directory (`-c` puts it first)
start = time.perf_counter()
import jax
events_path = sys.argv[1]
sums = collections.defaultdict(float)
jax.monitoring.register_event_duration_secs_listener(lambda name, secs, **kw: sums.__setitem__(name, sums[name] + secs))
# Each program's XLA compilation (or persistent-cache load), wall seconds, by program name.
programs = collections.defaultdict(float)
def per_program(name, secs, fun_name=None, **kw):
    if name == "/jax/core/compile/backend_compile_duration" and fun_name:
        programs[fun_name] += secs
jax.monitoring.register_event_duration_secs_listener(per_program)
def dump():
    with open(events_path, "w") as f:
        json.dump(dict(sums, import_s=imported - start, programs=programs, peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20), f)
atexit.register(dump)
from jaxplan.cli import main
imported = time.perf_counter()
sys.argv = ["jaxplan"] + sys.argv[2:]
main()
"""

EVENTS = {
    "trace_s": "/jax/core/compile/jaxpr_trace_duration",
    "lower_s": "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "xla_compile_s": "/jax/core/compile/backend_compile_duration",
    "cache_load_s": "/jax/compilation_cache/cache_retrieval_time_sec",
    "executable_load_s": "/jaxplan/program_cache/executable_load_duration",
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(args: list[str], cache_dir: str) -> dict:
    """One process: wall, CPU, JAX's event sums and the command's stage times."""
    before = _children_cpu()
    with tempfile.TemporaryDirectory() as tmp:
        events_path, json_path = os.path.join(tmp, "events.json"), os.path.join(tmp, "plan.json")
        env = dict(os.environ, JAXPLAN_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT))
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", CHILD, events_path, *args, "--json", json_path], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        printed, errors = child.communicate()  # reads both pipes to the end, then reaps the child
        wall = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        if child.returncode != 0:
            raise SystemExit(f"the command failed: {errors[-2000:]}")
        events = json.loads(Path(events_path).read_text())
        plan = json.loads(Path(json_path).read_text())
    cpu = usage.ru_utime + usage.ru_stime - before
    row = {"wall_s": wall, "cpu_s": cpu, "import_s": events["import_s"], "peak_rss_gib": events["peak_rss_gib"]}
    row.update({key: events.get(name, 0.0) for key, name in EVENTS.items()})
    programs = events["programs"]
    for name in ("sweep_chunk", "evaluate_digits", "advance", "finish", "start"):
        row[f"{name}_s"] = sum(v for k, v in programs.items() if k.removeprefix("jit(").rstrip(")").lstrip("_") == name)
    row["first_chunk_s"] = plan["compile_s"]  # the chunk kernel's compilation (or cache load) and one chunk
    row["stream_s"] = plan["run_s"]
    stage7 = re.search(r"^7 replay: .* in ([0-9.]+) s;", printed, re.M)
    row["replay_s"] = float(stage7.group(1)) if stage7 else 0.0  # stage 7's wall time, its compilation included
    row["winner"] = (plan["winner"] or {}).get("digits")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="cold + warm pairs, each with its own fresh cache")
    parser.add_argument("args", nargs="*", help="jaxplan arguments after `--` (default: the README's sweep)")
    options = parser.parse_args()
    args = options.args or README_SWEEP
    rows = {"cold": [], "warm": []}
    for _ in range(options.repeat):
        with tempfile.TemporaryDirectory(prefix="jaxplan-bench-cache-") as cache:
            for phase in ("cold", "warm"):
                row = run_once(args, cache)
                rows[phase].append(row)
                print(phase, " ".join(f"{k}={v:.2f}" for k, v in row.items() if isinstance(v, float)), flush=True)
    winners = {json.dumps(r["winner"]) for phase in rows.values() for r in phase}
    print(f"winners agree across runs: {len(winners) == 1}")
    for phase, runs in rows.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], float)}
        print(f"median {phase}: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))


if __name__ == "__main__":
    main()
