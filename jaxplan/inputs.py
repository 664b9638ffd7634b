"""A sweep's inputs, loaded and validated once: model, GPU types (with prices), workload, search space.

Each input is a spec object or a name/path (as the CLI takes it); options such as a GPU budget, a
throughput target, a Poisson rate, prices and dtype lists are applied here, with one-line PlanErrors
that name the option as the caller spells it (`labels`: the CLI passes its `--flags`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from jaxplan.errors import bad_value
from jaxplan.specs.gpu import GpuSpec
from jaxplan.specs.model import ModelSpec
from jaxplan.specs.space import SearchSpace
from jaxplan.specs.workload import Workload

# How errors name each option: Python keyword arguments by default.
API_LABELS = {"price": "price", "weight_dtypes": "weight_dtypes", "kv_cache_dtypes": "kv_cache_dtypes", "target_throughput": "target_throughput", "gpus": "gpus", "layout_kinds": "layout_kinds"}
CLI_LABELS = {"price": "--price", "weight_dtypes": "--weight-dtypes", "kv_cache_dtypes": "--kv-cache-dtypes", "target_throughput": "--target-throughput", "gpus": "--gpus", "layout_kinds": "--layout-kinds"}


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a sweep runs over; `space_name` is how the space was named (for the report)."""

    model: ModelSpec
    gpus: tuple[GpuSpec, ...]
    workload: Workload
    space: SearchSpace
    space_name: str = ""


def parse_prices(text: str | Mapping[str, float] | None, label: str = "price") -> dict[str, float]:
    """'h100_sxm=2.5,h200_sxm=3.1' (or a {name: price} mapping) -> {name: USD per GPU-hour}."""
    if isinstance(text, Mapping):
        items = [(name, value, f"{name}={value}") for name, value in text.items()]
    else:
        items = [(*item.partition("=")[::2], item) for item in (text or "").split(",") if item.strip()]
    prices = {}
    for name, value, shown in items:
        try:
            price = float(value)
        except (TypeError, ValueError):
            raise bad_value(label, shown, "use GPU=USD_PER_HOUR, e.g. h100_sxm=2.5") from None
        if not math.isfinite(price) or price <= 0:
            raise bad_value(label, shown, "the price must be a positive number of USD per GPU-hour")
        prices[str(name).strip()] = price
    return prices


def dtype_list(text: str | Sequence[str], option: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """'bf16, fp8' (or ['bf16', 'fp8']) -> ('bf16', 'fp8'); one line naming `option` for an empty,
    unknown or repeated value."""
    parts = text.split(",") if isinstance(text, str) else [str(v) for v in text]
    values = tuple(v.strip().lower() for v in parts if v.strip())
    bad = [v for v in values if v not in allowed]
    if not values or bad or len(set(values)) != len(values):
        problem = f"{bad[0]!r} is not one of them" if bad else "name each at most once" if values else "name at least one"
        raise bad_value(option, text, f"use comma-separated values from {', '.join(allowed)}; {problem}")
    return values


def gpu_specs(gpus: str | GpuSpec | Sequence[str | GpuSpec], label: str = "gpus") -> tuple[GpuSpec, ...]:
    """'h100_sxm,h200_sxm', one GpuSpec, or a sequence of names and GpuSpecs -> GpuSpecs (no repeats)."""
    from jaxplan.specs import load_gpu, parse_gpu_list

    if isinstance(gpus, str):
        return parse_gpu_list(gpus)
    if isinstance(gpus, GpuSpec):
        return (gpus,)
    if not isinstance(gpus, Sequence) or not gpus:
        raise bad_value(label, gpus, "name at least one GPU type: 'h100_sxm,h200_sxm', a GpuSpec, or a list of either")
    specs = tuple(g if isinstance(g, GpuSpec) else load_gpu(str(g)) for g in gpus)
    if len({g.name for g in specs}) != len(specs):
        raise bad_value(label, [g.name for g in specs], "lists a GPU type twice")
    return specs


def load_inputs(
    model: str | ModelSpec,
    gpus,
    workload: str | Workload,
    space: str | SearchSpace = "default",
    *,
    budget: int | None = None,
    target_throughput: float | None = None,
    rate: float | None = None,
    price=None,
    weight_dtypes=None,
    kv_cache_dtypes=None,
    layout_kinds=None,
    enable_prefix_caching: bool | None = None,
    labels: Mapping[str, str] = API_LABELS,
) -> Inputs:
    """Load and validate the inputs shared by sweep, report, size and sensitivity: names/paths are
    loaded, spec objects taken as they are; the options override the workload and the space
    (layout_kinds: 'tp,dp_ep' or a list, the space's layout_kind: tp, ep, dp, dp_ep;
    enable_prefix_caching: the space's, vLLM's prefix cache on or off)."""
    from jaxplan.specs import load_model, load_space, load_workload
    from jaxplan.specs.space import KV_CACHE_DTYPES, LAYOUT_KINDS, WEIGHT_DTYPES
    from jaxplan.specs.workload import Arrival

    model_spec = model if isinstance(model, ModelSpec) else load_model(model)
    specs = gpu_specs(gpus, labels["gpus"])
    prices = parse_prices(price, labels["price"])
    unknown = set(prices) - {g.name for g in specs}
    if unknown:
        raise bad_value(labels["price"], sorted(unknown)[0], f"not among the GPU types ({', '.join(g.name for g in specs)})")
    specs = tuple(g.with_price(prices[g.name]) if g.name in prices else g for g in specs)
    if isinstance(workload, Workload):
        workload_spec = workload
        workload_spec.check_target_is_offered()  # load_workload checks a named one
    else:
        workload_spec = load_workload(workload)
    changes = {}
    if target_throughput is not None:
        if not target_throughput > 0:
            raise bad_value(labels["target_throughput"], target_throughput, "must be > 0 output tokens/s; leave it out for the workload's own target")
        changes["target_output_tokens_per_s"] = float(target_throughput)
    if rate is not None:
        changes.update(arrival=Arrival.POISSON, request_rate_per_s=float(rate))
    if changes:
        workload_spec = dataclasses.replace(workload_spec, **changes)
        workload_spec.check_target_is_offered()
    space_spec = space if isinstance(space, SearchSpace) else load_space(space)
    if budget is not None:
        space_spec = space_spec.replace(gpu_budget=budget)
    if weight_dtypes is not None:
        space_spec = space_spec.replace(weight_dtype=dtype_list(weight_dtypes, labels["weight_dtypes"], WEIGHT_DTYPES))
    if kv_cache_dtypes is not None:
        space_spec = space_spec.replace(kv_cache_dtype=dtype_list(kv_cache_dtypes, labels["kv_cache_dtypes"], KV_CACHE_DTYPES))
    if layout_kinds is not None:
        space_spec = space_spec.replace(layout_kind=dtype_list(layout_kinds, labels["layout_kinds"], LAYOUT_KINDS))
    if enable_prefix_caching is not None:
        space_spec = space_spec.replace(enable_prefix_caching=bool(enable_prefix_caching))
    space_spec = space_spec.for_model(model_spec)
    return Inputs(model_spec, specs, workload_spec, space_spec, space if isinstance(space, str) else space_spec.name)
