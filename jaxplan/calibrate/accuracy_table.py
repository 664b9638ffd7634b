"""The held-out accuracy table of `docs/accuracy.md`: every evaluated vLLM row grouped by model, GPU,
dtype, ISL/OSL band and concurrency band, scored under each held-out protocol (leave-one-GPU-out,
leave-one-model-out) with the signed bias next to each MAPE, and rendered as Markdown.

`accuracy_table` is computed by `jaxplan calibrate` (report["accuracy_table"]); `markdown` renders a
report's table, which `jaxplan calibrate --accuracy-table FILE` writes and docs/accuracy.md holds.
Relative errors are fractions (0.1 = 10%); a bias is the mean of predicted / measured - 1.
"""

from __future__ import annotations

import math

import numpy as np

from jaxplan.calibrate.metrics import spearman

PROTOCOLS = {"gpu": "leave-one-GPU-out", "model": "leave-one-model-out"}
# Band edges in tokens: the campaigns' lengths are 1,000-1,024 and 2,000 / 4,000 / 8,000-8,192 (a
# 1,024-token request lands in the first band, an 8,192 one in the last); ShareGPT means ~200.
LENGTH_BANDS = ((1100.0, "<=1k"), (4200.0, "1k-4k"), (math.inf, ">4k"))
CONCURRENCY_BANDS = ((8, "1-8"), (32, "9-32"), (64, "33-64"), (math.inf, ">64"))
METRICS = (("ttft", "ttft_ms_mean"), ("tpot", "tpot_ms_mean"))


def length_band(tokens: float) -> str:
    """LENGTH_BANDS label of a mean request length in tokens."""
    return next(label for edge, label in LENGTH_BANDS if float(tokens) <= edge)


def concurrency_band(row: dict) -> str:
    """CONCURRENCY_BANDS label of a closed-loop row's clients; "open loop" for a row sent at a rate."""
    if row.get("request_rate") not in (None, "") and row.get("concurrency") in (None, ""):
        return "open loop"
    clients = float(row["concurrency"])
    return next(label for edge, label in CONCURRENCY_BANDS if clients <= edge)


def _order(key: list[str]) -> tuple:
    """Sort key of a group: model, GPU, dtype, then the bands in their numeric order (not as text)."""
    lengths = [label for _, label in LENGTH_BANDS]
    clients = [label for _, label in CONCURRENCY_BANDS] + ["open loop"]
    isl, osl = key[3].split(" / ")
    return (key[0], key[1], key[2], lengths.index(isl), lengths.index(osl), clients.index(key[4]))


def group_key(row: dict) -> tuple[str, str, str, str, str]:
    """(model, GPU, weight/KV dtype, ISL/OSL band, concurrency band) of a row."""
    dtype = f"{row.get('weight_dtype') or 'bf16'}/{row.get('kv_cache_dtype') or 'auto'}"
    return (row["model"], row["gpu"], dtype, f"{length_band(row['isl'])} / {length_band(row['osl'])}", concurrency_band(row))


def _scores(rows: list[dict], predicted: list[dict | None]) -> dict:
    """rows, not_predicted; per metric its MAPE and bias; throughput Spearman where >= 3 rows have it."""
    out: dict = {"rows": len(rows)}
    missing = sum(1 for p in predicted if p is None or any(p.get(c) is None for _, c in METRICS))
    if missing:
        out["not_predicted"] = missing
    for key, column in METRICS:
        ratios = np.array([p[column] / r[f"measured_{column}"] for r, p in zip(rows, predicted) if p is not None and p.get(column) is not None])
        if ratios.size:
            out[f"{key}_mape"] = float(np.mean(np.abs(ratios - 1.0)))
            out[f"{key}_bias"] = float(np.mean(ratios - 1.0))
    pairs = [(p["output_tok_s"], r["measured_output_tok_s"]) for r, p in zip(rows, predicted)
             if p is not None and p.get("output_tok_s") is not None and r.get("measured_output_tok_s")]
    if len(pairs) >= 3:
        out["throughput_spearman"] = spearman(*zip(*pairs))
    return out


