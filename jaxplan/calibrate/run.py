"""`jaxplan calibrate`: kernel priors, the per-GPU fit, held-out accuracy, and the shipped TOML.

Held-out accuracy: for each GPU with serving rows, one shared parameter vector is
fitted on the other GPUs' rows (and their kernel priors) and evaluated on the
held-out GPU's rows, so the reported error is that of a fit that never saw the
evaluated GPU; with `replay_check` the same parameters also drive `jaxplan predict`'s
default method, the step-by-step replay, on the held-out GPU's fitted campaign rows.
Held-out configurations: one more per-GPU fit leaves out a seeded quarter of each GPU's
configurations (its layouts; its rows when it has one layout) and scores them (with
`folds=4`, four fits score every configuration once), which is what a user fitting their
own measurements of one GPU gets: the error on layouts they did not measure.
Other backends (SGLang, TRT-LLM) are reported with the final fit as out-of-sample checks.

Held-out models (`held_out_models`): for each model with vLLM rows, one more fit on the
other models' rows only, scored on every row of the held-out model: a model the fit has not
seen is priced from its config alone (no parameter is per model).

Rows whose stated workload the physics cannot be asked to match (`fit_excluded`), and
closed-loop rows whose KV cache cannot hold the clients (`trained_rows`), are evaluated
but not fitted.
"""

from __future__ import annotations

import datetime
import time
from collections import Counter
from pathlib import Path

import jax
import numpy as np

from jaxplan.bands import ROWS_FITTED_AS
from jaxplan.calibrate import fit
from jaxplan.calibrate.accuracy_table import accuracy_table
from jaxplan.calibrate.metrics import mape, spearman
from jaxplan.calibrate.moe_kernels import all_fields as moe_kernel_fields
from jaxplan.errors import PlanError, bad_value
from jaxplan.measured import IMPOSSIBLE_PEAK_FRACTION, too_fast_uncached
from jaxplan.physics.params import BOUNDS, DEFAULTS, PARAMS_ENV, PARAMS_PATH, is_bundled, load_priors, user_params_path
from jaxplan.prediction import batch_kv_blocks, predict_rows, replay_predict_rows, row_batches, row_hardware
from jaxplan.specs import known
from jaxplan.tomlio import toml_value

FIT_BACKEND = "vllm"
HELD_OUT_FOLDS = 4  # each fitted GPU's configurations are dealt into this many folds (a quarter each)
HELD_OUT_SEED = 0
LAYOUT_COLUMNS = ("model", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "weight_dtype", "kv_cache_dtype")

# A GPU whose serving rows were not fitted (one without rows, or the held-out GPU of the accuracy
# report) takes these from its own kernel tables (`fit.kernel_priors`): they time the operations that
# dominate prefill under serving conditions (compute-bound GEMMs and, for FP8, the quantisation of their
# input; long-context attention; NCCL's all-reduces at 16-128 MiB, what a 1k-8k-token prefill step
# sends per layer outside CUDA graphs, `fit.allreduce_prior`). Everything else comes from the
# serving fit: the HBM fraction of CUDA-graph decode (the tables' weight-streaming GEMMs sit 0.10
# below it on both fitted GPUs), the small-message all-reduce latency (vLLM's custom all-reduce in
# CUDA graphs, not the tables' NCCL), and the runtime's per-layer, per-sequence and per-request
# overheads. Fields outside `fit.FIT_FIELDS` are never fitted:
# every GPU keeps its kernel value of them (e.g. `fp8_kv_read_bytes_per_element`, from decode attention,
# and the NVFP4 GEMMs' `fp4_gemm_flops_efficiency`, `fp4_quant_bytes_per_element` and
# `fp4_weight_read_bytes_per_param`).
KERNEL_FIELDS = (
    "gemm_flops_efficiency", "fp8_quant_bytes_per_element", "attention_flops_efficiency",
    "allreduce_bandwidth_efficiency", "allreduce_two_gpu_ratio",
)
# Kernel fields an unfitted GPU takes as its prior times what serving reaches of the tables on the
# fitted GPUs (`serving_ratios`): NVIDIA's GEMM tables time each GEMM alone at its best kernel, and
# both serving fits land below them (H200 0.88, B200 0.97 of the table's FP8/BF16 efficiency). Without
# it an H100 (no serving rows, the H200's silicon) would prefill faster than the H200.
SERVING_RATIO_FIELDS = ("gemm_flops_efficiency",)
# A GPU priced from its SAME_SILICON sibling shares its die, not its memory: it also takes its own tables'
# weight-streaming fraction of HBM times what the sibling's serving reaches of the sibling's tables. That
# ratio is a property of the serving stack (fitted / table: H200 1.070, B200 1.069, the same campaign; A100
# 0.81, vLLM 0.8.3), so it transfers to a sibling and not across stacks (docs/accuracy.md, "The H100").
SIBLING_RATIO_FIELDS = SERVING_RATIO_FIELDS + ("memory_bandwidth_efficiency",)
# Fitted fields that describe the engine a GPU's rows were served with, not the GPU: a GPU whose rows were
# not fitted keeps its prior (the default: vLLM V1) rather than the fitted GPUs' mean. The A100 TP4 x PP2
# runs are the only pipeline-parallel rows, served by vLLM 0.8.3's V0 fallback (`pipeline_seq_overhead_s`).
ENGINE_FIELDS = ("pipeline_seq_overhead_s",)

