"""Names of layers from the parameters they hold (pytree paths), for models without named
scopes: the search names its layers with :func:`unit_name`, and a figure of a plan that records
no layer names its operators the same way."""

from __future__ import annotations

from collections.abc import Sequence

from autoplan.plans._planfile import parse_keystr

__all__ = ["unit_name", "split_input_name", "LEAF_KEYS"]

#: leaf keys that name a kind of array rather than a layer (dropped from layers' names)
LEAF_KEYS = frozenset({"kernel", "w", "weight", "bias", "b", "scale", "embedding", "value",
                       "gamma", "beta", "mean", "var"})


def split_input_name(name: str) -> tuple[str, str]:
    """``"params['dense0']['kernel']"`` -> ``("params", "['dense0']['kernel']")``: a graph
    input's name as its argument's name and its ``keystr`` path."""
    cut = min((i for i in (name.find("["), name.find(".")) if i >= 0), default=len(name))
    return name[:cut], name[cut:]


def unit_name(paths: Sequence[tuple[str, str]]) -> str | None:
    """The name of a unit holding the parameters ``paths`` (``(argument name, keystr path)``
    each, in the order the unit reads them): their longest common pytree path without its
    argument (``blocks[0]``), or with it when the path starts at a list position
    (``params[2]``); the leaf keys every library gives a parameter (``kernel``, ``bias``,
    ``weight``, ``.value``, ...) are dropped; siblings with no common path are joined
    (``conv1+conv2``; ``first..last`` for more than three). None for no parameter.

    Examples:
        >>> unit_name([("params", "['dense0']['kernel']"), ("params", "['dense0']['bias']")])
        'dense0'
        >>> unit_name([("params", "[2]")])
        'params[2]'
        >>> unit_name([("p", ".conv1.weight"), ("p", ".conv2.weight")])
        'conv1+conv2'
    """
    keyed = []
    for arg, path in paths:
        keys = parse_keystr(path)
        keys = list(keys) if keys is not None else [path]
        while len(keys) > 1 and keys[-1] in LEAF_KEYS:
            keys.pop()
        keyed.append((arg, keys))
    if not keyed:
        return None

    def text(arg: str, keys: Sequence[str | int]) -> str:
        out = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys)
        return arg + out if not keys or isinstance(keys[0], int) else out[1:]

    arg0 = keyed[0][0]
    if all(arg == arg0 for arg, _ in keyed):
        common = keyed[0][1]
        for _, keys in keyed[1:]:
            n = 0
            while n < min(len(common), len(keys)) and common[n] == keys[n]:
                n += 1
            common = common[:n]
        if common:
            return text(arg0, common)
    tops = list(dict.fromkeys(text(arg, keys[:1]) for arg, keys in keyed))
    return "+".join(tops) if len(tops) <= 3 else f"{tops[0]}..{tops[-1]}"
