"""The model zoo: JAX training steps of the workloads autoplan is measured on.

Example:
    >>> from autoplan.models import get, list_models
    >>> wl = get("gpt", size="tiny")
    >>> wl.name, wl.size, wl.arg_kinds
    ('gpt', 'tiny', ('parameter', 'optimizer_state', 'batch'))

Models: ``gpt`` (Alpa's GPT sizes up to GPT-3 175B), ``moe`` (GShard MoE), ``wide_resnet``
(Alpa's Wide-ResNet), ``unet``, ``two_tower`` (recommender), ``mlp``. Each has a ``"tiny"`` size
that runs in about a second on CPU.
"""

from autoplan.models._build import Workload as Workload
from autoplan.models._registry import get as get
from autoplan.models._registry import list_models as list_models

__all__ = ["get", "list_models", "Workload"]
