"""A plain-Python reference of the replay's scheduler, written for clarity, not speed.

It implements the same vLLM-V1-style semantics as `jaxplan.replay.scheduler`
(see that module's docstring) with ordinary lists and loops, one step at a
time, and KV blocks by id in a free queue with prefix caching (`RefBlockPool`)
where the replay counts them: round robin replays one replica after the
other, least loaded runs all replicas in one event loop (`least_loaded`), and
so does vLLM's DP coordinator over lock-step groups of ranks (`dp_coordinator`). The JAX replay must match it
exactly (step counts, the step of each request's first token and finish,
preemptions, replicas) whenever the arithmetic on times is exact (e.g. dyadic
step times and arrivals).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from collections.abc import Callable

import numpy as np

from jaxplan.replay.traffic import Requests


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class RefBlockPool:
    """vLLM V1's KV block pool with prefix caching, block by block: a free queue (least recently
    freed at the head), from whose head new blocks are taken, dropping what they cached, and the
    whole blocks a preempted request left cached, found by (request, block index)."""

    def __init__(self, num_blocks: int):
        self.queue: OrderedDict[int, tuple[int, int] | None] = OrderedDict((b, None) for b in range(num_blocks))
        self.where: dict[tuple[int, int], int] = {}  # (request id, block index) -> free block caching it

    def __len__(self) -> int:
        return len(self.queue)

    def take(self, n: int) -> list[int]:
        """n blocks off the head; their cached contents are gone."""
        blocks = []
        for _ in range(n):
            block, key = self.queue.popitem(last=False)
            if key is not None:
                del self.where[key]
            blocks.append(block)
        return blocks

    def give(self, req: RefRequest, full: int):
        """Free the request's blocks to the tail, its last block first (vLLM frees in reverse so that a
        request's tail is evicted first); its first `full` blocks stay cached."""
        for j in reversed(range(len(req.blocks))):
            key = (req.rid, j) if j < full else None
            self.queue[req.blocks[j]] = key
            if key is not None:
                self.where[key] = req.blocks[j]
        req.blocks = []

    def cached(self, req: RefRequest, block_size: int) -> int:
        """Whole blocks of the request's own still cached from its first on, at most prompt + outputs - 1 tokens."""
        cap = max(req.prompt + req.out - 1, 0) // block_size
        j = 0
        while j < cap and (req.rid, j) in self.where:
            j += 1
        return j

    def reclaim(self, req: RefRequest, n: int) -> list[int]:
        """The request takes its first n cached blocks back; the rest of what it cached is forgotten."""
        blocks = [self.where.pop((req.rid, j)) for j in range(n)]
        for block in blocks:
            del self.queue[block]
        for key in [key for key in self.where if key[0] == req.rid]:
            self.queue[self.where.pop(key)] = None
        return blocks


@dataclasses.dataclass
class RefRequest:
    rid: int
    prompt: int
    osl: int
    hit: int  # prefix-cache hit tokens, whole blocks, <= prompt - 1
    arrival: float | None  # None: not submitted yet (closed loop)
    computed: int = 0  # tokens in KV (vLLM num_computed_tokens)
    out: int = 0  # output tokens produced so far
    preemptions: int = 0
    admit_time: float | None = None
    first_token_step: int = -1
    first_token_time: float | None = None
    finish_step: int = -1
    finish_time: float | None = None
    replica: int = -1  # the replica it was routed to (-1: never)
    blocks: list[int] = dataclasses.field(default_factory=list)  # KV block ids it holds, in order


@dataclasses.dataclass
class RefReplica:
    steps: int = 0
    clock: float = 0.0  # the scheduler's clock, seconds
    last_step_end: float = 0.0  # when its last step ended, seconds
    preemptions: int = 0
    peak_kv_blocks: int = 0
    stalled: bool = False
    tokens_out: int = 0
    kv_block_steps: int = 0  # sum over steps of KV blocks in use
    scheduled_sum: int = 0  # sum over steps of requests scheduled


