"""What a traced step does with its batch: losses that mix examples, and random draws.

Micro-batching (gradient accumulation, pipelines) runs a step's forward and backward once per
micro-batch and averages what they hand to the update. That is the full-batch step only when
every example's contribution is computed from that example alone and the loss sums or averages
them. Two analyses of an :class:`~autoplan.OpGraph` say when it is not:

* :func:`mixing` follows the batch axis through the step's forward operators, a dataflow
  analysis over the graph: each tensor carries the set of its dimensions that index the batch's
  examples (the leading dimension of every ``batch`` input, carried by one rule per primitive
  through broadcasts, reshapes, transposes, contractions and gathers). A step mixes examples when
  a forward operator

  - combines a value reduced over the batch (a ``reduce_*`` or a contraction over a batch
    dimension: a batch mean, a Gram matrix ``x.T @ x``) with values that still carry the batch:
    batch normalisation, centering ``x - x.mean(0)``, a softmax over the batch;
  - puts two examples side by side: a result whose batch dimensions come from two operands at
    different positions (``a @ b.T`` of two batch-derived operands, ``x[:, None] - x[None, :]``),
    as in-batch negatives;
  - scans, sorts or ranks along the batch dimension (``cumsum``, ``sort``, ``top_k``): a prefix
    over examples, such as tokens of several examples competing for an expert's capacity;
  - on the way to the loss, applies a non-linear function (``log``, ``exp``, ``sqrt``, a power)
    to a value reduced over the batch: ``log(mean(exp(l)))``, ``sqrt(mean(l ** 2))``.

  The loss's final reduction (a mean, a sum, a weighted mean ``sum(w l) / sum(w)``) reduces the
  batch into values that carry no batch, so it is never flagged; nor is anything the backward
  pass does (gradients reduce the batch into parameters), what autodiff adds to the forward
  pass for it (the mask of where a maximum over the batch is), or the optimizer. Normalising over
  features (layer norm) reduces dimensions that are not the batch, and is not flagged either.
* :func:`random_draws` lists the primitives with which a step draws random numbers: a
  micro-batched plan draws them once per micro-batch, so its draws differ from one full-batch
  step's.

Operators kept opaque (``while``, ``cond``, a long ``scan``) are not looked into: the batch axis
is not followed through them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autoplan._memo import per_owner
from autoplan.tracing._primitives import (
    BATCH_OPAQUE,
    BATCH_REDUCTIONS,
    NONLINEAR,
    SCANS_ALONG,
    SLICES,
)

__all__ = ["Mixing", "mixing", "mixing_of", "batch_axes", "random_draws", "MIXING_NOTE", "RANDOM_NOTE"]

#: the note a search result and its plans carry for a loss that mixes examples
MIXING_NOTE = "this loss mixes examples across the batch; micro-batching would change it"
#: the note a micro-batched plan of a step drawing random numbers carries
RANDOM_NOTE = "draws random numbers per micro-batch"

# the primitives of the rules below are the registry's views (tracing/_primitives.py); a
# function that is not linear (NONLINEAR) applied to a batch sum or mean on the way to the loss
# (``log(mean(exp(l)))``, ``sqrt(mean(l ** 2))``) makes the loss no longer a sum or mean of
# per-example terms

#: a tensor's batch dimensions: ``(dimension, positions per example along it)`` pairs (a
#: dimension that merged the batch with an inner one, ``(B T, F)``, has T positions per example)
Dims = frozenset[tuple[int, int]]
_NONE: Dims = frozenset()


def _axes(d: Dims) -> set[int]:
    return {a for a, _ in d}


def _moved(d: Dims, where: Callable[[int], int | None]) -> Dims:
    """``d`` with each dimension moved to ``where(dimension)`` (dropped where None)."""
    return frozenset((w, f) for a, f in d if (w := where(a)) is not None)


@dataclass(frozen=True)
class Mixing:
    """Where a step's forward pass mixes examples of its batch.

    Attributes:
        op: the operator's id.
        primitive: its primitive.
        scope: its named-scope path (``"head/loss"``), empty when it has none.
        reason: what it does, in words.
    """

    op: int
    primitive: str
    scope: str
    reason: str

    def __str__(self) -> str:
        where = f" in scope {self.scope!r}" if self.scope else ""
        return f"operator {self.op} ({self.primitive}{where}) {self.reason}"


@dataclass
class _Flow:
    """The analysis's state: batch dimensions per tensor, values reduced over the batch."""

    dims: dict[int, Dims]
    reduced: dict[int, int]  # tensor -> the operator that reduced the batch it derives from
    batch: int


