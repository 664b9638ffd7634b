"""Short labels for figures and tables: GPU names, (GPU, TP, PP, DP) layouts, replayed throughputs."""

from __future__ import annotations


def gpu_label(name: str) -> str:
    """'h200_sxm' -> 'H200'."""
    return name.split("_")[0].upper()


def split_label(row: dict) -> str:
    """'TP4xPP1xDP2' for a row with tensor/pipeline/data_parallel_size; a MoE row of another layout
    kind as `layout_kind.kind_label` writes it ('4x(TP2xPP1)', 'TP1xPP1 DP8-lockstep EP8')."""
    from jaxplan.layout_kind import kind_label

    return kind_label(row)


def layout_label(row: dict) -> str:
    """'H200 TP4xPP1xDP2'."""
    return f"{gpu_label(row['gpu'])} {split_label(row)}"


def gpus_label(names) -> str:
    return ", ".join(gpu_label(n) for n in names)


def replay_tokens_cell(row: dict) -> str:
    """A finalist's replayed output tokens/s for a table cell, with "behind" where the replay found its
    queue to stop emptying under Poisson traffic (`replay.backlog`), which ranks it last."""
    return f"{row['replay_output_tokens_per_s']:,.0f}" + (" behind" if row.get("replay_falls_behind") else "")
