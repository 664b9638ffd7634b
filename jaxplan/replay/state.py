"""Replay state: fixed-size arrays for one lane (one finalist), vmapped over finalists.

Round robin: a lane replays its finalist's replicas one after the other (they
are independent schedulers); scalars describe the current replica, `rep_*`
arrays [D] keep each replica's totals. Least loaded (balance.py): the
per-replica fields (balance.BANK) carry a leading [D] axis, every replica at
once, and stream positions are request ids in arrival order.

Requests in flight live in two ordered slot tables of S rows: `run` (the
running list, in order of admission) and `pq` (requests preempted and waiting
for recompute, front of the waiting queue first). New requests are admitted
only when `pq` is empty, so running + preempted never exceeds max_num_seqs.
S may be smaller than max_num_seqs (rows are a capacity, not a limit): a
lane that would need more raises its `overflow` flag and the host widens the
tables (see driver.py). Never-admitted requests are not copied anywhere: they
are the lane's stream from `next_k` on.

A table is two matrices, int32 [S, NI] and float32 [S, NF] (a request per
row, a field per column, read as `table[..., FIELD]`): moving requests between
tables, which every iteration does, gathers whole rows of contiguous fields,
where a field-per-row table made XLA:CPU transpose every table to gather its
columns and back (bench/README.md, stage 7). Times are float32 seconds; the
clock is a compensated (hi, lo) pair so that long replays (1e5+ steps) do not
lose the step times' low bits.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# int32 columns of a slot table
K, PROMPT, OSL, HIT, COMP, OUT, STEP_FIRST, NPRE = range(8)
NI = 8  # K: index in the lane's stream; COMP: tokens in KV (vLLM num_computed_tokens), of a preempted
# request those it had computed (its whole blocks may still be cached); OUT: output tokens so far;
# STEP_FIRST: step of the first token (-1 before); NPRE: times preempted. Eight int32 columns: a ninth
# makes every row gather of the loop ~20% slower (bench/README.md), so a preempted request's place in
# the free queue is a vector of its own (LaneState.pq_mark).
# float32 columns
ARRIVAL, SINCE, T_ADMIT, TTFT = range(4)
NF = 4  # SINCE: s since the request's last token; T_ADMIT: first admission (nan before); TTFT (nan before)

# Inter-token-latency histogram: bins read straight off float32 bits (exponent and
# ITL_SUB_BITS mantissa bits), i.e. log-spaced with 2**ITL_SUB_BITS bins per octave
# (~1.1% wide), from 2**ITL_MIN_EXP s (~15 us) up; bigger gaps land in the last bin.
ITL_SUB_BITS = 6
ITL_MIN_EXP = -16
ITL_BINS = 32 << ITL_SUB_BITS  # 32 octaves: up to ~65,000 s


class LaneState(NamedTuple):
    """One finalist's replicas, replayed one after the other. Scalars unless noted; vmapped to [F, ...].

    Scalars describe the current replica; `rep_*` arrays [D] accumulate per replica.
    """

    run_i: jnp.ndarray  # [S, NI] running list, rows (requests) < n_run valid
    run_f: jnp.ndarray  # [S, NF]
    n_run: jnp.ndarray
    pq_i: jnp.ndarray  # [S, NI] preempted queue, rows < n_pq valid
    pq_f: jnp.ndarray  # [S, NF]
    pq_mark: jnp.ndarray  # [S] int32 each preempted row's first block's place in the free queue (1 = its
    # head), less the blocks taken off the head since (scheduler.retained_blocks)
    n_pq: jnp.ndarray
    replica: jnp.ndarray  # int32 current replica
    finished: jnp.ndarray  # bool: the current replica is done (or stalled)
    next_k: jnp.ndarray  # stream position of the first never-admitted request
    submitted: jnp.ndarray  # closed loop: stream position of the next unsubmitted request
    arrival: jnp.ndarray  # [S + R + S] float32 s, stream arrival times at offset S (inf = none / not submitted)
    rec_i: jnp.ndarray  # [3, R] int32 by stream position: first-token step, finish step, preemptions
    rec_f: jnp.ndarray  # [3, R] float32 s by stream position: TTFT, end-to-end latency, first admission time
    clock_hi: jnp.ndarray  # float32 s, current replica
    clock_lo: jnp.ndarray  # float32 s, compensation term
    steps: jnp.ndarray  # int32 steps executed by the current replica
    overflow: jnp.ndarray  # bool: more than S requests in flight were needed; results invalid
    itl_hist: jnp.ndarray  # [ITL_BINS] int32 inter-token gaps
    rep_steps: jnp.ndarray  # [D] int32
    rep_iterations: jnp.ndarray  # [D] int32 loop iterations (a jump is one)
    rep_clock: jnp.ndarray  # [D] float32 s when the replica's last step ended
    rep_preemptions: jnp.ndarray  # [D] int32
    rep_tokens_out: jnp.ndarray  # [D] int32 output tokens produced
    rep_peak_kv: jnp.ndarray  # [D] int32 most KV blocks in use in one step
    rep_stalled: jnp.ndarray  # [D] bool: a request can never fit in KV; the replica stopped
    rep_batch: jnp.ndarray  # [D, 2] float32 compensated sum over steps of scheduled requests
    rep_kv: jnp.ndarray  # [D, 2] float32 compensated sum over steps of KV blocks in use


def empty_rows(num_slots: int):
    """Empty slot tables: ints [num_slots, NI], floats [num_slots, NF]."""
    ints = jnp.zeros((num_slots, NI), jnp.int32).at[:, K].set(-1).at[:, STEP_FIRST].set(-1)
    floats = jnp.full((num_slots, NF), jnp.nan, jnp.float32).at[:, SINCE].set(0.0)
    return ints, floats


def stream_rows(stream, num_slots: int):
    """A lane's stream [R, 3] (prompt, osl, hit) as the slot-table rows its requests enter with,
    int32 [S + R + S, NI]: row j is stream position j - S (K), the request's fields, nothing computed
    yet; the S rows before and after are empty requests. The scheduler slices its waiting window
    out of it, whole rows, instead of assembling them every iteration."""
    num_r = stream.shape[0]
    rows = jnp.zeros((num_slots + num_r + num_slots, NI), jnp.int32).at[:, STEP_FIRST].set(-1)
    rows = rows.at[num_slots : num_slots + num_r, PROMPT : HIT + 1].set(stream.astype(jnp.int32))
    return rows.at[:, K].set(jnp.arange(rows.shape[0], dtype=jnp.int32) - num_slots)


def widen_stream_rows(rows, num_slots: int, extra: int):
    """Lanes' `stream_rows` [L, S + R + S, NI] for S = num_slots, rebuilt for S + extra slot rows."""
    return jax.vmap(lambda r: stream_rows(r[num_slots : r.shape[0] - num_slots, PROMPT : HIT + 1], num_slots + extra))(rows)


