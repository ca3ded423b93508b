"""The exception hierarchy of autoplan.

Every error a user can cause derives from :class:`AutoplanError`. Messages follow one pattern:
what was wrong, the value received, and the fix ("X should ... Got ... . Fix: ...").
"""

from __future__ import annotations

__all__ = [
    "AutoplanError",
    "TraceError",
    "ClusterError",
    "ModelError",
    "SearchError",
    "InfeasiblePlanError",
    "PlanFileError",
    "PlanMismatchError",
    "OutputError",
    "ExecutionError",
    "EquivalenceError",
    "StepSignatureError",
    "NonFiniteError",
    "LaunchError",
    "ArgumentError",
    "ArgumentTypeError",
    "ArgumentIndexError",
    "StateError",
    "WaitTimeoutError",
    "SolverError",
    "ScheduleError",
]


class AutoplanError(Exception):
    """Base class of every error autoplan raises on bad input or an impossible request."""


class TraceError(AutoplanError):
    """The function or its arguments could not be traced into an operator graph."""


class ArgumentError(AutoplanError, ValueError):
    """An argument's value is not one the function accepts: an unknown option, a layer or
    segment that does not exist, a malformed mesh axis. Also a :class:`ValueError`."""


class ArgumentTypeError(AutoplanError, TypeError):
    """An argument is of a type the function does not take. Also a :class:`TypeError`."""


class ArgumentIndexError(ArgumentError, IndexError):
    """An index is out of range (a candidate number past the last plan). Also an
    :class:`IndexError`."""


class StateError(AutoplanError, RuntimeError):
    """An object was asked for something before the step it needs (the Explorer's selection
    before its search has a result). Also a :class:`RuntimeError`."""


class WaitTimeoutError(AutoplanError, TimeoutError):
    """Work still ran when a wait's timeout passed. Also a :class:`TimeoutError`."""


class ClusterError(AutoplanError):
    """A cluster description (preset name, node count, ``name:nodes`` string, mesh) is invalid."""


class ModelError(AutoplanError):
    """An unknown model name, size or configuration override."""


class SearchError(AutoplanError):
    """The plan search was given options it cannot honour."""


class SolverError(SearchError, RuntimeError):
    """No ILP solver is installed, or every installed solver failed on the model. Also a
    :class:`RuntimeError`."""


class InfeasiblePlanError(SearchError):
    """No plan fits the constraints (for example the per-device memory budget).

    Attributes:
        least_memory: the smallest per-device memory (bytes) with which a plan would fit, when known.
    """

    def __init__(self, message: str, least_memory: float | None = None):
        super().__init__(message)
        self.least_memory = least_memory


class PlanFileError(AutoplanError):
    """A plan file is malformed, of an unknown schema version, or unreadable.

    Attributes:
        field: the JSON path of the offending field (``"stages[1].mesh_shape"``), when one is to
            blame; ``None`` for a file that is unreadable, not UTF-8 or not JSON.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class PlanMismatchError(AutoplanError):
    """A plan was made for another model, argument structure, or device count."""


class OutputError(AutoplanError):
    """An output path cannot be written: a missing or read-only folder, a folder given as a file,
    the input file itself, or a write that failed (the file that was there is kept)."""


class ExecutionError(AutoplanError):
    """Running a plan failed."""


class StepSignatureError(ExecutionError):
    """A training step returns what no executor can run: a loss that is not a scalar, or new
    state whose structure does not mirror the step's arguments (see :mod:`autoplan.tracing._signature`)."""


class EquivalenceError(ExecutionError):
    """A plan's results differ from single-device execution beyond the tolerance."""


class NonFiniteError(ExecutionError):
    """A run's loss or gradients hold NaN or infinity. The message says whether one device
    computes the same (the model's numbers, not the plan's) or not (the plan's); pass
    ``allow_nonfinite=True`` (``--allow-nonfinite``) to keep such a run."""


class ScheduleError(SearchError, ExecutionError):
    """A pipeline schedule's kind, counts, times, table or task order is invalid. Both a
    :class:`SearchError` and an :class:`ExecutionError`: the search and the executor share the
    schedules (:mod:`autoplan.plans._schedule`)."""


class LaunchError(ExecutionError):
    """A multi-process launch failed; the message carries the workers' last output lines."""
