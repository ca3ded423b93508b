"""Reading a compiled HLO module's text: element sizes, shape bytes, the entry's instructions.

Shared by the executor's collective parser (:mod:`autoplan.exec._hlo`) and the profiler
(:mod:`autoplan.costs._profile`, which counts a reference step's kernels and the bytes they move).

Example:
    >>> shape_bytes("(f32[16,8]{1,0}, s32[4])")
    528
    >>> text = '''
    ... ENTRY %main (p: f32[16,8]) -> f32[16,8] {
    ...   %p = f32[16,8]{1,0} parameter(0)
    ...   ROOT %t = f32[16,8]{1,0} tanh(%p)
    ... }'''
    >>> [(i.name, i.opcode, i.operands) for i in entry_instructions(text)]
    [('p', 'parameter', []), ('t', 'tanh', ['p'])]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autoplan._dtype import dtype_bytes

__all__ = ["Instruction", "dtype_size", "numpy_dtype_name", "shape_bytes", "split_shape",
           "parse_instruction", "entry_instructions", "kernel_traffic", "NOT_KERNELS"]

#: an HLO element type: ``pred``, ``token``, or a kind letter and bit width with an optional
#: float8/float4 suffix (``f32``, ``bf16``, ``s4``, ``u2``, ``c64``, ``f8e4m3fn``, ``f4e2m1fn``)
_HLO_TYPE = re.compile(r"(bf|[fsuc])(\d+)([a-z0-9]*)")
_KIND_NAMES = {"bf": "bfloat", "f": "float", "s": "int", "u": "uint", "c": "complex"}
ARRAY_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
OPCODE_RE = re.compile(r"^([a-z][a-z0-9\-]*)\(")
#: entry instructions that are not kernels of their own
NOT_KERNELS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast"})


def numpy_dtype_name(dtype: str) -> str | None:
    """The NumPy/JAX name of an HLO element type (``"f32"`` -> ``"float32"``, ``"pred"`` ->
    ``"bool"``, ``"f8e4m3fn"`` -> ``"float8_e4m3fn"``), or None for a name that is not one."""
    if dtype in ("pred", "token"):
        return "bool" if dtype == "pred" else "token"
    m = _HLO_TYPE.fullmatch(dtype)
    if m is None:
        return None
    kind, bits, suffix = m.groups()
    return f"{_KIND_NAMES[kind]}{bits}" + (f"_{suffix}" if suffix else "")


def dtype_size(dtype: str) -> int:
    """Bytes per element of an HLO element type (``"f32"`` -> 4), as
    :func:`autoplan._dtype.dtype_bytes` gives them for its NumPy name (sub-byte types take one
    byte); 0 for a token or an unknown type."""
    name = numpy_dtype_name(dtype)
    return 0 if name is None else dtype_bytes(name)


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string: an array (``f32[16,8]{1,0}``) or a tuple of arrays."""
    total = 0
    for dt, dims in ARRAY_RE.findall(shape):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * dtype_size(dt)
    return total


def split_shape(rest: str) -> tuple[str, str]:
    """Split ``'(f32[2], f32[3]) all-reduce(...)...'`` into the shape and the remainder."""
    rest = rest.strip()
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1:].strip()
        return rest, ""
    sp = rest.find(" ")
    return (rest, "") if sp < 0 else (rest[:sp], rest[sp + 1:].strip())


@dataclass(frozen=True)
class Instruction:
    """One instruction: its ``name``, result ``shape``, ``opcode`` and operand names; where the
    reader keeps them, its attribute text (``replica_groups=...``) and the computation it is in."""

    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str = ""
    computation: str = ""


def parse_instruction(line: str) -> tuple[str, str, str, str, str] | None:
    """``(name, shape, opcode, operand text, attributes)`` of one instruction line, or None."""
    m = INSTR_RE.match(line)
    if not m:
        return None
    shape, rest = split_shape(m.group(2))
    om = OPCODE_RE.match(rest)
    if not om:
        return None
    depth, end = 0, len(rest)
    for i in range(om.end() - 1, len(rest)):
        depth += rest[i] == "("
        depth -= rest[i] == ")"
        if depth == 0:
            end = i
            break
    return m.group(1), shape, om.group(1), rest[om.end():end], rest[end + 1:]


def entry_instructions(text: str) -> list[Instruction]:
    """The instructions of a module's ENTRY computation, in order."""
    start = text.find("ENTRY")
    if start < 0:
        return []
    out = []
    for line in text[start:].splitlines()[1:]:
        if line.strip() == "}":
            break
        parsed = parse_instruction(line)
        if parsed is not None:
            name, shape, opcode, args, _ = parsed
            out.append(Instruction(name, shape, opcode, re.findall(r"%([\w.\-]+)", args)))
    return out


def kernel_traffic(text: str) -> list[int]:
    """The bytes each kernel of a module's entry reads (its operands) and writes (its results),
    one entry per instruction that runs as a kernel (XLA's ``bytes accessed``)."""
    instrs = entry_instructions(text)
    shapes = {i.name: i.shape for i in instrs}
    return [shape_bytes(i.shape) + sum(shape_bytes(shapes.get(o, "")) for o in i.operands)
            for i in instrs if i.opcode not in NOT_KERNELS]
