"""Per-operator strategy tables (autoplan.search.intra._strategies)."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import pytest

import autoplan
from autoplan import Cluster
from autoplan.plans._spec import Spec
from autoplan.search.intra._strategies import (
    Strategy,
    combined_latency,
    derive,
    fusion_context,
    leader_operand,
    strategies,
)
from autoplan.tracing._graph import OpNode

CL = Cluster.preset("p3.16xlarge")
M18 = CL.logical_mesh((1, 8))
M24 = CL.logical_mesh((2, 4))
S = jax.ShapeDtypeStruct
F32 = jnp.float32


def roofline(flops, nbytes, cl=CL, op="matmul", dtype="float32"):
    """max(F / R(F), Q / BW(Q)) + kernel overhead: an operator's time on a datasheet cluster,
    R the device model's rate for the operator's precision at its size, BW its bandwidth for a
    kernel moving Q bytes (tests/test_cluster.py checks those against the datasheet)."""
    return max(cl.flop_time(op, flops, dtype), cl.memory_time(nbytes)) + cl.op_overhead


def trace_op(fn, *shapes, prim, index=0, dtype=F32):
    g = autoplan.trace(fn, *[S(s, dtype) if isinstance(s, tuple) else s for s in shapes])
    ops = [op for op in g if op.primitive == prim]
    return g, ops[index]


def by_specs(strats):
    return {(st.in_specs, st.out_specs): st for st in strats}


# ---- dot_general: Alpa's table ----------------------------------------------------------------

def test_dot_rs_x_sr_all_reduce_matches_hand_value():
    m, k, n = 512, 1024, 256
    # (the product feeds more work: its all-reduce is on the critical path, not combined)
    g, op = trace_op(lambda a, b: jnp.tanh(a @ b).sum(), (m, k), (k, n), prim="dot_general")
    table = by_specs(strategies(op, g, M18))
    st = table[(((None, ("y",)), (("y",), None)), ((None, None),))]
    (c,) = st.comm
    out_bytes = m * n * 4
    assert (c.kind, c.axes, c.bytes) == ("all-reduce", ("y",), out_bytes)
    hand = M18.alpha[1] + M18.beta[1] * 2 * 7 / 8 * out_bytes
    assert c.time == pytest.approx(hand)
    assert c.time == pytest.approx(M18.collective_time("all-reduce", out_bytes, [1]))
    # work is split 8 ways (each device multiplies its k-slice): the roofline of an eighth of the
    # FLOPs and of the bytes each device reads (its slices of a and b) and writes (the full result)
    q = (m * k + k * n) * 4 / 8 + m * n * 4
    assert st.compute_time == pytest.approx(roofline(2 * m * k * n / 8, q))
    # the reduce-scatter variant: partial sums scattered onto the rows
    rs = table[(((None, ("y",)), (("y",), None)), ((("y",), None),))]
    assert [(c.kind, c.bytes) for c in rs.comm] == [("reduce-scatter", out_bytes)]
    assert rs.comm[0].time == pytest.approx(M18.collective_time("reduce-scatter", out_bytes, [1]))
    assert "all-reduce y" in st.name and st.name.startswith("RS(y) x S(y)R -> RR")


def test_strategy_name_describes_specs_and_collectives_or_is_the_label():
    g, op = trace_op(lambda a, b: jnp.tanh(a @ b).sum(), (64, 128), (128, 32), prim="dot_general")
    st = by_specs(strategies(op, g, M18))[(((None, ("y",)), (("y",), None)), ((None, None),))]
    assert st.name == "RS(y) x S(y)R -> RR (all-reduce y)"
    # the same description, written from the fields of an equal strategy, whenever it is read
    again = Strategy(st.out_specs, st.in_specs, st.comm, st.compute_time, st.memory)
    assert again == st and again.name == st.name
    assert pickle.loads(pickle.dumps(st)).name == st.name
    # operands without a spec (literals) and scalars are left out; a label replaces the text
    scalar = Strategy((Spec(("x",), None),), (None, Spec(), Spec(None, ("y",))))
    assert scalar.name == "RS(y) -> S(x)R"
    assert Strategy((Spec(("x",), None),), (), label="S(x)R").name == "S(x)R"


def test_dot_2d_table_on_2x4():
    m, k, n = 512, 1024, 256
    g, op = trace_op(lambda a, b: jnp.tanh(a @ b).sum(), (m, k), (k, n), prim="dot_general")
    strats = strategies(op, g, M24)
    table = by_specs(strats)
    X, Y = ("x",), ("y",)
    # SS = SR x RS: no communication, work split 8 ways
    ss = table[(((X, None), (None, Y)), ((X, Y),))]
    assert ss.comm == ()
    assert ss.compute_time == pytest.approx(
        roofline(2 * m * k * n / 8, (m * k / 2 + k * n / 4 + m * n / 8) * 4))
    # SR = SS x SR: all-reduce over y of the (x-split) result
    sr = table[(((X, Y), (Y, None)), ((X, None),))]
    assert [(c.kind, c.axes, c.bytes) for c in sr.comm] == [("all-reduce", ("y",), m * n * 4 / 2)]
    # RS = RS x SS: all-reduce over x
    rs = table[(((None, X), (X, Y)), ((None, Y),))]
    assert [(c.kind, c.axes, c.bytes) for c in rs.comm] == [("all-reduce", ("x",), m * n * 4 / 4)]
    # both orientations, the replicated strategy, and the flattened S^01 on rows exist
    assert (((Y, None), (None, X)), ((Y, X),)) in table
    assert (((None, None), (None, None)), ((None, None),)) in table
    assert (((("x", "y"), None), (None, None)), ((("x", "y"), None),)) in table
    # replicated work costs the full FLOPs and bytes
    rep = table[(((None, None), (None, None)), ((None, None),))]
    assert rep.compute_time == pytest.approx(roofline(2 * m * k * n, (m * k + k * n + m * n) * 4))
    assert len(table) == len(strats)  # no duplicates


def test_batched_dot_splits_batch_dims():
    g, op = trace_op(lambda a, b: jnp.einsum("bqd,bkd->bqk", a, b), (8, 16, 32), (8, 16, 32),
                     prim="dot_general")
    table = by_specs(strategies(op, g, M18))
    Y = ("y",)
    st = table[(((Y, None, None), (Y, None, None)), ((Y, None, None),))]
    assert st.comm == ()


def test_backward_gradient_collectives_are_discounted_and_share_one_latency():
    cl = Cluster.preset("p3.16xlarge", gamma=0.25)
    mesh = cl.logical_mesh((1, 8))

    def step(w, x):
        return jax.grad(lambda w: ((x @ w["a"]) @ w["b"]).sum())(w)

    w = {"a": S((256, 128), F32), "b": S((128, 64), F32)}
    g = autoplan.trace(step, w, S((1024, 256), F32))
    wgrads = [op for op in g if op.primitive == "dot_general" and op.role == "backward"
              and op.out_shapes[0] in ((128, 256), (64, 128))]
    assert len(wgrads) == 2
    # both weight gradients only feed the step's results: XLA combines their all-reduces, so
    # each is charged its transfer (discounted by gamma) and half of the latency
    assert [fusion_context(g)[op.id][2] for op in wgrads] == [0.5, 0.5]
    wgrad = wgrads[0]
    # the weight gradient contracts the batch: batch split -> partial sums -> all-reduce
    st = next(s for s in strategies(wgrad, g, mesh)
              if s.comm and s.comm[0].kind == "all-reduce" and s.out_specs[0] == (None, None))
    c = st.comm[0]
    assert c.time == pytest.approx(0.5 * mesh.alpha[1] + 0.25 * mesh.beta[1] * 2 * 7 / 8 * c.bytes)
    # the plan adds what is missing for one latency per combined group: one gradient
    # communicating pays the other half, both together pay nothing more
    assert combined_latency(g, mesh, [(wgrad.id, c)]) == {"all-reduce": pytest.approx(
        0.5 * mesh.alpha[1])}
    assert combined_latency(g, mesh, [(op.id, c) for op in wgrads]) == {}


# ---- convolution ------------------------------------------------------------------------------

def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def test_conv_batch_out_in_channel_and_2d():
    g, op = trace_op(_conv, (16, 8, 8, 32), (3, 3, 32, 64), prim="conv_general_dilated")
    table = by_specs(strategies(op, g, M24))
    X, Y = ("x",), ("y",)
    R4 = (None,) * 4
    # batch split: data parallel, no comm
    assert table[(((Y, None, None, None), R4), ((Y, None, None, None),))].comm == ()
    # out-channel split
    assert table[((R4, (None, None, None, Y)), ((None, None, None, Y),))].comm == ()
    # in-channel split: partial sums, all-reduce of the output
    ic = table[(((None, None, None, Y), (None, None, Y, None)), (R4,))]
    assert [(c.kind, c.axes, c.bytes) for c in ic.comm] == [("all-reduce", ("y",), 16 * 8 * 8 * 64 * 4)]
    # 2-D combinations: batch x out-channel, batch x in-channel, in x out channel
    assert table[(((X, None, None, None), (None, None, None, Y)), ((X, None, None, Y),))].comm == ()
    bi = table[(((X, None, None, Y), (None, None, Y, None)), ((X, None, None, None),))]
    assert [c.kind for c in bi.comm] == ["all-reduce"]
    io = table[(((None, None, None, X), (None, None, X, Y)), ((None, None, None, Y),))]
    assert [(c.kind, c.axes) for c in io.comm] == [("all-reduce", ("x",))]
    # spatial dims are never split
    for (ins, outs) in table:
        assert ins[0][1] is None and ins[0][2] is None and outs[0][1] is None


# ---- followers ------------------------------------------------------------------------------

def test_elementwise_broadcast_and_scalars():
    g, op = trace_op(lambda x, b: x * 2.0 + b, (16, 32), (1, 32), prim="add")
    st = derive(op, M24, 0, (("x",), ("y",)))
    assert st.out_specs == ((("x",), ("y",)),)
    assert st.in_specs == ((("x",), ("y",)), (None, ("y",)))  # size-1 dim replicated
    g, op = trace_op(lambda x: x * 2.0, (16, 32), prim="mul")
    k = leader_operand(op, None, g)
    st = derive(op, M24, k, (("x",), None))
    assert st.out_specs == ((("x",), None),)
    assert None in st.in_specs  # the literal
    # select_n / comparisons / integer_pow / convert share the spec
    for prim, fn in [("select_n", lambda x, y: jnp.where(x > 0, x, y)),
                     ("gt", lambda x, y: x > y),
                     ("integer_pow", lambda x, y: x ** 3 + y),
                     ("convert_element_type", lambda x, y: x.astype(jnp.bfloat16) + y.astype(jnp.bfloat16))]:
        g, op = trace_op(fn, (16, 32), (16, 32), prim=prim)
        k = leader_operand(op, None, g)
        st = derive(op, M24, k, (None, ("y",)))
        assert st.out_specs[0] == (None, ("y",)), prim


def test_reshape_factoring_keeps_head_split():
    g, op = trace_op(lambda x: x.reshape(4, 64, 16, 64), (4, 64, 1024), prim="reshape")
    # H = 1024 -> (heads=16, head_dim=64): a split of H stays on heads
    st = derive(op, M18, 0, (None, None, ("y",)))
    assert st.out_specs == ((None, None, ("y",), None),)
    assert st.in_specs == ((None, None, ("y",)),)
    # merging back: (heads, head_dim) -> H keeps a heads split on H
    g, op = trace_op(lambda x: x.reshape(4, 64, 1024), (4, 64, 16, 64), prim="reshape")
    st = derive(op, M18, 0, (None, None, ("y",), None))
    assert st.out_specs == ((None, None, ("y",)),)
    # a split of head_dim has no contiguous image: only that dim is replicated
    st = derive(op, M24, 0, (("x",), None, None, ("y",)))
    assert st.out_specs == ((("x",), None, None),)
    assert st.in_specs == ((("x",), None, None, None),)
    # merging batch and sequence keeps a batch split
    g, op = trace_op(lambda x: x.reshape(256, 1024), (4, 64, 1024), prim="reshape")
    st = derive(op, M24, 0, (("x",), ("y",), None))
    assert st.out_specs == ((("x",), None),)  # the sequence split is strided after the merge


def test_transpose_reduce_cut_ops():
    g, op = trace_op(lambda x: x.T, (16, 32), prim="transpose")
    assert derive(op, M24, 0, (("x",), ("y",))).out_specs == ((("y",), ("x",)),)
    g, op = trace_op(lambda x: x.sum(axis=1), (16, 32), prim="reduce_sum")
    st = derive(op, M24, 0, (("x",), ("y",)))
    assert st.out_specs == ((("x",),),)
    assert [(c.kind, c.axes, c.bytes) for c in st.comm] == [("all-reduce", ("y",), 16 * 4 / 2)]
    assert derive(op, M24, 0, (("x",), None)).comm == ()
    g, op = trace_op(lambda x: x[:, :16], (16, 32), prim="slice")
    assert derive(op, M24, 0, (("x",), ("y",))).out_specs == ((("x",), None),)
    g, op = trace_op(lambda x: jnp.pad(x, ((0, 0), (1, 1))), (16, 32), prim="pad")
    assert derive(op, M24, 0, (("x",), ("y",))).in_specs[0] == (("x",), None)
    g, op = trace_op(lambda x, y: jnp.concatenate([x, y], axis=0), (16, 32), (16, 32),
                     prim="concatenate")
    st = derive(op, M24, 0, (("x",), ("y",)))
    assert st.out_specs == ((None, ("y",)),) and st.in_specs == ((None, ("y",)),) * 2
    g, op = trace_op(lambda x: jnp.cumsum(x, axis=1), (16, 32), prim="cumsum")
    assert derive(op, M24, 0, (("x",), ("y",))).out_specs == ((("x",), None),)
    g, op = trace_op(lambda x: jnp.sort(x, axis=0), (16, 32), prim="sort")
    assert derive(op, M24, 0, (("x",), ("y",))).out_specs[0] == (None, ("y",))
    g, op = trace_op(lambda x: jnp.argmax(x, axis=1), (16, 32), prim="argmax")
    st = derive(op, M24, 0, (("x",), ("y",)))
    assert st.in_specs == ((("x",), None),) and st.out_specs == ((("x",),),)


def test_broadcast_in_dim_maps_dims():
    g, op = trace_op(lambda x: jnp.broadcast_to(x[:, None, :], (16, 8, 32)), (16, 32),
                     prim="broadcast_in_dim")
    st = derive(op, M24, 0, (("x",), ("y",)))
    assert st.out_specs == ((("x",), None, ("y",)),)


# ---- gather / scatter --------------------------------------------------------------------------

def test_embedding_lookup_vocab_parallel_and_batch_split():
    g, op = trace_op(lambda e, i: jnp.take(e, i, axis=0),
                     (512, 64), S((8, 16), jnp.int32), prim="gather")
    table = by_specs(strategies(op, g, M18))
    Y = ("y",)
    vocab = [st for (ins, outs), st in table.items() if ins[0] == (Y, None)]
    assert vocab, "no vocabulary-parallel strategy"
    (c,) = vocab[0].comm
    assert c.kind == "all-reduce" and c.bytes == 8 * 16 * 64 * 4
    batch = [st for (ins, outs), st in table.items() if ins[1][0] == Y and ins[0] == (None, None)]
    assert batch and batch[0].comm == () and batch[0].out_specs[0][0] == Y
    feat = [st for (ins, outs), st in table.items() if ins[0] == (None, Y)]
    assert feat and feat[0].out_specs[0][-1] == Y


def test_embedding_gradient_scatter_add():
    def f(e, i):
        return jax.grad(lambda e: jnp.take(e, i, axis=0).sum())(e)

    g, op = trace_op(f, (512, 64), S((8, 16), jnp.int32), prim="scatter-add")
    strats = strategies(op, g, M18)
    kinds = {tuple(c.kind for c in st.comm) for st in strats}
    assert ("all-reduce",) in kinds  # updates split over tokens: partial table sums
    assert any(st.out_specs[0] == (("y",), None) and not st.comm for st in strats)  # vocab split


# ---- scan slices, unknown primitives, odd params ---------------------------------------------

def test_scan_slice_and_stack():
    def f(xs):
        return jax.lax.scan(lambda c, x: (c + x, x * 2), jnp.zeros(xs.shape[1:]), xs)[1]

    g = autoplan.trace(f, S((4, 16, 32), F32))
    sl = next(op for op in g if op.primitive == "scan_slice")
    st = derive(sl, M24, 0, (("x",), ("y",), None))
    assert st.in_specs == ((None, ("y",), None),) and st.out_specs == ((("y",), None),)
    stack = next(op for op in g if op.primitive == "scan_stack")
    st = derive(stack, M24, 0, (("y",), None))
    assert st.out_specs == ((None, ("y",), None),)


def test_unknown_primitive_replicated_and_reported():
    g, op = trace_op(lambda x: jnp.fft.fft(x).real, (16, 32), prim="fft")
    unknown: set[str] = set()
    strats = strategies(op, g, M24, unknown)
    assert len(strats) == 1 and all(e is None for e in strats[0].out_specs[0])
    assert unknown == {"fft"}
    # a kernel of its own, replicated: reads its (complex) operand, writes its result
    nbytes = 16 * 32 * 8 * 2
    assert strats[0].compute_time == pytest.approx(roofline(op.flops, nbytes, op="elementwise"))


@pytest.mark.parametrize("params", [{}, {"dimension_numbers": "garbage"},
                                    {"dimension_numbers": (((5,), (7,)), ((), ()))}])
def test_odd_params_never_crash(params):
    op = OpNode(0, "dot_general", params, (0, 1), (2,), 10.0, (), "forward",
                in_shapes=((4, 8), (8, 4)), out_shapes=((4, 4),), in_dtypes=("float32",) * 2,
                out_dtypes=("float32",))
    unknown: set[str] = set()
    strats = strategies(op, None, M24, unknown)
    assert len(strats) == 1 and unknown == {"dot_general"}
    weird = OpNode(1, "reduce_sum", {"axes": "x"}, (0,), (1,), 1.0, (), "forward",
                   in_shapes=((4, 8),), out_shapes=((4,),), in_dtypes=("float32",),
                   out_dtypes=("float32",))
    assert strategies(weird, None, M24)
    derive(weird, M24, 0, (("x",), None))  # a rule or None, never an exception


def test_reduce_over_split_dim_all_reduce_or_keep_partial():
    g, op = trace_op(lambda x: x.sum(axis=0), (16, 32), prim="reduce_sum")
    strats = strategies(op, g, M18)
    Y = ("y",)
    ar = [s for s in strats if s.in_specs[0] == (Y, None) and s.out_specs[0] == (None,)]
    rs = [s for s in strats if s.in_specs[0] == (Y, None) and s.out_specs[0] == (Y,)]
    assert [c.kind for c in ar[0].comm] == ["all-reduce"]
    assert [(c.kind, c.bytes) for c in rs[0].comm] == [("reduce-scatter", 32 * 4)]
    # the sum is the step's result: its collective is combinable, and the only one, so it
    # pays the whole latency
    assert fusion_context(g)[op.id][2] == 1.0
    assert rs[0].comm[0].time == pytest.approx(M18.collective_time("reduce-scatter", 32 * 4, [1]))


def _fusion_context_by_definition(graph):
    """fusion_context, operator by operator as its docstring defines it."""
    from autoplan.search.intra._strategies import (
        _REDUCTIONS,
        LOOP_FUSIBLE,
        combinable_ops,
        is_heavy,
    )

    ops, consumers, tensors = graph.ops, graph.consumers, graph.tensors
    outputs = {o.tensor for o in graph.outputs}
    kernel = [op.primitive not in LOOP_FUSIBLE
              or any(t in outputs or any(ops[c].primitive not in LOOP_FUSIBLE for c in consumers[t])
                     for t in op.outputs) for op in ops]
    combine = combinable_ops(graph)
    k = sum(1 for op in ops if combine[op.id] and (is_heavy(op) or op.primitive in _REDUCTIONS))
    return [(kernel[op.id],
             tuple(t is not None and (tensors[t].producer < 0 or kernel[tensors[t].producer])
                   for t in op.inputs),
             1.0 / max(1, k) if combine[op.id] else 1.0) for op in ops]


@pytest.mark.parametrize("name, kw", [("gpt", {"size": "tiny"}), ("wide_resnet", {"size": "tiny"}),
                                      ("moe", {"size": "tiny"}), ("unet", {"size": "tiny"})])
def test_fusion_context_over_arrays_equals_its_definition(name, kw):
    from autoplan import models
    from autoplan.search.intra._strategies import fusion_context

    graph = autoplan.trace(models.get(name, **kw))
    lazy = fusion_context(graph)
    want = _fusion_context_by_definition(graph)
    # each context is made when first read: read out of order, then all of them
    assert [lazy[i] for i in range(len(lazy) - 1, -1, -7)] == want[::-1][::7]
    got = list(lazy)
    assert got == want and lazy[-1] == want[-1] and lazy[2:5] == want[2:5]
    assert any(not k for k, _, _ in got) and any(k for k, _, _ in got)  # both kinds occur
    assert any(False in m for _, m, _ in got) and any(True in m for _, m, _ in got)
    assert all(type(k) is bool and all(type(x) is bool for x in m) for k, m, _ in got)


def _passing_by_definition(graph):
    """combinable_ops and gradient_feeds operator by operator as their docstrings define them,
    recursively over each operator's readers."""
    import functools

    from autoplan.search.intra._strategies import _REDUCTIONS, is_heavy

    ops, consumers = graph.ops, graph.consumers
    outputs = {o.tensor for o in graph.outputs}
    stop = [is_heavy(op) or op.primitive in _REDUCTIONS for op in ops]

    @functools.cache
    def only_update_waits(i):  # its results only feed the update or the step's results
        readers = [c for t in ops[i].outputs for c in consumers[t]]
        used = any(t in outputs for t in ops[i].outputs) or bool(readers)
        return used and all(ops[c].role == "update" or (not stop[c] and only_update_waits(c))
                            for c in readers)

    @functools.cache
    def passes_gradient(c):  # a result read by c reaches the update unchanged
        return ops[c].role == "update" or (not stop[c] and makes_gradient(c))

    @functools.cache
    def makes_gradient(i):
        return any(passes_gradient(c) for t in ops[i].outputs for c in consumers[t])

    order = range(len(ops) - 1, -1, -1)  # (readers first: no deep recursion)
    combinable = [only_update_waits(i) for i in order][::-1]
    feeds = [makes_gradient(i) for i in order][::-1]
    return combinable, feeds


