"""The predicted communication is what XLA compiles: for every zoo model (tiny), the searched
plan on a 1-D and a 2-D mesh of the 8 emulated devices, compiled by the executor (which pins the
plan's heavy operators and both ends of every resharding), moves the predicted bytes per device
within 10% in total (``benchmarks/comm_validation.py`` prints the full table, medium sizes too)."""

from __future__ import annotations

import warnings

import pytest

import autoplan
from autoplan import models
from autoplan.exec import run

FAST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


@pytest.mark.parametrize("name", sorted(models.list_models()))
@pytest.mark.parametrize("mesh", [(8, 1), (2, 4)])
def test_compiled_communication_matches_the_prediction(name, mesh):
    wl = models.get(name, "tiny", abstract=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autoplan.plan(wl, "cpu:8", pipeline=False, baselines=False, mesh_shape=mesh,
                             level="exhaustive")
    rep = run(plan, wl, steps=0, check=False, compiler_options=FAST)
    predicted = sum(rep.predicted_comm_bytes.values())
    compiled = sum(rep.comm_bytes.values())
    assert compiled == pytest.approx(predicted, rel=0.10, abs=1024), (
        f"{name} on {mesh}: predicted {rep.predicted_comm_bytes}, compiled {rep.comm_bytes}")
