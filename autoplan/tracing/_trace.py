"""Tracing a JAX training step into an :class:`~autoplan.OpGraph`.

:func:`trace` takes the jaxpr of the whole function (``jax.make_jaxpr``; abstract
``jax.ShapeDtypeStruct`` arguments work, so nothing is allocated) and flattens it with
:func:`autoplan.tracing._jaxpr.walk_jaxpr`, the walk the executor evaluates too:

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

PRNG keys are values like any other: a typed key's tensor has the dtype ``key<impl>``
(``key<fry>``, 8 bytes) and the key primitives (``random_seed``, ``random_wrap``,
``random_split``, ``random_fold_in``, ...) are operators; arguments holding keys get the kind
``key`` (:func:`autoplan.tracing._workload.infer_arg_kinds`).

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

from autoplan._errors import ModelError, TraceError
from autoplan._gc import gc_paused
from autoplan._memo import BoundedCache
from autoplan.tracing._graph import GraphInput, GraphOutput, OpGraph, OpNode, Tensor
from autoplan.tracing._jaxpr import Lit, Walk, step_jaxpr, walk_jaxpr
from autoplan.tracing._primitives import OPAQUE_CONTROL, rule_of
from autoplan.tracing._workload import (
    ARG_KINDS,
    arg_trees,
    as_workload,
    check_key_kinds,
    infer_arg_kinds,
    is_workload_like,
    non_array_leaf,
    parameter_leaves,
)

__all__ = ["trace", "trace_workload", "forget_shared_traces", "OpaqueControlFlowWarning"]


class OpaqueControlFlowWarning(UserWarning):
    """``while``/``cond`` (or an over-long ``scan``) was kept as one opaque, replicated node."""



#: integer operations per 32-bit word of ``random_bits``: threefry2x32 makes two words in 20
#: rounds of add, rotate (two shifts and an or) and xor, with a key injection every 4 rounds
THREEFRY_OPS = 55


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
    spatial); reductions and scans: |in|; data movement and key handling (``random_seed``,
    ``random_wrap``, ...: a few words per key): 0; ``scatter``/``scatter-add``: |updates|;
    ``random_bits``: :data:`THREEFRY_OPS` integer operations per 32-bit word drawn; every other
    (elementwise) op: |out|. Which primitives count which way is the ``flops`` of their rule in
    the primitive registry (:mod:`autoplan.tracing._primitives`).
    """
    out = sum(math.prod(s) for s in out_shapes)
    if primitive == "random_bits":
        return float(THREEFRY_OPS * out * max(1, int(params.get("bit_width", 32)) // 32))
    if primitive == "dot_general":
        (lc, _rc), _ = params["dimension_numbers"]
        return 2.0 * out * math.prod(in_shapes[0][d] for d in lc)
    if primitive == "conv_general_dilated":
        rhs_spec = params["dimension_numbers"]["rhs_spec"]
        rhs = in_shapes[1]
        kernel = math.prod(rhs[d] for d in rhs_spec[2:])
        return 2.0 * out * rhs[rhs_spec[1]] * kernel
    counted = rule_of(primitive).flops  # how the primitive registry counts it
    if counted == "none":  # data movement, re-typing, key handling
        return 0.0
    if counted == "operand":  # reductions and scans
        return float(math.prod(in_shapes[0])) if in_shapes and in_shapes[0] is not None else 0.0
    if primitive == "sort":
        n = math.prod(in_shapes[0]) if in_shapes[0] else 1
        dim = params.get("dimension", 0)
        k = in_shapes[0][dim] if in_shapes[0] else 1
        return float(n * max(1.0, math.log2(max(k, 2))))
    if counted == "updates":  # a scatter: one per update
        return float(math.prod(in_shapes[2])) if len(in_shapes) > 2 and in_shapes[2] else 0.0
    return float(out)


def _dtype_name(dtype: Any) -> str:
    """A dtype's name: NumPy's for arrays, ``key<impl>`` for typed PRNG keys (JAX's extended
    dtypes, which NumPy cannot interpret), ``token`` for tokens."""
    if dtype is None:
        return "token"
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return str(dtype)
    return np.dtype(dtype).name


def _graph_from_walk(w: Walk) -> tuple[list[OpNode], list[Tensor], dict[str, int]]:
    """The walk's operators as :class:`OpNode` s, its tensors as :class:`Tensor` s, and the
    count of operators kept opaque, by primitive.

    An equation inlined many times (a layer's jitted function, called once per layer) is read
    once: its plain params, and its FLOPs per operand and result shapes, are kept by the
    equation (each operator still gets its own params dict)."""
    dtype_names: dict[Any, str] = {}

    def dtype_name(dtype: Any) -> str:
        try:
            return dtype_names[dtype]
        except KeyError:
            out = dtype_names[dtype] = _dtype_name(dtype)
            return out
        except TypeError:  # (an unhashable dtype)
            return _dtype_name(dtype)

    tensors = [Tensor(i, t.shape, dtype_name(t.dtype), t.producer)
               for i, t in enumerate(w.tensors)]
    nbytes = [t.nbytes for t in tensors]
    # roles: forward (under jvp), backward (under transpose); un-transformed operators after
    # the first backward one (in program order) are the update, the ones before it forward
    first_bwd = next((op.id for op in w.ops if "transpose" in op.transforms), len(w.ops))
    ops: list[OpNode] = []
    opaque: dict[str, int] = {}
    plain: dict[int, dict[str, Any]] = {}  # id(equation) -> its plain params
    flops_of: dict[tuple, float] = {}  # (id(equation), operand shapes, result shapes) -> FLOPs
    for op in w.ops:
        if "transpose" in op.transforms:
            role = "backward"
        elif "jvp" in op.transforms or "linearize" in op.transforms or op.id < first_bwd:
            role = "forward"
        else:
            role = "update"
        inputs = tuple(None if isinstance(r, Lit) else r for r in op.inputs)
        in_shapes = tuple(tensors[t].shape if t is not None else None for t in inputs)
        out_shapes = tuple(tensors[t].shape for t in op.outputs)
        if op.eqn is None:
            params = op.params
        else:  # (the walk holds every equation, so no id is reused while this runs)
            got = plain.get(id(op.eqn))
            if got is None:
                got = plain[id(op.eqn)] = _plain_params(op.eqn.params)
            params = dict(got)
        if op.eqn is not None and is_opaque(op.primitive):
            # while/cond, and a scan longer than max_scan_unroll (shorter ones are unrolled)
            opaque[op.primitive] = opaque.get(op.primitive, 0) + 1
            flops = _count_flops_eqn(op.eqn)
        else:
            key = None if op.eqn is None else (id(op.eqn), in_shapes, out_shapes)
            flops = flops_of.get(key) if key is not None else None
            if flops is None:
                flops = shape_flops(op.primitive, params, in_shapes, out_shapes)
                if key is not None:
                    flops_of[key] = flops
        ops.append(OpNode(
            id=op.id, primitive=op.primitive, params=params, inputs=inputs, outputs=op.outputs,
            flops=float(flops), scope=op.scope, role=role, in_shapes=in_shapes,
            out_shapes=out_shapes,
            bytes_in=sum(nbytes[t] for t in inputs if t is not None),
            bytes_out=sum(nbytes[t] for t in op.outputs),
            in_dtypes=tuple(tensors[t].dtype if t is not None else None for t in inputs),
            out_dtypes=tuple(tensors[t].dtype for t in op.outputs)))
    return ops, tensors, opaque


def shape_flops(primitive: str, params: dict[str, Any], in_shapes: tuple, out_shapes: tuple
                ) -> float:
    """An operator's FLOPs from its params and shapes, as the trace counts them (:func:`op_flops`;
    the results' size where its rule cannot read them)."""
    try:
        return float(op_flops(primitive, params, list(in_shapes), list(out_shapes)))
    except (KeyError, IndexError, TypeError):
        return float(sum(math.prod(s) for s in out_shapes))


def is_opaque(primitive: str) -> bool:
    """Whether a traced operator of this primitive is control flow kept whole
    (``while``/``cond``, a scan longer than ``max_scan_unroll``: shorter scans are unrolled into
    other primitives): its FLOPs are its bodies', not a function of its own shapes."""
    return primitive in OPAQUE_CONTROL or primitive == "scan"


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
    return shape_flops(name, _plain_params(eqn.params), ins, outs)


def _arg_names(fn: Callable, n: int) -> list[str]:
    try:
        sig = inspect.signature(fn)
        names = [p.name for p in sig.parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"arg{i}" for i in range(n)]


@gc_paused
def trace(fn: Callable, *args: Any, arg_kinds: tuple[str, ...] | None = None,
          name: str | None = None, max_scan_unroll: int = 512, **kwargs: Any) -> OpGraph:
    """Trace a JAX function (typically a whole training step) into an :class:`OpGraph`.

    Args:
        fn: the function, e.g. ``train_step(params, opt_state, batch)``; or an
            :class:`autoplan.Workload` (or a zoo workload), whose ``fn`` and ``args`` are used.
        *args: its positional arguments: arrays or ``jax.ShapeDtypeStruct`` pytrees.
        arg_kinds: the kind of each positional argument (``"parameter"``,
            ``"optimizer_state"``, ``"batch"``, ``"key"``, ``"input"``). Default: read off the arguments
            and the signature by :func:`autoplan.tracing._workload.infer_arg_kinds` (an optax state is
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
    if is_workload_like(fn) and not args:
        try:
            wl = as_workload(fn, "trace")
        except ModelError as err:
            raise TraceError(str(err)) from err
        return trace(wl.fn, *wl.args, arg_kinds=wl.arg_kinds, name=name or wl.name,
                     max_scan_unroll=max_scan_unroll)
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
    if arg_kinds is not None:
        check_key_kinds(fn, args, kinds, TraceError, "trace")

    closed, out_shape = step_jaxpr(
        fn, args, kwargs, lambda msg: TraceError(f"trace: {msg}"),
        "fn must be a pure JAX function of its array arguments (see jax.make_jaxpr).")

    w = walk_jaxpr(closed, max_scan_unroll)
    ops, tensors, opaque = _graph_from_walk(w)
    names = _arg_names(fn, n)
    # (parameters an optimizer-state argument carries, a TrainState's, are parameters)
    carried = {i: iter(parameter_leaves(args[i])) for i in range(n)
               if kinds[i] == "optimizer_state"}
    inputs: list[GraphInput] = []
    for (path, _leaf), tid in zip(flat_with_path, w.input_ids):
        if path[0].idx == 0:
            i = path[1].idx
            kind = "parameter" if i in carried and next(carried[i]) else kinds[i]
            inputs.append(GraphInput(tid, i, names[i], jax.tree_util.keystr(path[2:]), kind))
        else:
            inputs.append(GraphInput(tid, n, "kwargs", jax.tree_util.keystr(path[1:]), "input"))
    out_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(out_shape)[0]]
    outputs = [GraphOutput(t, p) for t, p in zip(w.outputs, out_paths) if not isinstance(t, Lit)]
    msgs = []
    if opaque:
        desc = ", ".join(f"{k} x{v}" for k, v in sorted(opaque.items()))
        msg = (f"trace: kept {sum(opaque.values())} control-flow operator(s) opaque ({desc}): "
               "their trip counts or branches are not static, so each is one node with the "
               "replicated strategy. Fix: use lax.scan with a static length or Python loops for "
               "repeated layers.")
        warnings.warn(msg, OpaqueControlFlowWarning, stacklevel=2)
        msgs.append(msg)
    return OpGraph(ops=ops, tensors=tensors, inputs=inputs, outputs=outputs,
                   name=name or getattr(fn, "__name__", "graph"), consts=w.top_consts,
                   warnings=msgs, arg_trees=None if kwargs else arg_trees(args))


#: zoo workloads' traces, shared by every workload object built from one zoo spec; a few, as each
#: keeps its graph's analyses (mining, the ILP's tables) alive with it
_ZOO_TRACES: BoundedCache[tuple, OpGraph] = BoundedCache(8)


def _zoo_key(workload: Any, args: tuple, name: str) -> tuple | None:
    """What a zoo workload's trace is a function of: its zoo spec (model, size and the config
    fields that differ from the size's, which build the step again: ``Workload.concrete`` does
    the same), its arguments' structure, shapes and dtypes, their kinds, the graph's name and
    the JAX settings that change a jaxpr's types. None for any other workload."""
    origin = getattr(workload, "origin", None)
    if origin is None or origin.kind != "zoo":
        return None
    leaves, tree = jax.tree_util.tree_flatten(args)
    sig = tuple((tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False)))
                for x in leaves)
    config = (jax.config.jax_enable_x64, str(jax.config.jax_default_matmul_precision),
              str(jax.config.jax_default_prng_impl))
    return (origin.model, origin.size, tuple(sorted((k, repr(v)) for k, v in origin.kwargs.items())),
            tree, sig, tuple(workload.arg_kinds), name, config)


