"""The collectives XLA compiled: parsing ``compiled.as_text()``.

:func:`collectives` lists every all-reduce, all-gather, reduce-scatter, all-to-all and
collective-permute of an HLO module (synchronous or ``-start``/``-done`` async pairs) with its
operand and result bytes **per device** (an SPMD module's shapes are per-device shards) and the
size of its replica groups. A tuple all-reduce (XLA's combiner merges several into one) yields
one :class:`Collective` per operand, so bytes add up the same whether or not XLA combined them.

Bytes follow the cost model of :mod:`autoplan.costs._mesh` (``B`` in its formulas): the reduced
size for all-reduce, the gathered (result) size for all-gather, the size before scattering for
reduce-scatter, the operand size for all-to-all and collective-permute.

The known CPU difference: XLA's CPU backend has no reduce-scatter; the SPMD partitioner emits an
all-reduce whose result only feeds ``dynamic-slice`` (or a fusion built around one) that keeps
this device's shard. Such an all-reduce gets ``equivalent="reduce-scatter"``, and
:func:`comm_bytes` counts it as a reduce-scatter (``map_cpu=True``), which is what a GPU would run.

Replica groups appear in three spellings, all handled: explicit ``{{0,1},{2,3}}``, iota
``[2,4]<=[8]`` and mesh ``mesh['axis_0'=2,'axis_1'=4] ... {'axis_1'}``.

Example:
    >>> text = '''
    ... ENTRY %main (p: f32[16,8]) -> f32[16,8] {
    ...   %p = f32[16,8]{1,0} parameter(0)
    ...   ROOT %all-reduce = f32[16,8]{1,0} all-reduce(%p), replica_groups={{0,1,2,3}}, to_apply=%add
    ... }'''
    >>> [(c.kind, c.bytes, c.group_size) for c in collectives(text)]
    [('all-reduce', 512, 4)]
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autoplan._errors import ArgumentTypeError
from autoplan.costs._hlotext import ARRAY_RE, Instruction, dtype_size, parse_instruction, shape_bytes

__all__ = ["Collective", "KINDS", "MemoryStats", "collectives", "comm_bytes", "dtype_size",
           "memory_stats", "shape_bytes"]

#: the collective kinds reported, in the order tables print them
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_ARRAY_RE = ARRAY_RE
_COMP_RE = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*[({]")
_CALLS_RE = re.compile(r"\bcalls=%?([\w.\-]+)")
_GROUPS_EXPLICIT = re.compile(r"replica_groups=\{(\{[0-9,\s]*\}(?:\s*,\s*\{[0-9,\s]*\})*)?\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[([0-9,]+)\]<=\[")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{(.*?)\}\}")


def _array_shapes(shape: str) -> list[str]:
    """The array shapes inside a (possibly tuple) HLO shape, in order."""
    return [f"{dt}[{dims}]" for dt, dims in _ARRAY_RE.findall(shape)]


@dataclass(frozen=True)
class Collective:
    """One collective (one operand of a tuple collective) in a compiled HLO module.

    Attributes:
        kind: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all`` or
            ``collective-permute`` (the ``-start`` of an async pair is reported under its kind).
        name: the HLO instruction's name (``all-reduce.2``); ``operand`` which operand of it.
        computation: the HLO computation that holds it (``main.0_spmd`` for the entry).
        dtype: element type of the operand (``f32``).
        operand_bytes: bytes of the operand on one device.
        result_bytes: bytes of the result on one device.
        group_size: devices in each replica group (1 when it could not be read).
        equivalent: the kind a GPU would run: ``"reduce-scatter"`` for a CPU all-reduce whose
            result only feeds a dynamic-slice; else ``kind``.
    """

    kind: str
    name: str
    operand: int
    computation: str
    dtype: str
    operand_bytes: int
    result_bytes: int
    group_size: int
    equivalent: str

    @property
    def bytes(self) -> int:
        """``B`` of the cost model: the gathered size for all-gather, else the operand size."""
        return self.result_bytes if self.kind == "all-gather" else self.operand_bytes


def _parse(text: str) -> tuple[dict[str, list[Instruction]], dict[str, str]]:
    """Instructions by computation, and each computation's ROOT instruction name."""
    comps: dict[str, list[Instruction]] = {}
    roots: dict[str, str] = {}
    current = "?"
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("//"):
            continue
        if "=" not in s.split("(")[0] and s.endswith("{"):
            m = _COMP_RE.match(s)
            if m:
                current = m.group(2)
                comps.setdefault(current, [])
            continue
        parsed = parse_instruction(line)
        if parsed is None:
            continue
        name, shape, opcode, args, attrs = parsed
        operands = re.findall(r"%([\w.\-]+)", args)
        if not operands and args.strip() and opcode not in ("parameter", "constant", "iota"):
            operands = [a.strip().split()[-1] for a in args.split(",") if a.strip()]
        ins = Instruction(name, shape, opcode, operands, attrs, current)
        comps.setdefault(current, []).append(ins)
        if s.startswith("ROOT"):
            roots[current] = name
    return comps, roots


