"""How a plan's devices map onto worker processes: on this machine, or on a cluster.

On this machine (:func:`choose_layout`), from what :mod:`autoplan.exec._probe` found:

* **GPUs**: one worker per GPU (JAX's convention for ``jax.distributed``): worker ``i`` sees only
  its own GPU, ``CUDA_VISIBLE_DEVICES`` (``ROCR_VISIBLE_DEVICES`` on ROCm) set to the ``i``-th
  entry of this process's visible GPUs; with ``per_host`` one worker holds all the GPUs the plan
  uses. NCCL's sockets stay on the loopback interface (``NCCL_SOCKET_IFNAME=lo`` unless set).
  A plan for more GPUs than are attached is refused with the commands that run it on a cluster.
* **TPU**: one worker per host, holding every chip (the plan must use them all).
* **No accelerator**: devices are emulated on the CPU (``jax_num_cpu_devices``); by default two
  workers when the plan's device count is even, as two hosts would run it, else one.

On a cluster (:func:`cluster_command`): an ``srun`` (SLURM) or ``mpirun`` (Open MPI) line that
starts the same worker, ``python -m autoplan.exec._worker``, once per GPU (or once per node with
``per_host``, or for CPU and TPU), reading the plan from a path every node sees. The workers call
``jax.distributed.initialize()`` without arguments, and JAX reads the coordinator, the process
count and id, and each process's local GPU from the scheduler's variables.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import site
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoplan._errors import LaunchError, PlanMismatchError
from autoplan.exec._probe import DeviceInfo

__all__ = ["WorkerLayout", "choose_layout", "cluster_command", "local_worker_command",
           "worker_args", "worker_pythonpath", "VISIBLE_DEVICES", "CLUSTER_KINDS"]

#: the variable that picks a worker's GPUs, per runtime
VISIBLE_DEVICES = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "ROCR_VISIBLE_DEVICES"}
#: schedulers :func:`cluster_command` writes commands for
CLUSTER_KINDS = ("slurm", "mpi")
WORKER_MODULE = "autoplan.exec._worker"


@dataclass(frozen=True)
class WorkerLayout:
    """Worker processes of a local launch.

    Attributes:
        platform: the workers' ``JAX_PLATFORMS`` (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``).
        num_processes: workers.
        devices_per_process: devices of each.
        emulated: CPU devices emulated with ``jax_num_cpu_devices`` (no accelerator is used).
        visible: per worker, the value of ``visible_var`` (None: left as it is).
        visible_var: ``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES``, or None.
        devices: what was detected (for an asked-for platform, what was found of it).
        requested: the platform was asked for (``platform=``), not detected.
    """

    platform: str
    num_processes: int
    devices_per_process: int
    emulated: bool
    visible: tuple[str | None, ...]
    visible_var: str | None
    devices: DeviceInfo
    requested: bool = False

    def env(self, index: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment variables worker ``index`` gets on top of ``base``."""
        base = base or {}
        out = {"JAX_PLATFORMS": self.platform}
        if self.visible_var is not None and self.visible[index] is not None:
            out[self.visible_var] = self.visible[index]
        if self.platform in VISIBLE_DEVICES and "NCCL_SOCKET_IFNAME" not in base:
            out["NCCL_SOCKET_IFNAME"] = "lo"  # a local job: NCCL's sockets on loopback
        return out

    def describe(self) -> str:
        """E.g. ``"2 processes x 4 emulated CPU devices (no accelerator attached)"``."""
        procs = f"{self.num_processes} process{'es' if self.num_processes != 1 else ''}"
        if self.emulated:
            why = " (platform cpu asked for)" if self.requested else " (no accelerator attached)"
            return f"{procs} x {self.devices_per_process} emulated CPU devices{why}"
        unit = self.devices.platform.upper()
        return (f"{procs} x {self.devices_per_process} {unit}{'s' if self.devices_per_process != 1 else ''}"
                f" ({self.devices.kind}, {self.platform})")


def _positive(name: str, v: Any) -> None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise LaunchError(f"launch: {name} should be a positive integer or None (chosen for you). "
                          f"Got {v!r}. Fix: e.g. {name}=2, or leave it out.")


