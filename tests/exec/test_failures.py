"""Failures that must not take the caller's process down.

* A training step whose Python callback raises: inside a sharded program with collectives XLA
  would end the whole process (the other devices wait in the collective until its rendezvous
  times out), so ``run`` first runs such a step on one device, where the failure is an ordinary
  exception, and raises :class:`ExecutionError`; the process then runs the next plan.
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

from autoplan import ExecutionError
from autoplan.exec import run


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
