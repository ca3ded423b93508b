"""Every zoo model traces; GPT's traced FLOPs match Alpa's analytic formula."""

import functools
import warnings

import jax
import pytest

import autoplan
from autoplan import models


def _largest(name):
    return models.list_models()[name][-1]


@functools.cache
def _largest_traced(name):
    """A zoo model at its largest size (abstract by default: nothing is allocated) and its
    trace, once per run of this module (GPT-3 175B's takes seconds)."""
    wl = models.get(name, size=_largest(name))
    with warnings.catch_warnings():
        warnings.simplefilter("error", autoplan.OpaqueControlFlowWarning)
        return wl, autoplan.trace(wl)


@pytest.mark.parametrize("name", sorted(models.list_models()))
def test_zoo_model_traces_at_largest_size_abstractly(name):
    wl, g = _largest_traced(name)
    assert wl.abstract
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(wl.args))
    assert len(g) > 0 and g.flops > 0
    assert g.param_count == wl.num_params
    assert {op.role for op in g} == {"forward", "backward", "update"}
    assert {gi.kind for gi in g.inputs} == {"parameter", "optimizer_state", "batch"}
    assert len(g.layers) >= 2
    # the step returns (loss, new parameters, new optimizer state): a float32 scalar, then
    # every parameter and optimizer-state leaf at its path, with the shape and dtype it came in
    out = {o.path: (g.tensors[o.tensor].shape, g.tensors[o.tensor].dtype) for o in g.outputs}
    assert out.pop("[0]") == ((), "float32")
    assert out == {f"[{i.arg + 1}]{i.path}": (g.tensors[i.tensor].shape, g.tensors[i.tensor].dtype)
                   for i in g.inputs if i.kind != "batch"}


@pytest.mark.parametrize("name", sorted(models.list_models()))
def test_zoo_model_traces_concrete_tiny(name):
    wl = models.get(name, size="tiny", abstract=False)
    g = autoplan.trace(wl)
    abstract = autoplan.trace(models.get(name, size="tiny", abstract=True))
    assert len(g) == len(abstract) and g.fingerprint == abstract.fingerprint
    assert g.flops == abstract.flops


@pytest.mark.parametrize("size", ["1.3B", "39B", "175B"])
def test_gpt_flops_match_alpa_formula(size):
    if size == _largest("gpt"):
        wl, g = _largest_traced("gpt")
    else:
        wl = models.get("gpt", size=size)
        g = autoplan.trace(wl)
    c = wl.config
    B, S, H, L, V = c["batch"], c["seq_len"], c["hidden"], c["layers"], c["vocab"]
    alpa = 72 * B * S * H**2 * L * (1 + S / (6 * H)) + 6 * B * S * H * V
    matmul = sum(op.flops for op in g if op.primitive == "dot_general")
    assert matmul == pytest.approx(alpa, rel=0.02)
    # everything else (softmax, norms, GELU, Adam) is a small fraction on top
    assert alpa <= g.flops <= 1.05 * alpa


def test_gpt_layers_and_paths():
    wl = models.get("gpt", size="tiny", layers=3)
    g = autoplan.trace(wl)
    names = [ly.name for ly in g.layers]
    assert names == ["embed", "layers_0", "layers_1", "layers_2", "head"]
    assert any(p.endswith("['layers'][1]['mlp']['fc1']['kernel']") for p in g.layers[2].params)
    assert len(g.find_inputs(r"\['layers'\]\[2\]\['mlp'\]\['fc2'\]\['kernel'\]")) == 3  # param, mu, nu


def test_gpt_without_scopes_traces_the_same_ops():
    a = autoplan.trace(models.get("gpt", size="tiny", scopes=True))
    b = autoplan.trace(models.get("gpt", size="tiny", scopes=False))
    assert [op.primitive for op in a] == [op.primitive for op in b]
    assert all(not op.scope or op.scope == ("optimizer",) for op in b)
    assert any(op.scope and op.scope != ("optimizer",) for op in a)
    assert [(i.path, i.kind) for i in a.inputs] == [(i.path, i.kind) for i in b.inputs]
    assert [(t.shape, t.dtype) for t in a.tensors] == [(t.shape, t.dtype) for t in b.tensors]
