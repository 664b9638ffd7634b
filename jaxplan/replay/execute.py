"""Run a planned step: its StepBatch and time, jumps, and the new tables and records.

Jumps: when nothing is admitted or preempted and every running request would
keep its grant in the next steps (a decode token, or a prompt chunk of the
same size that completes no prompt: `Plan.steady`), the next k steps are
identical but for the growing contexts and prompt prefixes, as long as no
request finishes before the k-th, the KV blocks they need are free, and no
arrival could be admitted (admission closed: the grants fill the step's
budget or max_num_seqs run; or the waiting queue's head is blocked; or the
next arrival comes after the k-th step's start). One iteration then executes
all k (<= window) steps at once; results are the same as stepping one by one
(bit for bit with dyadic step times: `tests/test_replay_reference.py`).

A token is sampled at the end of a step for every request whose KV reaches
prompt + outputs (the first token ends the step that completes the prefill);
a request that has produced its output length finishes and frees its blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxplan.physics.batch import StepBatch
from jaxplan.replay.ops import F32, I32, cdiv, ceil_sum, cumsum, materialize
from jaxplan.replay.scheduler import LaneInput, Plan, Queue, Replica
from jaxplan.replay.state import (
    ARRIVAL,
    COMP,
    NPRE,
    OSL,
    OUT,
    PROMPT,
    SINCE,
    STEP_FIRST,
    T_ADMIT,
    TTFT,
    K,
    LaneState,
    gather_rows,
    itl_bin,
    two_sum_add,
)

BIG = 2**30


def jump_candidates(window: int) -> tuple[int, ...]:
    """Jump lengths tried against the free KV blocks: powers of two below `window`, and `window`."""
    out, c = [], 1
    while c < window:
        out.append(c)
        c *= 2
    return tuple(out) + (window,)


class Timing(NamedTuple):
    """The iteration's k steps. Scalars unless noted."""

    dts: jnp.ndarray  # [window] float32 s: this step, then the jump's next steps
    k: jnp.ndarray  # int32 steps covered (1 = a plain step)
    dt: jnp.ndarray  # float32 s: their total
    end_hi: jnp.ndarray  # float32 s: clock after them
    end_lo: jnp.ndarray
    n_dec: jnp.ndarray  # int32 decoding requests (each jump step makes that many tokens)
    kv_sum: jnp.ndarray  # float32 sum over the k steps of KV blocks in use
    kv_last: jnp.ndarray  # int32 KV blocks in use in the last of them
    batch_sum: jnp.ndarray  # float32 sum over the k steps of scheduled requests


def step_batches(st: LaneState, queue: Queue, plan: Plan, window: int) -> tuple[StepBatch, jnp.ndarray]:
    """The StepBatch of this step and of the next window - 1 with the same grants ([window] each
    field: the contexts and prompt prefixes grow), and the decoding requests (int32)."""
    r_i = st.run_i
    comp, out = r_i[:, COMP], r_i[:, OUT]
    g, cg = plan.grant, plan.c_grant
    dec = (g > 0) & (out >= 1) & (comp == r_i[:, PROMPT] + out - 1)
    pre = (g > 0) & ~dec
    n_dec = jnp.sum(dec).astype(I32)
    gp, gc = g.astype(F32), cg.astype(F32)
    # Requests admitted this step are prefills, a readmitted one whose cached blocks hold all but its
    # last token included (one token, priced as a chunk: the reference counts it so too).
    pf_tokens = (jnp.sum(jnp.where(pre, g, 0)) + jnp.sum(cg)).astype(F32)
    pairs = jnp.sum(jnp.where(pre, gp * (comp + gp / 2), 0.0)) + jnp.sum(gc * (plan.c_hit + gc / 2))
    pairs_growth = jnp.sum(jnp.where(pre, gp * gp, 0.0))  # a chunk's prefix grows by its size each step
    context = (jnp.sum(jnp.where(pre, comp, 0)) + jnp.sum(jnp.where(cg > 0, plan.c_hit, 0))).astype(F32)
    context_growth = jnp.sum(jnp.where(pre, gp, 0.0))
    pf_seqs = (jnp.sum(pre) + plan.admitted).astype(F32)
    ctx0 = jnp.sum(jnp.where(dec, comp + 1, 0)).astype(F32)
    j = jnp.arange(window, dtype=I32)
    jf = j.astype(F32)
    ones = jnp.ones(window, F32)
    return StepBatch(pf_tokens * ones, n_dec.astype(F32) * ones, ctx0 + (j * n_dec).astype(F32), pairs + jf * pairs_growth, pf_seqs * ones,
                     context + jf * context_growth), n_dec