# (dataset, model) campaigns that are evaluated but not fitted, with the reason.
FIT_EXCLUDED = {
    ("aiconfigurator_silicon", "llama-3.1-8b"): (
        "single-point 'auto gap analysis' runs whose measured TPOT is below what the stated workload needs: "
        "at closed-loop concurrency b each step must also prefill b / OSL prompts of ISL tokens, and e.g. "
        "TP1 2000/100 c64 would need 97% of the FP8 peak for its linear layers alone and 4 more rows 73-79% "
        "(`implied_peak_fraction`; the best FP8 GEMMs in the kernel tables reach 0.77-0.85, and attention, "
        "weight reads and step overheads come on top; the 70B rows need at most 37%); prompts must have been "
        "cached or shorter than stated, by an amount the data does not give"
    ),
}


def measured_rows(rows: list[dict]) -> list[dict]:
    """Rows with TTFT and TPOT measured (a row measured on a variant of a GPU carries its own HBM figures,
    `row_gpu.GPU_OVERRIDES`)."""
    return [r for r in rows if r.get("measured_ttft_ms_mean") and r.get("measured_tpot_ms_mean")]


def evaluated_rows(rows: list[dict]) -> list[dict]:
    """The fit backend's rows with TTFT and TPOT measured: those the report scores as vLLM rows."""
    return measured_rows([r for r in rows if r.get("backend") == FIT_BACKEND])


def not_fitted_groups(evaluated: list[dict]) -> dict[str, list[dict]]:
    """`evaluated` rows that are `fit_excluded`, grouped by campaign, keyed "gpu/dataset/model" (sorted)."""
    groups: dict[str, list[dict]] = {}
    for r in evaluated:
        if fit_excluded(r):
            groups.setdefault("/".join((r["gpu"], r["dataset"], r["model"])), []).append(r)
    return dict(sorted(groups.items()))


def unfitted_gpu_params(prior: dict[str, float], fitted: dict[str, float], ratios: dict[str, float] | None = None, *,
                        tables: bool = True) -> dict[str, float]:
    """Parameters of a GPU whose serving rows were not fitted: its kernel priors for KERNEL_FIELDS (times
    `ratios`, `serving_ratios`, for SERVING_RATIO_FIELDS), `fitted` (a serving fit on other GPUs) for the
    other fitted fields. tables=False (a GPU without kernel tables, whose priors are DEFAULTS, a typical
    Hopper's): `fitted` for the kernel fields too, since what its stack's fitted GPUs reach of their own
    peaks is evidence and DEFAULTS is none. ENGINE_FIELDS stay the prior's either way: they describe the
    engine another GPU's rows ran, not a GPU."""
    if not tables:
        return {**prior, **{f: fitted[f] for f in fit.FIT_FIELDS if f not in ENGINE_FIELDS}}
    scaled = {f: scaled_field(prior, f, r) for f, r in (ratios or {}).items()}
    return {**prior, **{f: fitted[f] for f in fit.FIT_FIELDS if f not in KERNEL_FIELDS + ENGINE_FIELDS}, **scaled}


# The fused-MoE kernel's GEMM rate (`moe_<format>_flops_fraction`, read off NVIDIA's MoE tables) takes the
# share of the tables' GEMM rate that the GPU's dense GEMMs reach in serving: fitted (or priced) over the
# table's `gemm_flops_efficiency` of the GPU the MoE fields come from (`moe_table_gpu`). The tables time
# each kernel alone, and whatever keeps serving below them slows the expert GEMMs as it does the dense
# ones; a GPU that borrows another's MoE fields (B300 and GB200 B200's, the AMD GPUs H100's defaults)
# reaches what its own stack reaches of the dense GEMMs. The streaming rate and least time stay as read.
MOE_SERVING_SHARE_FIELDS = tuple(f for f in moe_kernel_fields() if f.endswith("_flops_fraction"))
# `physics.params.MOE_KERNEL_DEFAULTS`, the MoE fields of a GPU without tables of its own or a peer's, are
# H100's table values.
MOE_DEFAULTS_GPU = "h100_sxm"


def moe_table_gpu(gpu: str, scaled: set[str]) -> str:
    """The GPU whose kernel tables `gpu`'s MoE fields were read from: its own (`scaled`: priors from
    kernel tables), its KERNEL_PEERS peer's, else MOE_DEFAULTS_GPU's."""
    return gpu if gpu in scaled else KERNEL_PEERS.get(gpu, MOE_DEFAULTS_GPU)


def with_moe_serving_share(values: dict[str, float], prior: dict[str, float], table_gemm_efficiency: float) -> dict[str, float]:
    """`values` (a GPU's complete parameters) with the MoE GEMM rates of `prior` (as read off the
    tables) scaled by values' `gemm_flops_efficiency` over the tables' (`table_gemm_efficiency`, of
    the GPU the MoE fields come from), within BOUNDS (see MOE_SERVING_SHARE_FIELDS)."""
    share = values["gemm_flops_efficiency"] / table_gemm_efficiency
    return {**values, **{f: scaled_field(prior, f, share) for f in MOE_SERVING_SHARE_FIELDS if f in prior}}


def scaled_field(prior: dict[str, float], field: str, ratio: float) -> float:
    """`prior[field]` times `ratio`, within the field's BOUNDS."""
    return float(np.clip(prior[field] * ratio, BOUNDS[field][1], BOUNDS[field][2]))


def serving_ratios(fitted: dict[str, dict[str, float]], priors: dict[str, dict[str, float]],
                   fields: tuple[str, ...] = SERVING_RATIO_FIELDS) -> dict[str, float]:
    """`fields` (default SERVING_RATIO_FIELDS) -> the mean over the fitted GPUs (`fitted`: GPU -> its
    serving-fit values) of fitted value / kernel prior (pass only GPUs whose priors are kernel tables)."""
    return {f: float(np.mean([values[f] / priors[g][f] for g, values in fitted.items()])) for f in fields}


