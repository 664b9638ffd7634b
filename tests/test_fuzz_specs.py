"""Fuzz the spec loaders: every input either loads into a valid spec or raises a one-line PlanError.

Two sources of inputs:
- mutation (seeded `random.Random`, reproducible): each bundled TOML and each HF config.json
  (the raw ones in ../shared when present, plus one written from every bundled model spec) is
  parsed, mutated 1-3 times (drop a field, change its type, extreme numbers, NaN/inf, negative,
  huge strings, nested junk, typo'd or unknown keys, range tables) and written back; the raw file
  text is also corrupted byte-wise (truncation, flipped bytes, deleted/duplicated lines, bad UTF-8).
- hypothesis: random tables over the real field names and random HF dicts.

Inputs tried in the default run (the `slow` tests try 10x as many, opt in with --run-slow):
  TOML mutations    18 seeds x (150 structured + 50 byte-level)                = 3,600
  HF mutations      15 seeds x (150 structured + 40 byte-level)                = 2,850 (8 seeds without ../shared: 1,520)
  hypothesis        TOML 400 + HF dict 400 + ModelSpec kwargs 300 + space 200  = 1,300
  fixed pathological files (deep nesting, 5,000-digit ints, ...)               = 8
  total                                                                        = 7,758
Each load runs under a SIGALRM limit (HANG_SECONDS): a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxplan.calibrate._data import default_data_root
from jaxplan.errors import PlanError
from time_limit import Hang, time_limit
from jaxplan.specs import GpuSpec, ModelSpec, SearchSpace, Workload, known
from jaxplan.specs import loader
from jaxplan.specs.hf_config import model_from_hf_dict

HANG_SECONDS = 5.0  # the slowest valid load takes ~40 ms; 100x that is a hang
N_TOML, N_TOML_BYTES, N_HF, N_HF_BYTES = 150, 50, 150, 40
N_HYP = 400
SLOW = 10  # multiplier behind the `slow` marker

# functools.cache'd loaders: call the undecorated functions so thousands of paths do not pile up
LOADERS = {
    "models": loader.load_model.__wrapped__,
    "gpus": loader.load_gpu.__wrapped__,
    "workloads": loader.load_workload.__wrapped__,
    "spaces": loader.load_space.__wrapped__,
}
TYPES = {"models": ModelSpec, "gpus": GpuSpec, "workloads": Workload, "spaces": SearchSpace}
TOML_SEEDS = [(kind, name) for kind in LOADERS for name in known(kind)]
RAW_HF = sorted((default_data_root() / "specs" / "raw_model_configs").glob("*.json"))  # $JAXPLAN_SHARED_DATA or <repo>/../shared/data


# ---- harness ---------------------------------------------------------------------------------


def check_valid(spec) -> None:
    """Invariants of any spec that loaded."""
    dataclasses.replace(spec)  # re-validates: a loaded spec is a valid spec
    if isinstance(spec, ModelSpec):
        assert 0 < spec.active_params <= spec.total_params <= 1e14
        assert spec.kv_bytes_per_token(2) >= 0 and spec.linear_state_bytes_per_request_per_layer() >= 0
        assert spec.full_attention_layers + spec.sliding_window_layers + spec.linear_attention_layers == spec.num_layers
        assert "\n" not in spec.describe()
    elif isinstance(spec, SearchSpace):
        for axis, values in spec.axis_values().items():
            assert values and len(set(values)) == len(values), axis
            if axis not in ("weight_dtype", "kv_cache_dtype"):
                assert list(values) == sorted(values), axis
        assert spec.size(1) >= 1
    elif isinstance(spec, GpuSpec):
        assert math.isfinite(spec.hbm_bytes) and spec.hbm_bytes >= 1e9
    elif isinstance(spec, Workload):
        assert "\n" not in spec.describe()


def outcome(load, arg, label: str) -> str:
    """'ok' or 'error'; any other exception type, a multi-line message or a hang fails with `label`."""
    try:
        with time_limit(HANG_SECONDS):
            spec = load(arg)
            check_valid(spec)
    except PlanError as err:
        message = str(err)
        assert message and "\n" not in message and "\r" not in message, f"{label}: multi-line PlanError {message!r}"
        assert len(message) < 5000, f"{label}: {len(message)}-char PlanError"
        return "error"
    except Hang:
        pytest.fail(f"{label}: hang (> {HANG_SECONDS} s)")
    except Exception as err:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{label}: {type(err).__name__} instead of PlanError: {err!s:.300}")
    return "ok"


# ---- writing TOML (tomllib only reads) ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Raw:
    """Text written verbatim into the TOML/JSON (a 5,000-digit int cannot go through str() in 3.11)."""

    text: str


def toml_value(value) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON escapes are TOML basic-string escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    raise TypeError(type(value))


def toml_text(data: dict) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items() if v is not None)


def json_text(data) -> str:
    def encode(value):
        if isinstance(value, Raw):
            return f"__RAW{id(value)}__"
        if isinstance(value, dict):
            return {k: encode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [encode(v) for v in value]
        return value

    raws: dict[str, str] = {}

    def collect(value):
        if isinstance(value, Raw):
            raws[f'"__RAW{id(value)}__"'] = value.text
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, list):
            for v in value:
                collect(v)

    collect(data)
    text = json.dumps(encode(data))  # NaN / Infinity tokens: Python's json reads them back
    for marker, raw in raws.items():
        text = text.replace(marker, raw)
    return text


# ---- HF config.json from a spec (seeds that exist without ../shared) ---------------------------------


def hf_dict(spec: ModelSpec) -> dict:
    cfg = {
        "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size,
        "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": spec.tie_word_embeddings,
        "attn_output_gate": spec.attn_output_gate, "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    }
    if spec.qk_norm_across_heads:
        cfg.update(use_qk_norm=True, qk_norm_type="per_layer")
    if spec.sliding_window_layers or spec.linear_attention_layers:
        cfg["layer_types"] = (
            ["full_attention"] * spec.full_attention_layers
            + ["sliding_attention"] * spec.sliding_window_layers
            + ["linear_attention"] * spec.linear_attention_layers
        )
    if spec.sliding_window_layers:
        cfg["sliding_window"] = spec.sliding_window_tokens
    if spec.linear_attention_layers:
        cfg.update(linear_num_key_heads=spec.linear_num_key_heads, linear_num_value_heads=spec.linear_num_value_heads,
                   linear_key_head_dim=spec.linear_key_head_dim, linear_value_head_dim=spec.linear_value_head_dim,
                   linear_conv_kernel_dim=spec.linear_conv_kernel)
    if spec.is_mla:
        cfg.update(kv_lora_rank=spec.kv_lora_rank, q_lora_rank=spec.q_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
                   qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim)
    if spec.chunked_attention_layers:
        cfg.update(attention_chunk_size=spec.attention_chunk_tokens,
                   no_rope_layers=[1] * spec.chunked_attention_layers + [0] * (spec.num_layers - spec.chunked_attention_layers))
    if spec.sparse_attention_topk:
        cfg.update(index_topk=spec.sparse_attention_topk, index_n_heads=spec.indexer_heads, index_head_dim=spec.indexer_head_dim)
    if spec.is_moe:
        cfg.update(n_routed_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
                   moe_intermediate_size=spec.moe_intermediate_size, n_shared_experts=spec.num_shared_experts,
                   first_k_dense_replace=spec.first_dense_layers)
    return cfg


def _architecture(spec: ModelSpec) -> dict:
    # checkpoint_weight_format comes from quantization_config, which the synthetic seeds do not write
    skip = ("name", "aliases", "source", "hf_id", "checkpoint_weight_format")
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in skip}


@pytest.mark.parametrize("name", known("models"))
def test_hf_seed_round_trips(name):
    """The synthetic HF seeds are faithful: parsing one gives back the bundled spec."""
    spec = loader.load_model(name)
    assert _architecture(model_from_hf_dict(hf_dict(spec), name)) == _architecture(spec)


HF_SEEDS = [(f"spec:{name}", lambda name=name: hf_dict(loader.load_model(name))) for name in known("models")]
HF_SEEDS += [(f"raw:{p.name}", lambda p=p: json.loads(p.read_text())) for p in RAW_HF]


# ---- mutations ---------------------------------------------------------------------------------

EXTREME_NUMBERS = [0, -1, 1, 2, 3, 7, 1000, 2**31, 2**63, -(2**63), 10**30, 10**400, 1e308, -1e-300, 0.5, 1.5,
                   math.nan, math.inf, -math.inf, 10_000_000, 10_000_001]
JUNK = [True, False, "", "8", "abc", "inf", "poisson", "bf16", "x" * 100_000, "line\nbreak\x00", "\U0001f680",
        [], [1, 2], [1, 1], ["bf16", "fp8"], [[1]], [None], {}, {"min": 1, "max": 4}, {"min": 4, "max": 1},
        {"min": 1, "max": 10**9, "step": 1}, {"a": {"b": [1, {"c": None}]}}, Raw("9" * 5000)]


def nested_junk(rng: random.Random, depth: int):
    value = rng.choice([1, "x", math.nan, None, True])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {rng.choice(["a", "min", "max", "num_layers"]): value}
    return value


def mutate_value(rng: random.Random, old):
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(EXTREME_NUMBERS)
    if roll < 0.55:
        return rng.choice(JUNK)
    if roll < 0.65:
        return nested_junk(rng, rng.randint(1, 60))
    if isinstance(old, (int, float)) and not isinstance(old, bool):  # near-valid numbers: the validators' edges
        edges = [old * 0, -old, old * 1000, old + 1, old - 1, old // 2 if isinstance(old, int) else old / 3]
        if abs(old) < 1e290:  # float arithmetic on a 400-digit int would overflow in the harness itself
            edges += [old / 1000, old * 1e9]
        return rng.choice(edges)
    if isinstance(old, list) and old:
        choice = rng.randint(0, 3)
        return [old[0]] * 2 if choice == 0 else old[::-1] if choice == 1 else [] if choice == 2 else old + [rng.choice(EXTREME_NUMBERS)]
    if isinstance(old, dict) and old:
        key = rng.choice(sorted(old))
        return {**old, key: mutate_value(rng, old[key])}
    return rng.choice(EXTREME_NUMBERS + JUNK)


def mutate(rng: random.Random, data: dict, field_names: list[str]) -> tuple[dict, list[str]]:
    """Apply 1-3 random mutations to a copy of `data`; returns it and what was done (for the failure label)."""
    data = json.loads(json.dumps(data))  # deep copy; NaN survives
    done = []
    for _ in range(rng.randint(1, 3)):
        target = data
        if isinstance(data.get("text_config"), dict) and rng.random() < 0.7:
            target = data["text_config"]
        op = rng.random()
        keys = sorted(target)
        if op < 0.15 and keys:
            key = rng.choice(keys)
            target.pop(key)
            done.append(f"drop {key}")
        elif op < 0.75 and keys:
            key = rng.choice(keys)
            target[key] = mutate_value(rng, target[key])
            done.append(f"{key} <- {str(target[key])[:60]!s}")
        elif op < 0.85:
            key = rng.choice(field_names)
            target[key] = mutate_value(rng, target.get(key, 1))
            done.append(f"set {key} <- {str(target[key])[:60]!s}")
        elif op < 0.93 and keys:
            key = rng.choice(keys)
            cut = rng.randrange(len(key))
            target[key[:cut] + key[cut + 1:]] = target.pop(key)
            done.append(f"typo {key}")
        else:
            key = "".join(rng.choice(string.ascii_letters + "_.") for _ in range(rng.randint(1, 12)))
            target[key] = rng.choice(JUNK)
            done.append(f"unknown key {key!r}")
    return data, done


def corrupt_bytes(rng: random.Random, text: bytes) -> bytes:
    """Byte-level damage to a file's text."""
    op = rng.randint(0, 6)
    n = len(text)
    if op == 0:
        return text[: rng.randrange(n)]  # truncated
    if op == 1:
        i = rng.randrange(n)
        return text[:i] + bytes([rng.randrange(256)]) + text[i + 1:]  # one byte flipped
    if op == 2:
        lines = text.splitlines(keepends=True)
        del lines[rng.randrange(len(lines))]
        return b"".join(lines)
    if op == 3:
        lines = text.splitlines(keepends=True)
        i = rng.randrange(len(lines))
        return b"".join(lines[: i + 1] + [lines[i]] + lines[i + 1:])  # duplicated line (duplicate key in TOML)
    if op == 4:
        i = rng.randrange(n)
        return text[:i] + b"\xff\xfe\x00" + text[i:]  # not UTF-8
    if op == 5:
        return text.replace(b"=", b":", 1).replace(b":", b"=", 1)  # punctuation swap
    return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))  # noise


