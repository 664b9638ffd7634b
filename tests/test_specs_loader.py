"""Loader: bundled names, HF-id aliases, paths, and one-line PlanErrors for every bad input."""

from __future__ import annotations

import math
import shutil

import pytest

from jaxplan.errors import PlanError, bad_value, short_repr, unknown_name
from jaxplan.specs import GpuSpec, ModelSpec, SearchSpace, Workload, known, load_gpu, load_model, load_space, load_workload, parse_gpu_list
from jaxplan.specs.loader import CONFIG_DIR

LOADERS = {"models": load_model, "gpus": load_gpu, "workloads": load_workload, "spaces": load_space}
TYPES = {"models": ModelSpec, "gpus": GpuSpec, "workloads": Workload, "spaces": SearchSpace}
BUNDLED = [(kind, name) for kind in LOADERS for name in known(kind)]


def _one_line_error(call, *args) -> str:
    with pytest.raises(PlanError) as err:
        call(*args)
    message = str(err.value)
    assert message and "\n" not in message and "\r" not in message
    return message


def test_known_lists_every_bundled_file():
    assert known("models") == sorted(p.stem for p in (CONFIG_DIR / "models").glob("*.toml"))
    assert {"llama-3.1-70b", "llama-3.1-8b", "deepseek-v3", "qwen3.5-27b", "gemma-3-27b"} <= set(known("models"))
    assert {"h100_sxm", "a100_sxm"} <= set(known("gpus")) and "default" in known("spaces") and "chat" in known("workloads")


@pytest.mark.parametrize("kind, name", BUNDLED)
def test_every_bundled_spec_loads(kind, name):
    spec = LOADERS[kind](name)
    assert isinstance(spec, TYPES[kind]) and spec.name == name


@pytest.mark.parametrize("kind, name", BUNDLED)
def test_bundled_toml_path_loads_the_same_spec(kind, name, tmp_path):
    copy = tmp_path / f"{name}.toml"
    shutil.copy(CONFIG_DIR / kind / f"{name}.toml", copy)
    assert LOADERS[kind](str(copy)) == LOADERS[kind](name)


def test_unknown_model_lists_known_names_and_the_closest():
    message = _one_line_error(load_model, "llama-3.1-7b")
    assert "Did you mean 'llama-3.1-70b'?" in message or "Did you mean 'llama-3.1-8b'?" in message
    for name in known("models"):
        assert name in message


def test_an_unbundled_hugging_face_id_says_which_config_json_to_save():
    message = _one_line_error(load_model, "mistralai/Mistral-7B-v0.1")
    assert "https://huggingface.co/mistralai/Mistral-7B-v0.1/resolve/main/config.json" in message and "--model path/to/config.json" in message
    assert "resolve/main" not in _one_line_error(load_model, "llama-3.1-7b")  # not an id: no download hint
    assert load_model("meta-llama/Llama-3.1-70B") == load_model("llama-3.1-70b")  # a bundled model's id still loads


@pytest.mark.parametrize("name", ["deepseek-ai/DeepSeek-V3.2", "deepseek-v3.1", "zai-org/GLM-5.1"])
def test_a_later_release_of_a_bundled_model_is_not_suggested_as_that_model(name):
    """DeepSeek-V3.2 adds sparse attention to V3: offering 'deepseek-v3' for it would plan another
    architecture. A different spelling of the same model is still suggested."""
    message = _one_line_error(load_model, name)
    assert "Did you mean" not in message and "unknown model" in message
    assert "Did you mean 'deepseek-v3'?" in _one_line_error(load_model, "deepseek-v3-instruct")
    assert "Did you mean 'glm-5'?" in _one_line_error(load_model, "glm5")
    assert "Did you mean 'qwen3-235b-a22b'?" in _one_line_error(load_model, "Qwen/Qwen3-235B-A22B-2507")


def test_the_later_release_rule_is_for_models_alone():
    """A GPU or workload name followed by a digit is a typo, not a release: the match is offered."""
    assert "Did you mean 'h100_sxm'?" in _one_line_error(load_gpu, "h100_sxm7")
    assert "Did you mean 'chat'?" in _one_line_error(load_workload, "chat2")


