"""`jaxplan report`: one self-contained HTML file with every section, embedded figures, no external URLs."""

from __future__ import annotations

import base64
import re
import struct

import pytest
from typer.testing import CliRunner

from jaxplan.cli import app
from jaxplan.plots import style
from jaxplan.report.html import SECTIONS

SMALL = ["--model", "llama-3.1-8b", "--gpus", "h100_sxm", "--workload", "chat", "--space", "small", "--top", "3"]
IMG = re.compile(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def report(runner, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    # --timelines = --top: the timelines' replay has the shapes stage 7 compiled, so it does not recompile
    res = runner.invoke(app, ["report", *SMALL, "--replay-requests", "40", "--timelines", "3", "-o", str(path)])
    return res, path


def test_report_runs_and_writes_one_file(report):
    res, path = report
    assert res.exit_code == 0, res.output
    assert f"wrote {path}" in res.stdout.replace("\n", "")
    assert path.stat().st_size > 50_000


def test_report_has_every_section_and_the_inputs(report):
    _, path = report
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for sid, _ in SECTIONS:
        assert f'<section id="{sid}">' in text, sid
    for fig in ("funnel", "frontier", "splits", "timeline_1", "timeline_2", "timeline_3", "tornado"):
        assert f'id="fig-{fig}"' in text, fig
    assert "<code>vllm serve meta-llama/Llama-3.1-8B" in text and "--tensor-parallel-size" in text
    for needle in ("llama-3.1-8b", "h100_sxm", "chat:", "small:", "max_num_batched_tokens", "Re-ranked by the replay"):
        assert needle in text, needle


def test_report_is_self_contained(report):
    _, path = report
    text = path.read_text()
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text.lower() and "<link" not in text.lower() and "@import" not in text
    assert re.findall(r'src="([^"]*)"', text) and all(src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', text))


def test_report_figures_are_valid_pngs(report):
    _, path = report
    images = IMG.findall(path.read_text())
    assert len(images) == 7
    for data in images:
        png = base64.b64decode(data)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, _ = struct.unpack(">II", png[16:24])
        assert width == style.PIXELS[0]


def test_report_without_replay_says_so(runner, tmp_path):
    path = tmp_path / "r.html"
    res = runner.invoke(app, ["report", *SMALL, "--no-replay", "-o", str(path), "--plot", str(tmp_path / "figs"), "--winner-map", "isl=1000:8000:2,rate=1:4:2"])
    assert res.exit_code == 0, res.output
    text = path.read_text()
    assert '<section id="timelines">' in text and "did not run" in text and 'id="fig-timeline_1"' not in text
    assert "Ranked by stage 4" in text
    assert 'id="winner-map"' in text  # --winner-map adds its section
    names = ("funnel", "frontier", "splits", "tornado", "winner_map")
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == sorted(f"{n}.{e}" for n in names for e in ("png", "svg"))


def test_report_bad_output_is_one_line(runner, tmp_path):
    res = runner.invoke(app, ["report", *SMALL, "--no-replay", "-o", str(tmp_path / "missing" / "r.html")])
    assert res.exit_code == 1
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "does not exist" in lines[0]


def test_render_escapes_and_omits_missing_figures(report):
    from jaxplan.report.html import _figure, _table

    assert "No funnel figure" in _figure({}, "funnel", "caption")
    assert "&lt;b&gt;" in _table(["a"], [["<b>"]])


def test_the_winner_section_warns_when_the_replay_misses_the_workload():
    from jaxplan.report.html import _winner

    winner = dict(num_gpus=2, gpu="h100_sxm", tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=1, max_num_seqs=256,
                  max_num_batched_tokens=512, weight_dtype="fp8", kv_cache_dtype="fp8", kv_cache_check="Check: vLLM should log x",
                  output_tokens_per_s=5272.0, ttft_p99_s=4.0, tpot_p99_s=0.05, hourly_usd=8.0, cost_per_million_output_tokens_usd=0.4,
                  replay_output_tokens_per_s=4861.0, replay_ttft_p99_s=8.0, replay_tpot_p99_s=0.055, replay_slo_attainment=1.0,
                  vllm_serve="vllm serve m", replay_shortfalls=["4,861 output tok/s < target 5,000"])
    html = _winner({"winner": winner})
    assert "no finalist meets the workload" in html and "4,861 output tok/s &lt; target 5,000" in html
    assert "no finalist meets" not in _winner({"winner": dict(winner, replay_shortfalls=[])})
