"""The keys of a pytree leaf's path as ``jax.tree_util.keystr`` writes it (plan files key their
inputs' specs by it; the search matches optimizer state to parameters by its endings)."""

from __future__ import annotations

import re

__all__ = ["parse_keystr"]

# one key of a jax.tree_util.keystr path: ['name'], ["name"], [3], .attribute, or another
# bracketed key repr (a tuple dict key, say), kept whole
_KEY_RE = re.compile(r"\[(?:'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"|(-?\d+)|([^\]]*))\]|\.([A-Za-z_]\w*)")


def parse_keystr(path: str) -> list[str | int] | None:
    """The keys of a ``jax.tree_util.keystr`` path, names and list positions in order (none for
    ``""``, an argument that is one leaf), or None when ``path`` is not one."""
    keys: list[str | int] = []
    pos = 0
    for m in _KEY_RE.finditer(path):
        if m.start() != pos:
            return None
        pos = m.end()
        if m.group(3) is not None:
            keys.append(int(m.group(3)))
        else:
            keys.append(next(g for g in (m.group(1), m.group(2), m.group(4), m.group(5)) if g is not None))
    return keys if pos == len(path) else None
