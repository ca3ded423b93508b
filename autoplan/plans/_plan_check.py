"""Plans that contradict themselves or their workload.

:mod:`autoplan.plans._planfile` checks that a plan file is well formed, field by field and against
the cluster; a file edited by hand can pass it and still say two things at once. This module
finds those contradictions, wherever a plan is read:

* ``autoplan show`` and ``report`` (and :meth:`autoplan.Plan.from_json` /
  :meth:`~autoplan.Plan.from_dict`) warn with :class:`PlanContradictionWarning`, one per
  contradiction, and go on: the plan can still be looked at;
* :func:`autoplan.exec.run` and :func:`autoplan.exec.launch` (``autoplan launch``) refuse it
  before any program is compiled or any worker started: :class:`~autoplan.PlanFileError` for a
  plan that contradicts itself, :class:`~autoplan.PlanMismatchError` for one that contradicts
  the workload given.

What contradicts itself (:func:`plan_contradictions`, from the plan alone):

* **inputs and fingerprint**: ``fingerprint`` is a hash of the inputs' argument names, paths,
  shapes and dtypes (:attr:`autoplan.OpGraph.fingerprint`, the same formula); inputs whose hash
  differs were changed after the plan was made;
* **argument kinds**: the leaves of one positional argument share its kind (a parameter marked
  ``batch`` among parameters);
* **batch**: ``config.batch`` is the leading dimension of every ``batch`` input;
* **stages and layers**: with the folding analysis in the file (``analysis.layers``, the layers
  in model order), each stage holds the layers its ``layer_range`` names, by name; and the
  operators a stage lists belong to its layers;
* **schedule**: a non-empty ``table`` is not the table of the other kind (a 1F1B table under
  ``"gpipe"``);
* **cluster**: the cluster has as many devices as the plan's stages use (a search plans for
  every device; ``devices_per_node`` 16 on an 8-device plan is a different cluster).

What contradicts the workload (:func:`workload_contradictions`, given a :class:`WorkloadView`
of the traced workload): the model's name, the config fields both record, each input's argument
name, shape, dtype and kind, and the stages' layer names against the trace's layers.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoplan._errors import PlanFileError, PlanMismatchError
from autoplan.plans._keystr import parse_keystr
from autoplan.tracing._graph import ARG_KINDS

__all__ = ["PlanContradictionWarning", "PlatformWarning", "Contradiction", "WorkloadView",
           "plan_contradictions", "workload_contradictions", "warn_contradictions",
           "refuse_contradictions", "inputs_fingerprint", "platform_note"]

_REMAKE = "re-create the plan ('autoplan plan -o'), or restore the file the search wrote"


class PlanContradictionWarning(UserWarning):
    """A plan read for viewing contradicts itself (``autoplan show``, ``Plan.from_json``); the
    same plan is refused by ``exec.run`` and ``launch``."""


class PlatformWarning(UserWarning):
    """A plan runs on another platform than its cluster's (a GPU plan on emulated CPU devices):
    its numbers are checked all the same, its times and memory say nothing of the planned
    devices."""


@dataclass(frozen=True)
class Contradiction:
    """One contradiction: the JSON path of the field to blame and the message (what it should
    be, what it is, the fix)."""

    field: str
    message: str


@dataclass(frozen=True)
class WorkloadView:
    """What a plan is checked against, read off the traced workload (JSON-able, so that the
    launcher's probe can send it).

    Attributes:
        name: the graph's name (``Plan.model`` of a plan made for it).
        inputs: per graph input, ``(arg, arg_name, path, kind, shape, dtype)``.
        layers: the trace's layer names in model order.
        config: the workload's configuration (empty for a user's workload without one).
    """

    name: str
    inputs: tuple[tuple[int, str, str, str, tuple[int, ...], str], ...]
    layers: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: Any, config: Mapping[str, Any] | None = None) -> WorkloadView:
        """The view of a traced graph (:class:`~autoplan.OpGraph`) and its workload's config."""
        inputs = tuple((gi.arg, gi.arg_name, gi.path, gi.kind,
                        tuple(graph.tensors[gi.tensor].shape), str(graph.tensors[gi.tensor].dtype))
                       for gi in graph.inputs)
        plain = {str(k): v for k, v in (config or {}).items() if _is_json(v)}
        return cls(graph.name, inputs, tuple(graph.layer_order), plain)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "inputs": [list(i) for i in self.inputs],
                "layers": list(self.layers), "config": dict(self.config)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkloadView:
        return cls(str(d["name"]), tuple((int(a), str(n), str(p), str(k), tuple(s), str(t))
                                         for a, n, p, k, s, t in d["inputs"]),
                   tuple(d.get("layers", ())), dict(d.get("config", {})))


