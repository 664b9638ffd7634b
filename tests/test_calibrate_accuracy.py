"""Which measured rows the accuracy report keeps under "kv_fits" (hand-computed capacity), and the held-out configurations."""

import pytest

from jaxplan.calibrate.run import kv_holds_concurrency
from jaxplan.errors import PlanError
from jaxplan.physics.params import DEFAULTS

# Llama-3.1-70B BF16 at TP=2 on H100-80GB with max_num_seqs 256 holds 1,481 blocks of 16 tokens
# (test_physics_memory): 8.78 requests of 2,700 tokens.
BASE = dict(model="llama-3.1-70b", gpu="h100_sxm", tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=1,
            weight_dtype="bf16", kv_cache_dtype="auto", isl=1700, osl=1000, max_num_seqs=256)


def test_closed_loop_rows_fit_up_to_the_hand_computed_capacity():
    rows = [dict(BASE, concurrency=c) for c in (1, 8, 9, 64)]
    assert kv_holds_concurrency(rows, {"h100_sxm": DEFAULTS}) == [True, True, False, False]


def test_replicas_split_the_clients():
    rows = [dict(BASE, concurrency=16, data_parallel_size=2), dict(BASE, concurrency=18, data_parallel_size=2)]
    assert kv_holds_concurrency(rows, {"h100_sxm": DEFAULTS}) == [True, False]


def test_open_loop_rows_are_always_kept():
    rows = [dict(BASE, request_rate=50.0, num_prompts=1000), dict(BASE, request_rate="inf", num_prompts=1000)]
    assert kv_holds_concurrency(rows, {"h100_sxm": DEFAULTS}) == [True, True]


def test_the_fit_sees_only_rows_whose_kv_cache_holds_the_clients(monkeypatch):
    """`calibrate` hands the serving fit the closed-loop rows up to the capacity (and open-loop rows),
    and still scores every row in the report."""
    from jaxplan.calibrate import fit, run

    measured = dict(backend="vllm", dataset="user", measured_ttft_ms_mean=200.0, measured_tpot_ms_mean=30.0, measured_output_tok_s=100.0)
    rows = [dict(BASE, **measured, concurrency=c) for c in (1, 8, 9, 64)] + [dict(BASE, **measured, request_rate=2.0, num_prompts=100)]
    assert run.trained_rows(rows, {"h100_sxm": {}}) == [rows[0], rows[1], rows[4]]
    seen = []
    real = fit.fit_data
    monkeypatch.setattr(fit, "fit_data", lambda r, gpus: seen.append([x.get("concurrency") for x in r]) or real(r, gpus))
    _, report = run.calibrate(rows, steps=2, log=lambda *a: None)
    assert seen[0] == [1, 8, None]  # the shipped fit (then the held-out-configurations fit, on a subset)
    assert set(map(tuple, seen[1:])) <= {(1, 8, None), (8, None), (1, None), (1, 8)}
    assert report["fit_rows"] == 5 and report["fit_rows_kv_fits"] == 3
    assert report["in_sample"]["h100_sxm"]["rows"] == 5 and report["in_sample"]["h100_sxm"]["kv_fits"]["rows"] == 3


