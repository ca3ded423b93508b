"""The Plan: plain, frozen data that search produces and viz/exec read.

A :class:`Plan` records, for one training step on one cluster: its pipeline stages (one stage for
an intra-operator-only plan), each stage's submesh and logical mesh, the PartitionSpec of every
graph input (parameters, optimizer state, batch) keyed by pytree path, the sharding of the heavy
operators (dot/conv: their strategy and tensor specs), the schedule, and the predictions.

Specs are stored as tuples with one entry per tensor dimension: ``None`` (replicated along that
dimension) or a tuple of mesh-axis names (``("x",)``, ``("x", "y")``), the same information as a
``jax.sharding.PartitionSpec``. ``Plan.to_json()``/``Plan.from_json()`` round-trip exactly.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from ._cluster import Cluster
from ._errors import ArgumentError, ArgumentTypeError, PlanFileError, PlanMismatchError
from ._frozen import FrozenDict, freeze_fields
from ._io import atomic_write_text
from ._planfile import read_plan_json, validate_plan_dict

__all__ = ["SCHEMA_VERSION", "LEVELS", "Spec", "TensorSharding", "Comm", "OpSharding", "InputSpec", "Stage",
           "Schedule", "Predicted", "Plan", "require_plan", "spec_to_pspec", "pspec_to_spec", "spec_str"]

SCHEMA_VERSION = 1
LEVELS = ("auto", "exhaustive", "hierarchical", "folded")
"""The search levels a plan's ``level`` names, in the order the options list them: ``"auto"``
picks one of the other three (see :mod:`autoplan.search.fold._levels`)."""
Spec = tuple  # tuple[None | tuple[str, ...], ...]


def spec_to_pspec(spec: Spec):
    """Our spec tuple -> ``jax.sharding.PartitionSpec``."""
    from jax.sharding import PartitionSpec  # noqa: PLC0415

    entries = []
    for e in spec:
        if not e:
            entries.append(None)
        elif len(e) == 1:
            entries.append(e[0])
        else:
            entries.append(tuple(e))
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def pspec_to_spec(pspec, ndim: int) -> Spec:
    """``PartitionSpec`` -> our spec tuple of length ``ndim``."""
    out: list = []
    for e in tuple(pspec):
        if e is None:
            out.append(None)
        elif isinstance(e, str):
            out.append((e,))
        else:
            out.append(tuple(e))
    out += [None] * (ndim - len(out))
    return tuple(out[:ndim])


def spec_str(spec: Spec) -> str:
    """Alpa's notation: ``S^x R`` style, written ``S(x)R`` / ``S(xy)``; ``R`` when replicated."""
    parts = []
    for e in spec:
        parts.append("R" if not e else "S(" + ",".join(e) + ")")
    return "".join(parts) if parts else "scalar"


def _norm_spec(spec) -> Spec:
    return tuple(None if not e else tuple(e) for e in spec)


@dataclass(frozen=True)
class TensorSharding:
    """One tensor of an operator, for the sharding view.

    Attributes:
        name: a readable name (``params['layers'][0]['mlp']['fc1']['kernel']`` or ``%123``).
        role: ``"input"``, ``"weight"`` or ``"output"``.
        shape: global shape.
        dtype: dtype name.
        spec: per-dimension mesh axes.
    """

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    spec: Spec

    def __post_init__(self) -> None:
        freeze_fields(self)

    def tiles(self, mesh_shape: Sequence[int], axis_names: Sequence[str]) -> int:
        used = {a for e in self.spec if e for a in e}
        return math.prod(s for s, n in zip(mesh_shape, axis_names) if n in used)


@dataclass(frozen=True)
class Comm:
    """A predicted communication: ``kind`` (a collective), ``bytes``, mesh ``axes``, ``time``
    in seconds, and ``where`` (``"op"``, ``"reshard"``, ``"grad-sync"``, ``"cross-stage"``)."""

    kind: str
    bytes: float
    axes: tuple[str, ...]
    time: float
    where: str = "op"

    def __post_init__(self) -> None:
        freeze_fields(self)


