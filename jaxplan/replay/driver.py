"""Host driver: vmap the lane scheduler over every replica of every finalist.

The routing policy (`routing.RoutingPolicy`, looked up once by name) supplies
every function that depends on how requests reach replicas; the driver calls
only those. One `lax.while_loop` advances all lanes together (one lane per
finalist, its replicas replayed one after the other under round-robin routing,
roundrobin.py, or all together in time order under least-loaded routing,
balance.py) until every lane is done; a lane that is done stops changing. Round robin with a work estimate (`replica_steps_hint`)
or `max_replicas_per_lane`: a finalist's replicas may be spread over several
lanes, each a contiguous range of them (`LaneSplit`, chosen on the host by
`choose_split`; lane counts padded to F or a power of two), so that the loop,
which runs as long as the busiest lane, is shorter; `_finish` merges the lanes
back into one trace per finalist, the same bit for bit. The loop runs at most `chunk` iterations per call; the
host calls it again on the returned state (same shapes, same compiled program)
until all lanes finish or `max_iterations` is spent, in which case the
unfinished requests are reported. With a `progress(done, total)` callback (in
output tokens; e.g. a `jaxplan.deadline.Deadline`), calls are kept short instead
(PROGRESS_FIRST_ITERATIONS, doubled while a call takes under PROGRESS_CALL_S)
and the callback hears after each one; the replay is the same either way.
Slot rows (requests in flight per replica) are a fixed capacity too: a lane
that needs more stops before that step, and the host widens every lane's
tables (one more compile) and resumes where it stopped.
Before allocating, the replay's memory is estimated from its array shapes
(memory.py): finalists too many for the limit run in chunks, and a request
count that does not fit even for one finalist is refused (PlanError).
With several local devices (the CLI makes one XLA CPU device per core, see
jaxplan/cpu_devices.py), the lanes are sharded over them and each device runs
its own loop on its share (`shard_map`; round robin pads the lane count to a
multiple of the devices with empty lanes, the one-lane-a-finalist policies with
copies of the last finalist, dropped after): lanes are independent, so this is the same replay,
except that each device's program may round the step times' last bits
differently.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxplan import compile_ahead, program_cache
from jaxplan.buckets import bucket_size
from jaxplan.errors import bad_value
from jaxplan.replay import memory
from jaxplan.replay.config import ReplayConfig
from jaxplan.replay.metrics import ReplayMetrics, summarize
from jaxplan.replay.routing import RoutingPolicy, call_policy, routing_policy
from jaxplan.replay.scheduler import LaneInput
from jaxplan.replay.split import LANE_OVERHEAD as LANE_OVERHEAD
from jaxplan.replay.split import LaneSplit as LaneSplit
from jaxplan.replay.split import choose_split as choose_split
from jaxplan.replay.split import lane_count_bucket as lane_count_bucket
from jaxplan.replay.split import lane_split as lane_split
from jaxplan.replay.split import split_sizes as split_sizes
from jaxplan.replay.state import LaneState, stream_rows
from jaxplan.replay.traffic import Requests, pad_requests, request_bucket
from jaxplan.specs.workload import Arrival, Workload
from jaxplan.xla_options import LEAN_ONE_SHOT_COMPILE

DEFAULT_WINDOW = 128
INITIAL_SLOTS = 32  # slot rows per lane to start with
PROGRESS_FIRST_ITERATIONS = 256  # with a progress callback: loop iterations of the first call
PROGRESS_CALL_S = 0.5  # ... doubled while a call takes less than this


class ReplayTrace(NamedTuple):
    """Raw replay results. Per request [F, R]; per replica [F, D]; steps count per replica from 0."""

    first_token_step: jnp.ndarray  # [F, R] int32 step (of its replica) whose end gave the first token; -1 none
    finish_step: jnp.ndarray  # [F, R] int32 step that gave the last token; -1 unfinished
    preemptions: jnp.ndarray  # [F, R] int32 times the request was preempted
    arrival_s: jnp.ndarray  # [F, R] float32 s (inf: never submitted)
    admit_s: jnp.ndarray  # [F, R] float32 s of the first admission (nan: never)
    ttft_s: jnp.ndarray  # [F, R] float32 s arrival -> first token (nan: none)
    e2e_s: jnp.ndarray  # [F, R] float32 s arrival -> last token (nan: unfinished)
    replica: jnp.ndarray  # [F, R] int32 replica the request was routed to
    prompt_tokens: jnp.ndarray  # [R] int32
    output_tokens: jnp.ndarray  # [R] int32
    replica_active: jnp.ndarray  # [F, D] bool (d < routed replicas)
    replica_steps: jnp.ndarray  # [F, D] int32 steps executed
    replica_iterations: jnp.ndarray  # [F, D] int32 loop iterations (a jump counts once)
    replica_clock_s: jnp.ndarray  # [F, D] float32 s when its last step ended
    replica_preemptions: jnp.ndarray  # [F, D] int32
    replica_tokens_out: jnp.ndarray  # [F, D] int32 output tokens produced
    replica_peak_kv_blocks: jnp.ndarray  # [F, D] int32 most KV blocks in use in one step
    replica_stalled: jnp.ndarray  # [F, D] bool: a request could never fit; replica stopped
    replica_done: jnp.ndarray  # [F, D] bool: finished (or stalled) within max_iterations
    replica_overflow: jnp.ndarray  # [F, D] bool: ran out of slot rows (only if the caller fixed num_slots)
    replica_batch_sum: jnp.ndarray  # [F, D] float32 sum over steps of scheduled requests
    replica_kv_sum: jnp.ndarray  # [F, D] float32 sum over steps of KV blocks in use
    num_kv_blocks: jnp.ndarray  # [F] int32
    itl_hist: jnp.ndarray  # [F, ITL_BINS] int32 inter-token gaps (all replicas)


def lane_devices() -> int:
    """Local devices the lanes are sharded over (1: no sharding)."""
    return jax.local_device_count()


def _lane_mesh(num_lanes: int, devices: int) -> Mesh | None:
    """A 1-D mesh over the first `devices` local devices when the lanes split evenly over more than one."""
    if devices <= 1 or num_lanes % devices:
        return None
    return Mesh(np.array(jax.local_devices()[:devices]), ("lanes",))


# Loop iterations per request of one replica: 8 x (requests in flight)^(-1/3) x (1 + OSL / window)^(1/4).
# Iterations end at events (an admission, the chunk that completes a prompt, a finish, an arrival
# while the step's budget has room, the window), which the requests in flight share; fitted on
# sweep finalists of the bundled workloads (bench/README.md). Only the split over lanes uses it, so
# its error moves work between lanes, never a result.
ITERATIONS_PER_REQUEST = 8.0
CONCURRENCY_EXPONENT = -1.0 / 3.0
DECODE_EXPONENT = 0.25


def replica_work(requests: Requests, dp, window: int, steps_hint=None, concurrency_hint=None) -> np.ndarray:
    """Estimated loop iterations of one replica of each finalist [F] (host, for choose_split).

    Its requests times ITERATIONS_PER_REQUEST x in-flight^CONCURRENCY_EXPONENT x
    (1 + mean OSL / window)^DECODE_EXPONENT, with `concurrency_hint` [F] the requests in flight per
    replica (e.g. stage 4's; 1 where unknown); at most its scheduler steps, `steps_hint` [F]
    (e.g. the traffic's duration over stage 4's mean step time; inf or nan: unknown).
    """
    osl = np.asarray(requests.output_tokens, np.float64)
    per_replica = np.ceil(osl.shape[0] / np.maximum(np.asarray(dp, np.float64), 1))
    conc = np.ones_like(per_replica) if concurrency_hint is None else np.broadcast_to(np.asarray(concurrency_hint, np.float64), per_replica.shape)
    conc = np.where(np.isfinite(conc) & (conc >= 1), conc, 1.0)
    events = per_replica * ITERATIONS_PER_REQUEST * conc**CONCURRENCY_EXPONENT * (1 + np.mean(osl) / window) ** DECODE_EXPONENT
    if steps_hint is None:
        return events
    hint = np.broadcast_to(np.asarray(steps_hint, np.float64), events.shape)
    return np.where(np.isfinite(hint) & (hint > 0), np.minimum(events, hint), events)


def _on_lanes(tree, mesh: Mesh | None):
    """`tree` (arrays with a leading lane axis) laid out over the mesh's lanes, inside a jit (one
    program for every array, not a transfer program each)."""
    if mesh is None:
        return tree
    lanes = NamedSharding(mesh, P("lanes"))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, lanes), tree)


@program_cache.jit(options=LEAN_ONE_SHOT_COMPILE, static_argnames=("num_slots", "max_dp", "policy"))
def _start_lanes(requests: Requests, num_requests, config: ReplayConfig, closed_concurrency, split: LaneSplit, *, num_slots: int, max_dp: int, policy: RoutingPolicy):
    """Lane inputs and states [L], and each request's stream position [F, R] (its finalist's
    stream), on one device. `requests` [R] are padded; the first `num_requests` are real."""
    lanes, state, position = policy.start(requests, num_requests, config, closed_concurrency, split, max_dp=max_dp, num_slots=num_slots)
    inputs = LaneInput(
        jax.vmap(lambda s: stream_rows(s, num_slots))(lanes.stream),
        lanes.seg_start,
        lanes.seg_count,
        lanes.seg_initial,
        lanes.num_replicas,
        lanes.closed,
        lanes.max_num_seqs,
        lanes.budget,
        lanes.step_budget,
        lanes.num_kv_blocks,
        lanes.num_requests,
        jnp.full(lanes.closed.shape, config.prefix_caching),
    )
    return inputs, state, position


def _start(requests: Requests, num_requests, config: ReplayConfig, closed_concurrency, split: LaneSplit, *, num_slots: int, max_dp: int, policy: RoutingPolicy, mesh: Mesh | None = None):
    """`_start_lanes`, its lane inputs and states then laid out over the mesh's lanes.

    The program runs on one device, whatever devices the lanes use, so that it is stored and a warm
    run loads it (`program_cache`) like the loop; the tables, a few MB, are then placed from the
    host in one transfer."""
    inputs, state, position = _start_lanes(requests, num_requests, config, closed_concurrency, split, num_slots=num_slots, max_dp=max_dp, policy=policy)
    if mesh is None:
        return inputs, state, position
    return *jax.device_put(jax.device_get((inputs, state)), NamedSharding(mesh, P("lanes"))), position


def _lanes_done(state, inputs: LaneInput, policy: RoutingPolicy):
    """[L] bool: every lane that is done."""
    return jax.vmap(policy.done)(state, inputs)


def _loop(inputs: LaneInput, state, step_params, max_iterations, grow, *, step_time_fn, window: int, block_size: int, policy: RoutingPolicy):
    """Up to `max_iterations` iterations of every lane; stops early when all are done,
    or (if `grow`) as soon as a lane is out of slot rows (it is frozen before that step).
    Returns (state, iterations run)."""
    step = jax.vmap(functools.partial(policy.step, step_time_fn=step_time_fn, window=window, block_size=block_size), in_axes=(0, 0, 0, None))

    def cond(carry):
        st, it = carry
        return (it < max_iterations) & ~jnp.all(_lanes_done(st, inputs, policy)) & ~(grow & jnp.any(policy.lane_state(st).overflow))

    def body(carry):
        st, it = carry
        return step(st, inputs, step_params, grow), it + 1

    return jax.lax.while_loop(cond, body, (state, jnp.zeros((), jnp.int32)))


@program_cache.jit(static_argnames=("step_time_fn", "window", "block_size", "policy", "mesh"), donate_argnames=("state",))
def _advance(inputs: LaneInput, state, step_params, max_iterations, grow, *, step_time_fn, window: int, block_size: int, policy: RoutingPolicy, mesh: Mesh | None = None):
    """`_loop` over every lane; with a mesh, each device loops over its share of the lanes on its
    own (no synchronisation per iteration). Returns (state, iterations run, every lane done, a lane
    out of slot rows), the last three [devices] (one value per device; [1] without a mesh), which the
    host combines (`_host_flags`).

    Nothing here makes the devices meet after their loops: a reduction across devices would make
    the device whose lanes finish first wait for the others inside XLA, and XLA:CPU aborts the
    process when a collective waits more than 40 s (a long replay whose lanes are uneven)."""
    loop = functools.partial(_loop, step_time_fn=step_time_fn, window=window, block_size=block_size, policy=policy)

    def local(inputs, state, step_params, max_iterations, grow):
        state, ran = loop(inputs, state, step_params, max_iterations, grow)
        done, overflow = jnp.all(_lanes_done(state, inputs, policy)), jnp.any(policy.lane_state(state).overflow)
        return state, ran[None], done[None], overflow[None]

    if mesh is None:
        return local(inputs, state, step_params, max_iterations, grow)
    lanes = P("lanes")
    sharded = jax.shard_map(local, mesh=mesh, in_specs=(lanes, lanes, lanes, P(), P()), out_specs=(lanes,) * 4, check_vma=False)
    return sharded(inputs, state, step_params, max_iterations, grow)


def _host_flags(ran, done, overflow) -> tuple[int, bool, bool]:
    """`_advance`'s per-device results on the host: (the most iterations any device ran, every lane
    done, a lane out of slot rows)."""
    ran, done, overflow = jax.device_get((ran, done, overflow))
    return int(np.max(ran)), bool(np.all(done)), bool(np.any(overflow))


@functools.partial(jax.jit, static_argnames=("policy",))
def _demand(inputs: LaneInput, state, *, policy: RoutingPolicy):
    """Most requests one replica of each lane wants in flight now: running, preempted, arrived and waiting. [L]."""
    return jax.vmap(policy.demand)(state, inputs)


@functools.partial(jax.jit, static_argnames=("num_slots", "policy", "mesh"))
def _grow(inputs: LaneInput, state, *, num_slots: int, policy: RoutingPolicy, mesh: Mesh | None = None):
    """The same lanes with `num_slots` slot rows (more than before); resumes exactly."""
    extra = num_slots - policy.lane_state(state).run_i.shape[-2]
    return _on_lanes(policy.widen(inputs, state, extra), mesh)


@program_cache.jit(options=LEAN_ONE_SHOT_COMPILE, static_argnames=("policy",))
def _finish(requests: Requests, inputs: LaneInput, state, position, split: LaneSplit, dp, *, policy: RoutingPolicy) -> ReplayTrace:
    """The trace [F, ...] of lanes [L], merged back to one per finalist by the policy. Called with
    the lanes' tables fetched to the host: one program on one device, whatever the lanes ran on, that
    a warm run loads (`program_cache`)."""
    merged = policy.merge(inputs, state, position, split, dp, _lanes_done(state, inputs, policy))
    return _trace(requests, *merged[:2], position, *merged[2:])


def _trace(requests: Requests, inputs: LaneInput, state: LaneState, position, rec_i, rec_f, replica, replica_done) -> ReplayTrace:
    num_r = requests.prompt_tokens.shape[0]
    num_d = state.rep_steps.shape[1]
    num_s = state.run_i.shape[-2]
    dp = inputs.num_replicas
    take = lambda x: jnp.take_along_axis(x, position, axis=1)
    gi = jnp.stack([take(rec_i[:, c]) for c in range(3)], -1)  # [F, R, 3] by request
    gf = jnp.stack([take(rec_f[:, c]) for c in range(3)], -1)
    return ReplayTrace(
        first_token_step=gi[..., 0],
        finish_step=gi[..., 1],
        preemptions=gi[..., 2],
        arrival_s=take(state.arrival[:, num_s : num_s + num_r]),
        admit_s=gf[..., 2],
        ttft_s=gf[..., 0],
        e2e_s=gf[..., 1],
        replica=replica,
        prompt_tokens=jnp.asarray(requests.prompt_tokens, jnp.int32),
        output_tokens=jnp.asarray(requests.output_tokens, jnp.int32),
        replica_active=jnp.arange(num_d)[None, :] < dp[:, None],
        replica_steps=state.rep_steps,
        replica_iterations=state.rep_iterations,
        replica_clock_s=state.rep_clock,
        replica_preemptions=state.rep_preemptions,
        replica_tokens_out=state.rep_tokens_out,
        replica_peak_kv_blocks=state.rep_peak_kv,
        replica_stalled=state.rep_stalled,
        replica_done=replica_done,
        replica_overflow=state.overflow[:, None] & (jnp.arange(num_d)[None, :] < dp[:, None]),
        replica_batch_sum=state.rep_batch.sum(-1),
        replica_kv_sum=state.rep_kv.sum(-1),
        num_kv_blocks=inputs.num_kv_blocks,
        itl_hist=state.itl_hist,
    )


def _checked(requests: Requests, closed: int) -> Requests:
    """Requests as device arrays, after host-side checks of what the replay assumes."""
    prompt, osl, hit, arrival = (np.asarray(x) for x in requests)
    if not (prompt.ndim == 1 and prompt.shape == osl.shape == hit.shape == arrival.shape and prompt.size >= 1):
        raise bad_value("requests", [x.shape for x in (prompt, osl, hit, arrival)], "need four 1-D arrays of one length R >= 1")
    if prompt.min() < 1 or osl.min() < 1 or hit.min() < 0 or max(prompt.max(), osl.max()) > 2**26:
        raise bad_value("requests", (int(prompt.min()), int(osl.min()), int(hit.min())), "prompt and output tokens must be in 1..2**26, prefix hits >= 0")
    starts = arrival[:closed] if closed else arrival  # closed loop: the clients' start times
    if not np.all(np.isfinite(starts)) or starts.min() < 0 or np.any(np.diff(starts) < 0):
        raise bad_value("requests.arrival_s", starts[:4].tolist(), "must be finite, >= 0 seconds and nondecreasing")
    return Requests(prompt.astype(np.int32), osl.astype(np.int32), hit.astype(np.int32), arrival.astype(np.float32))


def _padded(requests: Requests) -> Requests:
    """The request set padded to its bucket (`request_bucket`), as device arrays: replays of
    nearby request counts share their compiled programs."""
    return Requests(*(jnp.asarray(x) for x in pad_requests(requests, request_bucket(requests.num_requests))))


# ReplayTrace fields with a request axis (last), cut back to the real requests after a padded replay
_PER_REQUEST = ("first_token_step", "finish_step", "preemptions", "arrival_s", "admit_s", "ttft_s", "e2e_s", "replica", "prompt_tokens", "output_tokens")


def _real_requests(trace: ReplayTrace, num_r: int) -> ReplayTrace:
    """The trace on the host (NumPy: a slice of a device array would compile a program per shape)
    with its request axis cut back to the `num_r` real requests."""
    trace = jax.device_get(trace)
    return trace._replace(**{name: getattr(trace, name)[..., :num_r] for name in _PER_REQUEST})


def _bucket(value: int) -> int:
    return bucket_size(value, 1)


# Slot rows past this many grow in steps of it rather than doubling: an iteration's fixed cost is
# small against its per-row cost, so max_num_seqs 192 runs on 192 rows, not 256.
# Each width is one more program, compiled once per shape.
SLOT_STEP = 64


def slot_rows(value: int) -> int:
    """Slot rows for `value` requests in flight: a power of two up to SLOT_STEP, then a multiple of it."""
    return _bucket(value) if value <= SLOT_STEP else SLOT_STEP * math.ceil(value / SLOT_STEP)


def closed_concurrency(workload: Workload) -> int:
    return int(workload.concurrency) if workload.arrival == Arrival.CLOSED else 0


def simulate_trace(
    configs: ReplayConfig,
    requests: Requests,
    workload: Workload,
    step_time_fn: Callable,
    step_params,
    *,
    window: int = DEFAULT_WINDOW,
    max_iterations: int = 50_000_000,
    chunk: int = 1 << 20,
    num_slots: int | None = None,
    max_replicas: int | None = None,
    routing: str | None = None,
    memory_limit_bytes: int | None = None,
    replica_steps_hint=None,
    replica_concurrency_hint=None,
    max_replicas_per_lane: int | None = None,
    initial_slots: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayTrace:
    """Replay `requests` on every finalist; raw per-request and per-replica results.

    configs: ReplayConfig with arrays [F]. requests: one Requests set [R] for all.
    workload: its arrival kind (closed loop uses `concurrency`).
    step_time_fn(params, StepBatch) -> seconds (float32 scalar), with params one
        finalist's slice of `step_params`; it must be a hashable, reused function
        (it is a static argument: a new lambda per call recompiles).
    step_params: PyTree of arrays with leading axis [F].
    window: most steps one jump may cover (1 = step by step).
    max_iterations: loop iterations before giving up (unfinished requests are reported).
    num_slots: rows for requests in flight per replica (static). Default: start at
        min(32, max_num_seqs) and, when a replica needs more, resume with enough for
        every request then in flight or waiting (at least twice as many).
        A fixed value is never exceeded: replicas that would need more are flagged
        in `replica_overflow` (their results are then not exact).
    max_replicas: padded replica count (static); default max(data_parallel_size)
        rounded up to a power of two, so that nearby configs share one program.
    routing: a routing policy's name (`routing.POLICIES`: "round_robin", "least_loaded" or
        "dp_coordinator", which alone runs lock-step groups and calls
        step_time_fn(params, batch, group_batch_tokens)); default `configs.routing`.
    memory_limit_bytes: most bytes the replay may use; default MEMORY_FRACTION of the
        machine's available memory. Finalists run in chunks that fit; a request
        count that does not fit for one finalist is a PlanError.
    replica_steps_hint: [F] estimated scheduler steps of one replica (e.g. the traffic's duration
        over stage 4's mean step time; inf: unknown). Round robin only: with it, a finalist's
        replicas may be spread over several lanes (`choose_split`) so that the loop, which runs as
        long as the busiest lane, is shorter. Results are the same, bit for bit, with or without.
    replica_concurrency_hint: [F] estimated requests in flight per replica (e.g. stage 4's); it
        refines the work estimate behind the split (`replica_work`). Results do not depend on it.
    max_replicas_per_lane: round robin: spread every finalist's replicas over lanes of at most
        this many (overrides the hint). Without either, one lane per finalist.
    initial_slots: with num_slots None, the slot rows to start with instead of INITIAL_SLOTS
        (e.g. stage 4's estimate of the requests in flight per replica): each width the rows grow
        through is one more program to trace and compile. Results do not depend on it.
    progress: called as progress(output tokens produced, output tokens of the whole call) after
        every loop call, which are then short (see the module docstring); it may raise (e.g. a
        `jaxplan.deadline.Deadline` past its limit) to stop the replay. Results do not depend on it.
    """
    if not isinstance(configs, ReplayConfig):
        raise bad_value("configs", type(configs).__name__, "must be a ReplayConfig (use ReplayConfig.create)")
    policy = routing_policy(configs.routing if routing is None else routing)
    if policy.name != "dp_coordinator" and np.any(np.asarray(configs.lockstep_ranks) > 1):
        raise bad_value("routing", policy.name, "runs independent replicas; lock-step ranks (lockstep_ranks > 1) need routing 'dp_coordinator'")
    if not isinstance(window, int) or window < 1:
        raise bad_value("window", window, "must be an integer >= 1 steps")
    num_f = configs.num_finalists
    leaves = jax.tree.leaves(step_params)
    if any(np.shape(x)[:1] != (num_f,) for x in leaves):
        raise bad_value("step_params", [np.shape(x) for x in leaves][:4], f"every leaf needs a leading finalist axis of {num_f}")
    closed = closed_concurrency(workload)
    max_seqs = int(np.max(configs.max_num_seqs))
    dp_routed = policy.routed_replicas(configs.data_parallel_size, closed)
    max_dp = _bucket(int(dp_routed.max())) if max_replicas is None else max_replicas
    if max_dp < int(dp_routed.max()):
        raise bad_value("max_replicas", max_replicas, f"must cover data_parallel_size {int(dp_routed.max())}")
    policy = call_policy(policy, configs.lockstep_ranks, max_dp)  # lock-step: step one server's ranks, not the lane's
    if num_slots is not None and (not isinstance(num_slots, int) or num_slots < 1):
        raise bad_value("num_slots", num_slots, "must be an integer >= 1")
    if initial_slots is not None and (not isinstance(initial_slots, int) or isinstance(initial_slots, bool) or initial_slots < 1):
        raise bad_value("initial_slots", initial_slots, "must be an integer >= 1")
    if max_replicas_per_lane is not None and (not isinstance(max_replicas_per_lane, int) or isinstance(max_replicas_per_lane, bool) or max_replicas_per_lane < 1):
        raise bad_value("max_replicas_per_lane", max_replicas_per_lane, "must be an integer >= 1")
    for name, hint in (("replica_steps_hint", replica_steps_hint), ("replica_concurrency_hint", replica_concurrency_hint)):
        if hint is not None and np.shape(hint) not in ((), (num_f,)):
            raise bad_value(name, np.shape(hint), f"must be a number or an array [{num_f}]")
    reqs = _checked(requests, closed)
    num_r = requests_count(reqs)
    padded = _padded(reqs)
    devices = lane_devices()  # _lane_mesh shards only lane counts that split evenly over them
    if replica_steps_hint is None and max_replicas_per_lane is None:
        work, lanes_per_f = None, np.ones(num_f, np.int64)
    else:
        work = replica_work(requests, dp_routed, window, replica_steps_hint, replica_concurrency_hint) if max_replicas_per_lane is None else None
        lanes_per_f = policy.choose_split(dp_routed, work, max_replicas_per_lane=max_replicas_per_lane, devices=devices)
    num_lanes = policy.lane_count(int(lanes_per_f.sum()), num_f, devices)
    shape = memory.ReplayShape(
        num_f, num_r, max_dp, num_slots if num_slots is not None else slot_rows(min(max_seqs, num_r)), window, policy.name, num_lanes / num_f
    )  # fmt: skip
    per_call = memory.finalists_per_call(shape, memory_limit_bytes)
    tokens_per_finalist = int(np.sum(np.asarray(reqs.output_tokens, np.int64)))  # progress is counted in output tokens
    run = functools.partial(
        _replay, padded, num_r, workload, step_time_fn, closed=closed, window=window, max_iterations=max_iterations, chunk=chunk,
        num_slots=num_slots, max_dp=max_dp, policy=policy, devices=devices, initial_slots=initial_slots or INITIAL_SLOTS,
        tokens_per_finalist=tokens_per_finalist,
    )  # fmt: skip
    parts_total = -(-num_f // per_call) * per_call * tokens_per_finalist  # finalists padded to whole calls

    def part_progress(first: int):
        if progress is None:
            return None
        return lambda done, _total: progress(first * tokens_per_finalist + done, parts_total)

    spare = devices_padding(num_lanes, devices) if num_lanes == num_f and per_call >= num_f else 0
    if spare and memory.finalists_per_call(shape._replace(num_finalists=num_f + spare), memory_limit_bytes) >= num_f + spare:
        # One lane a finalist (least loaded, lock-step) in a count the devices do not divide would run
        # on one device: the last finalist repeated to fill them, and its copies dropped after.
        idx = np.minimum(np.arange(num_f + spare), num_f - 1)
        padded_progress = None if progress is None else (lambda done, _total: progress(done * num_f // (num_f + spare), parts_total))
        trace = run(_take_finalists(configs, idx), jax.tree.map(functools.partial(_rows, idx=idx), step_params),
                    lane_split(dp_routed[idx], lanes_per_f[idx], max_dp, num_lanes + spare), progress=padded_progress)  # fmt: skip
        return _first_finalists(trace, num_f)
    if per_call >= num_f:
        return run(configs, step_params, lane_split(dp_routed, lanes_per_f, max_dp, num_lanes), progress=part_progress(0))
    # Too many finalists at once for the memory limit: equal chunks (the last padded), one program;
    # each chunk's replicas are split again over a fixed number of lanes.
    chunk_lanes = memory.lanes_per_call(shape, per_call)
    parts = []
    for start in range(0, num_f, per_call):
        idx = np.minimum(np.arange(start, start + per_call), num_f - 1)
        sub_dp = dp_routed[idx]
        if chunk_lanes > per_call:
            k = policy.choose_split(sub_dp, None if work is None else work[idx], max_replicas_per_lane=max_replicas_per_lane, lanes=chunk_lanes)
        else:
            k = np.ones(per_call, np.int64)
        split = lane_split(sub_dp, k, max_dp, chunk_lanes)
        part = jax.device_get(run(_take_finalists(configs, idx), jax.tree.map(functools.partial(_rows, idx=idx), step_params), split, progress=part_progress(start)))
        keep = min(per_call, num_f - start)
        parts.append(_first_finalists(part, keep))
    return ReplayTrace(*(p[0] if name in SHARED_FIELDS else np.concatenate(p) for name, p in zip(ReplayTrace._fields, zip(*parts))))


def devices_padding(num_lanes: int, devices: int) -> int:
    """Lanes to add so that `devices` divide them (0 on one device): the driver shards only even splits."""
    return -num_lanes % devices if devices > 1 else 0


SHARED_FIELDS = ("prompt_tokens", "output_tokens")  # ReplayTrace fields [R] of the requests alone: the same for every finalist


def _first_finalists(trace: ReplayTrace, num: int) -> ReplayTrace:
    """A host trace cut back to its first `num` finalists (the rest padding copies)."""
    return trace._replace(**{name: getattr(trace, name)[:num] for name in ReplayTrace._fields if name not in SHARED_FIELDS})


def _rows(x, *, idx):
    return np.asarray(x)[idx]


def requests_count(requests: Requests) -> int:
    return int(np.shape(requests.prompt_tokens)[0])


def _take_finalists(configs: ReplayConfig, idx) -> ReplayConfig:
    fields = {name: np.asarray(getattr(configs, name))[idx] for name in ("max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "data_parallel_size", "pipeline_parallel_size", "lockstep_ranks")}
    return ReplayConfig(**fields, block_size=configs.block_size, routing=configs.routing, prefix_caching=configs.prefix_caching)


def _replay(reqs: Requests, num_r: int, workload, step_time_fn, configs: ReplayConfig, step_params, split: LaneSplit, *, closed, window, max_iterations, chunk, num_slots, max_dp, policy: RoutingPolicy, devices, initial_slots, tokens_per_finalist: int, progress=None) -> ReplayTrace:
    """One replay call over configs [F] on the lanes of `split` (see simulate_trace) of the first
    `num_r` of the padded requests `reqs` (the trace has those only), sharded over
    `devices` local devices when the lanes split evenly over them; `progress(done, total)` in output
    tokens (`tokens_per_finalist` each) after every loop call."""
    configs = ReplayConfig(
        configs.max_num_seqs, configs.max_num_batched_tokens, configs.num_kv_blocks, configs.data_parallel_size, configs.pipeline_parallel_size, configs.lockstep_ranks,
        block_size=configs.block_size, routing=policy.name, prefix_caching=configs.prefix_caching,
    )  # fmt: skip
    max_seqs = int(np.max(configs.max_num_seqs))
    slots = num_slots if num_slots is not None else min(slot_rows(max_seqs), slot_rows(initial_slots))
    finalist = np.asarray(split.finalist, np.int64)
    split = LaneSplit(*(np.asarray(x, np.int32) for x in split))
    closed_conc = np.int32(closed)
    mesh = _lane_mesh(int(split.finalist.shape[0]), devices)
    inputs, state, position = _start(reqs, np.int32(num_r), configs, closed_conc, split, num_slots=slots, max_dp=max_dp, policy=policy, mesh=mesh)
    # params per lane (the lane's finalist's), gathered on the host and sent to the lanes' devices
    step_params = jax.tree.map(lambda x: np.asarray(x)[finalist], jax.device_get(step_params))
    step_params = jax.device_put(step_params, None if mesh is None else NamedSharding(mesh, P("lanes")))
    dp = jnp.asarray(policy.routed_replicas(configs.data_parallel_size, closed), jnp.int32)
    loop_options = dict(step_time_fn=step_time_fn, window=window, block_size=configs.block_size, policy=policy, mesh=mesh)
    # While the loop compiles (its first call), the merge compiles on a worker thread: the loop's
    # state keeps its shapes, so the merge's arguments (the lanes' tables as fetched to the host)
    # are known now. The loop is traced first, alone (`CachedProgram.prepare`).
    program_cache.prepare(_advance, inputs, state, step_params, np.int32(1), np.bool_(False), **loop_options)
    compile_ahead.ahead("replay_finish", _finish, reqs, compile_ahead.on_host(inputs), compile_ahead.on_host(state), position, split, dp, policy=policy)
    used = 0
    total_tokens = configs.num_finalists * tokens_per_finalist
    per_call = chunk if progress is None else min(chunk, PROGRESS_FIRST_ITERATIONS)
    while used < max_iterations:
        grow = num_slots is None and slots < max_seqs
        budget = min(per_call, max_iterations - used)
        t0 = time.perf_counter()
        state, *flags = _advance(inputs, state, step_params, np.int32(budget), np.bool_(grow), **loop_options)
        ran, done, overflow = _host_flags(*flags)
        used += ran
        if progress is not None:
            produced = int(np.sum(np.asarray(policy.lane_state(state).rep_tokens_out, np.int64)))
            progress(total_tokens if bool(done) else min(produced, total_tokens - 1), total_tokens)
            if time.perf_counter() - t0 < PROGRESS_CALL_S:
                per_call = min(chunk, 2 * per_call)
        if bool(done):
            break
        if grow and bool(overflow):
            # more requests in flight than rows: resume where it stopped, with more rows
            slots = min(max(2 * slots, slot_rows(int(np.max(jax.device_get(_demand(inputs, state, policy=policy)))))), slot_rows(max_seqs))
            inputs, state = _grow(inputs, state, num_slots=slots, policy=policy, mesh=mesh)
    compile_ahead.wait("replay_finish")
    lanes = jax.device_get((inputs, state))
    del inputs, state  # the lanes' tables once, on the host, while they merge
    return _real_requests(_finish(reqs, *lanes, position, split, dp, policy=policy), num_r)


def simulate(
    configs: ReplayConfig,
    requests: Requests,
    workload: Workload,
    step_time_fn: Callable,
    step_params,
    *,
    window: int = DEFAULT_WINDOW,
    max_iterations: int = 50_000_000,
    series_points: int = 64,
    **kwargs,
) -> ReplayMetrics:
    """Replay and summarise: ReplayMetrics with leading axis [F] (see simulate_trace for arguments)."""
    trace = simulate_trace(configs, requests, workload, step_time_fn, step_params, window=window, max_iterations=max_iterations, **kwargs)
    return summarize(trace, workload, series_points=series_points)