class JumpLimits(NamedTuple):
    """What bounds a jump of one replica (int32 steps, scalars): k = max(1, min of them) if `eligible`."""

    eligible: jnp.ndarray  # bool: the same grants may repeat (nothing admitted or preempted, something granted)
    k_own: jnp.ndarray  # its own requests: no finish before the k-th step, KV for k more steps, same grants
    k_arrival: jnp.ndarray  # no admissible arrival before the k-th step starts (window when admission is closed)


def jump_limits(st: LaneState, rep: Replica, queue: Queue, plan: Plan, dts, *, window: int, block_size: int) -> JumpLimits:
    """How many steps with the same grants may run at once, given their times `dts` [window] s."""
    bs = block_size
    r_i = st.run_i
    comp, out = r_i[:, COMP], r_i[:, OUT]
    g = plan.grant
    dec = (g > 0) & (out >= 1) & (comp == r_i[:, PROMPT] + out - 1)
    cum = cumsum(dts)
    valid = jnp.arange(comp.shape[0]) < rep.n_run
    elig = (window > 1) & (plan.admitted == 0) & (plan.kept == rep.n_run) & jnp.any(g > 0)
    k_fin = jnp.min(jnp.where(dec, r_i[:, OSL] - out, BIG))
    alloc = cdiv(comp, bs)
    cands = jnp.asarray(jump_candidates(window), I32)
    extra_c = jnp.sum(jnp.where(valid[None, :], cdiv(comp[None, :] + cands[:, None] * g[None, :], bs) - alloc[None, :], 0), axis=1)
    k_kv = cands[jnp.maximum(jnp.sum(extra_c <= plan.free0) - 1, 0)]
    k_arr = jnp.where((queue.n_wait > 0) | plan.closed, window, 1 + jnp.sum(cum[:-1] < (queue.t_next - queue.clock_hi) - queue.clock_lo))
    return JumpLimits(elig, jnp.minimum(jnp.minimum(k_fin, k_kv), plan.steady).astype(I32), k_arr.astype(I32))


def timing_of(st: LaneState, rep: Replica, queue: Queue, plan: Plan, dts, k, n_dec, *, block_size: int) -> Timing:
    """The Timing of `k` steps with the same grants, taking `dts` [window] s each."""
    bs = block_size
    comp, g = st.run_i[:, COMP], plan.grant
    valid = jnp.arange(comp.shape[0]) < rep.n_run
    dt = cumsum(dts)[k - 1]
    end_hi, end_lo = two_sum_add(queue.clock_hi, queue.clock_lo, dt)

    # KV blocks in use over the k steps: request i holds ceil((comp_i + j g_i) / bs) in step j.
    kv_sum = jnp.sum(jnp.where(valid, ceil_sum(jnp.broadcast_to(k, comp.shape), comp, g, bs, max_k=dts.shape[0]), 0))
    kv_k = jnp.sum(jnp.where(valid, cdiv(comp + k * g, bs), 0))
    jump = k > 1
    return Timing(
        dts=dts,
        k=k,
        dt=dt,
        end_hi=end_hi,
        end_lo=end_lo,
        n_dec=n_dec,
        kv_sum=jnp.where(jump, kv_sum, plan.used_step).astype(F32),
        kv_last=jnp.where(jump, kv_k, plan.used_step),
        batch_sum=((jnp.sum(g > 0) + plan.admitted) * k).astype(F32),
    )


def time_steps(st: LaneState, rep: Replica, queue: Queue, plan: Plan, params, *, step_time_fn, window: int, block_size: int) -> Timing:
    """The step's StepBatch and time, and how many steps with the same grants to jump (k >= 1)."""
    batches, n_dec = step_batches(st, queue, plan, window)
    dts = jax.vmap(lambda b: jnp.asarray(step_time_fn(params, b), F32))(batches)
    dts = jax.lax.optimization_barrier(dts)  # evaluate the physics once, not once per use
    # Jump length: the same grants (plan.steady), no finish before the k-th step, KV for k more
    # steps' tokens, no admissible arrival.
    lim = jump_limits(st, rep, queue, plan, dts, window=window, block_size=block_size)
    k = jnp.where(lim.eligible, jnp.maximum(1, jnp.minimum(lim.k_own, jnp.minimum(lim.k_arrival, window))), 1).astype(I32)
    return timing_of(st, rep, queue, plan, dts, k, n_dec, block_size=block_size)


class Rows(NamedTuple):
    """A slot table after the step(s), before finished rows are dropped."""

    ints: jnp.ndarray  # [S, NI]
    floats: jnp.ndarray  # [S, NF]
    keep: jnp.ndarray  # [S] bool: still in flight
    rec_idx: jnp.ndarray  # [S] int32 stream position of a finished request, R otherwise
    rec_i: jnp.ndarray  # [3, S] int32 its record: first-token step, finish step, preemptions
    rec_f: jnp.ndarray  # [3, S] float32 s: TTFT, end-to-end latency, first admission
    gap: jnp.ndarray  # [S] float32 s since the request's previous token
    gap_weight: jnp.ndarray  # [S] int32: 1 if this step made a token after the first
    made: jnp.ndarray  # int32 tokens made


