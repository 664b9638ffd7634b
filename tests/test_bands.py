"""Uncertainty bands (jaxplan/bands.py, docs/uncertainty.md): quantiles, pooling, classes, the band
columns of predict, and the coverage the bundled bands claim on held-out rows."""

import csv
import math
import tomllib

import numpy as np
import pytest

from jaxplan import bands
from jaxplan.calibrate import _data

H200, H100, MI325X, B200 = "h200_sxm", "h100_sxm", "mi325x", "b200_sxm"  # MI325X: no rows, no kernel tables
SEEN, UNSEEN = "llama-3.1-70b", "llama-3.1-8b"


def residual(evidence, model_class, regime, ratio, gpu=H200, model=SEEN):
    """A residual row whose measured / predicted is `ratio` for all three metrics (predicted 100)."""
    row = {"gpu": gpu, "model": model, "dataset": "synthetic", "source_id": "", "evidence": evidence, "model_class": model_class, "regime": regime}
    for m in bands.METRICS:
        row[f"measured_{m}"], row[m] = 100.0 * ratio, 100.0
    return row


def test_ratio_quantiles_are_the_interpolated_order_statistics():
    """Five ratios 1..5 (NaN ignored): p10 sits 0.4 of the way from the 1st to the 2nd (1.4), p90 0.6 of
    the way from the 4th to the 5th (4.6); eleven ratios 1..11 put them on the 2nd and the 10th."""
    values = np.array([[3.0, 1.0], [1.0, np.nan], [5.0, 1.0], [2.0, 1.0], [4.0, 1.0]])
    q = bands.ratio_quantiles(values)
    assert q[:, 0] == pytest.approx([1.4, 4.6])
    assert q[:, 1] == pytest.approx([1.0, 1.0])
    assert bands.ratio_quantiles(np.arange(1.0, 12.0)[:, None])[:, 0] == pytest.approx([2.0, 10.0])


def test_ratios_are_measured_over_predicted_and_nan_where_missing():
    rows = [residual("calibrated", "seen", "kv_fits", 1.5), {**residual("calibrated", "seen", "kv_fits", 2.0), "tpot_ms_mean": None}]
    r = bands.ratios(rows)
    assert r[0] == pytest.approx([1.5, 1.5, 1.5])
    assert r[1, 0] == pytest.approx(2.0) and math.isnan(r[1, 1])


def test_a_thin_class_borrows_the_nearest_coarser_band_stretched_to_its_own_rows():
    """20 kv_fits rows at ratios 0.80..1.18 and 3 kv_starved rows at 5: the kv_starved class (3 rows,
    and 3 in every pool that keeps the regime) takes the band of all 23 rows, stretched up to 5."""
    fits = [residual("calibrated", "seen", "kv_fits", 0.8 + 0.02 * i) for i in range(20)]
    starved = [residual("calibrated", "seen", "kv_starved", 5.0) for _ in range(3)]
    table = bands.compute_bands(fits + starved)
    own = table["calibrated/seen/kv_fits"]
    assert own["pooled_from"] == "calibrated/seen/kv_fits" and own["rows"] == 20 and not own["stretched"]
    expected = np.quantile(0.8 + 0.02 * np.arange(20), [0.1, 0.9])
    assert own["ttft_ms_mean"] == pytest.approx(expected.tolist())
    thin = table["calibrated/seen/kv_starved"]
    assert thin["pooled_from"] == "*/*/*" and thin["rows"] == 3 and thin["pooled_rows"] == 23 and thin["stretched"]
    all_ratios = np.r_[0.8 + 0.02 * np.arange(20), [5.0] * 3]
    assert thin["tpot_ms_mean"] == pytest.approx([np.quantile(all_ratios, 0.1), 5.0])
    # A class without rows takes the pool unstretched; a spec-sheet class is widened both ways.
    empty = table["kernel_tables/unseen/kv_fits"]
    assert empty["rows"] == 0 and empty["pooled_from"] == "*/*/kv_fits" and not empty["stretched"]
    spec = table["spec_sheet/seen/kv_fits"]
    assert spec["widened"] == bands.SPEC_SHEET_WIDENING
    assert spec["output_tok_s"] == pytest.approx([expected[0] / bands.SPEC_SHEET_WIDENING, expected[1] * bands.SPEC_SHEET_WIDENING])


