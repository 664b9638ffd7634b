"""Scale-out: two JAX processes on this machine (coordinator on localhost) sweep one grid between them
and both end with the one-process result; the CLI's host variables are checked for bad values."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan.cli import hosts
from jaxplan.errors import PlanError

REPO = Path(__file__).resolve().parent.parent
# 1,536 candidates in chunks of 1,024: host 0 streams chunk 0 (1,024), host 1 chunk 1 (512), so each
# host alone sees a different funnel and only a correct gather gives both the one-process result.
SWEEP = dict(model="llama-3.1-8b", gpus="h100_sxm,a100_sxm", workload="chat", space="small", chunk_size=1024)
TIMING_KEYS = {"seconds", "compile_s", "run_s", "num_devices"}
HOST_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def host_command(json_path: Path) -> list[str]:
    """`jaxplan sweep ... --no-replay --json PATH`, the command a user runs on each host."""
    return [
        sys.executable, "-c", "from jaxplan.cli import main; main()", "sweep", "--model", SWEEP["model"], "--gpus", SWEEP["gpus"],
        "--workload", SWEEP["workload"], "--space", SWEEP["space"], "--chunk-size", str(SWEEP["chunk_size"]), "--no-replay",
        "--json", str(json_path),
    ]


def test_two_processes_sweep_to_the_one_process_result(tmp_path):
    try:
        port = free_port()
    except OSError as error:
        pytest.skip(f"cannot bind a localhost port for the coordinator: {error}")
    one = json.loads(jaxplan.sweep(replay=False, **SWEEP).to_json())
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        JAXPLAN_SWEEP_DEVICES="1", JAXPLAN_COORDINATOR=f"127.0.0.1:{port}", JAXPLAN_NUM_PROCESSES="2",
        # The session's compilation cache (tests/conftest.py): the hosts load the kernels this process compiled.
        JAXPLAN_CACHE_DIR=os.environ.get("JAXPLAN_TEST_XLA_CACHE", "off"),
        # ... compiled as this process compiles them: at the suite's fast-compile flags a stored program
        # (`program_cache`, the command line's) can round a report row's last bit otherwise (not at the
        # shipped flags); this test is about combining the hosts' parts, compared exactly.
        JAXPLAN_PROGRAM_CACHE="off",
    )
    # Host i has i + 1 CPU devices, as hosts with different core counts would: the gather must not care.
    paths = [tmp_path / f"host{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen(host_command(paths[i]), env=dict(env, JAXPLAN_PROCESS_ID=str(i), JAXPLAN_CPU_DEVICES=str(i + 1)), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=HOST_TIMEOUT_S)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for i, (proc, output) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"host {i} exited {proc.returncode}:\n{output[-3000:]}"
    for i, path in enumerate(paths):
        plan = json.loads(path.read_text())
        assert plan["num_devices"] == 2, f"host {i}: the result should combine both hosts' devices"
        assert plan["grid_size"] == 1536
        for key in ("funnel", "shortlist", "frontier", "winner", "winner_verdict"):
            assert without_timings(plan[key]) == without_timings(one[key]), f"host {i}: {key} differs from the one-process sweep"
    # The comparison is not vacuous: the shortlist is full and every stage rejected or admitted something.
    assert len(one["shortlist"]) == 20
    assert sum(stage["rejected"] for stage in one["funnel"][:4]) > 0


@pytest.mark.parametrize(
    "environ, field",
    [
        ({"JAXPLAN_COORDINATOR": "localhost"}, "JAXPLAN_COORDINATOR"),
        ({"JAXPLAN_COORDINATOR": "10.0.0.1:99999"}, "JAXPLAN_COORDINATOR"),
        ({"JAXPLAN_COORDINATOR": "10.0.0.1:1234", "JAXPLAN_PROCESS_ID": "0"}, "JAXPLAN_NUM_PROCESSES"),
        ({"JAXPLAN_COORDINATOR": "10.0.0.1:1234", "JAXPLAN_NUM_PROCESSES": "two", "JAXPLAN_PROCESS_ID": "0"}, "JAXPLAN_NUM_PROCESSES"),
        ({"JAXPLAN_COORDINATOR": "10.0.0.1:1234", "JAXPLAN_NUM_PROCESSES": "0", "JAXPLAN_PROCESS_ID": "0"}, "JAXPLAN_NUM_PROCESSES"),
        ({"JAXPLAN_COORDINATOR": "10.0.0.1:1234", "JAXPLAN_NUM_PROCESSES": "2"}, "JAXPLAN_PROCESS_ID"),
        ({"JAXPLAN_COORDINATOR": "10.0.0.1:1234", "JAXPLAN_NUM_PROCESSES": "2", "JAXPLAN_PROCESS_ID": "2"}, "JAXPLAN_PROCESS_ID"),
        ({"JAXPLAN_COORDINATOR": "10.0.0.1:1234", "JAXPLAN_NUM_PROCESSES": "2", "JAXPLAN_PROCESS_ID": "-1"}, "JAXPLAN_PROCESS_ID"),
    ],
)
def test_bad_host_variables_name_the_variable(environ, field):
    with pytest.raises(PlanError, match=f"^{field} = "):
        hosts.distributed_args(environ)


def test_only_sweeping_commands_join_the_hosts():
    assert hosts.command_sweeps(["jaxplan", "sweep", "--model", "x"])
    assert hosts.command_sweeps(["/usr/bin/jaxplan", "report", "-o", "r.html"])
    assert not hosts.command_sweeps(["jaxplan", "predict", "rows.csv"])
    assert not hosts.command_sweeps(["jaxplan", "--help"])
    assert not hosts.command_sweeps(["jaxplan"])


def test_host_variables_give_jax_distributed_arguments():
    assert hosts.distributed_args({}) is None
    assert hosts.distributed_args({"JAXPLAN_COORDINATOR": " "}) is None
    args = hosts.distributed_args({"JAXPLAN_COORDINATOR": "node-0.cluster:1234", "JAXPLAN_NUM_PROCESSES": "4", "JAXPLAN_PROCESS_ID": "3"})
    assert (args["coordinator_address"], args["num_processes"], args["process_id"]) == ("node-0.cluster:1234", 4, 3)
    assert "coordinator_address" not in hosts.distributed_args({"JAXPLAN_COORDINATOR": "auto"})  # JAX detects the cluster


def test_cli_refuses_bad_host_variables_in_one_line(monkeypatch, capsys):
    from jaxplan.cli import main

    for name, value in {"JAXPLAN_CACHE_DIR": "off", "JAXPLAN_CPU_DEVICES": "1", "JAXPLAN_COORDINATOR": "10.0.0.1:1234", "JAXPLAN_NUM_PROCESSES": "2", "JAXPLAN_PROCESS_ID": "5"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["jaxplan", "sweep", "--space", "small"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "JAXPLAN_PROCESS_ID = 5" in lines[0], lines
    # A command that does not sweep runs on this host alone and ignores the variables.
    monkeypatch.setattr(sys, "argv", ["jaxplan", "list"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0, capsys.readouterr().err


def test_a_part_crosses_hosts_exactly():
    """What a host posts to the coordinator comes back bit for bit, counts past int32 included."""
    from jaxplan.funnel.chunk import SweepState
    from jaxplan.funnel.sweep import StreamedPart, part_bytes, part_from_bytes
    from jaxplan.funnel.tables import BestTable

    rng = np.random.default_rng(0)
    table = lambda n: BestTable(jnp.asarray(rng.normal(size=n).astype(np.float32)), jnp.asarray(rng.integers(-1, 9, (n, 8), dtype=np.int32)))
    part = StreamedPart(np.array([0, 1, 2**31, 2**40 + 7, 10**12], np.int64), SweepState(table(5), table(3)), 1.25, 0.5, 3, 4096)
    back = part_from_bytes(part_bytes(part))
    np.testing.assert_array_equal(back.totals, part.totals)
    assert back.totals.dtype == np.int64
    for a, b in zip(jax.tree.leaves(back.state), jax.tree.leaves(part.state)):
        np.testing.assert_array_equal(a, np.asarray(b))
        assert a.dtype == b.dtype
    assert (back.compile_s, back.run_s, back.num_devices, back.chunk_size) == (1.25, 0.5, 3, 4096)


class FakeCoordinator:
    """The key-value store of jax.distributed's client, in memory, holding what other hosts posted."""

    def __init__(self, posted: dict[str, bytes]):
        self.store, self.barriers = dict(posted), []

    def key_value_set_bytes(self, key, value, allow_overwrite=False):
        self.store[key] = value

    def key_value_dir_get_bytes(self, prefix):
        return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]

    def wait_at_barrier(self, barrier_id, timeout_in_ms):
        self.barriers.append(barrier_id)

    def key_value_delete(self, key):
        del self.store[key]


