"""The zoo's Adam: its jitted update traces to the plain update's operators and computes its
numbers, and a step traced again at other batch shapes reuses the update's trace."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import autoplan
from autoplan.models import _adam, get
from autoplan.models._adam import _phases, _update, _update_jit, adam_update


def _ops(graph):
    return [(op.primitive, op.params, op.inputs, op.outputs, op.flops, op.scope, op.role,
             op.in_shapes, op.in_dtypes) for op in graph.ops]


def _plain_step(wl):
    """The zoo's train step with the plain (unjitted) update: the same equations, each bound
    where the tree map reaches it."""
    lr = wl.config["learning_rate"]

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(wl.loss_fn)(params, batch)
        hyper = (lr, 0.9, 0.999, 1e-8)
        new_params, new_state = _update(params, grads, opt_state, hyper, True, _phases(*hyper))
        return loss, new_params, new_state

    return autoplan.Workload(train_step, wl.args, name=wl.name, arg_kinds=wl.arg_kinds)


@pytest.mark.parametrize("name,kw", [("gpt", {}), ("gpt", {"dtype": "float16", "master_weights": "float32"}),
                                     ("wide_resnet", {"dtype": "bfloat16", "master_weights": "float32"}),
                                     ("moe", {})])
def test_jitted_update_traces_to_the_plain_updates_operators(name, kw):
    wl = get(name, "tiny", **kw)
    jitted, plain = autoplan.trace(wl), autoplan.trace(_plain_step(wl))
    assert len(jitted.ops) == len(plain.ops)
    assert _ops(jitted) == _ops(plain)
    assert [(t.shape, t.dtype, t.producer) for t in jitted.tensors] == \
        [(t.shape, t.dtype, t.producer) for t in plain.tensors]
    assert sum(op.role == "update" for op in jitted.ops) > 0


def test_a_step_traced_at_another_batch_size_reuses_the_updates_trace():
    wl = get("gpt", "tiny", batch=8)
    autoplan.trace(wl)
    before = _update_jit._cache_size()
    g = autoplan.trace(get("gpt", "tiny", batch=4))  # other activations, the same parameters
    assert _update_jit._cache_size() == before
    assert {g.tensors[gi.tensor].shape[0] for gi in g.inputs if gi.kind == "batch"} == {4}


@pytest.mark.parametrize("master", ["none", "float32"])
def test_jitted_update_computes_the_plain_updates_numbers(master):
    wl = get("mlp", "tiny", dtype="float16" if master == "float32" else "float32",
             master_weights=master, abstract=False)
    params, state, _ = wl.args
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(p.dtype), params)
    hyper = (1e-3, 0.9, 0.999, 1e-8)
    got = adam_update(params, grads, state, learning_rate=1e-3)
    want = _update(params, grads, state, hyper, True, _phases(*hyper))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                   rtol=1e-6, atol=1e-7)
    # (a second step from the first's state: the count and bias corrections move on)
    again = adam_update(got[0], grads, got[1], learning_rate=1e-3)
    assert int(again[1]["count"]) == 2


def test_hyperparameters_that_are_not_python_numbers_run_the_plain_update(monkeypatch):
    calls = []
    monkeypatch.setattr(_adam, "_update_jit", lambda *a, **k: calls.append(1))
    wl = get("mlp", "tiny", abstract=False)
    params, state, _ = wl.args
    grads = jax.tree.map(np.ones_like, params)
    out = adam_update(params, grads, state, learning_rate=np.float32(1e-3))
    assert not calls and int(out[1]["count"]) == 1
    adam_update(params, grads, state, learning_rate=1e-3)
    assert calls == [1]
