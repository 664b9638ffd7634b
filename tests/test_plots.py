"""Figures (--plot): every figure from a small sweep is a PNG of the set size and a parseable SVG,
fonts are slide-sized, the timeline's reconstruction is exact where it can be checked, and the
CLI writes the files (or fails in one line)."""

from __future__ import annotations

import struct
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from typer.testing import CliRunner

from jaxplan.cli import app
from jaxplan.errors import PlanError
from jaxplan.funnel import run_sweep
from jaxplan.funnel.replay_stage import replay_rows
from jaxplan.plots import style
from jaxplan.plots.save import plot_dir, save
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SMALL = ["--model", "llama-3.1-8b", "--gpus", "h100_sxm", "--workload", "chat", "--space", "small", "--top", "3"]


@pytest.fixture(scope="module")
def result():
    return run_sweep(load_model("llama-3.1-8b"), parse_gpu_list("h100_sxm"), load_workload("chat"), load_space("small"), top_k=3)


@pytest.fixture(scope="module")
def replayed(result):
    return replay_rows(result, result.shortlist[:2], num_requests=40)


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def check_written(paths, name: str, size=style.PIXELS) -> None:
    png, svg = paths
    assert png.name == f"{name}.png" and svg.name == f"{name}.svg"
    assert png.stat().st_size > 10_000  # a drawn figure, not an empty canvas
    assert png_size(png) == size
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert len(list(root.iter())) > 50  # drawn elements, not an empty document


def check_fonts(fig) -> None:
    from matplotlib.text import Text

    texts = [t for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]
    assert texts
    small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < style.MIN_FONT_PT]
    assert not small, small


def test_funnel_figure(result, replayed, tmp_path):
    from jaxplan.plots.funnel import funnel_figure

    fig = funnel_figure(result, (len(replayed), 40, 1.5))
    check_fonts(fig)
    left, right = fig.axes[:2]
    assert left.get_yscale() == "log"
    heights = [p.get_height() for p in left.patches]
    assert heights[0] == result.grid.size and len(heights) == 1 + len(result.stages) + 1  # grid, stages 1-6, replay
    assert "7 replay" in [t.get_text() for t in right.get_yticklabels()]
    check_written(save(fig, tmp_path, "funnel"), "funnel")


def test_frontier_figure_labels_finalists_by_layout(result, tmp_path):
    from jaxplan.plots.frontier import frontier_figure
    from jaxplan.plots.labels import layout_label

    fig = frontier_figure(result.frontier, result.shortlist)
    check_fonts(fig)
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert f"#1 {layout_label(result.shortlist[0])}" in texts
    assert layout_label(result.shortlist[0]).startswith("H100 TP")
    assert [ax.get_xscale() for ax in fig.axes[:2]] == ["log", "log"]
    assert "TPOT" in fig.axes[0].get_xlabel() and "TTFT" in fig.axes[1].get_xlabel() and "ms" in fig.axes[0].get_xlabel()
    check_written(save(fig, tmp_path, "frontier"), "frontier")


def test_pareto_mask():
    from jaxplan.plots.frontier import pareto_mask

    x = np.array([1.0, 2.0, 2.0, 3.0, 4.0])
    y = np.array([1.0, 3.0, 2.0, 2.5, 4.0])
    assert pareto_mask(x, y).tolist() == [True, True, False, False, True]
    assert pareto_mask(np.array([]), np.array([])).tolist() == []


def test_best_per_split_agrees_with_the_shortlist(result, tmp_path):
    from jaxplan.plots.splits import best_per_split, splits_figure

    winner = result.shortlist[0]
    rows = best_per_split(result, winner["num_gpus"])
    assert rows and all(r["tensor_parallel_size"] * r["pipeline_parallel_size"] * r["data_parallel_size"] == winner["num_gpus"] for r in rows)
    splits = {(r["tensor_parallel_size"], r["pipeline_parallel_size"], r["data_parallel_size"]) for r in rows}
    assert len(splits) == len(rows)  # one row per split
    # Stage 6 keeps the best candidate per layout: for the winner's layout it must be the same one.
    same = [r for r in rows if r["passes"] and r["digits"][:3] == winner["digits"][:3] and r["data_parallel_size"] == winner["data_parallel_size"]]
    assert len(same) == 1 and same[0]["digits"] == winner["digits"]
    assert rows[0]["score"] == pytest.approx(winner["score"])  # the winner is the best split at its GPU count
    assert all(r["why"] for r in rows if not r["passes"])
    fig = splits_figure(rows, result.workload, highlight=winner)
    check_fonts(fig)
    check_written(save(fig, tmp_path, "splits"), "splits", size=(style.PIXELS[0], round(fig.get_figheight() * style.DPI)))