def _group_size(attrs: str) -> int:
    m = _GROUPS_MESH.search(attrs)
    if m:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
        axes = re.findall(r"'([^']+)'", m.group(2))
        return math.prod(int(sizes.get(a, 1)) for a in axes) if axes else 1
    m = _GROUPS_IOTA.search(attrs)
    if m:
        dims = [int(d) for d in m.group(1).split(",") if d]
        return math.prod(dims[1:]) if len(dims) > 1 else dims[0]
    m = _GROUPS_EXPLICIT.search(attrs)
    if m and m.group(1):
        first = re.search(r"\{([0-9,\s]*)\}", m.group(1))
        return len([x for x in first.group(1).split(",") if x.strip()]) if first else 1
    if "collective-permute" in attrs or _PAIRS.search(attrs):
        return 2
    return 1


def _kind_of(opcode: str) -> str | None:
    base = opcode[:-6] if opcode.endswith("-start") else opcode
    return base if base in KINDS else None


def _slices_only(comps: Mapping[str, list[Instruction]], users: Mapping[str, list[Instruction]], value: str,
                 value_bytes: int, group: int, tuple_index: int | None = None) -> bool:
    """True when every use of ``value`` (through get-tuple-element/bitcast/copy) keeps 1/group of
    it with a dynamic-slice, directly or inside a fusion."""
    uses = users.get(value, [])
    if not uses or group <= 1:
        return False
    for u in uses:
        if u.opcode == "get-tuple-element":
            idx = re.search(r"index=(\d+)", u.attrs)
            if tuple_index is not None and idx and int(idx.group(1)) != tuple_index:
                continue
            if not _slices_only(comps, users, u.name, value_bytes, group):
                return False
            continue
        if u.opcode in ("bitcast", "copy", "reshape"):
            if not _slices_only(comps, users, u.name, value_bytes, group):
                return False
            continue
        if shape_bytes(u.shape) * group != value_bytes:
            return False
        if u.opcode == "dynamic-slice":
            continue
        if u.opcode == "fusion":
            called = _CALLS_RE.search(u.attrs)
            body = comps.get(called.group(1), []) if called else []
            if any(i.opcode == "dynamic-slice" for i in body):
                continue
        return False
    return True


