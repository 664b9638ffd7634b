"""The exit codes of every `jaxplan` command, defined once, and the typer group that applies them.

A script can branch on the code alone: 0 it ran, 1 the input is wrong (fix the command line or a
file), 2 the input is fine but no configuration survived the funnel (relax the SLOs or the space),
3 the time limit (--max-seconds) stopped or refused the job (raise it or shrink the job), 70 a bug.
"""

from __future__ import annotations

import enum
import sys

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError  # typer vendors click; pinned <0.30 in pyproject
from typer.core import TyperGroup

from jaxplan.errors import NothingSurvived, PlanError, TimeLimitExceeded


MAX_USAGE_CHARS = 800


class ExitCode(enum.IntEnum):
    OK = 0
    BAD_INPUT = 1  # a PlanError, an unreadable file, or a command-line usage error
    NOTHING_SURVIVED = 2  # the funnel ran and left no configuration
    TIME_LIMIT = 3  # --max-seconds stopped the job, or refused it up front from its estimate
    INTERNAL_ERROR = 70  # a bug in jaxplan (sysexits.h's EX_SOFTWARE, so no planning outcome is mistaken for it)
    INTERRUPTED = 130  # Ctrl-C, the shell's convention (128 + SIGINT)


EPILOG = (
    "Exit codes: 0 success; 1 bad input (a usage error included); 2 nothing survived the funnel; "
    "3 stopped or refused by --max-seconds; 70 internal error (a bug in jaxplan)."
)


def exit_code_for(error: PlanError) -> ExitCode:
    """The exit code of a PlanError: its subclass says whether the input or the outcome is at fault."""
    if isinstance(error, TimeLimitExceeded):
        return ExitCode.TIME_LIMIT
    if isinstance(error, NothingSurvived):
        return ExitCode.NOTHING_SURVIVED
    return ExitCode.BAD_INPUT


class ExitCodeGroup(TyperGroup):
    """The `jaxplan` group: every command's --help ends with the exit codes, and a usage error
    (unknown option, bad option value) is one stderr line and exit 1, as any other bad input is,
    not click's box and exit 2, which here means "nothing survived"."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epilog = self.epilog or EPILOG
        for command in self.commands.values():
            command.epilog = command.epilog or EPILOG

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as error:  # `jaxplan` alone: the help (rich prints it while building the error), not an error
            if error.format_message().strip():
                print(error.format_message())
            sys.exit(ExitCode.OK)
        except ClickException as error:
            ctx = getattr(error, "ctx", None)
            path = ctx.command_path if ctx is not None else "jaxplan"
            message = " ".join(str(error.format_message()).split())
            if len(message) > MAX_USAGE_CHARS:  # click quotes the value given, which may be megabytes
                message = f"{message[:MAX_USAGE_CHARS // 2]} ... ({len(message):,} chars) ... {message[-MAX_USAGE_CHARS // 4:]}"
            print(f"error: {message} (see '{path} --help')", file=sys.stderr)
            sys.exit(ExitCode.BAD_INPUT)
        except (typer.Abort, KeyboardInterrupt):
            print("error: interrupted", file=sys.stderr)
            sys.exit(ExitCode.INTERRUPTED)
        sys.exit(code if isinstance(code, int) else ExitCode.OK)
