"""What every command shares: the typer app, consoles, option types, error handling, loading a sweep's inputs."""

from __future__ import annotations

import contextlib
import enum
import functools
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
from jaxplan.jsonio import finite, json_default, json_text  # noqa: F401 - re-exported for the commands

app = typer.Typer(cls=ExitCodeGroup, add_completion=False, no_args_is_help=True, help="Plan LLM serving deployments on a CPU: how many GPUs, arranged how, for what traffic.")
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


# Options shared by several commands (one definition each).
ModelOption = Annotated[str, typer.Option(help="Bundled name, Hugging Face id (Qwen/Qwen3-32B) or a config.json path.")]
GpusOption = Annotated[str, typer.Option(help="Comma-separated GPU types: h100_sxm, h200_sxm, a100_sxm, b200_sxm, l40s, mi300x.")]
WorkloadOption = Annotated[str, typer.Option(help="Bundled workload (coding, chat, reasoning, rl-rollout) or a .toml path.")]
SpaceOption = Annotated[str, typer.Option(help="Bundled search space (default, small, huge) or a .toml path.")]
BudgetOption = Annotated[Optional[int], typer.Option(min=1, help="GPU budget (overrides the space's gpu_budget).")]
LayoutKindsOption = Annotated[Optional[str], typer.Option(help="Layout kinds of a MoE model to search, e.g. tp,dp_ep (overrides the space's layout_kind; default all four): tp, ep (--enable-expert-parallel), dp (--data-parallel-size, lock-step), dp_ep (both). A dense model has tp only.")]
WeightDtypesOption = Annotated[Optional[str], typer.Option(help="Weight dtypes to search, e.g. bf16,fp8,nvfp4 (overrides the space's weight_dtype; nvfp4 needs NVFP4 tensor cores: b200_sxm, b300_sxm, gb200, gb300).")]
KvDtypesOption = Annotated[Optional[str], typer.Option(help="KV-cache dtypes to search: auto,fp8 (overrides the space's kv_cache_dtype).")]
TargetOption = Annotated[Optional[float], typer.Option(min=0.0, help="Required output tokens/s for the whole deployment.")]
RateOption = Annotated[Optional[float], typer.Option(min=0.0, help="Override the workload's Poisson request rate (requests/s).")]
PriceOption = Annotated[Optional[str], typer.Option(help="Override GPU prices: h100_sxm=2.5,h200_sxm=3.2 (USD per GPU-hour).")]
PrefixCachingOption = Annotated[Optional[bool], typer.Option(
    "--enable-prefix-caching/--no-enable-prefix-caching",
    help="vLLM's prefix cache on (its default) or off, as the servers will run (overrides the space's enable_prefix_caching): "
         "without it a preempted request recomputes everything, and the winner's line says so.",
)]


def _say_params(value: Optional[Path]) -> Optional[Path]:
    """ParamsOption's callback: one stderr line naming the parameters file a command reads when it is
    not the bundled one (--params, else $JAXPLAN_PARAMS; `physics.params.selected_path`). A file that
    cannot be used gets no line here: the command's own one-line error names it."""
    from jaxplan.physics.params import describe_selection, load_efficiency

    try:
        line = describe_selection(value)
        if line:
            load_efficiency(str(value) if value else None)
    except PlanError:
        return value
    if line:
        err.print(escape(line), highlight=False, soft_wrap=True)
    return value


ParamsOption = Annotated[Optional[Path], typer.Option(exists=True, dir_okay=False, callback=_say_params, help="Calibration parameters TOML (default: $JAXPLAN_PARAMS if set, else the bundled file).")]


def _select_release(value: Optional[str]) -> Optional[str]:
    """VllmVersionOption's callback: a release that parses becomes this process's selection
    ($JAXPLAN_VLLM_VERSION, which every layer reads through `vllm_release.selected`); one stderr line
    names a release chosen by the option or the variable (none for the default)."""
    from jaxplan.vllm_release import RELEASE_ENV, parse_release

    if value:
        try:
            parse_release(value, "--vllm-version")
        except PlanError as error:
            raise typer.BadParameter(str(error)) from None
        os.environ[RELEASE_ENV] = value.strip()
        err.print(escape(f"vLLM release priced: {value.strip()} (from --vllm-version)"), highlight=False, soft_wrap=True)
    elif os.environ.get(RELEASE_ENV, "").strip():
        err.print(escape(f"vLLM release priced: {os.environ[RELEASE_ENV].strip()} (from ${RELEASE_ENV})"), highlight=False, soft_wrap=True)
    return value


