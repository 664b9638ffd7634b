"""docs/api.md runs: its python blocks execute in order, in one namespace, as a reader would paste them."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_the_block_reader_finds_every_block():
    assert python_blocks("a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x\n```\n") == ["x = 1\n", "y = x\n"]


def test_the_api_doc_runs(capsys):
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 5  # sweep, JSON round trip, workload in code, predict, sensitivity
    namespace: dict = {}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"{DOC.name} block {number}", "exec"), namespace)  # noqa: S102 - our own documentation
    printed = capsys.readouterr().out
    assert "vllm serve meta-llama/Llama-3.1-8B" in printed and "winner: +1% ISL ->" in printed
    assert namespace["plan"].winner is not None and len(namespace["plan"].finalists) == 3
