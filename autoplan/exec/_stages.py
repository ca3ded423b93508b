"""The stage executor: gradient accumulation as one scanned program, and pipeline stages as one
program per task on their own submeshes, in one process or across processes (MPMD).

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
3. Every operator gets a *stage*: the stage whose ``layers`` hold its named-scope layer
   (``graph.layer_names``), or, for a forward operator in none, the stage of the planned forward
   operator at or before it whose recorded layer a stage holds (the search's layers without
   named scopes are ranges of the forward pass, named from what they hold; a plan file of an
   older version names them ``op<id>``, the range from that id); any other (the optimizer, glue) goes with
   its latest producer, or with the stage holding the parameter it reads. An operator is moved
   later when one of its operands would otherwise come from a task that runs after it.
4. The backward of a stage is the train step's own backward operators of that stage's layers
   (what ``jax.value_and_grad`` produced when the step was traced), not a re-derivation: the
   gradients are exactly the step's.
5. Values a per-micro-batch operator hands to the update (the gradients) and per-micro-batch
   results (the loss) are summed over the micro-batches in an accumulator of at least float32,
   laid out like the parameter the gradient updates, and divided by the number of micro-batches:
   the full-batch gradient of a loss that is a mean over the batch's leading dimension. The update
   operators then run once, on those means, so the optimizer is the workload's own. A loss that
   is not such a mean (batch statistics, sums) gives other numbers; the equivalence check says so.

Gradient accumulation (one stage, ``m > 1`` micro-batches) is **one compiled program**: the
prologue, a ``lax.scan`` over the micro-batches (each iteration the forward and backward of one
micro-batch, adding into the accumulators), the means and the update. The batch enters stacked as
``(m, b, ...)`` with the plan's spec on the micro-batch dimensions, so every device holds its
share of every micro-batch and nothing moves between devices to take a slice. One dispatch per
step, whatever ``m``.

A pipeline (several stages on disjoint submeshes) runs the plan's schedule table task by task,
each *task* (phase, stage) a program jitted on the stage's submesh (``plan.mesh(stage=i)``) with
``with_sharding_constraint`` on the operators the plan chose shardings for:

* ``prologue[s]`` once per step; it also makes stage ``s``'s zeroed accumulators;
* ``forward[s]`` and ``backward[s]`` once per micro-batch, in the table's order; a task that
  produces accumulated values takes their running sums and returns the new sums (donated), so
  accumulation costs no dispatch of its own;
* ``update[s]`` once per step: the means of the sums it reads, then the stage's update operators.

A ZB-H1 table (``weight`` tasks) splits each stage's backward in two tasks:
``backward[s]`` (``B``) holds the backward operators whose results another stage's
per-micro-batch task reads, and everything those read; ``weight[s]`` (``W``) the rest, which feed
only the accumulated weight gradients (:func:`_split_weight_passes`). An interleaved plan's
stages are model chunks, stage ``s`` on the devices of mesh ``s mod P``; each chunk is a stage
here, and the CPU waits below are per mesh.

This is the fewest dispatches the schedule allows: a stage cannot run the forwards of several
micro-batches as one program without making the next stage wait for all of them (GPipe would
then run the stages one after the other, ``S m (f + b)`` instead of ``(m + S - 1)(f + b)``), and
in 1F1B nearly every task reads a value its neighbour made one tick earlier. So a pipeline step
is ``S (2 m + 2)`` programs plus the transfers between stages, and everything else
(accumulation, means, zeroing) is folded into those programs.
All of a step's dispatch decisions are made once, before the first step, as a list of
instructions (run a task, send values to another stage); a step walks that list.

Values crossing stages leave their task replicated on its submesh (a constraint inside the
task) and arrive replicated on the consumer's submesh, counted as send/recv bytes. Within one
process that is ``jax.device_put``. Across processes (multi-controller JAX, every process running
the same instruction list and issuing only what involves its own devices) it is a collective:
a jitted ``shard_map`` over the union of the two submeshes whose ``lax.ppermute`` rounds send
each source device's copy to destination devices (:mod:`autoplan.exec._transfer`). Since every
process walks the same list, every cross-process collective is issued in the same order
everywhere.

XLA's CPU runtime runs each device's share of a program on a thread pool as large as the
number of devices, and a collective blocks its threads until every participant arrives: two
programs with collectives on the same devices in flight at once can starve each other, and XLA
then ends the process after its rendezvous timeout. On CPU the executor therefore waits for a
submesh's earlier programs with collectives before it dispatches another one there (programs on
different submeshes still overlap); on GPUs, streams order the programs and nothing waits.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from autoplan._dtype import dtype_bytes, is_key_dtype
from autoplan._errors import ExecutionError
from autoplan.exec._hlo import Collective, MemoryStats, collectives, memory_stats
from autoplan.exec._hlo import _parse as _parse_hlo
from autoplan.exec._interpret import FlatOp, FlatProgram, Lit, sharding_hook
from autoplan.exec._levers import evaluate_with_barriers, recompute
from autoplan.exec._transfer import move, replicated_on, transfer
from autoplan.plans._schedule import KINDS, ideal_makespan, num_meshes, order_from_table, schedule_order
from autoplan.plans._spec import ZERO_SHARDED, Spec, zero_spec
from autoplan.tracing._signature import step_signature
from autoplan.tracing._workload import abstract_leaf, is_key_leaf

__all__ = ["PipelineOutcome", "StepRecord", "run_pipeline", "run_program", "place", "transfer", "executions_per_run",
           "error_summary", "first_scalar"]

#: move values between submeshes with the cross-process collective (:mod:`._transfer`) even
#: within one process: what a launch across processes runs, made testable in one process
_FORCE_COLLECTIVE_TRANSFERS = False

PHASES = ("prologue", "forward", "backward", "weight", "update")
PER_MB = ("forward", "backward", "weight")
STEP = -1  # the micro-batch index of per-step values


def place(host: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """A (global) array with ``sharding`` made from a host value: each process fills its own
    shards (``jax.make_array_from_callback``), so this works across processes too.

    A typed PRNG key (``jax.random.key``) is placed as its key data, with the key's spec and the
    data's last dimension (the key's words) whole, then wrapped again as a key of the same
    implementation."""
    if is_key_array(host):
        data = np.asarray(jax.random.key_data(host))
        spec = tuple(sharding.spec) + (None,) * (data.ndim - len(sharding.spec))
        words = place(data, NamedSharding(sharding.mesh, PartitionSpec(*spec)))
        return jax.random.wrap_key_data(words, impl=jax.random.key_impl(host))
    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


#: True for a typed PRNG key array (dtype ``key<impl>``)
is_key_array = is_key_leaf


def host_value(x: Any) -> Any:
    """A value held on the host between steps: a NumPy array, or a typed PRNG key kept as the
    JAX key array it is (NumPy has no key dtype)."""
    return x if is_key_array(x) else np.asarray(x)


_KEY_IMPLS = {"fry": "threefry2x32", "rbg": "rbg", "urbg": "unsafe_rbg"}


def _key_impl(name: Any) -> str:
    """The PRNG implementation of a typed key's dtype name (``key<fry>``: threefry2x32)."""
    return _KEY_IMPLS.get(str(name)[4:-1], "threefry2x32")


@functools.cache
def jax_dtype(name: str) -> Any:
    """The dtype a graph tensor's dtype name stands for: a NumPy dtype, or a typed PRNG key's
    dtype (``key<fry>``), which NumPy does not know."""
    if is_key_dtype(name):
        return jax.eval_shape(lambda: jax.random.key(0, impl=_key_impl(name))).dtype
    return np.dtype(name)


@functools.cache
def _key_data_aval(name: str) -> tuple[tuple[int, ...], Any]:
    """The trailing shape and dtype of a typed key's key data (``key<fry>``: (2,), uint32)."""
    a = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=_key_impl(name))))
    return tuple(a.shape), a.dtype


#: The shape and dtype of a host value as JAX sees it when the step is called with it (a typed
#: PRNG key keeps its key dtype, dtypes are JAX's canonical ones, a Python number is weakly typed)
abstract_value = abstract_leaf


def comparable(x: Any) -> np.ndarray:
    """A NumPy array to compare: the value itself, or a typed key's key data (``uint32``)."""
    return np.asarray(jax.random.key_data(x)) if is_key_array(x) else np.asarray(x)


