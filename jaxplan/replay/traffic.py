"""Traffic: sample requests from a workload, and route them to replicas.

Round robin (the default): request `i` goes to replica `i % dp`, as the
`k = i // dp`-th request of that replica's stream. Replicas are independent
schedulers, so a finalist's *lane* replays its replicas one after the other.
Least loaded: the lane's stream is every request in arrival order, and the
replay routes each when it arrives (see balance.py).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxplan.buckets import bucket_size
from jaxplan.errors import bad_value
from jaxplan.replay.clients import output_length_shape
from jaxplan.specs.workload import Arrival, LengthDistribution, Workload

INF = float("inf")


class Requests(NamedTuple):
    """One request set, shared by every finalist of a replay call. Shapes [R].

    prompt_tokens: prompt length (ISL), tokens, >= 1.
    output_tokens: output length (OSL), tokens, >= 1 (the request stops after that many).
    prefix_hit_tokens: prompt tokens already in the prefix cache (rounded down to
        whole KV blocks and capped at prompt - 1 by the scheduler).
    arrival_s: arrival time, seconds, nondecreasing; all 0 for a burst. Closed loop of N
        clients: arrival_s[:N] are the clients' start times (nondecreasing; `sample_requests`
        starts them all at 0, as benchmark clients do), the rest are decided during the replay.
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_hit_tokens: np.ndarray
    arrival_s: np.ndarray

    @property
    def num_requests(self) -> int:
        return int(np.shape(self.prompt_tokens)[0])


def _lengths(rng: np.random.Generator, dist: LengthDistribution, mean: float, spread: float, n: int) -> np.ndarray:
    if dist == LengthDistribution.FIXED or spread == 0:
        values = np.full(n, mean)
    elif dist == LengthDistribution.UNIFORM:
        values = rng.uniform(mean * (1 - spread), mean * (1 + spread), n)
    elif dist == LengthDistribution.LOGNORMAL:
        sigma2 = np.log1p(spread**2)
        values = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)
    else:  # pragma: no cover - enum is closed
        raise bad_value("length distribution", dist, "must be fixed, uniform or lognormal")
    return np.clip(np.rint(values), 1, 2**26).astype(np.int32)


def sample_requests(workload: Workload, num_requests: int | None = None, seed: int = 0) -> Requests:
    """Sample `num_requests` (default `workload.num_requests`) requests with numpy seed `seed`.

    ISL/OSL follow the workload's distributions (or its lengths_file, in order, repeated as needed
    and scaled to the isl/osl means; a closed loop's fixed OSL gets the spread of
    `jaxplan.replay.clients`); prefix hits are
    `floor(prefix_hit_rate * ISL)` tokens; Poisson arrivals start at t = 0 with
    exponential gaps of mean 1 / request_rate_per_s seconds.
    """
    n = workload.num_requests if num_requests is None else num_requests
    if not isinstance(n, (int, np.integer)) or not 1 <= n <= 10_000_000:
        raise bad_value("num_requests", n, "must be an integer in 1..10,000,000", where="sample_requests")
    rng = np.random.default_rng(seed)
    recorded = workload.lengths()
    if recorded is not None:
        prompt, output = recorded.scaled(n, workload.isl_mean_tokens, workload.osl_mean_tokens)
    else:
        prompt = _lengths(rng, workload.isl_distribution, workload.isl_mean_tokens, workload.isl_spread, n)
        osl_distribution, osl_spread = output_length_shape(workload)  # a closed loop's fixed OSL is spread (clients.py)
        output = _lengths(rng, osl_distribution, workload.osl_mean_tokens, osl_spread, n)
    hit = np.floor(workload.prefix_hit_rate * prompt).astype(np.int32)
    if workload.arrival == Arrival.POISSON:
        gaps = rng.exponential(1.0 / workload.request_rate_per_s, n)
        gaps[0] = 0.0
        arrival = np.cumsum(gaps).astype(np.float32)
    else:
        arrival = np.zeros(n, np.float32)
    return Requests(prompt, output, hit, arrival)


# Request counts are padded to a bucket so that replays of nearby counts share their compiled
# programs (~7 s each on 2 cores): at least MIN_REQUEST_BUCKET, a power of two up to
# EXACT_OCTAVE_LIMIT, then a multiple of an eighth of the power of two below (at most 12.5%
# padding where the arrays are large). The loop's cost per iteration does not depend on the
# padding (its work is on the slot rows): 2,000 requests replay in the same time padded to 2,000,
# 9,800 or 102,000 (4 finalists, dp 1-2, 2 cores).
MIN_REQUEST_BUCKET = 256
EXACT_OCTAVE_LIMIT = 4096


