"""The garbage collector's thresholds: raised by the command line, left alone by the library."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from jaxplan.python_gc import THRESHOLDS, collect_less


def test_collect_less_raises_each_threshold_and_keeps_a_higher_one():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        collect_less()
        assert gc.get_threshold() == THRESHOLDS
        gc.set_threshold(THRESHOLDS[0] * 4, 5, THRESHOLDS[2] * 2)
        collect_less()
        assert gc.get_threshold() == (THRESHOLDS[0] * 4, THRESHOLDS[1], THRESHOLDS[2] * 2)
    finally:
        gc.set_threshold(*before)


def test_the_command_line_collects_less_and_importing_the_library_does_not():
    """A fresh interpreter: the thresholds after importing the API and the CLI, then inside a command."""
    script = """
import gc, json, sys
seen = {"bare": gc.get_threshold()}
import jaxplan.api, jaxplan.cli
seen["imported"] = gc.get_threshold()
sys.argv = ["jaxplan", "list"]
try:
    jaxplan.cli.main()
except SystemExit:
    pass
seen["command"] = gc.get_threshold()
print("THRESHOLDS" + json.dumps(seen))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True).stdout
    seen = json.loads(out.split("THRESHOLDS", 1)[1])
    assert seen["imported"] == seen["bare"]  # a library import leaves the interpreter's defaults
    assert tuple(seen["command"]) == tuple(max(bare, ours) for bare, ours in zip(seen["bare"], THRESHOLDS))
    assert tuple(seen["command"]) != tuple(seen["bare"])


def test_the_command_line_freezes_what_it_holds_only_at_the_interpreters_exit():
    """After a command nothing is frozen yet (an in-process caller collects as before); at the exit,
    before the finalisation's collections, everything left is (`no_collections_at_exit`)."""
    script = """
import atexit, gc, sys
atexit.register(lambda: print("AT_EXIT", gc.get_freeze_count() > 1000))  # runs after the CLI's handler
import jaxplan.cli
sys.argv = ["jaxplan", "list"]
try:
    jaxplan.cli.main()
except SystemExit:
    pass
print("AFTER_COMMAND", gc.get_freeze_count())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True).stdout
    assert "AFTER_COMMAND 0" in out and "AT_EXIT True" in out, out