def fake_trace(**fields):
    """A ReplayTrace-like record with just the fields the timeline reads (one finalist)."""
    from typing import NamedTuple

    names = ("arrival_s", "admit_s", "ttft_s", "e2e_s", "replica", "prompt_tokens", "output_tokens", "replica_active", "replica_clock_s", "replica_peak_kv_blocks", "num_kv_blocks")
    Trace = NamedTuple("Trace", [(n, object) for n in names])
    return Trace(**{n: np.asarray(fields[n]) for n in names})


def test_timeline_of_one_known_request():
    from jaxplan.replay.timeline import timeline

    # arrives at 0, admitted at 1, first token at 1.5, last (4th) token at 6; the replay ends at 10
    trace = fake_trace(arrival_s=[[0.0]], admit_s=[[1.0]], ttft_s=[[1.5]], e2e_s=[[6.0]], replica=[[0]], prompt_tokens=[160], output_tokens=[4],
                       replica_active=[[True]], replica_clock_s=[[10.0]], replica_peak_kv_blocks=[[11]], num_kv_blocks=[100])
    tl = timeline(trace, points=10, block_size=16)  # bins of 1 s, centres 0.5 .. 9.5
    np.testing.assert_allclose(tl.time_s[0], np.arange(10) + 0.5)
    np.testing.assert_allclose(tl.queue_length[0], [1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(tl.running[0], [0, 1, 1, 1, 1, 1, 0, 0, 0, 0])
    # KV grows linearly from 160 to 164 tokens over [1, 6): at 3.5 s, 160 + 4 * 2.5 / 5 = 162 tokens
    np.testing.assert_allclose(tl.kv_utilization[0, 3], (162 / 16 + 0.5) / 100)
    # 1 token at 1.5 s, then 3 tokens evenly over [1.5, 6] (2/3 per s): bin 1 gets 1 + 1/3, bins 2..5 2/3 each
    np.testing.assert_allclose(tl.output_tokens_per_s[0], [0, 4 / 3, 2 / 3, 2 / 3, 2 / 3, 2 / 3, 0, 0, 0, 0])
    assert tl.output_tokens_per_s.sum() == pytest.approx(4.0)


def test_timeline_matches_brute_force_and_replay_metrics(result):
    from jaxplan.plots.traces import sweep_traces
    from jaxplan.replay import summarize
    from jaxplan.replay.timeline import timeline

    trace, block_size = sweep_traces(result, result.shortlist[:2], num_requests=40)  # the shapes of `replayed`: no recompile
    tl = timeline(trace, points=50, block_size=block_size)
    metrics = summarize(trace, result.workload)
    # the bin-averaged output rate integrates to the replay's own throughput
    np.testing.assert_allclose(tl.output_tokens_per_s.mean(axis=1), np.asarray(metrics.output_tokens_per_s), rtol=1e-4)
    for f in range(2):
        t = tl.time_s[f][:, None]
        arrival = np.asarray(trace.arrival_s[f], float)
        admit = np.asarray(trace.admit_s[f], float)
        finish = np.where(np.isfinite(np.asarray(trace.e2e_s[f])), arrival + np.asarray(trace.e2e_s[f], float), np.inf)
        running = np.sum((admit <= t) & (t < finish), axis=1)  # [P] by brute force over [P, R]
        queued = np.sum(arrival <= t, axis=1) - np.sum(admit <= t, axis=1)
        np.testing.assert_allclose(tl.running[f], running)
        np.testing.assert_allclose(tl.queue_length[f], queued)
        assert np.all(tl.kv_utilization[f] >= 0) and tl.kv_utilization[f].max() <= 1.0 + 1e-6


def test_timeline_figures(result, replayed, tmp_path):
    from jaxplan.plots.figures import timeline_figures

    figures = timeline_figures(result, replayed, num_requests=40, seed=0)
    assert list(figures) == ["timeline_1", "timeline_2"]
    fig = figures["timeline_1"]
    check_fonts(fig)
    assert len(fig.axes) == 4 and all(ax.lines for ax in fig.axes)
    assert all(ax.get_ylabel() for ax in fig.axes)
    assert "TP" in fig._suptitle.get_text()
    check_written(save(fig, tmp_path, "timeline_1"), "timeline_1")


def test_tornado_sorted_by_magnitude(result, tmp_path):
    from jaxplan.plots.figures import sensitivity_figures
    from jaxplan.elasticity import for_rows

    sens = for_rows(result, result.shortlist)
    fig = sensitivity_figures(sens, result.shortlist)["tornado"]
    check_fonts(fig)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == len(sens.metrics)
    for m, ax in enumerate(panels):
        widths = [abs(p.get_width()) for p in ax.patches]
        assert widths == sorted(widths)  # barh draws bottom-up: the largest is on top
        np.testing.assert_allclose(sorted(widths), sorted(np.abs(sens.elasticity[0, m])), atol=1e-6)
    check_written(save(fig, tmp_path, "tornado"), "tornado")


def test_winner_map_heat_map_synthetic(tmp_path):
    from jaxplan.plots.sensitivity import winner_map_figure

    x, y = np.geomspace(1, 32, 6), np.array([1000, 2000, 4000, 8000])
    labels = np.array([["H200 TP1xPP2xDP5" if i < 3 else "H100 TP2xPP2xDP3" for i in range(6)] for _ in range(4)], dtype=object)
    labels[0, 0] = ""  # nothing passes there
    margin = np.linspace(0, 0.5, 24).reshape(4, 6)
    margin[1, 1] = np.nan  # no runner-up
    fig = winner_map_figure("arrival rate (requests/s)", x, "mean ISL (prompt tokens)", y, labels, margin, current=(8, 8000), title="Winner map (synthetic)")
    check_fonts(fig)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"2: H200 TP1xPP2xDP5", "1: H100 TP2xPP2xDP3", "nothing passes", "current workload"} <= set(legend)  # numbered by cells won
    cells = [t.get_text() for t in ax.texts]
    assert "none" in cells and "2: only" in cells and "1: +50%" in cells  # the legend number names the winner
    check_written(save(fig, tmp_path, "winner_map"), "winner_map")
    with pytest.raises(ValueError):
        winner_map_figure("x", x, "y", y, labels[:2], margin, None, "bad shape")


def test_plot_dir_rejects_a_file_and_an_unwritable_dir(tmp_path):
    a_file = tmp_path / "figures.png"
    a_file.write_text("x")
    with pytest.raises(PlanError, match="--plot"):
        plot_dir(a_file)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not __import__("os").access(locked, __import__("os").W_OK):  # root can write anyway
            with pytest.raises(PlanError, match="not writable"):
                plot_dir(locked)
    finally:
        locked.chmod(0o700)
    assert plot_dir(tmp_path / "new" / "dir").is_dir()


def test_cli_without_plot_does_not_import_matplotlib():
    code = "import sys, jaxplan.cli, jaxplan.plots.figures, jaxplan.report.html; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_sweep_plot_cli(runner, tmp_path):
    out = tmp_path / "figs"
    res = runner.invoke(app, ["sweep", *SMALL, "--no-replay", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(f"{n}.{ext}" for n in ("funnel", "frontier", "splits") for ext in ("png", "svg"))
    assert png_size(out / "funnel.png") == style.PIXELS
    assert "wrote 3 figures" in res.stdout


def test_sweep_plot_cli_bad_dir_is_one_line(runner, tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    res = runner.invoke(app, ["sweep", *SMALL, "--no-replay", "--plot", str(a_file)])
    assert res.exit_code in (1, 2)  # typer's own check (file_okay=False) or ours
    assert "Traceback" not in res.output


def test_simulate_and_sensitivity_plot_cli(runner, tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text("model,gpu,tensor_parallel_size,isl,osl,request_rate,num_prompts\nllama-3.1-8b,h100_sxm,1,500,50,4,30\n")
    res = runner.invoke(app, ["simulate", str(csv), "--plot", str(tmp_path / "sim")])
    assert res.exit_code == 0, res.output
    assert png_size(tmp_path / "sim" / "timeline_row1.png") == style.PIXELS
    ET.parse(tmp_path / "sim" / "timeline_row1.svg")
    res = runner.invoke(app, ["sensitivity", *SMALL, "--plot", str(tmp_path / "sens")])
    assert res.exit_code == 0, res.output
    assert png_size(tmp_path / "sens" / "tornado.png") == style.PIXELS
