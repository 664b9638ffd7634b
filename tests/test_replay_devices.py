"""The replay's lanes sharded over several XLA CPU devices (one loop per device) give the same trace,
and the CLI asks for one CPU device per core.

Sharded runs need a process whose CPU backend was created with several devices, so they run in a
subprocess with XLA_FLAGS=--xla_force_host_platform_device_count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from jaxplan import cpu_devices
from jaxplan.replay import driver

TESTS = Path(__file__).parent

SHARDED = """
import json, os, sys
sys.path.insert(0, {tests!r})
import jax, numpy as np
from jaxplan import compile_cache
compile_cache.enable({{compile_cache.ENV: os.environ.get("JAXPLAN_TEST_XLA_CACHE", "off")}})  # the suite's cache (tests/conftest.py)
from test_replay_split import _dp_case, _same
from test_replay_reference import _workload
from jaxplan.replay import driver, simulate_trace
from jaxplan.replay.testing import affine_step_time
assert jax.local_device_count() == {devices}, jax.devices()
report = {{}}
for seed, closed, routing, kw in {cases!r}:
    requests, config, params = _dp_case(seed, (1, 2))
    keep = kw.pop("finalists", config.num_finalists)  # the first `keep` finalists only
    config, params = driver._take_finalists(config, np.arange(keep)), jax.tree.map(lambda x: np.asarray(x)[:keep], params)
    run = lambda **extra: simulate_trace(config, requests, _workload(closed), affine_step_time, params, window=8, routing=routing, **kw, **extra)
    calls, first = [], []
    real = driver._advance
    driver._advance = lambda *a, **k: calls.append(k.get("mesh")) or first.append((a, k)) or real(*a, **k)
    sharded = run()
    driver._advance = real
    a, k = first[0]
    hlo = real.lower(*(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)) if hasattr(x, "shape") else x for x in a), **k).compile().as_text()
    collectives = sorted({{op for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute") if op + "(" in hlo or op + "-start(" in hlo}})
    devices = driver.lane_devices
    driver.lane_devices = lambda: 1
    single = run()
    driver.lane_devices = devices
    _same(sharded, single, f"seed {{seed}} closed {{closed}} {{routing}} {{kw}}")
    report[f"{{seed}}-{{closed}}-{{routing}}"] = {{"meshes": sorted({{0 if m is None else m.devices.size for m in calls}}), "finished": int((np.asarray(sharded.finish_step) >= 0).sum()), "collectives": collectives, "finalists": int(np.shape(sharded.finish_step)[0])}}
print(json.dumps(report))
"""


def _run_sharded(devices: int, cases) -> dict:
    # after the suite's own flags (tests/conftest.py: -O0), which the CLI would not add
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAXPLAN_CACHE_DIR="off")
    code = SHARDED.format(tests=str(TESTS), devices=devices, cases=cases)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=TESTS)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_sharded_lanes_give_the_same_trace():
    """Round robin (split and unsplit, open and closed loop) and least loaded (with a finalist count
    the devices do not divide, too), on 2 and 3 devices:
    every ReplayTrace field equals the one-device replay's, bit for bit (the affine step time rounds
    the same in every program; the physics' step times may differ in their last bits)."""
    cases = [
        (1, 0, "round_robin", {"max_replicas_per_lane": 1}),
        (2, 3, "round_robin", {"replica_steps_hint": 1e6}),
        (3, 0, "round_robin", {}),
        (4, 0, "least_loaded", {}),
        (5, 0, "least_loaded", {"finalists": 5}),
    ]
    two = _run_sharded(2, cases)
    assert all(r["finished"] > 0 for r in two.values())
    assert two["1-0-round_robin"]["meshes"] == [2]  # the lanes really were sharded
    assert two["3-0-round_robin"]["meshes"] == [2]  # unsplit: lanes padded to a multiple of 2
    assert two["4-0-least_loaded"]["meshes"] == [2]  # 6 finalists, 3 per device
    # 5 finalists of one lane each: the last repeated to make 3 a device, its copy dropped after
    assert two["5-0-least_loaded"]["meshes"] == [2] and two["5-0-least_loaded"]["finalists"] == 5
    # Each device's loop ends on its own: no collective after it, where the device done first would
    # wait for the others (XLA:CPU aborts a process whose collective waits 40 s; found by a MoE
    # rl-rollout sweep whose lanes ran minutes apart).
    assert all(r["collectives"] == [] for r in two.values()), two
    three = _run_sharded(3, cases[:1])
    assert three["1-0-round_robin"]["meshes"] == [3]


STORED = """
import json, sys
sys.path.insert(0, {tests!r})
import jax, numpy as np
from jaxplan import program_cache
lowered = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, fun_name=None, **_: lowered.append(fun_name) if name == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None)
program_cache.enable({cache!r})
from test_replay_split import _dp_case
from test_replay_reference import _workload
from jaxplan.replay import driver, simulate_trace
from jaxplan.replay.testing import affine_step_time
meshes = []
real = driver._advance
driver._advance = lambda *a, **k: meshes.append(k["mesh"].devices.size) or real(*a, **k)
requests, config, params = _dp_case(3, (1, 2))
trace = simulate_trace(config, requests, _workload(0), affine_step_time, params, window=8)
print(json.dumps({{"lowered": sorted(set(lowered)), "meshes": sorted(set(meshes)), "trace": [np.asarray(x).tolist() for x in trace]}}))
"""


def test_a_warm_process_loads_the_sharded_replays_programs(tmp_path):
    """With the program cache on (as the CLI runs), a replay whose lanes are sharded over 2 devices
    stores its start, loop and merge; a second process loads all three, lowering none of them, and
    gives the same trace. The start and the merge run on one device (the start's tables are then
    placed over the lanes, the merge's fetched from them), so they are stored like the loop."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAXPLAN_CACHE_DIR="off")
    code = STORED.format(tests=str(TESTS), cache=str(tmp_path))
    first, second = (subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=TESTS) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-3000:] + second.stderr[-3000:]
    cold, warm = (json.loads(run.stdout.strip().splitlines()[-1]) for run in (first, second))
    assert cold["meshes"] == warm["meshes"] == [2]  # the lanes really were sharded
    replay = {"jit(_start_lanes)", "jit(_advance)", "jit(_finish)"}
    assert replay <= set(cold["lowered"])  # exported, then compiled, by the first process
    assert not replay & set(warm["lowered"]), warm["lowered"]
    assert len(warm["trace"]) == len(cold["trace"])
    for loaded, compiled in zip(warm["trace"], cold["trace"]):
        np.testing.assert_array_equal(np.asarray(loaded, np.float64), np.asarray(compiled, np.float64))  # NaN where NaN


def test_lane_counts_round_up_to_the_devices():
    assert driver.lane_count_bucket(5, 5) == 5
    assert driver.lane_count_bucket(5, 5, devices=2) == 6
    assert driver.lane_count_bucket(9, 5, devices=4) == 16  # power of two, already a multiple
    assert driver.lane_count_bucket(9, 5, devices=3) == 18
    # more devices make more lanes cheaper: the split never uses fewer lanes
    dp, work = np.array([8, 3, 1]), np.array([100.0, 300.0, 50.0])
    assert driver.choose_split(dp, work, devices=4).sum() >= driver.choose_split(dp, work).sum()


def test_device_count_follows_the_environment():
    assert cpu_devices.device_count({}, cores=2) == 2
    assert cpu_devices.device_count({}, cores=64) == cpu_devices.MAX_DEFAULT_DEVICES
    assert cpu_devices.device_count({cpu_devices.ENV: "3"}, cores=2) == 3
    assert cpu_devices.device_count({cpu_devices.ENV: "0"}, cores=2) == 1
    assert cpu_devices.device_count({cpu_devices.ENV: "many"}, cores=4) == 4  # not a number: the default
    env = {"XLA_FLAGS": "--xla_cpu_foo=1"}
    assert cpu_devices.enable(env, cores=4) == 4
    assert env["XLA_FLAGS"] == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=4"
    assert env[cpu_devices.SWEEP_ENV] == "1"  # the sweep's chunks stay on one CPU device
    theirs = {cpu_devices.SWEEP_ENV: "2"}
    assert cpu_devices.enable(theirs, cores=4) == 4 and theirs[cpu_devices.SWEEP_ENV] == "2"
    mine = {"XLA_FLAGS": "--xla_force_host_platform_device_count=7"}
    assert cpu_devices.enable(mine, cores=4) == 0 and mine["XLA_FLAGS"].endswith("=7")  # the user's wins
    assert cpu_devices.SWEEP_ENV not in mine  # and the sweep then uses all 7
    one = {cpu_devices.ENV: "1"}
    assert cpu_devices.enable(one, cores=4) == 1 and "XLA_FLAGS" not in one


def test_the_command_line_makes_the_devices():
    code = (
        "import sys, jax\n"
        "from jaxplan import cli\n"
        "sys.argv = ['jaxplan', 'list']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "from jaxplan.funnel.budget import estimate_sweep\n"
        "from jaxplan.funnel.sweep import device_mesh\n"
        "from jaxplan.grid import Grid\n"
        "from jaxplan.specs import load_space, parse_gpu_list\n"
        "grid = Grid(parse_gpu_list('h100_sxm'), load_space('small'))\n"
        "print(jax.local_device_count(), device_mesh().devices.size, estimate_sweep(grid, 65536).num_devices)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", cpu_devices.SWEEP_ENV)}
    env.update({cpu_devices.ENV: "3", "JAXPLAN_CACHE_DIR": "off"})
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    # 3 devices; the sweep on one of them, and its up-front estimate counts that one
    assert run.stdout.strip().splitlines()[-1] == "3 1 1"


def test_the_sweep_limit_applies_to_cpu_devices_only():
    """$JAXPLAN_SWEEP_DEVICES (the CLI's 1, set before JAX knows its backend) keeps the chunks on the
    first CPU devices; GPUs each add throughput, so all of them stream chunks."""
    from types import SimpleNamespace

    from jaxplan.funnel.devices import sweep_devices

    cpus = [SimpleNamespace(platform="cpu", id=i) for i in range(4)]
    gpus = [SimpleNamespace(platform="gpu", id=i) for i in range(8)]
    assert sweep_devices(cpus, {cpu_devices.SWEEP_ENV: "1"}) == cpus[:1]
    assert sweep_devices(cpus, {cpu_devices.SWEEP_ENV: "3"}) == cpus[:3]
    assert sweep_devices(cpus, {}) == cpus
    assert sweep_devices(gpus, {cpu_devices.SWEEP_ENV: "1"}) == gpus
