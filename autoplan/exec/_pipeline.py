"""The pipeline executor: one ``jax.jit`` per stage on its own submesh, micro-batches in the
plan's schedule order, gradient accumulation, then the optimizer update.

How a step is split (all read off the traced graph; nothing is re-derived by hand):

1. The training step is re-traced at the micro-batch shape (the batch leaves split on their
   leading dimension into ``plan.schedule.microbatches`` pieces) and flattened with
   :func:`~autoplan.exec._interpret.flatten`. The plan's operator ids (``Stage.ops``) are read in
   this micro-batch trace, which is where the search assigns them; a trace whose structure
   depends on the batch size (size-1 micro-batches often drop a few operators) is fine.
2. Every operator gets a *phase*: ``forward``/``backward`` when it depends on the batch (its trace
   role decides which), ``update`` when it reads an accumulated (per-micro-batch) value, such as
   the optimizer reading the gradients, and ``prologue`` otherwise (operators that depend on
   parameters only: position ids, masks, the step count). Forward and backward operators run once
   per micro-batch; prologue and update operators once per step.
3. Every operator gets a *stage*: the stage whose ``layers`` hold its top-level named scope
   (``OpNode.scope[0]``); an operator outside every layer (the optimizer, un-scoped glue) goes with
   its latest producer, or with the stage holding the parameter it reads. An operator is moved
   later when one of its operands would otherwise come from a task that runs after it.
4. A *task* is (phase, stage): its operators in program order become one function, jitted on
   the stage's submesh (``plan.mesh(stage=i)``) with ``with_sharding_constraint`` on the
   operators the plan chose shardings for. Values crossing stages are moved with
   ``jax.device_put`` (replicated on the destination submesh) and counted as send/recv bytes.
5. The backward of a stage is the train step's own backward operators of that stage's layers
   (what ``jax.value_and_grad`` produced when the step was traced), not a re-derivation: the
   gradients are exactly the step's.
6. Values a per-micro-batch task hands to the update (the gradients) and per-micro-batch graph
   outputs (the loss) are averaged over the micro-batches: the full-batch gradient of a loss that
   is a mean over the batch's leading dimension. The update operators then run once, on the
   averaged gradients, so the optimizer is the workload's own. A loss that is not such a mean
   (batch statistics, sums) gives other numbers; the equivalence check reports it.

Schedules: the order is the plan's ``Schedule.table`` read row by row (tick by tick, mesh by
mesh); an empty table is generated here for ``gpipe`` or ``1f1b``. JAX dispatches asynchronously,
so tasks of different meshes overlap as the order allows.
"""

from __future__ import annotations

import bisect
import math
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from autoplan._errors import ExecutionError
from autoplan._plan import spec_to_pspec
from autoplan._trace import OpaqueControlFlowWarning, trace
from autoplan.exec._hlo import Collective, MemoryStats, collectives, memory_stats
from autoplan.exec._interpret import FlatOp, FlatProgram, Lit, flatten, sharding_hook

__all__ = ["PipelineOutcome", "StepRecord", "schedule_table", "schedule_order", "run_pipeline",
           "ideal_makespan", "place", "divisible"]

PHASES = ("prologue", "forward", "backward", "update")
_KIND = {"forward": "forward", "f": "forward", "fwd": "forward",
         "backward": "backward", "b": "backward", "bwd": "backward"}


def divisible(shape: Sequence[int], spec: Sequence[Any], axis_sizes: Mapping[str, int]) -> bool:
    """True when every dimension of ``shape`` divides by the product of its mesh axes."""
    if len(spec) > len(shape):
        return False
    for n, e in zip(shape, spec):
        if e and n % math.prod(axis_sizes[a] for a in e):
            return False
    return True


