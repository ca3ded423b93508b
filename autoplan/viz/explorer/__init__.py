"""The interactive plan explorer: search, inspect, question and launch plans from a notebook.

:class:`Explorer` is an ipywidgets layer over the static figures of :mod:`autoplan.viz`:

* controls for the workload (a zoo name and size, a user's ``module:function`` typed into the
  model box, or a workload object or traced graph passed in), the cluster (a preset and its node
  count), the search level (``auto`` by default), the pipeline schedule and micro-batches, and a
  per-device memory budget; **Search** runs ``autoplan.search`` in a background thread, shows the
  intra-operator candidates as soon as they are ranked (before the pipeline search ends), and
  keeps every result of the session, so a repeated search with the same settings is instant;
* a candidate selector over the ranked plans (equivalent plans, the same shardings up to swapping
  mesh axes, listed once), a full-width summary, and seven views: operator sharding (folded by
  layer class, with a drill-down into one layer), stages on the cluster, memory per device,
  the mined subgraphs (segments coloured by class, critical nodes, fold ratio, ILPs), the
  pipeline timeline, the comparison of all plans (against the previous answer or the plan
  before a what-if), and the launch;
* linked selection: clicking an operator, a device, a stage's memory bar, a timeline bar or a
  mined segment selects its layer or stage, and every view highlights it;
* what-if: clicking a tensor in the sharding view picks a graph input (the operator's weight for
  an activation), a spec from its candidates on the plan's mesh pins it, and a re-solve with
  ``search(..., pins=...)`` adds the new plan beside the old one, with the cost difference broken
  down; **undo** takes the last pin back;
* a code pane with ``plan.to_code()`` and a copy button;
* a Launch button that runs the selected plan with :func:`autoplan.exec.launch` on the devices
  attached, as ``autoplan launch`` does (platform and worker counts detected: one worker per
  GPU, or emulated CPU devices in 2 processes when no accelerator is attached; pipeline plans
  run their stages on their own submeshes across the processes), streams each step's loss and
  step time, and at the end shows the measured step time against the prediction and whether
  the run matched single-device results. The panel is cleared when the model, size or cluster
  changes.

Every figure is a :class:`~autoplan.viz._widget.PlotView`: its whole state is one synced trait,
so the views are right after the first search, after a page reload and in a reopened notebook
whose kernel still runs, and plotly.js is loaded once per page (never stored in the notebook).
Displaying the explorer also shows a static snapshot after the widget (:meth:`Explorer.static_html`:
the status, the candidates, the selected plan's summary and its figures' numbers), kept up to
date and hidden by the live widget, for a front end without the widget's kernel; the widget holds
the same snapshot in its state, shown where it is drawn from the state saved with the notebook
and no kernel holds it (JupyterLab with ``saveState``, see docs/explorer.md). Searches, redraws and
launches run in background threads, so the kernel stays free; every error is written into the
explorer's ``Output``. The explorer reaches ``autoplan.search`` and ``autoplan.exec`` only when
asked to (imports inside the methods), so importing :mod:`autoplan.viz` imports neither.

Example (in a notebook)::

    from autoplan.viz import Explorer
    ex = Explorer(model="gpt", size="tiny", cluster="cpu:8")   # starts the search
    ex                                                          # shows the widget
    ex.wait_idle(300); ex.select(1); ex.select_layer("layers_0"); ex.launch()

The package's modules: ``_explorer`` (the :class:`Explorer`: its arguments, wiring, display and
background threads), ``_layout`` (its widgets and page), ``_state`` (what it holds besides its
widgets, :class:`LaunchRecord`, the status lines' text helpers), and one module per panel, each
a class the Explorer is made of: ``_search`` (controls and search), ``_candidates`` (the ranked
plans and the selected plan's views), ``_focus`` (the linked selection and clicks), ``_whatif``
(pins, re-solve, undo) and ``_launch`` (launch and its results).
"""

from autoplan.viz.explorer._explorer import Explorer as Explorer
from autoplan.viz.explorer._state import LaunchRecord as LaunchRecord

__all__ = ["Explorer", "LaunchRecord"]