def collectives(hlo_text: str) -> list[Collective]:
    """The collectives of a compiled HLO module's text (``compiled.as_text()``).

    Args:
        hlo_text: the module's text.

    Returns:
        One :class:`Collective` per operand of every collective instruction, in text order.

    Raises:
        ArgumentTypeError: ``hlo_text`` is not a string.
    """
    if not isinstance(hlo_text, str):
        raise ArgumentTypeError(f"collectives: hlo_text should be an HLO module's text. Got "
                                f"{type(hlo_text).__name__}. Fix: pass compiled.as_text().")
    comps, _roots = _parse(hlo_text)
    users: dict[str, list[Instruction]] = {}
    shapes: dict[str, str] = {}
    for instrs in comps.values():
        for ins in instrs:
            shapes[ins.name] = ins.shape
            for o in ins.operands:
                users.setdefault(o, []).append(ins)
    out: list[Collective] = []
    for comp, instrs in comps.items():
        for ins in instrs:
            kind = _kind_of(ins.opcode)
            if kind is None:
                continue
            group = _group_size(ins.attrs)
            result_shape = ins.shape
            done: list[Instruction] = []
            if ins.opcode.endswith("-start"):
                done = [u for u in users.get(ins.name, []) if u.opcode.endswith("-done")]
                result_shape = done[0].shape if done else ins.shape
            op_shapes = [shapes.get(o, "") for o in ins.operands]
            results = _array_shapes(result_shape)
            if ins.opcode.endswith("-start") and len(results) > len(op_shapes) and not done:
                results = results[len(op_shapes):]  # (operands..., results...) start tuples
            for k, osh in enumerate(op_shapes):
                ob = shape_bytes(osh)
                rb = shape_bytes(results[k]) if k < len(results) else ob
                dt = _ARRAY_RE.search(osh)
                equivalent = kind
                if kind == "all-reduce":
                    tuple_index = k if len(op_shapes) > 1 else None
                    value = ins.name
                    if ins.opcode.endswith("-start"):
                        done_users = [u for u in users.get(ins.name, []) if u.opcode.endswith("-done")]
                        value = done_users[0].name if done_users else ins.name
                    if _slices_only(comps, users, value, ob, group, tuple_index):
                        equivalent = "reduce-scatter"
                out.append(Collective(kind, ins.name, k, comp, dt.group(1) if dt else "?", ob, rb,
                                      group, equivalent))
    return out


def comm_bytes(colls: Iterable[Collective], map_cpu: bool = True, times: float = 1.0) -> dict[str, float]:
    """Bytes per device by collective kind.

    Args:
        colls: collectives from :func:`collectives`.
        map_cpu: count a CPU all-reduce + dynamic-slice as the reduce-scatter it stands for, with
            the cost model's ``B`` (its operand bytes, the size before scattering).
        times: multiply every entry (executions per step).

    Returns:
        ``{kind: bytes}`` for every kind in :data:`KINDS` (zero when absent).
    """
    if not isinstance(colls, Iterable) or isinstance(colls, str | bytes):
        raise ArgumentTypeError(f"comm_bytes: colls should be the collectives from collectives(). "
                                f"Got {type(colls).__name__}. Fix: comm_bytes(collectives(text)).")
    out = dict.fromkeys(KINDS, 0.0)
    for c in colls:
        kind = c.equivalent if map_cpu else c.kind
        out[kind] = out.get(kind, 0.0) + c.bytes * times
    return out


@dataclass(frozen=True)
class MemoryStats:
    """Per-device memory of one compiled executable (``compiled.memory_analysis()``), bytes.

    Attributes:
        argument: inputs; ``output``: results; ``temp``: scratch; ``alias``: outputs that reuse
            input buffers; ``code``: generated code.
    """

    argument: int
    output: int
    temp: int
    alias: int = 0
    code: int = 0

    @property
    def total(self) -> int:
        """Bytes live while the executable runs: arguments + outputs + temporaries - aliased."""
        return self.argument + self.output + self.temp - self.alias


def memory_stats(compiled: Any) -> MemoryStats:
    """:class:`MemoryStats` of a ``jax.stages.Compiled`` (zeros when the backend has none)."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        m = None
    if m is None:
        return MemoryStats(0, 0, 0)
    return MemoryStats(int(m.argument_size_in_bytes), int(m.output_size_in_bytes),
                       int(m.temp_size_in_bytes), int(m.alias_size_in_bytes),
                       int(getattr(m, "generated_code_size_in_bytes", 0)))
