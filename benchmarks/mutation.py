"""Mutation check: every listed test set must fail when a plausible bug is put into the code it
covers.

Each mutation replaces one exact snippet (it must occur exactly once in its file) in a copy of
the repository's files (the ``autoplan`` package with the tests and their data), made in a
temporary folder that is the only entry of ``PYTHONPATH``; the named tests then run there in a
subprocess (``python -P -m pytest -x -q``), which stops with an error unless they import the
mutated copy of ``autoplan``.
The worktree's files are never edited. A mutation is ``killed`` when its tests fail and
``SURVIVED`` when they pass; the run prints a markdown table and exits with status 1 when any
mutation survived (or its run could not tell).

Run: ``.venv/bin/python benchmarks/mutation.py`` (all, about 10-15 minutes on 2 cores);
``--only NAME`` (repeatable) for some; ``--list`` to print the mutations without running them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: ``original`` (exactly once in ``file``) becomes ``mutated``."""

    name: str
    file: str  # relative to the repository root
    original: str
    mutated: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the repository root
    breaks: str


M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    M("ilp-reshard-cost", "autoplan/search/intra/_ilp_cost.py",
      "            comm += charge(t, src, dst, i)",
      "            comm += 0.0 * charge(t, src, dst, i)",
      ("tests/search/intra/test_ilp.py::test_ilp_optimum_equals_brute_force",),
      "the recomputed objective leaves out resharding an operand to its consumer's spec"),
    M("ilp-eliminate-max", "autoplan/search/intra/_ilp_reduce.py",
      "self.cost[n] = self.cost[n] + tot.min(axis=1)",
      "self.cost[n] = self.cost[n] + tot.max(axis=1)",
      ("tests/search/intra/test_ilp.py::test_ilp_optimum_equals_brute_force",),
      "eliminating a leaf node charges its neighbour the worst option, not the best"),
    M("mesh-allreduce-factor", "autoplan/costs/_mesh.py",
      '"all-reduce": lambda n: 2 * (n - 1) / n',
      '"all-reduce": lambda n: (n - 1) / n',
      ("tests/test_cluster.py::test_collective_formulas_match_hand_values",),
      "an all-reduce costs one pass of the ring, not two"),
    M("mesh-scattered-outer-axis", "autoplan/costs/_mesh.py",
      "                b /= n  # the next (outer) axis reduces the already scattered part",
      "                pass",
      ("tests/test_cluster.py",),
      "a 2-D all-reduce's outer axis reduces the whole tensor again"),
    M("cluster-parse-nodes", "autoplan/costs/_cluster.py",
      "        return cls.preset(name, n)",
      "        return cls.preset(name, 1)",
      ("tests/test_cluster.py::test_presets_and_parse",),
      "'p3.16xlarge:4' parses as one node"),
    M("stage-dp-max", "autoplan/search/pipeline/_stage_dp.py",
      "np.minimum(Fq[k0:k1], out, out=Fq[k0:k1])",
      "np.maximum(Fq[k0:k1], out, out=Fq[k0:k1])",
      ("tests/search/pipeline/test_stage_dp.py",),
      "the stage DP keeps the worst split of the remaining layers"),
    M("stage-dp-batched-max", "autoplan/search/pipeline/_stage_dp.py",
      "best = np.minimum.reduceat(vals, starts[lo:hi] - c0, axis=0)",
      "best = np.maximum.reduceat(vals, starts[lo:hi] - c0, axis=0)",
      ("tests/search/pipeline/test_stage_dp.py",),
      "the batched stage-DP tables keep each first layer's worst stage, not its best"),
    M("least-memory-bound-unsplit", "autoplan/search/intra/_ilp_problem.py",
      "    return _memory_bytes(graph) / mesh.size\n",
      "    return _memory_bytes(graph)\n",
      ("tests/search/fold/test_levels.py",),
      "the least-memory bound counts every tensor unsplit, refusing budgets some plan meets"),
    M("stage-dp-choice-off-by-one", "autoplan/search/pipeline/_stage_dp.py",
      "rows = np.minimum(k + 1 + np.arange(W), L)  # (W,)",
      "rows = np.minimum(k + np.arange(W), L)  # (W,)",
      ("tests/search/pipeline/test_stage_dp.py",),
      "recovering a stage's choice reads the next table one layer early"),
    M("schedule-1f1b-warmup", "autoplan/plans/_schedule.py",
      "        w = min(S - j - 1, m)\n",
      "        w = min(S - j, m)\n",
      ("tests/search/pipeline/test_schedule.py",),
      "1F1B runs one warm-up forward too many on every mesh"),
    M("schedule-zb-h1-weight", "autoplan/plans/_schedule.py",
      "elif w < b and bdone[j][w] < t:",
      "elif w <= b and bdone[j][w] < t:",
      ("tests/test_schedule_interleaved_zb.py",),
      "ZB-H1 may run a W before its B"),
    M("schedule-interleaved-backward", "autoplan/plans/_schedule.py",
      'bwd = [StagePass(microbatch(k), (v - 1 - (k // P) % v) * P + j, "backward")',
      'bwd = [StagePass(microbatch(k), ((k // P) % v) * P + j, "backward")',
      ("tests/test_schedule_interleaved_zb.py",),
      "interleaved 1F1B runs backward chunks in forward order"),
    M("spec-tile-count", "autoplan/plans/_spec.py",
      "                n *= sizes[a]",
      "                n = sizes[a]",
      ("tests/test_spec_value.py",),
      "a dimension split over two axes counts only the last axis's tiles"),
    M("zero-spec-drops-axes", "autoplan/plans/_spec.py",
      "            return Spec(*spec[:d], have + extra, *spec[d + 1:])",
      "            return Spec(*spec[:d], extra, *spec[d + 1:])",
      ("tests/test_spec_value.py",),
      "ZeRO replaces the axes a dimension is already split over instead of adding to them"),
    M("trace-dot-flops", "autoplan/tracing/_trace.py",
      "return 2.0 * out * math.prod(in_shapes[0][d] for d in lc)",
      "return out * math.prod(in_shapes[0][d] for d in lc)",
      ("tests/test_trace.py",),
      "a matmul counts one FLOP per multiply-add, not two"),
    M("primitive-broadcast-operand", "autoplan/tracing/_primitives.py",
      "        return tuple(e if shp[d] == out_shape[d] else None for d, e in enumerate(out))",
      "        return out",
      ("tests/test_primitives.py",),
      "an elementwise follower splits a broadcast (size-1) operand dimension"),
    M("batchflow-dot-pairs", "autoplan/tracing/_batchflow.py",
      "if from_l and from_r and from_l != from_r:",
      "if from_l and from_r and from_l == from_r:",
      ("tests/search/test_mixing.py",),
      "a similarity matrix over the batch (in-batch negatives) is not seen as mixing examples"),
    M("exec-accumulation-mean", "autoplan/exec/_stages.py",
      "            for t, a in zip(acc_ids, sums):\n"
      "                env[t] = (a / num_mb).astype(tensors[t].dtype)",
      "            for t, a in zip(acc_ids, sums):\n"
      "                env[t] = a.astype(tensors[t].dtype)",
      ("tests/exec/test_microbatch_loops.py::"
       "test_gradient_accumulation_is_one_program_per_step_and_follows_one_device",),
      "gradient accumulation sums the micro-batches' gradients instead of averaging them"),
    M("exec-pipeline-mean", "autoplan/exec/_stages.py",
      "                for t, a in zip(task.means, sums):\n"
      "                    env[t] = (a / num_mb).astype(tensors[t].dtype)",
      "                for t, a in zip(task.means, sums):\n"
      "                    env[t] = a.astype(tensors[t].dtype)",
      ("tests/exec/test_run.py::test_pipeline_plan_matches_single_device",),
      "a pipeline's update task sums the micro-batches' gradients instead of averaging them"),
    M("remat-closure-inputs", "autoplan/exec/_levers.py",
      "if not isinstance(t, Lit) and t not in outs))",
      "if not isinstance(t, Lit)))",
      ("tests/exec/test_levers_applied.py::"
       "test_recompute_reruns_a_layer_from_its_inputs_before_the_first_reader",),
      "the recomputation's barrier also holds values it makes itself"),
    M("remat-closure-stops", "autoplan/exec/_levers.py",
      "                stack.append(u)",
      "                pass",
      ("tests/exec/test_levers_applied.py::"
       "test_recompute_reruns_a_layer_from_its_inputs_before_the_first_reader",),
      "rematerialisation recomputes only the value read, not what it is made from in its layer"),
    M("equivalence-tolerance", "autoplan/exec/_run.py",
      "ratio = np.where(diff == 0, 0.0, diff / tol)",
      "ratio = np.where(diff == 0, 0.0, diff / tol / 1e3)",
      ("tests/exec/test_failures.py::test_non_finite_values_are_compared_position_by_position",),
      "the equivalence check accepts differences 1000 times its tolerance"),
    M("equivalence-second-reference-after-a-loss-mismatch", "autoplan/exec/_run.py",
      "            and not tally.failed[3] and not tally.loss_failed:",
      "            and not tally.failed[3]:",
      ("tests/exec/test_microbatch_loops.py::"
       "test_a_loss_that_differs_keeps_the_full_batch_reference",),
      "a micro-batched plan whose loss differs from the full batch's matches its micro-batched "
      "reference instead"),
    M("equivalence-second-reference-full-batch", "autoplan/exec/_run.py",
      "        again = _tally_steps(r, graph, cross, records, microbatches, rtol, atol, compiler_options)",
      "        again = _tally_steps(r, graph, cross, records, 1, rtol, atol, compiler_options)",
      ("tests/exec/test_microbatch_loops.py::"
       "test_a_full_batch_reference_off_at_a_discontinuity_gives_way_to_the_micro_batched_one",),
      "the second reference of a micro-batched plan is the full-batch one again"),
    M("planfile-stage-index", "autoplan/plans/_planfile.py",
      "        if stage >= len(views):",
      "        if stage > len(views):",
      ("tests/test_planfile.py::test_a_wrong_field_is_named",),
      "an input naming a stage one past the last is not refused by name"),
    M("levers-remat-peak", "autoplan/search/pipeline/_levers.py",
      "    out.resident += max((lev[p].remat_saving for p in remat), default=0.0)",
      "    out.resident += 0.0",
      ("tests/search/pipeline/test_levers.py::test_greedy_remat_takes_most_bytes_per_second_first",),
      "rematerialisation forgets the peak of the one layer being recomputed"),
    M("levers-zero3-buffer", "autoplan/search/pipeline/_levers.py",
      "        out.resident += max((x.zero_buffer for x in lev), default=0.0)",
      "        out.resident += 0.0",
      ("tests/search/pipeline/test_levers.py::"
       "test_zero_3_holds_the_largest_layers_gathered_parameters",),
      "ZeRO-3 forgets the buffer of the gathered parameters of one layer"),
    M("pins-prng-keys", "autoplan/search/intra/_pins.py",
      "            hits = [gi for gi in hits if gi.tensor not in keys]",
      "            hits = list(hits)",
      ("tests/search/intra/test_pins.py",
       "tests/test_keys.py::test_a_wider_sharded_pin_leaves_out_the_keys_it_matches"),
      "a sharded pin over a wider pattern shards the PRNG keys it matches"),
    M("zero-1-shards-nothing", "autoplan/plans/_spec.py",
      '    1: frozenset({"optimizer_state"}),',
      '    1: frozenset(),',
      ("tests/search/pipeline/test_levers.py::test_memory_figure_shows_the_levers",),
      "ZeRO-1 keeps the optimizer state whole (the memory figure and the executor read the rule)"),
    M("pipeline-kinds-ignore-pins", "autoplan/search/pipeline/_cost_table.py",
      "        if not self.ctx.pins:\n            return [ly.signature for ly in self.layers]",
      "        if True:\n            return [ly.signature for ly in self.layers]",
      ("tests/search/pipeline/test_cost_model.py::"
       "test_a_layer_pinned_unlike_its_kind_keeps_its_pin_and_does_not_lend_it",),
      "the pipeline search folds layers by structure alone: one layer's pins serve its kind"),
    M("levers-zero-ignores-pins", "autoplan/search/pipeline/_levers.py",
      "            max_zero = min(max_zero, max(z for z in ZERO_LEVELS if i.kind not in "
      "ZERO_SHARDED[z]))",
      "            max_zero = 3",
      ("tests/search/pipeline/test_levers.py::test_zero_never_shards_an_input_the_user_pinned",),
      "ZeRO shards an input the user pinned"),
    M("unheld-pins-size-one-axes", "autoplan/search/intra/_pins.py",
      "    return tuple(tuple(a for a in (e or ()) if sizes.get(a, 1) > 1) or None for e in spec)",
      "    return tuple(tuple(e or ()) or None for e in spec)",
      ("tests/search/intra/test_pins.py::"
       "test_unheld_pins_names_a_changed_spec_and_a_zero_stage_sharding_a_pinned_input",),
      "the pins check counts a mesh axis of size 1 as a split"),
    M("ilp-budget-after-edges", "autoplan/search/intra/_ilp_solve.py",
      "        _check_least(prob.unknown, least, mesh, memory_budget)\n"
      "        problem_edges(prob, ops=ops, fixed=fixed, pins=pins)",
      "        problem_edges(prob, ops=ops, fixed=fixed, pins=pins)\n"
      "        _check_least(prob.unknown, least, mesh, memory_budget)",
      ("tests/search/intra/test_ilp.py::"
       "test_a_budget_below_the_least_memory_is_refused_before_the_edges_are_built",),
      "a budget below the least memory is refused only after the whole problem is built"),
    M("ilp-least-not-kept", "autoplan/search/intra/_ilp_solve.py",
      "        hit = kept.get(key) if kept is not None else None",
      "        hit = None",
      ("tests/search/intra/test_ilp.py::"
       "test_a_budget_below_the_least_memory_is_refused_before_the_edges_are_built",),
      "a budget change builds the whole step's nodes again to refuse a mesh it refused before"),
    M("zoo-trace-ignores-shapes", "autoplan/tracing/_trace.py",
      "            tree, sig, tuple(workload.arg_kinds), name, config)",
      "            tree, tuple(workload.arg_kinds), name, config)",
      ("tests/test_trace.py::test_a_zoo_workloads_trace_is_shared_by_every_object_of_its_spec",),
      "a zoo workload's micro-batch trace is its full batch's, shared by the spec alone"),
    M("zoo-trace-any-origin", "autoplan/tracing/_trace.py",
      '    if origin is None or origin.kind != "zoo":',
      "    if origin is None:",
      ("tests/test_trace.py::test_a_zoo_workloads_trace_is_shared_by_every_object_of_its_spec",),
      "a workload built in this process shares a trace with another of the same name"),
    M("parallel-newer-batch-ignored", "autoplan/search/_parallel.py",
      "not self._goes_first() and self._newer_waits()) or \\",
      "not self._goes_first() and False) or \\",
      ("tests/search/test_parallel.py::test_a_batchs_tasks_go_to_the_workers_first_but_its_last_"
       "waits_for_a_nested_batch",),
      "a batch hands its last task to the workers too while a batch started inside one of its "
      "tasks waits"),
    M("parallel-first-group-behind", "autoplan/search/_parallel.py",
      "if self._older_goes_first() or (",
      "if False or (",
      ("tests/search/test_parallel.py::test_a_first_group_goes_ahead_of_nested_batches_and_is_"
       "shown_while_the_caller_works",),
      "a nested batch hands its tasks to the workers while its parent's first group (the "
      "candidates shown early) waits for one"),
    M("parallel-family-busy-ignored", "autoplan/search/_parallel.py",
      "                            self._workers_taken():",
      "                            False:",
      ("tests/search/test_parallel.py::test_a_nested_batch_hands_no_task_to_a_worker_its_family_"
       "keeps_busy",),
      "a nested batch hands a task to a worker busy with its parent's long task, and the "
      "caller waits for it"),
    M("pipeline-kinds-spread-wrong", "autoplan/search/pipeline/_levers.py",
      "        per = self.per_kind[:, :, self.index]",
      "        per = self.per_kind[:, :, self.index[::-1]]",
      ("tests/search/pipeline/test_levers.py::test_stage_dp_arrays_and_lever_deltas_hold_each_"
       "layers_own_costs",),
      "the lever variants' changes made per layer kind are spread over the layers in the wrong "
      "order"),
    M("lever-inputs-travel-made", "autoplan/search/pipeline/_stage_dp.py",
      'return {**self.__dict__, "_made": None}',
      "return dict(self.__dict__)",
      ("tests/search/pipeline/test_levers.py::test_lever_inputs_travel_as_their_recipe_and_make_"
       "the_same_arrays",),
      "a stage-DP run sent to a worker carries the arrays it made (its base arrays, the lever "
      "deltas) as well as their recipe"),
    M("parallel-task-collector-young", "autoplan/search/_parallel.py",
      "with warnings.catch_warnings(record=True) as caught, paused():",
      "with warnings.catch_warnings(record=True) as caught:",
      ("tests/search/test_parallel.py::test_a_task_leaves_what_it_kept_in_the_oldest_"
       "generation",),
      "a task runs with the collector on, what it kept left young for a whole-heap walk"),
    M("kinds-labels-not-batch", "autoplan/tracing/_workload.py",
      "            if (batch is not None and _leading_dims(args[i]) == {batch}",
      "            if (False",
      ("tests/test_arg_kinds.py::test_labels_beside_the_inputs_are_batch_arguments_whatever_"
       "their_name",
       "tests/test_arg_kinds.py::test_a_four_argument_dropout_step_gets_micro_batched_plans_that_"
       "match_one_device"),
      "labels beside the inputs are not read as batch arguments: a micro-batch splits the "
      "inputs and keeps the labels whole"),
    M("microbatch-failure-fails-search", "autoplan/search/_api.py",
      "            if not strict and isinstance(o.error, MicrobatchTraceError):",
      "            if False:",
      ("tests/test_arg_kinds.py::test_a_step_that_cannot_be_micro_batched_keeps_its_other_plans_"
       "and_says_why",
       "tests/test_arg_kinds.py::test_a_scalar_in_the_batch_keeps_the_other_plans_and_names_the_"
       "leaf"),
      "a step that cannot be micro-batched fails the whole search instead of keeping its other "
      "candidates"),
    M("sweep-cache-unbounded", "autoplan/plans/_schedule.py",
      "        while _SWEEP_TASKS[0] > SWEEP_CACHE_TASKS and len(_SWEEPS) > 1:",
      "        while False:",
      ("tests/test_shared_schedule.py::test_sweep_orders_are_kept_up_to_a_task_budget_most_"
       "recent_first",),
      "the simulation's kept sweep orders grow without bound"),
    M("loader-folder-stays-first", "autoplan/tracing/_loader.py",
      "            sys.path.append(cwd)",
      "            sys.path.insert(0, cwd)",
      ("tests/test_faults_files.py::test_a_users_queue_py_beside_their_workload_does_not_break_a_"
       "search",),
      "the workload's folder stays ahead of the standard library, and a queue.py beside the "
      "workload stands in for the real one in what the search imports later"),
    M("abstract-numpy-dtypes", "autoplan/tracing/_workload.py",
      "    return jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype), weak_type=weak)",
      "    return jax.ShapeDtypeStruct(shape, dtype)",
      ("tests/test_arg_kinds.py::test_a_flax_train_state_step_with_labels_apart_runs_micro_"
       "batched_equal_to_one_device",),
      "a host value's dtype is read as NumPy's (a Python int as int64), not as JAX calls the "
      "step with it"),
    M("aligned-nodes-any-costs", "autoplan/search/intra/_ilp_problem.py",
      "            dev += float(np.ptp(nb.cost - na.cost))",
      "            dev += 0.0",
      ("tests/search/pipeline/test_cost_model.py::test_aligned_nodes_asks_for_one_ilp_up_to_a_"
       "constant",),
      "a layer kind takes another kind's plans where their ILPs' costs differ by more than a "
      "constant"),
    M("layer-families-off", "autoplan/search/pipeline/_cost_table.py",
      "        self.family = self._families()",
      "        self.family = {}",
      ("tests/search/pipeline/test_cost_model.py::test_layer_kinds_of_one_loose_signature_share_"
       "their_plans",),
      "every layer kind solves its own ILPs, the first MoE layer's beside the others'"),
    M("carried-parameters-as-state", "autoplan/tracing/_trace.py",
      '            kind = "parameter" if i in carried and next(carried[i]) else kinds[i]',
      "            kind = kinds[i]",
      ("tests/test_arg_kinds.py::test_a_train_states_parameters_are_parameters_and_its_moments_"
       "follow_their_layers",),
      "a TrainState's parameters are read as optimizer state: no gradient buffers, the "
      "optimizer state's levers"),
    M("moments-by-whole-path-only", "autoplan/search/fold/_layers.py",
      "            ly = next((param_layer.get(e, ending_layer.get(e)) for e in path_endings(gi.path)",
      "            ly = next((param_layer.get(e, -1) for e in path_endings(gi.path)",
      ("tests/test_arg_kinds.py::test_a_train_states_parameters_are_parameters_and_its_moments_"
       "follow_their_layers",),
      "Adam's moments of a TrainState's parameters all go to the last layer's stage"),
    M("bound-never-foreseen", "autoplan/search/fold/_levels.py",
      "        if self.solves + len(states) > self.max_ilps:",
      "        if False:",
      ("tests/user_models/test_user_folding.py::test_auto_bound_is_foreseen_from_the_"
       "disagreeing_boundaries",),
      "a folded search whose boundaries all disagree solves up to its bound before the "
      "exhaustive search replaces it"),
    M("one-sided-states-one-side", "autoplan/search/fold/_levels.py",
      "                for key in ((ckey[i], None, s), (ckey[i + 1], s, None)) if key not in self.cache}",
      "                for key in ((ckey[i + 1], s, None),) if key not in self.cache}",
      ("tests/user_models/test_user_folding.py::test_foreseen_states_are_the_one_sided_ilps_"
       "left",),
      "the forecast misses the left side's one-sided ILPs and lets a chain run past its bound"),
    M("one-sided-states-solved-counted", "autoplan/search/fold/_levels.py",
      "                for key in ((ckey[i], None, s), (ckey[i + 1], s, None)) if key not in self.cache}",
      "                for key in ((ckey[i], None, s), (ckey[i + 1], s, None))}",
      ("tests/user_models/test_user_folding.py::test_foreseen_states_are_the_one_sided_ilps_"
       "left",),
      "the forecast counts one-sided ILPs an earlier run solved and stops a chain too soon"),
    M("summary-potential-backward-order", "autoplan/plans/_schedule.py",
      "        bpot = 2 * S - 1 - stage + 2 * b",
      "        bpot = 2 * S - 1 + stage + 2 * b",
      ("tests/search/pipeline/test_schedule.py::test_each_sweep_keeps_every_mesh_order_and_"
       "waits_for_each_dependency",),
      "the summary's 1F1B order puts a stage's backward before the next stage's, which it waits "
      "for"),
    M("dp-finite-stages-strict", "autoplan/search/pipeline/_stage_dp.py",
      "        keep = np.flatnonzero(cost <= t_max)",
      "        keep = np.flatnonzero(cost < t_max)",
      ("tests/search/pipeline/test_stage_dp.py::test_finite_stages_of_a_run_are_those_of_its_"
       "own_masked_table",),
      "a DP run drops the stages that cost exactly t_max, so the bisection's own bound has no "
      "plan"),
    M("dp-positions-first-stage-one-late", "autoplan/search/pipeline/_stage_dp.py",
      "            first[p] = np.where(count[0] > p, base[0], np.inf)",
      "            first[p] = np.where(count[0] >= p, base[0], np.inf)",
      ("tests/search/pipeline/test_stage_dp.py::test_position_tables_equal_each_position_"
       "tested_alone",),
      "the first stage keeps a config one position after it stops fitting the memory"),
    M("rescale-any-difference-scaled", "autoplan/tracing/_rescale.py",
      "        if whole != part * self.base or whole % self.count or part == 1 or whole == self.count:",
      "        if whole % self.count or part == 1 or whole == self.count:",
      ("tests/user_models/test_rescaled_graphs.py::test_nothing_is_derived_where_two_traces_do_"
       "not_determine_the_graph",),
      "a dimension that differs between the two traces but not in the ratio of their batches "
      "(batch + 8) is scaled as if it were a multiple of the batch"),
    M("rescale-opaque-flops-recounted", "autoplan/tracing/_rescale.py",
      "    if is_opaque(a.primitive):  # (its FLOPs",
      "    if False:  # (its FLOPs",
      ("tests/user_models/test_rescaled_graphs.py::test_a_derived_graph_is_the_trace_at_its_"
       "count",),
      "an opaque control-flow operator's FLOPs (its bodies') are counted from its own shapes "
      "instead of scaled"),
)

