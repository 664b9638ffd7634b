"""DP-coordinator routing over lock-step groups of ranks: vLLM's `--data-parallel-size` for a MoE model.

The ranks of one vLLM DP deployment of a MoE model share the expert layers, so
they step together: every step, each rank schedules its own batch (its own
scheduler, KV cache and requests) and the step lasts as long as the slowest
rank's, whose expert layers carry the tokens of every rank (`step_time_fn(params,
batch, group_batch_tokens)`). A rank with nothing to run still steps (vLLM runs a
dummy forward pass: priced as an empty batch with the group's tokens) while any
rank of its group is busy; the group sleeps only when all its ranks are idle.
Replicas come in groups of `lockstep_ranks` consecutive ranks (replica r in group
r // lockstep_ranks); lockstep_ranks = 1 makes every replica its own group.

Routing is vLLM's DP load balancing (`DPLBAsyncMPClient`): an arriving request
goes to the rank with the lowest 4 x waiting + running requests, ties to the
lowest index. vLLM reads those counts from the DP coordinator's published stats
(about every 100 ms) plus the requests it routed since; the replay uses the
exact counts at the arrival. Over several groups (servers) the same rule picks
among all their ranks, i.e. a front router that balances the same way.

The lane is least-loaded routing's (balance.py: every replica's tables, one
lane per finalist, steps in time order, closed-loop releases), with step 3 run
for a whole group: the earliest busy replica's group, all of its ranks at once.
A jump of the group covers the steps every working rank could jump, and stops
before the next unrouted arrival unless no rank of the group could admit it (a
rank that cannot admit keeps its load, 4 x waiting + running, through a jump,
so routing sees the same either way); in closed loop also before the next
release of replacements and the next step of another group (which may release).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxplan.replay import balance
from jaxplan.replay.balance import BANK, Route, _earliest, _status, release_and_route
from jaxplan.replay.execute import advance, jump_limits, step_batches, timing_of
from jaxplan.replay.ops import F32, I32
from jaxplan.replay.scheduler import LaneInput, Replica, schedule, waiting_queue
from jaxplan.replay.state import LaneState

BIG = 2**30
WAITING_WEIGHT = 4  # vLLM's score: 4 x waiting + running


def coordinator_score(st: LaneState, rt: Route, clock, a):
    """[D] vLLM's DP load-balancing score at time `a`: 4 x waiting (routed and not admitted, or
    preempted) + running (counting those the last iteration finished at its clock, after `a`)."""
    waiting = st.n_pq + rt.n_routed - st.next_k
    return WAITING_WEIGHT * waiting + st.n_run + jnp.where(clock > a, rt.last_fin, 0)


def lockstep_step(carry, lane: LaneInput, params, freeze_on_overflow, *, step_time_fn, window: int, block_size: int, max_group: int | None = None):
    """One iteration of a lock-step lane: release, route one arrival, step the earliest group.

    max_group: at least the lane's lock-step ranks (static; default every replica): the group is
    scheduled, priced and advanced over that many rows of the lane's replicas, not all of them, so an
    iteration of a finalist of several servers costs one server's work. The rows past the group's
    ranks take no part either way."""
    st, rt, ranks = carry
    num_s, num_d = st.run_i.shape[-2], st.n_run.shape[0]
    num_g = num_d if max_group is None else min(max_group, num_d)
    d_idx = jnp.arange(num_d, dtype=I32)
    g_idx = jnp.arange(num_g, dtype=I32)
    pos = jnp.arange(num_s, dtype=I32)
    st, rt, clock = release_and_route(st, rt, lane, coordinator_score)

    # 3. Step the earliest busy replica's group, unless something at or before its start is left.
    _, busy, s_hi, s_lo = _status(st, rt, lane)
    x, any_busy, t_star = _earliest(busy, s_hi, s_lo)
    a_next = st.arrival[num_s + rt.next_id]
    go = any_busy & (a_next > t_star) & ~jnp.any((rt.pend > 0) & (clock <= t_star))
    start_hi, start_lo = s_hi[x], s_lo[x]
    first = (x // ranks) * ranks
    # [G] the group's rows from its first (distinct replicas: G <= D), each advanced once
    member = (first + g_idx) % num_d
    in_group = (g_idx < ranks) & (first + g_idx < lane.num_replicas) & ~st.rep_stalled[member]
    solo = lane._replace(closed=jnp.zeros_like(lane.closed))  # submissions are released above, not by the step
    # Closed loop: a replacement is routed when released, at the clock of the rank that finished, so a
    # jump stops before the next release, and before another group's next step, which may end with one.
    others = busy & (d_idx // ranks != x // ranks)
    release_s = jnp.minimum(jnp.min(jnp.where(others, s_hi + s_lo, jnp.inf)), jnp.min(jnp.where(rt.pend > 0, clock, jnp.inf)))
    t_stop = jnp.minimum(a_next, jnp.where(lane.closed, release_s, jnp.inf))

    def plan_rank(d, ok):
        view = st._replace(**{f: getattr(st, f)[d] for f in BANK})
        seg_end = rt.n_routed[d]
        rep = Replica(
            switch=jnp.zeros((), bool), index=d, hot=d_idx == d, seg_end=seg_end, n_run=view.n_run, n_pq=view.n_pq,
            next_k=view.next_k, submitted=view.submitted, clock_hi=start_hi, clock_lo=start_lo, steps=view.steps, active=go & ok,
        )  # fmt: skip
        ids = jax.lax.dynamic_slice(rt.routed, (d, num_s + view.next_k - view.n_pq), (1, num_s))[0]
        routed_ok = (pos >= view.n_pq) & (view.next_k + pos - view.n_pq < seg_end)
        ids = jnp.where(routed_ok, ids, 0)
        w_arr = jnp.where(routed_ok, st.arrival[num_s + ids], jnp.inf)
        # every routed request has arrived by the group's start; a rank never wakes on its own
        later = w_arr > start_hi + start_lo
        queue = waiting_queue(view, solo, rep, (jnp.take(lane.stream, num_s + ids, axis=0), jnp.where(later, jnp.inf, w_arr)))
        queue = queue._replace(t_next=jnp.minimum(queue.t_next, jnp.minimum(jnp.min(jnp.where(later, w_arr, jnp.inf)), t_stop)))
        plan = schedule(view, solo, rep, queue, block_size)
        batches, n_dec = step_batches(view, queue, plan, window)
        return view, rep, queue, plan, batches, n_dec

    views, reps, queues, plans, batches, n_decs = jax.vmap(plan_rank)(member, in_group)
    has_work = reps.active & ~queues.nothing_left
    stall = has_work & plans.stall
    overflow = has_work & ~stall & plans.overflow
    working = has_work & ~stall
    takes_part = in_group & ~stall  # working ranks and the dummies
    group_runs = go & jnp.any(working) & ~(freeze_on_overflow & jnp.any(overflow))
    runs = group_runs & takes_part

    # The group's step times: the slowest rank's, each rank's expert layers seeing all the group's tokens.
    zero = jax.tree.map(jnp.zeros_like, batches)
    own = jax.tree.map(lambda b, z: jnp.where(working[:, None], b, z), batches, zero)
    group_tokens = jnp.sum(jnp.where(working, own.prefill_tokens[:, 0] + own.decode_tokens[:, 0], 0.0))
    rank_dts = jax.vmap(jax.vmap(lambda b: jnp.asarray(step_time_fn(params, b, group_tokens), F32)))(own)
    rank_dts = jax.lax.optimization_barrier(rank_dts)  # evaluate the physics once, not once per use
    dts = jnp.max(jnp.where(takes_part[:, None], rank_dts, 0.0), axis=0)

    # One jump length for the group: what every working rank could jump, and no admissible arrival
    # (at any rank taking part) before its last step.
    lim = jax.vmap(lambda v, r, q, p: jump_limits(v, r, q, p, dts, window=window, block_size=block_size))(views, reps, queues, plans)
    k_own = jnp.min(jnp.where(working, jnp.where(lim.eligible, lim.k_own, 1), BIG))
    k_arr = jnp.min(jnp.where(takes_part, lim.k_arrival, BIG))
    k = jnp.maximum(1, jnp.minimum(jnp.minimum(k_own, k_arr), window)).astype(I32)
    timings = jax.vmap(lambda v, r, q, p, n: timing_of(v, r, q, p, dts, k, n, block_size=block_size))(views, reps, queues, plans, n_decs)

    def advance_rank(state, i):
        d = member[i]
        view = state._replace(**{f: getattr(state, f)[d] for f in BANK})
        pick = lambda tree: jax.tree.map(lambda leaf: leaf[i], tree)
        new = advance(view, solo, pick(reps), pick(queues), pick(plans), pick(timings), runs=runs[i], stall=stall[i], overflow=overflow[i])
        # a replica that does not step keeps its own clock (its Replica carries the group's start)
        new = new._replace(clock_hi=jnp.where(runs[i], new.clock_hi, view.clock_hi), clock_lo=jnp.where(runs[i], new.clock_lo, view.clock_lo))
        n_fin = view.n_run + view.n_pq + (new.next_k - view.next_k) - new.n_run - new.n_pq
        done = new._replace(**{f: getattr(state, f).at[d].set(getattr(new, f)) for f in BANK})
        return done, (n_fin, d)

    st, (n_fin, ds) = jax.lax.scan(advance_rank, st, g_idx)
    ran = jnp.zeros(num_d, bool).at[ds].set(runs)
    fin = jnp.zeros(num_d, I32).at[ds].set(jnp.where(runs, n_fin, 0))
    rt = rt._replace(last_fin=jnp.where(ran, fin, rt.last_fin), pend=rt.pend + jnp.where(ran & lane.closed, fin, 0))
    return st, rt, ranks


def lockstep_done(carry, lane: LaneInput):
    """As balance.balanced_done (the carry is (LaneState, Route, lock-step ranks))."""
    return balance.balanced_done(carry[:2], lane)


def lockstep_demand(carry, lane: LaneInput):
    """As balance.balanced_demand."""
    return balance.balanced_demand(carry[:2], lane)


def lockstep_widen(inputs: LaneInput, carry, extra: int):
    """As balance.balanced_widen."""
    inputs, pair = balance.balanced_widen(inputs, carry[:2], extra)
    return inputs, (*pair, carry[2])


def lockstep_lane_state(carry) -> LaneState:
    """The LaneState of a lock-step carry."""
    return carry[0]


def start_lockstep(requests, num_requests, config, closed_concurrency, split, *, max_dp: int, num_slots: int):
    """As `balance.start_balanced`, with each lane's lock-step group size (config.lockstep_ranks)."""
    lanes, state, position = balance.start_balanced(requests, num_requests, config, closed_concurrency, split, max_dp=max_dp, num_slots=num_slots)
    return lanes, (*state, jnp.asarray(config.lockstep_ranks, I32)), position


def merge_lockstep(inputs: LaneInput, carry, position, split, dp, lanes_done):
    """As balance.merge_balanced."""
    return balance.merge_balanced(inputs, carry[:2], position, split, dp, lanes_done)