def place(host: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """A (global) array with ``sharding`` made from a host value: each process fills its own
    shards (``jax.make_array_from_callback``), so this works across processes too."""
    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def schedule_table(kind: str, num_stages: int, microbatches: int
                   ) -> list[list[tuple[int, int, str] | None]]:
    """A GPipe or 1F1B clock table in the layout of ``Schedule.table``: rows are clock ticks,
    columns are meshes (stage ``j`` runs on mesh ``j``); entries are ``(micro-batch, stage,
    kind)`` tasks or None (a bubble).

    Per-mesh orders (GPipe: all forwards then all backwards; 1F1B: ``S - j - 1`` warm-up
    forwards, then one forward and one backward alternately, then the cool-down backwards) are
    placed on a clock with unit task times, each task at the first tick after its dependencies.

    Args:
        kind: ``"gpipe"`` or ``"1f1b"``.
        num_stages: stages ``S``.
        microbatches: micro-batches ``m``.

    Returns:
        ``2 (m + S - 1)`` rows holding ``2 S m`` tasks.

    Raises:
        ExecutionError: an unknown schedule kind.

    Examples:
        >>> schedule_table("gpipe", 2, 2)[:3]
        [[(0, 0, 'forward'), None], [(1, 0, 'forward'), (0, 1, 'forward')], [None, (1, 1, 'forward')]]
    """
    S, m = num_stages, microbatches
    if kind not in ("gpipe", "1f1b", "none"):
        raise ExecutionError(f"schedule kind should be 'gpipe' or '1f1b'. Got {kind!r}. Fix: use "
                             "one of them in the plan's Schedule.")
    orders: list[list[tuple[int, int, str]]] = []
    for j in range(S):
        if kind == "1f1b":
            w = min(S - j - 1, m)
            seq = [(i, j, "forward") for i in range(w)]
            f, b = w, 0
            while f < m or b < m:
                if f < m:
                    seq.append((f, j, "forward"))
                    f += 1
                if b < m and b < f:
                    seq.append((b, j, "backward"))
                    b += 1
            orders.append(seq)
        else:
            orders.append([(i, j, "forward") for i in range(m)] + [(i, j, "backward") for i in range(m)])
    done: dict[tuple[int, int, str], int] = {}
    pos = [0] * S
    rows: list[list[tuple[int, int, str] | None]] = []
    tick = 0
    while any(pos[j] < len(orders[j]) for j in range(S)):
        row = []
        for j in range(S):
            if pos[j] >= len(orders[j]):
                continue
            t = orders[j][pos[j]]
            if all(d in done and done[d] < tick for d in _deps(t, S)):
                row.append(t)
        for t in row:
            done[t] = tick
            pos[t[1]] += 1
        if not row:  # pragma: no cover - the per-mesh orders above are always feasible
            raise ExecutionError(f"schedule_table: {kind} order deadlocked")
        cols: list[tuple[int, int, str] | None] = [None] * S
        for t in row:
            cols[t[1]] = t
        rows.append(cols)
        tick += 1
    return rows


def schedule_order(kind: str, num_stages: int, microbatches: int) -> list[tuple[int, int, str]]:
    """:func:`schedule_table` read tick by tick: a valid task order.

    Examples:
        >>> [f"{k[0].upper()}{m}s{j}" for m, j, k in schedule_order("1f1b", 2, 2)]
        ['F0s0', 'F1s0', 'F0s1', 'B0s1', 'B0s0', 'F1s1', 'B1s1', 'B1s0']
    """
    return [t for row in schedule_table(kind, num_stages, microbatches) for t in row if t is not None]


def _deps(task: tuple[int, int, str], S: int) -> list[tuple[int, int, str]]:
    i, j, kind = task
    if kind == "forward":
        return [(i, j - 1, "forward")] if j > 0 else []
    deps = [(i, j, "forward")]
    if j < S - 1:
        deps.append((i, j + 1, "backward"))
    return deps


def ideal_makespan(order: Sequence[tuple[int, int, str]], forward: Sequence[float],
                   backward: Sequence[float]) -> float:
    """The schedule's time with the given per-stage task times and free communication: each mesh
    runs its tasks in ``order``'s order, each as soon as its dependencies are done."""
    S = len(forward)
    end: dict[tuple[int, int, str], float] = {}
    free = [0.0] * S
    pending = list(order)
    while pending:
        progressed = False
        rest = []
        for t in pending:
            deps = _deps(t, S)
            if all(d in end for d in deps) and all(r[1] != t[1] for r in rest):
                start = max([free[t[1]]] + [end[d] for d in deps])
                end[t] = start + (forward[t[1]] if t[2] == "forward" else backward[t[1]])
                free[t[1]] = end[t]
                progressed = True
            else:
                rest.append(t)
        if not progressed:
            raise ExecutionError("ideal_makespan: the order's dependencies cannot be met")
        pending = rest
    return max(end.values(), default=0.0)


@dataclass
class _Task:
    phase: str
    stage: int
    ops: list[FlatOp] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    compiled: Any = None
    last_args: Any = None

    @property
    def name(self) -> str:
        return f"{self.phase}[{self.stage}]"


@dataclass
class PipelineOutcome:
    """What :func:`run_pipeline` measured (``run`` turns it into a ``RunReport``).

    Attributes:
        losses, step_times: per step.
        outputs: the last step's results (a pytree of arrays on the stages' submeshes).
        compile_time: seconds spent compiling the tasks.
        collectives: ``(task name, stage, collective, executions per step)``.
        memory: per device id, the largest of its stage's task executables.
        transfer_bytes: per stage, bytes each of its devices receives from other submeshes per
            step (values are sent replicated, so every device receives the whole value).
        task_times: seconds per task execution (measured alone after the steps).
        ideal_time: the schedule's makespan with those times and free communication, plus the
            prologue and update tasks.
        order: the task order run.
        constraints_applied, constraints_skipped: sharding constraints of the plan's operators.
        phases: number of operators per (phase, stage) task.
    """

    losses: list[float]
    step_times: list[float]
    outputs: Any
    compile_time: float
    collectives: list[tuple[str, int, Collective, int]]
    memory: dict[int, MemoryStats]
    transfer_bytes: dict[int, float]
    task_times: dict[str, float]
    ideal_time: float
    order: list[tuple[int, int, str]]
    constraints_applied: int
    constraints_skipped: int
    phases: dict[str, int]
    crossing: list[int] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    graph: Any = None


@dataclass
class StepRecord:
    """One executed step, for the equivalence check.

    Attributes:
        loss: the step's loss.
        outputs: its results (arrays, possibly sharded).
        grads: the values handed to the optimizer update (``PipelineOutcome.crossing``), in
            that order: the full-batch gradients.
    """

    loss: float
    outputs: Any
    grads: list[Any]


@jax.jit
def _add_lists(a: list[Any], b: list[Any]) -> list[Any]:
    return [x + y for x, y in zip(a, b)]


@jax.jit
def _scale_list(a: list[Any], factor: float) -> list[Any]:
    return [(x * factor).astype(x.dtype) for x in a]


def _table_order(plan: Any) -> list[tuple[int, int, str]]:
    sch = plan.schedule
    S, m = len(plan.stages), sch.microbatches
    if sch.table:
        order = []
        for row in sch.table:
            for e in row:
                if e is None:
                    continue
                mb, st, kind = int(e[0]), int(e[1]), _KIND.get(str(e[2]).lower())
                if kind is None:
                    raise ExecutionError(f"schedule table entry {e!r}: kind should be 'forward' or "
                                         "'backward'. Fix: re-create the plan's schedule.")
                order.append((mb, st, kind))
    else:
        order = schedule_order(sch.kind, S, m)
    want = {(i, j, k) for i in range(m) for j in range(S) for k in ("forward", "backward")}
    if sorted(order) != sorted(want):
        raise ExecutionError(
            f"the plan's schedule table should hold each of the {len(want)} (micro-batch, stage, "
            f"forward/backward) tasks once for {m} micro-batches and {S} stages. Got {len(order)} "
            "entries. Fix: re-create the plan's schedule.")
    return order


def _layer_stage(node: Any, layer_stage: Mapping[str, int],
                 op_units: Sequence[tuple[int, int]]) -> int | None:
    """The stage whose layers hold an operator: by its top-level scope (``"(root)"`` for an
    un-scoped one), or, for a graph without scopes whose layers are named ``op<id>`` (units
    starting at that forward operator), the unit holding a forward operator."""
    name = node.scope[0] if node.scope else "(root)"
    if name in layer_stage:
        return layer_stage[name]
    if op_units and node.role == "forward" and not node.scope:
        k = bisect.bisect_right([u for u, _ in op_units], node.id) - 1
        return op_units[max(k, 0)][1]
    return None


def _assign(plan: Any, graph: Any, prog: FlatProgram) -> list[tuple[str, int]]:
    """(phase, stage) of every operator; see the module docstring."""
    S = len(plan.stages)
    layer_stage = {name: s for s, st in enumerate(plan.stages) for name in st.layers}
    op_units = sorted((int(n[2:]), s) for n, s in layer_stage.items() if re.fullmatch(r"op\d+", n))
    spec_of = {(i.arg, i.path): i for i in plan.inputs}
    input_stage: dict[int, int] = {}
    batch: set[int] = set()
    for gi in graph.inputs:
        ispec = spec_of.get((gi.arg, gi.path))
        if ispec is not None:
            input_stage[gi.tensor] = ispec.stage
        if gi.kind == "batch":
            batch.add(gi.tensor)
    per_mb = set(batch)
    post: set[int] = set()
    producer: dict[int, tuple[str, int]] = {}

    def key(phase: str, s: int) -> tuple[int, int]:
        return (PHASES.index(phase), S - 1 - s if phase == "backward" else s)

    out: list[tuple[str, int]] = []
    for op, node in zip(prog.ops, graph.ops):
        ins = [t for t in op.inputs if not isinstance(t, Lit)]
        reads_mb = any(t in per_mb for t in ins)
        reads_post = any(t in post for t in ins)
        if reads_post or (reads_mb and node.role == "update"):
            phase = "update"
        elif reads_mb:
            phase = "backward" if node.role == "backward" else "forward"
        else:
            phase = "prologue"
        same = [producer[t] for t in ins if t in producer and producer[t][0] == phase]
        if any(producer[t][0] == "update" for t in ins if t in producer) and phase != "update":
            raise ExecutionError(
                f"operator {op.id} ({op.primitive}, role {node.role}) runs per micro-batch but reads "
                "a value of the optimizer update. Fix: such a step cannot be pipelined; use an "
                "intra-operator plan.")
        stage = _layer_stage(node, layer_stage, op_units)
        if stage is None and phase == "backward":
            # an un-scoped backward operator goes with the forward values it differentiates
            fwd = [producer[t][1] for t in ins if t in producer and producer[t][0] == "forward"]
            stage = min(fwd) if fwd else None
        if stage is None and same:
            stage = max(same, key=lambda p: key(*p))[1]
        if stage is None:
            held = [input_stage[t] for t in ins if t in input_stage]
            made = [producer[t] for t in ins if t in producer]
            if held:
                stage = held[0]
            elif made:
                stage = max(made, key=lambda p: key(*p))[1]
            else:
                stage = S - 1 if phase == "backward" else 0
        if same:
            latest = max(same, key=lambda p: key(*p))
            if key(*latest) > key(phase, stage):
                stage = latest[1]
        for t in op.outputs:
            producer[t] = (phase, stage)
            if phase in ("forward", "backward"):
                per_mb.add(t)
            elif phase == "update":
                post.add(t)
        out.append((phase, stage))
    return out


def _build_tasks(prog: FlatProgram, assign: list[tuple[str, int]], output_ids: set[int]
                 ) -> tuple[dict[tuple[str, int], _Task], dict[int, tuple[str, int]]]:
    tasks: dict[tuple[str, int], _Task] = {}
    producer: dict[int, tuple[str, int]] = {}
    for op, (phase, s) in zip(prog.ops, assign):
        task = tasks.setdefault((phase, s), _Task(phase, s))
        task.ops.append(op)
        for t in op.outputs:
            producer[t] = (phase, s)
    for task in tasks.values():
        made = {t for op in task.ops for t in op.outputs}
        seen: set[int] = set()
        for op in task.ops:
            for t in op.inputs:
                if isinstance(t, Lit) or t in made or t in prog.consts or t in seen:
                    continue
                seen.add(t)
                task.inputs.append(t)
    needed: set[int] = set(output_ids)
    for task in tasks.values():
        needed.update(task.inputs)
    for task in tasks.values():
        task.outputs = [t for op in task.ops for t in op.outputs if t in needed]
    return tasks, producer


def run_pipeline(plan: Any, fn: Callable[..., Any], host_args: tuple[Any, ...],
                 arg_kinds: Sequence[str], full_graph: Any, devices: Sequence[Any], steps: int,
                 on_step: Callable[[int, float, float], None] | None = None,
                 time_tasks: bool = True, capture: bool = False,
                 compiler_options: Mapping[str, Any] | None = None) -> PipelineOutcome:
    """Run ``steps`` training steps of a pipeline plan (see the module docstring).

    Args:
        plan: a plan with several stages.
        fn: the training step ``(params, opt_state, batch) -> (loss, params, opt_state)``.
        host_args: its arguments as host (numpy) pytrees.
        arg_kinds: the kind of each argument (``"batch"`` ones are split into micro-batches).
        full_graph: the full-batch trace the plan was made for (its fingerprint is checked by
            the caller); the step is re-traced at the micro-batch size, and the plan's operator
            ids (``Stage.ops``) are read in that micro-batch trace, as the search writes them.
        devices: the devices (``plan.mesh`` takes the stages' ids from them).
        steps: training steps.
        on_step: called with (step, loss, seconds) after each step.
        time_tasks: after the steps, time each task alone (for the schedule's ideal).
        capture: keep every step's results and the gradients handed to the update
            (``PipelineOutcome.records``) for the equivalence check.
        compiler_options: XLA options for every task's compilation.

    Returns:
        The measurements.

    Raises:
        ExecutionError: the batch does not split into the micro-batches, the step's structure
            depends on the batch size, or the schedule's order breaks a data dependency.
    """
    S = len(plan.stages)
    M = plan.schedule.microbatches
    if jax.process_count() > 1:
        raise ExecutionError(
            "pipeline plans run in one process only: moving activations between submeshes held by "
            "different processes needs cross-host transfers this executor does not implement. "
            "Fix: run the pipeline plan with autoplan.exec.run in one process, or launch an "
            "intra-operator plan.")
    if M < 1:
        raise ExecutionError(f"schedule.microbatches should be at least 1. Got {M}.")
    order = _table_order(plan)
    batch_args = [i for i, k in enumerate(arg_kinds) if k == "batch"]
    mb_abstract = []
    for i, a in enumerate(host_args):
        if i in batch_args:
            def split(x, i=i):
                x = np.asarray(x)
                if x.ndim == 0 or x.shape[0] % M:
                    raise ExecutionError(
                        f"batch argument {i} has a leaf of shape {x.shape} whose leading dimension "
                        f"does not split into {M} micro-batches. Fix: make a plan whose "
                        "schedule.microbatches divides the batch size.")
                return jax.ShapeDtypeStruct((x.shape[0] // M,) + x.shape[1:], x.dtype)
            mb_abstract.append(jax.tree_util.tree_map(split, a))
        else:
            mb_abstract.append(jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueControlFlowWarning)
        graph = trace(fn, *mb_abstract, arg_kinds=tuple(arg_kinds), name=full_graph.name)
    prog = flatten(fn, *mb_abstract)
    prog.check_matches(graph)

    meshes = [plan.mesh(devices, s) for s in range(S)]
    mesh_devs = [frozenset(m.devices.flat) for m in meshes]
    assign = _assign(plan, graph, prog)
    out_ids = {r for r in prog.outputs if not isinstance(r, Lit)}
    tasks, producer = _build_tasks(prog, assign, out_ids)

    # plan shardings of the graph inputs
    spec_of = {(i.arg, i.path): i for i in plan.inputs}
    leaves_with_path = []
    for a, tree in enumerate(host_args):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            leaves_with_path.append((a, jax.tree_util.keystr(path), leaf))
    in_info: dict[int, tuple[int, Any, bool]] = {}  # tensor -> (stage, sharding, is batch)
    for tid, (a, path, leaf) in zip(prog.input_ids, leaves_with_path):
        ispec = spec_of[(a, path)]
        mesh = meshes[ispec.stage]
        shape = np.shape(leaf)
        is_batch = a in batch_args
        if is_batch:
            shape = (shape[0] // M,) + tuple(shape[1:])
        ok = divisible(shape, ispec.spec, dict(mesh.shape))
        sh = NamedSharding(mesh, spec_to_pspec(ispec.spec) if ok else PartitionSpec())
        in_info[tid] = (ispec.stage, sh, is_batch)

    # accumulated values: per-micro-batch results read by the update or returned
    per_mb_tasks = {k for k in tasks if k[0] in ("forward", "backward")}
    accumulate: set[int] = set()
    for (phase, _s), task in tasks.items():
        if phase in ("update", "prologue"):
            accumulate.update(t for t in task.inputs if producer.get(t, ("",))[0] in ("forward", "backward"))
    accumulate.update(t for t in out_ids if producer.get(t, ("",))[0] in ("forward", "backward"))
    for t in accumulate:
        dt = graph.tensors[t].dtype
        if not np.issubdtype(np.dtype(dt), np.floating):
            raise ExecutionError(
                f"tensor {t} ({dt}) is computed per micro-batch and handed to the update or "
                "returned; only floating-point values can be averaged over micro-batches. Fix: "
                "use an intra-operator plan for this step.")
    crossing = sorted(t for t in accumulate if any(
        t in task.inputs for k, task in tasks.items() if k[0] in ("update", "prologue")))
    consumers: dict[int, int] = {}
    for k in per_mb_tasks:
        for t in tasks[k].inputs:
            if producer.get(t, ("",))[0] in ("forward", "backward"):
                consumers[t] = consumers.get(t, 0) + 1

    hooks = []
    applied = skipped = 0
    for s in range(S):
        mine = {op.id for k, task in tasks.items() if k[1] == s for op in task.ops}
        hook, counts = sharding_hook(meshes[s], [o for o in plan.stages[s].ops if o.op in mine],
                                     exact_shapes=False)
        hooks.append((hook, counts))

    def make_fn(task: _Task):
        hook = hooks[task.stage][0]

        def f(*vals):
            env = dict(zip(task.inputs, vals))
            prog.evaluate(env, task.ops, hook)
            return [env[t] for t in task.outputs]
        f.__name__ = f"{task.phase}_stage{task.stage}"
        return f

    fns = {k: jax.jit(make_fn(t)) for k, t in tasks.items()}
    compile_time = 0.0
    transfer = dict.fromkeys(range(S), 0.0)

    def to_stage(v: Any, s: int) -> Any:
        if isinstance(v, jax.Array) and frozenset(v.sharding.device_set) != mesh_devs[s]:
            transfer[s] += v.nbytes
            return jax.device_put(v, NamedSharding(meshes[s], PartitionSpec()))
        return v

    def call(k: tuple[str, int], args: list[Any]) -> list[Any]:
        nonlocal compile_time
        task = tasks[k]
        if task.compiled is None:
            t0 = time.perf_counter()
            task.compiled = fns[k].lower(*args).compile(compiler_options=compiler_options)
            compile_time += time.perf_counter() - t0
        task.last_args = args
        return task.compiled(*args)

    inputs_now: dict[int, Any] = {}
    for tid, (_a, _path, leaf) in zip(prog.input_ids, leaves_with_path):
        _stage, sh, is_batch = in_info[tid]
        if is_batch:
            inputs_now[tid] = np.asarray(leaf)
        else:
            inputs_now[tid] = place(leaf, sh)

    def one_step() -> tuple[list[Any], list[Any]]:
        """One training step from ``inputs_now``: the flat results and the accumulated
        values handed to the update."""
        store: dict[Any, Any] = {}  # (micro-batch, "acc" or None, tensor) -> value
        moved: dict[Any, Any] = {}  # (..., tensor, stage) -> the value on that stage
        acc: dict[int, Any] = {}
        left: dict[tuple[int, int], int] = {}

        def value(t: int, s: int, mb: int | None, phase: str) -> Any:
            if t in in_info:
                stage, sh, is_batch = in_info[t]
                if is_batch:  # micro-batch slices, kept while the host batch stays the same
                    host = inputs_now[t]
                    ck = (id(host), mb, t, s)
                    if ck not in batch_cache:
                        b = host.shape[0] // M
                        shd = sh if stage == s else NamedSharding(meshes[s], PartitionSpec())
                        batch_cache[ck] = (host, place(host[mb * b:(mb + 1) * b], shd))
                    return batch_cache[ck][1]
                if stage == s:
                    return inputs_now[t]
                ck = (None, t, s)
                if ck not in moved:
                    moved[ck] = to_stage(inputs_now[t], s)
                return moved[ck]
            pphase = producer[t][0]
            if pphase in ("forward", "backward") and phase in ("forward", "backward"):
                key: tuple[Any, int] = (mb, t)
            elif pphase in ("forward", "backward"):
                key = ("acc", t)
            else:
                key = (None, t)
            if key not in store:
                raise ExecutionError(
                    f"the schedule order runs a {phase} task of stage {s} (micro-batch {mb}) before "
                    f"the {pphase} task of stage {producer[t][1]} that produces its operand (tensor "
                    f"{t}). Fix: use a schedule table whose order respects the dependencies.")
            ck = key + (s,)
            if ck not in moved:
                moved[ck] = to_stage(store[key], s)
            return moved[ck]

        def run_task(k: tuple[str, int], mb: int | None) -> None:
            task = tasks[k]
            outs = call(k, [value(t, k[1], mb, k[0]) for t in task.inputs])
            summed = [t for t in task.outputs if t in accumulate]
            if mb is not None and summed:  # one jitted add per task, not one per gradient
                new = [v for t, v in zip(task.outputs, outs) if t in accumulate]
                old = [acc.get(t) for t in summed]
                if all(o is not None for o in old):
                    new = _add_lists(old, new)
                acc.update(zip(summed, new))
            for t, v in zip(task.outputs, outs):
                if mb is None:
                    store[(None, t)] = v
                    continue
                if consumers.get(t):
                    store[(mb, t)] = v
                    left[(mb, t)] = consumers[t]
            if mb is not None:  # free per-micro-batch values nobody reads any more
                for t in task.inputs:
                    if (mb, t) in left:
                        left[(mb, t)] -= 1
                        if left[(mb, t)] == 0:
                            del left[(mb, t)]
                            store.pop((mb, t), None)
                            for s2 in range(S):
                                moved.pop((mb, t, s2), None)

        for s in range(S):
            if ("prologue", s) in tasks:
                run_task(("prologue", s), None)
        for mb, s, kind in order:
            if (kind, s) in tasks:
                run_task((kind, s), mb)
        for s in range(S):  # the mean over micro-batches, one call per submesh
            names = [t for t in acc if producer[t][1] == s]
            vals = [acc[t] for t in names]
            for t, v in zip(names, _scale_list(vals, 1.0 / M) if M > 1 and vals else vals):
                store[("acc", t)] = v
        for s in range(S):
            if ("update", s) in tasks:
                run_task(("update", s), None)
        flat_out = []
        for r in prog.outputs:
            if isinstance(r, Lit):
                flat_out.append(jnp.asarray(r.value))
            elif r in in_info:
                flat_out.append(inputs_now[r])
            elif producer[r][0] in ("forward", "backward"):
                flat_out.append(store[("acc", r)])
            else:
                flat_out.append(store[(None, r)])
        return jax.block_until_ready(flat_out), [store[("acc", t)] for t in crossing]

    batch_cache: dict[Any, Any] = {}
    one_step()  # warm-up: compiles every task; its results are dropped
    losses: list[float] = []
    step_times: list[float] = []
    records: list[StepRecord] = []
    outputs: Any = None
    for step in range(steps):
        for s in range(S):
            transfer[s] = 0.0
        t0 = time.perf_counter()
        flat_out, grads = one_step()
        dt = time.perf_counter() - t0
        outputs = jax.tree_util.tree_unflatten(prog.out_tree, flat_out)
        first = flat_out[0]
        loss = float(np.asarray(first.addressable_data(0))) if isinstance(first, jax.Array) else float(first)
        losses.append(loss)
        step_times.append(dt)
        if capture:
            records.append(StepRecord(loss, outputs, grads))
        if on_step is not None:
            on_step(step, loss, dt)
        if step + 1 < steps:
            if not (isinstance(outputs, tuple) and len(outputs) == len(host_args)):
                raise ExecutionError("steps > 1 needs a step returning (loss, new_params, "
                                     "new_opt_state). Fix: run steps=1.")
            new_leaves = jax.tree_util.tree_leaves(tuple(outputs[1:]))
            fixed = [t for t in prog.input_ids if not in_info[t][2]]
            if len(new_leaves) != len(fixed):
                raise ExecutionError("the step's new parameters and optimizer state should mirror "
                                     "its inputs. Fix: run steps=1.")
            for t, v in zip(fixed, new_leaves):
                inputs_now[t] = jax.device_put(v, in_info[t][1])

    colls: list[tuple[str, int, Collective, int]] = []
    memory: dict[int, MemoryStats] = {}
    for k, task in tasks.items():
        if task.compiled is None:
            continue
        times = M if k[0] in ("forward", "backward") else 1
        for c in collectives(task.compiled.as_text()):
            colls.append((task.name, k[1], c, times))
        ms = memory_stats(task.compiled)
        for d in meshes[k[1]].devices.flat:
            if d.id not in memory or ms.total > memory[d.id].total:
                memory[d.id] = ms
    task_times: dict[str, float] = {}
    if time_tasks:
        for task in tasks.values():
            if task.compiled is None:
                continue
            best = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                jax.block_until_ready(task.compiled(*task.last_args))
                best = min(best, time.perf_counter() - t0)
            task_times[task.name] = best
    fwd = [task_times.get(f"forward[{s}]", 0.0) for s in range(S)]
    bwd = [task_times.get(f"backward[{s}]", 0.0) for s in range(S)]
    ideal = (max((task_times.get(f"prologue[{s}]", 0.0) for s in range(S)), default=0.0)
             + ideal_makespan(order, fwd, bwd)
             + max((task_times.get(f"update[{s}]", 0.0) for s in range(S)), default=0.0))
    for _hook, counts in hooks:
        applied += counts["applied"]
        skipped += counts["skipped"]
    for task in tasks.values():
        task.last_args = None
    return PipelineOutcome(
        losses=losses, step_times=step_times, outputs=outputs, compile_time=compile_time,
        collectives=colls, memory=memory, transfer_bytes=dict(transfer), task_times=task_times,
        ideal_time=ideal, order=order, constraints_applied=applied, constraints_skipped=skipped,
        phases={t.name: len(t.ops) for t in tasks.values()}, crossing=crossing, records=records,
        graph=graph)
