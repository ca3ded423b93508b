"""One place that runs PuLP models: HiGHS (through highspy) first, CBC as the fallback.

A time limit never loses work: when the solver stops at the limit with a feasible incumbent, that
incumbent is returned and a :class:`SolverTimeoutWarning` is issued.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import pulp

__all__ = ["SolveResult", "SolverTimeoutWarning", "solve", "available_solvers"]


class SolverTimeoutWarning(UserWarning):
    """The ILP solver hit its time limit; the best plan found so far is used."""


@dataclass(frozen=True)
class SolveResult:
    """Outcome of :func:`solve`.

    Attributes:
        status: ``"optimal"``, ``"feasible"`` (time limit hit with an incumbent), or ``"infeasible"``.
        objective: objective value of the returned assignment (None when infeasible).
        solver: the solver's name.
        seconds: wall-clock solve time.
    """

    status: str
    objective: float | None
    solver: str
    seconds: float


def available_solvers() -> list[str]:
    return [s for s in ("HiGHS", "PULP_CBC_CMD") if s in pulp.listSolvers(onlyAvailable=True)]


def _make(name: str, time_limit: float | None, msg: bool):
    if name == "HiGHS":
        kw = {"msg": msg}
        if time_limit is not None:
            kw["timeLimit"] = float(time_limit)
        return pulp.HiGHS(**kw)
    kw = {"msg": msg}
    if time_limit is not None:
        kw["timeLimit"] = max(1, int(round(time_limit)))
    return pulp.PULP_CBC_CMD(**kw)


def _has_incumbent(prob: pulp.LpProblem) -> bool:
    vs = prob.variables()
    return bool(vs) and all(v.varValue is not None for v in vs)


def solve(prob: pulp.LpProblem, time_limit: float | None = 60.0, solver: str | None = None,
          msg: bool = False) -> SolveResult:
    """Solve ``prob`` in place.

    Args:
        prob: a PuLP problem (minimisation).
        time_limit: seconds; at the limit the incumbent is kept and a warning issued.
        solver: ``"HiGHS"`` or ``"PULP_CBC_CMD"``; default the first available of the two.
        msg: show the solver's log.

    Returns:
        A :class:`SolveResult`; variable values are read with ``var.varValue``.
    """
    names = [solver] if solver else available_solvers()
    if not names:
        raise RuntimeError("no ILP solver available: pip install highspy (or pulp's bundled CBC)")
    last_err: Exception | None = None
    for name in names:
        t0 = time.perf_counter()
        try:
            prob.solve(_make(name, time_limit, msg))
        except Exception as err:  # a broken solver binary: try the next one
            last_err = err
            continue
        dt = time.perf_counter() - t0
        status = pulp.LpStatus[prob.status]
        if status == "Infeasible":
            return SolveResult("infeasible", None, name, dt)
        timed_out = time_limit is not None and dt >= 0.95 * time_limit
        if status == "Optimal" and not timed_out:
            return SolveResult("optimal", pulp.value(prob.objective), name, dt)
        if _has_incumbent(prob):
            warnings.warn(
                f"ILP solver {name} stopped at its time limit ({time_limit} s) before proving "
                "optimality; the best plan found so far is used. Fix: raise time_limit for a "
                "better plan.",
                SolverTimeoutWarning,
                stacklevel=2,
            )
            return SolveResult("feasible", pulp.value(prob.objective), name, dt)
        if status in ("Not Solved", "Undefined") and timed_out:
            return SolveResult("infeasible", None, name, dt)
        return SolveResult("infeasible", None, name, dt)
    raise RuntimeError(f"every ILP solver failed: {last_err}")