def choose_layout(num_devices: int, devices: DeviceInfo, num_processes: int | None = None,
                  devices_per_process: int | None = None, *, per_host: bool = False,
                  env: Mapping[str, str] | None = None, cluster_hint: str = "",
                  requested: bool = False) -> WorkerLayout:
    """The workers that run a plan of ``num_devices`` devices on this machine.

    Args:
        num_devices: the plan's device count.
        devices: the attached devices (:func:`~autoplan.exec._probe.detect_devices`); a
            ``"cpu"`` platform means emulated devices.
        num_processes, devices_per_process: fixed by the caller, or None to choose (one of them
            may be given: the other is the quotient).
        per_host: GPUs: one worker holding every GPU the plan uses, instead of one per GPU.
        env: the environment the workers inherit (for the visible GPUs already set).
        cluster_hint: text telling how to run a plan that needs more devices than attached.
        requested: the platform was asked for rather than detected (said by ``describe()``).

    Raises:
        PlanMismatchError: both counts given and their product is not ``num_devices``.
        LaunchError: the counts do not divide ``num_devices``, the plan needs more GPUs than are
            attached, or a TPU plan does not use every chip of the host.
    """
    _positive("num_processes", num_processes)
    _positive("devices_per_process", devices_per_process)
    env = os.environ if env is None else env
    d = num_devices
    if devices.platform == "cpu":
        if num_processes is None and devices_per_process is None:
            num_processes = 1 if per_host or d % 2 or d < 2 else 2
        p, k = _split(d, num_processes, devices_per_process, "emulated CPU devices")
        return WorkerLayout("cpu", p, k, True, (None,) * p, None, devices, requested)
    if devices.platform == "tpu":
        if (num_processes or 1) != 1:
            raise LaunchError(f"launch: TPU hosts run one worker each. Got num_processes="
                              f"{num_processes}. Fix: leave num_processes out.")
        if d != devices.count:
            raise LaunchError(
                f"launch: the plan uses {d} TPU devices but this host has {devices.count} "
                f"({devices.kind}); one worker per host holds every chip. Fix: make a plan for "
                f"{devices.count} devices, or run it on a slice with that many per host."
                + (f" {cluster_hint}" if cluster_hint else ""))
        return WorkerLayout("tpu", 1, d, False, (None,), None, devices, requested)
    if d > devices.count:
        raise LaunchError(
            f"launch: the plan uses {d} devices but this machine has {devices.describe()}. "
            + (cluster_hint or "Fix: run it on a cluster (autoplan launch PLAN.json --model ... "
               "--print-command slurm|mpi prints the command)")
            + f" Or make a plan for {devices.count} device{'s' if devices.count != 1 else ''}, or "
              "pass --platform cpu (platform='cpu') to emulate the devices on the CPU.")
    if num_processes is None and devices_per_process is None:
        devices_per_process = d if per_host else 1
    p, k = _split(d, num_processes, devices_per_process, f"{devices.platform} devices")
    var = VISIBLE_DEVICES.get(devices.runtime)
    ids = [s.strip() for s in env.get(var, "").split(",") if s.strip()] if var else []
    if not ids:
        ids = [str(i) for i in range(devices.count)]
    visible = tuple(",".join(ids[i * k:(i + 1) * k]) if var else None for i in range(p))
    return WorkerLayout(devices.runtime, p, k, False, visible, var, devices, requested)


def _split(d: int, p: int | None, k: int | None, what: str) -> tuple[int, int]:
    if p is not None and k is not None:
        if p * k != d:
            raise PlanMismatchError(
                f"launch: the plan uses {d} devices but num_processes x devices_per_process = "
                f"{p} x {k} = {p * k}. Fix: choose them so the product is {d}, leave them out "
                "(chosen for you), or make a plan for that many devices.")
        return p, k
    if p is not None:
        if d % p:
            raise LaunchError(f"launch: {d} {what} do not split evenly over num_processes={p}. "
                              f"Fix: a divisor of {d}, or leave it out.")
        return p, d // p
    assert k is not None
    if d % k:
        raise LaunchError(f"launch: {d} {what} do not split evenly into devices_per_process={k}. "
                          f"Fix: a divisor of {d}, or leave it out.")
    return d // k, k


def worker_pythonpath(extra: Sequence[str] = ()) -> list[str]:
    """The module search path workers need: this autoplan, the current directory, and the
    entries of ``sys.path`` that are not the interpreter's own (the caller's ``PYTHONPATH``, a
    notebook's ``sys.path.append``...); relative entries made absolute.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = sysconfig.get_paths()
    own = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")
           if paths.get(k)}
    own |= {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
    stdlib_zip = os.path.realpath(os.path.join(sys.base_prefix, "lib",
                                               f"python{sys.version_info[0]}{sys.version_info[1]}.zip"))
    out: list[str] = []
    for p in [root, os.getcwd(), *extra, *sys.path]:
        p = os.path.abspath(p or os.getcwd())
        real = os.path.realpath(p)
        if p in out or real == stdlib_zip or not os.path.exists(p):
            continue
        if any(real == o or real.startswith(o + os.sep) for o in own):
            continue  # the interpreter's own: every worker has it
        out.append(p)
    return out


def worker_args(plan_path: str, spec: Mapping[str, Any], *, steps: int, seed: int, check: bool,
                platform: str | None, devices_per_process: int | None,
                python: str | None = None) -> list[str]:
    """The worker's command line (plan read from ``plan_path``; no launcher pipe)."""
    cmd = [python or sys.executable, "-m", WORKER_MODULE, "--plan", plan_path,
           "--workload", json.dumps(dict(spec), separators=(",", ":")), "--steps", str(steps),
           "--seed", str(seed)]
    if platform:
        cmd += ["--platform", platform]
    if devices_per_process:
        cmd += ["--devices-per-process", str(devices_per_process)]
    if not check:
        cmd.append("--no-check")
    return cmd


