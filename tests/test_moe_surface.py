"""What a user sees of a MoE plan: the layout kind of every row (fields, labels, JSON), the `vllm serve`
lines of every kind parsed back into the layout they came from (one node and several), the weight
format in vLLM's terms, why the winner beats the other kinds, and --layout-kinds."""

from __future__ import annotations

import argparse
import re
import shlex

import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.layout_kind import kind_fields, kind_label
from jaxplan.report.vllm_command import checkpoint_and_quantization, launch_note, serve_lines
from jaxplan.specs import load_model, load_workload

# ---- rows and labels ------------------------------------------------------------------------------


@pytest.mark.parametrize(("label", "dp_axis", "moe", "expected"), [
    ("tp", 4, False, dict(data_parallel_size=4, layout_kind="tp", lockstep_ranks=1, enable_expert_parallel=False, servers=1)),
    ("tp", 4, True, dict(data_parallel_size=4, layout_kind="tp", lockstep_ranks=1, enable_expert_parallel=False, servers=4)),
    ("ep", 2, True, dict(data_parallel_size=2, layout_kind="ep", lockstep_ranks=1, enable_expert_parallel=True, servers=2)),
    ("dp:4", 1, True, dict(data_parallel_size=4, layout_kind="dp", lockstep_ranks=4, enable_expert_parallel=False, servers=1)),
    ("dp_ep:8", 2, True, dict(data_parallel_size=16, layout_kind="dp_ep", lockstep_ranks=8, enable_expert_parallel=True, servers=2)),
])
def test_kind_fields_count_replicas_and_servers(label, dp_axis, moe, expected):
    """The DP axis counts servers of a lock-step kind (each of D ranks), replicas otherwise; a dense
    model's replicas are one server (vLLM's --data-parallel-size), a MoE model's tp/ep replicas one each."""
    fields = kind_fields(label, dp_axis, "fp8", moe)
    assert fields == dict(expected, expert_weight_format="fp8")


@pytest.mark.parametrize(("fields", "label"), [
    (dict(layout_kind="tp", lockstep_ranks=1, servers=1, data_parallel_size=3), "TP4xPP2xDP3"),  # dense: as before
    (dict(data_parallel_size=3), "TP4xPP2xDP3"),  # a row without kind fields (older JSON)
    (dict(layout_kind="tp", lockstep_ranks=1, servers=3, data_parallel_size=3), "3x(TP4xPP2)"),
    (dict(layout_kind="ep", lockstep_ranks=1, servers=1, data_parallel_size=1, enable_expert_parallel=True), "TP4xPP2 EP4"),
    (dict(layout_kind="dp", lockstep_ranks=4, servers=1, data_parallel_size=4), "TP4xPP2 DP4-lockstep"),
    (dict(layout_kind="dp_ep", lockstep_ranks=8, servers=2, data_parallel_size=16, enable_expert_parallel=True), "2x(TP4xPP2 DP8-lockstep EP32)"),
])
def test_labels_name_the_kind(fields, label):
    assert kind_label(dict(tensor_parallel_size=4, pipeline_parallel_size=2, **fields)) == label


# ---- serve lines parsed back ---------------------------------------------------------------------------

BASE = dict(max_num_seqs=64, max_num_batched_tokens=2048, kv_cache_dtype="auto", kv_blocks_per_replica=100_000)


def moe_row(gpu, tp, pp, kind, ranks, servers, weight_dtype):
    lockstep = kind in ("dp", "dp_ep")
    replicas = servers * ranks if lockstep else servers
    return dict(BASE, gpu=gpu, tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=replicas, layout_kind=kind,
                lockstep_ranks=ranks if lockstep else 1, enable_expert_parallel=kind in ("ep", "dp_ep"), servers=servers,
                weight_dtype=weight_dtype, num_gpus=tp * pp * replicas)


