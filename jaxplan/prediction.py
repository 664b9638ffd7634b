"""`jaxplan predict`: the stage-4 estimate for explicit configurations, one CSV row each.

Rows are grouped by model; inside a group every row's layout, GPU and traffic
are [N] arrays, padded to a power-of-two bucket, and the model shape is traced
(one compilation per bucket serves every model).
The same row batches feed the calibration fit, whose gradient flows through
the Hardware efficiency fields.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan import vllm_release
from jaxplan.buckets import bucket_size, pad_rows, unpad_rows
from jaxplan.engine_defaults import batch_knobs
from jaxplan.engine_rules import invalid_rows
from jaxplan.errors import bad_value
from jaxplan.measured import too_fast_uncached
from jaxplan.physics.memory import kv_blocks_per_replica, replay_kv_blocks
from jaxplan.physics.params import efficiency_for, load_efficiency
from jaxplan.physics.shapes import Hardware, Layout, ModelShape, hardware_table, model_shape, traced
from jaxplan.physics.steady_state import estimate, run_drain_s
from jaxplan.physics.traffic import WorkloadParams, length_shape, longest_output_factor
from jaxplan.row_gpu import given as _given
from jaxplan.row_gpu import gpu_key, row_gpu
from jaxplan.row_gpu import number as _number
from jaxplan.specs import ModelSpec, load_model
from jaxplan.specs.formats import BY_NAME as FORMAT_BY_NAME
from jaxplan.specs.formats import EXPERT_ONLY
from jaxplan.specs.lengths import read_lengths
from jaxplan.specs.space import BLOCK_SIZES, VLLM_DEFAULT_BLOCK_SIZE_TOKENS, WEIGHT_DTYPES
from jaxplan.specs.workload import Arrival, Workload, length_fields

# A row without room: its status names what holds the memory and what frees it.
_WORKSPACE_AND_FIX = (
    "next to the weights and vLLM's start-up workspace (its sampler profile holds max_num_seqs x vocabulary "
    "logits, ~5 GB at the default 1024 for a 128k vocabulary); raise TP/PP, use FP8, or lower max_num_seqs"
)
DOES_NOT_FIT = f"does not fit: not even one request's KV cache fits {_WORKSPACE_AND_FIX}"
NO_KV_CACHE = f"does not fit: no KV cache is left {_WORKSPACE_AND_FIX}"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default, for a row without gpu_memory_utilization
DEFAULT_NUM_PROMPTS = 1000
KV_BLOCK_TOKENS = VLLM_DEFAULT_BLOCK_SIZE_TOKENS  # a row without block_size is predicted at vLLM's default
# kv_cache_tokens: what one replica's KV cache holds, vLLM's "GPU KV cache size: N tokens" at start-up
# (for a model whose every attention layer is full; sliding-window and linear layers are not in it).
OUTPUT_COLUMNS = ("ttft_ms_mean", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p99", "output_tok_s", "request_s", "kv_cache_tokens", "status")


class RowBatch(NamedTuple):
    """Rows of one model as arrays [N]; `gpu_index` points into `gpus`."""

    model: ModelShape
    gpus: tuple  # GpuSpec per gpu index
    gpu_index: np.ndarray  # [N] int32
    layout: Layout
    workload: WorkloadParams
    row_ids: np.ndarray  # [N] position of each row in the caller's list
    gpu_memory_utilization: np.ndarray | float = DEFAULT_GPU_MEMORY_UTILIZATION  # [N] each row's vLLM setting
    block_size_tokens: np.ndarray | float = KV_BLOCK_TOKENS  # [N] each row's KV-cache block size
    releases: tuple = ()  # [N] (major, minor, patch): each row's vLLM release (`vllm_release`); () = the selected one


def _length_shape(row: dict, where: str) -> dict:
    """The row's length distributions, or its lengths_file, as Workload fields (blank = fixed lengths),
    validated by `length_fields`; "lengths_file" only when the row has one."""
    shape = length_fields(row, where)
    if not shape["lengths_file"]:
        del shape["lengths_file"]
    return shape


def _default_num_prompts(shape: dict) -> int:
    """Requests of a row without num_prompts: its lengths_file's count, else DEFAULT_NUM_PROMPTS."""
    return len(read_lengths(shape["lengths_file"]).input_tokens) if "lengths_file" in shape else DEFAULT_NUM_PROMPTS


