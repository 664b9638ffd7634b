"""Which tokens each request gets in one step of one replica: vLLM V1's scheduler, vectorised.

Each step of a replica (clock t, token budget B = PP x max_num_batched_tokens:
PP micro-batches in flight, each with its own budget; a request sits in one, so
it takes at most max_num_batched_tokens of them):

1. Requests with arrival <= t join the back of the waiting queue (FCFS).
   With nothing running and nothing waiting, the clock jumps to the next arrival.
2. Running requests, in order of (re)admission, take min(tokens left to
   compute, max_num_batched_tokens, budget left) tokens: one decode token, or the next prompt chunk
   (chunked prefill). Once the budget is spent the rest wait for the next step.
   A request needs ceil((KV tokens + new tokens) / block_size) KV blocks; when
   the free blocks do not suffice, the most recently admitted running request
   is preempted (KV freed, back to the front of the waiting queue, recomputed
   from scratch later) until they do, or until the request itself was the one
   preempted, which ends this phase.
3. Only if nothing was preempted in this step: waiting requests are admitted
   in FCFS order while budget > 0, running < max_num_seqs and free blocks
   cover their first chunk; the first that does not fit stops admission. A
   prefix-cache hit (whole blocks, at most prompt - 1 tokens) is counted as
   KV the request holds (its blocks are not shared) but is not computed. A
   preempted request recomputes prompt + outputs so far, less the larger of
   that hit and its own blocks still cached: vLLM frees a victim's blocks
   into the free queue tail first and allocation evicts from the queue's
   head, so the blocks other requests took since are gone, the rest remain
   (`retained_blocks`). One that an earlier admission of the same step would
   evict blocks from waits for the next step.
4. The step takes step_time_fn(params, StepBatch) seconds (see execute.py).

A replica whose oldest request cannot fit in its KV cache even alone stops
(stalled): that request could never finish.

Vectorised form: every "in order, until the first that does not fit" loop of
vLLM is a prefix of the ordered table, found with cumulative sums; e.g. the
running requests that survive preemption are those whose cumulative new
blocks fit in the free blocks plus the blocks of every request after them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxplan.replay.ops import F32, I32, cdiv, cumsum, div, div_small, materialize
from jaxplan.replay.state import ARRIVAL, COMP, HIT, NF, OUT, PROMPT, LaneState, empty_rows


class LaneInput(NamedTuple):
    """One lane's (finalist's) static inputs: request stream, replica segments, capacities."""

    stream: jnp.ndarray  # [S + R + S, NI] int32 each request's slot-table row before admission (state.stream_rows)
    seg_start: jnp.ndarray  # [D] int32 first stream position of each replica
    seg_count: jnp.ndarray  # [D] int32 requests of each replica
    seg_initial: jnp.ndarray  # [D] int32 requests submitted at t = 0 (closed loop; else all)
    num_replicas: jnp.ndarray  # int32
    closed: jnp.ndarray  # bool: closed loop
    max_num_seqs: jnp.ndarray  # int32
    budget: jnp.ndarray  # int32 max_num_batched_tokens: most tokens of one request per step
    step_budget: jnp.ndarray  # int32 pp x max_num_batched_tokens: tokens of the whole step
    num_kv_blocks: jnp.ndarray  # int32
    num_requests: jnp.ndarray  # int32 real requests in the stream (the rest is padding)
    prefix_caching: jnp.ndarray  # bool: a preempted request's blocks stay cached (ReplayConfig.prefix_caching)


def lane_done(st: LaneState, lane: LaneInput):
    """Every replica of the lane is done (or stalled). Scalar bool."""
    return st.finished & (st.replica + 1 >= lane.num_replicas)


class Replica(NamedTuple):
    """The replica this iteration works on (the next one if the last finished). Scalars."""

    switch: jnp.ndarray  # bool: starting a new replica now
    index: jnp.ndarray  # int32 replica number
    hot: jnp.ndarray  # [D] bool one-hot of `index`
    seg_end: jnp.ndarray  # int32 end of its stream segment
    n_run: jnp.ndarray
    n_pq: jnp.ndarray
    next_k: jnp.ndarray
    submitted: jnp.ndarray
    clock_hi: jnp.ndarray
    clock_lo: jnp.ndarray
    steps: jnp.ndarray
    active: jnp.ndarray  # bool: not done


def current_replica(st: LaneState, lane: LaneInput) -> Replica:
    """Replicas run one after the other: start the next one when the current is done."""
    switch = st.finished & (st.replica + 1 < lane.num_replicas)
    index = st.replica + switch.astype(I32)
    hot = jnp.arange(st.rep_steps.shape[0], dtype=I32) == index
    pick = lambda per_replica: jnp.sum(jnp.where(hot, per_replica, 0))
    seg_start = pick(lane.seg_start)
    restart = lambda fresh, old: jnp.where(switch, fresh, old)
    return Replica(
        switch=switch,
        index=index,
        hot=hot,
        seg_end=seg_start + pick(lane.seg_count),
        n_run=restart(0, st.n_run),
        n_pq=restart(0, st.n_pq),
        next_k=restart(seg_start, st.next_k),
        submitted=restart(seg_start + pick(lane.seg_initial), st.submitted),
        clock_hi=restart(0.0, st.clock_hi).astype(F32),
        clock_lo=restart(0.0, st.clock_lo).astype(F32),
        steps=restart(0, st.steps),
        active=~st.finished | switch,
    )


class Queue(NamedTuple):
    """The waiting queue's first S requests (preempted ones first) and the step's clock."""

    cand_i: jnp.ndarray  # [S, NI] int32 fields of each candidate
    cand_f: jnp.ndarray  # [S, NF] float32 fields
    cand_mark: jnp.ndarray  # [S] int32 a preempted candidate's place in the free queue (LaneState.pq_mark; 0 for the rest)
    valid: jnp.ndarray  # [S] bool: a request that has arrived and waits
    n_wait: jnp.ndarray  # int32 (capped at S)
    t_next: jnp.ndarray  # float32 s: next arrival not yet waiting (inf: none)
    clock_hi: jnp.ndarray  # float32 s: step start (after sleeping until an arrival)
    clock_lo: jnp.ndarray
    nothing_left: jnp.ndarray  # bool: idle, and no request will ever arrive


def stream_window(st: LaneState, lane: LaneInput, rep: Replica):
    """The replica's never-admitted requests, a window of S behind its n_pq preempted ones.

    Returns (their slot-table rows [S, NI] int32, arrival [S] float32 s, inf for the first n_pq
    rows and past the replica's segment).
    """
    num_s = st.run_i.shape[0]
    pos = jnp.arange(num_s, dtype=I32)
    base = num_s + rep.next_k - rep.n_pq
    w_rows = jax.lax.dynamic_slice_in_dim(lane.stream, base, num_s, axis=0)  # [S, NI]
    w_pos = rep.next_k + pos - rep.n_pq
    w_arr = jnp.where((pos < rep.n_pq) | (w_pos >= rep.seg_end), jnp.inf, jax.lax.dynamic_slice_in_dim(st.arrival, base, num_s))
    return w_rows, w_arr


def waiting_queue(st: LaneState, lane: LaneInput, rep: Replica, window=None) -> Queue:
    """Preempted rows first, then the stream window (default `stream_window`); sleep if idle."""
    num_s = st.run_i.shape[0]
    pos = jnp.arange(num_s, dtype=I32)
    w_rows, w_arr = stream_window(st, lane, rep) if window is None else window
    from_pq = pos < rep.n_pq
    t_first = jnp.min(w_arr)
    idle = (rep.n_run == 0) & (rep.n_pq == 0) & (t_first > rep.clock_hi + rep.clock_lo)
    wake = idle & jnp.isfinite(t_first)  # sleep until the next arrival
    hi = jnp.where(wake, t_first, rep.clock_hi)
    lo = jnp.where(wake, 0.0, rep.clock_lo).astype(F32)
    arrived = w_arr <= hi + lo
    valid = from_pq | arrived
    fresh_f = jnp.where(jnp.arange(NF) == ARRIVAL, w_arr[:, None], empty_rows(1)[1])  # arrived, nothing else yet
    cand_i, cand_f = materialize(jnp.where(from_pq[:, None], st.pq_i, w_rows), jnp.where(from_pq[:, None], st.pq_f, fresh_f))
    mark = jnp.where(from_pq, st.pq_mark, 0)
    return Queue(cand_i, cand_f, mark, valid, jnp.sum(valid).astype(I32), jnp.min(jnp.where(arrived, jnp.inf, w_arr)), hi, lo, idle & ~wake)


class Plan(NamedTuple):
    """Who runs this step with how many tokens. Vectors [S] over the running list / the queue."""

    grant: jnp.ndarray  # [S] int32 tokens for each kept running request (0 for the rest)
    kept: jnp.ndarray  # int32 m: running requests not preempted (a prefix)
    c_grant: jnp.ndarray  # [S] int32 tokens for each admitted candidate (0 for the rest)
    c_hit: jnp.ndarray  # [S] int32 tokens each candidate finds in the prefix cache (whole blocks)
    admitted: jnp.ndarray  # int32 a: candidates admitted (a prefix)
    used0: jnp.ndarray  # int32 KV blocks in use before the step
    used_step: jnp.ndarray  # int32 KV blocks in use during the step
    free0: jnp.ndarray  # int32 free KV blocks before the step
    popped: jnp.ndarray  # int32 blocks the step takes off the free queue's head (plain step)
    victim_mark: jnp.ndarray  # [S] int32 each running request's place in the free queue, were it preempted (LaneState.pq_mark)
    overflow: jnp.ndarray  # bool: admission stopped only because the S rows were full
    stall: jnp.ndarray  # bool: the oldest request can never fit
    steady: jnp.ndarray  # int32 >= 1: steps over which every kept request's grant stays the same, each
    # prompt chunk at its size and none completing a prompt (the decode rows' finishes are not counted)
    closed: jnp.ndarray  # bool: no request can be admitted while the running list is as it is
    # (its grants fill the step's budget, or max_num_seqs run)


def retained_blocks(c_i, mark, popped, block_size: int):
    """[S] int32 whole KV blocks of its own that each waiting request (rows `c_i` [S, NI], places in
    the free queue `mark` [S]) finds in the prefix cache once `popped` more blocks (scalar or [S])
    come off the free queue's head; 0 for a request never preempted (mark 0).

    vLLM V1 frees a preempted request's blocks into the free queue's tail, its last block first, and
    keeps their contents cached until a block is taken off the head for reuse. Its first block then
    sits `mark` blocks from the head, so the first mark - popped of its whole blocks
    (COMP // block_size) are left; a hit covers at most prompt + outputs - 1 tokens."""
    whole = div(jnp.minimum(c_i[:, COMP], jnp.maximum(c_i[:, PROMPT] + c_i[:, OUT] - 1, 0)), block_size)
    return jnp.clip(mark - popped, 0, whole)


def schedule(st: LaneState, lane: LaneInput, rep: Replica, queue: Queue, block_size: int) -> Plan:
    """vLLM's running loop (grants, preemption from the tail) and admission, as prefix sums."""
    num_s = st.run_i.shape[0]
    bs, budget, n = block_size, lane.step_budget, rep.n_run
    pos = jnp.arange(num_s, dtype=I32)
    r_i, c_i = st.run_i, queue.cand_i
    valid = pos < n
    comp = r_i[:, COMP]
    want = jnp.where(valid, r_i[:, PROMPT] + r_i[:, OUT] - comp, 0)
    alloc = jnp.where(valid, cdiv(comp, bs), 0)
    clipped = jnp.minimum(want, lane.budget)  # one micro-batch's budget each
    # Candidates are admitted only where the running requests leave budget, so each got its whole
    # clipped grant, and only in a step without preemption, after every running request's blocks
    # came off the free queue's head: a candidate's own cached blocks are what those left.
    need_all = jnp.sum(cdiv(comp + clipped, bs) - alloc)
    c_ret = retained_blocks(c_i, queue.cand_mark, need_all, bs)
    c_hit = jnp.maximum(c_i[:, HIT], c_ret * bs)
    c_touch = jnp.where(c_ret * bs >= c_i[:, HIT], c_ret, 0)  # blocks taken back, not off the head
    c_want = jnp.where(queue.valid, c_i[:, PROMPT] + c_i[:, OUT] - c_hit, 0)
    c_clipped = jnp.minimum(c_want, lane.budget)
    sums = cumsum(jnp.stack([clipped, alloc, c_clipped]))
    grant = jnp.clip(budget - (sums[0] - clipped), 0, clipped)
    need = cdiv(comp + grant, bs) - alloc
    used0 = jnp.sum(alloc)
    free0 = lane.num_kv_blocks - used0
    c_room = budget - jnp.sum(grant) - (sums[2] - c_clipped)  # budget left before each candidate
    c_grant = jnp.clip(c_room, 0, c_clipped)
    c_blocks = cdiv(c_hit + c_grant, bs)
    sums2 = cumsum(jnp.stack([need, c_blocks, c_touch]))
    # request i keeps running iff its blocks and all before it fit once every
    # request after it is preempted; that set is a prefix of the running list.
    ok = valid & (sums2[0] <= free0 + (used0 - sums[1]))
    m = jnp.sum(ok).astype(I32)
    preempt = m < n
    need_kept = jnp.sum(jnp.where(ok, need, 0))
    victim_alloc = jnp.sum(jnp.where(ok, 0, alloc))
    free1 = free0 + victim_alloc - need_kept
    seats = jnp.minimum(lane.max_num_seqs, num_s)
    c_ok = queue.valid & (c_room > 0) & (n + pos < seats) & (sums2[1] <= free1) & ~preempt
    # An earlier admission of this step that takes a candidate's cached blocks off the head makes
    # it wait a step (vLLM would admit it with the shorter hit): candidates stay a prefix.
    c_pops = c_blocks - c_touch  # blocks off the head: those earlier candidates take are (sums2[1] - sums2[2]) - c_pops
    eroded = c_ret > retained_blocks(c_i, queue.cand_mark, need_all + (sums2[1] - sums2[2]) - c_pops, bs)
    c_ok = c_ok & (pos < jnp.min(jnp.where(eroded, pos, num_s)))
    a = jnp.sum(c_ok).astype(I32)
    # Out of rows: the real scheduler might have admitted more than S requests.
    room_next = jnp.sum(jnp.where(pos == jnp.minimum(a, num_s - 1), c_room, 0))
    more_waiting = (queue.n_wait > a) | (queue.n_wait == num_s)
    overflow = (n + a == num_s) & (num_s < lane.max_num_seqs) & more_waiting & (room_next > 0)
    stall = (preempt & (m == 0)) | ((n == 0) & (queue.n_wait > 0) & (a == 0))
    # A prompt chunk keeps its size while the rest of the prompt stays >= the per-request budget
    # (its clipped size, and so every grant after it, is then the same) and completes no prompt.
    g_ok = jnp.where(ok, grant, 0)
    chunk = (g_ok > 0) & ~((r_i[:, OUT] >= 1) & (want == 1))
    g_safe = jnp.maximum(g_ok, 1)
    k_chunk = jnp.where(want >= lane.budget, jnp.minimum(div_small(jnp.maximum(want - lane.budget, 0), g_safe) + 1, div_small(jnp.maximum(want - 1, 0), g_safe)), 1)
    steady = jnp.maximum(jnp.min(jnp.where(chunk, k_chunk, jnp.iinfo(I32).max)), 1).astype(I32)
    return Plan(
        grant=g_ok,
        kept=m,
        c_grant=jnp.where(c_ok, c_grant, 0),
        c_hit=c_hit,
        admitted=a,
        used0=used0,
        used_step=used0 - victim_alloc + need_kept + jnp.sum(jnp.where(c_ok, c_blocks, 0)),
        free0=free0,
        popped=need_kept + jnp.sum(jnp.where(c_ok, c_pops, 0)),
        victim_mark=free0 - need_kept + used0 - (sums[1] - alloc),
        overflow=overflow,
        stall=stall,
        steady=steady,
        closed=(budget - jnp.sum(g_ok) <= 0) | (n >= lane.max_num_seqs),
    )
