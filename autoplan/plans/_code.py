"""A plan as Python code a user pastes into a training script: :meth:`autoplan.Plan.to_code`.

The snippet builds the plan's mesh (one per stage for a pipeline plan) and a function
``shardings_for(args)`` returning ``NamedSharding`` pytrees that mirror the train step's
positional arguments, whatever their container types (``tree_map_with_path`` over the user's own
arguments). Which spec a leaf gets is a short list of rules, ``(argument, regular expression over
the leaf's jax.tree_util.keystr path, PartitionSpec)``, first match wins, replicated when none
does; the rules are found from the plan's inputs:

1. each leaf path is generalised at its numbered parts (``['layers_12']`` -> ``['layers_\\d+']``,
   ``[3]`` -> ``[\\d+]``), so a model's repeated layers share one rule;
2. a group of leaves with one generalised path and one spec (and stage) becomes one rule;
   in a group whose leaves differ, the fewest numbered components whose numbers decide the
   spec and stage keep the numbers they were seen with (``['fc1']``, or a pipeline stage's
   ``['layers_(?:0|1|2)']``), the others stay generalised;
3. rules of one argument and spec that differ in one path component are merged into an
   alternation (``.(?:mu|nu)`` for Adam's two moments);
4. every input of the plan is checked against the rules (first match wins): a rule set that
   would give any leaf another spec is replaced by exact paths.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from autoplan.plans._spec import Spec

__all__ = ["plan_to_code", "path_rules"]

_TOKEN = re.compile(r"\[(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|-?\d+)\]|\.[A-Za-z_]\w*")
_NUMBERED_KEY = re.compile(r"^\['(.*?)(\d+)'\]$")
_INDEX = re.compile(r"^\[(\d+)\]$")

Rule = tuple[int, int, str, tuple]  # (stage, arg, regex, spec)


def _tokens(path: str) -> list[str]:
    toks = _TOKEN.findall(path)
    if "".join(toks) != path:  # a path keystr writes otherwise: matched exactly, as one token
        return [path]
    return toks


def _general(tok: str) -> tuple[str, str | None]:
    """A token's generalised form (a regex) and its number when it has one."""
    m = _NUMBERED_KEY.match(tok)
    if m:
        return r"\['" + re.escape(m.group(1)) + r"\d+'\]", m.group(2)
    m = _INDEX.match(tok)
    if m:
        return r"\[\d+\]", m.group(1)
    return re.escape(tok), None


def _with_numbers(tok: str, numbers: Sequence[str]) -> str:
    alt = "|".join(sorted(set(numbers), key=int))
    alt = alt if len(set(numbers)) == 1 else f"(?:{alt})"
    m = _NUMBERED_KEY.match(tok)
    if m:
        return r"\['" + re.escape(m.group(1)) + alt + r"'\]"
    return r"\[" + alt + r"\]"


def _first_match(rules: Sequence[Rule], arg: int, path: str) -> Rule | None:
    return next((r for r in rules if r[1] == arg and re.search(r[2], path)), None)


def _exact(stage: int, arg: int, path: str, spec: tuple) -> Rule:
    return (stage, arg, "^" + re.escape(path) + "$", spec)


def path_rules(leaves: Sequence[tuple[int, str, tuple, int]], *, default: bool = True
               ) -> list[Rule]:
    """Short first-match rules reproducing every leaf's spec and stage.

    Args:
        leaves: ``(arg, path, spec, stage)`` per input leaf; ``spec`` a tuple (one entry per
            dimension, ``None`` or mesh-axis names).
        default: a leaf matching no rule is replicated on stage 0 (so no rule is written for
            such leaves); False when every leaf must be matched (pipeline plans, where each
            leaf belongs to a stage).

    Returns:
        ``(stage, arg, regex, spec)`` rules; the first whose ``arg`` is the leaf's argument and
        whose regex matches its path gives the leaf's spec and stage.
    """
    def is_default(kind: tuple[tuple, int]) -> bool:
        return default and kind[1] == 0 and not any(kind[0])

    groups: dict[tuple[int, str], list[tuple[list[str], tuple[tuple, int]]]] = {}
    for arg, path, spec, stage in leaves:
        toks = _tokens(path)
        key = (arg, "".join(_general(t)[0] for t in toks))
        groups.setdefault(key, []).append((toks, (tuple(spec), stage)))
    rules: list[Rule] = []
    for (arg, _), members in groups.items():
        rules += _group_rules(arg, members, is_default)
    rules = _merge_alternatives(rules)
    if not _reproduces(rules, leaves, default):
        rules = [_exact(stage, arg, path, tuple(spec)) for arg, path, spec, stage in leaves
                 if not is_default((tuple(spec), stage))]
    return rules


