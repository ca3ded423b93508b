"""A user's training step and its arguments: :class:`Workload`, what autoplan plans and runs.

``autoplan.Workload(step, (params, opt_state, batch))`` is the one form a user's own step takes
through every part of autoplan: :func:`autoplan.trace`, :func:`autoplan.search` (pipeline plans
included), :func:`autoplan.exec.run` and :func:`autoplan.exec.launch` (a ``module:function``
spec returning a Workload). It is the one workload type: the zoo's
:class:`autoplan.models.Workload` is this class, and so is what :func:`autoplan.load_workload`
returns; each carries its :class:`Origin` (a zoo name and size, a ``module:function``, or an
object built in this process).

The kind of each positional argument (``parameter``, ``optimizer_state``, ``batch``, ``key`` or
``input``) decides how the search treats it: parameters and their optimizer state are what a
stage holds, batch arguments are split into micro-batches along their leading dimension, and
PRNG keys (typed ``jax.random.key`` s, raw ``uint32`` ``jax.random.PRNGKey`` s, an
``nnx.Rngs`` state) are replicated on every device, never sharded or split.
:func:`infer_arg_kinds` reads them off the arguments and the step's signature when the user does
not say (see its docstring); ``Workload(..., arg_kinds=...)`` overrides.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from autoplan._errors import ModelError
from autoplan.tracing._graph import ARG_KINDS

__all__ = ["Workload", "Origin", "ORIGIN_KINDS", "ArgTree", "arg_trees", "infer_arg_kinds", "non_array_leaf",
           "check_key_kinds", "is_key_leaf", "ARG_KINDS", "as_workload", "is_workload_like",
           "abstract_leaf"]


# names a PRNG key argument goes by; a raw uint32 key (jax.random.PRNGKey) is known by them
_KEY_NAMES = {"rng", "key", "rngs", "prng", "prng_key", "rng_key", "keys", "dropout_rng",
              "dropout_key", "dropout_rngs", "sample_key", "noise_key", "rng_state"}
# flax.nnx's random-state variables: an nnx.Rngs split off with nnx.split(rngs)
_NNX_RNG_TYPES = {"RngKey", "RngCount", "RngState"}
# flax.nnx's optimizer-state variables: an nnx.Optimizer's state split off with nnx.split
_NNX_OPT_TYPES = {"OptState", "OptVariable", "OptArray"}

# argument names as training steps spell them (compared lower-case)
_NAMES = {
    "parameter": {"params", "param", "parameters", "weights", "model", "variables", "net",
                  "network", "train_params", "trainable", "diff_model", "model_params"},
    "optimizer_state": {"opt_state", "optimizer_state", "opt", "optim_state", "optimiser_state",
                        "opt_st", "tx_state", "optimizer"},
    "batch": {"batch", "data", "inputs", "input", "x", "xs", "x_batch", "tokens", "images",
              "image", "labels", "targets", "examples", "input_ids", "minibatch", "sample",
              "samples", "features"},
    "input": {"rng", "key", "rngs", "prng", "seed", "step", "lr", "learning_rate", "t", "i"},
}
_POSITIONAL = {1: ("parameter",), 2: ("parameter", "batch"),
               3: ("parameter", "optimizer_state", "batch")}


def _node_types(tree: Any) -> set[type]:
    """The types of every node (containers and leaves) of a pytree."""
    seen: set[type] = set()

    def visit(x: Any) -> bool:
        seen.add(type(x))
        return False

    jax.tree_util.tree_flatten(tree, is_leaf=visit)
    return seen


def _is_optimizer_node(t: type) -> bool:
    """True for an optax state's type or a Flax ``nnx.Optimizer`` state variable's."""
    return ((getattr(t, "__module__", "") or "").split(".")[0] == "optax"
            or (t.__name__ in _NNX_OPT_TYPES and (t.__module__ or "").startswith("flax")))


def _is_optimizer_state(tree: Any) -> bool:
    """True when a pytree holds an optax state (``ScaleByAdamState``, ``EmptyState``, ...) or
    the state of a Flax ``nnx.Optimizer`` (its ``OptState`` variables)."""
    return any(_is_optimizer_node(t) for t in _node_types(tree))


def _is_nnx_param(x: Any) -> bool:
    """True for a Flax NNX ``Param`` variable (or its split-off state)."""
    t = type(x)
    return ((t.__name__ == "Param" or getattr(getattr(x, "type", None), "__name__", "") == "Param")
            and (t.__module__ or "").startswith("flax"))


def _field_name(entry: Any) -> str | None:
    """The name of a pytree path entry: an attribute's or a string dict key's."""
    name = getattr(entry, "name", None)
    if name is None:
        name = getattr(entry, "key", None)
    return name if isinstance(name, str) else None


#: the names of an optimizer-state argument's field that holds only parameters (Flax linen's
#: ``params`` collection; not ``variables`` or ``model``, which hold batch statistics and other
#: state beside them), in the order they are looked for (the first one present is read)
_PARAM_FIELDS = ("params", "param", "parameters", "weights", "train_params", "trainable",
                 "model_params")


def parameter_leaves(arg: Any) -> list[bool]:
    """For each leaf of an optimizer-state argument (in ``jax.tree_util.tree_leaves`` order),
    whether it is a parameter the argument carries beside the optimizer's state. Two forms are
    read, and nothing else (anything in doubt stays optimizer state):

    * where the argument holds an optax state, every leaf of a field named like a parameters
      collection (``params``, ``weights``, ...: :data:`_PARAM_FIELDS`) that holds no optimizer
      state and no Flax NNX variable: a Flax ``TrainState``'s ``params``, a dict of ``params``
      beside ``opt_state`` (momentum kept by hand under ``params``, with no optax state, is
      state);
    * the Flax NNX ``Param`` variables outside the optimizer's state when they all sit under one
      top-level entry (``nnx.split((model, optimizer))``): Adam's moments are ``Param``
      variables inside the optimizer's state, and ``Param`` variables under two entries (a model
      and an EMA copy of it) cannot be told apart.

    Their kind is ``"parameter"``: they get the parameters' gradient buffers and memory levers,
    not the optimizer state's. Every leaf a form marks shares its path's first key."""
    flat = jax.tree_util.tree_flatten_with_path(arg)[0]
    out: list[bool] = []
    # (a Param variable inside an optimizer's state, Adam's moments of an nnx.State, is state)
    for item in jax.tree_util.tree_leaves(
            arg, is_leaf=lambda x: _is_nnx_param(x) or _is_optimizer_node(type(x))):
        out.extend([_is_nnx_param(item)] * len(jax.tree_util.tree_leaves(item)))
    tops = {path[0] for (path, _), param in zip(flat, out) if param and path}
    if len(tops) != 1:
        out = [False] * len(out)
    if any(out) or not _is_optimizer_state(arg):
        return out
    for name in _PARAM_FIELDS:
        field = arg.get(name) if isinstance(arg, dict) else getattr(arg, name, None)
        if (field is None or not jax.tree_util.tree_leaves(field) or _is_optimizer_state(field)
                or _has_nnx_variables(field)):
            continue
        return [bool(path) and _field_name(path[0]) == name for path, _ in flat]
    return out


def _has_nnx_variables(tree: Any) -> bool:
    """True when a pytree holds a Flax NNX variable (whose kind its type says, not its name)."""
    return any((t.__module__ or "").startswith("flax") and "nnx" in (t.__module__ or "")
               for t in _node_types(tree))


def is_key_leaf(leaf: Any) -> bool:
    """True for a typed PRNG key (``jax.random.key``, or its ``jax.ShapeDtypeStruct``)."""
    dtype = getattr(leaf, "dtype", None)
    try:
        return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    except TypeError:
        return False


def _is_raw_key_leaf(leaf: Any) -> bool:
    """True for what ``jax.random.PRNGKey`` makes: ``uint32`` words, the last dimension holding
    one key (2 words for threefry, 4 for RBG)."""
    shape = tuple(getattr(leaf, "shape", ()))
    return (str(getattr(leaf, "dtype", "")) == "uint32" and len(shape) >= 1
            and shape[-1] in (2, 4))


def _is_key_tree(tree: Any, name: str | None) -> bool:
    """True when an argument is PRNG state: every leaf a typed key; an ``nnx.Rngs`` state (its
    keys and counters); or, for an argument named like a key (``key``, ``rng``, ...), raw
    ``uint32`` keys."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return False
    if all(is_key_leaf(x) for x in leaves):
        return True
    if any(t.__name__ in _NNX_RNG_TYPES and (t.__module__ or "").startswith("flax")
           for t in _node_types(tree)):
        return all(is_key_leaf(x) or str(getattr(x, "dtype", "")) == "uint32" for x in leaves)
    return (name is not None and name.lower() in _KEY_NAMES
            and all(is_key_leaf(x) or _is_raw_key_leaf(x) for x in leaves))


