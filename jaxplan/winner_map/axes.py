"""The winner map's scenario axes: parsing `--winner-map`, and the workloads of the scenario grid."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from jaxplan.errors import bad_value
from jaxplan.physics.traffic import WorkloadParams, workload_params
from jaxplan.specs.workload import Arrival, Workload

# Scenario axes: CLI name -> (WorkloadParams field, unit, log-spaced ranges)
AXIS_FIELDS = {
    "isl": ("isl_tokens", "tokens", True),
    "osl": ("osl_tokens", "tokens", True),
    "rate": ("request_rate_per_s", "requests/s", True),
    "hit": ("prefix_hit_rate", "fraction", False),
    "concurrency": ("concurrency", "requests", True),
}
ALIASES = {
    "isl_tokens": "isl", "osl_tokens": "osl", "request_rate_per_s": "rate", "request_rate": "rate",
    "prefix_hit_rate": "hit", "hit_rate": "hit", "conc": "concurrency",
}
MAX_AXES = 3
MAX_VALUES_PER_AXIS = 200


@dataclasses.dataclass(frozen=True)
class ScenarioAxis:
    name: str  # isl, osl, rate, hit, concurrency
    values: tuple[float, ...]

    @property
    def field(self) -> str:
        return AXIS_FIELDS[self.name][0]

    @property
    def unit(self) -> str:
        return AXIS_FIELDS[self.name][1]

    @property
    def log_spaced(self) -> bool:
        return AXIS_FIELDS[self.name][2]


def parse_axes(text: str) -> tuple[ScenarioAxis, ...]:
    """'isl=2000:32000:5,rate=1:16:5' -> axes (x first). `lo:hi:n` is log-spaced for token counts,
    rates and concurrency and linear for the hit rate; explicit values: 'hit=0,0.25,0.5'."""
    axes: list[tuple[str, list[float]]] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            raw_name, _, value = item.partition("=")
            name = ALIASES.get(raw_name.strip().lower(), raw_name.strip().lower())
            if name not in AXIS_FIELDS:
                raise bad_value("--winner-map", raw_name.strip(), f"scenario axes are {', '.join(AXIS_FIELDS)}")
            if any(n == name for n, _ in axes):
                raise bad_value("--winner-map", name, "each axis may appear once")
            axes.append((name, []))
        elif not axes:
            raise bad_value("--winner-map", item, "start with an axis: NAME=LO:HI:N or NAME=V1,V2,... (e.g. isl=2000:32000:5,rate=1:16:5)")
        else:
            value = item
        name, values = axes[-1]
        values.extend(_parse_values(name, value.strip()))
    if not axes:
        raise bad_value("--winner-map", text, "give 1 to 3 axes, e.g. isl=2000:32000:5,rate=1:16:5")
    if len(axes) > MAX_AXES:
        raise bad_value("--winner-map", text, f"at most {MAX_AXES} axes (x, y and one facet axis)")
    out = []
    for name, values in axes:
        if len(values) > MAX_VALUES_PER_AXIS:
            raise bad_value("--winner-map", f"{name} with {len(values)} values", f"at most {MAX_VALUES_PER_AXIS} values per axis")
        _check_values(name, values)
        out.append(ScenarioAxis(name, tuple(sorted(set(values)))))
    return tuple(out)


def _parse_values(name: str, text: str) -> list[float]:
    if ":" in text:
        parts = text.split(":")
        try:
            lo, hi, n = float(parts[0]), float(parts[1]), int(parts[2])
            if len(parts) != 3:
                raise ValueError
        except (ValueError, IndexError):
            raise bad_value("--winner-map", f"{name}={text}", "a range is LO:HI:N (N an integer number of values)") from None
        if not 1 <= n <= MAX_VALUES_PER_AXIS or not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
            raise bad_value("--winner-map", f"{name}={text}", f"need finite LO <= HI and 1 <= N <= {MAX_VALUES_PER_AXIS}")
        if n == 1:
            return [lo]
        if AXIS_FIELDS[name][2] and lo > 0:
            return [float(f"{v:.6g}") for v in np.geomspace(lo, hi, n)]
        return [float(f"{v:.6g}") for v in np.linspace(lo, hi, n)]
    try:
        value = float(text)
    except ValueError:
        raise bad_value("--winner-map", f"{name}={text}", "values are numbers; a range is LO:HI:N") from None
    return [value]


def _check_values(name: str, values: list[float]) -> None:
    for v in values:
        if not math.isfinite(v):
            raise bad_value("--winner-map", f"{name}={v}", "values must be finite")
        if name in ("isl", "osl") and not 1 <= v <= 1e7:
            raise bad_value("--winner-map", f"{name}={v:g}", "token counts must be in 1..10,000,000")
        if name == "hit" and not 0 <= v < 1:
            raise bad_value("--winner-map", f"hit={v:g}", "the prefix hit rate must be in [0, 1)")
        if name == "rate" and v <= 0:
            raise bad_value("--winner-map", f"rate={v:g}", "request rates must be > 0 requests/s")
        if name == "concurrency" and not 1 <= v <= 1e7:
            raise bad_value("--winner-map", f"concurrency={v:g}", "concurrency must be in 1..10,000,000 requests")


def scenario_workload(workload: Workload, values: dict[str, float]) -> Workload:
    """The workload with scenario values (axis name -> value) substituted."""
    changes = {}
    for name, v in values.items():
        if name == "isl":
            changes["isl_mean_tokens"] = float(v)
        elif name == "osl":
            changes["osl_mean_tokens"] = float(v)
        elif name == "hit":
            changes["prefix_hit_rate"] = float(v)
        elif name == "rate":
            if workload.arrival != Arrival.POISSON:
                raise bad_value("--winner-map", "rate", f"workload {workload.name!r} is not Poisson ({workload.arrival.value}); map `concurrency` instead, or pass --rate to make it Poisson")
            changes["request_rate_per_s"] = float(v)
        elif name == "concurrency":
            if workload.arrival == Arrival.POISSON:
                raise bad_value("--winner-map", "concurrency", f"workload {workload.name!r} is Poisson; map `rate` instead")
            changes["concurrency" if workload.arrival == Arrival.CLOSED else "num_requests"] = max(1, round(v))
    return dataclasses.replace(workload, **changes)


def current_value(workload: Workload, name: str) -> float:
    w = workload_params(workload)
    return float(getattr(w, AXIS_FIELDS[name][0]))


def stacked_params(workloads: Sequence[Workload]) -> WorkloadParams:
    """WorkloadParams with fields [S] (one entry per scenario)."""
    params = [workload_params(w) for w in workloads]
    return WorkloadParams(*(jnp.stack([getattr(p, f) for p in params]) for f in WorkloadParams._fields))


def scenario_grid(workload: Workload, axes: tuple[ScenarioAxis, ...]) -> list[Workload]:
    """Scenario workloads in [nz, ny, nx] order (x fastest), then the current workload."""
    sizes = [len(a.values) for a in axes] + [1] * (MAX_AXES - len(axes))
    out = []
    for iz, iy, ix in np.ndindex(sizes[2], sizes[1], sizes[0]):
        idx = (ix, iy, iz)
        out.append(scenario_workload(workload, {a.name: a.values[idx[k]] for k, a in enumerate(axes)}))
    out.append(workload)
    return out


def axis_label(name: str) -> str:
    """'isl' -> 'mean ISL (tokens)' (for axis titles)."""
    return {"isl": "mean ISL", "osl": "mean OSL", "rate": "request rate", "hit": "prefix hit rate", "concurrency": "concurrency"}[name] + f" ({AXIS_FIELDS[name][1]})"