def _group_rules(arg: int, members: list[tuple[list[str], tuple[tuple, int]]],
                 is_default: Any) -> list[Rule]:
    """The rules of leaves sharing one generalised path: the fewest numbered components whose
    numbers decide the spec and stage, written as alternations of the numbers seen."""
    toks0 = members[0][0]
    numbered = [p for p, t in enumerate(toks0) if _general(t)[1] is not None]
    for size in range(min(len(numbered), 3) + 1):
        for q in itertools.combinations(numbered, size):
            by_key: dict[tuple[str, ...], tuple[tuple, int]] = {}
            if any(by_key.setdefault(tuple(_general(t[p])[1] for p in q), kind) != kind
                   for t, kind in members):
                continue
            rules: list[Rule] = []
            kinds: dict[tuple[tuple, int], list[tuple[str, ...]]] = {}
            for key, kind in by_key.items():
                kinds.setdefault(kind, []).append(key)
            for kind, keys in kinds.items():
                if is_default(kind):
                    continue
                sets = [sorted({k[j] for k in keys}, key=int) for j in range(size)]
                product = len(keys) == math.prod(len(x) for x in sets)
                for combo in ([tuple(sets)] if product else [tuple([v] for v in k) for k in keys]):
                    rx = []
                    for pos, tok in enumerate(toks0):
                        if pos in q:
                            rx.append(_with_numbers(tok, combo[q.index(pos)]))
                        else:
                            rx.append(_general(tok)[0])
                    rules.append((kind[1], arg, "^" + "".join(rx) + "$", kind[0]))
            return rules
    return [_exact(kind[1], arg, "".join(t), kind[0]) for t, kind in members if not is_default(kind)]


_PREFIX_END = r"(?=[\[.]|$)"  # a path prefix ends where a component does


def _ending(rx: str) -> str:
    return _PREFIX_END if rx.endswith(_PREFIX_END) else "$"


def _split(rx: str) -> list[str]:
    """A rule's regex back into its path components (the body between ``^`` and its end)."""
    body = rx[1:-len(_ending(rx))]
    out, depth, cur, i = [], 0, "", 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if depth == 0 and nxt in "[." and cur:
                out.append(cur)
                cur = ""
            cur += ch + nxt
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        cur += ch
        i += 1
    if cur:
        out.append(cur)
    return out


_KEY_ALTS = re.compile(r"^\\\['(?:\(\?:)?([\w|]+?)\)?'\\\]$")


def _alternatives(tok: str) -> list[str] | None:
    """The names of a dict-key token regex (``\\['a'\\]`` or ``\\['(?:a|b)'\\]``), else None."""
    m = _KEY_ALTS.match(tok)
    return m.group(1).split("|") if m else None


