"""Tracing a JAX training step into an :class:`~autoplan.OpGraph`.

:func:`trace` takes the jaxpr of the whole function (``jax.make_jaxpr``; abstract
``jax.ShapeDtypeStruct`` arguments work, so nothing is allocated) and flattens it:

* containers are inlined: ``jit``/``pjit``, ``closed_call``, ``remat``/``checkpoint``,
  ``custom_jvp_call``, ``custom_vjp_call``; their named scopes are prefixed by the enclosing
  equation's scopes;
* ``scan`` is **unrolled**: each iteration's body appears once in the graph (in a named scope
  ``scan_<i>``, ``i`` the iteration's index in the scanned inputs), with synthetic
  ``scan_slice`` operators taking iteration ``i``'s slice of each scanned input and one
  ``scan_stack`` operator stacking each scanned output, so repeated layers written with ``scan``
  are visible as repeated structure to the folding search (scans longer than
  ``max_scan_unroll`` stay one opaque node whose FLOPs are the body's times the trip count);
* ``while`` and ``cond`` stay opaque nodes (their trip counts and branches are not static): one
  :class:`OpaqueControlFlowWarning` names them all.

Each operator records its primitive, sharding-relevant params, shapes, dtypes, FLOPs, bytes, its
``jax.named_scope`` path and its role: ``forward`` (under ``jvp``), ``backward`` (under
``transpose``) or ``update`` (after the gradients, such as the optimizer step).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from ._errors import TraceError
from ._graph import GraphInput, GraphOutput, OpGraph, OpNode, Tensor
from ._workload import ARG_KINDS, arg_trees, infer_arg_kinds, non_array_leaf

__all__ = ["trace", "OpaqueControlFlowWarning"]


class OpaqueControlFlowWarning(UserWarning):
    """``while``/``cond`` (or an over-long ``scan``) was kept as one opaque, replicated node."""


_INLINE = {"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
           "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "named_call",
           "custom_lin"}
_OPAQUE = {"while", "cond", "shard_map", "xla_pmap", "custom_transpose_call"}
_INTERNAL_SCOPES = {"rematted_computation"}

#: primitives that move or re-type data without arithmetic (0 FLOPs)
MOVEMENT = frozenset({
    "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice", "dynamic_slice",
    "dynamic_update_slice", "gather", "concatenate", "pad", "convert_element_type", "copy", "copy_p",
    "iota", "rev", "split", "scan_slice", "scan_stack", "stop_gradient", "sharding_constraint",
    "device_put", "bitcast_convert_type", "squeeze_p", "reduce_precision", "optimization_barrier",
    "mesh_cast", "reshard", "select_and_gather_add",
})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
                        "reduce_or", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
                        "cumlogsumexp", "reduce_precision_sum"})


def _plain(v: Any, depth: int = 0) -> Any:
    """Params as plain JSON-able values (tuples, ints, strings); anything else is dropped."""
    if depth > 6:
        return None
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, np.integer | np.floating):
        return v.item()
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return np.dtype(v).name
    if hasattr(v, "_asdict"):
        return {k: _plain(x, depth + 1) for k, x in v._asdict().items()}
    if isinstance(v, tuple | list):
        out = [_plain(x, depth + 1) for x in v]
        return tuple(out)
    if hasattr(v, "name") and hasattr(v, "value") and isinstance(v.name, str):  # enums
        return v.name
    if hasattr(v, "dtype") and hasattr(v, "itemsize"):
        return np.dtype(v).name
    return _DROP


_DROP = object()


def _plain_params(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        if k in ("jaxpr", "call_jaxpr", "branches", "cond_jaxpr", "body_jaxpr", "fun_jaxpr",
                 "jvp_jaxpr_fun", "jvp_jaxpr_thunk", "fwd_jaxpr_thunk", "bwd", "in_shardings",
                 "out_shardings", "sharding", "out_sharding", "precision", "in_layouts",
                 "out_layouts"):
            continue
        p = _plain(v)
        if p is not _DROP and not _contains_drop(p):
            out[k] = p
    return out


def _contains_drop(v: Any) -> bool:
    if v is _DROP:
        return True
    if isinstance(v, tuple):
        return any(_contains_drop(x) for x in v)
    if isinstance(v, dict):
        return any(_contains_drop(x) for x in v.values())
    return False


def op_flops(primitive: str, params: dict[str, Any], in_shapes: list, out_shapes: list) -> float:
    """FLOPs of one operator.

    dot_general: 2.|out|.prod(contracting dims); conv: 2.|out|.C_in(per group).prod(kernel
    spatial); reductions and scans: |in|; data movement: 0; every other (elementwise) op: |out|.
    """
    out = sum(math.prod(s) for s in out_shapes)
    if primitive == "dot_general":
        (lc, _rc), _ = params["dimension_numbers"]
        return 2.0 * out * math.prod(in_shapes[0][d] for d in lc)
    if primitive == "conv_general_dilated":
        rhs_spec = params["dimension_numbers"]["rhs_spec"]
        rhs = in_shapes[1]
        kernel = math.prod(rhs[d] for d in rhs_spec[2:])
        return 2.0 * out * rhs[rhs_spec[1]] * kernel
    if primitive in MOVEMENT:
        return 0.0
    if primitive in REDUCTIONS:
        return float(math.prod(in_shapes[0])) if in_shapes and in_shapes[0] is not None else 0.0
    if primitive == "sort":
        n = math.prod(in_shapes[0]) if in_shapes[0] else 1
        dim = params.get("dimension", 0)
        k = in_shapes[0][dim] if in_shapes[0] else 1
        return float(n * max(1.0, math.log2(max(k, 2))))
    if primitive in ("scatter-add", "scatter_add", "scatter"):
        return float(math.prod(in_shapes[2])) if len(in_shapes) > 2 and in_shapes[2] else 0.0
    return float(out)


def _aval_info(v) -> tuple[tuple[int, ...], str]:
    aval = v.aval
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    dtype = getattr(aval, "dtype", None)
    return shape, (np.dtype(dtype).name if dtype is not None else "token")


class _Builder:
    def __init__(self, max_scan_unroll: int):
        self.ops: list[OpNode] = []
        self.tensors: list[Tensor] = []
        self.opaque: dict[str, int] = {}
        self.max_scan_unroll = max_scan_unroll
        self.transforms: list[tuple[str, ...]] = []  # per op: transform names (for roles)

    def new_tensor(self, shape, dtype, producer=-1) -> int:
        t = Tensor(len(self.tensors), shape, dtype, producer)
        self.tensors.append(t)
        return t.id

    def add_op(self, primitive, params, inputs, out_avals, scope, transforms, flops=None) -> list[int]:
        oid = len(self.ops)
        outs = [self.new_tensor(s, d, oid) for s, d in out_avals]
        in_shapes = tuple(self.tensors[t].shape if t is not None else None for t in inputs)
        in_dtypes = tuple(self.tensors[t].dtype if t is not None else None for t in inputs)
        out_shapes = tuple(s for s, _ in out_avals)
        if flops is None:
            try:
                flops = op_flops(primitive, params, list(in_shapes), list(out_shapes))
            except (KeyError, IndexError, TypeError):
                flops = float(sum(math.prod(s) for s in out_shapes))
        self.ops.append(OpNode(
            id=oid, primitive=primitive, params=params, inputs=tuple(inputs), outputs=tuple(outs),
            flops=float(flops), scope=scope, role="", in_shapes=in_shapes, out_shapes=out_shapes,
            bytes_in=sum(self.tensors[t].nbytes for t in inputs if t is not None),
            bytes_out=sum(self.tensors[t].nbytes for t in outs),
            in_dtypes=in_dtypes, out_dtypes=tuple(d for _, d in out_avals)))
        self.transforms.append(transforms)
        return outs

    # ---- the walk ----------------------------------------------------------------------
    def walk(self, jaxpr, in_ids: list[int | None], scope: tuple[str, ...],
             transforms: tuple[str, ...]) -> list[int | None]:
        env: dict[Any, int | None] = {}
        for v, t in zip(jaxpr.invars, in_ids):
            env[v] = t

        def read(v):
            if isinstance(v, jcore.Literal):
                return None
            return env.get(v)

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            ns = eqn.source_info.name_stack
            e_scope, e_tf = list(scope), list(transforms)
            for el in ns.stack:
                if type(el).__name__ == "Transform":
                    e_tf.append(el.name)
                elif el.name not in _INTERNAL_SCOPES:
                    e_scope.append(el.name)
            e_scope_t, e_tf_t = tuple(e_scope), tuple(e_tf)
            name = eqn.primitive.name
            if name in _INLINE:
                sub = inline_jaxpr(eqn)
                if sub is not None:
                    inner, consts = sub
                    const_ids = [self._const(c) for c in consts]
                    outs = self.walk(inner, const_ids + ins, e_scope_t, e_tf_t)
                    for v, t in zip(eqn.outvars, outs):
                        env[v] = t
                    continue
            if name == "scan":
                outs = self._scan(eqn, ins, e_scope_t, e_tf_t)
            elif name in _OPAQUE:
                self.opaque[name] = self.opaque.get(name, 0) + 1
                outs = self.add_op(name, _plain_params(eqn.params), ins,
                                   [_aval_info(v) for v in eqn.outvars], e_scope_t, e_tf_t,
                                   flops=_count_flops_eqn(eqn))
            else:
                outs = self.add_op(name, _plain_params(eqn.params), ins,
                                   [_aval_info(v) for v in eqn.outvars], e_scope_t, e_tf_t)
            for v, t in zip(eqn.outvars, outs):
                env[v] = t
        return [read(v) for v in jaxpr.outvars]

    def _const(self, c) -> int:
        arr = np.asarray(c) if not hasattr(c, "aval") else c
        shape = tuple(int(d) for d in np.shape(arr))
        dtype = np.dtype(getattr(arr, "dtype", np.float32)).name
        return self.new_tensor(shape, dtype)

    def _scan(self, eqn, ins, scope, tf) -> list[int | None]:
        p = eqn.params
        length, n_consts, n_carry = int(p["length"]), int(p["num_consts"]), int(p["num_carry"])
        closed = p["jaxpr"]
        if length > self.max_scan_unroll:
            self.opaque["scan"] = self.opaque.get("scan", 0) + 1
            return self.add_op("scan", _plain_params(p), ins, [_aval_info(v) for v in eqn.outvars],
                               scope, tf, flops=_count_flops_eqn(eqn))
        body, consts = _closed_to_open(closed)
        const_ids = [self._const(c) for c in consts]
        c_ids = ins[:n_consts]
        carry = ins[n_consts:n_consts + n_carry]
        xs = ins[n_consts + n_carry:]
        n_ys = len(eqn.outvars) - n_carry
        ys_iters: list[list[int | None]] = [[] for _ in range(n_ys)]
        order = range(length - 1, -1, -1) if p.get("reverse") else range(length)
        x_avals = [_aval_info(v) for v in eqn.invars[n_consts + n_carry:]]
        for i in order:
            # named by the iteration's index into the scanned inputs, not by the trip's order:
            # the transpose of a scan runs in reverse, and its iteration i differentiates the
            # forward scan's iteration i (the same layer of stacked parameters)
            it_scope = scope + (f"scan_{i}",)
            x_slices = []
            for x, (shape, dtype) in zip(xs, x_avals):
                if x is None:
                    x_slices.append(None)
                    continue
                (s,) = self.add_op("scan_slice", {"axis": 0, "index": i}, [x], [(shape[1:], dtype)],
                                   it_scope, tf)
                x_slices.append(s)
            outs = self.walk(body, const_ids + c_ids + carry + x_slices, it_scope, tf)
            carry = outs[:n_carry]
            for k, y in enumerate(outs[n_carry:]):
                ys_iters[k].append(y)
        results: list[int | None] = list(carry)
        for k, v in enumerate(eqn.outvars[n_carry:]):
            parts = ys_iters[k][::-1] if p.get("reverse") else ys_iters[k]
            (y,) = self.add_op("scan_stack", {"axis": 0, "length": length}, parts,
                               [_aval_info(v)], scope, tf)
            results.append(y)
        return results


def inline_jaxpr(eqn) -> tuple[Any, list[Any]] | None:
    """The sub-jaxpr (and its consts) a container equation is inlined with, or None when the
    equation has none whose inputs match its operands. Shared with the plan executor, which must
    flatten exactly as the trace does."""
    n = len(eqn.invars)
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(key)
        if j is None:
            continue
        if isinstance(j, jcore.ClosedJaxpr):
            if len(j.jaxpr.invars) == n and not j.jaxpr.constvars:
                return j.jaxpr, []
            if len(j.jaxpr.invars) == n:
                return _closed_to_open(j)
        elif isinstance(j, jcore.Jaxpr) and len(j.invars) == n and not j.constvars:
            return j, []
    return None


def _closed_to_open(closed):
    """A ClosedJaxpr's jaxpr with its consts moved to leading invars."""
    j = closed.jaxpr
    if not j.constvars:
        return j, []
    from jax._src.interpreters import partial_eval as pe  # noqa: PLC0415

    return pe.convert_constvars_jaxpr(j), list(closed.consts)


