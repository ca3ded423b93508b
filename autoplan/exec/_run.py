"""Running a plan on the devices JAX sees, with an equivalence check against one device.

:func:`run` executes a :class:`~autoplan.Plan` for a workload:

* an intra-operator plan (one stage) becomes one ``jax.jit`` whose ``in_shardings`` are the plan's
  ``NamedSharding`` of every parameter, optimizer-state and batch leaf and whose
  ``out_shardings`` give the new parameters and optimizer state their input shardings; inside, the
  step is re-evaluated operator by operator (:mod:`autoplan.exec._interpret`, numbered as the
  trace numbers it) with ``with_sharding_constraint`` on the result of every operator the plan
  lists in its ``OpSharding`` entries;
* a pipeline plan (several stages), or a one-stage plan over several micro-batches (gradient
  accumulation), runs on the stage executor of :mod:`autoplan.exec._stages`.

With ``check=True`` every executed step is re-run unsharded on one device from the same inputs
(see :func:`check_equivalence`): the loss, the gradients handed to the optimizer, and the new
parameters and optimizer state (the single-device update applied to the run's own gradients) must
agree within ``rtol``/``atol`` (``|a - b| <= atol + rtol |b|``, norm-wise for gradients; NaN and
infinity position by position), else :class:`~autoplan.EquivalenceError` names the first
differing tensor by its pytree path, with the largest difference and the tolerance.

Nothing the executor does ends the caller's process: every step is one dispatched program
(intra-operator and gradient accumulation) or one program per pipeline task, with no two programs
with collectives in flight on the same devices of the CPU backend (see
:mod:`autoplan.exec._stages`); an XLA runtime error becomes :class:`~autoplan.ExecutionError`
naming the program; and a step that calls back into Python is first run on one device, because
a callback failing inside a sharded program with collectives leaves the other devices waiting,
and XLA ends the process when its rendezvous times out.

Everything works across processes too (after ``jax.distributed.initialize``): inputs are built
with ``jax.make_array_from_callback``, each process runs the programs of the (sub)meshes holding
its devices, and each checks the shards it holds (a pipeline shares its results so that every
process checks all of them).
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from autoplan._errors import (
    ArgumentTypeError,
    EquivalenceError,
    ExecutionError,
    NonFiniteError,
    PlanMismatchError,
)
from autoplan._memo import memo
from autoplan._options import check_callback, check_tolerance
from autoplan.exec._hlo import KINDS, Collective, MemoryStats, collectives, comm_bytes, memory_stats
from autoplan.exec._interpret import Lit, flatten, sharding_hook
from autoplan.exec._stages import (
    StepRecord,
    _microbatch_abstract,
    abstract_value,
    comparable,
    error_summary,
    first_scalar,
    host_value,
    is_key_array,
    place,
    run_pipeline,
    run_program,
)
from autoplan.plans._plan_check import PlatformWarning, WorkloadView, platform_note, refuse_contradictions
from autoplan.plans._plan_text import levers_text
from autoplan.tracing._batchflow import MIXING_NOTE, mixing_of, random_draws
from autoplan.tracing._signature import StepSignature, step_signature
from autoplan.tracing._trace import OpaqueControlFlowWarning, trace_workload
from autoplan.tracing._workload import Workload, _param_names, as_workload

__all__ = ["RunReport", "EquivalenceResult", "run", "resolve_workload", "check_equivalence"]

RTOL = 1e-5
ATOL = 1e-6


@dataclass(frozen=True)
class EquivalenceResult:
    """How a run's results compare with single-device execution.

    Attributes:
        matched: every compared tensor is within tolerance.
        max_abs_diff: the largest absolute difference over all compared finite elements.
        worst: the pytree path of the tensor with the largest difference relative to its
            tolerance (the first failing one when not matched).
        tensors: number of tensors compared (losses, gradients, results; per step).
        rtol, atol: the tolerance.
        message: a description (the error message when not matched).
        nonfinite_inputs: the input leaves holding NaN or infinity (empty when all are finite);
            non-finite results are then compared position by position, NaN equal to NaN.
    """

    matched: bool
    max_abs_diff: float
    worst: str
    tensors: int
    rtol: float
    atol: float
    message: str = ""
    nonfinite_inputs: tuple[str, ...] = ()


@dataclass
class RunReport:
    """What :func:`run` measured.

    Attributes:
        model: the workload's name; ``label`` the plan's label.
        mode: ``"intra-op"``, ``"pipeline"``, or ``"accumulation"`` (one stage over several
            micro-batches, or one with memory levers: gradient accumulation on the stage
            executor).
        layout: the plan's one-line description.
        num_devices: devices used.
        steps: training steps run.
        losses: the loss of every step.
        step_times: seconds per step, measured after a warm-up compile.
        compile_time: seconds spent compiling.
        memory: per device id, the compiled executable's memory (the largest of its stage's
            executables for a pipeline).
        collectives: ``(executable, stage, collective, executions per step)`` for every
            collective the compiled HLO holds (one entry per operand of a tuple collective).
        comm_bytes: compiled communication per device and step by kind, a CPU all-reduce +
            dynamic-slice counted as reduce-scatter; pipelines add ``"send-recv"`` (bytes a device
            receives from other submeshes) and give, per kind, the busiest stage's bytes (a
            device belongs to one stage; ``pipeline["stage_comm_bytes"]`` has every stage's).
        comm_bytes_raw: the same as compiled, without the reduce-scatter mapping.
        predicted_comm_bytes: the plan's ``predicted.comm_bytes``.
        predicted_step_time: the plan's ``predicted.step_time``.
        equivalence: the comparison with one device (None when ``check=False``).
        constraints_applied, constraints_skipped: the plan's operator shardings applied, or
            skipped because the result's shape did not fit the spec.
        pipeline: for pipelines and gradient accumulation: ``task_times`` (seconds per task,
            each timed alone), ``ideal_time`` (the schedule's makespan with those times, plus the
            prologue and update), ``order``, ``phases`` (operators per task), ``dispatches``
            (programs and transfers this process dispatches per step: one for gradient
            accumulation, which runs as one scanned program), ``held_bytes`` (per stage, bytes
            per device its forward hands to its backward per micro-batch) and ``levers`` (per
            stage with memory levers, the ZeRO level and axes and the rematerialised layers
            applied, with the operators run again).
        outputs: the last step's results (global arrays), not printed; across processes, a
            pipeline's results held only by other processes' stages are None.
        nonfinite: empty when every loss (and, with ``check``, every gradient) is finite; else
            what was not, and whether one device computes the same (a run with
            ``allow_nonfinite=True``; otherwise :class:`~autoplan.NonFiniteError` is raised).
    """

    model: str
    label: str
    mode: str
    layout: str
    num_devices: int
    steps: int
    losses: list[float]
    step_times: list[float]
    compile_time: float
    memory: dict[int, MemoryStats]
    collectives: list[tuple[str, int, Collective, int]]
    comm_bytes: dict[str, float]
    comm_bytes_raw: dict[str, float]
    predicted_comm_bytes: dict[str, float]
    predicted_step_time: float
    equivalence: EquivalenceResult | None
    constraints_applied: int = 0
    constraints_skipped: int = 0
    pipeline: dict[str, Any] = field(default_factory=dict)
    outputs: Any = field(default=None, repr=False)
    nonfinite: str = ""

    @property
    def step_time(self) -> float:
        """Median seconds per step."""
        return statistics.median(self.step_times) if self.step_times else math.nan

    @property
    def peak_memory(self) -> int:
        """The largest per-device memory (bytes)."""
        return max((m.total for m in self.memory.values()), default=0)

    def comm_table(self) -> str:
        """Predicted versus compiled communication bytes per device and step, by kind."""
        kinds = list(KINDS) + [k for k in sorted(set(self.comm_bytes) | set(self.predicted_comm_bytes))
                               if k not in KINDS]
        lines = [f"  {'collective':<20}{'predicted':>14}{'compiled':>14}{'as compiled':>14}"]
        for k in kinds:
            p, c, r = (self.predicted_comm_bytes.get(k, 0.0), self.comm_bytes.get(k, 0.0),
                       self.comm_bytes_raw.get(k, 0.0))
            if p or c or r:
                lines.append(f"  {k:<20}{_fmt_bytes(p):>14}{_fmt_bytes(c):>14}{_fmt_bytes(r):>14}")
        if len(lines) == 1:
            lines.append("  (no communication predicted or compiled)")
        return "\n".join(lines)

    def summary(self) -> str:
        """A readable summary: losses, times, memory, equivalence, communication."""
        eq = self.equivalence
        eq_line = ("not checked" if eq is None else
                   f"{'matched' if eq.matched else 'MISMATCH'}: max |diff| {eq.max_abs_diff:.2e} over "
                   f"{eq.tensors} tensors (rtol {eq.rtol:g}, atol {eq.atol:g})")
        lines = [
            f"run [{self.label}] of {self.model} on {self.num_devices} devices ({self.layout}), "
            f"{self.steps} step(s)",
            "  losses        : " + ", ".join(f"{x:.6f}" for x in self.losses),
            f"  step time     : {self.step_time * 1e3:.3f} ms (median; predicted "
            f"{self.predicted_step_time * 1e3:.3f} ms)   compile {self.compile_time:.2f} s",
            f"  memory/device : {_fmt_bytes(self.peak_memory)} (largest executable)",
            f"  constraints   : {self.constraints_applied} applied, {self.constraints_skipped} skipped",
            f"  equivalence   : {eq_line}",
        ]
        if self.pipeline:
            lines.append(f"  schedule ideal: {self.pipeline['ideal_time'] * 1e3:.3f} ms with measured "
                         "task times")
            for s, lv in sorted(self.pipeline.get("levers", {}).items()):
                text = levers_text(lv["zero"], lv["zero_axes"], lv["remat_layers"])
                again = (f"; {lv['recomputed']} operators run again per micro-batch"
                         if lv["remat_layers"] else "")
                lines.append(f"  stage {s} levers: {text} (applied{again})")
        lines.append(self.comm_table())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _fmt_bytes(n: float) -> str:
    if not n:
        return "0"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


@dataclass(frozen=True)
class _Resolved:
    name: str
    fn: Callable[..., Any]
    host_args: tuple[Any, ...]
    arg_kinds: tuple[str, ...]
    source: Workload


def resolve_workload(workload: Any, seed: int = 0) -> _Resolved:
    """The training step and concrete host arguments of a workload.

    Args:
        workload: an :class:`autoplan.Workload` (an abstract one is made concrete with
            ``.concrete(seed)``), any object with ``fn`` and ``args``, or a dict ``{"model": name, "size": size, **overrides}`` for
            :func:`autoplan.models.get`.
        seed: PRNG seed for concrete arguments.

    Raises:
        ExecutionError: the workload is of an unknown type.
        ModelError: the workload has abstract arguments and no way to make concrete ones.
    """
    if isinstance(workload, Mapping):
        from autoplan import models  # noqa: PLC0415 - the zoo is optional for run()

        spec = dict(workload)
        if "model" not in spec:
            raise ExecutionError(f"workload spec should have a 'model' key. Got {sorted(spec)}. "
                                 "Fix: pass {'model': 'gpt', 'size': 'tiny', ...}.")
        name, size = spec.pop("model"), spec.pop("size", "tiny")
        workload = models.get(name, size, abstract=False, seed=seed, **spec)
    if not all(hasattr(workload, a) for a in ("fn", "args")):
        raise ExecutionError(f"workload should be an autoplan.Workload (a step and its arguments), "
                             f"a zoo workload, an object with fn and args, or a dict spec. Got "
                             f"{type(workload).__name__}. Fix: pass autoplan.Workload(train_step, "
                             "(params, opt_state, batch)) or autoplan.models.get('gpt', 'tiny').")
    workload = as_workload(workload, "run")
    if workload.abstract:
        workload = workload.concrete(seed)
    host = jax.tree_util.tree_map(host_value, tuple(workload.args))
    return _Resolved(workload.name, workload.fn, host, workload.arg_kinds, workload)


# What a run derives from its workload (traces, flat programs, compiled references) is memoised on
# the workload object (``r.source``), keyed by the function that derives it (see autoplan._memo).

def _graph(r: _Resolved) -> Any:
    """The step's trace, once per workload object (a zoo workload's shared with the search's,
    :func:`~autoplan.tracing._trace.trace_workload`)."""
    def make():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OpaqueControlFlowWarning)
            return trace_workload(r.source, _abstract(r.host_args), name=r.name)
    return memo(r.source, _graph, make)


def _program(r: _Resolved) -> Any:
    """The step's flat program, once per workload object."""
    return memo(r.source, _program, lambda: flatten(r.fn, *_abstract(r.host_args)))