# A GPU without rows whose die and software image equal a fitted GPU's takes that GPU's fitted values
# (its own spec peaks carry the difference, and its own kernel tables, where it has them, the kernel
# fields): MI325X is MI300X's CDNA 3 compute die with HBM3E instead of HBM3, and the InferenceMAX runs
# use the same ROCm vLLM image on both; H100 SXM is H200 SXM's GH100 die with 80 GB of HBM3 instead of
# 141 GB of HBM3E, served from the same vLLM images in the same NVIDIA campaigns; a GPU whose rows are
# fitted under another name (bands.ROWS_FITTED_AS: A100 SXM4 40GB) is that GPU. The mean of the stack's
# fitted GPUs is weaker evidence for such a GPU: priced from it (held out), the H200's Llama-3.1-70B
# rows miss TTFT / TPOT by 16% / 9%, against 9% / 6% with its own fit (docs/calibration_report.json).
SAME_SILICON = {"mi325x": "mi300x", "h100_sxm": "h200_sxm", **ROWS_FITTED_AS}


def software_stack(gpu: str) -> str:
    """"cuda" or "rocm": the serving stack a GPU runs (a CUDA compute capability in its spec, or none).
    The runtime's fixed costs and the kernels' reach of the peaks are properties of the stack (CUDA
    graphs and cuBLAS vs HIP graphs and hipBLASLt), so a GPU without rows is priced from its own
    stack's fitted GPUs (`stack_peers`)."""
    from jaxplan.specs import load_gpu

    return "cuda" if load_gpu(gpu).compute_capability else "rocm"


def stack_peers(gpu: str, fitted: list[str]) -> list[str]:
    """The GPUs of `fitted` (other than `gpu`) on `gpu`'s software stack; all of them where none is."""
    others = [g for g in fitted if g != gpu]
    same = [g for g in others if software_stack(g) == software_stack(gpu)]
    return same or others


def priced_without_rows(gpu: str, priors: dict[str, dict[str, float]], vectors: dict[str, np.ndarray], scaled: set[str]) -> dict[str, float]:
    """Complete parameters of `gpu` from serving fits that did not see its rows: `vectors` (fitted GPU ->
    its free vector; a shared fit gives every fitted GPU the same one). `unfitted_gpu_params` of its
    SAME_SILICON sibling's free vector where that GPU was fitted (of every fitted field where `gpu`
    has no kernel tables), else of the mean free vector of its `stack_peers`; the serving ratio of
    those GPUs whose priors are kernel tables (`scaled`) applied where `gpu` has tables of its own."""
    sibling = SAME_SILICON.get(gpu)
    if sibling in vectors and gpu not in scaled:
        return complete_params(gpu, {**DEFAULTS, **priors[sibling], **fit.values_of(vectors[sibling])}, priors, scaled)
    peers = [sibling] if sibling in vectors else stack_peers(gpu, sorted(vectors))
    shared = fit.values_of(np.mean([vectors[g] for g in peers], axis=0))
    with_tables = [g for g in peers if g in scaled]
    fields = SIBLING_RATIO_FIELDS if peers == [sibling] else SERVING_RATIO_FIELDS
    ratios = serving_ratios({g: fit.values_of(vectors[g]) for g in with_tables}, priors, fields) if gpu in scaled and with_tables else None
    return complete_params(gpu, {**DEFAULTS, **unfitted_gpu_params(priors[gpu], shared, ratios, tables=gpu in scaled)}, priors, scaled)


def complete_params(gpu: str, values: dict[str, float], priors: dict[str, dict[str, float]], scaled: set[str]) -> dict[str, float]:
    """A GPU's parameters as shipped and scored: `values`, with the MoE GEMM rates taking the serving
    share of the GEMM tables they were read with (`with_moe_serving_share`); unchanged where those
    tables' priors are not at hand (`scaled`: the GPUs whose priors are kernel tables)."""
    table = moe_table_gpu(gpu, scaled)
    if table not in scaled:
        return values
    return with_moe_serving_share(values, priors[gpu], priors[table]["gemm_flops_efficiency"])


def trained_rows(rows: list[dict], priors: dict[str, dict[str, float]]) -> list[dict]:
    """The rows the serving fit sees (`trained_mask`)."""
    return [r for r, keep in zip(rows, trained_mask(rows, priors)) if keep]


def trained_mask(rows: list[dict], priors: dict[str, dict[str, float]]) -> list[bool]:
    """Whether the serving fit sees each row: its KV cache holds the clients (`kv_holds_concurrency`;
    KV capacity does not depend on the fitted fields, so the priors decide). In the others vLLM
    preempts, and the measured TTFT depends on how long the benchmark ran, which the shared data do
    not state: stage 4 is off by 10x both ways there (H200 TP1 8192/1024 c32 9.8x, 1024/8192 c64
    0.10x); with the previous fit's parameters, 4 such rows of 60 held 96% of the H200 fit's squared
    TTFT log error, 2 of 60 held 72% of B200's. They are still evaluated (the report's all-row figures)."""
    complete = {g: {**DEFAULTS, **priors[g]} for g in {r["gpu"] for r in rows}}
    return kv_holds_concurrency(rows, complete)