def test_a_class_with_enough_rows_of_its_own_model_pool_keeps_its_regime():
    """8 kernel-table rows of an unseen model pool with the 12 of the seen model (same evidence and
    regime), not with the calibrated rows."""
    rows = [residual("kernel_tables", "seen", "kv_fits", 1.0 + 0.01 * i) for i in range(12)]
    rows += [residual("kernel_tables", "unseen", "kv_fits", 2.0, model=UNSEEN) for _ in range(8)]
    rows += [residual("calibrated", "seen", "kv_fits", 0.5) for _ in range(30)]
    entry = bands.compute_bands(rows)["kernel_tables/unseen/kv_fits"]
    assert entry["pooled_from"] == "kernel_tables/*/kv_fits" and entry["pooled_rows"] == 20
    assert entry["sources"] == [f"{H200}/{UNSEEN}/synthetic: 8"]


def test_an_unseen_class_of_fewer_models_borrows_a_coarser_band():
    """25 rows of two unseen models (enough rows, too few models to say how far a third lands) borrow the
    band of the coarser class, stretched to their own rows; a third model's 5 rows let them stand alone."""
    rows = [residual("spec_sheet", "unseen", "kv_starved", 1.0 + 0.02 * i, model=m) for m, n in (("a", 15), ("b", 10)) for i in range(n)]
    rows += [residual("spec_sheet", "seen", "kv_starved", 0.5 + 0.1 * i) for i in range(20)]
    entry = bands.compute_bands(rows)["spec_sheet/unseen/kv_starved"]
    assert entry["rows"] == 25 and entry["pooled_from"] == "spec_sheet/*/kv_starved" and entry["pooled_rows"] == 45
    assert entry["widened"] == bands.SPEC_SHEET_WIDENING
    rows += [residual("spec_sheet", "unseen", "kv_starved", 1.1, model="c") for _ in range(5)]
    assert bands.compute_bands(rows)["spec_sheet/unseen/kv_starved"]["pooled_from"] == "spec_sheet/unseen/kv_starved"


def test_unseen_models_widen_their_band_until_a_new_model_is_covered():
    """Three unseen models, each off in its own direction (x0.7, x1, x1.4, spread 0.9-1.1 within): the
    band from every row covers 80% of the rows, but one made from two models misses most of the third's;
    the widening is the least 1% step at which the other models' bands cover 80% of each model's rows."""
    spread = np.linspace(0.9, 1.1, 20)
    offsets = {"a": 0.7, "b": 1.0, "c": 1.4}
    rows = [residual("calibrated", "unseen", "kv_fits", float(o * x), model=m) for m, o in offsets.items() for x in spread]
    values, models = bands.ratios(rows), np.array([r["model"] for r in rows])
    w = bands.unseen_model_widening(values, models)
    assert w > 1.2

    def covered(factor):
        inside = 0
        for m in offsets:
            low, high = np.quantile(values[models != m, 0], bands.QUANTILES)
            inside += np.sum((values[models == m, 0] >= low / factor) & (values[models == m, 0] <= high * factor))
        return inside / len(rows)

    assert covered(w) >= 0.8 > covered(w - 0.01)
    entry = bands.compute_bands(rows)["calibrated/unseen/kv_fits"]
    assert entry["widened"] == w
    assert entry["tpot_ms_mean"] == pytest.approx([np.quantile(values[:, 1], 0.1) / w, np.quantile(values[:, 1], 0.9) * w], rel=1e-5)
    # One or two models cannot say how far a new one lands: no widening.
    assert bands.unseen_model_widening(values[models != "c"], models[models != "c"]) == 1.0
    assert bands.compute_bands(rows)["calibrated/seen/kv_fits"]["widened"] == 1.0