def gather_rows(parts, dests, num_slots: int):
    """Slot tables (ints [S, NI], floats [S, NF]) filled from `parts`, a list of (ints [n, NI], floats [n, NF]
    [, a vector [n] int32]): row j of part p goes to row dests[p][j] (int32 [n]; num_slots or more:
    nowhere); the rows nothing is sent to are empty (the vector's 0). Destinations must not collide.
    Returns (ints, floats), and the vector [S] where the parts carry one.

    One scatter of source numbers [S], then one gather of whole rows per matrix.
    """
    e_i, e_f = empty_rows(1)
    src_i = jnp.concatenate([p[0] for p in parts] + [e_i], axis=0)
    src_f = jnp.concatenate([p[1] for p in parts] + [e_f], axis=0)
    empty = src_i.shape[0] - 1
    src = jnp.full(num_slots, empty, jnp.int32)
    offset = 0
    for part, dest in zip(parts, dests):
        src = src.at[dest].set(offset + jnp.arange(part[0].shape[0], dtype=jnp.int32), mode="drop")
        offset += part[0].shape[0]
    if len(parts[0]) == 2:
        return src_i[src], src_f[src]
    src_v = jnp.concatenate([p[2] for p in parts] + [jnp.zeros(1, jnp.int32)])
    return src_i[src], src_f[src], src_v[src]