def apply_rows(ints, floats, before, grant, member, flush, rep: Replica, queue: Queue, timing: Timing, dt, num_r: int) -> Rows:
    """The k steps' effect on requests `member` that hold `before` KV tokens and got `grant` tokens.

    Finished requests get their record; so do `flush` ones (still in flight, as unfinished).
    """
    k, end_hi, end_lo = timing.k, timing.end_hi, timing.end_lo
    out = ints[:, OUT]
    tok = member & (grant > 0) & (before + grant == ints[:, PROMPT] + out)
    made = jnp.where(tok, k, 0)
    new_out = out + made
    first = tok & (out == 0)
    fin = tok & (new_out >= ints[:, OSL])
    arrival = floats[:, ARRIVAL]
    ttft = jnp.where(first, (end_hi - arrival) + end_lo, floats[:, TTFT])
    step_first = jnp.where(first, rep.steps, ints[:, STEP_FIRST])
    t_admit = jnp.where(member & jnp.isnan(floats[:, T_ADMIT]), queue.clock_hi + queue.clock_lo, floats[:, T_ADMIT])
    since = floats[:, SINCE]
    new_i = ints.at[:, COMP].set(before + grant * k).at[:, OUT].set(new_out).at[:, STEP_FIRST].set(step_first)
    new_f = floats.at[:, SINCE].set(jnp.where(tok, 0.0, since + dt)).at[:, T_ADMIT].set(t_admit).at[:, TTFT].set(ttft)
    last_step = jnp.broadcast_to(rep.steps + k - 1, out.shape)
    return Rows(
        ints=new_i,
        floats=new_f,
        keep=member & ~fin,
        rec_idx=jnp.where(fin | flush, ints[:, K], num_r),
        rec_i=jnp.stack([step_first, jnp.where(fin, last_step, -1), ints[:, NPRE]]),
        rec_f=jnp.stack([ttft, jnp.where(fin, (end_hi - arrival) + end_lo, jnp.nan), t_admit]),
        gap=since + timing.dts[0],
        gap_weight=(tok & (out >= 1)).astype(I32),
        made=jnp.sum(made),
    )


