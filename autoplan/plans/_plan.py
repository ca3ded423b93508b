"""The Plan: plain, frozen data that search produces and viz/exec read.

A :class:`Plan` records, for one training step on one cluster: its pipeline stages (one stage for
an intra-operator-only plan), each stage's submesh and logical mesh, the PartitionSpec of every
graph input (parameters, optimizer state, batch) keyed by pytree path, the sharding of the heavy
operators (dot/conv: their strategy and tensor specs), the schedule, and the predictions.

Specs are stored as :class:`autoplan.plans._spec.Spec` values, one entry per tensor dimension: ``None``
(replicated along that dimension) or a tuple of mesh-axis names (``("x",)``, ``("x", "y")``), the
same information as a ``jax.sharding.PartitionSpec``; the JSON writes each as a list of entries.
``Plan.to_json()``/``Plan.from_json()`` round-trip exactly.

Every record is immutable all the way down (its mappings are :class:`~autoplan.plans._frozen.FrozenDict`,
its sequences tuples, whatever its constructor was given) and hashable. What a plan does lives in
functions of their own, which the methods call: the JAX views and checks in
:mod:`autoplan.plans._plan_jax`, the texts in :mod:`autoplan.plans._plan_text`, the file format in
:mod:`autoplan.plans._planfile`, the code snippet in :mod:`autoplan.plans._code`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter
from typing import Any

from autoplan._errors import ArgumentError, ArgumentTypeError
from autoplan.costs._cluster import Cluster
from autoplan.plans._frozen import FrozenDict, freeze_fields, immutable_type
from autoplan.plans._plan_check import warn_contradictions
from autoplan.plans._plan_jax import (
    check_matches,
    input_trees,
    logical_axis_rules,
    named_shardings,
    stage_mesh,
)
from autoplan.plans._plan_text import describe, plan_html, summary
from autoplan.plans._planfile import (
    field_sets,
    plan_to_dict,
    read_plan_json,
    validate_plan_dict,
    write_plan_json,
)
from autoplan.plans._spec import Spec

__all__ = ["SCHEMA_VERSION", "LEVELS", "Spec", "TensorSharding", "Comm", "OpSharding", "InputSpec", "Stage",
           "Schedule", "Predicted", "Plan", "require_plan", "spec_to_pspec", "pspec_to_spec", "spec_str"]

SCHEMA_VERSION = 1
LEVELS = ("auto", "exhaustive", "hierarchical", "folded")
"""The search levels a plan's ``level`` names, in the order the options list them: ``"auto"``
picks one of the other three (see :mod:`autoplan.search.fold._levels`)."""


def _deprecated(old: str, new: str) -> None:
    import warnings  # noqa: PLC0415

    warnings.warn(f"autoplan.plans._plan.{old} is deprecated and will be removed in the next release; "
                  f"use {new}.", DeprecationWarning, stacklevel=3)


def spec_to_pspec(spec: Sequence[Any]) -> Any:
    """Deprecated: use ``Spec.of(spec).to_pspec()`` (:meth:`autoplan.plans._spec.Spec.to_pspec`)."""
    _deprecated("spec_to_pspec", "autoplan.plans._spec.Spec.to_pspec")
    return Spec.of(spec).to_pspec()


def pspec_to_spec(pspec: Any, ndim: int) -> Spec:
    """Deprecated: use :meth:`autoplan.plans._spec.Spec.from_pspec`."""
    _deprecated("pspec_to_spec", "autoplan.plans._spec.Spec.from_pspec")
    return Spec.from_pspec(tuple(pspec)[:ndim], ndim)


def spec_str(spec: Sequence[Any]) -> str:
    """Deprecated: use ``str(spec)`` of a :class:`autoplan.plans._spec.Spec`."""
    _deprecated("spec_str", "str(Spec)")
    return str(Spec.of(spec))


@immutable_type
@dataclass(frozen=True, slots=True)
class TensorSharding:
    """One tensor of an operator, for the sharding view.

    Attributes:
        name: a readable name (``params['layers'][0]['mlp']['fc1']['kernel']`` or ``%123``).
        role: ``"input"``, ``"weight"`` or ``"output"``.
        shape: global shape.
        dtype: dtype name.
        spec: per-dimension mesh axes (:class:`autoplan.plans._spec.Spec`).
    """

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    spec: Spec

    def __post_init__(self) -> None:  # any spec-shaped sequence is stored as its canonical Spec
        if type(self.spec) is not Spec:
            object.__setattr__(self, "spec", Spec.of(self.spec))
        freeze_fields(self)

    def tiles(self, mesh_shape: Sequence[int], axis_names: Sequence[str]) -> int:
        """How many tiles the tensor is cut into (:meth:`autoplan.plans._spec.Spec.tiles`)."""
        return self.spec.tiles(mesh_shape, axis_names)


@immutable_type
@dataclass(frozen=True, slots=True)
class Comm:
    """A predicted communication: ``kind`` (a collective), ``bytes``, mesh ``axes``, ``time``
    in seconds, and ``where`` (``"op"``, ``"reshard"``, ``"grad-sync"``, ``"cross-stage"``)."""

    kind: str
    bytes: float
    axes: tuple[str, ...]
    time: float
    where: str = "op"

    def __post_init__(self) -> None:
        # the one field that could be given mutable; checked by hand: the search makes many Comms
        if type(self.axes) is not tuple:
            object.__setattr__(self, "axes", tuple(self.axes))


@immutable_type
@dataclass(frozen=True, slots=True)
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


@immutable_type
@dataclass(frozen=True, slots=True)
class InputSpec:
    """The sharding of one graph input (a parameter, optimizer-state or batch leaf).

    Attributes:
        arg: positional argument index; ``arg_name`` its name; ``path`` its ``keystr`` in it.
        kind: ``parameter``, ``optimizer_state``, ``batch`` or ``input``.
        shape, dtype: the leaf's.
        spec: per-dimension mesh axes (:class:`autoplan.plans._spec.Spec`).
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

    def __post_init__(self) -> None:  # any spec-shaped sequence is stored as its canonical Spec
        if type(self.spec) is not Spec:
            object.__setattr__(self, "spec", Spec.of(self.spec))
        freeze_fields(self)

    @property
    def name(self) -> str:
        return f"{self.arg_name}{self.path}"


