"""One iteration of one lane: pick the replica, read the queue, schedule, execute.

Written for one lane (one finalist) and vmapped over finalists by the driver.
"""

from __future__ import annotations

from jaxplan.replay.execute import advance, time_steps
from jaxplan.replay.scheduler import LaneInput, current_replica, schedule, waiting_queue
from jaxplan.replay.state import LaneState


def lane_step(st: LaneState, lane: LaneInput, params, freeze_on_overflow, *, step_time_fn, window: int, block_size: int) -> LaneState:
    """Advance one lane by one scheduler step, or by a jump of up to `window` steps with the same grants.

    params: this finalist's step-time parameters (a slice of step_params).
    freeze_on_overflow: a lane that runs out of slot rows keeps its state (flagged),
    so that the host can give it more rows and resume exactly there.
    """
    rep = current_replica(st, lane)
    queue = waiting_queue(st, lane, rep)
    plan = schedule(st, lane, rep, queue, block_size)
    live = rep.active & ~queue.nothing_left
    stall = live & plan.stall
    overflow = live & ~stall & plan.overflow
    runs = live & ~stall & ~(overflow & freeze_on_overflow)
    timing = time_steps(st, rep, queue, plan, params, step_time_fn=step_time_fn, window=window, block_size=block_size)
    return advance(st, lane, rep, queue, plan, timing, runs=runs, stall=stall, overflow=overflow)
