"""What a training step returns, and which of its results feed its next step.

Every executor (:func:`autoplan.exec.run` for intra-operator plans, the stage executor for
pipelines and gradient accumulation, and :func:`autoplan.exec.launch`, whose workers call
``run``) reads a step's results through :func:`step_signature`, so all accept the same steps.

A step returns its loss first, then the new values of some of its arguments:

* ``loss``;
* ``(loss, params)`` for ``step(params, batch)``;
* ``(loss, params, opt_state)`` for ``step(params, opt_state, batch)``;
* extra inputs (keys, step counters, learning rates) in any position among the arguments: an
  argument the step does not return is passed unchanged to the next step, one it returns (a key
  split for the next step, a counter plus one) is replaced by its new value;
* ``(loss, aux)``, ``((loss, aux), params, ...)`` as ``jax.value_and_grad(..., has_aux=True)``
  gives it; a last result that mirrors no argument (``(loss, params, metrics)``) is aux too.

After the loss (or ``(loss, aux)``) come the new values of the step's non-batch arguments, in
the arguments' order, each with the argument's exact structure, shapes and dtypes; arguments
may be skipped. The loss must be a scalar. A step outside these forms is refused, before any
program is compiled, with :class:`~autoplan.StepSignatureError` naming what it returned and the
fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoplan._errors import StepSignatureError

__all__ = ["StepSignature", "step_signature", "workload_signature", "describe_tree"]


@dataclass(frozen=True)
class StepSignature:
    """How a step's results map onto its arguments.

    Attributes:
        form: the returned structure in words (``"(loss, params, opt_state)"``).
        aux: whether the step returns auxiliary values (``(loss, aux)`` or a last result that
            mirrors no argument).
        returned: per result after the loss (and aux), the positional argument it replaces.
        state: ``(output leaf, input leaf)`` pairs: flat result leaf ``i`` is the next step's flat
            argument leaf ``j`` (flat as ``jax.tree_util.tree_leaves`` orders them); argument
            leaves not listed are passed unchanged. The loss is always result leaf 0.
        leaf_names: a readable name per result leaf (``"loss"``, ``"aux['acc']"``,
            ``"new_params['w']"``).
    """

    form: str
    aux: bool
    returned: tuple[int, ...]
    state: tuple[tuple[int, int], ...]
    leaf_names: tuple[str, ...]

    def next_args(self, outputs: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """The next step's flat argument leaves: ``args`` (flat) with the returned ones replaced
        by ``outputs`` (flat)."""
        out = list(args)
        for i, j in self.state:
            out[j] = outputs[i]
        return out


def describe_tree(tree: Any, depth: int = 0) -> str:
    """A short description of an (abstract) pytree: ``f32[8]``, ``(f32[], dict(w, b))``."""
    import jax  # noqa: PLC0415

    if hasattr(tree, "shape") and hasattr(tree, "dtype"):
        dt = str(getattr(tree.dtype, "name", tree.dtype))
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                 "int32": "i32", "int64": "i64", "uint32": "u32", "bool": "bool"}.get(dt, dt)
        return f"{short}[{','.join(map(str, tree.shape))}]"
    if depth >= 2:
        n = len(jax.tree_util.tree_leaves(tree))
        return f"{type(tree).__name__}({n} leaves)"
    if isinstance(tree, tuple | list):
        inner = ", ".join(describe_tree(x, depth + 1) for x in tree)
        return f"({inner})" if isinstance(tree, tuple) else f"[{inner}]"
    if isinstance(tree, dict):
        keys = list(tree)
        return "dict(" + ", ".join(map(str, keys[:4])) + (", ..." if len(keys) > 4 else "") + ")"
    if tree is None:
        return "None"
    n = len(jax.tree_util.tree_leaves(tree))
    return f"{type(tree).__name__}({n} leaves)"


def _mirrors(out: Any, arg: Any) -> bool:
    import jax  # noqa: PLC0415

    if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(arg):
        return False
    return all(tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
               for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(arg)))


def _differences(out: Any, arg: Any) -> str:
    """Where ``out`` differs from ``arg`` (same tree structure): the first leaf."""
    import jax  # noqa: PLC0415

    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(out)[0],
                            jax.tree_util.tree_leaves(arg)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            return (f"at {jax.tree_util.keystr(path) or 'the top'} it returns "
                    f"{describe_tree(a)} for {describe_tree(b)}")
    return ""


def step_signature(out_shape: Any, args: Sequence[Any], kinds: Sequence[str],
                   names: Sequence[str | None] | None = None, *,
                   step_name: str = "the step") -> StepSignature:
    """Read how a step's results map onto its arguments (see the module docstring).

    Args:
        out_shape: the step's result as abstract values (``jax.eval_shape(step, *args)``).
        args: its positional arguments (arrays or ``jax.ShapeDtypeStruct``).
        kinds: the kind of each argument (``"batch"`` arguments are never returned).
        names: each argument's name in the step's signature, for the form (default
            ``params``, ``opt_state``, ``batch``, ``arg<i>`` by kind).
        step_name: the step's name, for messages.

    Returns:
        The :class:`StepSignature`.

    Raises:
        StepSignatureError: the loss is not a scalar, or a result after the loss has the
            structure of an argument but other shapes or dtypes, or mirrors none where more
            results follow.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> params, batch = {"w": jnp.ones((4, 2))}, jnp.ones((8, 4))
        >>> def step(params, batch):
        ...     loss, g = jax.value_and_grad(lambda p: jnp.mean((batch @ p["w"]) ** 2))(params)
        ...     return loss, {"w": params["w"] - 0.1 * g["w"]}
        >>> sig = step_signature(jax.eval_shape(step, params, batch), (params, batch),
        ...                      ("parameter", "batch"), ("params", "batch"))
        >>> sig.form, sig.state
        ('(loss, params)', ((1, 0),))
    """
    import jax  # noqa: PLC0415

    default = {"parameter": "params", "optimizer_state": "opt_state", "batch": "batch"}
    names = [n or default.get(k, f"arg{i}") for i, (n, k) in
             enumerate(zip(list(names or []) + [None] * len(args), kinds))]
    offsets, off = [], 0
    for a in args:
        offsets.append(off)
        off += len(jax.tree_util.tree_leaves(a))

    parts = list(out_shape) if isinstance(out_shape, tuple | list) else [out_shape]
    head = parts[0] if parts else out_shape
    rest = parts[1:] if isinstance(out_shape, tuple | list) else []
    aux = False
    if isinstance(head, tuple | list) and head and not hasattr(head, "shape"):
        loss, aux = head[0], len(head) > 1
        head_form = "(loss, aux)" if aux else "(loss,)"
    else:
        loss, head_form = head, "loss"
    fix_loss = ("Fix: return the loss as a scalar (reduce it: jnp.mean(per_example_losses)) "
                "first, then the new parameters and optimizer state: (loss, params, opt_state), "
                "or ((loss, aux), params, opt_state) for more results.")
    if not (hasattr(loss, "shape") and hasattr(loss, "dtype")):
        raise StepSignatureError(
            f"{step_name} should return the loss first, as a scalar. Got {describe_tree(out_shape)}"
            f", whose first result is {describe_tree(loss)}. {fix_loss}")
    if tuple(loss.shape) != ():
        raise StepSignatureError(
            f"{step_name} should return a scalar loss first. Got a loss of shape "
            f"{tuple(loss.shape)} ({describe_tree(loss)}) in {describe_tree(out_shape)}. {fix_loss}")

    free = [i for i, k in enumerate(kinds) if k != "batch"]
    returned: list[int] = []
    forms = [head_form]
    leaf = len(jax.tree_util.tree_leaves(head))
    leaf_names = ["loss"] + [f"aux{jax.tree_util.keystr(tuple(p[1:]) if len(head) == 2 else p)}"
                             for p, _ in jax.tree_util.tree_flatten_with_path(head)[0][1:]]
    state: list[tuple[int, int]] = []
    pos = 0
    for k, r in enumerate(rest):
        match = next((j for j in range(pos, len(free)) if _mirrors(r, args[free[j]])), None)
        if match is None:
            same_tree = next((j for j in range(pos, len(free)) if jax.tree_util.tree_structure(r)
                              == jax.tree_util.tree_structure(args[free[j]])), None)
            if same_tree is not None:
                a = free[same_tree]
                raise StepSignatureError(
                    f"{step_name}: result {k + 1} has the structure of argument {a} "
                    f"({names[a]}) but not its shapes and dtypes: {_differences(r, args[a])}. "
                    f"Got {describe_tree(out_shape)}. Fix: return new values of the argument's "
                    "exact shapes and dtypes (cast back, e.g. with jax.tree.map(lambda n, o: "
                    "n.astype(o.dtype), new, old)).")
            earlier = next((free[j] for j in range(pos) if _mirrors(r, args[free[j]])), None)
            if earlier is not None:
                order = ", ".join(["loss"] + [names[i] for i in free])
                raise StepSignatureError(
                    f"{step_name}: result {k + 1} mirrors argument {earlier} ({names[earlier]}), "
                    "which an earlier result already replaced or which comes before it: new "
                    "values should follow in the arguments' order. Got "
                    f"{describe_tree(out_shape)} ({', '.join(forms)}, ...). Fix: return "
                    f"({order}) in that order, e.g. (loss, params, opt_state).")
            if k == len(rest) - 1 and not aux:
                aux = True
                forms.append("aux")
                sub = jax.tree_util.tree_flatten_with_path(r)[0]
                leaf_names += [f"aux{jax.tree_util.keystr(p)}" for p, _ in sub]
                leaf += len(sub)
                break
            expect = ", ".join(f"{names[i]} ({describe_tree(args[i])})" for i in free[pos:]) \
                or "none left"
            raise StepSignatureError(
                f"{step_name}: result {k + 1} ({describe_tree(r)}) should be the new value of one "
                f"of its non-batch arguments, in order ({expect}), so that the next step can take "
                f"it. Got {describe_tree(out_shape)}. Fix: return (loss, params, opt_state) with "
                "the arguments' own structure, and put other results in the loss's aux: "
                "((loss, aux), params, opt_state).")
        a = free[match]
        pos = match + 1
        returned.append(a)
        forms.append(names[a])
        sub = jax.tree_util.tree_flatten_with_path(r)[0]
        for n, (p, _) in enumerate(sub):
            state.append((leaf + n, offsets[a] + n))
            leaf_names.append(f"new_{names[a]}{jax.tree_util.keystr(p)}")
        leaf += len(sub)
    form = forms[0] if not rest else "(" + ", ".join(forms) + ")"
    return StepSignature(form, aux, tuple(returned), tuple(state), tuple(leaf_names))


def workload_signature(workload: Any) -> StepSignature:
    """:func:`step_signature` of a workload (anything with ``fn`` and ``args``; abstract
    arguments are enough): how the launcher refuses a step before any worker starts.

    Raises:
        StepSignatureError: the step returns what no executor can run.
    """
    import jax  # noqa: PLC0415

    from autoplan.tracing._workload import _param_names, as_workload  # noqa: PLC0415

    wl = as_workload(workload)
    args = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(tuple(getattr(x, "shape", ())),
                                       getattr(x, "dtype", None) or jax.numpy.asarray(x).dtype),
        tuple(wl.args))
    kinds = tuple(wl.arg_kinds)
    names = [None if k in ("parameter", "optimizer_state") else n
             for n, k in zip(_param_names(wl.fn, len(args)), kinds)]
    return step_signature(jax.eval_shape(wl.fn, *args), args, kinds, names,
                          step_name=f"the training step of {wl.name}")