def _workload_arrays(rows: list[dict], wheres: list[str]) -> WorkloadParams:
    fields = {name: [] for name in WorkloadParams._fields}
    for row, where in zip(rows, wheres):
        shape = _length_shape(row, where)
        file_means = (None, None)
        if "lengths_file" in shape and any(row.get(side) in (None, "") for side in ("isl", "osl")):
            file_means = read_lengths(shape["lengths_file"]).means()  # blank isl/osl: the file's means, as rows.check_row gives
        isl = _number(row, "isl", file_means[0], where=where)
        osl = _number(row, "osl", file_means[1], where=where)
        if isl < 1 or osl < 1:
            raise bad_value("isl" if isl < 1 else "osl", isl if isl < 1 else osl, "token counts must be >= 1", where=where)
        concurrency = row.get("concurrency")
        has_concurrency = concurrency not in (None, "") and float(concurrency) > 0
        rate = _number(row, "request_rate", math.inf, where=where) if not has_concurrency else 0.0
        num_prompts = _number(row, "num_prompts", _default_num_prompts(shape), where=where)
        if has_concurrency:  # vllm bench serve runs at most num_prompts clients, however many it is given
            given = _number(row, "concurrency", where=where)
            conc = min(given, num_prompts) if row.get("num_prompts") not in (None, "") else given
            code, rate_value = 2.0, 0.0
        elif math.isinf(rate):
            code, conc, rate_value = 1.0, num_prompts, 0.0
        elif rate > 0:
            code, conc, rate_value = 0.0, 0.0, rate
        else:
            raise bad_value("request_rate", row.get("request_rate"), "give concurrency > 0, or request_rate > 0 (inf for a burst)", where=where)
        hit = _number(row, "prefix_hit_rate", 0.0, where=where)
        if hit >= 1:
            raise bad_value("prefix_hit_rate", hit, "must be in [0, 1)", where=where)
        max_context_factor, length_cv = length_shape(Workload(name="row", isl_mean_tokens=isl, osl_mean_tokens=osl, **shape))
        values = dict(
            isl_tokens=isl, osl_tokens=osl, prefix_hit_rate=hit, request_rate_per_s=rate_value, concurrency=conc,
            arrival_code=code, max_context_factor=max_context_factor, length_cv=length_cv,
            ttft_slo_s=math.inf, tpot_slo_s=math.inf, target_output_tokens_per_s=0.0,
            num_requests=max(num_prompts, conc) if has_concurrency else num_prompts,
            longest_output_factor=longest_output_factor(Workload(name="row", isl_mean_tokens=isl, osl_mean_tokens=osl, **shape), num_prompts),
        )
        for name, value in values.items():
            fields[name].append(value)
    return WorkloadParams(**{k: jnp.asarray(np.asarray(v, np.float32)) for k, v in fields.items()})


def _layout_arrays(rows: list[dict], wheres: list[str], model: ModelSpec, gpus: list) -> Layout:
    """The rows' layouts in vLLM's meaning: for a MoE model, data_parallel_size ranks step together
    and share the experts (sliced, or whole with enable_expert_parallel); a dense model's DP ranks are
    independent replicas and refuse expert parallelism and expert-only formats. `gpus`: each row's
    GpuSpec, whose vLLM defaults fill a batching knob the row leaves out."""
    columns = {name: [] for name in Layout._fields}
    for row, where, gpu in zip(rows, wheres, gpus):
        for dtype_field, allowed in (("weight_dtype", WEIGHT_DTYPES), ("kv_cache_dtype", ("auto", "fp8", "bf16"))):
            if str(row.get(dtype_field) or allowed[0]) not in allowed:
                raise bad_value(dtype_field, row.get(dtype_field), f"use one of {', '.join(allowed)}", where=where)
        sizes = {}
        for field, default in (("tensor_parallel_size", 1), ("pipeline_parallel_size", 1), ("data_parallel_size", 1)):
            value = _number(row, field, default, where=where)
            if value < 1 or value != int(value):
                raise bad_value(field, row.get(field), "must be a positive integer", where=where)
            sizes[field] = value
        fmt = FORMAT_BY_NAME[weight_dtype_of(row)]
        expert_parallel = _flag(row, "enable_expert_parallel", where)
        if not model.is_moe and expert_parallel:
            raise bad_value("enable_expert_parallel", row.get("enable_expert_parallel"), f"{model.name} is dense: expert parallelism needs a mixture-of-experts model; set it false (or leave out --enable-expert-parallel)", where=where)
        if not model.is_moe and fmt.name in EXPERT_ONLY:
            raise bad_value("weight_dtype", fmt.name, f"quantises only a MoE model's experts and {model.name} is dense; use bf16, fp8 or nvfp4", where=where)
        columns["tensor_parallel_size"].append(sizes["tensor_parallel_size"])
        columns["pipeline_parallel_size"].append(sizes["pipeline_parallel_size"])
        columns["data_parallel_size"].append(sizes["data_parallel_size"])
        columns["weight_bytes_per_param"].append(fmt.other_bytes_per_param)
        columns["kv_bytes_per_element"].append(1 if str(row.get("kv_cache_dtype")) == "fp8" else 2)
        stated = {field: _number(row, field, where=where) if _given(row, field) else None for field in ("max_num_seqs", "max_num_batched_tokens")}
        seqs, budget = batch_knobs(gpu, **stated)  # vLLM's values for the flags the row leaves out
        columns["max_num_seqs"].append(seqs)
        columns["max_num_batched_tokens"].append(budget)
        columns["expert_weight_format"].append(fmt.code)
        columns["lockstep_ranks"].append(sizes["data_parallel_size"] if model.is_moe else 1)
        columns["expert_parallel"].append(1.0 if expert_parallel else 0.0)
    return Layout(**{k: jax.device_put(np.asarray(v, np.float32)) for k, v in columns.items()})


