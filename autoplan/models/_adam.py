"""Adam written by hand, so the optimizer update is plain JAX inside the traced train step.

The state is ``{"count": int32[], "mu": tree like params, "nu": tree like params}`` and the update
(Kingma & Ba, 2015, Algorithm 1, with bias correction) runs under ``jax.named_scope("optimizer")``:

    m_t = b1 m_{t-1} + (1 - b1) g_t
    v_t = b2 v_{t-1} + (1 - b2) g_t^2
    p_t = p_{t-1} - lr (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from autoplan.models._layers import scope

__all__ = ["adam_init", "adam_update"]


def adam_init(params: Any, zeros_like: Callable[[Any], Any] = jnp.zeros_like) -> dict[str, Any]:
    """Zero Adam state for ``params``.

    Args:
        params: a pytree of arrays.
        zeros_like: makes one zero leaf (``jnp.zeros_like``; the zoo passes a numpy one to avoid
            compiling a fill per shape).

    Returns:
        ``{"count": int32 scalar 0, "mu": zeros like params, "nu": zeros like params}``.
    """
    return {
        "count": np.zeros((), np.int32) if zeros_like is not jnp.zeros_like else jnp.zeros((), jnp.int32),
        "mu": jax.tree.map(zeros_like, params),
        "nu": jax.tree.map(zeros_like, params),
    }


def adam_update(
    params: Any,
    grads: Any,
    state: dict[str, Any],
    *,
    learning_rate: float,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    scoped: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """One Adam step.

    Args:
        params: current parameters.
        grads: gradients, same tree as ``params``.
        state: the Adam state from :func:`adam_init` or a previous update.
        learning_rate: step size.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the root of the second moment.
        scoped: run under ``jax.named_scope("optimizer")``.

    Returns:
        ``(new_params, new_state)`` with the same tree structures as the inputs.
    """
    with scope("optimizer", scoped):
        count = state["count"] + 1
        t = count.astype(jnp.float32)
        c1 = 1.0 - jnp.power(jnp.float32(b1), t)
        c2 = 1.0 - jnp.power(jnp.float32(b2), t)
        mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state["mu"], grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g), state["nu"], grads)

        def step(p, m, v):
            upd = (m / c1) / (jnp.sqrt(v / c2) + eps)
            return (p - learning_rate * upd).astype(p.dtype)

        new_params = jax.tree.map(step, params, mu, nu)
    return new_params, {"count": count, "mu": mu, "nu": nu}