def _abstract(host_args: Any) -> Any:
    return jax.tree_util.tree_map(abstract_value, host_args)


def signature_of(r: _Resolved) -> StepSignature:
    """How the workload's step returns its loss and next state (:mod:`autoplan.tracing._signature`),
    read once per workload from its abstract result; refuses a step no executor can run.

    Raises:
        StepSignatureError: a loss that is not a scalar, or results that do not mirror the
            step's arguments.
    """
    def make() -> StepSignature:
        names = _param_names(r.fn, len(r.host_args))
        names = [None if k in ("parameter", "optimizer_state") else n
                 for n, k in zip(names, r.arg_kinds)]
        out = jax.eval_shape(r.fn, *_abstract(r.host_args))
        return step_signature(out, _abstract(r.host_args), r.arg_kinds, names,
                              step_name=f"the training step of {r.name}")
    return memo(r.source, signature_of, make)


def _advance_args(sig: StepSignature, outputs: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    """The next step's arguments (a tuple of pytrees like ``args``): the step's returned state
    in place of the arguments it mirrors, the others unchanged."""
    flat, treedef = jax.tree_util.tree_flatten(tuple(args))
    return tuple(jax.tree_util.tree_unflatten(
        treedef, sig.next_args(jax.tree_util.tree_leaves(outputs), flat)))


def _grad_tensors(graph: Any) -> list[int]:
    """Tensors the optimizer update reads from the forward/backward pass: the gradients."""
    upd = {op.id for op in graph.ops if op.role == "update"}
    out = []
    for op in graph.ops:
        if op.role == "update":
            continue
        for t in op.outputs:
            if any(c in upd for c in graph.consumers[t]):
                out.append(t)
    return out


#: primitives that call back into Python while a compiled program runs
_CALLBACKS = ("callback", "debug_callback", "pure_callback", "io_callback", "inside_call")


def _preflight(r: _Resolved, compiler_options: Mapping[str, Any] | None) -> None:
    """Run a step that calls back into Python once on one device before running it sharded.

    A Python callback that raises inside a program with collectives leaves the other devices
    waiting in the collective, and XLA ends the whole process when its rendezvous times out: a
    notebook kernel would die. On one device there is no collective, so the same failure is an
    ordinary exception, raised here before anything is sharded.

    Raises:
        ExecutionError: the step failed on one device (the message holds its error).
    """
    prog = _program(r)
    names = sorted({op.primitive for op in prog.ops
                    if any(op.primitive.endswith(c) for c in _CALLBACKS)})
    if not names:
        return
    dev = jax.local_devices()[0]
    try:
        args = jax.device_put(r.host_args, dev)
        options = repr(sorted((compiler_options or {}).items()))
        compiled = memo(r.source, (_preflight, dev.id, options),
                        lambda: jax.jit(r.fn).lower(*args).compile(compiler_options=compiler_options))
        jax.block_until_ready(compiled(*args))
    except Exception as err:  # the user's callback may raise anything
        first = error_summary(err)
        raise ExecutionError(
            f"the training step of {r.name} calls back into Python ({', '.join(names)}) and failed "
            f"on one device: {first}. It was not run under the plan: a callback failing inside a "
            "sharded program with collectives ends the whole process. Fix: make the step run "
            "with jax.jit(workload.fn) on one device first.") from err


def _run_intra(plan: Any, r: _Resolved, graph: Any, devices: Sequence[Any], steps: int,
               on_step: Callable[[int, float, float], None] | None, capture: bool,
               compiler_options: Mapping[str, Any] | None):
    mesh = plan.mesh(devices, 0)
    abstract = _abstract(r.host_args)
    prog = _program(r)
    prog.check_matches(graph)
    shardings = plan.named_shardings(mesh, like=abstract)
    sizes = dict(mesh.shape)
    for i in plan.inputs:
        if not i.spec.divides(i.shape, mesh.axis_sizes, mesh.axis_names):
            raise ExecutionError(
                f"input {i.name} of shape {i.shape} cannot take the plan's spec {i.spec} on mesh "
                f"{sizes}: a dimension does not divide by its mesh axes. Fix: re-create the plan.")
    sig = signature_of(r)
    out_shape = jax.eval_shape(r.fn, *abstract)
    # results in the sharding of the argument they replace next step; loss and aux replicated
    in_flat = jax.tree_util.tree_leaves(tuple(shardings))
    out_flat = [NamedSharding(mesh, PartitionSpec())] * len(jax.tree_util.tree_leaves(out_shape))
    for i, j in sig.state:
        out_flat[i] = in_flat[j]
    out_sh = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), out_flat)
    hook, counts = sharding_hook(mesh, plan.stages[0].ops, exact_shapes=True)
    grad_tensors = _grad_tensors(graph) if capture else []

    def step(*args):
        leaves = jax.tree_util.tree_leaves(args)
        env = dict(zip(prog.input_ids, leaves))
        prog.evaluate(env, hook=hook)
        out = jax.tree_util.tree_unflatten(prog.out_tree, [prog.read(env, x) for x in prog.outputs])
        return out, [env[t] for t in grad_tensors]

    step.__name__ = f"{r.name}_step"
    jitted = jax.jit(step, in_shardings=tuple(shardings), out_shardings=(out_sh, None))
    args = tuple(jax.tree_util.tree_map(place, h, s) for h, s in zip(r.host_args, shardings))
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile(compiler_options=compiler_options)
    compile_time = time.perf_counter() - t0

    def advance(result: Any, a: Sequence[Any]) -> tuple[Any, ...]:
        return _advance_args(sig, result[0], a)

    def loss_of(result: Any) -> float:
        return first_scalar(jax.tree_util.tree_leaves(result[0])[0])

    losses, times, results, _ = run_program(compiled, args, steps, "the sharded step", advance,
                                            loss_of, on_step, keep_all=capture)
    records = [StepRecord(loss, out, grads) for loss, (out, grads) in zip(losses, results)] \
        if capture else []
    out = results[-1][0] if results else None
    colls = [("step", 0, c, 1) for c in collectives(compiled.as_text())]
    ms = memory_stats(compiled)
    memory = {d.id: ms for d in mesh.devices.flat}
    return dict(losses=losses, step_times=times, outputs=out, compile_time=compile_time,
                collectives=colls, memory=memory, constraints_applied=counts["applied"],
                constraints_skipped=counts["skipped"], pipeline={}, transfer_bytes={},
                grad_tensors=grad_tensors, records=records)


