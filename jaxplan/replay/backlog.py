"""Does a replayed deployment keep up with open-loop (Poisson) traffic?

A finite replay cannot show it by its throughput: output tokens over the whole run, ramp and drain
included, are below the offered rate for every deployment, the ones that keep up included. What
separates them is the waiting queue (requests arrived and never yet admitted). vLLM admits a
replica's waiting requests first come, first served, so its queue is empty between the admission of
a request and the arrival of the replica's next one whenever the first comes before the second. A
replica that keeps up empties its queue again and again (a stable queue is regenerative); one that
falls behind stops emptying it once it saturates, and the queue then grows for as long as requests
arrive. A deployment *falls behind* when most of its replicas' queues never empty over the last
third of the arrival span: late enough for an overloaded replica to have filled its slots, long
enough for a stable one to have emptied its queue many times. A replica that received fewer than
MIN_JUDGED_ARRIVALS requests in that third is not judged. A run whose slots fill only near its end
cannot show an overload: it then counts as keeping up, as stage 4 judged it. The false-alarm and
detection rates on simulated queues are in docs/usage.md ("How it ranks").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Arrivals a replica needs in the judged span for its queue to be judged: with fewer, a busy but
# stable replica may stay queued through the whole span by chance.
MIN_JUDGED_ARRIVALS = 8
# The judged part of the arrival span starts this far in: later finds an overload that fills its
# slots late in a short run, earlier gives a stable replica's chance long queue less room (the
# rates of both, for the last half, third and quarter, in docs/usage.md).
JUDGED_FROM = 2.0 / 3.0


class Backlog(NamedTuple):
    """How each finalist's waiting queue evolved while requests arrived; each [F]."""

    falls_behind: np.ndarray  # bool: most judged replicas' queues never empty in the last third of the arrivals
    queue_at_last_arrival: np.ndarray  # int: requests waiting (never admitted) when the last one arrives, all replicas
    sustained_output_tokens_per_s: np.ndarray  # output tokens made in that third / its length


def backlog(arrival_s, admit_s, ttft_s, e2e_s, replica, output_tokens) -> Backlog:
    """The queue verdict from a replay's record: arrival, first admission, time to first token and
    end-to-end times [F, R] (s; inf arrival: never submitted, nan: never), the replica of each
    request [F, R], output tokens [R]. Host NumPy over F x R: a few sorts."""
    arrival = np.asarray(arrival_s, np.float64)
    admit = np.nan_to_num(np.asarray(admit_s, np.float64), nan=np.inf)
    first_token = arrival + np.nan_to_num(np.asarray(ttft_s, np.float64), nan=np.inf)
    finish = arrival + np.nan_to_num(np.asarray(e2e_s, np.float64), nan=np.inf)
    rep = np.asarray(replica, np.int64)
    submitted = np.isfinite(arrival)
    first = np.min(np.where(submitted, arrival, np.inf), -1, keepdims=True)
    last = np.max(np.where(submitted, arrival, -np.inf), -1, keepdims=True)
    start = first + JUDGED_FROM * (last - first)  # [F, 1]: the judged span is [start, last]

    # Each finalist's requests by replica, then arrival (never-submitted ones last).
    order = np.lexsort((arrival, np.where(submitted, rep, np.iinfo(np.int64).max)), axis=-1)
    arr, adm, rp, sub = (np.take_along_axis(x, order, -1) for x in (arrival, admit, rep, submitted))
    same_next = np.concatenate([(rp[:, 1:] == rp[:, :-1]) & sub[:, 1:], np.zeros_like(sub[:, :1])], -1)
    next_arrival = np.where(same_next, np.concatenate([arr[:, 1:], arr[:, :1]], -1), np.inf)
    # Empty over (admission of k, next arrival on its replica): does that interval meet [start, last]?
    empties = sub & (adm < next_arrival) & (adm <= last) & (next_arrival >= start)
    # ... or over the replica's start, before its first arrival, if that falls in the judged span.
    starts = sub & np.concatenate([np.ones_like(sub[:, :1]), rp[:, 1:] != rp[:, :-1]], -1)
    empties |= starts & (arr >= start)
    judged = sub & (arr >= start)

    num_replicas = int(rp[sub].max(initial=0)) + 1
    slot = np.where(sub, rp, num_replicas)  # never-submitted ones to a bin past the replicas
    emptied = per_replica(empties, slot, num_replicas + 1, np.logical_or, False, bool)
    arrivals = per_replica(judged, slot, num_replicas + 1, dtype=np.int64)
    judged_replicas = arrivals[:, :num_replicas] >= MIN_JUDGED_ARRIVALS
    stuck = np.sum(judged_replicas & ~emptied[:, :num_replicas], -1)
    # Most judged replicas stuck: identical replicas share one load, so a lone stuck one among many
    # is a stable replica's chance long excursion, not the deployment falling behind.
    falls_behind = 2 * stuck > np.sum(judged_replicas, -1)

    queue = np.sum(submitted & (arrival <= last) & (admit > last), -1)
    # Output tokens made over [start, last], each request's spread evenly from its first token to its
    # last: finishes alone come in waves where requests were admitted together.
    made = tokens_by(last, first_token, finish, output_tokens) - tokens_by(start, first_token, finish, output_tokens)
    sustained = np.sum(made, -1) / np.maximum(last - start, 1e-30)[:, 0]
    return Backlog(falls_behind, queue.astype(np.int64), np.where(last[:, 0] > start[:, 0], sustained, np.nan))


def per_replica(values, replica, num_replicas: int, ufunc=np.add, fill=0, dtype=np.float64) -> np.ndarray:
    """[F, num_replicas] `ufunc` over each replica's requests of `values` [F, R] (or broadcast to it),
    `replica` [F, R] the replica of each request; `fill` where a replica has none."""
    out = np.full((replica.shape[0], num_replicas), fill, dtype)
    ufunc.at(out, (np.arange(replica.shape[0])[:, None], replica), np.broadcast_to(values, replica.shape))
    return out


def tokens_by(t_s, first_token_s, finish_s, output_tokens):
    """[F, R] output tokens each request has made by time `t_s` [F, 1]: its first at `first_token_s`,
    the rest evenly until `finish_s` (inf: unfinished, only the first counted)."""
    out = np.asarray(output_tokens, np.float64)[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.clip((t_s - first_token_s) / (finish_s - first_token_s), 0.0, 1.0)
    share = np.where(finish_s <= first_token_s, (t_s >= finish_s).astype(np.float64), np.nan_to_num(share, nan=0.0))
    return np.where(t_s >= first_token_s, 1.0 + (out - 1.0) * share, 0.0)
