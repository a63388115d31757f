"""Strict JAX settings for the tests and small shared fixtures."""

import contextlib
import os
import tempfile

# Two simulated CPU devices, so sharding across devices is exercised on any machine.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("MPLBACKEND", "Agg")
# The CLI subprocesses the tests start share compiled programs through an on-disk cache; this
# process does not write to it (jax 0.10's executable serialisation has crashed here after a few
# hundred in-process compilations).
os.environ.setdefault("PHASEBO_CACHE", os.path.join(tempfile.gettempdir(), "phasebo-test-cache"))

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# The suite is bound by XLA compilation (hundreds of small programs, each run for a few steps):
# compiling without XLA's optimisation passes makes it ~35 % faster. Numbers agree within every
# test's tolerance (the stored reference runs still match to 1e-12 in float64); the CLI
# subprocesses and notebooks the tests start compile as users do, optimisations on.
jax.config.update("jax_disable_most_optimizations", True)

import phasebo  # noqa: E402, F401

# Compile in memory in this process (see above), also where a test calls the CLI's main() in
# process; CLI subprocesses still use the on-disk cache.
jax.config.update("jax_enable_compilation_cache", False)


@contextlib.contextmanager
def enabled_x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


@pytest.fixture
def x64():
    """64-bit JAX for one test (float64 runs)."""
    with enabled_x64():
        yield


@pytest.fixture(scope="module")
def x64_module():
    """64-bit JAX for a whole module (request it from an autouse module fixture)."""
    with enabled_x64():
        yield


@contextlib.contextmanager
def xla_optimised():
    """Compile with XLA's optimisations, for the few tests whose time is spent running large
    programs rather than compiling small ones."""
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", True)


@pytest.fixture(autouse=True)
def _optimised_marker(request):
    if request.node.get_closest_marker("optimized"):
        with xla_optimised():
            yield
    else:
        yield


@pytest.fixture(autouse=True, scope="module")
def fresh_compilations():
    """Each test module compiles its own programs: the executables of the modules before it are
    released (XLA's CPU compiler has crashed here after some hundreds of live executables)."""
    yield
    jax.clear_caches()


@pytest.fixture
def tmp_out(tmp_path):
    return tmp_path / "out"