def weight_dtype_of(row: dict) -> str:
    """A row's weight format: as given, else what vLLM serves its checkpoint in (`served_weight_dtype`)."""
    given = row.get("weight_dtype")
    return str(given) if given not in (None, "") else load_model(str(row["model"]).strip()).served_weight_dtype


def _flag(row: dict, field: str, where: str) -> bool:
    """A true/false column (blank: false); strings as a CSV gives them."""
    value = row.get(field)
    if value is None or value == "":
        return False
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise bad_value(field, value, "must be true or false", where=where)


def _engine_arrays(rows: list[dict], wheres: list[str]) -> tuple[np.ndarray, np.ndarray, tuple]:
    """([N] gpu_memory_utilization, [N] block_size tokens) float32 and the [N] vLLM releases: each row's
    vLLM settings, its release's defaults where a row leaves them blank (they size the KV cache, so they
    are inputs of the row). A row's release: its `vllm_version` column, else `vllm_release.selected()`."""
    fractions, blocks, releases = [], [], []
    default_release = vllm_release.selected()
    for row, where in zip(rows, wheres):
        release = vllm_release.parse_release(row["vllm_version"], where=where) if _given(row, "vllm_version") else default_release
        default_fraction = vllm_release.default_gpu_memory_utilization(release)
        fraction = _number(row, "gpu_memory_utilization", default_fraction, where=where)
        if not 0.05 <= fraction <= 1.0:
            raise bad_value("gpu_memory_utilization", row.get("gpu_memory_utilization"), f"must be in [0.05, 1] (vLLM's default is {default_fraction:g})", where=where)
        releases.append(release)
        block = _number(row, "block_size", KV_BLOCK_TOKENS, where=where)
        if block not in BLOCK_SIZES:
            raise bad_value("block_size", row.get("block_size"), f"use one of {', '.join(map(str, BLOCK_SIZES))} (vLLM's --block-size)", where=where)
        fractions.append(fraction)
        blocks.append(block)
    return np.asarray(fractions, np.float32), np.asarray(blocks, np.float32), tuple(releases)


def row_hardware(batch: RowBatch, params_path: str | None = None, efficiency: dict | None = None) -> Hardware:
    """[N] Hardware of a batch's rows: their GPUs' parameters (`efficiency`, GPU name -> fields, if given,
    else the file `params_path` selects, `efficiency_for`), with the pipeline host cost of each row's vLLM
    release (`vllm_release.pipeline_seq_overhead_s`, which looks up the V0 pipeline fit's GPU in the same
    parameters)."""
    names = [g.name for g in batch.gpus]
    chosen = {n: efficiency[n] for n in names} if efficiency is not None else efficiency_for(names, params_path)
    # gathered on the host: on the device each field's gather compiled a program of its own
    rows = np.asarray(batch.gpu_index)
    hw = jax.tree.map(lambda field: jax.device_put(np.asarray(field)[rows]), hardware_table(batch.gpus, chosen))
    releases = batch.releases or (vllm_release.selected(),) * len(batch.row_ids)
    lookup = {**(efficiency if efficiency is not None else load_efficiency(params_path)), **chosen}
    cost = [vllm_release.pipeline_seq_overhead_s(lookup, batch.gpus[g].name, r) for g, r in zip(np.asarray(batch.gpu_index), releases)]
    return hw._replace(pipeline_seq_overhead_s=jax.device_put(np.asarray(cost, np.float32)))


