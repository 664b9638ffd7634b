"""What every command shares: the typer app, consoles, option types, error handling, loading a sweep's inputs."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from jaxplan.cli.exit_codes import ExitCode, ExitCodeGroup, exit_code_for
from jaxplan.errors import PlanError, bad_value, short_repr

app = typer.Typer(cls=ExitCodeGroup, add_completion=False, no_args_is_help=True, help="Plan LLM serving deployments on a CPU: how many GPUs, arranged how, for what traffic.")
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


# Options shared by several commands (one definition each).
ModelOption = Annotated[str, typer.Option(help="Bundled name, Hugging Face id (Qwen/Qwen3-32B) or a config.json path.")]
GpusOption = Annotated[str, typer.Option(help="Comma-separated GPU types: h100_sxm, h200_sxm, a100_sxm, b200_sxm, l40s, mi300x.")]
WorkloadOption = Annotated[str, typer.Option(help="Bundled workload (coding, chat, reasoning, rl-rollout) or a .toml path.")]
SpaceOption = Annotated[str, typer.Option(help="Bundled search space (default, small, huge) or a .toml path.")]
BudgetOption = Annotated[Optional[int], typer.Option(min=1, help="GPU budget (overrides the space's gpu_budget).")]
WeightDtypesOption = Annotated[Optional[str], typer.Option(help="Weight dtypes to search, e.g. bf16,fp8,nvfp4 (overrides the space's weight_dtype; nvfp4 needs FP4 tensor cores: b200_sxm).")]
KvDtypesOption = Annotated[Optional[str], typer.Option(help="KV-cache dtypes to search: auto,fp8 (overrides the space's kv_cache_dtype).")]
TargetOption = Annotated[Optional[float], typer.Option(min=0.0, help="Required output tokens/s for the whole deployment.")]
RateOption = Annotated[Optional[float], typer.Option(min=0.0, help="Override the workload's Poisson request rate (requests/s).")]
PriceOption = Annotated[Optional[str], typer.Option(help="Override GPU prices: h100_sxm=2.5,h200_sxm=3.2 (USD per GPU-hour).")]
ParamsOption = Annotated[Optional[Path], typer.Option(exists=True, dir_okay=False, help="Calibration parameters TOML (default: bundled).")]


class Routing(str, enum.Enum):
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"


MaxMemoryGibOption = Annotated[Optional[float], typer.Option("--max-memory-gib", min=0.001, help="Refuse a sweep estimated to need more memory (default: the machine's available memory), or a winner map whose table does not fit.")]
ReplayMaxSecondsOption = Annotated[Optional[float], typer.Option("--max-seconds", min=0.001, help="Stop a replay whose measured pace projects past this many seconds in all (default: no limit).")]
RoutingOption = Annotated[Routing, typer.Option(help="Replay: how requests reach data-parallel replicas (round_robin: request i to replica i mod DP; least_loaded: to the replica with the fewest outstanding requests).")]


def check_writable(path: Optional[Path], option: str) -> None:
    """Fail before any work if `path` cannot be written later (one short line naming `option`)."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    name_bytes, name_max = len(os.fsencode(path.name)), _name_max(parent)
    if name_bytes > name_max:
        raise bad_value(option, str(path), f"the file name is {name_bytes:,} bytes, longer than the {name_max} this file system allows; pick a shorter one")
    if not parent.is_dir():
        raise bad_value(option, str(path), f"the directory {short_repr(str(parent))} does not exist; create it or pick another path")
    if path.is_dir():
        raise bad_value(option, str(path), "is a directory; give a file name")
    if not os.access(parent, os.W_OK):
        raise bad_value(option, str(path), f"the directory {short_repr(str(parent))} is not writable; pick another path")


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of `folder` takes (255 where it does not say)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def clean_errors(command):
    """Turn PlanError (and a few OS errors) into one stderr line and its exit code (`ExitCode`):
    1 bad input, 2 nothing survived, 3 past --max-seconds; any other exception is a bug: 70."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except PlanError as error:
            err.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)  # [gpu.x] is text, not markup
            raise typer.Exit(code=exit_code_for(error)) from None
        except (OSError, UnicodeDecodeError) as error:
            err.print(f"[bold red]error:[/] {escape(_os_error_text(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=ExitCode.BAD_INPUT) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as error:  # a bug: one line, and the traceback on request
            if os.environ.get("JAXPLAN_DEBUG"):
                raise
            err.print(f"[bold red]internal error[/] (a bug in jaxplan, please report it): {type(error).__name__}: {escape(str(error))}. Rerun with JAXPLAN_DEBUG=1 for the traceback.", highlight=False, soft_wrap=True)
            raise typer.Exit(code=ExitCode.INTERNAL_ERROR) from None

    return wrapper


def _os_error_text(error: Exception) -> str:
    """An OS error as one short line: a path too long to show (the error it often is) is cut like any value."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.strerror}: {short_repr(str(error.filename))}"
    return str(error)


def parse_prices(text: str | None) -> dict[str, float]:
    """'h100_sxm=2.5,h200_sxm=3.1' -> {name: USD per GPU-hour}."""
    prices = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            raise bad_value("--price", item, "use GPU=USD_PER_HOUR, e.g. h100_sxm=2.5") from None
        if not math.isfinite(price) or price <= 0:
            raise bad_value("--price", item, "the price must be a positive number of USD per GPU-hour")
        prices[name.strip()] = price
    return prices


