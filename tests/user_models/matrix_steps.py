"""The model matrix: training steps as users write them, with randomness inside the step and
losses that mix examples. Each ``make_*`` returns an :class:`autoplan.Workload` with concrete,
tiny arguments (a plan runs on 8 emulated CPU devices in seconds):

* ``nnx_dropout``: a Flax NNX MLP with ``nnx.Dropout``, trained through ``nnx.Optimizer``; the
  dropout's ``nnx.Rngs`` state is an argument of its own (kind ``key``);
* ``linen_scan_dropout``: a Flax linen model whose blocks run under ``nn.scan`` with
  ``nn.Dropout``, the dropout key a typed ``jax.random.key``;
* ``equinox_dropout``: an Equinox MLP with ``eqx.nn.Dropout``, the key a raw ``uint32``
  ``jax.random.PRNGKey``;
* ``contrastive``: a plain-JAX two-tower model with in-batch negatives (``logits = a @ b.T``,
  softmax over the batch);
* ``batchnorm_cnn``: a plain-JAX CNN with batch normalisation over the batch's statistics.

Every step is ``train_step(params, opt_state, batch[, key]) -> (loss, params, opt_state)``.
The module-level ``workload_*`` functions are the same workloads by ``module:function`` name
(for ``autoplan plan matrix_steps:workload_equinox_dropout``).
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import autoplan

BATCH = 16


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(rng: np.random.Generator, shape, scale: float = 1.0) -> jax.Array:
    return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


# ---------------------------------------------------------------------------------------------
# Flax NNX: nnx.Dropout and nnx.Optimizer
# ---------------------------------------------------------------------------------------------

class _NnxMLP(nnx.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(d_in, hidden, rngs=rngs)
        self.drop = nnx.Dropout(0.25, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.head = nnx.Linear(hidden, d_out, rngs=rngs)

    def __call__(self, x):
        h = self.drop(nnx.relu(self.fc1(x)))
        return self.head(self.drop(nnx.relu(self.fc2(h))))


def make_nnx_dropout(seed: int = 0) -> autoplan.Workload:
    model = _NnxMLP(16, 32, 4, nnx.Rngs(params=seed, dropout=seed + 1))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    graphdef, params, opt_state, rngs = nnx.split((model, optimizer), nnx.Param, nnx.OptState,
                                                   nnx.RngState)
    rng = _rng(seed)
    batch = {"x": _normal(rng, (BATCH, 16)), "y": _normal(rng, (BATCH, 4))}

    def train_step(params, opt_state, batch, rngs):
        model, optimizer = nnx.merge(graphdef, params, opt_state, rngs)

        def loss_fn(model):
            return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        _, params, opt_state, _ = nnx.split((model, optimizer), nnx.Param, nnx.OptState,
                                            nnx.RngState)
        return loss, params, opt_state

    return autoplan.Workload(train_step, (params, opt_state, batch, rngs), name="nnx_dropout")


# ---------------------------------------------------------------------------------------------
# Flax linen: nn.scan over blocks with nn.Dropout
# ---------------------------------------------------------------------------------------------

class _Block(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, h, _):
        y = nn.Dense(self.hidden)(nn.LayerNorm()(h))
        y = nn.Dropout(0.2, deterministic=False)(nn.gelu(y))
        return h + y, None


class _ScanModel(nn.Module):
    hidden: int = 32
    layers: int = 3

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.hidden)(x)
        blocks = nn.scan(_Block, variable_axes={"params": 0},
                         split_rngs={"params": True, "dropout": True}, length=self.layers)
        h, _ = blocks(self.hidden)(h, None)
        return nn.Dense(4)(h)


def make_linen_scan_dropout(seed: int = 0) -> autoplan.Workload:
    model = _ScanModel()
    tx = optax.adam(1e-2)
    rng = _rng(seed)
    batch = {"x": _normal(rng, (BATCH, 16)), "y": _normal(rng, (BATCH, 4))}
    params = model.init(jax.random.key(seed), batch["x"])["params"]
    opt_state = tx.init(params)

    def train_step(params, opt_state, batch, key):
        def loss_fn(p):
            out = model.apply({"params": p}, batch["x"], rngs={"dropout": key})
            return jnp.mean((out - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, (params, opt_state, batch, jax.random.key(seed + 7)),
                             name="linen_scan_dropout")


# ---------------------------------------------------------------------------------------------
# Equinox: eqx.nn.Dropout with a raw uint32 key
# ---------------------------------------------------------------------------------------------

class _EqxMLP(eqx.Module):
    fc1: eqx.nn.Linear
    drop: eqx.nn.Dropout
    fc2: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.fc1 = eqx.nn.Linear(16, 32, key=k1)
        self.drop = eqx.nn.Dropout(0.3)
        self.fc2 = eqx.nn.Linear(32, 4, key=k2)

    def __call__(self, x, key):
        h = jax.nn.relu(jax.vmap(self.fc1)(x))
        return jax.vmap(self.fc2)(self.drop(h, key=key))


def make_equinox_dropout(seed: int = 0) -> autoplan.Workload:
    params, static = eqx.partition(_EqxMLP(jax.random.key(seed)), eqx.is_array)
    tx = optax.sgd(0.05, momentum=0.9)
    opt_state = tx.init(params)
    rng = _rng(seed)
    batch = {"x": _normal(rng, (BATCH, 16)), "y": _normal(rng, (BATCH, 4))}

    def train_step(params, opt_state, batch, key):
        @eqx.filter_value_and_grad
        def loss_fn(p):
            model = eqx.combine(p, static)
            return jnp.mean((model(batch["x"], key) - batch["y"]) ** 2)

        loss, grads = loss_fn(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, eqx.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, (params, opt_state, batch, jax.random.PRNGKey(seed + 3)),
                             name="equinox_dropout")


# ---------------------------------------------------------------------------------------------
# plain JAX: a contrastive two-tower model (in-batch negatives)
# ---------------------------------------------------------------------------------------------

def make_contrastive(seed: int = 0) -> autoplan.Workload:
    rng = _rng(seed)
    params = {"query": {"w1": _normal(rng, (16, 32), 0.25), "w2": _normal(rng, (32, 8), 0.2)},
              "doc": {"w1": _normal(rng, (24, 32), 0.2), "w2": _normal(rng, (32, 8), 0.2)}}
    tx = optax.adam(1e-2)
    batch = {"query": _normal(rng, (BATCH, 16)), "doc": _normal(rng, (BATCH, 24))}

    def tower(p, x):
        h = jnp.tanh(x @ p["w1"]) @ p["w2"]
        return h / jnp.linalg.norm(h, axis=-1, keepdims=True)

    def loss_fn(params, batch):
        a, b = tower(params["query"], batch["query"]), tower(params["doc"], batch["doc"])
        logits = a @ b.T / 0.1  # every other example of the batch is a negative
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.arange(logits.shape[0])).mean()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, (params, tx.init(params), batch), name="contrastive")


# ---------------------------------------------------------------------------------------------
# plain JAX: a CNN with batch normalisation (the batch's own statistics)
# ---------------------------------------------------------------------------------------------

def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _batch_norm(x, scale, bias, eps: float = 1e-5):
    mean = x.mean(axis=(0, 1, 2))
    var = ((x - mean) ** 2).mean(axis=(0, 1, 2))
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def make_batchnorm_cnn(seed: int = 0) -> autoplan.Workload:
    rng = _rng(seed)
    params = {"conv1": _normal(rng, (3, 3, 3, 8), 0.3), "bn1": {"scale": jnp.ones(8),
                                                                "bias": jnp.zeros(8)},
              "conv2": _normal(rng, (3, 3, 8, 8), 0.2), "bn2": {"scale": jnp.ones(8),
                                                                "bias": jnp.zeros(8)},
              "head": _normal(rng, (8, 4), 0.3)}
    tx = optax.adam(1e-2)
    batch = {"images": _normal(rng, (BATCH, 8, 8, 3)),
             "labels": jnp.asarray(rng.integers(0, 4, BATCH), jnp.int32)}

    def loss_fn(params, batch):
        h = jax.nn.relu(_batch_norm(_conv(batch["images"], params["conv1"]), **params["bn1"]))
        h = jax.nn.relu(_batch_norm(_conv(h, params["conv2"]), **params["bn2"]))
        logits = h.mean(axis=(1, 2)) @ params["head"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, (params, tx.init(params), batch), name="batchnorm_cnn")


MAKERS = {
    "nnx_dropout": make_nnx_dropout,
    "linen_scan_dropout": make_linen_scan_dropout,
    "equinox_dropout": make_equinox_dropout,
    "contrastive": make_contrastive,
    "batchnorm_cnn": make_batchnorm_cnn,
}
#: the rows whose loss mixes examples across the batch (micro-batching would change it)
MIXING = ("contrastive", "batchnorm_cnn")
#: the rows that draw random numbers inside the step
RANDOM = ("nnx_dropout", "linen_scan_dropout", "equinox_dropout")


def workload_equinox_dropout(seed: int = 0) -> autoplan.Workload:
    """The Equinox dropout row by ``module:function`` name (the command line's form)."""
    return make_equinox_dropout(seed)


def workload_nnx_dropout(seed: int = 0) -> autoplan.Workload:
    """The Flax NNX dropout row by ``module:function`` name."""
    return make_nnx_dropout(seed)
