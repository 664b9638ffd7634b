"""Engine settings of `vllm bench serve` JSON runs, named on the command line.

A `--save-result` file records the served model id and the traffic, but the engine's layout only if
the benchmark was run with `--metadata gpu=... tensor_parallel_size=...`. `jaxplan calibrate` and
`jaxplan predict` take the missing settings as options, with vLLM's argument names; a file's own
metadata wins, and `--model` stands in for a served model_id that is a local path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jaxplan.errors import bad_value

JSON_SUFFIXES = (".json", ".jsonl")  # vllm bench serve --save-result (--append-result: one object per line)
PANEL = "Engine settings of vllm bench serve JSON files that do not record them (a file's --metadata wins)"

ModelSetting = Annotated[Optional[str], typer.Option("--model", help="The model (bundled name, HF id or config.json), in place of the served model_id (often a local path).", show_default=False, rich_help_panel=PANEL)]
GpuSetting = Annotated[Optional[str], typer.Option("--gpu", help="GPU type, e.g. h100_sxm.", show_default=False, rich_help_panel=PANEL)]
TensorParallelSetting = Annotated[Optional[int], typer.Option("--tensor-parallel-size", min=1, help="vLLM's --tensor-parallel-size.", show_default=False, rich_help_panel=PANEL)]
PipelineParallelSetting = Annotated[Optional[int], typer.Option("--pipeline-parallel-size", min=1, help="vLLM's --pipeline-parallel-size (default 1).", show_default=False, rich_help_panel=PANEL)]
DataParallelSetting = Annotated[Optional[int], typer.Option("--data-parallel-size", min=1, help="vLLM's --data-parallel-size (default 1).", show_default=False, rich_help_panel=PANEL)]
ExpertParallelSetting = Annotated[Optional[bool], typer.Option("--enable-expert-parallel", help="vLLM's --enable-expert-parallel (a MoE model's experts whole on each GPU).", show_default=False, rich_help_panel=PANEL)]
WeightDtypeSetting = Annotated[Optional[str], typer.Option("--weight-dtype", help="Weight precision: bf16, fp8, nvfp4, mxfp4 or int4 (default: the checkpoint's stored format, e.g. fp8 for an -FP8 checkpoint, else bf16).", show_default=False, rich_help_panel=PANEL)]
KvCacheDtypeSetting = Annotated[Optional[str], typer.Option("--kv-cache-dtype", help="vLLM's --kv-cache-dtype: auto or fp8 (default auto).", show_default=False, rich_help_panel=PANEL)]
MaxNumSeqsSetting = Annotated[Optional[int], typer.Option("--max-num-seqs", min=1, help="vLLM's --max-num-seqs.", show_default=False, rich_help_panel=PANEL)]
MaxNumBatchedTokensSetting = Annotated[Optional[int], typer.Option("--max-num-batched-tokens", min=1, help="vLLM's --max-num-batched-tokens.", show_default=False, rich_help_panel=PANEL)]


def given(paths: list[Path], options: dict) -> dict:
    """The settings given among a command's `options` (its parameters by name, e.g. its `locals()`;
    fields as in `serving.JSON_DEFAULT_FIELDS`, each command's parameter of that name): field -> value.
    One given with no JSON file among `paths` to apply to is a one-line error naming the option."""
    from jaxplan.calibrate.serving import JSON_DEFAULT_FIELDS

    chosen = {field: options[field] for field in JSON_DEFAULT_FIELDS if options.get(field) is not None}
    if chosen and not any(p.suffix in JSON_SUFFIXES for p in paths):
        field, value = next(iter(chosen.items()))
        raise bad_value("--" + field.replace("_", "-"), value, "names the engine settings of vllm bench serve JSON files, and none was given; pass the runs' .json files (a CSV states them in its columns)")
    return chosen


def read_rows(path: Path, settings: dict) -> list[dict]:
    """Rows of a measurement or configuration file: `vllm bench serve` JSON (with `settings` for what it
    does not record) or a predict-format CSV."""
    from jaxplan.calibrate.rows import read_predict_csv
    from jaxplan.calibrate.serving import read_vllm_bench_json

    return read_vllm_bench_json(path, defaults=settings) if path.suffix in JSON_SUFFIXES else read_predict_csv(path)
