"""Training steps written the way users write them, outside autoplan: library layers, optax
optimizers, no named scopes added for autoplan's sake.

Each ``make_*`` function returns an :class:`autoplan.Workload` with concrete arguments (small
enough that tracing, searching and running a plan take seconds on 8 emulated CPU devices) and an
``init(seed)`` making new ones. The parameters' structure is the libraries' own (their
initialisers run under ``jax.eval_shape``); the values are drawn with numpy:

* ``nnx_transformer``: a Flax NNX transformer (``nnx.Embed``, ``nnx.MultiHeadAttention``,
  ``nnx.Linear``, ``nnx.LayerNorm``; blocks in an ``nnx.List``), made pure with
  ``nnx.split``/``nnx.merge``, trained with ``optax.adamw``;
* ``linen_mixer``: a Flax linen MLP-Mixer whose blocks are ``nn.remat``-ed, ``optax.adam``;
* ``equinox_cnn``: an Equinox CNN (``eqx.nn.Conv2d`` stem, residual MLP blocks, a bias-free
  ``eqx.nn.Linear`` head, so ``eqx.partition`` leaves ``None`` in the parameters) trained with
  ``eqx.filter_value_and_grad`` and ``optax.sgd`` with momentum;
* ``scan_cnn``: a plain-JAX CNN with a ``lax.scan`` over stacked residual blocks, ``optax.adam``;
* ``control_flow_mlp``: a plain-JAX MLP whose step clips the gradients with ``lax.cond`` and
  normalises each example with a ``lax.while_loop`` (under ``jax.vmap``), ``optax.adam``.

``make_unscoped_mlp`` is a plain-JAX 6-layer MLP (a Python loop, no scopes) with plain SGD.
"""

from __future__ import annotations

import functools

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import autoplan


def _fill(tree, seed: int, scale: float = 0.2):
    """Concrete arrays for an abstract pytree (``jax.eval_shape`` of the library's own
    initialiser): normal(0, scale) floats, zero integers, drawn with numpy (no per-shape XLA
    compilation of random-number kernels, which costs seconds on a loaded 2-core machine)."""
    rng = np.random.default_rng(seed)

    def leaf(x):
        if jnp.issubdtype(x.dtype, jnp.floating):
            return jnp.asarray((scale * rng.standard_normal(x.shape)).astype(x.dtype))
        return jnp.zeros(x.shape, x.dtype)

    return jax.tree.map(leaf, tree)


def _normal(rng, shape, scale):
    return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


def _optimizer_state(tx, params):
    """``tx.init(params)``'s structure, zero-filled (what every optax state starts as)."""
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(tx.init, params))

# ---------------------------------------------------------------------------------------------
# Flax NNX transformer


class Block(nnx.Module):
    def __init__(self, d: int, heads: int, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d, decode=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.fc1 = nnx.Linear(d, 4 * d, rngs=rngs)
        self.fc2 = nnx.Linear(4 * d, d, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))


class Transformer(nnx.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.blocks = nnx.List([Block(d, heads, rngs) for _ in range(layers)])
        self.ln = nnx.LayerNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def make_nnx_transformer(layers: int = 2, d: int = 32, heads: int = 4, vocab: int = 64,
                         batch: int = 16, seq: int = 16) -> autoplan.Workload:
    abstract = nnx.eval_shape(lambda: Transformer(vocab, d, heads, layers, nnx.Rngs(0)))
    graphdef, shapes = nnx.split(abstract, nnx.Param)
    tx = optax.adamw(1e-3)

    def init(seed):
        params = _fill(shapes, seed)
        tokens = np.random.default_rng(seed + 1).integers(0, vocab, (batch, seq + 1))
        return params, _optimizer_state(tx, params), jnp.asarray(tokens, jnp.int32)

    def loss_fn(params, tokens):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def train_step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, init(0), name="nnx_transformer", init=init)


# ---------------------------------------------------------------------------------------------
# Flax linen MLP-Mixer with nn.remat blocks


class MixerBlock(nn.Module):
    tokens_hidden: int
    channels_hidden: int

    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm()(x)
        y = jnp.swapaxes(y, 1, 2)
        y = nn.Dense(self.tokens_hidden)(y)
        y = nn.Dense(x.shape[1])(nn.gelu(y))
        x = x + jnp.swapaxes(y, 1, 2)
        y = nn.LayerNorm()(x)
        y = nn.Dense(self.channels_hidden)(y)
        return x + nn.Dense(x.shape[2])(nn.gelu(y))


class Mixer(nn.Module):
    blocks: int
    patch: int
    hidden: int
    classes: int

    @nn.compact
    def __call__(self, images):
        x = nn.Conv(self.hidden, (self.patch, self.patch), strides=(self.patch, self.patch))(images)
        x = x.reshape(x.shape[0], -1, self.hidden)
        block = nn.remat(MixerBlock)
        for _ in range(self.blocks):
            x = block(tokens_hidden=2 * x.shape[1], channels_hidden=2 * self.hidden)(x)
        x = nn.LayerNorm()(x).mean(axis=1)
        return nn.Dense(self.classes)(x)