def executions_per_run(hlo_text: str, default_trip_count: int = 1) -> dict[str, int]:
    """How many times each computation of a compiled HLO module runs per execution.

    The entry runs once; a ``while`` body and condition run its ``known_trip_count`` times (or
    ``default_trip_count`` when XLA did not record one) times their caller's count; any other
    called computation runs as often as its caller.

    Examples:
        >>> text = '''
        ... %body (p: f32[]) -> f32[] {
        ...   ROOT %ar = f32[] all-reduce(%p), replica_groups={{0,1}}, to_apply=%add
        ... }
        ... ENTRY %main (x: f32[]) -> f32[] {
        ...   ROOT %w = f32[] while(%x), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"8"}}
        ... }'''
        >>> executions_per_run(text)["body"]
        8
    """
    comps, _ = _parse_hlo(hlo_text)
    calls: dict[str, list[tuple[str, int]]] = {c: [] for c in comps}
    called: set[str] = set()
    for comp, instrs in comps.items():
        for ins in instrs:
            trip = 1
            if ins.opcode == "while":
                m = re.search(r'known_trip_count"?\s*[:=]\s*\{\s*"?n"?\s*[:=]\s*"?(\d+)', ins.attrs)
                trip = int(m.group(1)) if m else default_trip_count
            for key, name in re.findall(r"\b(calls|to_apply|body|condition|branch_computations|"
                                        r"true_computation|false_computation)=\{?%?([\w.\-]+)",
                                        ins.attrs):
                if name in comps:
                    calls[comp].append((name, trip if key in ("body", "condition") else 1))
                    called.add(name)
    count: dict[str, int] = {}
    stack = [(c, 1) for c in comps if c not in called]
    while stack:
        comp, n = stack.pop()
        if count.get(comp, 0) >= n:
            continue
        count[comp] = n
        stack.extend((callee, n * k) for callee, k in calls[comp])
    return count


@dataclass
class _Task:
    """One program of a pipeline step: the operators of one (phase, stage).

    ``inputs`` are the tensors it reads (in first-use order); ``plain`` the results it returns;
    ``acc`` the accumulated tensors it adds into (per-micro-batch tasks) or zeroes (prologue);
    ``means`` the accumulated tensors whose sums an update task reads, and ``mean_out`` the means
    it returns (results of the step, gradients for the equivalence check).
    """

    phase: str
    stage: int
    ops: list[FlatOp] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    plain: list[int] = field(default_factory=list)
    acc: list[int] = field(default_factory=list)
    means: list[int] = field(default_factory=list)
    mean_out: list[int] = field(default_factory=list)
    compiled: Any = None
    has_collectives: bool = False
    last_args: Any = None
    barriers: dict[int, tuple[int, ...]] = field(default_factory=dict)
    recomputed: int = 0

    @property
    def name(self) -> str:
        return f"{self.phase}[{self.stage}]"


@dataclass
class PipelineOutcome:
    """What :func:`run_pipeline` measured (``run`` turns it into a ``RunReport``).

    Attributes:
        losses, step_times: per step.
        outputs: the last step's results (a pytree of arrays on the stages' submeshes; across
            processes, leaves held only by other processes' stages are None).
        compile_time: seconds spent compiling.
        collectives: ``(program name, stage, collective, executions per step)``.
        memory: per device id, the largest of its stage's executables.
        transfer_bytes: per stage, bytes each of its devices receives from other submeshes per
            step (values are sent replicated, so every device receives the whole value).
        task_times: seconds per task execution (each task timed alone after the steps).
        ideal_time: the schedule's makespan with those times and free communication, plus the
            prologue and update tasks.
        order: the task order run.
        constraints_applied, constraints_skipped: sharding constraints of the plan's operators.
        phases: number of operators per (phase, stage) task.
        dispatches: programs and transfers dispatched per step by this process.
        grad_tensors: tensor ids of the micro-batch graph's gradients (the values handed to the
            optimizer update), matching each record's ``grads``.
        records: the executed steps, for the equivalence check (with ``capture``).
        graph: the micro-batch graph.
        held_bytes: per stage, bytes per device of the values its forward task hands to its own
            backward (and weight) tasks for one micro-batch: what it holds per micro-batch in
            flight (from the compiled forward task's output layouts; stages whose forward task
            was not compiled apart are missing).
        levers: per stage with memory levers, what the executor applied: ``zero``,
            ``zero_axes``, ``remat_layers`` and ``recomputed`` (operators its backward and weight
            tasks run again per micro-batch).
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
    grad_tensors: list[int] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    graph: Any = None
    dispatches: int = 0
    held_bytes: dict[int, int] = field(default_factory=dict)
    levers: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class StepRecord:
    """One executed step, for the equivalence check.

    Attributes:
        loss: the step's loss.
        outputs: its results (arrays, possibly sharded, or host arrays).
        grads: the values handed to the optimizer update (``PipelineOutcome.grad_tensors``), in
            that order: the full-batch gradients.
    """

    loss: float
    outputs: Any
    grads: list[Any]


def _table_order(plan: Any) -> list[tuple[int, int, str]]:
    sch = plan.schedule
    S, m = len(plan.stages), sch.microbatches
    if sch.table:
        return order_from_table(sch.table, S, m)
    kind = sch.kind if sch.kind in KINDS else ("1f1b" if S == 1 else "gpipe")
    return schedule_order(kind, S, m, _virtual_stages(plan) if kind == "interleaved" else 1)


def _virtual_stages(plan: Any) -> int:
    """The plan's stages per mesh (interleaved chunks; 1 otherwise)."""
    return int(getattr(plan.schedule, "virtual_stages", 1) or 1)


def _split_weight_passes(prog: FlatProgram, assign: list[tuple[str, int]]
                         ) -> list[tuple[str, int]]:
    """ZB-H1's backward split (Qi et al., ICLR 2024): of a stage's backward operators, ``B``
    (phase ``backward``) keeps those whose results another stage's per-micro-batch task reads
    (the gradient of the stage's input, which the previous stage waits for) and every operator
    those read in turn; the rest, which only the update (the weight gradients, accumulated) or
    each other read, become ``W`` (phase ``weight``). The step's own backward operators, not a
    re-derivation: ``B`` then ``W`` compute exactly what the backward did, the vjp with respect to
    the stage's input first and with respect to its weights after."""
    consumers: dict[int, list[int]] = {}
    for n, op in enumerate(prog.ops):
        for t in op.inputs:
            if not isinstance(t, Lit):
                consumers.setdefault(t, []).append(n)
    out = list(assign)
    in_b = [False] * len(prog.ops)
    for n in reversed(range(len(prog.ops))):  # consumers follow their producers
        phase, s = assign[n]
        if phase != "backward":
            continue
        in_b[n] = any(in_b[c] or (assign[c][0] in ("forward", "backward") and assign[c][1] != s)
                      for t in prog.ops[n].outputs for c in consumers.get(t, ()))
        if not in_b[n]:
            out[n] = ("weight", s)
    return out


def _layer_of(node: Any, layer_name: str | None, layer_stage: Mapping[str, int],
              op_units: Sequence[tuple[int, str]]) -> str | None:
    """The plan's layer that holds an operator: its named-scope layer (``layer_name``, from
    ``graph.layer_names``; ``"(root)"`` for none), or, for a forward operator in no named layer,
    the layer of the last range start at or before it (``op_units``: ``(first operator id,
    layer)`` of the ranges of forward operators the plan's layers without named scopes hold)."""
    name = layer_name or "(root)"
    if name in layer_stage:
        return name
    if op_units and node.role == "forward":
        k = bisect.bisect_right([u for u, _ in op_units], node.id) - 1
        return op_units[max(k, 0)][1]
    return None


def _unit_starts(plan: Any, graph: Any, layer_stage: Mapping[str, int]) -> list[tuple[int, str]]:
    """``(first forward operator id, layer)`` of each range of forward operators that the plan's
    layers without a named scope hold: where the planned forward operators outside every named
    layer change layer (their recorded layer is one a stage holds), or, in a plan file of an
    older version, the ids of its layers named ``op<id>``."""
    old = sorted((int(n[2:]), n) for n in layer_stage if re.fullmatch(r"op\d+", n))
    if old:
        return old
    names = graph.layer_names
    ops = graph.ops
    planned = sorted((o.op, o.layer) for st in plan.stages for o in st.ops
                     if o.op < len(ops) and ops[o.op].role == "forward" and names[o.op] is None
                     and o.layer in layer_stage)
    out: list[tuple[int, str]] = []
    last = None
    for op, layer in planned:
        if layer != last:
            out.append((op, layer))
            last = layer
    return out


