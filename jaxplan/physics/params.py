"""Calibrated efficiency parameters per GPU type.

The physics multiplies spec-sheet peaks by achievable fractions and adds fixed
latencies. Values ship in `jaxplan/configs/calibration/params.toml`, written by
the maintainers' `jaxplan calibrate --write-bundled` with a record of the data they
were fitted to; a GPU type missing there (e.g. MI300X, which has no measurements)
gets DEFAULTS, which are typical of Hopper-class GPUs running vLLM.

Which file is read (`selected_path`): an explicit path (`--params`), else the one
$JAXPLAN_PARAMS names, else the bundled file. A user's `jaxplan calibrate` writes to
`user_params_path()` (never the bundled file), which is read only when one of the
first two selects it: a fit of old measurements is never picked up silently.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
from pathlib import Path

from jaxplan.errors import PlanError, bad_value

PARAMS_PATH = Path(__file__).resolve().parent.parent / "configs" / "calibration" / "params.toml"
PARAMS_ENV = "JAXPLAN_PARAMS"  # names the parameters file every command reads when --params is not given

# Field -> (default, lowest, highest). Fractions are of the spec-sheet peak.
BOUNDS: dict[str, tuple[float, float, float]] = {
    "gemm_flops_efficiency": (0.65, 0.05, 1.0),
    # HBM bytes per input element of an FP8 GEMM's activation quantisation (a separate kernel):
    # read bf16 and write fp8 = 3 in one pass; a dynamic per-tensor scale reads twice.
    "fp8_quant_bytes_per_element": (3.0, 0.0, 40.0),
    # HBM bytes decode attention spends per element of an FP8 KV cache (1 = the byte it stores): the
    # kernels dequantise as they read, and on Hopper that costs more than the byte saved. NVIDIA's
    # decode-attention tables (FP8 against BF16 KV, >= 512 MiB read): H100 1.35, H200 1.76, B200 1.17.
    # The default is H100's. Capacity is unaffected (one byte per element is stored).
    "fp8_kv_read_bytes_per_element": (1.35, 0.5, 4.0),
    # NVFP4 GEMMs (FP4 tensor cores, Blackwell on): their efficiency of the FP4 peak, and the HBM bytes per
    # input element of quantising their bf16 input to NVFP4 (with its block scales). NVIDIA's B200 GEMM
    # tables: 0.54 and 4.4 (FP8 GEMMs there: 0.70 and 15). Read off the tables, never fitted.
    "fp4_gemm_flops_efficiency": (0.55, 0.05, 1.0),
    "fp4_quant_bytes_per_element": (5.0, 0.0, 40.0),
    # HBM bytes an NVFP4 GEMM costs per weight it streams, where an FP8 GEMM costs the 1 byte it
    # stores (at the same achievable bandwidth). 0.5625 are stored (4 bits and an FP8 scale per 16),
    # but the kernels stream them slower than FP8's: NVIDIA's B200 tables time GEMMs of <= 16 tokens
    # over >= 64 MB of FP8 weights at a median 0.67 of the FP8 time in NVFP4. The default is the
    # stored size. Read off the tables, never fitted; capacity is unaffected.
    "fp4_weight_read_bytes_per_param": (0.5625, 0.1, 2.0),
    # The least time one weight GEMM takes however few bytes it reads (a tiny GEMM is launch- and
    # tail-bound): BF16, FP8 and NVFP4 (the last two with their input quantisation, a second kernel).
    # NVIDIA's tables, GEMMs of <= 16 tokens over <= 1 MiB of weights: H100/H200 3.0 / 5.4 us, B200 2.2 /
    # 6.0 / 7.0 us. Read off the tables, never fitted; they bind in decode at high TP.
    "gemm_floor_s": (3e-6, 0.0, 1e-4),
    "fp8_gemm_floor_s": (5.4e-6, 0.0, 1e-4),
    "fp4_gemm_floor_s": (7e-6, 0.0, 1e-4),
    "memory_bandwidth_efficiency": (0.80, 0.05, 1.0),
    "attention_flops_efficiency": (0.45, 0.02, 1.0),
    # The fixed cost of each layer in a step, beside its priced operators: the small kernels between the
    # GEMMs (norms, rotary, activation, residual adds, the KV-cache write) and the gaps between launches.
    # Vidur's H100 profiles time the small kernels alone at 17-19 us a layer. The default is typical of
    # the fits of the GPUs with rows (docs/accuracy.md, "Fixed costs", gives them).
    "layer_latency_s": (39e-6, 0.0, 1e-3),
    "allreduce_latency_s": (12e-6, 0.0, 1e-3),
    "allreduce_bandwidth_efficiency": (0.6, 0.02, 1.0),  # ring-equivalent, in a group of 8 GPUs (or more)
    # Efficiency in a pair of GPUs over that in 8; 4 GPUs get its square root (NCCL's algorithms differ by
    # group size: at prefill sizes H100/H200 pairs reach 0.76-0.77 of what 8 GPUs reach, B200 pairs 1.1x,
    # PCIe pairs far more).
    "allreduce_two_gpu_ratio": (1.0, 0.1, 20.0),
    # A fixed cost per step whatever the model's depth. Not fitted and 0 by default: with every fitted row
    # from 80-layer models, a per-step and a per-layer cost cannot be told apart, and models of 36-94
    # layers side with the per-layer one (docs/accuracy.md, "Fixed costs"). Kept so a user's file may set it.
    "step_overhead_s": (0.0, 0.0, 0.1),
    "per_seq_overhead_s": (4e-6, 0.0, 1e-3),
    "p2p_latency_s": (20e-6, 0.0, 1e-2),
    # Host seconds per running sequence per step that a pipeline-parallel replica (PP > 1) pays on the
    # step's critical path on top of `per_seq_overhead_s`: vLLM's V0 engine turns asynchronous output
    # processing off under PP (config.py: "Async output processing can not be enabled with pipeline
    # parallel"), so each step's per-sequence output processing no longer hides behind the next step's
    # GPU work; and vLLM 0.8.x-0.9.0 serve PP on V0 unless `--distributed-executor-backend ray` is
    # given. The default is per_seq_overhead_s's (V1 hides it); the A100 TP4 x PP2 runs fit it.
    "pipeline_seq_overhead_s": (4e-6, 0.0, 1e-3),
    "request_overhead_s": (0.02, 0.0, 2.0),
}
# The fused-MoE kernel of each expert format (`calibrate.moe_kernels`, which reads them off NVIDIA's MoE
# tables; never fitted): its least time per layer, the fraction of the HBM peak at which it streams the
# touched experts' stored bytes, and the fraction of the format's peak (`physics.moe.expert_peak_flops_per_s`)
# its grouped GEMMs reach. Defaults: H100's table (vLLM 0.24), NVFP4 B200's (Hopper has no NVFP4 kernel).
MOE_KERNEL_DEFAULTS = {
    "bf16": (38e-6, 0.95, 0.60),
    "fp8": (45e-6, 0.95, 0.31),
    "nvfp4": (21e-6, 0.90, 0.32),
    "mxfp4": (41e-6, 0.85, 0.48),
    "int4": (46e-6, 0.90, 0.26),
}
for _format, (_floor, _hbm, _flops) in MOE_KERNEL_DEFAULTS.items():
    BOUNDS[f"moe_{_format}_floor_s"] = (_floor, 0.0, 1e-3)
    BOUNDS[f"moe_{_format}_hbm_fraction"] = (_hbm, 0.02, 1.0)
    BOUNDS[f"moe_{_format}_flops_fraction"] = (_flops, 0.01, 1.0)
# Fields that parameter files may hold but the physics does not read; accepted and dropped, so such a
# file still loads. closed_loop_sync_fraction: a closed loop's first wave is concurrency / num_requests, not fitted.
RETIRED = frozenset({"closed_loop_sync_fraction"})
DEFAULTS = {field: bounds[0] for field, bounds in BOUNDS.items()}
FILE_SECTIONS = frozenset({"record", "gpu", "prior"})  # what `jaxplan calibrate` writes


def validate(gpu: str, params: dict[str, float], where: str) -> dict[str, float]:
    params = {k: v for k, v in params.items() if k not in RETIRED}
    unknown = set(params) - set(BOUNDS)
    if unknown:
        raise bad_value(f"[{gpu}].{sorted(unknown)[0]}", params[sorted(unknown)[0]], f"unknown parameter; known: {', '.join(BOUNDS)}", where=where)
    merged = {**DEFAULTS, **params}
    for field, value in merged.items():
        _, low, high = BOUNDS[field]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
            raise bad_value(f"[{gpu}].{field}", value, f"must be a number in [{low:g}, {high:g}]", where=where)
    return {k: float(v) for k, v in merged.items()}


def user_params_path() -> Path:
    """Where a user's `jaxplan calibrate` writes by default: $XDG_CONFIG_HOME/jaxplan/params.toml, or
    ~/.config/jaxplan/params.toml (the XDG base-directory rule: a relative XDG_CONFIG_HOME is ignored)."""
    config = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(config) if config and os.path.isabs(config) else Path.home() / ".config"
    return root / "jaxplan" / "params.toml"


def is_bundled(path: str | os.PathLike) -> bool:
    """Whether `path` is the bundled parameter file (through links and relative spellings)."""
    return Path(path).resolve() == PARAMS_PATH.resolve()


def selected_path(path: str | os.PathLike | None = None) -> str | None:
    """The parameters file to read: `path` (--params) if given, else $JAXPLAN_PARAMS if set and not
    empty, else None (the bundled file). A $JAXPLAN_PARAMS that names no readable file is a PlanError
    naming the variable, its value and the fix."""
    if path:
        return str(path)
    value = os.environ.get(PARAMS_ENV, "")
    if not value:
        return None
    target = Path(value).expanduser()
    problem = ("does not exist" if not target.exists() else "is not a file" if not target.is_file()
               else "is not readable" if not os.access(target, os.R_OK) else None)
    if problem:
        raise PlanError(f"${PARAMS_ENV} = {value!r} {problem}; point it at a file `jaxplan calibrate` wrote, or unset it to use the bundled parameters")
    return str(target)


def describe_selection(path: str | os.PathLike | None = None) -> str | None:
    """One line naming the parameters file in use and what chose it; None for the bundled file."""
    chosen = selected_path(path)
    if chosen is None or is_bundled(chosen):
        return None
    how = "--params" if path else f"${PARAMS_ENV}"
    return f"parameters: {chosen} (from {how})"


def load_efficiency(path: str | None = None) -> dict[str, dict[str, float]]:
    """GPU name -> efficiency parameters of the selected file (`selected_path`; missing GPUs fall back to
    DEFAULTS via `efficiency_for`)."""
    chosen = selected_path(path)
    if chosen is None:
        return _load_efficiency(None)
    if not path:  # from the environment: any error names the variable, since no option on the command line did
        try:
            return _load_efficiency(chosen)
        except PlanError as error:
            raise PlanError(f"${PARAMS_ENV}: {error}; or unset {PARAMS_ENV} to use the bundled parameters") from None
    return _load_efficiency(chosen)


@functools.cache
def _load_efficiency(path: str | None) -> dict[str, dict[str, float]]:
    target = Path(path) if path else PARAMS_PATH
    if not target.exists() and path:
        raise PlanError(f"calibration file {path!r} does not exist; run `jaxplan calibrate` or omit --params")
    return _gpu_tables(target, "gpu")


def _gpu_tables(target: Path, section: str) -> dict[str, dict[str, float]]:
    """The validated [<section>.<gpu>] tables of a calibration file ({} if the file is absent)."""
    from jaxplan.specs.loader import read_toml

    if not target.exists():
        return {}
    raw = read_toml(target)
    unknown = sorted(set(raw) - FILE_SECTIONS)
    if unknown:
        raise PlanError(f"{target}: [{unknown[0]}] is not a section of a calibration file, which has {', '.join(f'[{s}]' for s in sorted(FILE_SECTIONS))} (jaxplan calibrate -o writes one)")
    tables = raw.get(section, {})
    if not isinstance(tables, dict):
        raise bad_value(section, tables, f"must be a table of [{section}.<name>] sections", where=str(target))
    return {name: validate(name, values, str(target)) for name, values in tables.items()}


@functools.cache
def load_priors(path: str | None = None) -> dict[str, dict[str, float]]:
    """GPU name -> the kernel-table priors a calibration file was fitted from (its [prior.<name>]
    tables; {} for a file without them) of the file `path` or $JAXPLAN_PARAMS selects (`selected_path`):
    what `jaxplan calibrate` starts from where NVIDIA's kernel tables are not on disk, e.g. in a clone
    without ../shared, and which GPUs a prediction's band counts as priced from kernel tables."""
    chosen = selected_path(path)
    return _gpu_tables(Path(chosen) if chosen else PARAMS_PATH, "prior")


def efficiency_for(gpu_names, path: str | None = None) -> dict[str, dict[str, float]]:
    """GPU name -> parameters: the bundled file's (DEFAULTS for a GPU it lacks, e.g. a GPU spec of
    your own), or those of the file `path` or $JAXPLAN_PARAMS selects (`selected_path`), which must hold
    every GPU asked for (`jaxplan calibrate` writes them all): a missing one is a PlanError naming the
    tables the file has, not a silent fall back to DEFAULTS."""
    table = load_efficiency(path)
    chosen = selected_path(path)
    if chosen:
        missing = [name for name in gpu_names if name not in table]
        if missing:
            close = difflib.get_close_matches(missing[0], list(table), n=1, cutoff=0.4)
            where = f"--params {chosen}" if path else f"${PARAMS_ENV} = {chosen}"
            raise PlanError(f"{where}: no [gpu.{missing[0]}] table (it has {', '.join(f'[gpu.{n}]' for n in table) or 'none'})"
                            + (f"; is [gpu.{close[0]}] meant to be it?" if close else "") + "; write the file with jaxplan calibrate -o, or add the table")
    return {name: table.get(name, DEFAULTS) for name in gpu_names}
