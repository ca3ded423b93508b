"""A step's graph at another micro-batch count, from two of its traces.

The pipeline search traces the step whole and at the default count's micro-batch size, then
costs one more count exactly (:mod:`autoplan.search.pipeline._pipeline`). Its graph at that count
is the same operators on tensors whose batch dimensions are another size, so
:func:`rescaled_graph` derives it from the two traces instead of tracing a third time: every
number of the graph (each tensor dimension, each integer in an operator's params) is either the
same in both traces (it does not depend on the batch) or exactly in the ratio of their batch
sizes (a multiple of the batch: ``n * batch``, never ``n * batch + c`` with ``c != 0``); at the
new size a multiple of the batch takes its new value, which must be a whole number. Anything else
(a float, a string or a structure that differs, an opaque control-flow operator's FLOPs that are
neither the same nor in ratio, a dimension that would not be whole) means the step writes the
batch size into itself some other way, and nothing is derived: the caller traces. The FLOPs and
bytes of every other operator are counted again from the new shapes by the trace's own rules, so
the derived graph equals the trace field by field (tested on the zoo and on users' steps).

What two traces cannot see is a dimension that depends on the batch in steps (padded to a
multiple, capped) and happens to look proportional at both sizes; the micro-batch trace's own
rule already asks steps not to write the batch size into themselves.
"""

from __future__ import annotations

import math
from typing import Any

from autoplan._gc import gc_paused
from autoplan.tracing._graph import OpGraph, OpNode, Tensor
from autoplan.tracing._trace import is_opaque, shape_flops

__all__ = ["rescaled_graph"]


class _Differs(Exception):
    """A number of the graph depends on the batch in a way two traces cannot extrapolate."""


class _Scale:
    """Values at ``count`` micro-batches from their values whole and at ``base`` micro-batches."""

    def __init__(self, base: int, count: int):
        self.base, self.count = base, count

    def int(self, whole: int, part: int) -> int:
        if whole == part:
            return whole
        # (a dimension of 1 is broadcast, and its reductions written, apart from any other
        # size: JAX traces the step differently where a batch dimension is 1)
        if whole != part * self.base or whole % self.count or part == 1 or whole == self.count:
            raise _Differs
        return whole // self.count

    def float(self, whole: float, part: float) -> float:
        if whole == part:
            return whole
        if whole != part * self.base or (whole / self.count) % 1:
            raise _Differs
        return whole / self.count

    def shape(self, whole: tuple[int, ...], part: tuple[int, ...]) -> tuple[int, ...]:
        if whole == part:
            return whole
        if len(whole) != len(part):
            raise _Differs
        return tuple(self.int(a, b) for a, b in zip(whole, part))

    def value(self, whole: Any, part: Any) -> Any:
        """A param's value: integers scaled, containers by element, the rest equal."""
        if whole == part and type(whole) is type(part):
            return whole
        if type(whole) is not type(part):
            raise _Differs
        if isinstance(whole, int) and not isinstance(whole, bool):
            return self.int(whole, part)
        if isinstance(whole, tuple) and len(whole) == len(part):
            return tuple(self.value(a, b) for a, b in zip(whole, part))
        if isinstance(whole, dict) and whole.keys() == part.keys():
            return {k: self.value(whole[k], part[k]) for k in whole}
        if isinstance(whole, float) and math.isnan(whole) and math.isnan(part):
            return whole  # (a gather's fill value)
        raise _Differs


@gc_paused
def rescaled_graph(whole: OpGraph, part: OpGraph, base: int, count: int) -> OpGraph | None:
    """The step's graph at ``count`` micro-batches, from its trace ``whole`` (the full batch) and
    ``part`` (at ``base`` micro-batches, ``base > 1``); None when the two traces do not determine
    it (see the module docstring: the caller then traces).

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> S = jax.ShapeDtypeStruct
        >>> step = lambda w, x: jnp.tanh(x @ w).mean()
        >>> w = S((4, 8), jnp.float32)
        >>> g1, g4 = (autoplan.trace(step, w, S((n, 4), jnp.float32)) for n in (16, 4))
        >>> g2 = rescaled_graph(g1, g4, 4, 2)
        >>> [op.out_shapes for op in g2.ops[:2]], g2.ops[0].flops
        ([((8, 8),), ((8, 8),)], 512.0)
        >>> g2.ops == autoplan.trace(step, w, S((8, 4), jnp.float32)).ops
        True
    """
    if base <= 1 or count < 1 or count == base:
        return None
    if not (len(whole.ops) == len(part.ops) and len(whole.tensors) == len(part.tensors)
            and whole.inputs == part.inputs and whole.outputs == part.outputs
            and whole.consts == part.consts and whole.warnings == part.warnings
            and whole.name == part.name and whole.origin is None and part.origin is None):
        return None
    sc = _Scale(base, count)
    try:
        tensors = [_tensor(sc, a, b) for a, b in zip(whole.tensors, part.tensors)]
        ops = [_op(sc, a, b, tensors) for a, b in zip(whole.ops, part.ops)]
    except _Differs:
        return None
    return OpGraph(ops=ops, tensors=tensors, inputs=list(part.inputs), outputs=list(part.outputs),
                   name=part.name, consts=list(part.consts), warnings=list(part.warnings),
                   arg_trees=part.arg_trees)


def _tensor(sc: _Scale, a: Tensor, b: Tensor) -> Tensor:
    if a.id != b.id or a.dtype != b.dtype or a.producer != b.producer:
        raise _Differs
    return a if a.shape == b.shape else Tensor(a.id, sc.shape(a.shape, b.shape), a.dtype,
                                               a.producer)


def _op(sc: _Scale, a: OpNode, b: OpNode, tensors: list[Tensor]) -> OpNode:
    if (a.primitive != b.primitive or a.inputs != b.inputs or a.outputs != b.outputs
            or a.scope != b.scope or a.role != b.role or a.in_dtypes != b.in_dtypes
            or a.out_dtypes != b.out_dtypes):
        raise _Differs
    same = a.params == b.params
    if same and a.in_shapes == b.in_shapes and a.out_shapes == b.out_shapes and (
            a.flops == b.flops or not is_opaque(a.primitive)):
        return a  # (nothing of it depends on the batch: the operator itself, as traced)
    params = dict(a.params) if same else sc.value(a.params, b.params)
    in_shapes = tuple(None if t is None else tensors[t].shape for t in a.inputs)
    out_shapes = tuple(tensors[t].shape for t in a.outputs)
    if is_opaque(a.primitive):  # (its FLOPs are its bodies': the same or in ratio, like any number)
        flops = sc.float(a.flops, b.flops)
    else:
        flops = shape_flops(a.primitive, params, in_shapes, out_shapes)
    return OpNode(
        id=a.id, primitive=a.primitive, params=params, inputs=a.inputs, outputs=a.outputs,
        flops=flops, scope=a.scope, role=a.role, in_shapes=in_shapes, out_shapes=out_shapes,
        bytes_in=sum(tensors[t].nbytes for t in a.inputs if t is not None),
        bytes_out=sum(tensors[t].nbytes for t in a.outputs),
        in_dtypes=a.in_dtypes, out_dtypes=a.out_dtypes)
