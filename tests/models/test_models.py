"""Tests of the model zoo: interface, training steps, abstract sizes, FLOPs, scopes, errors."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from autoplan._errors import ModelError
from autoplan.models import Workload, get, list_models
from autoplan.models import gpt as gpt_mod
from autoplan.models import mlp as mlp_mod
from autoplan.models import moe as moe_mod
from autoplan.models import two_tower as two_tower_mod
from autoplan.models import unet as unet_mod
from autoplan.models import wide_resnet as wrn_mod
from autoplan.models._blocks import KeyGen

MODULES = {
    "gpt": gpt_mod,
    "moe": moe_mod,
    "wide_resnet": wrn_mod,
    "unet": unet_mod,
    "two_tower": two_tower_mod,
    "mlp": mlp_mod,
}

MODELS = ["gpt", "moe", "wide_resnet", "unet", "two_tower", "mlp"]
# Optimisation level 0 halves XLA:CPU compile time; numerics are unchanged.
FAST = {"xla_backend_optimization_level": 0}


def _size_value(name: str) -> float:
    m = re.fullmatch(r"([0-9.]+)([MB])", name)
    assert m, name
    return float(m.group(1)) * (1e6 if m.group(2) == "M" else 1e9)


def _dot_flops(jaxpr) -> int:
    """2 * output elements * contracted size, summed over every dot_general (nested jaxprs too)."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lc)
        for sub in jaxprs_in_params(eqn.params):
            total += _dot_flops(sub)
    return total


def _name_stacks(jaxpr, out: list[str]) -> list[str]:
    for eqn in jaxpr.eqns:
        out.append(str(eqn.source_info.name_stack))
        for sub in jaxprs_in_params(eqn.params):
            _name_stacks(sub, out)
    return out


def _top_scopes(wl: Workload) -> set[str]:
    """Top-level named scopes of the forward and optimizer eqns (``jvp(x)`` unwrapped to ``x``)."""
    stacks = _name_stacks(jax.make_jaxpr(wl.fn)(*wl.args).jaxpr, [])
    tops = set()
    for s in stacks:
        first = s.split("/")[0]
        m = re.fullmatch(r"(?:transpose\()?(?:jvp\()?([^()]*)\)*", first)
        if m and m.group(1):
            tops.add(m.group(1))
    return tops


def test_list_models_has_all_six_with_tiny():
    models = list_models()
    assert sorted(models) == sorted(MODELS)
    for name, sizes in models.items():
        assert sizes[0] == "tiny", name
        assert all(isinstance(s, str) for s in sizes)
    assert models["gpt"] == [
        "tiny",
        "125M",
        "350M",
        "760M",
        "1.3B",
        "2.6B",
        "6.7B",
        "15B",
        "39B",
        "76B",
        "175B",
    ]
    assert models["moe"][-1] == "70B"
    assert models["wide_resnet"][-1] == "13B"
    assert models["unet"] == ["tiny", "small", "base"]
    assert models["two_tower"] == ["tiny", "small", "base", "large"]


@pytest.mark.parametrize("name", MODELS)
def test_tiny_train_step_runs_and_learns(name):
    wl = get(name, "tiny", abstract=False)
    assert wl.name == name and wl.size == "tiny"
    assert wl.arg_kinds == ("parameter", "optimizer_state", "batch")
    assert not wl.abstract
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(wl.args))
    step = jax.jit(wl.fn, compiler_options=FAST)
    params, opt_state, batch = wl.args
    loss1, params1, opt1 = step(params, opt_state, batch)
    loss2, params2, opt2 = step(params1, opt1, batch)
    loss1, loss2 = float(loss1), float(loss2)
    assert np.isfinite(loss1) and np.isfinite(loss2)
    assert loss2 < loss1, (name, loss1, loss2)  # Adam on the same batch goes downhill
    for old, new in ((params, params1), (opt_state, opt1), (params1, params2), (opt1, opt2)):
        assert jax.tree.structure(old) == jax.tree.structure(new)
        for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new)):
            assert a.shape == b.shape and a.dtype == b.dtype
    assert int(opt1["count"]) == 1 and int(opt2["count"]) == 2
    changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params1))]
    assert sum(changed) >= 0.9 * len(changed)
    # loss_fn is what the step differentiates.
    assert float(jax.jit(wl.loss_fn, compiler_options=FAST)(params, batch)) == pytest.approx(loss1, rel=1e-5)