def _count_flops_jaxpr(jaxpr) -> float:
    total = 0.0
    for eqn in jaxpr.eqns:
        total += _count_flops_eqn(eqn)
    return total


def _count_flops_eqn(eqn) -> float:
    name = eqn.primitive.name
    subs = list(jcore.jaxprs_in_params(eqn.params))
    if subs:
        if name == "cond":
            return max(_count_flops_jaxpr(s) for s in subs)
        if name == "scan":
            return int(eqn.params["length"]) * sum(_count_flops_jaxpr(s) for s in subs)
        return sum(_count_flops_jaxpr(s) for s in subs)
    ins = [tuple(getattr(v.aval, "shape", ())) if not isinstance(v, jcore.Literal) else ()
           for v in eqn.invars]
    outs = [tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars]
    try:
        return op_flops(name, _plain_params(eqn.params), ins, outs)
    except (KeyError, IndexError, TypeError):
        return float(sum(math.prod(s) for s in outs))


def _assign_roles(b: _Builder) -> list[OpNode]:
    """forward (under jvp), backward (under transpose); un-transformed ops after the first
    backward op (in program order) are the update, the ones before it forward."""
    first_bwd = next((i for i, tf in enumerate(b.transforms) if "transpose" in tf), len(b.ops))
    out: list[OpNode] = []
    for i, (op, tf) in enumerate(zip(b.ops, b.transforms)):
        if "transpose" in tf:
            role = "backward"
        elif "jvp" in tf or "linearize" in tf or i < first_bwd:
            role = "forward"
        else:
            role = "update"
        out.append(OpNode(**{**op.__dict__, "role": role}))
    return out


