"""Winner map: stages 1-4 of the funnel over a grid of workload scenarios, one compiled pass.

The question is not "which configuration wins for this traffic" but "for which traffic does it
keep winning": the grid of candidates is streamed once, in chunks, and every chunk is evaluated
for every scenario (ISL x OSL, hit rate x rate, ...) inside the same jitted kernel:

* per chunk, the digits are decoded and stage 1's workload-independent checks (TP/PP divisibility,
  node fit, GPU budget, FP8, vLLM's rules) run once;
* vmapped over the scenario axis, stages 2-3 and the demand-independent part of stage 4 run on
  the DP-less configurations [S, Co] (as in the sweep, `funnel/chunk.py: device_chunk`);
* the survivors of all scenarios are compacted into one list and the rest of stage 4 runs on full
  pages of it, each survivor under its own scenario's workload (WorkloadParams fields gathered
  per survivor: the physics is elementwise);
* each scenario keeps a streaming per-layout best table ([S x layouts]: the best score of every
  (GPU, TP, PP, DP) layout and its knobs packed into one int32), so memory is bounded by the chunk
  x S and S x layouts, never by the grid. Ties go to the lowest grid index, as in the sweep.

"Winner" is the sweep's own objective (`funnel.estimate.objective`, through stage 4's score): for a
scenario equal to the sweep's workload, the winner and runner-up are the sweep's stage-4 shortlist
rows 1 and 2. The margin is exp(score_winner - score_runner_up) - 1: the objective is a log, so
this is the winner's relative advantage in its natural unit (output tokens per dollar, or, with a
throughput target, 1 / USD per hour), e.g. 0.25 = the runner-up is 25% worse. The runner-up is the
best *other layout* (another (GPU, TP, PP, DP)), not the same layout with other knobs.

The current workload is evaluated as one extra scenario and marked on the map (nearest cell).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.errors import PlanError, bad_value
from jaxplan.funnel.capacity import capacity
from jaxplan.funnel.chunk import (
    SweepContext,
    combine_reasons,
    compact,
    evaluate_survivors,
    layout_of,
)
from jaxplan.funnel.memory import memory
from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.structure import structure
from jaxplan.funnel.tables import NEG_INF, BestTable, merge_chunk
from jaxplan.grid import (
    AXES,
    DP_AXIS,
    LAYOUT_AXES,
    Grid,
    candidates_from_digits,
    decode_digits,
    layout_index,
)
from jaxplan.physics.shapes import take
from jaxplan.physics.steady_state import Prepared, prepare
from jaxplan.physics.traffic import WorkloadParams, max_context_tokens, workload_params
from jaxplan.plots import labels
from jaxplan.specs.workload import Arrival, Workload

KNOB_AXES = tuple(a for a in range(len(AXES)) if a not in LAYOUT_AXES)  # seqs, budget, weight and KV dtypes
DEFAULT_CHUNK = 1 << 15  # candidates per chunk; x scenarios evaluated per kernel call
DEFAULT_PAGE = 1 << 14  # stage-4 survivors (of all scenarios) per page
MAX_SCENARIOS = 4096
MAX_TABLE_BYTES = 1 << 30  # S x layouts x (score + packed knobs)

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


# ---------------------------------------------------------------- kernel


def _pack_knobs(digits: jnp.ndarray, sizes: jnp.ndarray) -> jnp.ndarray:
    """[C, 1] int32: the knob digits (seqs, budget, weight dtype, KV dtype) as one mixed-radix number.

    Within one layout, grid-index order is lexicographic in exactly these digits, so comparing the
    packed numbers breaks ties like the sweep (lowest grid index)."""
    packed = jnp.zeros(digits.shape[:-1], jnp.int32)
    for axis in KNOB_AXES:
        packed = packed * sizes[axis] + digits[..., axis]
    return packed[..., None]


def _unpack(layout_ids: np.ndarray, packed: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    """Full digits [K, A] from layout indices [K] and packed knobs [K]."""
    digits = np.zeros((len(layout_ids), len(AXES)), np.int32)
    layout_digits = np.unravel_index(layout_ids, [sizes[a] for a in LAYOUT_AXES])
    knob_digits = np.unravel_index(packed, [sizes[a] for a in KNOB_AXES])
    for axis, d in zip(LAYOUT_AXES, layout_digits):
        digits[:, axis] = d
    for axis, d in zip(KNOB_AXES, knob_digits):
        digits[:, axis] = d
    return digits


def _scenario_rows(prepared: Prepared) -> Prepared:
    """Per-scenario Prepared ([S, Co] fields, [S, K, Co] knot tables) as one: row s x Co + c."""
    flat = lambda x: jnp.reshape(x, (-1,))  # noqa: E731
    table = lambda x: jnp.reshape(jnp.moveaxis(x, 0, 1), (x.shape[1], -1))  # noqa: E731
    return Prepared(
        flat(prepared.b_max), flat(prepared.bound), flat(prepared.full_slot_s), flat(prepared.admission),
        table(prepared.knot_b), table(prepared.knot_slot_s), table(prepared.knot_rate),
        jnp.arange(prepared.b_max.size, dtype=jnp.int32),
    )


@functools.partial(jax.jit, static_argnames=("model", "page_size"))
def _map_chunk(table: BestTable, ctx: SweepContext, scenarios: WorkloadParams, base_digits, offsets, *, model, page_size: int):
    """(table [S x L], feasible count [S]) after folding the chunk at base + offsets into every scenario's table.

    The table is flat: segment s * L + layout. Survivors of stages 1-3 of *all* scenarios are compacted
    into one list and stage 4 runs on full pages of it, each survivor under its own scenario's workload."""
    ctx = ctx._replace(model=model)
    num_dp = ctx.axis_values[DP_AXIS].shape[0]
    num_s = scenarios.isl_tokens.shape[0]
    num_layouts = table.score.shape[0] // num_s
    outer_offsets = offsets[::num_dp] // num_dp
    outer_digits, outer_valid = decode_digits(ctx.sizes[:DP_AXIS], base_digits[:DP_AXIS], outer_offsets)
    first_dp = jnp.zeros((outer_digits.shape[0], 1), jnp.int32)
    outer = candidates_from_digits(ctx.axis_values, jnp.concatenate([outer_digits, first_dp], axis=1), outer_valid)
    hw, layout = take(ctx.hardware, outer.gpu_index), layout_of(outer)
    # Workload-independent: stage 1 and the GPU budget, once per chunk for every scenario.
    s1 = structure(ctx.model, hw, outer, jnp.inf, ctx.allow_multi_node)
    dp_values = ctx.axis_values[DP_AXIS]
    over_budget = outer.tensor_parallel_size[:, None] * outer.pipeline_parallel_size[:, None] * dp_values[None, :] > ctx.gpu_budget

    def per_scenario(w):  # stages 2-3 and stage 4's demand-independent part on the DP-less configurations [Co]
        s2 = memory(ctx.model, hw, layout, max_context_tokens(w), ctx.gpu_memory_utilization, ctx.block_size_tokens)
        s3, b_max, bound, _ = capacity(ctx.model, hw, layout, w, ctx.gpu_memory_utilization, ctx.block_size_tokens)
        later = jnp.where(s2 == Reason.ADMITTED, s3, s2)
        return later, prepare(ctx.model, hw, layout, w, ctx.gpu_memory_utilization, (b_max, bound))

    later, prepared = jax.vmap(per_scenario)(scenarios)  # [S, Co]
    prepared = _scenario_rows(prepared)  # row s x Co + c
    reason = combine_reasons(s1[None, :, None], later[:, :, None], over_budget[None])  # [S, Co, DP]
    reason = jnp.where(outer_valid[None, :, None], reason, jnp.int32(Reason.PADDING)).reshape(-1)
    order, survivors = compact(reason == Reason.ADMITTED)
    per_s = outer_digits.shape[0] * num_dp

    def body(carry):
        page, table, feasible = carry
        position = page * page_size + jnp.arange(page_size, dtype=jnp.int32)
        flat = order[jnp.minimum(position, order.shape[0] - 1)]
        s, rest = flat // per_s, flat % per_s
        which, dp_digit = rest // num_dp, rest % num_dp
        digits = jnp.concatenate([outer_digits[which], dp_digit[:, None]], axis=1)
        picked = candidates_from_digits(ctx.axis_values, digits, position < survivors)
        w = jax.tree.map(lambda f: f[s], scenarios)
        ev = evaluate_survivors(ctx._replace(workload=w), picked, prepared.take(s * outer_digits.shape[0] + which))
        segment = s * num_layouts + layout_index(digits, ctx.sizes)
        table = merge_chunk(table, segment, ev.score, _pack_knobs(digits, ctx.sizes))
        return page + 1, table, feasible.at[s].add((ev.score > NEG_INF).astype(jnp.int32))

    init = (jnp.int32(0), table, jnp.zeros(num_s, jnp.int32))
    _, table, feasible = jax.lax.while_loop(lambda c: c[0] * page_size < survivors, body, init)
    return table, feasible


