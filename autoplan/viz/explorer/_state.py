"""What the explorer holds besides its widgets (:class:`ExplorerState`), the record of a
launch (:class:`LaunchRecord`), and the text helpers of its status lines and budget box."""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from autoplan._errors import SearchError
from autoplan.costs._cluster import Cluster
from autoplan.plans._plan import Plan
from autoplan.plans._spec import Spec
from autoplan.viz._style import fmt_sig


@dataclass(eq=False)
class Pin:
    """One what-if pin: input ``name`` fixed to ``spec`` on the mesh of ``before``, whose re-solve
    made ``plan`` in ``seconds``. A pin of a what-if plan keeps the pins made on the way to it
    (see ``WhatIfPanel._chain_has``)."""

    name: str
    spec: Spec
    before: Plan
    plan: Plan
    seconds: float


@dataclass(eq=False)
class ExplorerState:
    """What an explorer holds besides its widgets. The candidates offered, the selected index
    and the layer or stage in focus are the values of their pickers (the page changes them);
    everything else the explorer knows is here.

    Attributes:
        models: the zoo's ``{model: sizes}`` (the model box's options).
        workload: the workload being planned (None: built from the model box at the next
            search); custom_cluster: a cluster passed in (or this machine's, once measured)
            that no preset names, else None.
        result: the last ``SearchResult`` shown; plan: the selected plan.
        memo: every result of this explorer, keyed by workload, cluster and options (a search
            repeated with the same settings shows it at once); search_key_now: the key of the
            result shown; context: its ``(model, size, cluster spec)``; cluster_names: cluster
            spec -> its name with its devices; generation: how many results were shown (a
            what-if started before a newer result drops its plan).
        picked: the plan the user selected since the search began (stays selected when the
            search ends).
        reference, reference_note: the plan the comparison sets the selected one against (the
            previous answer, before the settings changed) and the words for it.
        whatif: the plans made by what-if pins, after the result's; pins: the undo stack, one
            :class:`Pin` per pin in order; pin_target: the graph input the next pin fixes.
        base: each figure of the selected plan without highlighting (JSON); op_layer,
            stage_of_op: the selected plan's operator -> layer and operator -> stage.
        last_launch: the last :class:`LaunchRecord`.
    """

    models: dict[str, list[str]]
    workload: Any = None
    custom_cluster: Cluster | None = None
    result: Any = None
    plan: Plan | None = None
    memo: dict[tuple, Any] = field(default_factory=dict)
    search_key_now: tuple | None = None
    context: tuple[str, str, str] = ("", "", "")
    cluster_names: dict[str, str] = field(default_factory=dict)
    generation: int = 0
    picked: Plan | None = None
    reference: Plan | None = None
    reference_note: str = ""
    whatif: list[Plan] = field(default_factory=list)
    pins: list[Pin] = field(default_factory=list)
    pin_target: str | None = None
    base: dict[str, dict[str, Any]] = field(default_factory=dict)
    op_layer: dict[int, str] = field(default_factory=dict)
    stage_of_op: dict[int, int] = field(default_factory=dict)
    last_launch: LaunchRecord | None = None


