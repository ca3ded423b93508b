"""The model matrix (``matrix_steps.py``): Flax NNX with dropout and ``nnx.Optimizer``, linen
with ``nn.scan`` and dropout, Equinox with ``eqx.nn.Dropout``, a plain-JAX contrastive
two-tower, a batch-norm CNN.

Each row is traced, planned on 8 emulated devices, run for 3 steps under the best
intra-operator plan (and the data-parallel baseline, which shards the batch and with it the
random draws) equal to one device, and exported into the user's own ``jax.jit``, whose results
equal the unsharded step's.
"""

from __future__ import annotations

import warnings

import jax
import matrix_steps
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import autoplan
from autoplan.exec import run
from autoplan.tracing._batchflow import MIXING_NOTE, RANDOM_NOTE

FAST = {"xla_backend_optimization_level": 0}
ROWS = list(matrix_steps.MAKERS)


@pytest.fixture(scope="module")
def searched():
    """One intra-operator search per row (shared by the tests below)."""
    cache = {}

    def get(name):
        if name not in cache:
            wl = matrix_steps.MAKERS[name]()
            with warnings.catch_warnings():
                warnings.simplefilter("error", autoplan.algorithms.UnsupportedPrimitiveWarning)
                res = autoplan.search(wl, "cpu:8", pipeline=False)
            cache[name] = (wl, res)
        return cache[name]

    return get


def _key_inputs(graph):
    return [gi for gi in graph.inputs if gi.kind == "key"]


@pytest.mark.parametrize("name", ROWS)
def test_row_is_traced_with_its_keys(name):
    wl = matrix_steps.MAKERS[name]()
    g = autoplan.trace(wl)
    random_ops = {op.primitive for op in g if op.primitive.startswith("random_")}
    if name in matrix_steps.RANDOM:
        assert wl.arg_kinds == ("parameter", "optimizer_state", "batch", "key")
        assert "random_bits" in random_ops
        keys = _key_inputs(g)
        assert keys and all(gi.tensor in g.key_tensors for gi in keys)
        # a typed key's tensor counts its key data's bytes (threefry: two uint32 words)
        typed = [g.tensors[gi.tensor] for gi in keys if g.tensors[gi.tensor].dtype == "key<fry>"]
        assert all(t.nbytes == 8 * t.size for t in typed)
        bits = [op for op in g if op.primitive == "random_bits"]
        assert all(op.flops > 0 for op in bits)
    else:
        assert wl.arg_kinds == ("parameter", "optimizer_state", "batch")
        assert not random_ops and not _key_inputs(g)


@pytest.mark.parametrize("name", ROWS)
def test_row_runs_three_steps_equal_to_one_device(searched, name):
    wl, res = searched(name)
    intra = [p for p in res.plans if not p.is_pipeline and p.schedule.microbatches == 1]
    best = intra[0]
    dp = next(p for p in res.baselines if p.label == "baseline: data parallel")
    for plan in (best, dp):
        # keys are replicated in every plan
        assert all(i.spec.to_pspec() == PartitionSpec() for i in plan.inputs if i.kind == "key")
        report = run(plan, wl, steps=3, compiler_options=FAST, rtol=1e-5, atol=1e-6)
        assert report.equivalence.matched, (plan.label, report.equivalence.message)
        assert len(report.losses) == 3 and all(np.isfinite(report.losses))
    if name in matrix_steps.RANDOM:
        # the plans record (and the runs above pinned) where each device draws its random bits,
        # from the replicated key
        for plan in (best, dp):
            bits = [o for o in plan.stages[0].ops if o.primitive == "random_bits"]
            assert bits and all(t.spec.to_pspec() == PartitionSpec() for o in bits
                                for t in o.tensors if t.role != "output")


def _micro_batched(plans):
    return [p for p in plans if p.is_pipeline or p.schedule.microbatches > 1]