# ---------------------------------------------------------------- result


def axis_label(name: str) -> str:
    """'isl' -> 'mean ISL (tokens)' (for axis titles)."""
    return {"isl": "mean ISL", "osl": "mean OSL", "rate": "request rate", "hit": "prefix hit rate", "concurrency": "concurrency"}[name] + f" ({AXIS_FIELDS[name][1]})"


def layout_label(row: dict | None) -> str:
    """'H200 TP4xPP1xDP2' (the figure's and the table's cell label); '' when nothing is feasible."""
    if row is None:
        return ""
    return labels.layout_label(row)


@dataclasses.dataclass
class WinnerPlane:
    """A 2-D view (what the heat map draws): arrays [ny, nx]; y is None for a 1-axis map (ny = 1)."""

    x_name: str
    x_values: np.ndarray
    y_name: str | None
    y_values: np.ndarray
    winner_labels: np.ndarray  # [ny, nx] str, e.g. "H200 TP4xPP1xDP2"; "" where nothing is feasible
    margin: np.ndarray  # [ny, nx] winner objective / runner-up objective - 1 (nan: no runner-up or no winner)
    current: tuple[float, float]  # the workload's own (x, y) (y = 0 for a 1-axis map)
    z_name: str | None = None
    z_value: float | None = None

    @property
    def x_label(self) -> str:
        return axis_label(self.x_name)

    @property
    def y_label(self) -> str:
        return axis_label(self.y_name) if self.y_name else ""


