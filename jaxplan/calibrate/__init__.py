"""Measured data for calibrating jaxplan's cost model, and accuracy metrics.

Modules:
  kernels   per-kernel timing tables (GEMM, attention, NCCL / vLLM all-reduce) as numpy NamedTuples, SI units
  serving   end-to-end serving measurements normalized to predict-CSV rows; vllm bench serve JSON reader
  rows      the row format: columns, validation, write_predict_csv / read_predict_csv, serving_arrays
  metrics   MAPE, median APE, Spearman, log-RMSE; split_by / random_split
  fixtures  regenerate the small test fixtures under tests/fixtures/ (python -m jaxplan.calibrate.fixtures)

The data itself is not shipped: loaders read `$JAXPLAN_SHARED_DATA` or
`<repo>/../shared/data` (`default_data_root()`); see docs/data.md.
Parquet tables need pyarrow (`pip install pyarrow`), imported only when a table is read.
"""

from jaxplan.calibrate._data import data_root_exists as data_root_exists, default_data_root as default_data_root
from jaxplan.calibrate.kernels import (
    CommTable as CommTable,
    ContextAttentionTable as ContextAttentionTable,
    GemmTable as GemmTable,
    GenerationAttentionTable as GenerationAttentionTable,
    load_allreduce as load_allreduce,
    load_context_attention as load_context_attention,
    load_custom_allreduce as load_custom_allreduce,
    load_gemm as load_gemm,
    load_generation_attention as load_generation_attention,
    load_nccl as load_nccl,
    read_kernel_csv as read_kernel_csv,
    write_kernel_csv as write_kernel_csv,
)
from jaxplan.calibrate.metrics import (
    log_rmse as log_rmse,
    mape as mape,
    median_ape as median_ape,
    random_split as random_split,
    spearman as spearman,
    split_by as split_by,
)
from jaxplan.calibrate.rows import (
    COLUMNS as COLUMNS,
    ServingArrays as ServingArrays,
    read_predict_csv as read_predict_csv,
    serving_arrays as serving_arrays,
    write_predict_csv as write_predict_csv,
)
from jaxplan.calibrate.serving import (
    load_serving_rows as load_serving_rows,
    read_vllm_bench_json as read_vllm_bench_json,
    serving_drop_counts as serving_drop_counts,
)