_RECORD_MAKERS: dict[type, Any] = {}


def record_maker(cls: type) -> Any:
    """The unchecked constructor of :func:`canonical_record` for ``cls``, made once per class:
    a function of the field values, in field order, that fills a new record field by field
    (its slots, through their descriptors, or else its instance dict), as the dataclass's own
    ``__init__`` would, without its checks. A plan of a deep model holds tens of thousands of
    records, so the search takes the maker once and calls it per record: a third of the cost
    of the generic path. The plan's records keep their fields in slots: no instance dict each,
    so a 96-layer GPT's three plans hold 38,000 fewer objects (less memory, and less for every
    full collection of the process to walk)."""
    make = _RECORD_MAKERS.get(cls)
    if make is None:
        # positional parameters v0, v1, ... (no field name can shadow the maker's own names);
        # the fields in field order: their slot descriptors' setters, or the instance dict's
        # keys as string literals
        names = [f.name for f in fields(cls)]
        params = ", ".join(f"v{k}" for k in range(len(names)))
        scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
        if "__slots__" in cls.__dict__:
            # each field's slot descriptor sets it (past the frozen class's __setattr__)
            scope.update({f"s{k}": cls.__dict__[n].__set__ for k, n in enumerate(names)})
            body = "".join(f"    s{k}(obj, v{k})\n" for k in range(len(names)))
            src = f"def make({params}):\n    obj = new(cls)\n{body}    return obj\n"
        else:
            body = "".join(f"    d[{n!r}] = v{k}\n" for k, n in enumerate(names))
            src = (f"def make({params}):\n    obj = new(cls)\n    d = obj.__dict__\n{body}"
                   "    return obj\n")
        exec(src, scope)  # noqa: S102 (made from the dataclass's own field names, as literals)
        make = _RECORD_MAKERS[cls] = scope["make"]
        make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    return make


