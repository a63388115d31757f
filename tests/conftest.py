"""Strict JAX settings for the tests and small shared fixtures."""

import os
import tempfile

# Two simulated CPU devices, so sharding across devices is exercised on any machine.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("MPLBACKEND", "Agg")
# Share compiled programs between the tests and the CLI subprocesses they start.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "phasebo-test-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

import phasebo  # noqa: E402, F401  (registers models)


@pytest.fixture
def tmp_out(tmp_path):
    return tmp_path / "out"