def row_batches(rows: list[dict], source: str = "input") -> list[RowBatch]:
    """Group rows by model and turn each group into arrays (validating every field). A row's
    `row_gpu.GPU_OVERRIDES` columns give it a GPU of its own: the named spec with those fields replaced."""
    groups: dict[str, list[int]] = {}
    models = {}
    for i, row in enumerate(rows):
        name = str(row.get("model") or "").strip()
        if not name:
            raise bad_value("model", row.get("model"), "is required (a bundled name, HF id or config.json path)", where=f"{source} row {i + 1}")
        models.setdefault(name, load_model(name))
        groups.setdefault(models[name].name, []).append(i)
    batches = []
    for name, ids in groups.items():
        group = [rows[i] for i in ids]
        wheres = [f"{source} row {i + 1}" for i in ids]
        row_keys = [gpu_key(r, where) for r, where in zip(group, wheres)]
        keys = sorted(set(row_keys), key=lambda key: (key[0], [-1.0 if v is None else v for v in key[1:]]))
        gpus = tuple(row_gpu(key, wheres[row_keys.index(key)]) for key in keys)
        index = np.array([keys.index(key) for key in row_keys], np.int32)
        model = next(m for m in models.values() if m.name == name)
        batches.append(RowBatch(model_shape(model), gpus, index, _layout_arrays(group, wheres, model, [gpus[k] for k in index]), _workload_arrays(group, wheres), np.array(ids), *_engine_arrays(group, wheres)))
    return batches


@jax.jit
def _estimate_rows(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization):
    est = estimate(model, hw, layout, w, gpu_memory_utilization)
    return est, run_drain_s(model, hw, layout, w, est.concurrency_per_replica)


# Rows per stage-4 program at least: every CSV, campaign or fold up to this many rows shares one
# compilation, which costs far more than evaluating the padding rows.
PREDICT_MIN_ROWS = 256


def estimate_rows(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization):
    """(Stage-4 Estimate, `steady_state.run_drain_s` [N] s) for [N] rows (hw already gathered per row).
    The model shape is traced (float32) and the rows padded to `buckets.bucket_size(N,
    PREDICT_MIN_ROWS)`: one compilation per bucket serves every model and every N in it."""
    num = int(np.shape(layout.tensor_parallel_size)[0])
    size = bucket_size(num, PREDICT_MIN_ROWS)
    fraction = np.broadcast_to(np.asarray(gpu_memory_utilization, np.float32), (num,))  # a scalar or [N] per row
    out = _estimate_rows(traced(model), *pad_rows((hw, layout, w, fraction), num, size))
    return unpad_rows(out, num, size)


def weight_only_note(gpu, weight_dtype: str) -> str:
    """'' or a note for a status column: FP8 (NVFP4) weights on a GPU without FP8 (FP4) tensor cores
    run weight-only, as vLLM's Marlin kernels do: the smaller weights are read, the GEMMs run in bf16
    (the physics prices them so; the sweep's structure sieve leaves such layouts out)."""
    if weight_dtype == "bf16" or gpu.tensor_core_flops_per_s(weight_dtype) > 0:
        return ""
    if weight_dtype == "int4":
        return "; int4 experts priced weight-only (bf16 GEMMs over dequantised weights, as vLLM's INT4 MoE kernels run)"
    cores = {"fp8": "FP8", "mxfp4": "MXFP4"}.get(weight_dtype, "FP4")
    return f"; {gpu.name} has no {cores} tensor cores: {weight_dtype} weights priced weight-only (bf16 GEMMs as in vLLM's Marlin kernels)"


def _row_note(batch: RowBatch, k: int, row: dict) -> str:
    note = weight_only_note(batch.gpus[int(batch.gpu_index[k])], weight_dtype_of(row))
    too_fast = too_fast_uncached(row)
    if too_fast is not None:
        note += (f"; measured TPOT too fast for this workload uncached (its linear layers alone would need {too_fast:.0%} "
                 "of the GPU's dense peak): its prompts were likely served from the prefix cache")
    return note


# A replayed row's status names its preemptions from this share of its requests on (fewer cost little).
PREEMPTION_NOTE_SHARE = 0.01


def notable_preemptions(count: int, requests: int) -> bool:
    """Whether `count` preemptions in a replay of `requests` are worth a line: at least one, and at
    least PREEMPTION_NOTE_SHARE of the requests (predict's status, the sweep's verdict)."""
    return requests >= 1 and count >= max(1.0, PREEMPTION_NOTE_SHARE * requests)