@dataclass
class LaunchRecord:
    """One launch of a plan from the explorer (``Explorer.last_launch``).

    Attributes:
        plan: the plan launched; ``spec`` the workload spec given to ``autoplan.exec.launch``.
        num_processes, devices_per_process, steps: how it ran (0 devices until the launcher has
            chosen the layout); ``layout`` says it in words (platform included).
        context: ``(model, size, cluster)`` of the search the plan came from.
        handle: the ``LaunchHandle`` (None until the launch has started).
        events: every event polled from the handle, in order.
        result: the ``LaunchResult`` (None until finished).
        error: an error message when the launch failed, else None.
        started, finished: ``time.time()`` stamps (``finished`` None while running).
    """

    plan: Plan
    spec: dict[str, Any]
    num_processes: int
    devices_per_process: int
    steps: int
    context: tuple[str, str, str] = ("", "", "")
    layout: str = ""
    handle: Any = None
    events: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    error: str | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None

    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def step_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "step"]

    @property
    def losses(self) -> list[float]:
        """The loss of each step (process 0's; every process computes the same)."""
        if self.result is not None:
            return [float(x) for x in self.result.loss]
        by_step: dict[int, tuple[int, float]] = {}
        for e in self.step_events:
            if e.get("loss") is None:
                continue
            s, p = int(e["step"]), int(e.get("process", 0))
            if s not in by_step or p < by_step[s][0]:
                by_step[s] = (p, float(e["loss"]))
        return [by_step[s][1] for s in sorted(by_step)]

    @property
    def step_times(self) -> list[float]:
        """The time of each step: the slowest process's."""
        if self.result is not None and self.result.step_times:
            per = list(self.result.step_times.values())
            return [max(p[k] for p in per if k < len(p)) for k in range(max(map(len, per)))]
        by_step: dict[int, float] = {}
        for e in self.step_events:
            if e.get("step_time") is None:
                continue
            s = int(e["step"])
            by_step[s] = max(by_step.get(s, 0.0), float(e["step_time"]))
        return [by_step[s] for s in sorted(by_step)]

    @property
    def measured_step_time(self) -> float | None:
        """The median step time after the first step (which includes compilation)."""
        times = self.step_times
        if not times:
            return None
        return statistics.median(times[1:] if len(times) > 1 else times)

    @property
    def final_loss(self) -> float | None:
        losses = self.losses
        return losses[-1] if losses else None

    @property
    def matched(self) -> bool | None:
        """Whether every process matched single-device execution (None when not known)."""
        if self.result is not None:
            return self.result.matched
        flags = [e.get("matched") for e in self.events if e.get("event") == "done"]
        flags = [f for f in flags if isinstance(f, bool)]
        return all(flags) if flags else None

    def __repr__(self) -> str:
        state = "error" if self.error else ("done" if self.done else "running")
        return (f"LaunchRecord({self.plan.label!r}, {self.num_processes}x{self.devices_per_process} "
                f"devices, {state}, {len(self.step_events)} step events)")


_BYTE_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
               "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}


def parse_budget(text: Any) -> float | None:
    """The memory budget box's text in bytes: ``"8 GiB"``, ``"512 MiB"``, ``"1.5e9 B"``, a bare
    number of GiB; None (the device's memory) for ``""`` or 0.

    Raises:
        SearchError: anything else, or a negative amount.
    """
    raw = str(text if text is not None else "").strip()
    m = re.fullmatch(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)", raw)
    unit = (m.group(2).lower() or "gib") if m else None
    if raw and (m is None or unit not in _BYTE_UNITS or float(m.group(1)) < 0
                or not math.isfinite(float(m.group(1)))):
        raise SearchError(f"Explorer: the memory budget should be an amount of memory such as "
                          f"'8 GiB' or '512 MiB' (a bare number is GiB), or empty for the "
                          f"device's memory. Got {raw!r}. Fix: e.g. 8 GiB.")
    v = float(m.group(1)) * _BYTE_UNITS[unit] if raw else 0.0
    return v if v > 0 else None


def fmt_budget(nbytes: float | None) -> str:
    """A memory budget in the unit its size calls for, at most 3 significant digits
    (``"20 KiB"``, ``"8 GiB"``); ``""`` for None (the device's memory)."""
    if not nbytes:
        return ""
    unit, name = next(((2.0 ** p, n) for p, n in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB"))
                       if nbytes >= 2.0 ** p), (1.0, "B"))
    return f"{fmt_sig(nbytes / unit)} {name}"


def cluster_text(cl: Cluster) -> str:
    """A cluster as the page names it, with its device count: ``cpu:8 (8 devices)``, ``local
    (8 devices, measured)``, ``p3.16xlarge:2 (16 devices)``."""
    n = cl.num_devices
    if cl.name == "local":
        return f"this machine ({n} device{'s' if n != 1 else ''}, measured)"
    return f"{cl.spec} ({n} device{'s' if n != 1 else ''})"


def short_error(text: str, limit: int = 240) -> str:
    """An error message cut to about ``limit`` characters for a status line, keeping its
    ``Fix:`` (and what follows it) whole."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text.find("Fix:")
    if cut < 0:
        return text[:limit - 1] + "\u2026"
    fix = text[cut:]
    head = max(60, limit - len(fix) - 3)
    return (text[:head].rstrip() + " \u2026 " + fix) if head < cut else text


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"


def _loss(v: Any) -> str:
    return "-" if v is None else f"{float(v):.6f}"


def _is_graph(obj: Any) -> bool:
    from autoplan.tracing._graph import OpGraph  # noqa: PLC0415

    return isinstance(obj, OpGraph)