def _map_grad_tensors(src: Any, grad_tensors: Sequence[int], dst: Any) -> list[int]:
    """The tensors of ``dst`` that are ``grad_tensors`` of ``src`` (the micro-batch and full-batch
    traces of one step): the same ids when both have the same operators, else matched by where
    they enter the optimizer update, which does not depend on the batch size."""
    same = len(src.ops) == len(dst.ops) and all(
        a.primitive == b.primitive and a.inputs == b.inputs and a.outputs == b.outputs
        for a, b in zip(src.ops, dst.ops))
    if same:
        return list(grad_tensors)

    def signatures(g: Any) -> tuple[list[Any], dict[Any, int]]:
        upd = [op for op in g.ops if op.role == "update"]
        pos = {op.id: k for k, op in enumerate(upd)}
        sig: dict[Any, int] = {}
        for op in g.ops:
            if op.role == "update":
                continue
            for t in op.outputs:
                uses = tuple(sorted((pos[c], g.ops[c].inputs.index(t)) for c in g.consumers[t]
                                    if c in pos))
                if uses:
                    sig[uses + (g.tensors[t].shape,)] = t
        return [(op.primitive, op.out_shapes) for op in upd], sig

    upd_src, sig_src = signatures(src)
    upd_dst, sig_dst = signatures(dst)
    by_tensor = {t: k for k, t in sig_src.items()}
    if upd_src != upd_dst or any(by_tensor.get(t) not in sig_dst for t in grad_tensors):
        raise ExecutionError(
            "the optimizer update of the micro-batch trace differs from the full-batch one, so "
            "the pipeline's gradients cannot be matched for the equivalence check. Fix: run with "
            "check=False, or use micro-batches for which the step traces alike.")
    return [sig_dst[by_tensor[t]] for t in grad_tensors]


def _to_host(x: Any) -> Any:
    """The full value of an array on this host (gathered from other processes if needed); a
    typed PRNG key stays a key array (see :func:`host_value`)."""
    if is_key_array(x):
        data = _to_host(jax.random.key_data(x))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils  # noqa: PLC0415

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _leaf_names(sig: StepSignature, outputs: Any) -> list[str]:
    """A readable name per result leaf (``loss``, ``new_params['w']``, ``aux['acc']``)."""
    n = len(jax.tree_util.tree_leaves(outputs))
    names = list(sig.leaf_names[:n])
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(outputs)[0]]
    return names + [f"out{p}" for p in paths[len(names):]]


