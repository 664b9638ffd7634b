"""Up-front time and memory estimates of a sweep, and refusing one that does not fit the user's limits.

Memory is bounded by the streamed chunk and the per-layout table, not by the grid (see sweep.py):

  memory = BASE (JAX runtime, compiled kernels, stage-5 frontier over <= 4,096 table entries)
         + effective chunk x CHUNK_BYTES (digits, candidate fields, reasons, one stage-4 page per device)
         + layouts x LAYOUT_BYTES x (devices + LAYOUT_COPIES) (the best-per-layout table: score + digits,
           one per device, the host copies, the devices' merge and the shortlist's sort; each chunk
           only works on a window of it, `Grid.layout_window`)

The effective chunk is the one `stream` uses: at least one whole run of the DP axis per device. On an
accelerator the chunk lives in the device's memory, so only the rest counts against the host's.
Time is the grid at a conservative streaming rate plus a compilation allowance; while the sweep runs,
`jaxplan.deadline.Deadline` re-estimates from the measured rate and stops it once the projection exceeds the limit.
The constants are deliberately below the rates and above the memory bench/README.md measures, so a
refusal up front is never a sweep that would have fitted.
"""

from __future__ import annotations

import dataclasses

from jaxplan.buckets import bucket_size
from jaxplan.deadline import check_limit
from jaxplan.errors import PlanError, TimeLimitExceeded
from jaxplan.funnel.devices import local_sweep_devices
from jaxplan.grid import AXES, DP_AXIS, Grid

GIB = 1024**3
BASE_BYTES = int(0.75 * GIB)
CHUNK_BYTES = 2048  # per candidate of the effective chunk
LAYOUT_BYTES = 4 * (1 + len(AXES))  # float32 score + int32 digits per table entry
LAYOUT_COPIES = 6
CPU_CHUNK = 1 << 16  # XLA:CPU: 16,384 streams slower, 262,144 no faster (bench/README.md)
# On a GPU a chunk's time is launch overhead below about a million candidates: an H200 streams 3.3e7
# candidates/s at 65,536 and 6.3e8 at 4,194,304 (bench/README.md, "On a GPU").
ACCELERATOR_CHUNK = 1 << 22
CANDIDATES_PER_S = 2.0e6  # conservative streaming rate on 2 busy cores (measured: 2.8e6-5.7e6)
COMPILE_S = 20.0  # first chunk: compilation on a busy machine (measured: 4.5-14 s)


@dataclasses.dataclass(frozen=True)
class SweepEstimate:
    candidates: int
    layouts: int
    chunk_size: int  # effective, as streamed
    num_devices: int
    memory_bytes: int
    seconds: float

    def describe(self) -> str:
        return (
            f"{self.candidates:,} candidates ({self.layouts:,} layouts, chunks of {self.chunk_size:,}): "
            f"about {self.seconds:,.0f} s and {self.memory_bytes / GIB:,.1f} GiB"
        )


SMALL_CHUNK = 8192


def effective_chunk(grid: Grid, chunk_size: int, num_devices: int) -> int:
    """The chunk a streamed pass uses (the sweep's `stream`, the winner map's `stream_scenarios`): the
    requested size capped at the grid, rounded up so every device's share holds whole runs of the DP
    axis (the kernel factorises over DP). A grid smaller than the chunk takes a power of two of those
    runs, at least SMALL_CHUNK candidates, so that small grids of other sizes share the compiled kernel
    (the extra candidates are padding, a fraction of a millisecond)."""
    unit = num_devices * grid.sizes[DP_AXIS]
    runs = -(-min(chunk_size, max(grid.size, 1)) // unit)
    if grid.size < chunk_size:
        runs = min(max(bucket_size(runs, 1), -(-SMALL_CHUNK // unit)), -(-chunk_size // unit))
    return unit * runs


def default_chunk(platform: str | None = None, device_bytes: int | None = None) -> int:
    """Candidates per chunk when the caller names none: CPU_CHUNK on a CPU; on an accelerator
    ACCELERATOR_CHUNK, halved while its CHUNK_BYTES exceed a quarter of one device's memory
    (`device_bytes`, default: what JAX reports for the first device; unknown: not halved)."""
    if platform is None:
        device = local_sweep_devices()[0]
        platform = device.platform
        if device_bytes is None and platform != "cpu":
            try:
                device_bytes = (device.memory_stats() or {}).get("bytes_limit")
            except Exception:  # noqa: BLE001 - a backend without memory statistics: the size is unknown
                device_bytes = None
    if platform == "cpu":
        return CPU_CHUNK
    chunk = ACCELERATOR_CHUNK
    while device_bytes and chunk > CPU_CHUNK and chunk * CHUNK_BYTES > device_bytes / 4:
        chunk //= 2
    return chunk


def estimate_sweep(grid: Grid, chunk_size: int, num_devices: int | None = None, on_host: bool | None = None) -> SweepEstimate:
    """`num_devices`: the devices the chunks are sharded over, `on_host`: the chunk is in host memory
    (defaults: those of `devices.local_sweep_devices()`, and whether they are CPUs)."""
    if num_devices is None or on_host is None:
        devices = local_sweep_devices()
        num_devices = len(devices) if num_devices is None else num_devices
        on_host = devices[0].platform == "cpu" if on_host is None else on_host
    chunk = effective_chunk(grid, chunk_size, num_devices)
    layouts = grid.num_layouts
    memory = BASE_BYTES + chunk * CHUNK_BYTES * on_host + layouts * LAYOUT_BYTES * (num_devices + LAYOUT_COPIES)
    seconds = COMPILE_S + grid.size / CANDIDATES_PER_S
    return SweepEstimate(grid.size, layouts, chunk, num_devices, int(memory), seconds)


def _fixes(grid: Grid, estimate: SweepEstimate) -> str:
    fixes = ["a smaller --space (fewer axis values)"]
    if len(grid.gpus) > 1:
        fixes.append("fewer --gpus")
    return ", ".join(fixes)


def check_limits(grid: Grid, chunk_size: int, *, max_seconds: float | None = None, max_memory_bytes: float | None = None, num_devices: int | None = None) -> SweepEstimate:
    """The estimate; a one-line PlanError (estimates + fix) when it exceeds a limit (None = no limit)."""
    for name, value in (("--max-seconds", max_seconds), ("--max-memory-gib", max_memory_bytes)):
        check_limit(value, name)
    estimate = estimate_sweep(grid, chunk_size, num_devices)
    if max_memory_bytes is not None and estimate.memory_bytes > max_memory_bytes:
        chunk_fix = ""
        if estimate.chunk_size * CHUNK_BYTES > 0.25 * max_memory_bytes and estimate.chunk_size > grid.sizes[DP_AXIS] * estimate.num_devices:
            chunk_fix = "a smaller --chunk-size, "
        raise PlanError(
            f"refusing the sweep: {estimate.describe()}, above the memory limit of {max_memory_bytes / GIB:,.1f} GiB "
            f"(--max-memory-gib; default: the machine's available memory); use {chunk_fix}{_fixes(grid, estimate)}, "
            f"fewer TP/PP/DP values (the table keeps one entry per GPU x TP x PP x DP layout), or raise --max-memory-gib"
        )
    if max_seconds is not None and estimate.seconds > max_seconds:
        raise TimeLimitExceeded(
            f"refusing the sweep: {estimate.describe()} (at a conservative {CANDIDATES_PER_S:,.0f} candidates/s), "
            f"above --max-seconds = {max_seconds:g}; use {_fixes(grid, estimate)}, or raise --max-seconds"
        )
    return estimate