# ---- mutation tests ----------------------------------------------------------------------------


def _toml_cases(kind: str, name: str, tmp_path: Path, n_struct: int, n_bytes: int) -> dict[str, int]:
    source = loader.CONFIG_DIR / kind / f"{name}.toml"
    data = loader.read_toml(source)
    field_names = [f.name for f in dataclasses.fields(TYPES[kind])]
    rng = random.Random(f"{kind}/{name}")  # string seeds are stable across runs and Python versions
    counts = {"ok": 0, "error": 0}
    for case in range(n_struct):
        mutated, done = mutate(rng, data, field_names)
        path = tmp_path / f"{name}-{case}.toml"
        path.write_text(toml_text(mutated), encoding="utf-8")
        counts[outcome(LOADERS[kind], str(path), f"{kind}/{name} case {case}: {done}")] += 1
    raw = source.read_bytes()
    for case in range(n_bytes):
        path = tmp_path / f"{name}-bytes-{case}.toml"
        path.write_bytes(corrupt_bytes(rng, raw))
        counts[outcome(LOADERS[kind], str(path), f"{kind}/{name} byte case {case}")] += 1
    return counts


def _hf_cases(label: str, make, tmp_path: Path, n_struct: int, n_bytes: int) -> dict[str, int]:
    data = make()
    field_names = sorted(set(hf_dict(loader.load_model("deepseek-v3"))) | set(hf_dict(loader.load_model("qwen3.5-27b")))
                         | {"text_config", "num_local_experts", "num_experts", "sliding_window_pattern", "mlp_only_layers",
                            "decoder_sparse_step", "full_attention_interval", "use_sliding_window", "max_window_layers"})
    rng = random.Random(label)
    counts = {"ok": 0, "error": 0}
    for case in range(n_struct):
        mutated, done = mutate(rng, data, field_names)
        path = tmp_path / f"c{case}" / "config.json"
        path.parent.mkdir()
        path.write_text(json_text(mutated), encoding="utf-8")
        load = LOADERS["models"] if case % 2 else (lambda p: loader.load_model.__wrapped__(str(Path(p).parent)))
        counts[outcome(load, str(path), f"{label} case {case}: {done}")] += 1
    raw = json_text(data).encode()
    for case in range(n_bytes):
        path = tmp_path / f"bytes-{case}.json"
        path.write_bytes(corrupt_bytes(rng, raw))
        counts[outcome(LOADERS["models"], str(path), f"{label} byte case {case}")] += 1
    return counts