def _merge_alternatives(rules: list[Rule]) -> list[Rule]:
    """Merge rules of one stage, argument and spec whose paths differ in one dict key.

    The pairs are taken in order (the first mergeable pair ``i < j`` merges into ``i``, and the
    scan starts again), without re-reading what a merge cannot have changed: the rows before
    ``i`` held no mergeable pair, and of their pairs only those with the merged rule ``i`` are
    new, so after a merge the scan looks at those, then goes on from row ``i``. The merges are
    the ones a full rescan after each would make, in the same order."""
    rules = list(rules)
    parts: dict[str, list[str]] = {}

    def split(rx: str) -> list[str]:
        got = parts.get(rx)
        if got is None:
            got = parts[rx] = _split(rx)
        return got

    def merged(a: Rule, b: Rule) -> Rule | None:
        if (a[0], a[1], a[3], _ending(a[2])) != (b[0], b[1], b[3], _ending(b[2])):
            return None
        ta, tb = split(a[2]), split(b[2])
        if len(ta) != len(tb):
            return None
        diff = [k for k in range(len(ta)) if ta[k] != tb[k]]
        if len(diff) != 1:
            return None
        alts_a, alts_b = _alternatives(ta[diff[0]]), _alternatives(tb[diff[0]])
        if alts_a is None or alts_b is None:
            return None
        names = sorted(set(alts_a) | set(alts_b))
        toks = list(ta)
        toks[diff[0]] = r"\['(?:" + "|".join(names) + r")'\]"
        return (a[0], a[1], "^" + "".join(toks) + _ending(a[2]), a[3])

    def first(pairs: Iterable[tuple[int, int]]) -> tuple[int, int, Rule] | None:
        """The first pair ``(i, j)`` that merges, with the merged rule."""
        return next(((i, j, m) for i, j in pairs
                     if (m := merged(rules[i], rules[j])) is not None), None)

    row, changed = 0, False
    while row < len(rules):
        # once this row's rule has changed, an earlier row may merge with it: the first does
        hit = first((k, row) for k in range(row)) if changed else None
        if hit is None:
            hit = first((row, j) for j in range(row + 1, len(rules)))
        if hit is None:
            row, changed = row + 1, False
            continue
        keep, drop, m = hit
        rules[keep] = m
        del rules[drop]
        row, changed = keep, True
    return rules