#: a pytest plugin (written next to the copy) that stops the run when the tests import any
#: ``autoplan`` other than the mutated copy
_GUARD = '''
import sys
import pytest

def pytest_collection_finish(session):
    import autoplan
    where = autoplan.__file__
    if not where.startswith({root!r}):
        pytest.exit(f"the tests import autoplan from {{where}}, not the mutated copy", returncode=3)
'''


def check_snippet(m: Mutation) -> str:
    """The file's text, after checking ``m.original`` occurs in it exactly once."""
    text = (ROOT / m.file).read_text()
    n = text.count(m.original)
    if n != 1:
        raise SystemExit(f"mutation {m.name}: its snippet occurs {n} times in {m.file}, not once. "
                         "Fix: update the snippet in benchmarks/mutation.py to the code as it is now.")
    return text


def _tree_files() -> list[str]:
    """The repository's files as git sees them (tracked, and new ones not ignored); outside a
    git checkout, the package, the tests and the files pytest reads to start."""
    try:
        r = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                           cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        found = [p for d in ("autoplan", "tests") for p in (ROOT / d).rglob("*")
                 if "__pycache__" not in p.parts]
        found += [ROOT / "conftest.py", ROOT / "pyproject.toml"]
        return [p.relative_to(ROOT).as_posix() for p in found if p.is_file()]
    return [f for f in r.stdout.split("\0") if f and (ROOT / f).is_file()]


