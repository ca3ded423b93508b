"""The search panel: the controls read as a workload, a cluster and search options, a search
run in the background (its result memoised per settings), and its result applied."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import autoplan
from autoplan._errors import ModelError
from autoplan.costs._cluster import PRESETS, Cluster
from autoplan.plans._plan import Plan

from ._layout import NO_SIZE
from ._state import _is_graph, _ms, cluster_text, parse_budget, short_error


class SearchPanel:
    """The model, size and cluster controls' callbacks, :meth:`search` and its job, and
    :meth:`_apply_result` (which the candidate panel shows)."""

    # ---- controls --------------------------------------------------------------------------
    def _on_model(self, change: Mapping[str, Any]) -> None:
        self._state.workload = None
        name = str(change["new"] or "").strip()
        sizes = self._state.models.get(name)
        if sizes is None:  # a user's module:function (loaded at the next search): no sizes
            self._size.options = [NO_SIZE]
            self._size.value = NO_SIZE
            self._size.disabled = True
            return
        self._size.disabled = False
        self._size.options = sizes
        self._size.value = "tiny" if "tiny" in sizes else sizes[0]

    def _on_size(self, change: Mapping[str, Any]) -> None:
        self._state.workload = None

    def _on_preset(self, change: Mapping[str, Any]) -> None:
        new = change["new"]
        if new in PRESETS or new == "local":
            self._state.custom_cluster = None if new in PRESETS else self._state.custom_cluster
        self._nodes.description = "devices" if new == "cpu" else "nodes"
        self._nodes.disabled = new == "local"

    def _cluster_spec(self) -> str:
        if self._state.custom_cluster is not None and self._preset.value == self._state.custom_cluster.name:
            return self._state.custom_cluster.spec
        if self._preset.value == "local":
            return "local"
        return f"{self._preset.value}:{self._nodes.value}"

    def _cluster(self) -> Cluster:
        """The cluster the controls name. ``local``: this machine's devices as measured by
        :meth:`Cluster.detect` (a quick profile on first use, about half a minute on 8 emulated
        CPU devices, then read from the on-disk cache), called from the search's thread."""
        if self._state.custom_cluster is not None and self._preset.value == self._state.custom_cluster.name:
            return self._state.custom_cluster
        if self._preset.value == "local":
            self._status.value = ("profiling this machine's devices (once: the profile is cached "
                                  "on disk)")
            cl = Cluster.detect(quick=True, progress=False)
            self._state.custom_cluster = cl
            return cl
        return Cluster.parse(self._cluster_spec())

    def _get_workload(self) -> Any:
        if self._state.workload is not None:
            return self._state.workload
        from autoplan.tracing._loader import is_function_spec, load_workload  # noqa: PLC0415

        name = str(self._model.value or "").strip()
        if name not in self._state.models and not is_function_spec(name):
            raise ModelError(f"Explorer: the model box should hold one of {sorted(self._state.models)} "
                             f"or a user's 'module:function'. Got {name!r}.")
        size = self._size.value if name in self._state.models else None
        self._state.workload = load_workload(name, size=size)
        return self._state.workload

    def _memory_budget(self) -> float | None:
        return parse_budget(self._budget.value)

    def _options(self) -> dict[str, Any]:
        return {"schedule": self._schedule.value, "microbatches": self._microbatches.value or None,
                "level": self._level.value, "memory_budget": self._memory_budget()}

    # ---- search ----------------------------------------------------------------------------
    def search(self) -> bool:
        """Start a search with the current settings in the background.

        A search whose workload, cluster and options equal an earlier one of this explorer
        shows that result at once. The intra-operator candidates are shown as soon as they are
        ranked; the pipeline candidates and baselines join them when the search ends.

        Returns:
            False (and starts nothing) when a search is already running.
        """
        started = self._start("search", self._search_job, pause_gc=True)
        if not started:
            self._status.value = "a search is already running"
        return started

    def _progress_cb(self, message: str, fraction: float) -> None:
        self._progress.value = max(0.0, min(1.0, float(fraction)))
        self._status.value = f"{message} ({fraction * 100:.0f}%)"

    def _workload_key(self, wl: Any) -> tuple:
        from autoplan.tracing._loader import workload_spec  # noqa: PLC0415

        if _is_graph(wl):
            return ("graph", wl.fingerprint, id(wl))
        spec = workload_spec(wl)
        if spec is None:
            return ("object", id(wl))
        return ("spec", json.dumps(spec, sort_keys=True, default=str))

    def _search_job(self) -> None:
        self._state.picked = None
        self._search_button.disabled = True
        self._progress.bar_style = ""
        self._progress.value = 0.0
        t0 = time.perf_counter()
        try:
            self._status.value = f"building {self._model.value}" + (
                f" ({self._size.value})" if self._size.value != NO_SIZE else "")
            wl = self._get_workload()
            cl = self._cluster()
            opts = self._options()
            key = (self._workload_key(wl), json.dumps(cl.to_dict(), sort_keys=True, default=str),
                   json.dumps(opts, sort_keys=True))
            context = (str(self._model.value), str(self._size.value), cl.spec)
            self._state.cluster_names[cl.spec] = cluster_text(cl)
            res = self._state.memo.get(key)
            repeated = res is not None
            if res is None:
                kw: dict[str, Any] = dict(opts, pipeline=False if _is_graph(wl) else "auto",
                                          progress=self._progress_cb)
                kw["partial"] = lambda part: self._apply_result(part, key, context, partial=True)
                res = autoplan.search(wl, cl, **kw)
                self._state.memo[key] = res
        except Exception as err:
            self._progress.bar_style = "danger"
            self._status.value = f"search failed: {type(err).__name__}: {short_error(str(err))}"
            raise
        finally:
            self._search_button.disabled = False
        secs = time.perf_counter() - t0
        self._apply_result(res, key, context)
        self._progress.value = 1.0
        self._progress.bar_style = "success"
        size = None if _is_graph(wl) else wl.size
        name = wl.name or str(self._model.value)
        how = "repeated search: this explorer's earlier result" if repeated else f"in {secs:.1f} s"
        status = (f"{len(res.plans)} plans for {name}{f' ({size})' if size else ''} on {cluster_text(cl)} "
                  f"{how}; best: {res.best.label}, {res.best.describe()}, "
                  f"{_ms(res.best.predicted.step_time)}"
                  + "".join(f"; note: {n}" for n in getattr(res, "notes", ())))
        shown = self.plan
        if shown is not None and not _same_plan(shown, res.best):
            status += (f"; showing #{self._candidate.value} {shown.label}, "
                       f"{_ms(shown.predicted.step_time)}, picked during the search: not the best")
        self._status.value = status
        self._refresh_snapshot()

    def _apply_result(self, res: Any, key: tuple, context: tuple[str, str, str], *,
                      partial: bool = False) -> None:
        with self._lock:
            same_search = key == self._state.search_key_now
            keep = self.plan if same_search else None
            if not same_search:
                before = self.plan
                self._state.reference, self._state.reference_note = None, ""
                if before is not None and context[:2] == self._state.context[:2] and not before.label.startswith("what-if"):
                    self._state.reference = before
                    self._state.reference_note = "the previous answer (before the settings changed)"
                self._state.whatif, self._state.pins, self._state.pin_target = [], [], None
            where = self._state.cluster_names.get(context[2], context[2])
            if (self.last_launch is not None and self.last_launch.context != context):
                self._clear_launch(f"no launch yet for {context[0]} on {where}")
            elif self.last_launch is None and context != self._state.context:
                self._launch_status.value = f"no launch yet for {context[0]} on {where}"
            self._state.search_key_now = key
            self._state.context = context
            self.result = res
            self._state.generation += 1
            self._refresh_candidates()
            plans = self.plans
            best = next((k for k, p in enumerate(plans) if p is res.best),
                        next((k for k, p in enumerate(plans) if _same_plan(p, res.best)), 0))
            index = best
            # a candidate the user picked while this search ran stays selected; anything else
            # (the partial result's best, the plan of an earlier search) gives way to the best
            if keep is not None and same_search and self._state.picked is not None:
                index = next((k for k, p in enumerate(plans) if _same_plan(p, self._state.picked)),
                             best)
            if partial:
                self._status.value = (f"{len(res.plans)} intra-operator plans so far; searching "
                                      "pipeline plans and baselines")
        self._select(index, picked=False)



def _same_plan(a: Plan, b: Plan) -> bool:
    """The same plan found again (a later result of one search: equal up to its timings)."""
    return (a.label, a.describe(), a.predicted.step_time, a.predicted.memory_per_device) == (
        b.label, b.describe(), b.predicted.step_time, b.predicted.memory_per_device)
