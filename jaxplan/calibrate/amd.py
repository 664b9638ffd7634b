"""The AMD GPUs' per-GPU fit on the InferenceMAX vLLM rows, its held-out checks, and its TOML.

`python -m jaxplan.calibrate.amd [-o PATH]` fits MI300X and MI355X on their own rows (the bundled
calibration's serving fit, `run.serving_fit`, one parameter vector per GPU, from DEFAULTS: no kernel
tables exist for AMD GPUs) and writes a calibration TOML with a [gpu.<name>] table for each, plus
MI325X, which has no rows: it takes MI300X's fitted values (the same CDNA 3 compute die, HBM3E instead
of HBM3, and the same ROCm vLLM image in the runs). Default output:
jaxplan/configs/calibration/amd.toml, a file `--params` reads and the bundled fit can absorb.

Held-out protocols (`held_out`): leave-one-GPU-out between the two measured GPUs (fit one, predict
the other with its values: efficiencies are fractions of each GPU's own spec peaks), and
leave-one-ISL/OSL-out per GPU (fit on two of the three length pairs, predict the third).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxplan.calibrate import fit
from jaxplan.calibrate.inferencemax import INFERENCEMAX_AMD, load_inferencemax_rows
from jaxplan.calibrate.run import accuracy, calibration_priors, serving_fit, trained_mask, write_params
from jaxplan.physics.params import DEFAULTS

FITTED_GPUS = ("mi300x", "mi355x")
SAME_SILICON = {"mi325x": "mi300x"}  # GPU without rows -> the fitted GPU whose values it takes
OUTPUT = Path(__file__).resolve().parents[1] / "configs" / "calibration" / "amd.toml"


def length_pair(row: dict) -> str:
    """The nominal ISL/OSL of an InferenceMAX row (its lengths are 0.9 x nominal on average)."""
    from jaxplan.calibrate.inferencemax import LENGTH_MEAN_FRACTION

    return f"{round(row['isl'] / LENGTH_MEAN_FRACTION)}/{round(row['osl'] / LENGTH_MEAN_FRACTION)}"


def fit_amd(rows: list[dict], train: list[dict] | None = None, priors: dict | None = None) -> dict[str, dict[str, float]]:
    """GPU -> complete parameters (DEFAULTS, priors, fitted fields) of a per-GPU fit on `train` (default:
    `rows` whose KV cache holds their clients, `run.trained_mask`); every fit shares one program."""
    priors = priors or calibration_priors(FITTED_GPUS)[0]
    everything = [r for r, keep in zip(rows, trained_mask(rows, priors)) if keep]
    gpus, z, _ = serving_fit(everything if train is None else train, priors, gpus=list(FITTED_GPUS), like=everything)
    return {g: {**DEFAULTS, **priors[g], **fit.values_of(vector)} for g, vector in zip(gpus, z)}


def held_out(rows: list[dict]) -> dict[str, dict]:
    """"logo/<gpu>" and "lengths/<gpu>/<isl>/<osl>" -> `run.accuracy` of the held-out rows."""
    priors = calibration_priors(FITTED_GPUS)[0]
    train = [r for r, keep in zip(rows, trained_mask(rows, priors)) if keep]
    out = {}
    for held in FITTED_GPUS:
        other = next(g for g in FITTED_GPUS if g != held)
        values = fit_amd(rows, [r for r in train if r["gpu"] == other], priors)[other]
        out[f"logo/{held}"] = accuracy([r for r in rows if r["gpu"] == held], {held: values})
    for pair in sorted({length_pair(r) for r in rows}):
        params = fit_amd(rows, [r for r in train if length_pair(r) != pair], priors)
        for gpu in FITTED_GPUS:
            out[f"lengths/{gpu}/{pair}"] = accuracy([r for r in rows if r["gpu"] == gpu and length_pair(r) == pair], {gpu: params[gpu]})
    return out


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m jaxplan.calibrate.amd", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    parser.add_argument("--data-root", default=None, help="the measured-data folder (default: $JAXPLAN_SHARED_DATA or ../shared/data)")
    args = parser.parse_args(argv)
    rows = load_inferencemax_rows(args.data_root)
    params = fit_amd(rows)
    for gpu, source in SAME_SILICON.items():
        params[gpu] = dict(params[source])
    for gpu in FITTED_GPUS:
        scores = accuracy([r for r in rows if r["gpu"] == gpu], params)
        print(f"{gpu}: in sample, {scores['rows']} rows: TTFT MAPE {scores['ttft_mape']:.1%}, TPOT MAPE {scores['tpot_mape']:.1%}")
    record = {
        "command": "python -m jaxplan.calibrate.amd", "data": [f"shared/data: {INFERENCEMAX_AMD}"],
        "fit_rows": len(rows), "fitted": list(FITTED_GPUS), "same_silicon": [f"{g} = {s}" for g, s in SAME_SILICON.items()],
    }
    return write_params(params, args.output, record, {g: DEFAULTS for g in FITTED_GPUS})


if __name__ == "__main__":
    print(main())
