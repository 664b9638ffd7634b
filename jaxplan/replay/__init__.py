"""Replay: step-by-step vLLM-V1-style continuous batching for a few finalists, in JAX.

    workload = load_workload("coding")
    requests = sample_requests(workload, 5000, seed=0)  # one request set for every finalist
    configs = ReplayConfig.create(max_num_seqs=[256, 128], max_num_batched_tokens=8192,
                                  num_kv_blocks=[20000, 9000], data_parallel_size=[1, 2])
    metrics = simulate(configs, requests, workload, step_time_fn, step_params)  # fields [F]

`step_time_fn(params, StepBatch) -> seconds` is the physics and `step_params`
its per-finalist parameters (a PyTree, leading axis [F]); `step_time_fn` is a
static argument, so pass the same function object on every call. All
finalists run in one vmapped program: their capacities are traced values.
`simulate_trace` returns the raw per-request results (`ReplayTrace`) that
`summarize` turns into `ReplayMetrics`.

Semantics: `scheduler.py` (what each step schedules) and `execute.py` (what
a step does); `reference.py` is the same scheduler in plain Python, which the
replay matches exactly. Requests go to replicas round-robin (`roundrobin.py`) or,
with `routing="least_loaded"` (a ReplayConfig field, or a simulate keyword), to
the replica with the fewest waiting + running requests when they arrive
(`balance.py`); each replica has its own scheduler and KV cache. With
`routing="dp_coordinator"`, groups of `lockstep_ranks` replicas step together
as a MoE model's vLLM DP ranks do, and requests go where vLLM's DP coordinator
sends them (`lockstep.py`; `step_time_fn(params, batch, group_batch_tokens)`). A routing
policy is one `routing.RoutingPolicy` (the functions the driver calls), looked
up by name in `routing.POLICIES`. The replay's
memory is estimated before it runs (`memory.py`): finalists that do not fit at
once run in chunks, and a request count too large for one finalist is refused.
"""

from jaxplan.replay.config import ReplayConfig as ReplayConfig
from jaxplan.replay.driver import ReplayTrace as ReplayTrace
from jaxplan.replay.driver import simulate as simulate
from jaxplan.replay.driver import simulate_trace as simulate_trace
from jaxplan.replay.metrics import LatencyStats as LatencyStats
from jaxplan.replay.metrics import ReplayMetrics as ReplayMetrics
from jaxplan.replay.metrics import summarize as summarize
from jaxplan.replay.traffic import Requests as Requests
from jaxplan.replay.traffic import sample_requests as sample_requests

__all__ = ["LatencyStats", "ReplayConfig", "ReplayMetrics", "ReplayTrace", "Requests", "sample_requests", "simulate", "simulate_trace", "summarize"]
