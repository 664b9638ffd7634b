"""Winner map: stages 1-4 of the funnel over a grid of workload scenarios, one compiled pass.

The question is not "which configuration wins for this traffic" but "for which traffic does it
keep winning": the grid of candidates is streamed once, in chunks, and every chunk is evaluated
for every scenario (ISL x OSL, hit rate x rate, ...) inside the same jitted kernel:

The kernel is the sweep's own (`funnel/chunk.py: survivor_pages`), given a stacked batch of
scenario workloads instead of one:

* per chunk, the digits are decoded and stage 1's workload-independent checks (TP/PP divisibility,
  node fit, FP8, vLLM's rules) run once on the DP-less configurations [Co];
* vmapped over the scenario axis, stages 2-3 and the demand-independent part of stage 4 run on
  [S, Co]; the GPU budget keeps a prefix of each row's DP values;
* the survivors of all scenarios are paged through the rest of stage 4 together, each survivor
  under its own scenario's workload (WorkloadParams fields gathered per survivor: the physics is
  elementwise);
* each scenario keeps a streaming per-layout best table ([S x layouts]: the best score of every
  (GPU, TP, PP, DP) layout and its knobs packed into one int32), so memory is bounded by the chunk
  x S and S x layouts, never by the grid. Ties go to the lowest grid index, as in the sweep.

"Winner" is the sweep's own objective (`funnel.estimate.objective`, through stage 4's score): for a
scenario equal to the sweep's workload, the winner and runner-up are the sweep's stage-4 shortlist
rows 1 and 2. The margin is exp(score_winner - score_runner_up) - 1: the objective is a log, so
this is the winner's relative advantage in its natural unit (output tokens per dollar, or, with a
throughput target, 1 / USD per hour), e.g. 0.25 = the runner-up is 25% worse. The runner-up is the
best *other layout* (another (GPU, TP, PP, DP)), not the same layout with other knobs.

The current workload is evaluated as one extra scenario and marked on the map (nearest cell).
"""

from __future__ import annotations

from jaxplan.winner_map.axes import (
    ALIASES,
    AXIS_FIELDS,
    MAX_AXES,
    MAX_VALUES_PER_AXIS,
    ScenarioAxis,
    axis_label,
    current_value,
    parse_axes,
    scenario_grid,
    scenario_workload,
    stacked_params,
)
from jaxplan.winner_map.driver import MAX_SCENARIOS, MAX_TABLE_BYTES, rows_under, winner_map
from jaxplan.winner_map.kernel import DEFAULT_CHUNK, DEFAULT_PAGE, map_chunk, stream_scenarios, top_two
from jaxplan.winner_map.result import WinnerMap, WinnerPlane, layout_label
from jaxplan.winner_map.tables import map_tables, summary_lines

__all__ = [
    "ALIASES", "AXIS_FIELDS", "DEFAULT_CHUNK", "DEFAULT_PAGE", "MAX_AXES", "MAX_SCENARIOS", "MAX_TABLE_BYTES",
    "MAX_VALUES_PER_AXIS", "ScenarioAxis", "WinnerMap", "WinnerPlane", "axis_label", "current_value", "layout_label",
    "map_chunk", "map_tables", "parse_axes", "rows_under", "scenario_grid", "scenario_workload", "stacked_params",
    "stream_scenarios", "summary_lines", "top_two", "winner_map",
]