def make_linen_mixer(blocks: int = 2, hidden: int = 32, batch: int = 16, image: int = 16,
                     patch: int = 4, classes: int = 10) -> autoplan.Workload:
    model = Mixer(blocks, patch, hidden, classes)
    tx = optax.adam(1e-3)

    images = jax.ShapeDtypeStruct((batch, image, image, 3), jnp.float32)
    shapes = jax.eval_shape(model.init, jax.random.key(0), images)["params"]

    def init(seed):
        params = _fill(shapes, seed)
        rng = np.random.default_rng(seed + 1)
        data = {"images": jnp.asarray(rng.standard_normal(images.shape), jnp.float32),
                "labels": jnp.asarray(rng.integers(0, classes, (batch,)), jnp.int32)}
        return params, _optimizer_state(tx, params), data

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits = model.apply({"params": p}, batch["images"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, init(0), name="linen_mixer", init=init)


# ---------------------------------------------------------------------------------------------
# Equinox CNN


class ResidualMLP(eqx.Module):
    norm: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __init__(self, d: int, key):
        k1, k2 = jax.random.split(key)
        self.norm = eqx.nn.LayerNorm(d)
        self.fc1 = eqx.nn.Linear(d, 2 * d, key=k1)
        self.fc2 = eqx.nn.Linear(2 * d, d, key=k2)

    def __call__(self, x):
        return x + self.fc2(jax.nn.relu(self.fc1(self.norm(x))))


class EqxCNN(eqx.Module):
    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    blocks: list
    head: eqx.nn.Linear

    def __init__(self, channels: int, blocks: int, image: int, classes: int, key):
        keys = jax.random.split(key, blocks + 3)
        self.conv1 = eqx.nn.Conv2d(3, channels, 3, padding=1, key=keys[0])
        self.conv2 = eqx.nn.Conv2d(channels, channels, 3, stride=2, padding=1, key=keys[1])
        d = channels * (image // 2) ** 2
        self.blocks = [ResidualMLP(d, k) for k in keys[2:-1]]
        self.head = eqx.nn.Linear(d, classes, use_bias=False, key=keys[-1])

    def __call__(self, image):  # one example, channels first (Equinox's convention)
        x = jax.nn.relu(self.conv1(image))
        x = jax.nn.relu(self.conv2(x)).reshape(-1)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_equinox_cnn(channels: int = 4, blocks: int = 2, image: int = 8, classes: int = 10,
                     batch: int = 16) -> autoplan.Workload:
    tx = optax.sgd(1e-2, momentum=0.9)

    abstract = eqx.filter_eval_shape(EqxCNN, channels, blocks, image, classes, jax.random.key(0))
    shapes, static = eqx.partition(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))

    def init(seed):
        params = _fill(shapes, seed)
        rng = np.random.default_rng(seed + 1)
        images = jnp.asarray(rng.standard_normal((batch, 3, image, image)), jnp.float32)
        labels = jnp.asarray(rng.integers(0, classes, (batch,)), jnp.int32)
        return params, _optimizer_state(tx, params), (images, labels)

    @eqx.filter_value_and_grad
    def loss_fn(params, images, labels):
        logits = jax.vmap(eqx.combine(params, static))(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def train_step(params, opt_state, batch):
        images, labels = batch
        loss, grads = loss_fn(params, images, labels)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, eqx.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, init(0), name="equinox_cnn", init=init)


# ---------------------------------------------------------------------------------------------
# plain-JAX CNN with a lax.scan over residual blocks


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def make_scan_cnn(blocks: int = 3, channels: int = 8, image: int = 8, classes: int = 10,
                  batch: int = 16) -> autoplan.Workload:
    tx = optax.adam(1e-3)

    def init(seed):
        rng = np.random.default_rng(seed)
        normal = functools.partial(_normal, rng)

        params = {
            "stem": normal((3, 3, 3, channels), 0.3),
            "blocks": {"w1": normal((blocks, 3, 3, channels, channels), 0.1),
                       "w2": normal((blocks, 3, 3, channels, channels), 0.1),
                       "scale": jnp.ones((blocks, channels))},
            "head": normal((channels, classes), 0.3),
        }
        data = {"images": normal((batch, image, image, 3), 1.0),
                "labels": jnp.asarray(rng.integers(0, classes, (batch,)), jnp.int32)}
        return params, _optimizer_state(tx, params), data

    def loss_fn(params, images, labels):
        x = jax.nn.relu(_conv(images, params["stem"]))

        def block(x, p):
            y = jax.nn.relu(_conv(x, p["w1"]))
            return x + p["scale"] * _conv(y, p["w2"]), None

        x, _ = jax.lax.scan(block, x, params["blocks"])
        logits = x.mean(axis=(1, 2)) @ params["head"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch["images"], batch["labels"])
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, init(0), name="scan_cnn", init=init)


