"""One place that runs the ILPs: HiGHS (through highspy) first, CBC as the fallback.

Models come either as PuLP problems (:func:`solve`) or in matrix form (:class:`MatrixModel`,
:func:`solve_matrix`: passed to HiGHS in one call, the fast path for the intra-op ILPs).

A time limit never loses work: when the solver stops at the limit with a feasible incumbent, that
incumbent is returned and a :class:`SolverTimeoutWarning` is issued.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pulp

from autoplan._errors import SolverError

__all__ = ["SolveResult", "SolverTimeoutWarning", "solve", "available_solvers", "MatrixModel",
           "MatrixSolution", "solve_matrix", "AssignmentSolution", "solve_assignment"]


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
        new_highs()  # the process's first instance, made without its banner
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
        raise SolverError("solve: an ILP solver should be installed. Got none of HiGHS and PuLP's CBC. "
                          "Fix: pip install highspy (or pulp with its bundled CBC).")
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
    raise SolverError(f"solve: an ILP solver should solve the model. Got a failure from each of "
                      f"{names}: {last_err}. Fix: reinstall highspy, or pass another solver.")


class MatrixModel:
    """A linear model in matrix form: min ``c @ x + offset`` subject to ``lo <= A @ x <= hi``.

    Columns and rows are added in blocks of numpy arrays, so building a model of a hundred
    thousand variables costs a few numpy calls rather than one Python object per variable (the
    intra-op ILPs are solved hundreds of times during a pipeline search). :func:`solve_matrix`
    passes it to HiGHS in one call, or converts it to PuLP for CBC when highspy is missing.
    """

    def __init__(self) -> None:
        self._cost: list[np.ndarray] = []
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._rlo: list[np.ndarray] = []
        self._rhi: list[np.ndarray] = []
        self.num_cols = 0
        self.num_rows = 0
        self.offset = 0.0

    def add_cols(self, cost: np.ndarray | Sequence[float], lb: float = 0.0, ub: float = 1.0,
                 integer: bool = False) -> np.ndarray:
        """Add ``len(cost)`` columns with bounds ``[lb, ub]``; returns their indices."""
        cost = np.asarray(cost, dtype=np.float64).ravel()
        n = len(cost)
        self._cost.append(cost)
        self._lb.append(np.full(n, lb, dtype=np.float64))
        self._ub.append(np.full(n, ub, dtype=np.float64))
        self._int.append(np.full(n, 1 if integer else 0, dtype=np.int32))
        idx = np.arange(self.num_cols, self.num_cols + n)
        self.num_cols += n
        return idx

    def add_rows(self, row: np.ndarray, col: np.ndarray, val: np.ndarray | float,
                 lo: np.ndarray | float, hi: np.ndarray | float, count: int) -> np.ndarray:
        """Add ``count`` rows given as triplets: ``row`` (0..count-1, local), ``col``, ``val``."""
        row = np.asarray(row, dtype=np.int64)
        col = np.asarray(col, dtype=np.int64)
        self._rows.append(row + self.num_rows)
        self._cols.append(col)
        self._vals.append(np.broadcast_to(np.asarray(val, dtype=np.float64), row.shape).copy())
        self._rlo.append(np.broadcast_to(np.asarray(lo, dtype=np.float64), (count,)).copy())
        self._rhi.append(np.broadcast_to(np.asarray(hi, dtype=np.float64), (count,)).copy())
        idx = np.arange(self.num_rows, self.num_rows + count)
        self.num_rows += count
        return idx

    def arrays(self) -> dict[str, np.ndarray]:
        """The model as CSR arrays (``start`` has ``num_rows + 1`` entries)."""
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
        rows, cols, vals = cat(self._rows, np.int64), cat(self._cols, np.int32), cat(self._vals, np.float64)
        order = np.argsort(rows, kind="stable")
        start = np.zeros(self.num_rows + 1, dtype=np.int64)
        np.add.at(start, rows + 1, 1)
        return dict(cost=cat(self._cost, np.float64), lb=cat(self._lb, np.float64),
                    ub=cat(self._ub, np.float64), integrality=cat(self._int, np.int32),
                    row_lo=cat(self._rlo, np.float64), row_hi=cat(self._rhi, np.float64),
                    start=np.cumsum(start).astype(np.int32), index=cols[order],
                    value=vals[order])


@dataclass(frozen=True)
class MatrixSolution:
    """Outcome of :func:`solve_matrix`: a :class:`SolveResult` plus the column values."""

    result: SolveResult
    x: np.ndarray | None


def _highs_available() -> bool:
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


def solve_matrix(model: MatrixModel, time_limit: float | None = 60.0, relax: bool = False,
                 solver: str | None = None, msg: bool = False) -> MatrixSolution:
    """Solve a :class:`MatrixModel` (minimisation).

    Args:
        model: the model.
        time_limit: seconds; at the limit a feasible incumbent is returned with a
            :class:`SolverTimeoutWarning`.
        relax: drop integrality (solve the LP relaxation).
        solver: ``"HiGHS"`` (direct, through highspy) or ``"PULP_CBC_CMD"``; default HiGHS when
            highspy is installed, else CBC.
        msg: show the solver's log.
    """
    name = solver or ("HiGHS" if _highs_available() else "PULP_CBC_CMD")
    if name == "HiGHS":
        return _solve_highs(model, time_limit, relax, msg)
    return _solve_via_pulp(model, time_limit, relax, name, msg)


def _timeout_warning(name: str, time_limit: float | None) -> None:
    warnings.warn(
        f"ILP solver {name} stopped at its time limit ({time_limit} s) before proving "
        "optimality; the best plan found so far is used. Fix: raise time_limit for a "
        "better plan.", SolverTimeoutWarning, stacklevel=3)


_BANNER_LOCK = threading.Lock()
_BANNER_DONE = False


def new_highs():
    """A ``highspy.Highs`` instance. HiGHS writes its copyright banner to the process's standard
    output (file descriptor 1) when the first instance of a process is made, whatever its
    options; that one construction runs with descriptor 1 pointed at ``os.devnull``, so a user's
    output (the CLI's tables, a notebook's cells) never carries it."""
    global _BANNER_DONE
    import highspy  # noqa: PLC0415

    if _BANNER_DONE:
        return highspy.Highs()
    with _BANNER_LOCK:
        if _BANNER_DONE:
            return highspy.Highs()
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _BANNER_DONE = True
        return h


def _highs(model: MatrixModel, arrays: dict[str, np.ndarray], *, integer: bool,
           time_limit: float | None, msg: bool = False):
    """A ``highspy.Highs`` holding ``model`` (rowwise, minimisation), its LP relaxation unless
    ``integer``."""
    import highspy

    h = new_highs()
    h.setOptionValue("output_flag", bool(msg))
    if time_limit is not None:
        h.setOptionValue("time_limit", float(max(time_limit, 1e-3)))
    a = arrays
    ig = a["integrality"] if integer else np.zeros_like(a["integrality"])
    st = h.passModel(model.num_cols, model.num_rows, len(a["index"]), 2, 1, float(model.offset),
                     a["cost"], a["lb"], a["ub"], a["row_lo"], a["row_hi"], a["start"][:-1],
                     a["index"], a["value"], ig)
    if st == highspy.HighsStatus.kError:
        raise SolverError(f"HiGHS refused the model ({model.num_cols} columns, "
                          f"{model.num_rows} rows). Fix: reinstall highspy.")
    return h


def _solve_highs(model: MatrixModel, time_limit: float | None, relax: bool,
                 msg: bool) -> MatrixSolution:
    import highspy

    t0 = time.perf_counter()
    h = _highs(model, model.arrays(), integer=not relax, time_limit=time_limit, msg=msg)
    h.run()
    dt = time.perf_counter() - t0
    status = h.getModelStatus()
    S = highspy.HighsModelStatus
    if status == S.kOptimal:
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
        return MatrixSolution(SolveResult("optimal", float(h.getInfo().objective_function_value),
                                          "HiGHS", dt), x)
    if status in (S.kInfeasible, S.kUnboundedOrInfeasible):
        return MatrixSolution(SolveResult("infeasible", None, "HiGHS", dt), None)
    if h.getInfo().primal_solution_status == 2:  # a feasible incumbent at the limit
        _timeout_warning("HiGHS", time_limit)
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
        return MatrixSolution(SolveResult("feasible", float(h.getInfo().objective_function_value),
                                          "HiGHS", dt), x)
    return MatrixSolution(SolveResult("infeasible", None, "HiGHS", dt), None)


def _solve_via_pulp(model: MatrixModel, time_limit: float | None, relax: bool, name: str,
                    msg: bool) -> MatrixSolution:
    a = model.arrays()
    lp = pulp.LpProblem("autoplan", pulp.LpMinimize)
    new_var = getattr(lp, "add_variable", None) or pulp.LpVariable  # PuLP >= 3.3, or before
    xs = [new_var(f"x{i}", float(lo), float(hi),
                  cat=pulp.LpInteger if (ig and not relax) else pulp.LpContinuous)
          for i, (lo, hi, ig) in enumerate(zip(a["lb"], a["ub"], a["integrality"]))]
    for r in range(model.num_rows):
        s, e = a["start"][r], a["start"][r + 1]
        expr = pulp.LpAffineExpression([(xs[j], float(v)) for j, v in
                                        zip(a["index"][s:e], a["value"][s:e])])
        lo, hi = float(a["row_lo"][r]), float(a["row_hi"][r])
        if lo == hi:
            lp.addConstraint(expr == lo, f"r{r}")
        else:
            if np.isfinite(lo):
                lp.addConstraint(expr >= lo, f"l{r}")
            if np.isfinite(hi):
                lp.addConstraint(expr <= hi, f"u{r}")
    lp.setObjective(pulp.LpAffineExpression([(x, float(c)) for x, c in zip(xs, a["cost"]) if c],
                                            constant=model.offset))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = solve(lp, time_limit, name, msg)
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=3)
    if res.status == "infeasible":
        return MatrixSolution(res, None)
    return MatrixSolution(res, np.array([x.varValue or 0.0 for x in xs], dtype=np.float64))


@dataclass(frozen=True)
class AssignmentSolution:
    """Outcome of :func:`solve_assignment`.

    Attributes:
        result: status (``"optimal"`` means within ``mip_gap`` of the LP bound or proven by the
            MIP), objective, solver, seconds.
        x: column values (None when infeasible).
        bound: a lower bound on the optimum (the LP relaxation's or the MIP's dual bound).
        gap: ``(objective - bound) / |objective|``, 0 when the LP optimum is integral.
        dives: LP re-solves spent diving.
        mip: whether the MIP was run.
    """

    result: SolveResult
    x: np.ndarray | None
    bound: float | None
    gap: float | None
    dives: int = 0
    mip: bool = False


class _Groups:
    """The one-hot groups as flat arrays, for vectorised tests over all of them."""

    def __init__(self, groups: Sequence[np.ndarray]):
        self.groups = [np.asarray(g, dtype=np.int64) for g in groups if len(g)]
        sizes = np.array([len(g) for g in self.groups], dtype=np.int64)
        self.cols = np.concatenate(self.groups) if self.groups else np.zeros(0, np.int64)
        self.gid = np.repeat(np.arange(len(self.groups)), sizes)
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    def most_decided_fractional(self, x: np.ndarray, tol: float = 1e-6) -> int | None:
        """The column to fix next: the largest value of the fractional group whose largest value
        is largest; None when every group is integral."""
        if not self.groups:
            return None
        v = x[self.cols]
        frac = (v > tol) & (v < 1 - tol)
        if not frac.any():
            return None
        gmax = np.maximum.reduceat(v, self.starts)
        fg = np.zeros(len(self.groups), dtype=bool)
        fg[self.gid[frac]] = True
        best = int(np.flatnonzero(fg)[np.argmax(gmax[fg])])
        g = self.groups[best]
        return int(g[int(np.argmax(x[g]))])


def _objective(cost: np.ndarray, x: np.ndarray, offset: float) -> float:
    """``cost @ x + offset``, summed by numpy rather than BLAS: a BLAS dot product of this length
    wakes OpenBLAS's thread pool, whose threads then spin for a while on every core, taking it
    from the search's other worker processes."""
    return float(np.multiply(cost, x).sum()) + float(offset)


