"""Round-robin routing: request i goes to replica i % dp, so a lane replays its replicas one after the other.

The routing is fixed before the replay (`traffic.build_lanes` lays each replica's requests out as
a segment of the lane's stream), so replicas are independent: a finalist's replicas may be spread
over several lanes (`split.LaneSplit`), each starting at its first replica, and `merge_lanes`
puts each finalist's trace back together from them, the same bit for bit. The functions here are
the round-robin half of `routing.ROUND_ROBIN`; `lane_step` and `lane_done` are the others.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan.replay.scheduler import LaneInput
from jaxplan.replay.state import LaneState, empty_rows, flush_in_flight, init_lane, widen_stream_rows
from jaxplan.replay.traffic import Lanes, build_lanes, split_lanes


def start_lanes(requests, num_requests, config, closed_concurrency, split, *, max_dp: int, num_slots: int) -> tuple[Lanes, LaneState, jnp.ndarray]:
    """(lanes [L] of `split`, their initial states [L], each request's stream position [F, R]) (traceable)."""
    lanes = build_lanes(requests, config, closed_concurrency, max_dp, num_requests)
    position = lanes.position
    lanes = split_lanes(lanes, split.finalist, split.first, split.end)
    state = jax.vmap(lambda arr, sub: init_lane(arr, sub, max_dp, num_slots))(lanes.arrival, lanes.seg_initial[:, 0])
    # a lane starts at its first replica, as if the replicas before it had been replayed
    first = split.first[:, None] == jnp.arange(max_dp)[None, :]
    seg_first = jnp.sum(jnp.where(first, lanes.seg_start, 0), axis=1)
    state = state._replace(replica=split.first, next_k=seg_first, submitted=seg_first + jnp.sum(jnp.where(first, lanes.seg_initial, 0), axis=1))
    return lanes, state, position


def lane_demand(st: LaneState, lane: LaneInput):
    """Requests the lane's current replica wants in flight now: running, preempted, arrived and waiting. Scalar."""
    num_s = st.run_i.shape[-2]
    num_r = st.rec_i.shape[-1]
    hot = jnp.arange(st.rep_steps.shape[0]) == st.replica
    seg_end = jnp.sum(jnp.where(hot, lane.seg_start + lane.seg_count, 0))
    p = jnp.arange(num_r)
    waiting = (p >= st.next_k) & (p < seg_end) & (st.arrival[num_s : num_s + num_r] <= st.clock_hi + st.clock_lo)
    return st.n_run + st.n_pq + jnp.sum(waiting)


def widen_lanes(inputs: LaneInput, state: LaneState, extra: int):
    """The same lanes (leading axis [L]) with `extra` more slot rows."""
    stream = widen_stream_rows(inputs.stream, state.run_i.shape[-2], extra)
    e_i, e_f = jax.vmap(lambda _: empty_rows(extra))(state.n_run)
    widen = lambda x, e: jnp.concatenate([x, e], axis=-2)  # more slot rows
    pad_inf = jnp.full(state.arrival.shape[:-1] + (extra,), jnp.inf, jnp.float32)
    # A lane out of rows was frozen before its step, which it runs again now: that iteration did
    # nothing, so it does not count (replica_iterations then do not depend on when rows grow).
    frozen = state.overflow[:, None] & (jnp.arange(state.rep_iterations.shape[1])[None, :] == state.replica[:, None])
    state = state._replace(
        rep_iterations=state.rep_iterations - frozen.astype(jnp.int32),
        run_i=widen(state.run_i, e_i),
        run_f=widen(state.run_f, e_f),
        pq_i=widen(state.pq_i, e_i),
        pq_f=widen(state.pq_f, e_f),
        pq_mark=jnp.concatenate([state.pq_mark, jnp.zeros(state.pq_mark.shape[:-1] + (extra,), state.pq_mark.dtype)], axis=-1),
        arrival=jnp.concatenate([pad_inf, state.arrival, pad_inf], axis=-1),
        overflow=jnp.zeros_like(state.overflow),
    )
    return inputs._replace(stream=stream), state


def merge_lanes(inputs: LaneInput, state: LaneState, position, split, dp, lanes_done):
    """Each finalist's lanes [L] merged back into one: (inputs, state) [F], records rec_i, rec_f
    [F, 3, R] by stream position, the replica of each request [F, R] and replica_done [F, D]."""
    num_r = position.shape[1]
    num_d = state.rep_steps.shape[1]
    num_s = state.run_i.shape[-2]
    num_f = position.shape[0]
    replica_done = lanes_done[:, None] | (jnp.arange(num_d)[None, :] < state.replica[:, None])
    rec_i, rec_f = jax.vmap(flush_in_flight)(state)  # [L, 3, R] by stream position of the lane's finalist
    # Each finalist's replica d (and its stream positions) comes from the one lane that replayed it.
    d = jnp.arange(num_d, dtype=jnp.int32)
    lane_of = split.lane_of  # [F, D]
    real = split.first < split.end  # [L] padding lanes replay nothing
    of_replica = lambda x: x[lane_of, d[None, :]]  # [L, D] -> [F, D]
    i = jnp.arange(num_r, dtype=jnp.int32)
    pos_replica = jnp.zeros((num_f, num_r), jnp.int32).at[jnp.arange(num_f)[:, None], position].set(i[None, :] % dp[:, None])
    pos_lane = jnp.take_along_axis(lane_of, pos_replica, axis=1)  # [F, R] lane of each stream position
    of_position = lambda x: x[pos_lane[:, None, :], jnp.arange(x.shape[1])[None, :, None], i[None, None, :]]  # [L, C, R] -> [F, C, R]
    arrival = of_position(state.arrival[:, None, num_s : num_s + num_r])[:, 0]
    owner = jnp.where(real, split.finalist, num_f)  # padding lanes go to a dropped segment
    merged = jax.tree.map(lambda x: x[lane_of[:, 0]], state)._replace(
        arrival=jnp.pad(arrival, ((0, 0), (num_s, num_s)), constant_values=jnp.inf),
        rep_steps=of_replica(state.rep_steps),
        rep_iterations=of_replica(state.rep_iterations),
        rep_clock=of_replica(state.rep_clock),
        rep_preemptions=of_replica(state.rep_preemptions),
        rep_tokens_out=of_replica(state.rep_tokens_out),
        rep_peak_kv=of_replica(state.rep_peak_kv),
        rep_stalled=of_replica(state.rep_stalled),
        rep_batch=of_replica(state.rep_batch),
        rep_kv=of_replica(state.rep_kv),
        overflow=jax.ops.segment_max(state.overflow.astype(jnp.int32), owner, num_segments=num_f + 1)[:num_f] > 0,
        itl_hist=jax.ops.segment_sum(state.itl_hist, owner, num_segments=num_f + 1)[:num_f],
    )
    fin_inputs = jax.tree.map(lambda x: x[lane_of[:, 0]], inputs)._replace(num_replicas=dp)
    replica = i[None, :] % dp[:, None]
    return fin_inputs, merged, of_position(rec_i), of_position(rec_f), replica, of_replica(replica_done)