def _is_json(v: Any) -> bool:
    """A value JSON writes and reads back as itself (a config field the probe can send)."""
    if v is None or isinstance(v, bool | int | float | str):
        return True
    if isinstance(v, list | tuple):
        return all(_is_json(x) for x in v)
    if isinstance(v, Mapping):
        return all(isinstance(k, str) and _is_json(x) for k, x in v.items())
    return False


def inputs_fingerprint(inputs: Sequence[Any]) -> str:
    """The fingerprint of a plan's inputs (argument name, path, shape, dtype, in order): the
    formula of :attr:`autoplan.OpGraph.fingerprint`, so a plan's own ``fingerprint`` equals it
    unless its inputs were changed."""
    h = hashlib.sha256()
    for i in inputs:
        h.update(f"{i.arg_name}{i.path}:{tuple(i.shape)}:{i.dtype};".encode())
    return h.hexdigest()[:16]


def _task(t: Any) -> tuple[int, int, str] | None:
    return None if t is None else (int(t[0]), int(t[1]), str(t[2]))


def lever_contradiction(zero: Any, zero_axes: Sequence[str], remat_layers: Sequence[str],
                        axes: Sequence[str], layers: Sequence[str], where: str
                        ) -> tuple[str, str, Any, str | None] | None:
    """The first contradiction of a stage's memory levers with its mesh and layers, as ``(field
    after the stage's path, what it should be, what it is, the fix or None)``: ``zero`` 0 .. 3,
    ``zero_axes`` distinct axes of its mesh (``where``: the mesh in words; some when ``zero`` >
    0, none at 0), ``remat_layers`` distinct layers of the stage. The plan file's reader and
    :func:`plan_contradictions` both report it."""
    if isinstance(zero, bool) or not isinstance(zero, int) or not 0 <= zero <= 3:
        return ".zero", "a ZeRO level 0, 1, 2 or 3", zero, None
    for j, a in enumerate(zero_axes):
        if a not in axes or a in zero_axes[:j]:
            return (f".zero_axes[{j}]", f"a mesh axis of {where} ({', '.join(axes)}) listed once",
                    a, None)
    if bool(zero) != bool(zero_axes):
        return (".zero_axes", f"the mesh axes ZeRO level {zero} shards over (some axes for a "
                "level above 0, none at 0)", list(zero_axes), "give zero_axes with zero > 0, or neither")
    for j, name in enumerate(remat_layers):
        if name not in layers or name in remat_layers[:j]:
            return (f".remat_layers[{j}]", "a layer of this stage's layers, listed once", name,
                    "name layers of the stage's 'layers'")
    return None


