"""Plan files: writing them, and reading and validating them as a whole.

:meth:`autoplan.Plan.to_dict` and :meth:`~autoplan.Plan.to_json` write a plan with
:func:`plan_to_dict` and :func:`write_plan_json` (atomically).

:meth:`autoplan.Plan.from_json` and :meth:`~autoplan.Plan.from_dict` (and so every command that
reads a plan: ``autoplan show``, ``report``, ``launch``) call :func:`read_plan_json` and
:func:`validate_plan_dict` before building a :class:`~autoplan.Plan`. A file that passes can be
drawn, summarised, turned into shardings and run; a file that does not is refused with one
:class:`~autoplan.PlanFileError` naming the field by its JSON path (``stages[1].mesh_shape``),
the value found, and the fix. What is checked:

* **Bytes.** The file is readable, UTF-8 (a byte-order mark is allowed), and one JSON object.
* **Schema.** ``schema`` is ``"autoplan.plan"`` and ``schema_version`` this version; every record
  (plan, cluster, stage, operator, tensor, input, schedule, predictions) has its required fields,
  no unknown ones, and values of the right type: integers where counts and ids go, finite
  non-negative numbers for times, bytes and FLOPs, strings for names.
* **Cluster.** A valid :class:`~autoplan.Cluster` (positive sizes, bandwidths, fractions in (0, 1]),
  of at most :data:`~autoplan.costs._cluster.MAX_DEVICES` devices.
* **Stages and meshes.** ``index`` is the stage's position; ``submesh_shape`` ``(hosts, devices
  per host)`` fits the cluster (files written before the field had that name say ``submesh``);
  ``device_ids`` are ``hosts x devices per host`` distinct cluster device ids, on ``hosts`` hosts
  with that many devices each, used by no other stage (but for an interleaved schedule's chunks
  of one mesh, which list the same ids); ``mesh_shape`` multiplies to the
  submesh's device count and ``axis_names`` gives one distinct name per mesh axis.
* **Specs.** Every input's and every operator tensor's spec has one entry per dimension, names
  only mesh axes of its stage, uses an axis at most once, and splits a dimension only over axes
  whose sizes' product divides it. Every operator communication runs over the stage's axes.
* **Layers.** A layer belongs to one stage: layer names are unique across stages, the layer
  ranges ``[start, end)`` cover ``0 .. L - 1`` with no gap (``L`` the largest end), there are at
  least ``L`` layer names (each layer has a name), and no stage's first or last layer is another
  stage's (TePDist's DAG stages may be non-contiguous, so ranges may nest, but never share an end).
* **Memory levers.** A stage's ``zero`` is 0 .. 3, its ``zero_axes`` distinct axes of its mesh
  (some when ``zero`` > 0, none at 0), its ``remat_layers`` distinct names of its ``layers``.
  The three are written only when set (a field marked ``omit_default``), so plans without
  levers are written as before.
* **Inputs.** ``(arg, path)`` pairs are unique, one argument has one name, the paths of one
  argument form a tree (no leaf inside another leaf), and ``stage`` is a stage of the plan.
* **Schedule.** ``num_stages`` is the number of stages; the kind is ``none`` (one stage),
  ``gpipe``, ``1f1b``, ``interleaved`` or ``zb-h1``; ``virtual_stages`` (``v``, default 1, more
  only for ``interleaved``) divides the stages into ``P = S / v`` meshes, and stage ``s >= P``
  lists the devices of stage ``s mod P``; the micro-batches divide the batch
  (``config["batch"]`` when recorded, and the leading dimension of every ``batch`` input) and,
  interleaved, are a multiple of ``P``; the table, when present, has one column per mesh and
  holds every ``(micro-batch, stage, forward/backward)`` task (and for ``zb-h1`` every
  ``weight`` task) exactly once, in its stage's mesh's column, after the tasks it depends on;
  the events, when present, hold every task once with ``start <= end`` on its stage's mesh.
* **Analysis.** ``analysis``, when not null, is an object whose ``layers`` is a list of objects
  with a ``name`` (what :func:`autoplan.viz.graph_figure` reads), holding finite numbers only.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, NoReturn

from autoplan._errors import ClusterError, PlanFileError
from autoplan._io import atomic_write_text, read_input_bytes
from autoplan.costs._cluster import MAX_DEVICES, Cluster
from autoplan.plans._keystr import parse_keystr
from autoplan.plans._plan_check import lever_contradiction
from autoplan.plans._schedule import task_deps

__all__ = ["read_plan_json", "validate_plan_dict", "FieldSets", "field_sets", "plan_to_dict",
           "write_plan_json"]

#: record name -> (required field names, optional field names), given by the dataclasses.
FieldSets = Mapping[str, tuple[frozenset[str], frozenset[str]]]

_FIX = "re-create the plan ('autoplan plan -o', or Plan.to_json) or restore the field from the original file"
_KINDS = ("forward", "backward")
#: the JAX axis types of a plan's meshes (``Plan.mesh`` builds Auto axes); files older autoplans
#: wrote say so in ``mesh_axis_types``, read and checked but no longer written
_AXIS_TYPES = ("Auto",)
_MAPS = frozenset({"comm_bytes", "comm_by_axis", "comm_time_by_kind"})  # of the predictions
_NUMBERS = frozenset({"step_time", "throughput", "memory_per_device", "compute_time", "comm_time",
                      "bubble_fraction", "mfu"})
_MAX_INDEX = MAX_DEVICES  # bounds devices (Cluster's own cap), argument positions and list indices


def field_sets(cls: type, skip: frozenset[str] = frozenset()) -> tuple[frozenset[str], frozenset[str]]:
    """(required, optional) field names of a dataclass, less ``skip``: what its record in a plan
    file holds."""
    names = frozenset(f.name for f in fields(cls)) - skip
    required = frozenset(f.name for f in fields(cls)
                         if f.default is MISSING and f.default_factory is MISSING)
    return required, names - required


def plan_to_dict(plan: Any, schema_version: int, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A plan (a dataclass) as plain JSON data: ``schema`` and ``schema_version``, then every field
    but those in ``skip`` (kept in memory only), records as objects, mappings as objects with
    string keys, tuples as lists, and NaN or infinite numbers as null."""
    d: dict[str, Any] = {"schema": "autoplan.plan", "schema_version": schema_version}
    for f in fields(plan):
        if f.name not in skip:
            v = getattr(plan, f.name)
            d[f.name] = v.to_dict() if isinstance(v, Cluster) else _jsonable(v)
    return d


