"""The suite compiles fast (tests/conftest.py: LLVM's -O0, XLA:CPU's older emitters): each flag is
added once, other flags are kept, an option already set wins, and JAXPLAN_TEST_XLA_OPT=default opts out."""

import os

from conftest import FAST_COMPILE_ENV, FAST_COMPILE_FLAGS, _compile_fast


def test_the_flags_are_added_to_an_empty_environment():
    env = {}
    _compile_fast(env)
    assert env["XLA_FLAGS"] == "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def test_other_flags_are_kept_and_each_flag_is_added_once():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    _compile_fast(env)
    _compile_fast(env)
    assert env["XLA_FLAGS"] == " ".join(("--xla_force_host_platform_device_count=2",) + FAST_COMPILE_FLAGS)


def test_an_option_already_set_wins():
    env = {"XLA_FLAGS": "--xla_backend_optimization_level=2"}
    _compile_fast(env)
    assert env["XLA_FLAGS"] == "--xla_backend_optimization_level=2 --xla_cpu_use_fusion_emitters=false"
    env = {"XLA_FLAGS": "--xla_cpu_use_fusion_emitters=true"}
    _compile_fast(env)
    assert env["XLA_FLAGS"] == "--xla_cpu_use_fusion_emitters=true --xla_backend_optimization_level=0"


def test_the_opt_out_leaves_the_flags_alone():
    env = {FAST_COMPILE_ENV: "default", "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    _compile_fast(env)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"


def test_this_run_compiles_fast_unless_opted_out():
    flags = os.environ.get("XLA_FLAGS", "")
    if os.environ.get(FAST_COMPILE_ENV, "fast") == "fast":
        assert all(flag.split("=")[0] in flags for flag in FAST_COMPILE_FLAGS)


def test_collection_keeps_the_file_order():
    """No hand-kept timing list steers the order: collection returns the items in file order (the
    slow marker aside), and pytest-xdist's --dist loadfile schedules the modules itself."""
    from pathlib import Path
    from types import SimpleNamespace

    import conftest

    names = ["test_a.py", "test_cli.py", "test_fuzz_cli.py", "test_solver.py", "test_z.py"]
    items = [SimpleNamespace(path=Path("tests") / name, keywords={}) for name in names]
    config = SimpleNamespace(getoption=lambda name: True, option=SimpleNamespace(loadscopereorder=True))
    conftest.pytest_collection_modifyitems(config, items)
    assert [item.path.name for item in items] == names
    conftest.pytest_configure(config)
    assert config.option.loadscopereorder is True


def test_a_flag_this_xla_lacks_is_left_out():
    """XLA aborts a process at an unknown flag in XLA_FLAGS, and newer XLA drops debug options: a
    flag the installed XLA lacks is not added (probed in a subprocess), the others are."""
    env = {}
    _compile_fast(env, FAST_COMPILE_FLAGS + ("--xla_jaxplan_no_such_flag=true",))
    assert env["XLA_FLAGS"] == " ".join(FAST_COMPILE_FLAGS)


def test_the_suite_cache_is_kept_between_runs_unless_fresh_is_asked(tmp_path):
    """Default: $XDG_CACHE_HOME/jaxplan/test-xla, kept; a path named in the variable, kept; `fresh`:
    a new temporary directory that the run removes."""
    from conftest import SHARED_CACHE_ENV, suite_cache_dir

    assert suite_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == (str(tmp_path / "jaxplan" / "test-xla"), False)
    assert suite_cache_dir({SHARED_CACHE_ENV: "/somewhere/else"}) == ("/somewhere/else", False)
    where, made = suite_cache_dir({SHARED_CACHE_ENV: "fresh", "XDG_CACHE_HOME": str(tmp_path)})
    assert made and os.path.isdir(where) and not os.listdir(where) and not where.startswith(str(tmp_path / "jaxplan"))
    os.rmdir(where)