def _preemption_note(m, workload: Workload, kv_blocks: int, block_tokens: int, num_requests: int) -> str:
    """A note for a replayed row's status ("" if none): where the replay preempted at least
    PREEMPTION_NOTE_SHARE of its requests, how often and why. vLLM admits a request on its prompt's KV
    blocks (replay/scheduler.py), so requests admitted together can outgrow the cache, and a preempted
    one recomputes what of its prompt and output so far the prefix cache lost; stage 4 does not price
    that. `kv_blocks`: the scheduler's blocks of one replica (`batch_kv_blocks`)."""
    count = int(m.num_preemptions[0])
    if not notable_preemptions(count, num_requests):
        return ""
    whole = int(kv_blocks) // max(math.ceil((workload.isl_mean_tokens + workload.osl_mean_tokens) / block_tokens), 1)
    hold = (f"--max-num-seqs {whole} or fewer would hold every request of the mean lengths whole (a smaller batch: predict both)"
            if whole >= 1 else "the KV cache holds no request of the mean lengths whole")
    return (f"; the replay preempted {count:,} times ({count / num_requests:.2g} a request): vLLM admits a request on its "
            f"prompt's KV blocks, the running requests then outgrew the KV cache, and each preempted one recomputed what "
            f"of its prompt and output so far the prefix cache had lost, which --method analytical does not price (and the replay may price high: "
            f"docs/accuracy.md); {hold}")


def _replay_status(m, workload: Workload) -> str:
    """A replayed row's status: ok, unfinished requests, or, under Poisson arrivals, a queue that stops
    emptying while requests arrive (`jaxplan.replay.backlog`): the replayed throughput is then the
    run's, and its TTFT grows with the run's length."""
    if int(m.unfinished[0]):
        return f"{int(m.unfinished[0])} requests unfinished (stalled or iteration limit)"
    if workload.arrival == Arrival.POISSON and bool(m.falls_behind[0]):
        sent = workload.offered_output_tokens_per_s
        return (f"overloaded: the replay's queue stops emptying while requests arrive at {workload.request_rate_per_s:.4g}/s "
                f"({int(m.queue_at_last_arrival[0]):,} wait at the last arrival); it serves about "
                f"{float(m.sustained_output_tokens_per_s[0]):,.0f} of the {sent:,.0f} output tok/s sent, and its TTFT grows with the run")
    return "ok"


def capped_rate(row: dict) -> bool:
    """The row gives both `concurrency` and a finite `request_rate`: vllm bench serve's --request-rate
    with --max-concurrency (Poisson arrivals, at most that many in flight)."""
    rate = row.get("request_rate")
    return row.get("concurrency") not in (None, "") and rate not in (None, "") and math.isfinite(float(rate))


def resolve_capped_rates(rows: list[dict], **predict_kwargs) -> tuple[list[dict], dict[int, str]]:
    """(rows to predict, notes by row index): each `capped_rate` row as the regime that binds. Its
    clients as a closed loop serve X requests/s (stage 4); below X the arrival rate binds (the clients
    are rarely all busy) and the row is an open loop at its rate, else the clients bind and it is the
    closed loop. Other rows unchanged."""
    capped = [i for i, row in enumerate(rows) if capped_rate(row)]
    if not capped:
        return rows, {}
    closed = predict_rows([{**rows[i], "request_rate": None} for i in capped], **predict_kwargs)
    out, notes = list(rows), {}
    for i, clients in zip(capped, closed):
        rate, served = float(rows[i]["request_rate"]), clients["request_s"]
        if served is not None and rate < served:
            out[i] = {**rows[i], "concurrency": None}
            notes[i] = f"; request_rate {rate:g}/s binds ({rows[i]['concurrency']} clients would serve {served:.3g}/s): open loop"
        else:
            out[i] = {**rows[i], "request_rate": None}
            notes[i] = f"; the {rows[i]['concurrency']} clients bind (they serve {served or 0:.3g}/s, under request_rate {rate:g}/s): closed loop"
    return out, notes


def with_notes(rows: list[dict], results: list[dict], notes: dict[int, str]) -> list[dict]:
    """`results` of `resolve_capped_rates`' rows with the input's concurrency and request_rate back
    and the note on the status."""
    for i, note in notes.items():
        results[i].update(concurrency=rows[i]["concurrency"], request_rate=rows[i]["request_rate"], status=str(results[i]["status"]) + note)
    return results


