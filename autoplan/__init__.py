"""autoplan: an auto-parallel planner for JAX training steps.

trace -> search -> Plan -> (viz | exec):

    >>> import autoplan
    >>> wl = autoplan.models.get("mlp", size="tiny", batch=512)
    >>> graph = autoplan.trace(wl)
    >>> result = autoplan.search(wl, "cpu:8", pipeline=False)
    >>> result.best.describe()
    'intra-op on mesh 8x1'
    >>> result.best.partition_specs()[2]
    {'labels': P('x',), 'x': P('x',)}

``import autoplan`` loads no JAX, NumPy or NetworkX: the tracer, the graph and the subpackages
load on first use, so the command line starts at once (and a Ctrl-C during its start is handled
by the command line itself).

``autoplan.search`` is the search function; its algorithms (mining, segments, the ILP, the stage
DP, the schedules) are :mod:`autoplan.algorithms`, and its options can be kept as one
:class:`SearchOptions`.

Costs come from a cluster profile: a datasheet preset (``"p3.16xlarge:8"``, ``"cpu:8"``) or the
attached devices measured by ``autoplan.profile()`` (``Cluster.detect()`` caches it on disk).
"""

import sys as _sys
import types as _types
from typing import TYPE_CHECKING

from autoplan.costs._cluster import Cluster as Cluster
from autoplan.costs._mesh import LogicalMesh as LogicalMesh
from autoplan.plans._plan import Plan as Plan
from autoplan.plans._plan_check import PlanContradictionWarning as PlanContradictionWarning
from autoplan.plans._plan_check import PlatformWarning as PlatformWarning

from ._errors import ArgumentError as ArgumentError
from ._errors import ArgumentIndexError as ArgumentIndexError
from ._errors import ArgumentTypeError as ArgumentTypeError
from ._errors import AutoplanError as AutoplanError
from ._errors import ClusterError as ClusterError
from ._errors import EquivalenceError as EquivalenceError
from ._errors import ExecutionError as ExecutionError
from ._errors import InfeasiblePlanError as InfeasiblePlanError
from ._errors import LaunchError as LaunchError
from ._errors import ModelError as ModelError
from ._errors import NonFiniteError as NonFiniteError
from ._errors import OutputError as OutputError
from ._errors import PlanFileError as PlanFileError
from ._errors import PlanMismatchError as PlanMismatchError
from ._errors import SearchError as SearchError
from ._errors import SolverError as SolverError
from ._errors import StateError as StateError
from ._errors import StepSignatureError as StepSignatureError
from ._errors import TraceError as TraceError
from ._errors import WaitTimeoutError as WaitTimeoutError

if TYPE_CHECKING:  # loaded on first use, see _LAZY
    from autoplan.tracing._graph import GraphInput as GraphInput
    from autoplan.tracing._graph import OpGraph as OpGraph
    from autoplan.tracing._graph import OpNode as OpNode
    from autoplan.tracing._graph import Tensor as Tensor
    from autoplan.tracing._loader import load_workload as load_workload
    from autoplan.tracing._trace import OpaqueControlFlowWarning as OpaqueControlFlowWarning
    from autoplan.tracing._trace import trace as trace
    from autoplan.tracing._workload import Workload as Workload

    from .search._api import SearchResult as SearchResult
    from .search._api import plan as plan
    from .search._api import search as search
    from .search._search_options import SearchOptions as SearchOptions

__version__ = "0.1.0"

_LAZY = {"models": ("autoplan.models", None), "algorithms": ("autoplan.algorithms", None),
         "exec": ("autoplan.exec", None), "viz": ("autoplan.viz", None),
         "plan": ("autoplan.search._api", "plan"),
         "SearchResult": ("autoplan.search._api", "SearchResult"),
         "SearchOptions": ("autoplan.search._search_options", "SearchOptions"),
         "trace": ("autoplan.tracing._trace", "trace"),
         "OpaqueControlFlowWarning": ("autoplan.tracing._trace", "OpaqueControlFlowWarning"),
         "GraphInput": ("autoplan.tracing._graph", "GraphInput"), "OpGraph": ("autoplan.tracing._graph", "OpGraph"),
         "OpNode": ("autoplan.tracing._graph", "OpNode"), "Tensor": ("autoplan.tracing._graph", "Tensor"),
         "Workload": ("autoplan.tracing._workload", "Workload"),
         "load_workload": ("autoplan.tracing._loader", "load_workload"),
         "profile": ("autoplan.costs._cluster", "profile")}


def __getattr__(name: str):
    """``autoplan.plan``, ``autoplan.profile``, ``autoplan.models``, ``autoplan.algorithms``,
    ``autoplan.exec``, ``autoplan.viz``, ``autoplan.trace``, ``Workload``, ``SearchOptions`` and
    the graph classes load on first use (``autoplan.search`` too, see :class:`_Package`):
    ``import autoplan`` stays light, and importing ``autoplan.viz`` or ``autoplan.exec`` does not
    import the search."""
    if name in _LAZY:
        import importlib  # noqa: PLC0415

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autoplan' has no attribute {name!r}")


class _Package(_types.ModuleType):
    """The ``autoplan`` package, whose ``search`` is always the search function.

    The search's implementation is the private package ``autoplan/search/``, and importing a
    sub-module of it makes the import system bind the package as ``autoplan.search``: that
    binding is ignored here, so the name stays the function (loaded on first use). Setting
    another callable (a test's stand-in) replaces it until deleted or set back.
    """

    @property
    def search(self):  # noqa: D102 (the function's own docstring is what users read)
        own = self.__dict__.get("_search")
        if own is None:
            import importlib  # noqa: PLC0415

            own = self.__dict__["_search"] = importlib.import_module("autoplan.search._api").search
        return own

    @search.setter
    def search(self, value) -> None:
        if isinstance(value, _types.ModuleType):
            return  # the import system binding the implementation package: the name stays
        self.__dict__["_search"] = value

    @search.deleter
    def search(self) -> None:
        self.__dict__.pop("_search", None)


_sys.modules[__name__].__class__ = _Package

__all__ = [
    "models", "search", "algorithms", "SearchOptions", "exec", "viz", "Cluster", "LogicalMesh", "AutoplanError", "ClusterError",
    "EquivalenceError", "ExecutionError", "InfeasiblePlanError", "LaunchError", "ModelError", "NonFiniteError", "OutputError",
    "PlanFileError", "PlanMismatchError", "SearchError", "TraceError", "ArgumentError",
    "ArgumentTypeError", "ArgumentIndexError", "StateError", "StepSignatureError", "WaitTimeoutError", "SolverError", "GraphInput", "OpGraph",
    "OpNode", "Tensor", "Plan", "OpaqueControlFlowWarning", "trace", "SearchResult", "plan",
    "Workload", "load_workload", "profile", "PlanContradictionWarning", "PlatformWarning",
]