def _remade(cls: type, values: tuple[Any, ...]) -> Any:
    """A record of ``cls`` from its field values in field order, as :func:`record_maker` makes
    it (what unpickling a record calls)."""
    return record_maker(cls)(*values)


def _pickled_by_fields(cls: type) -> None:
    """Pickle the slotted records of ``cls`` as ``(cls, field values)``, remade by
    :func:`_remade`. The slotted dataclass's own ``__getstate__`` and ``__setstate__`` list
    its fields anew for every record, and a 39B GPT's plans hold hundreds of thousands of them:
    storing those plans in the plan cache took 0.30 s that way and 0.21-0.26 s this way, loading
    them 0.20 s and 0.11 s (the cyclic collector off)."""
    get = attrgetter(*(f.name for f in fields(cls)))

    def __reduce__(self: Any) -> tuple[Any, tuple[type, tuple[Any, ...]]]:
        return _remade, (type(self), get(self))

    cls.__reduce__ = __reduce__  # type: ignore[method-assign]


for _cls in (TensorSharding, Comm, OpSharding, InputSpec):
    _pickled_by_fields(_cls)


def canonical_record(cls: type, *values: Any) -> Any:
    """A :class:`TensorSharding`, :class:`OpSharding` or :class:`InputSpec` from every one of its
    field values, in field order, already in the form its constructor stores (a :class:`Spec`,
    tuples of records, strings and numbers): equal to ``cls(*values)``, made without the
    constructor's checks. A plan of a deep model holds tens of thousands of these records, and
    the search makes three or more plans per search; the checked constructor was a third of
    making one (tests check that what the search makes equals the checked records). Loops take
    :func:`record_maker` once instead."""
    return record_maker(cls)(*values)


@immutable_type
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
        zero: the stage's ZeRO level (0: none; 1 optimizer state, 2 also gradients, 3 also
            parameters sharded over ``zero_axes``, the mesh axes its gradients are synchronised
            over), as the pipeline search chose it to fit the memory limit.
        zero_axes: the mesh axes ZeRO shards over (empty at level 0).
        remat_layers: the stage's layers whose forward is rematerialised in the backward
            (``jax.checkpoint``), a subset of ``layers``.

    The three lever fields are written to a plan file only when set (see
    :mod:`autoplan.plans._planfile`); the stage executor applies them
    (:mod:`autoplan.exec._levers`), and a plan that uses them says so in its notes.
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
    zero: int = field(default=0, metadata={"omit_default": True})
    zero_axes: tuple[str, ...] = field(default=(), metadata={"omit_default": True})
    remat_layers: tuple[str, ...] = field(default=(), metadata={"omit_default": True})

    def __post_init__(self) -> None:
        freeze_fields(self)

    @property
    def levers(self) -> bool:
        """Whether the stage uses a memory lever (a ZeRO level or rematerialised layers)."""
        return bool(self.zero or self.remat_layers)

    @property
    def num_devices(self) -> int:
        return len(self.device_ids)

    @property
    def submesh(self) -> tuple[int, int]:
        """Deprecated name of :attr:`submesh_shape` (it is a shape, not a mesh)."""
        warnings.warn("Stage.submesh is deprecated: it is the submesh's shape (hosts, devices per "
                      "host); use Stage.submesh_shape.", DeprecationWarning, stacklevel=2)
        return self.submesh_shape