def _rel_gap(objective: float, bound: float) -> float:
    """``(objective - bound) / |objective|``: how far above the bound a solution may be."""
    return (objective - bound) / max(abs(objective), 1e-300)


def _run_mip(model: MatrixModel, a: dict[str, Any], incumbent: tuple[float, np.ndarray] | None,
             limit: float | None, mip_gap: float, left: Callable[[], float | None]):
    """HiGHS's branch-and-cut on the model within ``limit`` seconds and ``mip_gap``, started from
    ``incumbent`` (the dive's solution) when there is one: ``(the solver, its model status, its
    info, whether it holds a primal solution)``."""
    import highspy

    S = highspy.HighsModelStatus

    def run(start: tuple[float, np.ndarray] | None, seconds: float | None):
        m = _highs(model, a, integer=True, time_limit=seconds)
        m.setOptionValue("mip_rel_gap", float(mip_gap))
        # without presolve: on these one-hot assignment models HiGHS's MIP presolve and the
        # restarts it triggers took most of the MIP's time (a Wide-ResNet 4B step's exhaustive
        # ILP 36 s against 12 s; MoE layers' Lagrangian solves 6-10 s, some stopped at the time
        # limit, against 0.3-0.7 s), each result within its gap
        m.setOptionValue("presolve", "off")
        if start is not None:
            sol = highspy.HighsSolution()
            sol.col_value = start[1].tolist()
            sol.value_valid = True
            m.setSolution(sol)
        m.run()
        info = m.getInfo()
        return m, m.getModelStatus(), info, info.primal_solution_status == 2

    m, ms, info, has = run(incumbent, limit)
    if incumbent is not None and (ms == S.kOptimal or has):
        # HiGHS started from a given solution can hand back that solution's columns with the
        # objective value of a better one it found: then solve again without the start
        x = np.asarray(m.getSolution().col_value, dtype=np.float64)
        if abs(_objective(a["cost"], x, model.offset) - float(info.objective_function_value)) \
                > 1e-9 * max(1.0, abs(float(info.objective_function_value))):
            m, ms, info, has = run(None, left())
    return m, ms, info, has


