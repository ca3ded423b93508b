"""The what-if panel: an input of the selected plan pinned to a spec and the plan's mesh
re-solved with the pins, the new plans compared with the plans before them, and undo."""

from __future__ import annotations

import html
import math
import re
import time
from collections.abc import Sequence
from typing import Any

import autoplan
from autoplan._errors import AutoplanError, SearchError, StateError
from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import Plan
from autoplan.plans._spec import Spec
from autoplan.viz._compare import cost_parts
from autoplan.viz._style import fmt_bytes, fmt_in_unit, time_unit

from ._state import Pin


def spec_choices(shape: Sequence[int], mesh_shape: Sequence[int], axis_names: Sequence[str]
                 ) -> list[tuple]:
    """Every spec of a tensor of ``shape`` on the mesh, replicated first: each mesh axis of more
    than one device unused or splitting one dimension it divides (several axes on a dimension in
    mesh order); as the search enumerates them."""
    from autoplan.search.intra._spec_space import enumerate_specs  # noqa: PLC0415

    cl = Cluster.preset("cpu", 1, devices_per_node=max(1, math.prod(mesh_shape)))
    mesh = cl.logical_mesh(tuple(mesh_shape))
    names = dict(zip(mesh.axis_names, axis_names))
    return [Spec(*[None if not e else tuple(names.get(a, a) for a in e) for e in s])
            for s in enumerate_specs(tuple(shape), mesh)]