def serving_fit(rows: list[dict], priors: dict[str, dict[str, float]], *, steps: int = fit.STEPS, shared: bool = False,
                gpus: list[str] | None = None, like: list[dict] | None = None) -> tuple[list[str], np.ndarray, float]:
    """The serving fit on `rows`, each GPU's kernel priors as its prior and as its values of the fields
    the fit leaves alone (FP8 KV reads, NVFP4 GEMMs, GEMM floors: what it is evaluated and shipped
    with): (its GPUs, sorted: `gpus`, default those of the rows; fitted free vectors [G, P]; final loss).
    shared=True fits one vector for all of them. `like`: the rows of the complete fit (and `gpus` its
    GPUs), whose compiled program a fit on part of them reuses (`fit.fit_serving`'s min_rows): the
    held-out fits then cost no compilation."""
    gpus = sorted(gpus or {r["gpu"] for r in rows})
    min_rows = max(Counter(r["model"] for r in like).values()) if like else 0
    z, loss = fit.fit_serving(fit.fit_data(rows, gpus), gpus, np.stack([fit.free_vector(priors[g]) for g in gpus]),
                              fixed={g: priors[g] for g in gpus}, shared=shared, steps=steps, min_rows=min_rows)
    return gpus, z, loss


def held_out_params(train_rows: list[dict], held: str, priors: dict[str, dict[str, float]], scaled: set[str] | None = None, *,
                    steps: int = fit.STEPS, shared_out: dict | None = None) -> dict[str, float]:
    """Parameters for GPU `held` from one shared fit on the rows among `train_rows` (the rows the fit
    may see, `trained_rows`; their kernel priors as the prior) of its `stack_peers`, applied as to a GPU
    without rows (`priced_without_rows`, `scaled`: the GPUs with kernel tables): no row of `held` is
    seen (it is listed in the fit, with no say in it, so that the fit reuses the complete fit's program).
    `scaled` None: every GPU of `priors` has kernel tables. `shared_out`, when given, gets the shared
    fit's values (what a GPU without kernel tables would take for every fitted field)."""
    gpus = sorted({r["gpu"] for r in train_rows})
    peers = stack_peers(held, gpus)
    _, z, _ = serving_fit([r for r in train_rows if r["gpu"] in peers], priors, steps=steps, shared=True, gpus=gpus, like=train_rows)
    if shared_out is not None:
        shared_out.update(fit.values_of(z[0]))
    return priced_without_rows(held, priors, {g: z[0] for g in peers}, set(priors) if scaled is None else scaled)


def layout_label(row: dict) -> str:
    """A row's configuration: model, TP x PP x DP and dtypes, e.g. 'llama-3.1-70b TP8xPP1xDP1 fp8/fp8'."""
    model, tp, pp, dp, weights, kv = (row.get(c) for c in LAYOUT_COLUMNS)
    number = lambda v: int(float(v)) if v not in (None, "") else 1  # noqa: E731
    return f"{model} TP{number(tp)}xPP{number(pp)}xDP{number(dp)} {weights or 'bf16'}/{kv or 'auto'}"


def configuration_folds(rows: list[dict]) -> tuple[list[int], list[str]]:
    """Fold (0..HELD_OUT_FOLDS-1) of each of one GPU's rows, and a label per fold: its configurations
    (layouts, `layout_label`; the rows themselves when the GPU has one layout) in a seeded order, dealt
    out in turn, so every fold holds about a quarter of them and all of a layout's rows share a fold."""
    layouts = sorted({layout_label(r) for r in rows})
    keys = [layout_label(r) for r in rows] if len(layouts) >= 2 else list(range(len(rows)))
    groups = sorted(set(keys), key=repr)
    order = np.random.default_rng(HELD_OUT_SEED).permutation(len(groups))
    fold_of = {groups[g]: i % HELD_OUT_FOLDS for i, g in enumerate(order)}
    folds = [fold_of[k] for k in keys]
    if len(layouts) >= 2:
        labels = [", ".join(sorted(str(k) for k in groups if fold_of[k] == f)) for f in range(HELD_OUT_FOLDS)]
    else:
        labels = [f"{folds.count(f)} of {len(rows)} rows (one layout: {layouts[0] if layouts else '-'})" for f in range(HELD_OUT_FOLDS)]
    return folds, labels


def held_out_configurations(fit_rows: list[dict], trained: list[bool], priors: dict[str, dict[str, float]], *, steps: int = fit.STEPS, folds: int = 1,
                            collect: dict[int, dict] | None = None) -> dict:
    """GPU -> accuracy (see `accuracy`) on configurations left out of a per-GPU fit (the shipped fit's
    method, on the other configurations' rows among those the fit may see, `trained` [len(fit_rows)],
    `trained_mask`): the first `folds` of HELD_OUT_FOLDS
    (`configuration_folds`; 1: a quarter of each GPU's configurations, HELD_OUT_FOLDS: every
    configuration once, each fold by its own fit), pooled; with the held-out labels. A GPU with a
    single row is skipped with the reason. `collect`, when given, gets each scored row's prediction:
    id(row) -> predicted row (the uncertainty bands' `calibrated` residuals)."""
    if not 1 <= folds <= HELD_OUT_FOLDS:
        raise bad_value("folds", folds, f"must be 1 to {HELD_OUT_FOLDS}")
    if len(trained) != len(fit_rows):
        raise bad_value("trained", f"{len(trained)} flags", f"must have one per row ({len(fit_rows)})")
    gpus = sorted({r["gpu"] for r, seen in zip(fit_rows, trained) if seen})
    out: dict[str, dict] = {}
    fold = [-1] * len(fit_rows)  # by row: its fold, -1 when its GPU is not scored
    labels: dict[str, list[str]] = {}
    for g in gpus:
        index = [i for i, r in enumerate(fit_rows) if r["gpu"] == g]
        if len(index) < 2:
            out[g] = {"rows": 0, "skipped": "one measured row: nothing to hold out"}
            continue
        assigned, labels[g] = configuration_folds([fit_rows[i] for i in index])
        for i, f in zip(index, assigned):
            fold[i] = f
    if not labels:
        return out
    predicted: dict[str, list] = {g: [] for g in labels}
    for f in range(folds):
        rest = [r for r, seen, k in zip(fit_rows, trained, fold) if seen and k != f]
        params = {g: dict(priors[g]) for g in gpus}
        if rest:
            fitted, z, _ = serving_fit(rest, priors, steps=steps, gpus=gpus, like=[r for r, seen in zip(fit_rows, trained) if seen])
            for g, vector in zip(fitted, z):
                params[g].update(fit.values_of(vector))
        for g in labels:
            held = [r for r, k in zip(fit_rows, fold) if r["gpu"] == g and k == f]
            if held:
                predicted[g].append(_predicted(held, {g: params[g]}))
                if collect is not None:
                    collect.update((id(row), p) for row, p in zip(held, predicted[g][-1][0]))
    for g in labels:
        rows = [p for part, _ in predicted[g] for p in part]
        fits = [x for _, part in predicted[g] for x in part]
        out[g] = {"held_out": [label for label in labels[g][:folds] if label], "folds": folds, **_summary(rows, fits)}
    return out


