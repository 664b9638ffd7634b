"""How often the replay's queue verdict (`jaxplan.replay.backlog`) says a deployment falls behind, on
first-come-first-served servers simulated in plain Python (`jaxplan.replay.fifo_reference`) at a known
load rho (arrival rate x mean service time / slots; exponential service times, Poisson arrivals,
round-robin over replicas). Below rho = 1 a "falls behind" is a false alarm, above it a detection.
The table in docs/usage.md ("How it ranks") is this script's output:

    python bench/bench_queue_verdict.py               # 200 seeds a cell, about a minute
    python bench/bench_queue_verdict.py --seeds 50    # quicker, coarser
"""

from __future__ import annotations

import argparse

from jaxplan.replay.fifo_reference import falls_behind_rate

RHOS = (0.8, 0.9, 0.95, 1.05, 1.1, 1.2, 1.5)
# (replicas, slots per replica, requests): one slot, a replica of many, several replicas, the
# sweep's 2,000 replayed requests, and a shorter run.
SHAPES = ((1, 1, 2000), (1, 16, 2000), (1, 128, 2000), (8, 16, 2000), (8, 16, 500))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args()
    print(f"share of {args.seeds} seeded runs said to fall behind, by load rho")
    print("| replicas x slots, requests | " + " | ".join(f"rho {r:g}" for r in RHOS) + " |")
    print("|---|" + "---:|" * len(RHOS))
    for replicas, slots, requests in SHAPES:
        rates = [falls_behind_rate(rho, slots, requests, args.seeds, replicas) for rho in RHOS]
        print(f"| {replicas} x {slots}, {requests:,} | " + " | ".join(f"{r:.0%}" for r in rates) + " |")


if __name__ == "__main__":
    main()
