"""One walk of a training step's jaxpr, numbering its operators and tensors.

:func:`autoplan.trace` builds its :class:`~autoplan.OpGraph` from this walk and the executor
(:func:`autoplan.exec.flatten`) evaluates the very same walk with a plan's shardings, so operator
``i`` and tensor ``t`` mean the same thing to both by construction.

The walk flattens the jaxpr:

* containers are inlined: ``jit``/``pjit``, ``closed_call``, ``remat``/``checkpoint``,
  ``custom_jvp_call``, ``custom_vjp_call`` (:data:`INLINE`), their bodies' constants becoming new
  constant tensors;
* ``scan`` is unrolled when its length is at most ``max_scan_unroll``: for each iteration ``i``
  (in the scan's own order, reversed for ``reverse=True``) one synthetic ``scan_slice`` operator
  per scanned (non-literal) input takes slice ``i``, then the body follows; after the last
  iteration one synthetic ``scan_stack`` operator per scanned output stacks the iterations'
  results in index order;
* every other equation (``while``, ``cond``, a longer ``scan``, any primitive) is one operator.

Tensor ids are handed out in one order: the jaxpr's inputs, its constants, then each operator's
results as it is emitted (a container's or a scan body's constants when it is entered). Each
operator carries its named-scope path and JAX transforms (``jvp``, ``transpose``, ...) read off
the equations' name stacks, an unrolled iteration adding the scope ``scan_<i>``, ``i`` the index
into the scanned inputs.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda w, x: jax.jit(jnp.tanh)(x @ w).sum())(
    ...     jnp.ones((4, 8)), jnp.ones((2, 4)))
    >>> w = walk_jaxpr(closed)
    >>> [(op.id, op.primitive, op.inputs, op.outputs) for op in w.ops]
    [(0, 'dot_general', (1, 0), (2,)), (1, 'tanh', (2,), (3,)), (2, 'reduce_sum', (3,), (4,))]
    >>> w.input_ids, w.outputs
    ([0, 1], [4])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.extend import core as jcore

from autoplan.tracing._primitives import INLINE_CALLS

__all__ = ["INLINE", "Lit", "Ref", "WalkTensor", "WalkOp", "Walk", "step_jaxpr", "walk_jaxpr"]

#: container primitives whose body is inlined into the walk (the primitive registry's view)
INLINE = INLINE_CALLS
#: named scopes JAX adds on its own, left out of an operator's scope path
_INTERNAL_SCOPES = frozenset({"rematted_computation"})


@dataclass(frozen=True)
class Lit:
    """A literal operand: its value (the trace records ``None`` for it)."""

    value: Any


Ref = int | Lit


class WalkTensor(NamedTuple):
    """A tensor the walk numbered: its shape, dtype (None for a token) and producing operator
    (-1 for the jaxpr's inputs and constants)."""

    shape: tuple[int, ...]
    dtype: Any
    producer: int


@dataclass(frozen=True, eq=False)
class WalkOp:
    """One operator of the walk.

    Attributes:
        id: the operator's index in :attr:`Walk.ops`.
        primitive: the primitive's name (``scan_slice``/``scan_stack`` for the synthetic ones).
        inputs: tensor ids of the operands, :class:`Lit` for literals.
        outputs: tensor ids of the results.
        eqn: the jaxpr equation (None for a synthetic operator).
        params: a synthetic operator's parameters (``{"axis": 0, "index": i}`` for
            ``scan_slice``, ``{"axis": 0, "length": n}`` for ``scan_stack``); empty otherwise.
        scope: the named-scope path.
        transforms: the JAX transforms the operator is under (``jvp``, ``transpose``, ...).
        name_stack: the full ``jax`` name stack (for HLO metadata when the equation is bound
            again).
    """

    id: int
    primitive: str
    inputs: tuple[Ref, ...]
    outputs: tuple[int, ...]
    eqn: Any
    params: dict[str, Any]
    scope: tuple[str, ...]
    transforms: tuple[str, ...]
    name_stack: Any


@dataclass(eq=False)
class Walk:
    """A jaxpr flattened by :func:`walk_jaxpr`.

    Attributes:
        ops: the operators in program order (``ops[i].id == i``).
        tensors: every numbered tensor (``tensors[t]`` is tensor ``t``).
        input_ids: tensor ids of the jaxpr's inputs.
        top_consts: tensor ids of the jaxpr's own constants.
        consts: tensor id -> value of every constant (the jaxpr's and inlined bodies').
        outputs: references of the jaxpr's results.
    """

    ops: list[WalkOp] = field(default_factory=list)
    tensors: list[WalkTensor] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    top_consts: list[int] = field(default_factory=list)
    consts: dict[int, Any] = field(default_factory=dict)
    outputs: list[Ref] = field(default_factory=list)


def step_jaxpr(fn: Callable[..., Any], args: Any, kwargs: Any,
               error: Callable[[str], Exception], fix: str) -> tuple[Any, Any]:
    """``jax.make_jaxpr`` of ``fn(*args, **kwargs)`` with its output shapes: ``(closed, shapes)``.

    Raises:
        ``error(message)``: JAX cannot trace ``fn`` (it raises many types; all mean that), the
        message naming ``fn``, JAX's error and ``fix``.
    """
    def wrapped(a, kw):
        return fn(*a, **kw)

    try:
        return jax.make_jaxpr(wrapped, return_shape=True)(args, kwargs)
    except Exception as err:
        if type(err).__name__ == "TraceContextError":  # Flax state changed under a transform
            fix = ("draw keys from an nnx.Rngs before entering jax.grad/jax.value_and_grad (key = "
                   "rngs.dropout() at the top of the step), or use nnx.value_and_grad, which "
                   "carries Flax's state through the transform.")
        raise error(f"JAX could not trace {getattr(fn, '__name__', fn)!r}: {type(err).__name__}: "
                    f"{err}. Fix: {fix}") from err


def walk_jaxpr(closed: Any, max_scan_unroll: int = 512) -> Walk:
    """Flatten a ``ClosedJaxpr`` (of ``jax.make_jaxpr``) into numbered operators and tensors.

    Args:
        closed: the jaxpr.
        max_scan_unroll: scans up to this length are unrolled; longer ones are one operator.

    Returns:
        The walk.
    """
    w = _Walker(max_scan_unroll)
    w.out.input_ids = [w.tensor(*_aval(v)) for v in closed.jaxpr.invars]
    top, consts = _closed_to_open(closed)
    w.out.top_consts = [w.const(c) for c in consts]
    w.out.outputs = w.walk(top, w.out.top_consts + w.out.input_ids, (), (), None)
    return w.out


def _aval(v: Any) -> tuple[tuple[int, ...], Any]:
    aval = v.aval
    return tuple(map(int, getattr(aval, "shape", ()))), getattr(aval, "dtype", None)


class _Walker:
    def __init__(self, max_scan_unroll: int):
        self.out = Walk()
        self.max_scan_unroll = max_scan_unroll

    def tensor(self, shape: tuple[int, ...], dtype: Any, producer: int = -1) -> int:
        self.out.tensors.append(WalkTensor(shape, dtype, producer))
        return len(self.out.tensors) - 1

    def const(self, value: Any) -> int:
        arr = value if hasattr(value, "aval") else np.asarray(value)
        t = self.tensor(tuple(int(d) for d in np.shape(arr)), getattr(arr, "dtype", np.float32))
        self.out.consts[t] = value
        return t

    def op(self, primitive: str, inputs: list[Ref], out_avals: list[tuple[tuple[int, ...], Any]],
           eqn: Any, scope: tuple[str, ...], transforms: tuple[str, ...], name_stack: Any,
           params: dict[str, Any] | None = None) -> list[int]:
        oid = len(self.out.ops)
        outs = tuple(self.tensor(s, d, oid) for s, d in out_avals)
        self.out.ops.append(WalkOp(oid, primitive, tuple(inputs), outs, eqn, params or {}, scope,
                                   transforms, name_stack))
        return list(outs)

    def walk(self, jaxpr: Any, in_refs: list[Ref], scope: tuple[str, ...],
             transforms: tuple[str, ...], name_stack: Any) -> list[Ref]:
        env: dict[Any, Ref] = dict(zip(jaxpr.invars, in_refs))

        def read(v: Any) -> Ref:
            return Lit(v.val) if isinstance(v, jcore.Literal) else env[v]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            own = eqn.source_info.name_stack
            ns = own if name_stack is None else name_stack + own
            e_scope, e_tf = list(scope), list(transforms)
            for el in own.stack:
                if type(el).__name__ == "Transform":
                    e_tf.append(el.name)
                elif el.name not in _INTERNAL_SCOPES:
                    e_scope.append(el.name)
            ctx = (tuple(e_scope), tuple(e_tf), ns)
            name = eqn.primitive.name
            sub = _inline_jaxpr(eqn) if name in INLINE else None
            if sub is not None:
                inner, consts = sub
                outs = self.walk(inner, [self.const(c) for c in consts] + ins, *ctx)
            elif name == "scan" and int(eqn.params["length"]) <= self.max_scan_unroll:
                outs = self.scan(eqn, ins, *ctx)
            else:
                outs = self.op(name, ins, [_aval(v) for v in eqn.outvars], eqn, *ctx)
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    def scan(self, eqn: Any, ins: list[Ref], scope: tuple[str, ...], tf: tuple[str, ...],
             ns: Any) -> list[Ref]:
        p = eqn.params
        length, n_consts, n_carry = int(p["length"]), int(p["num_consts"]), int(p["num_carry"])
        body, consts = _closed_to_open(p["jaxpr"])
        const_ids: list[Ref] = [self.const(c) for c in consts]
        c_refs = ins[:n_consts]
        carry = ins[n_consts:n_consts + n_carry]
        xs = ins[n_consts + n_carry:]
        x_avals = [_aval(v) for v in eqn.invars[n_consts + n_carry:]]
        ys_iters: list[list[Ref]] = [[] for _ in range(len(eqn.outvars) - n_carry)]
        order = range(length - 1, -1, -1) if p.get("reverse") else range(length)
        for i in order:
            # named by the iteration's index into the scanned inputs, not by the trip's order:
            # the transpose of a scan runs in reverse, and its iteration i differentiates the
            # forward scan's iteration i (the same layer of stacked parameters)
            it_scope = scope + (f"scan_{i}",)
            x_slices: list[Ref] = []
            for x, (shape, dtype) in zip(xs, x_avals):
                if isinstance(x, Lit):
                    x_slices.append(Lit(np.asarray(x.value)[i]))
                    continue
                (s,) = self.op("scan_slice", [x], [(shape[1:], dtype)], None, it_scope, tf, ns,
                               {"axis": 0, "index": i})
                x_slices.append(s)
            outs = self.walk(body, const_ids + c_refs + carry + x_slices, it_scope, tf, ns)
            carry = outs[:n_carry]
            for k, y in enumerate(outs[n_carry:]):
                ys_iters[k].append(y)
        results: list[Ref] = list(carry)
        for parts, v in zip(ys_iters, eqn.outvars[n_carry:]):
            (y,) = self.op("scan_stack", parts[::-1] if p.get("reverse") else parts, [_aval(v)],
                           None, scope, tf, ns, {"axis": 0, "length": length})
            results.append(y)
        return results


def _inline_jaxpr(eqn: Any) -> tuple[Any, list[Any]] | None:
    """The body (and its constants) a container equation is inlined with, or None when it has
    none whose inputs match its operands."""
    n = len(eqn.invars)
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(key)
        if isinstance(j, jcore.ClosedJaxpr) and len(j.jaxpr.invars) == n:
            return _closed_to_open(j)
        if isinstance(j, jcore.Jaxpr) and len(j.invars) == n and not j.constvars:
            return j, []
    return None


def _closed_to_open(closed: Any) -> tuple[Any, list[Any]]:
    """A ClosedJaxpr's jaxpr with its constants moved to leading inputs, and the constants."""
    j = closed.jaxpr
    if not j.constvars:
        return j, []
    from jax._src.interpreters import partial_eval as pe  # noqa: PLC0415

    return pe.convert_constvars_jaxpr(j), list(closed.consts)