def fake_part(seed: int, chunk_size: int):
    from jaxplan.funnel.chunk import SweepState
    from jaxplan.funnel.sweep import StreamedPart
    from jaxplan.funnel.tables import BestTable

    rng = np.random.default_rng(seed)
    table = lambda n: BestTable(rng.normal(size=n).astype(np.float32), rng.integers(0, 9, (n, 8), dtype=np.int32))
    return StreamedPart(rng.integers(0, 2**40, 5).astype(np.int64), SweepState(table(6), table(4)), 1.0 + seed, 0.5 + seed, 1, chunk_size)


@pytest.fixture
def as_host_0_of_2(monkeypatch):
    """Install a fake coordinator holding `posted` (keys as host 1 would post them in gather round 7)."""
    import itertools

    from jax._src import distributed

    from jaxplan.funnel import sweep

    jax.devices()  # the backend first: made while the fake client is installed, it would try to use it

    def install(posted):
        fake = FakeCoordinator(posted)
        monkeypatch.setattr(distributed.global_state, "client", fake)
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        monkeypatch.setattr(jax, "process_index", lambda: 0)
        monkeypatch.setattr(sweep, "_gather_rounds", itertools.count(7))
        return fake

    return install


def test_gather_combines_what_the_other_host_posted(as_host_0_of_2):
    from jaxplan.funnel.sweep import combine, gather_hosts, part_bytes

    mine, theirs = fake_part(0, 4096), fake_part(1, 4096)
    coordinator = as_host_0_of_2({"jaxplan/sweep/7/1": part_bytes(theirs)})
    got = gather_hosts(mine)
    want = combine([mine, theirs])
    np.testing.assert_array_equal(got.totals, mine.totals + theirs.totals)
    for a, b in zip(jax.tree.leaves(got.state), jax.tree.leaves(want.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (got.num_devices, got.compile_s, got.run_s) == (2, 2.0, 1.5)
    # Everyone read every part before this host removed its own.
    assert coordinator.barriers == ["jaxplan/sweep/7/read"] and set(coordinator.store) == {"jaxplan/sweep/7/1"}


def test_gather_refuses_hosts_with_different_chunks(as_host_0_of_2):
    from jaxplan.funnel.sweep import gather_hosts, part_bytes

    as_host_0_of_2({"jaxplan/sweep/7/1": part_bytes(fake_part(1, 8192))})
    with pytest.raises(PlanError, match="different sizes .*4,096, 8,192.*JAXPLAN_SWEEP_DEVICES"):
        gather_hosts(fake_part(0, 4096))


def test_gather_stops_when_another_host_abandoned(as_host_0_of_2):
    from jaxplan.funnel.sweep import abandon_hosts, gather_hosts

    coordinator = as_host_0_of_2({"jaxplan/abandoned/1": b"exit code 1"})
    with pytest.raises(PlanError, match=r"^host 1 stopped \(exit code 1\)"):
        gather_hosts(fake_part(0, 4096))
    abandon_hosts("PlanError: bad")
    assert coordinator.store["jaxplan/abandoned/0"] == b"PlanError: bad"


def test_a_host_with_bad_input_stops_the_other(tmp_path):
    """Host 1 is given an unknown space: both hosts exit 1 promptly (no wait for the missing part)."""
    try:
        port = free_port()
    except OSError as error:
        pytest.skip(f"cannot bind a localhost port for the coordinator: {error}")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), JAXPLAN_CPU_DEVICES="1",
        JAXPLAN_COORDINATOR=f"127.0.0.1:{port}", JAXPLAN_NUM_PROCESSES="2", JAXPLAN_CACHE_DIR=os.environ.get("JAXPLAN_TEST_XLA_CACHE", "off"),
    )
    commands = [host_command(tmp_path / "host0.json"), [*host_command(tmp_path / "host1.json"), "--space", "no-such-space"]]
    procs = [subprocess.Popen(c, env=dict(env, JAXPLAN_PROCESS_ID=str(i)), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i, c in enumerate(commands)]
    outputs = []
    try:
        outputs = [p.communicate(timeout=HOST_TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [1, 1], outputs
    assert "unknown search space 'no-such-space'" in outputs[1]
    assert "host 1 stopped (exit code 1)" in outputs[0]
