"""Which local JAX devices the sweep streams its chunks on: the one answer that the device mesh, the
default chunk size and the up-front time and memory estimate share."""

from __future__ import annotations

import os

from jaxplan.cpu_devices import SWEEP_ENV


def sweep_devices(devices: list, environ=os.environ) -> list:
    """Of the local `devices`, those the chunks are sharded over: all, or on CPUs the first
    $JAXPLAN_SWEEP_DEVICES. The CLI sets it to 1 before JAX starts, when it made one XLA CPU device
    per core for the replay (cpu_devices.py); it cannot know then whether JAX will find GPUs, and
    GPUs, unlike the cores, each add their own throughput (to limit those, CUDA_VISIBLE_DEVICES)."""
    limit = environ.get(SWEEP_ENV, "").strip()
    if limit.isdigit() and devices and devices[0].platform == "cpu":
        return devices[: max(1, int(limit))]
    return list(devices)


def local_sweep_devices() -> list:
    """`sweep_devices` of this process's JAX devices (creates JAX's backend)."""
    import jax

    return sweep_devices(jax.local_devices())