def vllm_parser() -> argparse.ArgumentParser:
    """The `vllm serve` flags the lines use, as vLLM names them (docs/serving/data_parallel_deployment.md)."""
    p = argparse.ArgumentParser(prog="vllm serve", exit_on_error=False)
    p.add_argument("model")
    for name in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--data-parallel-size-local",
                 "--data-parallel-start-rank", "--data-parallel-rpc-port", "--max-num-seqs", "--max-num-batched-tokens", "--port", "--max-model-len", "--block-size"):
        p.add_argument(name, type=int)
    for name in ("--data-parallel-address", "--quantization", "--kv-cache-dtype", "--distributed-executor-backend", "--gpu-memory-utilization"):
        p.add_argument(name)
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--headless", action="store_true")
    return p


def parse_deployment(model, commands: list[str]) -> dict:
    """(T, P, D, EP, servers, weight dtype, GPUs) of a deployment from its lines alone: a line without
    --headless starts a server, a --headless one adds ranks to the server of its address; the weight
    dtype from --quantization or the checkpoint the line names."""
    parser = vllm_parser()
    servers, gpus, devices = [], 0, {}
    for command in commands:
        argv = shlex.split(command)
        env = [a for a in argv[: argv.index("vllm")]]
        assert argv[argv.index("vllm") + 1] == "serve"
        args = parser.parse_args(argv[argv.index("vllm") + 2 :])
        ranks = args.data_parallel_size_local if args.data_parallel_size_local is not None else (args.data_parallel_size or 1)
        gpus += args.tensor_parallel_size * args.pipeline_parallel_size * ranks
        if env:  # servers sharing a node: disjoint GPUs, distinct ports
            (visible,) = [e.split("=", 1)[1] for e in env if e.startswith("CUDA_VISIBLE_DEVICES=")]
            assert len(visible.split(",")) == args.tensor_parallel_size * args.pipeline_parallel_size * ranks
            devices.setdefault(args.port, set()).update(visible.split(","))
        if args.headless:
            (head,) = [s for s in servers if s.data_parallel_address == args.data_parallel_address]
            assert args.data_parallel_start_rank == head.covered  # ranks follow on, node after node
            head.covered += args.data_parallel_size_local
        else:
            args.covered = ranks
            servers.append(args)
    first = servers[0]
    for s in servers:
        assert (s.tensor_parallel_size, s.pipeline_parallel_size, s.data_parallel_size, s.enable_expert_parallel) == (
            first.tensor_parallel_size, first.pipeline_parallel_size, first.data_parallel_size, first.enable_expert_parallel)
        assert s.covered == (s.data_parallel_size or 1)  # every rank of every server started
    if first.quantization == "fp8":
        dtype = "fp8"
    elif first.quantization == "modelopt_fp4":
        dtype = "nvfp4"
    elif first.model == model.hf_id:
        dtype = model.checkpoint_weight_format
    else:
        dtype = {"bf16": "bf16", "MXFP4": "mxfp4", "INT4": "int4"}[re.match(r"<(\S+) ", first.model).group(1)]
    return dict(T=first.tensor_parallel_size, P=first.pipeline_parallel_size, D=first.data_parallel_size or 1, EP=first.enable_expert_parallel,
                servers=len(servers), dtype=dtype, gpus=gpus)


def layout_of_deployment(parsed: dict, moe: bool) -> dict:
    """The row fields a parsed deployment is: vLLM's --data-parallel-size D > 1 on a MoE model is lock-step."""
    if not moe:
        return dict(layout_kind="tp", data_parallel_size=parsed["D"], servers=parsed["servers"])
    lockstep = parsed["D"] > 1
    kind = ("dp_ep" if parsed["EP"] else "dp") if lockstep else ("ep" if parsed["EP"] else "tp")
    return dict(layout_kind=kind, data_parallel_size=parsed["servers"] * parsed["D"], servers=parsed["servers"])


