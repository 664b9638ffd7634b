"""A/B of the replay loop's speed in one process: the working tree's code against a git revision's.

The VM's speed drifts by up to 2x from hour to hour, more than most changes to the scheduler's step
move it, so two versions timed in separate runs rarely compare. Here each version's loop
(`replay.driver._advance`, the README sweep's first F finalists at S fixed slot rows, one CPU device)
is compiled by a child process running that version's code (the revision's `jaxplan/` from
`git archive`) and handed back as a serialised executable over flat arrays, with the arguments of its
first call; this process loads both and calls them alternately, in the order A B B A A B ..., so a
slow minute falls on both alike and neither always runs second.
Reported per version: the median and the least microseconds per loop iteration, and the iterations
run (equal unless the change alters the schedule). `--against HEAD` with an unchanged tree shows the
harness's own noise.

    python bench/bench_replay_ab.py --against HEAD
    python bench/bench_replay_ab.py --against HEAD~3 --finalists 20 --repeat 12
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

ROOT = Path(__file__).resolve().parents[1]

# Runs in a child process whose sys.path starts at one version's code: compile that version's loop
# over flat arrays and pickle the executable and its arguments.
CHILD = r"""
import os, pickle, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ.update(JAXPLAN_SWEEP_DEVICES="1", JAXPLAN_PROGRAM_CACHE="off", JAXPLAN_CACHE_DIR="off")
import jax
import numpy as np
from jax.experimental import serialize_executable
import jaxplan
from jaxplan.funnel import run_sweep
from jaxplan.funnel.replay_stage import finalist_inputs, physics_step
from jaxplan.replay import driver, sample_requests
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list

out_path, finalists, slots, iterations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
workload = load_workload("coding")
result = run_sweep(load_model("llama-3.1-70b"), parse_gpu_list("h100_sxm,h200_sxm"), workload, load_space("default"), top_k=finalists)
configs, params = finalist_inputs(result, result.shortlist[:finalists])
requests = sample_requests(workload, 2000, seed=0)
loop, first = driver._advance, {}

def capture(*args, **static):
    if not first:  # before the call: it donates its state
        first["args"], first["static"] = jax.tree.map(np.array, args), static
    return loop(*args, **static)

driver._advance = capture
driver.simulate_trace(configs, requests, workload, physics_step, params, num_slots=slots, max_iterations=iterations)
leaves, treedef = jax.tree.flatten(first["args"])

def flat(*leaves):
    state, ran, *flags = loop.__wrapped__(*jax.tree.unflatten(treedef, leaves), **first["static"])
    return [ran, *flags, *jax.tree.leaves(state)]  # every output kept, so nothing of the loop is dropped

payload, in_tree, out_tree = serialize_executable.serialize(jax.jit(flat).lower(*leaves).compile())
with open(out_path, "wb") as f:
    pickle.dump({"payload": payload, "in_tree": in_tree, "out_tree": out_tree, "leaves": leaves, "code": jaxplan.__file__}, f)
"""


def export_revision(rev: str, where: Path) -> Path:
    """The revision's `jaxplan/` unpacked under `where` (its sys.path root)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "jaxplan"], capture_output=True, check=True).stdout
    tar_path = where / "code.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        # the "data" filter (Python >= 3.11.4) refuses links and absolute paths; git's own archive has none
        tar.extractall(where, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return where


def compile_version(code_root: Path, out: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code_root))
    run = subprocess.run([sys.executable, "-c", CHILD, str(out), str(args.finalists), str(args.slots), str(args.iterations)],
                         cwd=code_root, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"compiling the loop from {code_root} failed:\n{run.stderr[-3000:]}")
    with open(out, "rb") as f:
        saved = pickle.load(f)
    if not Path(saved["code"]).resolve().is_relative_to(code_root.resolve()):
        sys.exit(f"the child imported jaxplan from {saved['code']}, not from {code_root}")
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="git revision to compare the working tree with")
    parser.add_argument("--finalists", type=int, default=10, help="lanes (the README sweep's first N finalists)")
    parser.add_argument("--slots", type=int, default=192, help="slot rows per lane, fixed")
    parser.add_argument("--iterations", type=int, default=3000, help="loop iterations per timed call")
    parser.add_argument("--repeat", type=int, default=8, help="timed calls of each version, alternating")
    args = parser.parse_args()

    import jax
    import numpy as np
    from jax.experimental import serialize_executable

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine import print_end, print_start

    print_start()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        versions = {"working tree": ROOT, args.against: export_revision(args.against, tmp)}
        loaded = {}
        for label, code_root in versions.items():
            saved = compile_version(code_root, tmp / f"{len(loaded)}.pkl", args)
            executable = serialize_executable.deserialize_and_load(saved["payload"], saved["in_tree"], saved["out_tree"])
            loaded[label] = (executable, [jax.device_put(x) for x in saved["leaves"]])
    per_iteration = {label: [] for label in loaded}
    ran = {}
    labels = list(loaded)
    for repeat in range(args.repeat):
        for label in labels if repeat % 2 == 0 else labels[::-1]:  # ABBA: neither version always runs second
            executable, leaves = loaded[label]
            start = time.perf_counter()
            out = jax.block_until_ready(executable(*leaves))
            ran[label] = int(np.max(np.asarray(out[0])))  # [devices] in revisions whose loop reports each device's count
            per_iteration[label].append((time.perf_counter() - start) / ran[label] * 1e6)
    for label, times in per_iteration.items():
        print(f"{label:>14}: {statistics.median(times):.1f} us per loop iteration (least {min(times):.1f}), {ran[label]:,} iterations a call, "
              f"{args.finalists} lanes x {args.slots} slot rows, {args.repeat} calls alternating")
    print_end()


if __name__ == "__main__":
    main()
