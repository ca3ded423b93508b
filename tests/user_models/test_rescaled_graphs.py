"""A step's graph at another micro-batch count, derived from its full trace and one micro-batch
trace (``rescaled_graph``), is the trace at that count field by field, for the zoo and for users'
own steps; where the two traces cannot determine it (a dimension not a multiple of the batch, a
batch dimension of 1, a size that would not be whole) nothing is derived and the search traces.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import matrix_steps
import pytest
import user_steps

import autoplan
from autoplan import models
from autoplan.search.pipeline import _microbatches as mb
from autoplan.search.pipeline import _pipeline as pp
from autoplan.tracing import _trace
from autoplan.tracing._rescale import rescaled_graph

S, f32 = jax.ShapeDtypeStruct, jnp.float32


def _trace_at(w: autoplan.Workload, count: int) -> autoplan.OpGraph:
    args = w.args if count == 1 else mb.microbatch_workload_args(w.args, w.arg_kinds, count)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _trace.trace(w.fn, *args, arg_kinds=tuple(w.arg_kinds), name=w.name)


def _fields(g: autoplan.OpGraph) -> tuple:
    return (g.ops, g.tensors, g.inputs, g.outputs, g.name, g.consts, g.warnings, g.arg_trees)


CASES = {
    "gpt": lambda: models.get("gpt", "tiny", layers=2, batch=16),
    "moe": lambda: models.get("moe", "tiny", layers=2, batch=32),
    "wide_resnet": lambda: models.get("wide_resnet", "tiny", batch=16),
    "unet": lambda: models.get("unet", "tiny", batch=16),
    **{name: make for name, make in user_steps.MAKERS.items()},
    "nnx_dropout": matrix_steps.make_nnx_dropout,
    "contrastive": matrix_steps.make_contrastive,
    "batchnorm_cnn": matrix_steps.make_batchnorm_cnn,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_derived_graph_is_the_trace_at_its_count(name):
    w = CASES[name]()
    whole = _trace_at(w, 1)
    batch = mb.batch_size(whole)
    part = _trace_at(w, 2)
    derived = 0
    for count in (4, 8, 1):
        if batch % count:
            continue
        got = rescaled_graph(whole, part, 2, count)
        if got is None:
            continue
        assert _fields(got) == _fields(_trace_at(w, count)), (name, count)
        assert mb.batch_size(got) == batch // count
        derived += count > 2
    assert derived  # (a count beyond the traced ones, with more than one example)


def test_nothing_is_derived_where_two_traces_do_not_determine_the_graph():
    """A dimension of ``batch + 1`` or ``batch + 8`` (not a multiple of the batch, whether or
    not its value at the new count would be whole), a batch dimension that would be 1, and a
    reshape into 4 rows of ``batch / 4`` at a count where that is not whole (where the trace
    itself fails): none derived."""
    def extra_row(w, x):  # the batch and one learned row
        return jnp.tanh(jnp.concatenate([x, w[:1]], 0) @ w).sum()

    w, x16, x8 = S((8, 8), f32), S((16, 8), f32), S((8, 8), f32)
    whole, part = (autoplan.trace(extra_row, w, x) for x in (x16, x8))
    assert rescaled_graph(whole, part, 2, 4) is None

    def extra_rows(w, x):  # the batch and eight learned rows: 24 and 16, whole at 4 (6) but wrong
        return jnp.tanh(jnp.concatenate([x, w], 0) @ w).sum()

    whole, part = (autoplan.trace(extra_rows, w, x) for x in (x16, x8))
    assert rescaled_graph(whole, part, 2, 4) is None

    def plain(w, x):
        return jnp.tanh(x @ w).mean()

    whole, part = (autoplan.trace(plain, w, x) for x in (x16, x8))
    assert rescaled_graph(whole, part, 2, 4) is not None
    assert rescaled_graph(whole, part, 2, 16) is None  # (one example: JAX reduces it apart)

    def in_fours(w, x):
        return (x.reshape(4, -1, 8) @ w).sum()

    whole, part = (autoplan.trace(in_fours, w, x) for x in (x16, x8))
    assert rescaled_graph(whole, part, 2, 8) is None
    with pytest.raises(autoplan.TraceError):
        autoplan.trace(in_fours, w, S((2, 8), f32))


def test_the_search_derives_its_second_count_and_plans_as_with_a_trace(monkeypatch):
    """The pipeline search costs a second micro-batch count exactly on a graph derived from its
    two traces (two traces in all, not three), and finds every plan as it does tracing that count."""
    cluster = autoplan.Cluster.preset("p3.16xlarge", 1)
    made = []
    real = _trace.trace
    monkeypatch.setattr(_trace, "trace", lambda *a, **k: made.append(1) or real(*a, **k))

    def search():
        _trace.forget_shared_traces()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return pp.pipeline_search(models.get("gpt", "tiny", layers=4, batch=64), cluster)

    derived = search()
    assert len(derived.stats["microbatches_exact"]) == 2 and len(made) == 2
    monkeypatch.setattr(mb, "rescaled_graph", lambda *a: None)
    traced = search()
    assert len(made) == 5
    assert [p.to_dict() for p in derived.plans] == [p.to_dict() for p in traced.plans]