def params_without(rest: list[dict], train: list[dict], priors: dict[str, dict[str, float]], scaled: set[str], *,
                   steps: int = fit.STEPS) -> dict[str, dict[str, float]]:
    """Parameters for every GPU of `priors` from a per-GPU fit on `rest` (part of `train`, the rows the
    complete fit sees, whose compiled program it reuses): a GPU with rows in `rest` takes its fit, any
    other is priced as a GPU without rows (`unfitted_gpu_params` of the fitted GPUs' mean; the serving
    ratio only for `scaled`, the GPUs whose priors come from kernel tables). With `rest` empty every
    GPU keeps its priors (DEFAULTS for the runtime fields): nothing was measured to fit them."""
    params = {g: {**DEFAULTS, **priors[g]} for g in priors}
    fitted_gpus = sorted({r["gpu"] for r in rest})
    if not fitted_gpus:
        return params
    gpus, z, _ = serving_fit(rest, priors, steps=steps, gpus=sorted({r["gpu"] for r in train} | set(fitted_gpus)), like=train)
    vectors = {g: z[gpus.index(g)] for g in fitted_gpus}
    for g in priors:
        params[g] = complete_params(g, {**DEFAULTS, **priors[g], **fit.values_of(vectors[g])}, priors, scaled) if g in vectors else priced_without_rows(g, priors, vectors, scaled)
    return params


def held_out_models(evaluated: list[dict], train: list[dict], priors: dict[str, dict[str, float]], scaled: set[str], final: dict[str, dict[str, float]], *,
                    steps: int = fit.STEPS, collect: dict[int, dict] | None = None, log=print) -> dict:
    """Leave-one-model-out: model -> accuracy (see `accuracy`, with per-GPU entries under "by_gpu") of
    every `evaluated` row of the model, predicted by parameters fitted on `train` (the rows the complete
    fit sees) without any row of that model (`params_without`; `final`, the complete fit's parameters,
    where `train` holds no row of the model, as that fit is the same one), with "fitted_on": the models
    the fit saw. Parameters are per GPU, so the held-out model is priced from its config alone.
    `collect`, when given, gets id(row) -> predicted row."""
    out = {}
    for model in sorted({r["model"] for r in evaluated}):
        rest = [r for r in train if r["model"] != model]
        params = final if len(rest) == len(train) else params_without(rest, train, priors, scaled, steps=steps)
        held = [r for r in evaluated if r["model"] == model]
        predicted, fits = _predicted(held, {g: params[g] for g in {r["gpu"] for r in held}})
        if collect is not None:
            collect.update((id(r), p) for r, p in zip(held, predicted))
        by_gpu = {}
        for g in sorted({r["gpu"] for r in held}):
            mine = [k for k, r in enumerate(held) if r["gpu"] == g]
            by_gpu[g] = _summary([predicted[k] for k in mine], [fits[k] for k in mine])
        out[model] = {"fitted_on": sorted({r["model"] for r in rest}), **_summary(predicted, fits), "by_gpu": by_gpu}
        log(f"held out {model}: {({k: v for k, v in out[model].items() if k != 'by_gpu'})}")
    return out


UNCACHED_IMPOSSIBLE = (
    f"its measured TPOT leaves the linear layers of its stated workload (each step b decodes and b / OSL prompts) "
    f"over {IMPOSSIBLE_PEAK_FRACTION:.0%} of the GPU's dense peak, more than the kernel tables' best GEMMs reach: its prompts "
    f"were served from the prefix cache (the same vllm bench serve --seed run again against a server that stayed up "
    f"sends the same prompts) or were shorter than stated; give its prefix_hit_rate or rerun it with its own --seed"
)


def fit_excluded(row: dict) -> str | None:
    """Why `row` is evaluated but not fitted (None: it is fitted): its campaign is (FIT_EXCLUDED), or
    it is a closed-loop row that cannot have run its stated workload uncached (`measured.too_fast_uncached`)."""
    campaign = FIT_EXCLUDED.get((row.get("dataset"), row.get("model")))
    if campaign is not None:
        return campaign
    return UNCACHED_IMPOSSIBLE if too_fast_uncached(row) is not None else None


def kv_holds_concurrency(rows: list[dict], efficiency: dict[str, dict[str, float]]) -> list[bool]:
    """Per row: can each replica's KV cache hold its share of the clients' full contexts
    (concurrency / dp x (ISL + OSL) tokens)? Where it cannot, vLLM admits on prompt blocks
    and preempts later, and the measured TTFT depends on how long the benchmark ran
    (`num_prompts`), which the shared data does not state."""
    fits = [True] * len(rows)
    for batch in row_batches(rows, source="measurements"):
        blocks, _ = batch_kv_blocks(batch, row_hardware(batch, efficiency=efficiency))
        tokens = blocks * batch.block_size_tokens
        w = batch.workload
        demand = np.asarray(w.concurrency) / np.asarray(batch.layout.data_parallel_size) * (np.asarray(w.isl_tokens) + np.asarray(w.osl_tokens))
        closed = np.asarray(w.arrival_code) == 2
        for k, i in enumerate(batch.row_ids):
            fits[i] = bool(not closed[k] or tokens[k] >= demand[k])
    return fits