def trace_workload(workload: Any, args: tuple | None = None, name: str | None = None) -> OpGraph:
    """``trace(workload.fn, *args, arg_kinds=workload.arg_kinds, name=name)``: the search's and the
    executor's trace of a workload (``args`` default to its own, ``name`` to its name).

    A zoo workload (:func:`autoplan.models.get`) is the same step whenever its spec is, so its
    trace is shared by every workload object of that spec and arguments' shapes in this process
    (a few kept; the opaque-control-flow warnings given again on each use); any other workload is
    traced on each call (its callers keep its trace on the object). :func:`trace` itself always
    traces.
    """
    args = tuple(workload.args) if args is None else tuple(args)
    name = workload.name if name is None else name
    key = _zoo_key(workload, args, name)
    hit = _ZOO_TRACES.get(key) if key is not None else None
    if hit is not None:
        for msg in hit.warnings:
            warnings.warn(msg, OpaqueControlFlowWarning, stacklevel=2)
        return hit
    graph = trace(workload.fn, *args, arg_kinds=tuple(workload.arg_kinds), name=name)
    return graph if key is None else _ZOO_TRACES.put(key, graph)


def forget_shared_traces() -> None:
    """Drop the zoo traces :func:`trace_workload` shares: a search of a new workload object of a
    zoo spec then traces and solves it afresh (a benchmark's cold runs in one process)."""
    _ZOO_TRACES.clear()
