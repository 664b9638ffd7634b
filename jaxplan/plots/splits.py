"""The same GPUs arranged differently: the best candidate of each (TP, PP, DP) split at one GPU count.

`best_per_split` re-evaluates (stages 1-4, the sweep's own kernel) every candidate of those splits --
all batching knobs and dtypes of each -- and keeps the best by the sweep's objective;
`splits_figure` draws throughput per GPU, p99 TPOT and p99 TTFT per split.
"""

from __future__ import annotations

import itertools

import numpy as np

from jaxplan.plots.labels import gpu_label, split_label
from jaxplan.plots.style import GREY, OKABE_ITO, figure, log_axis, styled

KNOB_AXES = ("max_num_seqs", "max_num_batched_tokens", "weight_dtype", "kv_cache_dtype")


def split_digits(grid, num_gpus: int, gpus: tuple[str, ...] | None = None) -> dict[tuple, np.ndarray]:
    """{(gpu, tp, pp, layout kind label, dp): digits [K, A] of all its candidates} for splits of
    `num_gpus` GPUs: TP x PP x DP x the kind's lock-step ranks (the DP axis counts the servers of a
    lock-step kind)."""
    from jaxplan.grid import AXES
    from jaxplan.specs.space import parse_kind_label

    labels = grid.labels
    knob_digits = np.array(list(itertools.product(*(range(len(labels[a])) for a in KNOB_AXES))), np.int32)
    layout_axes = ("tensor_parallel_size", "pipeline_parallel_size", "layout_kind", "data_parallel_size")
    out = {}
    for g, gpu in enumerate(labels["gpu"]):
        if gpus is not None and gpu not in gpus:
            continue
        for (t, tp), (p, pp), (k, kind), (d, dp) in itertools.product(*(enumerate(labels[a]) for a in layout_axes)):
            if tp * pp * dp * parse_kind_label(kind)[1] != num_gpus:
                continue
            digits = np.zeros((len(knob_digits), len(AXES)), np.int32)
            digits[:, AXES.index("gpu")] = g
            for axis, digit in zip(layout_axes, (t, p, k, d)):
                digits[:, AXES.index(axis)] = digit
            for j, axis in enumerate(KNOB_AXES):
                digits[:, AXES.index(axis)] = knob_digits[:, j]
            out[(gpu, tp, pp, kind, dp)] = digits
    return out


def best_per_split(result, num_gpus: int, gpus: tuple[str, ...] | None = None) -> list[dict]:
    """One row per split (GPU type, TP, PP, layout kind, DP) of `num_gpus` GPUs: the sweep's row of its best
    candidate (`passes` True), or, when none passes stages 1-4, `passes` False, `why` (the most
    common reason at the furthest stage its candidates reached; at stage 4, the reason of the candidate
    estimated at the most output tokens/s), `why_stage` (that stage) and, where that is stage 4,
    `why_tokens_per_s` (that candidate's output tokens/s; -inf otherwise). Best first by the sweep's score."""
    from jaxplan.funnel.reasons import Reason
    from jaxplan.funnel.sweep import rows_for
    from jaxplan.layout_kind import kind_fields

    splits = split_digits(result.grid, num_gpus, gpus)
    if not splits:
        return []
    keys = list(splits)
    sizes = [len(splits[k]) for k in keys]
    flat = np.concatenate([splits[k] for k in keys])
    evaluated, default_compile = checked_evaluation(result, flat, sizes)
    score, reason = evaluated.score, evaluated.reason
    stage = np.array([Reason(int(r)).stage for r in reason])
    throughput = np.asarray(evaluated.estimate.output_tokens_per_s, np.float64)
    rows, best_digits, start = [], [], 0
    for key, size in zip(keys, sizes):
        part = slice(start, start + size)
        start += size
        best = int(np.argmax(score[part]))  # first of equals: the lowest grid index
        if np.isfinite(score[part][best]):
            best_digits.append(flat[part][best])
            continue
        furthest, code, closest = split_failure(reason[part], stage[part], throughput[part])
        gpu, tp, pp, kind, dp = key
        why = code.description if code is not None else "no finite estimate"
        fields = kind_fields(kind, dp, "", float(result.context.model.moe_layers) > 0)
        del fields["expert_weight_format"]
        rows.append({"gpu": gpu, "tensor_parallel_size": tp, "pipeline_parallel_size": pp, **fields,
                     "num_gpus": num_gpus, "passes": False, "why": why, "why_stage": furthest, "why_tokens_per_s": closest,
                     "score": float("-inf")})
    if best_digits:  # the passing splits' rows in one call
        rows += [dict(row, passes=True, why="") for row in rows_for(result.grid, result.context, np.stack(best_digits), default_compile=default_compile)]
    return sorted(rows, key=lambda r: -r["score"])