def run_one(m: Mutation, timeout: float, mutate: bool = True) -> tuple[str, float]:
    """``(outcome, seconds)``: ``killed (by the first failing test)``, ``SURVIVED`` or
    ``error (...)``; with ``mutate=False`` the tests run on the unmutated copy (they should
    pass: ``SURVIVED`` then means the set-up is sound)."""
    text = check_snippet(m)
    with tempfile.TemporaryDirectory(prefix=f"mutation-{m.name}-") as tmp:
        # the whole tree, not only the package: pytest puts the folder of the root conftest.py
        # first on sys.path, so tests run from the worktree would import its unmutated autoplan
        for f in _tree_files():
            dst = Path(tmp) / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst)
        if mutate:
            (Path(tmp) / m.file).write_text(text.replace(m.original, m.mutated))
        (Path(tmp) / "_mutation_guard.py").write_text(
            _GUARD.format(root=str(Path(tmp) / "autoplan")))
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=tmp)
        cmd = [sys.executable, "-P", "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "-p", "_mutation_guard", *m.tests]
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed (timed out)", time.perf_counter() - t0
        dt = time.perf_counter() - t0
    if r.returncode == 0:
        return "SURVIVED", dt
    if r.returncode in (1, 2):  # tests failed, or collection failed on the mutated code
        failed = [ln.split()[1] for ln in r.stdout.splitlines()
                  if ln.startswith(("FAILED ", "ERROR ")) and len(ln.split()) > 1]
        return f"killed (by `{failed[0]}`)" if failed else "killed", dt
    tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
    return f"error (pytest exit {r.returncode}: {tail[0][:80]})", dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", metavar="NAME", help="run this mutation (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the mutations, run nothing")
    ap.add_argument("--clean", action="store_true",
                    help="run the tests on the unmutated copy instead (each should pass)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutation's tests")
    args = ap.parse_args(argv)
    names = {m.name for m in MUTATIONS}
    chosen = list(MUTATIONS)
    if args.only:
        unknown = sorted(set(args.only) - names)
        if unknown:
            ap.error(f"--only {unknown[0]!r} is not a mutation. Known: {', '.join(sorted(names))}")
        chosen = [m for m in MUTATIONS if m.name in args.only]
    if args.list:
        for m in chosen:
            check_snippet(m)
            print(f"{m.name}\t{m.file}\t{' '.join(m.tests)}\t{m.breaks}")
        return 0
    print("| mutation | file | breaks | tests | result | seconds |")
    print("|---|---|---|---|---|---|")
    bad = 0
    for m in chosen:
        outcome, dt = run_one(m, args.timeout, mutate=not args.clean)
        if args.clean:
            outcome = "passes" if outcome == "SURVIVED" else f"FAILS UNMUTATED: {outcome}"
            bad += outcome != "passes"
        else:
            bad += not outcome.startswith("killed")
        tests = ", ".join(f"`{t}`" for t in m.tests)
        print(f"| {m.name} | `{m.file}` | {m.breaks} | {tests} | {outcome} | {dt:.1f} |", flush=True)
    print(f"\n{len(chosen) - bad} of {len(chosen)} "
          + ("pass unmutated" if args.clean else "killed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