@pytest.mark.parametrize("kind, name", TOML_SEEDS, ids=[f"{k}/{n}" for k, n in TOML_SEEDS])
def test_mutated_toml(kind, name, tmp_path):
    counts = _toml_cases(kind, name, tmp_path, N_TOML, N_TOML_BYTES)
    assert counts["error"] > 0  # the mutations do reach the validators


@pytest.mark.parametrize("label, make", HF_SEEDS, ids=[label for label, _ in HF_SEEDS])
def test_mutated_hf_config(label, make, tmp_path):
    counts = _hf_cases(label, make, tmp_path, N_HF, N_HF_BYTES)
    assert counts["error"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("kind, name", TOML_SEEDS, ids=[f"{k}/{n}" for k, n in TOML_SEEDS])
def test_mutated_toml_long(kind, name, tmp_path):
    _toml_cases(kind, name, tmp_path, N_TOML * SLOW, N_TOML_BYTES * SLOW)


@pytest.mark.slow
@pytest.mark.parametrize("label, make", HF_SEEDS, ids=[label for label, _ in HF_SEEDS])
def test_mutated_hf_config_long(label, make, tmp_path):
    _hf_cases(label + "/long", make, tmp_path, N_HF * SLOW, N_HF_BYTES * SLOW)


PATHOLOGICAL = [
    ("models", "x = " + "[" * 100_000 + "]" * 100_000),  # recursion in the TOML parser
    ("models", "x = " + "{a = " * 5_000 + "1" + "}" * 5_000),
    ("models", "num_layers = " + "9" * 5_000),  # over Python's 4,300-digit int limit
    ("gpus", "hbm_bytes = 1" + "0" * 4_000),  # parses, but float() of it overflows
    # otherwise valid, but 10^7 data-parallel sizes: 3.4 s and ~1 GB to load before the 100,000-value cap
    ("spaces", "tensor_parallel_size = [1]\npipeline_parallel_size = [1]\nmax_num_seqs = [8]\nmax_num_batched_tokens = [256]\n"
               "data_parallel_size = { min = 1, max = 10000000 }"),
    ("workloads", "description = '" + "x" * 5_000_000 + "'"),
    ("models", "\x00" * 1000),
    ("models", ""),
]


@pytest.mark.parametrize("kind, text", PATHOLOGICAL, ids=[f"{kind}-{i}" for i, (kind, _) in enumerate(PATHOLOGICAL)])
def test_pathological_files(kind, text, tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert outcome(LOADERS[kind], str(path), f"{kind}: {text[:40]!r}") == "error"


# ---- hypothesis ------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 4, 8, 16, 64, 128, 1024, 4096, 2**31, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["bf16", "fp8", "auto", "poisson", "burst", "closed", "lognormal", "full_attention", "sliding_attention"]),
)
# two levels of nesting spelled out (deeper junk comes from the mutation tests' nested_junk)
shallow = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=6), scalars, max_size=3))
values = st.one_of(shallow, st.lists(shallow, max_size=3), st.dictionaries(st.text(max_size=6), shallow, max_size=3))
HYP = settings(max_examples=N_HYP, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], database=None)
HYP_SLOW = settings(HYP, max_examples=N_HYP * SLOW)