@dataclass(frozen=True)
class OpSharding:
    """The chosen strategy of one (heavy) operator.

    Attributes:
        op: operator id in the traced graph.
        primitive: ``dot_general``, ``conv_general_dilated``...
        scope: its named-scope path.
        layer: its layer's name.
        role: forward / backward / update.
        strategy: the strategy's name (Alpa's notation, e.g. ``RS(y) x S(y)R -> RR (all-reduce y)``).
        tensors: its operands and result with their specs.
        comm: the communication the strategy itself needs.
        flops: FLOPs of the operator.
    """

    op: int
    primitive: str
    scope: str
    layer: str
    role: str
    strategy: str
    tensors: tuple[TensorSharding, ...]
    comm: tuple[Comm, ...] = ()
    flops: float = 0.0

    def __post_init__(self) -> None:
        freeze_fields(self)



@dataclass(frozen=True)
class InputSpec:
    """The sharding of one graph input (a parameter, optimizer-state or batch leaf).

    Attributes:
        arg: positional argument index; ``arg_name`` its name; ``path`` its ``keystr`` in it.
        kind: ``parameter``, ``optimizer_state``, ``batch`` or ``input``.
        shape, dtype: the leaf's.
        spec: per-dimension mesh axes.
        stage: the pipeline stage that holds it (0 for intra-op plans).
    """

    arg: int
    arg_name: str
    path: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    spec: Spec
    stage: int = 0

    def __post_init__(self) -> None:
        freeze_fields(self)

    @property
    def name(self) -> str:
        return f"{self.arg_name}{self.path}"


