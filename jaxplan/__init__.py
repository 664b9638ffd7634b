"""jaxplan: plan LLM serving deployments on a CPU with JAX.

A cost-inverted funnel: millions of (GPU type, TP, PP, DP, max_num_seqs,
max_num_batched_tokens, weight dtype, KV dtype) candidates pass cheap batched
sieves and a roofline cost model; a few finalists reach a step-by-step replay.

The Python API (docs/api.md): `jaxplan.sweep(model=..., gpus=..., workload=...)` -> `Plan`,
`jaxplan.predict(rows)`, `jaxplan.sensitivity(plan)`, and the spec loaders. Names are imported on
first use, so `import jaxplan` does not load JAX.
"""

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "sweep": "jaxplan.api",
    "predict": "jaxplan.api",
    "sensitivity": "jaxplan.api",
    "Plan": "jaxplan.plan",
    "Finalist": "jaxplan.finalist",
    "ReplayMetrics": "jaxplan.finalist",
    "Winner": "jaxplan.finalist",
    "PlanError": "jaxplan.errors",
    "load_model": "jaxplan.specs",
    "load_gpu": "jaxplan.specs",
    "load_workload": "jaxplan.specs",
    "load_space": "jaxplan.specs",
    "ModelSpec": "jaxplan.specs",
    "GpuSpec": "jaxplan.specs",
    "Workload": "jaxplan.specs",
    "Arrival": "jaxplan.specs",
    "SearchSpace": "jaxplan.specs",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'jaxplan' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
