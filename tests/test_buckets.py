"""Row buckets (jaxplan.buckets): sizes, padding, and that padded rows never reach a caller's answer."""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.buckets import bucket_size, pad_rows, unpad_rows


@pytest.mark.parametrize(("num", "size"), [(0, 8), (1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (1000, 1024)])
def test_bucket_size_is_the_next_power_of_two_from_eight(num, size):
    assert bucket_size(num) == size


def test_pad_repeats_the_last_row_and_unpad_cuts_it_off():
    rows = {"a": np.arange(3.0), "b": np.arange(6).reshape(3, 2), "scalar": np.float32(0.9), "table": np.ones(4)}
    padded = pad_rows(rows, 3, 8)
    np.testing.assert_array_equal(padded["a"], [0, 1, 2, 2, 2, 2, 2, 2])
    assert padded["b"].shape == (8, 2) and (padded["b"][3:] == [4, 5]).all()
    assert padded["scalar"] == np.float32(0.9) and padded["table"].shape == (4,)  # not per row: kept
    back = unpad_rows(padded, 3, 8)
    np.testing.assert_array_equal(back["a"], rows["a"])
    np.testing.assert_array_equal(back["b"], rows["b"])


def test_predict_rows_do_not_depend_on_their_neighbours(monkeypatch):
    """Three rows alone (bucket 256) and among 297 others (bucket 512): the same answers, so no
    padding row and no other row leaks into a row's prediction. Bit for bit with the emitters the
    command line compiles stage 4's rows with (the suite's older ones round a row's float32 result
    differently from one bucket size to the next)."""
    import jax

    from conftest import SHIPPED_EMITTERS
    from jaxplan import prediction
    from jaxplan.xla_options import accepted
    from jaxplan.prediction import OUTPUT_COLUMNS, PREDICT_MIN_ROWS, predict_rows

    monkeypatch.setattr(prediction, "_estimate_rows", jax.jit(prediction._estimate_rows.__wrapped__, compiler_options=accepted(SHIPPED_EMITTERS) or None))

    assert bucket_size(3, PREDICT_MIN_ROWS) < bucket_size(300, PREDICT_MIN_ROWS)
    base = dict(model="llama-3.1-8b", gpu="h100_sxm", weight_dtype="bf16", kv_cache_dtype="auto", osl=200.0)
    mine = [dict(base, isl=1000.0, request_rate=2.0), dict(base, isl=3000.0, concurrency=16, tensor_parallel_size=2), dict(base, isl=500.0, concurrency=64)]
    others = [dict(base, isl=100.0 * (k % 40 + 1), concurrency=k % 13 + 1, gpu="a100_sxm") for k in range(297)]
    alone = predict_rows(mine)
    among = predict_rows(others[:7] + mine + others[7:])[7:10]
    for a, b in zip(alone, among):
        for column in OUTPUT_COLUMNS:
            assert a[column] == b[column], column
    assert len({r["ttft_ms_mean"] for r in alone}) == 3