def test_gpt_175b_config_and_shapes():
    wl = get("gpt", "175B")
    c = wl.config
    assert (c["hidden"], c["layers"], c["heads"], c["seq_len"], c["vocab"], c["batch"]) == (
        12288,
        96,
        96,
        2048,
        51200,
        1024,
    )
    assert c["dtype"] == "float32"
    p = wl.params
    assert p["embed"]["wte"].shape == (51200, 12288)
    assert p["layers"][3]["attn"]["qkv"]["kernel"].shape == (12288, 3 * 12288)
    assert p["layers"][3]["attn"]["qkv"]["bias"].shape == (3 * 12288,)
    assert p["layers"][95]["attn"]["out"]["kernel"].shape == (12288, 12288)
    assert p["layers"][0]["mlp"]["fc1"]["kernel"].shape == (12288, 4 * 12288)
    assert p["layers"][0]["mlp"]["fc2"]["kernel"].shape == (4 * 12288, 12288)
    assert p["layers"][0]["ln1"]["scale"].shape == (12288,)
    assert p["head"]["kernel"].shape == (12288, 51200)
    assert wl.batch["input_ids"].shape == (1024, 2048) and wl.batch["input_ids"].dtype == jnp.int32
    assert wl.opt_state["count"].shape == () and wl.opt_state["count"].dtype == jnp.int32
    assert jax.tree.structure(wl.opt_state["mu"]) == jax.tree.structure(p)


@pytest.mark.parametrize("name", MODELS)
def test_parameter_counts_match_documented_formulas(name):
    for size in list_models()[name]:
        wl = get(name, size)
        assert wl.num_params == MODULES[name].param_count(wl.config), (name, size)


def test_gpt_parameter_counts_match_names():
    for size in list_models()["gpt"][1:]:
        wl = get("gpt", size)
        assert wl.num_params == gpt_mod.param_count(wl.config)
        h, v = wl.config["hidden"], wl.config["vocab"]
        # Alpa's names count the vocabulary matrix once (tied); ours has an untied head on top.
        counted = wl.num_params - h * v
        assert abs(counted / _size_value(size) - 1) < 0.10, (size, counted)
        assert wl.config["batch"] == 1024


def test_moe_and_wide_resnet_parameter_counts_match_names():
    for size in list_models()["moe"][1:]:
        wl = get("moe", size)
        assert wl.num_params == moe_mod.param_count(wl.config)
        counted = wl.num_params - wl.config["hidden"] * wl.config["vocab"]
        assert abs(counted / _size_value(size) - 1) < 0.10, (size, counted)
    for size in list_models()["wide_resnet"][1:]:
        wl = get("wide_resnet", size)
        assert wl.num_params == wrn_mod.param_count(wl.config)
        assert abs(wl.num_params / _size_value(size) - 1) < 0.10, (size, wl.num_params)
        assert wl.config["batch"] == 1536 and wl.config["image"] == 224


def test_moe_structure():
    wl = get("moe", "380M")
    c = wl.config
    assert (c["hidden"], c["layers"], c["experts"], c["vocab"], c["heads"]) == (768, 8, 8, 32000, 16)
    layers = wl.params["layers"]
    assert "mlp" in layers[0] and "moe" not in layers[0]
    assert layers[1]["moe"]["wi"].shape == (8, 768, 8 * 768)
    assert layers[1]["moe"]["wo"].shape == (8, 8 * 768, 768)
    assert layers[1]["moe"]["gate"]["kernel"].shape == (768, 8)
    assert sum("moe" in lp for lp in layers) == 4
    assert moe_mod.capacity(c) == 2 * 2048 // 8
    # The expert group never exceeds the batch's tokens.
    assert get("moe", "380M", batch=1, seq_len=512).config["group_size"] == 512