def _arg_names(fn: Callable, n: int) -> list[str]:
    try:
        sig = inspect.signature(fn)
        names = [p.name for p in sig.parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"arg{i}" for i in range(n)]


def trace(fn: Callable, *args: Any, arg_kinds: tuple[str, ...] | None = None,
          name: str | None = None, max_scan_unroll: int = 512, **kwargs: Any) -> OpGraph:
    """Trace a JAX function (typically a whole training step) into an :class:`OpGraph`.

    Args:
        fn: the function, e.g. ``train_step(params, opt_state, batch)``; or an
            :class:`autoplan.Workload` (or a zoo workload), whose ``fn`` and ``args`` are used.
        *args: its positional arguments: arrays or ``jax.ShapeDtypeStruct`` pytrees.
        arg_kinds: the kind of each positional argument (``"parameter"``,
            ``"optimizer_state"``, ``"batch"``, ``"input"``). Default: read off the arguments
            and the signature by :func:`autoplan._workload.infer_arg_kinds` (an optax state is
            the optimizer state; ``params``, ``opt_state``, ``batch`` and similar names; else
            three arguments are (parameter, optimizer_state, batch), two (parameter, batch)).
        name: a name for the graph (default the function's name).
        max_scan_unroll: scans up to this trip count are unrolled; longer ones stay opaque.
        **kwargs: keyword arguments of ``fn`` (traced as inputs of kind ``"input"``).

    Returns:
        The operator graph.

    Raises:
        TraceError: ``fn`` is not callable, an argument leaf is not an array, or JAX cannot trace
            the function.

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> g = autoplan.trace(lambda w, x: jnp.tanh(x @ w).sum(),
        ...                    jax.ShapeDtypeStruct((4, 8), jnp.float32),
        ...                    jax.ShapeDtypeStruct((2, 4), jnp.float32))
        >>> [op.primitive for op in g]
        ['dot_general', 'tanh', 'reduce_sum']
    """
    if hasattr(fn, "fn") and hasattr(fn, "args") and not args:
        wl = fn
        kinds = getattr(wl, "arg_kinds", None)
        return trace(wl.fn, *wl.args, arg_kinds=tuple(kinds) if kinds is not None else None,
                     name=name or getattr(wl, "name", None), max_scan_unroll=max_scan_unroll)
    if not callable(fn):
        raise TraceError(f"trace: fn should be a callable JAX function or a Workload. Got "
                         f"{type(fn).__name__}: {fn!r}. Fix: pass the training step function.")
    flat_with_path, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
    bad = non_array_leaf((args, kwargs))
    if bad is not None:
        path, leaf = bad
        raise TraceError(
            f"trace: every argument leaf should be an array or jax.ShapeDtypeStruct. Got "
            f"{type(leaf).__name__} at {path}: {leaf!r:.80}. Fix: pass arrays (or "
            "jax.ShapeDtypeStruct for abstract tracing), or close over non-array values with "
            "functools.partial.")
    n = len(args)
    kinds = tuple(arg_kinds) if arg_kinds is not None else infer_arg_kinds(fn, args)
    if len(kinds) != n:
        raise TraceError(f"trace: arg_kinds should give one kind per positional argument ({n}). "
                         f"Got {len(kinds)}: {kinds}. Fix: pass a tuple of length {n}.")
    bad_kinds = [k for k in kinds if k not in ARG_KINDS]
    if bad_kinds:
        raise TraceError(f"trace: arg_kinds should each be one of {ARG_KINDS}. Got {bad_kinds[0]!r}. "
                         "Fix: e.g. arg_kinds=('parameter', 'optimizer_state', 'batch').")

    def wrapped(a, kw):
        return fn(*a, **kw)

    try:
        closed, out_shape = jax.make_jaxpr(wrapped, return_shape=True)(args, kwargs)
    except Exception as err:  # JAX raises many types; all mean "not traceable"
        raise TraceError(
            f"trace: JAX could not trace {getattr(fn, '__name__', fn)!r}: "
            f"{type(err).__name__}: {err}. Fix: fn must be a pure JAX function of its array "
            "arguments (see jax.make_jaxpr).") from err

    b = _Builder(max_scan_unroll)
    names = _arg_names(fn, n)
    inputs: list[GraphInput] = []
    in_ids: list[int | None] = []
    for (path, _leaf), var in zip(flat_with_path, closed.jaxpr.invars):
        shape, dtype = _aval_info(var)
        tid = b.new_tensor(shape, dtype)
        in_ids.append(tid)
        if path[0].idx == 0:
            i = path[1].idx
            inputs.append(GraphInput(tid, i, names[i], jax.tree_util.keystr(path[2:]), kinds[i]))
        else:
            inputs.append(GraphInput(tid, n, "kwargs", jax.tree_util.keystr(path[1:]), "input"))
    top, top_consts = _closed_to_open(closed)
    consts = [b._const(c) for c in top_consts]
    outs = b.walk(top, consts + in_ids, (), ())
    out_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(out_shape)[0]]
    outputs = [GraphOutput(t, p) for t, p in zip(outs, out_paths) if t is not None]
    ops = _assign_roles(b)
    msgs = []
    if b.opaque:
        desc = ", ".join(f"{k} x{v}" for k, v in sorted(b.opaque.items()))
        msg = (f"trace: kept {sum(b.opaque.values())} control-flow operator(s) opaque ({desc}): "
               "their trip counts or branches are not static, so each is one node with the "
               "replicated strategy. Fix: use lax.scan with a static length or Python loops for "
               "repeated layers.")
        warnings.warn(msg, OpaqueControlFlowWarning, stacklevel=2)
        msgs.append(msg)
    return OpGraph(ops=ops, tensors=b.tensors, inputs=inputs, outputs=outputs,
                   name=name or getattr(fn, "__name__", "graph"), consts=consts, warnings=msgs,
                   arg_trees=None if kwargs else arg_trees(args))
