"""Immutable, validated inputs: models, GPUs, workloads, search spaces."""

from jaxplan.specs.gpu import GpuSpec as GpuSpec
from jaxplan.specs.loader import (
    known as known,
    load_gpu as load_gpu,
    load_model as load_model,
    load_space as load_space,
    load_workload as load_workload,
    parse_gpu_list as parse_gpu_list,
)
from jaxplan.specs.model import ModelSpec as ModelSpec
from jaxplan.specs.space import SearchSpace as SearchSpace
from jaxplan.specs.workload import Arrival as Arrival, Workload as Workload