def test_moe_layer_matches_dense_top2_reference():
    # capacity_factor 2 gives C = group_size: no token is dropped, so routing must equal the plain
    # per-token top-2 mixture.
    cfg = get("moe", "tiny", capacity_factor=2.0).config
    assert moe_mod.capacity(cfg) == cfg["group_size"]
    kg = KeyGen(jax.random.key(3), concrete=True)
    h, e, f = cfg["hidden"], cfg["experts"], cfg["mlp_factor"] * cfg["hidden"]
    p = {
        "gate": {"kernel": jnp.asarray(kg.normal((h, e), 0.5, "float32"))},
        "wi": jnp.asarray(kg.normal((e, h, f), 0.2, "float32")),
        "wo": jnp.asarray(kg.normal((e, f, h), 0.2, "float32")),
    }
    x = jnp.asarray(kg.normal((4, 16, h), 1.0, "float32"))

    def reference(p, x):
        probs = jax.nn.softmax(x @ p["gate"]["kernel"], axis=-1)
        top_p, top_i = jax.lax.top_k(probs, 2)
        gates = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
        outs = jnp.einsum("bsm,emf->bsef", x, p["wi"])
        outs = jnp.einsum("bsef,efm->bsem", jax.nn.gelu(outs), p["wo"])
        picked = jnp.take_along_axis(outs, top_i[..., None], axis=2)
        return jnp.sum(gates[..., None] * picked, axis=2)

    y, aux = jax.jit(lambda p, x: moe_mod.moe_mlp(p, x, cfg))(p, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.jit(reference)(p, x)), rtol=2e-4, atol=2e-5)
    assert 0.5 < float(aux) < float(e)  # E * sum(me * ce): 1 when balanced, E when collapsed
    # With a tiny capacity most tokens overflow and get no expert output.
    small = dict(cfg, capacity_factor=0.125)
    assert moe_mod.capacity(small) == 2
    y_small, _ = jax.jit(lambda p, x: moe_mod.moe_mlp(p, x, small))(p, x)
    served = np.abs(np.asarray(y_small)).reshape(-1, 32, h).sum(-1) > 0  # [groups, tokens]
    assert served.sum(axis=1).max() <= e * 2  # at most E * C token slots per group
    assert served.sum() < served.size


def test_gpt_matmul_flops_equal_alpa_formula():
    for kw in ({}, {"layers": 3, "seq_len": 32, "hidden": 64, "batch": 4}):
        wl = get("gpt", "tiny", **kw)
        step = _dot_flops(jax.make_jaxpr(wl.fn)(*wl.args).jaxpr)
        fwd = _dot_flops(jax.make_jaxpr(wl.loss_fn)(wl.params, wl.batch).jaxpr)
        assert step == gpt_mod.alpa_flops(wl.config)
        assert fwd == gpt_mod.alpa_flops(wl.config, backward=False)


def test_moe_forward_matmul_flops_equal_alpa_formula():
    wl = get("moe", "tiny", layers=4, experts=8, group_size=64)
    c = wl.config
    fwd = _dot_flops(jax.make_jaxpr(wl.loss_fn)(wl.params, wl.batch).jaxpr)
    gating = c["layers"] // 2 * 4 * c["batch"] * c["seq_len"] * c["group_size"]  # not a matmul here
    assert fwd == moe_mod.alpa_flops(c, backward=False) - gating


def test_scopes_name_layers_and_scopes_false_gives_same_loss():
    wl = get("gpt", "tiny", abstract=False)
    assert _top_scopes(wl) >= {"embed", "layers_0", "layers_1", "head", "optimizer"}
    off = get("gpt", "tiny", abstract=False, scopes=False)
    # Without scopes no eqn carries any name (autodiff's jvp()/transpose() wrappers aside).
    for model in (off, get("moe", "tiny", scopes=False)):
        stacks = _name_stacks(jax.make_jaxpr(model.fn)(*model.args).jaxpr, [])
        assert len(stacks) > 500
        assert [s for s in stacks if re.sub(r"transpose|jvp|[()]", "", s)] == []
    on_loss = jax.jit(wl.loss_fn, compiler_options=FAST)(wl.params, wl.batch)
    off_loss = jax.jit(off.loss_fn, compiler_options=FAST)(off.params, off.batch)
    assert float(on_loss) == float(off_loss)


