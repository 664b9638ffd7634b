"""The winner map's result: who wins each scenario, by what margin, and where the winner changes."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxplan.plots import labels
from jaxplan.specs.workload import Workload
from jaxplan.winner_map.axes import ScenarioAxis, axis_label, current_value


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