def flush_in_flight(st: LaneState):
    """The lane's records (rec_i, rec_f [3, R] by stream position) with the requests still in its
    slot tables written in, as unfinished: first-token step, no finish step (-1), preemptions; TTFT,
    no end (NaN), first admission. The tables may carry leading axes (least loaded: one per replica,
    with counts [D])."""
    num_r = st.rec_i.shape[-1]
    rec_i, rec_f = st.rec_i, st.rec_f
    for ints, floats, count in ((st.run_i, st.run_f, st.n_run), (st.pq_i, st.pq_f, st.n_pq)):  # two tables
        count = jnp.asarray(count)
        live = jnp.arange(ints.shape[-2]).reshape((1,) * count.ndim + (-1,)) < count[..., None]  # [..., S]
        idx = jnp.where(live, ints[..., K], num_r).reshape(-1)
        flat = lambda x: x.reshape(-1)
        rec_i = rec_i.at[:, idx].set(jnp.stack([flat(ints[..., STEP_FIRST]), jnp.full(idx.shape, -1, jnp.int32), flat(ints[..., NPRE])]), mode="drop")
        rec_f = rec_f.at[:, idx].set(jnp.stack([flat(floats[..., TTFT]), jnp.full(idx.shape, jnp.nan, jnp.float32), flat(floats[..., T_ADMIT])]), mode="drop")
    return rec_i, rec_f


def init_lane(arrival, submitted, max_dp: int, num_slots: int) -> LaneState:
    """Empty state for one lane: stream arrival times [R] (inf = not submitted), first unsubmitted position."""
    num_r = arrival.shape[0]
    pad = jnp.full(num_slots, jnp.inf, jnp.float32)
    z = jnp.zeros((), jnp.int32)
    zf = jnp.zeros((), jnp.float32)
    zd = jnp.zeros(max_dp, jnp.int32)
    ri, rf = empty_rows(num_slots)
    return LaneState(
        run_i=ri,
        run_f=rf,
        n_run=z,
        pq_i=ri,
        pq_f=rf,
        pq_mark=jnp.zeros(num_slots, jnp.int32),
        n_pq=z,
        replica=z,
        finished=jnp.zeros((), bool),
        next_k=z,
        submitted=jnp.asarray(submitted, jnp.int32),
        arrival=jnp.concatenate([pad, arrival.astype(jnp.float32), pad]),
        rec_i=jnp.full((3, num_r), -1, jnp.int32).at[2].set(0),
        rec_f=jnp.full((3, num_r), jnp.nan, jnp.float32),
        clock_hi=zf,
        clock_lo=zf,
        steps=z,
        overflow=jnp.zeros((), bool),
        itl_hist=jnp.zeros(ITL_BINS, jnp.int32),
        rep_steps=zd,
        rep_iterations=zd,
        rep_clock=jnp.zeros(max_dp, jnp.float32),
        rep_preemptions=zd,
        rep_tokens_out=zd,
        rep_peak_kv=zd,
        rep_stalled=jnp.zeros(max_dp, bool),
        rep_batch=jnp.zeros((max_dp, 2), jnp.float32),
        rep_kv=jnp.zeros((max_dp, 2), jnp.float32),
    )


def two_sum_add(hi, lo, x):
    """(hi, lo) + x as a renormalised compensated pair (Knuth's TwoSum)."""
    s = hi + x
    bp = s - hi
    err = (hi - (s - bp)) + (x - bp)
    lo = lo + err
    new_hi = s + lo
    return new_hi, lo - (new_hi - s)


def itl_bin(gap_s):
    """Histogram bin of an inter-token gap, seconds (clipped to the ends)."""
    bits = jax.lax.bitcast_convert_type(jnp.maximum(gap_s, 0.0).astype(jnp.float32), jnp.int32)
    base = (127 + ITL_MIN_EXP) << ITL_SUB_BITS
    return jnp.clip((bits >> (23 - ITL_SUB_BITS)) - base, 0, ITL_BINS - 1)


def itl_bin_value(index) -> np.ndarray:
    """Geometric centre (almost) of ITL bin `index` (NumPy, on the host), float32 seconds."""
    base = (127 + ITL_MIN_EXP) << ITL_SUB_BITS
    bits = ((np.asarray(index, np.int32) + base) << (23 - ITL_SUB_BITS)) | (1 << (22 - ITL_SUB_BITS))
    return bits.astype(np.int32).view(np.float32)