def _remat_made(plan: Any, graph: Any, prog: FlatProgram, assign: Sequence[tuple[str, int]]
                ) -> tuple[dict[int, dict[int, FlatOp]], dict[int, str]]:
    """Per stage with rematerialised layers, the values their forward operators make (tensor ->
    operator), and the layer of each such operator."""
    wanted = {s: set(st.remat_layers) for s, st in enumerate(plan.stages) if st.remat_layers}
    if not wanted:
        return {}, {}
    layer_stage = {name: s for s, st in enumerate(plan.stages) for name in st.layers}
    units = _unit_starts(plan, graph, layer_stage)
    made: dict[int, dict[int, FlatOp]] = {}
    layer_of: dict[int, str] = {}
    for op, node, (phase, s) in zip(prog.ops, graph.ops, assign):
        if phase != "forward" or s not in wanted:
            continue
        name = _layer_of(node, graph.layer_names[node.id], layer_stage, units)
        if name in wanted[s]:
            layer_of[op.id] = name
            made.setdefault(s, {}).update(dict.fromkeys(op.outputs, op))
    return made, layer_of


def _assign(plan: Any, graph: Any, prog: FlatProgram) -> list[tuple[str, int]]:
    """(phase, stage) of every operator; see the module docstring."""
    S = len(plan.stages)
    layer_stage = {name: s for s, st in enumerate(plan.stages) for name in st.layers}
    layer_names = graph.layer_names
    op_units = _unit_starts(plan, graph, layer_stage)
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
        if any(t in batch for t in ins) and (reads_post or node.role == "update"):
            raise ExecutionError(
                f"operator {op.id} ({op.primitive}, role {node.role}) of the optimizer update reads "
                "the batch directly, so it cannot run once per step on accumulated gradients. Fix: "
                "run this step with an intra-operator plan (schedule.microbatches = 1).")
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
        layer = _layer_of(node, layer_names[node.id], layer_stage, op_units)
        stage = None if layer is None else layer_stage[layer]
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
            if phase in PER_MB:
                per_mb.add(t)
            elif phase == "update":
                post.add(t)
        out.append((phase, stage))
    return out


def _build_tasks(prog: FlatProgram, assign: list[tuple[str, int]], output_ids: set[int],
                 remat: Mapping[int, Mapping[int, FlatOp]] | None = None,
                 layer_of: Mapping[int, str] | None = None
                 ) -> tuple[dict[tuple[str, int], _Task], dict[int, tuple[str, int]]]:
    """The tasks of a step: each (phase, stage)'s operators in program order, its inputs and
    the results other tasks or the step read. ``remat`` (per stage, the values its
    rematerialised layers' forward operators make, :func:`_remat_made`) has the stage's backward
    and weight tasks make those values again (:func:`autoplan.exec._levers.recompute`) instead of
    reading them from its forward task."""
    tasks: dict[tuple[str, int], _Task] = {}
    producer: dict[int, tuple[str, int]] = {}
    for op, (phase, s) in zip(prog.ops, assign):
        task = tasks.setdefault((phase, s), _Task(phase, s))
        task.ops.append(op)
        for t in op.outputs:
            producer[t] = (phase, s)
    own = {k: [t for op in task.ops for t in op.outputs] for k, task in tasks.items()}
    for (phase, s), task in tasks.items():
        if phase in ("backward", "weight") and remat and s in remat:
            rc = recompute(task.ops, lambda op: True, remat[s], layer_of or {})
            task.ops, task.barriers, task.recomputed = rc.ops, rc.barriers, rc.recomputed
    for task in tasks.values():
        # read before the task makes it (a recomputed layer may make again a value that
        # another recomputed layer read from the forward earlier)
        made: set[int] = set()
        seen: set[int] = set()
        for op in task.ops:
            for t in op.inputs:
                if isinstance(t, Lit) or t in made or t in prog.consts or t in seen:
                    continue
                seen.add(t)
                task.inputs.append(t)
            made.update(op.outputs)
    needed: set[int] = set(output_ids)
    for task in tasks.values():
        needed.update(task.inputs)
    for k, task in tasks.items():  # what a task makes again stays its own
        task.outputs = [t for t in own[k] if t in needed]
    return tasks, producer


def _acc_dtype(dtype: Any) -> np.dtype:
    """Accumulators of at least float32 (bf16 gradients summed in bf16 lose their low bits)."""
    return np.promote_types(np.dtype(dtype), np.float32)


