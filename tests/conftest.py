"""Shared pytest setup: strict JAX numerics and an opt-in flag for slow tests."""

from __future__ import annotations

import jax
import pytest

# Strict JAX in tests (../shared/style.md, point 8): an implicit broadcast of mismatched ranks is a bug.
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked `slow`")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: opt in with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
