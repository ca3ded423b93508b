"""The executor's interpreter visits exactly the trace's operators, in the trace's order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exec_cases import MODELS, graph, workload
from jax.extend import core as jcore

import autoplan
from autoplan.exec import flatten
from autoplan.tracing._jaxpr import INLINE


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


@jax.custom_vjp
def _clip_grad(x):
    return x


_clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))


@jax.jit
def _block(w, h):
    return jax.checkpoint(lambda a: jnp.tanh(_clip_grad(a @ w)))(h)


def _loss(ws, x):
    def body(h, w):
        return _block(w, h), h.sum()
    h, ys = jax.lax.scan(body, x, ws)
    return (h ** 2).sum() + ys.sum()


def _nested_step(ws, x):
    """A gradient step, then the new parameters' loss (forward only, so the custom_vjp call is
    kept as one: under grad JAX replaces it by its fwd and bwd rules)."""
    loss, g = jax.value_and_grad(_loss)(ws, x)
    new = ws - 0.1 * g
    return loss, new, _loss(new, x)


def _primitives(jaxpr, found=None):
    found = set() if found is None else found
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for sub in jcore.jaxprs_in_params(eqn.params):
            _primitives(sub, found)
    return found


def test_trace_and_interpreter_number_nested_containers_alike():
    ws = jnp.linspace(-0.5, 0.5, 48).reshape(3, 4, 4)
    x = jnp.arange(8.0).reshape(2, 4) / 8
    nested = _primitives(jax.make_jaxpr(_nested_step)(ws, x).jaxpr)
    assert {"scan", "custom_vjp_call"} <= nested
    assert nested & {"jit", "pjit"} and nested & {"remat2", "checkpoint"}

    g = autoplan.trace(_nested_step, ws, x)
    prog = flatten(_nested_step, ws, x)
    traced = [(op.id, op.primitive, op.inputs, op.outputs) for op in g.ops]
    walked = [(op.id, op.primitive, tuple(r if isinstance(r, int) else None for r in op.inputs),
               op.outputs) for op in prog.ops]
    assert traced and traced == walked
    assert prog.input_ids == [gi.tensor for gi in g.inputs]
    prims = [op.primitive for op in prog.ops]
    assert not INLINE & set(prims)  # every container inlined, by both
    assert "scan_slice" in prims and "scan_stack" in prims  # every scan unrolled, by both
    assert {"scan_0", "scan_1", "scan_2"} <= {s for op in g.ops for s in op.scope}
    assert {"forward", "backward", "update"} <= {op.role for op in g.ops}
    for a, b in zip(jax.tree.leaves(jax.jit(prog)(ws, x)), jax.tree.leaves(_nested_step(ws, x)),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