def predict_rows(rows: list[dict], params_path: str | None = None, source: str = "input", efficiency: dict | None = None) -> list[dict]:
    """Input rows plus the predicted output columns (times in ms, rates per second). A row with both
    concurrency and a finite request_rate is predicted as the regime that binds (`resolve_capped_rates`).

    Efficiency parameters: `efficiency` (GPU -> fields) if given, else the TOML at `params_path`,
    else the bundled calibration."""
    work, notes = resolve_capped_rates(rows, params_path=params_path, source=source, efficiency=efficiency)
    results, all_at_once = _predict_rows(work, params_path, source, efficiency)
    if all_at_once:  # overloaded, but every prompt finds a slot: the run is one wave of clients that start together
        bursts, _ = _predict_rows([{**work[i], "request_rate": None, "concurrency": work[i]["num_prompts"]} for i in all_at_once], params_path, source, efficiency)
        for (i, note), burst in zip(all_at_once.items(), bursts):
            results[i] = {**burst, "request_rate": work[i]["request_rate"], "concurrency": work[i].get("concurrency"), "status": note + str(burst["status"]).removeprefix("ok")}
    return with_notes(rows, results, notes)


def finite_run_share(num_prompts: float, rate_per_s: float, drain_s: float) -> float:
    """The share of a finite open-loop run (`vllm bench serve --num-prompts N --request-rate R`) that
    keeps up spent while its prompts arrive: they arrive over about N / R seconds, and its last
    requests then take `drain_s` to finish (`steady_state.run_drain_s`). The benchmark divides the
    run's output by all of that time, so it reports this share of the steady state's throughput: less
    for a short run, and less again for a layout that decodes more slowly, whose drain is longer."""
    arrivals_s = num_prompts / rate_per_s
    return arrivals_s / (arrivals_s + drain_s)


def overloaded_status(rate: float, capacity: float, num_prompts: float, slots: float, given: bool) -> str:
    """The status of an open-loop row whose arrivals (`rate`, requests/s) outpace the `capacity` it
    serves at full load. No steady state exists, so no steady-state TTFT: a run of `num_prompts` that
    all fit in the `slots` (requests in flight, all replicas) is predicted as that many clients that
    start together and send one prompt each, the first wave of a closed loop (its TTFT is an upper
    bound: the real prompts arrive spread over num_prompts / rate); a longer run
    reports the capacity as its throughput, and its queue, hence TTFT, grows throughout the run."""
    head = f"overloaded: requests arrive at {rate:.4g}/s, above the {capacity:.4g}/s this deployment serves at full load"
    if given and num_prompts <= slots:
        return f"{head}; its {num_prompts:,.0f} prompts all fit in its {slots:,.0f} slots: predicted as all arriving at once (TTFT an upper bound)"
    run = f"the queue grows by {rate - capacity:.3g} requests/s while its {num_prompts:,.0f} prompts arrive" if given else "the queue grows for as long as requests arrive"
    return f"{head}; output_tok_s and request_s are that capacity; no TTFT: {run} (--method replay times such a run)"


@jax.jit
def _kv_blocks(model: ModelShape, hw: Hardware, layout: Layout, gpu_memory_utilization, block_size_tokens, mean_context_tokens):
    """(`kv_blocks_per_replica`, `replay_kv_blocks`) of a batch's rows [N], as one program: evaluated
    op by op, their few dozen operations each compiled and lowered a program of its own, about a
    tenth of a warm `predict`."""
    args = (model, hw, layout, gpu_memory_utilization, block_size_tokens)
    return kv_blocks_per_replica(*args), replay_kv_blocks(*args, mean_context_tokens)


def batch_kv_blocks(batch: RowBatch, hw: Hardware) -> tuple[np.ndarray, np.ndarray]:
    """(KV blocks one replica holds, the replay scheduler's blocks at the rows' mean context ISL + OSL / 2)
    [N] of a batch's rows on `hw` (`row_hardware`), on the host."""
    context = batch.workload.isl_tokens + 0.5 * batch.workload.osl_tokens
    return jax.device_get(_kv_blocks(batch.model, hw, batch.layout, batch.gpu_memory_utilization, batch.block_size_tokens, context))