@dataclass(frozen=True)
class Stage:
    """One pipeline stage (the whole model for an intra-op plan).

    Attributes:
        index: stage number.
        layers: names of its layers, in order; ``layer_range`` their [start, end) indices.
        submesh_shape: the shape of its physical submesh, (hosts, devices per host);
            ``device_ids`` the cluster devices it uses.
        mesh_shape: its logical mesh; ``axis_names`` the mesh-axis names.
        ops: shardings of its heavy operators.
        forward_time, backward_time: predicted seconds per micro-batch.
        memory: predicted peak bytes per device.
        comm_bytes: predicted communication bytes per device by collective kind (one step).
    """

    index: int
    layers: tuple[str, ...]
    layer_range: tuple[int, int]
    submesh_shape: tuple[int, int]
    device_ids: tuple[int, ...]
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    ops: tuple[OpSharding, ...] = ()
    forward_time: float = 0.0
    backward_time: float = 0.0
    memory: float = 0.0
    comm_bytes: Mapping[str, float] = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        freeze_fields(self)

    @property
    def num_devices(self) -> int:
        return len(self.device_ids)

    @property
    def submesh(self) -> tuple[int, int]:
        """Deprecated name of :attr:`submesh_shape` (it is a shape, not a mesh)."""
        warnings.warn("Stage.submesh is deprecated: it is the submesh's shape (hosts, devices per "
                      "host); use Stage.submesh_shape.", DeprecationWarning, stacklevel=2)
        return self.submesh_shape


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule.

    Attributes:
        kind: ``"gpipe"`` or ``"1f1b"`` (``"none"`` for a single stage).
        microbatches: number of micro-batches.
        num_stages: number of stages.
        table: rows = clock ticks, columns = meshes; entries ``(micro-batch, stage, kind)`` or None.
        events: ``(start, end, mesh, micro-batch, stage, kind)`` with predicted times.
    """

    kind: str
    microbatches: int
    num_stages: int
    table: tuple[tuple[tuple[int, int, str] | None, ...], ...] = ()
    events: tuple[tuple[float, float, int, int, int, str], ...] = ()

    def __post_init__(self) -> None:
        freeze_fields(self)


@dataclass(frozen=True)
class Predicted:
    """The cost model's predictions for one training step.

    Attributes:
        step_time: seconds per step.
        throughput: samples per second.
        memory_per_device: peak bytes on the busiest device.
        compute_time: seconds of computation on the critical path.
        comm_time: seconds of communication on the critical path (by kind in ``comm_time_by_kind``).
        comm_bytes: bytes communicated per device by collective kind.
        comm_by_axis: bytes by mesh axis name.
        bubble_fraction: idle fraction of the pipeline.
        mfu: model FLOPs utilisation (graph FLOPs / (step_time . devices . peak)).
    """

    step_time: float
    throughput: float
    memory_per_device: float
    compute_time: float = 0.0
    comm_time: float = 0.0
    comm_bytes: Mapping[str, float] = field(default_factory=FrozenDict)
    comm_by_axis: Mapping[str, float] = field(default_factory=FrozenDict)
    comm_time_by_kind: Mapping[str, float] = field(default_factory=FrozenDict)
    bubble_fraction: float = 0.0
    mfu: float = 0.0

    def __post_init__(self) -> None:
        freeze_fields(self)


@dataclass(frozen=True)
class Plan:
    """A parallelisation plan for one training step on one cluster.

    Attributes:
        model: the workload or graph name; ``fingerprint`` the traced graph's fingerprint.
        cluster: the cluster planned for.
        stages: pipeline stages (one for an intra-operator plan).
        inputs: the spec of every graph input.
        schedule: the pipeline schedule.
        predicted: predictions.
        label: ``"autoplan"`` for a searched plan, or a baseline's name.
        level: the search level used.
        config: the workload's configuration (batch, layers, ...), when known.
        search_seconds: time the search took.
        jax_version: JAX version the plan was made with.
        notes: remarks of the search (the level used and why, fallbacks).
        arg_types: per positional argument of the step, the container types its pytree holds
            that the recorded paths cannot rebuild (``"flax.nnx.statelib.State"``, ``"None"``,
            ``"tuple"``, ...; see :class:`autoplan._workload.ArgTree`); empty for nested dicts
            and lists. Written to the plan file.
        analysis: the folding analysis of the graph the plan was searched on, as plain data
            (segments in model order with their mined classes, critical nodes, fold ratio, the
            ILPs and level of the search; see :mod:`autoplan.search.fold._summary`), or None.
            Written to the plan file (optional there: files without it read as None), so
            :func:`autoplan.viz.graph_figure` draws a plan file's mined subgraphs too.
        arg_trees: the argument pytrees' structures themselves, kept in memory by plans that a
            search made from a workload's arguments (not written to the plan file): the JAX
            views then return pytrees of the user's own types without ``like=``.
    """

    model: str
    fingerprint: str
    cluster: Cluster
    stages: tuple[Stage, ...]
    inputs: tuple[InputSpec, ...]
    schedule: Schedule
    predicted: Predicted
    label: str = "autoplan"
    level: str = "exhaustive"
    config: Mapping[str, Any] = field(default_factory=FrozenDict)
    search_seconds: float = 0.0
    jax_version: str = ""
    notes: tuple[str, ...] = ()
    arg_types: tuple[tuple[str, ...], ...] = ()
    analysis: Mapping[str, Any] | None = None
    arg_trees: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        freeze_fields(self)

    # ---- structure ---------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return sum(s.num_devices for s in self.stages)

    @property
    def is_pipeline(self) -> bool:
        return len(self.stages) > 1

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The logical mesh of the first stage (the only one for an intra-op plan)."""
        return self.stages[0].mesh_shape

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self.stages[0].axis_names

    @property
    def ops(self) -> tuple[OpSharding, ...]:
        return tuple(o for s in self.stages for o in s.ops)

    def input_spec(self, name: str) -> InputSpec:
        for i in self.inputs:
            if i.name == name or i.path == name:
                return i
        raise ArgumentError(f"Plan.input_spec: name should be the name or path of one of the plan's "
                            f"inputs. Got {name!r}. Fix: pass one of "
                            f"{[i.name for i in self.inputs][:8]}.")

    def describe(self) -> str:
        """A one-line description: stages and their logical meshes."""
        if not self.is_pipeline:
            desc = f"intra-op on mesh {'x'.join(map(str, self.mesh_shape))}"
            if self.schedule.microbatches > 1:
                desc += f", {self.schedule.microbatches} mb accumulated"
            return desc
        meshes = " | ".join(f"{len(s.layers)}L@{'x'.join(map(str, s.mesh_shape))}" for s in self.stages)
        return f"{len(self.stages)} stages ({self.schedule.kind}, {self.schedule.microbatches} mb): {meshes}"

    # ---- JAX views ---------------------------------------------------------------------
    def partition_specs(self, like: Any = None, stage: int | None = None) -> Any:
        """The PartitionSpec of every graph input as a pytree of the step's arguments, in the
        user's own container types (same treedef: ``nnx.State``, Equinox modules with their
        ``None`` leaves left ``None``, optax's named tuples, dataclasses).

        The structure comes from ``like`` when given, else from the arguments the search traced
        (a plan made by :func:`autoplan.search` in this process), else it is rebuilt as nested
        dicts and lists from the recorded paths, which is exact only for arguments made of
        dicts and lists (a plan file records which are not: :attr:`arg_types`).

        Args:
            like: the step's positional arguments (arrays or ``jax.ShapeDtypeStruct``s, one
                entry per argument; or the :class:`autoplan.Workload`); its structure is
                mirrored exactly.
            stage: only inputs held by this stage (the others get ``None``); default all.

        Returns:
            A tuple with one pytree of ``jax.sharding.PartitionSpec`` per positional argument.

        Raises:
            PlanMismatchError: ``like`` has another number of arguments or leaves the plan does
                not know, or the plan (loaded from a file) cannot rebuild an argument's types.

        Examples:
            >>> import autoplan
            >>> wl = autoplan.models.get("mlp", batch=512)
            >>> plan = autoplan.plan(wl, "cpu:8", pipeline=False)
            >>> params_specs, opt_state_specs, batch_specs = plan.partition_specs()
            >>> batch_specs  # the batch split over the mesh's first axis (data parallelism)
            {'labels': P('x',), 'x': P('x',)}
            >>> plan.partition_specs(like=wl.args)[0]["layers"][0]
            {'bias': P(), 'kernel': P()}
        """
        by_key = {(i.arg, i.path): i for i in self.inputs}
        nargs = 1 + max((i.arg for i in self.inputs), default=-1)

        def pick(i: InputSpec | None):
            if i is None or (stage is not None and i.stage != stage):
                return None
            return spec_to_pspec(i.spec)

        if like is not None:
            return tuple(t.treedef.unflatten([pick(by_key[(a, p)]) for p in t.paths])
                         for a, t in enumerate(self._like_trees(like, nargs, by_key)))
        if self.arg_trees is not None and len(self.arg_trees) == nargs:
            return tuple(t.treedef.unflatten([pick(by_key.get((a, p))) for p in t.paths])
                         for a, t in enumerate(self.arg_trees))
        for a, types in enumerate(self.arg_types):
            if types:
                name = next((i.arg_name for i in self.inputs if i.arg == a), f"argument {a}")
                raise PlanMismatchError(
                    f"partition_specs: argument {a} ({name}) of {self.model!r} is a pytree of "
                    f"{', '.join(types)}, which a plan file records by path only, so its structure "
                    "cannot be rebuilt without the arguments. Fix: pass like=<the step's "
                    "arguments> (arrays or jax.ShapeDtypeStructs, or the Workload), e.g. "
                    "plan.named_shardings(like=(params, opt_state, batch)).")
        trees: list[Any] = [None] * nargs
        for i in self.inputs:
            keys = _parse_keystr(i.path)
            if not keys:
                trees[i.arg] = pick(i)
                continue
            if trees[i.arg] is None:
                trees[i.arg] = [] if isinstance(keys[0], int) else {}
            _set_path(trees[i.arg], keys, pick(i))
        return tuple(trees)

    def _like_trees(self, like: Any, nargs: int, by_key: Mapping[tuple[int, str], InputSpec]
                    ) -> tuple[Any, ...]:
        """The :class:`autoplan._workload.ArgTree` of ``like``, checked against the plan."""
        from ._workload import arg_trees  # noqa: PLC0415

        if hasattr(like, "fn") and hasattr(like, "args"):
            like = like.args
        if not isinstance(like, tuple | list):
            raise PlanMismatchError(
                f"partition_specs: like should be the step's positional arguments as a tuple "
                f"({nargs} of them). Got {type(like).__name__}. Fix: like=(params, opt_state, "
                "batch), or like=workload.")
        if len(like) != nargs:
            raise PlanMismatchError(
                f"partition_specs: like should have {nargs} positional arguments as the plan "
                f"does. Got {len(like)}. Fix: pass the workload's args tuple.")
        trees = arg_trees(like)
        for a, t in enumerate(trees):
            for p in t.paths:
                if (a, p) not in by_key:
                    raise PlanMismatchError(
                        f"partition_specs: argument {a} has a leaf at {p!r} that the plan "
                        f"({self.model}) does not know. Fix: use the plan made for this model.")
            held = sum(1 for (arg, _) in by_key if arg == a)
            if held != len(t.paths):
                raise PlanMismatchError(
                    f"partition_specs: argument {a} has {len(t.paths)} leaves but the plan "
                    f"({self.model}) has {held}. Fix: use the plan made for this model.")
        return trees

    def mesh(self, devices: Sequence[Any] | None = None, stage: int = 0):
        """A ``jax.sharding.Mesh`` for ``stage`` over ``devices`` (default ``jax.devices()``),
        taking the stage's device ids in order; axis types Auto."""
        import jax  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415
        from jax.sharding import AxisType, Mesh  # noqa: PLC0415

        st = self.stages[stage]
        devs = list(devices) if devices is not None else jax.devices()
        if len(devs) < self.num_devices:
            raise PlanMismatchError(
                f"mesh: the plan uses {self.num_devices} devices but {len(devs)} are available. "
                "Fix: run on a machine with that many devices, set jax_num_cpu_devices, or make a "
                f"plan for {len(devs)} devices.")
        arr = np.array([devs[d] for d in st.device_ids], dtype=object).reshape(st.mesh_shape)
        return Mesh(arr, st.axis_names, axis_types=(AxisType.Auto,) * len(st.axis_names))

    def named_shardings(self, mesh=None, like: Any = None, stage: int | None = None) -> Any:
        """``NamedSharding`` pytrees of the step's arguments, in the user's own container types
        (see :meth:`partition_specs`), ready for ``jax.jit(step, in_shardings=...)`` and
        ``jax.device_put(args, ...)``. ``None`` stays ``None`` (an Equinox module's non-array
        fields; with ``stage``, the leaves other stages hold).

        Args:
            mesh: the ``jax.sharding.Mesh`` (default :meth:`mesh` of ``stage``, or of stage 0).
            like: the step's arguments, as for :meth:`partition_specs`.
            stage: only the inputs this stage holds.

        Examples:
            >>> import jax, autoplan
            >>> wl = autoplan.models.get("mlp", batch=512, abstract=False)
            >>> plan = autoplan.plan(wl, "cpu:8", pipeline=False)
            >>> sh = plan.named_shardings()
            >>> args = jax.device_put(wl.args, sh)
            >>> args[2]["x"].sharding.spec
            P('x',)
            >>> step = jax.jit(wl.fn, in_shardings=sh)
            >>> loss = step(*args)[0]
        """
        import jax  # noqa: PLC0415
        from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

        mesh = mesh if mesh is not None else self.mesh(stage=stage or 0)
        specs = self.partition_specs(like=like, stage=stage)
        return jax.tree_util.tree_map(lambda p: NamedSharding(mesh, p), specs,
                                      is_leaf=lambda x: isinstance(x, PartitionSpec))

    def logical_axis_rules(self) -> list[tuple[str, str | tuple[str, ...] | None]]:
        """Flax-style logical-axis rules read off the parameters' specs: for each parameter
        dimension a logical name ``"<param leaf>_<dim>"`` mapped to its mesh axes, e.g.
        ``("mlp.fc1.kernel_1", "y")``. Use with ``flax.linen.logical_to_mesh_axes``."""
        rules = []
        for i in self.inputs:
            if i.kind != "parameter":
                continue
            base = ".".join(str(k) for k in _parse_keystr(i.path)) or i.arg_name
            for d, e in enumerate(i.spec):
                rules.append((f"{base}_{d}", None if not e else (e[0] if len(e) == 1 else tuple(e))))
        return rules

    def to_code(self, *, logical_axis_rules: bool | None = None) -> str:
        """A short, runnable Python snippet that applies this plan in a user's own script.

        The snippet builds the plan's mesh (one per stage for a pipeline plan) and defines
        ``shardings_for(args)`` (``shardings_for(args, stage)`` for a pipeline plan), which
        returns ``NamedSharding`` pytrees mirroring the train step's positional arguments, in
        their own container types: ready for ``jax.jit(step, in_shardings=...)`` and
        ``jax.device_put``. The specs are written as a few rules over the leaves' paths (one
        per kind of leaf, repeated layers sharing a rule; see :mod:`autoplan._code`), checked to
        reproduce every input's spec; ``shardings_for(args)`` equals
        ``plan.named_shardings(like=args)``.

        Args:
            logical_axis_rules: add Flax logical axis rules (:meth:`logical_axis_rules`, the
                sharded dimensions); default when the step's arguments hold Flax types.

        Returns:
            The Python source.

        Examples:
            >>> import jax, autoplan
            >>> wl = autoplan.models.get("mlp", batch=512, abstract=False)
            >>> plan = autoplan.plan(wl, "cpu:8", pipeline=False)
            >>> print(plan.to_code().splitlines()[2])
            Generated by autoplan; predicted step time ...
            >>> ns = {}; exec(plan.to_code(), ns)
            >>> step = jax.jit(wl.fn, in_shardings=ns["shardings_for"](wl.args))
            >>> loss = step(*wl.args)[0]
        """
        from ._code import plan_to_code  # noqa: PLC0415

        return plan_to_code(self, logical_axis_rules=logical_axis_rules)

    # ---- files -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {"schema": "autoplan.plan", "schema_version": SCHEMA_VERSION}
        for f in fields(self):
            if f.name in _IN_MEMORY:  # the user's pytree types live in memory only
                continue
            v = getattr(self, f.name)
            d[f.name] = v.to_dict() if isinstance(v, Cluster) else _jsonable(v)
        return d

    def to_json(self, path: str | os.PathLike | None = None, indent: int | None = 1) -> str:
        """The plan as JSON text, also written to ``path`` when given.

        The file is written atomically (a temporary file in the same folder, flushed, then
        renamed over ``path``): an interrupted or failed write leaves the old file as it was.

        Raises:
            OutputError: ``path`` cannot be written (the old file, if any, is kept).
        """
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            atomic_write_text(path, text)
        return text

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """A plan from its dict (``Plan.to_dict()``, or a parsed plan file), validated as a whole
        (see :mod:`autoplan._planfile` for every check).

        Raises:
            PlanFileError: not a plan, another schema version, or a field that is missing, of the
                wrong type, or inconsistent with the rest (its JSON path is in the message and in
                ``err.field``).
        """
        return cls._from_checked(d, "Plan.from_dict")

    @classmethod
    def from_json(cls, text_or_path: str | bytes | os.PathLike) -> Plan:
        """Read a plan from JSON text (or bytes) or a file path, validated as a whole.

        Raises:
            PlanFileError: unreadable, not UTF-8, not JSON, not a plan, another schema version,
                or a malformed or inconsistent field (named by its JSON path).
        """
        d, source = read_plan_json(text_or_path)
        return cls._from_checked(d, source)

    @classmethod
    def _from_checked(cls, d: Any, source: str) -> Plan:
        cluster = validate_plan_dict(d, _FIELD_SETS, Cluster.from_dict, SCHEMA_VERSION, source)
        kw = {k: d[k] for k in _FIELD_SETS["plan"][0] | _FIELD_SETS["plan"][1] if k in d}
        kw["cluster"] = cluster
        kw["stages"] = tuple(_stage_from(s) for s in d["stages"])
        kw["inputs"] = tuple(InputSpec(**{**i, "shape": tuple(i["shape"]), "spec": _norm_spec(i["spec"])})
                             for i in d["inputs"])
        kw["schedule"] = Schedule(**d["schedule"])
        kw["predicted"] = Predicted(**d["predicted"])
        if "analysis" in kw:
            kw["analysis"] = _analysis_from(kw["analysis"], source)
        return cls(**kw)

    def check_matches(self, graph_or_fingerprint: Any, num_devices: int | None = None) -> None:
        """Raise :class:`PlanMismatchError` unless the plan was made for this graph (and, when
        given, this many devices)."""
        fp = getattr(graph_or_fingerprint, "fingerprint", graph_or_fingerprint)
        if fp != self.fingerprint:
            raise PlanMismatchError(
                f"this plan was made for model {self.model!r} (fingerprint {self.fingerprint}) but the "
                f"workload given has fingerprint {fp}: its parameters' paths, shapes or dtypes differ. "
                "Fix: make a plan for this workload (autoplan.plan or 'autoplan plan').")
        if num_devices is not None and num_devices != self.num_devices:
            raise PlanMismatchError(
                f"this plan uses {self.num_devices} devices but {num_devices} are available. Fix: "
                f"make a plan for {num_devices} devices (e.g. --cluster cpu:{num_devices}).")

    def with_(self, **changes: Any) -> Plan:
        return replace(self, **changes)

    # ---- text and HTML -----------------------------------------------------------------
    def summary(self) -> str:
        """A summary table of the plan."""
        p = self.predicted
        lines = [
            f"plan [{self.label}] for {self.model} on {self.cluster.spec} "
            f"({self.num_devices} devices, level {self.level})",
            f"  costed on       : {self.cluster.describe_profile()}",
            f"  layout          : {self.describe()}",
            f"  step time       : {p.step_time * 1e3:.3f} ms   throughput {p.throughput:.1f} samples/s"
            f"   MFU {p.mfu * 100:.1f}%",
            f"  memory / device : {p.memory_per_device / 2**30:.3f} GiB "
            f"(device has {self.cluster.device_memory / 2**30:.1f} GiB)",
            f"  compute / comm  : {p.compute_time * 1e3:.3f} ms / {p.comm_time * 1e3:.3f} ms"
            f"   bubble {p.bubble_fraction * 100:.1f}%",
            "  communication   : " + (", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in
                                             sorted(p.comm_bytes.items()) if v) or "none"),
            "  stage  layers                        submesh  mesh     devices  fwd ms   bwd ms   mem GiB",
        ]
        for s in self.stages:
            rng = _layer_span(s.layers)
            lines.append(f"  {s.index:>5}  {rng:<28}  {s.submesh_shape[0]}x{s.submesh_shape[1]:<5}  "
                         f"{'x'.join(map(str, s.mesh_shape)):<7}  {s.num_devices:>7}  "
                         f"{s.forward_time * 1e3:>7.3f}  {s.backward_time * 1e3:>7.3f}  "
                         f"{s.memory / 2**30:>7.3f}")
        params = [i for i in self.inputs if i.kind == "parameter"]
        sharded = sum(1 for i in params if any(i.spec))
        lines.append(f"  parameters      : {len(params)} leaves, {sharded} sharded")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td><code>{html.escape(i.name)}</code></td><td>{i.kind}</td>"
            f"<td>{'x'.join(map(str, i.shape))}</td><td><code>{html.escape(str(spec_to_pspec(i.spec)))}"
            f"</code></td><td>{i.stage}</td></tr>"
            for i in self.inputs[:200])
        more = f"<p>... {len(self.inputs) - 200} more inputs</p>" if len(self.inputs) > 200 else ""
        return (f"<div class='autoplan-plan'><pre>{html.escape(self.summary())}</pre>"
                "<details><summary>PartitionSpecs</summary><table><tr><th>input</th><th>kind</th>"
                f"<th>shape</th><th>PartitionSpec</th><th>stage</th></tr>{rows}</table>{more}"
                "</details></div>")


