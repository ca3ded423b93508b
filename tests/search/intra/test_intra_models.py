"""intra_op_search on the model zoo: the plans a good planner should rediscover."""

from __future__ import annotations

import json
import warnings

import jax
import pytest
from jax.sharding import PartitionSpec as P

import autoplan
from autoplan import Cluster, InfeasiblePlanError, Plan, SearchError
from autoplan.search.intra._intra import default_mesh_shape, intra_op_search
from autoplan.search.intra._solver import SolverTimeoutWarning

models = pytest.importorskip("autoplan.models")

P3 = Cluster.preset("p3.16xlarge")
X, Y = ("x",), ("y",)


def trace(wl):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.trace(wl)


def specs_by_name(res):
    return {i.name: i.spec for i in res.plan.inputs}


# GPT: a hidden=256 / seq_len=64 model is so small that on V100 constants its whole
# step computes in ~11 us, less than the latency of two collectives, so the honest optimum is to
# replicate everything; hidden=1024 / seq_len=256 is the smallest size where sharding pays.
@pytest.fixture(scope="module")
def gpt():
    wl = models.get("gpt", "tiny", batch=1, hidden=1024, heads=16, seq_len=256, layers=2, vocab=512)
    return wl, trace(wl)


@pytest.fixture(scope="module")
def gpt_res(gpt):
    wl, g = gpt
    return intra_op_search(g, P3, (1, 8), config=wl.config)


def test_gpt_megatron_on_1x8(gpt, gpt_res):
    g = gpt[1]
    specs = specs_by_name(gpt_res)
    for i in range(2):
        lay = f"params['layers'][{i}]"
        assert specs[f"{lay}['attn']['qkv']['kernel']"] == (None, Y)
        assert specs[f"{lay}['mlp']['fc1']['kernel']"] == (None, Y)
        assert specs[f"{lay}['attn']['out']['kernel']"] == (Y, None)
        assert specs[f"{lay}['mlp']['fc2']['kernel']"] == (Y, None)
    # attention heads on the tensor-parallel axis: the score dot is split on its head dim
    score = [o for o in gpt_res.plan.ops if o.role == "forward" and o.primitive == "dot_general"
             and len(o.tensors[-1].shape) == 4]
    assert score and all(Y in [e for e in o.tensors[-1].spec] for o in score)
    # two all-reduces per layer forward: attention out and fc2 (Megatron's f/g operators); the
    # LM head outside the layers may split its contraction instead of its vocabulary
    fwd_ar = [c for o in gpt_res.plan.ops if o.role == "forward"
              and g.ops[o.op].scope[:1] in (("layers_0",), ("layers_1",))
              for c in o.comm if c.kind == "all-reduce"]
    assert len(fwd_ar) == 4


def test_gpt_plan_fields(gpt, gpt_res):
    wl, g = gpt
    plan = gpt_res.plan
    assert isinstance(plan, Plan)
    assert len(plan.inputs) == len(g.inputs)
    assert {(i.arg, i.path) for i in plan.inputs} == {(gi.arg, gi.path) for gi in g.inputs}
    # the plan lists every heavy operator, and both ends of every resharding (what the
    # executor pins)
    listed = {o.op for o in plan.ops}
    assert {op.id for op in g if op.primitive in ("dot_general", "gather")} <= listed
    sol = gpt_res.solution
    for i in listed - {op.id for op in g if op.primitive in ("dot_general", "gather",
                                                              "scatter-add")}:
        op, st = g.ops[i], sol.strategies[i]
        reads = any(t is not None and sol.specs.get(t) not in (None, dst) and g.tensors[t].shape
                    for t, dst in zip(op.inputs, st.in_specs) if dst is not None)
        feeds = any(sol.strategies[c].in_specs[g.ops[c].inputs.index(t)] not in (None, sol.specs[t])
                    for t in op.outputs for c in g.consumers[t] if c in sol.strategies)
        assert reads or feeds or op.role == "update", (i, op.primitive)
    assert plan.stages[0].mesh_shape == (1, 8) and plan.stages[0].axis_names == ("x", "y")
    assert plan.schedule.kind == "none" and plan.fingerprint == g.fingerprint
    assert plan.model == g.name and plan.jax_version == jax.__version__
    p = plan.predicted
    assert p.step_time == pytest.approx(p.compute_time + p.comm_time)
    assert p.throughput == pytest.approx(wl.config["batch"] / p.step_time)
    assert 0 < p.mfu < 1
    assert p.comm_bytes["all-reduce"] > 0 and p.comm_by_axis["y"] > 0
    assert p.memory_per_device > 0
    weight = next(t for o in plan.ops for t in o.tensors if t.role == "weight")
    assert weight.name.startswith("params[")
    assert any(t.name.startswith("%") for o in plan.ops for t in o.tensors)
    assert Plan.from_json(plan.to_json()) == plan
    assert json.loads(plan.to_json())
    st = gpt_res.stats
    assert st["vars_after_merging"] < st["vars_before_merging"] / 3 and st["status"] == "optimal"


