"""The options of a search as one frozen, validated record: :class:`SearchOptions`.

:func:`autoplan.search` builds one from its keywords (or takes one, ``options=``), refuses bad
values before any work, and keys the plan cache on :meth:`SearchOptions.key`: a SHA-256 of the
options that change a result, the same in every process (Python's ``hash`` of a string is
randomised per process, so it is not used).
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from autoplan._errors import SearchError
from autoplan._options import check_memory_budget, check_mesh_shape
from autoplan.plans._frozen import FrozenDict
from autoplan.plans._plan import LEVELS

__all__ = ["SearchOptions", "NOT_IN_KEY"]

#: the options that change no result, left out of :meth:`SearchOptions.key`
NOT_IN_KEY = frozenset({"workers", "cache"})


def _check_pipeline_options(pipeline: bool | str, mesh_shape: Any, microbatches: Any, schedule: str,
                            num_layers: Any, stage_algorithm: str, submesh_hosts: str,
                            memory_levers: Any = True) -> None:
    """Refuse options that the chosen ``pipeline`` mode would ignore."""
    if pipeline is True and mesh_shape is not None:
        raise SearchError(
            f"search: mesh_shape={mesh_shape!r} sets the logical mesh of intra-operator plans, "
            "but pipeline=True makes pipeline plans only (each stage's mesh is searched), so it "
            "would be ignored. Fix: drop mesh_shape, or use pipeline=False (or 'auto').")
    if pipeline is False:
        given = [f"{k}={v!r}" for k, v, default in (
            ("microbatches", microbatches, None), ("schedule", schedule, "1f1b"),
            ("num_layers", num_layers, None), ("stage_algorithm", stage_algorithm, "auto"),
            ("submesh_hosts", submesh_hosts, "auto"), ("memory_levers", memory_levers, True))
            if v != default]
        if given:
            raise SearchError(
                f"search: {', '.join(given)} set{'s' if len(given) == 1 else ''} pipeline plans, but "
                "pipeline=False makes intra-operator plans only, so "
                f"{'it' if len(given) == 1 else 'they'} would be ignored. Fix: drop "
                f"{'it' if len(given) == 1 else 'them'}, or use pipeline=True (or 'auto').")


@dataclass(frozen=True, eq=True)
class SearchOptions:
    """What :func:`autoplan.search` searches, validated when made (see :func:`autoplan.search`
    for each option's meaning; the defaults are its defaults).

    ``SearchOptions(level="folded", mesh_shape=(2, 4))`` can be passed as
    ``autoplan.search(workload, cluster, options=...)`` and reused; :meth:`replace` makes a
    changed copy (validated again). ``mesh_shape`` is kept as a tuple of ints and ``pins`` as an
    immutable mapping. Equal options have equal :meth:`key` and hash.

    Raises:
        SearchError: a bad value, or options the chosen ``pipeline`` mode would ignore.
    """

    pipeline: bool | str = "auto"
    schedule: str = "1f1b"
    microbatches: int | str | None = None
    level: str = "auto"
    mesh_shape: tuple[int, ...] | None = None
    memory_budget: float | None = None
    pins: Mapping[Any, Any] | None = None
    time_limit: float | None = 60.0
    baselines: bool | str = True
    num_layers: int | None = None
    stage_algorithm: str = "auto"
    submesh_hosts: str = "auto"
    workers: int | None = None
    cache: bool = True
    allow_microbatching_mixed: bool = False
    memory_levers: bool = True

    def __post_init__(self) -> None:
        level, pipeline, schedule = self.level, self.pipeline, self.schedule
        microbatches = self.microbatches
        if level not in LEVELS:
            raise SearchError(f"search: level should be one of {LEVELS}. Got {level!r}. Fix: "
                              "level='auto' (default), 'exhaustive', 'hierarchical' or 'folded'.")
        if pipeline not in (True, False, "auto"):
            raise SearchError(f"search: pipeline should be True, False or 'auto'. Got "
                              f"{pipeline!r}.")
        from autoplan.plans._schedule import check_schedule_choice  # noqa: PLC0415
        from autoplan.search.pipeline._microbatches import check_microbatches  # noqa: PLC0415
        from autoplan.search.pipeline._pipeline import (  # noqa: PLC0415
            check_stage_algorithm,
            check_submesh_hosts,
        )

        check_schedule_choice(schedule)
        if self.baselines not in (True, False, "paper"):
            raise SearchError(f"search: baselines should be True, False or 'paper'. Got "
                              f"{self.baselines!r}. Fix: 'paper' adds Alpa's comparisons "
                              "(Megatron's TP x PP x DP grid, ZeRO-2, ZeRO-3, inter-op only).")
        check_submesh_hosts(self.submesh_hosts)
        check_microbatches(microbatches)
        _check_pipeline_options(pipeline, self.mesh_shape,
                                None if microbatches == "auto" else microbatches, schedule,
                                self.num_layers, self.stage_algorithm, self.submesh_hosts,
                                self.memory_levers)
        if not isinstance(self.memory_levers, bool):
            raise SearchError(f"search: memory_levers should be True or False. Got "
                              f"{self.memory_levers!r}. Fix: memory_levers=False searches "
                              "pipeline plans without ZeRO levels and rematerialisation.")
        check_memory_budget("search", self.memory_budget, SearchError)
        shape = check_mesh_shape("search", self.mesh_shape, SearchError)
        check_stage_algorithm(self.stage_algorithm)
        t = self.time_limit
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real)
                              or not math.isfinite(t) or t <= 0):
            raise SearchError(f"search: time_limit should be a positive number of seconds (per "
                              f"ILP). Got {t!r}. Fix: e.g. time_limit=60 (the default).")
        n = self.num_layers
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
            raise SearchError(f"search: num_layers should be a positive integer or None. Got "
                              f"{n!r}. Fix: e.g. num_layers=8, or None to group layers "
                              "automatically.")
        if self.pins is not None and not isinstance(self.pins, Mapping):
            raise SearchError(f"search: pins should be a dict {{regex over input names: "
                              f"PartitionSpec}}. Got {type(self.pins).__name__}: {self.pins!r:.40}. "
                              "Fix: e.g. pins={'^embed': PartitionSpec(None, 'y')}.")
        from autoplan.search._parallel import check_workers  # noqa: PLC0415

        if not isinstance(self.allow_microbatching_mixed, bool):
            raise SearchError(f"search: allow_microbatching_mixed should be True or False. Got "
                              f"{self.allow_microbatching_mixed!r}. Fix: "
                              "allow_microbatching_mixed=True to search micro-batched plans for a "
                              "loss that mixes examples.")
        check_workers(self.workers)
        if not isinstance(self.cache, bool):
            raise SearchError(f"search: cache should be True or False. Got {self.cache!r}. Fix: "
                              "cache=False to search without the plan cache.")
        object.__setattr__(self, "mesh_shape", shape)
        if self.pins is not None and not isinstance(self.pins, FrozenDict):
            object.__setattr__(self, "pins", FrozenDict(self.pins))

    def replace(self, **changes: Any) -> SearchOptions:
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every option by name (``pins`` as a plain dict)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if out["pins"] is not None:
            out["pins"] = dict(out["pins"])
        return out

    def key(self) -> str:
        """The SHA-256 (hex) of every option that changes a result (all but ``workers`` and
        ``cache``), each by its ``repr``: equal in every process for equal options."""
        text = json.dumps({f.name: repr(getattr(self, f.name)) for f in fields(self)
                           if f.name not in NOT_IN_KEY}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def __hash__(self) -> int:
        return int(self.key()[:16], 16)
