"""How the zoo builds a :class:`Workload` (:class:`autoplan.Workload`, the one workload type) from a
model definition.

A model definition (:class:`ModelDef`) gives per-size configs, a parameter initialiser, a batch
initialiser and a loss. :func:`build` turns it into a training step
``train_step(params, opt_state, batch) -> (loss, new_params, new_opt_state)``: ``jax.value_and_grad``
of the loss followed by the hand-written Adam update of :mod:`autoplan.models._adam`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from autoplan._errors import ModelError
from autoplan.models._adam import MASTER_WEIGHTS, adam_init, adam_update
from autoplan.models._blocks import KeyGen
from autoplan.tracing._workload import Origin, Workload

__all__ = ["Workload", "ModelDef", "DTYPES", "resolve_config", "build"]

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

#: Fields every model's config has, with their defaults: ``remat`` recomputes each layer's
#: activations in the backward pass (``jax.checkpoint`` per layer, only the layer's inputs kept);
#: ``master_weights="float32"`` keeps an fp32 master copy of fp16/bf16 weights in the optimizer
#: state (:mod:`autoplan.models._adam`).
COMMON: dict[str, Any] = {"dtype": "float32", "scopes": True, "learning_rate": 1e-3,
                          "remat": False, "master_weights": "none"}


@dataclasses.dataclass(frozen=True)
class ModelDef:
    """How to build one model of the zoo.

    Attributes:
        name: registry name.
        sizes: size name -> config fields specific to that size (every size gives the same keys).
        init_params: ``(keygen, config) -> params`` (values from a :class:`KeyGen`).
        init_batch: ``(keygen, config) -> batch``.
        loss: ``(params, batch, config) -> scalar``.
        check: ``config -> None``, raises :class:`ModelError` on inconsistent values.
        finalize: ``config -> config``, fills derived values before ``check`` (optional).
        nonneg: numeric fields that may be zero (others must be positive).
    """

    name: str
    sizes: Mapping[str, Mapping[str, Any]]
    init_params: Callable[[KeyGen, dict], Any]
    init_batch: Callable[[KeyGen, dict], Any]
    loss: Callable[[Any, Any, dict], Any]
    check: Callable[[dict], None] = lambda cfg: None
    finalize: Callable[[dict], dict] | None = None
    nonneg: frozenset[str] = frozenset()


def _field_error(model: str, key: str, want: str, value: Any, fix: str) -> ModelError:
    return ModelError(f"Config field {key!r} of model {model!r} should be {want}. Got {value!r}. Fix: {fix}.")


def _coerce(model: ModelDef, key: str, value: Any, default: Any) -> Any:
    """Checks one config value against the kind of its default and returns it normalised."""
    name = model.name
    zero_ok = key in model.nonneg
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise _field_error(name, key, "True or False", value, f"pass {key}=True or {key}=False "
                               f"(on the command line: --set {key}=true or --set {key}=false)")
        return value
    if isinstance(default, numbers.Integral):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise _field_error(name, key, "an integer", value, f"pass an int, e.g. {key}={default}")
        if value < 0 or (value == 0 and not zero_ok):
            want = "a non-negative integer" if zero_ok else "a positive integer"
            raise _field_error(name, key, want, value, f"pass a value such as {key}={default}")
        return int(value)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise _field_error(name, key, "a finite number", value, f"pass e.g. {key}={default}")
        if value < 0 or (value == 0 and not zero_ok):
            want = "a non-negative number" if zero_ok else "a positive number"
            raise _field_error(name, key, want, value, f"pass e.g. {key}={default}")
        return float(value)
    if isinstance(default, tuple):
        ok = isinstance(value, (tuple, list)) and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in value
        )
        if not ok:
            raise _field_error(name, key, "a tuple of positive integers", value,
                               f"pass e.g. {key}={default} (on the command line: --set "
                               f"{key}=[{','.join(map(str, default))}])")
        return tuple(int(v) for v in value)
    if key == "dtype":
        if value not in DTYPES:
            raise _field_error(name, key, f"one of {list(DTYPES)}", value, "pass dtype='float32'")
        return value
    if key == "master_weights":
        if value not in MASTER_WEIGHTS:
            raise _field_error(name, key, f"one of {list(MASTER_WEIGHTS)}", value,
                               "pass master_weights='float32' (an fp32 copy of fp16/bf16 "
                               "weights) or 'none'")
        return value
    return value


def resolve_config(model: ModelDef, size: Any, batch: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The full, validated config of ``model`` at ``size`` with ``batch`` and ``overrides`` applied.

    Args:
        model: the model definition.
        size: a size name from ``model.sizes``.
        batch: global batch size, or None for the size's default.
        overrides: other config fields to replace.

    Returns:
        The config dict.

    Raises:
        ModelError: unknown size or override key, or an invalid value.
    """
    if not isinstance(size, str) or size not in model.sizes:
        raise ModelError(
            f"Size of model {model.name!r} should be one of {list(model.sizes)}. Got {size!r}. "
            f"Fix: pass size= one of those strings (e.g. size='tiny'), or override fields such as "
            f"layers= or hidden= on top of the nearest size."
        )
    defaults = {**model.sizes[size], **COMMON}
    unknown = [k for k in overrides if k not in defaults]
    if unknown:
        raise ModelError(
            f"Override keys of model {model.name!r} should be config fields {sorted(defaults)}. "
            f"Got unknown key(s) {unknown}. Fix: spell the field as listed, or drop it."
        )
    cfg = dict(defaults)
    given = dict(overrides)
    if batch is not None:
        given["batch"] = batch
    for key, value in given.items():
        cfg[key] = _coerce(model, key, value, defaults[key])
    if model.finalize is not None:
        cfg = model.finalize(cfg)
    model.check(cfg)
    return cfg