def test_the_bundled_unseen_bands_cover_a_new_model():
    """The bundled unseen-model classes rest on rows of several models (Llama-3.1-8B and the MoE models,
    which no fit sees), and their widening is what their residuals give (`unseen_model_widening`: the
    least at which bands from the other models cover 80% of each model's rows, tested above)."""
    residuals = bundled_residuals()
    loaded = bands.load_bands()["classes"]
    for key in ("calibrated/unseen/kv_fits", "kernel_tables/unseen/kv_fits", "spec_sheet/unseen/kv_fits"):
        mine = [r for r in residuals if bands.class_key(r["evidence"], r["model_class"], r["regime"]) == key]
        assert len({r["model"] for r in mine}) >= bands.UNSEEN_MIN_MODELS
        w = loaded[key]["widened"] / (bands.SPEC_SHEET_WIDENING if key.startswith("spec_sheet/") else 1.0)
        assert w == pytest.approx(bands.unseen_model_widening(bands.ratios(mine), np.array([r["model"] for r in mine])))


def test_classes_name_the_evidence_the_model_and_the_regime():
    classes = bands.classify(
        [H200, H100, MI325X, "my_gpu", H200], [SEEN, SEEN, SEEN, UNSEEN, UNSEEN], [True, True, False, True, False],
        fitted_gpus=[H200, B200], prior_gpus=[H200, B200, H100], fitted_models=[SEEN],
    )  # fmt: skip
    assert classes.tolist() == [
        "calibrated/seen/kv_fits", "kernel_tables/seen/kv_fits", "spec_sheet/seen/kv_starved", "spec_sheet/unseen/kv_fits", "calibrated/unseen/kv_starved",
    ]  # fmt: skip


def test_kv_regime_compares_the_clients_contexts_with_the_kv_cache():
    """10,000 KV tokens per replica: 4 clients of 1,000 + 1,000 tokens need 8,000 (fit), 8 need 16,000
    (starved) unless 2 replicas share them or only 4 prompts run; an open loop is never starved here."""
    base = {"kv_cache_tokens": 10_000, "isl": 1000, "osl": 1000, "data_parallel_size": 1}
    rows = [
        {**base, "concurrency": 4}, {**base, "concurrency": 8}, {**base, "concurrency": 8, "data_parallel_size": 2},
        {**base, "concurrency": 8, "num_prompts": 4}, {**base, "request_rate": 5.0}, {**base, "concurrency": 4, "kv_cache_tokens": None},
    ]  # fmt: skip
    assert bands.kv_regime(rows).tolist() == [True, False, True, True, True, False]


def test_bands_path_sits_next_to_the_parameters():
    assert bands.bands_path(None) == bands.BANDS_PATH
    assert bands.bands_path("/x/params.toml").as_posix() == "/x/bands.toml"
    assert bands.bands_path("/x/mine.toml").as_posix() == "/x/mine.bands.toml"
    assert bands.residuals_path("/x/bands.toml").as_posix() == "/x/bands.residuals.csv"


def test_the_bands_file_round_trips(tmp_path):
    rows = [residual("calibrated", "seen", "kv_fits", 0.9 + 0.01 * i) for i in range(15)]
    table = bands.compute_bands(rows)
    path = bands.write_bands(table, tmp_path / "bands.toml", {"fitted_gpus": [H200], "fitted_models": [SEEN]}, rows)
    loaded = bands.load_bands(str(path))
    assert loaded["record"]["fitted_gpus"] == [H200]
    assert loaded["classes"]["calibrated/seen/kv_fits"]["ttft_ms_mean"] == pytest.approx(table["calibrated/seen/kv_fits"]["ttft_ms_mean"], rel=1e-5)
    back = bands.read_residuals(bands.residuals_path(path))
    assert len(back) == 15 and back[3]["measured_tpot_ms_mean"] == pytest.approx(rows[3]["measured_tpot_ms_mean"])