def _jsonable(v: Any) -> Any:
    if is_dataclass(v):  # (fields marked ``omit_default`` are written only when set)
        return {f.name: _jsonable(getattr(v, f.name)) for f in fields(v)
                if not (f.metadata.get("omit_default") and getattr(v, f.name) == f.default)}
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_plan_json(d: Mapping[str, Any], path: str | os.PathLike | None = None,
                    indent: int | None = 1) -> str:
    """The JSON text of a plan's dict (:func:`plan_to_dict`), also written to ``path`` when given,
    atomically (a temporary file in the same folder, flushed, then renamed over ``path``).

    Raises:
        OutputError: ``path`` cannot be written (the old file, if any, is kept).
    """
    text = json.dumps(d, indent=indent)
    if path is not None:
        atomic_write_text(path, text)
    return text


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 6
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 120


def _short(v: Any, n: int = 80) -> str:
    """A repr of ``v`` for a message: at most ``n`` characters, cheap for huge values."""
    text = _REPR.repr(v)
    return text if len(text) <= n else text[: n - 3] + "..."


class _Checker:
    """Walks a plan dict; every failure is one PlanFileError naming the JSON path."""

    def __init__(self, source: str, fields: FieldSets):
        self.source = source
        self.fields = fields

    # ---- failing -----------------------------------------------------------------------
    def fail(self, path: str, want: str, got: Any, fix: str = _FIX) -> NoReturn:
        raise PlanFileError(f"{self.source}: {path} should be {want}. "
                            f"Got {_short(got)}. Fix: {fix}.", field=path)

    # ---- types -------------------------------------------------------------------------
    def obj(self, v: Any, path: str, record: str, extra: Sequence[str] = ()) -> Mapping[str, Any]:
        if not isinstance(v, Mapping):
            self.fail(path, f"an object (a {record} record)", v)
        required, optional = self.fields[record]
        unknown = sorted(set(v) - required - optional - set(extra), key=str)
        if unknown:
            where = _join(path, unknown[0])
            raise PlanFileError(
                f"{self.source}: {where} is not a field of a {record} record "
                f"(its fields: {', '.join(sorted(required | optional))}). Got {_short(v[unknown[0]])}. "
                "Fix: remove the field, or read the file with the autoplan version that wrote it.",
                field=where)
        missing = sorted(required - set(v))
        if missing:
            where = _join(path, missing[0])
            raise PlanFileError(f"{self.source}: {where} is missing: a {record} "
                                f"record should have it. Got the fields "
                                f"{_short(', '.join(sorted(map(str, v))) or 'none', 120)}. Fix: {_FIX}.",
                                field=where)
        return v

    def string(self, v: Any, path: str, nonempty: bool = False) -> str:
        if not isinstance(v, str) or (nonempty and not v):
            self.fail(path, "a non-empty string" if nonempty else "a string", v)
        return v

    def integer(self, v: Any, path: str, low: int = 0) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            self.fail(path, f"an integer >= {low}", v)
        return v

    def number(self, v: Any, path: str, low: float = 0.0, high: float | None = None) -> float:
        ok = isinstance(v, int | float) and not isinstance(v, bool)
        if ok:
            try:
                f = float(v)
            except OverflowError:
                ok = False
            else:
                ok = math.isfinite(f) and f >= low and (high is None or f <= high)
        if not ok:
            want = f"a finite number >= {low:g}" + (f" and <= {high:g}" if high is not None else "")
            self.fail(path, want, v)
        return float(v)

    def array(self, v: Any, path: str, of: str = "values", min_len: int = 0) -> Sequence:
        if not isinstance(v, list | tuple) or len(v) < min_len:
            want = f"a list of {of}" + (f" with at least {min_len} entr{'y' if min_len == 1 else 'ies'}"
                                        if min_len else "")
            self.fail(path, want, v)
        return v

    def ints(self, v: Any, path: str, low: int = 0, length: int | None = None) -> Sequence[int]:
        self.array(v, path, "integers")
        if length is not None and len(v) != length:
            self.fail(path, f"a list of {length} integers", v)
        for k, x in enumerate(v):
            self.integer(x, f"{path}[{k}]", low)
        return v

    def strings(self, v: Any, path: str) -> Sequence[str]:
        self.array(v, path, "strings")
        for k, x in enumerate(v):
            self.string(x, f"{path}[{k}]")
        return v

    def number_map(self, v: Any, path: str) -> None:
        if not isinstance(v, Mapping):
            self.fail(path, "an object of numbers", v)
        for k, x in v.items():
            self.number(x, _join(path, k))

    # ---- records -----------------------------------------------------------------------
    def cluster(self, v: Any, path: str, build: Callable[[Mapping[str, Any]], Any]) -> Any:
        c = self.obj(v, path, "cluster")
        for k in ("name", "device_kind"):
            if k in c:
                self.string(c[k], f"{path}.{k}", nonempty=k == "name")
        for k in ("nodes", "devices_per_node"):
            if k in c:
                self.integer(c[k], f"{path}.{k}", 1)
        for k in ("device_memory", "peak_flops", "intra_bandwidth", "inter_bandwidth", "intra_latency",
                  "inter_latency"):  # positivity of the first four: Cluster's own check below
            if k in c:
                self.number(c[k], f"{path}.{k}")
        for k in ("compute_efficiency", "gamma"):
            if k in c:
                self.number(c[k], f"{path}.{k}", 0.0, 1.0)
        if "epsilon" in c:
            self.array(c["epsilon"], f"{path}.epsilon", "[collective, factor] pairs")
            for k, pair in enumerate(c["epsilon"]):
                p = f"{path}.epsilon[{k}]"
                if not isinstance(pair, list | tuple) or len(pair) != 2:
                    self.fail(p, "a [collective, factor] pair", pair)
                self.string(pair[0], f"{p}[0]")
                self.number(pair[1], f"{p}[1]", 0.0, 1.0)
        if c.get("nodes", 1) * c.get("devices_per_node", 1) > MAX_DEVICES:
            self.fail(f"{path}.nodes", f"a node count giving at most {MAX_DEVICES:,} devices "
                      f"({c.get('devices_per_node', 1):,} per node)", c.get("nodes", 1))
        try:
            cluster = build(c)
        except ClusterError as err:
            fix = "" if "Fix:" in str(err) else f" Fix: {_FIX}."
            raise PlanFileError(f"{self.source}: {path} is not a valid cluster: {err}{fix}",
                                field=path) from None
        return cluster

    def spec(self, v: Any, path: str, shape: Sequence[int], sizes: Mapping[str, int],
             where: str) -> None:
        if not isinstance(v, list | tuple) or len(v) != len(shape):
            self.fail(path, f"a list with one entry per dimension of the shape {list(shape)} "
                      "(null or a list of mesh-axis names)", v)
        seen: set[str] = set()
        for d, e in enumerate(v):
            if e is None:
                continue
            p = f"{path}[{d}]"
            if not isinstance(e, list | tuple):
                self.fail(p, "null or a list of mesh-axis names", e)
            k = 1
            for j, a in enumerate(e):
                if not isinstance(a, str) or a not in sizes:
                    self.fail(f"{p}[{j}]", f"a mesh axis of {where} ({', '.join(sizes) or 'none'})", a,
                              "name one of those axes, or re-create the plan")
                if a in seen:
                    self.fail(f"{p}[{j}]", "an axis the spec does not use already (a mesh axis "
                              "splits at most one dimension, once)", a)
                seen.add(a)
                k *= sizes[a]
            if shape[d] % k:
                self.fail(p, f"mesh axes whose sizes multiply to a divisor of dimension {d} "
                          f"(size {shape[d]}) on {where}", e,
                          f"split dimension {d} over axes whose product divides {shape[d]}, or "
                          "leave it unsplit (null)")

    def stage(self, s: Any, path: str, index: int, cluster: Any) -> dict[str, Any]:
        sub = "submesh_shape"
        if isinstance(s, Mapping) and "submesh" in s and sub not in s:
            sub = "submesh"  # the name files written before submesh_shape use; read the same
            s = {("submesh_shape" if k == sub else k): v for k, v in s.items()}
        st = self.obj(s, path, "stage")
        if self.integer(st["index"], f"{path}.index") != index:
            self.fail(f"{path}.index", f"{index}, the stage's position in the list", st["index"],
                      "number the stages 0, 1, 2, ... in order")
        self.strings(st["layers"], f"{path}.layers")
        self.ints(st["layer_range"], f"{path}.layer_range", 0, 2)
        lo, hi = st["layer_range"]
        if hi < lo:
            self.fail(f"{path}.layer_range", "[start, end) with start <= end", st["layer_range"])
        hosts, per = self.ints(st["submesh_shape"], f"{path}.{sub}", 1, 2)
        if hosts > cluster.nodes or per > cluster.devices_per_node:
            self.fail(f"{path}.{sub}", f"[hosts, devices per host] within the cluster's "
                      f"{cluster.nodes} x {cluster.devices_per_node}", st["submesh_shape"],
                      "use a submesh the cluster has, or the cluster the plan was made for")
        n = hosts * per
        ids = self.ints(st["device_ids"], f"{path}.device_ids")
        if len(ids) != n:
            self.fail(f"{path}.device_ids", f"{n} device ids (the submesh {hosts} x {per})", ids)
        for k, d in enumerate(ids):
            if d >= cluster.num_devices:
                self.fail(f"{path}.device_ids[{k}]", f"a device id below {cluster.num_devices} "
                          f"(the cluster {cluster.spec} has {cluster.num_devices} devices)", d)
        on_host: dict[int, int] = {}
        for d in ids:
            on_host[d // cluster.devices_per_node] = on_host.get(d // cluster.devices_per_node, 0) + 1
        if len(on_host) != hosts or set(on_host.values()) != {per}:
            self.fail(f"{path}.device_ids", f"{per} devices on each of {hosts} host(s) (the submesh; "
                      f"{cluster.devices_per_node} devices per host)", ids)
        shape = self.ints(st["mesh_shape"], f"{path}.mesh_shape", 1)
        if not shape or math.prod(shape) != n:
            self.fail(f"{path}.mesh_shape", f"a logical mesh of {n} devices (the submesh "
                      f"{hosts} x {per}), e.g. [{n}, 1] or [{hosts}, {per}]", shape,
                      "make the product of mesh_shape equal the submesh's device count")
        names = self.strings(st["axis_names"], f"{path}.axis_names")
        if len(names) != len(shape) or len(set(names)) != len(names) or not all(names):
            self.fail(f"{path}.axis_names", f"{len(shape)} distinct non-empty names, one per axis "
                      f"of mesh_shape {shape}", names)
        sizes = dict(zip(names, shape))
        where = f"stage {index}'s mesh {'x'.join(map(str, shape))}"
        for k in ("forward_time", "backward_time", "memory"):
            if k in st:
                self.number(st[k], f"{path}.{k}")
        if "comm_bytes" in st:
            self.number_map(st["comm_bytes"], f"{path}.comm_bytes")
        for k, o in enumerate(self.array(st.get("ops", []), f"{path}.ops", "operator records")):
            self.op(o, f"{path}.ops[{k}]", sizes, where)
        self.levers(st, path, sizes, where)
        return {"ids": ids, "sizes": sizes, "where": where, "layers": st["layers"],
                "range": (lo, hi)}

    def levers(self, st: Mapping[str, Any], path: str, sizes: Mapping[str, int], where: str
               ) -> None:
        """A stage's memory levers: ``zero`` 0 .. 3, ``zero_axes`` distinct axes of its mesh
        (some when ``zero`` > 0, none at 0), ``remat_layers`` distinct layers of the stage."""
        axes = self.strings(st.get("zero_axes", []), f"{path}.zero_axes")
        remat = self.strings(st.get("remat_layers", []), f"{path}.remat_layers")
        bad = lever_contradiction(st.get("zero", 0), list(axes), list(remat), list(sizes),
                                  st["layers"], where)
        if bad is not None:
            self.fail(path + bad[0], bad[1], bad[2], bad[3] or _FIX)

    def op(self, o: Any, path: str, sizes: Mapping[str, int], where: str) -> None:
        op = self.obj(o, path, "operator")
        self.integer(op["op"], f"{path}.op")
        for k in ("primitive", "scope", "layer", "role", "strategy"):
            if k in op:
                self.string(op[k], f"{path}.{k}")
        if "flops" in op:
            self.number(op["flops"], f"{path}.flops")
        for k, t in enumerate(self.array(op["tensors"], f"{path}.tensors", "tensor records")):
            p = f"{path}.tensors[{k}]"
            tr = self.obj(t, p, "tensor")
            for f in ("name", "role", "dtype"):
                self.string(tr[f], f"{p}.{f}")
            shape = self.ints(tr["shape"], f"{p}.shape")
            self.spec(tr["spec"], f"{p}.spec", shape, sizes, where)
        for k, c in enumerate(self.array(op.get("comm", []), f"{path}.comm", "communication records")):
            p = f"{path}.comm[{k}]"
            cr = self.obj(c, p, "communication")
            self.string(cr["kind"], f"{p}.kind", nonempty=True)
            self.number(cr["bytes"], f"{p}.bytes")
            self.number(cr["time"], f"{p}.time")
            if "where" in cr:
                self.string(cr["where"], f"{p}.where")
            for j, a in enumerate(self.strings(cr["axes"], f"{p}.axes")):
                if a not in sizes:
                    self.fail(f"{p}.axes[{j}]", f"a mesh axis of {where} ({', '.join(sizes)})", a)


def _join(path: str, key: Any) -> str:
    key = str(key)
    if re.fullmatch(r"[A-Za-z_]\w*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def read_plan_json(text_or_path: Any, caller: str = "Plan.from_json") -> tuple[Any, str]:
    """Parse a plan given as JSON text, bytes, or a file path.

    Returns:
        ``(the parsed JSON value, how messages name its source)``.

    Raises:
        PlanFileError: an unreadable file, bytes that are not UTF-8, or text that is not JSON.
    """
    source = caller
    if isinstance(text_or_path, os.PathLike):
        text_or_path = os.fspath(text_or_path)
    if isinstance(text_or_path, bytes | bytearray):
        data = bytes(text_or_path)
        text = None
    elif isinstance(text_or_path, str):
        data = None
        text = text_or_path
        if not text_or_path.lstrip().startswith(("{", "[")):
            path = text_or_path
            source = f"plan file {path!r}"
            try:
                data = read_input_bytes(path, what="plan file")  # (a pipe or device: refused)
            except (OSError, ValueError) as err:  # ValueError: an embedded NUL byte
                why = getattr(err, "strerror", None) or err
                raise PlanFileError(f"{caller}: cannot read plan file {path!r}: it should be a "
                                    f"readable file. Got: {why}. Fix: check the path.") from None
    else:
        raise PlanFileError(f"{caller}: the plan should be JSON text, bytes, or a file path. Got "
                            f"{type(text_or_path).__name__}. Fix: pass the path of a plan file "
                            "written by Plan.to_json or 'autoplan plan -o'.")
    if data is not None:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise PlanFileError(
                f"{source}: not UTF-8 text: a plan file should be UTF-8 encoded JSON. Got byte "
                f"0x{data[err.start]:02x} at offset {err.start}, which UTF-8 cannot decode. Fix: pass "
                "a file written by Plan.to_json or 'autoplan plan -o' (an edited file must be saved "
                "as UTF-8).") from None
    assert text is not None
    if not text.strip():
        raise PlanFileError(f"{source}: the plan file is empty: it should hold one JSON object. "
                            f"Got {len(text)} blank character(s). Fix: pass a file written by "
                            "Plan.to_json or 'autoplan plan -o' (an interrupted copy leaves an "
                            "empty file).")
    try:
        return json.loads(text), source
    except json.JSONDecodeError as err:
        raise PlanFileError(f"{source}: not valid JSON ({err}). Got {text[:60]!r}. Fix: pass a file "
                            "written by Plan.to_json; a truncated file must be re-created.") from None
    except (ValueError, RecursionError) as err:  # over-long integers, absurd nesting
        raise PlanFileError(f"{source}: not a plan file: it should be the JSON a plan writer made. Got "
                            f"{type(err).__name__}: {_short(str(err))}. Fix: pass a file written "
                            "by Plan.to_json.") from None


def validate_plan_dict(d: Any, fields: FieldSets, build_cluster: Callable[[Mapping[str, Any]], Any],
                       schema_version: int, source: str = "Plan.from_dict") -> Any:
    """Check a plan's dict (parsed JSON) as a whole; see the module docstring for the checks.

    Args:
        d: the parsed JSON value.
        fields: per record, its required and optional field names (from the dataclasses).
        build_cluster: makes the :class:`~autoplan.Cluster` from its dict (raises ClusterError).
        schema_version: the version this autoplan reads.
        source: how messages name the plan's source.

    Returns:
        The :class:`~autoplan.Cluster` built from ``d["cluster"]``.

    Raises:
        PlanFileError: naming the first field found wrong, its value and the fix.
    """
    if not isinstance(d, Mapping) or d.get("schema") != "autoplan.plan":
        got = (f"schema {_short(d.get('schema'))}" if isinstance(d, Mapping)
               else f"a JSON {type(d).__name__}: {_short(d, 40)}")
        raise PlanFileError(f"{source}: not an autoplan plan: it should be an object whose 'schema' "
                            f"field is 'autoplan.plan'. Got {got}. Fix: pass a file written by Plan.to_json "
                            "or 'autoplan plan -o'.", field="schema")
    ver = d.get("schema_version")
    if isinstance(ver, bool) or ver != schema_version:
        raise PlanFileError(f"{source}: schema_version should be {schema_version}. Got {ver!r}. Fix: "
                            "re-create the plan with this autoplan version.", field="schema_version")
    c = _Checker(source, fields)
    c.obj(d, "", "plan", extra=("schema", "schema_version", "mesh_axis_types"))
    for k in ("model", "fingerprint", "label", "level", "jax_version"):
        if k in d:
            c.string(d[k], k)
    if "search_seconds" in d:
        c.number(d["search_seconds"], "search_seconds")
    if "notes" in d:
        c.strings(d["notes"], "notes")
    for k, types in enumerate(c.array(d.get("arg_types", []), "arg_types", "lists of type names")):
        c.strings(types, f"arg_types[{k}]")
    config = d.get("config", {})
    if not isinstance(config, Mapping):
        c.fail("config", "an object (the workload's configuration)", config)
    _check_config(c, config)
    cluster = c.cluster(d["cluster"], "cluster", build_cluster)

    # stages, meshes, devices, layers
    stages = c.array(d["stages"], "stages", "stage records", min_len=1)
    views = [c.stage(s, f"stages[{k}]", k, cluster) for k, s in enumerate(stages)]
    owner: dict[int, int] = {}
    P = _schedule_meshes(c, d.get("schedule"), len(views))
    for k, v in enumerate(views):
        if k >= P:  # an interleaved schedule's later chunks run on the meshes of the first P
            if list(v["ids"]) != list(views[k % P]["ids"]):
                c.fail(f"stages[{k}].device_ids", f"the devices of stages[{k % P}] (an interleaved "
                       f"schedule runs stage {k} on mesh {k % P})", v["ids"],
                       "give each chunk of a mesh the same device ids")
            continue
        for j, dev in enumerate(v["ids"]):
            if dev in owner:
                want = (f"a device this stage lists once (device {dev} is listed twice)"
                        if owner[dev] == k else f"a device not used by stages[{owner[dev]}]")
                c.fail(f"stages[{k}].device_ids[{j}]", want, dev, "give each device to one stage once")
            owner[dev] = k
    _check_layers(c, views)
    if "mesh_axis_types" in d:  # in files older autoplans wrote
        types = c.strings(d["mesh_axis_types"], "mesh_axis_types")
        n_axes = len(views[0]["sizes"])
        if len(types) != n_axes or any(t not in _AXIS_TYPES for t in types):
            c.fail("mesh_axis_types", f"{n_axes} entries (one per mesh axis of stage 0) from "
                   f"{list(_AXIS_TYPES)} (a plan's meshes have Auto axes)", types,
                   "delete the field (plan files no longer write it)")

    # inputs
    _check_inputs(c, c.array(d["inputs"], "inputs", "input records"), views)

    # schedule
    _check_schedule(c, d["schedule"], len(views), config, d["inputs"])

    # predictions
    p = c.obj(d["predicted"], "predicted", "predictions")
    for k, v in p.items():
        if k in _MAPS or (isinstance(v, Mapping) and k not in _NUMBERS):
            c.number_map(v, f"predicted.{k}")
        else:
            c.number(v, f"predicted.{k}", 0.0, 1.0 if k == "bubble_fraction" else None)

    # the folding analysis
    _check_analysis(source, d.get("analysis"))
    return cluster


def _check_analysis(source: str, a: Any) -> None:
    """A plan file's ``analysis``: None (absent in files older autoplans wrote), or an object
    whose ``layers`` is a list of objects with a ``name`` (what ``graph_figure`` reads)."""
    if a is None:
        return
    layers = a.get("layers") if isinstance(a, Mapping) else None
    if not isinstance(layers, list | tuple) or not all(
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


def _non_finite(x: Any, path: str = "") -> tuple[str, Any] | None:
    """The path and value of the first NaN or infinity in plain data, or None."""
    if isinstance(x, float) and not math.isfinite(x):
        return path or "(value)", x
    items = (x.items() if isinstance(x, Mapping) else enumerate(x) if isinstance(x, list | tuple)
             else ())
    for k, v in items:
        hit = _non_finite(v, f"{path}.{k}" if path and isinstance(k, str) else
                          f"{path}[{k}]" if path else str(k))
        if hit is not None:
            return hit
    return None


def _check_config(c: _Checker, config: Mapping[str, Any]) -> None:
    """JSON values nested at most 16 deep (walked iteratively), with finite numbers only."""
    todo: list[tuple[Any, str, int]] = [(config, "config", 0)]
    while todo:
        x, path, depth = todo.pop()
        if depth > 16:
            c.fail(path, "a configuration value nested at most 16 deep", "a deeper value")
        if isinstance(x, float) and not math.isfinite(x):
            c.fail(path, "a finite number", x)
        if isinstance(x, Mapping):
            todo.extend((y, _join(path, k), depth + 1) for k, y in x.items())
        elif isinstance(x, list | tuple):
            todo.extend((y, f"{path}[{i}]", depth + 1) for i, y in enumerate(x))


def _check_layers(c: _Checker, views: list[dict[str, Any]]) -> None:
    seen: dict[str, int] = {}
    for k, v in enumerate(views):
        for j, name in enumerate(v["layers"]):
            if name in seen:
                c.fail(f"stages[{k}].layers[{j}]", f"a layer of no other stage (it is in "
                       f"stages[{seen[name]}] already)", name, "give each layer to one stage")
            seen[name] = k
    total = max(v["range"][1] for v in views)
    if total == 0:
        if len(views) > 1:
            c.fail("stages[0].layer_range", "a non-empty range in a plan of several stages",
                   list(views[0]["range"]))
        return
    names = sum(len(v["layers"]) for v in views)
    if names < total:  # checked first: a huge end must not make a huge list below
        c.fail("stages", f"stages naming at least {total} layers (their ranges reach layer "
               f"{total - 1}, and every layer has a name)", [list(v["range"]) for v in views])
    covered = [False] * total
    ends: dict[int, int] = {}
    for k, v in enumerate(views):
        lo, hi = v["range"]
        path = f"stages[{k}].layer_range"
        if hi == lo:
            c.fail(path, "a non-empty range [start, end) (a stage holds at least one layer)", [lo, hi])
        if len(v["layers"]) < (1 if hi - lo == 1 else 2):
            c.fail(f"stages[{k}].layers", f"the names of the stage's layers (at least "
                   f"{1 if hi - lo == 1 else 2} for the range [{lo}, {hi}))", v["layers"])
        for end in {lo, hi - 1}:
            if end in ends:
                c.fail(path, f"a range whose first and last layers are this stage's own (layer {end} "
                       f"is an end of stages[{ends[end]}].layer_range too)", [lo, hi],
                       "give each layer to one stage: stage ranges do not overlap at their ends")
            ends[end] = k
        for i in range(lo, hi):
            covered[i] = True
    if not all(covered):
        gap = covered.index(False)
        c.fail("stages", f"layer ranges that cover layers 0 .. {total - 1} (no stage holds layer "
               f"{gap})", [list(v["range"]) for v in views], "give every layer to a stage")


def _check_inputs(c: _Checker, inputs: list, views: list[dict[str, Any]]) -> None:
    keys: dict[tuple[int, str], int] = {}
    arg_names: dict[int, tuple[str, int]] = {}
    trees: dict[int, dict] = {}
    for k, i in enumerate(inputs):
        path = f"inputs[{k}]"
        r = c.obj(i, path, "input")
        arg = c.integer(r["arg"], f"{path}.arg")
        if arg >= _MAX_INDEX:
            c.fail(f"{path}.arg", f"a positional argument index below {_MAX_INDEX:,}", arg)
        name = c.string(r["arg_name"], f"{path}.arg_name")
        leaf = c.string(r["path"], f"{path}.path")
        c.string(r["kind"], f"{path}.kind", nonempty=True)
        c.string(r["dtype"], f"{path}.dtype", nonempty=True)
        shape = c.ints(r["shape"], f"{path}.shape")
        stage = c.integer(r.get("stage", 0), f"{path}.stage")
        if stage >= len(views):
            c.fail(f"{path}.stage", f"a stage of the plan (0 .. {len(views) - 1})", stage)
        v = views[stage]
        c.spec(r["spec"], f"{path}.spec", shape, v["sizes"], v["where"])
        if (arg, leaf) in keys:
            c.fail(f"{path}.path", f"a leaf no other input names (inputs[{keys[arg, leaf]}] has the "
                   f"same argument {arg} and path)", leaf, "keep one record per leaf")
        keys[arg, leaf] = k
        if arg in arg_names and arg_names[arg][0] != name:
            c.fail(f"{path}.arg_name", f"{arg_names[arg][0]!r}, the name inputs[{arg_names[arg][1]}] "
                   f"gives argument {arg}", name)
        arg_names.setdefault(arg, (name, k))
        _add_leaf(c, trees.setdefault(arg, {}), leaf, f"{path}.path", k)


def _add_leaf(c: _Checker, tree: dict, leaf: str, path: str, k: int) -> None:
    """Insert one leaf path into its argument's tree; leaves may not nest, and one node's
    children are all list positions or all names."""
    keys = parse_keystr(leaf)
    if keys is None:
        c.fail(path, "a jax.tree_util.keystr path such as \"['layers'][0]['kernel']\" (or \"\" "
               "for an argument that is a single array)", leaf,
               "keep the paths jax.tree_util.keystr gave the argument's leaves")
    node = tree
    for depth, key in enumerate(keys + [None]):
        if node.get("leaf") is not None:
            c.fail(path, f"a leaf path not inside the leaf of inputs[{node['leaf']}]", leaf,
                   "keep the paths jax.tree_util.keystr gave the argument's leaves")
        if key is None:
            if node.get("children"):
                c.fail(path, "a leaf path, not the parent of other inputs' paths", leaf)
            node["leaf"] = k
            return
        kind = "index" if isinstance(key, int) else "name"
        if isinstance(key, int) and not 0 <= key < _MAX_INDEX:
            c.fail(path, f"a path whose list indices are 0 .. {_MAX_INDEX - 1:,}", leaf)
        if node.setdefault("kind", kind) != kind:
            c.fail(path, f"a path whose key at depth {depth} is a {node['kind']}, as in the other "
                   f"inputs of this argument", leaf)
        node = node.setdefault("children", {}).setdefault(key, {})


def _schedule_meshes(c: _Checker, sd: Any, num_stages: int) -> int:
    """The meshes of the stages, ``num_stages / virtual_stages`` (read before the stages'
    devices are checked: an interleaved schedule's chunks share their mesh's devices)."""
    if not isinstance(sd, Mapping):
        return num_stages  # (the schedule's own check says what it should be)
    v = c.integer(sd.get("virtual_stages", 1), "schedule.virtual_stages", 1)
    if num_stages % v:
        c.fail("schedule.virtual_stages", f"a divisor of the {num_stages} stages (v chunks on "
               "each of num_stages / v meshes)", v)
    return num_stages // v


def _check_schedule(c: _Checker, sd: Any, num_stages: int, config: Mapping[str, Any],
                    inputs: list) -> None:
    s = c.obj(sd, "schedule", "schedule")
    kind = c.string(s["kind"], "schedule.kind")
    m = c.integer(s["microbatches"], "schedule.microbatches", 1)
    if c.integer(s["num_stages"], "schedule.num_stages", 1) != num_stages:
        c.fail("schedule.num_stages", f"{num_stages}, the number of stages", s["num_stages"])
    kinds = ("gpipe", "1f1b", "interleaved", "zb-h1")
    if kind not in ("none", *kinds) or (kind == "none" and num_stages > 1):
        want = ", ".join(map(repr, kinds if num_stages > 1 else ("none", *kinds)))
        c.fail("schedule.kind", f"one of {want}", kind)
    v = c.integer(s.get("virtual_stages", 1), "schedule.virtual_stages", 1)
    if v > 1 and kind != "interleaved":
        c.fail("schedule.virtual_stages", f"1 for a {kind!r} schedule (only 'interleaved' has "
               "virtual stages)", v)
    if num_stages % v or (v > 1 and m % (num_stages // v)):
        c.fail("schedule.virtual_stages", f"a divisor of the {num_stages} stages whose meshes "
               f"({num_stages} / virtual_stages) divide the {m} micro-batches", v)
    P = num_stages // v
    task_kinds = _KINDS + ("weight",) if kind == "zb-h1" else _KINDS
    batch = config.get("batch")
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            c.fail("config.batch", "a positive integer (the global batch)", batch)
        if batch % m:
            c.fail("schedule.microbatches", f"a divisor of the batch {batch} (config.batch)", m,
                   "use a micro-batch count that divides the batch")
    if m > 1:
        if not any(i["kind"] == "batch" for i in inputs):
            c.fail("schedule.microbatches", "1 in a plan with no batch input (micro-batches split "
                   "the batch inputs' leading dimension)", m)
        for k, i in enumerate(inputs):
            if i["kind"] == "batch" and (not i["shape"] or i["shape"][0] % m):
                c.fail("schedule.microbatches", f"a divisor of the leading dimension of every batch "
                       f"input (inputs[{k}] has shape {i['shape']})", m,
                       "use a micro-batch count that divides the batch")
    n_tasks = len(task_kinds) * m * num_stages
    table = c.array(s.get("table", []), "schedule.table", "rows")
    events = c.array(s.get("events", []), "schedule.events", "events")
    for t, row in enumerate(table):
        if not isinstance(row, list | tuple) or len(row) != P:
            c.fail(f"schedule.table[{t}]", f"a row of {P} entries (one per mesh)", row)
    if table or events:
        # counted before the set of tasks is made: a huge micro-batch count must not make it
        count = (sum(not _is_update(e) for e in events) if events
                 else sum(e is not None for row in table for e in row))
        if count != n_tasks:
            c.fail("schedule.events" if events else "schedule.table", f"{n_tasks} tasks (a "
                   f"{', a '.join(task_kinds)} of each of {m} micro-batches on each of "
                   f"{num_stages} stages)", f"{count} tasks", "re-create the plan's schedule")
        tasks = {(b, st, kd) for b in range(m) for st in range(num_stages) for kd in task_kinds}
    if table:
        when: dict[tuple[int, int, str], int] = {}
        for t, row in enumerate(table):
            for j, e in enumerate(row):
                if e is None:
                    continue
                task = _task(c, e, f"schedule.table[{t}][{j}]", m, num_stages, kinds=task_kinds)
                if task[1] % P != j:
                    c.fail(f"schedule.table[{t}][{j}]", f"a task of stage {j} (column {j} is stage "
                           f"{j}'s mesh)" if P == num_stages else f"a task of a stage s with s mod "
                           f"{P} = {j} (column {j} is their mesh)", e)
                if task in when:
                    c.fail(f"schedule.table[{t}][{j}]", f"a task not scheduled already (clock "
                           f"{when[task]} runs it)", e)
                when[task] = t
        missing = sorted(tasks - set(when))
        if missing:
            c.fail("schedule.table", f"a table holding every task; micro-batch {missing[0][0]}'s "
                   f"{missing[0][2]} of stage {missing[0][1]} is missing", f"{len(when)} of "
                   f"{len(tasks)} tasks", "re-create the plan's schedule")
        for task, t in when.items():
            for dep in task_deps(task, num_stages):
                if when[dep] >= t:
                    c.fail(f"schedule.table[{t}][{task[1]}]", f"after micro-batch {task[0]}'s "
                           f"{dep[2]} of stage {dep[1]} (clock {when[dep]}), which it depends on",
                           list(task), "re-create the plan's schedule")
    if events:
        got: set[tuple[int, int, str]] = set()
        updated: set[int] = set()
        for k, e in enumerate(events):
            p = f"schedule.events[{k}]"
            if not isinstance(e, list | tuple) or len(e) != 6:
                c.fail(p, "[start, end, mesh, micro-batch, stage, kind]", e)
            start = c.number(e[0], f"{p}[0]")
            if c.number(e[1], f"{p}[1]") < start:
                c.fail(f"{p}[1]", f"an end time >= the start {start}", e[1])
            if _is_update(e):  # a stage's per-step work: once per stage, on its own mesh
                st = c.integer(e[4], f"{p}[4]")
                if st >= num_stages or st in updated:
                    c.fail(f"{p}[4]", f"a stage below {num_stages} with no other update event", st)
                if c.integer(e[2], f"{p}[2]") != st % P:
                    c.fail(f"{p}[2]", f"the mesh of stage {st} ({st % P})", e[2])
                updated.add(st)
                continue
            task = _task(c, e[3:], p, m, num_stages, offset=3, kinds=task_kinds)
            if c.integer(e[2], f"{p}[2]") != task[1] % P:
                c.fail(f"{p}[2]", f"the mesh of stage {task[1]} ({task[1] % P})", e[2])
            if task in got:
                c.fail(p, "an event of a task no other event runs", e)
            got.add(task)
        if got != tasks:
            b, st, kd = sorted(tasks - got)[0]
            c.fail("schedule.events", f"one event per task; micro-batch {b}'s {kd} of stage {st} "
                   "has none", f"{len(got)} of {len(tasks)} tasks")


def _is_update(e: Any) -> bool:
    """An event of kind ``update`` (a stage's gradient synchronisation and optimizer update)."""
    return isinstance(e, list | tuple) and len(e) == 6 and e[5] == "update"


def _task(c: _Checker, e: Any, path: str, m: int, num_stages: int,
          offset: int = 0, kinds: tuple[str, ...] = _KINDS) -> tuple[int, int, str]:
    if not isinstance(e, list | tuple) or len(e) != 3:
        c.fail(path, f"null or a task [micro-batch, stage, {' or '.join(map(repr, kinds))}]", e)
    b = c.integer(e[0], f"{path}[{offset}]")
    if b >= m:
        c.fail(f"{path}[{offset}]", f"a micro-batch index below {m}", b)
    st = c.integer(e[1], f"{path}[{offset + 1}]")
    if st >= num_stages:
        c.fail(f"{path}[{offset + 1}]", f"a stage index below {num_stages}", st)
    if e[2] not in kinds:
        c.fail(f"{path}[{offset + 2}]", " or ".join(map(repr, kinds)), e[2])
    return b, st, e[2]