@immutable_type
@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule.

    Attributes:
        kind: ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` (1F1B over ``virtual_stages`` model
            chunks per mesh) or ``"zb-h1"`` (the backward split into ``backward``, the input
            gradient, and ``weight``, the weight gradient); ``"none"`` for a single stage.
        microbatches: number of micro-batches.
        num_stages: number of stages (model chunks for interleaved: stage ``s`` runs on mesh
            ``s mod (num_stages / virtual_stages)``, and shares that mesh's devices).
        table: rows = clock ticks, columns = meshes; entries ``(micro-batch, stage, kind)`` or None.
        events: ``(start, end, mesh, micro-batch, stage, kind)`` with predicted times.
        virtual_stages: stages per mesh ``v`` (1 but for interleaved).
    """

    kind: str
    microbatches: int
    num_stages: int
    table: tuple[tuple[tuple[int, int, str] | None, ...], ...] = ()
    events: tuple[tuple[float, float, int, int, int, str], ...] = ()
    virtual_stages: int = 1

    @property
    def num_meshes(self) -> int:
        """The pipeline's meshes (the table's columns): ``num_stages / virtual_stages``."""
        return self.num_stages // max(self.virtual_stages, 1)

    def __post_init__(self) -> None:
        freeze_fields(self)


@immutable_type
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


@immutable_type
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
            ``"tuple"``, ...; see :class:`autoplan.tracing._workload.ArgTree`); empty for nested dicts
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
        # an interleaved schedule's chunks share their mesh's devices: each mesh counts once
        return sum(s.num_devices for s in self.stages[:self.schedule.num_meshes])

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
        return describe(self)

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
        return input_trees(self, lambda i: i.spec.to_pspec() if stage in (None, i.stage) else None,
                           like)

    def mesh(self, devices: Sequence[Any] | None = None, stage: int = 0):
        """A ``jax.sharding.Mesh`` for ``stage`` over ``devices`` (default ``jax.devices()``),
        taking the stage's device ids in order; axis types Auto."""
        return stage_mesh(self, devices, stage)

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
        return named_shardings(self, self.partition_specs(like=like, stage=stage), mesh, stage)

    def logical_axis_rules(self) -> list[tuple[str, str | tuple[str, ...] | None]]:
        """Flax-style logical-axis rules read off the parameters' specs: for each parameter
        dimension a logical name ``"<param leaf>_<dim>"`` mapped to its mesh axes, e.g.
        ``("mlp.fc1.kernel_1", "y")``. Use with ``flax.linen.logical_to_mesh_axes``."""
        return logical_axis_rules(self)

    def to_code(self, *, logical_axis_rules: bool | None = None) -> str:
        """A short, runnable Python snippet that applies this plan in a user's own script.

        The snippet builds the plan's mesh (one per stage for a pipeline plan) and defines
        ``shardings_for(args)`` (``shardings_for(args, stage)`` for a pipeline plan), which
        returns ``NamedSharding`` pytrees mirroring the train step's positional arguments, in
        their own container types: ready for ``jax.jit(step, in_shardings=...)`` and
        ``jax.device_put``. The specs are written as a few rules over the leaves' paths (one
        per kind of leaf, repeated layers sharing a rule; see :mod:`autoplan.plans._code`), checked to
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
        from autoplan.plans._code import plan_to_code  # noqa: PLC0415

        return plan_to_code(self, logical_axis_rules=logical_axis_rules)

    # ---- files -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON data: what :meth:`to_json` writes."""
        return plan_to_dict(self, SCHEMA_VERSION, _IN_MEMORY)

    def to_json(self, path: str | os.PathLike | None = None, indent: int | None = 1) -> str:
        """The plan as JSON text, also written to ``path`` when given.

        The file is written atomically (a temporary file in the same folder, flushed, then
        renamed over ``path``): an interrupted or failed write leaves the old file as it was.

        Raises:
            OutputError: ``path`` cannot be written (the old file, if any, is kept).
        """
        return write_plan_json(self.to_dict(), path, indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """A plan from its dict (``Plan.to_dict()``, or a parsed plan file), validated as a whole
        (see :mod:`autoplan.plans._planfile` for every check).

        Raises:
            PlanFileError: not a plan, another schema version, or a field that is missing, of the
                wrong type, or inconsistent with the rest (its JSON path is in the message and in
                ``err.field``).

        Warns:
            PlanContradictionWarning: a well-formed plan that contradicts itself (inputs changed
                after it was made, a stage holding other layers than its range, a schedule kind
                over another kind's table...; see :mod:`autoplan.plans._plan_check`): it can be looked
                at, but ``exec.run`` and ``launch`` refuse it.
        """
        plan = cls._from_checked(d, "Plan.from_dict")
        warn_contradictions(plan, "Plan.from_dict")
        return plan

    @classmethod
    def from_json(cls, text_or_path: str | bytes | os.PathLike) -> Plan:
        """Read a plan from JSON text (or bytes) or a file path, validated as a whole.

        Raises:
            PlanFileError: unreadable, not UTF-8, not JSON, not a plan, another schema version,
                or a malformed or inconsistent field (named by its JSON path).

        Warns:
            PlanContradictionWarning: as :meth:`from_dict`.
        """
        d, source = read_plan_json(text_or_path)
        plan = cls._from_checked(d, source)
        warn_contradictions(plan, source)
        return plan

    @classmethod
    def _from_checked(cls, d: Any, source: str) -> Plan:
        cluster = validate_plan_dict(d, _FIELD_SETS, Cluster.from_dict, SCHEMA_VERSION, source)
        kw = {k: d[k] for k in _FIELD_SETS["plan"][0] | _FIELD_SETS["plan"][1] if k in d}
        kw["cluster"] = cluster
        kw["stages"] = tuple(_stage_from(s) for s in d["stages"])
        kw["inputs"] = tuple(InputSpec(**{**i, "shape": tuple(i["shape"]), "spec": Spec.of(i["spec"])})
                             for i in d["inputs"])
        kw["schedule"] = Schedule(**d["schedule"])
        kw["predicted"] = Predicted(**d["predicted"])
        return cls(**kw)

    def check_matches(self, graph_or_fingerprint: Any, num_devices: int | None = None) -> None:
        """Raise :class:`PlanMismatchError` unless the plan was made for this graph (and, when
        given, this many devices)."""
        check_matches(self, graph_or_fingerprint, num_devices)

    def with_(self, **changes: Any) -> Plan:
        """A copy of the plan with ``changes`` to its fields (frozen as any plan's are)."""
        return replace(self, **changes)

    # ---- text and HTML -----------------------------------------------------------------
    def summary(self) -> str:
        """A summary table of the plan."""
        return summary(self)

    def __str__(self) -> str:
        return summary(self)

    def _repr_html_(self) -> str:
        return plan_html(self)


#: Plan fields kept in memory only, never written to (or read from) a plan file
_IN_MEMORY = frozenset({"arg_trees"})
_FIELD_SETS = {record: field_sets(cls, _IN_MEMORY) for record, cls in (
    ("plan", Plan), ("cluster", Cluster), ("stage", Stage), ("operator", OpSharding),
    ("tensor", TensorSharding), ("communication", Comm), ("input", InputSpec), ("schedule", Schedule),
    ("predictions", Predicted))}


def _stage_from(s: Mapping[str, Any]) -> Stage:
    kw = dict(s)
    if "submesh" in kw:  # the name files written before ``submesh_shape`` use
        kw["submesh_shape"] = kw.pop("submesh")
    if "ops" in kw:
        kw["ops"] = tuple(_op_from(o) for o in kw["ops"])
    return Stage(**kw)


def _op_from(o: Mapping[str, Any]) -> OpSharding:
    kw = dict(o)
    kw["tensors"] = tuple(TensorSharding(**{**t, "shape": tuple(t["shape"]), "spec": Spec.of(t["spec"])})
                          for t in o["tensors"])
    if "comm" in kw:
        kw["comm"] = tuple(Comm(**c) for c in o["comm"])
    return OpSharding(**kw)


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