@pytest.mark.parametrize(
    "loader, name, suggestion",
    [(load_gpu, "h100", "h100_sxm"), (load_workload, "chats", "chat"), (load_space, "defualt", "default")],
)
def test_unknown_names_suggest(loader, name, suggestion):
    assert f"Did you mean {suggestion!r}?" in _one_line_error(loader, name)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("meta-llama/Llama-3.1-70B", "llama-3.1-70b"),
        ("META-LLAMA/llama-3.1-70b-instruct", "llama-3.1-70b"),  # HF ids are case-insensitive
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b"),
        ("LLAMA-3.1-8B", "llama-3.1-8b"),
        ("qwen/qwen3-30b-a3b", "qwen3-30b-a3b"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
        ("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3"),
        ("Qwen/Qwen3.5-27B", "qwen3.5-27b"),
        ("gemma3-27b", "gemma-3-27b"),
    ],
)
def test_hf_ids_and_aliases_resolve(name, expected):
    assert load_model(name).name == expected


def test_gpu_names_are_normalised():
    assert load_gpu("H100-SXM") == load_gpu("h100_sxm")


def test_model_toml_path_takes_the_file_stem_as_name(tmp_path):
    path = tmp_path / "my-llama.toml"
    shutil.copy(CONFIG_DIR / "models" / "llama-3.1-8b.toml", path)
    m = load_model(str(path))
    assert m.name == "my-llama" and m.total_params == load_model("llama-3.1-8b").total_params


def test_directory_without_config_json(tmp_path):
    assert "config.json" in _one_line_error(load_model, str(tmp_path))


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_missing_files(tmp_path, suffix):
    assert "does not exist" in _one_line_error(load_model, str(tmp_path / f"nope{suffix}"))


def test_missing_toml_for_other_kinds(tmp_path):
    for loader in (load_gpu, load_workload, load_space):
        assert "does not exist" in _one_line_error(loader, str(tmp_path / "nope.toml"))


def test_unexpandable_home_directory_is_a_plan_error():
    # Path('~nosuchuser/x').expanduser() raises RuntimeError; the loader used to let it out
    _one_line_error(load_model, "~no_such_user_jaxplan/m.toml")


# ---- malformed and invalid files ------------------------------------------------------------

LLAMA_8B_TOML = (CONFIG_DIR / "models" / "llama-3.1-8b.toml").read_text()
H100_TOML = (CONFIG_DIR / "gpus" / "h100_sxm.toml").read_text()