def checked_evaluation(result, digits: np.ndarray, sizes: list[int]):
    """(`evaluate_blocks` of the splits' candidates [N, A], whether it took XLA's defaults): consecutive
    groups of `sizes` rows, one split (one GPU, TP, PP, kind, DP layout) each, checked against the sweep's
    chunk kernel. A split's best score must be its layout's in the kernel's best-per-layout table
    (`sweep.layout_table`; -inf on both sides where nothing passes): the two programs are compiled
    apart, so the table and the figure cannot share a compiler's error. Where the one-shot program
    disagrees the splits are priced again at XLA's defaults; where that does too, PlanError."""
    from jaxplan.funnel.sweep import agrees_with_kernel, evaluate_blocks, kernel_disagreement, layout_table
    from jaxplan.grid import LAYOUT_AXES

    starts = np.cumsum([0, *sizes[:-1]])
    layout = np.ravel_multi_index(tuple(digits[starts][:, a] for a in LAYOUT_AXES), tuple(result.grid.sizes[a] for a in LAYOUT_AXES))
    kernel = np.asarray(layout_table(result).score)[layout]
    for default_compile in (False, True):
        evaluated = evaluate_blocks(result.context, digits, default_compile=default_compile)
        best = np.maximum.reduceat(np.asarray(evaluated.score, np.float64), starts)
        if agrees_with_kernel(best, kernel):
            return evaluated, default_compile
    raise kernel_disagreement("the split table's split", "best score", best, kernel)


def split_failure(reasons: np.ndarray, stages: np.ndarray, throughput: np.ndarray):
    """(furthest stage, reason, output tokens/s) of a split none of whose candidates [N] passes: at
    stage 4 the candidate estimated at the most output tokens/s (the first of equals) and its own
    reason, so that "cannot keep up" never comes with a throughput that meets the demand another
    candidate failed an SLO at; before it the most common reason at the furthest stage (-inf)."""
    from jaxplan.funnel.reasons import Reason

    furthest = int(stages.max())  # ADMITTED and PADDING are stage 0
    at_four = np.flatnonzero((stages == 4) & np.isfinite(throughput))
    if furthest == 4 and at_four.size:
        best = at_four[int(np.argmax(throughput[at_four]))]
        return furthest, Reason(int(reasons[best])), float(throughput[best])
    codes = [Reason(int(r)) for r in reasons if int(r) not in (Reason.ADMITTED, Reason.PADDING)]
    common = max({c for c in codes if c.stage == furthest}, key=lambda c: (codes.count(c), -c), default=None)
    return furthest, common, float("-inf")


def splits_figure(rows: list[dict], workload=None, *, highlight: dict | None = None, title: str | None = None):
    """Three panels (throughput/GPU, p99 TPOT, p99 TTFT), one bar per split, best on top; splits where
    nothing passes stages 1-4 are listed with the reason. `highlight`: a row (e.g. the winner) to colour."""
    rows = rows[::-1]  # barh draws bottom-up
    names = [f"{gpu_label(r['gpu'])} {split_label(r)}" for r in rows]
    chosen = [highlight is not None and all(r.get(k) == highlight.get(k) for k in ("gpu", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "layout_kind", "lockstep_ranks")) for r in rows]
    colours = [OKABE_ITO["orange"] if c else OKABE_ITO["blue"] for c in chosen]
    num_gpus = rows[0]["num_gpus"] if rows else 0
    height = max(4.5, 1.6 + 0.42 * len(rows))
    with styled():
        fig, axes = figure(1, 3, sharey=True, size_in=(12.0, min(height, 13.5)), gridspec_kw={"width_ratios": [1.6, 1, 1]})
        panels = (
            ("output_tokens_per_s_per_gpu", 1.0, "output tokens/s per GPU", None, False),
            ("tpot_p99_s", 1e3, "p99 TPOT (ms, log scale)", getattr(workload, "tpot_slo_s", None), True),
            ("ttft_p99_s", 1e3, "p99 TTFT (ms, log scale)", getattr(workload, "ttft_slo_s", None), True),
        )
        for ax, (key, scale, label, slo, log) in zip(axes[0], panels):
            values = [r[key] * scale if r["passes"] else np.nan for r in rows]
            ax.barh(range(len(rows)), np.nan_to_num(values, nan=0.0), color=colours, height=0.65, log=False)
            if log:
                ax.set_xscale("log")
                finite = [v for v in values if np.isfinite(v) and v > 0]
                if finite:
                    ax.set_xlim(min(finite) / 1.5, max(finite + ([slo * scale] if slo and np.isfinite(slo) else [])) * 1.5)
                log_axis(ax, "x")
            if slo is not None and np.isfinite(slo):
                ax.axvline(slo * scale, color=OKABE_ITO["vermillion"], ls="--", lw=2)
            ax.set_xlabel(label)
            ax.grid(axis="y", visible=False)
        first = axes[0][0]
        for i, r in enumerate(rows):
            if not r["passes"]:
                first.text(0.01, i, f"none passes: {_short(r['why'])}", transform=first.get_yaxis_transform(), va="center", fontsize=11, color=GREY)
        first.set_yticks(range(len(rows)), names)
        for tick, r in zip(first.get_yticklabels(), rows):
            tick.set_color("black" if r["passes"] else GREY)
        first.set_ylim(-0.6, len(rows) - 0.4)
        for ax, name, (_, scale, _, slo, _) in zip(axes[0], ("Throughput per GPU", "p99 TPOT", "p99 TTFT"), panels):
            has_slo = slo is not None and np.isfinite(slo)
            ax.set_title(f"{name}\n(dashed: SLO {slo * scale:,.0f} ms)" if has_slo else name)
        marked = " (orange: the winner)" if any(chosen) else ""
        fig.suptitle(title or f"The same {num_gpus} GPUs arranged differently: best of each TP x PP x DP{marked}")
    return fig


def _short(text: str, limit: int = 44) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