def test_a_gpu_whose_rows_cannot_be_fitted_is_named_with_a_fix(tmp_path):
    """Only rows beyond the KV capacity: nothing is fitted, and `jaxplan calibrate` says why and what
    to measure instead (exit 0, the priors written)."""
    from typer.testing import CliRunner

    from jaxplan.calibrate import run
    from jaxplan.cli import app

    measured = dict(backend="vllm", dataset="user", measured_ttft_ms_mean=900.0, measured_tpot_ms_mean=40.0, measured_output_tok_s=500.0)
    rows = [dict(BASE, **measured, concurrency=c) for c in (16, 64)]
    _, report = run.calibrate(rows, steps=2, log=lambda *a: None)
    assert report["fit_rows_kv_fits"] == 0 and "in none of its 2 row(s)" in report["gpus_not_fitted"]["h100_sxm"]
    path = tmp_path / "measured.csv"
    columns = list(rows[0])
    path.write_text(",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["calibrate", "--measurements", str(path), "--no-shared-data", "--steps", "2", "-o", str(tmp_path / "p.toml")])
    assert result.exit_code == 0, result.output
    assert "warning: h100_sxm not fitted: in none of its 2 row(s)" in " ".join(result.output.split())
    assert (tmp_path / "p.toml").exists()


def test_the_parameters_are_written_before_the_replay_check(tmp_path, monkeypatch):
    """Two fitted GPUs: `jaxplan calibrate` writes the parameters as soon as the fit is done, says so,
    and only then replays the held-out rows (a check on them, which a user may interrupt)."""
    from typer.testing import CliRunner

    from jaxplan.calibrate import run
    from jaxplan.cli import app

    measured = dict(backend="vllm", dataset="user", measured_ttft_ms_mean=200.0, measured_tpot_ms_mean=30.0, measured_output_tok_s=100.0)
    rows = [dict(BASE, **measured, gpu=g, concurrency=c) for g in ("h100_sxm", "h200_sxm") for c in (1, 4)]
    path, target = tmp_path / "measured.csv", tmp_path / "p.toml"
    columns = list(rows[0])
    path.write_text(",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in rows))
    seen = []

    def check(rows, report, params, log=print, replayed=None):
        seen.append(target.exists() and "[gpu.h200_sxm]" in target.read_text())
        return {}

    monkeypatch.setattr(run, "replay_check", check)
    result = CliRunner().invoke(app, ["calibrate", "--measurements", str(path), "--no-shared-data", "--steps", "2", "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert seen == [True]
    assert f"wrote{target}(calibratedin" in "".join(result.output.split())  # rich may wrap the path


def test_one_gpu_of_your_own_gets_its_rows_replayed(tmp_path):
    """A user's measurements of one GPU: no GPU to hold out, but `jaxplan calibrate` still replays the
    rows step by step with the fit it wrote (`in_sample_replay`: how far `jaxplan predict`'s default
    method is from them) and says so; `--no-replay-check` skips it."""
    import json

    from typer.testing import CliRunner

    from jaxplan.cli import app

    measured = dict(backend="vllm", dataset="user", measured_ttft_ms_mean=200.0, measured_tpot_ms_mean=30.0, measured_output_tok_s=100.0)
    rows = [dict(BASE, **measured, osl=64, concurrency=c, num_prompts=2 * c) for c in (1, 4)]
    path, report_path = tmp_path / "measured.csv", tmp_path / "report.json"
    columns = list(rows[0])
    path.write_text(",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in rows))
    args = ["calibrate", "--measurements", str(path), "--no-shared-data", "--steps", "2", "-o", str(tmp_path / "p.toml"), "--report", str(report_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "replaying rows as a check" in " ".join(result.output.split())
    report = json.loads(report_path.read_text())
    replayed = report["in_sample_replay"]["h100_sxm"]
    assert replayed["rows"] == 2 and "not_predicted" not in replayed and replayed["ttft_mape"] >= 0 and replayed["tpot_mape"] >= 0
    assert "held_out_replay" not in report and report["held_out_params"] == {}
    result = CliRunner().invoke(app, args + ["--no-replay-check"])
    assert result.exit_code == 0, result.output
    assert "in_sample_replay" not in json.loads(report_path.read_text())


def test_held_out_configurations_are_scored_by_a_fit_that_never_saw_them(monkeypatch):
    """One GPU, four layouts x two concurrencies: the extra fit sees the rows of three layouts and the
    report scores the fourth with it; four folds score every layout once, each by a fit without it."""
    from jaxplan.calibrate import fit, run

    measured = dict(backend="vllm", dataset="user", measured_ttft_ms_mean=200.0, measured_tpot_ms_mean=30.0, measured_output_tok_s=100.0)
    rows = [dict(BASE, **measured, tensor_parallel_size=tp, concurrency=c) for tp in (2, 4, 8) for c in (1, 4)]
    rows += [dict(BASE, **measured, tensor_parallel_size=4, pipeline_parallel_size=2, concurrency=c) for c in (1, 4)]
    labels = {run.layout_label(r) for r in rows}
    assert "llama-3.1-70b TP4xPP2xDP1 bf16/auto" in labels and len(labels) == 4
    priors = {"h100_sxm": dict(DEFAULTS)}
    seen = []
    real = fit.fit_data
    monkeypatch.setattr(fit, "fit_data", lambda r, gpus: seen.append({run.layout_label(x) for x in r}) or real(r, gpus))
    result = run.held_out_configurations(rows, [True] * len(rows), priors, steps=2)["h100_sxm"]
    assert len(result["held_out"]) == 1 and result["rows"] == 2 and result["folds"] == 1
    assert seen == [labels - set(result["held_out"])]  # one fit, without the held-out layout
    assert result["ttft_mape"] >= 0 and "tpot_mape" in result

    seen.clear()
    result = run.held_out_configurations(rows, [True] * len(rows), priors, steps=2, folds=4)["h100_sxm"]
    assert sorted(result["held_out"]) == sorted(labels) and result["rows"] == 8 and len(seen) == 4
    assert all(len(fold) == 3 for fold in seen) and set.union(*[labels - fold for fold in seen]) == labels
    with pytest.raises(PlanError, match="folds"):
        run.held_out_configurations(rows, [True] * len(rows), priors, folds=5)
    with pytest.raises(PlanError, match=r"trained = '1 flags': must have one per row \(8\)"):
        run.held_out_configurations(rows, [True], priors)

    # A row the fit may not see (its KV cache cannot hold the clients) is scored but never fitted.
    seen.clear()
    unseen = run.layout_label(rows[0])
    run.held_out_configurations(rows, [run.layout_label(r) != unseen for r in rows], priors, steps=2, folds=4)
    assert len(seen) == 4 and all(unseen not in fold for fold in seen)


def test_configurations_are_rows_when_a_gpu_measured_one_layout():
    """One layout: its rows are dealt into the 4 folds (2 of 8 each); one row: nothing to hold out."""
    from jaxplan.calibrate import run

    one_layout = [dict(BASE, concurrency=c) for c in (1, 2, 4, 6, 8, 9, 64, 128)]
    folds, labels = run.configuration_folds(one_layout)
    assert sorted(folds) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert labels[0] == "2 of 8 rows (one layout: llama-3.1-70b TP2xPP1xDP1 bf16/auto)"
    assert run.configuration_folds(one_layout) == (folds, labels)  # seeded
    result = run.held_out_configurations(one_layout[:1], [True], {"h100_sxm": dict(DEFAULTS)})
    assert result["h100_sxm"]["skipped"].startswith("one measured row")


def test_a_clone_without_the_kernel_tables_calibrates_from_the_bundled_priors(tmp_path, monkeypatch):
    """A user's clone has no ../shared: `jaxplan calibrate` on their own rows starts every GPU from the
    [prior.<gpu>] tables of the bundled parameter file (the kernel-table priors the shipped fit came
    from), not from DEFAULTS, so a GPU they did not measure keeps its kernel values (B200 reads an FP8
    KV cache at 1.17 bytes per element and reaches 0.37 of its BF16 peak in prefill attention, where
    DEFAULTS say 1.35 and 0.45), and the file it writes records those priors again."""
    import json
    import tomllib

    from typer.testing import CliRunner

    from jaxplan.calibrate import fit
    from jaxplan.calibrate.run import KERNEL_FIELDS, PRIOR_SOURCES
    from jaxplan.cli import app
    from jaxplan.physics.params import load_priors

    bundled = load_priors()
    assert {"b200_sxm", "h100_sxm", "h200_sxm"} <= set(bundled)
    monkeypatch.setenv("JAXPLAN_SHARED_DATA", str(tmp_path / "no-shared-data"))
    assert not fit.has_kernel_tables("b200_sxm")
    measured = dict(backend="vllm", dataset="user", measured_ttft_ms_mean=200.0, measured_tpot_ms_mean=30.0, measured_output_tok_s=100.0)
    rows = [dict(BASE, **measured, osl=64, concurrency=c, num_prompts=2 * c) for c in (1, 4)]
    path, target, report_path = tmp_path / "measured.csv", tmp_path / "p.toml", tmp_path / "report.json"
    columns = list(rows[0])
    path.write_text(",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in rows))
    args = ["calibrate", str(path), "--steps", "2", "--no-replay-check", "-o", str(target), "--report", str(report_path)]  # files as arguments
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    sources = json.loads(report_path.read_text())["prior_sources"]
    assert {g for g, source in sources.items() if source == PRIOR_SOURCES[1]} == set(bundled)
    assert {source for g, source in sources.items() if g not in bundled} <= {PRIOR_SOURCES[2]}  # a GPU no table covers
    written = tomllib.loads(target.read_text())
    b200 = written["gpu"]["b200_sxm"]  # not measured: its kernel fields are the bundled priors (GEMMs at the fitted share)
    ratios = json.loads(report_path.read_text())["serving_ratios"]
    for field in KERNEL_FIELDS + ("fp8_kv_read_bytes_per_element", "fp4_gemm_flops_efficiency"):
        assert b200[field] == pytest.approx(bundled["b200_sxm"][field] * ratios.get(field, 1.0), rel=1e-5), field
    assert set(ratios) == {"gemm_flops_efficiency"} and 0.05 < ratios["gemm_flops_efficiency"] < 20
    assert b200["fp8_kv_read_bytes_per_element"] == pytest.approx(1.17, abs=0.01) != DEFAULTS["fp8_kv_read_bytes_per_element"]
    assert b200["attention_flops_efficiency"] == pytest.approx(0.37, abs=0.01)
    for gpu, prior in bundled.items():
        assert written["prior"][gpu] == pytest.approx(prior, rel=1e-5), gpu


def test_the_bundled_priors_are_the_kernel_tables_priors():
    """The [prior.<gpu>] tables shipped in the parameter file are what `fit.kernel_priors` reads off
    NVIDIA's tables today (to the file's 6 digits): rerun `jaxplan calibrate` when either changes."""
    from jaxplan.calibrate import _data, fit
    from jaxplan.physics.params import load_priors

    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    bundled = load_priors()
    with_tables = [g for g in bundled if fit.has_kernel_tables(g)]
    assert len(with_tables) >= 5
    for gpu in with_tables:
        assert bundled[gpu] == pytest.approx(fit.kernel_priors(gpu), rel=1e-5), gpu


def test_parameter_file_round_trip_keeps_gpu_and_prior_tables_apart(tmp_path):
    """`write_params` writes [gpu.*] (what the physics reads) and [prior.*] (what a later calibration
    starts from); each loader reads its own tables back to 6 significant digits."""
    from jaxplan.calibrate.run import write_params
    from jaxplan.physics.params import load_efficiency, load_priors

    params = {"h100_sxm": {**DEFAULTS, "gemm_flops_efficiency": 0.71234567}}
    priors = {"h100_sxm": {**DEFAULTS, "gemm_flops_efficiency": 0.65432198}, "b200_sxm": dict(DEFAULTS)}
    path = write_params(params, tmp_path / "p.toml", {"date": "2026-12-03"}, priors)
    assert load_efficiency(str(path))["h100_sxm"]["gemm_flops_efficiency"] == pytest.approx(0.712346, rel=1e-9)
    assert set(load_efficiency(str(path))) == {"h100_sxm"}
    loaded = load_priors(str(path))
    assert set(loaded) == {"h100_sxm", "b200_sxm"} and loaded["h100_sxm"]["gemm_flops_efficiency"] == pytest.approx(0.654322, rel=1e-9)
    assert load_priors(str(tmp_path / "missing.toml")) == {}


def test_engine_settings_of_json_runs_benchmarked_without_metadata(tmp_path, monkeypatch):
    """`vllm bench serve` JSON files record no GPU or TP unless run with --metadata: `jaxplan calibrate
    --gpu ... --tensor-parallel-size ...` names them (for the files that do not), and such a flag with
    no JSON file to apply to is a one-line error naming it."""
    import json

    from typer.testing import CliRunner

    from jaxplan.calibrate import run
    from jaxplan.cli import app

    record = {
        "backend": "vllm", "model_id": "/models/served-from-disk", "num_prompts": 40, "request_rate": "inf", "max_concurrency": 4,
        "completed": 40, "failed": 0, "total_input_tokens": 40 * 512, "total_output_tokens": 40 * 128,
        "output_throughput": 300.0, "mean_ttft_ms": 80.0, "mean_tpot_ms": 12.0,
    }  # fmt: skip
    bare, tagged = tmp_path / "bare.json", tmp_path / "tagged.jsonl"  # .jsonl: an --append-result file
    bare.write_text(json.dumps(record))
    tagged.write_text(json.dumps({**record, "gpu": "h100_sxm", "tensor_parallel_size": "1"}))
    seen = []

    def fake(rows, **kwargs):
        seen.extend(rows)
        return {}, {"seconds": 0.0, "fit_backend": "vllm", "fit_rows": len(rows), "fit_rows_kv_fits": len(rows)}

    monkeypatch.setattr(run, "calibrate", fake)
    monkeypatch.setattr(run, "write_params", lambda *a, **k: None)
    args = ["calibrate", str(bare), str(tagged), "--no-shared-data", "--no-replay-check", "-o", str(tmp_path / "p.toml")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "bare.json: gpu missing" in result.output and "--gpu h100_sxm (jaxplan calibrate or predict" in " ".join(result.output.split())
    result = CliRunner().invoke(app, args + ["--gpu", "h200_sxm", "--tensor-parallel-size", "2"])
    assert result.exit_code == 1 and "/models/served-from-disk" in result.output and "--model path/to/config.json (the model's Hugging Face config)" in " ".join(result.output.split())
    result = CliRunner().invoke(app, args + ["--model", "llama-3.1-8b", "--gpu", "h200_sxm", "--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8"])
    assert result.exit_code == 0, result.output
    by_file = {r["source_id"].split("#")[0]: r for r in seen}
    assert (by_file["bare.json"]["gpu"], by_file["bare.json"]["tensor_parallel_size"], by_file["bare.json"]["model"]) == ("h200_sxm", 2, "llama-3.1-8b")
    assert (by_file["tagged.jsonl"]["gpu"], by_file["tagged.jsonl"]["tensor_parallel_size"]) == ("h100_sxm", 1)  # its --metadata wins
    assert by_file["bare.json"]["kv_cache_dtype"] == by_file["tagged.jsonl"]["kv_cache_dtype"] == "fp8"
    csv_path = tmp_path / "rows.csv"
    csv_path.write_text("model\n")
    result = CliRunner().invoke(app, ["calibrate", str(csv_path), "--gpu", "h100_sxm", "--no-shared-data"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "--gpu" in result.output and "h100_sxm" in result.output and ".json" in result.output


def test_a_users_csv_without_a_backend_is_fitted_as_vllm(tmp_path, monkeypatch):
    """Found by an audit: a measured CSV without a `backend` column went to "other backends" and the fit
    saw none of it (exit 0, fit_rows = 0). An empty backend is vLLM's; a file without measured TTFT and
    TPOT, or with no vLLM row at all, is refused with one line that says what to give."""
    from typer.testing import CliRunner

    from jaxplan.calibrate import run
    from jaxplan.cli import app

    seen = []

    def fake(rows, **kwargs):
        seen.extend(rows)
        fitted = [r for r in run.evaluated_rows(rows) if not run.fit_excluded(r)]
        return {}, {"seconds": 0.0, "fit_backend": "vllm", "fit_rows": len(fitted), "fit_rows_kv_fits": len(fitted)}

    monkeypatch.setattr(run, "calibrate", fake)
    monkeypatch.setattr(run, "write_params", lambda *a, **k: None)
    header = "model,gpu,tensor_parallel_size,isl,osl,concurrency"
    mine = tmp_path / "mine.csv"
    mine.write_text(f"{header},measured_ttft_ms_mean,measured_tpot_ms_mean\nllama-3.1-8b,h100_sxm,1,1024,256,16,80,11\nllama-3.1-8b,h100_sxm,2,1024,256,16,60,7\n")
    args = ["--no-shared-data", "--no-replay-check", "-o", str(tmp_path / "p.toml")]
    result = CliRunner().invoke(app, ["calibrate", str(mine), *args])
    assert result.exit_code == 0, result.output
    assert [r["backend"] for r in seen] == ["vllm", "vllm"] and '"fit_rows": 2' in result.output
    bare = tmp_path / "bare.csv"
    bare.write_text(f"{header}\nllama-3.1-8b,h100_sxm,1,1024,256,16\n")
    result = CliRunner().invoke(app, ["calibrate", str(bare), *args])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "bare.csv: no row has both measured_ttft_ms_mean and measured_tpot_ms_mean" in result.output
    sglang = tmp_path / "sglang.csv"
    sglang.write_text(f"{header},measured_ttft_ms_mean,measured_tpot_ms_mean,backend\nllama-3.1-8b,h100_sxm,1,1024,256,16,80,11,sglang\n")
    result = CliRunner().invoke(app, ["calibrate", str(sglang), *args])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "sglang.csv: backend = 'sglang': no measured vllm row to fit" in " ".join(result.output.split())  # names the file


def test_rows_csv_holds_the_predictions_behind_the_report(tmp_path):
    """`jaxplan calibrate --rows rows.csv`: every measured row next to its predictions, from which the
    report's numbers follow (in sample, held out, replayed)."""
    import csv
    import json

    from typer.testing import CliRunner

    from jaxplan.calibrate.metrics import mape
    from jaxplan.calibrate.rows import read_predict_csv
    from jaxplan.cli import app

    measured = dict(backend="vllm", dataset="user", measured_output_tok_s=100.0)
    rows = [
        dict(BASE, **measured, gpu=g, osl=64, concurrency=c, num_prompts=2 * c, measured_ttft_ms_mean=ttft, measured_tpot_ms_mean=tpot)
        for g, scale in (("h100_sxm", 1.0), ("h200_sxm", 0.8)) for c, ttft, tpot in ((1, 150.0 * scale, 25.0 * scale), (4, 260.0 * scale, 31.0 * scale))
    ]  # fmt: skip
    path, report_path, table_path = tmp_path / "measured.csv", tmp_path / "report.json", tmp_path / "rows.csv"
    columns = list(rows[0])
    path.write_text(",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in rows))
    args = ["calibrate", str(path), "--no-shared-data", "--steps", "20", "-o", str(tmp_path / "p.toml"), "--report", str(report_path), "--rows", str(table_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    table = list(csv.DictReader(table_path.open()))
    assert [float(r["measured_ttft_ms_mean"]) for r in table] == [r["measured_ttft_ms_mean"] for r in rows]
    assert [r["concurrency"] for r in read_predict_csv(table_path)] == [1, 4, 1, 4]  # it reads back as input
    assert all(r["fitted"] == "true" and r["kv_fits"] == "true" and r["status"] == "ok" for r in table)
    for gpu in ("h100_sxm", "h200_sxm"):
        mine = [r for r in table if r["gpu"] == gpu]
        for column, measured_column, section, metric in (
            ("ttft_ms_mean", "measured_ttft_ms_mean", "in_sample", "ttft_mape"), ("tpot_ms_mean", "measured_tpot_ms_mean", "in_sample", "tpot_mape"),
            ("held_out_ttft_ms_mean", "measured_ttft_ms_mean", "held_out", "ttft_mape"), ("held_out_tpot_ms_mean", "measured_tpot_ms_mean", "held_out", "tpot_mape"),
            ("replay_ttft_ms_mean", "measured_ttft_ms_mean", "in_sample_replay", "ttft_mape"),
        ):  # fmt: skip
            found = mape([float(r[column]) for r in mine], [float(r[measured_column]) for r in mine])
            assert found == pytest.approx(report[section][gpu][metric], rel=1e-4), (gpu, column)
    result = CliRunner().invoke(app, args + ["--no-replay-check"])
    assert result.exit_code == 0, result.output
    assert {r["replay_ttft_ms_mean"] for r in csv.DictReader(table_path.open())} == {""}  # no replay: blank, not stale


# Llama-3.1-8B FP8 on one H200, 2,000 / 100 at 64 clients: the shared campaign's row that measured 9.74 ms TPOT.
IMPOSSIBLE = dict(model="llama-3.1-8b", gpu="h200_sxm", tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
                  weight_dtype="fp8", kv_cache_dtype="fp8", isl=2000, osl=100, concurrency=64, num_prompts=640, backend="vllm",
                  dataset="user", measured_ttft_ms_mean=122.0, measured_tpot_ms_mean=9.74)


def test_a_row_that_cannot_have_run_uncached_is_scored_not_fitted():
    """Its linear layers alone need 97% of the FP8 peak at its measured TPOT: 64 x (1 + 2,000 / 100) tokens
    a step x 2 x 8.0e9 weights over 1,978 TFLOP/s in 9.74 ms, by hand 0.97 (the kernel tables' best FP8
    GEMMs reach 0.77-0.85). A user's run like it is left out of their fit with the reason; the same row
    with a slower TPOT, a stated prefix hit rate or an open loop is fitted."""
    from jaxplan import measured
    from jaxplan.calibrate import run
    from jaxplan.specs import load_model

    by_hand = 64 * (1 + 2000 / 100) * 2 * load_model("llama-3.1-8b").layer_params(active=True) / 1.978e15 / 9.74e-3
    assert measured.implied_peak_fraction(IMPOSSIBLE) == pytest.approx(by_hand, rel=1e-12) and 0.96 < by_hand < 0.98
    assert run.fit_excluded(IMPOSSIBLE) == run.UNCACHED_IMPOSSIBLE
    assert run.fit_excluded(dict(IMPOSSIBLE, measured_tpot_ms_mean=12.0)) is None  # 0.79: possible
    assert run.fit_excluded(dict(IMPOSSIBLE, prefix_hit_rate=0.8)) is None  # 64 x (1 + 0.2 x 20) tokens a step: 0.23
    assert run.fit_excluded(dict(IMPOSSIBLE, concurrency=None, request_rate=5.0)) is None  # no closed-loop batch to bound
    shared = dict(IMPOSSIBLE, dataset="aiconfigurator_silicon")
    assert run.fit_excluded(shared) == run.FIT_EXCLUDED[("aiconfigurator_silicon", "llama-3.1-8b")]  # its campaign's reason first


def test_calibrate_says_which_rows_it_left_out_and_refuses_when_none_is_left(tmp_path, monkeypatch):
    """The command line names each left-out group with its reason (the fit itself replaced by what
    it reports of them: `not_fitted_groups`, as `run.calibrate` does), and refuses a file whose every
    row is left out, with the reason, before fitting."""
    from typer.testing import CliRunner

    from jaxplan.calibrate import run
    from jaxplan.cli import app
    from jaxplan.physics.params import load_efficiency

    def fake(rows, **_):
        groups = run.not_fitted_groups(run.evaluated_rows(rows))
        report = {"fit_backend": run.FIT_BACKEND, "fit_rows": len(rows), "fit_rows_kv_fits": len(rows),
                  "not_fitted": {key: {"reason": run.fit_excluded(group[0]), "rows": len(group)} for key, group in groups.items()}}
        return dict(load_efficiency()), report

    monkeypatch.setattr(run, "calibrate", fake)

    fine = [dict(IMPOSSIBLE, measured_tpot_ms_mean=tpot, concurrency=c, num_prompts=10 * c) for tpot, c in ((9.0, 4), (14.0, 16))]
    path = tmp_path / "measured.csv"
    columns = list(IMPOSSIBLE)

    def write(rows):
        path.write_text(",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in rows))

    args = ["calibrate", "--measurements", str(path), "--no-shared-data", "--no-replay-check", "-o", str(tmp_path / "p.toml")]
    write([IMPOSSIBLE, *fine])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "warning: 1 row(s) of h200_sxm/user/llama-3.1-8b not fitted: its measured TPOT leaves the linear layers" in said
    write([IMPOSSIBLE])
    result = CliRunner().invoke(app, args)
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "measured_tpot_ms_mean = 9.74: no measured vllm row is left to fit, this one's and every other's is left out: its measured TPOT" in said


def test_predict_notes_a_measured_run_too_fast_for_its_workload_uncached():
    from jaxplan.prediction import predict_rows

    noted, fine = predict_rows([IMPOSSIBLE, dict(IMPOSSIBLE, measured_tpot_ms_mean=12.0)], source="measurements")
    assert noted["status"].startswith("ok; measured TPOT too fast for this workload uncached (its linear layers alone would need 97% of")
    assert fine["status"] == "ok"
    (odd,) = predict_rows([dict(IMPOSSIBLE, measured_tpot_ms_mean="n/a")], source="measurements")  # a passthrough column
    assert odd["status"] == "ok"
