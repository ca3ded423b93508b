"""One name per layer in every view, for every model: a plain-JAX MLP without scopes (a dict of
``dense<k>`` layers and a list of arrays), a Flax linen model, an Equinox model and the zoo's
GPT. Every plan of a search (intra-operator, gradient accumulation, pipeline) names its
operators by the search's layers; the stages, the sharding view's columns, the mined-subgraph
view's segments, the stage view and timeline hovers, the summary and the report use those names
only, list each once, and never name ``(root)``, bare operator numbers or a parameter path the
model lacks."""

from __future__ import annotations

import json
import pathlib
import re
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoplan
from autoplan._names import split_input_name
from autoplan.plans._planfile import parse_keystr
from autoplan.search.fold._layers import layer_order
from autoplan.viz import graph_figure, op_layers, report_html, stage_figure, timeline_figure
from autoplan.viz._sharding import sharding_columns

USER_MODELS = pathlib.Path(__file__).resolve().parents[1] / "user_models"
BAD = re.compile(r"\(root\)|\bop ?\d+\b")


def dict_mlp(layers: int = 6, d: int = 32, batch: int = 16) -> autoplan.Workload:
    """A plain-JAX MLP whose parameters are ``{"dense<k>": {"kernel", "bias"}}``, no scopes."""
    rng = np.random.default_rng(0)
    params = {f"dense{k}": {"kernel": jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d),
                                                  jnp.float32),
                            "bias": jnp.zeros((d,), jnp.float32)} for k in range(layers)}
    x = jnp.asarray(rng.standard_normal((batch, d)), jnp.float32)

    def loss_fn(p, x):
        for k in range(layers):
            x = jnp.tanh(x @ p[f"dense{k}"]["kernel"] + p[f"dense{k}"]["bias"])
        return jnp.mean(x ** 2)

    def train_step(p, x):
        loss, g = jax.value_and_grad(loss_fn)(p, x)
        return loss, jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    return autoplan.Workload(train_step, (params, x), name="dict_mlp")


@pytest.fixture(scope="module")
def user_steps():
    sys.path.insert(0, str(USER_MODELS))
    try:
        import user_steps as mod  # noqa: PLC0415
        yield mod
    finally:
        sys.path.remove(str(USER_MODELS))


EXPECTED = {
    "dict_mlp": [f"dense{k}" for k in range(6)],
    "unscoped_mlp": [f"params[{k}]" for k in range(6)],
    "equinox_cnn": ["conv1+conv2", "blocks[0]", "blocks[1]", "head"],
    "linen_mixer": ["Mixer/Conv_0", "Mixer/CheckpointMixerBlock_0",
                    "Mixer/CheckpointMixerBlock_1", "Mixer/LayerNorm_0", "Mixer/Dense_0"],
    "gpt": ["embed", "layers_0", "layers_1", "head"],
}


def workload(name, user_steps):
    if name == "dict_mlp":
        return dict_mlp()
    if name == "gpt":
        return autoplan.models.get("gpt", "tiny")
    return getattr(user_steps, f"make_{name}")()


def param_paths(graph) -> list[list]:
    """Every parameter's keys, its argument's name first."""
    out = []
    for gi in graph.inputs:
        if gi.kind == "parameter":
            arg, path = split_input_name(gi.name)
            out.append([arg, *(parse_keystr(path) or [path])])
    return out


def names_a_missing_path(text: str, paths: list[list]) -> bool:
    """Whether ``text`` is written as a pytree path (``params['dense']``, ``blocks[0]``) that is
    no part of any parameter's path."""
    if "[" not in text:
        return False
    arg, path = split_input_name(text)
    keys = parse_keystr(path)
    if keys is None:
        return False
    want = [arg, *keys]
    return not any(p[i:i + len(want)] == want for p in paths for i in range(len(p)))


def test_a_path_the_model_lacks_is_told_from_one_it_has():
    paths = [["params", "dense0", "kernel"], ["params", "blocks", 0, "norm", "weight"]]
    assert names_a_missing_path("params['dense']", paths)
    assert not names_a_missing_path("params['dense0']", paths)
    assert not names_a_missing_path("blocks[0]", paths) and names_a_missing_path("blocks[1]", paths)
    assert not names_a_missing_path("attn.qkv", paths)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_view_names_the_searchs_layers_once(name, user_steps):
    wl = workload(name, user_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = autoplan.search(wl, "cpu:8", pipeline=True)
    graph = res.graph if getattr(res, "graph", None) is not None else autoplan.trace(wl)
    want = EXPECTED[name]
    assert list(layer_order(autoplan.trace(wl))) == want
    paths = param_paths(graph)
    kinds = {"pipeline": 0, "accumulation": 0, "intra": 0}
    for plan in res.plans:
        kind = ("pipeline" if plan.is_pipeline else
                "accumulation" if plan.schedule.microbatches > 1 else "intra")
        kinds[kind] += 1
        # the stages hold every layer once, in the model's order
        assert [n for s in plan.stages for n in s.layers] == want, (plan.label, kind)
        # every planned operator is in one of them
        shown = op_layers(plan)
        assert set(shown.values()) <= set(want), (plan.label, set(shown.values()) - set(want))
        assert {o.layer for o in plan.ops} <= set(want)
        # the sharding view: each layer in one column, rows never a path the model lacks
        cols, _ = sharding_columns(plan)
        in_cols = [n for c in cols for n in c.layers]
        assert len(in_cols) == len(set(in_cols)) and set(in_cols) <= set(want)
        rows = {k for c in cols for k, _ in c.cells}
        assert not [r for r in rows if BAD.search(r) or names_a_missing_path(r, paths)], rows
        # the mined subgraphs: segments named by their layers, no name twice
        if plan.analysis:
            segs = [d["name"] for d in plan.analysis["layers"]]
            assert len(segs) == len(set(segs))
            base = {re.sub(r" \(\d+/\d+\)$", "", s) for s in segs}
            assert all(b in want or all(p in want for p in b.split("..")) for b in base), segs
            fig = graph_figure(plan)
            bars = next(t for t in fig.data if (t.meta or {}).get("kind") == "layers")
            assert [cd[0] for cd in bars.customdata] == segs
        # the hovers, the summary and the report: no other names
        texts = [json.dumps(stage_figure(plan).to_plotly_json()),
                 json.dumps(timeline_figure(plan).to_plotly_json()), plan.summary()]
        for text in texts:
            assert not BAD.search(text), BAD.search(text).group(0)
    assert kinds["pipeline"] and kinds["accumulation"] + kinds["intra"], kinds
    html = report_html(res)
    body = html[html.find("<body"):]
    assert "(root)" not in body and not re.search(r"\bop\d+\b", body)