def _write(tmp_path, text: str | bytes, name: str = "spec.toml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _replace_line(text: str, key: str, new_line: str | None) -> str:
    lines = [line for line in text.splitlines() if not line.startswith(f"{key} =")]
    return "\n".join(lines + ([new_line] if new_line else [])) + "\n"


@pytest.mark.parametrize(
    "content, match",
    [
        ("num_layers = = 3", "malformed TOML"),
        ("num_layers = 3\nnum_layers = 4", "malformed TOML"),  # duplicate key
        (b"description = '\xff'", "not UTF-8"),
        ("x = " + "[" * 50_000 + "]" * 50_000, "unreadable TOML"),  # RecursionError before
        ("num_layers = " + "9" * 5000, "unreadable TOML"),  # int over 4300 digits: ValueError before
    ],
)
def test_unreadable_toml(tmp_path, content, match):
    assert match in _one_line_error(load_model, _write(tmp_path, content))


def test_unknown_field_suggests_the_right_one(tmp_path):
    message = _one_line_error(load_model, _write(tmp_path, LLAMA_8B_TOML + "num_layer = 3\n"))
    assert "num_layer" in message and "Did you mean 'num_layers'?" in message


def test_missing_required_field(tmp_path):
    message = _one_line_error(load_model, _write(tmp_path, _replace_line(LLAMA_8B_TOML, "hidden_size", None)))
    assert "hidden_size" in message and "missing" in message


@pytest.mark.parametrize(
    "line, field, value",
    [
        ('num_layers = "32"', "num_layers", "'32'"),
        ("num_layers = 32.5", "num_layers", "32.5"),
        ("num_layers = true", "num_layers", "True"),
        ("num_layers = nan", "num_layers", "nan"),
        ("num_layers = inf", "num_layers", "inf"),
        ("num_layers = 0", "num_layers", "0"),
        ("num_layers = -32", "num_layers", "-32"),
        ("num_layers = [32]", "num_layers", "[32]"),
        ("num_layers = { n = 32 }", "num_layers", "{'n': 32}"),
        ("hidden_size = 1e30", "hidden_size", "1000000000000000019884624838656"),
        ("num_experts = 1_000_000_000_000_000_000", "num_experts", "1000000000000000000"),
        ('aliases = "llama"', "aliases", "'llama'"),
        ("aliases = [1]", "aliases", "1"),
        ("tie_word_embeddings = 1", "tie_word_embeddings", "1"),
        ("hf_id = 3", "hf_id", "3"),
    ],
)
def test_bad_model_values_name_field_and_value(tmp_path, line, field, value):
    key = line.split(" =")[0]
    message = _one_line_error(load_model, _write(tmp_path, _replace_line(LLAMA_8B_TOML, key, line)))
    assert field in message and value in message


def test_a_10_to_the_30_parameter_model_is_rejected(tmp_path):
    # 1e24 experts of 3 * 4096 * 14336 weights each, per layer: ~1e35 parameters
    text = _replace_line(LLAMA_8B_TOML, "num_experts", "num_experts = 1_000_000_000_000_000_000_000_000")
    text += "experts_per_token = 2\nmoe_intermediate_size = 14336\n"
    _one_line_error(load_model, _write(tmp_path, text))
    # within each field's bound, but 2^28 experts x 3*4096*14336 x 32 layers ~ 4.7e19 parameters
    text = _replace_line(LLAMA_8B_TOML, "num_experts", f"num_experts = {1 << 28}") + "experts_per_token = 2\nmoe_intermediate_size = 14336\n"
    assert "parameters is implausible" in _one_line_error(load_model, _write(tmp_path, text, "b.toml"))


@pytest.mark.parametrize(
    "line, field",
    [
        ("hbm_bytes = 0", "hbm_bytes"),  # a 0-byte GPU
        ("hbm_bytes = 80", "hbm_bytes"),  # GB typed where bytes belong
        ("hbm_bytes = -85899345920", "hbm_bytes"),
        ("hbm_bytes = nan", "hbm_bytes"),
        ("hbm_bytes = inf", "hbm_bytes"),
        ('hbm_bytes = "80GB"', "hbm_bytes"),
        ("hbm_bytes = 1" + "0" * 400, "hbm_bytes"),  # float() of this int overflowed before
        ("hbm_bandwidth_bytes_per_s = 3.35", "hbm_bandwidth_bytes_per_s"),  # TB/s typed where bytes/s belong
        ("bf16_flops_per_s = 989", "bf16_flops_per_s"),  # TFLOP/s typed where FLOP/s belong
        ("fp8_flops_per_s = 1978", "fp8_flops_per_s"),  # accepted before: only [0, 1e17] was checked
        ("fp8_flops_per_s = -1", "fp8_flops_per_s"),
        ("fp4_flops_per_s = 9000", "fp4_flops_per_s"),  # PFLOP/s-scale typo: a FLOP/s figure or 0 (no FP4)
        ("fp4_flops_per_s = -1", "fp4_flops_per_s"),
        ("gpus_per_node = 0", "gpus_per_node"),
        ("gpus_per_node = 8.5", "gpus_per_node"),
        ("price_usd_per_hour = -1", "price_usd_per_hour"),
        ('price_usd_per_hour = "cheap"', "price_usd_per_hour"),
    ],
)
def test_bad_gpu_values(tmp_path, line, field):
    key = line.split(" =")[0]
    message = _one_line_error(load_gpu, _write(tmp_path, _replace_line(H100_TOML, key, line)))
    assert field in message and line.split("= ")[1].strip('"')[:20] in message


@pytest.mark.parametrize("line", ["ttft_slo_s = inf", 'ttft_slo_s = "inf"', 'ttft_slo_s = "Infinity"'])
def test_infinite_slo_means_none(tmp_path, line):
    text = _replace_line((CONFIG_DIR / "workloads" / "chat.toml").read_text(), "ttft_slo_s", line)
    w = load_workload(_write(tmp_path, text))
    assert w.ttft_slo_s == math.inf and w.has_slo  # the TPOT SLO remains


def test_bad_enum_value_lists_choices(tmp_path):
    text = (CONFIG_DIR / "workloads" / "chat.toml").read_text().replace('arrival = "poisson"', 'arrival = "poison"')
    message = _one_line_error(load_workload, _write(tmp_path, text))
    assert "arrival" in message and "Did you mean 'poisson'?" in message and "burst" in message


# ---- parse_gpu_list ------------------------------------------------------------------------


def test_parse_gpu_list():
    assert [g.name for g in parse_gpu_list("h100_sxm, a100_sxm")] == ["h100_sxm", "a100_sxm"]
    assert "at least one" in _one_line_error(parse_gpu_list, " , ")
    assert "twice" in _one_line_error(parse_gpu_list, "h100_sxm,h100_sxm")
    # the same GPU under two spellings was accepted twice before
    assert "twice" in _one_line_error(parse_gpu_list, "h100_sxm,H100-SXM")
    assert "twice" in _one_line_error(parse_gpu_list, "h100_sxm,NVIDIA H100 80GB HBM3")  # an alias is the same GPU
    assert "Did you mean 'h200_sxm'?" in _one_line_error(parse_gpu_list, "h100_sxm,h200_sx")


# ---- errors.py ------------------------------------------------------------------------------


def test_bad_value_format():
    assert str(bad_value("hbm_bytes", 80, "use bytes", where="gpu 'x'")) == "gpu 'x': hbm_bytes = 80: use bytes"
    assert str(bad_value("f", "a\nb", "fix")) == "f = 'a\\nb': fix"


def test_long_values_are_cut():
    message = str(bad_value("description", "x" * 1_000_000, "fix"))
    assert len(message) < 300 and "1,000,002 chars" in message
    assert len(short_repr("y" * 50)) == 52


def test_plan_error_is_always_one_line():
    assert str(PlanError("a\nb\r\nc")) == "a b c"
    assert isinstance(PlanError("x"), ValueError)


def test_unknown_name_with_a_huge_name():
    message = str(unknown_name("model", "z" * 100_000, ["a", "b"]))
    assert len(message) < 300 and "Known: a, b" in message


@pytest.mark.parametrize(("label", "gpu"), [
    ("NVIDIA H100 80GB HBM3", "h100_sxm"),  # nvidia-smi's name of the SXM part
    ("H100-SXM", "h100_sxm"),
    ("nvidia h200", "h200_sxm"),
    ("b200", "b200_sxm"),  # a B200 is an SXM part; gb200 is another product
    ("NVIDIA A100-SXM4-40GB", "a100_sxm_40gb"),
    ("AMD Instinct MI355X", "mi355x"),
])
def test_gpus_are_found_by_the_names_their_tools_print(label, gpu):
    assert load_gpu(label).name == gpu


def test_a_gpu_name_of_two_parts_is_not_guessed():
    with pytest.raises(PlanError, match=r"unknown GPU 'h100'. Did you mean 'h100_sxm'\?"):  # H100 PCIe is another part
        load_gpu("h100")


def test_gpu_aliases_name_one_gpu_each():
    from jaxplan.specs.loader import _bundled, _gpu_key, read_toml

    seen = {}
    for name, path in _bundled("gpus").items():
        for alias in (name, *read_toml(path).get("aliases", [])):
            assert seen.setdefault(_gpu_key(alias), name) == name, alias


def test_a_model_of_another_size_is_not_offered_as_a_misspelling():
    message = _one_line_error(load_model, "Qwen/Qwen3-8B")  # Qwen3-32B is another model, not what was meant
    assert "Did you mean" not in message and "config.json" in message
    assert "Did you mean 'qwen3-32b'?" in _one_line_error(load_model, "qwen3-32")  # a typo keeps its match
    assert "Did you mean 'qwen3-30b-a3b'?" in _one_line_error(load_model, "qwen3-30b-a3")  # 'a3b' is not a size
