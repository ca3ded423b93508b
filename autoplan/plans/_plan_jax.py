"""A plan applied in JAX: the pytrees of its inputs, its meshes, Flax rules, and its checks.

Functions of a :class:`~autoplan.Plan` (read through its fields only; the ``Plan`` methods
``partition_specs``, ``named_shardings``, ``mesh``, ``logical_axis_rules`` and
``check_matches`` call them):

* :func:`input_trees`: one pytree per positional argument of the train step holding a value
  per graph input, in the user's own container types (from ``like=``, from the argument
  structures a search kept in memory, or rebuilt from the recorded ``keystr`` paths);
* :func:`stage_mesh`: a stage's ``jax.sharding.Mesh`` over the devices;
* :func:`named_shardings`: ``NamedSharding`` pytrees over a mesh;
* :func:`logical_axis_rules`: Flax-style logical-axis rules of the parameters' specs;
* :func:`check_matches`: :class:`~autoplan.PlanMismatchError` unless the plan was made for a
  graph (and a device count).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autoplan._errors import PlanMismatchError
from autoplan.plans._planfile import parse_keystr

__all__ = ["input_trees", "stage_mesh", "named_shardings", "logical_axis_rules", "check_matches"]


def input_trees(plan: Any, leaf: Callable[[Any], Any], like: Any = None) -> tuple[Any, ...]:
    """One pytree per positional argument of the plan's train step, with ``leaf(input)`` at the
    place of each of the plan's inputs (:class:`~autoplan.InputSpec`) and ``None`` where the
    structure has a leaf the plan does not know.

    The structure comes from ``like`` when given, else from the arguments the search traced
    (``plan.arg_trees``), else it is rebuilt as nested dicts and lists from the recorded paths,
    which is exact only for arguments made of dicts and lists (``plan.arg_types`` says which
    are not).

    Raises:
        PlanMismatchError: ``like`` has another number of arguments or leaves the plan does not
            know, or the plan (loaded from a file) cannot rebuild an argument's types.
    """
    by_key = {(i.arg, i.path): i for i in plan.inputs}
    nargs = 1 + max((i.arg for i in plan.inputs), default=-1)

    def pick(i: Any) -> Any:
        return None if i is None else leaf(i)

    if like is not None:
        return tuple(t.treedef.unflatten([pick(by_key[(a, p)]) for p in t.paths])
                     for a, t in enumerate(_like_trees(plan, like, nargs, by_key)))
    if plan.arg_trees is not None and len(plan.arg_trees) == nargs:
        return tuple(t.treedef.unflatten([pick(by_key.get((a, p))) for p in t.paths])
                     for a, t in enumerate(plan.arg_trees))
    for a, types in enumerate(plan.arg_types):
        if types:
            name = next((i.arg_name for i in plan.inputs if i.arg == a), f"argument {a}")
            raise PlanMismatchError(
                f"partition_specs: argument {a} ({name}) of {plan.model!r} is a pytree of "
                f"{', '.join(types)}, which a plan file records by path only, so its structure "
                "cannot be rebuilt without the arguments. Fix: pass like=<the step's "
                "arguments> (arrays or jax.ShapeDtypeStructs, or the Workload), e.g. "
                "plan.named_shardings(like=(params, opt_state, batch)).")
    trees: list[Any] = [None] * nargs
    for i in plan.inputs:
        keys = parse_keystr(i.path)
        if not keys:  # one leaf (or not a keystr path: kept whole)
            trees[i.arg] = pick(i)
            continue
        if trees[i.arg] is None:
            trees[i.arg] = [] if isinstance(keys[0], int) else {}
        _set_path(trees[i.arg], keys, pick(i))
    return tuple(trees)


def _like_trees(plan: Any, like: Any, nargs: int, by_key: Mapping[tuple[int, str], Any]
                ) -> tuple[Any, ...]:
    """The :class:`autoplan.tracing._workload.ArgTree` of ``like``, checked against the plan."""
    from autoplan.tracing._workload import arg_trees  # noqa: PLC0415

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
                    f"({plan.model}) does not know. Fix: use the plan made for this model.")
        held = sum(1 for (arg, _) in by_key if arg == a)
        if held != len(t.paths):
            raise PlanMismatchError(
                f"partition_specs: argument {a} has {len(t.paths)} leaves but the plan "
                f"({plan.model}) has {held}. Fix: use the plan made for this model.")
    return trees


def stage_mesh(plan: Any, devices: Sequence[Any] | None = None, stage: int = 0):
    """A ``jax.sharding.Mesh`` for ``stage`` over ``devices`` (default ``jax.devices()``),
    taking the stage's device ids in order; axis types Auto.

    Raises:
        PlanMismatchError: fewer devices than the plan uses.
    """
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import AxisType, Mesh  # noqa: PLC0415

    st = plan.stages[stage]
    devs = list(devices) if devices is not None else jax.devices()
    if len(devs) < plan.num_devices:
        raise PlanMismatchError(
            f"mesh: the plan uses {plan.num_devices} devices but {len(devs)} are available. "
            "Fix: run on a machine with that many devices, set jax_num_cpu_devices, or make a "
            f"plan for {len(devs)} devices.")
    arr = np.array([devs[d] for d in st.device_ids], dtype=object).reshape(st.mesh_shape)
    return Mesh(arr, st.axis_names, axis_types=(AxisType.Auto,) * len(st.axis_names))


def named_shardings(plan: Any, specs: Any, mesh: Any = None, stage: int | None = None) -> Any:
    """``NamedSharding`` pytrees of ``specs`` (the plan's ``partition_specs``) over ``mesh``
    (default :func:`stage_mesh` of ``stage``, or of stage 0); ``None`` stays ``None``."""
    import jax  # noqa: PLC0415
    from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

    m = mesh if mesh is not None else stage_mesh(plan, stage=stage or 0)
    return jax.tree_util.tree_map(lambda p: NamedSharding(m, p), specs,
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))


def logical_axis_rules(plan: Any) -> list[tuple[str, str | tuple[str, ...] | None]]:
    """Flax-style logical-axis rules read off the parameters' specs: for each parameter
    dimension a logical name ``"<param leaf>_<dim>"`` mapped to its mesh axes."""
    rules = []
    for i in plan.inputs:
        if i.kind != "parameter":
            continue
        base = ".".join(str(k) for k in parse_keystr(i.path) or ()) or i.arg_name
        for d, e in enumerate(i.spec):
            rules.append((f"{base}_{d}", None if not e else (e[0] if len(e) == 1 else tuple(e))))
    return rules


def check_matches(plan: Any, graph_or_fingerprint: Any, num_devices: int | None = None) -> None:
    """Raise :class:`PlanMismatchError` unless ``plan`` was made for this graph (and, when
    given, this many devices)."""
    fp = getattr(graph_or_fingerprint, "fingerprint", graph_or_fingerprint)
    if fp != plan.fingerprint:
        raise PlanMismatchError(
            f"this plan was made for model {plan.model!r} (fingerprint {plan.fingerprint}) but the "
            f"workload given has fingerprint {fp}: its parameters' paths, shapes or dtypes differ. "
            "Fix: make a plan for this workload (autoplan.plan or 'autoplan plan').")
    if num_devices is not None and num_devices != plan.num_devices:
        raise PlanMismatchError(
            f"this plan uses {plan.num_devices} devices but {num_devices} are available. Fix: "
            f"make a plan for {num_devices} devices (e.g. --cluster cpu:{num_devices}).")


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