class WhatIfPanel:
    """:meth:`set_pin_target`, :meth:`pin_choices`, :meth:`what_if` and :meth:`undo`, and the
    pin controls they keep current."""

    def _pin_hint(self) -> str:
        return ("<small>click a tensor in the sharding view: a parameter, optimizer state or batch "
                "input is pinned as chosen (for an activation, its operator's weight)</small>")

    def set_pin_target(self, tensor: str, op: int | None = None) -> str | None:
        """Choose the graph input a what-if pin will fix: ``tensor`` when it is an input of the
        selected plan, else the weight of operator ``op``. Returns the input's name (None when
        neither is an input)."""
        plan = self.plan
        if plan is None:
            raise StateError("Explorer: a candidate should be selected first. Got none. Fix: "
                             "ex.select(0) first.")
        names = {i.name for i in plan.inputs}
        target = tensor if tensor in names else None
        if target is None and op is not None:
            o = next((o for o in plan.ops if o.op == op), None)
            if o is not None:
                target = next((t.name for t in o.tensors if t.role == "weight" and t.name in names),
                              None)
        self._state.pin_target = target
        self._refresh_pin_panel(None if target else
                                f"{html.escape(tensor)} is an activation and operator {op} reads "
                                "no parameter: pick a weight, an optimizer state or a batch input")
        return target

    def pin_choices(self) -> list[tuple[str, tuple]]:
        """``(label, spec)`` for every spec the pin target can take on the selected plan's mesh
        (its current spec first)."""
        plan = self.plan
        if plan is None or self._state.pin_target is None:
            return []
        inp = next(i for i in plan.inputs if i.name == self._state.pin_target)
        st = next((s for s in plan.stages if s.index == inp.stage), plan.stages[0])
        specs = spec_choices(inp.shape, st.mesh_shape, st.axis_names)
        cur = inp.spec
        specs = [cur] + [s for s in specs if s != cur]
        return [(f"{s.pspec_text()} = {s}" + (" (current)" if s == cur else ""), s)
                for s in specs]

    def _refresh_pin_panel(self, message: str | None = None) -> None:
        plan = self.plan
        target = self._state.pin_target
        pipeline = plan is not None and plan.is_pipeline
        if target is None or plan is None:
            self._pin_spec.options = []
            self._pin_spec.disabled = True
            self._pin_button.disabled = True
            self._pin_info.value = f"<small>{message}</small>" if message else self._pin_hint()
        else:
            inp = next(i for i in plan.inputs if i.name == target)
            choices = self.pin_choices()
            self._quiet += 1
            try:
                self._pin_spec.options = [(lab, k) for k, (lab, _) in enumerate(choices)]
                self._pin_spec.value = 1 if len(choices) > 1 else 0
            finally:
                self._quiet -= 1
            self._pin_spec.disabled = pipeline
            self._pin_button.disabled = pipeline or self.busy_with("what-if")
            why = ("<br><b>pins apply to intra-operator plans</b>: pipeline stages are searched "
                   "per layer and take no pins; select an intra-operator candidate"
                   if pipeline else "")
            self._pin_info.value = (
                f"<small>pin <code>{html.escape(target)}</code> ({inp.kind}, "
                f"{'x'.join(map(str, inp.shape)) or 'scalar'}, now {inp.spec.pspec_text()}) on mesh "
                f"{'x'.join(map(str, plan.mesh_shape))}: {len(choices)} specs{why}</small>")
        self._undo_button.disabled = not self._state.pins
        rows = "".join(
            f"<li><code>{html.escape(p.name)}</code> = {html.escape(p.spec.pspec_text())}: "
            f"{self._diff_text(p.before, p.plan)}</li>" for p in self._state.pins)
        self._pins_html.value = f"<small>pins:<ol>{rows}</ol></small>" if rows else ""

    @staticmethod
    def _diff_text(before: Plan, after: Plan) -> str:
        unit = time_unit(max(before.predicted.step_time, after.predicted.step_time))
        a, b = cost_parts(before), cost_parts(after)
        parts = []
        for k in dict.fromkeys([*a, *b]):
            d = b.get(k, 0.0) - a.get(k, 0.0)
            if abs(d) > 1e-12 * max(1.0, before.predicted.step_time):
                parts.append(f"{k} {'+' if d >= 0 else '&minus;'}{fmt_in_unit(abs(d), unit)}")
        dt = after.predicted.step_time - before.predicted.step_time
        dm = after.predicted.memory_per_device - before.predicted.memory_per_device
        return (f"step time {fmt_in_unit(before.predicted.step_time, unit)} &rarr; "
                f"{fmt_in_unit(after.predicted.step_time, unit)} "
                f"({'+' if dt >= 0 else '&minus;'}{fmt_in_unit(abs(dt), unit)}"
                + (f": {', '.join(parts)}" if parts else "") + "); memory "
                f"{'+' if dm >= 0 else '&minus;'}{fmt_bytes(abs(dm))} per device")

    def _pin_clicked(self) -> None:
        choices = self.pin_choices()
        if not choices or self._state.pin_target is None:
            return
        self.what_if(self._state.pin_target, choices[int(self._pin_spec.value or 0)][1])

    def what_if(self, name: str, spec: Any) -> bool:
        """Pin input ``name`` to ``spec`` (a spec tuple or a ``PartitionSpec``), with the pins
        made before, and re-solve the selected plan's mesh in the background; the new plan
        joins the candidates (label ``what-if: ...``), is selected and compared with the plan
        before it.

        Returns:
            False (and starts nothing) when a what-if is already running.

        Raises:
            StateError: no plan selected. SearchError: the selected plan is a pipeline plan,
                or ``name`` is not one of its inputs.
        """
        plan = self.plan
        if plan is None:
            raise StateError("Explorer.what_if: no plan selected. Fix: run a search first.")
        if plan.is_pipeline:
            raise SearchError("Explorer.what_if: pins apply to intra-operator plans; the selected "
                              f"plan [{plan.label}] has {len(plan.stages)} pipeline stages. Fix: "
                              "select an intra-operator candidate.")
        inp = next((i for i in plan.inputs if i.name == name), None)
        if inp is None:
            raise SearchError(f"Explorer.what_if: {name!r} is not an input of the selected plan. "
                              f"Fix: pick one of its inputs, e.g. {plan.inputs[0].name!r}.")
        spec = Spec.from_pspec(spec, len(inp.shape))
        started = self._start("what-if", lambda: self._what_if_job(plan, name, spec),
                              pause_gc=True)
        if started:
            self._pin_button.disabled = True
            self._pin_info.value = (f"<small>re-solving mesh {'x'.join(map(str, plan.mesh_shape))} "
                                    f"with <code>{html.escape(name)}</code> = "
                                    f"{html.escape(spec.pspec_text())}...</small>")
        return started

    def _what_if_job(self, before: Plan, name: str, spec: Spec) -> None:
        generation = self._state.generation
        pins = {("^" + re.escape(p.name) + "$"): p.spec.to_pspec()
                for p in self._state.pins if self._chain_has(before, p)}
        pins["^" + re.escape(name) + "$"] = spec.to_pspec()
        wl = self._get_workload()
        opts = self._options()
        t0 = time.perf_counter()
        try:
            res = autoplan.search(wl, self._cluster(), pipeline=False,
                                  mesh_shape=tuple(before.mesh_shape), level=opts["level"],
                                  memory_budget=opts["memory_budget"], pins=pins,
                                  baselines=False)
        except AutoplanError as err:
            self._refresh_pin_panel(f"the pin cannot be honoured: {html.escape(str(err))}")
            raise
        new = res.best.with_(label=f"what-if: {name} = {spec.pspec_text()}")
        with self._lock:
            if generation != self._state.generation:
                return  # a new search replaced the result meanwhile
            self._state.whatif.append(new)
            self._state.pins.append(Pin(name, spec, before, new, time.perf_counter() - t0))
            self._refresh_candidates()
        self.select(len(self.plans) - 1)

    def _chain_has(self, plan: Plan, pin: Pin) -> bool:
        """Whether ``pin`` was made on the way to ``plan`` (pins stack: a what-if of a what-if
        keeps the first pin)."""
        p = plan
        seen = 0
        while p is not None and seen < 100:
            step = next((q for q in self._state.pins if q.plan is p), None)
            if step is None:
                return False
            if step is pin:
                return True
            p = step.before
            seen += 1
        return False

    def undo(self) -> Plan | None:
        """Take the last what-if pin back: its plan leaves the candidates and the plan before it
        is selected again. Returns that plan (None when there was no pin)."""
        with self._lock:
            if not self._state.pins:
                return None
            last = self._state.pins.pop()
            self._state.whatif = [p for p in self._state.whatif if p is not last.plan]
            self._refresh_candidates()
            before = last.before
            index = next((k for k, p in enumerate(self.plans) if p is before),
                         next((k for k, p in enumerate(self.plans) if p == before), 0))
            self.select(index)
            return before

