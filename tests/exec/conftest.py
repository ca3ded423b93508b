"""Fixtures of the executor's tests (the root ``conftest.py`` sets 8 CPU devices).

Compilations use ``xla_backend_optimization_level=0`` (see ``exec_cases.FAST``) so that the whole
directory runs in a few minutes on two cores.
"""

from __future__ import annotations

import pytest
from exec_cases import FAST


@pytest.fixture
def fast() -> dict:
    """XLA options for quick compiles."""
    return dict(FAST)
