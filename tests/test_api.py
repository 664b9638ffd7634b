"""The Python API (jaxplan.sweep / predict / sensitivity -> typed results) against the CLI path and
the lower-level functions it wraps: same values, strict JSON that reads back, one-line PlanErrors."""

from __future__ import annotations

import dataclasses
import math
import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import jaxplan
from jaxplan.cli import app
from jaxplan.errors import PlanError
from jaxplan.finalist import Finalist, ReplayMetrics, Winner
from jaxplan.plan import Plan

SMALL = dict(model="llama-3.1-8b", gpus="h100_sxm", workload="chat", space="small", top=3, replay_requests=40)
SMALL_ARGS = ["--model", "llama-3.1-8b", "--gpus", "h100_sxm", "--workload", "chat", "--space", "small", "--top", "3", "--replay-requests", "40"]
TIMINGS = ("compile_s", "run_s")


@pytest.fixture(scope="module")
def plan() -> Plan:
    return jaxplan.sweep(**SMALL)


@pytest.fixture(scope="module")
def cli_json(tmp_path_factory, plan) -> dict:
    """`jaxplan sweep --json` with the same inputs (after `plan`: its programs are compiled)."""
    path = tmp_path_factory.mktemp("cli") / "sweep.json"
    result = CliRunner().invoke(app, ["sweep", *SMALL_ARGS, "--json", str(path)])
    assert result.exit_code == 0, result.output
    return json.loads(path.read_text())


def without_timings(payload: dict) -> dict:
    payload = {k: v for k, v in payload.items() if k not in TIMINGS}
    payload["funnel"] = [{k: v for k, v in s.items() if k != "seconds"} for s in payload["funnel"]]
    return payload


def test_import_jaxplan_is_cheap_and_names_load_on_use():
    code = "import sys, jaxplan; assert 'jax' not in sys.modules; jaxplan.load_model; assert callable(jaxplan.sweep); print(sorted(n for n in ('jax', 'jaxplan.api') if n in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['jaxplan.api']"  # the API's module, and still no JAX
    with pytest.raises(AttributeError, match="no_such_name"):
        jaxplan.no_such_name  # noqa: B018


def test_plan_is_typed_and_frozen(plan):
    assert isinstance(plan, Plan) and isinstance(plan.winner, Winner)
    assert len(plan.finalists) == 3 and all(isinstance(f, Finalist) and isinstance(f.replay, ReplayMetrics) for f in plan.finalists)
    assert plan.replayed and all(f.replay is None for f in plan.shortlist)  # stage 4's order keeps stage 4's rows
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.winner = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.finalists[0].num_gpus = 99


def test_finalists_are_ordered_and_the_winner_is_the_first(plan):
    scores = [f.replay.score for f in plan.finalists]
    assert scores == sorted(scores, reverse=True)
    assert plan.winner.finalist == plan.finalists[0]
    assert plan.winner.num_gpus == plan.finalists[0].num_gpus  # metrics read through to the finalist
    assert {f.digits for f in plan.finalists} == {f.digits for f in plan.shortlist}  # the replay re-ranks, it does not swap
    w = plan.winner
    assert w.serve_command.startswith("vllm serve meta-llama/Llama-3.1-8B") and f"--tensor-parallel-size {w.tensor_parallel_size}" in w.serve_command
    assert w.serve_commands == (w.serve_command,) and w.other_node_commands == ()  # one node
    assert "GPU KV cache size" in w.kv_cache_check and w.replay_shortfalls is not None


def test_every_finalist_carries_its_band_and_the_winner_a_verdict(plan):
    for f in plan.finalists:
        band = f.band
        assert band["band_class"].count("/") == 2
        assert band["output_tokens_per_s_p10"] <= band["output_tokens_per_s_p90"] and band["tpot_mean_s_p10"] < band["tpot_mean_s_p90"]
    assert plan.verdict is not None and json.loads(plan.to_json())["winner_verdict"]["close"] == plan.verdict.close


def test_funnel_counts_shrink_stage_by_stage(plan):
    assert [s.stage for s in plan.funnel] == [1, 2, 3, 4, 5, 6]
    admitted = [s.admitted for s in plan.funnel]
    assert admitted == sorted(admitted, reverse=True) and admitted[-1] == len(plan.shortlist) == 3
    assert all(s.admitted + s.rejected == (plan.grid_size if s.stage == 1 else plan.funnel[s.stage - 2].admitted) for s in plan.funnel[:4])
    assert plan.frontier and plan.sizing is None  # no target: no sizing


def test_plan_json_equals_what_the_cli_writes(plan, cli_json):
    mine = json.loads(plan.to_json())
    assert list(mine) == list(cli_json)  # same keys, same order
    assert without_timings(mine) == without_timings(cli_json)


