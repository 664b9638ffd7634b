"""Least-loaded routing: one lane advances all of its replicas together, in time order.

An arriving request goes to the replica with the fewest outstanding requests
(waiting + running, preempted ones included) at its arrival time, ties to the
lowest index. That couples the replicas, so a lane keeps every replica's
tables (LaneState's per-replica fields, `BANK`, get a leading [D] axis) and
each loop iteration does, with t* the earliest next step start of a busy
replica (ties: lowest index):

1. closed loop: releases the client's submissions of the earliest replica
   whose last iteration ended at or before t*: each request it finished is
   replaced by the next unsubmitted one, arriving when it finished (ids in
   order of (time, replica));
2. routes the next unrouted arrival if it arrived at or before t*;
3. steps (gathers, schedules, executes, scatters back) that earliest replica,
   unless a release or an arrival at or before its start is still left.

So steps run in nondecreasing start time, and a request arriving at `a` is
routed once every step that starts before `a` has run and none that starts at
or after it: a replica's requests finished by `a` are all but those of its
last iteration, which count once it ended by `a`. An idle replica waits for a
request (its next step starts at max(clock, arrival)).

A jump stops before the next unrouted arrival (it might go to this
replica) unless this replica could admit nothing in the meantime (its queue's
head is blocked, or admission is closed); the loads the router sees are the
same either way, since a jump finishes requests only at its end, so jumps
change nothing. Closed-loop replacements need no such
stop: the N first requests all arrive at t = 0, so the loads start as the
balanced vector (non-increasing in replica index, max - min <= 1) and routing
keeps them so; the replacements released at a time E then refill exactly the
replicas that finished at E (each gets back as many as it lost), never a
replica in the middle of a jump (it finishes nothing there). This relies on
closed-loop arrivals other than replacements being at t = 0 (and on
arrivals being nondecreasing in request order, as `next_id` routes them).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxplan.replay.execute import advance, time_steps
from jaxplan.replay.ops import F32, I32
from jaxplan.replay.scheduler import LaneInput, Replica, schedule, waiting_queue
from jaxplan.replay.state import (
    LaneState,
    empty_rows,
    flush_in_flight,
    init_lane,
    widen_stream_rows,
)
from jaxplan.replay.traffic import Lanes, build_balanced_lanes

# LaneState fields that hold one replica's scheduler; in least-loaded lanes they carry a leading [D] axis.
BANK = ("run_i", "run_f", "n_run", "pq_i", "pq_f", "pq_mark", "n_pq", "next_k", "clock_hi", "clock_lo", "steps")
BIG = 2**30


class Route(NamedTuple):
    """Routing state of one lane. Request ids are positions in the lane's stream (arrival order)."""

    routed: jnp.ndarray  # [D, S + R + S] int32 ids routed to each replica, in routing order, at offset S (-1 elsewhere)
    n_routed: jnp.ndarray  # [D] int32 requests routed to each replica
    last_fin: jnp.ndarray  # [D] int32 requests finished by the replica's last iteration (at its clock)
    pend: jnp.ndarray  # [D] int32 closed loop: replacements of those not yet submitted
    next_id: jnp.ndarray  # int32 first request not yet routed


def init_balanced(arrival, submitted, max_dp: int, num_slots: int):
    """(LaneState with [D] bank fields, Route) for one lane: stream arrivals [R] (inf = not submitted)."""
    st = init_lane(arrival, submitted, max_dp, num_slots)
    st = st._replace(**{f: jnp.broadcast_to(getattr(st, f), (max_dp,) + getattr(st, f).shape) for f in BANK})
    zd = jnp.zeros(max_dp, I32)
    routed = jnp.full((max_dp, arrival.shape[0] + 2 * num_slots), -1, I32)
    return st, Route(routed, zd, zd, zd, jnp.zeros((), I32))


def _status(st: LaneState, rt: Route, lane: LaneInput):
    """Per replica [D]: (live: may step at all, busy: has a step to run, next step start (hi, lo) s)."""
    num_s = st.run_i.shape[-2]
    d = jnp.arange(st.n_run.shape[0], dtype=I32)
    in_flight = st.n_run + st.n_pq
    waiting = rt.n_routed - st.next_k
    first = jnp.take_along_axis(rt.routed, (num_s + st.next_k)[:, None], axis=1)[:, 0]
    t_first = jnp.where(waiting > 0, st.arrival[num_s + first], jnp.inf)
    live = (d < lane.num_replicas) & ~st.rep_stalled
    busy = live & ((in_flight > 0) | (waiting > 0))
    wake = (in_flight == 0) & (t_first > st.clock_hi + st.clock_lo)  # idle: sleeps until its first request
    return live, busy, jnp.where(wake, t_first, st.clock_hi), jnp.where(wake, 0.0, st.clock_lo).astype(F32)


def _earliest(mask, hi, lo):
    """(first index of the smallest (hi, lo) where mask, any(mask), that time in s or inf)."""
    m_hi = jnp.min(jnp.where(mask, hi, jnp.inf))
    tie = mask & (hi == m_hi)
    m_lo = jnp.min(jnp.where(tie, lo, jnp.inf))
    first = jnp.argmax(tie & (lo == m_lo)).astype(I32)
    anything = jnp.any(mask)
    return first, anything, jnp.where(anything, m_hi + m_lo, jnp.inf)