VllmVersionOption = Annotated[Optional[str], typer.Option(
    "--vllm-version", callback=_select_release,
    help="The vLLM release to price, e.g. 0.8.3: it decides the engine serving pipeline parallelism (V0 before 0.9.1) and the default "
         "--gpu-memory-utilization of a predict row (0.92 from 0.22). Default: $JAXPLAN_VLLM_VERSION, else 0.19.0, the newest measured; "
         "a row's vllm_version column wins.")]


class Routing(str, enum.Enum):
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"
    DP_COORDINATOR = "dp_coordinator"


MaxMemoryGibOption = Annotated[Optional[float], typer.Option("--max-memory-gib", min=0.001, help="Refuse a sweep estimated to need more memory (default: the machine's available memory), or a winner map whose table does not fit.")]
ReplayMaxSecondsOption = Annotated[Optional[float], typer.Option("--max-seconds", min=0.001, help="Stop a replay whose measured pace projects past this many seconds in all (default: no limit).")]
RoutingOption = Annotated[Routing, typer.Option(help="Replay: how requests reach data-parallel replicas (round_robin: request i to replica i mod DP; least_loaded: to the replica with the fewest outstanding requests; dp_coordinator: to the lowest 4 x waiting + running, as vLLM's DP coordinator; a MoE model's lock-step DP ranks always use it).")]


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


def say_error(text: str) -> None:
    """One `error:` line on stderr; brackets in `text` (`[gpu.x]`) print as text, not rich markup."""
    err.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


def clean_errors(command):
    """Turn PlanError (and a few OS errors) into one stderr line and its exit code (`ExitCode`):
    1 bad input, 2 nothing survived, 3 past --max-seconds; any other exception is a bug: 70."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except PlanError as error:
            say_error(str(error))
            raise typer.Exit(code=exit_code_for(error)) from None
        except (OSError, UnicodeDecodeError) as error:
            say_error(_os_error_text(error))
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


def progress_bar():
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"), TimeRemainingColumn(), console=err, transient=True)


def load_cli_inputs(model, gpus, workload, space, budget, target_throughput, rate, price, weight_dtypes=None, kv_cache_dtypes=None, layout_kinds=None,
                    enable_prefix_caching=None):
    """The inputs shared by sweep, report, size and sensitivity (`jaxplan.inputs.load_inputs`, errors naming the --flags)."""
    from jaxplan.inputs import CLI_LABELS, load_inputs

    return load_inputs(
        model, gpus, workload, space, budget=budget, target_throughput=target_throughput, rate=rate, price=price,
        weight_dtypes=weight_dtypes, kv_cache_dtypes=kv_cache_dtypes, layout_kinds=layout_kinds,
        enable_prefix_caching=enable_prefix_caching, labels=CLI_LABELS,
    )


def plan_with_progress(inputs, on_funnel=None, **options):
    """`jaxplan.plan.run_plan` with the inputs described, a progress bar over the sweep (closed
    before `on_funnel(sweep_result)`, which may print) and a spinner during the replay."""
    from jaxplan.plan import run_plan

    out.print(f"[bold]{inputs.model.describe()}[/]", highlight=False)
    out.print(inputs.workload.describe(), highlight=False)
    with contextlib.ExitStack() as bar:
        progress = bar.enter_context(progress_bar())
        task = progress.add_task("sweeping", total=inputs.space.size(len(inputs.gpus)))

        def funnel_done(result) -> None:
            bar.close()  # one live display at a time: the replay's spinner comes next
            if on_funnel is not None:
                on_funnel(result)

        return run_plan(inputs, progress=lambda done, total: progress.update(task, completed=done), on_funnel=funnel_done, replay_status=err.status, **options)


def write_plots(make, total: int, directory: Path) -> list[Path]:
    """Draw with `make(step)` -> {name: Figure} and write PNG + SVG under `directory`, with a progress bar."""
    from jaxplan.plots.figures import write_figures
    from jaxplan.plots.save import plot_dir

    plot_dir(directory)
    with progress_bar() as progress:
        figures = make(progress_steps(progress, "drawing", total))
        paths = write_figures(figures, directory, progress_steps(progress, "writing", len(figures)))
    out.print(f"wrote {len(figures)} figures (PNG + SVG) to {directory}")
    return paths


def progress_steps(progress, description: str, total: int):
    """A `step(text)` that advances a new task of `progress` by one and shows `text`."""
    task = progress.add_task(description, total=total)

    def step(text: str) -> None:
        progress.update(task, description=text)
        progress.advance(task)

    return step


def gib_bytes(max_memory_gib: float | None) -> float | None:
    """--max-memory-gib in bytes (None: not given)."""
    from jaxplan.funnel.budget import GIB

    return None if max_memory_gib is None else max_memory_gib * GIB
