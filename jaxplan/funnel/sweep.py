"""The host driver: stream the grid through `sweep_chunk`, then build stages 5 and 6.

Chunks are sharded across the local JAX devices along the candidate axis (all of
them, or on CPUs the first $JAXPLAN_SWEEP_DEVICES: see `devices.sweep_devices`).
Memory is bounded by the chunk and the tables, and a chunk's time by the chunk: it
touches only the window of layout rows its candidates can reach (`Grid.layout_window`),
not the whole table. Per-chunk reason histograms are summed on the host in int64
(exact for any grid size). With several JAX processes (jax.distributed.initialize),
process i of N streams chunks i, i + N, ... and `gather_hosts` gives every process
the combined tables and counts.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import itertools
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxplan import program_cache
from jaxplan.buckets import bucket_size, pad_rows
from jaxplan.errors import PlanError
from jaxplan.deadline import Deadline
from jaxplan.funnel import relax
from jaxplan.funnel.budget import check_limits, default_chunk, effective_chunk
from jaxplan.funnel.devices import local_sweep_devices
from jaxplan.funnel.chunk import FRONTIER_GPU_BINS, FRONTIER_TPOT_BINS, SweepContext, SweepState, chunk_kernel, chunk_model, evaluate_digits, evaluate_digits_ahead
from jaxplan.funnel.frontier import pareto_front
from jaxplan.funnel.reasons import FIX_WITHOUT_BUDGET, NUM_REASONS, Reason
from jaxplan.funnel.shortlist import shortlist
from jaxplan.funnel.tables import BestTable, empty_table, merge_tables
from jaxplan.grid import AXES, Grid
from jaxplan.layout_kind import kind_fields
from jaxplan.physics.params import efficiency_for, load_efficiency
from jaxplan.physics.shapes import hardware_table, model_shape
from jaxplan.physics.traffic import max_context_tokens, workload_params
from jaxplan.specs.gpu import GpuSpec
from jaxplan.specs.model import ModelSpec
from jaxplan.specs.space import SearchSpace
from jaxplan.specs.workload import Workload
from jaxplan.vllm_release import for_release, selected

# Rows the report rows' kernel (`evaluate_digits`) prices per call: reports are priced in blocks of
# this one shape (one program), small enough that a sweep's shortlist and frontier (tens to a few
# hundred rows) are not padded to thousands (the kernel runs at -O0: xla_options.ONE_SHOT_COMPILE).
REPORT_ROWS = 512
SHARED_TABLE_ROWS = 2048  # a small grid's layout table and window: 80 KiB, folded in microseconds
SHARED_TABLE_MAX_ROWS = 1 << 17  # 5 MiB
PAGES_PER_CHUNK = 4  # stages 3-4 run on survivors in pages of chunk / devices / 4
STAGE_NAMES = {1: "structure", 2: "memory", 3: "capacity", 4: "estimate", 5: "frontier", 6: "shortlist"}


@dataclasses.dataclass(frozen=True)
class StageCount:
    stage: int
    name: str
    admitted: int
    rejected: int
    reasons: dict[str, int]  # reason description -> count, largest first
    seconds: float | None = None


@dataclasses.dataclass
class SweepResult:
    grid: Grid
    model: ModelSpec
    workload: Workload
    context: SweepContext
    stages: list[StageCount]
    reason_counts: dict[Reason, int]
    shortlist: list[dict]  # rows, best first
    frontier: list[dict]  # Pareto-optimal rows
    compile_s: float
    run_s: float
    num_devices: int
    chunk_size: int
    budget_note: str = ""  # an empty sweep's: what it would take without the GPU budget (funnel.relax)
    budget_helps: bool | None = None  # whether lifting the budget admits a configuration (None: not known)
    # The chunk kernel's best-per-layout table on the host (score [N], digits [N, A]; N = grid.num_layouts),
    # which `size` and the split table are checked against (`layout_table`); None: streamed again when asked.
    layouts: BestTable | None = dataclasses.field(default=None, repr=False)

    @property
    def winner(self) -> dict | None:
        return self.shortlist[0] if self.shortlist else None

    def last_sieve(self) -> tuple[int, str, int, Reason, int] | None:
        """(stage, its name, candidates it received, its most common reason, that reason's count) of
        the last stage of 1-4 that rejected anything; None for an empty grid."""
        last = max((s for s in self.stages if s.stage <= 4 and s.rejected), key=lambda s: s.stage, default=None)
        if last is None:
            return None
        reason = max((r for r in self.reason_counts if r.stage == last.stage), key=lambda r: self.reason_counts[r])
        before = self.stages[last.stage - 2].admitted if last.stage > 1 else self.grid.size
        return last.stage, last.name, before, reason, self.reason_counts[reason]

    def furthest_reason(self, stage: int) -> Reason | None:
        """Of stage 4's reasons (its checks run in code order, each on the candidates that passed the
        ones before), the last that rejected anything: what the candidates that got furthest failed
        on. None for the other stages, whose reasons are not one sequence."""
        if stage != 4:
            return None
        return max((r for r, n in self.reason_counts.items() if r.stage == 4 and n), default=None)

    def empty_explanation(self) -> str:
        """Which sieve removed the last candidates and what to relax, what the candidates that got
        furthest failed on where that differs, and, where the GPU budget removed candidates, what
        lifting it would do (`budget_note`). Where it removed none, or lifting it admits nothing, the
        fixes do not send the user to raise it (`reasons.FIX_WITHOUT_BUDGET`)."""
        last = self.last_sieve()
        if last is None:
            return "the search space is empty"
        stage, name, before, reason, count = last
        budget_binds = self.reason_counts.get(Reason.GPU_BUDGET, 0) > 0 and self.budget_helps is not False
        fix_of = (lambda r: r.fix) if budget_binds else (lambda r: FIX_WITHOUT_BUDGET.get(r, r.fix))  # noqa: E731
        text = f"no configuration survived: stage {stage} ({name}) removed the last {before:,} candidates, mostly because {reason.description} ({count:,})"
        furthest = self.furthest_reason(stage)
        if furthest is not None and furthest != reason:
            text += f"; those that get furthest fail on {furthest.description} ({self.reason_counts[furthest]:,}). To relax: {fix_of(reason)}; for those: {fix_of(furthest)}."
        else:
            text += f". To relax: {fix_of(reason)}."
        return f"{text} {self.budget_note}" if self.budget_note else text


def build_context(grid: Grid, model: ModelSpec, workload: Workload, params_path: str | None = None, *, vllm_version: str | None = None,
                  **workload_overrides) -> SweepContext:
    """The sweep's arrays; every candidate is priced for one vLLM release (`vllm_release.selected`)."""
    space = grid.space
    names = [g.name for g in grid.gpus]
    efficiency = for_release(efficiency_for(names, params_path), selected(vllm_version), every=load_efficiency(params_path))
    num_gpus = len(grid.gpus)
    return SweepContext(
        axis_values=grid.kernel_axis_arrays(),
        sizes=jax.device_put(np.asarray(grid.sizes, np.int32)),
        model=model_shape(model),
        # Padded like the axes (the last GPU repeated; no digit reaches it): one program serves 1-8 GPU types.
        hardware=jax.device_put(pad_rows(hardware_table(grid.gpus, efficiency), num_gpus, bucket_size(num_gpus))),
        workload=workload_params(workload, **workload_overrides),
        gpu_budget=jnp.float32(space.gpu_budget),
        allow_multi_node=jnp.bool_(space.allow_multi_node),
        gpu_memory_utilization=jnp.float32(space.gpu_memory_utilization),
        block_size_tokens=jnp.float32(space.block_size_tokens),
    )