def accuracy_table(rows: list[dict], predictions: dict[str, dict[int, dict]]) -> dict:
    """rows: the evaluated vLLM rows; predictions: protocol (PROTOCOLS key) -> id(row) -> its held-out
    prediction (a row missing from it is counted as not predicted). Returns {"protocols": the names,
    "totals": protocol -> {"all": scores, "model": {model: scores}, "gpu": {gpu: scores}},
    "groups": [{"key": group_key, protocol: scores, ...}] in model, GPU, dtype, band order}."""
    protocols = [p for p in PROTOCOLS if p in predictions]
    keys = sorted({group_key(r) for r in rows}, key=_order)
    groups = []
    for key in keys:
        mine = [r for r in rows if group_key(r) == key]
        groups.append({"key": list(key), **{p: _scores(mine, [predictions[p].get(id(r)) for r in mine]) for p in protocols}})
    totals = {}
    for p in protocols:
        scored = lambda group: _scores(group, [predictions[p].get(id(r)) for r in group])  # noqa: E731
        totals[p] = {"all": scored(rows), **{field: {name: scored([r for r in rows if r[field] == name]) for name in sorted({r[field] for r in rows})} for field in ("model", "gpu")}}
    return {"protocols": {p: PROTOCOLS[p] for p in protocols}, "totals": totals, "groups": groups}


def _percent(scores: dict, key: str) -> str:
    """'12.3% (-4.5%)': a metric's MAPE and bias; '-' where it was not scored."""
    if f"{key}_mape" not in scores:
        return "-"
    return f"{100 * scores[f'{key}_mape']:.1f}% ({100 * scores[f'{key}_bias']:+.1f}%)"


def _count(scores: dict) -> str:
    missing = scores.get("not_predicted", 0)
    return f"{scores['rows']}" + (f" ({missing} not predicted)" if missing else "")


def _cells(scores: dict) -> str:
    """A protocol's TTFT and TPOT cells of a group, saying how many of its rows were not predicted."""
    missing = scores.get("not_predicted", 0)
    note = f" [{missing} not predicted]" if missing else ""
    return f"{_percent(scores, 'ttft')}{note} | {_percent(scores, 'tpot')}"


def markdown(table: dict) -> str:
    """The report's `accuracy_table` as two Markdown tables: totals per protocol (all rows, by model, by
    GPU), then the groups with each protocol's TTFT and TPOT MAPE (signed bias)."""
    protocols = list(table["protocols"])
    lines = ["| protocol | rows | n | TTFT MAPE (bias) | TPOT MAPE (bias) | throughput Spearman |", "|---|---|---|---|---|---|"]
    for p in protocols:
        totals = table["totals"][p]
        entries = [("all dense vLLM rows", totals["all"])] + [(name, s) for field in ("model", "gpu") for name, s in totals[field].items()]
        for name, s in entries:
            rho = f"{s['throughput_spearman']:.3f}" if "throughput_spearman" in s else "-"
            lines.append(f"| {table['protocols'][p]} | {name} | {_count(s)} | {_percent(s, 'ttft')} | {_percent(s, 'tpot')} | {rho} |")
    header = "| model | GPU | weights/KV | ISL / OSL | clients | n | " + " | ".join(f"{table['protocols'][p]}: TTFT | TPOT" for p in protocols) + " |"
    lines += ["", header, "|" + "---|" * (6 + 2 * len(protocols))]
    for group in table["groups"]:
        rows = group[protocols[0]]["rows"] if protocols else 0
        lines.append("| " + " | ".join(group["key"]) + f" | {rows} | " + " | ".join(_cells(group[p]) for p in protocols) + " |")
    return "\n".join(lines) + "\n"
