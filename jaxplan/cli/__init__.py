"""The `jaxplan` command line (typer). Bad input: one line on stderr, exit code 1, no traceback; every
exit code is defined once in `jaxplan.cli.exit_codes`.

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
from jaxplan.cli import hosts
from jaxplan.cli.common import app, say_error
from jaxplan.cli.exit_codes import ExitCode
from jaxplan.compile_cache import enable as enable_compilation_cache
from jaxplan.cpu_devices import enable as enable_cpu_devices
from jaxplan.program_cache import enable as enable_program_cache
from jaxplan.errors import PlanError
from jaxplan.python_gc import collect_less, no_collections_at_exit


def main() -> None:
    collect_less()  # a command traces large programs: far fewer garbage collections (jaxplan/python_gc.py)
    no_collections_at_exit()  # nor the full ones over everything at the interpreter's exit
    # compiled kernels persist across runs (JAXPLAN_CACHE_DIR=off: not), the large ones whole, so a warm
    # run skips their tracing too (jaxplan/program_cache.py)
    enable_program_cache(enable_compilation_cache())
    enable_cpu_devices()  # one XLA CPU device per core (JAXPLAN_CPU_DEVICES=1: one in all)
    if hosts.command_sweeps(sys.argv):
        try:
            hosts.initialize()  # several hosts for one sweep: $JAXPLAN_COORDINATOR, see jaxplan/cli/hosts.py
        except PlanError as error:
            say_error(str(error))
            raise SystemExit(ExitCode.BAD_INPUT) from None
    try:
        app()  # exits with an ExitCode (jaxplan.cli.exit_codes), usage errors included
    except (SystemExit, KeyboardInterrupt) as stop:
        code = stop.code if isinstance(stop, SystemExit) else ExitCode.INTERRUPTED
        if code not in (0, None):
            hosts.abandon(f"exit code {code}")  # with several hosts, the others stop waiting for this one
        raise


__all__ = ["app", "main"]