def check_key_kinds(fn: Callable[..., Any], args: Sequence[Any], kinds: Sequence[str],
                    error: Callable[[str], Exception], where: str) -> None:
    """Refuse kinds that would shard or split PRNG keys, or call a non-key argument a key.

    A key is replicated on every device: an argument made of typed keys given the kind
    ``parameter``, ``optimizer_state`` or ``batch`` would be sharded or split into micro-batches,
    and an argument given the kind ``key`` must hold keys.

    Raises:
        ``error(message)``: naming the argument, what it holds and the kind to give.
    """
    names = _param_names(fn, len(args))
    for i, (a, kind) in enumerate(zip(args, kinds)):
        nm = names[i] or f"argument {i}"
        leaves = jax.tree_util.tree_flatten_with_path(a)[0]
        if kind in ("parameter", "optimizer_state", "batch") and leaves and all(
                is_key_leaf(x) for _, x in leaves):
            raise error(
                f"{where}: argument {i} ({nm!r}) holds PRNG keys ({leaves[0][1].dtype}), so its "
                f"kind should be 'key' (replicated on every device, never sharded or split into "
                f"micro-batches). Got arg_kinds[{i}] = {kind!r}. Fix: give 'key' for it, or leave "
                "arg_kinds out to have the kinds read off the arguments.")
        if kind == "key":
            bad = next(((p, x) for p, x in leaves if not (is_key_leaf(x) or str(
                getattr(x, "dtype", "")) == "uint32")), None)
            if bad is not None or not leaves:
                what = ("no leaves" if not leaves else f"{getattr(bad[1], 'dtype', type(bad[1]))} "
                        f"at {nm}{jax.tree_util.keystr(bad[0])}")
                raise error(
                    f"{where}: an argument of kind 'key' should hold PRNG keys: typed keys "
                    f"(jax.random.key), raw uint32 keys (jax.random.PRNGKey) or an nnx.Rngs state. "
                    f"Got {what} in argument {i} ({nm!r}). Fix: give it the kind 'input' (a "
                    "replicated value) or 'batch', or pass the key there.")