def accuracy(rows: list[dict], params: dict[str, dict[str, float]], *, replay: bool = False) -> dict:
    """MAPE of TTFT and TPOT, Spearman of output throughput, for rows predicted with `params`
    (stage 4, or with replay=True `jaxplan predict`'s default step-by-step replay at each row's
    num_prompts); the same again under "kv_fits" for the rows whose KV cache holds the clients' contexts."""
    if not rows:
        return {"rows": 0}
    return _summary(*_predicted(rows, params, replay=replay))


def _predicted(rows: list[dict], params: dict[str, dict[str, float]], *, replay: bool = False) -> tuple[list[dict], list[bool]]:
    """(predicted rows, whether each row's KV cache holds its clients) under `params`."""
    complete = {g: {**DEFAULTS, **values} for g, values in params.items()}
    if replay:
        predicted = replay_predict_rows(rows, source="measurements", efficiency=complete)
    else:
        predicted = predict_rows(rows, source="measurements", efficiency=complete)
    return predicted, kv_holds_concurrency(rows, complete)


def _summary(predicted: list[dict], fits: list[bool]) -> dict:
    """`_accuracy` of all rows, and again under "kv_fits" of those whose KV cache holds the clients."""
    if not predicted:
        return {"rows": 0}
    out = _accuracy(predicted)
    if 0 < sum(fits) < len(predicted):
        out["kv_fits"] = _accuracy([p for p, f in zip(predicted, fits) if f])
    return out


def _accuracy(predicted: list[dict]) -> dict:
    """Metrics of predicted rows (predict output columns next to the measured_* ones); rows without a
    prediction (does not fit, overloaded, no finite replayed value) are counted, not scored."""
    out = {"rows": len(predicted)}
    missing = sum(1 for p in predicted if p.get("ttft_ms_mean") is None or p.get("tpot_ms_mean") is None)
    if missing:
        out["not_predicted"] = missing
    for key, column in (("ttft", "ttft_ms_mean"), ("tpot", "tpot_ms_mean"), ("ttft_p99", "ttft_ms_p99"), ("tpot_p99", "tpot_ms_p99")):
        pairs = [(p[column], p[f"measured_{column}"]) for p in predicted if p.get(f"measured_{column}") and p.get(column) is not None]
        if pairs:
            out[f"{key}_mape"] = mape(*zip(*pairs))
            if key.endswith("_p99"):
                out[f"{key}_rows"] = len(pairs)
    pairs = [(p["output_tok_s"], p["measured_output_tok_s"]) for p in predicted if p.get("measured_output_tok_s") and p.get("output_tok_s") is not None]
    if len(pairs) >= 3:
        out["throughput_mape"] = mape(*zip(*pairs))
        out["throughput_spearman"] = spearman(*zip(*pairs))
    return out


