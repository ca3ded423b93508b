"""A micro-batched plan of a step that draws random numbers: the plan says it draws them per
micro-batch, and the equivalence check compares it with the same micro-batches run on one
device (each micro-batch draws its own numbers, as the plan runs it)."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exec_cases import FAST

import autoplan
from autoplan.exec import run
from autoplan.tracing._batchflow import RANDOM_NOTE

B, F, H = 16, 8, 16


def _loss(p, batch, key):
    # dropout drawn with lax.rng_bit_generator from a raw uint32 key
    _, bits = jax.lax.rng_bit_generator(key, (batch["x"].shape[0], H), dtype=jnp.uint32)
    keep = (bits >> 8).astype(jnp.float32) / 2**24 < 0.8
    with jax.named_scope("layers_0"):
        h = jnp.tanh(batch["x"] @ p["w"]) * keep / 0.8
    with jax.named_scope("layers_1"):
        h = jnp.tanh(h @ p["u"])
    with jax.named_scope("layers_2"):
        out = h @ p["v"]
    return jnp.mean((out - batch["y"]) ** 2)


def dropout_step(params, batch, key):
    loss, g = jax.value_and_grad(_loss)(params, batch, key)
    new_key, _ = jax.lax.rng_bit_generator(key, (1,), dtype=jnp.uint32)
    return loss, jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, params, g), new_key


@functools.cache
def _workload():
    k = jax.random.split(jax.random.key(0), 5)
    params = {"w": jax.random.normal(k[0], (F, H)) * 0.3, "u": jax.random.normal(k[1], (H, H)) * 0.3,
              "v": jax.random.normal(k[2], (H, 3)) * 0.3}
    batch = {"x": jax.random.normal(k[3], (B, F)), "y": jax.random.normal(k[4], (B, 3))}
    key = jnp.array([1, 2, 3, 4], dtype=jnp.uint32)
    return autoplan.Workload(dropout_step, (params, batch, key))


@functools.cache
def _plans():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = autoplan.search(_workload(), "cpu:8", pipeline=True, microbatches=2,
                              baselines=False)
        intra = autoplan.plan(_workload(), "cpu:8", pipeline=False, baselines=False)
    return res.plans, intra


def test_micro_batched_plans_say_they_draw_per_micro_batch():
    plans, intra = _plans()
    assert plans and all(p.schedule.microbatches == 2 for p in plans)
    for p in plans:
        assert any(n.startswith(RANDOM_NOTE) for n in p.notes)
        assert f"note            : {RANDOM_NOTE}" in p.summary()
        assert autoplan.Plan.from_json(p.to_json()).notes == p.notes
    assert not any(n.startswith(RANDOM_NOTE) for n in intra.notes)
    assert RANDOM_NOTE not in intra.summary()


def _by_hand(steps):
    """The plan's computation written out: each step, each micro-batch's loss and gradient from
    the same key, averaged; the key advanced as the step returns it."""
    wl = _workload()
    params, batch, key = wl.args
    grad = jax.jit(jax.value_and_grad(_loss))
    losses = []
    for _ in range(steps):
        parts = [grad(params, jax.tree_util.tree_map(lambda x, i=i: x[i * B // 2:(i + 1) * B // 2],
                                                     batch), key) for i in range(2)]
        losses.append(float(sum(lo for lo, _ in parts) / 2))
        g = jax.tree_util.tree_map(lambda a, b: (a + b) / 2, parts[0][1], parts[1][1])
        params = jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, params, g)
        key, _ = jax.lax.rng_bit_generator(key, (1,), dtype=jnp.uint32)
    full = float(_loss(*wl.args))
    return losses, full


@pytest.mark.parametrize("kind", ["accumulation", "pipeline"])
def test_the_check_compares_with_the_same_micro_batches_on_one_device(kind):
    plans, _ = _plans()
    plan = next(p for p in plans if p.is_pipeline == (kind == "pipeline"))
    rep = run(plan, _workload(), steps=3, compiler_options=FAST, time_tasks=False)
    assert rep.mode == kind
    assert rep.equivalence.matched, rep.equivalence.message
    assert "micro-batches on one device" in rep.equivalence.message
    by_hand, full = _by_hand(3)
    np.testing.assert_allclose(rep.losses, by_hand, rtol=1e-5, atol=1e-6)
    # the draws differ from one full-batch step's: a full-batch reference could not match
    assert abs(rep.losses[0] - full) > 1e-3


def test_intra_operator_plans_match_the_full_batch_step():
    _, intra = _plans()
    rep = run(intra, _workload(), steps=2, compiler_options=FAST)
    assert rep.equivalence.matched
    assert "micro-batches" not in rep.equivalence.message