def plan_contradictions(plan: Any) -> list[Contradiction]:
    """Every contradiction of ``plan`` with itself (see the module docstring)."""
    out: list[Contradiction] = []

    def add(path: str, want: str, got: Any, fix: str = _REMAKE) -> None:
        out.append(Contradiction(path, f"{path} should be {want}. Got {got}. Fix: {fix}."))

    # inputs against the fingerprint made from them
    fp = inputs_fingerprint(plan.inputs)
    if fp != plan.fingerprint:
        add("fingerprint", f"the hash of the inputs' names, shapes and dtypes ({fp}, what the "
            "inputs recorded give): the plan's inputs were changed after it was made",
            plan.fingerprint, "restore the inputs' shapes, dtypes and paths, or " + _REMAKE)
    # one kind per positional argument: the kind most of its leaves have; the others are wrong
    # (but for the parameters an optimizer-state argument carries, all under one field)
    by_arg: dict[int, list[int]] = {}
    for k, i in enumerate(plan.inputs):
        if i.kind not in ARG_KINDS:
            add(f"inputs[{k}].kind", ", ".join(repr(a) for a in ARG_KINDS[:-1]) + f" or {ARG_KINDS[-1]!r}",
                repr(i.kind))
        else:
            by_arg.setdefault(i.arg, []).append(k)
    for arg, ks in sorted(by_arg.items()):
        kinds = [plan.inputs[k].kind for k in ks]
        if set(kinds) == {"parameter", "optimizer_state"} and _carried(plan, ks):
            continue  # (an optimizer-state argument carrying its parameters: a TrainState)
        major = max(dict.fromkeys(kinds), key=kinds.count)
        odd = [k for k in ks if plan.inputs[k].kind != major]
        if odd:
            k = odd[0]
            add(f"inputs[{k}].kind", f"{major!r}, the kind of argument {arg} "
                f"({plan.inputs[k].arg_name}: {kinds.count(major)} of its {len(ks)} leaves say "
                f"so; a kind belongs to a positional argument)"
                + (f"; {len(odd) - 1} more leaf(s) differ" if len(odd) > 1 else ""),
                repr(plan.inputs[k].kind), f"restore inputs[{k}].kind to {major!r}")
    # the batch
    batch = plan.config.get("batch") if isinstance(plan.config, Mapping) else None
    if isinstance(batch, int) and not isinstance(batch, bool):
        for k, i in enumerate(plan.inputs):
            if i.kind == "batch" and i.shape and i.shape[0] != batch:
                add(f"inputs[{k}].shape", f"a shape whose leading dimension is the batch {batch} "
                    "(config.batch)", list(i.shape))
                break
    # each stage's memory levers against its mesh and layers
    for k, st in enumerate(plan.stages):
        bad = lever_contradiction(st.zero, st.zero_axes, st.remat_layers, st.axis_names, st.layers,
                                  f"stage {k}'s mesh {'x'.join(map(str, st.mesh_shape))}")
        if bad is not None:
            add(f"stages[{k}]{bad[0]}", bad[1], repr(bad[2]), bad[3] or _REMAKE)
    # stages against the layers in model order
    names = _analysis_layers(plan)
    if names is not None:
        out += _layer_contradictions(plan, names, "analysis.layers (the layers in model order)")
    # operators against the layers of their stage (when the operators' layer names are the
    # stages' own: a pipeline over grouped layers names them otherwise)
    owner = {name: k for k, st in enumerate(plan.stages) for name in st.layers}
    op_layers = {o.layer for st in plan.stages for o in st.ops if o.layer}
    if op_layers and op_layers <= set(owner):
        for k, st in enumerate(plan.stages):
            j, o = next(((j, o) for j, o in enumerate(st.ops)
                         if o.layer and owner[o.layer] != k), (None, None))
            if o is not None:
                add(f"stages[{k}].ops[{j}].layer", f"a layer of stages[{k}] "
                    f"({', '.join(st.layers) or 'none'}), the stage the operator runs in "
                    f"(stages[{owner[o.layer]}] holds {o.layer!r})", repr(o.layer),
                    "restore the stages' layers, or " + _REMAKE)
                break
    # the schedule's table against its kind: a table of the other kind under this one (a table
    # of neither is left to the file checker and the executor, which say what is wrong with it)
    sd = plan.schedule
    if sd.table and sd.kind in ("gpipe", "1f1b"):
        from autoplan.plans._schedule import schedule_table  # noqa: PLC0415

        other = "1f1b" if sd.kind == "gpipe" else "gpipe"
        got = [[_task(t) for t in row] for row in sd.table]
        try:
            tables = {k: [[_task(t) for t in row] for row in schedule_table(k, sd.num_stages,
                                                                             sd.microbatches)]
                      for k in (sd.kind, other)}
        except Exception:  # noqa: BLE001 - counts the file checker refuses anyway
            tables = {}
        if tables and got == tables[other] and got != tables[sd.kind]:
            add("schedule.kind", f"the kind of its table (schedule.table is the {other} table of "
                f"{sd.num_stages} stages and {sd.microbatches} micro-batches)", repr(sd.kind),
                f"set schedule.kind to {other!r}, or " + _REMAKE)
    # the cluster against the devices the stages use
    n = plan.num_devices  # (an interleaved schedule's chunks share their mesh's devices)
    c = plan.cluster
    if c.num_devices != n:
        add("cluster.devices_per_node" if c.nodes == 1 else "cluster.nodes",
            f"a cluster of {n} devices, as many as the plan's stages use (a search plans for "
            "every device of its cluster)", f"{c.nodes} node(s) x {c.devices_per_node} devices = "
            f"{c.num_devices} devices", "restore the cluster the plan was made for, or make a "
            f"plan for this cluster (autoplan plan --cluster {c.spec})")
    return out