def _microbatch_abstract(host_args: tuple[Any, ...], batch_args: Sequence[int],
                         num_mb: int) -> list[Any]:
    """The step's abstract arguments for one micro-batch: batch arguments' leading dimension
    divided by ``num_mb`` (refused when it does not divide), the others as they are."""
    mb_abstract = []
    for i, a in enumerate(host_args):
        if i in batch_args:
            def split(x, i=i):
                x = abstract_value(x)
                if x.ndim == 0 or x.shape[0] % num_mb:
                    raise ExecutionError(
                        f"batch argument {i} has a leaf of shape {x.shape} whose leading "
                        f"dimension does not split into {num_mb} micro-batches. Fix: make a plan "
                        "whose schedule.microbatches divides the batch size.")
                return jax.ShapeDtypeStruct((x.shape[0] // num_mb,) + x.shape[1:], x.dtype)
            mb_abstract.append(jax.tree_util.tree_map(split, a))
        else:
            mb_abstract.append(jax.tree_util.tree_map(abstract_value, a))
    return mb_abstract


class _Split:
    """A training step split into phases, stages and tasks for a plan (see the module
    docstring); everything both runners share."""

    def __init__(self, plan: Any, fn: Callable[..., Any], host_args: tuple[Any, ...],
                 arg_kinds: Sequence[str], full_graph: Any, devices: Sequence[Any], capture: bool,
                 microbatch_trace: Callable[[Sequence[Any]], tuple[Any, Any]]):
        self.plan = plan
        self.S = S = len(plan.stages)
        self.num_microbatches = num_mb = plan.schedule.microbatches
        if not isinstance(num_mb, int) or num_mb < 1:
            raise ExecutionError(f"schedule.microbatches should be an integer >= 1. Got {num_mb!r}. "
                                 "Fix: re-create the plan's schedule.")
        self.order = _table_order(plan)
        self.batch_args = [i for i, k in enumerate(arg_kinds) if k == "batch"]
        mb_abstract = _microbatch_abstract(host_args, self.batch_args, num_mb)
        # the step's trace and flat program at the micro-batch size (the run's, on its workload)
        self.graph, self.prog = graph, prog = microbatch_trace(mb_abstract)
        prog.check_matches(graph)
        # which results are the next step's arguments: one definition for every executor
        self.signature = step_signature(jax.eval_shape(fn, *mb_abstract), mb_abstract, arg_kinds,
                                        step_name=f"the training step of {full_graph.name}")

        self.meshes = meshes = [plan.mesh(devices, s) for s in range(S)]
        self.replicated = [NamedSharding(m, PartitionSpec()) for m in meshes]
        local = {d.id for d in jax.local_devices()}
        self.local = [any(d.id in local for d in m.devices.flat) for m in meshes]
        self.fully_local = [all(d.id in local for d in m.devices.flat) for m in meshes]
        self.cpu = meshes[0].devices.flat[0].platform == "cpu"
        self.out_ids = {r for r in prog.outputs if not isinstance(r, Lit)}
        assign = _assign(plan, graph, prog)
        if any(kind == "weight" for _, _, kind in self.order):  # ZB-H1: B and W run apart
            assign = _split_weight_passes(prog, assign)
        self.assign = assign
        self.remat, self.remat_layer = _remat_made(plan, graph, prog, assign)
        self.tasks, self.producer = _build_tasks(prog, assign, self.out_ids, self.remat,
                                                 self.remat_layer)
        # an interleaved plan's stages share meshes: stage s runs on mesh s mod P
        self.mesh_of = [s % num_meshes(S, _virtual_stages(plan)) for s in range(S)]

        self.leaves, self.in_info = self._input_shardings(host_args)
        self.accumulate, self.grad_tensors = self._accumulated()
        self.state_inputs = self._state_inputs()
        self.acc_sharding = {t: self._acc_sharding(t) for t in self.accumulate}

        self.hooks = []
        for s in range(S):
            mine = {op.id for k, task in self.tasks.items() if k[1] == s for op in task.ops}
            self.hooks.append(sharding_hook(meshes[s], [o for o in plan.stages[s].ops if o.op in mine],
                                            exact_shapes=False))
        self._fill_task_io(capture)

    def _input_shardings(self, host_args: tuple[Any, ...]
                         ) -> tuple[list[tuple[int, str, Any]], dict[int, tuple[int, NamedSharding, bool]]]:
        """The argument leaves ``(argument, path, leaf)`` and, per input tensor, the plan's
        ``(stage, sharding, is batch)`` (a spec that does not divide the micro-batch shape is
        replicated)."""
        spec_of = {(i.arg, i.path): i for i in self.plan.inputs}
        leaves: list[tuple[int, str, Any]] = []
        for a, tree in enumerate(host_args):
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                leaves.append((a, jax.tree_util.keystr(path), leaf))
        in_info: dict[int, tuple[int, NamedSharding, bool]] = {}
        kind_of = {gi.tensor: gi.kind for gi in self.graph.inputs}
        for tid, (a, path, leaf) in zip(self.prog.input_ids, leaves):
            ispec = spec_of[(a, path)]
            mesh = self.meshes[ispec.stage]
            shape = np.shape(leaf)
            is_batch = a in self.batch_args
            if is_batch:
                shape = (shape[0] // self.num_microbatches,) + tuple(shape[1:])
            ok = ispec.spec.divides(shape, mesh.axis_sizes, mesh.axis_names)
            spec = ispec.spec if ok else Spec.replicated(len(shape))
            stage = self.plan.stages[ispec.stage]
            kind = kind_of.get(tid)
            if kind in ZERO_SHARDED[stage.zero]:
                spec = zero_spec(spec, shape, stage.zero_axes, dict(mesh.shape))
            sh = NamedSharding(mesh, spec.to_pspec())
            in_info[tid] = (ispec.stage, sh, is_batch)
        return leaves, in_info

    def _accumulated(self) -> tuple[set[int], list[int]]:
        """The accumulated values (per-micro-batch results read once per step or returned) and,
        of them, the gradients (those the update tasks read), sorted; refuses a non-float one."""
        producer = self.producer
        accumulate: set[int] = set()
        for (phase, _s), task in self.tasks.items():
            if phase in ("update", "prologue"):
                accumulate.update(t for t in task.inputs if producer.get(t, ("",))[0] in PER_MB)
        accumulate.update(t for t in self.out_ids if producer.get(t, ("",))[0] in PER_MB)
        for t in sorted(accumulate):
            dt = self.graph.tensors[t].dtype
            if not np.issubdtype(np.dtype(dt), np.floating):
                raise ExecutionError(
                    f"tensor {t} ({dt}) is computed per micro-batch and handed to the update or "
                    "returned; only floating-point values can be averaged over micro-batches. Fix: "
                    "use an intra-operator plan (schedule.microbatches = 1) for this step.")
        grad_tensors = sorted(t for t in accumulate if any(
            t in task.inputs for k, task in self.tasks.items() if k[0] == "update"))
        return accumulate, grad_tensors

    # ---- layout of accumulators and new state ------------------------------------------
    def _state_inputs(self) -> dict[int, int]:
        """Result tensor -> the non-batch input it replaces next step (as the step's
        :class:`~autoplan.tracing._signature.StepSignature` maps its results onto its arguments)."""
        prog = self.prog
        out: dict[int, int] = {}
        for i, j in self.signature.state:
            r, t = prog.outputs[i], prog.input_ids[j]
            if not isinstance(r, Lit) and r not in self.in_info:
                out.setdefault(r, t)
        return out

    def _acc_sharding(self, t: int) -> NamedSharding:
        """The accumulator of ``t`` is laid out like the parameter (or optimizer state) whose new
        value it feeds, when that lives on the same stage and has its shape; else replicated. A
        gradient's accumulator of a stage at ZeRO level 2 or 3 is sharded over its ZeRO axes."""
        sh = self._acc_layout(t)
        s = self.producer[t][1]
        stage = self.plan.stages[s]
        if "gradient" in ZERO_SHARDED[stage.zero] and t in self.grad_tensors:
            shape = self.graph.tensors[t].shape
            spec = zero_spec(Spec.from_pspec(sh.spec, len(shape)), shape, stage.zero_axes,
                             dict(sh.mesh.shape))
            sh = NamedSharding(sh.mesh, spec.to_pspec())
        return sh

    def _acc_layout(self, t: int) -> NamedSharding:
        graph, s = self.graph, self.producer[t][1]
        shape = graph.tensors[t].shape
        seen, frontier = {t}, [t]
        for _ in range(64):
            nxt = []
            for u in frontier:
                inp = self.state_inputs.get(u)
                if inp is not None and graph.tensors[inp].shape == shape:
                    stage, sh, _b = self.in_info[inp]
                    if stage == s:
                        return sh
                for c in graph.consumers[u]:
                    for v in graph.ops[c].outputs:
                        if v not in seen:
                            seen.add(v)
                            nxt.append(v)
            if not nxt:
                break
            frontier = nxt
        return self.replicated[s]

    def _fill_task_io(self, capture: bool) -> None:
        """Which results each task returns plainly, which it accumulates, which means the update
        tasks take; empty prologue/update tasks where accumulators need zeroing or means."""
        tasks, producer, acc = self.tasks, self.producer, self.accumulate
        readers: dict[int, set[tuple[str, int]]] = {}
        for k, task in tasks.items():
            for t in task.inputs:
                readers.setdefault(t, set()).add(k)
        wanted_means = set(self.out_ids & acc) | (set(self.grad_tensors) if capture else set())
        for t in sorted(acc):
            s = producer[t][1]
            tasks.setdefault(("prologue", s), _Task("prologue", s)).acc.append(t)
            if t in wanted_means:
                tasks.setdefault(("update", s), _Task("update", s)).mean_out.append(t)
        for k, task in tasks.items():
            phase, s = k
            if phase in PER_MB:
                task.acc = [t for t in task.outputs if t in acc]
                task.plain = [t for t in task.outputs
                              if any(r[0] in PER_MB for r in readers.get(t, ()))]
            elif phase == "prologue":
                task.plain = list(task.outputs)
            else:
                task.plain = [t for t in task.outputs if t in readers or t in self.out_ids]
                task.means = sorted({t for t in task.inputs if t in acc} | set(task.mean_out))
        self.readers = readers

    # ---- the programs ------------------------------------------------------------------
    def task_fn(self, task: _Task) -> Callable[..., Any]:
        """The function of a task's program (see :class:`_Task` for its arguments/results)."""
        prog, s, num_mb = self.prog, task.stage, self.num_microbatches
        hook = self.hooks[s][0]
        repl = self.replicated[s]
        crossing_out = {t for t in task.plain
                        if any(r[1] != s for r in self.readers.get(t, ()))}
        pinned = {}
        for t in task.plain:
            inp = self.state_inputs.get(t)
            if inp is not None and self.in_info[inp][0] == s:
                pinned[t] = self.in_info[inp][1]
        value_inputs = self.value_inputs(task)
        wsc = jax.lax.with_sharding_constraint
        tensors = self.graph.tensors
        acc_sh = self.acc_sharding

        def f(*vals):
            env = dict(zip(value_inputs, vals))
            sums = vals[len(value_inputs):]
            if task.phase == "update":
                for t, a in zip(task.means, sums):
                    env[t] = (a / num_mb).astype(tensors[t].dtype)
            evaluate_with_barriers(prog, env, task.ops, task.barriers, hook)
            outs = []
            for t in task.plain:
                v = env[t]
                if t in pinned:
                    v = wsc(v, pinned[t])
                elif t in crossing_out:
                    v = wsc(v, repl)
                outs.append(v)
            if task.phase in PER_MB:
                outs += [wsc(a + env[t].astype(a.dtype), acc_sh[t]) for a, t in zip(sums, task.acc)]
            elif task.phase == "prologue":
                outs += [wsc(jnp.zeros(tensors[t].shape, _acc_dtype(tensors[t].dtype)), acc_sh[t])
                         for t in task.acc]
            else:
                outs += [env[t] for t in task.mean_out]
            return outs

        f.__name__ = f"{task.phase}_stage{s}"
        return f

    def value_inputs(self, task: _Task) -> list[int]:
        """The tensors a task's program takes as values (an update takes the running sums of
        accumulated tensors instead, after them)."""
        if task.phase == "update":
            return [t for t in task.inputs if t not in self.accumulate]
        return list(task.inputs)

    def task_arg_count(self, task: _Task) -> tuple[int, int]:
        """(value arguments, running-sum arguments) of a task's program."""
        sums = len(task.acc) if task.phase in PER_MB else len(task.means) if task.phase == "update" else 0
        return len(self.value_inputs(task)), sums

    def scan_fn(self, capture: bool) -> Callable[..., Any]:
        """The one-stage step as one program: prologue, a scan over micro-batches, means,
        update. Arguments are the flat input leaves with batch leaves stacked ``(m, b, ...)``."""
        prog, num_mb = self.prog, self.num_microbatches
        hook = self.hooks[0][0]
        tensors, acc_sh = self.graph.tensors, self.acc_sharding
        batch_ids = [t for t in prog.input_ids if self.in_info[t][2]]
        phase_of = {op.id: phase for op, (phase, _s) in zip(prog.ops, self.assign)}
        pro = [op for op in prog.ops if phase_of[op.id] == "prologue"]
        per_mb = recompute([op for op in prog.ops if phase_of[op.id] in PER_MB],
                           lambda op: phase_of[op.id] != "forward", self.remat.get(0, {}),
                           self.remat_layer)
        upd = [op for op in prog.ops if phase_of[op.id] == "update"]
        acc_ids = sorted(self.accumulate)
        pinned = {r: self.in_info[t][1] for r, t in self.state_inputs.items()}
        loss_sh = self.replicated[0]
        wsc = jax.lax.with_sharding_constraint

        def step(*leaves):
            env: dict[int, Any] = {}
            stacked = []
            for t, v in zip(prog.input_ids, leaves):
                if self.in_info[t][2]:
                    stacked.append(v)
                else:
                    env[t] = v
            prog.evaluate(env, pro, hook)

            def body(sums, xs):
                e = dict(env)
                e.update(zip(batch_ids, xs))
                evaluate_with_barriers(prog, e, per_mb.ops, per_mb.barriers, hook)
                return [wsc(a + e[t].astype(a.dtype), acc_sh[t]) for a, t in zip(sums, acc_ids)], None

            init = [wsc(jnp.zeros(tensors[t].shape, _acc_dtype(tensors[t].dtype)), acc_sh[t])
                    for t in acc_ids]
            sums, _ = jax.lax.scan(body, init, stacked)
            for t, a in zip(acc_ids, sums):
                env[t] = (a / num_mb).astype(tensors[t].dtype)
            prog.evaluate(env, upd, hook)
            flat = []
            for i, r in enumerate(prog.outputs):
                v = prog.read(env, r)
                if r in pinned:
                    v = wsc(v, pinned[r])
                elif i == 0 and not isinstance(r, Lit):
                    v = wsc(v, loss_sh)
                flat.append(v)
            return flat, ([env[t] for t in self.grad_tensors] if capture else [])

        step.__name__ = "accumulated_step"
        return step


# ---- the instruction list of a pipeline step ---------------------------------------------
@dataclass
class _Run:
    task: _Task
    mb: int
    args: list[tuple]
    outs: list[tuple]
    drop: list[tuple] = field(default_factory=list)


@dataclass
class _Send:
    src: int
    dst: int
    keys: list[tuple[tuple, tuple]]
    avals: list[tuple[tuple[int, ...], Any]]
    drop: list[tuple] = field(default_factory=list)


def _instructions(sp: _Split) -> tuple[list[Any], list[tuple]]:
    """The instructions of one step and the keys of the values it starts from.

    Keys: ``(tensor, micro-batch or STEP, stage)`` for values, ``(tensor, "acc", stage)`` for
    running sums, ``(tensor, "mean", stage)`` for means. Sends follow their producer at once;
    a run whose operand is not available yet is refused here, before anything runs."""
    step = _StepBuilder(sp)
    start = step.add_inputs()
    tasks = sp.tasks
    for s in range(sp.S):
        if ("prologue", s) in tasks:
            step.add_run(tasks[("prologue", s)], STEP)
    for mb, s, kind in sp.order:
        if (kind, s) in tasks:
            step.add_run(tasks[(kind, s)], mb)
    step.send_sums()
    for s in range(sp.S):
        if ("update", s) in tasks:
            step.add_run(tasks[("update", s)], STEP)
    step.drop_after_last_use()
    return step.instrs, start


class _StepBuilder:
    """One step's instruction list as :func:`_instructions` builds it, with the keys of the
    values available so far."""

    def __init__(self, sp: _Split):
        """Start an empty step of ``sp``."""
        self.sp = sp
        self.instrs: list[Any] = []
        self.avail: set[tuple] = set()

    def aval(self, t: int, kind: Any) -> tuple[tuple[int, ...], Any]:
        """Shape and dtype of tensor ``t`` (a running sum's dtype is at least float32)."""
        ten = self.sp.graph.tensors[t]
        dt = _acc_dtype(ten.dtype) if kind == "acc" else jax_dtype(ten.dtype)
        return tuple(ten.shape), dt

    def send(self, src: int, pairs: Mapping[int, list[tuple[int, Any]]]) -> None:
        """Send ``{destination stage: [(tensor, micro-batch or kind)]}`` from stage ``src``."""
        for dst in sorted(pairs):
            items = pairs[dst]
            self.instrs.append(_Send(src, dst, [((t, i, src), (t, i, dst)) for t, i in items],
                                     [self.aval(t, i) for t, i in items]))
            self.avail.update((t, i, dst) for t, i in items)

    def readers_stages(self, t: int, per_mb_only: bool = False) -> set[int]:
        """The stages whose tasks (per-micro-batch ones only, if asked) read ``t``."""
        return {k[1] for k in self.sp.readers.get(t, ()) if not per_mb_only or k[0] in PER_MB}

    def add_inputs(self) -> list[tuple]:
        """The inputs' keys (a batch input per micro-batch on each stage reading it), and the
        sends of non-batch inputs read on other stages than their own; returns the keys."""
        sp = self.sp
        start: list[tuple] = []
        by_home: dict[int, dict[int, list[tuple[int, Any]]]] = {}
        for t in sp.prog.input_ids:
            home, _sh, is_batch = sp.in_info[t]
            if is_batch:
                for s in self.readers_stages(t):
                    for i in range(sp.num_microbatches):
                        start.append((t, i, s))
                continue
            start.append((t, STEP, home))
            for s in sorted(self.readers_stages(t) - {home}):
                by_home.setdefault(home, {}).setdefault(s, []).append((t, STEP))
        self.avail.update(start)
        for home in sorted(by_home):
            self.send(home, by_home[home])
        return start

    def add_run(self, task: _Task, mb: int) -> None:
        """Run ``task`` on micro-batch ``mb`` (or STEP), then send its results to the other
        stages reading them; refuses an operand not available yet."""
        sp, avail = self.sp, self.avail
        producer, in_info = sp.producer, sp.in_info
        s = task.stage
        args = []
        for t in sp.value_inputs(task):
            if t in in_info:
                k = (t, mb if in_info[t][2] else STEP, s)
            else:
                k = (t, mb if producer[t][0] in PER_MB else STEP, s)
            if k not in avail:
                p_phase, p_stage = producer[t] if t in producer else ("input", in_info[t][0])
                raise ExecutionError(
                    f"the schedule order runs the {task.phase} of stage {s}"
                    + (f" (micro-batch {mb})" if mb != STEP else "")
                    + f" before the {p_phase} of stage {p_stage} that produces its operand "
                    f"(tensor {t}). Fix: use a schedule table whose order respects the "
                    "dependencies.")
            args.append(k)
        if task.phase in PER_MB:
            args += [(t, "acc", s) for t in task.acc]
            outs = [(t, mb, s) for t in task.plain] + [(t, "acc", s) for t in task.acc]
        elif task.phase == "prologue":
            outs = [(t, STEP, s) for t in task.plain] + [(t, "acc", s) for t in task.acc]
        else:
            args += [(t, "acc", s) for t in task.means]
            outs = [(t, STEP, s) for t in task.plain] + [(t, "mean", s) for t in task.mean_out]
        self.instrs.append(_Run(task, mb, args, outs))
        avail.update(outs)
        pairs: dict[int, list[tuple[int, Any]]] = {}
        for t in task.plain:
            for d in sorted(self.readers_stages(t, per_mb_only=task.phase in PER_MB) - {s}):
                pairs.setdefault(d, []).append((t, mb if task.phase in PER_MB else STEP))
        self.send(s, pairs)

    def send_sums(self) -> None:
        """Send the running sums read by another stage's update."""
        sp = self.sp
        sums: dict[int, dict[int, list[tuple[int, Any]]]] = {}
        for t in sorted(sp.accumulate):
            s = sp.producer[t][1]
            for d in sorted({k[1] for k in sp.readers.get(t, ()) if k[0] == "update"} - {s}):
                sums.setdefault(s, {}).setdefault(d, []).append((t, "acc"))
        for s in sorted(sums):
            self.send(s, sums[s])

    def drop_after_last_use(self) -> None:
        """Free per-micro-batch values after the instruction that uses them last."""
        instrs = self.instrs
        last: dict[tuple, int] = {}
        for n, ins in enumerate(instrs):
            for k in (ins.args if isinstance(ins, _Run) else [a for a, _ in ins.keys]):
                if isinstance(k[1], int) and k[1] >= 0:
                    last[k] = n
        for k, n in last.items():
            instrs[n].drop.append(k)


class _Runner:
    """Runs the instruction list of a pipeline step (or, for timing, of a one-stage step)."""

    def __init__(self, sp: _Split, compiler_options: Mapping[str, Any] | None, capture: bool):
        self.sp = sp
        self.compiler_options = compiler_options
        self.capture = capture
        self.instrs, self.start = _instructions(sp)
        self.compile_time = 0.0
        self.fns = {k: self._jit(t) for k, t in sp.tasks.items()}
        self.pending: dict[int, list[Any]] = {g: [] for g in set(sp.mesh_of)}  # per mesh
        self.transfer_bytes = dict.fromkeys(range(sp.S), 0.0)
        for ins in self.instrs:
            if isinstance(ins, _Send):
                self.transfer_bytes[ins.dst] += float(sum(
                    math.prod(shape) * dtype_bytes(dt) for shape, dt in ins.avals))
        self.dispatches = sum(1 for ins in self.instrs
                              if (isinstance(ins, _Run) and sp.local[ins.task.stage])
                              or (isinstance(ins, _Send) and (sp.local[ins.src] or sp.local[ins.dst])))
        self.batch_cache: dict[tuple, Any] = {}
        self.keep_args = False  # keep each task's last arguments, to time it alone afterwards

    def _jit(self, task: _Task) -> Any:
        nv, na = self.sp.task_arg_count(task)
        donate = tuple(range(nv, nv + na)) if task.phase in PER_MB else ()
        return jax.jit(self.sp.task_fn(task), donate_argnums=donate)

    def _wait(self, stages: Sequence[int]) -> None:
        """CPU only: wait for the programs with collectives dispatched on these stages'
        submeshes since the last wait (module docstring; an interleaved plan's stages of one
        mesh share it). Their results are waited on; one that a later task took as a donated
        running sum was taken by that task's next run, which waited first."""
        for g in sorted({self.sp.mesh_of[s] for s in stages}):
            live = [x for x in self.pending[g] if not x.is_deleted()]
            if live:
                jax.block_until_ready(live)
            self.pending[g] = []

    def inputs(self, host_leaves: Mapping[int, Any], state: Mapping[int, Any]) -> dict[tuple, Any]:
        """The step's starting values: this process's non-batch inputs and the micro-batch slices
        of the batch, placed once per host batch."""
        sp = self.sp
        slots: dict[tuple, Any] = {}
        for key in self.start:
            t, i, s = key
            if not sp.local[s]:
                continue
            if i == STEP:
                slots[key] = state[t]
                continue
            host = host_leaves[t]
            ck = (id(host), t, i, s)
            if ck not in self.batch_cache:
                stage, sh, _ = sp.in_info[t]
                b = host.shape[0] // sp.num_microbatches
                self.batch_cache[ck] = place(host[i * b:(i + 1) * b], sh if stage == s else sp.replicated[s])
            slots[key] = self.batch_cache[ck]
        return slots

    def call(self, task: _Task, args: list[Any]) -> list[Any]:
        if task.compiled is None:
            t0 = time.perf_counter()
            task.compiled = self.fns[(task.phase, task.stage)].lower(*args).compile(
                compiler_options=self.compiler_options)
            self.compile_time += time.perf_counter() - t0
            text = task.compiled.as_text()
            task.has_collectives = bool(collectives(text)) or any(
                a in text for a in ("replica_groups=", "source_target_pairs="))
        if self.sp.cpu and task.has_collectives:
            self._wait([task.stage])
        if self.keep_args:
            task.last_args = args
        outs = task.compiled(*args)
        if self.sp.cpu and task.has_collectives:
            self.pending[self.sp.mesh_of[task.stage]].extend(outs)
        return outs

    def step(self, slots: dict[tuple, Any]) -> dict[tuple, Any]:
        """Walk the instruction list once; returns the values left (results and means)."""
        sp = self.sp
        for ins in self.instrs:
            if isinstance(ins, _Run):
                if sp.local[ins.task.stage]:
                    try:
                        outs = self.call(ins.task, [slots[k] for k in ins.args])
                    except jax.errors.JaxRuntimeError as err:
                        raise _runtime_error(ins.task.name, ins.mb, err) from err
                    slots.update(zip(ins.outs, outs))
            elif sp.local[ins.src] or sp.local[ins.dst]:
                vals = [slots.get(a) for a, _ in ins.keys]
                cross = _FORCE_COLLECTIVE_TRANSFERS or not (sp.fully_local[ins.src]
                                                            and sp.fully_local[ins.dst])
                if sp.cpu and cross:
                    self._wait([ins.src, ins.dst])
                moved, witness = move(vals, sp.meshes[ins.src], sp.meshes[ins.dst], ins.avals,
                                       collective=cross)
                if moved is not None:
                    slots.update(zip([b for _, b in ins.keys], moved))
                if sp.cpu and witness:
                    self.pending[sp.mesh_of[ins.src]].extend(witness)
                    self.pending[sp.mesh_of[ins.dst]].extend(witness)
            for k in ins.drop:
                slots.pop(k, None)
        if sp.cpu:
            self._wait(range(sp.S))
        return slots


def error_summary(err: BaseException) -> str:
    """One line of an exception: its first line, and when the message carries a Python
    traceback (an exception raised in a callback), the exception at its end."""
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    head = lines[0]
    if len(lines) > 1 and "Traceback" in head:
        return head.split("Traceback")[0].rstrip(": ") + ": " + lines[-1].strip()
    return head


def first_scalar(x: Any) -> float:
    """A scalar result as a float (read from this process's first shard)."""
    if isinstance(x, jax.Array):
        return float(np.asarray(x.addressable_data(0)).reshape(()))
    return float(np.asarray(x).reshape(()))


def run_program(compiled: Any, args: Sequence[Any], steps: int, what: str,
                advance: Callable[[Any, Sequence[Any]], Sequence[Any]],
                loss_of: Callable[[Any], float],
                on_step: Callable[[int, float, float], None] | None, keep_all: bool
                ) -> tuple[list[float], list[float], list[Any], Sequence[Any]]:
    """A step that is one compiled program: a warm-up run, then ``steps`` timed runs, each
    from the arguments ``advance(previous result, previous arguments)`` gives.

    Returns:
        ``(losses, seconds per step, results, last arguments)``; ``results`` holds every step's
        result with ``keep_all``, else only the last one.

    Raises:
        ExecutionError: the program failed while running (XLA's error, summarised).
    """
    def one(a: Sequence[Any]) -> Any:
        try:
            return jax.block_until_ready(compiled(*a))
        except jax.errors.JaxRuntimeError as err:
            raise _runtime_error(what, None, err) from err

    if steps:
        one(args)  # warm-up run
    losses: list[float] = []
    times: list[float] = []
    results: list[Any] = []
    for step in range(steps):
        t0 = time.perf_counter()
        res = one(args)
        dt = time.perf_counter() - t0
        loss = loss_of(res)
        losses.append(loss)
        times.append(dt)
        if keep_all:
            results.append(res)
        else:
            results = [res]
        if on_step is not None:
            on_step(step, loss, dt)
        if step + 1 < steps:
            args = advance(res, args)
    return losses, times, results, args


def _runtime_error(what: str, mb: int | None, err: Exception) -> ExecutionError:
    where = f"{what}" + (f" (micro-batch {mb})" if mb is not None and mb >= 0 else "")
    return ExecutionError(f"{where} failed while running: {error_summary(err)}. Fix: run the step "
                          "without the plan (jax.jit(workload.fn)) to see whether it fails on one "
                          "device too.")


# ---- values every process can read ------------------------------------------------------
def _host_everywhere(sp: _Split, items: Sequence[tuple[Any, int, tuple[int, ...], Any]]) -> list[np.ndarray]:
    """Full host copies, on every process, of values held by the processes of their stage:
    ``items`` are ``(array or None, stage, shape, dtype)``; every process must call this with
    the same items in the same order (the broadcasts are collectives over all processes)."""
    from jax.experimental import multihost_utils  # noqa: PLC0415

    if jax.process_count() == 1:
        return [host_value(v) for v, *_ in items]
    me = jax.process_index()
    hosts: list[Any] = []
    sources: list[int] = []
    for v, s, shape, dtype in items:
        src = min(d.process_index for d in sp.meshes[s].devices.flat)
        sources.append(src)
        if sp.local[s] and v is not None:
            v = replicated_on(v, sp.meshes[s]) if not v.is_fully_addressable else v
            # (a typed key travels as its key data, and is wrapped again below)
            hosts.append(comparable(v.addressable_data(0)) if v.is_fully_replicated else comparable(v))
        elif is_key_dtype(dtype):
            tail, data_dtype = _key_data_aval(str(dtype))
            hosts.append(np.zeros(tuple(shape) + tail, data_dtype))
        else:
            hosts.append(np.zeros(shape, dtype))
    out: list[Any] = [None] * len(items)
    for src in sorted(set(sources)):
        idx = [k for k, p in enumerate(sources) if p == src]
        got = multihost_utils.broadcast_one_to_all([hosts[k] for k in idx], is_source=me == src)
        for k, g in zip(idx, got):
            dtype = items[k][3]
            out[k] = (jax.random.wrap_key_data(np.asarray(g), impl=_key_impl(dtype))
                      if is_key_dtype(dtype) else np.asarray(g).astype(dtype))
    return out


def _shared_task_times(sp: _Split, times: dict[str, float]) -> dict[str, float]:
    """Every process's task times (each times the tasks of its own stages)."""
    if jax.process_count() == 1:
        return times
    from jax.experimental import multihost_utils  # noqa: PLC0415

    names = sorted(t.name for t in sp.tasks.values())
    vec = np.array([times.get(n, np.nan) for n in names], np.float64)
    allv = np.asarray(multihost_utils.process_allgather(vec))
    out = {}
    for k, n in enumerate(names):
        col = allv[:, k]
        col = col[np.isfinite(col)]
        if col.size:
            out[n] = float(col.max())
    return out


def run_pipeline(plan: Any, fn: Callable[..., Any], host_args: tuple[Any, ...],
                 arg_kinds: Sequence[str], full_graph: Any, devices: Sequence[Any], steps: int,
                 on_step: Callable[[int, float, float], None] | None = None,
                 time_tasks: bool = True, capture: bool = False,
                 compiler_options: Mapping[str, Any] | None = None, *,
                 microbatch_trace: Callable[[Sequence[Any]], tuple[Any, Any]]) -> PipelineOutcome:
    """Run ``steps`` training steps of a pipeline or gradient-accumulation plan (see the module
    docstring).

    Args:
        plan: a plan with several stages, or one stage over several micro-batches.
        fn: the training step ``(params, opt_state, batch) -> (loss, params, opt_state)``.
        host_args: its arguments as host (numpy) pytrees.
        arg_kinds: the kind of each argument (``"batch"`` ones are split into micro-batches).
        full_graph: the full-batch trace the plan was made for (its fingerprint is checked by
            the caller); the step is re-traced at the micro-batch size, and the plan's operator
            ids (``Stage.ops``) are read in that micro-batch trace, as the search writes them.
        devices: the devices (``plan.mesh`` takes the stages' ids from them); across processes,
            the global devices.
        steps: training steps.
        on_step: called with (step, loss, seconds) after each step.
        time_tasks: after the steps, time each task alone (for the schedule's ideal); a
            one-stage plan then also compiles its tasks as separate programs.
        capture: keep every step's results and the gradients handed to the update
            (``PipelineOutcome.records``) for the equivalence check.
        compiler_options: XLA options for every compilation.
        microbatch_trace: the step's trace and flat program at the micro-batch size, given the
            micro-batch's abstract arguments (``exec._run``'s, kept on the workload).

    Returns:
        The measurements.

    Raises:
        ExecutionError: the batch does not split into the micro-batches, the step's structure
            cannot be split so, the schedule's order breaks a data dependency, or a program failed
            while running.
    """
    sp = _Split(plan, fn, host_args, arg_kinds, full_graph, devices, capture, microbatch_trace)
    host_leaves = {t: host_value(leaf) for t, (_a, _p, leaf) in zip(sp.prog.input_ids, sp.leaves)}
    if sp.S == 1:
        return _run_accumulation(sp, host_leaves, steps, on_step, time_tasks, capture,
                                 compiler_options)
    return _run_schedule(sp, host_leaves, steps, on_step, time_tasks, capture, compiler_options)


def _state0(sp: _Split, host_leaves: Mapping[int, Any]) -> dict[int, Any]:
    """Non-batch inputs placed on their stages (this process's stages only)."""
    return {t: place(host_leaves[t], sh) for t, (s, sh, is_batch) in sp.in_info.items()
            if not is_batch and sp.local[s]}


def _next_state(sp: _Split, state: dict[int, Any], flat_out: Sequence[Any],
                where: Sequence[int | None]) -> dict[int, Any]:
    """Next step's non-batch inputs: the results the step's signature maps onto its arguments
    (moved to the input's stage and sharding when they were made elsewhere); arguments it does
    not return are kept."""
    new = {}
    for i, j in sp.signature.state:
        t, v, s = sp.prog.input_ids[j], flat_out[i], where[i]
        home, sh, _ = sp.in_info[t]
        if s is None or s == home:
            if sp.local[home]:
                same = isinstance(v, jax.Array) and v.sharding.is_equivalent_to(sh, v.ndim)
                new[t] = v if same else jax.device_put(v, sh)
            continue
        aval = (tuple(sp.graph.tensors[t].shape), jax_dtype(sp.graph.tensors[t].dtype))
        moved = transfer([v], sp.meshes[s], sp.meshes[home], [aval])
        if moved is not None:
            new[t] = jax.device_put(moved[0], sh)
    for t in state:
        new.setdefault(t, state[t])
    return new


def _run_schedule(sp: _Split, host_leaves: Mapping[int, Any], steps: int,
                  on_step: Callable[[int, float, float], None] | None, time_tasks: bool,
                  capture: bool, compiler_options: Mapping[str, Any] | None) -> PipelineOutcome:
    runner = _Runner(sp, compiler_options, capture)
    prog = sp.prog
    state = _state0(sp, host_leaves)

    def locate(r: Any) -> tuple[tuple | None, int | None]:
        """The slot key of a result and the stage holding it (None for literals)."""
        if isinstance(r, Lit):
            return None, None
        if r in sp.in_info:
            return (r, STEP, sp.in_info[r][0]), sp.in_info[r][0]
        phase, s = sp.producer[r]
        return ((r, "mean", s) if phase in PER_MB else (r, STEP, s)), s

    out_keys = [locate(r) for r in prog.outputs]
    grad_keys = [(t, "mean", sp.producer[t][1]) for t in sp.grad_tensors] if capture else []

    def one_step() -> tuple[list[Any], list[Any]]:
        slots = runner.inputs(host_leaves, state)
        slots = runner.step(slots)
        flat = [jnp.asarray(r.value) if isinstance(r, Lit) else slots.get(k)
                for r, (k, _s) in zip(prog.outputs, out_keys)]
        grads = [slots.get(k) for k in grad_keys]
        try:
            jax.block_until_ready([v for v in flat + grads if v is not None])
        except jax.errors.JaxRuntimeError as err:
            raise _runtime_error("the pipeline step", None, err) from err
        return flat, grads

    runner.keep_args = time_tasks and steps == 0
    one_step()  # warm-up: compiles every task; its results are dropped
    losses: list[float] = []
    step_times: list[float] = []
    records: list[StepRecord] = []
    outputs: Any = None
    where = [s for _k, s in out_keys]
    multi = jax.process_count() > 1
    for step in range(steps):
        runner.keep_args = time_tasks and step == steps - 1
        t0 = time.perf_counter()
        flat, grads = one_step()
        dt = time.perf_counter() - t0
        outputs = jax.tree_util.tree_unflatten(prog.out_tree, flat)
        if multi:  # the results live on some processes only: share what the others need
            items = [(v, s if s is not None else 0, *_aval_of(sp, r))
                     for v, s, r in zip(flat, where, prog.outputs)]
            items += [(g, sp.producer[t][1], *_aval_of(sp, t)) for g, t in zip(grads, sp.grad_tensors)]
            host = _host_everywhere(sp, items if capture else items[:1])
            loss = float(np.asarray(host[0]).reshape(()))
            if capture:
                records.append(StepRecord(loss, jax.tree_util.tree_unflatten(
                    prog.out_tree, host[:len(flat)]), host[len(flat):]))
        else:
            loss = first_scalar(flat[0])
            if capture:
                records.append(StepRecord(loss, outputs, grads))
        losses.append(loss)
        step_times.append(dt)
        if on_step is not None:
            on_step(step, loss, dt)
        if step + 1 < steps:
            state = _next_state(sp, state, flat, where)

    task_times = _shared_task_times(sp, _time_tasks(runner)) if time_tasks else {}
    return _outcome(sp, runner, losses, step_times, outputs, records, task_times, sp.order)


def _aval_of(sp: _Split, r: Any) -> tuple[tuple[int, ...], Any]:
    if isinstance(r, Lit):
        return tuple(np.shape(r.value)), np.asarray(r.value).dtype
    t = sp.graph.tensors[r]
    return tuple(t.shape), jax_dtype(t.dtype)


def _time_tasks(runner: _Runner) -> dict[str, float]:
    """Each compiled task run alone three times on its last arguments (the best time);
    donated running sums are replaced by fresh zeros before each run."""
    times: dict[str, float] = {}
    for k in sorted(runner.sp.tasks, key=lambda k: (PHASES.index(k[0]), k[1])):
        task = runner.sp.tasks[k]
        if task.compiled is None or task.last_args is None:
            continue
        nv, na = runner.sp.task_arg_count(task)
        donated = range(nv, nv + na) if task.phase in PER_MB else range(0)
        shardings = task.compiled.input_shardings[0]
        best = math.inf
        for _ in range(3):
            args = list(task.last_args)
            for i in donated:
                args[i] = place(np.zeros(args[i].shape, args[i].dtype), shardings[i])
            jax.block_until_ready(args)
            t0 = time.perf_counter()
            jax.block_until_ready(task.compiled(*args))
            best = min(best, time.perf_counter() - t0)
        times[task.name] = best
    for task in runner.sp.tasks.values():
        task.last_args = None
    return times


def _outcome(sp: _Split, runner: _Runner | None, losses: list[float], step_times: list[float],
             outputs: Any, records: list[StepRecord], task_times: dict[str, float],
             order: list[tuple[int, int, str]], extra: Sequence[tuple[str, Any, float]] = ()
             ) -> PipelineOutcome:
    """Collectives, memory, the schedule's ideal and the constraint counts of a run."""
    S, num_mb = sp.S, sp.num_microbatches
    colls: list[tuple[str, int, Collective, int]] = []
    memory: dict[int, MemoryStats] = {}

    def account(name: str, stage: int, compiled: Any, times: int) -> None:
        text = compiled.as_text()
        per_comp = executions_per_run(text)  # the scan's loop records its trip count
        for c in collectives(text):
            colls.append((name, stage, c, times * per_comp.get(c.computation, 1)))
        ms = memory_stats(compiled)
        for d in sp.meshes[stage].devices.flat:
            if d.id not in memory or ms.total > memory[d.id].total:
                memory[d.id] = ms

    compile_time = 0.0
    for name, compiled, secs in extra:
        account(name, 0, compiled, 1)
        compile_time += secs
    if runner is not None:
        compile_time += runner.compile_time
        for k in sorted(sp.tasks, key=lambda k: (PHASES.index(k[0]), k[1])):
            task = sp.tasks[k]
            if task.compiled is not None and not extra:
                account(task.name, k[1], task.compiled, num_mb if k[0] in PER_MB else 1)
    fwd = [task_times.get(f"forward[{s}]", 0.0) for s in range(S)]
    bwd = [task_times.get(f"backward[{s}]", 0.0) for s in range(S)]
    wgt = [task_times.get(f"weight[{s}]", 0.0) for s in range(S)]
    ideal = (max((task_times.get(f"prologue[{s}]", 0.0) for s in range(S)), default=0.0)
             + ideal_makespan(order, fwd, bwd, wgt, _virtual_stages(sp.plan))
             + max((task_times.get(f"update[{s}]", 0.0) for s in range(S)), default=0.0))
    applied = sum(counts["applied"] for _h, counts in sp.hooks)
    skipped = sum(counts["skipped"] for _h, counts in sp.hooks)
    transfer_bytes = runner.transfer_bytes if runner is not None and not extra else dict.fromkeys(range(S), 0.0)
    return PipelineOutcome(
        losses=losses, step_times=step_times, outputs=outputs, compile_time=compile_time,
        collectives=colls, memory=memory, transfer_bytes=dict(transfer_bytes),
        task_times=task_times, ideal_time=ideal, order=order, constraints_applied=applied,
        constraints_skipped=skipped, phases={t.name: len(t.ops) for t in sp.tasks.values()},
        grad_tensors=sp.grad_tensors, records=records, graph=sp.graph,
        dispatches=(1 if extra else (runner.dispatches if runner is not None else 0)),
        held_bytes=_held_bytes(sp), levers=_applied_levers(sp))


def _held_bytes(sp: _Split) -> dict[int, int]:
    """Per stage, bytes per device its compiled forward task hands to its own backward and
    weight tasks (:attr:`PipelineOutcome.held_bytes`)."""
    out: dict[int, int] = {}
    for s in range(sp.S):
        task = sp.tasks.get(("forward", s))
        if task is None or task.compiled is None:
            continue
        own = {("backward", s), ("weight", s)}
        total = 0
        for t, sh in zip(task.plain, task.compiled.output_shardings):
            if own & sp.readers.get(t, set()):
                ten = sp.graph.tensors[t]
                total += math.prod(sh.shard_shape(tuple(ten.shape))) * dtype_bytes(ten.dtype)
        out[s] = total
    return out


def _applied_levers(sp: _Split) -> dict[int, dict[str, Any]]:
    """Per stage with memory levers, what the executor applied (:attr:`PipelineOutcome.levers`)."""
    out: dict[int, dict[str, Any]] = {}
    for s, st in enumerate(sp.plan.stages):
        if st.zero or st.remat_layers:
            again = sum(task.recomputed for (phase, k), task in sp.tasks.items() if k == s)
            out[s] = {"zero": st.zero, "zero_axes": tuple(st.zero_axes),
                      "remat_layers": tuple(st.remat_layers), "recomputed": again}
    return out


def _run_accumulation(sp: _Split, host_leaves: Mapping[int, Any], steps: int,
                      on_step: Callable[[int, float, float], None] | None, time_tasks: bool,
                      capture: bool, compiler_options: Mapping[str, Any] | None) -> PipelineOutcome:
    """A one-stage plan over ``m`` micro-batches: one scanned program per step."""
    prog, num_mb = sp.prog, sp.num_microbatches
    args = []
    for t in prog.input_ids:
        _s, sh, is_batch = sp.in_info[t]
        host = host_leaves[t]
        if is_batch:
            stacked = host.reshape((num_mb, host.shape[0] // num_mb) + host.shape[1:])
            args.append(place(stacked, NamedSharding(sh.mesh, PartitionSpec(None, *sh.spec))))
        else:
            args.append(place(host, sh))
    fixed = [i for i, t in enumerate(prog.input_ids) if not sp.in_info[t][2]]
    t0 = time.perf_counter()
    compiled = jax.jit(sp.scan_fn(capture)).lower(*args).compile(compiler_options=compiler_options)
    compile_time = time.perf_counter() - t0

    def advance(result: Any, a: Sequence[Any]) -> list[Any]:
        return sp.signature.next_args(result[0], a)

    losses, step_times, results, args = run_program(
        compiled, args, steps, "the accumulated step", advance, lambda res: first_scalar(res[0][0]),
        on_step, keep_all=capture)
    outputs = jax.tree_util.tree_unflatten(prog.out_tree, results[-1][0]) if results else None
    records = [StepRecord(loss, jax.tree_util.tree_unflatten(prog.out_tree, flat), list(grads))
               for loss, (flat, grads) in zip(losses, results)] if capture else []
    order = [(i, 0, k) for i in range(num_mb) for k in ("forward", "backward")]
    task_times: dict[str, float] = {}
    runner = None
    if time_tasks:
        # the same step as separate programs, to time a micro-batch's forward and backward alone
        runner = _Runner(sp, compiler_options, capture=False)
        runner.keep_args = True
        state = {t: args[i] for i, t in zip(fixed, [prog.input_ids[i] for i in fixed])}
        runner.step(runner.inputs(host_leaves, state))
        task_times = _time_tasks(runner)
    out = _outcome(sp, runner, losses, step_times, outputs, records, task_times, order,
                   extra=[("step", compiled, compile_time)])
    return out