def _default_search(wl, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autoplan.search(wl, "cpu:8", baselines=False, **kw)


@pytest.mark.parametrize("name", matrix_steps.MIXING)
def test_mixing_rows_get_no_micro_batched_candidates_unless_allowed(name):
    """Contrastive and batch-norm losses mix examples across the batch, so micro-batching changes
    them: the default search (pipeline="auto") offers no pipeline or accumulation candidate and
    says why; allowed explicitly, such a candidate runs and the check reports the change."""
    wl = matrix_steps.MAKERS[name]()
    res = _default_search(wl)
    assert res.plans and not _micro_batched(res.plans), res.table()
    assert any(n.startswith(MIXING_NOTE) for n in res.notes), res.notes
    allowed = [p for p in _default_search(wl, allow_microbatching_mixed=True, pipeline=True,
                                          microbatches=2).plans if p.schedule.microbatches > 1]
    assert allowed
    report = run(allowed[0], wl, steps=1, compiler_options=FAST, raise_on_mismatch=False)
    assert not report.equivalence.matched
    assert "mixes examples" in report.equivalence.message


@pytest.mark.parametrize("name", [r for r in ROWS if r not in matrix_steps.MIXING])
def test_row_micro_batched_candidates_run_equal_to_their_reference(name):
    """The rows whose loss is per example get pipeline or accumulation candidates; those over
    several micro-batches that draw random numbers say they draw them per micro-batch, and each
    runs equal to the same micro-batches on one device."""
    wl = matrix_steps.MAKERS[name]()
    res = _default_search(wl)
    assert not any(n.startswith(MIXING_NOTE) for n in res.notes), res.notes
    mb = _micro_batched(res.plans)
    assert mb, res.table()
    for plan in {id(p): p for p in (mb[0], mb[-1])}.values():
        if name in matrix_steps.RANDOM and plan.schedule.microbatches > 1:
            assert RANDOM_NOTE in plan.summary()
        report = run(plan, wl, steps=2, compiler_options=FAST, rtol=1e-5, atol=1e-6)
        assert report.equivalence.matched, (plan.label, report.equivalence.message)


@pytest.mark.parametrize("name", ROWS)
def test_row_exports_into_the_users_own_jit(searched, name):
    wl, res = searched(name)
    plan = next(p for p in res.plans if not p.is_pipeline and p.schedule.microbatches == 1)
    mesh = plan.mesh()
    shardings = plan.named_shardings()
    is_sharding = lambda x: isinstance(x, NamedSharding)  # noqa: E731
    assert jax.tree.structure(shardings, is_leaf=is_sharding) == jax.tree.structure(wl.args)
    step = jax.jit(wl.fn, in_shardings=shardings,
                   out_shardings=(NamedSharding(mesh, PartitionSpec()), shardings[0],
                                  shardings[1]))
    args = jax.device_put(wl.args, shardings)
    loss, new_params, new_opt_state = step.lower(*args).compile(FAST)(*args)
    ref_loss, ref_params, ref_opt = jax.jit(wl.fn).lower(*wl.args).compile(FAST)(*wl.args)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves((new_params, new_opt_state)),
                    jax.tree.leaves((ref_params, ref_opt))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # the same shardings from the plan's exported code, run as a user pastes it
    code = plan.to_code()
    ns: dict = {}
    exec(compile(code, "<plan code>", "exec"), ns)
    pasted = ns["shardings_for"](wl.args)
    assert jax.tree.structure(pasted, is_leaf=is_sharding) == jax.tree.structure(wl.args)
    assert [s.spec for s in jax.tree.leaves(pasted, is_leaf=is_sharding)] == \
        [s.spec for s in jax.tree.leaves(shardings, is_leaf=is_sharding)]
    # and from the plan file, rebuilt in the user's own types
    again = autoplan.Plan.from_json(plan.to_json())
    assert again == plan
    assert jax.tree.structure(again.named_shardings(like=wl), is_leaf=is_sharding) == \
        jax.tree.structure(wl.args)