def calibrate(rows: list[dict], *, data_root=None, steps: int = fit.STEPS, log=print, folds: int = 1,
              held_out_predictions: dict[int, dict] | None = None, moe_rows: list[dict] | None = None) -> tuple[dict, dict]:
    """(params per GPU, report). `rows` are normalized serving rows (see calibrate.rows). folds: of the
    held-out-configurations check (`held_out_configurations`; 4 scores every configuration, 3 more fits),
    whose per-row predictions go to `held_out_predictions` when given (its `collect`). `moe_rows`
    (`moe_rows.load_moe_rows`) are scored, never fitted, into report["moe"] (`moe_rows.moe_accuracy`)."""
    t0 = time.perf_counter()
    gpus = known("gpus")
    priors, prior_sources = calibration_priors(gpus, data_root)
    by_source = {source: [g for g in gpus if prior_sources[g] == source] for source in PRIOR_SOURCES}
    log(f"priors for {len(gpus)} GPUs in {time.perf_counter() - t0:.1f} s: " + "; ".join(f"{source}: {', '.join(names)}" for source, names in by_source.items() if names))
    evaluated = evaluated_rows(rows)
    fit_rows = [r for r in evaluated if not fit_excluded(r)]
    trained = trained_mask(fit_rows, priors)
    train = [r for r, seen in zip(fit_rows, trained) if seen]
    fitted_gpus = sorted({r["gpu"] for r in train})
    params = {g: dict(priors[g]) for g in gpus}
    report: dict = {
        "fit_backend": FIT_BACKEND, "fit_rows": len(fit_rows), "fit_rows_kv_fits": len(train),
        "held_out": {}, "held_out_params": {}, "in_sample": {}, "not_fitted": {}, "other_backends": {},
        "priors": {g: priors[g] for g in gpus if prior_sources[g] != PRIOR_SOURCES[2]}, "prior_sources": prior_sources,
    }  # fmt: skip
    for g in sorted({r["gpu"] for r in fit_rows} - set(fitted_gpus)):
        report.setdefault("gpus_not_fitted", {})[g] = (
            f"in none of its {sum(r['gpu'] == g for r in fit_rows)} row(s) does the KV cache hold the clients "
            "(concurrency / data_parallel_size x (isl + osl) tokens per replica), so their TTFT depends on how "
            "long the benchmark ran; it keeps its kernel priors (and the other fitted GPUs' or the default "
            "runtime values). Measure at a concurrency the KV cache holds (lower concurrency, more TP or PP, FP8 KV)"
        )
    if fitted_gpus:
        _, z, loss = serving_fit(train, priors, steps=steps, like=train)
        scaled = {g for g in gpus if prior_sources[g] != PRIOR_SOURCES[2]}
        for g, vector in zip(fitted_gpus, z):
            params[g] = complete_params(g, {**params[g], **fit.values_of(vector)}, priors, scaled)
        vectors = dict(zip(fitted_gpus, z))
        report["serving_ratios"] = serving_ratios({g: params[g] for g in fitted_gpus if g in scaled}, priors)
        for g in gpus:  # GPUs without serving rows: priced from their stack's fitted GPUs (`priced_without_rows`)
            if g not in fitted_gpus:
                params[g] = priced_without_rows(g, priors, vectors, scaled)
        report["in_sample"] = {g: accuracy([r for r in fit_rows if r["gpu"] == g], params) for g in fitted_gpus}
        for key, group in not_fitted_groups(evaluated).items():
            report["not_fitted"][key] = {"reason": fit_excluded(group[0]), **accuracy(group, params)}
        report["final_loss"] = loss
        log(f"per-GPU fit on {len(train)} of {len(fit_rows)} {FIT_BACKEND} rows, those whose KV cache holds the clients ({', '.join(fitted_gpus)}) in {time.perf_counter() - t0:.1f} s")
        by_gpu: dict[int, dict] = {}  # id(row) -> its prediction by the fit that held its GPU out
        by_model: dict[int, dict] = {}  # ... by the fit that held its model out
        for held in fitted_gpus if len(fitted_gpus) > 1 else []:
            held_params = {g: dict(priors[g]) for g in gpus}
            report.setdefault("held_out_shared", {})[held] = {}
            held_params[held] = held_out_params(train, held, priors, scaled, steps=steps, shared_out=report["held_out_shared"][held])
            report["held_out_params"][held] = {**DEFAULTS, **held_params[held]}
            held_rows = [r for r in evaluated if r["gpu"] == held]  # none of them was fitted
            predicted, fits = _predicted(held_rows, {held: held_params[held]})
            by_gpu.update((id(r), p) for r, p in zip(held_rows, predicted))
            report["held_out"][held] = _summary(predicted, fits)
            for model in sorted({r["model"] for r in held_rows}):
                mine = [k for k, r in enumerate(held_rows) if r["model"] == model]
                report["held_out"][f"{held}/{model}"] = _summary([predicted[k] for k in mine], [fits[k] for k in mine])
            log(f"held out {held}: {report['held_out'][held]}")
        report["held_out_models"] = held_out_models(evaluated, train, priors, scaled, params, steps=steps, collect=by_model, log=log)
        report["accuracy_table"] = accuracy_table(evaluated, {"gpu": by_gpu, "model": by_model})
        report["held_out_configurations"] = held_out_configurations(fit_rows, trained, priors, steps=steps, folds=folds, collect=held_out_predictions)
        log(f"held-out configurations: {report['held_out_configurations']}")
    for backend in sorted({r.get("backend") for r in rows} - {FIT_BACKEND}):
        other = [r for r in measured_rows(rows) if r.get("backend") == backend]
        report["other_backends"][backend] = accuracy(other, params)
    if moe_rows:
        from jaxplan.calibrate.moe_rows import moe_accuracy

        report["moe"] = moe_accuracy(moe_rows, params, report.get("held_out_params", {}))
        log(f"MoE rows, scored: {len(moe_rows)} ({time.perf_counter() - t0:.0f} s)")
    report["seconds"] = time.perf_counter() - t0
    return params, report


PRIOR_SOURCES = ("kernel tables", "bundled parameter file", "defaults")


# A GPU without kernel tables whose kernels are another's builds takes that GPU's table-read fields
# (`peer_kernel_fields`: the `moe_*` fields and every other field the serving fit leaves alone, e.g. the
# FP8 KV read, the NVFP4 GEMMs, the GEMM floors; fractions of its own peaks): B300 and GB200 run the
# SM100 FlashInfer / CUTLASS / Marlin kernels that NVIDIA's B200 tables time (GB300 as B300). The fitted fields still
# come from the fit (`priced_without_rows`). On the B300's 106 MoE rows: TTFT / TPOT 38.6% / 7.5% against
# 41.5% / 8.0% with the defaults' values of those fields (docs/accuracy.md).
KERNEL_PEERS = {"b300_sxm": "b200_sxm", "gb200": "b200_sxm", "gb300": "b200_sxm"}


def peer_kernel_fields(prior: dict[str, float]) -> list[str]:
    """The fields a KERNEL_PEERS GPU takes from its peer's priors: every field but the serving fit's."""
    return [f for f in prior if f not in fit.FIT_FIELDS]


def calibration_priors(gpus, data_root=None) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """(priors per GPU, where each came from): `fit.kernel_priors` where NVIDIA's kernel tables for the
    GPU are on disk; else the [prior.<gpu>] table of the bundled parameter file (the kernel priors the
    shipped fit started from, so a clone without ../shared calibrates its own rows from the same
    place); else DEFAULTS. A GPU of KERNEL_PEERS without tables of its own then takes its peer's
    `peer_kernel_fields`."""
    bundled = load_priors()

    def prior_of(g: str) -> tuple[dict[str, float], str]:
        if fit.has_kernel_tables(g, data_root):
            return fit.kernel_priors(g, data_root), PRIOR_SOURCES[0]
        if g in bundled:
            return dict(bundled[g]), PRIOR_SOURCES[1]
        return dict(DEFAULTS), PRIOR_SOURCES[2]

    priors, sources = {}, {}
    for g in gpus:
        priors[g], sources[g] = prior_of(g)
        if g in KERNEL_PEERS and sources[g] != PRIOR_SOURCES[0]:
            peer = priors[KERNEL_PEERS[g]] if KERNEL_PEERS[g] in priors else prior_of(KERNEL_PEERS[g])[0]
            priors[g].update({f: peer[f] for f in peer_kernel_fields(peer)})
    return priors, sources


