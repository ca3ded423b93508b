"""The interactive plan explorer's names where they were first imported from; the code lives in
the package :mod:`autoplan.viz.explorer`."""

from autoplan.plans._plan import LEVELS
from autoplan.viz._sharding import op_layers
from autoplan.viz._style import fmt_in_unit, time_unit
from autoplan.viz.explorer._explorer import Explorer
from autoplan.viz.explorer._focus import DIM, _cell_of, _device_at
from autoplan.viz.explorer._layout import _CSS, FIGURES, NO_SIZE
from autoplan.viz.explorer._state import (
    LaunchRecord,
    cluster_text,
    fmt_budget,
    parse_budget,
    short_error,
)

__all__ = ["Explorer", "LaunchRecord", "FIGURES", "LEVELS", "NO_SIZE", "DIM", "_CSS", "parse_budget",
           "fmt_budget", "cluster_text", "short_error", "time_unit", "fmt_in_unit", "op_layers",
           "_cell_of", "_device_at"]
