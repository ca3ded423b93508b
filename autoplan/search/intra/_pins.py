"""Pins: fixing some graph inputs' specs before the intra-operator ILP.

A pin maps a graph input to a ``PartitionSpec``; the ILP gives that input exactly that spec. Its
key is either a regular expression over input names (``params['w']``; every input whose name it
``re.search``-es is pinned), as users write them, or a graph input's tensor id, as the baselines
write them: a baseline is a spec per input, so it is expressed by input rather than by pattern.
Every function of the search takes them as ``pins=``; this module is the one place they are
resolved:

* :func:`resolve_pins` turns either kind of key into ``{input tensor id: PartitionSpec}`` once per
  graph (:func:`pinned_by` with the key that pinned each input);
* :func:`pin_specs` turns those into checked :class:`~autoplan.plans._spec.Spec` s on a logical mesh,
  once per graph, mesh and pins (what the ILP fixes);
* :func:`pins_by_name` rewrites tensor-id keys as their inputs' names, for a graph traced again
  (the pipeline search's micro-batch graph, whose tensor ids differ);
* :func:`baseline_pins` gives each intra-operator baseline's logical mesh and pins;
* :func:`renamed_pin` reads the deprecated ``pin=`` of the public functions.

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

import os
import re
import sys
import warnings
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from jax.sharding import PartitionSpec as P

from autoplan._errors import SearchError
from autoplan._memo import memo, per_owner_and_args
from autoplan.plans._spec import ZERO_SHARDED, Spec, zero_spec
from autoplan.search.intra._spec_space import checked_spec, replicated
from autoplan.tracing._graph import OpGraph

if TYPE_CHECKING:
    from autoplan.costs._cluster import Cluster
    from autoplan.costs._mesh import LogicalMesh

__all__ = ["data_parallel_pins", "zero_pins", "megatron_pins", "resolve_pins", "pinned_by",
           "pins_key", "pin_specs", "pins_by_name", "baseline_pins", "renamed_pin",
           "unheld_pins", "INTRA_BASELINES"]

# autoplan's folder: a deprecation warning names the first caller outside it
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep

#: the intra-operator baselines (:mod:`autoplan.search._baselines`), in the order they are
#: listed; :func:`baseline_pins` gives each one's mesh and pins
INTRA_BASELINES = ("baseline: data parallel", "baseline: ZeRO-2", "baseline: ZeRO-3",
                   "baseline: Megatron TP")

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
    return memo(graph, (pinned_by, key), lambda: _resolve(graph, pins))


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
            raise SearchError(f"pin: {pattern!r} should match an input name, but matches no graph "
                              f"input. Input names look like {names}. Fix: use a regular "
                              "expression that re.search finds in one of them.")
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


def pin_specs(graph: OpGraph, mesh: LogicalMesh, pins: Mapping[Any, Any] | None
              ) -> dict[int, Spec]:
    """``{input tensor id: spec}`` of ``pins`` on ``mesh`` (see :func:`resolve_pins`), each
    checked against its input's shape and the mesh; once per graph, mesh shape and pins (a
    folded search builds dozens of segment problems with the same pins).

    Raises:
        SearchError: a pin :func:`resolve_pins` refuses, or a spec that does not fit its input
            on the mesh (naming the pin, the input and its shape).
    """
    if not pins:
        return {}
    key = pins_key(pins)
    if key is None:
        return _specs_on(graph, mesh, pins)
    return memo(graph, (pin_specs, mesh.shape, mesh.axis_names, key),
                lambda: _specs_on(graph, mesh, pins))


def _specs_on(graph: OpGraph, mesh: LogicalMesh, pins: Mapping[Any, Any]) -> dict[int, Spec]:
    out: dict[int, Spec] = {}
    tensors, input_of = graph.tensors, graph.input_of_tensor
    done: dict[tuple, Spec] = {}  # (pspec, shape) -> spec: many inputs share both
    for t, (pattern, pspec) in pinned_by(graph, pins).items():
        shape = tensors[t].shape
        if pspec is None:
            out[t] = replicated(len(shape))
            continue
        try:
            k = (pspec, shape)
            hash(k)
        except TypeError:
            k = None
        spec = done.get(k) if k is not None else None
        if spec is None:
            try:
                spec = checked_spec(pspec, shape, mesh)
            except SearchError as err:
                raise SearchError(f"pin {pattern!r} -> {pspec} for input {input_of[t].name} "
                                  f"{shape}: {err}") from None
            if k is not None:
                done[k] = spec
        out[t] = spec
    return out


def unheld_pins(plan: Any, graph: OpGraph, pins: Mapping[Any, Any] | None) -> list[str]:
    """What of ``pins`` (given to the search of ``graph``) ``plan`` does not hold: for each input
    the pins fix, its spec on the mesh of the stage that holds it must be the pinned one (mesh
    axes of size 1 aside: they split nothing), and the stage's ZeRO level must not shard it
    further (:data:`~autoplan.plans._spec.ZERO_SHARDED` and
    :func:`~autoplan.plans._spec.zero_spec`, the rule the stage executor applies). One message per input that breaks its pin; empty when every pin holds."""
    if not pins:
        return []
    by = pinned_by(graph, pins)
    names = {graph.input_of_tensor[t].name: (key, pspec, len(graph.tensors[t].shape))
             for t, (key, pspec) in by.items()}
    out = []
    for i in plan.inputs:
        got = names.get(i.name)
        if got is None:
            continue
        key, pspec, ndim = got
        stage = plan.stages[i.stage]
        sizes = dict(zip(stage.axis_names, stage.mesh_shape))
        want = replicated(ndim) if pspec is None else Spec.from_pspec(tuple(pspec), ndim)
        if _splits(i.spec, sizes) != _splits(want, sizes):
            out.append(f"{i.name} is {i.spec} on stage {i.stage}'s mesh "
                       f"{dict(sizes)}, pinned {pspec} by {key!r}")
            continue
        # (ZeRO's rule as the stage executor applies it)
        if i.kind in ZERO_SHARDED[stage.zero] and \
                zero_spec(i.spec, i.shape, stage.zero_axes, sizes) != i.spec:
            out.append(f"{i.name} is sharded further by stage {i.stage}'s ZeRO-{stage.zero} over "
                       f"{stage.zero_axes}, pinned {pspec} by {key!r}")
    return out


def _splits(spec: Any, sizes: Mapping[str, int]) -> tuple:
    """Per dimension, the mesh axes of more than one device that split it (None: none)."""
    return tuple(tuple(a for a in (e or ()) if sizes.get(a, 1) > 1) or None for e in spec)


def pins_by_name(graph: OpGraph, pins: Mapping[Any, Any] | None) -> dict[Any, Any] | None:
    """``pins`` with tensor-id keys turned into their inputs' names (anchored, escaped), for a
    graph traced again from the same step: the pipeline search traces it at micro-batch size,
    where tensor ids differ. None when there are no pins."""
    if not pins:
        return None
    input_of = graph.input_of_tensor
    return {(f"^{re.escape(input_of[k].name)}$" if isinstance(k, int) and not isinstance(k, bool)
             else k): v for k, v in pins.items()}


def baseline_pins(graph: OpGraph, cluster: Cluster, label: str
                  ) -> tuple[tuple[int, int], dict[int, Any]] | None:
    """The logical mesh shape and pins of the intra-operator baseline ``label`` (one of
    :data:`INTRA_BASELINES`), or None where it does not apply (ZeRO or Megatron TP on one
    device, Megatron TP on a model without Megatron layers).

    Raises:
        SearchError: ``label`` is not one of :data:`INTRA_BASELINES`.
    """
    n, per = cluster.num_devices, cluster.devices_per_node
    if label == "baseline: data parallel":
        return (n, 1), data_parallel_pins(graph)
    if label in ("baseline: ZeRO-2", "baseline: ZeRO-3"):
        if n <= 1:
            return None
        return (n, 1), zero_pins(graph, n, int(label[-1]))
    if label != "baseline: Megatron TP":
        raise SearchError(f"baseline_pins: label should be one of {INTRA_BASELINES}. Got "
                          f"{label!r}. Fix: pass one of them.")
    tp = min(per, n)
    pins = megatron_pins(graph, tp)
    if pins is None or n <= 1:
        return None
    return (n // tp, tp), pins


def renamed_pin(where: str, pins: Mapping[Any, Any] | None, pin: Mapping[Any, Any] | None
                ) -> Mapping[Any, Any] | None:
    """``pins``, or the deprecated ``pin=`` given instead, with a :class:`DeprecationWarning`
    pointed at the first caller outside autoplan.

    Raises:
        SearchError: both given.
    """
    if pin is None:
        return pins
    if pins is not None:
        raise SearchError(f"{where}: pin= is the old name of pins=. Got both. Fix: pass pins= "
                          "alone.")
    frame, level = sys._getframe(1), 2  # (this function's caller is stacklevel 2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"{where}: pin= is deprecated and will be removed in the next release; use "
                  "pins= (the same mapping).", DeprecationWarning, stacklevel=level)
    return pin


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
    pins = _megatron_pins(graph, tp)
    return None if pins is None else dict(pins)


@per_owner_and_args
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
