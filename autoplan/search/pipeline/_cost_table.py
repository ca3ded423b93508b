"""The layer costs of the pipeline search at one micro-batch count: what every count's costing
shares (:class:`_Context`: the cluster, the submeshes and their logical meshes, the transfers
between stages) and the table of every layer kind's plan on every cell, the resharding between
layers and the tensors they pass each other (:class:`_Table`), from which stages are costed.

See :mod:`~autoplan.search.pipeline._pipeline` (steps 2 to 4 of its docstring).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autoplan._errors import SearchError
from autoplan._memo import per_owner, per_owner_and_args
from autoplan.costs._cluster import Cluster
from autoplan.costs._mesh import LogicalMesh, send_recv_time
from autoplan.plans._plan import Comm
from autoplan.search._parallel import Task, run_tasks
from autoplan.search.fold._layers import LayerGroup, loose_signature
from autoplan.search.intra._intra import make_logical_mesh, mesh_shapes_for
from autoplan.search.intra._pins import pins_key, resolve_pins
from autoplan.search.intra._reshard import reshard
from autoplan.search.pipeline._layer_costs import (
    LAYER_TIME_LIMIT,
    LayerCost,
    LayerPlans,
    _retimed,
    gradient_ops,
    layer_cost,
    layer_family_plans,
    layer_plans,
)
from autoplan.search.pipeline._microbatches import _aligned
from autoplan.tracing._graph import OpGraph


@per_owner
def _layer_plans_of(graph: OpGraph) -> dict[tuple, LayerPlans]:
    """The layer plans solved on ``graph`` (a step traced at one micro-batch size), shared by
    every search of it in this process: a layer's plan on a submesh and logical mesh depends on
    its operators, the submesh, the mesh, the micro-batch count, the pins and the time limit, and
    not on the memory budget, the schedule or the other options, so a search that changes only
    those (the Explorer's memory budget) re-solves none. Keyed by :meth:`_Table._plan_key`."""
    return {}


@per_owner
def _shared_of(graph: OpGraph) -> dict[tuple, _Shared]:
    """The budget-free costs of every table made on ``graph`` (:func:`_shared`)."""
    return {}


class _Shared:
    """What a table's costs depend on besides the memory budget and the schedule, kept across
    the searches of one traced step (:func:`_shared`): the layers' costs and the resharding
    between them here; what the search derives from them without the budget (the stage-DP
    arrays of a chain, the levers, the simulated timings, the composed layers) memoised on it
    by its own accessors (:func:`~autoplan._memo.memo`)."""

    def __init__(self, full: OpGraph):
        self.full = full  # (the key holds its id; kept so the id stays this graph's)
        self.local: dict[int, dict[int, int]] = {}
        self.dims: dict[int, dict[int, tuple]] = {}
        self.costs: dict[tuple, LayerCost | None] = {}
        self.pairs: dict[tuple, tuple] = {}
        self.terms: dict[tuple, _Terms | None] = {}
        self.pair_terms: dict[tuple, tuple[float, float, float]] = {}
        self.pair_kinds: dict[tuple[int, int], tuple] = {}


def _shared(ctx: _Context, graph: OpGraph, layers: list[LayerGroup], B: int) -> _Shared:
    """The :class:`_Shared` costs of a table of ``layers`` of ``graph`` at ``B`` micro-batches
    under ``ctx``: keyed by everything they read (the cluster, the submeshes and their logical
    meshes, the pins, the Megatron layout, the layer ILPs' time limit, the full-batch trace),
    and not by the memory budget or the schedule, so that a search changing only those (the
    Explorer's memory budget) costs nothing again."""
    pins = pins_key(ctx.pins)  # (in order: a later pin overrides an earlier one)
    if pins is None:  # (a pin value that is not hashable: nothing shared)
        return _Shared(ctx.full)
    key = (B, tuple(layers), ctx.cluster, tuple(ctx.submeshes),
           tuple(tuple(c) for c in ctx.configs), pins, ctx.megatron, ctx.time_limit, id(ctx.full))
    store = _shared_of(graph)
    got = store.get(key)
    if got is None or got.full is not ctx.full:
        got = store[key] = _Shared(ctx.full)
    return got


@per_owner_and_args
def _layer_subgraph(graph: OpGraph, ops: tuple[int, ...], name: str) -> OpGraph:
    """A layer's operators as a graph of their own, once per graph (the subgraph the layer
    plans of :func:`_layer_plans_of` were solved on)."""
    return graph.subgraph(ops, name=name)


class _Context:
    """What every micro-batch count's costing shares: the cluster, the submeshes and their
    logical-mesh variants, the options, and the solve counter."""

    def __init__(self, cluster: Cluster, full: OpGraph, submeshes: list[tuple[int, int]],
                 schedule: str, budget: float, time_limit: float, megatron: bool,
                 pins: Mapping[str, Any] | None = None):
        self.cluster, self.full, self.submeshes = cluster, full, submeshes
        self.num_hosts, self.devices_per_host = cluster.nodes, cluster.devices_per_node
        self.schedule, self.budget, self.time_limit, self.megatron = (
            schedule, budget, time_limit, megatron)
        self.pins = dict(pins or {})
        shapes_of = [mesh_shapes_for(n * m, n, m) for n, m in submeshes]
        # a config is a logical mesh and a variant: the fastest plan, or the memory-lean one
        # (:func:`~autoplan.search.pipeline._layer_costs._lean_plan`), which the DP takes when
        # the fastest plans do not fit (Eq. 5)
        self.configs = [[(shape, lean) for lean in (False, True) for shape in shapes]
                        for shapes in shapes_of]
        self.C = max(len(c) for c in self.configs)
        self.views = [replace(cluster, nodes=n, devices_per_node=m) for n, m in submeshes]
        self._meshes: dict[tuple, LogicalMesh] = {}
        self._recv: dict[tuple[float, int], float] = {}  # recv_estimate's, by bytes and submesh
        self.solves = 0
        self.timed_out = 0  # layer ILPs stopped at their time limit
        self.mapped = 0  # layer plans taken from another kind's ILP (:func:`layer_family_plans`)
        self.groupings: list[list[list[int]]] | None = None  # the DAG stage ILP's, once
        self.levers = True  # ZeRO levels and rematerialisation where a stage does not fit

    def mesh(self, k: int, shape: tuple[int, ...]) -> LogicalMesh:
        key = (k, tuple(shape))
        if key not in self._meshes:
            self._meshes[key] = make_logical_mesh(self.views[k], shape)
        return self._meshes[key]

    def cells(self):
        """Every ``(submesh k, config c)``."""
        for k, cfgs in enumerate(self.configs):
            for c in range(len(cfgs)):
                yield k, c

    def transfer(self, nbytes: float, dst: int, cross: bool, dst_devices: int
                 ) -> tuple[float, float, float]:
        """Moving ``nbytes`` to a stage on submesh ``dst`` (``dst_devices`` devices): ``(seconds,
        send/recv bytes per receiving device, all-gather bytes)``, the cheaper of sending the
        whole tensor to each device and Alpa's send of 1/n slices followed by an all-gather on
        the receiving mesh.

        Across hosts the receiving devices of one host share its network link: each host's
        link carries what its devices receive (``m`` whole tensors, or ``m`` slices of
        ``1/n``), where inside a host each device has its own links."""
        if nbytes <= 0:
            return 0.0, 0.0, 0.0
        hosts = self.submeshes[dst][0]
        per_host = dst_devices // hosts if cross else 1
        whole = send_recv_time(self.cluster, nbytes * per_host, cross)
        if dst_devices <= 1:
            return whole, nbytes, 0.0
        sliced = send_recv_time(self.cluster, nbytes / dst_devices * per_host, cross)
        sliced += self.cluster.logical_mesh((dst_devices,), submesh=self.submeshes[dst]).all_gather(
            nbytes, [0])
        if whole <= sliced:
            return whole, nbytes, 0.0
        return sliced, nbytes / dst_devices, nbytes

    def recv_estimate(self, nbytes: float, k: int) -> float:
        """The stage DP's estimate of the time a stage on submesh ``k`` spends receiving
        ``nbytes`` from a neighbour: across hosts when the submesh spans whole hosts of a
        multi-host cluster (its neighbours then sit on other hosts), inside a host otherwise."""
        key = (nbytes, k)
        hit = self._recv.get(key)
        if hit is None:  # (a chain's boundaries pass the same bytes: kept per value)
            n, m = self.submeshes[k]
            hit = self._recv[key] = self.transfer(
                nbytes, k, self.num_hosts > 1 and m == self.devices_per_host, n * m)[0]
        return hit

    def crosses_hosts(self, devices: Iterable[int], other: Iterable[int]) -> bool:
        """Whether two stages' devices (cluster ids, ``host * devices_per_host + local``) sit
        on different sets of hosts (their transfers then cross hosts)."""
        per_host = self.devices_per_host
        return {d // per_host for d in devices} != {d // per_host for d in other}


@dataclass
class _Terms:
    """One stage (or layer) on one cell: per micro-batch and per step."""

    forward: float
    backward: float
    step: float
    resident: float
    activation: float


class _Table:
    """Layer costs at one micro-batch count: every layer kind's plan on every cell, solved lazily
    and once per kind; the resharding between layers; the tensors layers pass each other."""

    def __init__(self, ctx: _Context, graph: OpGraph, layers: list[LayerGroup], B: int):
        self.ctx, self.graph, self.layers, self.B = ctx, graph, layers, B
        self.L = len(layers)
        # a layer kind: the layers of one structure whose inputs the user's pins fix alike (a
        # layer pinned otherwise is a kind of its own); the kind's first layer is solved for all
        self.kind = self._kinds()
        self.rep: dict[Hashable, int] = {}
        for ly in layers:
            self.rep.setdefault(self.kind[ly.index], ly.index)
        self.family = self._families()
        layer_of = np.full(len(graph.ops), -1, dtype=np.int64)
        for ly in layers:
            layer_of[list(ly.ops)] = ly.index
        self.layer_of = layer_of
        self.screenable = graph is not ctx.full and _aligned(graph, ctx.full)
        # (:meth:`_plan_key`: the layer kind's first layer on submesh k, mesh shape, options)
        self._solved = _layer_plans_of(graph)
        self._keys: dict[tuple, tuple] = {}  # (rep, k, shape) -> its _plan_key
        self.reused = 0  # layer plans found solved already (by an earlier search or table)
        self._mine: set[tuple] = set()  # the keys this table has used
        # (costs that do not read the memory budget or the schedule: kept across searches)
        self.shared = shared = _shared(ctx, graph, layers, B)
        self._local, self._dims, self._costs = shared.local, shared.dims, shared.costs
        self._pairs, self._terms, self._pair_terms = shared.pairs, shared.terms, shared.pair_terms
        self._pair_kinds = shared.pair_kinds
        self._passing = None
        self._tensors = None

    # ---- layers and their solutions ----------------------------------------------------------
    def sub(self, li: int) -> OpGraph:
        return _layer_subgraph(self.graph, self.layers[li].ops,
                               f"{self.graph.name}:{self.layers[li].name}")

    def local(self, li: int) -> dict[int, int]:
        """Layer ``li``'s subgraph tensor of each graph tensor it touches."""
        if li not in self._local:
            sub, ops, out = self.sub(li), self.graph.ops, {}
            for k, op in enumerate(sub.ops):
                g = ops[sub.origin[k]]
                for lt, gt in zip(op.inputs, g.inputs):
                    if lt is not None:
                        out[gt] = lt
                for lt, gt in zip(op.outputs, g.outputs):
                    out[gt] = lt
            self._local[li] = out
        return self._local[li]

    def _batch_dims(self, li: int) -> Callable[[int], tuple]:
        """Subgraph tensor -> its ``(dimension, full-batch size)`` pairs that scale with the
        batch (found by comparing this trace with the full-batch one)."""
        if li not in self._dims:
            full, out = self.ctx.full.tensors, {}
            for gt, lt in self.local(li).items():
                a, b = full[gt].shape, self.graph.tensors[gt].shape
                dims = tuple((d, x) for d, (x, y) in enumerate(zip(a, b)) if x != y)
                if dims:
                    out[lt] = dims
            self._dims[li] = out
        dims = self._dims[li]
        return lambda t: dims.get(t, ())

    def _transient(self, li: int) -> frozenset[int]:
        """Layer ``li``'s subgraph inputs made by another layer's backward or update operators."""
        g = self.graph
        return frozenset(gi.tensor for gi in self.sub(li).inputs if gi.kind == "activation"
                         and g.ops[g.tensors[int(gi.path[1:])].producer].role != "forward")

    def result(self, li: int, k: int, c: int):
        """The intra-op result of layer ``li``'s kind on cell ``(k, c)`` (the kind's first layer
        solved; its ids line up with every layer of the kind); None where the pins cannot hold
        on that cell's mesh."""
        shape, lean = self.ctx.configs[k][c]
        key = self._plan_key(self.rep[self.kind[li]], k, shape)
        got = self._seen(key)
        if got is None or (lean and not got.lean_solved):
            self.solve_cells([(li, k, c)], 1)
            got = self._solved[key]
        return got.lean if lean else got.fast

    def _plan_key(self, rep: int, k: int, shape: tuple[int, ...]) -> tuple:
        """What layer ``rep``'s plans on submesh ``k`` and mesh ``shape`` depend on: the layer's
        operators, the submesh (as a cluster), the mesh, and :meth:`_solve_options` (once per
        cell of this table: the pins are matched against the layer's inputs to make it)."""
        key = self._keys.get((rep, k, shape))
        if key is None:
            opts = self._solve_options(rep, k, shape)
            # (the pins in order: a later pin overrides an earlier one; a pin value that is not
            # hashable gets a key of its own, never another search's)
            pins = pins_key(opts["pins"])
            key = self._keys[(rep, k, shape)] = (
                self.layers[rep].ops, self.layers[rep].name, self.ctx.views[k], tuple(shape),
                opts["B"], object() if pins is None else pins, opts["time_limit"])
        return key

    def _seen(self, key: tuple) -> LayerPlans | None:
        """The layer plans solved for ``key`` so far (in this search or an earlier one)."""
        got = self._solved.get(key)
        if got is not None and key not in self._mine:
            self._mine.add(key)
            self.reused += 1
        return got

    def _solve_options(self, rep: int, k: int, shape: tuple[int, ...]) -> dict[str, Any]:
        return {"B": self.B, "pins": self._pins(rep, k, shape),
                "time_limit": min(self.ctx.time_limit, LAYER_TIME_LIMIT)}

    def _store(self, key: tuple, got: LayerPlans) -> None:
        self._solved[key] = got
        self._mine.add(key)
        self.ctx.solves += got.solves
        self.ctx.timed_out += got.timed_out
        self.ctx.mapped += got.mapped

    def solve_cells(self, cells: Iterable[tuple[int, int, int]], workers: int) -> None:
        """Solve the layer plans of ``(layer, k, c)`` cells not solved yet, as independent tasks
        on ``workers`` processes (:func:`~autoplan.search._parallel.run_tasks`; one task per
        layer kind, submesh and logical mesh: its fastest plan and, where a cell asks for it,
        the memory-lean one). A kind of another's family (:attr:`family`) rides with that
        kind's task (:func:`layer_family_plans`: its plans are the family's taken onto its own
        subgraph where the two ILPs are one up to a constant, else solved). Each layer kind's
        subgraph travels to a worker once (a family member's with each task it rides in). What
        each task gives is what it would give in this process."""
        want: dict[tuple, list] = {}  # the task's kind's key -> [rep, k, shape, lean, members]
        for li, k, c in cells:
            shape, lean = self.ctx.configs[k][c]
            kind = self.kind[li]
            rep = self.rep[kind]
            key = self._plan_key(rep, k, shape)
            got = self._seen(key)
            if got is not None and (got.lean_solved or not lean):
                continue
            head = self.family.get(kind)
            if head is None:
                task = want.setdefault(key, [rep, k, shape, False, {}])
            else:  # (the family's kind solves its lean variant too where this one wants it)
                hrep = self.rep[head]
                hkey = self._plan_key(hrep, k, shape)
                self._seen(hkey)  # (counted as reused where an earlier search solved it)
                task = want.setdefault(hkey, [hrep, k, shape, False, {}])
                task[4][key] = rep
            task[3] = task[3] or lean
        if not want:
            return
        tasks = []
        for key, (rep, k, shape, lean, members) in want.items():
            opts = {**self._solve_options(rep, k, shape), "lean": lean,
                    "fast": self._solved.get(key)}
            where = (f"on submesh {'x'.join(map(str, self.ctx.submeshes[k]))}, mesh "
                     f"{'x'.join(map(str, shape))}")
            if members:
                opts["members"] = tuple((self.sub(r), self._solved.get(mk))
                                        for mk, r in members.items())
                names = ", ".join(self.layers[r].name for r in members.values())
                tasks.append(Task(layer_family_plans, self.sub(rep), (self.ctx.views[k], shape),
                                  opts, label=f"layer ILP {self.layers[rep].name} (and {names}) "
                                              f"{where}"))
            else:
                tasks.append(Task(layer_plans, self.sub(rep), (self.ctx.views[k], shape), opts,
                                  label=f"layer ILP {self.layers[rep].name} {where}"))
        for (key, (*_, members)), out in zip(want.items(), run_tasks(tasks, workers=workers)):
            for category, message in out.warnings:
                warnings.warn(message, category, stacklevel=2)
            got = out.result()
            if not members:
                self._store(key, got)
                continue
            for k2, plans in zip((key, *members), got):
                self._store(k2, plans)

    def _user_pins(self, li: int) -> dict[str, Any]:
        """The user's pins that match layer ``li``'s inputs."""
        sub = self.sub(li)
        return {pat: spec for pat, spec in self.ctx.pins.items()
                if sub.find_inputs(pat, names_only=True)}

    def kind_index(self) -> tuple[list[int], np.ndarray]:
        """The first layer of each kind (:attr:`rep`, in the layers' order), and each layer's
        kind as an index into them. A layer's terms and levers on a cell are its kind's (kept
        once per kind), so per-kind arrays spread over the layers as ``values[index]``."""
        position = {kind: q for q, kind in enumerate(self.rep)}
        return list(self.rep.values()), np.array([position[kind] for kind in self.kind],
                                                 dtype=np.int64)

    def _families(self) -> dict[Hashable, Hashable]:
        """``{kind: the kind whose plans it takes}``: of the kinds that share a loose signature
        (:func:`~autoplan.search.fold._layers.loose_signature`: the first MoE layer that starts
        the auxiliary loss from ``0.0`` where the others add to it), every other one takes the
        plans of the kind with the most layers (the first of them), where the two ILPs are the
        same up to a constant on a cell (checked there). None where the user's pins or
        Megatron's layout fix inputs (their kinds are matched on the inputs' own names)."""
        if self.ctx.pins or self.ctx.megatron:
            return {}
        count = Counter(self.kind)
        groups: dict[str, list[Hashable]] = {}
        for kind, rep in self.rep.items():
            groups.setdefault(loose_signature(self.graph, self.layers[rep].ops), []).append(kind)
        out: dict[Hashable, Hashable] = {}
        for kinds in groups.values():
            head = max(kinds, key=count.__getitem__)  # (the first of the most layers)
            out.update({kind: head for kind in kinds if kind != head})
        return out

    def _kinds(self) -> list[Hashable]:
        """Each layer's kind: its structural signature, and where the user's pins fix some of
        its inputs, the spec each pinned input gets, by its position among the layer's inputs
        (which line up across the layers of one signature). Layers of one kind have one plan on
        a cell; a layer pinned unlike the others of its structure is solved on its own, its pins
        matched against its own inputs' names."""
        if not self.ctx.pins:
            return [ly.signature for ly in self.layers]
        out: list[Hashable] = []
        for ly in self.layers:
            mine = self._user_pins(ly.index)
            if not mine:
                out.append(ly.signature)
                continue
            sub = self.sub(ly.index)
            try:
                fixed = resolve_pins(sub, mine)
            except SearchError:  # (pins that only its PRNG keys match: its cells get no plan)
                out.append((ly.signature, ly.index))
                continue
            where = {gi.tensor: k for k, gi in enumerate(sub.inputs)}
            profile = pins_key({where[t]: fixed[t] for t in sorted(fixed, key=where.__getitem__)})
            # (a pin value that is not hashable: the layer is a kind of its own)
            out.append((ly.signature, profile if profile is not None else ly.index))
        return out

    def _pins(self, rep: int, k: int, shape: tuple[int, ...]) -> dict[str, Any] | None:
        """The pins that apply to layer ``rep``'s inputs: the user's, and Megatron's layout for
        the baseline (tensor parallelism over the logical mesh's inner axis)."""
        ctx, sub = self.ctx, self.sub(rep)
        out = self._user_pins(rep)
        if ctx.megatron:
            from autoplan.search.intra._pins import megatron_pins  # noqa: PLC0415

            out.update(megatron_pins(sub, shape[-1]) or {})
        return out or None

    def cost(self, li: int, k: int, c: int) -> LayerCost | None:
        sig = self.kind[li]
        key = (sig, k, c)
        if key not in self._costs:
            rep = self.rep[sig]
            shape = self.ctx.configs[k][c][0]
            res = self.result(li, k, c)
            self._costs[key] = None if res is None else layer_cost(
                res, self.sub(rep), self.ctx.mesh(k, shape),
                self._batch_dims(rep) if self.screenable else None, self._transient(rep))
        return self._costs[key]

    def terms(self, li: int, k: int, c: int, ratio: float = 1.0, B: int | None = None
              ) -> _Terms | None:
        """Layer ``li`` on cell ``(k, c)``; re-timed for micro-batches ``ratio`` times as large
        (``B`` of them) when ``ratio != 1``; None where the plan's splits do not divide."""
        key = (self.kind[li], k, c, ratio, B if ratio != 1.0 else None)
        if key in self._terms:
            return self._terms[key]
        lc = self.cost(li, k, c)
        if lc is None:
            out = None
        elif ratio == 1.0:
            out = _Terms(lc.forward, lc.backward, lc.step, lc.resident, lc.activation)
        elif not lc.feasible(B):
            out = None
        else:
            f, b, a = lc.rescaled(ratio, self.ctx.mesh(k, self.ctx.configs[k][c][0]))
            out = _Terms(f, b, lc.step, lc.resident, a)
        self._terms[key] = out
        return out

    # ---- what layers pass each other -----------------------------------------------------------
    def passing(self) -> dict[tuple[int, int], list[tuple[int, str]]]:
        """``{(producer layer, consumer layer): [(tensor, role of its first reader there)]}`` for
        every tensor one layer makes and another reads."""
        if self._passing is None:
            ops, consumers, layer_of = self.graph.ops, self.graph.consumers, self.layer_of
            out: dict[tuple[int, int], dict[int, str]] = {}
            for op in ops:
                a = int(layer_of[op.id])
                for t in op.outputs:
                    for c in consumers[t]:
                        b = int(layer_of[c])
                        if b != a and b >= 0:
                            out.setdefault((a, b), {}).setdefault(t, ops[c].role)
            self._passing = {k: list(v.items()) for k, v in out.items()}
        return self._passing

    def tensors(self) -> list[tuple[int, int, str, tuple[int, ...], float]]:
        """``(tensor, producer layer, producer role, consumer layers, bytes)`` of every tensor
        read outside the layer that made it."""
        if self._tensors is None:
            by_t: dict[int, tuple[int, set[int]]] = {}
            for (a, b), ts in self.passing().items():
                for t, _ in ts:
                    by_t.setdefault(t, (a, set()))[1].add(b)
            g = self.graph
            self._tensors = [(t, a, g.ops[g.tensors[t].producer].role, tuple(sorted(bs)),
                              float(g.tensors[t].nbytes)) for t, (a, bs) in sorted(by_t.items())]
        return self._tensors

    def _fold(self, a: int, b: int) -> tuple:
        """What the resharding from layer ``a`` to layer ``b`` depends on besides the cell: their
        kinds and the tensors passed (as their layers' own ids, with their readers' roles).
        Pairs of the same layer kinds passing the same tensors cost the same."""
        fold = self._pair_kinds.get((a, b))
        if fold is None:
            la, lb = self.local(a), self.local(b)
            fold = self._pair_kinds[(a, b)] = (
                self.kind[a], self.kind[b],
                tuple((la[t], lb[t], role) for t, role in self.passing().get((a, b), [])))
        return fold

    def pair(self, a: int, b: int, k: int, c: int) -> tuple[list[Comm], list[Comm], list[Comm]]:
        """The resharding of the tensors layer ``a`` passes to layer ``b`` on cell ``(k, c)``:
        from the spec ``a``'s plan gives each to the spec ``b``'s plan assumed for it, as
        ``(forward, backward, per-step)`` collectives by the role of its reader in ``b``."""
        key = (self._fold(a, b), k, c)
        hit = self._pairs.get(key)
        if hit is not None:
            return hit
        la, lb = self.local(a), self.local(b)
        entries = self.passing().get((a, b), [])
        ra, rb = self.result(a, k, c), self.result(b, k, c)
        out: tuple[list[Comm], list[Comm], list[Comm]] = ([], [], [])
        if ra is None or rb is None:  # no plan on this cell: the stage is impossible anyway
            self._pairs[key] = out
            return out
        sa, sb = ra.solution.specs, rb.solution.specs
        mesh = self.ctx.mesh(k, self.ctx.configs[k][c][0])
        for t, role in entries:
            src, dst = sa.get(la[t]), sb.get(lb[t])
            ten = self.graph.tensors[t]
            if src is None or dst is None or src == dst or not ten.shape:
                continue
            _, cs = reshard(src, dst, ten.shape, ten.dtype, mesh)
            out[0 if role == "forward" else 1 if role == "backward" else 2].extend(cs)
        self._pairs[key] = out
        return out

    def pair_terms(self, a: int, b: int, k: int, c: int, ratio: float = 1.0
                   ) -> tuple[float, float, float]:
        key = (self._fold(a, b), k, c, ratio)
        hit = self._pair_terms.get(key)
        if hit is None:
            fw, bw, st = self.pair(a, b, k, c)
            mesh = self.ctx.mesh(k, self.ctx.configs[k][c][0])
            hit = self._pair_terms[key] = (_retimed(fw, ratio, mesh, False),
                                           _retimed(bw, ratio, mesh, False),
                                           sum(x.time for x in st))
        return hit

    def stage(self, members: Sequence[int], k: int, c: int, ratio: float = 1.0,
              B: int | None = None) -> _Terms | None:
        """A stage of layers ``members`` on cell ``(k, c)``: the sum of its layers plus the
        resharding between them (None where a layer's plan does not divide)."""
        out = _Terms(0.0, 0.0, 0.0, 0.0, 0.0)
        for li in members:
            t = self.terms(li, k, c, ratio, B)
            if t is None:
                return None
            out.forward += t.forward
            out.backward += t.backward
            out.step += t.step
            out.resident += t.resident
            out.activation += t.activation
        inside = set(members)
        for a, b in self.passing():
            if a in inside and b in inside:
                f, bw, s = self.pair_terms(a, b, k, c, ratio)
                out.forward += f
                out.backward += bw
                out.step += s
        return out

    def weight_share(self, li: int) -> float:
        """The share of layer ``li``'s backward FLOPs that make its parameters' gradients
        (:func:`~autoplan.search.pipeline._layer_costs.gradient_ops`): ZB-H1's ``W`` pass, the
        rest being ``B``, the gradient of the layer's input. About a half for matmul layers
        (``dX = dY W^T`` and ``dW = X^T dY`` cost the same)."""
        ops, grads = self.graph.ops, gradient_ops(self.graph)
        bwd = self.layers[li].backward
        total = sum(ops[i].flops for i in bwd)
        return sum(ops[i].flops for i in bwd if i in grads) / total if total > 0 else 0.0

    def boundary_bytes(self, stage_of: Sequence[int], S: int) -> tuple[np.ndarray, np.ndarray]:
        """Per boundary between stage ``s`` and ``s + 1`` (``S - 1`` of them): the bytes of
        forward tensors sent on (once per boundary each crosses) and of backward tensors sent
        back."""
        fwd, bwd = np.zeros(max(S - 1, 0)), np.zeros(max(S - 1, 0))
        for _, a, role, bs, nbytes in self.tensors():
            sa = stage_of[a]
            far = max(stage_of[b] for b in bs)
            near = min(stage_of[b] for b in bs)
            if role == "forward" and far > sa:
                fwd[sa:far] += nbytes
            elif role == "backward" and near < sa:
                bwd[near:sa] += nbytes
        return fwd, bwd
