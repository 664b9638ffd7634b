"""The physics: memory per GPU and step time, one source of truth for stage 4 and the replay."""

from jaxplan.physics.batch import StepBatch as StepBatch
from jaxplan.physics.memory import (
    kv_blocks_per_replica as kv_blocks_per_replica,
    kv_budget_bytes_per_gpu as kv_budget_bytes_per_gpu,
    kv_bytes_per_token_per_gpu as kv_bytes_per_token_per_gpu,
    request_kv_bytes_per_gpu as request_kv_bytes_per_gpu,
    weight_bytes_per_gpu as weight_bytes_per_gpu,
)
from jaxplan.physics.params import efficiency_for as efficiency_for
from jaxplan.physics.shapes import (
    Hardware as Hardware,
    Layout as Layout,
    ModelShape as ModelShape,
    hardware_table as hardware_table,
    make_layout as make_layout,
    model_shape as model_shape,
    take as take,
    traced as traced,
)
from jaxplan.physics.steady_state import Estimate as Estimate, estimate as estimate
from jaxplan.physics.step_time import step_cost as step_cost, step_time_s as step_time_s
from jaxplan.physics.traffic import WorkloadParams as WorkloadParams, workload_params as workload_params
