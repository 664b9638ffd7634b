"""Figures for slides and reports (matplotlib, Agg, no pyplot state): PNG + SVG under `--plot DIR`.

style.py     the look (Okabe-Ito palette, fonts >= 11 pt, 1200 x 675 px)
save.py      writing PNG/SVG files, or bytes for the HTML report
labels.py    short GPU and layout labels ("H200 TP4xPP1xDP2")
annotate.py  non-overlapping point labels
funnel.py    candidates per stage and time per stage
frontier.py  throughput per GPU vs p99 TPOT / TTFT, Pareto front, finalists labelled
splits.py    the best configuration of each TP x PP x DP split at one GPU count
timeline.py  a finalist's replay over time (batch, KV cache, queue, output tokens/s)
sensitivity.py  tornado chart of elasticities; the winner map as a heat map
traces.py    replay traces for the timelines (stage 7 / simulate keep summaries only)
figures.py   which figures each command draws, and writing them

matplotlib is imported only inside these modules, so commands without --plot never load it.
"""