def test_scopes_of_other_models():
    moe = _top_scopes(get("moe", "tiny"))
    assert moe >= {"embed", "layers_0", "layers_1", "head", "optimizer"}
    stacks = _name_stacks(
        jax.make_jaxpr(get("moe", "tiny").loss_fn)(get("moe", "tiny").params, get("moe", "tiny").batch).jaxpr,
        [],
    )
    assert any(s.startswith("layers_1/moe") for s in stacks)
    assert _top_scopes(get("wide_resnet", "tiny")) >= {"stem", "blocks_0", "blocks_3", "head"}
    assert _top_scopes(get("unet", "tiny")) >= {"enc_0", "enc_1", "mid", "dec_0", "dec_1", "head"}
    assert _top_scopes(get("two_tower", "tiny")) >= {"user_embed", "user_layers_0", "item_layers_2", "head"}
    assert _top_scopes(get("mlp", "tiny")) >= {"layers_0", "layers_2", "head"}


def test_overrides_and_batch():
    wl = get("gpt", "tiny", batch=4, layers=3, hidden=64, heads=8, seq_len=32, vocab=512)
    assert len(wl.params["layers"]) == 3
    assert wl.params["layers"][2]["attn"]["qkv"]["kernel"].shape == (64, 192)
    assert wl.batch["input_ids"].shape == (4, 32) and wl.batch["labels"].shape == (4, 32)
    assert wl.params["head"]["kernel"].shape == (64, 512)
    assert wl.config["layers"] == 3 and wl.config["batch"] == 4
    assert get("mlp", "small").config["layers"] == 4 and get("mlp", "small").config["hidden"] == 1024
    bf = get("gpt", "tiny", dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(bf.params)} == {jnp.dtype("bfloat16")}
    assert jax.eval_shape(bf.fn, *bf.args)[0].shape == ()


def test_concrete_is_deterministic_and_matches_abstract():
    a = get("mlp", "tiny")
    c0 = a.concrete(seed=0)
    c0b = get("mlp", "tiny", abstract=False)
    c1 = a.concrete(seed=1)
    assert jax.tree.structure(c0.args) == jax.tree.structure(a.args)
    for x, y, z, s in zip(*(jax.tree.leaves(w.args) for w in (c0, c0b, c1, a))):
        assert x.shape == z.shape == s.shape and x.dtype == z.dtype == s.dtype
        np.testing.assert_array_equal(x, y)
    kernels = [(x, z) for x, z in zip(jax.tree.leaves(c0.params), jax.tree.leaves(c1.params)) if x.ndim == 2]
    assert kernels and all(not np.array_equal(x, z) for x, z in kernels)
    k = np.asarray(c0.params["layers"][1]["kernel"])
    assert abs(k.std() - math.sqrt(2 / 64)) < 0.02 and abs(k.mean()) < 0.02
    labels = np.asarray(c0.batch["labels"])
    assert labels.min() >= 0 and labels.max() < 8 and len(set(labels.tolist())) > 1


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"name": "gtp"}, "'gtp'"),
        ({"name": "gpt", "size": "1B"}, "'1B'"),
        ({"name": "gpt", "size": "tiny", "hiden": 64}, "'hiden'"),
        ({"name": "gpt", "size": "tiny", "heads": 5}, "heads=5"),
        ({"name": "gpt", "size": "tiny", "layers": 0}, "0"),
        ({"name": "gpt", "size": "tiny", "layers": -2}, "-2"),
        ({"name": "gpt", "size": "tiny", "layers": 2.5}, "2.5"),
        ({"name": "gpt", "size": "tiny", "batch": 0}, "'batch'"),
        ({"name": "gpt", "size": "tiny", "dtype": "int8"}, "'int8'"),
        ({"name": "gpt", "size": "tiny", "scopes": "no"}, "'no'"),
        ({"name": "moe", "size": "tiny", "group_size": 24}, "24"),
        ({"name": "moe", "size": "tiny", "top_k": 3}, "3"),
        ({"name": "wide_resnet", "size": "tiny", "depth": 34}, "34"),
        ({"name": "unet", "size": "tiny", "image": 18}, "18"),
        ({"name": "two_tower", "size": "tiny", "user_hidden": (8, -1)}, "-1"),
    ],
)
def test_bad_input_raises_model_error(kwargs, needle):
    with pytest.raises(ModelError) as err:
        get(**kwargs)
    msg = str(err.value)
    assert needle in msg
    assert "Fix:" in msg and "Got" in msg