def _param_names(fn: Callable[..., Any], n: int) -> list[str | None]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return [None] * n
    names = [p.name for p in sig.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else None for i in range(n)]


def infer_arg_kinds(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[str, ...]:
    """The kind of each positional argument of a training step, read off what it is.

    In order of precedence, an argument is:

    1. ``"key"`` when it is PRNG state: every leaf a typed key (``jax.random.key``), an
       ``nnx.Rngs`` state (``nnx.split(rngs)``), or raw ``uint32`` keys
       (``jax.random.PRNGKey``) in an argument named like a key (``key``, ``rng``, ``rngs``,
       ``dropout_rng``, ...);
    2. ``"optimizer_state"`` when its pytree holds an optax state (a node whose type comes from
       ``optax``: ``ScaleByAdamState``, ``EmptyState``, ...);
    3. the kind its name in ``fn``'s signature says: ``params``/``model``/``weights`` ->
       ``"parameter"``, ``opt_state``/``optimizer_state`` -> ``"optimizer_state"``,
       ``batch``/``data``/``x``/``tokens``/``images`` -> ``"batch"``, ``seed``/``step``/``lr``
       -> ``"input"``;
    4. by position, the kinds of the usual signatures not yet taken: ``(params, opt_state,
       batch)``, ``(params, batch)``, ``(params,)``, and of four or more arguments the first
       that holds arrays ``"parameter"`` (an NNX graph definition holds none);
    5. ``"batch"`` when every leaf is an array that leads with the batch arguments' one
       leading dimension, and the tree is not shaped like the parameters (labels ``y`` or a
       ``mask`` beside ``x``: examples the step splits along with the batch, so a micro-batch
       holds all of each example's arrays; momentum or an EMA copy is state);
    6. else a usual kind not yet taken, by position, or ``"input"`` (replicated, never split).

    Args:
        fn: the training step.
        args: its positional arguments.

    Returns:
        One kind per argument.

    Examples:
        >>> import jax.numpy as jnp
        >>> def step(w, x):
        ...     return (x @ w).sum()
        >>> infer_arg_kinds(step, (jnp.ones((4, 2)), jnp.ones((8, 4))))
        ('parameter', 'batch')
        >>> import jax
        >>> def noisy_step(w, x, rng):
        ...     return (x @ w + jax.random.normal(rng, (8, 2))).sum()
        >>> infer_arg_kinds(noisy_step, (jnp.ones((4, 2)), jnp.ones((8, 4)), jax.random.key(0)))
        ('parameter', 'batch', 'key')
        >>> def labelled_step(p, x, y, rng):
        ...     return ((x @ p - y) ** 2).sum()
        >>> infer_arg_kinds(labelled_step, (jnp.ones((4, 2)), jnp.ones((8, 4)), jnp.ones((8, 2)),
        ...                                 jax.random.key(0)))
        ('parameter', 'batch', 'batch', 'key')
    """
    n = len(args)
    names = _param_names(fn, n)
    kinds: list[str | None] = [None] * n
    for i, a in enumerate(args):
        if _is_key_tree(a, names[i]):
            kinds[i] = "key"
        elif _is_optimizer_state(a):
            kinds[i] = "optimizer_state"
    for i, name in enumerate(names):
        if kinds[i] is None and name is not None:
            kinds[i] = next((k for k, names in _NAMES.items() if name.lower() in names), None)
    default = _POSITIONAL.get(n, ())
    free = [k for k in default if k not in kinds]
    for i in range(n):
        if kinds[i] is None and i < len(default) and default[i] in free:
            kinds[i] = default[i]
            free.remove(default[i])
    if n > len(_POSITIONAL) and "parameter" not in kinds:
        # (the first argument that holds arrays: an NNX graphdef before its state holds none)
        first = next((i for i in range(n) if kinds[i] is None
                      and _leading_dims(args[i], scalars=True) is not None), None)
        if first is not None:
            kinds[first] = "parameter"
    batch = _leading_batch(args, kinds)
    params = [(jax.tree_util.tree_structure(a), _shapes(a)) for a, k in zip(args, kinds)
              if k == "parameter"]
    for i in range(n):
        if kinds[i] is None:
            if (batch is not None and _leading_dims(args[i]) == {batch}
                    and (jax.tree_util.tree_structure(args[i]), _shapes(args[i])) not in params):
                kinds[i] = "batch"  # (a tree shaped like the parameters is state: momentum)
            else:
                kinds[i] = free.pop(0) if free else "input"
    return tuple(k for k in kinds if k is not None)


def _shapes(arg: Any) -> tuple:
    return tuple(tuple(getattr(x, "shape", ())) for x in jax.tree_util.tree_leaves(arg))


def _leading_dims(arg: Any, scalars: bool = False) -> set[int] | None:
    """The leading dimensions of an argument's leaves; None when it has no leaf, or a leaf that
    is not an array of at least one dimension (with ``scalars``, of any dimensions), or is PRNG
    keys (typed, or raw ``uint32`` words)."""
    leaves = jax.tree_util.tree_leaves(arg)
    out: set[int] = set()
    for x in leaves:
        shape = getattr(x, "shape", None)
        if (shape is None or not (shape or scalars) or not hasattr(x, "dtype")
                or is_key_leaf(x) or _is_raw_key_leaf(x)):
            return None
        if shape:
            out.add(int(shape[0]))
    return out if leaves else None


@dataclasses.dataclass(frozen=True)
class ArgTree:
    """The pytree structure of one positional argument of a step, as plans rebuild it.

    Attributes:
        treedef: the argument's ``PyTreeDef`` (the user's own container types: ``nnx.State``,
            Equinox modules, optax states, dataclasses; ``None`` subtrees included).
        paths: ``jax.tree_util.keystr`` of each leaf, in the treedef's leaf order (the paths
            plans key their input specs by).
        types: the container types of the argument that a plan file's paths cannot rebuild
            (anything but dicts with string keys and lists: ``"tuple"``, ``"None"``, and the
            qualified name of every other node type), sorted; empty when nested dicts and lists
            rebuilt from the paths have the argument's exact structure.
    """

    treedef: Any
    paths: tuple[str, ...]
    types: tuple[str, ...]


def _unrebuildable(treedef: Any) -> set[str]:
    out: set[str] = set()
    stack = [treedef]
    while stack:
        td = stack.pop()
        node = td.node_data()
        if node is not None:
            kind, aux = node
            if kind is dict:
                if not all(isinstance(k, str) for k in aux or ()):
                    out.add("dict (keys that are not strings)")
            elif kind is not list:
                out.add("None" if kind is type(None) else "tuple" if kind is tuple
                        else f"{kind.__module__}.{kind.__qualname__}")
        stack.extend(td.children())
    return out


def arg_trees(args: Sequence[Any]) -> tuple[ArgTree, ...]:
    """The :class:`ArgTree` of each positional argument."""
    out = []
    for a in args:
        leaves, treedef = jax.tree_util.tree_flatten_with_path(a)
        out.append(ArgTree(treedef, tuple(jax.tree_util.keystr(p) for p, _ in leaves),
                           tuple(sorted(_unrebuildable(treedef)))))
    return tuple(out)


def non_array_leaf(tree: Any) -> tuple[str, Any] | None:
    """The first leaf of ``tree`` that is neither an array (anything with ``shape`` and
    ``dtype``: arrays, ``jax.ShapeDtypeStruct``) nor a Python number, as ``(keystr path, leaf)``;
    None when there is none."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")) and not isinstance(
                leaf, bool | int | float | complex):
            return jax.tree_util.keystr(path), leaf
    return None


def _leading_batch(args: Sequence[Any], kinds: Sequence[str]) -> int | None:
    """The leading dimension shared by every non-scalar batch leaf, when there is one."""
    dims = {int(x.shape[0]) for a, k in zip(args, kinds) if k == "batch"
            for x in jax.tree_util.tree_leaves(a) if len(getattr(x, "shape", ())) >= 1}
    return dims.pop() if len(dims) == 1 else None


def abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
    """A leaf's shape and dtype as JAX sees it when the step is called with it (what
    ``jax.eval_shape`` gives): a ``jax.ShapeDtypeStruct`` as it is, a typed PRNG key with its
    key dtype, other dtypes JAX's canonical ones (``int32`` for NumPy's ``int64`` while 64-bit
    types are off), and a Python number (not a bool, not NumPy's) weakly typed, as a JAX array
    that is (``TrainState.create``'s ``step=0`` is a weak ``int32``, as the step returns it).

    Examples:
        >>> import numpy as np
        >>> abstract_leaf(0)
        ShapeDtypeStruct(shape=(), dtype=int32, weak_type=True)
        >>> abstract_leaf(np.zeros((2, 3), np.int64))
        ShapeDtypeStruct(shape=(2, 3), dtype=int32)
    """
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    shape = tuple(getattr(x, "shape", ()))
    if is_key_leaf(x):
        return jax.ShapeDtypeStruct(shape, x.dtype)
    weak = type(x) in (int, float, complex) or bool(getattr(x, "weak_type", False))
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    return jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype), weak_type=weak)


def _abstract(tree: Any) -> Any:
    return jax.tree_util.tree_map(abstract_leaf, tree)


#: the kinds of :class:`Origin`
ORIGIN_KINDS = ("zoo", "function", "object")


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a :class:`Workload` comes from.

    Attributes:
        kind: ``"zoo"`` (:func:`autoplan.models.get`), ``"function"`` (a user's
            ``"module:function"``, or a workload object it names, loaded by
            :func:`autoplan.load_workload`) or ``"object"`` (built in this process:
            ``autoplan.Workload(...)``, or any object with ``fn`` and ``args``).
        model: the zoo model's name, the ``"module:function"`` spec, or the workload's name.
        size: the zoo size (``"tiny"``, ``"1.3B"``); None for the other kinds.
        kwargs: JSON values that build it again with ``model`` (and ``size``): the keyword
            arguments a ``"function"`` was called with (``--set``, ``--size``, ``--batch``), or
            the config fields of a ``"zoo"`` workload that differ from its size's defaults;
            empty for ``"object"``.

    Examples:
        >>> str(Origin("zoo", "gpt", "tiny")), str(Origin("function", "mypkg.train:workload"))
        ('gpt (tiny)', 'mypkg.train:workload')
    """

    kind: str
    model: str
    size: str | None = None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ORIGIN_KINDS:
            raise ModelError(f"Origin: kind should be one of {ORIGIN_KINDS}. Got {self.kind!r}. "
                             "Fix: 'object' for a workload built in this process.")
        if not isinstance(self.model, str) or not self.model:
            raise ModelError(f"Origin: model should be a non-empty string. Got {self.model!r}. "
                             "Fix: the zoo name, 'module:function' or the workload's name.")

    def __str__(self) -> str:
        return f"{self.model} ({self.size})" if self.size is not None else self.model


@dataclasses.dataclass(frozen=True, eq=False, init=False)
class Workload:
    """A training step with its arguments, ready to trace, plan, run and launch.

    One type for every workload: a user's ``autoplan.Workload(step, args)``, the zoo's
    (:func:`autoplan.models.get`; :class:`autoplan.models.Workload` is this class) and one loaded
    from ``"module:function"`` (:func:`autoplan.load_workload`); :attr:`origin` says which.

    Attributes:
        fn: the step, e.g. ``train_step(params, opt_state, batch) -> (loss, params,
            opt_state)``; pure JAX (``jax.jit``-able), not jitted.
        args: its positional arguments as a tuple: pytrees of arrays, or of
            ``jax.ShapeDtypeStruct`` (abstract: nothing is allocated; running the plan then needs
            ``init``). Any pytree works: ``flax.nnx.State``, Equinox modules (``None`` where
            ``eqx.partition`` left non-arrays), optax's named tuples, dataclasses.
        arg_kinds: one of :data:`ARG_KINDS` (``"parameter"``, ``"optimizer_state"``,
            ``"batch"``, ``"key"`` or ``"input"``) per argument (default:
            :func:`infer_arg_kinds`). Keys are replicated on every device and never split into
            micro-batches.
        name: a name for plans and reports (default ``fn.__name__``; the zoo's model name; the
            ``"module:function"`` of a loaded one).
        config: what plans record about the workload (the zoo's resolved configuration);
            ``"batch"`` (the leading dimension of the batch arguments) is filled in when the
            batch leaves agree on it.
        init: ``init(seed) -> args`` making concrete arguments of the same shapes (needed to run
            a workload given abstract arguments; the zoo and the loader give one).
        loss_fn: ``loss(params, batch) -> scalar``, what ``fn`` differentiates, where known (the
            zoo's); else None.
        origin: where it comes from (:class:`Origin`): the zoo's name and size, a
            ``"module:function"`` and its keyword arguments, or ``"object"`` (the default).

    Examples:
        >>> import jax, jax.numpy as jnp, autoplan
        >>> def train_step(params, batch):
        ...     loss, g = jax.value_and_grad(lambda p: jnp.mean((batch @ p) ** 2))(params)
        ...     return loss, params - 0.1 * g
        >>> wl = autoplan.Workload(train_step, (jnp.ones((4, 2)), jnp.ones((8, 4))))
        >>> wl.arg_kinds, wl.config, wl.origin.kind
        (('parameter', 'batch'), {'batch': 8}, 'object')
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    arg_kinds: tuple[str, ...]
    name: str
    config: dict[str, Any]
    init: Callable[[int], Sequence[Any]] | None = dataclasses.field(default=None, repr=False)
    loss_fn: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    origin: Origin = dataclasses.field(default=None, repr=False)  # type: ignore[assignment]

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any],
                 arg_kinds: Sequence[str] | None = None, name: str | None = None, *,
                 config: Mapping[str, Any] | None = None,
                 init: Callable[[int], Sequence[Any]] | None = None,
                 loss_fn: Callable[..., Any] | None = None,
                 origin: Origin | None = None):
        if not callable(fn):
            raise ModelError(f"Workload: fn should be the training step (a callable). Got "
                             f"{type(fn).__name__}: {fn!r:.80}. Fix: Workload(train_step, "
                             "(params, opt_state, batch)).")
        if not isinstance(args, tuple | list):
            raise ModelError(
                f"Workload: args should be a tuple with one entry per positional argument of the "
                f"step. Got {type(args).__name__}. Fix: Workload(train_step, (params, opt_state, "
                "batch)), or (params,) for a step of one argument.")
        args = tuple(args)
        bad = non_array_leaf(args)
        if bad is not None:
            path, leaf = bad
            raise ModelError(
                f"Workload: every leaf of args should be an array or jax.ShapeDtypeStruct. "
                f"Got {type(leaf).__name__} at args{path}: {leaf!r:.60}. Fix: split non-array "
                "state off (nnx.split, eqx.partition) and close over it in the step.")
        if arg_kinds is None:
            kinds = infer_arg_kinds(fn, args)
        else:
            kinds = tuple(arg_kinds)
            if len(kinds) != len(args) or any(k not in ARG_KINDS for k in kinds):
                raise ModelError(
                    f"Workload: arg_kinds should give one of {ARG_KINDS} for each of the "
                    f"{len(args)} arguments. Got {tuple(arg_kinds)!r}. Fix: e.g. "
                    f"arg_kinds={_POSITIONAL.get(len(args), ('input',) * len(args))!r}.")
            check_key_kinds(fn, args, kinds, ModelError, "Workload")
        if init is not None and not callable(init):
            raise ModelError(f"Workload: init should be a function seed -> args. Got "
                             f"{type(init).__name__}. Fix: init=lambda seed: make_args(seed).")
        if loss_fn is not None and not callable(loss_fn):
            raise ModelError(f"Workload: loss_fn should be the loss function or None. Got "
                             f"{type(loss_fn).__name__}. Fix: loss_fn=loss or leave it out.")
        if name is not None and not isinstance(name, str):
            raise ModelError(f"Workload: name should be a string. Got {type(name).__name__}: "
                             f"{name!r:.60}. Fix: name='my_model'.")
        name = name or getattr(fn, "__name__", "workload")
        if origin is None:
            origin = Origin("object", name or "workload")
        elif not isinstance(origin, Origin):
            raise ModelError(f"Workload: origin should be an autoplan.tracing._workload.Origin. Got "
                             f"{type(origin).__name__}. Fix: leave it out (a workload built in "
                             "this process).")
        cfg = dict(config or {})
        batch = _leading_batch(args, kinds)
        if batch is not None:
            cfg.setdefault("batch", batch)
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "arg_kinds", kinds)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "config", cfg)
        object.__setattr__(self, "init", init)
        object.__setattr__(self, "loss_fn", loss_fn)
        object.__setattr__(self, "origin", origin)

    @property
    def size(self) -> str | None:
        """The zoo size (``"tiny"``, ``"1.3B"``) of a zoo workload; None for the others."""
        return self.origin.size

    @property
    def spec(self) -> dict[str, Any] | None:
        """The JSON spec that loads this workload again in another process
        (:func:`autoplan.load_workload`): a ``"module:function"`` and its keyword arguments, or
        a zoo name, its size and the config fields that differ from the size's defaults; None
        for a workload built in this process only."""
        o = self.origin
        if o.kind == "object":
            return None
        return {"model": o.model, **({"size": o.size} if o.size is not None else {}),
                **o.kwargs}

    @property
    def abstract(self) -> bool:
        """True when some leaf of ``args`` is a ``jax.ShapeDtypeStruct``."""
        return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(self.args))

    def _arg(self, kind: str) -> Any:
        if kind not in self.arg_kinds:
            raise ModelError(f"Workload {self.name!r} has no argument of kind {kind!r}: its kinds "
                             f"are {self.arg_kinds}. Fix: read wl.args by position.")
        return self.args[self.arg_kinds.index(kind)]

    @property
    def params(self) -> Any:
        """The first argument of kind ``"parameter"`` (the zoo's ``args[0]``)."""
        return self._arg("parameter")

    @property
    def opt_state(self) -> Any:
        """The first argument of kind ``"optimizer_state"`` (the zoo's ``args[1]``)."""
        return self._arg("optimizer_state")

    @property
    def batch(self) -> Any:
        """The first argument of kind ``"batch"`` (the zoo's ``args[2]``)."""
        return self._arg("batch")

    @property
    def num_params(self) -> int:
        """Number of parameter elements (over the leaves of the arguments of kind
        ``"parameter"``)."""
        return sum(math.prod(getattr(x, "shape", ())) for a, k in zip(self.args, self.arg_kinds)
                   if k == "parameter" for x in jax.tree_util.tree_leaves(a))

    def _with_args(self, args: Sequence[Any]) -> Workload:
        return Workload(self.fn, args, self.arg_kinds, self.name, config=self.config,
                        init=self.init, loss_fn=self.loss_fn, origin=self.origin)

    def concrete(self, seed: int = 0) -> Workload:
        """This workload with concrete arrays made from ``seed``.

        A zoo or ``"module:function"`` workload is built again from its origin (arrays from
        ``seed``, even when its own are concrete); any other is itself when its arguments are
        arrays, else ``init(seed)``'s (checked to have the same structure, shapes and dtypes).

        Raises:
            ModelError: abstract arguments and no ``init``, or ``init`` returned other shapes.
        """
        if self.origin.kind == "object" and not self.abstract:
            return self
        if self.init is None:
            if not self.abstract:
                return self
            raise ModelError(
                f"Workload {self.name!r} has abstract (jax.ShapeDtypeStruct) arguments and no init "
                "to make concrete ones, so it cannot run. Fix: pass concrete arrays, or "
                "Workload(fn, args, init=lambda seed: make_args(seed)).")
        new = tuple(self.init(seed))
        want, got = _abstract(self.args), _abstract(new)
        if jax.tree_util.tree_structure(want) != jax.tree_util.tree_structure(got) or any(
                (a.shape, a.dtype) != (b.shape, b.dtype) for a, b in
                zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got))):
            raise ModelError(f"Workload {self.name!r}: init(seed) should return arguments of the "
                             "same structure, shapes and dtypes as args. Fix: make init build "
                             "the same pytrees as the abstract args.")
        return self._with_args(new)

    def with_abstract_args(self) -> Workload:
        """The same workload with every leaf replaced by its ``jax.ShapeDtypeStruct``."""
        return self._with_args(_abstract(self.args))

    def __repr__(self) -> str:
        parts = []
        for a, k, nm in zip(self.args, self.arg_kinds, _param_names(self.fn, len(self.args))):
            leaves = jax.tree_util.tree_leaves(a)
            size = sum(math.prod(getattr(x, "shape", ())) for x in leaves)
            parts.append(f"{nm or '?'}: {k} ({len(leaves)} leaves, {size:,} elements)")
        return f"Workload({self.name!r}, " + ", ".join(parts) + ")"


def is_workload_like(obj: Any) -> bool:
    """Whether ``obj`` is a workload by duck typing: it has ``fn`` and ``args`` (an
    :class:`OpGraph` or a bare function is not)."""
    return hasattr(obj, "fn") and hasattr(obj, "args")


def as_workload(obj: Any, where: str = "workload") -> Workload:
    """``obj`` as a :class:`Workload`.

    A :class:`Workload` (a user's, the zoo's, a loaded one) is returned as it is. Any other
    object with ``fn`` and ``args`` (a ``types.SimpleNamespace``, a dataclass of the user's)
    becomes a :class:`Workload` of the same step and arguments (origin ``"object"``), with its
    own ``arg_kinds``, ``name``, ``config`` and ``init`` where it has them and the kinds inferred
    as ``Workload`` infers them (:func:`infer_arg_kinds`) where it has none; its
    ``concrete(seed)``, if any, makes concrete arguments.

    Args:
        obj: the object.
        where: the entry point, for error messages (``"search"``).

    Raises:
        ModelError: ``obj`` has no ``fn`` and ``args``, or what it holds is not a step and its
            arguments (the message ends with the fix ``wrap it as autoplan.Workload(fn, args)``).

    Examples:
        >>> import types, jax.numpy as jnp
        >>> def step(params, batch):
        ...     return (batch @ params).sum()
        >>> wl = as_workload(types.SimpleNamespace(fn=step, args=(jnp.ones((4, 2)), jnp.ones((8, 4)))))
        >>> type(wl).__name__, wl.arg_kinds, wl.origin.kind
        ('Workload', ('parameter', 'batch'), 'object')
    """
    if isinstance(obj, Workload):
        return obj
    if not is_workload_like(obj):
        raise ModelError(f"{where}: the workload should be an object with fn (the training step) "
                         f"and args (its arguments). Got {type(obj).__name__}. Fix: wrap it as "
                         "autoplan.Workload(fn, args).")
    # (the duck-typed protocol: a foreign object's optional attributes, read here only)
    args, kinds = obj.args, getattr(obj, "arg_kinds", None)
    if not isinstance(args, tuple | list):
        raise ModelError(f"{where}: the workload's args should be a tuple of the step's positional "
                         f"arguments. Got {type(args).__name__}. Fix: wrap it as "
                         "autoplan.Workload(fn, args) with args=(params, opt_state, batch).")
    cfg = getattr(obj, "config", None)
    name = getattr(obj, "name", None)
    init = getattr(obj, "init", None)
    make = getattr(obj, "concrete", None)
    if not callable(init) and callable(make):
        def init(seed: int) -> tuple[Any, ...]:
            out = make(seed)
            if not is_workload_like(out):
                raise ModelError(f"{where}: concrete(seed) should return a workload with fn and "
                                 f"args. Got {type(out).__name__}. Fix: return e.g. "
                                 "types.SimpleNamespace(fn=train_step, args=(params, batch)).")
            return tuple(out.args)
    try:
        return Workload(obj.fn, tuple(args), kinds, name if isinstance(name, str) and name else None,
                        config=cfg if isinstance(cfg, Mapping) else None,
                        init=init if callable(init) else None)
    except ModelError as err:
        raise ModelError(f"{where}: {err} Or wrap it as autoplan.Workload(fn, args).") from err
