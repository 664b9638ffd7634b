"""Write figures: PNG and SVG files in a --plot directory, or bytes for the HTML report."""

from __future__ import annotations

import io
import os
from pathlib import Path

from jaxplan.errors import bad_value
from jaxplan.plots.style import DPI, styled


def plot_dir(path: Path | str) -> Path:
    """The --plot directory, created if needed; a PlanError if it cannot be written."""
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise bad_value("--plot", str(path), "is a file; give a directory for the PNG and SVG figures")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise bad_value("--plot", str(path), f"cannot create the directory ({error.strerror or error})") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise bad_value("--plot", str(path), "the directory is not writable; pick another one")
    return directory


def save(fig, directory: Path | str, name: str) -> list[Path]:
    """Write `name.png` and `name.svg` under `directory` (checked with plot_dir); returns both paths."""
    directory = plot_dir(directory)
    paths = [directory / f"{name}.png", directory / f"{name}.svg"]
    with styled():
        for path in paths:
            try:
                fig.savefig(path, dpi=DPI, metadata=_metadata(path.suffix))
            except OSError as error:
                raise bad_value("--plot", str(path), f"cannot write the figure ({error.strerror or error})") from None
    return paths


def png_bytes(fig) -> bytes:
    with styled():
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=DPI, metadata=_metadata(".png"))
    return buffer.getvalue()


def svg_text(fig) -> str:
    with styled():
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata=_metadata(".svg"))
    return buffer.getvalue()


def _metadata(suffix: str) -> dict:
    # No creation date: the same inputs give byte-identical files.
    return {"Software": "jaxplan"} if suffix == ".png" else {"Creator": "jaxplan", "Date": None}