def _predict_rows(rows: list[dict], params_path: str | None, source: str, efficiency: dict | None) -> tuple[list[dict], dict[int, str]]:
    """(results, all_at_once): the rows with their stage-4 predictions, and the overloaded open-loop
    rows whose prompts all fit in the slots (index -> status), for `predict_rows` to predict as bursts."""
    results, all_at_once = [dict(row) for row in rows], {}
    invalid = invalid_rows(rows, source)
    for batch in row_batches(rows, source):
        hw = row_hardware(batch, params_path, efficiency)
        est, drain = jax.device_get(estimate_rows(batch.model, hw, batch.layout, batch.workload, batch.gpu_memory_utilization))
        block_tokens = np.broadcast_to(np.asarray(batch.block_size_tokens), (len(batch.row_ids),)).astype(int)
        blocks, _ = batch_kv_blocks(batch, hw)
        one_token = np.asarray(batch.workload.osl_tokens) <= 1.0
        for k, i in enumerate(batch.row_ids):
            if i in invalid:
                results[i].update({c: None for c in OUTPUT_COLUMNS}, status=invalid[i])
                continue
            if est.max_concurrency_per_replica[k] < 1.0:
                results[i].update({c: None for c in OUTPUT_COLUMNS}, kv_cache_tokens=int(blocks[k]) * int(block_tokens[k]), status=DOES_NOT_FIT)
                continue
            open_loop = batch.workload.arrival_code[k] == 0
            overloaded = open_loop and est.utilization[k] >= 1.0
            given = rows[i].get("num_prompts") not in (None, "")
            status = "ok"
            share = 1.0
            if open_loop and given and not overloaded:
                share = finite_run_share(float(batch.workload.num_requests[k]), float(batch.workload.request_rate_per_s[k]), float(drain[k]))
            if overloaded:
                slots = float(est.max_concurrency_per_replica[k]) * float(batch.layout.data_parallel_size[k])
                num_prompts = float(batch.workload.num_requests[k])
                status = overloaded_status(float(batch.workload.request_rate_per_s[k]), float(est.requests_per_s[k]), num_prompts, slots, given)
                if given and num_prompts <= slots:
                    all_at_once[i] = status
            results[i].update(
                ttft_ms_mean=None if overloaded else float(est.ttft_mean_s[k]) * 1e3,
                ttft_ms_p99=None if overloaded else float(est.ttft_p99_s[k]) * 1e3,
                tpot_ms_mean=float(est.tpot_mean_s[k]) * 1e3 if one_token[k] == 0 else None,  # no TPOT with one output token
                tpot_ms_p99=float(est.tpot_p99_s[k]) * 1e3 if one_token[k] == 0 else None,
                output_tok_s=float(est.output_tokens_per_s[k]) * share,
                request_s=float(est.requests_per_s[k]) * share,
                kv_cache_tokens=int(blocks[k]) * int(block_tokens[k]),
                status=status + _row_note(batch, k, rows[i]),
            )
    return results, all_at_once



def _row_workload(batch: RowBatch, k: int, num_requests: int | None, row: dict):
    """The replay's Workload for row k of a batch, which is `row`: its lengths (mean and distribution)
    and arrival process.

    Requests: `num_requests` if given, else the count stage 4 weighs the row's first wave by
    (`_workload_arrays`: its num_prompts, else its lengths_file's count, else DEFAULT_NUM_PROMPTS;
    at least the concurrency of a closed loop that names no num_prompts). A closed loop runs at most
    that many clients, as vllm bench serve does with fewer prompts than --max-concurrency."""
    w = jax.device_get(batch.workload)
    code = int(w.arrival_code[k])
    arrival = {0: Arrival.POISSON, 1: Arrival.BURST, 2: Arrival.CLOSED}[code]
    shape = _length_shape(row, f"row {int(batch.row_ids[k]) + 1}")
    count = num_requests or int(round(float(w.num_requests[k])))
    return Workload(
        name=f"row {int(batch.row_ids[k]) + 1}",
        isl_mean_tokens=float(w.isl_tokens[k]), osl_mean_tokens=float(w.osl_tokens[k]), arrival=arrival,
        request_rate_per_s=float(w.request_rate_per_s[k]) if code == 0 else math.inf,
        concurrency=min(int(w.concurrency[k]), count) if code == 2 else 0,  # R requests keep at most R clients busy
        num_requests=count,
        prefix_hit_rate=float(w.prefix_hit_rate[k]),
        **shape,
    )