def check_inputs(model: ModelSpec, workload: Workload, space=None) -> None:
    if space is not None and not space.enable_prefix_caching and workload.prefix_hit_rate > 0:
        raise PlanError(
            f"workload {workload.name!r}: prefix_hit_rate = {workload.prefix_hit_rate:g} needs vLLM's prefix cache, which space "
            f"{space.name!r} turns off (enable_prefix_caching = false); set the workload's prefix_hit_rate = 0 or the space's enable_prefix_caching = true"
        )
    longest = float(max_context_tokens(workload_params(workload)))
    if longest > model.max_position_embeddings:
        raise PlanError(
            f"workload {workload.name!r}: p99 request length {longest:,.0f} tokens exceeds {model.name}'s "
            f"max_position_embeddings = {model.max_position_embeddings:,}; shorten isl/osl or pick a longer-context model"
        )


def stage_table(grid: Grid, counts: dict[Reason, int], frontier_size: int, shortlist_size: int) -> list[StageCount]:
    stages, admitted = [], grid.size
    for stage in (1, 2, 3, 4):
        reasons = {r: n for r, n in counts.items() if r.stage == stage and n}
        rejected = sum(reasons.values())
        admitted -= rejected
        named = {r.description: n for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])}
        stages.append(StageCount(stage, STAGE_NAMES[stage], admitted, rejected, named))
    stages.append(StageCount(5, STAGE_NAMES[5], frontier_size, admitted - frontier_size, {"dominated (Pareto: throughput/GPU, p99 TPOT, GPUs)": admitted - frontier_size}))
    stages.append(StageCount(6, STAGE_NAMES[6], shortlist_size, admitted - shortlist_size, {"not the best of its (GPU, TP, PP, DP) layout or below the top K": admitted - shortlist_size}))
    return stages