def _toml_table(kind: str):
    names = [f.name for f in dataclasses.fields(TYPES[kind])] + ["min", "max", "typo_field"]
    base = loader.read_toml(loader.CONFIG_DIR / kind / f"{known(kind)[0]}.toml")
    return st.dictionaries(st.sampled_from(names), values, max_size=6).map(lambda extra: {**base, **extra})


toml_inputs = st.sampled_from(list(LOADERS)).flatmap(lambda kind: st.tuples(st.just(kind), _toml_table(kind)))


def _check_toml(kind_and_table, tmp_path_factory):
    kind, table = kind_and_table
    path = tmp_path_factory.mktemp("hyp") / "spec.toml"
    path.write_text(toml_text(table), encoding="utf-8")
    outcome(LOADERS[kind], str(path), f"{kind}: {table!r:.400}")


@HYP
@given(toml_inputs)
def test_hypothesis_toml(tmp_path_factory, kind_and_table):
    _check_toml(kind_and_table, tmp_path_factory)


@pytest.mark.slow
@HYP_SLOW
@given(toml_inputs)
def test_hypothesis_toml_long(tmp_path_factory, kind_and_table):
    _check_toml(kind_and_table, tmp_path_factory)


HF_KEYS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
           "intermediate_size", "max_position_embeddings", "tie_word_embeddings", "layer_types", "sliding_window",
           "sliding_window_pattern", "use_sliding_window", "max_window_layers", "full_attention_interval",
           "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
           "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_local_experts",
           "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
           "first_k_dense_replace", "mlp_only_layers", "decoder_sparse_step", "rope_scaling", "text_config"]