def unseen_gpu_groups(rows: list[dict]) -> dict[str, list[dict]]:
    """The `fit_excluded` campaigns of the fit backend measured on a GPU none of whose rows is fitted,
    keyed "gpu/dataset/model": a check of a GPU no fit sees (priced as `unfitted_gpu_params`)."""
    evaluated = evaluated_rows(rows)
    fitted_gpus = {r["gpu"] for r in evaluated if not fit_excluded(r)}
    return {key: group for key, group in not_fitted_groups(evaluated).items() if group[0]["gpu"] not in fitted_gpus}


def replay_check(rows: list[dict], report: dict, params: dict[str, dict[str, float]] | None = None, log=print,
                 replayed: dict[int, dict] | None = None) -> dict:
    """Held-out accuracy of `jaxplan predict`'s default method: each held-out GPU's fitted-campaign
    rows replayed step by step with the parameters fitted without that GPU
    (`report["held_out_params"]`, from `calibrate`; none where a single GPU was fitted). GPU -> accuracy
    (see `accuracy`).
    With `params` (the final fit) it also replays each fitted GPU's rows into report["in_sample_replay"]
    and `unseen_gpu_groups` into report["not_fitted_replay"]. `replayed`, when given, collects each
    row's prediction replayed with the final fit: id(row) -> predicted row."""
    t0 = time.perf_counter()
    fit_rows = [r for r in evaluated_rows(rows) if not fit_excluded(r)]

    def scored(group: list[dict], chosen: dict[str, dict[str, float]], final: bool) -> dict:
        predicted, fits = _predicted(group, chosen, replay=True)
        if replayed is not None and final:
            replayed.update((id(row), prediction) for row, prediction in zip(group, predicted))
        return _summary(predicted, fits)

    out = {}
    for held, values in report.get("held_out_params", {}).items():
        out[held] = scored([r for r in fit_rows if r["gpu"] == held], {held: values}, final=False)
        log(f"held out {held}, replay: {out[held]} ({time.perf_counter() - t0:.0f} s)")
    if params is not None:
        for gpu in sorted({r["gpu"] for r in fit_rows}):
            report.setdefault("in_sample_replay", {})[gpu] = scored([r for r in fit_rows if r["gpu"] == gpu], {gpu: params[gpu]}, final=True)
            log(f"in sample {gpu}, replay: {report['in_sample_replay'][gpu]} ({time.perf_counter() - t0:.0f} s)")
        for key, group in unseen_gpu_groups(rows).items():
            report.setdefault("not_fitted_replay", {})[key] = scored(group, params, final=True)
            log(f"not fitted {key}, replay: {report['not_fitted_replay'][key]} ({time.perf_counter() - t0:.0f} s)")
    return out


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def write_params(params: dict[str, dict[str, float]], path: Path, record: dict, priors: dict[str, dict[str, float]] | None = None) -> Path:
    """The calibration TOML: [record] provenance, one [gpu.<name>] table per GPU (what the physics
    reads), then one [prior.<name>] table per GPU of `priors` (what the fit started from; read back by
    `calibration_priors` where the kernel tables are absent)."""
    lines = ["# Written by `jaxplan calibrate`; efficiencies are fractions of spec-sheet peaks, latencies in seconds.", "[record]"]
    for key, value in record.items():
        lines.append(f"{key} = {toml_value(value)}")
    for section, tables in (("gpu", params), ("prior", priors or {})):
        for gpu in sorted(tables):
            lines.append(f"\n[{section}.{gpu}]")
            for field in BOUNDS:
                lines.append(f"{field} = {_fmt(tables[gpu].get(field, DEFAULTS[field]))}")
    path.write_text("\n".join(lines) + "\n")
    return path


def provenance(rows: list[dict], report: dict, sources: list[str]) -> dict:
    datasets = sorted({r.get("dataset") or "?" for r in rows})
    return {
        "date": datetime.date.today().isoformat(),
        "command": "jaxplan calibrate",
        "jax_version": jax.__version__,
        "data": sources,
        "datasets": datasets,
        "fit_backend": report["fit_backend"],
        "fit_rows": report["fit_rows"],
        "fit_rows_kv_fits": report["fit_rows_kv_fits"],
        "final_loss": report.get("final_loss", float("nan")),
        "priors_from": sorted({f"{g}: {source}" for g, source in report.get("prior_sources", {}).items()}),
    }


def default_output() -> Path:
    """Where `jaxplan calibrate` writes without -o: the user's own file (`user_params_path`), never
    the bundled one, so a fit of one's own measurements cannot replace the shipped fit."""
    return user_params_path()


def output_path(output: Path | None = None, write_bundled: bool = False) -> Path:
    """The file a calibration is written to: `output`, else `default_output()`; the bundled file only
    with write_bundled (the maintainers' route, `jaxplan calibrate --write-bundled`): asked for
    otherwise it is a PlanError naming -o and the fix."""
    if write_bundled:
        if output is not None and not is_bundled(output):
            raise bad_value("-o", str(output), "--write-bundled writes the bundled parameter file; drop -o, or drop --write-bundled to write your own file")
        return PARAMS_PATH
    if output is not None and is_bundled(output):
        raise PlanError(f"-o {output} is the parameter file that ships with jaxplan; write your fit to a file of your own "
                        f"(omit -o for {default_output()}) and select it with --params or ${PARAMS_ENV}")
    return output if output is not None else default_output()