def _analysis_layers(plan: Any) -> list[str] | None:
    a = plan.analysis
    layers = a.get("layers") if isinstance(a, Mapping) else None
    if not isinstance(layers, Sequence):
        return None
    names = [x.get("name") for x in layers if isinstance(x, Mapping)]
    return names if all(isinstance(x, str) for x in names) else None


def _layer_contradictions(plan: Any, names: Sequence[str], where: str) -> list[Contradiction]:
    """Each stage holds, by name, the layers its ``layer_range`` covers in ``names`` (the
    layers in model order); checked when the stages name exactly those layers and their ranges
    are contiguous (TePDist's DAG stages may nest: not checked)."""
    stages = plan.stages
    held = [name for s in stages for name in s.layers]
    if sorted(held) != sorted(names) or len(set(names)) != len(names):
        return []  # other layers than the trace's (--num-layers grouped them): nothing to compare
    ranges = sorted(tuple(s.layer_range) for s in stages)
    if any(a[1] > b[0] for a, b in zip(ranges, ranges[1:])) or ranges[-1][1] != len(names):
        return []
    out = []
    for k, s in enumerate(stages):
        lo, hi = s.layer_range
        want = list(names[lo:hi])
        if sorted(s.layers) != sorted(want):
            out.append(Contradiction(
                f"stages[{k}].layers", f"stages[{k}].layers should be the layers its layer_range "
                f"[{lo}, {hi}) covers in {where}: {want}. Got {list(s.layers)}. Fix: restore the "
                "stage's layers or its layer_range, or " + _REMAKE + "."))
    return out


def _carried(plan: Any, ks: Sequence[int]) -> bool:
    """Whether the ``parameter`` leaves among inputs ``ks`` (one argument's, with
    ``optimizer_state`` leaves beside them) all sit under one field, as the parameters an
    optimizer-state argument carries do (a ``TrainState``'s ``.params``:
    :func:`~autoplan.tracing._workload.parameter_leaves`); a leaf's kind changed by hand in a
    parameters argument, or in the optimizer's state, leaves them under several."""
    firsts = set()
    for k in ks:
        if plan.inputs[k].kind == "parameter":
            keys = parse_keystr(plan.inputs[k].path)
            firsts.add(keys[0] if keys else None)
    return len(firsts) == 1 and None not in firsts


