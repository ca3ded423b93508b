"""Tracing JAX functions into operator graphs."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import autoplan
from autoplan import OpaqueControlFlowWarning, TraceError

S = jax.ShapeDtypeStruct
f32 = jnp.float32


def _mlp_step():
    def loss(p, x):
        h = x
        for i, w in enumerate(p["layers"]):
            with jax.named_scope(f"layers_{i}"):
                with jax.named_scope("fc"):
                    h = jax.nn.relu(h @ w)
        return jnp.mean(h**2)

    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        with jax.named_scope("optimizer"):
            new = jax.tree.map(lambda a, g: a - 0.1 * g, params, grads)
            mom = jax.tree.map(lambda m, g: 0.9 * m + g, opt_state, grads)
        return value, new, mom

    params = {"layers": [S((16, 16), f32) for _ in range(3)]}
    return step, (params, params, S((8, 16), f32))


def test_train_step_graph_structure():
    step, args = _mlp_step()
    g = autoplan.trace(step, *args)
    assert len(g) == len(g.ops) == g.nx.number_of_nodes()
    roles = {op.role for op in g}
    assert roles == {"forward", "backward", "update"}
    dots = [op for op in g if op.primitive == "dot_general"]
    # 3 forward dots, and 2 backward dots per layer (except the first layer needs no input grad)
    assert sum(op.role == "forward" for op in dots) == 3
    assert sum(op.role == "backward" for op in dots) == 5
    fwd = [op for op in dots if op.role == "forward"][0]
    assert fwd.flops == 2 * 8 * 16 * 16
    assert fwd.in_shapes == ((8, 16), (16, 16)) and fwd.out_shapes == ((8, 16),)
    assert fwd.params["dimension_numbers"] == (((1,), (0,)), ((), ()))
    assert fwd.scope == ("layers_0", "fc")
    assert [ly.name for ly in g.layers][:3] == ["layers_0", "layers_1", "layers_2"]
    assert g.layers[1].params == ("params['layers'][1]",)
    # update ops carry the optimizer scope
    assert all(op.scope[:1] == ("optimizer",) for op in g if op.role == "update")
    # graph inputs carry paths and kinds
    kinds = [(gi.name, gi.kind) for gi in g.inputs]
    assert kinds[0] == ("params['layers'][0]", "parameter")
    assert kinds[3] == ("opt_state['layers'][0]", "optimizer_state")
    assert kinds[6] == ("batch", "batch")
    assert [o.path for o in g.outputs][:2] == ["[0]", "[1]['layers'][0]"]
    assert g.bytes_of_kind("parameter") == 3 * 16 * 16 * 4
    # edges carry the tensors passed between ops
    u, v, data = next(iter(g.nx.edges(data=True)))
    assert data["bytes"] == sum(g.tensors[t].nbytes for t in data["tensors"])
    assert "layers_0 .. layers_2" in g.summary()


def test_flops_formulas():
    def f(x, w, k, kern):
        y = jax.lax.dot_general(x, w, (((2,), (1,)), ((0,), (0,))))  # batched matmul
        c = jax.lax.conv_general_dilated(k, kern, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y.sum() + jnp.tanh(c).sum()

    g = autoplan.trace(f, S((4, 5, 6), f32), S((4, 6, 7), f32), S((2, 8, 8, 4), f32),
                       S((3, 3, 4, 6), f32), arg_kinds=("input",) * 4)
    dot = next(op for op in g if op.primitive == "dot_general")
    assert dot.flops == 2 * (4 * 5 * 7) * 6
    conv = next(op for op in g if op.primitive == "conv_general_dilated")
    assert conv.flops == 2 * (2 * 8 * 8 * 6) * 4 * 9
    tanh = next(op for op in g if op.primitive == "tanh")
    assert tanh.flops == 2 * 8 * 8 * 6
    red = [op for op in g if op.primitive == "reduce_sum"]
    assert {op.flops for op in red} == {4 * 5 * 7, 2 * 8 * 8 * 6}


def test_containers_are_flattened_with_scopes():
    @jax.custom_jvp
    def act(x):
        return jnp.sin(x)

    act.defjvp(lambda p, t: (act(p[0]), jnp.cos(p[0]) * t[0]))

    @jax.custom_vjp
    def clip(x):
        return x * 2.0

    clip.defvjp(lambda x: (x * 2.0, None), lambda _, g: (g * 2.0,))

    @jax.jit
    def inner(x):
        with jax.named_scope("inner"):
            return jnp.exp(x)

    def f(x):
        with jax.named_scope("outer"):
            y = inner(x)
            y = jax.checkpoint(lambda z: jnp.tanh(z) * 3.0)(y)
        return clip(act(y)).sum()

    g = autoplan.trace(jax.grad(f), S((4,), f32))
    prims = [op.primitive for op in g]
    for container in ("pjit", "jit", "remat", "remat2", "checkpoint", "custom_jvp_call",
                      "custom_vjp_call"):
        assert container not in prims
    assert "exp" in prims and "tanh" in prims and "sin" in prims
    exp = next(op for op in g if op.primitive == "exp")
    assert exp.scope == ("outer", "inner") and exp.role == "forward"


def test_scan_is_unrolled_into_repeated_iterations():
    def f(ws, x):
        def body(h, w):
            return jnp.tanh(h @ w), h.sum()
        h, ys = jax.lax.scan(body, x, ws)
        return h.sum() + ys.sum()

    g = autoplan.trace(f, S((5, 8, 8), f32), S((2, 8), f32))
    fwd_dots = [op for op in g if op.primitive == "dot_general"]
    assert len(fwd_dots) == 5
    assert sorted({op.scope[-1] for op in fwd_dots}) == [f"scan_{i}" for i in range(5)]
    slices = [op for op in g if op.primitive == "scan_slice"]
    assert [op.params["index"] for op in slices] == list(range(5))
    stack = [op for op in g if op.primitive == "scan_stack"]
    assert len(stack) == 1 and stack[0].out_shapes == ((5,),) and len(stack[0].inputs) == 5
    # FLOPs equal the body's times the trip count
    assert sum(op.flops for op in fwd_dots) == 5 * 2 * 2 * 8 * 8


def test_while_and_cond_are_opaque_with_one_warning():
    def f(x):
        y = jax.lax.cond(x.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)
        z = jax.lax.while_loop(lambda c: c[0] < 3.0, lambda c: c + 1.0, y)
        return z.sum()

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        g = autoplan.trace(f, S((4,), f32))
    ours = [w for w in rec if issubclass(w.category, OpaqueControlFlowWarning)]
    assert len(ours) == 1
    assert "cond x1" in str(ours[0].message) and "while x1" in str(ours[0].message)
    assert {"cond", "while"} <= {op.primitive for op in g}


def test_abstract_arguments_do_not_allocate():
    # 4 x (65536 x 65536) fp32 = 64 GiB: only abstract tracing can handle it
    def f(w, x):
        for i in range(4):
            x = x @ w[i]
        return x.sum()

    g = autoplan.trace(f, [S((65536, 65536), f32)] * 4, S((2, 65536), f32))
    assert g.param_bytes == 4 * 65536 * 65536 * 4
    assert g.flops >= 4 * 2 * 2 * 65536 * 65536


def test_model_without_named_scopes():
    g = autoplan.trace(lambda w, x: jnp.tanh(x @ w).sum(), S((4, 8), f32), S((2, 4), f32))
    assert [op.primitive for op in g] == ["dot_general", "tanh", "reduce_sum"]
    assert [ly.name for ly in g.layers] == ["(root)"]


def test_flax_nnx_model_traces():
    class Block(nnx.Module):
        def __init__(self, d, rngs):
            self.fc = nnx.Linear(d, d, rngs=rngs)
            self.norm = nnx.LayerNorm(d, rngs=rngs)

        def __call__(self, x):
            return nnx.relu(self.fc(self.norm(x)))

    model = Block(16, nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def loss(state, x):
        return jnp.mean(nnx.merge(graphdef, state)(x) ** 2)

    def step(state, x):
        val, grads = jax.value_and_grad(loss)(state, x)
        return val, jax.tree.map(lambda p, g: p - 0.1 * g, state, grads)

    g = autoplan.trace(step, state, jnp.ones((4, 16)))
    assert sum(op.primitive == "dot_general" for op in g) == 3  # fwd + 2 bwd
    names = [gi.name for gi in g.inputs_of_kind("parameter")]
    assert any("fc" in n and "kernel" in n for n in names)
    assert g.param_count == 16 * 16 + 16 + 2 * 16


def test_equinox_model_traces():
    model = eqx.nn.MLP(8, 4, 32, depth=2, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params, x):
        m = eqx.combine(params, static)
        return jnp.mean(jax.vmap(m)(x) ** 2)

    def step(params, x):
        val, grads = jax.value_and_grad(loss)(params, x)
        return val, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    g = autoplan.trace(step, params, jnp.ones((16, 8)))
    fwd = [op for op in g if op.primitive == "dot_general" and op.role == "forward"]
    assert len(fwd) == 3
    assert any(".layers[0].weight" in gi.path for gi in g.inputs)


def test_errors_name_the_value_and_fix():
    with pytest.raises(TraceError, match="callable"):
        autoplan.trace(42)
    with pytest.raises(TraceError, match="str at"):
        autoplan.trace(lambda x: x, "not an array")
    with pytest.raises(TraceError, match="could not trace"):
        autoplan.trace(lambda x: float(x.sum()) + 1.0, S((3,), f32))
    with pytest.raises(TraceError, match="arg_kinds"):
        autoplan.trace(lambda x: x.sum(), S((3,), f32), arg_kinds=("batch", "batch"))


def test_a_zoo_workloads_trace_is_shared_by_every_object_of_its_spec(monkeypatch):
    """The search's and the executor's trace of a zoo workload (``trace_workload``) is made once
    per zoo spec and argument shapes, whichever workload object asks; anything else that
    differs (the spec, the shapes, a workload built in this process) is traced again, and
    ``autoplan.trace`` always traces."""
    from autoplan import models
    from autoplan.search.pipeline._microbatches import microbatch_workload_args
    from autoplan.tracing import _trace
    from autoplan.tracing._workload import Origin

    made = []
    real = _trace.trace
    monkeypatch.setattr(_trace, "trace", lambda *a, **k: made.append(1) or real(*a, **k))
    monkeypatch.setattr(_trace, "_ZOO_TRACES", type(_trace._ZOO_TRACES)(8))
    a, b = models.get("mlp", "tiny", layers=3), models.get("mlp", "tiny", layers=3)
    g = _trace.trace_workload(a)
    assert _trace.trace_workload(b) is g and _trace.trace_workload(b.concrete()) is g
    assert len(made) == 1
    # another spec, other shapes (a micro-batch), another name: traced again, each once
    other = _trace.trace_workload(models.get("mlp", "tiny", layers=2))
    mb_args = microbatch_workload_args(a.args, a.arg_kinds, 2)
    small = _trace.trace_workload(a, mb_args)
    assert _trace.trace_workload(b, mb_args) is small
    assert len({id(g), id(other), id(small)}) == 3 and len(made) == 3
    assert len(other.ops) < len(g.ops)
    assert {t.shape for t in small.tensors} != {t.shape for t in g.tensors}
    assert _trace.trace_workload(a, name="renamed").name == "renamed" and len(made) == 4
    # a workload built in this process: its own trace each time
    own = autoplan.Workload(a.fn, a.args, a.arg_kinds)
    assert _trace.trace_workload(own) is not _trace.trace_workload(own) and len(made) == 6
    # the public trace always traces (it calls trace on the workload's step)
    assert autoplan.trace(a) is not g and len(made) > 6
    n = len(made)

    # a shared trace with opaque control flow warns on every use, as tracing it would
    def step(w, x):
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ w), (0, x))[1].sum()

    looped = autoplan.Workload(step, (S((4, 4), f32), S((2, 4), f32)), ("parameter", "batch"),
                               origin=Origin("zoo", "looped", "tiny"))
    for _ in range(2):
        with pytest.warns(OpaqueControlFlowWarning, match="opaque"):
            _trace.trace_workload(looped)
    assert len(made) == n + 1