CASES = [
    # (model, gpu (8 per node), tp, pp, kind, D, servers, weight dtype)
    ("qwen3-235b-a22b", "h200_sxm", 8, 1, "tp", 1, 1, "fp8"),  # one node, one server
    ("qwen3-235b-a22b", "h200_sxm", 2, 1, "tp", 1, 4, "bf16"),  # four servers on one node
    ("gpt-oss-120b", "h200_sxm", 2, 1, "ep", 1, 4, "mxfp4"),
    ("gpt-oss-120b", "h200_sxm", 4, 2, "ep", 1, 3, "mxfp4"),  # one server per node, three nodes
    ("kimi-k2.5", "h200_sxm", 8, 2, "tp", 1, 2, "int4"),  # each server a Ray cluster of two nodes
    ("qwen3-235b-a22b", "h200_sxm", 1, 2, "dp", 4, 1, "fp8"),
    ("qwen3-235b-a22b", "h200_sxm", 1, 1, "dp", 4, 2, "fp8"),  # two lock-step servers sharing a node
    ("minimax-m2.5", "h200_sxm", 1, 1, "dp_ep", 8, 1, "fp8"),
    ("kimi-k2.5", "h200_sxm", 2, 1, "dp_ep", 16, 1, "int4"),  # 32 GPUs: one server over four nodes
    ("gpt-oss-120b", "h200_sxm", 2, 1, "dp_ep", 8, 3, "bf16"),  # three servers, each over two nodes
]


@pytest.mark.parametrize(("name", "gpu", "tp", "pp", "kind", "ranks", "servers", "dtype"), CASES)
def test_serve_lines_parse_back_into_the_layout(name, gpu, tp, pp, kind, ranks, servers, dtype):
    model = load_model(name)
    row = moe_row(gpu, tp, pp, kind, ranks, servers, dtype)
    lines = serve_lines(model, row)
    if tp * pp > 8:  # a replica over nodes runs over Ray: one line per server, its nodes joined by Ray
        assert all("--distributed-executor-backend ray" in line.command for line in lines) and len(lines) == servers
        parsed = parse_deployment(model, [line.command for line in lines])
        assert parsed["servers"] == servers and parsed["dtype"] == dtype
        return
    parsed = parse_deployment(model, [line.command for line in lines])
    assert (parsed["T"], parsed["P"], parsed["EP"], parsed["dtype"], parsed["gpus"]) == (tp, pp, kind in ("ep", "dp_ep"), dtype, row["num_gpus"])
    back = layout_of_deployment(parsed, model.is_moe)
    assert back == {k: row[k] for k in back}
    if kind in ("tp", "ep") and servers > 1:  # never vLLM's lock-step flag for independent servers
        assert all("--data-parallel-size" not in line.command for line in lines)
        assert "router" in launch_note(model, row)


def test_servers_sharing_a_node_get_disjoint_gpus_and_ports():
    row = moe_row("h200_sxm", 2, 1, "tp", 1, 4, "fp8")
    lines = [shlex.split(line.command) for line in serve_lines(load_model("qwen3-235b-a22b"), row)]
    visible = [argv[0] for argv in lines]
    assert visible == ["CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=2,3", "CUDA_VISIBLE_DEVICES=4,5", "CUDA_VISIBLE_DEVICES=6,7"]
    assert [argv[argv.index("--port") + 1] for argv in lines] == ["8000", "8001", "8002", "8003"]


def test_gb200_launches_per_compute_tray_of_four_gpus():
    """A GB200 NVL72 is one 72-GPU NVLink domain (the physics' node) of 4-GPU hosts: a TP8 replica is one
    Ray cluster over two trays, 16 lock-step ranks are four trays of 4 (head + 3 headless), and four
    TP1 servers share one tray. The same rows on H200 (8 GPUs a host) need half the hosts."""
    model = load_model("deepseek-r1")
    tp8 = serve_lines(model, moe_row("gb200", 8, 1, "tp", 1, 1, "fp8"))
    assert len(tp8) == 1 and "--distributed-executor-backend ray" in tp8[0].command
    assert "--distributed-executor-backend" not in serve_lines(model, moe_row("h200_sxm", 8, 1, "tp", 1, 1, "fp8"))[0].command
    ranks = [shlex.split(line.command) for line in serve_lines(model, moe_row("gb200", 1, 1, "dp_ep", 16, 1, "fp8"))]
    assert [argv[argv.index("--data-parallel-size-local") + 1] for argv in ranks] == ["4"] * 4
    assert len(serve_lines(model, moe_row("h200_sxm", 1, 1, "dp_ep", 16, 1, "fp8"))) == 2
    shared = [shlex.split(line.command)[0] for line in serve_lines(model, moe_row("gb200", 1, 1, "tp", 1, 8, "fp8"))]
    assert shared == [f"CUDA_VISIBLE_DEVICES={g}" for g in (0, 1, 2, 3)] * 2


