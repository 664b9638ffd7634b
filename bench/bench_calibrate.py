"""Benchmark `jaxplan calibrate` on the shared measurements: wall, CPU and peak memory of the whole command.

Usage:
    python bench/bench_calibrate.py                      # --report, with the replay check
    python bench/bench_calibrate.py --no-replay-check    # the fit and the held-out protocols only
    python bench/bench_calibrate.py --repeat 2

Each run is a fresh process writing to a temporary directory (never the bundled file), with
JAXPLAN_SHARED_DATA pointing at the data (default ../shared/data beside the checkout) and an empty
compilation cache, so every run compiles what a first calibration compiles. Reported: the wall time
of the command, the seconds after which the parameters were written (the log's "calibrated in N s",
the fit and both held-out protocols and the MoE rows' scoring), the CPU time (user + system) and the
peak resident memory of the process. Target (issue #34): under 3 minutes on the 2-core machine.

Prints machine facts and the load average at start and end: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine

ROOT = Path(__file__).resolve().parent.parent


def jaxplan_command() -> str:
    """The `jaxplan` entry point of this Python's environment (the one `pip install -e .` made)."""
    beside = Path(sys.executable).parent / "jaxplan"
    found = str(beside) if beside.exists() else shutil.which("jaxplan")
    if not found:
        sys.exit("no `jaxplan` command: install the project first (pip install -e .)")
    return found


def one_run(data: Path, replay_check: bool) -> dict:
    """One fresh `jaxplan calibrate` process: its wall s, CPU s, peak RSS GiB and the log's fit seconds."""
    with tempfile.TemporaryDirectory(prefix="jaxplan-bench-calibrate-") as where:
        out = Path(where)
        command = [jaxplan_command(), "calibrate", "-o", str(out / "params.toml"), "--report", str(out / "report.json")]
        if not replay_check:
            command.append("--no-replay-check")
        env = {**os.environ, "JAXPLAN_SHARED_DATA": str(data), "JAXPLAN_CACHE_DIR": str(out / "xla"), "XDG_CONFIG_HOME": str(out)}
        env.pop("JAXPLAN_PARAMS", None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            sys.exit(f"jaxplan calibrate failed ({done.returncode}):\n{done.stderr[-2000:]}")
        fitted = re.search(r"calibrated in (\d+) s", done.stdout + done.stderr)
        return {
            "wall_s": wall,
            "fit_s": float(fitted.group(1)) if fitted else float("nan"),
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "rss_gib": after.ru_maxrss / 2**20,  # the largest child so far (KiB on Linux)
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("JAXPLAN_SHARED_DATA", ROOT.parent / "shared" / "data")))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-replay-check", action="store_true")
    args = parser.parse_args()
    if not args.data.is_dir():
        sys.exit(f"--data {args.data}: no such folder; point it (or $JAXPLAN_SHARED_DATA) at the shared measurements")
    machine.print_start()
    runs = [one_run(args.data, not args.no_replay_check) for _ in range(args.repeat)]
    print("| what | runs | wall s (median) | parameters written after s | CPU s | peak RSS GiB |")
    print("|---|---|---|---|---|---|")
    what = "jaxplan calibrate --report" + (" --no-replay-check" if args.no_replay_check else "")
    print(f"| {what} | {len(runs)} | {statistics.median(r['wall_s'] for r in runs):.0f} | {statistics.median(r['fit_s'] for r in runs):.0f} "
          f"| {statistics.median(r['cpu_s'] for r in runs):.0f} | {max(r['rss_gib'] for r in runs):.2f} |")
    machine.print_end()


if __name__ == "__main__":
    main()
