"""Failures that must not take the caller's process down, and honest equivalence verdicts on
non-finite values.

* A training step whose Python callback raises: inside a sharded program with collectives XLA
  would end the whole process (the other devices wait in the collective until its rendezvous
  times out), so ``run`` first runs such a step on one device, where the failure is an ordinary
  exception, and raises :class:`ExecutionError`; the process then runs the next plan.
* NaN and infinity are compared position by position (NaN equals NaN, an infinity the infinity of
  the same sign), and the verdict says when the inputs themselves are not finite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exec_cases import plan, workload
from exec_plans import data_parallel_plan, traced

from autoplan import EquivalenceError, ExecutionError, NonFiniteError
from autoplan.exec import run
from autoplan.exec._run import _compare, nonfinite_leaves
from autoplan.plans._plan import Schedule


@dataclasses.dataclass
class _Step:
    """A user's own training step (not from the zoo)."""

    name: str
    fn: Callable[..., Any]
    args: tuple
    arg_kinds: tuple = ("parameter", "optimizer_state", "batch")
    config: dict = dataclasses.field(default_factory=dict)


def _regression(name: str, loss_of: Callable, log: Callable | None = None,
                x: np.ndarray | None = None) -> _Step:
    """Linear regression trained by SGD; ``log`` is called with the loss from inside the
    compiled step (``jax.debug.callback``, as users log metrics)."""
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((8, 4)).astype(np.float32)}
    batch = {"x": rng.standard_normal((16, 8)).astype(np.float32) if x is None else x,
             "y": rng.standard_normal((16, 4)).astype(np.float32)}

    def step(params, opt_state, batch):
        loss, g = jax.value_and_grad(lambda p: loss_of(p, batch))(params)
        if log is not None:
            jax.debug.callback(log, loss)
        new = jax.tree.map(lambda a, b: a - 0.1 * b, params, g)
        return loss, new, {"count": opt_state["count"] + 1}

    return _Step(name, step, (params, {"count": np.zeros((), np.int32)}, batch))


def _mse(p, batch):
    return jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2)


def test_a_failing_callback_raises_and_the_process_runs_the_next_plan(fast):
    def log(loss):
        raise ValueError("the metrics logger is down")

    bad = _regression("regression", _mse, log)
    p = data_parallel_plan(bad, traced(bad))
    with pytest.raises(ExecutionError) as info:
        run(p, bad, compiler_options=fast)
    msg = str(info.value)
    assert "calls back into Python (debug_callback)" in msg and "failed on one device" in msg
    assert "the metrics logger is down" in msg and "Fix:" in msg
    # the process is intact: the next run works
    rep = run(plan("mlp", "dp"), workload("mlp"), compiler_options=fast)
    assert rep.equivalence.matched


def test_a_working_callback_runs_under_the_plan(fast):
    seen: list[float] = []
    ok = _regression("regression", _mse, lambda loss: seen.append(float(loss)))
    p = data_parallel_plan(ok, traced(ok))
    rep = run(p, ok, compiler_options=fast)
    assert rep.equivalence.matched
    assert rep.losses[0] == pytest.approx(seen[0], rel=1e-6)  # the sharded step called it too


def test_identical_nan_losses_match_and_the_verdict_names_the_non_finite_input(fast):
    wl = workload("mlp")
    params, opt, batch = wl.args
    x = np.array(batch["x"])
    x[3, 1] = np.nan
    nan_wl = dataclasses.replace(wl, args=(params, opt, {**batch, "x": x}))
    with pytest.raises(NonFiniteError, match="One device computes the same non-finite values"):
        run(plan("mlp", "dp"), nan_wl, compiler_options=fast)  # a NaN loss ends the run
    rep = run(plan("mlp", "dp"), nan_wl, compiler_options=fast, allow_nonfinite=True)
    assert np.isnan(rep.losses[0]) and "the model's numbers" in rep.nonfinite
    eq = rep.equivalence
    assert eq.matched and eq.nonfinite_inputs == ("batch['x'] (1 NaN)",)
    assert "the inputs are not finite (batch['x'] (1 NaN))" in eq.message


def test_a_mismatch_with_non_finite_inputs_says_so(fast):
    # a loss that is a sum, not a mean: averaging two micro-batches halves it (a real mismatch),
    # and one NaN in the batch is skipped by the sum but spreads into the gradients
    x = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    x[0, 0] = np.nan
    wl = _regression("summed", lambda p, b: jnp.nansum((b["x"] @ p["w"]) ** 2), x=x)
    p = data_parallel_plan(wl, traced(wl))
    p = dataclasses.replace(p, schedule=Schedule("1f1b", 2, 1))
    with pytest.raises(EquivalenceError) as info:
        run(p, wl, compiler_options=fast)
    msg = str(info.value)
    assert msg.startswith("loss (step 0) differs from single-device execution: max |diff|")
    assert "the inputs themselves are not finite (batch['x'] (1 NaN))" in msg


def test_non_finite_values_are_compared_position_by_position():
    nan, inf = np.nan, np.inf
    a = np.array([1.0, nan, inf, -inf, 2.0])
    assert _compare(a, a.copy(), 0.0, 0.0) == (0.0, 0.0, 0)
    # finite differences are still measured next to matching NaNs
    d, ratio, bad = _compare(a + np.array([0, 0, 0, 0, 1e-3]), a, 1e-5, 1e-6)
    assert bad == 0 and d == pytest.approx(1e-3) and ratio > 1
    assert _compare(np.array([inf]), np.array([-inf]), 1e-5, 1e-6)[2] == 1
    assert _compare(np.array([nan, 1.0]), np.array([1.0, nan]), 1e-5, 1e-6)[2] == 2
    assert _compare(np.array([inf]), np.array([1e30]), 1.0, 1.0)[2] == 1


def test_non_finite_inputs_are_listed_by_path():
    args = ({"w": np.array([1.0, np.inf, -np.inf])}, {"count": np.int32(3)},
            {"x": np.array([[np.nan, np.nan]])})
    assert nonfinite_leaves(args) == ["params['w'] (2 inf)", "batch['x'] (2 NaN)"]
    assert nonfinite_leaves((np.ones(3),)) == []