def progress_bar():
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"), TimeRemainingColumn(), console=err, transient=True)


def dtype_list(text: str, option: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """'bf16, fp8' -> ('bf16', 'fp8'); one line naming `option` for an empty, unknown or repeated value."""
    values = tuple(v.strip().lower() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in allowed]
    if not values or bad or len(set(values)) != len(values):
        problem = f"{bad[0]!r} is not one of them" if bad else "name each at most once" if values else "name at least one"
        raise bad_value(option, text, f"use comma-separated values from {', '.join(allowed)}; {problem}")
    return values


def sweep_options(model, gpus, workload, space, budget, target_throughput, rate, price, weight_dtypes=None, kv_cache_dtypes=None):
    """Load and validate the inputs shared by sweep, report, size and sensitivity."""
    from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list
    from jaxplan.specs.space import KV_CACHE_DTYPES, WEIGHT_DTYPES
    from jaxplan.specs.workload import Arrival

    model_spec = load_model(model)
    gpu_specs = parse_gpu_list(gpus)
    prices = parse_prices(price)
    unknown = set(prices) - {g.name for g in gpu_specs}
    if unknown:
        raise bad_value("--price", sorted(unknown)[0], f"not among --gpus ({gpus})")
    gpu_specs = tuple(g.with_price(prices[g.name]) if g.name in prices else g for g in gpu_specs)
    workload_spec = load_workload(workload)
    changes = {}
    if target_throughput is not None:
        if not target_throughput > 0:  # sizing needs a target: refuse 0 here, before the sweep, not in the sizing after it
            raise bad_value("--target-throughput", target_throughput, "must be > 0 output tokens/s; leave it out for the workload's own target")
        changes["target_output_tokens_per_s"] = target_throughput
    if rate is not None:
        changes.update(arrival=Arrival.POISSON, request_rate_per_s=rate)
    if changes:
        workload_spec = dataclasses.replace(workload_spec, **changes)
        workload_spec.check_target_is_offered()
    space_spec = load_space(space)
    if budget is not None:
        space_spec = space_spec.replace(gpu_budget=budget)
    if weight_dtypes is not None:
        space_spec = space_spec.replace(weight_dtype=dtype_list(weight_dtypes, "--weight-dtypes", WEIGHT_DTYPES))
    if kv_cache_dtypes is not None:
        space_spec = space_spec.replace(kv_cache_dtype=dtype_list(kv_cache_dtypes, "--kv-cache-dtypes", KV_CACHE_DTYPES))
    return model_spec, gpu_specs, workload_spec, space_spec


def run_sweep(model_spec, gpu_specs, workload_spec, space_spec, top, chunk_size=1 << 16, params=None, max_seconds=None, max_memory_gib=None):
    """The funnel with a progress bar; refused up front when its estimated time or memory exceeds
    --max-seconds / --max-memory-gib (default: the machine's available memory)."""
    from jaxplan.system import available_memory_bytes
    from jaxplan.funnel.sweep import run_sweep

    max_memory_bytes = gib_bytes(max_memory_gib) if max_memory_gib is not None else available_memory_bytes()

    out.print(f"[bold]{model_spec.describe()}[/]", highlight=False)
    out.print(workload_spec.describe(), highlight=False)
    with progress_bar() as progress:
        task = progress.add_task("sweeping", total=space_spec.size(len(gpu_specs)))
        return run_sweep(
            model_spec, gpu_specs, workload_spec, space_spec, top_k=top, chunk_size=chunk_size,
            params_path=str(params) if params else None,
            progress=lambda done, total: progress.update(task, completed=done),
            max_seconds=max_seconds, max_memory_bytes=max_memory_bytes,
        )


def gib_bytes(max_memory_gib: float | None) -> float | None:
    """--max-memory-gib in bytes (None: not given)."""
    from jaxplan.funnel.budget import GIB

    return None if max_memory_gib is None else max_memory_gib * GIB


def stage7_deadline(max_seconds: float | None, started: float, finalists: int, requests: int):
    """The `progress` that stops stage 7 once the whole command (begun at `started`, perf_counter)
    projects past --max-seconds; None without a limit."""
    if max_seconds is None:
        return None
    from jaxplan.deadline import Deadline

    return Deadline(
        max_seconds, start=started, what=f"stage 7 (the replay of {finalists} finalists x {requests:,} requests)", unit="output tokens",
        fix="use fewer --replay-requests, a smaller --top or --no-replay",
    )


def json_default(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if hasattr(value, "value"):
        return value.value
    return str(value)


def finite(value):
    """JSON has no inf: write null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_text(payload) -> str:
    """`payload` as strict JSON (indent 2): dataclasses and enums as `json_default` writes them, and
    every non-finite float (an unbounded SLO, a burst's request rate) as null, never `Infinity`,
    which JSON parsers other than Python's reject."""

    def plain(value):
        if isinstance(value, dict):
            return {key: plain(v) for key, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, float):
            return finite(value)
        if value is None or isinstance(value, (str, int, bool)):
            return value
        converted = json_default(value)
        return plain(converted) if converted is not value else str(value)

    return json.dumps(plain(payload), indent=2, allow_nan=False)
