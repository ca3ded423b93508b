"""The candidates panel: the ranked plans in the candidate selector (equivalent plans once),
the selected plan's figures, summary and code."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from autoplan._errors import ArgumentIndexError, StateError
from autoplan.plans._plan import Plan
from autoplan.viz._compare import compare_figure, equivalent_groups
from autoplan.viz._graph_figure import graph_figure
from autoplan.viz._sharding import op_layers
from autoplan.viz._style import TEMPLATE
from autoplan.viz._timeline import memory_figure, stage_figure, timeline_figure

from ._state import _ms


class CandidatePanel:
    """:attr:`plans`, :attr:`candidates`, :meth:`select` and the views of the selected plan."""

    def _refresh_candidates(self) -> None:
        plans = self.plans
        opts = []
        for g in equivalent_groups(plans):
            k = g[0]
            p = plans[k]
            fits = p.predicted.memory_per_device <= p.cluster.device_memory
            same = "".join(f" = #{j} {plans[j].describe().split(' on mesh ')[-1]}" for j in g[1:])
            opts.append((f"{k}. {p.label}: {p.describe()}, {_ms(p.predicted.step_time)}"
                         + same + ("" if fits else " (does not fit)"), k))
        self._quiet += 1
        try:
            self._candidate.options = opts
            self._candidate.value = None
        finally:
            self._quiet -= 1

    @property
    def plans(self) -> list[Plan]:
        """Every plan the explorer holds: the result's ranked plans, then the what-if plans."""
        return (list(self.result.plans) if self.result is not None else []) + list(self._state.whatif)

    @property
    def candidates(self) -> list[Plan]:
        """The plans the candidate selector offers, in its order (one per group of equivalent
        plans)."""
        plans = self.plans
        return [plans[v] for _, v in self._candidate.options]

    def select(self, index: int) -> Plan:
        """Select plan ``index`` of :attr:`plans` (a plan of a group of equivalent plans selects
        the group) and update every view (in the calling thread). A plan selected while a
        search runs stays selected when the search ends (the status line then says that it is
        not the best); otherwise every search ends on its best plan.

        Raises:
            StateError: no search result yet. ArgumentIndexError: no such plan.
        """
        return self._select(index, picked=True)

    def _select(self, index: int, *, picked: bool) -> Plan:
        if self.result is None:
            raise StateError("Explorer.select: no search result yet. Fix: run ex.search() and "
                             "ex.wait_idle() first.")
        plans = self.plans
        n = len(plans)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
            raise ArgumentIndexError(f"Explorer.select: index should be in [0, {n}). Got {index!r}. "
                                     "Fix: pass the index of one of ex.plans.")
        with self._lock:
            shown = {v for _, v in self._candidate.options}
            if index not in shown:  # an equivalent plan: its group's entry
                group = next(g for g in equivalent_groups(plans) if index in g)
                index = next(k for k in group if k in shown)
            self._quiet += 1
            try:
                self._candidate.value = index
            finally:
                self._quiet -= 1
            if picked:
                self._state.picked = plans[index]
            self._show(index)
            return self.plan  # type: ignore[return-value]

    def _on_candidate(self, change: Mapping[str, Any]) -> None:
        if self._quiet or change["new"] is None:
            return
        # a change from the page: build the figures off the kernel's main thread
        self._start("view", lambda: self.select(change["new"]))

    def _reference_for(self, plan: Plan) -> tuple[Plan | None, str]:
        for p in self._state.pins:
            if p.plan is plan:
                return p.before, f"before pinning {p.name} to {p.spec.pspec_text()}"
        if self._state.reference is not None and self._state.reference is not plan:
            return self._state.reference, self._state.reference_note
        return None, ""

    def _show(self, index: int) -> None:
        with self._lock:
            plans = self.plans
            plan = plans[index]
            self.plan = plan
            self._state.op_layer = op_layers(plan)
            self._state.stage_of_op = {o.op: s.index for s in plan.stages for o in s.ops}
            ref, note = self._reference_for(plan)
            figs = {"stage": stage_figure(plan), "memory": memory_figure(plan),
                    "timeline": timeline_figure(plan),
                    "compare": compare_figure(plans, highlight=index, reference=ref),
                    "graph": self._graph_figure(plan)}
            for name, fig in figs.items():
                self._set_base(name, fig)
            self._summary.value = self._summary_html(plan, note)
            self._refresh_focus_options(plan)
            self._draw_sharding()
            self._highlight(self._focus.value)
            self._launch_button.disabled = False
            self.code.code = plan.to_code()
            self.code.note = (f"plan [{plan.label}] {plan.describe()}; "
                              "shardings_for(args) equals plan.named_shardings(like=args)")
            if self._state.pin_target is not None and not any(i.name == self._state.pin_target for i in plan.inputs):
                self._state.pin_target = None
            self._refresh_pin_panel()
            self._refresh_snapshot()

    def _graph_figure(self, plan: Plan) -> Any:
        import plotly.graph_objects as go  # noqa: PLC0415

        if plan.analysis:
            return graph_figure(plan)
        return go.Figure(layout={"template": TEMPLATE, "height": 200, "title": {
            "text": f"Mined subgraphs: plan [{html.escape(plan.label)}] carries no folding analysis"}})

    def _set_base(self, name: str, fig: Any) -> None:
        from autoplan.viz._widget import figure_json  # noqa: PLC0415

        self._state.base[name] = figure_json(fig)
        self.figures[name].show(self._state.base[name])

    def _summary_html(self, plan: Plan, reference_note: str) -> str:
        text = plan.summary()
        # layers that no scope names: the search named them from the parameters they read
        generic = plan.ops and not any(
            o.layer and o.layer.split("/")[-1] in o.scope.split("/") for o in plan.ops)
        layers = ""
        if generic:
            names = list(dict.fromkeys(self._state.op_layer.values()))
            layers = (f"<br><small>layers named from parameter paths: "
                      f"{html.escape(', '.join(names[:12]))}{' ...' if len(names) > 12 else ''}</small>")
        ref = (f"<br><small>compared with {html.escape(reference_note)}</small>"
               if reference_note else "")
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in plan.notes)
        rows = "".join(
            f"<tr><td><code>{html.escape(i.name)}</code></td><td>{i.kind}</td>"
            f"<td>{'x'.join(map(str, i.shape))}</td><td><code>{html.escape(str(i.spec.to_pspec()))}"
            f"</code></td><td>{i.stage}</td></tr>" for i in plan.inputs[:300])
        more = f"<p>... {len(plan.inputs) - 300} more inputs</p>" if len(plan.inputs) > 300 else ""
        return (f"<div class='autoplan-plan'><pre>{html.escape(text)}</pre>{layers}{ref}"
                f"<details><summary>notes of the search</summary><ul>{notes}</ul></details>"
                "<details><summary>PartitionSpecs</summary><table><tr><th>input</th><th>kind</th>"
                f"<th>shape</th><th>PartitionSpec</th><th>stage</th></tr>{rows}</table>{more}"
                "</details></div>")