def _analysis_from(a: Any, source: str) -> Mapping[str, Any] | None:
    """A plan file's ``analysis``: None (absent in files older autoplans wrote), or an object
    whose ``layers`` is a list of objects with a ``name`` (what ``graph_figure`` reads)."""
    if a is None:
        return None
    layers = a.get("layers") if isinstance(a, Mapping) else None
    if not isinstance(layers, list) or not all(
            isinstance(x, Mapping) and isinstance(x.get("name"), str) for x in layers):
        raise PlanFileError(
            f"{source}: analysis should be null or an object whose 'layers' is a list of objects "
            f"with a 'name' (the folding analysis a search records). Got {str(a)[:60]!r}. Fix: "
            "re-create the plan with 'autoplan plan -o', or delete the field.", field="analysis")
    bad = _non_finite(a)
    if bad is not None:
        raise PlanFileError(
            f"{source}: analysis.{bad[0]} should be a finite number (the folding analysis holds "
            f"counts and FLOPs). Got {bad[1]!r}. Fix: re-create the plan with 'autoplan plan -o', "
            "or delete the field.", field=f"analysis.{bad[0]}")
    return a


def _non_finite(x: Any, path: str = "") -> tuple[str, Any] | None:
    """The path and value of the first NaN or infinity in plain data, or None."""
    if isinstance(x, float) and not math.isfinite(x):
        return path or "(value)", x
    items = x.items() if isinstance(x, Mapping) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        hit = _non_finite(v, f"{path}.{k}" if path and isinstance(k, str) else
                          f"{path}[{k}]" if path else str(k))
        if hit is not None:
            return hit
    return None


