"""A user's own training step, written as users write them: plain JAX and optax, outside autoplan.

``optax_mlp:workload`` is planned and launched by name (``autoplan plan optax_mlp:workload``,
``autoplan launch plan.json --model optax_mlp:workload``) from this folder: the module is found
through the current directory, as a user's would be.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import optax


def workload(hidden: int = 64, layers: int = 3, batch: int = 16, learning_rate: float = 1e-3, *,
             abstract: bool = True, seed: int = 0):
    """An MLP regression step with AdamW: ``(params, opt_state, batch) -> (loss, params,
    opt_state)``. Shapes only when ``abstract``; else arrays initialised from ``seed``."""
    optimizer = optax.adamw(learning_rate)

    def init(key):
        keys = jax.random.split(key, layers + 2)
        params = [{"w": jax.random.normal(keys[i], (hidden, hidden)) / jnp.sqrt(hidden),
                   "b": jnp.zeros((hidden,))} for i in range(layers)]
        x = jax.random.normal(keys[-2], (batch, hidden))
        y = jax.random.normal(keys[-1], (batch, hidden))
        return params, optimizer.init(params), {"x": x, "y": y}

    def loss_fn(params, batch):
        h = batch["x"]
        for layer in params:
            h = jnp.tanh(h @ layer["w"] + layer["b"])
        return jnp.mean((h - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    key = jax.random.key(seed)
    args = jax.eval_shape(init, key) if abstract else init(key)
    return types.SimpleNamespace(fn=train_step, args=args)
