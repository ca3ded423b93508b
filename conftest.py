"""Test configuration: 8 emulated CPU devices, so sharding tests run on a laptop; each test has
a plan cache of its own (an empty folder), so no test sees another's stored searches.

The modules of :data:`SLOW_MODULES` (real processes, a browser, notebooks, the docs' pages, a
device profile) are marked ``slow``: ``make test-fast`` leaves them out for the inner loop, and
``make test`` (what CI runs) runs everything. docs/testing.md lists the slowest tests."""

import gc
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# bytecode written and read for the run, where the environment says not to write it
# (PYTHONDONTWRITEBYTECODE): otherwise each of the run's 170 or so Python processes compiles the
# autoplan modules it imports again, and each pytest worker rewrites and compiles every test
# module again (collection 7.5 s per worker without the caches, 3.4 s with them). The caches are
# the ignored __pycache__ folders; the processes the tests start inherit the setting.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# the test workers' young generation collected every 10,000 allocations instead of 700: a worker
# holds what its module's tests made and the libraries' caches, which the collector's older
# generations walked again and again (about 4% of the suite's CPU time); each test that needs
# garbage gone calls gc.collect() itself. The processes the tests start keep Python's default.
gc.set_threshold(10_000, 10, 10)
# XLA's CPU code generation without the fusion emitters, and LLVM without its optimisation
# passes, compiles the suite's many small programs several times faster (the same HLO and the
# same fusions; matmuls and convolutions call the same library kernels); set before JAX starts,
# and inherited by the processes the tests start (the docs' pages, launch workers, notebook
# kernels)
_FAST_CPU_CODEGEN = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0")
for _flag in _FAST_CPU_CODEGEN:
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

# one persistent XLA compilation cache for the whole run: the workers and every process the
# tests start (the docs' pages, launch workers, notebook kernels) compile a program once and read
# it back after (the suite compiles the same reference steps and stage programs in many tests).
# It is made by the first process of the run (the controller under pytest-xdist, whose workers
# inherit the variables) and removed when the run ends. It has no size bound (-1): with one, JAX
# takes a file lock and lists and reads every entry of the folder before each write to find what
# to evict, a cost that grows with the folder (about 1,400 entries by the end of a run, 45 us an
# entry each write: 9 min 37 s for the suite with a 4 GiB bound, 8 min 43 s without, 2026-11-30).
# Unlocked, a process that reads an entry while another writes it gets a short file, which JAX
# reports as a warning and compiles again. A cache the caller set is left alone.
_XLA_CACHE_OWNER = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _XLA_CACHE_OWNER:
    import tempfile  # noqa: E402

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="autoplan-suite-xla-")
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = "-1"
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


def pytest_configure(config):
    # a candidate that breaks a pin is the search's fault: fail the test that meets one (its
    # own warning filters aside), as well as leaving it out of the result
    config.addinivalue_line("filterwarnings", "error::autoplan.algorithms.PinNotHeldWarning")


#: test modules (relative to the repository) marked ``slow``
SLOW_MODULES = frozenset({
    "tests/test_docs.py", "tests/test_browser.py", "tests/test_notebooks.py", "tests/test_gc.py",
    "tests/test_profile.py", "tests/test_faults_files.py", "tests/exec/test_launch.py",
    "tests/exec/test_launch_cli.py", "tests/exec/test_pipeline_mpmd.py",
})


#: the modules that take longest (docs/testing.md), in that order: run first, so that under
#: ``make test``'s workers (``--dist loadfile --no-loadscope-reorder``: each module on one
#: worker, handed out in the order collected; without the second flag xdist hands them out by
#: their number of tests, and the one-test browser module ran last) no long module starts last
#: while the other workers stand idle
LONGEST_FIRST = (
    # (first of all, while a worker's heap is small: its tests walk the whole heap with
    # gc.collect and gc.get_objects, about 17 s late in a worker's run, 0.3 s first)
    "tests/test_gc.py",
    "tests/test_docs.py", "tests/user_models/test_user_matrix.py", "tests/test_browser.py",
    "tests/exec/test_pipeline_mpmd.py", "tests/search/pipeline/test_pipeline.py",
    "tests/search/fold/test_levels.py", "tests/viz/test_explorer.py", "tests/exec/test_launch.py",
    "tests/test_notebooks.py", "tests/exec/test_run.py", "tests/search/pipeline/test_levers.py",
    "tests/user_models/test_model_matrix.py", "tests/exec/test_levers_applied.py",
    "tests/test_profile.py", "tests/exec/test_launch_cli.py",
    "tests/exec/test_pipeline_schedules.py", "tests/models/test_models.py",
    "tests/search/pipeline/test_cost_model.py",
)


def _relative(item, root) -> str | None:
    try:
        return item.path.relative_to(root).as_posix()
    except ValueError:
        return None


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    rank = {m: k for k, m in enumerate(LONGEST_FIRST)}
    for item in items:
        if _relative(item, root) in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    # (a stable sort: each module's own tests keep their order)
    items.sort(key=lambda it: rank.get(_relative(it, root), len(rank)))


@pytest.fixture(autouse=True)
def _own_plan_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path_factory.mktemp("plan-cache")))


@pytest.fixture(autouse=True, scope="module")
def _own_zoo_traces():
    """Each test module starts without the zoo traces another module's searches shared
    (``trace_workload``): its tests share them, as a module's fixtures are shared."""
    if "autoplan.tracing._trace" in sys.modules:
        sys.modules["autoplan.tracing._trace"].forget_shared_traces()
    yield


def pytest_unconfigure(config):
    """The run's compilation cache goes when the process that made it ends its run."""
    if _XLA_CACHE_OWNER:
        import shutil  # noqa: PLC0415

        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
