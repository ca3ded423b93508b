"""Test configuration: 8 emulated CPU devices, so sharding tests run on a laptop."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