@pytest.mark.parametrize(("replicas", "lines"), [(4, 1), (7, 2)])
def test_a_dense_model_keeps_one_data_parallel_server(replicas, lines):
    """A dense model's --data-parallel-size replicas are independent in vLLM: one command (per node)."""
    model = load_model("llama-3.1-70b")
    row = dict(BASE, gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=2, data_parallel_size=replicas, weight_dtype="fp8",
               layout_kind="tp", lockstep_ranks=1, servers=1, num_gpus=2 * replicas)
    out = serve_lines(model, row)
    assert len(out) == lines
    parsed = parse_deployment(model, [line.command for line in out])
    assert (parsed["D"], parsed["servers"], parsed["gpus"], parsed["dtype"]) == (replicas, 1, 2 * replicas, "fp8")


@pytest.mark.parametrize(("name", "dtype", "served", "quantization"), [
    ("kimi-k2.5", "int4", "moonshotai/Kimi-K2.5", None),  # compressed-tensors INT4 checkpoint, as it is
    ("gpt-oss-120b", "mxfp4", "openai/gpt-oss-120b", None),
    ("minimax-m2.5", "fp8", "MiniMaxAI/MiniMax-M2.5", None),  # an FP8 checkpoint: read from its config
    ("qwen3-235b-a22b", "fp8", "Qwen/Qwen3-235B-A22B", "fp8"),  # BF16 weights quantised as vLLM loads them
    ("gpt-oss-120b", "bf16", "<bf16 checkpoint of openai/gpt-oss-120b>", None),  # vLLM cannot dequantise MXFP4
    ("gpt-oss-120b", "fp8", "<bf16 checkpoint of openai/gpt-oss-120b>", "fp8"),
    ("kimi-k2.5", "fp8", "<bf16 checkpoint of moonshotai/Kimi-K2.5>", "fp8"),
    ("qwen3-235b-a22b", "nvfp4", "<NVFP4 checkpoint of Qwen/Qwen3-235B-A22B>", "modelopt_fp4"),
])
def test_weight_formats_in_vllms_terms(name, dtype, served, quantization):
    model = load_model(name)
    got, flags = checkpoint_and_quantization(model, dtype)
    assert got == served and (flags[1] if flags else None) == quantization
    note = launch_note(model, moe_row("h200_sxm", 8, 1, "tp", 1, 1, dtype))
    assert ("give such a checkpoint" in note) == served.startswith("<")


# ---- a sweep: rows, JSON, why it wins, --layout-kinds ---------------------------------------------------


@pytest.fixture(scope="module")
def plan():
    import jaxplan

    return jaxplan.sweep("gpt-oss-120b", "h200_sxm", "coding", "small", top=8, replay=False)


def test_rows_carry_the_kind_and_count_gpus_by_replicas(plan):
    rows = [f.to_row() for f in plan.finalists]
    assert {r["layout_kind"] for r in rows} <= {"tp", "ep", "dp", "dp_ep"}
    for r in rows:
        assert r["num_gpus"] == r["tensor_parallel_size"] * r["pipeline_parallel_size"] * r["data_parallel_size"]
        lockstep = r["layout_kind"] in ("dp", "dp_ep")
        assert r["servers"] * (r["lockstep_ranks"] if lockstep else 1) == r["data_parallel_size"]
        assert r["enable_expert_parallel"] == (r["layout_kind"] in ("ep", "dp_ep")) and r["expert_weight_format"] == r["weight_dtype"]


def test_the_json_reads_back_with_the_kind_and_the_reasons(plan):
    from jaxplan.plan import Plan

    back = Plan.from_json(plan.to_json())
    assert back.finalists == plan.finalists and back.winner == plan.winner
    winner = plan.to_dict()["winner"]
    for key in ("layout_kind", "lockstep_ranks", "enable_expert_parallel", "servers", "expert_weight_format", "why_it_wins", "launch_note", "vllm_serve_labels"):
        assert key in winner
    assert len(winner["vllm_serve_labels"]) == 1 + len(winner["vllm_serve_other_nodes"])


