"""Checkpoints named by their Hugging Face ids (quantised and chat releases of a bundled model): the
model they are, the format their weights are stored in, and what a row, a sweep and a serve line make
of them."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from jaxplan.calibrate import serving
from jaxplan.calibrate.rows import make_row
from jaxplan.errors import PlanError
from jaxplan.report.vllm_command import vllm_serve_command
from jaxplan.specs import checkpoints, load_model, load_space
from jaxplan.specs.space import DEFAULT_WEIGHT_DTYPES


@pytest.mark.parametrize(("hf_id", "model", "fmt"), [
    ("Qwen/Qwen3-32B-FP8", "qwen3-32b", "fp8"),
    ("qwen/qwen3-32b-fp8", "qwen3-32b", "fp8"),  # ids are case-insensitive on the Hub
    ("nvidia/Qwen3-32B-NVFP4", "qwen3-32b", "nvfp4"),
    ("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b", "fp8"),
    ("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", "llama-3.1-70b", "fp8"),  # Meta-Llama-3.1-70B without -Instruct is an alias
    ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8-dynamic", "llama-3.1-8b", "fp8"),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b", "fp8"),
    ("nvidia/Llama-3.3-70B-Instruct-FP4", "llama-3.1-70b", "nvfp4"),  # ModelOpt's -FP4 is NVFP4
    ("amd/Llama-3.3-70B-Instruct-FP8-KV", "llama-3.1-70b", "fp8"),
    ("amd/Llama-3.3-70B-Instruct-MXFP4-Preview", "llama-3.1-70b", "mxfp4"),
    ("nvidia/DeepSeek-R1-NVFP4", "deepseek-r1", "nvfp4"),
    ("nvidia/Kimi-K2.5-NVFP4", "kimi-k2.5", "nvfp4"),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", "qwen3-30b-a3b", "fp8"),
    ("someone/Qwen3-32B-AWQ", "qwen3-32b", "int4"),
    ("RedHatAI/Qwen3-32B-W8A8-FP8", "qwen3-32b", "fp8"),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b", "bf16"),  # a chat release: the model's own format
    ("Qwen/Qwen3-30B-A3B-Thinking-2507", "qwen3-30b-a3b", "bf16"),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "qwen3-235b-a22b", "fp8"),
])
def test_a_checkpoint_resolves_to_the_model_it_is(hf_id, model, fmt):
    spec = load_model(hf_id)
    assert (spec.name, spec.checkpoint_weight_format, spec.hf_id, spec.named_checkpoint) == (model, fmt, hf_id, True)
    base = load_model(model)
    shape = {f.name for f in dataclasses.fields(base)} - {"hf_id", "aliases", "checkpoint_weight_format", "named_checkpoint", "source"}
    assert {f: getattr(spec, f) for f in shape} == {f: getattr(base, f) for f in shape}
    assert hf_id in spec.source and base.source in spec.source
    assert not base.named_checkpoint


@pytest.mark.parametrize("hf_id", [
    "Qwen/Qwen3-14B-FP8",  # not a bundled model
    "Qwen/Qwen3-32B-INT8",  # a format jaxplan does not price
    "someone/Qwen3-32B-FP8-AWQ",  # two formats: which one is stored is not clear
    "someone/Qwen3-32B-Distill",  # another model made from it: not its shape
    "someone/FP8",  # nothing left to match
])
def test_other_ids_are_not_guessed(hf_id):
    assert checkpoints.resolve(hf_id, {"Qwen/Qwen3-32B": "qwen3-32b"}) is None
    with pytest.raises(PlanError, match="config.json"):
        load_model(hf_id)


def test_a_name_two_models_share_matches_neither():
    known = {"a/Shared-7B": "one", "b/Shared-7B-Instruct": "two", "c/Own-7B": "three"}
    table = checkpoints.base_names(known)
    assert "shared-7b" not in table and table["shared-7b-instruct"] == "two" and table["own-7b"] == "three"
    assert checkpoints.resolve("q/Shared-7B-FP8", known) is None
    assert checkpoints.resolve("q/Own-7B-Instruct-FP8", known) == ("three", "fp8")


@pytest.mark.parametrize(("model", "given", "priced"), [
    ("Qwen/Qwen3-32B-FP8", None, "fp8"),
    ("Qwen/Qwen3-32B-FP8", "fp8", "fp8"),
    ("qwen3-32b", None, "bf16"),
    ("Qwen/Qwen3-32B", "fp8", "fp8"),  # online quantisation of the BF16 checkpoint: as stated
    ("gpt-oss-120b", None, "mxfp4"),  # vLLM serves gpt-oss's MXFP4 experts as stored
    ("kimi-k2.5", None, "int4"),
    ("nvidia/Kimi-K2.5-NVFP4", None, "nvfp4"),
])
def test_a_row_without_weight_dtype_is_priced_in_its_checkpoints_format(model, given, priced):
    row = make_row(model=model, gpu="h100_sxm", tensor_parallel_size=8, isl=1000, osl=100, concurrency=8, weight_dtype=given)
    assert row["weight_dtype"] == priced
    assert row["model"] == load_model(model).name  # the bundled name, as for any other id


@pytest.mark.parametrize(("model_id", "model", "weight_dtype"), [
    ("Qwen/Qwen3-32B-FP8", "qwen3-32b", "fp8"),
    ("openai/gpt-oss-120b", "gpt-oss-120b", "mxfp4"),  # a bundled model the calibration does not fit: predicted all the same
])
def test_a_bench_file_reads_any_bundled_model_in_its_checkpoints_format(tmp_path, model_id, model, weight_dtype):
    record = {
        "model_id": model_id, "num_prompts": 240, "request_rate": "inf", "max_concurrency": 24, "completed": 240,
        "failed": 0, "total_input_tokens": 240 * 4000, "total_output_tokens": 240 * 1000, "mean_ttft_ms": 900.0, "mean_tpot_ms": 17.0,
        "output_throughput": 1300.0, "gpu": "h100_sxm", "tensor_parallel_size": "1", "kv_cache_dtype": "fp8",
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    (row,) = serving.read_vllm_bench_json(path)
    assert (row["model"], row["weight_dtype"], row["kv_cache_dtype"]) == (model, weight_dtype, "fp8")
    path.write_text(json.dumps(dict(record, model_id="someone/Unknown-7B-FP8")))
    with pytest.raises(PlanError, match=r"run.json: model 'someone/Unknown-7B-FP8' is not a bundled model, a known HF id or a config path: name it with --model"):
        serving.read_vllm_bench_json(path)


def test_the_sweep_plans_a_named_checkpoint_in_its_stored_format():
    space = load_space("small")
    assert space.weight_dtype == DEFAULT_WEIGHT_DTYPES
    assert space.for_model(load_model("Qwen/Qwen3-32B-FP8")).weight_dtype == ("fp8",)
    assert space.for_model(load_model("nvidia/Qwen3-32B-NVFP4")).weight_dtype == ("nvfp4",)
    assert space.for_model(load_model("qwen3-32b")).weight_dtype == DEFAULT_WEIGHT_DTYPES  # BF16: FP8 is quantised on load
    assert space.for_model(load_model("deepseek-v3")).weight_dtype == DEFAULT_WEIGHT_DTYPES  # not named as a checkpoint
    # a format a dense model cannot be priced in leaves the defaults (their lines name the checkpoint needed)
    assert space.for_model(load_model("amd/Llama-3.3-70B-Instruct-MXFP4-Preview")).weight_dtype == DEFAULT_WEIGHT_DTYPES
    named = space.replace(weight_dtype=("bf16",))
    assert named.for_model(load_model("Qwen/Qwen3-32B-FP8")).weight_dtype == ("bf16",)  # the space's own choice wins


def test_a_quantised_checkpoint_is_served_as_stored():
    row = dict(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, max_num_seqs=64, max_num_batched_tokens=8192,
               weight_dtype="fp8", kv_cache_dtype="fp8")
    argv = shlex.split(vllm_serve_command(load_model("Qwen/Qwen3-32B-FP8"), row))
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-32B-FP8"] and "--quantization" not in argv
    argv = shlex.split(vllm_serve_command(load_model("qwen3-32b"), row))
    assert argv[2] == "Qwen/Qwen3-32B" and argv[argv.index("--quantization") + 1] == "fp8"
    bf16 = shlex.split(vllm_serve_command(load_model("Qwen/Qwen3-32B-FP8"), dict(row, weight_dtype="bf16")))
    assert bf16[2] == "<bf16 checkpoint of Qwen/Qwen3-32B-FP8>"  # vLLM cannot dequantise it


def test_the_python_api_prices_a_row_without_weight_dtype_as_the_cli_does():
    from jaxplan import api

    row = dict(model="Qwen/Qwen3-32B-FP8", gpu="h100_sxm", tensor_parallel_size=2, isl=2000, osl=200, concurrency=8, num_prompts=80)
    blank, fp8, bf16 = api.predict([row, dict(row, weight_dtype="fp8"), dict(row, weight_dtype="bf16")], method="analytical")
    assert blank["tpot_ms_mean"] == fp8["tpot_ms_mean"] and blank["ttft_ms_mean"] == fp8["ttft_ms_mean"]
    assert bf16["tpot_ms_mean"] > 1.2 * fp8["tpot_ms_mean"]  # twice the weight bytes a decode step streams