def test_to_json_is_strict_and_reads_back(plan, tmp_path):
    text = plan.to_json()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    assert json.loads(text)["workload"]["request_rate_per_s"] is not None  # chat is Poisson: a finite rate stays
    back = Plan.from_json(text)
    assert back.to_json() == text and back.sweep is None
    assert back.winner == plan.winner and back.finalists == plan.finalists and back.frontier == plan.frontier
    assert back.model == plan.model and back.workload == plan.workload and back.space == plan.space and back.gpus == plan.gpus
    path = tmp_path / "sweep.json"
    path.write_text(text)
    assert Plan.from_json(path) == back


def test_report_from_json_renders_without_recomputing(cli_json, tmp_path, monkeypatch):
    import jaxplan.funnel.sweep

    monkeypatch.setattr(jaxplan.funnel.sweep, "run_sweep", lambda *a, **k: pytest.fail("report --from swept again"))
    source, html = tmp_path / "sweep.json", tmp_path / "report.html"
    source.write_text(json.dumps(cli_json))
    result = CliRunner().invoke(app, ["report", "--from", str(source), "-o", str(html)])
    assert result.exit_code == 0, result.output
    text = html.read_text()
    assert f"<code>{cli_json['winner']['vllm_serve']}" in text and "Re-ranked by the replay" in text
    assert "rendered from a saved sweep" in text and "<img" not in text  # figures need the live sweep: a note instead
    assert f"p10-p90 ({cli_json['winner']['band_class']}" in text and "tok/s p10-p90" in text  # the bands travel in the JSON
    for needle in ("llama-3.1-8b", "h100_sxm", "chat:", "small:", f"{cli_json['grid_size']:,} configurations"):
        assert needle in text, needle