def stage_rules(leaves: Sequence[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """``(arg, regex, stage)`` rules over path prefixes saying which stage holds each leaf.

    The leaves' paths form a tree per argument; a rule is written at the highest node whose
    leaves all belong to one stage, and sibling nodes of one stage share a rule (an
    alternation of their numbers or names). The first rule whose regex matches a leaf's path
    gives its stage.
    """
    rules: list[tuple[int, str, int]] = []
    by_arg: dict[int, list[tuple[list[str], int]]] = {}
    for arg, path, stage in leaves:
        by_arg.setdefault(arg, []).append((_tokens(path), stage))

    def visit(arg: int, prefix: list[str], items: list[tuple[list[str], int]]) -> None:
        stages = {st for _, st in items}
        if len(stages) == 1:
            rules.append((arg, "^" + "".join(re.escape(t) for t in prefix) + _PREFIX_END,
                          stages.pop()))
            return
        children: dict[str, list[tuple[list[str], int]]] = {}
        for toks, st in items:
            if len(toks) > len(prefix):
                children.setdefault(toks[len(prefix)], []).append((toks, st))
        uniform: dict[int, list[str]] = {}
        for tok, sub in children.items():
            sub_stages = {st for _, st in sub}
            if len(sub_stages) == 1:
                uniform.setdefault(next(iter(sub_stages)), []).append(tok)
            else:
                visit(arg, prefix + [tok], sub)
        head = "^" + "".join(re.escape(t) for t in prefix)
        for st, toks in sorted(uniform.items()):
            rules.append((arg, head + _token_alternation(toks) + _PREFIX_END, st))

    for arg, items in sorted(by_arg.items()):
        visit(arg, [], items)
    merged = _merge_alternatives([(st, arg, rx, None) for arg, rx, st in rules])
    out = [(arg, rx, st) for st, arg, rx, _ in merged]
    if any(next((st for a, rx, st in out if a == arg and re.search(rx, path)), None) != stage
           for arg, path, stage in leaves):
        out = [(arg, "^" + re.escape(path) + "$", stage) for arg, path, stage in leaves]
    return out


def _token_alternation(toks: list[str]) -> str:
    """One regex for several sibling path tokens: ``\\[(?:0|1|2)\\]``, ``\\['(?:a|b)'\\]``."""
    if len(toks) == 1:
        return re.escape(toks[0])
    idx = [_INDEX.match(t) for t in toks]
    if all(idx):
        return r"\[(?:" + "|".join(sorted((m.group(1) for m in idx), key=int)) + r")\]"
    keys = [re.match(r"^\['(\w+)'\]$", t) for t in toks]
    if all(keys):
        return r"\['(?:" + "|".join(sorted(m.group(1) for m in keys)) + r")'\]"
    return "(?:" + "|".join(re.escape(t) for t in sorted(toks)) + ")"


def _reproduces(rules: Sequence[Rule], leaves: Sequence[tuple[int, str, tuple, int]],
                default: bool) -> bool:
    for arg, path, spec, stage in leaves:
        hit = _first_match(rules, arg, path)
        if hit is None:
            if not (default and stage == 0 and not any(spec)):
                return False
        elif (hit[0], tuple(hit[3])) != (stage, tuple(spec)):
            return False
    return True


def _mesh_code(name: str, device_ids: Sequence[int], shape: Sequence[int],
               axis_names: Sequence[str]) -> str:
    ids = list(device_ids)
    if ids == list(range(len(ids))):
        pick = f"np.array(jax.devices()[:{len(ids)}])"
    else:
        pick = f"np.array(jax.devices())[{ids}]"
    axes = ", ".join(repr(a) for a in axis_names) + ("," if len(axis_names) == 1 else "")
    types = f"(AxisType.Auto,) * {len(axis_names)}"
    shape_txt = ", ".join(map(str, shape))
    return f"{name} = Mesh({pick}.reshape({shape_txt}), ({axes}), axis_types={types})"


def levers_code(plan: Any) -> list[str]:
    """The lines of a plan's memory levers: ``REMAT_LAYERS`` (the rematerialised layers' names,
    the scopes of their operators) with ``remat(name, fn)``, which wraps a layer's function in
    ``jax.checkpoint`` (saving nothing inside it) when the plan rematerialises that layer, and
    ``ZERO`` (per stage, its ZeRO level and the mesh axes it shards over)."""
    remat = [name for s in plan.stages for name in s.remat_layers]
    zero = {s.index: (s.zero, tuple(s.zero_axes)) for s in plan.stages if s.zero}
    lines = ["", "", "# memory levers the search chose (autoplan's stage executor applies them; in a "
             "step of your own, wrap the layers with remat() and shard as ZERO says)", "# layers whose forward is recomputed in the backward "
             "(jax.checkpoint), by layer name", "REMAT_LAYERS = frozenset({"]
    lines += [f"    {name!r}," for name in remat]
    lines += ["})", "", "",
              "def remat(name, fn):",
              '    """`fn` (a layer\'s function) rematerialised when the plan says so: wrap each',
              '    layer as `x = remat("layers_3", block)(params, x)`."""',
              "    if name in REMAT_LAYERS:",
              "        return jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)",
              "    return fn",
              "",
              "",
              "# stage -> (ZeRO level, mesh axes it shards over): 1 the optimizer state, 2 also "
              "the gradients, 3 also the parameters",
              "ZERO = {" + ", ".join(f"{k}: ({z}, {axes!r})" for k, (z, axes) in zero.items()) + "}"]
    return lines


def plan_to_code(plan: Any, *, logical_axis_rules: bool | None = None) -> str:
    """The snippet of :meth:`autoplan.Plan.to_code` (see the module docstring)."""
    pipeline = len(plan.stages) > 1
    rules = path_rules([(i.arg, i.path, tuple(i.spec), 0) for i in plan.inputs])
    stages = stage_rules([(i.arg, i.path, i.stage) for i in plan.inputs]) if pipeline else []
    arg_names: dict[int, str] = {}
    for i in plan.inputs:
        arg_names.setdefault(i.arg, i.arg_name)
    args = ", ".join(arg_names.get(a, f"arg{a}") for a in range(1 + max(arg_names, default=-1)))
    cl = plan.cluster
    lines = [
        f'"""Shardings of plan [{plan.label}] for {plan.model} on {cl.spec}: {plan.describe()}.',
        "",
        f"Generated by autoplan; predicted step time {plan.predicted.step_time * 1e3:.3f} ms, "
        f"{plan.predicted.memory_per_device / 2**30:.3f} GiB per device.",
        '"""',
        "import re",
        "",
        "import jax",
        "import numpy as np",
        "from jax.sharding import AxisType, Mesh, NamedSharding",
        "from jax.sharding import PartitionSpec as P",
        "",
    ]
    if pipeline:
        lines.append(f"# one mesh per pipeline stage ({plan.num_devices} devices of jax.devices())")
        for s in plan.stages:
            lines.append(_mesh_code(f"mesh_{s.index}", s.device_ids, s.mesh_shape, s.axis_names))
        lines.append("meshes = [" + ", ".join(f"mesh_{s.index}" for s in plan.stages) + "]")
        lines += ["", "# (argument, regex over the leaf's jax.tree_util.keystr path, stage): which "
                      "stage holds a leaf; the first match wins", "STAGES = ["]
        lines += [f'    ({arg}, r"{rx}", {st}),' for arg, rx, st in stages]
        lines.append("]")
    else:
        s = plan.stages[0]
        lines.append(f"# the plan's logical mesh over {s.num_devices} devices of jax.devices()")
        lines.append(_mesh_code("mesh", s.device_ids, s.mesh_shape, s.axis_names))
    lines += ["", "# (argument, regex over the leaf's jax.tree_util.keystr path, PartitionSpec): "
                  "the first match wins; other leaves are replicated", "RULES = ["]
    lines += [f'    ({arg}, r"{rx}", {Spec.of(spec).pspec_text(trim=True)}),' for _, arg, rx, spec in rules]
    lines += ["]", "", ""]
    if pipeline:
        lines += [
            "def shardings_for(args, stage):",
            '    """NamedSharding pytrees mirroring the train step\'s positional arguments, for the',
            '    leaves `stage` holds (None for the others)."""',
            "    def one(arg, tree):",
            "        def leaf(path, _):",
            "            key = jax.tree_util.keystr(path)",
            "            held = next(st for a, rx, st in STAGES if a == arg and re.search(rx, key))",
            "            spec = next((s for a, rx, s in RULES if a == arg and re.search(rx, key)), P())",
            "            return NamedSharding(meshes[stage], spec) if held == stage else None",
            "        return jax.tree_util.tree_map_with_path(leaf, tree)",
            "    return tuple(one(a, t) for a, t in enumerate(args))",
            "",
            "",
            "# each stage's program takes the leaves it holds:",
            f"# stage_shardings = [shardings_for(({args}), k) for k in range(len(meshes))]",
        ]
    else:
        lines += [
            "def shardings_for(args):",
            '    """NamedSharding pytrees mirroring the train step\'s positional arguments."""',
            "    def one(arg, tree):",
            "        def leaf(path, _):",
            "            key = jax.tree_util.keystr(path)",
            "            spec = next((s for a, rx, s in RULES if a == arg and re.search(rx, key)), P())",
            "            return NamedSharding(mesh, spec)",
            "        return jax.tree_util.tree_map_with_path(leaf, tree)",
            "    return tuple(one(a, t) for a, t in enumerate(args))",
            "",
            "",
            f"# in_shardings = shardings_for(({args}))",
            "# step = jax.jit(train_step, in_shardings=in_shardings)",
            f"# {args} = jax.device_put(({args}), in_shardings)",
        ]
    if any(s.levers for s in plan.stages):
        lines += levers_code(plan)
    if logical_axis_rules is None:
        logical_axis_rules = any("flax" in t for types in plan.arg_types for t in types)
    if logical_axis_rules:
        sharded = [(n, ax) for n, ax in plan.logical_axis_rules() if ax is not None]
        lines += ["", "# Flax logical axis rules (logical name -> mesh axes) for the sharded "
                      "parameter dimensions; the other names map to None",
                  "LOGICAL_AXIS_RULES = ["]
        lines += [f"    ({n!r}, {ax!r})," for n, ax in sharded]
        lines.append("]")
    return "\n".join(lines) + "\n"
