"""autoplan.viz: figures and a static HTML report that read a :class:`autoplan.Plan`.

Every figure is a ``plotly.graph_objects.Figure`` with deterministic colours: a device has the
same colour everywhere (:func:`device_color`), and so does a stage and a mined class. ``viz``
only reads plans: the figure and report modules import neither ``autoplan.search`` nor
``autoplan.exec``. The :class:`Explorer` widget is the one place that drives both (a search when
its controls change, a launch from its Launch button); it reaches them through ``autoplan`` at
call time.
"""

from autoplan.viz._graph_figure import graph_figure as graph_figure
from autoplan.viz._timeline import memory_breakdown as memory_breakdown
from autoplan.viz._timeline import memory_figure as memory_figure
from autoplan.viz._timeline import stage_figure as stage_figure
from autoplan.viz._timeline import timeline_events as timeline_events
from autoplan.viz._timeline import timeline_figure as timeline_figure

from ._compare import compare_figure as compare_figure
from ._compare import pareto_front as pareto_front
from ._explorer import Explorer as Explorer
from ._notebook import set_notebook_renderer as set_notebook_renderer
from ._report import report_html as report_html
from ._sharding import op_layers as op_layers
from ._sharding import sharding_figure as sharding_figure
from ._sharding import tile_color as tile_color
from ._sharding import tile_devices as tile_devices
from ._sharding import tile_grid as tile_grid
from ._style import GREYS as GREYS
from ._style import REPLICATED_COLOR as REPLICATED_COLOR
from ._style import class_color as class_color
from ._style import device_color as device_color
from ._style import mesh_color as mesh_color
from ._style import stage_color as stage_color

__all__ = [
    "Explorer",
    "sharding_figure",
    "stage_figure",
    "timeline_figure",
    "memory_figure",
    "memory_breakdown",
    "compare_figure",
    "graph_figure",
    "report_html",
    "set_notebook_renderer",
    "tile_devices",
    "tile_grid",
    "tile_color",
    "op_layers",
    "mesh_color",
    "timeline_events",
    "pareto_front",
    "device_color",
    "stage_color",
    "class_color",
    "REPLICATED_COLOR",
    "GREYS",
]
