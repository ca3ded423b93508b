"""The fault table's script classifies what it sees by itself: tracebacks, hangs, aborts, lost
files and processes left behind are found from the processes and files, not written by hand."""

from __future__ import annotations

import importlib.util
import signal
import sys
import warnings
from pathlib import Path

import pytest

import autoplan
from autoplan.models import get

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def faults():
    spec = importlib.util.spec_from_file_location("autoplan_benchmark_faults", ROOT / "benchmarks" / "faults.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fixtures")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        autoplan.plan(get("mlp", "tiny"), "cpu:8", pipeline=False, level="exhaustive", mesh_shape=(2, 4),
                      baselines=False).to_json(folder / "mlp.json")
    return {"mlp": folder / "mlp.json"}  # the cases run here read no pipeline plan


def test_the_table_has_every_kind_of_fault(faults):
    cases = faults.cases()
    names = [c.name for c in cases]
    assert len(cases) >= 40 and len(set(names)) == len(names)
    groups = {c.group for c in cases}
    assert {"plan file", "outputs", "search", "launch", "executor"} <= groups
    # the launch faults the table must hold: dead, hung and killed workers, a taken port, and
    # every signal to the launcher
    assert {"l-dead", "l-hung", "l-killed", "l-port", "l-sigint", "l-sigterm", "l-sighup",
            "l-sigkill"} <= set(names)
    for c in cases:
        assert (c.argv is None) != (c.code is None), c.name
        assert c.expect in ("error", "warning", "ok", "interrupted", "killed"), c.name


def _run(faults, fixtures, tmp_path, case):
    return faults.run_case(case, fixtures, tmp_path)


@pytest.mark.parametrize("code, verdict", [
    ("raise ValueError('boom')", "traceback"),
    ("import os; os.abort()", "process abort"),
    ("import time; time.sleep(60)", "hang"),  # at the 3 s timeout
    ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
     " start_new_session=True)", "left behind"),
    ("import os, tempfile; os.mkdir(os.path.join(tempfile.gettempdir(), 'autoplan-launch-x'))",
     "left behind"),
    ("open('keep.json', 'w').write('')", "data lost"),
    ("pass", "silently accepted"),
    ("import sys; print('autoplan: error: it went wrong', file=sys.stderr); sys.exit(2)", "unclear error"),
    ("import sys; print('autoplan: error: no such thing. Fix: x', file=sys.stderr); sys.exit(2)",
     "clear error"),
])
def test_verdicts_come_from_what_the_process_left(faults, fixtures, tmp_path, code, verdict):
    case = faults.Case("synthetic", "test", "a synthetic fault", code=code, words=("no such thing",),
                       setup=faults.raw_file("keep.json", b"{}"), keep=("keep.json",), timeout=3)
    res = _run(faults, fixtures, tmp_path, case)
    assert verdict in res.verdicts, (res.verdicts, res.stderr[-300:])
    assert faults._marked(res.marker) == []  # whatever was left behind was ended


def test_real_cases_are_classified(faults, fixtures, tmp_path):
    by_name = {c.name: c for c in faults.cases()}
    for name, verdict in (("pf-mesh", "clear error"), ("out-same", "clear error")):
        res = _run(faults, fixtures, tmp_path, by_name[name])
        assert res.verdicts == [verdict], (name, res.verdicts, res.stderr[-500:])
    md = faults.markdown([res], "a test machine")
    assert "| tried | 1 |" in md and "| traceback (target 0) | 0 |" in md


def test_an_interrupted_command_is_a_clear_error_only_with_its_status(faults, fixtures, tmp_path):
    case = faults.Case("sig", "test", "SIGTERM to a Python script", code="import time; time.sleep(30)",
                       expect="interrupted", words=(), signal_at=("start", 1.0, signal.SIGTERM), timeout=20)
    res = _run(faults, fixtures, tmp_path, case)
    assert res.verdicts == ["process abort"]  # killed by a signal it did not handle
