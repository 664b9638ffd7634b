"""Several hosts for one sweep, from the environment: the command line's call to jax.distributed.initialize.

On every host, set JAXPLAN_COORDINATOR=host:port (the address of process 0, reachable from all
hosts), JAXPLAN_NUM_PROCESSES (the number of hosts) and JAXPLAN_PROCESS_ID (this host's index,
0 .. N-1), then run the same `jaxplan` command (one that sweeps: SWEEPING_COMMANDS; the others run
on each host alone and ignore the variables). JAXPLAN_COORDINATOR=auto lets JAX read the three
from a cluster it knows (SLURM, Open MPI, Kubernetes). Unset: one host, nothing is initialized.
Each host streams every N-th chunk of the grid (jaxplan.funnel.sweep.run_sweep) and all of them
end with the same result. Environment variables, not options, because the call must come before
JAX's first computation, which parsing a command's options may already make.
"""

from __future__ import annotations

import os

from jaxplan.errors import PlanError, bad_value

COORDINATOR_ENV = "JAXPLAN_COORDINATOR"
NUM_PROCESSES_ENV = "JAXPLAN_NUM_PROCESSES"
PROCESS_ID_ENV = "JAXPLAN_PROCESS_ID"
SWEEPING_COMMANDS = ("sweep", "size", "sensitivity", "report")
INITIALIZE_TIMEOUT_S = 300  # how long a host waits for the others to reach the coordinator


def command_sweeps(argv: list[str]) -> bool:
    """Whether the command line `argv` (sys.argv) runs a command that sweeps: only those join the hosts,
    so that `jaxplan list` or `predict` on one host does not wait for the others."""
    command = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
    return command in SWEEPING_COMMANDS


def distributed_args(environ=os.environ) -> dict | None:
    """The keyword arguments of jax.distributed.initialize the environment asks for, or None (one host).
    Raises PlanError naming the variable for a malformed one."""
    coordinator = environ.get(COORDINATOR_ENV, "").strip()
    if not coordinator:
        return None
    if coordinator.lower() == "auto":
        return {"initialization_timeout": INITIALIZE_TIMEOUT_S}
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad_value(COORDINATOR_ENV, coordinator, "give host:port of process 0 (e.g. 10.0.0.1:12345), or auto on SLURM / Open MPI / Kubernetes")
    num_processes = _integer(environ, NUM_PROCESSES_ENV, "the number of hosts taking part (an integer >= 1), the same on every host")
    process_id = _integer(environ, PROCESS_ID_ENV, f"this host's index, an integer from 0 to {NUM_PROCESSES_ENV} - 1, different on every host")
    if num_processes < 1:
        raise bad_value(NUM_PROCESSES_ENV, num_processes, "the number of hosts must be at least 1")
    if not 0 <= process_id < num_processes:
        raise bad_value(PROCESS_ID_ENV, process_id, f"must be from 0 to {num_processes - 1} ({NUM_PROCESSES_ENV} = {num_processes})")
    return {
        "coordinator_address": coordinator, "num_processes": num_processes, "process_id": process_id,
        "initialization_timeout": INITIALIZE_TIMEOUT_S,
    }


def _integer(environ, name: str, meaning: str) -> int:
    text = environ.get(name, "").strip()
    if not text.lstrip("-").isdigit():
        raise bad_value(name, text, f"set it to {meaning} (needed with {COORDINATOR_ENV})")
    return int(text)


def initialize(environ=os.environ) -> int:
    """Join the hosts named by the environment (see the module docstring); the number of processes (1: none asked for)."""
    args = distributed_args(environ)
    if args is None:
        return 1
    import jax

    try:
        jax.distributed.initialize(**args)
    except (RuntimeError, ValueError) as error:  # jaxlib's errors (unreachable coordinator, timeout) are RuntimeErrors
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = args.get("coordinator_address", "the cluster's coordinator")
        raise PlanError(
            f"{COORDINATOR_ENV}: could not join the hosts at {where}: {first}; start every host within "
            f"{INITIALIZE_TIMEOUT_S} s with the same {COORDINATOR_ENV} and {NUM_PROCESSES_ENV} and a distinct {PROCESS_ID_ENV}"
        ) from None
    return jax.process_count()


def abandon(reason: str) -> None:
    """This host is stopping before its share is posted: tell the others (nothing on one host)."""
    import jax

    if jax.distributed.is_initialized():
        from jaxplan.funnel.sweep import abandon_hosts

        abandon_hosts(reason)