def outstanding(st: LaneState, rt: Route, clock, a):
    """[D] requests each replica holds at time `a`: waiting (routed, not admitted, or preempted) and
    running, counting those its last iteration finished at its clock, after `a`."""
    return st.n_run + st.n_pq + rt.n_routed - st.next_k + jnp.where(clock > a, rt.last_fin, 0)


def release_and_route(st: LaneState, rt: Route, lane: LaneInput, load_fn=outstanding):
    """Steps 1 and 2 of an iteration (see the module docstring), routing to the lowest
    `load_fn(st, rt, clock [D], arrival s) -> [D]` (ties to the lowest index).
    Returns (st, rt, clock [D] s)."""
    num_s, num_d = st.run_i.shape[-2], st.n_run.shape[0]
    d_idx = jnp.arange(num_d, dtype=I32)
    pos = jnp.arange(num_s, dtype=I32)
    clock = st.clock_hi + st.clock_lo  # [D] when each replica's last iteration ended

    # 1. Closed loop: the earliest finished-but-unreleased replica's replacements arrive at its clock.
    _, busy, s_hi, s_lo = _status(st, rt, lane)
    _, _, t_star = _earliest(busy, s_hi, s_lo)
    y, any_rel, _ = _earliest((rt.pend > 0) & (clock <= t_star), st.clock_hi, st.clock_lo)
    n_rel = jnp.where(any_rel, jnp.minimum(rt.pend[y], lane.num_requests - st.submitted), 0)
    off = num_s + st.submitted
    old = jax.lax.dynamic_slice_in_dim(st.arrival, off, num_s)
    arrival = jax.lax.dynamic_update_slice_in_dim(st.arrival, jnp.where(pos < n_rel, clock[y], old), off, 0)
    pend = jnp.where(any_rel & (d_idx == y), 0, rt.pend)
    st = st._replace(arrival=arrival, submitted=st.submitted + n_rel)

    # 2. Route the next arrival, if it came by t*: lowest load at its arrival time, lowest index.
    a = arrival[num_s + rt.next_id]
    do_route = jnp.isfinite(a) & (a <= t_star)  # a = inf: nothing (yet) to route
    load = load_fn(st, rt, clock, a)
    target = jnp.argmin(jnp.where(d_idx < lane.num_replicas, load, BIG)).astype(I32)
    slot = jnp.where(do_route, num_s + rt.n_routed[target], BIG)
    routed = rt.routed.at[target, slot].set(rt.next_id, mode="drop")
    n_routed = rt.n_routed + ((d_idx == target) & do_route).astype(I32)
    next_id = rt.next_id + do_route.astype(I32)
    return st, Route(routed, n_routed, rt.last_fin, pend, next_id), clock


def balanced_step(carry, lane: LaneInput, params, freeze_on_overflow, *, step_time_fn, window: int, block_size: int):
    """One iteration of a least-loaded lane: release, route one arrival, step the earliest replica."""
    st, rt = carry
    num_s, num_d = st.run_i.shape[-2], st.n_run.shape[0]
    d_idx = jnp.arange(num_d, dtype=I32)
    pos = jnp.arange(num_s, dtype=I32)
    st, rt, clock = release_and_route(st, rt, lane)
    arrival, pend, routed, n_routed, next_id = st.arrival, rt.pend, rt.routed, rt.n_routed, rt.next_id

    # 3. Step the earliest replica, unless something at or before its start is left to release or route.
    _, busy, s_hi, s_lo = _status(st, rt, lane)
    x, any_busy, t_star = _earliest(busy, s_hi, s_lo)
    a_next = arrival[num_s + next_id]
    go = any_busy & (a_next > t_star) & ~jnp.any((pend > 0) & (clock <= t_star))

    view = st._replace(**{f: getattr(st, f)[x] for f in BANK})
    seg_end = n_routed[x]
    rep = Replica(
        switch=jnp.zeros((), bool),
        index=x,
        hot=d_idx == x,
        seg_end=seg_end,
        n_run=view.n_run,
        n_pq=view.n_pq,
        next_k=view.next_k,
        submitted=view.submitted,
        clock_hi=view.clock_hi,
        clock_lo=view.clock_lo,
        steps=view.steps,
        active=go,
    )
    ids = jax.lax.dynamic_slice(routed, (x, num_s + view.next_k - view.n_pq), (1, num_s))[0]
    ok = (pos >= view.n_pq) & (view.next_k + pos - view.n_pq < seg_end)
    ids = jnp.where(ok, ids, 0)
    w_rows = jnp.take(lane.stream, num_s + ids, axis=0)
    w_arr = jnp.where(ok, arrival[num_s + ids], jnp.inf)
    solo = lane._replace(closed=jnp.zeros_like(lane.closed))  # submissions are released above, not by the step
    queue = waiting_queue(view, solo, rep, (w_rows, w_arr))
    queue = queue._replace(t_next=jnp.minimum(queue.t_next, a_next))  # a jump stops before it (unless admission is closed)
    plan = schedule(view, solo, rep, queue, block_size)
    live_step = rep.active & ~queue.nothing_left
    stall = live_step & plan.stall
    overflow = live_step & ~stall & plan.overflow
    runs = live_step & ~stall & ~(overflow & freeze_on_overflow)
    timing = time_steps(view, rep, queue, plan, params, step_time_fn=step_time_fn, window=window, block_size=block_size)
    new = advance(view, solo, rep, queue, plan, timing, runs=runs, stall=stall, overflow=overflow)

    n_fin = view.n_run + view.n_pq + (new.next_k - view.next_k) - new.n_run - new.n_pq
    ran = rep.hot & runs
    st = new._replace(**{f: getattr(st, f).at[x].set(getattr(new, f)) for f in BANK})
    rt = rt._replace(last_fin=jnp.where(ran, n_fin, rt.last_fin), pend=pend + jnp.where(ran & lane.closed, n_fin, 0))
    return st, rt


