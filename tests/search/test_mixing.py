"""Losses that mix examples across the batch: found from the graph, and what the search does."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import autoplan
from autoplan.tracing._batchflow import MIXING_NOTE, mixing

B, F, H = 8, 6, 4


def _params(seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {"w1": jax.random.normal(k1, (F, H)) * 0.3, "w2": jax.random.normal(k2, (H, 3)) * 0.3}


def _batch(seed=1):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return {"x": jax.random.normal(k1, (B, F)), "y": jax.random.normal(k2, (B, 3)),
            "w": jax.random.uniform(k3, (B,)) + 0.5}


def _sgd(loss_fn):
    def train_step(params, batch):
        loss, g = jax.value_and_grad(loss_fn)(params, batch)
        return loss, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)
    return train_step


def _per_example(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"])
    return jnp.sum((h @ params["w2"] - batch["y"]) ** 2, axis=-1)


def _mean(params, batch):
    return jnp.mean(_per_example(params, batch))


def _sum(params, batch):
    return jnp.sum(_per_example(params, batch))


def _weighted_mean(params, batch):
    return jnp.sum(batch["w"] * _per_example(params, batch)) / jnp.sum(batch["w"])


def _layer_norm(params, batch):
    h = batch["x"] @ params["w1"]
    h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


def _token_mean(params, batch):
    # (B, T, F) tokens flattened to (B T, F) and back: per-example all the same
    x = jnp.repeat(batch["x"][:, None, :], 2, axis=1).reshape(B * 2, F)
    h = jnp.tanh(x @ params["w1"]).reshape(B, 2, H).mean(1)
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


def _label_pick(params, batch):
    logits = batch["x"] @ params["w1"]
    labels = jnp.argmax(batch["y"], axis=-1)
    logp = jax.nn.log_softmax(logits[:, :3], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def _batch_norm(params, batch):
    h = batch["x"] @ params["w1"]
    h = (h - h.mean(0)) / jnp.sqrt(h.var(0) + 1e-5)
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


def _centering(params, batch):
    x = batch["x"] - batch["x"].mean(0)
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - batch["y"]) ** 2)


def _contrastive(params, batch):
    a = batch["x"] @ params["w1"]
    b = batch["y"] @ params["w2"].T
    logits = a @ b.T
    return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, axis=-1)))


def _softmax_over_batch(params, batch):
    s = jnp.sum(jnp.tanh(batch["x"] @ params["w1"]), axis=-1)
    return -jnp.mean(jax.nn.log_softmax(s) * batch["w"])


def _pairwise(params, batch):
    h = batch["x"] @ params["w1"]
    d = h[:, None, :] - h[None, :, :]
    return jnp.mean(d ** 2) + jnp.mean(params["w2"] ** 2)


def _rank(params, batch):
    s = jnp.sum(batch["x"] @ params["w1"], axis=-1)
    return jnp.mean(jnp.cumsum(jnp.sort(s)))


PER_EXAMPLE = [_mean, _sum, _weighted_mean, _layer_norm, _token_mean, _label_pick]
MIXED = [_batch_norm, _centering, _contrastive, _softmax_over_batch, _pairwise, _rank]


def _graph(loss_fn):
    return autoplan.trace(autoplan.Workload(_sgd(loss_fn), (_params(), _batch())))


@pytest.mark.parametrize("loss_fn", PER_EXAMPLE, ids=lambda f: f.__name__)
def test_per_example_losses_are_not_flagged(loss_fn):
    assert mixing(_graph(loss_fn)) is None


@pytest.mark.parametrize("loss_fn", MIXED, ids=lambda f: f.__name__)
def test_losses_that_mix_examples_are_flagged(loss_fn):
    found = mixing(_graph(loss_fn))
    assert found is not None
    assert found.reason and str(found).startswith(f"operator {found.op} ")


def _bn_with_stats(p, batch):
    """Batch norm over the batch: the loss and the batch's statistics (a running-statistics
    state argument is advanced with them)."""
    h = batch["x"] @ p["w1"]
    mu, var = h.mean(0), h.var(0)
    out = (h - mu) / jnp.sqrt(var + 1e-5)
    return jnp.mean((out @ p["w2"] - batch["y"]) ** 2), (mu, var)


def _advance(stats, mu, var):
    return {"mean": 0.9 * stats["mean"] + 0.1 * mu, "var": 0.9 * stats["var"] + 0.1 * var}


def test_batch_norm_with_running_statistics_is_flagged():
    def train_step(params, stats, batch):
        (loss, (mu, var)), g = jax.value_and_grad(_bn_with_stats, has_aux=True)(params, batch)
        new_stats = _advance(stats, mu, var)
        return loss, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g), new_stats

    stats = {"mean": jnp.zeros(H), "var": jnp.ones(H)}
    wl = autoplan.Workload(train_step, (_params(), stats, _batch()),
                           arg_kinds=("parameter", "input", "batch"))
    assert mixing(autoplan.trace(wl)) is not None


def test_zoo_models():
    flagged = {name: mixing(autoplan.trace(autoplan.models.get(name, "tiny"))) is not None
               for name in ("mlp", "gpt", "wide_resnet", "two_tower")}
    # Wide-ResNet's batch norm uses the batch's statistics; the two-tower's softmax takes the
    # other examples of the batch as negatives
    assert flagged == {"mlp": False, "gpt": False, "wide_resnet": True, "two_tower": True}


def _adam_workload(loss_fn):
    tx = optax.adam(1e-2)
    params = _params()

    def train_step(params, opt_state, batch):
        loss, g = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(g, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, (params, tx.init(params), _batch()))


def _microbatched(plans):
    return [p for p in plans if p.schedule.microbatches > 1]


def test_search_refuses_microbatching_a_mixed_loss_by_default():
    wl = _adam_workload(_batch_norm)
    res = autoplan.search(wl, "cpu:8", time_limit=10)
    assert _microbatched(res.plans) == []
    assert not any(p.is_pipeline for p in res.plans)
    assert any(n.startswith(MIXING_NOTE) for n in res.notes)
    assert res.mixing is not None


def test_search_allows_microbatching_a_mixed_loss_when_asked():
    wl = _adam_workload(_batch_norm)
    res = autoplan.search(wl, "cpu:8", time_limit=10, allow_microbatching_mixed=True)
    assert _microbatched(res.plans)
    assert any(n.startswith(MIXING_NOTE) for n in res.notes)
    mb = _microbatched(res.plans)
    assert all(any(n.startswith(MIXING_NOTE) for n in p.notes) for p in mb)


def test_search_of_a_per_example_loss_keeps_microbatched_plans():
    res = autoplan.search(_adam_workload(_weighted_mean), "cpu:8", time_limit=10)
    assert _microbatched(res.plans)
    assert not any(n.startswith(MIXING_NOTE) for n in res.notes)


def test_pipeline_true_on_a_mixed_loss_is_refused():
    with pytest.raises(autoplan.SearchError, match="allow_microbatching_mixed"):
        autoplan.search(_adam_workload(_contrastive), "cpu:8", pipeline=True)


def test_allow_microbatching_mixed_is_checked():
    with pytest.raises(autoplan.SearchError, match="allow_microbatching_mixed should be"):
        autoplan.search(_adam_workload(_mean), "cpu:8", allow_microbatching_mixed="yes")


BN_MODULE = '''
import jax, jax.numpy as jnp
import autoplan


def workload():
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w": jax.random.normal(k1, (6, 4)), "v": jax.random.normal(k2, (4, 3))}
    batch = {"x": jnp.ones((8, 6)), "y": jnp.zeros((8, 3))}

    def train_step(params, batch):
        def loss_fn(p):
            h = batch["x"] @ p["w"]
            h = (h - h.mean(0)) / jnp.sqrt(h.var(0) + 1e-5)
            return jnp.mean((h @ p["v"] - batch["y"]) ** 2)
        loss, g = jax.value_and_grad(loss_fn)(params)
        return loss, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)

    return autoplan.Workload(train_step, (params, batch))
'''


@pytest.fixture
def bn_module(tmp_path, monkeypatch):
    (tmp_path / "bn_step.py").write_text(BN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "bn_step:workload"
    import sys

    sys.modules.pop("bn_step", None)


def test_cli_plan_says_why_and_takes_the_flag(bn_module, capsys):
    from autoplan.cli import main

    assert main(["plan", bn_module, "--cluster", "cpu:8", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert f"note: {MIXING_NOTE}" in out and "allow_microbatching_mixed=True" in out
    assert "autoplan-pipeline" not in out
    assert main(["plan", bn_module, "--cluster", "cpu:8", "--no-cache",
                 "--allow-microbatching-mixed"]) == 0
    out = capsys.readouterr().out
    assert "autoplan-pipeline" in out and f"note: {MIXING_NOTE}" in out


def test_explorer_status_shows_the_note(bn_module):
    pytest.importorskip("ipywidgets")
    from autoplan.viz._explorer import Explorer

    ex = Explorer(bn_module, cluster="cpu:8")
    ex.wait_idle(600)
    assert ex.result is not None
    assert MIXING_NOTE in ex._status.value
    assert not any(p.schedule.microbatches > 1 for p in ex.result.plans)


def test_what_autodiff_adds_for_a_maximum_over_the_batch_is_not_mixing():
    """``jnp.max`` over the batch as an aux metric: its derivative's mask (where the maximum is)
    compares the maximum with every example in the forward pass, for the backward pass only."""
    def loss_fn(params, batch):
        per = _per_example(params, batch)
        return jnp.mean(per), jnp.max(per)

    def train_step(params, batch):
        (loss, worst), g = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        return (loss, worst), jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)

    assert mixing(autoplan.trace(autoplan.Workload(train_step, (_params(), _batch())))) is None


def test_a_step_returning_gradients_only_is_analysed_too():
    def train_step(params, batch):
        return jax.grad(_batch_norm)(params, batch)

    assert mixing(autoplan.trace(autoplan.Workload(train_step, (_params(), _batch())))) is not None


def test_the_reason_names_the_operators():
    found = mixing(_graph(_centering))
    assert found.primitive == "sub" and "reduced over the batch (by operator" in found.reason
    assert "reduce_sum" in found.reason


def _log_mean_exp(params, batch):
    return jnp.log(jnp.mean(jnp.exp(_per_example(params, batch) * 0.1)))


def _root_mean_square(params, batch):
    return jnp.sqrt(jnp.mean(_per_example(params, batch)))


def _masked_mean(params, batch):
    mask = (batch["w"] > 0.7).astype(jnp.float32)
    return jnp.sum(mask * _per_example(params, batch)) / jnp.maximum(jnp.sum(mask), 1.0)


def _mean_plus_regulariser(params, batch):
    return jnp.mean(_per_example(params, batch)) + 1e-3 * sum(
        jnp.sum(p ** 2) for p in jax.tree_util.tree_leaves(params))


@pytest.mark.parametrize("loss_fn", [_log_mean_exp, _root_mean_square], ids=lambda f: f.__name__)
def test_non_linear_functions_of_batch_means_are_flagged(loss_fn):
    found = mixing(_graph(loss_fn))
    assert found is not None and "on the way to the loss" in found.reason


@pytest.mark.parametrize("loss_fn", [_masked_mean, _mean_plus_regulariser],
                         ids=lambda f: f.__name__)
def test_masked_means_and_regularisers_are_not_flagged(loss_fn):
    assert mixing(_graph(loss_fn)) is None


def test_a_perplexity_in_aux_is_not_the_loss():
    def loss_fn(params, batch):
        loss = _mean(params, batch)
        return loss, jnp.exp(loss)

    def train_step(params, batch):
        (loss, ppl), g = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        return (loss, ppl), jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)

    assert mixing(autoplan.trace(autoplan.Workload(train_step, (_params(), _batch())))) is None


def test_running_a_micro_batched_plan_of_a_mixed_loss_names_the_cause():
    import autoplan.exec as ex

    wl = _adam_workload(_batch_norm)
    res = autoplan.search(wl, "cpu:8", pipeline=True, microbatches=2, baselines=False,
                          allow_microbatching_mixed=True, time_limit=10)
    plan = next(p for p in res.plans if not p.is_pipeline)
    with pytest.raises(autoplan.EquivalenceError, match=f"Cause: {MIXING_NOTE}"):
        ex.run(plan, wl, steps=1, time_tasks=False)


def test_batch_norm_with_running_statistics_gets_no_micro_batched_plans():
    tx = optax.adam(1e-2)

    def train_step(params, opt_state, stats, batch):
        (loss, (mu, var)), g = jax.value_and_grad(_bn_with_stats, has_aux=True)(params, batch)
        updates, opt_state = tx.update(g, opt_state, params)
        stats = _advance(stats, mu, var)
        return loss, optax.apply_updates(params, updates), opt_state, stats

    params = _params()
    wl = autoplan.Workload(train_step, (params, tx.init(params),
                                        {"mean": jnp.zeros(H), "var": jnp.ones(H)}, _batch()),
                           arg_kinds=("parameter", "optimizer_state", "input", "batch"))
    res = autoplan.search(wl, "cpu:8", time_limit=10)
    assert _microbatched(res.plans) == [] and res.mixing is not None
    assert any(n.startswith(MIXING_NOTE) for n in res.notes)
    # the intra-operator plan runs it, its running statistics advanced step by step
    import autoplan.exec as ex

    rep = ex.run(res.best, wl, steps=3)
    assert rep.equivalence.matched
    assert not np.allclose(np.asarray(rep.outputs[3]["mean"]), 0.0)


def test_a_pipeline_of_one_micro_batch_is_searched_and_runs_a_mixed_loss_exactly():
    import autoplan.exec as ex

    wl = _adam_workload(_batch_norm)
    res = autoplan.search(wl, "cpu:8", pipeline=True, microbatches=1, baselines=False,
                          time_limit=10)
    piped = [p for p in res.plans if p.is_pipeline]
    assert piped and all(p.schedule.microbatches == 1 for p in res.plans)
    rep = ex.run(piped[0], wl, steps=2, time_tasks=False)
    assert rep.mode == "pipeline" and rep.equivalence.matched


def _linen_workload(train: bool):
    nn = pytest.importorskip("flax.linen")

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(8, (3, 3))(x)
            x = nn.BatchNorm(use_running_average=not train)(x)
            return nn.Dense(10)(nn.relu(x).mean((1, 2)))

    model = CNN()
    x, y = jnp.ones((8, 16, 16, 3)), jnp.zeros((8,), jnp.int32)
    variables = model.init(jax.random.key(0), x)
    tx = optax.adam(1e-3)

    def train_step(params, opt_state, batch_stats, batch):
        def loss_fn(p):
            logits, upd = model.apply({"params": p, "batch_stats": batch_stats}, batch["x"],
                                      mutable=["batch_stats"])
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
            return ce, upd["batch_stats"]

        (loss, stats), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(g, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state, stats

    params = variables["params"]
    return autoplan.Workload(train_step, (params, tx.init(params), variables["batch_stats"],
                                          {"x": x, "y": y}),
                             arg_kinds=("parameter", "optimizer_state", "input", "batch"))


def test_flax_batch_norm_in_training_is_flagged_and_with_running_averages_is_not():
    found = mixing(autoplan.trace(_linen_workload(train=True)))
    assert found is not None and "BatchNorm" in found.scope
    assert mixing(autoplan.trace(_linen_workload(train=False))) is None
