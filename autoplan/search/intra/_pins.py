"""Pins: fixing some graph inputs' specs before the intra-operator ILP.

A pin maps a regular expression over input names (``params['w']``) to a ``PartitionSpec``; the
ILP gives every matching input exactly that spec. The baselines are written as pins:

* :func:`data_parallel_pins`: the batch split on its leading dimension over axis ``x``, every
  parameter and optimizer-state leaf replicated;
* :func:`megatron_pins`: Megatron-LM's expert layout (QKV / FC1 / expert ``wi`` kernels split on
  their output dimension, attention-output / FC2 / expert ``wo`` kernels on their input
  dimension, the embedding vocabulary-parallel, the LM head on its vocabulary dimension) with
  tensor parallelism on mesh axis ``y``.
"""

from __future__ import annotations

import re
from typing import Any

from jax.sharding import PartitionSpec as P

from autoplan._graph import OpGraph

__all__ = ["data_parallel_pins", "megatron_pins"]

# (regex over an input's path, spec) in Megatron-LM's layout; first match wins
_MEGATRON = [
    (r"\['(qkv|query|key|value|fc1|wi|up|gate)'\]\['kernel'\]$", P(None, "y")),
    (r"\['(qkv|query|key|value|fc1|up|gate)'\]\['bias'\]$", P("y")),
    (r"\['(out|fc2|wo|down|proj)'\]\['kernel'\]$", P("y", None)),
    (r"\['wi'\]$", P(None, None, "y")),
    (r"\['wo'\]$", P(None, "y", None)),
    (r"\['(wte|tok|token|embedding)'\]$", P("y", None)),
    (r"\['head'\]\['kernel'\]$", P(None, "y")),
]


def data_parallel_pins(graph: OpGraph) -> dict[str, Any]:
    pins: dict[str, Any] = {}
    for gi in graph.inputs:
        shape = graph.tensors[gi.tensor].shape
        key = "^" + re.escape(gi.name) + "$"
        if gi.kind == "batch":
            pins[key] = P("x") if shape else P()
        elif gi.kind in ("parameter", "optimizer_state"):
            pins[key] = P()
    return pins


def megatron_pins(graph: OpGraph, tp: int) -> dict[str, Any] | None:
    """Megatron pins for the graph's inputs, or None when the model has no Megatron layers."""
    pins: dict[str, Any] = {}
    matched = 0
    for gi in graph.inputs:
        shape = graph.tensors[gi.tensor].shape
        key = "^" + re.escape(gi.name) + "$"
        if gi.kind == "batch":
            pins[key] = P("x") if shape else P()
            continue
        if gi.kind not in ("parameter", "optimizer_state"):
            continue
        spec = P()
        for rx, s in _MEGATRON:
            if re.search(rx, gi.path) and len(tuple(s)) <= len(shape):
                dims_ok = all(e is None or shape[d] % tp == 0 for d, e in enumerate(tuple(s)))
                if dims_ok:
                    spec = s
                    matched += gi.kind == "parameter"
                break
        pins[key] = spec
    return pins if matched else None