def _initial_slots(workload, layout) -> int | None:
    """Slot rows for a row's replay to start with: a closed loop's clients or a burst's requests
    per replica (the replay never runs more), at least the replay's default; for Poisson arrivals
    its requests per replica where they fit in the smallest request bucket (a short replay, whose
    cost is compiling: each width the rows grow through is one more loop program, ~4 s on 2 cores,
    where wider steps cost milliseconds), else None (the default: start small and grow, because a
    long replay's cost is its steps, on rows mostly empty at low load). The replay caps them at
    max_num_seqs; results do not depend on them. A burst or Poisson row of 200 requests compiles
    one width (256), not four (32 to 256)."""
    from jaxplan.replay.driver import INITIAL_SLOTS
    from jaxplan.replay.traffic import MIN_REQUEST_BUCKET

    per_replica = lambda n: -(-int(n) // int(layout.data_parallel_size[0]))  # noqa: E731
    if workload.arrival == Arrival.CLOSED:
        return max(INITIAL_SLOTS, per_replica(workload.concurrency))
    if workload.arrival == Arrival.BURST or per_replica(workload.num_requests) <= MIN_REQUEST_BUCKET:
        return max(INITIAL_SLOTS, per_replica(workload.num_requests))
    return None


def replay_predict_rows(
    rows: list[dict], params_path: str | None = None, source: str = "input", num_requests: int | None = None, seed: int = 0, routing: str = "round_robin",
    efficiency: dict | None = None, max_seconds: float | None = None, started_at: float | None = None,
) -> list[dict]:
    """Like `predict_rows`, but each row is replayed step by step (one replay per row's workload).

    routing: how requests reach data-parallel replicas, "round_robin" or "least_loaded".
    efficiency: GPU -> parameter fields, as for `predict_rows` (else the TOML at `params_path`).
    max_seconds: stop (PlanError) a replay whose measured pace projects past this many seconds from
    `started_at` (time.perf_counter(); default: now), so that several calls can share one limit.
    A row with both concurrency and a finite request_rate replays the regime that binds
    (`resolve_capped_rates`, by stage 4)."""
    original = rows
    rows, notes = resolve_capped_rates(rows, params_path=params_path, source=source, efficiency=efficiency)
    return with_notes(original, _replay_predict_rows(rows, params_path, source, num_requests, seed, routing, efficiency, max_seconds, started_at), notes)


def _replay_predict_rows(rows, params_path, source, num_requests, seed, routing, efficiency, max_seconds, started_at) -> list[dict]:
    import time

    from jaxplan.deadline import Deadline
    from jaxplan.funnel.replay_stage import physics_params, physics_step, prefix_caching, replay_config
    from jaxplan.replay import sample_requests, simulate

    results = [dict(row) for row in rows]
    started_at = time.perf_counter() if started_at is None else started_at
    invalid = invalid_rows(rows, source)
    for batch in row_batches(rows, source):
        hw_all = row_hardware(batch, params_path, efficiency)
        block_tokens = np.broadcast_to(np.asarray(batch.block_size_tokens), (len(batch.row_ids),)).astype(int)
        blocks, scheduler_blocks = batch_kv_blocks(batch, hw_all)
        for k, i in enumerate(batch.row_ids):
            if i in invalid:
                results[i].update({c: None for c in OUTPUT_COLUMNS}, status=invalid[i])
                continue
            if blocks[k] < 1:
                results[i].update({c: None for c in OUTPUT_COLUMNS}, kv_cache_tokens=0, status=NO_KV_CACHE)
                continue
            workload = _row_workload(batch, k, num_requests, rows[i])
            pick = lambda tree: jax.tree.map(lambda x: x[k : k + 1] if jnp.ndim(x) else x, tree)  # noqa: E731
            hw, layout = pick(hw_all), pick(batch.layout)
            caching = prefix_caching(batch.model, rows[i].get("enable_prefix_caching") is not False)
            config = replay_config(layout, scheduler_blocks[k : k + 1], int(block_tokens[k]), routing=routing, prefix_caching=caching)
            requests = sample_requests(workload, None, seed)
            deadline = None if max_seconds is None else Deadline(
                max_seconds, start=started_at, what=f"the replay of {source} row {i + 1} ({requests.num_requests:,} requests)", unit="output tokens",
                fix="replay fewer requests (--requests, or the row's num_prompts / concurrency) or use predict --method analytical",
            )  # fmt: skip
            m = jax.device_get(simulate(config, requests, workload, physics_step, physics_params(batch.model, hw, layout), progress=deadline, initial_slots=_initial_slots(workload, layout)))
            overhead_s = float(hw.request_overhead_s[0])
            results[i].update(
                ttft_ms_mean=(float(m.ttft.mean_s[0]) + overhead_s) * 1e3,
                ttft_ms_p99=(float(m.ttft.p99_s[0]) + overhead_s) * 1e3,
                tpot_ms_mean=float(m.tpot.mean_s[0]) * 1e3,
                tpot_ms_p99=float(m.tpot.p99_s[0]) * 1e3,
                output_tok_s=float(m.output_tokens_per_s[0]),
                request_s=float(m.request_throughput_per_s[0]),
                kv_cache_tokens=int(blocks[k]) * int(block_tokens[k]),
                status=_replay_status(m, workload) + _preemption_note(m, workload, scheduler_blocks[k], block_tokens[k], requests.num_requests) + _row_note(batch, k, rows[i]),
            )
            for column in OUTPUT_COLUMNS[:-1]:  # no NaN in an output: TPOT is undefined when every request has 1 output token
                if results[i][column] is not None and not math.isfinite(results[i][column]):
                    results[i][column] = None
    return results
