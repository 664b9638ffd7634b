"""Property tests that cannot pass vacuously: a property over candidates holds for an empty set, and
many random examples leave none (nothing fits, nothing meets the SLOs).

Each example reports `exercised(has_candidates, what)`; a test decorated `@counted` (above its hypothesis
decorators) fails unless at least MIN_EXERCISED of its examples checked the property on some candidate.
"""

from __future__ import annotations

import functools

from hypothesis import event

# Of a test's examples, the share that must check its property on some candidate. Derandomized runs
# still vary with the modules loaded before them (hypothesis also draws constants found in loaded
# code): 58-100% of the examples had candidates here, so the floor catches strategies that drift to
# (nearly) nothing without failing on a test order.
MIN_EXERCISED = 0.3
_counts: list[int] = [0, 0]  # (examples run, examples with candidates) of the test running now


def exercised(has_candidates: bool, what: str) -> None:
    """Count one example of the running test; `has_candidates`: it checked its property on at least
    one candidate (`what` names them, e.g. "admitted by stages 2-4"). Also a hypothesis event, so
    --hypothesis-show-statistics shows the split."""
    _counts[0] += 1
    _counts[1] += bool(has_candidates)
    event(f"{what}: {'some' if has_candidates else 'none (vacuous example)'}")


def counted(test):
    """Run the @given `test`, then fail unless MIN_EXERCISED of its examples had candidates."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        _counts[:] = [0, 0]
        test(*args, **kwargs)
        total, with_candidates = _counts
        assert total > 0 and with_candidates >= MIN_EXERCISED * total, (
            f"only {with_candidates} of {total} examples had candidates to check the property on; "
            "widen the strategies so that most examples exercise it"
        )

    return run