def test_why_the_winner_wins_is_computed_from_the_rows(plan):
    """One line per other kind; the KV ratio it states is the rows' own (replicas x blocks x block size)."""
    from jaxplan.plots.splits import best_per_split

    winner = plan.winner.finalist.to_row()
    assert len(plan.winner.why) == 3  # gpt-oss on one H200 node: tp, ep, dp and dp_ep all fit
    block = plan.space.block_size_tokens
    rows = best_per_split(plan.sweep, winner["num_gpus"], (winner["gpu"],))
    for line in plan.winner.why:
        rival_kind = re.search(r" over (\w+)", line).group(1)
        assert rival_kind != winner["layout_kind"]
        rival = next(r for r in rows if r["layout_kind"] == rival_kind and r["passes"])
        ratio = (winner["kv_blocks_per_replica"] * winner["data_parallel_size"]) / (rival["kv_blocks_per_replica"] * rival["data_parallel_size"])
        assert f"{ratio:.2f}x the KV cache" in line and kind_label(rival) in line, line
        assert block > 0 and "decode step at" in line


def test_a_one_gpu_winner_is_set_against_the_fewest_gpus_that_run_each_other_kind(plan):
    """At a chat rate one H200 serves gpt-oss-120b: no EP or lock-step layout exists on one GPU, so each
    line names the fewest H200s on which that kind passes (2: TP2 EP2, DP2 lock-step) and its cost
    per output token against the winner's, as the rows give them."""
    import jaxplan
    from jaxplan.plots.splits import best_per_split

    chat = jaxplan.sweep("gpt-oss-120b", "h200_sxm", "chat", "small", top=8, replay=False)  # the fixture's programs
    winner = chat.winner.finalist.to_row()
    assert (winner["layout_kind"], winner["num_gpus"]) == ("tp", 1)
    assert [re.search(r" over (\w+)", line).group(1) for line in chat.winner.why] == ["ep", "dp", "dp_ep"]
    assert "passes (" in chat.winner.why[0] and "the space has no dp layout of 1 h200_sxm" in chat.winner.why[1]
    two = best_per_split(chat.sweep, 2, ("h200_sxm",))
    for line in chat.winner.why:
        kind = re.search(r" over (\w+)", line).group(1)
        rival = next(r for r in two if r["passes"] and r["layout_kind"] == kind)  # best first
        cost, theirs = winner["cost_per_million_output_tokens_usd"], rival["cost_per_million_output_tokens_usd"]
        assert f"run one (2), the best, {kind_label(rival)} " in line, line
        assert f"${theirs:.2f} per million output tokens against the winner's ${cost:.2f} ({theirs / cost:.2f}x)" in line, line
        assert theirs > cost  # two GPUs for the rate one serves: the winner is the cheaper


