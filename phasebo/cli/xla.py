"""XLA settings for the CPU, set before any JAX backend starts (the sweep, bench and reference
commands call :func:`tune_xla_cpu`)."""

from __future__ import annotations

import os

# XLA's CPU backend runs each matrix product as one YNNPACK call; this lets it take the
# elementwise work around the product into the same call. Measured on 2 cores (jaxlib 0.10.2,
# python -m phasebo.bench): the noise groups' step 1.4x, the flow map 1.17x, W + p no change.
YNN_FUSION = "--xla_cpu_experimental_ynn_fusion_type=dot"
YNN_MEASURED = (0, 10)  # the jaxlib (major, minor) it was measured on: an experimental flag


def tune_xla_cpu(environ=os.environ) -> bool:
    """Add :data:`YNN_FUSION` to ``XLA_FLAGS`` before any JAX backend starts, unless the user's
    ``XLA_FLAGS`` already sets it, ``PHASEBO_XLA_TUNING=0``, or the installed jaxlib is not the
    one it was measured on (XLA stops a process at a flag it does not know). It reorders float32
    roundings only: the p-only map's regimes and accuracies are the same with and without it
    (tested on a small sweep). Returns whether it was added."""
    from importlib.metadata import PackageNotFoundError, version

    from ..threefry import tuning_off

    flags = environ.get("XLA_FLAGS", "")
    if tuning_off(environ) or "xla_cpu_experimental_ynn" in flags:
        return False
    try:
        major_minor = tuple(int(x) for x in version("jaxlib").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    if major_minor != YNN_MEASURED:
        return False
    environ["XLA_FLAGS"] = f"{flags} {YNN_FUSION}".strip()
    return True
