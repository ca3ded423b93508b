"""The autoplan command line."""

import json
import os
import subprocess
import sys
import time

import pytest

from autoplan import _cache
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
    import gc

    path = tmp_path / "plan.json"
    frozen = gc.get_freeze_count()
    assert main(["plan", "mlp", "--size", "tiny", "--cluster", "cpu:8", "--pipeline", "no",
                 "--level", "exhaustive", "-o", str(path)]) == 0
    # (called in-process, the command leaves the caller's collector as it was: nothing frozen)
    assert gc.get_freeze_count() == frozen and gc.isenabled()
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


@pytest.mark.parametrize("module", ["autoplan.cli", "autoplan"])
def test_console_script_entry_point(module):
    out = subprocess.run([sys.executable, "-m", module, "models"], capture_output=True,
                         text=True, check=True).stdout
    assert "gpt" in out


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



@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the processes' environments in /proc")
def test_the_command_exits_at_once_and_ends_its_worker_processes(tmp_path):
    # ``autoplan`` ends with ``autoplan.cli.run``: output flushed, the search's worker processes
    # ended, the atexit functions run, and no slow teardown of the interpreter's objects
    mark = f"autoplan-test-{os.getpid()}-{time.time_ns()}"
    path = tmp_path / "p.json"
    out = subprocess.run([sys.executable, "-m", "autoplan.cli", "plan", "mlp", "--size", "tiny",
                          "--cluster", "cpu:8", "--pipeline", "no", "--workers", "2",
                          "--no-cache", "-o", str(path)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu",
                                           "AUTOPLAN_TEST_MARK": mark})
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().splitlines()[-1] == f"plan written to {path}"  # flushed in full
    assert json.loads(path.read_text())["stages"]
    deadline = time.monotonic() + 30
    while _processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_marked(mark)