def _layer_span(layers: Sequence[str]) -> str:
    if not layers:
        return "-"
    if len(layers) == 1:
        return layers[0]
    return f"{layers[0]} .. {layers[-1]} ({len(layers)})"


#: Plan fields kept in memory only, never written to (or read from) a plan file
_IN_MEMORY = frozenset({"arg_trees"})


def _field_sets(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """(required, optional) field names of a dataclass: what its record in a plan file holds."""
    names = frozenset(f.name for f in fields(cls)) - _IN_MEMORY
    required = frozenset(f.name for f in fields(cls)
                         if f.default is MISSING and f.default_factory is MISSING)
    return required, names - required


_FIELD_SETS = {"plan": _field_sets(Plan), "cluster": _field_sets(Cluster), "stage": _field_sets(Stage),
               "operator": _field_sets(OpSharding), "tensor": _field_sets(TensorSharding),
               "communication": _field_sets(Comm), "input": _field_sets(InputSpec),
               "schedule": _field_sets(Schedule), "predictions": _field_sets(Predicted)}


def _stage_from(s: Mapping[str, Any]) -> Stage:
    kw = dict(s)
    if "submesh" in kw:  # the name files written before ``submesh_shape`` use
        kw["submesh_shape"] = kw.pop("submesh")
    if "ops" in kw:
        kw["ops"] = tuple(_op_from(o) for o in kw["ops"])
    return Stage(**kw)


def _op_from(o: Mapping[str, Any]) -> OpSharding:
    kw = dict(o)
    kw["tensors"] = tuple(TensorSharding(**{**t, "shape": tuple(t["shape"]), "spec": _norm_spec(t["spec"])})
                          for t in o["tensors"])
    if "comm" in kw:
        kw["comm"] = tuple(Comm(**c) for c in o["comm"])
    return OpSharding(**kw)


def _jsonable(v: Any) -> Any:
    if hasattr(v, "__dataclass_fields__"):
        return {f.name: _jsonable(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


_KEY_RE = re.compile(r"\[(?:'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"|(-?\d+))\]|\.([A-Za-z_]\w*)")


def _parse_keystr(path: str) -> list[str | int]:
    keys: list[str | int] = []
    for m in _KEY_RE.finditer(path):
        if m.group(3) is not None:
            keys.append(int(m.group(3)))
        else:
            keys.append(m.group(1) if m.group(1) is not None else (m.group(2) or m.group(4)))
    return keys


def _set_path(tree: Any, keys: list[str | int], value: Any) -> None:
    node = tree
    for k, nxt in zip(keys[:-1], keys[1:]):
        child_default = [] if isinstance(nxt, int) else {}
        if isinstance(k, int):
            while len(node) <= k:
                node.append(None)
            if node[k] is None:
                node[k] = child_default
            node = node[k]
        else:
            node = node.setdefault(k, child_default)
    last = keys[-1]
    if isinstance(last, int):
        while len(node) <= last:
            node.append(None)
        node[last] = value
    else:
        node[last] = value




def require_plan(plan: Any, where: str) -> Plan:
    """``plan`` itself when it is a :class:`Plan`; else :class:`ArgumentTypeError` naming ``where``.

    A search result (anything with a ``best`` plan) is named in the fix, since it is the usual
    mistake.
    """
    if isinstance(plan, Plan):
        return plan
    hint = ("pass result.best (or one of result.plans)" if isinstance(getattr(plan, "best", None), Plan)
            else "pass a plan from autoplan.search or Plan.from_json(path)")
    raise ArgumentTypeError(f"{where}: plan should be an autoplan Plan. Got "
                            f"{type(plan).__name__}: {plan!r:.40}. Fix: {hint}.")
