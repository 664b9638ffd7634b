"""What the GPU budget costs an empty sweep: the same grid swept again without it.

An empty sweep's explanation names the sieve that removed the last candidates and its fix, which is
often "raise --budget". Whether that helps is a question the funnel can answer: the budget is a
value the compiled kernel takes, not a shape, so the grid streams again with it lifted at the cost
of one more pass. Either a layout then passes (the note names it and the budget it needs: with that
budget, the sweep finds it), or nothing does and the note says what stops the candidates instead,
so that a user is not sent to raise the budget in vain.
"""

from __future__ import annotations

from jaxplan.errors import PlanError
from jaxplan.funnel.reasons import FIX_WITHOUT_BUDGET, Reason
from jaxplan.layout_kind import kind_label

NO_BUDGET = 1_000_000  # the largest gpu_budget a space admits: no layout of any grid exceeds it
MAX_CANDIDATES = 50_000_000  # larger grids are not swept twice for the note: the second pass alone would take tens of seconds


def applies(result) -> bool:
    """Whether an empty sweep `result` gets the note: the budget removed candidates, and the grid is
    small enough to stream again."""
    return not result.shortlist and result.reason_counts.get(Reason.GPU_BUDGET, 0) > 0 and result.grid.size <= MAX_CANDIDATES


def budget_note(sweep, space, budget: int) -> tuple[str, bool | None]:
    """(one or two sentences on `sweep(space)` run without the GPU budget of `budget`, whether lifting
    it admits a configuration); ("", None) where that cannot be had (the pass refused or stopped by a
    time or memory limit). `sweep(space)`: the sweep with the caller's other inputs and options (top
    1 is enough)."""
    try:
        relaxed = sweep(space.replace(gpu_budget=NO_BUDGET))
    except PlanError:
        return "", None
    if relaxed.shortlist:
        best = relaxed.shortlist[0]
        return (f"Without the GPU budget ({budget:,}), the best configuration that passes is {best['num_gpus']:,} x {best['gpu']} "
                f"as {kind_label(best)}: raise --budget to {best['num_gpus']:,}."), True
    last = relaxed.last_sieve()
    if last is None:
        return "", None
    stage, name, before, reason, count = last
    furthest = relaxed.furthest_reason(stage)
    if furthest is not None:
        reason = furthest
        why = f"those that get furthest fail on {reason.description} ({relaxed.reason_counts[reason]:,})"
    else:
        why = f"mostly because {reason.description} ({count:,})"
    fix = FIX_WITHOUT_BUDGET.get(reason, reason.fix)
    return f"Raising --budget would not help: without it, stage {stage} ({name}) still removes the last {before:,} candidates; {why}; to relax that: {fix}.", False