small_ints = st.one_of(st.integers(min_value=-2, max_value=64), st.sampled_from([128, 256, 1024, 4096, 32000, 10**9]))
hf_values = st.one_of(small_ints, values, st.lists(st.sampled_from(["full_attention", "sliding_attention", "linear_attention", "mamba", 3]), max_size=8))
hf_dicts = st.dictionaries(st.sampled_from(HF_KEYS), hf_values, max_size=12).map(
    lambda d: {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, **d}
)
hf_inputs = st.one_of(hf_dicts, hf_dicts.map(lambda d: {"vocab_size": 100, "text_config": d}), values)


@HYP
@given(hf_inputs)
def test_hypothesis_hf_dict(raw):
    outcome(lambda r: model_from_hf_dict(r, "h"), raw, f"{raw!r:.400}")


@pytest.mark.slow
@HYP_SLOW
@given(hf_inputs)
def test_hypothesis_hf_dict_long(raw):
    outcome(lambda r: model_from_hf_dict(r, "h"), raw, f"{raw!r:.400}")


model_kwargs = st.fixed_dictionaries(
    {f: st.one_of(st.integers(1, 64), st.integers(1, 64), small_ints) for f in ("num_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_kv_heads", "head_dim",
                             "intermediate_size", "max_position_embeddings")},
    optional={f: st.one_of(st.integers(0, 8), st.just(0), small_ints, scalars) for f in ("full_attention_layers", "sliding_window_layers", "sliding_window_tokens",
              "linear_attention_layers", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
              "linear_value_head_dim", "linear_conv_kernel", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim", "num_experts", "experts_per_token", "moe_intermediate_size",
              "num_shared_experts", "first_dense_layers", "linear_state_bytes_per_element")},
)


