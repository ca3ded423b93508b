"""Test configuration: 8 emulated CPU devices, so sharding tests run on a laptop; each test has
a plan cache of its own (an empty folder), so no test sees another's stored searches."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture(autouse=True)
def _own_plan_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path_factory.mktemp("plan-cache")))