def balanced_done(carry, lane: LaneInput):
    """No replica has a step to run, nothing is left to route or to submit. Scalar bool."""
    st, rt = carry
    num_s = st.run_i.shape[-2]
    live = (jnp.arange(st.n_run.shape[0]) < lane.num_replicas) & ~st.rep_stalled
    busy = live & ((st.n_run + st.n_pq > 0) | (rt.n_routed > st.next_k))
    return ~jnp.any(busy) & ~jnp.isfinite(st.arrival[num_s + rt.next_id]) & ~jnp.any(rt.pend > 0)


def balanced_demand(carry, lane: LaneInput):
    """Most requests one replica has in flight or waiting (all routed ones have arrived). Scalar."""
    st, rt = carry
    return jnp.max(st.n_run + st.n_pq + rt.n_routed - st.next_k)


def balanced_widen(inputs: LaneInput, carry, extra: int):
    """The same lanes (leading axis [F]) with `extra` more slot rows per replica."""
    st, rt = carry
    num_f, num_d = st.n_run.shape
    stream = widen_stream_rows(inputs.stream, st.run_i.shape[-2], extra)
    e_i, e_f = empty_rows(extra)
    tile = lambda e: jnp.broadcast_to(e, (num_f, num_d) + e.shape)
    widen = lambda x, e: jnp.concatenate([x, tile(e)], axis=-2)  # more slot rows
    pad = lambda x, v: jnp.concatenate([jnp.full(x.shape[:-1] + (extra,), v, x.dtype), x, jnp.full(x.shape[:-1] + (extra,), v, x.dtype)], axis=-1)
    st = st._replace(
        run_i=widen(st.run_i, e_i),
        run_f=widen(st.run_f, e_f),
        pq_i=widen(st.pq_i, e_i),
        pq_f=widen(st.pq_f, e_f),
        pq_mark=jnp.concatenate([st.pq_mark, jnp.zeros(st.pq_mark.shape[:-1] + (extra,), st.pq_mark.dtype)], axis=-1),
        arrival=pad(st.arrival, jnp.inf),
        overflow=jnp.zeros_like(st.overflow),
    )
    return inputs._replace(stream=stream), (st, rt._replace(routed=pad(rt.routed, -1)))


def balanced_records(carry):
    """One lane's records [3, R] with its requests still in flight (every replica) flushed in,
    and the replica each request was routed to [R] (-1: never routed)."""
    st, rt = carry
    num_r = st.rec_i.shape[-1]
    rec_i, rec_f = flush_in_flight(st)
    num_d = rt.routed.shape[0]
    ids = jnp.where(rt.routed >= 0, rt.routed, num_r).reshape(-1)
    replica = jnp.full(num_r, -1, I32).at[ids].set(jnp.repeat(jnp.arange(num_d, dtype=I32), rt.routed.shape[1]), mode="drop")
    return rec_i, rec_f, replica


def start_balanced(requests, num_requests, config, closed_concurrency, split, *, max_dp: int, num_slots: int) -> tuple[Lanes, tuple, jnp.ndarray]:
    """(lanes [F], their initial (LaneState, Route) [F], each request's stream position [F, R]) (traceable).
    One lane per finalist: `split` has one lane each and is not needed."""
    lanes, submitted = build_balanced_lanes(requests, config, closed_concurrency, max_dp, num_requests)
    state = jax.vmap(lambda arr, sub: init_balanced(arr, sub, max_dp, num_slots))(lanes.arrival, submitted)
    return lanes, state, lanes.position


def balanced_lane_state(carry) -> LaneState:
    """The LaneState of a (LaneState, Route) carry (one lane or [F])."""
    return carry[0]


def merge_balanced(inputs: LaneInput, carry, position, split, dp, lanes_done):
    """The lanes' results [F] (one lane per finalist): (inputs, state), records rec_i, rec_f
    [F, 3, R] by stream position, the replica of each request [F, R] and replica_done [F, D]."""
    rec_i, rec_f, replica = jax.vmap(balanced_records)(carry)
    state = carry[0]
    return inputs, state, rec_i, rec_f, replica, lanes_done[:, None] | state.rep_stalled
