"""The executor's interpreter visits exactly the trace's operators, in the trace's order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exec_cases import MODELS, graph, workload

import autoplan
from autoplan.exec import flatten


@pytest.mark.parametrize("name", MODELS)
def test_interpreter_visits_the_traced_operators(name):
    wl, g = workload(name), graph(name)
    prog = flatten(wl.fn, *wl.args)
    assert len(prog) == len(g)
    assert [op.primitive for op in prog.ops] == [op.primitive for op in g.ops]
    for a, b in zip(prog.ops, g.ops):
        assert tuple(None if not isinstance(t, int) else t for t in a.inputs) == b.inputs
        assert a.outputs == b.outputs
    assert prog.input_ids == [gi.tensor for gi in g.inputs]
    prog.check_matches(g)  # the executor's own guard agrees


def test_unrolled_scan_and_opaque_while_numbered_like_the_trace():
    def f(w, xs):
        def body(c, x):
            return jnp.tanh(c @ w + x), c.sum()
        c, ys = jax.lax.scan(body, jnp.zeros((2, 4)), xs)
        n = jax.lax.while_loop(lambda i: i < 3, lambda i: i + 1, 0)
        return (c * n).sum() + ys.sum()

    w = jnp.eye(4) * 0.5
    xs = jnp.arange(24.0).reshape(3, 2, 4) / 24
    with pytest.warns(autoplan.OpaqueControlFlowWarning):
        g = autoplan.trace(f, w, xs)
    prog = flatten(f, w, xs)
    prog.check_matches(g)
    prims = [op.primitive for op in prog.ops]
    assert prims.count("scan_slice") == 3 and prims.count("scan_stack") == 1
    assert prims.count("while") == 1
    np.testing.assert_allclose(jax.jit(prog)(w, xs), f(w, xs), rtol=1e-6)


def test_program_reproduces_the_train_step():
    wl = workload("mlp")
    out = jax.jit(flatten(wl.fn, *wl.args))(*wl.args)
    ref = jax.jit(wl.fn)(*wl.args)
    assert jax.tree.structure(out) == jax.tree.structure(ref)
    assert len(jax.tree.leaves(ref)) > 3  # the loss, the new parameters and optimizer state
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