@pytest.mark.parametrize("name, kw", [("gpt", {"size": "tiny"}), ("wide_resnet", {"size": "tiny"}),
                                      ("moe", {"size": "tiny"}),
                                      ("gpt", {"size": "tiny", "remat": True})])
def test_combinable_ops_and_gradient_feeds_equal_their_definitions(name, kw):
    from autoplan import models
    from autoplan.search.intra._strategies import combinable_ops, gradient_feeds

    graph = autoplan.trace(models.get(name, **kw))
    combinable, feeds = _passing_by_definition(graph)
    assert combinable_ops(graph) == combinable and any(combinable) and not all(combinable)
    assert gradient_feeds(graph) == feeds and any(feeds) and not all(feeds)


def test_one_minus_square_is_elementwise():
    """JAX 0.11 differentiates tanh through ``one_minus_square`` (1 - x**2): it shards as
    every elementwise operator does, not replicated and reported as unknown (an operator of
    that name is built by hand here, since JAX 0.10 does not emit it)."""
    op = OpNode(0, "one_minus_square", {}, (0,), (1,), 2.0 * 16 * 32, (), "backward",
                in_shapes=((16, 32),), out_shapes=((16, 32),), in_dtypes=("float32",),
                out_dtypes=("float32",))
    unknown: set[str] = set()
    strats = strategies(op, None, M24, unknown)
    assert not unknown
    assert ((("x",), ("y",)),) in {st.out_specs for st in strats}
    assert derive(op, M24, 0, (("x",), None)).out_specs == ((("x",), None),)