def test_a_kind_that_never_passes_is_named_by_the_split_that_came_closest(monkeypatch):
    """Where no layout of a kind passes on the winner's GPUs, the line gives the split that got
    furthest (at stage 4, the most throughput) and its reason, not whichever split came first: a
    DeepSeek-R1 sweep said "no tp layout of 40 b200_sxm passes (weights ... exceed ...)" while its
    5 x TP8 servers fitted and only fell short of the arrival rate."""
    import types

    import jaxplan.plots.splits as splits
    from jaxplan.why_it_wins import why_it_wins

    def split(tp, pp, stage, why, tokens_per_s=float("-inf")):
        return {"gpu": "b200_sxm", "tensor_parallel_size": tp, "pipeline_parallel_size": pp, **kind_fields("tp", 8 // (tp * pp), "", True),
                "num_gpus": 8, "passes": False, "why": why, "why_stage": stage, "why_tokens_per_s": tokens_per_s, "score": float("-inf")}

    rows = [split(1, 1, 2, "weights exceed the HBM"), split(2, 1, 4, "cannot keep up with the arrival rate", 900.0),
            split(8, 1, 4, "cannot keep up with the arrival rate", 4100.0), split(4, 2, 4, "cannot keep up with the arrival rate", 2500.0)]
    monkeypatch.setattr(splits, "best_per_split", lambda result, num_gpus, gpus: rows if num_gpus == 8 else [])
    space = types.SimpleNamespace(layout_kind=("tp", "dp"))
    labels = {"tensor_parallel_size": (1, 2, 4, 8), "pipeline_parallel_size": (1, 2), "data_parallel_size": (1, 2, 4, 8), "layout_kind": ("tp", "dp:8")}
    workload = load_workload("chat")
    result = types.SimpleNamespace(model=load_model("deepseek-r1"), grid=types.SimpleNamespace(space=space, labels=labels), workload=workload)
    winner = {"gpu": "b200_sxm", "num_gpus": 8, "tensor_parallel_size": 1, "pipeline_parallel_size": 1, **kind_fields("dp:8", 1, "fp8", True)}
    [line] = why_it_wins(result, winner)
    assert line.startswith("dp:8 over tp: no tp layout of 8 b200_sxm passes (the one that comes closest, TP8xPP1xDP1, "), line
    asked = workload.request_rate_per_s * workload.osl_mean_tokens
    assert f"stops at stage 4 (estimate): cannot keep up with the arrival rate; its best estimate 4,100 output tok/s of the {asked:,.0f} the traffic asks for" in line, line
    assert "weights" not in line


def test_a_failing_splits_reason_is_the_closest_candidates_own():
    """GLM-5's sweep said one kind "cannot keep up with the arrival rate; its best estimate 2,400 output
    tok/s of the 2,400 the traffic asks for": the reason was the split's most common one and the
    throughput another candidate's, which met the demand and failed the TPOT SLO. At stage 4 both now
    come from the candidate estimated at the most output tokens/s; before it, the most common reason."""
    from jaxplan.funnel.reasons import Reason
    from jaxplan.plots.splits import split_failure

    reasons = np.array([Reason.OVERLOADED, Reason.OVERLOADED, Reason.TPOT_SLO, Reason.WEIGHTS_DONT_FIT, Reason.OVERLOADED])
    stages = np.array([Reason(int(r)).stage for r in reasons])
    throughput = np.array([1900.0, 2100.0, 2400.0, np.nan, 2000.0])
    assert split_failure(reasons, stages, throughput) == (4, Reason.TPOT_SLO, 2400.0)
    early = np.array([Reason.WEIGHTS_DONT_FIT, Reason.NO_CONCURRENCY, Reason.WEIGHTS_DONT_FIT])
    assert split_failure(early, np.array([2, 3, 2]), np.full(3, np.nan)) == (3, Reason.NO_CONCURRENCY, float("-inf"))
    assert split_failure(early, np.array([2, 2, 2]), np.full(3, np.nan))[1] == Reason.WEIGHTS_DONT_FIT


def test_a_best_estimate_short_of_the_demand_never_rounds_up_to_it():
    """A layout that cannot keep up with 5,000 tok/s of arrivals reaches at most just under it; the
    line read "its best estimate 5,000 output tok/s" beside "cannot keep up"."""
    from jaxplan.why_it_wins import reached_clause

    assert reached_clause(4999.7, 5000.0) == "; its best estimate 4,999 output tok/s of the 5,000 the traffic asks for"
    assert reached_clause(1234.9, None) == "; its best estimate 1,234 output tok/s"
    assert reached_clause(float("-inf"), 5000.0) == ""


def test_a_dense_plan_says_nothing_about_kinds():
    from jaxplan.why_it_wins import why_it_wins

    class Result:  # why_it_wins reads only the model and the space for a dense model
        model = load_model("llama-3.1-8b")

    assert why_it_wins(Result, {}) == []


def test_layout_kinds_option_sets_the_space():
    from jaxplan.inputs import CLI_LABELS, load_inputs

    inputs = load_inputs("gpt-oss-120b", "h200_sxm", "coding", "small", layout_kinds="tp,dp_ep")
    assert inputs.space.layout_kind == ("tp", "dp_ep")
    assert inputs.space.layout_kind_labels() == ("tp", "dp_ep:2", "dp_ep:4", "dp_ep:8")
    with pytest.raises(PlanError, match="--layout-kinds"):
        load_inputs("gpt-oss-120b", "h200_sxm", "coding", "small", layout_kinds="tp,pp", labels=CLI_LABELS)
    with pytest.raises(PlanError, match="layout_kind"):
        load_inputs("llama-3.1-8b", "h200_sxm", "coding", "small", layout_kinds=["dp_ep"])