def test_error_lists_valid_choices():
    with pytest.raises(ModelError, match="175B"):
        get("gpt", "13B")
    with pytest.raises(ModelError, match="wide_resnet"):
        get("resnet")
    with pytest.raises(ModelError, match="seq_len"):
        get("gpt", "tiny", seqlen=8)


def _one_device_memory(wl) -> float:
    """Predicted live memory of the step on one device (parameters, optimizer state, batch and
    the activations saved for the backward)."""
    import autoplan
    from autoplan.algorithms import intra_op_search

    one = autoplan.Cluster.preset("cpu", devices_per_node=1)
    return intra_op_search(autoplan.trace(wl), one, (1, 1)).plan.predicted.memory_per_device


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_master_weights_add_eight_bytes_per_fp16_parameter(name):
    """fp32 master weights: a 4-byte copy of each fp16 parameter and fp32 instead of fp16 Adam
    moments (2 x 2 more bytes), counted by the cost model as optimizer state."""
    plain = get(name, "tiny", dtype="float16")
    master = get(name, "tiny", dtype="float16", master_weights="float32")
    assert set(master.opt_state) == {"count", "master", "mu", "nu"}
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(master.opt_state["mu"]))
    delta = _one_device_memory(master) - _one_device_memory(plain)
    assert delta == 8 * plain.num_params
    # fp32 weights need no copy
    assert set(get(name, "tiny", master_weights="float32").opt_state) == {"count", "mu", "nu"}


def test_master_weights_train_like_fp32():
    """The update runs on the fp32 copy: one step from the same fp16 weights moves the master
    copy as fp32 Adam would, and the new weights are it rounded to fp16."""
    wl = get("mlp", "tiny", dtype="float16", master_weights="float32", abstract=False)
    _, params, state = jax.jit(wl.fn)(*wl.args)
    ref = get("mlp", "tiny", dtype="float32", abstract=False)
    start32 = jax.tree.map(lambda p: p.astype(jnp.float32), wl.args[0])
    _, ref_params, _ = jax.jit(ref.fn)(start32, ref.opt_state, jax.tree.map(
        lambda x: x.astype(jnp.float32) if x.dtype == jnp.float16 else x, wl.args[2]))
    for m, p, r in zip(jax.tree.leaves(state["master"]), jax.tree.leaves(params),
                       jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(m, r, rtol=2e-2, atol=2e-4)
        assert p.dtype == jnp.float16
        np.testing.assert_array_equal(p, m.astype(jnp.float16))


def test_remat_drops_the_saved_activations_as_hand_computed():
    """With remat an MLP layer keeps only its input: its ReLU mask (batch x hidden bools) is no
    longer saved for the backward."""
    cfg = get("mlp", "tiny").config
    full, lean = (_one_device_memory(get("mlp", "tiny", remat=r)) for r in (False, True))
    assert full - lean == cfg["layers"] * cfg["batch"] * cfg["hidden"]


@pytest.mark.parametrize("name", ["gpt", "moe", "wide_resnet", "unet", "two_tower"])
def test_remat_lowers_predicted_memory_and_keeps_the_loss(name):
    plain, lean = get(name, "tiny"), get(name, "tiny", remat=True)
    assert _one_device_memory(lean) < _one_device_memory(plain)
    a, b = get(name, "tiny", abstract=False), get(name, "tiny", remat=True, abstract=False)
    np.testing.assert_allclose(jax.jit(a.loss_fn)(a.args[0], a.args[2]),
                               jax.jit(b.loss_fn)(b.args[0], b.args[2]), rtol=1e-6)


def test_master_weights_rejects_other_values():
    with pytest.raises(ModelError, match="master_weights"):
        get("gpt", "tiny", master_weights="bfloat16")