def test_the_bands_follow_the_parameters_jaxplan_params_selects(tmp_path, monkeypatch):
    rows = [residual("calibrated", "seen", "kv_fits", 0.5 + 0.01 * i) for i in range(15)]
    bands.write_bands(bands.compute_bands(rows), tmp_path / "bands.toml", {"fitted_gpus": [H200], "fitted_models": [SEEN]}, rows)
    (tmp_path / "params.toml").write_text("")
    monkeypatch.setenv("JAXPLAN_PARAMS", str(tmp_path / "params.toml"))
    own = bands.bands_for()["classes"]["calibrated/seen/kv_fits"]["ttft_ms_mean"]
    monkeypatch.delenv("JAXPLAN_PARAMS")
    shipped = bands.bands_for()["classes"]["calibrated/seen/kv_fits"]["ttft_ms_mean"]
    assert own[1] < 0.7 < shipped[0]  # the user's band (ratios 0.5-0.64), not the shipped one


def test_a_missing_bands_file_is_one_clear_error(tmp_path):
    from jaxplan.errors import PlanError

    with pytest.raises(PlanError, match="does not exist"):
        bands.load_bands(str(tmp_path / "nope.toml"))


# --- the bundled bands applied to predictions -----------------------------------------------------


def bundled_classes() -> dict:
    with open(bands.BANDS_PATH, "rb") as handle:
        return tomllib.load(handle)["class"]


def test_the_bundled_bands_cover_every_class_with_p10_below_p90():
    classes = bundled_classes()
    assert set(classes) == set(bands.ALL_CLASSES)
    for key, entry in classes.items():
        for m in bands.METRICS:
            assert 0 < entry[m][0] < entry[m][1], (key, m)
        spec = bands.SPEC_SHEET_WIDENING if key.startswith("spec_sheet/") else 1.0
        if "/unseen/" in key and entry["pooled_from"] == key:  # widened for new models too (tested below)
            assert entry["widened"] > spec
        else:
            assert entry["widened"] == spec


def test_the_bands_page_shows_the_bundled_bands():
    """docs/uncertainty.md's table is the bundled file's, to two decimals: regenerate it with the file."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "uncertainty.md").read_text()
    shown = {m[0]: (int(m[1]), *(tuple(map(float, q.split("-"))) for q in m[2:])) for m in re.findall(r"^\| ([a-z_]+/[a-z]+/[a-z_]+) \| (\d+) \| [^|]+ \| ([\d.]+-[\d.]+) \| ([\d.]+-[\d.]+) \| ([\d.]+-[\d.]+) \|$", page, re.M)}
    classes = bundled_classes()
    assert set(shown) == set(classes)
    for key, entry in classes.items():
        assert shown[key][0] == entry["rows"], key
        for got, m in zip(shown[key][1:], bands.METRICS):
            assert got == pytest.approx(entry[m], abs=0.005 + 1e-9), (key, m)


def test_predict_rows_carry_their_band_and_class():
    """H200 and B200 are fitted, H100 has kernel tables, MI325X only its spec sheet; p10 and p90 are the
    prediction times the class's ratio quantiles as the bundled file states them."""
    from jaxplan.prediction import predict_rows

    common = {"tensor_parallel_size": 8, "weight_dtype": "fp8", "kv_cache_dtype": "fp8", "isl": 1000, "osl": 500, "concurrency": 16}
    rows = [{**common, "model": SEEN, "gpu": H200}, {**common, "model": SEEN, "gpu": H100}, {**common, "model": SEEN, "gpu": MI325X, "weight_dtype": "bf16", "kv_cache_dtype": "auto"},
            {**common, "model": UNSEEN, "gpu": B200}]  # fmt: skip
    out = bands.with_bands(predict_rows(rows))
    assert [r["prediction_class"] for r in out] == ["calibrated/seen/kv_fits", "kernel_tables/seen/kv_fits", "spec_sheet/seen/kv_fits", "calibrated/unseen/kv_fits"]
    classes = bundled_classes()
    for r in out:
        for m in bands.METRICS:
            low, high = classes[r["prediction_class"]][m]
            assert r[f"{m}_p10"] == pytest.approx(r[m] * low, rel=1e-9)
            assert r[f"{m}_p90"] == pytest.approx(r[m] * high, rel=1e-9)
            assert r[f"{m}_p10"] < r[f"{m}_p90"]


