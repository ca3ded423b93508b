"""Re-evaluating a training step op by op, numbered exactly as :func:`autoplan.trace` numbers it.

:func:`flatten` takes the jaxpr of the function (``jax.make_jaxpr``, as the trace does) and
flattens it with :func:`autoplan.tracing._jaxpr.walk_jaxpr`, the walk :func:`autoplan.trace` builds its
graph from: containers (jit/pjit, remat, custom_jvp/custom_vjp calls, ...) inlined, short
``scan`` s unrolled into synthetic ``scan_slice`` / ``scan_stack`` operators around each
iteration's body, and every other equation (``while``/``cond``, longer scans, any primitive) bound
as it is. Operator ``i`` and tensor ``t`` of the :class:`FlatProgram` are therefore operator
``i`` and tensor ``t`` of the :class:`~autoplan.OpGraph`.

A :class:`FlatProgram` evaluates any subset of its operators on an environment ``{tensor id:
value}``, with a hook on every operator's outputs (and, when the hook has a ``before`` method, on
its operands): the executor uses it to apply ``jax.lax.with_sharding_constraint`` to the operands
and results of the operators a plan chose a sharding for, and the pipeline executor to run one
stage's operators inside that stage's ``jax.jit``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> prog = flatten(lambda w, x: jnp.tanh(x @ w).sum(),
    ...                jax.ShapeDtypeStruct((4, 8), jnp.float32),
    ...                jax.ShapeDtypeStruct((2, 4), jnp.float32))
    >>> [op.primitive for op in prog.ops]
    ['dot_general', 'tanh', 'reduce_sum']
    >>> float(prog(jnp.zeros((4, 8)), jnp.ones((2, 4))))
    0.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from autoplan._errors import ExecutionError
from autoplan.tracing._jaxpr import Lit, Ref, Walk, WalkOp, step_jaxpr, walk_jaxpr

__all__ = ["Lit", "FlatOp", "FlatProgram", "flatten", "sharding_hook"]

try:  # HLO metadata (op_name) of re-bound equations; optional
    from jax._src import source_info_util as _siu
except ImportError:  # pragma: no cover - private module moved
    _siu = None


@dataclass(frozen=True, eq=False)
class FlatOp:
    """One operator of a :class:`FlatProgram` (operator ``id`` of the traced graph).

    Attributes:
        id: operator id, equal to the trace's.
        primitive: the primitive's name (``scan_slice``/``scan_stack`` for the synthetic ones).
        inputs: tensor ids of the operands, or :class:`Lit` for literals.
        outputs: tensor ids of the results.
        eqn: the jaxpr equation bound (None for synthetic operators).
        params: ``{"index": i}`` for ``scan_slice``, ``{"dtype": ...}`` for ``scan_stack``.
        name_stack: the equation's full name stack (for HLO metadata).
    """

    id: int
    primitive: str
    inputs: tuple[Ref, ...]
    outputs: tuple[int, ...]
    eqn: Any = None
    params: Mapping[str, Any] = field(default_factory=dict)
    name_stack: Any = None

    def apply(self, vals: Sequence[Any]) -> list[Any]:
        """Evaluate the operator on operand values; returns one value per output."""
        if self.primitive == "scan_slice" and self.eqn is None:
            return [jax.lax.index_in_dim(vals[0], self.params["index"], axis=0, keepdims=False)]
        if self.primitive == "scan_stack" and self.eqn is None:
            dt = self.params["dtype"]
            return [jnp.stack([jnp.asarray(v, dtype=dt) for v in vals], axis=0)]
        eqn = self.eqn
        params = eqn.primitive.get_bind_params(eqn.params)
        if _siu is not None and self.name_stack is not None:
            ctx = _siu.user_context(eqn.source_info.traceback,
                                    name_stack=_siu.current_name_stack() + self.name_stack)
        else:  # pragma: no cover
            ctx = _nullcontext()
        with ctx, eqn.ctx.manager:
            ans = eqn.primitive.bind(*vals, **params)
        return list(ans) if eqn.primitive.multiple_results else [ans]


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


Hook = Callable[[FlatOp, list[Any]], list[Any]]


@dataclass(eq=False)
class FlatProgram:
    """A training step as a flat list of operators over numbered tensors.

    Attributes:
        ops: the operators, in the trace's order (``ops[i].id == i``).
        input_ids: tensor ids of the flattened positional arguments' leaves.
        consts: tensor id -> value of the jaxpr's constants.
        outputs: references (tensor ids or literals) of the flattened results.
        out_tree: the results' pytree structure.
        in_tree: the arguments' pytree structure (of the tuple of positional arguments).
        num_tensors: number of tensor ids handed out.
    """

    ops: list[FlatOp]
    input_ids: list[int]
    consts: dict[int, Any]
    outputs: list[Ref]
    out_tree: Any
    in_tree: Any
    num_tensors: int

    def __len__(self) -> int:
        return len(self.ops)

    def evaluate(self, env: dict[int, Any], ops: Iterable[FlatOp] | None = None,
                 hook: Hook | None = None) -> dict[int, Any]:
        """Run ``ops`` (default all) in order, reading and writing ``env`` (tensor id -> value).

        Args:
            env: values of the tensors read; updated with every result.
            ops: the operators to run, a subset of ``self.ops`` in program order.
            hook: called with each operator and its results; returns the results to store
                (e.g. with sharding constraints applied). When it has a ``before`` attribute,
                ``hook.before(op, operands)`` is called first and returns the operands to use.

        Returns:
            ``env``.

        Raises:
            ExecutionError: an operand is neither in ``env`` nor a constant or literal.
        """
        before = getattr(hook, "before", None)
        for op in self.ops if ops is None else ops:
            vals = []
            for r in op.inputs:
                if isinstance(r, Lit):
                    vals.append(r.value)
                elif r in env:
                    vals.append(env[r])
                elif r in self.consts:
                    vals.append(self.consts[r])
                else:
                    raise ExecutionError(
                        f"evaluate: operator {op.id} ({op.primitive}) reads tensor {r}, which is "
                        "not available. Fix: evaluate the operators that produce it first "
                        "(pass ops in program order).")
            if before is not None:
                vals = before(op, vals)
            outs = op.apply(vals)
            if hook is not None:
                outs = hook(op, outs)
            for t, v in zip(op.outputs, outs):
                env[t] = v
        return env

    def read(self, env: Mapping[int, Any], ref: Ref) -> Any:
        """The value of a reference in ``env`` (or a constant, or a literal)."""
        if isinstance(ref, Lit):
            return ref.value
        return env[ref] if ref in env else self.consts[ref]

    def __call__(self, *args: Any, hook: Hook | None = None) -> Any:
        """Evaluate the whole program on the positional arguments; returns the result pytree."""
        leaves = jax.tree_util.tree_leaves(args)
        if len(leaves) != len(self.input_ids):
            raise ExecutionError(f"FlatProgram: expected {len(self.input_ids)} argument leaves. "
                                 f"Got {len(leaves)}. Fix: pass the arguments it was traced with.")
        env = dict(zip(self.input_ids, leaves))
        self.evaluate(env, hook=hook)
        return jax.tree_util.tree_unflatten(self.out_tree, [self.read(env, r) for r in self.outputs])

    def check_matches(self, graph: Any) -> None:
        """Raise :class:`ExecutionError` unless the program visits the graph's operators: same
        count, primitives, operand and result tensor ids."""
        if len(self.ops) != len(graph.ops):
            raise ExecutionError(
                f"the executor's walk of the jaxpr has {len(self.ops)} operators but the trace has "
                f"{len(graph.ops)}. Fix: trace and run with the same autoplan version and "
                "max_scan_unroll.")
        for a, b in zip(self.ops, graph.ops):
            ins = tuple(None if isinstance(r, Lit) else r for r in a.inputs)
            if a.primitive != b.primitive or ins != tuple(b.inputs) or a.outputs != tuple(b.outputs):
                raise ExecutionError(
                    f"the executor's operator {a.id} ({a.primitive}, in {ins}, out {a.outputs}) "
                    f"differs from the trace's ({b.primitive}, in {tuple(b.inputs)}, out "
                    f"{tuple(b.outputs)}). Fix: trace and run with the same autoplan version.")


def _abstract(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


def flatten(fn: Callable[..., Any], *args: Any, max_scan_unroll: int = 512) -> FlatProgram:
    """Flatten ``fn(*args)`` into a :class:`FlatProgram` numbered as :func:`autoplan.trace` does.

    Args:
        fn: the function (a training step).
        *args: its positional arguments (arrays or ``jax.ShapeDtypeStruct``; only shapes and
            dtypes are used).
        max_scan_unroll: scans up to this length are unrolled (the trace's default is 512).

    Returns:
        The program.

    Raises:
        ExecutionError: JAX cannot make a jaxpr of ``fn``.
    """
    abstract = jax.tree_util.tree_map(_abstract, args)

    closed, out_shape = step_jaxpr(
        fn, abstract, {}, lambda msg: ExecutionError(f"flatten: {msg}"),
        "pass the training step (a function JAX can trace) and its arguments.")
    w = walk_jaxpr(closed, max_scan_unroll)
    ops = [FlatOp(op.id, op.primitive, op.inputs, op.outputs, op.eqn, _flat_params(w, op),
                  op.name_stack) for op in w.ops]
    return FlatProgram(ops=ops, input_ids=w.input_ids, consts=w.consts, outputs=w.outputs,
                       out_tree=jax.tree_util.tree_structure(out_shape),
                       in_tree=jax.tree_util.tree_structure(abstract), num_tensors=len(w.tensors))


def _flat_params(w: Walk, op: WalkOp) -> dict[str, Any]:
    """What :meth:`FlatOp.apply` reads of a synthetic operator: the slice's index, the stacked
    result's dtype."""
    if op.primitive == "scan_slice" and op.eqn is None:
        return {"index": op.params["index"]}
    if op.primitive == "scan_stack" and op.eqn is None:
        return {"dtype": w.tensors[op.outputs[0]].dtype}
    return {}


class _ShardingHook:
    """The hook of :func:`sharding_hook`: constrains an operator's operands (``before``) and
    results (the call) to the plan's specs."""

    def __init__(self, mesh: Any, op_shardings: Iterable[Any], exact_shapes: bool):
        self.mesh = mesh
        self.exact_shapes = exact_shapes
        self.outputs: dict[int, list[Any]] = {}
        self.operands: dict[int, list[Any]] = {}
        self.prim: dict[int, str] = {}
        for o in op_shardings:
            outs = [t for t in o.tensors if t.role == "output"]
            if outs:
                self.outputs.setdefault(o.op, []).extend(outs)
                self.prim[o.op] = o.primitive
            ins = [t for t in o.tensors if t.role != "output"]
            if ins:
                self.operands.setdefault(o.op, []).extend(ins)
                self.prim[o.op] = o.primitive
        self.counts = {"applied": 0, "skipped": 0, "operands_applied": 0, "operands_skipped": 0}
        self._seen: dict[str, set[tuple[int, int, str]]] = {k: set() for k in self.counts}

    def count(self, kind: str, op_id: int, k: int, name: str) -> None:
        """Count a constraint once per operator, position and tensor (tracing twice counts once)."""
        self._seen[kind].add((op_id, k, name))
        self.counts[kind] = len(self._seen[kind])

    def fits(self, v: Any, t: Any) -> bool:
        shape = tuple(np.shape(v))
        if self.exact_shapes and shape != tuple(t.shape):
            return False
        return t.spec.divides(shape, self.mesh.axis_sizes, self.mesh.axis_names)

    def constrain(self, v: Any, t: Any) -> Any:
        return jax.lax.with_sharding_constraint(v, NamedSharding(self.mesh, t.spec.to_pspec()))

    def before(self, op: FlatOp, vals: list[Any]) -> list[Any]:
        specs = self.operands.get(op.id)
        if not specs:
            return vals
        if self.prim[op.id] and self.prim[op.id] != op.primitive:  # numbered for another trace
            for k, t in enumerate(specs):
                self.count("operands_skipped", op.id, k, t.name)
            return vals
        vals = list(vals)
        # the plan lists the tensor operands in order (literals have no spec)
        positions = [k for k, r in enumerate(op.inputs) if not isinstance(r, Lit)]
        for k, t in zip(positions, specs):
            if self.fits(vals[k], t):
                vals[k] = self.constrain(vals[k], t)
                self.count("operands_applied", op.id, k, t.name)
            else:
                self.count("operands_skipped", op.id, k, t.name)
        return vals

    def __call__(self, op: FlatOp, outs: list[Any]) -> list[Any]:
        specs = self.outputs.get(op.id)
        if not specs:
            return outs
        if self.prim[op.id] and self.prim[op.id] != op.primitive:  # numbered for another trace
            for t in specs:
                self.count("skipped", op.id, -1, t.name)
            return outs
        outs = list(outs)
        for t in specs:
            for k, v in enumerate(outs):
                if self.fits(v, t):
                    outs[k] = self.constrain(v, t)
                    self.count("applied", op.id, -1, t.name)
                    break
            else:
                self.count("skipped", op.id, -1, t.name)
        return outs


def sharding_hook(mesh: Any, op_shardings: Iterable[Any], exact_shapes: bool = True
                  ) -> tuple[Hook, dict[str, int]]:
    """A :meth:`FlatProgram.evaluate` hook applying the plan's operator shardings.

    For every :class:`~autoplan.OpSharding` its ``"output"`` tensor's spec is applied with
    ``jax.lax.with_sharding_constraint`` to the operator's result of the same rank (and, with
    ``exact_shapes``, the same shape), and its operands' specs (the ``"input"`` and ``"weight"``
    tensors, in operand order) to its operands before it runs. Pinning the operands makes XLA
    reshard where the plan does, with the collectives the plan costed: left free, XLA's sharding
    propagation may move the resharding elsewhere (gathering an activation before every matmul
    instead of the token ids once). A spec whose mesh axes do not divide the value's dimensions
    (a micro-batch smaller than the plan's batch, say), or recorded for an operator of another
    primitive, is skipped.

    Args:
        mesh: the ``jax.sharding.Mesh`` the specs name axes of.
        op_shardings: the plan's ``OpSharding`` entries to apply.
        exact_shapes: require the value's shape to equal the recorded one.

    Returns:
        The hook, and a dict counting ``applied`` and ``skipped`` result constraints and
        ``operands_applied`` and ``operands_skipped`` operand constraints (filled as the hook
        runs, i.e. while JAX traces the function; an operator traced again, say in a second
        program or a loop body traced twice, is counted once).
    """
    hook = _ShardingHook(mesh, op_shardings, exact_shapes)
    return hook, hook.counts
