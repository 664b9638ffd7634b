"""Where the measured data lives, and the optional pyarrow import.

The measured data sets are not shipped with jaxplan. They sit in a folder
next to the repository (`<repo>/../shared/data`); `JAXPLAN_SHARED_DATA`
points elsewhere. Every loader takes `data_root=None` meaning "that default".
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from jaxplan.errors import PlanError

ENV_VAR = "JAXPLAN_SHARED_DATA"


def default_data_root() -> Path:
    """`$JAXPLAN_SHARED_DATA`, else `<repo>/../shared/data` (may not exist)."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def data_root_exists(data_root: str | Path | None = None) -> bool:
    """True when the data folder is there (tests use this to skip)."""
    root = Path(data_root) if data_root is not None else default_data_root()
    return root.is_dir()


def resolve_root(data_root: str | Path | None) -> Path:
    """The data folder, or a one-line PlanError saying how to point at it."""
    root = Path(data_root).expanduser() if data_root is not None else default_data_root()
    if not root.is_dir():
        raise PlanError(
            f"measured-data folder {str(root)!r} does not exist; set {ENV_VAR} to the folder that holds "
            "kernels_aiconfigurator/, e2e_aiconfigurator_silicon/, ... (or pass data_root=)"
        )
    return root


def require_file(path: Path) -> Path:
    if not path.is_file():
        raise PlanError(f"measured-data file {str(path)!r} is missing; re-fetch the data set (see its SOURCE.txt)")
    return path


def import_pyarrow_parquet():
    """`pyarrow.parquet`, imported lazily so jaxplan imports without pyarrow."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PlanError("reading the kernel tables needs pyarrow: run `pip install pyarrow` (or `pip install jaxplan[test]`)") from None
    return pq


def version_key(text: str) -> tuple:
    """Sort key for version strings like '0.24.0', '2.27.3', '1.2.0rc6' (numeric parts compare as numbers)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"[.\-+]", text) if part)