@settings(HYP, max_examples=300)
@given(model_kwargs)
def test_hypothesis_model_spec(kwargs):
    """Direct construction: valid specs have consistent derived counts; the rest are PlanErrors."""
    outcome(lambda kw: ModelSpec(name="m", **kw), kwargs, f"{kwargs!r}")


axis = st.one_of(st.lists(st.integers(min_value=1, max_value=4096), min_size=1, max_size=5, unique=True),  # mostly valid
                 st.lists(st.integers(min_value=1, max_value=4096), min_size=1, max_size=5, unique=True),
                 st.lists(st.integers(min_value=-3, max_value=2**24), max_size=5),
                 st.fixed_dictionaries({"min": st.integers(-3, 300), "max": st.integers(-3, 5000)}, optional={"step": st.integers(-1, 64)}),
                 st.fixed_dictionaries({"min": st.just(1), "max": st.sampled_from([99_999, 100_000, 100_001, 10**7, 2**63])}),
                 values)
space_tables = st.fixed_dictionaries({a: axis for a in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                                                        "max_num_seqs", "max_num_batched_tokens")},
                                     optional={"weight_dtype": values, "kv_cache_dtype": values, "block_size_tokens": values,
                                               "gpu_memory_utilization": values, "gpu_budget": values})


@settings(HYP, max_examples=200)
@given(space_tables)
def test_hypothesis_search_space(table):
    outcome(lambda t: loader.build(SearchSpace, t, name="s", where="s.toml"), table, f"{table!r:.400}")
