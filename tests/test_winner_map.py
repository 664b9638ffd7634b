"""Winner map: stages 1-4 over workload scenarios in one pass.

Checked against independent sweeps (each scenario's winner and runner-up are the sweep's stage-4
shortlist rows 1 and 2 for that workload); the hand-built two-candidate case whose winner must flip
is in tests/test_winner_map_flip.py."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from jaxplan.errors import PlanError
from jaxplan.funnel.sweep import run_sweep
from jaxplan.grid import Grid
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list
from jaxplan.winner_map import parse_axes, winner_map

MODEL = load_model("llama-3.1-70b")
GPUS = parse_gpu_list("h100_sxm,h200_sxm")
CODING = load_workload("coding")  # ISL 8,000, Poisson 8 req/s
AXES = "isl=4000,8000,rate=4,8"  # the current workload is the cell (isl 8,000, rate 8)


@pytest.fixture(scope="module")
def small_map():
    return winner_map(MODEL, GPUS, CODING, load_space("small"), AXES)


def test_parse_axes_ranges_lists_and_errors():
    isl, hit = parse_axes("isl=2000:32000:5,hit=0:0.5:3")
    assert isl.name == "isl" and isl.values == (2000, 4000, 8000, 16000, 32000)  # log-spaced
    assert hit.values == (0.0, 0.25, 0.5)  # linear
    (rate,) = parse_axes("request_rate_per_s=4,1,2")
    assert rate.name == "rate" and rate.values == (1, 2, 4)  # aliases; sorted
    for bad in ("speed=1:2:3", "isl=1:2", "isl=10:5:3", "hit=0.5,1.0", "rate=0", "isl=1,osl=1,rate=1,hit=0", "4000", "isl=1,isl=2", ""):
        with pytest.raises(PlanError):
            parse_axes(bad)


def test_scenario_errors_are_plan_errors():
    with pytest.raises(PlanError, match="not Poisson"):
        winner_map(MODEL, GPUS, load_workload("rl-rollout"), load_space("small"), "rate=1,2")
    with pytest.raises(PlanError, match="max_position_embeddings"):
        winner_map(MODEL, GPUS, CODING, load_space("small"), "isl=200000")


def test_a_map_whose_rows_do_not_price_as_its_kernel_scored_them_stops(monkeypatch):
    """The cells' rows come from the report rows' program (-O0), the winners from the map kernel
    (compiled apart): rows that disagree with the kernel's scores are priced again at XLA's defaults,
    and where those disagree too the map stops with a one-line error instead of drawing them."""
    from jaxplan.funnel import chunk

    def off_by_a_percent(program):
        return lambda ctx, digits: (lambda ev: ev._replace(score=ev.score * 1.01))(program(ctx, digits))

    monkeypatch.setattr(chunk, "_evaluate_digits", off_by_a_percent(chunk._evaluate_digits))
    monkeypatch.setattr(chunk, "_evaluate_digits_default", off_by_a_percent(chunk._evaluate_digits_default))
    with pytest.raises(PlanError, match=r"internal check: the winner map's row \d+ has score"):
        winner_map(MODEL, GPUS, CODING, load_space("small"), AXES)


def test_every_cell_is_the_sweeps_own_answer(small_map):
    space = load_space("small")
    assert small_map.shape == (1, 2, 2)
    # The extra scenario (the current workload) and the cell at the same values both equal the sweep's top 2.
    sweep = run_sweep(MODEL, GPUS, CODING, space, top_k=2)
    first, second = sweep.shortlist
    assert small_map.current_winner["digits"] == first["digits"] and small_map.current_runner_up["digits"] == second["digits"]
    assert small_map.current_objective == pytest.approx(first["score"], abs=1e-6)
    cz, cy, cx = small_map.current_cell()
    assert (cy, cx) == (1, 1)
    assert small_map.winner[cz][cy][cx]["digits"] == first["digits"]
    # A cell away from the current workload equals an independent sweep of that workload.
    other = dataclasses.replace(CODING, isl_mean_tokens=4000.0, request_rate_per_s=4.0)
    sweep = run_sweep(MODEL, GPUS, other, space, top_k=2)
    assert small_map.winner[0][0][0]["digits"] == sweep.shortlist[0]["digits"]
    assert small_map.runner_up[0][0][0]["digits"] == sweep.shortlist[1]["digits"]
    expected_margin = math.expm1(sweep.shortlist[0]["score"] - sweep.shortlist[1]["score"])
    assert small_map.margins[0, 0, 0] == pytest.approx(expected_margin, rel=1e-3, abs=1e-6)
    # Feasible counts equal the sweep's stage-4 admissions.
    assert small_map.feasible[0, 0, 0] == sweep.stages[3].admitted


def test_plane_is_the_heat_map_interface(small_map):
    plane = small_map.plane()
    assert plane.x_name == "isl" and plane.y_name == "rate"
    assert list(plane.x_values) == [4000, 8000] and list(plane.y_values) == [4, 8]
    assert plane.winner_labels.shape == (2, 2) and plane.margin.shape == (2, 2)
    assert all(label.split()[0] in ("H100", "H200") and "TP" in label for label in plane.winner_labels.ravel())
    assert plane.current == (8000.0, 8.0)
    assert np.all((plane.margin >= 0) | np.isnan(plane.margin))
    payload = small_map.to_json()
    json.dumps(payload)  # no NaN/inf objects that break strict readers... (json allows NaN; we write null)
    assert len(payload["cells"]) == 4 and payload["current"]["winner"]["digits"] == small_map.current_winner["digits"]


def test_cli_winner_map_table_and_json(tmp_path):
    from jaxplan.cli import app

    path = tmp_path / "map.json"
    result = CliRunner().invoke(app, ["sensitivity", "--space", "small", "--winner-map", AXES, "--json", str(path)])
    assert result.exit_code == 0, result.output
    assert "Winning layout by mean ISL (tokens) x request rate" in result.stdout
    assert "current workload (isl = 8,000, rate = 8)" in result.stdout
    payload = json.loads(path.read_text())
    assert [a["name"] for a in payload["axes"]] == ["isl", "rate"] and len(payload["cells"]) == 4
    bad = CliRunner().invoke(app, ["sensitivity", "--space", "small", "--winner-map", "speed=1:2:3"])
    assert bad.exit_code == 1 and "scenario axes are" in bad.output and "Traceback" not in bad.output


def test_max_seconds_stops_the_map_and_a_generous_limit_changes_nothing(small_map):
    """A map whose pace projects past max_seconds stops after its first chunk with one line naming the
    map, the candidates done and the fix; a limit it keeps gives the same map as no limit."""
    with pytest.raises(PlanError, match=r"^stopped the winner map \(4 scenarios\) after .* at 512 of 1,536 candidates.*"
                       r"beyond --max-seconds = 0\.001; use fewer scenarios, a narrower space or fewer --gpus, or raise --max-seconds$"):
        winner_map(MODEL, GPUS, CODING, load_space("small"), AXES, chunk_size=512, max_seconds=0.001)
    limited = winner_map(MODEL, GPUS, CODING, load_space("small"), AXES, max_seconds=600)
    assert limited.labels.tolist() == small_map.labels.tolist()
    np.testing.assert_array_equal(limited.objective, small_map.objective)


def test_a_map_whose_table_exceeds_the_memory_limit_or_the_cap_is_refused(monkeypatch):
    """4 + 1 scenarios x the small space's layouts x 8 bytes: refused under a smaller --max-memory-gib
    (one line naming the option) or a smaller cap, before anything is built."""
    import jaxplan.funnel.sweep as sweep_module
    import jaxplan.winner_map.driver as wm

    monkeypatch.setattr(sweep_module, "build_context", lambda *a, **k: pytest.fail("the map started"))
    table = 5 * Grid(tuple(GPUS), load_space("small")).num_layouts * 8
    with pytest.raises(PlanError, match=r"^the winner map would keep 5 scenarios x .* layouts .* above the memory limit of 0\.00 GiB \(--max-memory-gib\); .*, or raise --max-memory-gib$"):
        winner_map(MODEL, GPUS, CODING, load_space("small"), AXES, max_memory_bytes=table - 1)
    monkeypatch.setattr(wm, "MAX_TABLE_BYTES", table - 1)
    with pytest.raises(PlanError, match=r"above its cap of .* GiB; use fewer scenarios or a narrower space \(fewer GPU types, TP/PP or DP values\)$"):
        winner_map(MODEL, GPUS, CODING, load_space("small"), AXES)
