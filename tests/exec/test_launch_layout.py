"""Where workers go, without starting any: layouts for emulated CPU devices, GPUs and TPUs (the
GPU path checked by the commands and environments it would start), the srun/mpirun lines for a
cluster, the hang watchdog, and how a worker reads its scheduler."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from autoplan import LaunchError, PlanMismatchError
from autoplan.exec._launch import HANG_FACTOR, HANG_FLOOR, Watchdog, spec_arguments
from autoplan.exec._layout import (
    choose_layout,
    cluster_command,
    local_worker_command,
    worker_pythonpath,
)
from autoplan.exec._probe import DeviceInfo
from autoplan.exec._worker import _scheduler_bind, cluster_kind

CPU = DeviceInfo("cpu", "cpu", 1, "cpu")
H100 = DeviceInfo("gpu", "cuda", 8, "NVIDIA H100 80GB HBM3")
MI300 = DeviceInfo("gpu", "rocm", 4, "AMD Instinct MI300X")
TPU = DeviceInfo("tpu", "tpu", 4, "TPU v5 lite")


def test_emulated_cpu_devices_default_to_two_processes_when_they_split():
    lay = choose_layout(8, CPU)
    assert (lay.platform, lay.num_processes, lay.devices_per_process, lay.emulated) == ("cpu", 2, 4, True)
    assert lay.env(0) == {"JAX_PLATFORMS": "cpu"}
    assert lay.describe() == "2 processes x 4 emulated CPU devices (no accelerator attached)"
    assert choose_layout(8, CPU, requested=True).describe() == \
        "2 processes x 4 emulated CPU devices (platform cpu asked for)"
    assert (choose_layout(3, CPU).num_processes, choose_layout(1, CPU).num_processes) == (1, 1)
    assert choose_layout(8, CPU, per_host=True).num_processes == 1
    assert (choose_layout(8, CPU, num_processes=4).devices_per_process,
            choose_layout(8, CPU, devices_per_process=8).num_processes) == (2, 1)
    with pytest.raises(PlanMismatchError, match="2 x 2 = 4"):
        choose_layout(8, CPU, 2, 2)
    with pytest.raises(LaunchError, match="do not split evenly over num_processes=3"):
        choose_layout(8, CPU, 3)
    with pytest.raises(LaunchError, match="positive integer"):
        choose_layout(8, CPU, 0)


def test_gpus_get_one_worker_each_seeing_only_its_own_gpu():
    lay = choose_layout(4, H100, env={})
    assert (lay.platform, lay.num_processes, lay.devices_per_process, lay.emulated) == ("cuda", 4, 1, False)
    envs = [lay.env(i, {}) for i in range(4)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2", "3"]
    assert all(e["JAX_PLATFORMS"] == "cuda" and e["NCCL_SOCKET_IFNAME"] == "lo" for e in envs)
    assert lay.describe() == "4 processes x 1 GPU (NVIDIA H100 80GB HBM3, cuda)"
    cmd = local_worker_command(lay, 2, 41234, {"model": "gpt", "size": "tiny"}, steps=3, seed=1,
                               check=True)
    assert cmd[:3] == [sys.executable, "-m", "autoplan.exec._worker"]
    opts = dict(zip(cmd[3::1], cmd[4::1]))
    assert opts["--plan"] == "-" and "--launcher-pipe" in cmd and "--loopback" in cmd
    assert (opts["--process-id"], opts["--num-processes"], opts["--coordinator"]) == ("2", "4", "127.0.0.1:41234")
    assert (opts["--platform"], opts["--devices-per-process"]) == ("cuda", "1")
    assert json.loads(opts["--workload"]) == {"model": "gpt", "size": "tiny"}
    # GPUs already narrowed by the caller: workers take the visible ones in order
    lay = choose_layout(2, H100, env={"CUDA_VISIBLE_DEVICES": "5,7,2", "NCCL_SOCKET_IFNAME": "ib0"})
    assert [lay.env(i, {"NCCL_SOCKET_IFNAME": "ib0"}) for i in range(2)] == [
        {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "5"},
        {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "7"}]
    # one worker per host with all its GPUs; two workers of two GPUs
    lay = choose_layout(8, H100, per_host=True, env={})
    assert (lay.num_processes, lay.devices_per_process, lay.env(0, {})["CUDA_VISIBLE_DEVICES"]) == \
        (1, 8, "0,1,2,3,4,5,6,7")
    lay = choose_layout(4, H100, num_processes=2, env={})
    assert [lay.env(i, {})["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["0,1", "2,3"]
    # ROCm picks GPUs with ROCR_VISIBLE_DEVICES
    lay = choose_layout(4, MI300, env={})
    assert [lay.env(i, {})["ROCR_VISIBLE_DEVICES"] for i in range(4)] == ["0", "1", "2", "3"]
    assert lay.platform == "rocm"


def test_a_plan_for_more_gpus_than_attached_is_refused_with_the_cluster_commands():
    with pytest.raises(LaunchError) as info:
        choose_layout(16, H100, cluster_hint="Run it on a cluster:\n  slurm: srun ...\n")
    msg = str(info.value)
    assert "the plan uses 16 devices but this machine has 8 gpu devices (NVIDIA H100" in msg
    assert "srun" in msg and "make a plan for 8 devices" in msg and "platform='cpu'" in msg


def test_tpu_hosts_run_one_worker_with_every_chip():
    lay = choose_layout(4, TPU)
    assert (lay.platform, lay.num_processes, lay.devices_per_process) == ("tpu", 1, 4)
    with pytest.raises(LaunchError, match="one worker per host holds every chip"):
        choose_layout(2, TPU)
    with pytest.raises(LaunchError, match="TPU hosts run one worker each"):
        choose_layout(4, TPU, num_processes=2)


def _split(cmd: str) -> tuple[list[str], list[str]]:
    argv = shlex.split(cmd)
    i = argv.index(sys.executable)
    return argv[:i], argv[i:]


def test_slurm_commands_start_one_task_per_gpu_and_rely_on_jax_cluster_detection(tmp_path):
    spec = {"model": "mypkg.train:workload", "hidden": 256}
    cmd = cluster_command("slurm", "plan.json", spec, 16, 8, steps=5, seed=3,
                          pythonpath=["/src", "/work"])
    launcher, worker = _split(cmd)
    assert launcher == ["srun", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8",
                        "--gpus-per-node=8", "--kill-on-bad-exit=1",
                        "--export=ALL,PYTHONPATH=/src:/work"]
    assert worker[1:3] == ["-m", "autoplan.exec._worker"]
    opts = dict(zip(worker[3::2], worker[4::2]))
    assert opts["--plan"].endswith("/plan.json") and opts["--plan"].startswith("/")
    assert json.loads(opts["--workload"]) == spec
    assert (opts["--steps"], opts["--seed"]) == ("5", "3")
    # no coordinator, process id or count: jax.distributed.initialize() reads SLURM's variables
    assert not {"--coordinator", "--process-id", "--num-processes", "--platform"} & set(worker)
    # one task per node holding its 8 GPUs
    launcher, worker = _split(cluster_command("slurm", "plan.json", spec, 16, 8, per_host=True,
                                              pythonpath=[]))
    assert launcher[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--gpus-per-node=8"]
    assert worker[worker.index("--devices-per-process") + 1] == "8"
    # emulated CPU devices: one task per node
    launcher, worker = _split(cluster_command("slurm", "plan.json", spec, 8, 8, nodes=2,
                                              platform="cpu", pythonpath=[]))
    assert launcher[:4] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    assert not any(a.startswith("--gpus") for a in launcher)
    assert worker[worker.index("--platform") + 1] == "cpu"
    assert worker[worker.index("--devices-per-process") + 1] == "4"


def test_mpirun_commands():
    launcher, worker = _split(cluster_command("mpi", "/plans/p.json", {"model": "gpt"}, 16, 8,
                                              pythonpath=["/src"]))
    assert launcher == ["mpirun", "-np", "16", "--map-by", "ppr:8:node", "--bind-to", "none",
                        "-x", "PYTHONPATH=/src"]
    assert worker[worker.index("--plan") + 1] == "/plans/p.json"
    with pytest.raises(LaunchError, match="should be one of \\['slurm', 'mpi'\\]"):
        cluster_command("pbs", "p.json", {"model": "gpt"}, 8, 8)
    with pytest.raises(LaunchError, match="do not spread evenly over 3 nodes"):
        cluster_command("slurm", "p.json", {"model": "gpt"}, 8, 8, nodes=3)


def test_workers_get_the_callers_module_path_but_not_the_interpreters_own(tmp_path, monkeypatch):
    import os

    monkeypatch.chdir(tmp_path)
    extra = tmp_path / "src"
    extra.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(extra), "relative_missing"])
    path = worker_pythonpath()
    assert str(tmp_path) in path and str(extra) in path
    assert not any("site-packages" in p or p.endswith("lib-dynload") for p in path)
    import autoplan

    assert os.path.dirname(os.path.dirname(autoplan.__file__)) == path[0]


def test_spec_arguments_are_the_cli_form():
    assert spec_arguments({"model": "gpt", "size": "tiny", "layers": 3, "dtype": "bfloat16"}) == \
        'gpt --size tiny --set layers=3 --set dtype="bfloat16"'


def _beat(w, progress, **kw):
    return {"event": "heartbeat", "worker": w, "progress": progress, **kw}


def test_the_watchdog_fails_a_launch_only_when_no_worker_progresses():
    wd = Watchdog(2, now=0.0)
    assert wd.limit == HANG_FLOOR  # nothing measured yet: the floor, for the first steps
    wd.see(_beat(0, 1), 10.0)
    wd.see(_beat(1, 1), 10.0)
    assert wd.stalled(10.0 + HANG_FLOOR - 1, [0, 1]) is None
    # worker 0 keeps computing; worker 1 is blocked (its counter does not move)
    for t in range(11, 100):
        wd.see(_beat(0, t), float(t))
        wd.see(_beat(1, 1, where="x.py:1 wait"), float(t))
    assert wd.stalled(99.0, [0, 1]) is None  # one worker progresses: the launch is alive
    # a worker inside XLA's compiler counts as progressing even with an unmoved counter
    for t in range(100, 200):
        wd.see(_beat(0, 99, compiling=True), float(t))
    assert wd.stalled(199.0, [0, 1]) is None
    # both stalled past the floor: hung, and the message says where each one is
    wd.see(_beat(0, 99, phase="running", step=0, stack=["a.py:3 step", "b.py:9 run"]), 200.0)
    msg = wd.stalled(200.0 + HANG_FLOOR, [0, 1])
    assert msg is not None and "no worker made progress" in msg
    assert "worker 0 in phase 'running' after step 0" in msg and "a.py:3 step <- b.py:9 run" in msg
    assert "worker 1" in msg and "x.py:1 wait" in msg
    assert wd.stalled(200.0 + HANG_FLOOR, []) is None  # nobody running: nothing hangs
    # steps raise the limit to HANG_FACTOR x the slowest; a fixed hang_timeout overrides
    wd.see({"event": "step", "worker": 0, "step_time": 30.0}, 300.0)
    assert wd.limit == HANG_FACTOR * 30.0
    # checking against one device does every device's work there: a longer default limit
    wd = Watchdog(2, 0.0, check_scale=8)
    wd.see(_beat(0, 1, phase="checking"), 0.0)
    wd.see(_beat(1, 1, phase="running"), 0.0)
    assert (wd.limit_of(0), wd.limit_of(1)) == (8 * HANG_FLOOR, HANG_FLOOR)
    assert wd.stalled(HANG_FLOOR + 1, [0, 1]) is None and wd.stalled(HANG_FLOOR + 1, [1]) is not None
    assert Watchdog(1, 0.0, hang_timeout=7).limit == 7
    assert Watchdog(1, 0.0, hang_timeout=7).stalled(7.5, [0]).startswith(
        "no worker made progress for 7 s (the limit: hang_timeout=7 s)")


def test_workers_read_their_scheduler_as_jax_does():
    assert cluster_kind({}) is None
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_NTASKS": "2",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    assert cluster_kind(slurm) == "slurm"
    assert cluster_kind({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}) is None  # an allocation, no task
    assert cluster_kind({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:3000",
                         "OMPI_COMM_WORLD_SIZE": "2"}) == "ompi"
    assert cluster_kind({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}) == "mpi4py"
    # process 0 binds where the scheduler's name for it resolves, unless that is loopback
    assert _scheduler_bind("10.1.2.3:61234") == "10.1.2.3:61234"
    assert _scheduler_bind("[fd00::7]:61234") == "[fd00::7]:61234"
    assert _scheduler_bind("127.0.0.1:61234") is None and _scheduler_bind("localhost:61234") is None


def test_the_attached_devices_are_found_by_a_probe_process(monkeypatch):
    import os

    from autoplan.exec import _probe as _devices
    from autoplan.exec import detect_devices

    monkeypatch.setattr(_devices, "_DETECTED", {})
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    info = detect_devices(env=env)
    assert (info.platform, info.runtime, info.accelerator) == ("cpu", "cpu", False)
    assert info.describe() == "no accelerator attached (CPU)"
    assert list(_devices._DETECTED.values()) == [info]  # asked once per environment
    monkeypatch.setattr(_devices, "preflight", lambda *a, **k: pytest.fail("probed again"))
    assert detect_devices(env=env) is info
