"""Workloads by duck typing (any object with ``fn`` and ``args``) through every public entry, and
a search given a traced graph, which says why it has no pipeline candidates."""

import dataclasses
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import autoplan
import autoplan.exec as ex
from autoplan.algorithms import NoPipelineWarning
from autoplan.search._api import GRAPH_ONLY_NOTE


def _step_and_args():
    tx = optax.adam(1e-2)
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w": jax.random.normal(k1, (8, 16)) * 0.3, "v": jax.random.normal(k2, (16, 4)) * 0.3}
    batch = {"x": jax.random.normal(k3, (16, 8)), "y": jnp.ones((16, 4))}

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            return jnp.mean((jnp.tanh(batch["x"] @ p["w"]) @ p["v"] - batch["y"]) ** 2)
        loss, g = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(g, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return train_step, (params, tx.init(params), batch)


@dataclasses.dataclass
class MyWorkload:  # a user's own class, not autoplan's
    fn: object
    args: tuple


@pytest.fixture(scope="module")
def duck():
    fn, args = _step_and_args()
    return types.SimpleNamespace(fn=fn, args=args)


def test_trace_reads_the_kinds(duck):
    g = autoplan.trace(duck)
    kinds = {gi.kind for gi in g.inputs}
    assert kinds == {"parameter", "optimizer_state", "batch"}


@pytest.mark.parametrize("make", [lambda fn, a: types.SimpleNamespace(fn=fn, args=a),
                                  lambda fn, a: MyWorkload(fn, a),
                                  lambda fn, a: types.SimpleNamespace(fn=fn, args=list(a))],
                         ids=["namespace", "dataclass", "list-args"])
def test_search_and_plan_accept_duck_workloads(make):
    fn, args = _step_and_args()
    wl = make(fn, args)
    res = autoplan.search(wl, "cpu:8", time_limit=10)
    assert any(p.is_pipeline or p.schedule.microbatches > 1 for p in res.plans)
    ref = autoplan.search(autoplan.Workload(fn, args), "cpu:8", time_limit=10)
    assert [p.describe() for p in res.plans] == [p.describe() for p in ref.plans]
    assert autoplan.plan(wl, "cpu:8", pipeline=False).describe() == \
        autoplan.plan(autoplan.Workload(fn, args), "cpu:8", pipeline=False).describe()


def test_run_accepts_a_duck_workload_for_several_steps(duck):
    plan = autoplan.plan(duck, "cpu:8", pipeline=False)
    rep = ex.run(plan, duck, steps=3)
    assert rep.equivalence.matched and len(rep.losses) == 3
    accum = next(p for p in autoplan.search(duck, "cpu:8", pipeline=True).plans
                 if p.schedule.microbatches > 1)
    rep = ex.run(accum, duck, steps=2)
    assert rep.equivalence.matched


def test_named_shardings_like_a_duck_workload(duck):
    plan = autoplan.plan(duck, "cpu:8", pipeline=False)
    sh = plan.named_shardings(like=duck)
    assert jax.tree_util.tree_structure(sh[0]) == jax.tree_util.tree_structure(duck.args[0])


def test_abstract_duck_workload_with_concrete(duck):
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), duck.args)
    obj = types.SimpleNamespace(fn=duck.fn, args=abstract,
                                concrete=lambda seed: types.SimpleNamespace(fn=duck.fn,
                                                                            args=duck.args))
    plan = autoplan.plan(obj, "cpu:8", pipeline=False)
    rep = ex.run(plan, obj, steps=1)
    assert rep.equivalence.matched


def test_explorer_accepts_a_duck_workload(duck):
    pytest.importorskip("ipywidgets")
    from autoplan.viz._explorer import Explorer

    e = Explorer(duck, cluster="cpu:8")
    e.wait_idle(600)
    assert e.result is not None and e.result.plans


def test_a_duck_workload_that_cannot_be_read_is_refused_in_one_line(duck):
    bad = types.SimpleNamespace(fn=duck.fn, args={"params": duck.args[0]})
    for call in (lambda: autoplan.search(bad, "cpu:8"), lambda: ex.run(None, bad)):
        with pytest.raises(autoplan.AutoplanError, match=r"wrap it as autoplan\.Workload\(fn, args\)"):
            call()


def test_graph_only_search_says_why_it_has_no_pipeline_plans(duck):
    g = autoplan.trace(duck)
    with pytest.warns(NoPipelineWarning, match="pipeline plans need the workload"):
        res = autoplan.search(g, "cpu:8", time_limit=10)
    assert GRAPH_ONLY_NOTE in res.notes
    assert not any(p.is_pipeline or p.schedule.microbatches > 1 for p in res.plans)
    # from the plan cache too
    with pytest.warns(NoPipelineWarning):
        again = autoplan.search(g, "cpu:8", time_limit=10)
    assert again.stats["cache"] == "hit" and GRAPH_ONLY_NOTE in again.notes
    # asked for intra-operator plans only: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoPipelineWarning)
        res = autoplan.search(g, "cpu:8", pipeline=False, time_limit=10)
    assert GRAPH_ONLY_NOTE not in res.notes
    assert np.isfinite(res.best.predicted.step_time)


def test_graph_only_search_with_pipeline_true_is_refused_with_the_fix(duck):
    with pytest.raises(autoplan.SearchError, match=r"pass autoplan\.Workload\(fn, args\)"):
        autoplan.search(autoplan.trace(duck), "cpu:8", pipeline=True)
