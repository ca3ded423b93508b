"""The zoo's registry: :func:`get` and :func:`list_models`."""

from __future__ import annotations

from typing import Any

from autoplan._errors import ModelError
from autoplan.models import gpt, mlp, moe, two_tower, unet, wide_resnet
from autoplan.models._build import ModelDef, Workload, build, resolve_config

__all__ = ["get", "list_models"]

MODELS: dict[str, ModelDef] = {m.MODEL.name: m.MODEL for m in (gpt, moe, wide_resnet, unet, two_tower, mlp)}


def list_models() -> dict[str, list[str]]:
    """Model names and their sizes, smallest first.

    Returns:
        ``{model name: [size names]}``, e.g. ``{"gpt": ["tiny", "125M", ...], ...}``.

    Examples:
        >>> "tiny" in list_models()["gpt"]
        True
    """
    return {name: list(m.sizes) for name, m in MODELS.items()}


def get(
    name: str,
    size: str = "tiny",
    batch: int | None = None,
    abstract: bool = True,
    *,
    seed: int = 0,
    **overrides: Any,
) -> Workload:
    """A model's training step and arguments.

    Args:
        name: model name, one of :func:`list_models`.
        size: size name of that model (e.g. ``"1.3B"``; every model has ``"tiny"``).
        batch: global batch size; None takes the size's default (Alpa's 1024 for GPT/MoE, 1536 for
            Wide-ResNet, small batches for ``"tiny"``).
        abstract: give ``jax.ShapeDtypeStruct`` args (nothing allocated); False gives concrete
            arrays initialised from ``seed``.
        seed: PRNG seed of the concrete arrays.
        **overrides: any config field, e.g. ``layers=4, hidden=256, heads=4, seq_len=128``,
            ``scopes=False`` (same computation without ``jax.named_scope``), ``dtype="bfloat16"``.

    Returns:
        The :class:`Workload`.

    Raises:
        ModelError: unknown model, size or override key, or an invalid value.

    Examples:
        >>> wl = get("gpt", "tiny", layers=1)
        >>> wl.config["layers"], wl.arg_kinds
        (1, ('parameter', 'optimizer_state', 'batch'))
    """
    if not isinstance(name, str) or name not in MODELS:
        raise ModelError(
            f"Model name should be one of {list(MODELS)}. Got {name!r}. "
            f"Fix: pass one of those names, e.g. autoplan.models.get('gpt', size='tiny')."
        )
    if not isinstance(abstract, bool):
        raise ModelError(f"abstract should be True or False. Got {abstract!r}. Fix: pass abstract=True.")
    model = MODELS[name]
    cfg = resolve_config(model, size, batch, overrides)
    return build(model, size, cfg, abstract=abstract, seed=seed)