def request_bucket(num: int) -> int:
    """Padded request count (>= num) of a replay of `num` requests."""
    num = int(num)
    if num <= EXACT_OCTAVE_LIMIT:
        return bucket_size(num, MIN_REQUEST_BUCKET)
    step = 1 << (num.bit_length() - 4)  # an eighth of the power of two <= num
    return -(-num // step) * step


def pad_requests(requests: Requests, size: int) -> Requests:
    """`requests` [R] padded to [size] (NumPy) with requests that never arrive (arrival inf, one
    prompt and one output token); the lanes route only the first R (`build_lanes`' num_requests)."""
    num = requests.num_requests
    if size < num:
        raise bad_value("size", size, f"must be >= the {num} requests")
    extra = size - num
    pad = lambda x, value, dtype: np.concatenate([np.asarray(x, dtype), np.full(extra, value, dtype)])  # noqa: E731
    return Requests(
        pad(requests.prompt_tokens, 1, np.int32), pad(requests.output_tokens, 1, np.int32), pad(requests.prefix_hit_tokens, 0, np.int32), pad(requests.arrival_s, np.inf, np.float32)
    )


class Lanes(NamedTuple):
    """One lane per finalist: its replicas' request streams back to back. Leading axis [F].

    Round-robin routing sends request i to replica d = i % dp as that replica's
    k = i // dp-th request; the lane's stream holds replica 0's requests, then
    replica 1's, ...: request i sits at position seg_start[d] + k.
    """

    ids: jnp.ndarray  # [F, R] int32 request at each stream position
    stream: jnp.ndarray  # [F, R, 3] int32 (prompt, osl, prefix hit in whole blocks <= prompt - 1)
    arrival: jnp.ndarray  # [F, R] float32 s; inf = not (yet) submitted
    position: jnp.ndarray  # [F, R] int32 stream position of each request
    seg_start: jnp.ndarray  # [F, D] int32 first stream position of each replica
    seg_count: jnp.ndarray  # [F, D] int32 requests of each replica (0 past dp)
    seg_initial: jnp.ndarray  # [F, D] int32 closed loop: requests submitted at t = 0
    num_replicas: jnp.ndarray  # [F] int32 replicas that receive requests
    closed: jnp.ndarray  # [F] bool: closed loop (a finish submits the replica's next request)
    max_num_seqs: jnp.ndarray  # [F] int32
    budget: jnp.ndarray  # [F] int32 max_num_batched_tokens: most tokens of one request per step
    step_budget: jnp.ndarray  # [F] int32 pp x max_num_batched_tokens: tokens of one replica step
    num_kv_blocks: jnp.ndarray  # [F] int32
    num_requests: jnp.ndarray  # [F] int32 real requests: stream positions >= it are padding


def routing_dp(data_parallel_size, closed_concurrency, xp=jnp):
    """Replicas that receive requests: dp, or min(dp, concurrency) in closed loop. [F].
    xp: jax.numpy (traced) or numpy (on the host, no XLA program)."""
    dp = xp.asarray(data_parallel_size, xp.int32)
    conc = xp.asarray(closed_concurrency, xp.int32)
    return xp.where(conc > 0, xp.minimum(dp, xp.maximum(conc, 1)), dp)


def build_lanes(requests: Requests, config, closed_concurrency, max_dp: int, num_requests=None) -> Lanes:
    """Round-robin split of `requests` over each finalist's replicas (traceable).

    num_requests: the real requests (int32 scalar, may be traced), the first of the arrays' R;
    default R. Stream positions past them (padding, see `pad_requests`) are in no replica's
    segment, so no replica ever admits them; request i >= num_requests sits at position i.

    closed_concurrency: 0 for open loop (arrival_s used), else the client's
    concurrency N: replica d of a finalist with dp' routed replicas starts with
    the ceil((N - d) / dp') requests j < N, j = d mod dp', at their clients' start times
    arrival_s[j], and each finish submits that replica's next request (never before the
    replica's last client has started, so that arrivals stay in stream order).
    """
    num_r = requests.prompt_tokens.shape[0]
    n = jnp.asarray(num_r if num_requests is None else num_requests, jnp.int32)
    bs = config.block_size
    dp = routing_dp(config.data_parallel_size, closed_concurrency)[:, None]  # [F, 1]
    d = jnp.arange(max_dp, dtype=jnp.int32)[None, :]  # [1, D]
    count = jnp.where(d < dp, (n - d + dp - 1) // dp, 0)  # [F, D]
    start = jnp.cumsum(count, axis=1) - count
    p = jnp.arange(num_r, dtype=jnp.int32)[None, :]  # stream positions
    real = p < n
    rep = jnp.sum(start[:, None, 1:] <= p[:, :, None], axis=-1) if max_dp > 1 else jnp.zeros_like(p)  # [F, R]
    k = p - jnp.take_along_axis(start, rep, axis=1)
    ids = jnp.where(real, rep + k * dp, p)
    prompt = jnp.asarray(requests.prompt_tokens, jnp.int32)[ids]
    hit_raw = jnp.asarray(requests.prefix_hit_tokens, jnp.int32)[ids]
    hit = (jnp.clip(jnp.minimum(hit_raw, prompt - 1), 0) // bs) * bs
    conc = jnp.asarray(closed_concurrency, jnp.int32)
    closed = conc > 0
    initial = jnp.minimum(count, jnp.where(d < dp, (jnp.maximum(conc - d, 0) + dp - 1) // dp, 0))
    given = jnp.where(real, jnp.asarray(requests.arrival_s, jnp.float32)[ids], INF)
    arrival = jnp.where(closed, jnp.where(k < jnp.take_along_axis(initial, rep, axis=1), given, INF), given)
    i = jnp.arange(num_r, dtype=jnp.int32)[None, :]
    position = jnp.where(i < n, jnp.take_along_axis(start, i % dp, axis=1) + i // dp, i)
    num_f = dp.shape[0]
    return Lanes(
        ids=ids,
        stream=jnp.stack([prompt, jnp.asarray(requests.output_tokens, jnp.int32)[ids], hit], -1),
        arrival=arrival.astype(jnp.float32),
        position=position,
        seg_start=start,
        seg_count=count,
        seg_initial=jnp.where(closed, initial, count),
        num_replicas=dp[:, 0],
        closed=jnp.broadcast_to(closed, (num_f,)),
        max_num_seqs=jnp.asarray(config.max_num_seqs, jnp.int32),
        budget=jnp.asarray(config.max_num_batched_tokens, jnp.int32),
        step_budget=jnp.asarray(config.max_num_batched_tokens, jnp.int32) * jnp.asarray(config.pipeline_parallel_size, jnp.int32),
        num_kv_blocks=jnp.asarray(config.num_kv_blocks, jnp.int32),
        num_requests=jnp.broadcast_to(n, (num_f,)),
    )


def build_balanced_lanes(requests: Requests, config, closed_concurrency, max_dp: int, num_requests=None) -> tuple[Lanes, jnp.ndarray]:
    """Least-loaded lanes (traceable): each lane's stream is every request in arrival order.

    Routing happens during the replay, so the segments are unused (zeros) and
    every one of dp replicas may receive requests. Closed loop: the first N
    requests arrive at t = 0, the rest when the client submits them.
    num_requests: as for `build_lanes`; requests past them never arrive and are never submitted.
    Returns the lanes and the first unsubmitted stream position [F].
    """
    num_r = requests.prompt_tokens.shape[0]
    n = jnp.asarray(num_r if num_requests is None else num_requests, jnp.int32)
    bs = config.block_size
    dp = jnp.asarray(config.data_parallel_size, jnp.int32)
    num_f = dp.shape[0]
    prompt = jnp.asarray(requests.prompt_tokens, jnp.int32)
    hit = (jnp.clip(jnp.minimum(jnp.asarray(requests.prefix_hit_tokens, jnp.int32), prompt - 1), 0) // bs) * bs
    conc = jnp.asarray(closed_concurrency, jnp.int32)
    closed = conc > 0
    i = jnp.arange(num_r, dtype=jnp.int32)
    arrival = jnp.where(i < n, jnp.where(closed, jnp.where(i < conc, 0.0, INF), jnp.asarray(requests.arrival_s, jnp.float32)), INF)
    zeros = jnp.zeros((num_f, max_dp), jnp.int32)
    lanes = Lanes(
        ids=jnp.broadcast_to(i, (num_f, num_r)),
        stream=jnp.broadcast_to(jnp.stack([prompt, jnp.asarray(requests.output_tokens, jnp.int32), hit], -1), (num_f, num_r, 3)),
        arrival=jnp.broadcast_to(arrival.astype(jnp.float32), (num_f, num_r)),
        position=jnp.broadcast_to(i, (num_f, num_r)),
        seg_start=zeros,
        seg_count=zeros,
        seg_initial=zeros,
        num_replicas=dp,
        closed=jnp.broadcast_to(closed, (num_f,)),
        max_num_seqs=jnp.asarray(config.max_num_seqs, jnp.int32),
        budget=jnp.asarray(config.max_num_batched_tokens, jnp.int32),
        step_budget=jnp.asarray(config.max_num_batched_tokens, jnp.int32) * jnp.asarray(config.pipeline_parallel_size, jnp.int32),
        num_kv_blocks=jnp.asarray(config.num_kv_blocks, jnp.int32),
        num_requests=jnp.broadcast_to(n, (num_f,)),
    )
    submitted = jnp.where(closed, jnp.minimum(conc, n), n)
    return lanes, jnp.broadcast_to(submitted, (num_f,))


def split_lanes(lanes: Lanes, finalist, first, end) -> Lanes:
    """Round robin: lanes [L] that each replay the replicas [first, end) of finalist `finalist` (traceable).

    Replicas are independent under round robin, so a finalist's replicas may be spread over
    several lanes: lane l is its finalist's lane with the same stream and segment tables, but it
    starts at replica first[l] (the driver sets its state there) and stops after replica end[l] - 1.
    A lane with end <= first is padding: no requests, done after one iteration.
    """
    finalist, first, end = (jnp.asarray(x, jnp.int32) for x in (finalist, first, end))
    out = Lanes(*(x[finalist] for x in lanes))
    empty = (end <= first)[:, None]
    return out._replace(
        seg_count=jnp.where(empty, 0, out.seg_count),
        seg_initial=jnp.where(empty, 0, out.seg_initial),
        num_replicas=jnp.where(end <= first, 1, end),
    )
