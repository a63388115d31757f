"""phasebo: a JAX simulation engine for benign-overfitting phase sweeps of softmax attention.

    >>> import phasebo
    >>> spec = phasebo.spec_from_dict({"d": 500, "steps": 100}, {"signal_norm": [5.0, 20.0]})
    >>> df = phasebo.run_sweep(spec, "results/example", quiet=True)   # doctest: +SKIP
    >>> cells = phasebo.aggregate(df)                                  # doctest: +SKIP

The public API: sweeps (:func:`load_sweep`, :func:`spec_from_dict`, :func:`run_sweep`,
:func:`run_one`), tables (:func:`load`, :func:`aggregate`, :func:`pivot`, :func:`at_step`,
:func:`export`), regimes at a step (:func:`classify_regime`, :func:`regimes_over_time`,
:func:`timeline`), phase boundaries (:func:`boundaries`, :func:`crossings`,
:func:`fit_power_law`, :func:`power_law_row`, :func:`exponents_over_steps`), and the
tables of models and engines (:data:`MODELS`, :data:`ENGINES`).
"""

from . import theory as theory
from .analysis import aggregate as aggregate
from .analysis import at_step as at_step
from .analysis import cell_axes as cell_axes
from .analysis import export as export
from .analysis import load as load
from .analysis import load_dynamics as load_dynamics
from .analysis import load_samples as load_samples
from .analysis import pivot as pivot
from .analysis import select as select
from .analysis import wilson as wilson
from .boundaries import boundaries as boundaries
from .boundaries import crossings as crossings
from .config import SweepSpec as SweepSpec
from .config import load_sweep as load_sweep
from .config import spec_from_dict as spec_from_dict
from .models.base import Model as Model
from .regimes import classify_regime as classify_regime
from .regimes import regimes_over_time as regimes_over_time
from .regimes import timeline as timeline
from .registry import ENGINES as ENGINES
from .registry import MODELS as MODELS
from .results import load_results as load_results
from .scaling import exponents_over_steps as exponents_over_steps
from .scaling import fit_power_law as fit_power_law
from .scaling import power_law_row as power_law_row
from .settings import ConfigError as ConfigError
from .settings import Setting as Setting

__version__ = "0.2.0"


# The sweep driver is imported on first use, so that ``python -m phasebo.sweep`` does not find
# its own module already imported.
def run_sweep(spec, out_dir=None, **kwargs):
    """Run a sweep and return its results table; see :func:`phasebo.sweep.run_sweep`."""
    from .sweep import run_sweep as _run_sweep

    return _run_sweep(spec, out_dir, **kwargs)


def run_one(settings=None, **kwargs):
    """One run from a settings dict: ``RunOutput(final, dynamics, samples)``; see
    :func:`phasebo.sweep.run_one`."""
    from .sweep import run_one as _run_one

    return _run_one(settings, **kwargs)


def enable_compilation_cache():
    """Keep compiled programs on disk between processes, as the command line does; see
    :func:`phasebo.settings.enable_compilation_cache`."""
    from .settings import enable_compilation_cache as _enable

    _enable()


def refine_sweep(spec, refinement, out_dir=None, **kwargs):
    """Run a sweep, then refine its grid around a phase boundary; see
    :func:`phasebo.refine.refine_sweep` (``refinement``: :func:`phasebo.refine.parse_refine`)."""
    from .refine import refine_sweep as _refine
    from .sweep import run_sweep as _run_sweep

    return _refine(spec, refinement, out_dir, run_sweep=_run_sweep, **kwargs)
