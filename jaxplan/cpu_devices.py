"""One XLA CPU device per core for the command line, so that the replay's loop uses every core.

XLA:CPU gives a process one device, and a `lax.while_loop` of small operations (the replay's
scheduler steps) runs on one thread of it. With N host devices the replay shards its lanes over
them and each device loops over its share on its own core (jaxplan/replay/driver.py); the sweep's
chunks are sharded over them too. How many: $JAXPLAN_CPU_DEVICES (1 turns it off), else one per
core, at most MAX_DEFAULT_DEVICES. An XLA_FLAGS that already sets the host device count wins.
It must run before JAX creates its CPU backend (the first computation); later it changes nothing.
"""

from __future__ import annotations

import os

ENV = "JAXPLAN_CPU_DEVICES"
SWEEP_ENV = "JAXPLAN_SWEEP_DEVICES"  # read by jaxplan.funnel.devices.sweep_devices (CPU devices only)
FLAG = "--xla_force_host_platform_device_count"
MAX_DEFAULT_DEVICES = 8


def device_count(environ=os.environ, cores: int | None = None) -> int:
    """Host devices to ask for: $JAXPLAN_CPU_DEVICES if it is a positive integer, else min(cores, 8)."""
    chosen = environ.get(ENV, "").strip()
    if chosen:
        try:
            return max(1, int(chosen))
        except ValueError:
            pass
    cores = os.cpu_count() if cores is None else cores
    return max(1, min(cores or 1, MAX_DEFAULT_DEVICES))


def enable(environ=os.environ, cores: int | None = None) -> int:
    """Add the host device count to XLA_FLAGS in `environ` unless it is there already, and keep the
    sweep on one device (unless $JAXPLAN_SWEEP_DEVICES says otherwise); the count asked for (1:
    nothing added, 0: XLA_FLAGS had one)."""
    flags = environ.get("XLA_FLAGS", "")
    if FLAG in flags:
        return 0
    count = device_count(environ, cores)
    if count > 1:
        environ["XLA_FLAGS"] = f"{flags} {FLAG}={count}".strip()
        environ.setdefault(SWEEP_ENV, "1")
    return count
