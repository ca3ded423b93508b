"""``autoplan launch`` as a user runs it: a user's optax module planned and launched by
``module:function`` from its own folder; SIGINT, SIGTERM, SIGHUP and SIGKILL to the launcher
leave no worker and no launch folder behind; ``--print-command`` lines, and the printed srun
worker run under SLURM's variables as srun would start it."""

from __future__ import annotations

import json
import os
import pathlib
import random
import shlex
import signal
import subprocess
import sys
import time

import pytest
from exec_cases import plan
from launch_cases import gone, is_loopback, launch_folders, listening_addresses, wait_gone

from autoplan.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
USER_MODELS = ROOT / "tests" / "user_models"


def cli(tmp_path: pathlib.Path) -> list[str]:
    """The ``autoplan`` console script: a script outside the user's folder, so (as for the
    installed entry point) the current directory is not on ``sys.path`` by itself."""
    script = tmp_path / "autoplan_cli.py"
    script.write_text("import sys\nfrom autoplan.cli import main\nsys.exit(main())\n")
    return [sys.executable, str(script)]


def user_env(**extra: str) -> dict[str, str]:
    """This autoplan on the path, nothing of the user's: their folder is the working directory."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", **extra}


def test_a_users_optax_module_is_planned_and_launched_by_module_function(tmp_path):
    exe, path = cli(tmp_path), tmp_path / "plan.json"
    out = subprocess.run([*exe, "plan", "optax_mlp:workload", "--set", "layers=2", "--cluster",
                          "cpu:8", "--pipeline", "no", "-o", str(path)], cwd=USER_MODELS,
                         env=user_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(path.read_text())["model"] == "optax_mlp:workload"
    # platform and counts detected: no accelerator here, so 2 processes x 4 emulated devices
    out = subprocess.run([*exe, "launch", str(path), "--model", "optax_mlp:workload", "--set",
                          "layers=2", "--steps", "3"], cwd=USER_MODELS, env=user_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "on 2 processes x 4 emulated CPU devices (no accelerator attached)" in out.stdout
    assert "process 0: losses" in out.stdout and "process 1: losses" in out.stdout
    assert "matched single-device results" in out.stdout
    # the same plan with another --set is another workload: refused before any worker starts
    out = subprocess.run([*exe, "launch", str(path), "--model", "optax_mlp:workload"],
                         cwd=USER_MODELS, env=user_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2
    assert out.stderr.startswith("autoplan: error: launch: the plan was made for model "
                                 "'optax_mlp:workload'") and "No worker was started" in out.stderr
    assert "Traceback" not in out.stderr


def test_trace_and_plan_take_module_function_specs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(USER_MODELS)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(USER_MODELS))])
    try:
        assert main(["trace", "optax_mlp:workload", "--set", "layers=2"]) == 0
        assert "operators" in capsys.readouterr().out
        assert main(["trace", "optax_mlp:workload", "--set", "depth=2"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("autoplan: error:") and "['depth'] it does not take" in err
        assert main(["trace", "no_such_module_xyz:workload"]) == 2
        assert "no module named 'no_such_module_xyz'" in capsys.readouterr().err
        assert main(["trace", "gpt", "--set", "size=tiny"]) == 2
        assert "Fix: use --size" in capsys.readouterr().err
    finally:
        sys.modules.pop("optax_mlp", None)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: s.name)
def test_a_killed_launcher_leaves_no_worker_and_no_launch_folder(tmp_path, sig):
    path = tmp_path / "plan.json"
    plan("mlp", "dp").to_json(str(path))
    tmp = tmp_path / "tmp"  # the launcher's and its workers' temporary directory
    tmp.mkdir()
    proc = subprocess.Popen(
        [*cli(tmp_path), "launch", str(path), "--model", "mlp", "--hang-timeout", "600"],
        env=user_env(AUTOPLAN_TEST_HANG_AT_STEP="0", TMPDIR=str(tmp)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "worker pids" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        pids = [int(x) for x in line.split("worker pids")[1].split()]
        assert len(pids) == 2 and not any(gone(p) for p in pids)
        time.sleep(1.0)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:  # one line, no traceback, 128 + the signal
        assert proc.returncode == 128 + sig, err
        assert err.strip() == (f"autoplan: interrupted by {signal.Signals(sig).name}; "
                               "every worker of the launch was stopped.")
    # the workers' process groups: gone within 10 s (at once unless the launcher was SIGKILLed,
    # then the workers notice its pipe close)
    assert wait_gone(pids, 10), [p for p in pids if not gone(p)]
    assert launch_folders(tmp) == set()


def test_print_command_prints_the_cluster_lines(tmp_path, capsys):
    path = tmp_path / "plan.json"
    plan("mlp", "dp").to_json(str(path))
    assert main(["launch", str(path), "--model", "mlp", "--print-command", "slurm"]) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line
    argv = shlex.split(line)
    # a plan made for emulated CPU devices runs on CPUs: one task per node
    assert argv[:5] == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=1"]
    assert argv[argv.index("--platform") + 1] == "cpu"
    assert argv[argv.index("--plan") + 1] == str(path)
    assert json.loads(argv[argv.index("--workload") + 1]) == {"model": "mlp"}
    assert main(["launch", str(path), "--model", "mlp", "--set", "hidden=64", "--print-command",
                 "mpi", "--nodes", "2"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip())
    assert argv[:6] == ["mpirun", "-np", "2", "--map-by", "ppr:1:node", "--bind-to"]
    assert json.loads(argv[argv.index("--workload") + 1]) == {"model": "mlp", "hidden": 64}
    assert argv[argv.index("--devices-per-process") + 1] == "4"
    # on GPUs: one task per GPU
    assert main(["launch", str(path), "--model", "mlp", "--print-command", "slurm", "--platform",
                 "gpu"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip())
    assert argv[:5] == ["srun", "--nodes=1", "--ntasks=8", "--ntasks-per-node=8", "--gpus-per-node=8"]


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback (the route to a public address)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: UDP connect only picks a route
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def test_the_printed_srun_worker_runs_under_slurms_variables(tmp_path, capsys):
    """The worker of the printed srun line, started twice with the variables srun gives its
    tasks: JAX's own SLURM detection joins them, process 0 binds where the scheduler's node
    name points (not every interface), and the run matches single-device execution."""
    node = _non_loopback_address()
    if node is None:
        pytest.skip("this machine has no non-loopback IPv4 address to stand for a node")
    path = tmp_path / "plan.json"
    plan("mlp", "dp").to_json(str(path))
    assert main(["launch", str(path), "--model", "mlp", "--print-command", "slurm",
                 "--platform", "cpu", "--nodes", "2", "--steps", "2"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip())
    start = argv.index(sys.executable)
    srun, worker = argv[:start], argv[start:]
    opts = dict(a[2:].split("=", 1) for a in srun[1:] if "=" in a)
    ntasks = int(opts["ntasks"])
    exported = dict([opts["export"].split(",", 1)[1].split("=", 1)])
    job = str(random.randint(10_000, 10_000_000))
    procs = []
    for rank in range(ntasks):
        env = {**os.environ, **exported, "SLURM_JOB_ID": job, "SLURM_STEP_NODELIST": node,
               "SLURM_NTASKS": str(ntasks), "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0",
               "SLURM_STEP_NUM_NODES": str(ntasks)}
        procs.append(subprocess.Popen(worker, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    events = [[json.loads(ln) for ln in out.splitlines() if ln.startswith("{")] for out, _ in outs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    starts = [next(e for e in evs if e["event"] == "start") for evs in events]
    assert starts[0]["coordinator_bind"] == f"{node}:{int(job) % 4096 + 61440}"
    assert starts[1]["coordinator_bind"] is None and starts[0]["devices"] == 8
    done = [next(e for e in evs if e["event"] == "done") for evs in events]
    assert all(d["matched"] is True for d in done)
    assert done[0]["losses"] == done[1]["losses"]
    assert not any(e["event"] == "heartbeat" for evs in events for e in evs)  # no launcher here


def test_cluster_workers_bind_the_coordinator_where_the_scheduler_says(tmp_path):
    """While a scheduler-started job runs, process 0's coordination service listens on the
    scheduler's address for it only, not on every interface."""
    node = _non_loopback_address()
    if node is None:
        pytest.skip("this machine has no non-loopback IPv4 address to stand for a node")
    path = tmp_path / "plan.json"
    plan("mlp", "dp").to_json(str(path))
    job = str(random.randint(10_000, 10_000_000))
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": job,
               "SLURM_STEP_NODELIST": node, "SLURM_NTASKS": "2", "SLURM_PROCID": str(rank),
               "SLURM_LOCALID": "0", "AUTOPLAN_TEST_HANG_AT_STEP": "0"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "autoplan.exec._worker", "--plan", str(path), "--workload",
             "mlp", "--platform", "cpu", "--devices-per-process", "4"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True))
    try:
        first = procs[0].stdout.readline()  # the start event: the coordinator is up
        assert json.loads(first)["event"] == "start", first
        addresses = listening_addresses(procs[0].pid)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    port = int(job) % 4096 + 61440
    assert f"{node}:{port}" in addresses, addresses
    assert not any(a.endswith(f":{port}") and a != f"{node}:{port}" for a in addresses)
    assert not any(a.startswith(("0.0.0.0:", ":::")) for a in addresses), addresses
    assert all(is_loopback(a) or a.startswith(f"{node}:") for a in addresses)