@dataclasses.dataclass
class WinnerMap:
    """Scenario arrays are [nz, ny, nx] (x = the first axis; missing axes have size 1)."""

    axes: tuple[ScenarioAxis, ...]
    workload: Workload
    winner: list  # [nz][ny][nx] row dict (sweep-style row evaluated under that scenario) or None
    runner_up: list  # same
    objective: np.ndarray  # [nz, ny, nx] winner's score (log objective; -inf: none)
    runner_up_objective: np.ndarray
    feasible: np.ndarray  # [nz, ny, nx] candidates passing stages 1-4
    current_winner: dict | None
    current_runner_up: dict | None
    current_objective: float
    current_runner_up_objective: float
    current_feasible: int
    num_candidates: int
    compile_s: float
    run_s: float
    chunk_size: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.objective.shape

    @property
    def x_name(self) -> str:
        return self.axes[0].name

    @property
    def y_name(self) -> str | None:
        return self.axes[1].name if len(self.axes) > 1 else None

    @property
    def z_name(self) -> str | None:
        return self.axes[2].name if len(self.axes) > 2 else None

    def values(self, k: int) -> np.ndarray:
        return np.array(self.axes[k].values) if k < len(self.axes) else np.array([0.0])

    @property
    def x_values(self) -> np.ndarray:
        return self.values(0)

    @property
    def y_values(self) -> np.ndarray:
        return self.values(1)

    @property
    def z_values(self) -> np.ndarray:
        return self.values(2)

    @property
    def labels(self) -> np.ndarray:
        """[nz, ny, nx] winner labels."""
        return np.array([[[layout_label(r) for r in row] for row in plane] for plane in self.winner], dtype=object).reshape(self.shape)

    @property
    def margins(self) -> np.ndarray:
        """[nz, ny, nx] exp(winner score - runner-up score) - 1 (nan: no runner-up, or no winner)."""
        both = np.isfinite(self.objective) & np.isfinite(self.runner_up_objective)
        diff = np.where(both, self.objective, 0.0).astype(np.float64) - np.where(both, self.runner_up_objective, 0.0).astype(np.float64)
        return np.where(both, np.expm1(diff), np.nan)

    @property
    def current_margin(self) -> float:
        if not (math.isfinite(self.current_objective) and math.isfinite(self.current_runner_up_objective)):
            return float("nan")
        return float(math.expm1(self.current_objective - self.current_runner_up_objective))

    def current_values(self) -> tuple[float | None, ...]:
        return tuple(current_value(self.workload, a.name) for a in self.axes)

    def current_cell(self) -> tuple[int, int, int]:
        """(iz, iy, ix) of the grid cell nearest the current workload (in log space on log axes)."""
        cell = []
        for k in (2, 1, 0):
            if k >= len(self.axes):
                cell.append(0)
                continue
            axis = self.axes[k]
            values, here = np.array(axis.values), current_value(self.workload, axis.name)
            if axis.log_spaced and here > 0 and np.all(values > 0):
                values, here = np.log(values), math.log(here)
            cell.append(int(np.argmin(np.abs(values - here))))
        return tuple(cell)

    def plane(self, iz: int | None = None) -> WinnerPlane:
        """The 2-D map at facet iz (default: the facet nearest the current workload)."""
        iz = self.current_cell()[0] if iz is None else iz
        here = self.current_values()
        return WinnerPlane(
            self.x_name, self.x_values, self.y_name, self.y_values, self.labels[iz], self.margins[iz],
            (here[0], here[1] if len(here) > 1 else 0.0), self.z_name, float(self.z_values[iz]) if self.z_name else None,
        )

    # The heat map's interface (the plane at the current workload's facet).
    @property
    def winner_labels(self) -> np.ndarray:
        return self.plane().winner_labels

    @property
    def margin(self) -> np.ndarray:
        return self.plane().margin

    @property
    def current(self) -> tuple[float, float]:
        return self.plane().current

    def boundaries(self) -> list[dict]:
        """Adjacent cells (along each axis) whose winning layouts differ."""
        labels = self.labels
        out = []
        names = [a.name for a in self.axes]
        for k, axis in enumerate(self.axes):
            dim = 2 - k  # array dimension of axis k
            for index in np.ndindex(*labels.shape):
                if index[dim] + 1 >= labels.shape[dim]:
                    continue
                nxt = list(index)
                nxt[dim] += 1
                a, b = labels[index], labels[tuple(nxt)]
                if a != b:
                    at = {names[j]: float(self.axes[j].values[index[2 - j]]) for j in range(len(self.axes)) if j != k}
                    out.append({
                        "axis": axis.name, "from_value": float(axis.values[index[dim]]), "to_value": float(axis.values[index[dim] + 1]),
                        "at": at, "from_winner": a, "to_winner": b,
                    })
        return out

    def to_json(self) -> dict:
        def clean(row):
            if row is None:
                return None
            return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}

        def num(x):
            x = float(x)
            return x if math.isfinite(x) else None

        nz, ny, nx = self.shape
        cells = []
        margins = self.margins
        for iz, iy, ix in np.ndindex(nz, ny, nx):
            scenario = {self.axes[k].name: float(self.axes[k].values[(ix, iy, iz)[k]]) for k in range(len(self.axes))}
            cells.append({
                "scenario": scenario, "index": {"x": ix, "y": iy, "z": iz},
                "winner_label": layout_label(self.winner[iz][iy][ix]), "winner": clean(self.winner[iz][iy][ix]),
                "runner_up_label": layout_label(self.runner_up[iz][iy][ix]), "runner_up": clean(self.runner_up[iz][iy][ix]),
                "objective": num(self.objective[iz, iy, ix]), "runner_up_objective": num(self.runner_up_objective[iz, iy, ix]),
                "margin": num(margins[iz, iy, ix]), "feasible_candidates": int(self.feasible[iz, iy, ix]),
            })
        here = dict(zip([a.name for a in self.axes], self.current_values()))
        return {
            "axes": [{"name": a.name, "field": a.field, "unit": a.unit, "values": list(a.values)} for a in self.axes],
            "shape_zyx": list(self.shape),
            "objective": "funnel.estimate.objective (log); margin = exp(winner - runner_up) - 1",
            "cells": cells,
            "boundaries": self.boundaries(),
            "current": {
                "scenario": here, "nearest_cell": dict(zip(("z", "y", "x"), self.current_cell())),
                "winner_label": layout_label(self.current_winner), "winner": clean(self.current_winner),
                "runner_up_label": layout_label(self.current_runner_up), "runner_up": clean(self.current_runner_up),
                "objective": num(self.current_objective), "runner_up_objective": num(self.current_runner_up_objective),
                "margin": num(self.current_margin), "feasible_candidates": self.current_feasible,
            },
            "num_candidates": self.num_candidates, "num_scenarios": int(np.prod(self.shape)) + 1,
            "compile_s": self.compile_s, "run_s": self.run_s, "chunk_size": self.chunk_size,
        }


