"""Multi-process launches through jax.distributed: a 2 x 4 device run of tiny GPT that matches
single-device execution, and failing workers that take the launch down cleanly."""

import os
import time

import pytest
from exec_cases import FAST, plan, workload

from autoplan import LaunchError, PlanMismatchError
from autoplan.exec import describe_workload, launch


def _gone(pid: int) -> bool:
    """No process is left in the worker's process group (it led its own session)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_two_processes_of_four_devices_run_tiny_gpt_and_match():
    p = plan("gpt", "tp")  # a (2, 4) mesh: "x" spans the two processes
    handle = launch(p, workload("gpt"), num_processes=2, devices_per_process=4, steps=2,
                    timeout=150, compiler_options=FAST)
    seen = []
    while not handle.done:
        seen += handle.poll()
        time.sleep(0.2)
    result = handle.wait(timeout=30)
    seen += handle.poll()
    assert result.matched is True
    assert set(result.losses) == {0, 1} and all(len(v) == 2 for v in result.losses.values())
    assert result.losses[0] == pytest.approx(result.losses[1], rel=1e-6)
    assert result.loss[1] < result.loss[0]
    steps = [e for e in result.events if e["event"] == "step"]
    assert {(e["process"], e["step"]) for e in steps} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    starts = [e for e in result.events if e["event"] == "start"]
    assert all(e["devices"] == 8 and e["local_devices"] == 4 for e in starts)
    assert all(e["devices"] == 8 for e in result.done.values())
    assert all(_gone(pid) for pid in handle.pids)
    assert not os.path.exists(handle.workdir)


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["AUTOPLAN_TEST_CRASH_AT_STEP", "AUTOPLAN_TEST_HANG_AT_STEP"])
def test_failing_worker_fails_the_launch_and_leaves_nothing_behind(failure):
    # crash mid-run (before step 1); hang right after start-up, so the timeout can be short
    crash = failure.endswith("CRASH_AT_STEP")
    timeout, step = (60, 1) if crash else (20, 0)
    t0 = time.monotonic()
    handle = launch(plan("mlp", "dp"), {"model": "mlp", "size": "tiny"}, num_processes=2,
                    devices_per_process=4, steps=3, timeout=timeout, env={failure: str(step)},
                    compiler_options=FAST)
    with pytest.raises(LaunchError) as info:
        handle.wait()
    elapsed = time.monotonic() - t0
    assert elapsed < timeout + 10
    msg = str(info.value)
    assert "[worker 1]" in msg and "[worker 0]" in msg  # every worker's last stderr lines
    if crash:
        assert "worker 1 exited with status 17" in msg and "injected crash before step 1" in msg
        assert elapsed < timeout  # noticed at once, not at the timeout
    else:
        assert "timed out" in msg and "injected hang before step 0" in msg
    assert handle.done and all(rc is not None for rc in handle.returncodes())
    assert all(_gone(pid) for pid in handle.pids)
    with pytest.raises(LaunchError):  # the failure sticks
        handle.wait()


def test_launch_refuses_a_device_count_the_plan_was_not_made_for():
    with pytest.raises(PlanMismatchError, match="2 x 2 = 4"):
        launch(plan("mlp", "dp"), {"model": "mlp"}, num_processes=2, devices_per_process=2)


def test_workload_is_described_by_name_size_and_overrides():
    from autoplan import models

    assert describe_workload(models.get("gpt", "tiny")) == {"model": "gpt", "size": "tiny"}
    spec = describe_workload(models.get("gpt", "tiny", layers=3, heads=2))
    assert spec == {"model": "gpt", "size": "tiny", "layers": 3, "heads": 2}
    with pytest.raises(LaunchError, match="cannot be sent"):
        describe_workload(lambda x: x)


def test_cluster_environments_are_detected_for_auto_initialisation():
    from autoplan.exec._worker import cluster_env_detected

    assert not cluster_env_detected({})
    assert cluster_env_detected({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"})
    assert cluster_env_detected({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"})
    assert not cluster_env_detected({"SLURM_JOB_ID": "7"})  # an allocation, not a task


def test_workers_are_killed_when_the_launching_interpreter_exits(tmp_path):
    import subprocess
    import sys

    plan("mlp", "dp").to_json(str(tmp_path / "plan.json"))
    script = (
        "import sys\n"
        "from autoplan.exec import launch\n"
        f"h = launch({str(tmp_path / 'plan.json')!r}, {{'model': 'mlp'}}, num_processes=2,\n"
        "           devices_per_process=4, env={'AUTOPLAN_TEST_HANG_AT_STEP': '0'})\n"
        "print(*h.pids, flush=True)\n"
        "sys.exit(0)  # no wait(): the atexit hook must take the workers down\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    pids = [int(x) for x in out.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids)