# ---- one rule per primitive: (op, operand dims, flow) -> (result dims, reduced over batch,
# ---- the reason it mixes examples or None)
Rule = Callable[[Any, list[Dims], _Flow], tuple[list[Dims], bool, str | None]]
RULES: dict[str, Rule] = {}


def _rule(*names: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return register


def _elementwise(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    """Operands of the result's rank line up dimension by dimension (lax broadcasts
    explicitly); two operands carrying the batch at different dimensions pair examples."""
    rank = len(op.out_shapes[0]) if op.out_shapes else 0
    carried = [d for d, s in zip(ins, op.in_shapes) if d and s is not None and len(s) == rank]
    out = frozenset().union(*carried) if carried else _NONE
    why = None
    if len(set(carried)) > 1:
        why = ("combines operands whose batch dimensions differ "
               f"({' and '.join(sorted({str(sorted(_axes(d))) for d in carried}))}): it pairs "
               "examples")
    return [out] * len(op.outputs), False, why


@_rule("broadcast_in_dim")
def _broadcast(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    bd = op.params.get("broadcast_dimensions", ())
    return [_moved(ins[0], lambda a: bd[a] if a < len(bd) else None)], False, None


@_rule("transpose")
def _transpose(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    perm = list(op.params.get("permutation", ()))
    return [_moved(ins[0], lambda a: perm.index(a) if a in perm else None)], False, None


@_rule("squeeze")
def _squeeze(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    gone = set(op.params.get("dimensions", ()))
    kept = [d for d in range(len(op.in_shapes[0])) if d not in gone]
    return [_moved(ins[0], lambda a: kept.index(a) if a in kept else None)], False, None


def _strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[k + 1:]) for k in range(len(shape))]


@_rule("reshape")
def _reshape(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    """A result dimension carries the batch when its range of flat positions overlaps the flat
    range the batch's examples step through: ``(B, T, H) -> (B T, H)`` carries it in the first
    dimension (T positions per example), ``(B T, H) -> (B, T, H)`` in the first only, and
    ``(B S, H) -> (B S / g, g, H)`` in the second too when a group ``g`` spans several
    examples."""
    src, dst = op.in_shapes[0], op.out_shapes[0]
    if not ins[0] or src is None:
        return [_NONE], False, None
    s_src, s_dst = _strides(src), _strides(dst)
    out = set()
    for d, per in ins[0]:
        lo, hi = s_src[d] * per, s_src[d] * src[d]  # one example's flat stride; the batch's
        for j in range(len(dst)):
            if dst[j] > 1 and s_dst[j] * dst[j] > lo and s_dst[j] < hi:
                out.add((j, max(1, lo // s_dst[j])))
    return [frozenset(out)], False, None


@_rule(*BATCH_REDUCTIONS)
def _reduce(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    axes = set(op.params.get("axes", ()))
    kept = [d for d in range(len(op.in_shapes[0] or ())) if d not in axes]
    out = _moved(ins[0], lambda a: kept.index(a) if a in kept else None)
    hit = axes & _axes(ins[0])
    why = None
    if hit and out:
        why = (f"reduces over part of the batch ({op.primitive} over dimension(s) "
               f"{sorted(hit)}, the result still indexed by examples): groups of examples")
    return [out] * len(op.outputs), bool(hit), why


@_rule(*SCANS_ALONG)
def _along(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    axis = op.params.get(SCANS_ALONG[op.primitive], 0)
    rank = len(op.in_shapes[0] or ())
    axis = axis + rank if isinstance(axis, int) and axis < 0 else axis
    outs, _, why = _elementwise(op, ins, flow)
    if why is None and any(axis in _axes(d) for d in ins):
        why = f"runs along the batch dimension ({op.primitive} over dimension {axis})"
    return outs, False, why


@_rule("top_k", "approx_top_k")
def _top_k(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    rank = len(op.in_shapes[0] or ())
    why = (f"ranks along the batch dimension ({op.primitive} over dimension {rank - 1})"
           if rank - 1 in _axes(ins[0]) else None)
    return [ins[0]] * len(op.outputs), False, why


@_rule("dot_general")
def _dot(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    ls, rs = op.in_shapes
    lf = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rs)) if d not in rc and d not in rb]
    nb, lb, rb = len(lb), list(lb), list(rb)
    from_l = _moved(ins[0], lambda a: lb.index(a) if a in lb else
                    nb + lf.index(a) if a in lf else None)
    from_r = _moved(ins[1], lambda a: rb.index(a) if a in rb else
                    nb + len(lf) + rf.index(a) if a in rf else None)
    reduced = bool(set(lc) & _axes(ins[0])) or bool(set(rc) & _axes(ins[1]))
    why = None
    if from_l and from_r and from_l != from_r:
        why = ("multiplies two batch-derived operands into a result indexed by pairs of "
               "examples (in-batch negatives, a similarity matrix over the batch)")
    elif reduced and (from_l or from_r):
        why = "contracts over the batch into values still indexed by examples"
    return [from_l | from_r], reduced, why


@_rule("conv_general_dilated")
def _conv(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    dn = op.params.get("dimension_numbers") or {}
    lhs, out = dn.get("lhs_spec"), dn.get("out_spec")
    if lhs is None or out is None:
        return [_NONE], bool(ins[0] or ins[1]), None
    res = _moved(ins[0], lambda a: out[0] if a == lhs[0] else None)
    reduced = any(a != lhs[0] for a in _axes(ins[0])) or bool(ins[1])
    return [res], reduced, None


@_rule(*SLICES)
def _slice(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    """Slicing keeps a batch dimension it leaves whole; one it cuts picks some examples, which
    then stand for the batch (a reduction, for this analysis)."""
    src, dst = op.in_shapes[0], op.out_shapes[0]
    keep = frozenset((a, f) for a, f in ins[0] if src[a] == dst[a])
    return [keep], keep != ins[0], None


@_rule("gather")
def _gather(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    dn = op.params.get("dimension_numbers") or {}
    offset = list(dn.get("offset_dims", ()))
    collapsed = set(dn.get("collapsed_slice_dims", ())) | set(dn.get("operand_batching_dims", ()))
    idx_rank = len(op.in_shapes[1] or ())
    rank = len(op.out_shapes[0])
    batch_pos = [j for j in range(rank) if j not in offset]
    window = [d for d in range(len(op.in_shapes[0] or ())) if d not in collapsed]
    out = _moved(ins[1], lambda a: batch_pos[a] if a < idx_rank - 1 and a < len(batch_pos)
                 else None)
    out |= _moved(ins[0], lambda a: offset[window.index(a)] if a in window
                  and window.index(a) < len(offset) else None)
    indexed = any(a not in window for a in _axes(ins[0]))
    return [out], indexed and not out, None


@_rule("concatenate", "pad", "clamp", "dynamic_update_slice", "rev", "convert_element_type",
       "copy", "copy_p", "reduce_precision")
def _same_rank(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    rank = len(op.out_shapes[0]) if op.out_shapes else 0
    carried = [d for d, s in zip(ins, op.in_shapes) if d and s is not None and len(s) == rank]
    return [frozenset().union(*carried) if carried else _NONE] * len(op.outputs), False, None


@_rule("iota", "random_bits", "random_seed", "random_wrap", "random_unwrap", "random_split",
       "random_fold_in", "threefry2x32")
def _fresh(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    return [_NONE] * len(op.outputs), False, None


@_rule(*BATCH_OPAQUE)
def _opaque(op: Any, ins: list[Dims], flow: _Flow) -> tuple[list[Dims], bool, str | None]:
    return [_NONE] * len(op.outputs), False, None


def _batch_size(graph: Any) -> int | None:
    lead = [graph.tensors[gi.tensor].shape[0] for gi in graph.inputs
            if gi.kind == "batch" and graph.tensors[gi.tensor].shape]
    if not lead:
        return None
    return max(set(lead), key=lead.count)


def batch_axes(graph: Any) -> dict[int, frozenset[int]]:
    """The dimensions that index the batch's examples, per tensor of the forward pass (tensors
    without any are left out): the leading dimension of each ``batch`` input of the batch size,
    carried forward through the forward operators."""
    return {t: frozenset(_axes(d)) for t, d in _analyse(graph)[0].dims.items()}


def _primal_ops(graph: Any) -> set[int]:
    """The forward operators that compute the step's values: those from which a result of the
    step is reached through forward operators (the loss, its aux). What autodiff adds to the
    forward pass only for the backward pass (``reduce_max``'s mask of where the maximum is,
    residuals) is left out. A step whose results all come from the backward pass or the update
    (``jax.grad`` alone) has every forward operator counted."""
    ops, tensors = graph.ops, graph.tensors
    seen: set[int] = set()
    stack = [o.tensor for o in graph.outputs]
    while stack:
        p = tensors[stack.pop()].producer
        if p < 0 or p in seen or ops[p].role != "forward":
            continue
        seen.add(p)
        stack.extend(t for t in ops[p].inputs if t is not None)
    return seen or {op.id for op in ops if op.role == "forward"}


def _analyse(graph: Any) -> tuple[_Flow, Mixing | None]:
    batch = _batch_size(graph)
    flow = _Flow({}, {}, batch or 0)
    if batch is None:
        return flow, None
    for gi in graph.inputs:
        shape = graph.tensors[gi.tensor].shape
        if gi.kind == "batch" and shape and shape[0] == batch:
            flow.dims[gi.tensor] = frozenset({(0, 1)})
    found: Mixing | None = None
    primal = _primal_ops(graph)
    for op in graph.ops:
        if op.id not in primal:
            continue
        ins = [flow.dims.get(t, _NONE) if t is not None else _NONE for t in op.inputs]
        reduced_in = any(t is not None and t in flow.reduced for t in op.inputs)
        if not any(ins) and not reduced_in:
            continue
        rule = RULES.get(op.primitive, _elementwise)
        outs, reduces, why = rule(op, ins, flow)
        carries = any(outs)
        if why is None and reduced_in and carries:
            src = graph.ops[next(flow.reduced[t] for t in op.inputs
                                 if t is not None and t in flow.reduced)]
            where = f" in scope {'/'.join(src.scope)!r}" if src.scope else ""
            why = (f"combines a value reduced over the batch (by operator {src.id}, "
                   f"{src.primitive}{where}: a batch mean or statistic) with per-example values")
        if why is not None and found is None:
            found = Mixing(op.id, op.primitive, "/".join(op.scope), why)
        for t, d in zip(op.outputs, outs):
            if d:
                flow.dims[t] = d
            if reduces:
                flow.reduced[t] = op.id
            elif reduced_in:
                flow.reduced[t] = next(flow.reduced[u] for u in op.inputs
                                       if u is not None and u in flow.reduced)
    if found is None:
        found = _nonlinear_after_reduction(graph, flow, primal)
    return flow, found


def _nonlinear_after_reduction(graph: Any, flow: _Flow, primal: set[int]) -> Mixing | None:
    """The first operator on the way to the loss (the step's first result) that applies a
    non-linear function to a value reduced over the batch."""
    if not graph.outputs:
        return None
    ops, tensors = graph.ops, graph.tensors
    to_loss: set[int] = set()
    stack = [graph.outputs[0].tensor]
    while stack:
        p = tensors[stack.pop()].producer
        if p < 0 or p in to_loss or p not in primal:
            continue
        to_loss.add(p)
        stack.extend(t for t in ops[p].inputs if t is not None)
    for i in sorted(to_loss):
        op = ops[i]
        src = next((flow.reduced[t] for t in op.inputs if t is not None and t in flow.reduced),
                   None)
        if op.primitive in NONLINEAR and src is not None:
            return Mixing(op.id, op.primitive, "/".join(op.scope),
                          f"applies {op.primitive} to a value reduced over the batch (by operator "
                          f"{src}, {ops[src].primitive}) on the way to the loss: the loss is not a "
                          "sum or mean of per-example terms")
    return None


def mixing(graph: Any) -> Mixing | None:
    """Where the step's forward pass first mixes examples of its batch (see the module
    docstring), or None when its loss is a sum or mean of per-example terms.

    Args:
        graph: the step's :class:`~autoplan.OpGraph` (its ``batch`` inputs say where the batch
            is).

    Returns:
        The first operator that mixes examples, or None.

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> def step(w, x):
        ...     h = x @ w
        ...     return jnp.mean((h - h.mean(0)) ** 2)
        >>> g = autoplan.trace(step, jnp.ones((4, 2)), jnp.ones((8, 4)))
        >>> mixing(g).primitive
        'sub'
        >>> mixing(autoplan.trace(lambda w, x: jnp.mean((x @ w) ** 2), jnp.ones((4, 2)),
        ...                       jnp.ones((8, 4)), arg_kinds=("parameter", "batch"))) is None
        True
    """
    return _analyse(graph)[1]


def random_draws(graph: Any) -> tuple[str, ...]:
    """The primitives with which the step draws random numbers, sorted (empty when it draws
    none): those of :attr:`autoplan.OpGraph.random_draws`."""
    return tuple(sorted({graph.ops[i].primitive for i in graph.random_draws}))


@per_owner
def mixing_of(graph: Any) -> Mixing | None:
    """:func:`mixing` of ``graph``, computed once per graph (the search reads it for its notes
    and for each micro-batched plan)."""
    return mixing(graph)