# ---------------------------------------------------------------- driver


def scenario_grid(workload: Workload, axes: tuple[ScenarioAxis, ...]) -> list[Workload]:
    """Scenario workloads in [nz, ny, nx] order (x fastest), then the current workload."""
    sizes = [len(a.values) for a in axes] + [1] * (MAX_AXES - len(axes))
    out = []
    for iz, iy, ix in np.ndindex(sizes[2], sizes[1], sizes[0]):
        idx = (ix, iy, iz)
        out.append(scenario_workload(workload, {a.name: a.values[idx[k]] for k, a in enumerate(axes)}))
    out.append(workload)
    return out


def stream_scenarios(grid: Grid, ctx: SweepContext, scenarios: WorkloadParams, *, chunk_size: int = DEFAULT_CHUNK, page_size: int = DEFAULT_PAGE, progress: Callable[[int, int], None] | None = None):
    """(per-layout tables BestTable [S, L] (digits = packed knobs [S, L, 1]), feasible [S] int64, compile_s, run_s, chunk)."""
    num_scenarios = int(scenarios.isl_tokens.shape[0])
    unit = grid.sizes[DP_AXIS]
    chunk_size = max(unit, (min(chunk_size, max(grid.size, 1)) + unit - 1) // unit * unit)
    page_size = max(256, min(int(page_size), chunk_size * num_scenarios))
    offsets = jnp.arange(chunk_size, dtype=jnp.int32)
    cells = num_scenarios * grid.num_layouts
    table = BestTable(jnp.full((cells,), NEG_INF, jnp.float32), jnp.full((cells, 1), -1, jnp.int32))
    arrays = ctx._replace(model=None)

    def run(table, start):
        return _map_chunk(table, arrays, scenarios, jnp.asarray(grid.digits_of(start)), offsets, model=ctx.model, page_size=page_size)

    starts = range(0, grid.size, chunk_size)
    feasible = []
    t0 = time.perf_counter()
    table, counts = run(table, starts[0])
    jax.block_until_ready(counts)
    feasible.append(counts)
    compile_s = time.perf_counter() - t0
    if progress:
        progress(min(chunk_size, grid.size), grid.size)
    t0 = time.perf_counter()
    for start in starts[1:]:
        table, counts = run(table, start)
        feasible.append(counts)
        if progress:
            progress(min(start + chunk_size, grid.size), grid.size)
    table = jax.device_get(table)
    table = BestTable(table.score.reshape(num_scenarios, -1), table.digits.reshape(num_scenarios, -1, 1))
    total = np.zeros(num_scenarios, np.int64)
    for counts in jax.device_get(feasible):
        total += counts
    return table, total, compile_s, time.perf_counter() - t0, chunk_size


def top_two(table: BestTable, grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layout ids [S, 2] (-1: none), scores [S, 2], packed knobs [S, 2]): best two layouts per scenario,
    ties to the lower layout index (like the shortlist)."""
    scores = np.asarray(table.score)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :2]
    if order.shape[1] < 2:
        order = np.concatenate([order, np.zeros((order.shape[0], 2 - order.shape[1]), order.dtype)], axis=1)
    best = np.take_along_axis(scores, order, axis=1)
    if scores.shape[1] < 2:
        best[:, 1] = -np.inf
    packed = np.take_along_axis(np.asarray(table.digits)[..., 0], order, axis=1)
    ids = np.where(np.isfinite(best), order, -1)
    return ids, best, packed


def rows_under(grid: Grid, ctx: SweepContext, digits: np.ndarray, params: WorkloadParams) -> list[dict]:
    """Sweep-style rows for candidates [K] each evaluated under its own scenario (params fields [K])."""
    from jaxplan.funnel.sweep import REPORT_ROWS, rows_for

    if len(digits) == 0:
        return []
    size = max(REPORT_ROWS, len(digits))  # rows_for pads the digits to this size; pad the scenarios alike
    w = WorkloadParams(*(jnp.concatenate([f, jnp.broadcast_to(f[:1], (size - len(digits),))]) for f in params))
    return rows_for(grid, ctx._replace(workload=w), digits)


def winner_map(
    model,
    gpus,
    workload: Workload,
    space,
    axes: tuple[ScenarioAxis, ...] | str,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    page_size: int = DEFAULT_PAGE,
    params_path: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_seconds: float | None = None,
    started: float | None = None,
    max_memory_bytes: float | None = None,
) -> WinnerMap:
    """Stages 1-4 over the grid for every scenario of `axes` (plus the current workload).

    max_seconds: stop (one-line PlanError) once the measured pace projects the map past this many
    seconds from `started` (time.perf_counter(); default: now), like a sweep's --max-seconds.
    max_memory_bytes: refuse a map whose scenario x layout table would not fit (--max-memory-gib);
    MAX_TABLE_BYTES caps it in any case."""
    from jaxplan.deadline import Deadline
    from jaxplan.funnel.sweep import build_context, check_inputs, grid_size_check

    if isinstance(axes, str):
        axes = parse_axes(axes)
    check_inputs(model, workload)
    grid = Grid(tuple(gpus), space)
    grid_size_check(grid)
    workloads = scenario_grid(workload, axes)
    if len(workloads) - 1 > MAX_SCENARIOS:
        raise bad_value("--winner-map", f"{len(workloads) - 1} scenarios", f"at most {MAX_SCENARIOS}; use fewer values per axis")
    table_bytes = len(workloads) * grid.num_layouts * 8
    over_option = max_memory_bytes is not None and table_bytes > max_memory_bytes
    if table_bytes > MAX_TABLE_BYTES or over_option:
        limit = f"the memory limit of {max_memory_bytes / 2**30:,.2f} GiB (--max-memory-gib)" if over_option else f"its cap of {MAX_TABLE_BYTES / 2**30:g} GiB"
        raise PlanError(
            f"the winner map would keep {len(workloads):,} scenarios x {grid.num_layouts:,} layouts ({table_bytes / 2**30:.2f} GiB), above {limit}; "
            "use fewer scenarios or a narrower space (fewer GPU types, TP/PP or DP values)" + (", or raise --max-memory-gib" if over_option else "")
        )
    for w in workloads:
        longest = float(max_context_tokens(workload_params(w)))
        if longest > model.max_position_embeddings:
            raise PlanError(
                f"scenario isl={w.isl_mean_tokens:g}, osl={w.osl_mean_tokens:g}: p99 request length {longest:,.0f} tokens exceeds "
                f"{model.name}'s max_position_embeddings = {model.max_position_embeddings:,}; lower the map's isl/osl range"
            )
    if max_seconds is not None:
        progress = Deadline(
            max_seconds, progress, start=started, what=f"the winner map ({len(workloads) - 1} scenarios)",
            fix="use fewer scenarios, a narrower space or fewer --gpus",
        )
    ctx = build_context(grid, model, workload, params_path)
    params = stacked_params(workloads)
    table, feasible, compile_s, run_s, chunk = stream_scenarios(grid, ctx, params, chunk_size=chunk_size, page_size=page_size, progress=progress)
    ids, best, packed = top_two(table, grid)

    # Evaluate winners and runners-up under their own scenario, in one batched call.
    num_s = len(workloads)
    flat_ids, flat_packed = ids.reshape(-1), packed.reshape(-1)
    have = flat_ids >= 0
    digits = _unpack(flat_ids[have], flat_packed[have], grid.sizes)
    scenario_of = np.repeat(np.arange(num_s), 2)[have]
    rows_flat = rows_under(grid, ctx, digits, jax.tree.map(lambda f: f[jnp.asarray(scenario_of)], params))
    rows: list[dict | None] = [None] * (2 * num_s)
    for slot, row in zip(np.flatnonzero(have), rows_flat):
        rows[slot] = row
    sizes = [len(a.values) for a in axes] + [1] * (MAX_AXES - len(axes))
    nz, ny, nx = sizes[2], sizes[1], sizes[0]
    cells = num_s - 1

    def nest(values):
        return [[values[(iz * ny + iy) * nx: (iz * ny + iy + 1) * nx] for iy in range(ny)] for iz in range(nz)]

    return WinnerMap(
        axes=axes, workload=workload,
        winner=nest(rows[0: 2 * cells: 2]), runner_up=nest(rows[1: 2 * cells: 2]),
        objective=best[:cells, 0].reshape(nz, ny, nx), runner_up_objective=best[:cells, 1].reshape(nz, ny, nx),
        feasible=feasible[:cells].reshape(nz, ny, nx),
        current_winner=rows[2 * cells], current_runner_up=rows[2 * cells + 1],
        current_objective=float(best[cells, 0]), current_runner_up_objective=float(best[cells, 1]),
        current_feasible=int(feasible[cells]),
        num_candidates=grid.size, compile_s=compile_s, run_s=run_s, chunk_size=chunk,
    )


# ---------------------------------------------------------------- terminal


def _value(name: str, v: float) -> str:
    if name == "hit":
        return f"{v:.0%}"
    return f"{v:,.0f}" if v >= 100 else f"{v:g}"


def _margin_text(margin: float, label: str) -> str:
    if not label:
        return "none"
    if not math.isfinite(margin):
        return "only"
    return f"+{margin:.1%}" if margin >= 0.01 else f"+{margin:.2%}"


def map_tables(wmap: WinnerMap) -> list:
    """Rich tables: rows = y values, columns = x values, cell = winner label and margin; * = the current
    workload's nearest cell. One table per value of a third (facet) axis."""
    from rich.table import Table

    labels, margins = wmap.labels, wmap.margins
    cz, cy, cx = wmap.current_cell()
    x, y = wmap.axes[0], wmap.axes[1] if len(wmap.axes) > 1 else None
    tables = []
    for iz in range(wmap.shape[0]):
        title = f"Winning layout by {axis_label(x.name)}" + (f" x {axis_label(y.name)}" if y else "")
        if wmap.z_name:
            title += f" at {wmap.z_name} = {_value(wmap.z_name, wmap.z_values[iz])}"
        table = Table(title=title, show_lines=True)
        table.add_column(f"{y.name} \\ {x.name}" if y else x.name, justify="right")
        for v in x.values:
            table.add_column(_value(x.name, v), justify="center")
        for iy in range(wmap.shape[1]):
            cells = []
            for ix in range(wmap.shape[2]):
                text = f"{labels[iz, iy, ix] or '-'}\n{_margin_text(margins[iz, iy, ix], labels[iz, iy, ix])}"
                if (iz, iy, ix) == (cz, cy, cx):
                    text = f"[bold]*{text}[/]"
                cells.append(text)
            table.add_row(_value(y.name, y.values[iy]) if y else "", *cells)
        table.caption = "cell: winning (GPU, TP, PP, DP) layout; +x% = its objective over the best other layout's; * = nearest the current workload"
        tables.append(table)
    return tables


def summary_lines(wmap: WinnerMap, max_boundaries: int = 12) -> list[str]:
    """The current workload's winner and margin, and where the winner changes."""
    here = ", ".join(f"{a.name} = {_value(a.name, v)}" for a, v in zip(wmap.axes, wmap.current_values()))
    lines = [
        f"current workload ({here}): {layout_label(wmap.current_winner) or 'nothing passes'}"
        + (f", margin {_margin_text(wmap.current_margin, layout_label(wmap.current_winner))} over {layout_label(wmap.current_runner_up)}" if wmap.current_runner_up else ""),
    ]
    bounds = wmap.boundaries()
    distinct = sorted({b for b in wmap.labels.ravel() if b})
    lines.append(f"{len(distinct)} distinct winner(s) over {int(np.prod(wmap.shape)):,} scenarios; {len(bounds)} boundary crossing(s) between neighbouring cells")
    for b in bounds[:max_boundaries]:
        at = ", ".join(f"{k} = {_value(k, v)}" for k, v in b["at"].items())
        lines.append(
            f"  {b['axis']} {_value(b['axis'], b['from_value'])} -> {_value(b['axis'], b['to_value'])}"
            + (f" at {at}" if at else "") + f": {b['from_winner'] or 'none'} -> {b['to_winner'] or 'none'}"
        )
    if len(bounds) > max_boundaries:
        lines.append(f"  ... {len(bounds) - max_boundaries} more (--json has all)")
    lines.append(f"{wmap.num_candidates:,} candidates x {int(np.prod(wmap.shape)) + 1} scenarios: compile {wmap.compile_s:.1f} s, streamed in {wmap.run_s:.1f} s")
    return lines
