"""Notebook display: a plotly renderer whose output survives ``jupyter nbconvert``."""

from __future__ import annotations

import os

import plotly.io as pio

__all__ = ["set_notebook_renderer", "notebook_renderer_name"]


def _in_ipykernel() -> bool:
    try:
        from IPython import get_ipython  # noqa: PLC0415
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__module__.startswith("ipykernel.")


def notebook_renderer_name() -> str | None:
    """The renderer :func:`set_notebook_renderer` would pick here, or ``None`` outside ipykernel.

    Under ipykernel plotly defaults to ``"plotly_mimetype"`` alone, a mimetype nbconvert drops,
    so exported notebooks show no figures. ``"plotly_mimetype+notebook"`` adds a ``text/html``
    copy of each figure (with plotly.js embedded once in the notebook, so it works offline)
    that nbconvert keeps; VS Code gets ``"vscode+notebook"`` and Colab ``"colab"``.
    """
    if not _in_ipykernel():
        return None
    if "COLAB_NOTEBOOK_ID" in os.environ or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    if "VSCODE_PID" in os.environ:
        return "vscode+notebook"
    return "plotly_mimetype+notebook"


def set_notebook_renderer(renderer: str | None = None) -> str:
    """Set plotly's default renderer so figures show live and in nbconvert's HTML export.

    Args:
        renderer: a plotly renderer name to use instead of the one picked for this kernel
            (see :func:`notebook_renderer_name`).

    Returns:
        The default renderer now in effect (unchanged outside ipykernel when ``renderer`` is
        not given).

    Raises:
        ValueError: ``renderer`` is not a plotly renderer name.
    """
    name = renderer or notebook_renderer_name()
    if name is not None:
        try:
            pio.renderers.default = name
        except ValueError as err:
            raise ValueError(f"set_notebook_renderer: renderer should be one of plotly's renderers "
                             f"({', '.join(sorted(pio.renderers))}), optionally joined with '+'. "
                             f"Got {name!r}.") from err
    return pio.renderers.default