def test_gpt_memory_budget_pins_time_limit(gpt):
    wl, g = gpt
    least = intra_op_search(g, P3, (1, 8)).solution.least_memory
    with pytest.raises(InfeasiblePlanError) as err:
        intra_op_search(g, P3, (1, 8), memory_budget=0.5 * least)
    assert err.value.least_memory == pytest.approx(least)
    res = intra_op_search(g, P3, (1, 8), memory_budget=1.01 * least)
    assert res.plan.predicted.memory_per_device <= 1.01 * least * (1 + 1e-9)
    # pins: force the un-Megatron layout on fc1
    res = intra_op_search(g, P3, (1, 8), pins={r"\['fc1'\]\['kernel'\]": P("y", None)})
    specs = specs_by_name(res)
    assert specs["params['layers'][0]['mlp']['fc1']['kernel']"] == (Y, None)
    assert specs["params['layers'][1]['mlp']['fc1']['kernel']"] == (Y, None)
    with pytest.warns(SolverTimeoutWarning):
        res = intra_op_search(g, P3, (1, 8), time_limit=1e-3)
    assert res.plan.predicted.step_time > 0 and res.stats["status"] in ("feasible", "timeout-greedy")


def test_mlp_large_batch_is_data_parallel():
    wl = models.get("mlp", "tiny", batch=4096, features=256, hidden=256, layers=3, classes=16)
    res = intra_op_search(trace(wl), P3, (8, 1), config=wl.config)
    for i in res.plan.inputs:
        if i.kind == "parameter":
            assert all(e is None for e in i.spec), i.name
        if i.name == "batch['x']":
            assert i.spec == (X, None)
    kinds = {(c.kind, c.where) for _, c in res.solution.comms}
    assert ("all-reduce", "grad-sync") in kinds
    for o in res.plan.ops:
        if o.role == "forward":
            assert o.tensors[0].spec[0] == X  # activations split on the batch


def test_moe_expert_parallel():
    wl = models.get("moe", "tiny", batch=16, seq_len=256, hidden=512, heads=8, experts=8, vocab=512)
    res = intra_op_search(trace(wl), P3, (1, 8), config=wl.config)
    specs = specs_by_name(res)
    moe = [n for n in specs if n.endswith("['moe']['wi']") or n.endswith("['moe']['wo']")]
    assert moe
    for n in moe:
        assert specs[n][0] == Y and all(e is None for e in specs[n][1:]), (n, specs[n])
    assert "all-to-all" in res.plan.predicted.comm_bytes  # token dispatch between experts


