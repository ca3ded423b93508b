"""Shared cases of the executor's tests: tiny zoo workloads and hand-made plans, built once.

(A module of its own, not ``conftest``: the root ``conftest.py`` already owns that module name.)
"""

from __future__ import annotations

import functools

import jax
from exec_plans import data_parallel_plan, pipeline_plan, tensor_parallel_plan

from autoplan import models
from autoplan.exec import _run

#: same HLO and collectives; CPU code generated 3-4x faster (measured on the tiny Wide-ResNet)
FAST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
MODELS = sorted(models.list_models())


@functools.cache
def workload(name: str):
    """The tiny concrete workload of a zoo model (one object per model, so caches hit)."""
    return models.get(name, "tiny", abstract=False)


@functools.cache
def graph(name: str):
    """Its traced graph (the executor's own cached trace, so each model is traced once)."""
    return _run._graph(_run.resolve_workload(workload(name)))


@functools.cache
def plan(name: str, kind: str, schedule: str = "gpipe", microbatches: int = 2):
    """A hand-made plan: ``kind`` is ``"dp"``, ``"tp"`` or ``"pp"``."""
    wl, g = workload(name), graph(name)
    if kind == "dp":
        return data_parallel_plan(wl, g)
    if kind == "tp":
        return tensor_parallel_plan(wl, g)
    return pipeline_plan(wl, g, schedule=schedule, microbatches=microbatches)


def single_device_losses(wl, steps: int) -> list[float]:
    """The losses of ``steps`` training steps of ``jax.jit(wl.fn)`` on one device, each from the
    previous step's parameters and optimizer state, on the same batch."""
    f = jax.jit(wl.fn)
    args, losses = wl.args, []
    for _ in range(steps):
        loss, params, opt = f(*args)
        losses.append(float(loss))
        args = (params, opt, args[2])
    return losses
