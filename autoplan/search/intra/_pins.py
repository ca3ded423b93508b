"""Pins: fixing some graph inputs' specs before the intra-operator ILP.

A pin maps a graph input to a ``PartitionSpec``; the ILP gives that input exactly that spec. Its
key is either a regular expression over input names (``params['w']``; every input whose name it
``re.search``-es is pinned), as users write them, or a graph input's tensor id, as the baselines
write them: a baseline is a spec per input, so it is expressed by input rather than by pattern.
:func:`resolve_pins` turns either into ``{input tensor id: PartitionSpec}`` once per graph.

The baselines' pins:

* :func:`data_parallel_pins`: the batch split on its leading dimension over axis ``x``, every
  parameter and optimizer-state leaf replicated;
* :func:`zero_pins`: ZeRO's data parallelism (Rajbhandari et al., "ZeRO", SC'20): the batch split
  over axis ``x`` and the optimizer state partitioned over it (stage 2, whose gradients the
  optimizer then reads reduce-scattered), or the parameters too (stage 3, gathered where used);
* :func:`megatron_pins`: Megatron-LM's expert layout (QKV / FC1 / expert ``wi`` kernels split on
  their output dimension, attention-output / FC2 / expert ``wo`` kernels on their input
  dimension, the embedding vocabulary-parallel, the LM head on its vocabulary dimension) with
  tensor parallelism on mesh axis ``y``.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import Any

from jax.sharding import PartitionSpec as P

from autoplan._errors import SearchError
from autoplan._graph import OpGraph
from autoplan._memo import memo

__all__ = ["data_parallel_pins", "zero_pins", "megatron_pins", "resolve_pins", "pinned_by", "pins_key"]

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


def pins_key(pins: Mapping[Any, Any] | None) -> Hashable | None:
    """A hashable form of ``pins`` (to memoize what is derived from them), or None when a
    value is not hashable: its keys and its values, in order, as two tuples (the Megatron pins
    of a deep model hold thousands of inputs, and a memo keeps its keys: two tuples, not a
    pair per input)."""
    if not pins:
        return ()
    try:
        key = (tuple(pins.keys()), tuple(pins.values()))
        hash(key)
    except TypeError:
        return None
    return key


def resolve_pins(graph: OpGraph, pins: Mapping[Any, Any] | None) -> dict[int, Any]:
    """``{input tensor id: PartitionSpec or None}`` for ``pins`` keyed by regular expressions
    over input names or by graph inputs' tensor ids (a later key overrides an earlier one on the
    same input). Computed once per graph and pins.

    Raises:
        SearchError: a key that is not a valid regular expression, matches no input name, or is
            an integer that is not a graph input's tensor id.
    """
    return {t: pspec for t, (_, pspec) in pinned_by(graph, pins).items()}


def pinned_by(graph: OpGraph, pins: Mapping[Any, Any] | None) -> dict[int, tuple[Any, Any]]:
    """``{input tensor id: (the pin's key, its PartitionSpec)}``: :func:`resolve_pins` with the
    key that pinned each input (for error messages)."""
    key = pins_key(pins)
    if key is None:
        return _resolve(graph, pins)
    return memo(graph, ("pins", key), lambda: _resolve(graph, pins))


def _resolve(graph: OpGraph, pins: Mapping[Any, Any] | None) -> dict[int, tuple[Any, Any]]:
    out: dict[int, tuple[Any, Any]] = {}
    input_of = graph.input_of_tensor
    for pattern, pspec in (pins or {}).items():
        if isinstance(pattern, int) and not isinstance(pattern, bool):
            if pattern not in input_of:
                raise SearchError(
                    f"pin: an integer key should be the tensor id of a graph input. Got "
                    f"{pattern}, which is not one. Fix: use gi.tensor of one of graph.inputs, or "
                    "a regular expression over input names.")
            _refuse_sharded_key(graph, [input_of[pattern]], pattern, pspec)
            out[pattern] = (pattern, pspec)
            continue
        if not isinstance(pattern, str):
            raise SearchError(f"pin: keys should be regular expressions over input names (or "
                              f"graph inputs' tensor ids). Got {pattern!r}. Fix: e.g. "
                              "{r\"\\['fc1'\\]\\['kernel'\\]\": PartitionSpec(None, 'y')}.")
        try:
            hits = graph.find_inputs(pattern, names_only=True)
        except re.error as err:
            raise SearchError(f"pin: {pattern!r} should be a regular expression ({err}). Fix: "
                              "escape brackets, e.g. r\"\\['fc1'\\]\\['kernel'\\]\".") from err
        if not hits:
            names = ", ".join(gi.name for gi in graph.inputs[:3])
            raise SearchError(f"pin: {pattern!r} matches no graph input. Input names look like "
                              f"{names}. Fix: use a regular expression that re.search finds in "
                              "one of them.")
        keys = graph.key_tensors
        if _sharded(pspec) and any(gi.tensor in keys for gi in hits):
            # PRNG keys stay replicated: a pattern over keys alone is refused, and the keys a
            # wider pattern also matches are left out of it
            _refuse_sharded_key(graph, [gi for gi in hits if gi.tensor not in keys] or hits,
                                pattern, pspec)
            hits = [gi for gi in hits if gi.tensor not in keys]
        for gi in hits:
            out[gi.tensor] = (pattern, pspec)
    return out


def _sharded(pspec: Any) -> bool:
    return pspec is not None and any(e is not None for e in tuple(pspec))


def _refuse_sharded_key(graph: OpGraph, hits: list[Any], pattern: Any, pspec: Any) -> None:
    """Raise :class:`SearchError` when ``hits`` are PRNG keys pinned to a sharded spec."""
    if not _sharded(pspec) or not all(gi.tensor in graph.key_tensors for gi in hits):
        return
    raise SearchError(
        f"pin: {pattern!r} should not shard PRNG keys: a key is replicated on every device. Got "
        f"{pspec} for {hits[0].name} (kind {hits[0].kind!r}). Fix: pin it to PartitionSpec() or "
        "leave it unpinned.")


def data_parallel_pins(graph: OpGraph) -> dict[int, Any]:
    """Data parallelism as pins by input tensor id: every batch leaf (PRNG keys aside) split on its leading
    dimension over axis ``x``, every parameter and optimizer-state leaf replicated."""
    pins: dict[int, Any] = {}
    for gi in graph.inputs:
        shape = graph.tensors[gi.tensor].shape
        if gi.kind == "batch":
            pins[gi.tensor] = P("x") if shape and gi.tensor not in graph.key_tensors else P()
        elif gi.kind in ("parameter", "optimizer_state"):
            pins[gi.tensor] = P()
    return pins


def zero_pins(graph: OpGraph, devices: int, stage: int) -> dict[int, Any]:
    """ZeRO stage ``stage`` (2 or 3) on a data-parallel mesh of ``devices`` (axis ``x``) as pins
    by input tensor id: every batch leaf split on its leading dimension, every optimizer-state
    leaf (and for stage 3 every parameter leaf) partitioned on its first dimension that
    ``devices`` divides (replicated where none does), the other parameters replicated."""
    if stage not in (2, 3):
        raise SearchError(f"zero_pins: stage should be 2 or 3. Got {stage!r}.")
    pins: dict[int, Any] = {}
    for gi in graph.inputs:
        shape = graph.tensors[gi.tensor].shape
        if gi.kind == "batch":
            pins[gi.tensor] = P("x") if shape else P()
        elif gi.kind == "optimizer_state" or (gi.kind == "parameter" and stage == 3):
            dim = next((d for d, n in enumerate(shape) if n % devices == 0), None)
            pins[gi.tensor] = P() if dim is None else P(*([None] * dim), "x")
        elif gi.kind == "parameter":
            pins[gi.tensor] = P()
    return pins


def megatron_pins(graph: OpGraph, tp: int) -> dict[int, Any] | None:
    """Megatron pins by input tensor id (tensor parallelism of ``tp`` devices on axis ``y``, the
    batch split over ``x``), or None when the model has no Megatron layers; matched once per
    graph and ``tp`` (a search asks whether the baseline applies, then solves it), a new dict
    each call."""
    pins = memo(graph, ("megatron pins", tp), lambda: _megatron_pins(graph, tp))
    return None if pins is None else dict(pins)


def _megatron_pins(graph: OpGraph, tp: int) -> dict[int, Any] | None:
    pins: dict[int, Any] = {}
    matched = 0
    for gi in graph.inputs:
        shape = graph.tensors[gi.tensor].shape
        if gi.kind == "batch":
            pins[gi.tensor] = P("x") if shape and gi.tensor not in graph.key_tensors else P()
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
        pins[gi.tensor] = spec
    return pins if matched else None
