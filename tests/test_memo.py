"""The per-object memo (:mod:`autoplan._memo`): its accessors compute once per owner (and
arguments), and no module under ``autoplan/`` keys a value by a string, so two modules can
share a value only by calling one accessor."""

from __future__ import annotations

import ast
import pathlib

from autoplan._memo import BoundedCache, forget, memo, per_owner, per_owner_and_args

ROOT = pathlib.Path(__file__).resolve().parents[1] / "autoplan"


class _Owner:
    pass


class _Slotted:
    __slots__ = ()


def _spelled_keys(source: str, filename: str = "<test>") -> list[str]:
    """``file:line`` of every ``memo(...)`` call whose key is not the accessor that computes the
    value: a literal (a string, a number), a tuple whose first element is not a name (``("pins",
    key)``), or anything else that is not a name, an attribute or such a tuple."""
    bad = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(
            func, ast.Attribute) else None
        if name != "memo":
            continue
        key = node.args[1] if len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg == "key"), None)
        head = key.elts[0] if isinstance(key, ast.Tuple) and key.elts else key
        if not isinstance(head, (ast.Name, ast.Attribute)):
            bad.append(f"{filename}:{node.lineno}")
    return bad


def test_no_module_keys_a_memo_by_a_spelled_name():
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        bad += _spelled_keys(path.read_text(), str(path.relative_to(ROOT.parent)))
    assert not bad, ("memo keys should be the accessor function (or (accessor, *args)), not a "
                     f"string: {bad}. Fix: make the value a per_owner / per_owner_and_args "
                     "accessor and call it from every module that reads it.")


def test_the_key_check_sees_spelled_keys():
    src = '''
memo(graph, "fusion_context", make)
memo(graph, ("pins", key), make)
_memo.memo(workload, ("search", "microbatch trace", m), make)
memo(graph, key=f"x{k}", make=make)
memo(graph, (), make)
memo(graph, fusion_context, make)
memo(graph, (pinned_by, key), make)
memo(r.source, (self.accessor, dev.id), make)
memo(owner, accessor, lambda: fn(owner))
'''
    assert _spelled_keys(src) == ["<test>:2", "<test>:3", "<test>:4", "<test>:5", "<test>:6"]


def test_per_owner_and_args_computes_once_per_owner_and_args():
    calls = []

    @per_owner_and_args
    def scaled(owner, k, m=1):
        """The owner's scale."""
        calls.append((owner, k, m))
        return [k * m]

    a, b = _Owner(), _Owner()
    first = scaled(a, 2)
    assert scaled(a, 2) is first and calls == [(a, 2, 1)]  # the same owner and args: once
    assert scaled(a, 3) == [3] and scaled(a, 2, 5) == [10]  # other args: computed apart
    assert scaled(b, 2) is not first and scaled(b, 2) == [2]  # another owner: its own value
    assert calls == [(a, 2, 1), (a, 3, 1), (a, 2, 5), (b, 2, 1)]
    assert scaled.__name__ == "scaled" and scaled.__doc__ == "The owner's scale."
    forget(a)
    assert scaled(a, 2) is not first and len(calls) == 5  # forgotten: computed again


def test_owners_without_a_dict_are_not_cached():
    calls = []

    @per_owner_and_args
    def with_args(owner, k):
        calls.append(k)
        return k

    @per_owner
    def alone(owner):
        calls.append(None)
        return 0

    for owner in (_Slotted(), 7):
        calls.clear()
        assert with_args(owner, 1) == with_args(owner, 1) == 1 and alone(owner) == alone(owner) == 0
        assert calls == [1, 1, None, None]


def test_accessors_own_their_values():
    """Two accessors never read each other's values, whatever their arguments, and a direct
    ``memo`` call with an accessor's key is that accessor's value."""

    @per_owner
    def alone(owner):
        return "alone"

    @per_owner_and_args
    def with_args(owner, *args):
        return ("with", *args)

    owner = _Owner()
    assert alone(owner) == "alone" and with_args(owner) == ("with",)
    assert with_args(owner, alone) == ("with", alone)
    assert memo(owner, alone, lambda: "other") == "alone"
    assert memo(owner, (with_args, 1), lambda: "direct") == "direct" == memo(
        owner, (with_args, 1), lambda: "again")
    assert with_args(owner, 1) == "direct"  # the same key: the one value


def test_a_bounded_cache_empties_itself_once_over_its_limit():
    cache: BoundedCache[int, str] = BoundedCache(2)
    assert [cache.put(k, str(k)) for k in range(3)] == ["0", "1", "2"]
    assert dict(cache) == {0: "0", 1: "1", 2: "2"}  # (over the limit only after the third)
    assert cache.put(3, "3") == "3" and dict(cache) == {3: "3"}
    assert cache.get(0) is None and cache[3] == "3"


class _Picklable:
    pass


def test_a_pickled_owner_arrives_without_its_values():
    """Memoised values stay in their process: a mesh's number (mesh_id) is the order one
    process met its meshes, so a mesh sent to a worker must be numbered there again, not bring
    a number that names another mesh in the worker."""
    import pickle

    from autoplan import Cluster
    from autoplan.search.intra._reshard import mesh_id

    calls = []
    owner = _Picklable()
    assert memo(owner, _Picklable, lambda: calls.append(1) or "value") == "value"
    back = pickle.loads(pickle.dumps(owner))
    assert memo(back, _Picklable, lambda: calls.append(2) or "again") == "again"
    assert calls == [1, 2] and memo(owner, _Picklable, lambda: "no") == "value"
    mesh = Cluster.preset("p3.16xlarge", 2).logical_mesh((2, 8))
    n = mesh_id(mesh)
    sent = pickle.loads(pickle.dumps(mesh))
    assert not sent.__dict__.get("_autoplan_memo")
    assert mesh_id(sent) == n  # (numbered again here: the same mesh, the same number)