def test_report_from_a_file_that_is_not_a_sweep_is_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"model": {}}')
    result = CliRunner().invoke(app, ["report", "--from", str(bad), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 1 and "not a `jaxplan sweep --json` file" in result.output and len(result.output.strip().splitlines()) == 1


def test_to_pandas_says_what_is_missing(plan, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # an import of pandas now fails, as where it is not installed
    with pytest.raises(PlanError, match="pip install pandas"):
        plan.to_pandas()


def test_to_pandas(plan):
    pytest.importorskip("pandas")
    frame = plan.to_pandas()
    assert list(frame["gpu"]) == [f.gpu for f in plan.finalists] and "replay_output_tokens_per_s" in frame.columns


def test_a_workload_built_in_code_sweeps_like_the_bundled_one():
    chat = jaxplan.load_workload("chat")
    fields = {f.name: getattr(chat, f.name) for f in dataclasses.fields(chat)}
    fields.update(arrival=chat.arrival.value, isl_distribution=chat.isl_distribution.value, osl_distribution=chat.osl_distribution.value)
    mine = jaxplan.Workload(**fields)  # enums given as text, as a notebook would
    assert mine == chat
    options = dict(space="small", top=3, replay=False)
    by_object = jaxplan.sweep(model=jaxplan.load_model("llama-3.1-8b"), gpus=[jaxplan.load_gpu("h100_sxm")], workload=mine, **options)
    by_name = jaxplan.sweep(model="llama-3.1-8b", gpus="h100_sxm", workload="chat", **options)
    assert by_object.finalists == by_name.finalists and by_object.winner == by_name.winner


def test_a_misspelt_arrival_is_refused():
    with pytest.raises(PlanError, match="unknown arrival .*'poison'.*Did you mean 'poisson'"):
        jaxplan.Workload(name="w", isl_mean_tokens=100, osl_mean_tokens=10, arrival="poison", request_rate_per_s=1.0)


@pytest.mark.parametrize("change, fragment", [
    (dict(model="no-such-model"), "unknown model"),
    (dict(gpus=[]), "gpus = []"),
    (dict(gpus=["h100_sxm", "h100_sxm"]), "twice"),
    (dict(price={"h200_sxm": 2.0}), "price = 'h200_sxm': not among the GPU types"),
    (dict(price="h100_sxm=-1"), "positive number"),
    (dict(weight_dtypes=["fp16"]), "'fp16' is not one of them"),
    (dict(top=0), "top = 0: must be an integer in 1..1,000"),
    (dict(replay_requests=5), "replay_requests = 5"),
    (dict(routing="random"), "Known: dp_coordinator, least_loaded, round_robin"),
    (dict(target_throughput=0), "target_throughput = 0"),
])
def test_bad_sweep_input_is_a_one_line_plan_error(change, fragment):
    with pytest.raises(PlanError) as error:
        jaxplan.sweep(**{**SMALL, **change})
    assert fragment in str(error.value) and "\n" not in str(error.value)


ROWS = [
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": 1, "isl": 1000, "osl": 200, "request_rate": 2, "num_prompts": 30},
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": 2, "isl": 1000, "osl": 200, "concurrency": 4, "num_prompts": 30},
]


def test_predict_wraps_the_row_predictors(tmp_path):
    from jaxplan.bands import with_bands
    from jaxplan.prediction import predict_rows, replay_predict_rows

    analytical = jaxplan.predict(ROWS, method="analytical")
    assert analytical == with_bands(predict_rows([dict(r) for r in ROWS]))  # the CLI's columns, bands included
    assert all(r["output_tok_s_p10"] <= r["output_tok_s_p90"] and r["prediction_class"] for r in analytical)
    assert jaxplan.predict(ROWS, num_requests=20) == with_bands(replay_predict_rows([dict(r) for r in ROWS], num_requests=20))
    csv = tmp_path / "rows.csv"
    columns = sorted({k for r in ROWS for k in r})
    csv.write_text(",".join(columns) + "\n" + "\n".join(",".join(str(r.get(c, "")) for c in columns) for r in ROWS) + "\n")
    from_csv = jaxplan.predict(csv, method="analytical")
    assert [r["output_tok_s"] for r in from_csv] == [r["output_tok_s"] for r in predict_rows([dict(r) for r in ROWS])]
    assert all(r["status"].startswith("ok") for r in from_csv)


@pytest.mark.parametrize("rows, kwargs, fragment", [
    (ROWS, dict(method="exact"), "method = 'exact'"),
    ([], {}, "at least one"),
    (ROWS[0], {}, "list of dicts"),
    (ROWS, dict(routing="x"), "unknown routing 'x'"),
])
def test_bad_predict_input_is_a_one_line_plan_error(rows, kwargs, fragment):
    with pytest.raises(PlanError, match=fragment):
        jaxplan.predict(rows, **kwargs)


def test_sensitivity_of_a_plan_follows_its_finalists(plan):
    from jaxplan.elasticity import for_rows

    sens = jaxplan.sensitivity(plan)
    reference = for_rows(plan.sweep, plan.sweep.shortlist)  # stage 4's order
    order = [[f.digits for f in plan.shortlist].index(f.digits) for f in plan.finalists]
    assert sens.elasticity.shape == (3, len(sens.metrics), len(sens.parameters))
    # Same rows in another order through the same padded program: equal up to float32 rounding.
    np.testing.assert_allclose(sens.values, reference.values[order], rtol=1e-6)
    np.testing.assert_allclose(sens.elasticity, reference.elasticity[order], rtol=1e-5, atol=1e-7)
    assert jaxplan.sensitivity(plan, top=1).values.shape[0] == 1


def test_sensitivity_needs_a_live_plan(plan):
    with pytest.raises(PlanError, match="read from JSON"):
        jaxplan.sensitivity(Plan.from_json(plan.to_json()))
    with pytest.raises(PlanError, match="either a plan or sweep options"):
        jaxplan.sensitivity(plan, model="llama-3.1-8b")


def test_a_finalist_row_round_trips_and_keeps_keys_it_does_not_name(plan):
    row = plan.finalists[0].to_row()
    assert Finalist.from_row(row) == plan.finalists[0]
    assert list(row)[-len(dataclasses.fields(ReplayMetrics)):] == [f"replay_{f.name}" for f in dataclasses.fields(ReplayMetrics)]
    newer = dict(row, some_new_column=7)  # a funnel that writes one more column
    assert Finalist.from_row(newer).to_row() == newer
    with pytest.raises(PlanError, match="lacks num_gpus"):
        Finalist.from_row({k: v for k, v in row.items() if k != "num_gpus"})
    with pytest.raises(PlanError, match="lacks replay_score"):
        Finalist.from_row({k: v for k, v in row.items() if k != "replay_score"})
    # JSON's null: inf for a metric, NaN for the sustained rate that a non-Poisson replay has none of;
    # a row written before the queue verdict reads as keeping up.
    read = Finalist.from_row(dict(row, replay_ttft_p99_s=None, replay_sustained_output_tokens_per_s=None)).replay
    assert read.ttft_p99_s == math.inf and math.isnan(read.sustained_output_tokens_per_s)
    older = Finalist.from_row({k: v for k, v in row.items() if k not in ("replay_falls_behind", "replay_queue_at_last_arrival", "replay_sustained_output_tokens_per_s")})
    assert older.replay.falls_behind is False and older.replay.queue_at_last_arrival == 0


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: [1, 2], "not a `jaxplan sweep --json` file"),
    (lambda d: dict(d, model=dict(d["model"], num_layers="x")), "model: num_layers = 'x': must be an integer"),
    (lambda d: dict(d, workload=dict(d["workload"], arrival="poison")), "unknown arrival"),
    (lambda d: dict(d, funnel=[{"x": 1}]), "malformed sweep JSON"),
])
def test_from_json_of_an_edited_file_is_one_line(plan, edit, fragment):
    with pytest.raises(PlanError) as error:
        Plan.from_json(json.dumps(edit(json.loads(plan.to_json()))))
    assert fragment in str(error.value) and str(error.value).startswith("the plan: ") and "\n" not in str(error.value)
