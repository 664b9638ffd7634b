"""Errors a user can act on, each one line: bad input (PlanError, naming field, value and fix), a job
past its time limit (TimeLimitExceeded) and a search that left nothing (NothingSurvived)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

MAX_VALUE_CHARS = 120  # a fuzzed 1 MB string must not become a 1 MB error line


class PlanError(ValueError):
    """Bad input or an impossible request; the CLI prints `str(err)` and exits 1.

    The message is always one line: line breaks in it are replaced by spaces.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(" ".join(str(message).splitlines()), *args)


class TimeLimitExceeded(PlanError):
    """A job stopped, or refused before it started, because it would run past its time limit
    (--max-seconds); the CLI exits 3. The input may be fine: a larger limit or a smaller job runs."""


class NothingSurvived(PlanError):
    """The search ran and no configuration survived the funnel; the CLI exits 2. The message says
    which stage removed the last candidates and what to relax."""


def short_repr(value: object) -> str:
    """`repr(value)`, cut to MAX_VALUE_CHARS with the full length noted."""
    text = repr(value)
    if len(text) <= MAX_VALUE_CHARS:
        return text
    return f"{text[:MAX_VALUE_CHARS]}... ({len(text):,} chars)"


def bad_value(field: str, value: object, fix: str, *, where: str | None = None) -> PlanError:
    """`where: field = value: fix` as a PlanError (where = file or section, optional)."""
    prefix = f"{where}: " if where else ""
    return PlanError(f"{prefix}{field} = {short_repr(value)}: {fix}")


def unknown_name(kind: str, name: str, known: Iterable[str], *, releases: bool = False) -> PlanError:
    """Unknown name: list the known ones and the closest match. releases: the names are of things
    released in versions (models), so the match is not offered where the name is it with a version
    after it ('deepseek-v3.2', 'glm-5.1'): a later release, which may differ in architecture."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.4) if len(name) <= 200 else []
    hint = f" Did you mean {close[0]!r}?" if close and not (releases and (_later_release(name, close[0]) or _other_size(name, close[0]))) else ""
    return PlanError(f"unknown {kind} {short_repr(name)}.{hint} Known: {', '.join(known)}")


_SIZE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)b(?![a-z])")  # a parameter count: '8b' in 'qwen3-8b', not 'a22b'


def _other_size(name: str, known: str) -> bool:
    """Whether `name`, a Hugging Face id, states another parameter count than `known`
    ('Qwen/Qwen3-8B' against 'qwen3-32b'): another published model of the family, not a
    misspelling (a bare name may be one: 'llama-3.1-7b')."""
    if "/" not in name:
        return False
    sizes = [set(_SIZE.findall(text.lower().rsplit("/", 1)[-1].replace("_", "-"))) for text in (name, known)]
    return all(sizes) and sizes[0] != sizes[1]


def _later_release(name: str, known: str) -> bool:
    """Whether `name` (a Hugging Face id or a bare name) is `known` followed by a version, e.g.
    'deepseek-ai/DeepSeek-V3.2' after 'deepseek-v3'."""
    tail = name.lower().rsplit("/", 1)[-1]
    return tail.startswith(known.lower()) and tail[len(known):][:1] in tuple(".0123456789")
