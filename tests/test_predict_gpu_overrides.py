"""A row measured on a variant of a bundled GPU (`gpu_hbm_bytes_override`,
`gpu_hbm_bandwidth_bytes_per_s_override`, e.g. A100-SXM4-40GB against jaxplan's 80 GB a100_sxm) is
priced on that variant by `predict` (both methods) and by the calibration fit; before 2026-12-01 the
columns were accepted and silently ignored."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.calibrate import fit
from jaxplan.errors import PlanError
from jaxplan.physics.memory import kv_blocks_per_replica
from jaxplan.physics.params import efficiency_for
from jaxplan.physics.shapes import hardware_table, take
from jaxplan.prediction import DEFAULT_GPU_MEMORY_UTILIZATION, predict_rows, replay_predict_rows, row_batches
from jaxplan.specs import load_gpu

GIB = 1024**3
A100 = load_gpu("a100_sxm")
ROW = dict(model="llama-3.1-70b", gpu="a100_sxm", tensor_parallel_size=8, pipeline_parallel_size=1, data_parallel_size=1,
           weight_dtype="bf16", kv_cache_dtype="auto", isl=256, osl=128, concurrency=1, num_prompts=8)
SLOW = dict(ROW, gpu_hbm_bandwidth_bytes_per_s_override=A100.hbm_bandwidth_bytes_per_s / 2)


def _kv_blocks(rows):
    (batch,) = row_batches(rows)
    names = [g.name for g in batch.gpus]
    hw = take(hardware_table(batch.gpus, efficiency_for(names)), jnp.asarray(batch.gpu_index))
    blocks = np.asarray(kv_blocks_per_replica(batch.model, hw, batch.layout, DEFAULT_GPU_MEMORY_UTILIZATION))
    return blocks[np.argsort(batch.row_ids)]


def test_hbm_override_shrinks_the_kv_cache_by_the_freed_bytes():
    # Hand: 40 GiB less per GPU, of which CUDA reports 0.99 and vLLM uses 90%, over 8 GPUs, at 327,680
    # bytes per token (Llama-3.1-70B BF16 KV) and 16 tokens per block:
    # 8 x 0.9 x 0.99 x 40 GiB / 327,680 / 16 = 58,393 blocks.
    full, small = _kv_blocks([ROW, dict(ROW, gpu_hbm_bytes_override=40 * GIB)])
    assert full - small == pytest.approx(8 * 0.9 * 0.99 * 40 * GIB / 327_680 / 16, abs=2)
    same = _kv_blocks([dict(ROW, gpu_hbm_bytes_override=A100.hbm_bytes)])
    assert same[0] == full


def test_rows_without_room_for_the_weights_do_not_fit():
    # 70B BF16 weights over 8 GPUs are ~17.6 GB each: 16 GiB per GPU cannot hold them.
    (row,) = predict_rows([dict(ROW, gpu_hbm_bytes_override=16 * GIB)])
    assert row["status"].startswith("does not fit") and row["tpot_ms_mean"] is None


@pytest.mark.parametrize("method", ["analytical", "replay"])
def test_half_the_bandwidth_slows_a_decode_bound_row(method):
    run = predict_rows if method == "analytical" else replay_predict_rows
    spec, slow, same = run([ROW, SLOW, dict(ROW, gpu_hbm_bandwidth_bytes_per_s_override=A100.hbm_bandwidth_bytes_per_s)])
    assert same["tpot_ms_mean"] == pytest.approx(spec["tpot_ms_mean"], rel=1e-6)
    # One request at a time: the weight read is most of a step, the per-layer and per-step
    # overheads and the all-reduces are not, so TPOT grows by less than 2x but clearly.
    assert 1.3 < slow["tpot_ms_mean"] / spec["tpot_ms_mean"] < 2.0


def test_override_values_are_checked():
    with pytest.raises(PlanError) as excinfo:
        predict_rows([dict(ROW, gpu_hbm_bandwidth_bytes_per_s_override="fast")])
    message = str(excinfo.value)
    assert "\n" not in message and "gpu_hbm_bandwidth_bytes_per_s_override" in message and "'fast'" in message
    with pytest.raises(PlanError) as excinfo:
        predict_rows([ROW, dict(ROW, gpu_hbm_bytes_override=1.0)])
    message = str(excinfo.value)
    assert "\n" not in message and "row 2: gpu_hbm_bytes_override = 1.0: must lie in [1e+09, 1e+13] (bytes)" in message


def test_the_fit_prices_rows_on_their_own_variant():
    rows = [dict(r, measured_ttft_ms_mean=100.0, measured_tpot_ms_mean=30.0) for r in (ROW, SLOW)]
    params = efficiency_for(["a100_sxm"])
    data = fit.fit_data(rows, ["a100_sxm"])
    table = hardware_table((A100,), params)
    _, tpot_err = fit.log_errors(data, table)
    order = np.argsort(data.batches[0].row_ids)
    predicted = predict_rows(rows)
    expected = [np.log(p["tpot_ms_mean"] / 30.0) for p in predicted]
    assert np.asarray(tpot_err)[order] == pytest.approx(expected, abs=1e-4)
    assert expected[1] > expected[0] + 0.25


def test_predict_cli_reads_the_override_columns(tmp_path):
    from typer.testing import CliRunner

    from jaxplan.cli import app

    columns = ["model", "gpu", "tensor_parallel_size", "isl", "osl", "concurrency", "gpu_hbm_bandwidth_bytes_per_s_override"]
    lines = [",".join(columns), "llama-3.1-70b,a100_sxm,8,256,128,1,", f"llama-3.1-70b,a100_sxm,8,256,128,1,{A100.hbm_bandwidth_bytes_per_s / 2:.6g}"]
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["predict", str(tmp_path / "in.csv"), "-o", str(tmp_path / "out.csv"), "--method", "analytical"])
    assert result.exit_code == 0, result.output
    import csv

    spec, slow = list(csv.DictReader(open(tmp_path / "out.csv")))
    assert slow["gpu_hbm_bandwidth_bytes_per_s_override"] and not spec["gpu_hbm_bandwidth_bytes_per_s_override"]
    assert 1.3 < float(slow["tpot_ms_mean"]) / float(spec["tpot_ms_mean"]) < 2.0
