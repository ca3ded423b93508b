"""The operator graph: what :func:`autoplan.trace` builds from a training step's jaxpr.

An :class:`OpGraph` holds operators (:class:`OpNode`), the tensors flowing between them
(:class:`Tensor`), the graph inputs with their pytree paths (:class:`GraphInput`) and outputs. Its
``nx`` attribute is a ``networkx.DiGraph`` over operator ids whose edges carry the tensors passed.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from autoplan._dtype import dtype_bytes, is_key_dtype
from autoplan.tracing import _primitives

__all__ = ["Tensor", "OpNode", "GraphInput", "GraphOutput", "Layer", "OpGraph"]

ROLES = ("forward", "backward", "update")
#: primitives whose operands (``random_wrap``) or results (``random_unwrap``) are raw ``uint32``
#: key data
_KEY_DATA_IN = frozenset({"random_wrap"})
_KEY_DATA_OUT = frozenset({"random_unwrap"})
#: primitives that draw random numbers (the primitive registry's view)
RANDOM_DRAWS = _primitives.RANDOM_DRAWS
#: The kinds a positional argument of a training step can have (one definition: workloads, plan
#: files and the plan checks read it).
ARG_KINDS = ("parameter", "optimizer_state", "batch", "key", "input")
INPUT_KINDS = ARG_KINDS + ("activation", "constant")


@dataclass(frozen=True)
class Tensor:
    """A value in the graph: an operator's output, a graph input, or a constant.

    Attributes:
        id: index in ``OpGraph.tensors``.
        shape: dimensions.
        dtype: dtype name.
        producer: the operator id that makes it, or -1 for graph inputs and constants.
    """

    id: int
    shape: tuple[int, ...]
    dtype: str
    producer: int = -1

    @cached_property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @cached_property
    def nbytes(self) -> int:
        return self.size * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class OpNode:
    """One operator (one jaxpr equation after flattening containers).

    Attributes:
        id: index in ``OpGraph.ops`` (also its ``nx`` node).
        primitive: the JAX primitive's name (``"dot_general"``); synthetic ops made by unrolling
            ``scan`` are ``"scan_slice"`` and ``"scan_stack"``; opaque control flow keeps
            ``"while"``/``"cond"``.
        params: the parameters that matter for sharding (dimension numbers, axes, shapes...), as
            plain Python values.
        inputs: tensor ids of the operands (``None`` for a literal).
        outputs: tensor ids of the results.
        flops: floating-point operations of one execution.
        scope: the ``jax.named_scope`` path, outermost first (``("layers_3", "attn")``).
        role: ``"forward"``, ``"backward"`` or ``"update"`` (optimizer step).
    """

    id: int
    primitive: str
    params: dict[str, Any]
    inputs: tuple[int | None, ...]
    outputs: tuple[int, ...]
    flops: float
    scope: tuple[str, ...]
    role: str
    in_shapes: tuple[tuple[int, ...] | None, ...] = ()
    out_shapes: tuple[tuple[int, ...], ...] = ()
    bytes_in: int = 0
    bytes_out: int = 0
    in_dtypes: tuple[str | None, ...] = ()
    out_dtypes: tuple[str, ...] = ()

    @property
    def scope_name(self) -> str:
        return "/".join(self.scope)

    def __repr__(self) -> str:
        shapes = ",".join("x".join(map(str, s)) if s is not None else "lit" for s in self.in_shapes)
        return f"OpNode({self.id}, {self.primitive}, in=[{shapes}], scope={self.scope_name!r}, {self.role})"


@dataclass(frozen=True)
class GraphInput:
    """A leaf of the traced function's arguments.

    Attributes:
        tensor: its tensor id.
        arg: which positional argument it belongs to.
        arg_name: that argument's name in the function's signature (``"params"``).
        path: ``jax.tree_util.keystr`` of the leaf within the argument (``"['layers'][3]['fc1']"``).
        kind: ``"parameter"``, ``"optimizer_state"``, ``"batch"``, ``"key"`` (a PRNG key:
            replicated, never sharded), ``"input"``, or (in a subgraph) ``"activation"`` for a tensor made by an operator outside it.
    """

    tensor: int
    arg: int
    arg_name: str
    path: str
    kind: str

    @property
    def name(self) -> str:
        return f"{self.arg_name}{self.path}"


@dataclass(frozen=True)
class GraphOutput:
    """A leaf of the traced function's result (tensor id and ``keystr`` path in the result)."""

    tensor: int
    path: str