def test_the_a100_40gb_is_in_the_class_of_the_runs_fitted_on_it():
    """The A100 fit is of A100-SXM4-40GB runs given as `a100_sxm` rows (bands.ROWS_FITTED_AS): its own
    name is calibrated, not priced from its spec sheet."""
    from jaxplan.prediction import predict_rows

    row = {"model": SEEN, "gpu": "a100_sxm_40gb", "tensor_parallel_size": 8, "weight_dtype": "bf16", "kv_cache_dtype": "auto", "isl": 1000, "osl": 500, "concurrency": 16}
    assert [r["prediction_class"] for r in bands.with_bands(predict_rows([row]))] == ["calibrated/seen/kv_fits"]


def test_a_row_without_a_prediction_has_no_band_but_a_class():
    out = bands.with_bands([{"model": SEEN, "gpu": H200, "isl": 10, "osl": 10, "concurrency": 1, "ttft_ms_mean": None, "tpot_ms_mean": 20.0, "output_tok_s": None, "kv_cache_tokens": 0}])
    assert out[0]["ttft_ms_mean_p10"] is None and out[0]["output_tok_s_p90"] is None
    assert out[0]["tpot_ms_mean_p10"] is not None and out[0]["prediction_class"] == "calibrated/seen/kv_starved"


def test_predict_cli_writes_the_band_columns_and_the_file_reads_back(tmp_path):
    from typer.testing import CliRunner

    from jaxplan.calibrate.rows import read_predict_csv
    from jaxplan.cli import app

    source = tmp_path / "in.csv"
    source.write_text("model,gpu,tensor_parallel_size,weight_dtype,kv_cache_dtype,isl,osl,concurrency\nllama-3.1-70b,h200_sxm,8,fp8,fp8,1000,500,16\nllama-3.1-70b,mi325x,8,bf16,auto,1000,500,16\n")
    target = tmp_path / "out.csv"
    result = CliRunner().invoke(app, ["predict", str(source), "-o", str(target), "--method", "analytical"])
    assert result.exit_code == 0, result.output
    with open(target) as handle:
        written = list(csv.DictReader(handle))
    for column in bands.COLUMNS:
        assert column in written[0], column
    assert [r["prediction_class"] for r in written] == ["calibrated/seen/kv_fits", "spec_sheet/seen/kv_fits"]
    assert float(written[0]["ttft_ms_mean_p10"]) < float(written[0]["ttft_ms_mean_p90"])
    again = read_predict_csv(target)  # the written prediction columns are recognised and dropped
    assert len(again) == 2 and "prediction_class" not in again[0]


# --- coverage on held-out rows --------------------------------------------------------------------


def bundled_residuals() -> list[dict]:
    return bands.read_residuals(bands.residuals_path(bands.BANDS_PATH))


def leave_one_out_coverage(values: np.ndarray) -> float:
    """Fraction of the ratios [N] inside the p10-p90 band of the other N - 1: not circular, since no
    row's band is made from the row itself."""
    inside = [bool(low <= v <= high) for i, v in enumerate(values) for low, high in [np.quantile(np.delete(values, i), bands.QUANTILES)]]
    return float(np.mean(inside))