def _grad_names(graph: Any, grad_tensors: Sequence[int], out_names: Mapping[int, str]) -> list[str]:
    """Readable names of the gradient tensors: ``grad(params['w'])`` from the first new-parameter
    output they feed (else the first output), else ``%<tensor>``."""
    names = []
    for t in grad_tensors:
        seen, frontier, found = {t}, [t], []
        for _ in range(64):
            nxt = []
            for u in frontier:
                if u in out_names:
                    found.append(out_names[u])
                for c in graph.consumers[u]:
                    for v in graph.ops[c].outputs:
                        if v not in seen:
                            seen.add(v)
                            nxt.append(v)
            if any(n.startswith("new_params") for n in found) or not nxt:
                break
            frontier = nxt
        params = [n for n in found if n.startswith("new_params")]
        if params:
            names.append("grad(params" + params[0][len("new_params"):] + ")")
        elif found:
            names.append(f"grad -> {found[0]}")
        else:
            names.append(f"%{t}")
    return names


def _compare(a: np.ndarray, b: np.ndarray, rtol: float, atol: float,
             scale: float | None = None) -> tuple[float, float, int]:
    """``(max |a - b|, worst ratio of difference to tolerance, non-finite mismatches)``; a
    ratio above 1 or any non-finite mismatch fails.

    Finite elements pass when ``|a - b| <= atol + rtol |b|`` (with ``scale``, norm-wise:
    ``atol + rtol scale`` for every element). Non-finite elements are compared position by
    position: NaN equals NaN, and an infinity equals the infinity of the same sign; a NaN or
    infinity where the other side has something else is a mismatch (counted, and reported as an
    infinite difference).
    """
    if a.shape != b.shape:
        return math.inf, math.inf, max(a.size, b.size, 1)
    if a.size == 0:
        return 0.0, 0.0, 0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    both = fa & fb
    nonfinite = ~(fa & fb)
    bad = int(np.count_nonzero(nonfinite & ~((np.isnan(a64) & np.isnan(b64)) | (a64 == b64))))
    if bad:
        return math.inf, math.inf, bad
    diff = np.abs(a64[both] - b64[both])
    if diff.size == 0:
        return 0.0, 0.0, 0
    tol = atol + rtol * (scale if scale is not None else np.abs(b64[both]))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / tol)
    return float(np.max(diff)), float(np.max(ratio)), 0


def nonfinite_leaves(args: Any) -> list[str]:
    """Pytree paths of the floating-point leaves of ``args`` holding NaN or infinity, with
    what they hold (``"batch['x'] (3 NaN)"``)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        x = comparable(leaf)
        if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.complexfloating):
            continue
        nan, inf = int(np.count_nonzero(np.isnan(x))), int(np.count_nonzero(np.isinf(x)))
        if nan or inf:
            what = ", ".join(p for p in (f"{nan} NaN" if nan else "", f"{inf} inf" if inf else "") if p)
            out.append(f"{_arg_path(path)} ({what})")
    return out


def _arg_path(path: Sequence[Any]) -> str:
    if path and isinstance(path[0], jax.tree_util.SequenceKey):
        head = ("params", "opt_state", "batch")[path[0].idx] if path[0].idx < 3 else f"arg{path[0].idx}"
        return head + jax.tree_util.keystr(tuple(path[1:]))
    return jax.tree_util.keystr(tuple(path))


def _items(outputs: Any, ref: Any, names: Sequence[str]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, this process's shard of the run's value, the same slice of the reference)."""
    flat = jax.tree_util.tree_leaves(outputs)
    ref_flat = jax.tree_util.tree_leaves(ref)
    items = []
    for name, a, b in zip(names, flat, ref_flat):
        items.extend(_shards(name, a, comparable(b)))
    return items