def local_worker_command(layout: WorkerLayout, index: int, port: int, spec: Mapping[str, Any], *,
                         steps: int, seed: int, check: bool, python: str | None = None,
                         compiler_options: Mapping[str, Any] | None = None,
                         heartbeat: float = 2.0) -> list[str]:
    """Worker ``index``'s command line in a local launch: the plan on stdin (``--plan -``), the
    launcher's pipe watched, the coordinator on ``127.0.0.1:port``, everything on loopback, and
    heartbeats every ``heartbeat`` seconds. Its environment adds ``layout.env(index)``."""
    cmd = [python or sys.executable, "-m", WORKER_MODULE, "--plan", "-", "--launcher-pipe",
           "--workload", json.dumps(dict(spec), separators=(",", ":")),
           "--process-id", str(index), "--num-processes", str(layout.num_processes),
           "--coordinator", f"127.0.0.1:{port}", "--loopback", "--platform", layout.platform,
           "--devices-per-process", str(layout.devices_per_process), "--steps", str(steps),
           "--seed", str(seed), "--heartbeat", f"{heartbeat:g}"]
    if not check:
        cmd.append("--no-check")
    if compiler_options:
        cmd += ["--compiler-options", json.dumps(dict(compiler_options))]
    return cmd


def cluster_command(kind: str, plan_path: str, spec: Mapping[str, Any], num_devices: int,
                    devices_per_node: int, *, nodes: int | None = None, platform: str | None = None,
                    per_host: bool = False, steps: int = 2, seed: int = 0, check: bool = True,
                    python: str | None = None, pythonpath: Sequence[str] | None = None) -> str:
    """The shell command that runs a plan on a SLURM or Open MPI cluster.

    Args:
        kind: ``"slurm"`` (an ``srun`` line, run inside an allocation or with ``sbatch``) or
            ``"mpi"`` (an ``mpirun`` line for Open MPI 4, whose ``OMPI_MCA_orte_hnp_uri`` JAX
            reads; Open MPI 5 needs ``mpi4py`` on the nodes, which the worker then uses).
        plan_path: the plan file; it must be readable at this path on every node.
        spec: the workload spec (importable on every node, from the same ``PYTHONPATH``).
        num_devices: the plan's device count.
        devices_per_node: devices of one node (the plan's cluster's ``devices_per_node``).
        nodes: nodes to use (default: as many as the devices need).
        platform: the workers' JAX platform (None: JAX's default on the nodes, the GPUs there).
        per_host: accelerators: one worker per node holding every device of it, instead of one
            per device. CPU and TPU always run one worker per node.
        steps, seed, check: as :func:`autoplan.exec.launch`.
        python: the Python executable on the nodes (default this one's path).
        pythonpath: the nodes' ``PYTHONPATH`` (default :func:`worker_pythonpath`).

    Returns:
        One line of shell (``shlex``-quoted).

    Raises:
        LaunchError: an unknown kind, or devices that do not spread evenly over the nodes.
    """
    if kind not in CLUSTER_KINDS:
        raise LaunchError(f"--print-command should be one of {list(CLUSTER_KINDS)}. Got {kind!r}. "
                          "Fix: --print-command slurm (srun) or --print-command mpi (mpirun).")
    _positive("nodes", nodes)
    d = num_devices
    per_node = max(1, min(devices_per_node, d))
    n = nodes or math.ceil(d / per_node)
    if d % n:
        raise LaunchError(f"launch: {d} devices do not spread evenly over {n} nodes. Fix: "
                          f"--nodes a divisor of {d}.")
    g = d // n  # devices used on each node
    one_per_node = per_host or platform in ("cpu", "tpu")
    tasks_per_node = 1 if one_per_node else g
    k = g if one_per_node else 1
    argv = worker_args(os.path.abspath(plan_path), spec, steps=steps, seed=seed, check=check,
                       platform=platform, devices_per_process=k if (k > 1 or platform == "cpu")
                       else None, python=python)
    pp = ":".join(worker_pythonpath() if pythonpath is None else pythonpath)
    ntasks = n * tasks_per_node
    if kind == "slurm":
        cmd = ["srun", f"--nodes={n}", f"--ntasks={ntasks}", f"--ntasks-per-node={tasks_per_node}"]
        if platform not in ("cpu", "tpu"):
            cmd.append(f"--gpus-per-node={g}")
        cmd += ["--kill-on-bad-exit=1", f"--export=ALL,PYTHONPATH={pp}"]
    else:
        cmd = ["mpirun", "-np", str(ntasks), "--map-by", f"ppr:{tasks_per_node}:node",
               "--bind-to", "none", "-x", f"PYTHONPATH={pp}"]
    return shlex.join(cmd + argv)