def test_each_class_band_covers_80_percent_of_held_out_rows_it_did_not_come_from():
    """Every class with >= 20 held-out rows (bands.MIN_ROWS), each metric: the p10-p90 band of the other
    rows of the class covers 80% +- 10% of its rows (leave-one-out, so no row scores its own band).
    The spec-sheet classes are scored before SPEC_SHEET_WIDENING, which is deliberate slack for GPUs
    unlike the held-out ones."""
    residuals = bundled_residuals()
    keys = np.array([bands.class_key(r["evidence"], r["model_class"], r["regime"]) for r in residuals])
    values = bands.ratios(residuals)
    scored = 0
    for key in sorted(set(keys.tolist())):
        for j, m in enumerate(bands.METRICS):
            column = values[keys == key, j]
            column = column[np.isfinite(column)]
            if column.size < bands.MIN_ROWS:
                continue
            # 80% +- 10%, or +- two binomial standard deviations where a class is too small for 10%.
            slack = max(0.1, 2.0 * np.sqrt(0.8 * 0.2 / column.size))
            assert 0.8 - slack <= leave_one_out_coverage(column) <= 0.8 + slack, (key, m, column.size)
            scored += 1
    assert scored >= 12  # at least calibrated, kernel_tables and spec_sheet, seen and unseen, kv_fits, over 2+ metrics


def test_random_halves_give_the_same_coverage():
    """Quantiles from a seeded random half of each large class cover 80% +- 10% of the other half, on
    average over 20 splits (one split of ~90 rows moves by +-0.1 on its own). A split by row order
    would not do: the rows come in campaign order, alternating lengths and loads."""
    residuals = bundled_residuals()
    keys = np.array([bands.class_key(r["evidence"], r["model_class"], r["regime"]) for r in residuals])
    values = bands.ratios(residuals)
    for key in ("calibrated/seen/kv_fits", "kernel_tables/seen/kv_fits", "spec_sheet/seen/kv_fits"):
        for j, m in enumerate(bands.METRICS):
            column = values[keys == key, j]
            covered = []
            for seed in range(20):
                order = np.random.default_rng(seed).permutation(column.size)
                low, high = np.quantile(column[order[0::2]], bands.QUANTILES)
                other = column[order[1::2]]
                covered.append(np.mean((other >= low) & (other <= high)))
            assert 0.7 <= np.mean(covered) <= 0.9, (key, m)


def test_the_bundled_bands_hold_their_own_rows_where_stretched():
    """A class pooled and stretched to its own rows holds every one of them in the written file (the
    6-digit numbers are rounded outward), and the bundled file is what its residuals give."""
    residuals = bundled_residuals()
    recomputed = bands.compute_bands(residuals)
    loaded = bands.load_bands()["classes"]
    for key in bands.ALL_CLASSES:
        for m in bands.METRICS:
            assert loaded[key][m] == pytest.approx(recomputed[key][m], rel=1e-9), (key, m)
    for key, scores in bands.coverage(residuals, loaded).items():
        if recomputed[key]["stretched"]:
            assert all(value == 1.0 for value in scores.values()), (key, scores)