def _shards(name: str, a: Any, b: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
    if isinstance(a, jax.Array):
        out, seen = [], set()
        for sh in a.addressable_shards:
            key = repr(sh.index)
            if key not in seen:
                seen.add(key)
                out.append((name, comparable(sh.data), b[sh.index]))
        return out
    return [(name, comparable(a), b)]


def check_equivalence(r: _Resolved, graph: Any, grad_tensors: Sequence[int], records: Sequence[Any],
                      rtol: float = RTOL, atol: float = ATOL,
                      compiler_options: Mapping[str, Any] | None = None,
                      microbatches: int = 1) -> EquivalenceResult:
    """Compare executed steps with single-device execution, step by step.

    Every step is re-run unsharded on this process's first device from the same inputs (the
    run's own parameters and optimizer state of that step). Compared, with
    ``|a - b| <= atol + rtol |b|``:

    * the loss;
    * the gradients handed to the optimizer (``grad_tensors``), norm-wise
      (``max |a - b| <= atol + rtol max |b|``): a different reduction order perturbs every
      element by about the rounding error of the tensor's largest terms;
    * the new parameters and optimizer state, against the single-device update **applied to
      the run's own gradients**. Adam's first update is about ``lr sign(g)``: where a gradient
      element is near zero (a key bias in attention, a bias before a normalisation), rounding
      noise flips its sign and moves the parameter by up to ``2 lr`` in a way no reduction
      order can avoid (measured on the tiny zoo models: up to 2e-3 on Wide-ResNet, 1e-4 on
      Two-Tower, 4e-6 on GPT against rtol 1e-5 / atol 1e-6). Comparing the update on the same
      gradients checks the sharded optimizer exactly, and the gradient check covers the rest.

    A plan with micro-batches whose step neither draws random numbers nor mixes examples in its
    loss (:func:`~autoplan.tracing._batchflow.mixing`) has a second reference when a gradient
    differs from the full-batch one while every loss matches: the same micro-batches run in turn
    on one device, summed in the plan's order. The two are one computation in exact arithmetic,
    but fp32 rounds them differently, and at a discontinuity the difference is not small: a ReLU
    whose input is within rounding of 0 takes one side in one and the other side in the other,
    moving its unit's gradient by one example's share (measured: the small MLP's 64-micro-batch
    plan, where the full-batch gradient of one bias is 2.4e-5 off the float64 value while the
    micro-batched one and the plan's are within 4e-9 and 5e-7 of it). The plan matches when it
    matches that reference, and the verdict says so and by how much the full-batch value
    differed.

    Non-finite values are compared position by position: NaN equals NaN and an infinity equals
    the infinity of the same sign, so a step that makes NaN on one device and under the plan
    alike matches; a NaN or infinity on one side only is a mismatch. When the inputs themselves
    hold NaN or infinity, the verdict lists them (``nonfinite_inputs``) and says so.

    Args:
        r: the resolved workload.
        graph: its full-batch trace.
        grad_tensors: tensor ids of the gradients, matching each record's ``grads``.
        records: the executed steps (``StepRecord``).
        rtol, atol: the tolerance.
        compiler_options: XLA options for the reference's compilation.
        microbatches: the plan's micro-batches (a mismatch then names the loss's form as a
            likely cause).

    Returns:
        The comparison (``worst`` names the first failing tensor when one fails).
    """
    if not isinstance(r, _Resolved):
        raise ArgumentTypeError(f"check_equivalence: r should be the resolved workload of a run "
                                f"(autoplan.exec.run resolves it). Got {type(r).__name__}. Fix: call "
                                "autoplan.exec.run(plan, workload, check=True), which calls this.")
    cross = list(grad_tensors)
    draws = random_draws(graph) if microbatches > 1 else ()
    # (a step that draws random numbers: the same micro-batched step on one device, each
    # micro-batch drawing its own)
    tally = _tally_steps(r, graph, cross, records, microbatches if draws else 1, rtol, atol,
                         compiler_options)
    nonfinite_in = nonfinite_leaves(r.host_args)
    # (where the loss mixes examples: asked only of a micro-batched plan that failed, once per graph)
    mixed = mixing_of(graph) if tally.failed is not None and microbatches > 1 else None
    note = ""
    if tally.failed is not None and microbatches > 1 and not draws and mixed is None \
            and not tally.failed[3] and not tally.loss_failed:
        # a second reference: the same micro-batches on one device, summed in the plan's order
        # (for a step whose loss is a mean of per-example terms, and whose loss matched: the
        # two are one computation, and a loss that mixes examples gives another loss value)
        again = _tally_steps(r, graph, cross, records, microbatches, rtol, atol, compiler_options)
        if again.failed is None:
            name, d = tally.failed[:2]
            note = (f"; against the same {microbatches} micro-batches on one device, whose "
                    f"values the plan's match: the full-batch one-device value of {name} differs "
                    f"from the plan's by {d:.3e} (fp32 rounding at a discontinuity, such as a "
                    "ReLU's input at 0, makes such a difference)")
            tally = again
    n = len(tally.names)
    if tally.failed is not None:
        msg = _mismatch_message(tally.failed, rtol, atol, microbatches, nonfinite_in, mixed)
        return EquivalenceResult(False, tally.max_diff, tally.failed[0], n, rtol, atol, msg,
                                 tuple(nonfinite_in))
    if nonfinite_in:
        note = (f"; the inputs are not finite ({_listed(nonfinite_in)}): non-finite values "
                "matched position by position") + note
    if draws:
        note += (f"; against the same {microbatches} micro-batches on one device, since the step "
                 f"draws random numbers per micro-batch ({', '.join(draws)})")
    return EquivalenceResult(True, tally.max_diff, tally.worst, n, rtol, atol,
                             f"matched: max |diff| {tally.max_diff:.3e} over {n} tensors{note}",
                             tuple(nonfinite_in))


def _tally_steps(r: _Resolved, graph: Any, cross: Sequence[int], records: Sequence[Any],
                 microbatches: int, rtol: float, atol: float,
                 compiler_options: Mapping[str, Any] | None) -> _Tally:
    """Every executed step compared with its single-device reference (:func:`_reference`, or
    with ``microbatches > 1`` :func:`_microbatch_reference`: the same micro-batches run in
    turn), re-run on this process's first device from the run's own inputs of that step."""
    prog = _program(r)
    if microbatches > 1:
        reference = _microbatch_reference(r, graph, cross, microbatches)
    else:
        reference = _reference(prog, cross)
    dev = jax.local_devices()[0]
    ref_fn = None
    out_names: dict[int, str] = {}
    sig = signature_of(r)
    names: list[str] = []
    gnames: list[str] = []
    tally = _Tally(rtol, atol)
    args = r.host_args
    for s, rec in enumerate(records):
        host_grads = [_to_host(g) for g in rec.grads]
        dargs = jax.device_put(args, dev)
        dgrads = jax.device_put(host_grads, dev)
        if ref_fn is None:
            options = repr(sorted((compiler_options or {}).items()))
            key = (check_equivalence, tuple(cross), microbatches, options)
            ref_fn = memo(r.source, key, lambda a=dargs, g=dgrads: jax.jit(reference).lower(a, g).compile(
                compiler_options=compiler_options))
            names = _leaf_names(sig, rec.outputs)
            for name, ref in zip(names, prog.outputs):
                if not isinstance(ref, Lit):
                    out_names.setdefault(ref, name)
            gnames = _grad_names(graph, cross, out_names)
        reference_out = jax.tree_util.tree_map(comparable, ref_fn(dargs, dgrads))
        for name, a, b, scale in _step_items(s, rec, reference_out, gnames, names):
            tally.add(name, a, b, scale)
        if s + 1 < len(records):
            args = _advance_args(sig, jax.tree_util.tree_map(_to_host, rec.outputs), args)
    return tally


def _step_items(s: int, rec: Any, reference_out: tuple[Any, Any, Any], gnames: Sequence[str],
                names: Sequence[str]) -> list[tuple[str, Any, Any, float | None]]:
    """What step ``s`` compares, as ``(name, run's value, reference, norm-wise scale or None)``:
    the loss, each gradient shard (norm-wise, against the reference's largest finite
    magnitude) and the step's results."""
    own_loss, own_grads, sub = reference_out
    own_loss = float(np.asarray(own_loss).reshape(()))
    items = [(f"loss (step {s})", np.float64(rec.loss), np.float64(own_loss), None)]
    for g, og, gname in zip(rec.grads, own_grads, gnames):
        fin = np.abs(og[np.isfinite(og)]) if og.size else og
        scale = float(np.max(fin)) if fin.size else 0.0
        items += [(f"{n} (step {s})", a, b, scale) for n, a, b in _shards(gname, g, og)]
    items += [(f"{n} (step {s})", a, b, None) for n, a, b in _items(rec.outputs, sub, names)]
    return items

class _Tally:
    """The comparisons of :func:`check_equivalence` so far: the tensors compared, the largest
    finite difference, the tensor nearest its tolerance (``worst``) and the first to fail."""

    def __init__(self, rtol: float, atol: float):
        """Start with nothing compared."""
        self.rtol, self.atol = rtol, atol
        self.max_diff, self.worst, self.worst_ratio = 0.0, "", -1.0
        self.failed: tuple[str, float, bool, int] | None = None
        self.loss_failed = False
        self.names: set[str] = set()

    def add(self, name: str, a: Any, b: Any, scale: float | None) -> None:
        """Compare ``a`` with the reference ``b``: element-wise, or norm-wise against ``scale``
        (the reference's largest finite magnitude) when given."""
        self.names.add(name)
        d, ratio, bad = _compare(np.asarray(a), np.asarray(b), self.rtol, self.atol, scale)
        if math.isfinite(d):
            self.max_diff = max(self.max_diff, d)
        if ratio > self.worst_ratio:
            self.worst, self.worst_ratio = name, ratio
        if ratio > 1.0 or bad:
            if self.failed is None:
                self.failed = (name, d, scale is not None, bad)
            self.loss_failed = self.loss_failed or name.startswith("loss ")

def _reference(prog: Any, cross: Sequence[int]) -> Callable[[Any, Any], tuple[Any, Any, Any]]:
    """The single-device reference of a step: from the step's arguments and the run's own
    gradients, the reference loss, the reference gradients (``cross``), and the step's results
    with the update applied to the run's gradients."""
    cross_set = set(cross)
    downstream: list[Any] = []
    tainted = set(cross)
    for op in prog.ops:
        if any(not isinstance(t, Lit) and t in tainted for t in op.inputs):
            downstream.append(op)
            tainted.update(op.outputs)

    def reference(args, run_grads):
        leaves = jax.tree_util.tree_leaves(args)
        env = dict(zip(prog.input_ids, leaves))
        prog.evaluate(env)
        own = jax.tree_util.tree_unflatten(prog.out_tree, [prog.read(env, x) for x in prog.outputs])
        own_grads = [env[t] for t in cross]
        env2 = dict(env)
        env2.update(zip(cross, run_grads))
        prog.evaluate(env2, [op for op in downstream if not set(op.outputs) & cross_set])
        sub = jax.tree_util.tree_unflatten(prog.out_tree, [prog.read(env2, x) for x in prog.outputs])
        own_loss = jax.tree_util.tree_leaves(own)[0]
        return own_loss, own_grads, sub  # the own update is dead code: XLA drops it

    return reference


def _microbatch_program(r: _Resolved, microbatches: int, mb_abstract: Sequence[Any]) -> Any:
    """The flat program of the step on one of ``microbatches`` micro-batches (abstract arguments
    ``mb_abstract``), once per workload object and micro-batch count."""
    return memo(r.source, (_microbatch_program, microbatches),
                lambda: flatten(r.fn, *mb_abstract))


def _microbatch_graph(r: _Resolved, microbatches: int, mb_abstract: Sequence[Any]) -> Any:
    """The trace of the step on one of ``microbatches`` micro-batches (abstract arguments
    ``mb_abstract``), once per workload object and micro-batch count."""
    def make() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OpaqueControlFlowWarning)
            return trace_workload(r.source, tuple(mb_abstract), name=r.name)
    return memo(r.source, (_microbatch_graph, microbatches), make)


