"""The ranking metrics of ``benchmarks/fidelity.py`` (Spearman's rho with 5% ties, regret, MRR,
median error) on hand examples; the benchmark itself is run on a quiet machine."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def fid():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "fidelity.py"
    spec = importlib.util.spec_from_file_location("autoplan_benchmark_fidelity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tie_ranks_group_runs_within_five_percent(fid):
    assert fid.tie_ranks([1.0, 3.0, 2.0]) == [1.0, 3.0, 2.0]
    # 1.00, 1.04 and 1.08 chain into one tie (each within 5% of the next); 2.0 stands alone
    assert fid.tie_ranks([1.04, 2.0, 1.0, 1.08]) == [2.0, 4.0, 2.0, 2.0]
    assert fid.tie_ranks([1.0, 1.04], tie=0.0) == [1.0, 2.0]


def test_ranking_metrics(fid):
    pred = [1.0, 2.0, 3.0, 4.0]
    assert fid.spearman(pred, [10.0, 20.0, 30.0, 40.0]) == pytest.approx(1.0)
    assert fid.spearman(pred, [40.0, 30.0, 20.0, 10.0]) == pytest.approx(-1.0)
    # the measured best was predicted second: regret is the predicted-best plan's excess
    meas = [12.0, 10.0, 30.0, 40.0]
    assert fid.regret(pred, meas) == pytest.approx(0.2)
    assert fid.mrr(pred, meas) == pytest.approx(0.5)
    # within 5% of the measured best counts as the best (a tie)
    assert fid.mrr(pred, [10.3, 10.0, 30.0, 40.0]) == 1.0
    assert fid.error([2.0, 1.0], [1.0, 1.0]) == pytest.approx(0.5)
    assert fid.error([1.0, 1.0, 4.0], [2.0, 1.0, 1.0]) == pytest.approx(0.5)
    assert math.isnan(fid.spearman([1.0], [1.0]))


def test_user_step_is_plain_jax(fid):
    import jax  # noqa: PLC0415

    wl = fid.workload("user_mlp", "tiny")
    loss, params, momentum = jax.jit(wl.fn)(*wl.args)
    assert loss.shape == () and set(params) == {"w1", "b1", "w2", "b2", "w3"}
    assert jax.tree.structure(momentum) == jax.tree.structure(wl.args[1])