def _processes_marked(mark: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``AUTOPLAN_TEST_MARK=mark``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"AUTOPLAN_TEST_MARK={mark}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:  # gone, or not ours to read
            continue
    return found

# ---- errors, outputs and signals ---------------------------------------------------------------
def _one_line_error(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("autoplan: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, err
    return err


def _no_search(monkeypatch):
    from autoplan.search import _api

    def refuse(*args, **kwargs):
        raise AssertionError("the search should not have started")

    monkeypatch.setattr(_api, "search", refuse)


@pytest.mark.parametrize("argv, words", [
    (["plan", "mlp", "-o", "/no/such/dir/p.json"], ["the folder '/no/such/dir' does not exist"]),
    (["plan", "mlp", "-o", "/proc/p.json"], ["cannot create files in the folder '/proc'"]),
    (["plan", "mlp", "--mesh", "2x4", "--pipeline", "yes"], ["--mesh 2x4", "--pipeline yes",
                                                            "drop --mesh"]),
    (["plan", "mlp", "--pipeline", "no", "--microbatches", "4", "--schedule", "gpipe"],
     ["--microbatches 4, --schedule gpipe", "--pipeline no", "would be ignored"]),
    (["plan", "mlp", "--pipeline", "no", "--submesh-hosts", "pow2"], ["--submesh-hosts pow2"]),
    (["plan", "mlp", "--cluster", "cpu:"], ["positive device count", "'cpu:8'"]),
    (["plan", "mlp", "--mesh", "2x"], ["--mesh should be positive sizes joined by 'x'"]),
    (["plan", "mlp", "--mesh", "3x3"], ["9 devices but cluster cpu:8 has 8"]),
    (["plan", "mlp", "--workers", "0"], ["--workers should be a positive integer. Got 0"]),
])
def test_bad_plan_options_are_refused_before_the_search(argv, words, monkeypatch, capsys):
    if "3x3" not in argv:  # a mesh of the wrong size is found by the search's own check
        _no_search(monkeypatch)
    assert main(argv) == 2
    _one_line_error(capsys, *words)


def test_plan_uses_the_plan_cache_unless_told_not_to(tmp_path, capsys):
    argv = ["plan", "mlp", "--size", "tiny", "--pipeline", "no", "--workers", "2"]
    outs = []
    for _ in range(2):
        assert main(argv) == 0
        outs.append(capsys.readouterr().out)
    assert len(list((_cache.cache_dir() / "search").glob("*.entry"))) == 1
    assert "from the plan cache" not in outs[0] and "from the plan cache" in outs[1]
    assert outs[0].split("search took")[0] == outs[1].split("search took")[0]  # the same plans
    assert main(argv + ["--no-cache"]) == 0
    assert "from the plan cache" not in capsys.readouterr().out


def test_the_output_folder_is_checked_before_the_search(tmp_path, monkeypatch, capsys):
    _no_search(monkeypatch)
    assert main(["plan", "mlp", "-o", str(tmp_path)]) == 2
    _one_line_error(capsys, "is a folder", "plan.json")


def test_an_output_equal_to_the_input_is_refused(tmp_path, capsys):
    victim = tmp_path / "victim.json"
    assert main(["plan", "mlp", "--pipeline", "no", "--level", "exhaustive", "-o", str(victim)]) == 0
    capsys.readouterr()
    before = victim.read_bytes()
    alias = tmp_path / "alias.json"
    alias.symlink_to(victim)
    for out in (victim, alias):
        assert main(["report", str(victim), "-o", str(out)]) == 2
        _one_line_error(capsys, "is the input file", "would destroy the input")
    assert victim.read_bytes() == before
    assert main(["report", str(victim), "-o", str(tmp_path)]) == 2
    _one_line_error(capsys, "report.html")


def test_set_fixes_work_on_the_command_line(capsys):
    assert main(["trace", "gpt", "--set", "remat=yes"]) == 2
    _one_line_error(capsys, "--set remat=true")
    # the fix the message gives works, and so does the Python spelling of the API's message
    assert main(["trace", "gpt", "--set", "remat=true"]) == 0
    assert main(["trace", "gpt", "--set", "remat=True", "--set", "layers=1"]) == 0
    assert main(["trace", "two_tower", "--set", "user_hidden=(8, 4)"]) == 0
    assert main(["trace", "two_tower", "--set", "user_hidden=8x4"]) == 2
    _one_line_error(capsys, "--set user_hidden=[64,32]")


def test_no_plan_that_fits_is_an_error_unless_kept(tmp_path, capsys):
    out = tmp_path / "big.json"
    argv = ["plan", "gpt", "--size", "175B", "--set", "layers=1", "--cluster", "cpu:8",
            "--pipeline", "no", "-o", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "fits" in captured.out  # the ranked table is still shown
    err = captured.err
    assert err.startswith("autoplan: error: no candidate plan fits in the 2.000 GiB") and err.count("\n") == 1
    assert "the least any candidate needs is" in err and "--allow-no-fit" in err
    assert not out.exists()
    assert main(argv + ["--allow-no-fit"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("autoplan: warning: no candidate plan fits") and "kept as asked" in err
    assert out.exists()


def test_a_batch_that_cannot_be_split_is_said(capsys):
    assert main(["plan", "mlp", "--batch", "6", "--cluster", "cpu:8", "--pipeline", "no"]) == 0
    err = capsys.readouterr().err
    assert "autoplan: warning: search: the batch of 6 does not divide over the 8 devices" in err
    assert "Traceback" not in err and "BatchSplitWarning" not in err


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    import autoplan.cli

    def broken(args):
        raise ValueError("something nobody expected\nsecond line")

    monkeypatch.setattr(autoplan.cli, "cmd_models", broken)
    assert main(["models"]) == 1
    err = capsys.readouterr().err
    assert err == ("autoplan: internal error: ValueError: something nobody expected. This is a bug or "
                   "an input autoplan does not handle; rerun with --debug for the traceback.\n")
    for argv in (["--debug", "models"], ["models", "--debug"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and "rerun with --debug" in err

    def pipe_to_a_worker(args):  # a broken pipe that is not stdout's is no quiet exit
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(autoplan.cli, "cmd_models", pipe_to_a_worker)
    assert main(["models"]) == 1
    assert capsys.readouterr().err.startswith("autoplan: internal error: BrokenPipeError")


def test_a_signal_swallowed_where_it_landed_still_stops_the_write(tmp_path, monkeypatch, capsys):
    # Ctrl-C handled inside a finaliser is "ignored" by Python and the search goes on: the
    # command must still not write its output
    import signal

    from autoplan.search import _api

    path = tmp_path / "keep.json"
    path.write_text("the good plan")
    real = _api.search

    class Finalised:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs here, in the finaliser
                sum(range(100))

    def search_then_interrupt(*args, **kwargs):
        Finalised()
        return real(*args, **kwargs)

    monkeypatch.setattr(_api, "search", search_then_interrupt)
    before = signal.getsignal(signal.SIGINT)  # (Python's default; ignored under a background job)
    assert main(["plan", "mlp", "--pipeline", "no", "--level", "exhaustive", "-o", str(path)]) == 130
    err = capsys.readouterr().err
    assert err.strip().endswith(f"autoplan: interrupted by SIGINT; {path} was not written.")
    assert "Traceback" not in err
    assert path.read_text() == "the good plan"
    assert signal.getsignal(signal.SIGINT) is before  # handlers put back


@pytest.mark.parametrize("sig, status", [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_signal_during_the_search_writes_nothing(tmp_path, sig, status):
    import signal

    path = tmp_path / "keep.json"
    path.write_text("the good plan")
    code = ("import sys, autoplan.cli\nsys.stderr.write('ready\\n'); sys.stderr.flush()\n"
            "sys.exit(autoplan.cli.main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "plan", "gpt", "--size", "1.3B", "-o",
                             str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.stderr.readline() == "ready\n"
    import time

    time.sleep(1.0)  # inside main: tracing and searching a 24-layer GPT takes several seconds
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert err.strip() == f"autoplan: interrupted by {sig}; {path} was not written.", err
    assert path.read_text() == "the good plan"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_a_closed_stdout_is_no_traceback(tmp_path):
    # ``autoplan show plan.json | head -1``: the reader goes away before the output is written
    path = tmp_path / "p.json"
    assert main(["plan", "mlp", "--pipeline", "no", "--level", "exhaustive", "-o", str(path)]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "autoplan.cli", "show", str(path), "--specs"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == ""


@pytest.mark.parametrize("signum", [2, 15])
def test_a_signal_python_wrapped_in_another_error_is_the_signal(monkeypatch, capsys, signum):
    """A signal landing while a class body is made (an import's dataclass) reaches the command
    as ``RuntimeError: Error calling __set_name__``, raised from the interruption: it is the
    signal's one line and status, not an internal error."""
    from autoplan import cli

    class Field:
        def __set_name__(self, owner, name):
            raise cli._Interrupted(signum)

    def command(args):
        type("Made", (), {"stats": Field()})  # (Python wraps what __set_name__ raises)

    monkeypatch.setattr(cli, "build_parser", lambda: type("P", (), {
        "parse_args": lambda self, argv: type("A", (), {"func": staticmethod(command)})()})())
    assert main(["models"]) == 128 + signum
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autoplan: interrupted by SIG"), err


@pytest.mark.parametrize("signum", [2, 15])
def test_an_error_after_a_signal_is_the_signal_even_unlinked(monkeypatch, capsys, signum):
    """A signal landing inside a C++ callback of JAX's tracing comes back as JAX's own error,
    carrying the interruption in its message only (no __cause__ or __context__), and autoplan
    turns that into a TraceError: after a signal, any error is the signal's one line and
    status, not "autoplan: error: ..." with status 2."""
    import signal as _signal

    from autoplan import cli
    from autoplan._errors import TraceError

    def command(args):
        try:
            _signal.raise_signal(signum)
        except KeyboardInterrupt as e:  # (what the C++ boundary keeps of it: text)
            text = repr(e)
        raise TraceError(f"trace: JAX could not trace 'step': {text}. Fix: ...")

    monkeypatch.setattr(cli, "build_parser", lambda: type("P", (), {
        "parse_args": lambda self, argv: type("A", (), {"func": staticmethod(command)})()})())
    assert main(["models"]) == 128 + signum
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autoplan: interrupted by SIG"), err
    # without a signal, the same error is the command's error (status 2)

    def plain(args):
        raise TraceError("trace: JAX could not trace 'step': ValueError. Fix: ...")

    monkeypatch.setattr(cli, "build_parser", lambda: type("P", (), {
        "parse_args": lambda self, argv: type("A", (), {"func": staticmethod(plain)})()})())
    assert main(["models"]) == 2
    assert capsys.readouterr().err.startswith("autoplan: error: trace:")