def test_the_bundled_residuals_are_what_the_shared_data_and_the_shipped_fit_give():
    """The final-fit residuals in the bundled CSV (H200 Llama-3.1-8B rows and a tenth of H200's MoE rows,
    calibrated, unseen model: no fit sees them, so the final fit predicts them; the A100 rows are fitted and held out) match the shared data's measurements and a fresh stage-4 prediction
    with the bundled parameters: the bands describe this data and these parameters."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate.run import FIT_BACKEND, measured_rows
    from jaxplan.calibrate.serving import load_serving_rows
    from jaxplan.prediction import predict_rows

    from jaxplan.calibrate.moe_rows import load_moe_rows

    unseen = [r for r in bundled_residuals() if (r["gpu"], r["model_class"], r["evidence"]) == (H200, "unseen", "calibrated")]
    residuals = [r for r in unseen if r["model"] == "llama-3.1-8b"]
    assert len(residuals) == 21
    # The MoE rows no fit sees are unseen-model rows too, H200's by the final fit: every one of them.
    moe = [r for r in load_moe_rows() if r["gpu"] == H200]
    assert sorted(r["source_id"] for r in unseen if r["model"] != "llama-3.1-8b") == sorted(r["source_id"] for r in moe)
    residuals += [r for r in unseen if r["model"] != "llama-3.1-8b"][::10]
    rows = measured_rows([r for r in load_serving_rows() if r.get("backend") == FIT_BACKEND]) + moe
    by_source = {(r["gpu"], r["model"], r.get("dataset"), r.get("source_id") or ""): r for r in rows}
    chosen = [by_source[(r["gpu"], r["model"], r["dataset"], r["source_id"] or "")] for r in residuals]
    fresh = predict_rows(chosen, source="measurements")
    for stored, row, prediction in zip(residuals, chosen, fresh):
        for m in bands.METRICS:
            if stored[f"measured_{m}"] is not None:
                assert stored[f"measured_{m}"] == pytest.approx(row[f"measured_{m}"], rel=1e-5)
            assert stored[m] == pytest.approx(prediction[m], rel=1e-4), (row["source_id"], m)


def test_simulate_writes_the_band_columns_and_the_file_reads_back(tmp_path):
    """A spec-sheet GPU's replayed row says so in its class; the table shows it too."""
    from typer.testing import CliRunner

    from jaxplan.calibrate.rows import read_predict_csv
    from jaxplan.cli import app

    source = tmp_path / "in.csv"
    source.write_text("model,gpu,tensor_parallel_size,isl,osl,concurrency,num_prompts\nllama-3.1-8b,mi325x,1,500,50,4,12\n")
    target = tmp_path / "out.csv"
    result = CliRunner().invoke(app, ["simulate", str(source), "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert "spec_sheet/" in result.output
    with open(target) as handle:
        written = list(csv.DictReader(handle))
    assert written[0]["prediction_class"] == "spec_sheet/unseen/kv_fits"
    low, high = bundled_classes()["spec_sheet/unseen/kv_fits"]["tpot_ms_mean"]
    tpot = float(written[0]["tpot_ms_mean"])
    assert (float(written[0]["tpot_ms_mean_p10"]), float(written[0]["tpot_ms_mean_p90"])) == pytest.approx((tpot * low, tpot * high), rel=1e-5)
    assert len(read_predict_csv(target)) == 1


def test_calibrate_writes_no_bands_from_a_handful_of_rows(tmp_path, monkeypatch):
    """Fewer held-out rows than bands.MIN_ROWS (e.g. a user's two measurements of one GPU): no bands
    file (a band from two rows would claim a precision they do not have); with ten, one is written."""
    from jaxplan.calibrate import band_residuals

    rows = [residual("calibrated", "seen", "kv_fits", 1.0 + 0.01 * i) for i in range(bands.MIN_ROWS)]
    for count, written in ((2, False), (bands.MIN_ROWS, True)):
        monkeypatch.setattr(band_residuals, "held_out_residuals", lambda *a, n=count: rows[:n])
        target = tmp_path / f"p{count}.toml"
        path = band_residuals.write_calibration_bands([], {}, {}, {}, target, ["test"], 1)
        assert (path is not None) == written and bands.bands_path(target).exists() == written


def test_the_regime_of_a_prediction_is_the_one_calibrate_gives_its_measured_row():
    """`bands.kv_regime` (from predict's kv_cache_tokens) agrees with `run.kv_holds_concurrency` (from the
    KV budget of the physics) on every measured vLLM row of the shared data, the 6 KV-starved ones among them
    (4 NVIDIA, 2 MI300X TP1 at 64 clients)."""
    if not _data.data_root_exists():
        pytest.skip("measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
    from jaxplan.calibrate.run import FIT_BACKEND, kv_holds_concurrency, measured_rows
    from jaxplan.calibrate.serving import load_serving_rows
    from jaxplan.physics.params import efficiency_for
    from jaxplan.prediction import predict_rows

    rows = measured_rows([r for r in load_serving_rows() if r.get("backend") == FIT_BACKEND])
    expected = kv_holds_concurrency(rows, efficiency_for({r["gpu"] for r in rows}))
    assert bands.kv_regime(predict_rows(rows, source="measurements")).tolist() == expected
    assert expected.count(False) == 6