# ---------------------------------------------------------------------------------------------
# plain-JAX MLP with lax.cond gradient clipping and a while_loop


def make_control_flow_mlp(layers: int = 3, d: int = 32, batch: int = 16,
                          max_norm: float = 0.5) -> autoplan.Workload:
    tx = optax.adam(1e-2)

    def init(seed):
        rng = np.random.default_rng(seed)
        normal = functools.partial(_normal, rng)

        params = [{"w": normal((d, d), 1 / np.sqrt(d)), "b": jnp.zeros((d,))}
                  for _ in range(layers)]
        data = {"x": normal((batch, d), 3.0), "y": normal((batch, d), 1.0)}
        return params, _optimizer_state(tx, params), data

    @jax.vmap
    def normalise(x):
        # halve each example until its largest entry is below 1 (a data-dependent trip count)
        def cond(c):
            return jnp.max(jnp.abs(c)) >= 1.0

        return jax.lax.while_loop(cond, lambda c: c * 0.5, x)

    def loss_fn(params, x, y):
        h = normalise(x)
        for p in params:
            h = jnp.tanh(h @ p["w"] + p["b"])
        return jnp.mean((h - y) ** 2)

    def clip(grads):
        norm = optax.tree.norm(grads)
        return jax.lax.cond(norm > max_norm,
                            lambda g: jax.tree.map(lambda a: a * (max_norm / norm), g),
                            lambda g: g, grads)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch["x"], batch["y"])
        updates, opt_state = tx.update(clip(grads), opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return autoplan.Workload(train_step, init(0), name="control_flow_mlp", init=init)


# ---------------------------------------------------------------------------------------------
# plain-JAX MLP without any scope


def make_unscoped_mlp(layers: int = 6, d: int = 64, batch: int = 32) -> autoplan.Workload:
    def init(seed):
        rng = np.random.default_rng(seed)
        return ([jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d), jnp.float32)
                 for _ in range(layers)],
                jnp.asarray(rng.standard_normal((batch, d)), jnp.float32))

    def loss_fn(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    def train_step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return loss, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)

    return autoplan.Workload(train_step, init(0), name="unscoped_mlp", init=init)


# ---------------------------------------------------------------------------------------------
# layers stacked with the libraries' own scans (abstract arguments: for tracing)


class ScannedLayer(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return x + nn.Dense(x.shape[-1])(nn.relu(nn.Dense(2 * x.shape[-1])(x))), None


class LinenScanNet(nn.Module):
    layers: int

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(32)(x)
        stack = nn.scan(ScannedLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                        length=self.layers)
        x, _ = stack()(x, None)
        return nn.Dense(10)(x)


class NNXBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc = nnx.Linear(32, 32, rngs=rngs)

    def __call__(self, x):
        return x + nnx.relu(self.fc(x))


class NNXScanNet(nnx.Module):
    def __init__(self, layers: int):
        self.inp = nnx.Linear(8, 32, rngs=nnx.Rngs(0))
        keys = jax.random.split(jax.random.key(1), layers)
        self.blocks = nnx.vmap(lambda k: NNXBlock(nnx.Rngs(k)))(keys)
        self.out = nnx.Linear(32, 10, rngs=nnx.Rngs(2))

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def body(x, block):
            return block(x)

        return self.out(body(self.inp(x), self.blocks))


def _regression_step(apply, tx):
    def train_step(params, opt_state, batch):
        loss, g = jax.value_and_grad(lambda p: jnp.mean(apply(p, batch) ** 2))(params)
        updates, opt_state = tx.update(g, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return train_step


def make_linen_scan(layers: int = 4) -> autoplan.Workload:
    """Flax linen layers stacked with ``nn.scan``; abstract arguments."""
    model, tx = LinenScanNet(layers), optax.adam(1e-3)
    x = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    params = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
    step = _regression_step(lambda p, b: model.apply({"params": p}, b), tx)
    return autoplan.Workload(step, (params, jax.eval_shape(tx.init, params), x), name="linen_scan")


def make_nnx_scan(layers: int = 4) -> autoplan.Workload:
    """Flax NNX blocks made with ``nnx.vmap`` and applied with ``nnx.scan``; abstract arguments."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: NNXScanNet(layers)), nnx.Param)
    tx = optax.adam(1e-3)
    step = _regression_step(lambda p, b: nnx.merge(graphdef, p)(b), tx)
    x = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    return autoplan.Workload(step, (params, jax.eval_shape(tx.init, params), x), name="nnx_scan")


MAKERS = {
    "nnx_transformer": make_nnx_transformer,
    "linen_mixer": make_linen_mixer,
    "equinox_cnn": make_equinox_cnn,
    "scan_cnn": make_scan_cnn,
    "control_flow_mlp": make_control_flow_mlp,
}