def device_mesh() -> Mesh:
    """A 1-D mesh over `devices.local_sweep_devices()`."""
    return Mesh(np.array(local_sweep_devices()), ("candidates",))


@dataclasses.dataclass
class StreamedPart:
    """What one host's share of the grid produced (numpy, ready to combine with other hosts')."""

    totals: np.ndarray  # [NUM_REASONS] int64 reason histogram
    state: SweepState  # merged over this host's devices
    compile_s: float
    run_s: float
    num_devices: int
    chunk_size: int


def stream(grid: Grid, ctx: SweepContext, chunk_size: int, part: tuple[int, int] = (0, 1), progress=None, while_compiling: Callable[[], None] | None = None) -> StreamedPart:
    """Stream chunks part[0], part[0] + part[1], ... of the grid through stages 1-4 on the local devices.

    while_compiling: called once the chunk kernel is traced and lowered, before it compiles (to start
    background compilations that should not trace beside it: `CachedProgram.prepare`)."""
    mesh = device_mesh()
    num_devices = mesh.devices.size
    # Every device's share must hold whole runs of the DP axis (the funnel factorises over DP).
    chunk_size = effective_chunk(grid, chunk_size, num_devices)
    sharding = NamedSharding(mesh, PartitionSpec("candidates"))
    offsets = jax.device_put(np.arange(chunk_size, dtype=np.int32), sharding)
    num_axes = len(AXES)
    arrays, static_model = chunk_model(ctx, grid.size)
    table_rows, window_rows = table_shape(grid, chunk_size // num_devices, shared=static_model is None)
    one = SweepState(empty_table(table_rows, num_axes), empty_table(FRONTIER_GPU_BINS * FRONTIER_TPOT_BINS, num_axes))
    state = jax.device_put(jax.tree.map(lambda x: np.stack([np.asarray(x)] * num_devices), one), sharding)
    page_size = max(chunk_size // num_devices // PAGES_PER_CHUNK, 256)
    kernel = chunk_kernel(grid.size)

    def run_chunk(state, start):
        return kernel(
            state, arrays, np.asarray(grid.digits_of(start), np.int32), offsets, model=static_model, mesh=mesh, page_size=page_size, window_rows=window_rows
        )

    # sweep_chunk is jitted with the mesh, page size and window (and on large grids the model) static: a
    # second sweep with the same shapes reuses the compiled kernel.
    index, count = part
    starts = range(index * chunk_size, grid.size, count * chunk_size)
    if while_compiling is not None:
        if len(starts):
            program_cache.prepare(kernel, state, arrays, np.asarray(grid.digits_of(starts[0]), np.int32), offsets, model=static_model, mesh=mesh, page_size=page_size, window_rows=window_rows)
        while_compiling()
    state, histograms, compile_s, t0 = drive_chunks(run_chunk, state, starts, chunk_size, grid.size, progress)
    totals = np.zeros(NUM_REASONS, np.int64)
    for counts in jax.device_get(histograms):
        totals += counts.sum(axis=0)
    merged = merge_devices(state, num_devices)
    merged = merged._replace(layouts=BestTable(*(x[: grid.num_layouts] for x in merged.layouts)))  # the padding rows stay empty
    run_s = time.perf_counter() - t0
    return StreamedPart(totals, merged, compile_s, run_s, num_devices, chunk_size)


def table_shape(grid: Grid, run: int, *, shared: bool) -> tuple[int, int]:
    """(rows of the layout table the chunk kernel carries, rows of it one device's `run` of candidates
    touches: `Grid.layout_window`). Where the kernel is `shared` across models (the model traced), both
    are padded to `bucket_size`, at least SHARED_TABLE_ROWS, so that grids of other lengths share the
    program too: the table as if the GPU axis had its padded length (`build_context`), so that 1-8 GPU
    types share it, up to SHARED_TABLE_MAX_ROWS. A large grid, whose kernel is its model's own, keeps its
    exact table (it grows with the DP range)."""
    rows, window = grid.num_layouts, grid.layout_window(run)
    if not shared:
        return rows, window
    num_gpus = len(grid.gpus)
    as_padded = rows // num_gpus * bucket_size(num_gpus)
    rows = bucket_size(as_padded if as_padded <= SHARED_TABLE_MAX_ROWS else rows, SHARED_TABLE_ROWS)
    return rows, min(bucket_size(window, SHARED_TABLE_ROWS), rows)


def drive_chunks(run, state, starts, chunk_size: int, grid_size: int, progress=None):
    """Fold `run(state, start) -> (state, counts)` over the chunks beginning at `starts`, reporting
    `progress(done, total)` after each. The first chunk runs alone and is waited for, so its time is the
    compilation's (compile + one chunk). Returns (state, [counts per chunk], compile_s, the
    perf_counter at which the remaining chunks began: the caller's run time starts there)."""
    t0 = time.perf_counter()
    outputs = []
    if len(starts):
        state, counts = run(state, starts[0])
        jax.block_until_ready(counts)
        outputs.append(counts)
        if progress:
            progress(min(starts[0] + chunk_size, grid_size), grid_size)
    compile_s = time.perf_counter() - t0
    started = time.perf_counter()
    for start in starts[1:]:
        state, counts = run(state, start)
        outputs.append(counts)
        if progress:
            progress(min(start + chunk_size, grid_size), grid_size)
    return state, outputs, compile_s, started


def combine(parts: list[StreamedPart]) -> StreamedPart:
    """Merge several hosts' parts (order-independent)."""
    first = parts[0]
    totals = sum((p.totals for p in parts[1:]), first.totals.copy())
    state = functools.reduce(lambda a, b: SweepState(merge_tables(a.layouts, b.layouts), merge_tables(a.frontier, b.frontier)), (p.state for p in parts))
    return dataclasses.replace(
        first, totals=totals, state=state, compile_s=max(p.compile_s for p in parts), run_s=max(p.run_s for p in parts),
        num_devices=sum(p.num_devices for p in parts),
    )


HOST_WAIT_S = 24 * 3600.0  # how long a host waits for the others' parts (a dead host fails sooner: JAX's heartbeat)
POLL_S = 0.2
ABANDON_KEY = "jaxplan/abandoned"  # a host that fails posts its reason here, so that the others stop waiting for it
_gather_rounds = itertools.count()  # every host runs the same sweeps in the same order, so the rounds agree


def gather_hosts(local: StreamedPart) -> StreamedPart:
    """With several JAX processes (jax.distributed.initialize), every host gets the combined result.

    The parts are small (the tables, a histogram, four numbers): each host posts its own to the
    coordinator's key-value store and reads the others'. Unlike a device all-gather, this needs no
    cross-process collectives and works when hosts have different numbers of devices (CPU hosts
    with different core counts). A host that failed (`abandon_hosts`) stops the wait with a PlanError."""
    hosts = jax.process_count()
    if hosts == 1:
        return local
    client, me = _coordinator(), jax.process_index()
    key = f"jaxplan/sweep/{next(_gather_rounds)}"
    client.key_value_set_bytes(f"{key}/{me}", part_bytes(local))
    posted = _wait_for_parts(client, key, hosts)
    client.wait_at_barrier(f"{key}/read", int(HOST_WAIT_S * 1000))  # everyone has read every part: each may delete its own
    client.key_value_delete(f"{key}/{me}")
    parts = [local if h == me else part_from_bytes(posted[h]) for h in range(hosts)]
    chunks = sorted({p.chunk_size for p in parts})
    if len(chunks) > 1:
        # Host h streams chunks h, h + hosts, ... of its own size: equal sizes are what make the shares disjoint.
        raise PlanError(
            f"the {hosts} hosts streamed chunks of different sizes ({', '.join(f'{c:,}' for c in chunks)} candidates) because "
            f"their sweep device counts differ ({', '.join(str(p.num_devices) for p in parts)}); give every host the same "
            f"$JAXPLAN_SWEEP_DEVICES"
        )
    return combine(parts)


def _coordinator():
    # The coordinator's client has no public accessor; it is the one jax.distributed.initialize made.
    from jax._src import distributed

    return distributed.global_state.client


def _wait_for_parts(client, key: str, hosts: int) -> dict[int, bytes]:
    """{host: part bytes} once every host posted under `key`; PlanError if one abandoned the sweep.
    Polls rather than blocks, so that an abandoning host is noticed while waiting."""
    deadline = time.monotonic() + HOST_WAIT_S
    while True:
        posted = {int(k.rsplit("/", 1)[-1]): v for k, v in client.key_value_dir_get_bytes(f"{key}/")}
        if len(posted) >= hosts:
            return posted
        abandoned = client.key_value_dir_get_bytes(f"{ABANDON_KEY}/")
        if abandoned:
            name, reason = abandoned[0]
            raise PlanError(f"host {name.rsplit('/', 1)[-1]} stopped ({reason.decode(errors='replace')}); see its output; this host stops too")
        if time.monotonic() > deadline:
            raise PlanError(f"waited {HOST_WAIT_S:,.0f} s for hosts {sorted(set(range(hosts)) - set(posted))} to finish their share; are they running?")
        time.sleep(POLL_S)


def abandon_hosts(reason: str) -> None:
    """Tell the other hosts this one will not post its part (it failed), so that they stop waiting.
    Nothing with one process."""
    if jax.process_count() == 1:
        return
    try:
        _coordinator().key_value_set_bytes(f"{ABANDON_KEY}/{jax.process_index()}", reason.encode(), allow_overwrite=True)
    except Exception:  # noqa: BLE001 - the coordinator itself may be gone; the failure being reported matters more
        pass


def part_bytes(part: StreamedPart) -> bytes:
    """A part as .npz bytes (exact: the int64 histogram stays int64)."""
    buffer = io.BytesIO()
    (layouts, frontier) = part.state
    np.savez(
        buffer, totals=np.asarray(part.totals, np.int64), layout_score=layouts.score, layout_digits=layouts.digits,
        frontier_score=frontier.score, frontier_digits=frontier.digits,
        numbers=np.array([part.compile_s, part.run_s, part.num_devices, part.chunk_size], np.float64),
    )
    return buffer.getvalue()


def part_from_bytes(data: bytes) -> StreamedPart:
    """The inverse of `part_bytes`."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        state = SweepState(BestTable(z["layout_score"], z["layout_digits"]), BestTable(z["frontier_score"], z["frontier_digits"]))
        compile_s, run_s, num_devices, chunk_size = z["numbers"].tolist()
        return StreamedPart(z["totals"], state, compile_s, run_s, int(num_devices), int(chunk_size))


def run_sweep(
    model: ModelSpec,
    gpus: tuple[GpuSpec, ...],
    workload: Workload,
    space: SearchSpace,
    *,
    top_k: int = 20,
    chunk_size: int | None = None,
    params_path: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_seconds: float | None = None,
    max_memory_bytes: float | None = None,
    vllm_version: str | None = None,
    explain_budget: bool = True,
) -> SweepResult:
    """Stages 1-6 over the whole grid; `progress(done, total)` is called per chunk of `chunk_size`
    candidates (default: `budget.default_chunk()`, 65,536 on a CPU, about 4 million on a GPU).

    Each JAX process (host) streams every process_count-th chunk on its local devices; the
    hosts' tables are then gathered and merged, so every host returns the same result. `vllm_version`:
    the release the candidates are priced for (default: $JAXPLAN_VLLM_VERSION, else the newest measured).
    A sweep whose estimated time or memory exceeds `max_seconds` / `max_memory_bytes` is refused
    before anything is allocated (PlanError); one that runs past `max_seconds` is stopped.
    `explain_budget`: where nothing survives and the GPU budget removed candidates, sweep the grid
    again without it for the explanation's `budget_note` (`funnel.relax`)."""
    started = time.perf_counter()
    check_inputs(model, workload, space)
    grid = Grid(gpus, space.for_model(model))
    grid_size_check(grid)
    chunk_size = default_chunk() if chunk_size is None else chunk_size
    check_limits(grid, chunk_size, max_seconds=max_seconds, max_memory_bytes=max_memory_bytes)
    if max_seconds is not None:
        progress = Deadline(max_seconds, progress)
    ctx = build_context(grid, model, workload, params_path, vllm_version=vllm_version)
    rows_ahead = lambda: evaluate_digits_ahead(ctx, REPORT_ROWS, len(AXES))  # noqa: E731 - stages 5-6's rows: compile while the chunks do
    try:
        part = stream(grid, ctx, chunk_size, (jax.process_index(), jax.process_count()), progress, while_compiling=rows_ahead)
    except Exception as error:
        abandon_hosts(f"{type(error).__name__}: {error}")
        raise
    result = finish(grid, model, workload, ctx, gather_hosts(part), top_k)
    if explain_budget and relax.applies(result):
        left = None if max_seconds is None else max_seconds - (time.perf_counter() - started)
        if left is None or left > 0:
            again = lambda relaxed: run_sweep(model, gpus, workload, relaxed, top_k=1, chunk_size=chunk_size, params_path=params_path, max_seconds=left,  # noqa: E731
                                              max_memory_bytes=max_memory_bytes, vllm_version=vllm_version, explain_budget=False)
            result.budget_note, result.budget_helps = relax.budget_note(again, space, space.gpu_budget)
    return result


def finish(grid: Grid, model: ModelSpec, workload: Workload, ctx: SweepContext, part: StreamedPart, top_k: int) -> SweepResult:
    """Stages 5 and 6 from the streamed tables, and the per-stage counts."""
    reason_counts = {Reason(i): int(n) for i, n in enumerate(part.totals) if Reason(i) != Reason.PADDING}
    t0 = time.perf_counter()
    front = pareto_front(grid, ctx, *part.state.frontier)
    t1 = time.perf_counter()
    layouts = BestTable(*jax.device_get(tuple(part.state.layouts)))  # kept on the host: the shortlist, `size` and the split table read it
    short = shortlist(grid, ctx, *layouts, top_k)
    t2 = time.perf_counter()
    stages = stage_table(grid, reason_counts, len(front), len(short))
    # Stages 1-4 run fused in one kernel per chunk: they share the streamed time.
    stages = [dataclasses.replace(stage, seconds=seconds) for stage, seconds in zip(stages, (part.run_s, None, None, None, t1 - t0, t2 - t1))]
    return SweepResult(grid, model, workload, ctx, stages, reason_counts, short, front, part.compile_s, part.run_s, part.num_devices, part.chunk_size, layouts=layouts)


def layout_table(result: SweepResult) -> BestTable:
    """The chunk kernel's best-per-layout table of a sweep: the one it kept, else the grid streamed
    again through stages 1-4 (same compiled kernel, same context: the same table), then kept."""
    if result.layouts is None:
        result.layouts = BestTable(*jax.device_get(tuple(stream(result.grid, result.context, result.chunk_size).state.layouts)))
    return result.layouts


def merge_devices(state: SweepState, num_devices: int) -> SweepState:
    """Fold the per-device tables [D, ...] into one (order-independent: ties go to the lower index)."""
    host = jax.device_get(state)
    layouts, frontier = BestTable(*(x[0] for x in host.layouts)), BestTable(*(x[0] for x in host.frontier))
    for d in range(1, num_devices):
        layouts = merge_tables(layouts, BestTable(*(x[d] for x in host.layouts)))
        frontier = merge_tables(frontier, BestTable(*(x[d] for x in host.frontier)))
    return SweepState(layouts, frontier)


def report_rows(num_rows: int) -> int:
    """Rows `rows_for` prices for `num_rows` candidates: whole blocks of REPORT_ROWS (at least one)."""
    return max(-(-num_rows // REPORT_ROWS), 1) * REPORT_ROWS


def evaluate_blocks(ctx: SweepContext, digits: np.ndarray, *, default_compile: bool = False):
    """`evaluate_digits` of candidates given by digits [K, A] (K >= 1), on the host: padded to
    `report_rows(K)` and priced in blocks of REPORT_ROWS (one program for every K), cut back to K.
    Workload fields with one value per row ([K], `winner_map.rows_under`) are padded with their last
    value and cut with the rows. default_compile: see `evaluate_digits`."""
    num, total = digits.shape[0], report_rows(digits.shape[0])
    padded = np.zeros((total, digits.shape[1]), np.int32)
    padded[:num] = digits
    per_row = lambda f: np.ndim(f) > 0 and np.shape(f)[0] == num  # noqa: E731
    # on the host: slicing or padding a device array would compile a program per shape
    workload = jax.tree.map(lambda f: np.asarray(pad_rows(np.asarray(f), num, total)) if per_row(f) else f, ctx.workload)

    def block(start: int):
        stop = start + REPORT_ROWS
        rows = jax.tree.map(lambda f, g: g[start:stop] if per_row(f) else g, ctx.workload, workload)
        return jax.device_get(evaluate_digits(ctx._replace(workload=rows), jnp.asarray(padded[start:stop]), default_compile=default_compile))

    blocks = [block(start) for start in range(0, total, REPORT_ROWS)]
    return jax.tree.map(lambda *parts: np.concatenate(parts)[:num], *blocks)


def rows_for(grid: Grid, ctx: SweepContext, digits: np.ndarray, *, default_compile: bool = False) -> list[dict]:
    """Readable rows (axis values + metrics) for candidates given by digits [K, A]."""
    if len(digits) == 0:
        return []
    ev = evaluate_blocks(ctx, np.asarray(digits, np.int32), default_compile=default_compile)
    rows = []
    is_moe = float(ctx.model.moe_layers) > 0
    for i, d in enumerate(digits):
        row = grid.describe(d)
        # The DP axis counts servers of a lock-step kind: the row's data_parallel_size counts replicas.
        kind = kind_fields(row.pop("layout_kind"), row.pop("data_parallel_size"), row["weight_dtype"], is_moe)
        row["data_parallel_size"] = kind.pop("data_parallel_size")
        e = ev.estimate
        row.update(
            num_gpus=int(ev.layout.num_gpus[i]),
            output_tokens_per_s=float(e.output_tokens_per_s[i]),
            output_tokens_per_s_per_gpu=float(e.output_tokens_per_s[i] / ev.layout.num_gpus[i]),
            requests_per_s=float(e.requests_per_s[i]),
            ttft_mean_s=float(e.ttft_mean_s[i]),
            ttft_p99_s=float(e.ttft_p99_s[i]),
            tpot_mean_s=float(e.tpot_mean_s[i]),
            tpot_p99_s=float(e.tpot_p99_s[i]),
            concurrency_per_replica=float(e.concurrency_per_replica[i]),
            max_concurrency_per_replica=float(e.max_concurrency_per_replica[i]),
            utilization=float(e.utilization[i]),
            bound=int(ev.bound[i]),
            kv_blocks_per_replica=int(ev.kv_blocks[i]),
            hourly_usd=float(ev.hourly_usd[i]),
            cost_per_million_output_tokens_usd=float(ev.cost_per_million_usd[i]),
            score=float(ev.score[i]),
            reason=int(ev.reason[i]),
            digits=[int(x) for x in d],
            **kind,
        )
        rows.append(row)
    return rows


# How far a report row's score (or throughput per GPU) may sit from the chunk kernel's for the same
# candidate: the two programs compute the same float32 physics (equal to the bit on the sweeps tried).
ROW_SCORE_RTOL = 1e-4


def checked_rows(grid: Grid, ctx: SweepContext, digits: np.ndarray, kernel_values: np.ndarray, *, key: str = "score", what: str = "shortlist") -> list[dict]:
    """`rows_for` the candidates [K, A] for which the chunk kernel's table holds `kernel_values` [K]
    of the rows' `key` (the shortlist's scores, the frontier's output tokens/s per GPU), checked
    against them: two programs compiled apart must agree on every row. Where the one-shot program
    (-O0, `xla_options.ONE_SHOT_COMPILE`) does not, the rows are priced again at XLA's defaults;
    where that does not either, the sweep stops rather than print numbers it cannot stand behind."""
    rows = rows_for(grid, ctx, digits)
    if agrees_with_kernel([r[key] for r in rows], kernel_values):
        return rows
    rows = rows_for(grid, ctx, digits, default_compile=True)
    if agrees_with_kernel([r[key] for r in rows], kernel_values):
        return rows
    raise kernel_disagreement(f"the {what}'s row", key, [r[key] for r in rows], kernel_values)


def agrees_with_kernel(values, kernel_values) -> bool:
    """Whether values [K] computed by the report rows' program agree with the chunk kernel's
    `kernel_values` [K] to ROW_SCORE_RTOL (-inf on both sides agrees)."""
    return bool(np.allclose(np.asarray(values, np.float64), np.asarray(kernel_values, np.float64), rtol=ROW_SCORE_RTOL, atol=0.0))


def kernel_disagreement(item: str, key: str, values, kernel_values) -> PlanError:
    """The one-line internal-check error for the item (e.g. "the shortlist's row") whose `key` sits
    furthest, relatively, from the chunk kernel's value."""
    mine, kernel = np.asarray(values, np.float64), np.asarray(kernel_values, np.float64)
    with np.errstate(invalid="ignore"):  # -inf on both sides agrees; inf - inf is never picked
        worst = int(np.argmax(np.where(mine == kernel, 0.0, np.abs(mine - kernel) / np.maximum(np.abs(kernel), 1e-30))))
    return PlanError(
        f"internal check: {item} {worst + 1} has {key} {mine[worst]:.6g} where the sweep's kernel has "
        f"{kernel[worst]:.6g} (the same physics, compiled twice); the numbers cannot be trusted: please report it with the command"
    )


def grid_size_check(grid: Grid) -> None:
    if grid.size == 0:
        raise PlanError("the search space is empty; every axis needs at least one value")
    if math.log10(max(grid.size, 1)) > 12:
        raise PlanError(f"the grid has {grid.size:.2e} candidates (more than 1e12); narrow the space's axes")