def test_wide_resnet_early_data_late_model_parallel():
    """On two p3.16xlarge nodes (mesh 2x8) with a micro-batch of 64 images: early convolutions
    (large activations, small weights) split the batch; the widest late 3x3 convolution (small
    activations, 29.5M weights) splits channels. The cross-node axis x stays replicated: its link
    (25 Gbps shared by the 8 GPUs of a node) makes any gradient sync across nodes cost more than
    the compute it saves, so the cost model keeps the whole plan inside each node."""
    wl = models.get("wide_resnet", "tiny", channels=160, width=2, image=224, batch=64, classes=1000)
    cl = Cluster.preset("p3.16xlarge", nodes=2)
    res = intra_op_search(trace(wl), cl, (2, 8), config=wl.config)
    convs = [o for o in res.plan.ops if o.primitive == "conv_general_dilated" and o.role == "forward"]
    early = [o for o in convs if o.layer in ("stem", "blocks_0")]
    assert early
    for o in early:
        lhs, rhs = o.tensors[0], o.tensors[1]
        assert lhs.spec[0] is not None, (o.scope, o.strategy)  # batch (NHWC: N)
        assert all(e is None for e in rhs.spec), (o.scope, o.strategy)  # weights replicated
    wide = next(o for o in convs if o.scope.startswith("blocks_3/conv2"))
    rhs = wide.tensors[1]  # HWIO kernel
    assert rhs.spec[2] is not None or rhs.spec[3] is not None, wide.strategy  # channel split


def test_bad_mesh_shapes_and_defaults(gpt):
    _, g = gpt
    assert default_mesh_shape(P3) == (1, 8)
    assert default_mesh_shape(Cluster.preset("p3.16xlarge", nodes=2)) == (2, 8)
    for bad in [(3, 3), (0, 8), (-1, -8), (1, 8.0), "18", ()]:
        with pytest.raises(SearchError, match="mesh_shape") as err:
            intra_op_search(g, P3, bad)
        assert "Fix" in str(err.value)
    with pytest.raises(SearchError, match="mesh_axis_names"):
        intra_op_search(g, P3, (1, 8), mesh_axis_names=("x",))
    with pytest.raises(SearchError, match="Cluster"):
        intra_op_search(g, "p3.16xlarge", (1, 8))


def test_the_plans_records_equal_their_checked_construction(gpt):
    """The search makes a plan's records without their constructors' checks
    (``canonical_record``): each equals (and hashes as) the record its constructor makes from
    the same fields, with canonical specs and tuples."""
    from dataclasses import fields

    from autoplan.plans._plan import InputSpec, OpSharding, TensorSharding, canonical_record
    from autoplan.plans._spec import Spec

    _, graph = gpt
    plan = intra_op_search(graph, P3, (2, 4), label="records").plan
    records = list(plan.inputs) + [o for st in plan.stages for o in st.ops]
    records += [t for o in records if isinstance(o, OpSharding) for t in o.tensors]
    assert {type(r) for r in records} == {InputSpec, OpSharding, TensorSharding}
    for r in records:
        checked = type(r)(**{f.name: getattr(r, f.name) for f in fields(r)})
        assert r == checked and hash(r) == hash(checked)
        if not isinstance(r, OpSharding):
            assert type(r.spec) is Spec and type(r.shape) is tuple
        else:
            assert type(r.tensors) is tuple and type(r.comm) is tuple
    # an uncanonical value is the caller's to avoid: the helper stores what it is given
    ts = canonical_record(TensorSharding, "%1", "output", (4,), "float32", Spec.of(("x",)))
    assert ts == TensorSharding("%1", "output", (4,), "float32", ("x",))


@pytest.mark.parametrize("name", ["gpt", "moe", "wide_resnet", "two_tower"])
def test_a_plans_layer_names_are_the_graphs_layers_in_order(name):
    """``graph.layer_order`` is the layers of forward operators as they first appear, then those
    only backward operators are in; ``graph.layers`` and a single-stage plan follow it."""
    graph = autoplan.trace(autoplan.models.get(name, "tiny"))
    want: list[str] = []
    for role_forward in (True, False):
        for op in graph.ops:
            n = graph.layer_names[op.id] or "(root)"
            if (op.role == "forward") == role_forward and op.role != "update" and n not in want:
                want.append(n)
    assert graph.layer_order == tuple(want) and len(want) > 1
    assert tuple(ly.name for ly in graph.layers) == graph.layer_order
    assert [ly.index for ly in graph.layers] == list(range(len(want)))
    plan = autoplan.search(graph, "cpu:8", pipeline=False, mesh_shape=(2, 4), cache=False).best
    assert plan.stages[0].layers == graph.layer_order