def solve_assignment(model: MatrixModel, groups: Sequence[np.ndarray], *,
                     time_limit: float | None = 60.0, mip_gap: float = 1e-6,
                     max_dives: int = 64, relax_first: bool = True) -> AssignmentSolution:
    """Solve an assignment ILP: each group of columns (binaries with a one-hot row) picks one.

    The intra-op ILPs are nearly always integral or nearly so in their LP relaxation, so:

    1. solve the LP relaxation (its optimum is a lower bound); if integral, it is optimal;
    2. otherwise *dive*: fix the most decided fractional group to its largest column and
       re-solve the LP (warm-started), until integral or ``max_dives``; ties between symmetric
       strategies (the ``x`` and ``y`` axes of a square mesh) break after a dive or two;
    3. accept the dive's solution when within ``mip_gap`` (relative) of the LP bound; otherwise
       run the MIP (HiGHS branch-and-cut) from the dive's solution with that gap.

    With ``relax_first=False`` the MIP is run directly. Without highspy the model goes to CBC
    through PuLP as a plain MIP.
    """
    t0 = time.perf_counter()
    if not _highs_available():
        res = solve_matrix(model, time_limit=time_limit, solver="PULP_CBC_CMD")
        return AssignmentSolution(res.result, res.x, res.result.objective, 0.0, mip=True)
    import highspy

    S = highspy.HighsModelStatus
    a = model.arrays()

    def left() -> float | None:
        return None if time_limit is None else time_limit - (time.perf_counter() - t0)

    status = S.kNotset
    if relax_first:
        h = _highs(model, a, integer=False, time_limit=time_limit)
        # HiGHS's presolve costs more than it saves on these LPs (about 3x the simplex time on a
        # transformer layer's): the relaxation and the dives run without it, and so does the
        # MIP (_run_mip)
        h.setOptionValue("presolve", "off")
        h.run()
        status = h.getModelStatus()
    if status in (S.kInfeasible, S.kUnboundedOrInfeasible):
        return AssignmentSolution(SolveResult("infeasible", None, "HiGHS", time.perf_counter() - t0),
                                  None, None, None)
    incumbent: tuple[float, np.ndarray] | None = None
    bound: float | None = None
    dives = 0
    if status == S.kOptimal:
        bound = float(h.getInfo().objective_function_value)
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
        flat = _Groups(groups)
        col = flat.most_decided_fractional(x)
        while col is not None and dives < max_dives and (left() is None or left() > 0):
            dives += 1
            h.changeColBounds(col, 1.0, 1.0)
            h.run()
            if h.getModelStatus() != S.kOptimal:  # infeasible (memory): forbid it instead
                h.changeColBounds(col, 0.0, 0.0)
                h.run()
                if h.getModelStatus() != S.kOptimal:
                    break
            x = np.asarray(h.getSolution().col_value, dtype=np.float64)
            col = flat.most_decided_fractional(x)
        if col is None:
            # the objective of the dive's integral point, from its columns: after a dive that
            # forbade a column HiGHS can report the previous solve's objective value
            incumbent = (_objective(a["cost"], x, model.offset), x)
            gap = _rel_gap(incumbent[0], bound)
            if gap <= mip_gap:
                return AssignmentSolution(
                    SolveResult("optimal", incumbent[0], "HiGHS", time.perf_counter() - t0),
                    incumbent[1], bound, max(gap, 0.0), dives)
    # the MIP, started from the dive's solution
    limit = left()
    if limit is not None and limit <= 0:
        if incumbent is None:
            return AssignmentSolution(SolveResult("infeasible", None, "HiGHS",
                                                  time.perf_counter() - t0), None, bound, None, dives)
        _timeout_warning("HiGHS", time_limit)
        return AssignmentSolution(SolveResult("feasible", incumbent[0], "HiGHS",
                                              time.perf_counter() - t0), incumbent[1], bound,
                                  _rel_gap(incumbent[0], bound) if bound is not None else None,
                                  dives)
    m, ms, info, has = _run_mip(model, a, incumbent, limit, mip_gap, left)
    dt = time.perf_counter() - t0
    if ms == S.kOptimal or has:
        x = np.asarray(m.getSolution().col_value, dtype=np.float64)
        obj = _objective(a["cost"], x, model.offset)
        if incumbent is not None and incumbent[0] < obj:
            obj, x = incumbent
        mb = float(info.mip_dual_bound)
        gap = _rel_gap(obj, mb)
        if ms != S.kOptimal:
            _timeout_warning("HiGHS", time_limit)
        return AssignmentSolution(SolveResult("optimal" if ms == S.kOptimal else "feasible", obj,
                                              "HiGHS", dt), x, mb, max(gap, 0.0), dives, True)
    if ms in (S.kInfeasible, S.kUnboundedOrInfeasible):
        return AssignmentSolution(SolveResult("infeasible", None, "HiGHS", dt), None, None, None,
                                  dives, True)
    if incumbent is not None:
        _timeout_warning("HiGHS", time_limit)
        return AssignmentSolution(SolveResult("feasible", incumbent[0], "HiGHS", dt), incumbent[1],
                                  bound, None, dives, True)
    return AssignmentSolution(SolveResult("infeasible", None, "HiGHS", dt), None, bound, None,
                              dives, True)
