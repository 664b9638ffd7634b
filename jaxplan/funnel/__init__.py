"""The funnel: stages 1-6 as pure batched functions, streamed over the grid."""

from jaxplan.funnel.reasons import Reason as Reason
from jaxplan.funnel.sweep import SweepResult as SweepResult, run_sweep as run_sweep