def build(
    model: ModelDef, size: str, config: Mapping[str, Any], *, abstract: bool, seed: int = 0
) -> Workload:
    """Assemble the :class:`Workload` of a resolved config.

    Args:
        model: the model definition.
        size: the size name (recorded in the workload).
        config: a config from :func:`resolve_config`.
        abstract: give ``jax.ShapeDtypeStruct`` args (nothing allocated) instead of arrays.
        seed: PRNG seed of the concrete initialisation.

    Returns:
        The workload.
    """
    cfg = dict(config)
    lr = cfg["learning_rate"]
    scoped = cfg["scopes"]

    def loss_fn(params, batch):
        return model.loss(params, batch, cfg)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        new_params, new_opt_state = adam_update(params, grads, opt_state, learning_rate=lr, scoped=scoped)
        return loss, new_params, new_opt_state

    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ModelError(f"seed should be an integer. Got {seed!r}. Fix: pass seed=0.")
    key_params, key_batch = jax.random.split(jax.random.key(int(seed)))

    def init(concrete: bool):
        params = model.init_params(KeyGen(key_params, concrete), cfg)
        zeros = (lambda x: np.zeros(x.shape, x.dtype)) if concrete else jnp.zeros_like
        return (params, adam_init(params, zeros, cfg["master_weights"]),
                model.init_batch(KeyGen(key_batch, concrete), cfg))

    if abstract:
        args = jax.eval_shape(lambda: init(False))
    else:
        args = jax.tree.map(jnp.asarray, init(True))

    def make(seed: int) -> tuple[Any, Any, Any]:
        return build(model, size, cfg, abstract=False, seed=seed).args

    defaults = resolve_config(model, size, None, {})
    overrides = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()
                 if k in defaults and defaults[k] != v}  # (JSON values, as specs hold them)
    return Workload(train_step, tuple(args), ("parameter", "optimizer_state", "batch"),
                    model.name, config=cfg, init=make, loss_fn=loss_fn,
                    origin=Origin("zoo", model.name, size, overrides))
