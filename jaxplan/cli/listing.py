"""`jaxplan list`: what ships inside the project."""

from __future__ import annotations

from jaxplan.cli.common import app, clean_errors, out


@app.command(name="list")
@clean_errors
def list_specs() -> None:
    """List the bundled models, GPUs, workloads and search spaces."""
    from jaxplan.specs import known, load_gpu, load_model, load_space, load_workload

    for name in known("models"):
        out.print(f"model     {load_model(name).describe()}  [dim]({load_model(name).hf_id})[/]", highlight=False)
    for name in known("gpus"):
        g = load_gpu(name)
        out.print(f"gpu       {name}: {g.display_name}, {g.hbm_bytes / 2**30:.0f} GiB, {g.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s, ${g.price_usd_per_hour:.2f}/h", highlight=False)
    for name in known("workloads"):
        out.print(f"workload  {load_workload(name).describe()}", highlight=False)
    for name in known("spaces"):
        out.print(f"space     {name}: {load_space(name).size(1):,} candidates per GPU type", highlight=False)