def advance(st: LaneState, lane: LaneInput, rep: Replica, queue: Queue, plan: Plan, timing: Timing, *, runs, stall, overflow) -> LaneState:
    """The lane after this iteration; nothing but flags changes unless `runs`."""
    num_s, num_r = st.run_i.shape[0], st.rec_i.shape[1]
    pos = jnp.arange(num_s, dtype=I32)
    n, n_pq = rep.n_run, rep.n_pq
    m = jnp.where(runs, plan.kept, n)
    a = jnp.where(runs, plan.admitted, 0)
    dt = jnp.where(runs, timing.dt, 0.0)
    kept, adm = pos < m, pos < a
    r_i = st.run_i
    # a stalled replica is left for good: record what its requests in flight got so far
    flush_r, flush_q = stall & (pos < n), stall & (pos < n_pq)
    run = materialize(*apply_rows(r_i, st.run_f, r_i[:, COMP], jnp.where(runs, plan.grant, 0), kept, flush_r, rep, queue, timing, dt, num_r))
    new = materialize(*apply_rows(queue.cand_i, queue.cand_f, plan.c_hit, jnp.where(runs, plan.c_grant, 0), adm, flush_q, rep, queue, timing, dt, num_r))
    run, new = Rows(*run), Rows(*new)

    # Records of finished requests; inter-token gaps (first step per request, then the jump's steps).
    rec_idx = jnp.concatenate([run.rec_idx, new.rec_idx])
    rec_i = st.rec_i.at[:, rec_idx].set(jnp.concatenate([run.rec_i, new.rec_i], axis=1), mode="drop")
    rec_f = st.rec_f.at[:, rec_idx].set(jnp.concatenate([run.rec_f, new.rec_f], axis=1), mode="drop")
    j = jnp.arange(timing.dts.shape[0], dtype=I32)
    jump_weight = jnp.where((j >= 1) & (j < timing.k) & runs, timing.n_dec, 0).astype(I32)
    itl_hist = st.itl_hist.at[itl_bin(jnp.concatenate([run.gap, new.gap, timing.dts]))].add(jnp.concatenate([run.gap_weight, new.gap_weight, jump_weight]))

    # New running list: kept unfinished rows in order, then admitted unfinished ones.
    kept_sums = cumsum(jnp.stack([run.keep, new.keep]).astype(I32))
    n_keep = kept_sums[0, -1]
    dest_r = jnp.where(run.keep, kept_sums[0] - 1, num_s)
    dest_c = jnp.where(new.keep, n_keep + kept_sums[1] - 1, num_s)
    run_i, run_f = gather_rows([(run.ints, run.floats), (new.ints, new.floats)], [dest_r, dest_c], num_s)
    n_run = n_keep + kept_sums[1, -1]

    # New preempted queue: victims (in running order) in front of the rest, or admitted ones popped.
    n_vict = n - m
    a_pq = jnp.minimum(a, n_pq)
    dest_v = jnp.where((pos >= m) & (pos < n), pos - m, num_s)
    dest_q = jnp.where((pos >= a_pq) & (pos < n_pq), pos - a_pq + n_vict, num_s)
    victims = r_i.at[:, COMP].set(jnp.where(lane.prefix_caching, r_i[:, COMP], 0)).at[:, NPRE].add(1)
    # The rest of the queue's cached blocks come nearer the free queue's head (scheduler.retained_blocks).
    popped = jnp.where(runs, jnp.where(timing.k > 1, timing.kv_last - plan.used0, plan.popped), 0)
    pq_i, pq_f, pq_mark = gather_rows([(victims, st.run_f, plan.victim_mark), (st.pq_i, st.pq_f, st.pq_mark - popped)], [dest_v, dest_q], num_s)
    pq_f = pq_f + jnp.where(jnp.arange(pq_f.shape[1]) == SINCE, dt, 0.0)[None, :]
    new_pq = n_pq + n_vict - a_pq
    next_k = rep.next_k + a - a_pq

    # Closed loop: each finish submits the replica's next request at the end time, but not before
    # the replica's last client has started (its first requests arrive at the clients' start times).
    n_fin = jnp.sum(jnp.concatenate([run.rec_i[1], new.rec_i[1]]) >= 0).astype(I32)
    sub_off = num_s + rep.submitted
    sub_window = jax.lax.dynamic_slice_in_dim(st.arrival, sub_off, num_s)
    sub_ok = runs & lane.closed & (pos < n_fin) & (rep.submitted + pos < rep.seg_end)
    initial = jnp.sum(jnp.where(rep.hot, lane.seg_initial, 0))
    last_start_pos = num_s + jnp.sum(jnp.where(rep.hot, lane.seg_start, 0)) + jnp.maximum(initial - 1, 0)
    last_start = jnp.where(initial > 0, jax.lax.dynamic_index_in_dim(st.arrival, last_start_pos, keepdims=False), 0.0)
    submit_s = jnp.maximum(timing.end_hi + timing.end_lo, last_start)
    arrival = jax.lax.dynamic_update_slice_in_dim(st.arrival, jnp.where(sub_ok, submit_s, sub_window), sub_off, 0)
    submitted = jnp.where(lane.closed & runs, jnp.minimum(rep.submitted + n_fin, rep.seg_end), rep.submitted)

    frozen = overflow & ~runs  # out of rows: resume here once the host gives more
    done = ~runs | ((n_run == 0) & (new_pq == 0) & (next_k >= rep.seg_end))  # not running: done, idle for good, or stalled
    sel = lambda new_value, old: jnp.where(runs, new_value, old)
    hot = rep.hot & runs
    add_pair = lambda pairs, x: jnp.where(hot[:, None], jnp.stack(two_sum_add(pairs[:, 0], pairs[:, 1], x), -1), pairs)
    return LaneState(
        run_i=run_i,
        run_f=run_f,
        n_run=n_run,
        pq_i=pq_i,
        pq_f=pq_f,
        pq_mark=pq_mark,
        n_pq=new_pq,
        replica=rep.index,
        finished=jnp.where(frozen, False, done),
        next_k=next_k,
        submitted=submitted,
        arrival=arrival,
        rec_i=rec_i,
        rec_f=rec_f,
        clock_hi=sel(timing.end_hi, rep.clock_hi),
        clock_lo=sel(timing.end_lo, rep.clock_lo),
        steps=sel(rep.steps + timing.k, rep.steps),
        overflow=st.overflow | overflow,
        itl_hist=itl_hist,
        rep_steps=st.rep_steps + jnp.where(hot, timing.k, 0),
        rep_iterations=st.rep_iterations + (rep.hot & rep.active).astype(I32),
        rep_clock=jnp.where(hot, timing.end_hi + timing.end_lo, st.rep_clock),
        rep_preemptions=st.rep_preemptions + jnp.where(hot, n_vict, 0),
        rep_tokens_out=st.rep_tokens_out + jnp.where(hot, run.made + new.made, 0),
        rep_peak_kv=jnp.where(hot, jnp.maximum(st.rep_peak_kv, timing.kv_last), st.rep_peak_kv),
        rep_stalled=st.rep_stalled | (rep.hot & stall),
        rep_batch=add_pair(st.rep_batch, timing.batch_sum),
        rep_kv=add_pair(st.rep_kv, timing.kv_sum),
    )
