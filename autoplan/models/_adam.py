"""Adam written by hand, so the optimizer update is plain JAX inside the traced train step.

The state is ``{"count": int32[], "mu": tree like params, "nu": tree like params}`` and the update
(Kingma & Ba, 2015, Algorithm 1, with bias correction) runs under ``jax.named_scope("optimizer")``:

    m_t = b1 m_{t-1} + (1 - b1) g_t
    v_t = b2 v_{t-1} + (1 - b2) g_t^2
    p_t = p_{t-1} - lr (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)

Mixed-precision training (``master_weights="float32"``, as Alpa's GPT benchmark trains fp16
models) keeps an fp32 master copy of every fp16/bf16 parameter in the state (``"master"``), with
fp32 moments: the update runs in fp32 on the master copy (the gradient cast up) and the new
parameters are the master copy cast down. Per parameter element that adds 4 bytes (the copy) and
2 x 2 bytes (fp32 instead of fp16 moments): 8 bytes of optimizer state, once per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from autoplan._errors import ModelError
from autoplan.models._blocks import scope

__all__ = ["adam_init", "adam_update", "MASTER_WEIGHTS", "uses_master"]

#: Choices of ``master_weights``: ``"none"`` (the state in the parameters' dtype) or
#: ``"float32"`` (an fp32 master copy and fp32 moments for fp16/bf16 parameters).
MASTER_WEIGHTS = ("none", "float32")


def uses_master(params: Any, master_weights: str) -> bool:
    """Whether ``master_weights`` adds a master copy: ``"float32"`` and some floating parameter
    narrower than fp32."""
    if master_weights not in MASTER_WEIGHTS:
        raise ModelError(f"master_weights should be one of {list(MASTER_WEIGHTS)}. Got "
                         f"{master_weights!r}. Fix: pass master_weights='float32' for an fp32 "
                         "master copy of fp16/bf16 weights, or 'none'.")
    if master_weights == "none":
        return False
    return any(jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize < 4
               for x in jax.tree.leaves(params))


def adam_init(params: Any, zeros_like: Callable[[Any], Any] = jnp.zeros_like,
              master_weights: str = "none") -> dict[str, Any]:
    """Zero Adam state for ``params``.

    Args:
        params: a pytree of arrays.
        zeros_like: makes one zero leaf (``jnp.zeros_like``; the zoo passes a numpy one to avoid
            compiling a fill per shape).
        master_weights: ``"none"`` or ``"float32"`` (see the module docstring).

    Returns:
        ``{"count": int32 scalar 0, "mu": zeros like params, "nu": zeros like params}``, plus
        ``"master"`` (the parameters in fp32) with fp32 moments when a master copy is kept.
    """
    concrete = zeros_like is not jnp.zeros_like
    count = np.zeros((), np.int32) if concrete else jnp.zeros((), jnp.int32)
    if not uses_master(params, master_weights):
        return {"count": count, "mu": jax.tree.map(zeros_like, params),
                "nu": jax.tree.map(zeros_like, params)}
    if concrete:
        master = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    else:
        master = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    return {"count": count, "master": master, "mu": jax.tree.map(zeros_like, master),
            "nu": jax.tree.map(zeros_like, master)}


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
        ``(new_params, new_state)`` with the same tree structures as the inputs. With a master
        copy in ``state`` the update runs on it in fp32 and the new parameters are it cast to
        the parameters' dtypes.

    With Python numbers for the hyperparameters the update is a ``jax.jit`` of them, and each
    phase of one parameter (its moments, its step, its casts) a ``jax.jit`` of its own: a step
    traced again with other batch shapes (the pipeline search's micro-batch sizes) reuses the
    update's trace, and the first trace traces each phase once per parameter shape rather than
    once per parameter. The equations are the same as the plain update's, in the same order
    (``jit`` only wraps them; :func:`autoplan.trace` inlines it), so the traced graph is the same
    operator for operator.
    """
    hyper = (learning_rate, b1, b2, eps)
    if all(type(h) in (int, float) for h in hyper) and isinstance(scoped, bool):
        return _update_jit(params, grads, state, hyper=hyper, scoped=scoped)
    return _update(params, grads, state, hyper, scoped, _phases(*hyper))


def _update(params: Any, grads: Any, state: dict[str, Any], hyper: tuple, scoped: bool,
            phases: tuple[Callable, ...]) -> tuple[Any, dict[str, Any]]:
    """:func:`adam_update` with its per-parameter ``phases`` (:func:`_phases`)."""
    _, b1, b2, _ = hyper
    cast, first, second, step = phases
    with scope("optimizer", scoped):
        count = state["count"] + 1
        t = count.astype(jnp.float32)
        c1 = 1.0 - jnp.power(jnp.float32(b1), t)
        c2 = 1.0 - jnp.power(jnp.float32(b2), t)
        master = state.get("master")
        if master is not None:
            grads = jax.tree.map(cast, grads, master)
        mu = jax.tree.map(first, state["mu"], grads)
        nu = jax.tree.map(second, state["nu"], grads)

        def stepped(p, m, v):
            return step(p, m, v, c1, c2)

        if master is None:
            return jax.tree.map(stepped, params, mu, nu), {"count": count, "mu": mu, "nu": nu}
        new_master = jax.tree.map(stepped, master, mu, nu)
        new_params = jax.tree.map(cast, new_master, params)
    return new_params, {"count": count, "master": new_master, "mu": mu, "nu": nu}


def _phases(learning_rate: float, b1: float, b2: float, eps: float
            ) -> tuple[Callable, Callable, Callable, Callable]:
    """Adam's per-parameter phases: ``cast(x, like)`` (to ``like``'s dtype), the first and
    second moments ``first(m, g)`` and ``second(v, g)``, and ``step(p, m, v, c1, c2)`` (the
    bias corrections ``c1, c2`` given)."""

    def cast(x, like):
        return x.astype(like.dtype)

    def first(m, g):
        return b1 * m + (1.0 - b1) * g

    def second(v, g):
        return b2 * v + (1.0 - b2) * jnp.square(g)

    def step(p, m, v, c1, c2):
        upd = (m / c1) / (jnp.sqrt(v / c2) + eps)
        return (p - learning_rate * upd).astype(p.dtype)

    return cast, first, second, step


@functools.cache
def _jitted_phases(learning_rate: float, b1: float, b2: float, eps: float
                   ) -> tuple[Callable, ...]:
    """:func:`_phases` each under ``jax.jit``, one set per hyperparameters (so that their
    traces are kept across calls)."""
    return tuple(jax.jit(f) for f in _phases(learning_rate, b1, b2, eps))


@functools.partial(jax.jit, static_argnames=("hyper", "scoped"))
def _update_jit(params: Any, grads: Any, state: dict[str, Any], *, hyper: tuple, scoped: bool
                ) -> tuple[Any, dict[str, Any]]:
    return _update(params, grads, state, hyper, scoped, _jitted_phases(*hyper))
