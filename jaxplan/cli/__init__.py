"""The `jaxplan` command line (typer). Bad input: one line on stderr, exit code 1 (a usage error: 2), no traceback.

One module per command; importing them registers the commands on `app`.
"""

import sys

# Importing a command module registers its command; the order here is the order in --help.
from jaxplan.cli import sweep  # noqa: F401,I001
from jaxplan.cli import sensitivity  # noqa: F401
from jaxplan.cli import size  # noqa: F401
from jaxplan.cli import report  # noqa: F401
from jaxplan.cli import predict  # noqa: F401
from jaxplan.cli import calibrate  # noqa: F401
from jaxplan.cli import listing  # noqa: F401
from jaxplan.cli.common import app
from jaxplan.compile_cache import enable as enable_compilation_cache
from jaxplan.cpu_devices import enable as enable_cpu_devices


def main() -> None:
    enable_compilation_cache()  # compiled kernels persist across runs (JAXPLAN_CACHE_DIR=off: not)
    enable_cpu_devices()  # one XLA CPU device per core (JAXPLAN_CPU_DEVICES=1: one in all)
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as error:  # typer's usage errors (its vendored click's): one line, not a box
        if not (hasattr(error, "format_message") and hasattr(error, "exit_code")):
            raise
        ctx = getattr(error, "ctx", None)
        path = ctx.command_path if ctx is not None else "jaxplan"
        message = " ".join(str(error.format_message()).split())
        print(f"error: {message} (see '{path} --help')", file=sys.stderr)
        sys.exit(error.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