def workload_contradictions(plan: Any, view: WorkloadView) -> list[Contradiction]:
    """Every contradiction of ``plan`` with the workload ``view`` describes."""
    out: list[Contradiction] = []
    fix = ("run the workload the plan was made for (the same model, --size, --batch and --set), "
           f"or make a plan for this one (autoplan plan {view.name} -o plan.json)")
    from autoplan.models._registry import MODELS  # noqa: PLC0415

    # a zoo model is known by its name; a user's step goes by several (its function's, its
    # module:function spec), so its inputs and layers below tell it apart instead
    if plan.model != view.name and (plan.model in MODELS or view.name in MODELS):
        out.append(Contradiction("model", f"model should be {view.name!r}, the workload given. "
                                 f"Got {plan.model!r}. Fix: {fix}."))
    if isinstance(plan.config, Mapping):
        for key in sorted(set(plan.config) & set(view.config), key=str):
            a, b = plan.config[key], view.config[key]
            if _jsonish(a) != _jsonish(b):
                out.append(Contradiction(f"config.{key}", f"config.{key} should be {b!r}, the "
                                         f"workload's. Got {a!r}. Fix: {fix}."))
    theirs = {(a, p): (n, k, tuple(s), t) for a, n, p, k, s, t in view.inputs}
    for k, i in enumerate(plan.inputs):
        w = theirs.get((i.arg, i.path))
        if w is None:
            out.append(Contradiction(f"inputs[{k}].path", f"inputs[{k}].path should name a leaf of "
                                     f"the workload's argument {i.arg}. Got {i.path!r}. Fix: {fix}."))
            continue
        for attr, want, got in (("arg_name", w[0], i.arg_name), ("kind", w[1], i.kind),
                                ("shape", list(w[2]), list(i.shape)), ("dtype", w[3], i.dtype)):
            if want != got:
                why = fix
                if attr == "kind" and {want, got} == {"parameter", "optimizer_state"}:
                    why = (f"make the plan again for this workload (autoplan plan {view.name} -o "
                           "plan.json): the parameters an optimizer-state argument carries (a "
                           "TrainState's) are parameters, and a plan that read them as optimizer "
                           "state costed them so")
                out.append(Contradiction(f"inputs[{k}].{attr}", f"inputs[{k}].{attr} should be "
                                         f"{want!r}, the workload's {i.arg_name}{i.path}. Got "
                                         f"{got!r}. Fix: {why}."))
    if len(plan.inputs) != len(view.inputs):
        out.append(Contradiction("inputs", f"inputs should hold the workload's {len(view.inputs)} "
                                 f"leaves. Got {len(plan.inputs)}. Fix: {fix}."))
    if view.layers:
        out += _layer_contradictions(plan, view.layers, "the workload's trace")
    return out


def _jsonish(v: Any) -> Any:
    """A config value as JSON would write it (tuples as lists), for comparing."""
    if isinstance(v, Mapping):
        return {str(k): _jsonish(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonish(x) for x in v]
    return v


def warn_contradictions(plan: Any, source: str, stacklevel: int = 3) -> None:
    """One :class:`PlanContradictionWarning` per contradiction of ``plan`` with itself."""
    for c in plan_contradictions(plan):
        warnings.warn(f"{source}: {c.message} (autoplan launch and exec.run refuse this plan)",
                      PlanContradictionWarning, stacklevel=stacklevel)


def refuse_contradictions(plan: Any, where: str, view: WorkloadView | None = None) -> None:
    """Raise on the first contradiction of ``plan``: :class:`~autoplan.PlanFileError` with
    itself, else :class:`~autoplan.PlanMismatchError` with the workload ``view`` (when given).
    Every contradiction found is listed, the first one first."""
    own = plan_contradictions(plan)
    found = own + (workload_contradictions(plan, view) if view is not None else [])
    if not found:
        return
    more = (f" ({len(found) - 1} more: {', '.join(c.field for c in found[1:6])}"
            f"{' ...' if len(found) > 6 else ''})" if len(found) > 1 else "")
    msg = f"{where}: the plan contradicts {'itself' if own else 'the workload'}: {found[0].message}{more}"
    if own:
        raise PlanFileError(msg, field=found[0].field)
    raise PlanMismatchError(msg)


def platform_note(cluster: Any, platform: str, count: int) -> str | None:
    """A note when a plan made for ``cluster`` runs on devices of another platform (``"cpu"``
    for emulated CPU devices, ``"gpu"``, ``"tpu"``), else None."""
    planned_cpu = cluster.device_kind.lower() == "cpu" or cluster.platform == "cpu"
    on_cpu = platform == "cpu"
    if planned_cpu == on_cpu and (cluster.platform in ("", platform) or
                                  {cluster.platform, platform} <= {"gpu", "cuda", "rocm"}):
        return None
    here = f"{count} emulated CPU device(s)" if on_cpu else f"{count} {platform} device(s)"
    return (f"the plan was made for {cluster.spec} ({cluster.device_kind}) and runs on {here}: "
            "its numbers are checked against one device all the same, but its times and memory "
            "say nothing of the planned devices")
