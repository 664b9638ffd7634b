"""`predict --method replay` says when the replay preempted, and how many running requests the KV cache
holds whole: vLLM admits a request on its prompt's KV blocks, so a batch admitted together can outgrow
the cache, and stage 4 does not price the recomputation (docs/accuracy.md, "KV-starved closed loops").

Llama-3.1-70B FP8 on one H100 leaves a KV cache of 9,184 tokens (574 blocks of 16) next to its
weights: 8 requests of 512 + 512 tokens (64 blocks each) fit whole, a ninth does not.
"""

import re

from jaxplan.prediction import predict_rows, replay_predict_rows

BURST = dict(model="llama-3.1-70b", gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
             weight_dtype="fp8", kv_cache_dtype="fp8", isl=512, osl=512, request_rate=float("inf"), num_prompts=64)
NOTE = re.compile(r"^ok; the replay preempted ([\d,]+) times \(([\d.]+) a request\): .* --max-num-seqs (\d+) or fewer would hold every request")


def test_the_status_counts_the_preemptions_and_the_batch_the_cache_holds_whole():
    rows = [dict(BURST, max_num_seqs=seqs) for seqs in (8, 9, 16)]
    replayed = replay_predict_rows(rows)
    whole = replayed[0]["kv_cache_tokens"] // (BURST["isl"] + BURST["osl"])
    assert replayed[0]["kv_cache_tokens"] == 9184 and whole == 8
    # At the batch the note names, nothing is preempted and the status is plain.
    assert replayed[0]["status"] == "ok"
    counts = []
    for row in replayed[1:]:
        match = NOTE.match(row["status"])
        assert match, row["status"]
        count = int(match.group(1).replace(",", ""))
        assert count >= 1 and float(match.group(2)) == float(f"{count / BURST['num_prompts']:.2g}")
        assert int(match.group(3)) == whole
        counts.append(count)
    # One request more than the cache holds whole preempts a little; twice as many, more.
    assert counts[0] < counts[1]
    # Stage 4 prices no preemption, and says nothing of it.
    assert all(row["status"] == "ok" for row in predict_rows(rows))


def test_simulate_prints_a_long_status_below_its_table(tmp_path):
    """`jaxplan simulate` shows a status's first word in its table and the whole status on a line of its own below."""
    from typer.testing import CliRunner

    from jaxplan.cli import app

    rows = tmp_path / "rows.csv"
    columns = [c for c in BURST if c != "request_rate"]
    rows.write_text(",".join([*columns, "request_rate", "max_num_seqs"]) + "\n" + ",".join([*(str(BURST[c]) for c in columns), "inf", "16"]) + "\n")
    result = CliRunner().invoke(app, ["simulate", str(rows)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    note = [line for line in lines if line.startswith("row 1: ")]
    assert len(note) == 1 and NOTE.match(note[0].removeprefix("row 1: ")), result.output
    assert any("ok (below)" in line for line in lines) and not any("preempted" in line for line in lines if "│" in line)


def test_without_the_prefix_cache_a_victim_recomputes_everything():
    """`enable_prefix_caching` false (vLLM's --no-enable-prefix-caching): the same preemptions cost more,
    since a readmitted request finds none of its blocks; a stated prefix hit needs the cache."""
    import pytest

    from jaxplan.calibrate.rows import make_row
    from jaxplan.errors import PlanError

    cached, uncached = replay_predict_rows([dict(BURST, max_num_seqs=16), dict(BURST, max_num_seqs=16, enable_prefix_caching=False)])
    assert NOTE.match(cached["status"]) and NOTE.match(uncached["status"])
    assert uncached["output_tok_s"] < cached["output_tok_s"]
    with pytest.raises(PlanError, match="prefix_hit_rate.*enable_prefix_caching"):
        make_row(**dict(BURST, enable_prefix_caching=False, prefix_hit_rate=0.5))