def microbatch_tracer(r: _Resolved, microbatches: int
                      ) -> Callable[[Sequence[Any]], tuple[Any, Any]]:
    """The stage executor's source of the step at the micro-batch size: given the micro-batch's
    abstract arguments, its trace and flat program (:func:`_microbatch_graph`,
    :func:`_microbatch_program`), the ones the reference check uses, made once per workload."""
    return lambda mb_abstract: (_microbatch_graph(r, microbatches, mb_abstract),
                                _microbatch_program(r, microbatches, mb_abstract))


def _microbatch_reference(r: _Resolved, graph: Any, cross: Sequence[int], microbatches: int
                          ) -> Callable[[Any, Any], tuple[Any, Any, Any]]:
    """The single-device reference of a micro-batched step that draws random numbers: the step
    run on each micro-batch in turn, as the plan runs it (each micro-batch draws its own numbers,
    of the micro-batch's shape, from the same key), the per-micro-batch values averaged as the
    stage executor averages them, and the update applied to the run's own gradients. Same
    interface as :func:`_reference`; ``cross`` are the full-batch graph's gradient tensors."""
    m = microbatches
    batch_args = [i for i, k in enumerate(r.arg_kinds) if k == "batch"]
    mb_abstract = _microbatch_abstract(r.host_args, batch_args, m)

    mb_prog = _microbatch_program(r, m, mb_abstract)
    mb_cross = _map_grad_tensors(graph, cross, _microbatch_graph(r, m, mb_abstract))
    tainted = set(mb_cross)
    downstream, upstream = [], []
    for op in mb_prog.ops:
        if any(not isinstance(t, Lit) and t in tainted for t in op.inputs):
            downstream.append(op)
            tainted.update(op.outputs)
        else:
            upstream.append(op)
    reads = sorted({t for op in downstream for t in op.inputs
                    if not isinstance(t, Lit) and t not in tainted})
    is_batch = [a in batch_args for a, arg in enumerate(r.host_args)
                for _ in jax.tree_util.tree_leaves(arg)]

    def reference(args, run_grads):
        envs = []
        for i in range(m):
            leaves = [x.reshape((m, x.shape[0] // m) + x.shape[1:])[i] if b else x
                      for x, b in zip(jax.tree_util.tree_leaves(args), is_batch)]
            env = dict(zip(mb_prog.input_ids, leaves))
            mb_prog.evaluate(env, upstream)
            envs.append(env)

        def mean(ref: Any) -> Any:
            vals = [mb_prog.read(e, ref) for e in envs]
            v0 = jnp.asarray(vals[0])
            if not jnp.issubdtype(v0.dtype, jnp.floating):
                return vals[0]
            acc = jnp.promote_types(v0.dtype, jnp.float32)
            return (sum(jnp.asarray(v, acc) for v in vals) / m).astype(v0.dtype)

        own_grads = [mean(t) for t in mb_cross]
        env2 = dict(envs[0])
        env2.update({t: mean(t) for t in reads})
        env2.update(zip(mb_cross, run_grads))
        mb_prog.evaluate(env2, downstream)
        outs = [mb_prog.read(env2, x) if isinstance(x, Lit) or x in tainted else mean(x)
                for x in mb_prog.outputs]
        sub = jax.tree_util.tree_unflatten(mb_prog.out_tree, outs)
        return outs[0], own_grads, sub

    return reference


def _mismatch_message(failed: tuple[str, float, bool, int], rtol: float, atol: float,
                      microbatches: int, nonfinite_in: Sequence[str], mixed: Any = None) -> str:
    """The verdict of a mismatch: the first failing tensor, by how much, the likely cause (the
    operator where the loss mixes examples, when it does and the plan micro-batches)."""
    name, d, normwise, bad = failed
    kind = "norm-wise (max |diff| <= atol + rtol max |b|)" if normwise else "element-wise"
    if bad:
        what = (f"{bad} element(s) are NaN or infinite on one side and not the same on the "
                "other (non-finite values are compared position by position)")
    else:
        what = f"max |diff| {d:.3e} exceeds the tolerance (rtol {rtol:g}, atol {atol:g}, {kind})"
    if mixed is not None:
        cause = (f"Cause: {MIXING_NOTE} ({mixed}), and this plan runs {microbatches} "
                 "micro-batches. Fix: use a plan without micro-batches for this loss (a search "
                 "without allow_microbatching_mixed=True makes none).")
    elif microbatches > 1:
        cause = (f"Likely cause: over {microbatches} micro-batches, a loss that is not a mean "
                 "of per-example terms over the batch (batch-normalisation statistics, in-batch "
                 "negatives, a sum) gives other numbers by construction; else a sharding or "
                 "stage split that changes the computation. Fix: use a plan without "
                 "micro-batches for such a loss, or inspect that tensor's producers under the "
                 "plan.")
    else:
        cause = ("Likely cause: a sharding that changes the computation. Fix: inspect that "
                 "tensor's producers under the plan.")
    if nonfinite_in:
        cause = (f"Note: the inputs themselves are not finite ({_listed(nonfinite_in)}), and NaN "
                 "and infinity spread differently under another order of operations; check "
                 "them first. " + cause)
    return f"{name} differs from single-device execution: {what}. {cause}"


def _listed(items: Sequence[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def run(plan: Any, workload: Any, steps: int = 1, check: bool = True,
        devices: Sequence[Any] | None = None, *, seed: int = 0, rtol: float = RTOL,
        atol: float = ATOL, on_step: Callable[[int, float, float], None] | None = None,
        time_tasks: bool = True, compiler_options: Mapping[str, Any] | None = None,
        raise_on_mismatch: bool = True, allow_nonfinite: bool = False) -> RunReport:
    """Run ``steps`` training steps of a workload under a plan on the devices JAX sees.

    Args:
        plan: the :class:`~autoplan.Plan`.
        workload: an :class:`autoplan.Workload` (a user's step and its arguments), a zoo
            workload (or a dict ``{"model":..., "size":..., **overrides}``), or any object with
            ``fn``, ``args``, ``arg_kinds``.
        steps: training steps; each starts from what the previous step returned for its
            arguments (new parameters, optimizer state, a key or counter it returns; the others
            unchanged), on the same batch. Every step form of :mod:`autoplan.tracing._signature` runs
            here: ``(loss, params)``, ``(loss, params, opt_state)``, extra inputs, ``(loss,
            aux)`` and ``((loss, aux), params, ...)``. ``0`` compiles only (a pipeline runs its warm-up step,
            which compiles its tasks): the report then has the collectives and memory, no
            losses or times.
        check: compare every step with unsharded single-device execution (see
            :func:`check_equivalence`); raises on a mismatch. The compiled step then also returns
            the gradients, which the comparison needs.
        devices: the devices to run on (default ``jax.devices()``, every process's after
            ``jax.distributed.initialize``); their number must equal the plan's. Each process
            runs the programs of the (sub)meshes that hold its devices.
        seed: PRNG seed of the concrete arguments when the workload is abstract or a dict.
        rtol, atol: the equivalence tolerance.
        on_step: called with (step, loss, seconds) after each step.
        time_tasks: pipelines and gradient accumulation: time each task alone for the
            schedule's ideal (``report.pipeline``); gradient accumulation, which runs as one
            program, then also compiles its tasks as separate programs to time them.
        compiler_options: XLA options for every compilation (e.g.
            ``{"xla_backend_optimization_level": 0}`` compiles CPU code several times faster).
        raise_on_mismatch: raise :class:`~autoplan.EquivalenceError` on a mismatch (else only
            record it in ``report.equivalence``).
        allow_nonfinite: keep a run whose loss or gradients hold NaN or infinity (said in
            ``report.nonfinite``) instead of raising :class:`~autoplan.NonFiniteError`.

    Returns:
        The :class:`RunReport`.

    Raises:
        StepSignatureError: the step returns what no executor can run (a loss that is not a
            scalar, results that do not mirror its arguments), before any work.
        PlanMismatchError: the plan was made for another model, argument structure or number of
            devices, or contradicts the workload (its model, config, inputs' kinds, shapes and
            dtypes, its stages' layers: see :mod:`autoplan.plans._plan_check`).
        PlanFileError: the plan contradicts itself (inputs changed after it was made, a
            schedule kind over another kind's table, a cluster of another device count...).
        EquivalenceError: ``check`` and the results differ from single-device execution.
        NonFiniteError: a loss (or, with ``check``, a gradient) is NaN or infinite; the message
            says whether one device computes the same (the model's numbers) or not (the plan's).
        ExecutionError: the plan cannot be executed as given, a program failed while running
            (XLA's error, summarised), or a step that calls back into Python failed on one device
            (it is then not run under the plan); see the message.

    Warns:
        PlatformWarning: the plan's cluster is of another platform than the devices (a GPU
            plan on emulated CPU devices): the numbers are checked all the same.

    Examples:
        >>> import autoplan, autoplan.exec as ex
        >>> wl = autoplan.models.get("mlp", batch=512)
        >>> plan = autoplan.plan(wl, "cpu:8", pipeline=False)
        >>> report = ex.run(plan, wl)
        >>> report.equivalence.matched
        True
    """
    rtol, atol = _check_run_options(steps, rtol, atol, on_step, check=check, time_tasks=time_tasks,
                                    raise_on_mismatch=raise_on_mismatch,
                                    allow_nonfinite=allow_nonfinite)
    check = check and steps > 0
    r = resolve_workload(workload, seed)
    signature_of(r)  # a step no executor can run is refused before any work
    devices = list(devices) if devices is not None else jax.devices()
    graph = _graph(r)
    _check_plan(plan, r, graph, devices, compiler_options)
    if plan.is_pipeline or plan.schedule.microbatches > 1 or any(s.levers for s in plan.stages):
        res = _run_pipelined(plan, r, graph, devices, steps, on_step, check, time_tasks,
                             compiler_options)
        mode = "pipeline" if plan.is_pipeline else "accumulation"
    else:
        res = _run_intra(plan, r, graph, devices, steps, on_step, check, compiler_options)
        mode = "intra-op"
    compiled, raw = _measured_comm_bytes(plan, res)
    equivalence, nonfinite = _verdicts(plan, r, graph, res, steps, check, rtol, atol,
                                       compiler_options, raise_on_mismatch, allow_nonfinite)
    return RunReport(
        model=r.name, label=plan.label, mode=mode, layout=plan.describe(), num_devices=len(devices),
        steps=steps, losses=res["losses"], step_times=res["step_times"],
        compile_time=res["compile_time"], memory=res["memory"], collectives=res["collectives"],
        comm_bytes=compiled, comm_bytes_raw=raw,
        predicted_comm_bytes={k: float(v) for k, v in plan.predicted.comm_bytes.items()},
        predicted_step_time=float(plan.predicted.step_time), equivalence=equivalence,
        constraints_applied=res["constraints_applied"],
        constraints_skipped=res["constraints_skipped"], pipeline=res["pipeline"],
        outputs=res["outputs"], nonfinite=nonfinite)


def _verdicts(plan: Any, r: _Resolved, graph: Any, res: Mapping[str, Any], steps: int, check: bool,
              rtol: float, atol: float, compiler_options: Mapping[str, Any] | None,
              raise_on_mismatch: bool, allow_nonfinite: bool) -> tuple[EquivalenceResult | None, str]:
    """The run's equivalence with single-device execution (when ``check``) and its non-finite
    verdict, raising :class:`EquivalenceError` or :class:`NonFiniteError` as :func:`run` says."""
    equivalence = None
    if check:
        equivalence = check_equivalence(r, graph, res["grad_tensors"], res["records"], rtol, atol,
                                        compiler_options, plan.schedule.microbatches)
        if not equivalence.matched and raise_on_mismatch:
            raise EquivalenceError(equivalence.message)
    nonfinite = _nonfinite_verdict(r, res, equivalence, steps)
    if nonfinite and not allow_nonfinite:
        raise NonFiniteError(f"run: the numbers are not finite at {nonfinite} Fix: find where the "
                             "model overflows (a learning rate too high, the log of 0, an input "
                             "holding inf), or pass allow_nonfinite=True (--allow-nonfinite) to "
                             "keep the run.")
    return equivalence, nonfinite


def _nonfinite_verdict(r: _Resolved, res: Mapping[str, Any], equivalence: EquivalenceResult | None,
                       steps: int) -> str:
    """Empty when the run's losses (and its captured gradients) are finite; else which step
    first held NaN or infinity, and whether one device computes the same: from the equivalence
    check when it ran (non-finite values are compared there position by position), else by
    running the step unsharded on one device."""
    losses = res["losses"]
    step, what = None, ""
    for s, loss in enumerate(losses):
        bad_grads = sum(1 for g in (res["records"][s].grads if s < len(res["records"]) else ())
                        if not _all_finite(g))
        if not math.isfinite(loss) or bad_grads:
            step = s
            parts = [f"the loss is {loss}"] if not math.isfinite(loss) else []
            if bad_grads:
                parts.append(f"{bad_grads} gradient tensor(s) hold NaN or infinity")
            what = " and ".join(parts)
            break
    if step is None:
        return ""
    later = sum(1 for x in losses[step + 1:] if not math.isfinite(x))
    head = (f"step {step} (of {len(losses)}): {what}"
            + (f"; the loss of {later} later step(s) is not finite either" if later else "") + ".")
    inputs = nonfinite_leaves(r.host_args)
    note = (f" The inputs themselves are not finite: {_listed(inputs)}." if inputs else "")
    if equivalence is not None:
        if equivalence.matched:
            same = ("One device computes the same non-finite values (compared position by "
                    "position): the model's numbers, not the plan's.")
        else:
            same = (f"One device computes other values: the plan's numbers ({equivalence.message})")
    else:
        ref = _single_device_losses(r, step + 1)
        if ref is None:
            same = "Whether one device computes the same could not be checked."
        elif not math.isfinite(ref[-1]) or "gradient" in what:
            same = (f"One device gives the loss {ref[-1]} at step {step} too: the model's "
                    "numbers, not the plan's (gradients not compared: check=False).")
        else:
            same = (f"One device gives the finite loss {ref[-1]:.6g} at step {step}: the plan's "
                    "numbers differ from the model's.")
    return f"{head}{note} {same}"


def _all_finite(x: Any) -> bool:
    """Every element of ``x`` that this process holds is finite (integers always are)."""
    shards = ([np.asarray(sh.data) for sh in x.addressable_shards] if isinstance(x, jax.Array)
              else [np.asarray(x)])
    return all(not np.issubdtype(a.dtype, np.inexact) or bool(np.isfinite(a).all()) for a in shards)


def _single_device_losses(r: _Resolved, steps: int) -> list[float] | None:
    """The losses of ``steps`` unsharded steps on this process's first device (each from the
    last one's parameters and optimizer state), or None when the step cannot be chained."""
    dev = jax.local_devices()[0]
    fn = memo(r.source, (_single_device_losses, dev.id), lambda: jax.jit(r.fn))
    args = jax.device_put(r.host_args, dev)
    losses = []
    for s in range(steps):
        out = fn(*args)
        losses.append(first_scalar(out[0] if isinstance(out, tuple) else out))
        if s + 1 < steps:
            if not (isinstance(out, tuple) and len(out) == 3 and len(args) == 3):
                return None
            args = (out[1], out[2], args[2])
    return losses


def _check_run_options(steps: Any, rtol: Any, atol: Any, on_step: Any, **flags: Any
                       ) -> tuple[float, float]:
    """Refuse bad options of :func:`run` before any work; the tolerance as floats."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ExecutionError(f"run: steps should be a non-negative integer. Got {steps!r}. Fix: "
                             "steps=1 (or 0 to compile only).")
    rtol = check_tolerance("run", "rtol", rtol, ExecutionError, "1e-5")
    atol = check_tolerance("run", "atol", atol, ExecutionError, "1e-6")
    check_callback("run", "on_step", on_step, ExecutionError, "(step, loss, seconds)")
    for name, flag in flags.items():
        if not isinstance(flag, bool | np.bool_):
            raise ExecutionError(f"run: {name} should be True or False. Got {flag!r}. Fix: "
                                 f"{name}=True.")
    return rtol, atol


def _check_plan(plan: Any, r: _Resolved, graph: Any, devices: Sequence[Any],
                compiler_options: Mapping[str, Any] | None) -> None:
    """Refuse a plan that contradicts itself or the workload, or is made for another model,
    argument structure or number of devices (a note when it runs on another platform than its
    cluster's); with several devices, check that the step runs at all (:func:`_preflight`)."""
    plan.check_matches(graph, num_devices=len(devices))
    refuse_contradictions(plan, "run", WorkloadView.of(graph, r.source.config))
    note = platform_note(plan.cluster, devices[0].platform, len(devices)) if devices else None
    if note is not None:
        warnings.warn(f"run: {note}.", PlatformWarning, stacklevel=3)
    if len(devices) != plan.num_devices:  # pragma: no cover - check_matches covers it
        raise PlanMismatchError(f"the plan uses {plan.num_devices} devices; {len(devices)} given.")
    plan.partition_specs(like=_abstract(r.host_args))  # raises PlanMismatchError on another argument structure
    if len(devices) > 1:
        _preflight(r, compiler_options)


def _run_pipelined(plan: Any, r: _Resolved, graph: Any, devices: Sequence[Any], steps: int,
                   on_step: Callable[[int, float, float], None] | None, check: bool,
                   time_tasks: bool, compiler_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Run a pipeline or gradient-accumulation plan (:func:`run_pipeline`); its outcome as the
    fields ``run`` reports, the gradients mapped onto the full-batch graph."""
    po = run_pipeline(plan, r.fn, r.host_args, r.arg_kinds, graph, devices, steps, on_step,
                      time_tasks=time_tasks, capture=check, compiler_options=compiler_options,
                      microbatch_trace=microbatch_tracer(r, plan.schedule.microbatches))
    return dict(losses=po.losses, step_times=po.step_times, outputs=po.outputs,
                compile_time=po.compile_time, collectives=po.collectives, memory=po.memory,
                constraints_applied=po.constraints_applied,
                constraints_skipped=po.constraints_skipped, transfer_bytes=po.transfer_bytes,
                pipeline={"task_times": po.task_times, "ideal_time": po.ideal_time,
                          "order": po.order, "phases": po.phases,
                          "dispatches": po.dispatches, "held_bytes": po.held_bytes,
                          "levers": po.levers},
                grad_tensors=_map_grad_tensors(po.graph, po.grad_tensors, graph),
                records=po.records)


def _measured_comm_bytes(plan: Any, res: Mapping[str, Any]
                         ) -> tuple[dict[str, float], dict[str, float]]:
    """Bytes per device per step by collective kind, of the stage that moves most: as compiled
    (CPU collectives mapped to what they stand for) and raw. A pipeline's per-stage figures go
    into ``res["pipeline"]["stage_comm_bytes"]``."""
    stages: dict[int, tuple[dict[str, float], dict[str, float]]] = {
        s: (dict.fromkeys(KINDS, 0.0), dict.fromkeys(KINDS, 0.0)) for s in range(len(plan.stages))}
    for _name, stage, c, times in res["collectives"]:
        for k, v in comm_bytes([c], map_cpu=True, times=times).items():
            stages[stage][0][k] += v
        for k, v in comm_bytes([c], map_cpu=False, times=times).items():
            stages[stage][1][k] += v
    for stage, b in res["transfer_bytes"].items():
        stages[stage][0]["send-recv"] = stages[stage][1]["send-recv"] = float(b)
    kinds = sorted({k for m, _ in stages.values() for k in m})
    compiled = {k: max(m.get(k, 0.0) for m, _ in stages.values()) for k in kinds}
    raw = {k: max(r_.get(k, 0.0) for _, r_ in stages.values()) for k in kinds}
    if res["pipeline"]:
        res["pipeline"]["stage_comm_bytes"] = {s: m for s, (m, _) in stages.items()}
    return compiled, raw