@dataclasses.dataclass
class RefResult:
    requests: list[RefRequest]  # indexed by global request id
    replicas: list[RefReplica]


class RefScheduler:
    """One replica's scheduler: its queues, its clock, one step at a time."""

    def __init__(self, stream: list[RefRequest], *, max_num_seqs: int, budget: int, step_budget: int, num_kv_blocks: int, block_size: int, step_time: Callable[[dict], float], closed: bool, prefix_caching: bool = True):
        """budget: most tokens of one request per step; step_budget: of the whole step (PP micro-batches);
        prefix_caching: a preempted request's blocks stay cached until reused."""
        self.max_num_seqs, self.budget, self.step_budget, self.num_kv_blocks, self.bs = max_num_seqs, budget, step_budget, num_kv_blocks, block_size
        self.step_time, self.closed, self.prefix_caching = step_time, closed, prefix_caching
        # closed loop: no client sends a second request before the last one has started
        self.last_start = max((r.arrival for r in stream if r.arrival is not None), default=0.0)
        self.rep = RefReplica()
        self.pending = deque(stream)  # not yet arrived, in stream order
        self.waiting: deque[RefRequest] = deque()  # FCFS; preempted requests go to the front
        self.running: list[RefRequest] = []  # in order of (re)admission
        self.pool = RefBlockPool(num_kv_blocks)

    def next_start(self) -> float | None:
        """When its next step starts (it sleeps until a request arrives), or None: nothing to do, or stalled."""
        if self.rep.stalled:
            return None
        if self.running or self.waiting:
            return self.rep.clock
        if self.pending and self.pending[0].arrival is not None:
            return max(self.rep.clock, self.pending[0].arrival)
        return None

    def step(self) -> list[RefRequest]:
        """Run its next step (call only when next_start() is not None); the requests it finished."""
        scheduled, batch = self.plan(self.next_start())
        if batch is None:
            return []
        return self.execute(scheduled, self.rep.clock + self.step_time(batch))

    def plan(self, now: float):
        """Schedule a step starting at `now`: (scheduled [(request, new tokens, tokens in KV before)],
        its batch dict), or ([], None) if the replica stalls. With nothing to run (a lock-step rank's
        dummy step), ([], an empty batch)."""
        bs, budget, num_kv_blocks, rep = self.bs, self.budget, self.num_kv_blocks, self.rep
        pending, waiting, running = self.pending, self.waiting, self.running
        rep.clock = now
        while pending and pending[0].arrival is not None and pending[0].arrival <= rep.clock:
            waiting.append(pending.popleft())
        batch = {"prefill_tokens": 0.0, "decode_tokens": 0.0, "decode_context_tokens": 0.0, "prefill_attention_pairs": 0.0, "prefill_seqs": 0.0, "prefill_context_tokens": 0.0}
        if not running and not waiting:
            return [], batch

        # A request that cannot fit even alone can never finish: stop the replica.
        pool = self.pool
        head = running[0] if running else waiting[0]
        head_kv = head.computed if running else max(head.hit, pool.cached(head, bs) * bs)
        head_new = min(head.prompt + head.out - head_kv, budget)
        if _blocks(head_kv + head_new, bs) > num_kv_blocks:
            rep.stalled = True
            return [], None

        token_budget = self.step_budget
        scheduled: list[tuple[RefRequest, int, int]] = []  # (request, new tokens, tokens in KV before)
        preempted_any = False
        i = 0
        # 1. Running requests, in order: the next prefill chunk, or one decode token.
        while i < len(running) and token_budget > 0:
            req = running[i]
            new = min(req.prompt + req.out - req.computed, budget, token_budget)
            need = _blocks(req.computed + new, bs) - _blocks(req.computed, bs)
            self_preempted = False
            while need > len(pool):  # preempt the most recently admitted running request
                victim = running.pop()
                pool.give(victim, victim.computed // bs if self.prefix_caching else 0)
                victim.computed = 0
                victim.preemptions += 1
                rep.preemptions += 1
                waiting.appendleft(victim)
                preempted_any = True
                if victim is req:
                    self_preempted = True
                    break
            if self_preempted:
                break
            req.blocks += pool.take(need)
            token_budget -= new
            scheduled.append((req, new, req.computed))
            i += 1
        # 2. Waiting requests, FCFS, only in a step without preemption. A request whose cached blocks
        # an earlier admission of this step took off the head waits a step (as the replay does).
        admitted = set()
        if not preempted_any:
            cached_before = {req.rid: pool.cached(req, bs) for req in waiting}
            while waiting and token_budget > 0 and len(running) < self.max_num_seqs:
                req = waiting[0]
                cached = pool.cached(req, bs)
                if cached < cached_before[req.rid]:
                    break
                own = cached if cached * bs >= req.hit else 0  # blocks it takes back
                kv = max(req.hit, cached * bs)
                new = min(req.prompt + req.out - kv, budget, token_budget)
                need = _blocks(kv + new, bs)
                if need > len(pool):
                    break
                waiting.popleft()
                running.append(req)
                req.blocks = pool.reclaim(req, own)
                req.blocks += pool.take(need - own)
                req.computed = kv
                admitted.add(req.rid)
                if req.admit_time is None:
                    req.admit_time = rep.clock
                token_budget -= new
                scheduled.append((req, new, kv))
        assert scheduled, "the oldest request always gets a token once it fits alone"
        rep.peak_kv_blocks = max(rep.peak_kv_blocks, num_kv_blocks - len(pool))
        rep.kv_block_steps += num_kv_blocks - len(pool)
        rep.scheduled_sum += len(scheduled)

        for req, new, before in scheduled:
            # a request admitted this step is a prefill (a readmitted one too, even of one token)
            if req.out >= 1 and before == req.prompt + req.out - 1 and req.rid not in admitted:
                batch["decode_tokens"] += 1
                batch["decode_context_tokens"] += before + 1
            else:
                batch["prefill_tokens"] += new
                batch["prefill_attention_pairs"] += new * (before + new / 2)
                batch["prefill_seqs"] += 1
                batch["prefill_context_tokens"] += before
        return scheduled, batch

    def execute(self, scheduled, end: float) -> list[RefRequest]:
        """Execute a planned step that ends at `end` s; the requests it finished."""
        rep, pending, running = self.rep, self.pending, self.running
        finished = []
        for req, new, before in scheduled:
            req.computed = before + new
            if req.computed == req.prompt + req.out:  # the step samples a token for it
                req.out += 1
                rep.tokens_out += 1
                if req.out == 1:
                    req.first_token_step, req.first_token_time = rep.steps, end
                if req.out >= req.osl:
                    req.finish_step, req.finish_time = rep.steps, end
                    running.remove(req)
                    self.pool.give(req, 0)
                    finished.append(req)
                    if self.closed:  # the replica's own client sends its next request
                        nxt = next((p for p in pending if p.arrival is None), None)
                        if nxt is not None:
                            nxt.arrival = max(end, self.last_start)
        rep.clock = rep.last_step_end = end
        rep.steps += 1
        return finished


def run_replica(stream: list[RefRequest], *, max_steps: int = 10**7, **kwargs) -> RefReplica:
    """Replay one replica's request stream (in routing order) step by step."""
    scheduler = RefScheduler(stream, **kwargs)
    while scheduler.rep.steps < max_steps and scheduler.next_start() is not None:
        scheduler.step()
    return scheduler.rep


def least_loaded(reqs: list[RefRequest], dp: int, closed_concurrency: int, **kwargs) -> list[RefReplica]:
    """All replicas in one event loop; each arrival goes to the replica with the fewest outstanding requests.

    Events in time order; at one time, closed-loop submissions (earliest replica
    first), then arrivals (in request order), then step starts (lowest replica
    first). A request counts as outstanding on its replica from its arrival
    until its finish time; one that finishes exactly at an arrival no longer
    counts. Closed loop: each finish submits the next request, arriving then.
    """
    schedulers = [RefScheduler([], closed=False, **kwargs) for _ in range(dp)]
    routed: list[list[RefRequest]] = [[] for _ in range(dp)]
    unrouted = deque(r for r in reqs if r.arrival is not None)  # arrival order
    next_submit = closed_concurrency
    submissions: list[tuple[float, int, int]] = []  # closed loop: (time, replica, requests) not yet submitted

    def outstanding(d: int, t: float) -> int:
        return sum(1 for r in routed[d] if r.finish_time is None or r.finish_time > t)

    while True:
        events = [(t, 0, d) for t, d, _ in submissions]
        if unrouted:
            events.append((unrouted[0].arrival, 1, unrouted[0].rid))
        events += [(start, 2, d) for d, s in enumerate(schedulers) if (start := s.next_start()) is not None]
        if not events:
            break
        t, kind, who = min(events)
        if kind == 0:  # the client replaces finished requests
            entry = next(e for e in submissions if e[0] == t and e[1] == who)
            submissions.remove(entry)
            for _ in range(entry[2]):
                if next_submit < len(reqs):
                    reqs[next_submit].arrival = t
                    unrouted.append(reqs[next_submit])
                    next_submit += 1
        elif kind == 1:  # route an arrival
            req = unrouted.popleft()
            loads = [outstanding(d, req.arrival) for d in range(dp)]
            d = loads.index(min(loads))
            routed[d].append(req)
            req.replica = d
            schedulers[d].pending.append(req)
        else:
            finished = schedulers[who].step()
            if closed_concurrency > 0 and finished:
                submissions.append((schedulers[who].rep.clock, who, len(finished)))
    return [s.rep for s in schedulers]


def dp_coordinator(reqs: list[RefRequest], dp: int, ranks: int, closed_concurrency: int, **kwargs) -> list[RefReplica]:
    """vLLM's DP deployment of a MoE model: groups of `ranks` consecutive ranks that step together,
    each arrival to the rank with the lowest 4 x waiting + running (of every rank), in one event loop.

    Events in time order as in `least_loaded`; a group's step starts when its earliest rank has
    something to run, and every rank of the group that is not stalled takes part: each schedules
    its own batch (an idle rank an empty one), and the step lasts the longest of their
    step_time(batch with "group_batch_tokens": the prefill + decode tokens of the whole group).
    At a routing time t, a rank's waiting requests are its queue (routed, not admitted, or
    preempted); its running ones are its running list and those of its last step that finished
    after t.
    """
    schedulers = [RefScheduler([], closed=False, **kwargs) for _ in range(dp)]
    groups = [list(range(first, first + ranks)) for first in range(0, dp, ranks)]
    routed: list[list[RefRequest]] = [[] for _ in range(dp)]
    unrouted = deque(r for r in reqs if r.arrival is not None)  # arrival order
    next_submit = closed_concurrency
    submissions: list[tuple[float, int, int]] = []  # closed loop: (time, rank, requests) not yet submitted

    def score(d: int, t: float) -> int:
        s = schedulers[d]
        running = len(s.running) + sum(1 for r in routed[d] if r.finish_time is not None and r.finish_time > t)
        return 4 * (len(s.waiting) + len(s.pending)) + running

    def group_start(members: list[int]) -> float | None:
        starts = [start for d in members if (start := schedulers[d].next_start()) is not None]
        return min(starts) if starts else None

    while True:
        events = [(t, 0, d) for t, d, _ in submissions]
        if unrouted:
            events.append((unrouted[0].arrival, 1, unrouted[0].rid))
        events += [(start, 2, g) for g, members in enumerate(groups) if (start := group_start(members)) is not None]
        if not events:
            break
        t, kind, who = min(events)
        if kind == 0:  # the client replaces finished requests
            entry = next(e for e in submissions if e[0] == t and e[1] == who)
            submissions.remove(entry)
            for _ in range(entry[2]):
                if next_submit < len(reqs):
                    reqs[next_submit].arrival = t
                    unrouted.append(reqs[next_submit])
                    next_submit += 1
        elif kind == 1:  # route an arrival
            req = unrouted.popleft()
            scores = [score(d, req.arrival) for d in range(dp)]
            d = scores.index(min(scores))
            routed[d].append(req)
            req.replica = d
            schedulers[d].pending.append(req)
        else:  # the group's step
            plans = {d: schedulers[d].plan(t) for d in groups[who] if not schedulers[d].rep.stalled}
            plans = {d: p for d, p in plans.items() if p[1] is not None}  # without the ranks that stall now
            if not any(scheduled for scheduled, _ in plans.values()):
                continue
            group_tokens = sum(batch["prefill_tokens"] + batch["decode_tokens"] for _, batch in plans.values())
            end = t + max(schedulers[d].step_time({**batch, "group_batch_tokens": group_tokens}) for d, (_, batch) in plans.items())
            for d, (scheduled, _) in plans.items():
                finished = schedulers[d].execute(scheduled, end)
                if closed_concurrency > 0 and finished:
                    submissions.append((end, d, len(finished)))
    return [s.rep for s in schedulers]


def reference_replay(
    requests: Requests,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_kv_blocks: int,
    data_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    block_size: int = 16,
    step_time: Callable[[dict], float],
    closed_concurrency: int = 0,
    routing: str = "round_robin",
    lockstep_ranks: int = 1,
    prefix_caching: bool = True,
) -> RefResult:
    """Replay one finalist, one scheduler per replica.

    step_time(batch) -> seconds, where batch is a dict with the StepBatch field names.
    pipeline_parallel_size: a step carries that many micro-batches, pp x max_num_batched_tokens
    tokens in all, at most max_num_batched_tokens of them for one request.
    routing "round_robin": request i to replica i % dp; the replicas are
    independent. closed_concurrency: 0 for open loop; else N requests in flight,
    split over min(dp, N) replicas round-robin, each replica's client sending
    its next request when one of its requests finishes.
    routing "least_loaded": see `least_loaded` (closed loop: one client keeps N
    requests in flight over all dp replicas). routing "dp_coordinator": see `dp_coordinator`,
    groups of `lockstep_ranks` ranks in lock-step (closed loop as least loaded).
    prefix_caching: as ReplayConfig's.
    """
    num_r = len(requests.prompt_tokens)
    balanced = routing in ("least_loaded", "dp_coordinator")
    dp = data_parallel_size if closed_concurrency <= 0 or balanced else min(data_parallel_size, closed_concurrency)
    reqs = []
    for i in range(num_r):
        prompt = int(requests.prompt_tokens[i])
        hit = (max(0, min(int(requests.prefix_hit_tokens[i]), prompt - 1)) // block_size) * block_size
        start = float(np.float32(requests.arrival_s[i]))
        if closed_concurrency > 0:  # clients' start times (least-loaded: all at 0, see balance.py)
            start = (0.0 if balanced else start) if i < closed_concurrency else None
        arrival = start
        reqs.append(RefRequest(i, prompt, int(requests.output_tokens[i]), hit, arrival))
    step_budget = max_num_batched_tokens * pipeline_parallel_size
    kwargs = {"max_num_seqs": max_num_seqs, "budget": max_num_batched_tokens, "step_budget": step_budget, "num_kv_blocks": num_kv_blocks, "block_size": block_size, "step_time": step_time, "prefix_caching": prefix_caching}
    if routing == "dp_coordinator":
        return RefResult(reqs, dp_coordinator(reqs, dp, lockstep_ranks, closed_concurrency, **kwargs))
    if balanced:
        return RefResult(reqs, least_loaded(reqs, dp, closed_concurrency, **kwargs))
    for req in reqs:
        req.replica = req.rid % dp
    return RefResult(reqs, [run_replica(reqs[d::dp], closed=closed_concurrency > 0, **kwargs) for d in range(dp)])