@dataclass(frozen=True)
class Layer:
    """A layer found from the named scopes of its forward operators.

    Attributes:
        name: the scope name (``"layers_3"``; see :attr:`OpGraph.layer_names`).
        index: order of first appearance in the forward pass.
        forward: ids of its forward operators; ``backward`` likewise.
        flops: FLOPs of its forward and backward operators.
        params: names of the parameter inputs its forward operators read.
    """

    name: str
    index: int
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    flops: float
    params: tuple[str, ...]


@dataclass
class OpGraph:
    """An operator graph of one training step.

    ``len(graph)`` is the number of operators; ``graph.flops`` the FLOPs of one step;
    ``graph.layers`` the layers found from named scopes (``graph.layer_names`` per operator);
    ``graph.nx`` the ``networkx.DiGraph``.
    """

    ops: list[OpNode]
    tensors: list[Tensor]
    inputs: list[GraphInput]
    outputs: list[GraphOutput]
    name: str = "graph"
    consts: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    origin: list[int] | None = field(default=None, repr=False)
    #: the pytree structure of each positional argument of the traced step
    #: (:class:`autoplan.tracing._workload.ArgTree`), when traced from arguments
    arg_trees: tuple[Any, ...] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.ops)

    def __getitem__(self, i: int) -> OpNode:
        return self.ops[i]

    def __repr__(self) -> str:
        return (f"OpGraph({self.name!r}, ops={len(self)}, flops={self.flops:.3e}, "
                f"params={self.param_count:,}, layers={len(self.layers)})")

    # ---- derived structure -------------------------------------------------------------
    @cached_property
    def consumers(self) -> list[list[int]]:
        """For each tensor id, the ids of the operators that read it (in order, may repeat)."""
        users: list[list[int]] = [[] for _ in self.tensors]
        for op in self.ops:
            for t in op.inputs:
                if t is not None:
                    users[t].append(op.id)
        return users

    @cached_property
    def input_of_tensor(self) -> dict[int, GraphInput]:
        return {gi.tensor: gi for gi in self.inputs}

    @cached_property
    def nx(self) -> Any:
        """Operator-level DAG: node ids are op ids (attribute ``op``); an edge u->v carries the
        ids of the tensors u passes to v (``tensors``) and their total bytes (``bytes``)."""
        import networkx as nx  # noqa: PLC0415 - only this view needs it (and it imports queue)

        g = nx.DiGraph()
        for op in self.ops:
            g.add_node(op.id, op=op)
        for op in self.ops:
            for t in op.inputs:
                if t is None:
                    continue
                p = self.tensors[t].producer
                if p < 0:
                    continue
                if g.has_edge(p, op.id):
                    e = g.edges[p, op.id]
                    if t not in e["tensors"]:
                        e["tensors"].append(t)
                        e["bytes"] += self.tensors[t].nbytes
                else:
                    g.add_edge(p, op.id, tensors=[t], bytes=self.tensors[t].nbytes)
        return g

    @cached_property
    def key_tensors(self) -> frozenset[int]:
        """The tensors that hold PRNG keys, which are replicated on every device and never
        sharded: typed keys (dtype ``key<impl>``), graph inputs of kind ``"key"``, and raw
        ``uint32`` key data (what ``random_wrap`` reads and ``random_unwrap`` makes)."""
        out = {t.id for t in self.tensors if is_key_dtype(t.dtype)}
        out.update(gi.tensor for gi in self.inputs if gi.kind == "key")
        for op in self.ops:
            if op.primitive in _KEY_DATA_IN:
                out.update(t for t in op.inputs if t is not None)
            elif op.primitive in _KEY_DATA_OUT:
                out.update(op.outputs)
        return frozenset(out)

    @cached_property
    def random_draws(self) -> tuple[int, ...]:
        """The operators that draw random numbers (``random_bits``, ``threefry2x32``,
        ``rng_bit_generator``): a step with any draws different numbers when it runs once per
        micro-batch."""
        return tuple(op.id for op in self.ops if op.primitive in RANDOM_DRAWS)

    @cached_property
    def flops(self) -> float:
        """The FLOPs of one step (every plan of a search reads it)."""
        return float(sum(op.flops for op in self.ops))

    def flops_by_role(self) -> dict[str, float]:
        out = dict.fromkeys(ROLES, 0.0)
        for op in self.ops:
            out[op.role] += op.flops
        return out

    def inputs_of_kind(self, kind: str) -> list[GraphInput]:
        return [gi for gi in self.inputs if gi.kind == kind]

    @property
    def param_count(self) -> int:
        return sum(self.tensors[gi.tensor].size for gi in self.inputs_of_kind("parameter"))

    @property
    def param_bytes(self) -> int:
        return sum(self.tensors[gi.tensor].nbytes for gi in self.inputs_of_kind("parameter"))

    def bytes_of_kind(self, kind: str) -> int:
        return sum(self.tensors[gi.tensor].nbytes for gi in self.inputs_of_kind(kind))

    @cached_property
    def layer_names(self) -> list[str | None]:
        """For each operator, the named-scope layer it belongs to, or None.

        A layer is a named scope at the depth where the model's forward pass is a sequence of
        distinct scopes: the shallowest depth ``d`` (0 to 3) at which, among the forward
        operators under the most common scope prefix of length ``d``, the scope names at depth
        ``d``

        * are at least two,
        * each cover one contiguous run of the forward pass (operators without a name there may
          sit in between), and
        * hold at least half of the forward FLOPs.

        A layer's name is its scope path down to depth ``d`` joined by ``/``: ``"layers_3"``
        for ``jax.named_scope("layers_3")``, ``"Mixer/MixerBlock_0"`` for a Flax linen block
        inside the model's root module, ``"scan_2"`` for iteration 2 of an unrolled
        ``lax.scan``. Scopes that name a kind of layer rather than one (Equinox's
        ``eqx.nn.Linear``, ``jnp.einsum``'s subscripts) recur along the forward pass and are not
        layers. Every operator gets the layer whose scope path appears in its own (the backward
        pass keeps the forward pass's scopes; the backward of a rematerialised block repeats the
        enclosing ones, ``Mixer/Mixer/MixerBlock_0/...``). All None when no depth qualifies.
        """
        fwd = [op for op in self.ops if op.role == "forward"]
        total = sum(op.flops for op in fwd) or 1.0
        # the forward pass as runs of operators with one scope path: (path, their FLOPs in
        # order); the sums below add the same terms in the same order as a pass over operators
        spans: list[tuple[tuple[str, ...], list[float]]] = []
        for op in fwd:
            if not spans or spans[-1][0] != op.scope:
                spans.append((op.scope, [op.flops]))
            else:
                spans[-1][1].append(op.flops)
        for d in range(4):
            share: dict[tuple[str, ...], float] = {}
            for sc, fl in spans:
                if len(sc) > d:
                    s = share.get(sc[:d], 0.0)
                    for f in fl:
                        s = s + f + 1e-9
                    share[sc[:d]] = s
            if not share:
                break
            prefix = max(share, key=share.__getitem__)
            runs: list[str] = []
            covered = 0.0
            for sc, fl in spans:
                if len(sc) > d and sc[:d] == prefix:
                    for f in fl:
                        covered += f
                    if not runs or runs[-1] != sc[d]:
                        runs.append(sc[d])
            if len(set(runs)) < 2 or len(set(runs)) != len(runs) or covered < 0.5 * total:
                continue
            paths = {prefix + (name,) for name in runs}
            out: list[str | None] = []
            name_of: dict[tuple[str, ...], str | None] = {}  # per scope path (ops share them)
            for op in self.ops:
                sc = op.scope
                if sc in name_of:
                    out.append(name_of[sc])
                    continue
                # (the scope path may sit deeper than in the forward pass: the backward of a
                # rematerialised block repeats the enclosing scopes)
                hit = next((sc[j:j + d + 1] for j in range(len(sc) - d)
                            if sc[j:j + d + 1] in paths), None)
                name_of[sc] = name = "/".join(hit) if hit is not None else None
                out.append(name)
            return out
        return [None] * len(self.ops)

    @cached_property
    def layer_order(self) -> tuple[str, ...]:
        """The names of :attr:`layers` in their order: the layers of forward operators as they
        first appear, then those only backward operators are in (made without the layers)."""
        names = self.layer_names
        roles = [op.role for op in self.ops]
        forward = dict.fromkeys(n or "(root)" for n, r in zip(names, roles) if r == "forward")
        rest = dict.fromkeys(n or "(root)" for n, r in zip(names, roles)
                             if r != "forward" and r != "update")
        return tuple(forward) + tuple(n for n in rest if n not in forward)

    @cached_property
    def layers(self) -> list[Layer]:
        """The named-scope layers (see :attr:`layer_names`) of the forward and backward
        operators, in forward order.

        Operators outside every layer are collected in a layer named ``"(root)"``; the optimizer
        update is not a layer (its operators have role ``"update"``). The layers the pipeline
        search cuts between are :func:`autoplan.algorithms.group_layers`'s: these named-scope
        layers where the model has them, else its repeated blocks found by mining.
        """
        fwd: dict[str, list[int]] = {}
        bwd: dict[str, list[int]] = {}
        flops: dict[str, float] = {}
        params: dict[str, list[str]] = {}
        names = self.layer_names
        for op in self.ops:
            if op.role == "update":
                continue
            name = names[op.id] or "(root)"
            (fwd if op.role == "forward" else bwd).setdefault(name, []).append(op.id)
            flops[name] = flops.get(name, 0.0) + op.flops
            if op.role == "forward":
                for t in op.inputs:
                    gi = self.input_of_tensor.get(t) if t is not None else None
                    if gi is not None and gi.kind == "parameter":
                        lst = params.setdefault(name, [])
                        if gi.name not in lst:
                            lst.append(gi.name)
        return [
            Layer(name, k, tuple(fwd.get(name, ())), tuple(bwd.get(name, ())),
                  flops.get(name, 0.0), tuple(params.get(name, ())))
            for k, name in enumerate(self.layer_order)
        ]

    @cached_property
    def fingerprint(self) -> str:
        """A hash of the graph's inputs (paths, shapes, dtypes) and operator count: plan files
        record it so that a plan made for another model is refused."""
        h = hashlib.sha256()
        for gi in self.inputs:
            t = self.tensors[gi.tensor]
            h.update(f"{gi.arg_name}{gi.path}:{t.shape}:{t.dtype};".encode())
        return h.hexdigest()[:16]

    @cached_property
    def structure_hash(self) -> str:
        """A hash of everything a search reads from the graph: the :attr:`fingerprint`, the name,
        the inputs (argument, path, kind), outputs, constants and origin, and every operator
        (primitive, parameters, operand and result tensors with their shapes and dtypes, FLOPs,
        scope, role) and tensor. The same step traced twice hashes alike; a graph that differs in
        any operator does not. The plan cache keys searches by it."""
        h = hashlib.sha256()
        h.update(f"{self.fingerprint}|{self.name}|{self.consts}|{self.origin}\n".encode())
        for gi in self.inputs:
            h.update(f"{gi.tensor},{gi.arg},{gi.arg_name},{gi.path},{gi.kind};".encode())
        for go in self.outputs:
            h.update(f"{go.tensor},{go.path};".encode())
        h.update("\n".join(f"{t.shape}{t.dtype}{t.producer}" for t in self.tensors).encode())
        h.update("\n".join(
            repr((op.primitive, op.params, op.inputs, op.outputs, op.flops, op.scope, op.role,
                  op.in_shapes, op.in_dtypes, op.bytes_in, op.bytes_out)) for op in self.ops
        ).encode())
        return h.hexdigest()

    def subgraph(self, op_ids: Sequence[int], name: str | None = None) -> OpGraph:
        """The operators ``op_ids`` as a graph of their own (a pipeline stage, a layer).

        Tensors made outside and read inside become inputs: graph inputs keep their path and
        kind; activations from other operators become inputs of kind ``"activation"`` named
        ``%<tensor id>``. Tensors read outside or that were graph outputs become outputs.
        ``origin`` maps new operator ids to the original ones.
        """
        keep = sorted(set(op_ids))
        inside = set(keep)
        tmap: dict[int, int] = {}
        tensors: list[Tensor] = []
        inputs: list[GraphInput] = []

        def tensor(t: int, producer: int) -> int:
            if t not in tmap:
                old = self.tensors[t]
                tmap[t] = len(tensors)
                tensors.append(Tensor(len(tensors), old.shape, old.dtype, producer))
            return tmap[t]

        ops: list[OpNode] = []
        new_id = {o: i for i, o in enumerate(keep)}
        for o in keep:
            op = self.ops[o]
            ins = []
            for t in op.inputs:
                if t is None:
                    ins.append(None)
                    continue
                p = self.tensors[t].producer
                if t not in tmap:
                    nt = tensor(t, -1 if p not in inside else new_id[p])
                    if p not in inside:
                        gi = self.input_of_tensor.get(t)
                        if gi is not None:
                            inputs.append(GraphInput(nt, gi.arg, gi.arg_name, gi.path, gi.kind))
                        else:
                            inputs.append(GraphInput(nt, -1, "activation", f"%{t}", "activation"))
                ins.append(tmap[t])
            outs = tuple(tensor(t, new_id[o]) for t in op.outputs)
            ops.append(OpNode(**{**op.__dict__, "id": new_id[o], "inputs": tuple(ins), "outputs": outs}))
        graph_outs = {go.tensor: go.path for go in self.outputs}
        outputs = []
        for t_old, t_new in tmap.items():
            p = self.tensors[t_old].producer
            if p not in inside:
                continue
            outside_use = any(c not in inside for c in self.consumers[t_old])
            if t_old in graph_outs:
                outputs.append(GraphOutput(t_new, graph_outs[t_old]))
            elif outside_use:
                outputs.append(GraphOutput(t_new, f"%{t_old}"))
        return OpGraph(ops=ops, tensors=tensors, inputs=inputs, outputs=outputs,
                       name=name or f"{self.name}[sub]", origin=keep)

    def find_inputs(self, pattern: str, *, names_only: bool = False) -> list[GraphInput]:
        """Graph inputs whose name (``params['layers'][3]['fc1']['kernel']``) or path matches the
        regular expression ``pattern`` (``re.search``); with ``names_only`` the name alone."""
        rx = re.compile(pattern)
        if names_only:
            return [gi for gi in self.inputs if rx.search(gi.name)]
        return [gi for gi in self.inputs if rx.search(gi.name) or rx.search(gi.path)]

    def summary(self) -> str:
        """A human-readable summary: operators by role, FLOPs, parameters, layers."""
        by_role = {r: 0 for r in ROLES}
        for op in self.ops:
            by_role[op.role] += 1
        prims: dict[str, int] = {}
        for op in self.ops:
            prims[op.primitive] = prims.get(op.primitive, 0) + 1
        top = sorted(prims.items(), key=lambda kv: -kv[1])[:8]
        lines = [
            f"graph {self.name}: {len(self)} operators "
            f"({by_role['forward']} forward, {by_role['backward']} backward, {by_role['update']} update)",
            f"  FLOPs per step : {self.flops:.4e}",
            f"  parameters     : {self.param_count:,} ({_fmt_bytes(self.param_bytes)})",
            f"  optimizer state: {_fmt_bytes(self.bytes_of_kind('optimizer_state'))}",
            f"  batch          : {_fmt_bytes(self.bytes_of_kind('batch'))}",
        ]
        keys = self.inputs_of_kind("key")
        if keys:
            lines.append(f"  PRNG keys      : {len(keys)} leaves "
                         f"({_fmt_bytes(self.bytes_of_kind('key'))}), replicated")
        lines.append("  top primitives : " + ", ".join(f"{k} x{v}" for k, v in top))
        layers = self.layers
        names = [ly.name for ly in layers]
        lines.append(f"  layers ({len(layers)}): " + _compress_names(names))
        return "\n".join(lines)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _compress_names(names: Sequence[str]) -> str:
    """``[embed, layers_0 .. layers_23, head]``: runs of ``prefix_i`` shown as ranges."""
    out: list[str] = []
    i = 0
    while i < len(names):
        m = re.fullmatch(r"(.*)_(\d+)", names[i])
        j = i
        if m:
            pre, k = m.group(1), int(m.group(2))
            while j + 1 < len(names):
                m2 = re.fullmatch(r"(.*)_(\d+)", names[j + 1])
                if not (m2 and m2.group(1) == pre and int(m2.group(2)) == k + (j + 1 - i)):
                    break
                j += 1
        out.append(names[i] if j - i < 2 else f"{names[i]} .. {names[j]}")
        if 0 < j - i < 2:
            out.extend(names[i + 1:j + 1])
        i = j + 1
    return ", ".join(out)
