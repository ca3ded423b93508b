"""The autoplan command line."""

import json
import os
import subprocess
import sys

import pytest

from autoplan.cli import main


def test_models_lists_every_workload(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("gpt", "moe", "wide_resnet", "unet", "two_tower", "mlp"):
        assert name in out
    assert "175B" in out


def test_trace_prints_the_graph(capsys):
    assert main(["trace", "gpt", "--size", "1.3B"]) == 0
    out = capsys.readouterr().out
    assert "operators" in out and "FLOPs per step" in out and "layers_0 .. layers_23" in out
    assert "1,420,414,976" in out  # parameter count


def test_plan_show_and_report(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "mlp", "--size", "tiny", "--cluster", "cpu:8", "--pipeline", "no",
                 "--level", "exhaustive", "-o", str(path)]) == 0
    out = capsys.readouterr().out
    assert "baseline: data parallel" in out and f"plan written to {path}" in out
    assert json.loads(path.read_text())["model"] == "mlp"
    assert main(["show", str(path), "--specs"]) == 0
    out = capsys.readouterr().out
    assert "plan [autoplan] for mlp on cpu:8" in out and "batch[" in out and " P(" in out
    report = tmp_path / "r.html"
    assert main(["report", str(path), "-o", str(report)]) == 0
    assert report.stat().st_size > 1_000_000  # plotly.js embedded
    assert "Mined subgraphs" in report.read_text()  # the plan file keeps the folding analysis


def test_reports_of_a_search_have_every_plan(tmp_path, capsys):
    report = tmp_path / "search.html"
    assert main(["plan", "mlp", "--cluster", "cpu:8", "--pipeline", "no", "--report",
                 str(report)]) == 0
    out = capsys.readouterr().out
    n = int(out.split("report of ")[1].split(" plans")[0])
    text = report.read_text()
    assert n >= 3 and text.count("<tr class=") == n and "Plans compared" in text
    again = tmp_path / "again.html"
    assert main(["report", "mlp", "--cluster", "cpu:8", "--pipeline", "no", "-o", str(again)]) == 0
    assert "report of a search of mlp" in capsys.readouterr().out
    assert again.read_text().count("<tr class=") == n


@pytest.mark.parametrize("argv, message", [
    (["trace", "gpt", "--size", "7T"], "size"),
    (["trace", "nosuchmodel"], "nosuchmodel"),
    (["plan", "mlp", "--cluster", "p3.16xlarge:0"], "positive node count"),
    (["plan", "mlp", "--cluster", "nosuch:2"], "unknown preset"),
    (["show", "/nonexistent/plan.json"], "cannot read plan file"),
    (["trace", "gpt", "--set", "layers"], "KEY=VALUE"),
    (["report", "/nonexistent/plan.json"], "not a file"),
    (["plan", "mlp", "--mesh", "two"], "--mesh should be"),
])
def test_bad_input_is_a_clear_error(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoplan: error:") and message in err


def test_console_script_entry_point():
    out = subprocess.run([sys.executable, "-m", "autoplan.cli", "models"], capture_output=True,
                         text=True, check=True).stdout
    assert "gpt" in out


@pytest.mark.slow
def test_launch_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "mlp", "--size", "tiny", "--cluster", "cpu:8", "--pipeline", "no",
                 "--level", "exhaustive", "-o", str(path)]) == 0
    capsys.readouterr()
    assert main(["launch", str(path), "--model", "mlp", "--size", "tiny", "--num-processes", "2",
                 "--devices-per-process", "4", "--steps", "2", "--timeout", "240"]) == 0
    out = capsys.readouterr().out
    assert "process 0: losses" in out and "process 1: losses" in out
    assert "matched single-device results" in out


def test_the_cli_stdout_carries_no_solver_banner(tmp_path):
    # HiGHS writes a copyright banner to file descriptor 1 when a process makes its first
    # solver instance: only a fresh process shows whether it reaches the user
    out = subprocess.run([sys.executable, "-m", "autoplan.cli", "plan", "mlp", "--cluster",
                          "cpu:8", "--pipeline", "yes"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    assert "HiGHS" not in out.stdout and "Copyright" not in out.stdout
    assert out.stdout.lstrip().startswith("#")  # the ranked table comes first
