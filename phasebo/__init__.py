"""phasebo: a JAX simulation engine for benign-overfitting phase sweeps of softmax attention.

Importing phasebo registers every model (prompt attention, single-head, self-attention,
multi-layer, encoder, hand-built query) and every engine (direct, gram, reduced).

    >>> import phasebo
    >>> spec = phasebo.spec_from_dict({"d": 500, "steps": 100}, {"signal_norm": [5.0, 20.0]})
    >>> df = phasebo.run_sweep(spec, "results/example", quiet=True)   # doctest: +SKIP
    >>> cells = phasebo.aggregate(df, ["signal_norm"])                 # doctest: +SKIP
"""

from . import encoder as _encoder  # noqa: F401  (registers the encoder)
from . import engines as _engines  # noqa: F401  (registers the gram and reduced engines)
from . import magen as _magen  # noqa: F401  (registers single_head, self_attention, ...)
from . import train as _train  # noqa: F401  (registers prompt_attention)
from .analysis import aggregate as aggregate
from .analysis import export as export
from .analysis import load as load
from .analysis import load_dynamics as load_dynamics
from .analysis import load_samples as load_samples
from .analysis import pivot as pivot
from .analysis import select as select
from .config import ConfigError as ConfigError
from .config import load_sweep as load_sweep
from .config import spec_from_dict as spec_from_dict
from .results import load_results as load_results
from .train import ENGINES as ENGINES
from .train import MODELS as MODELS
from .train import run_one as run_one

__version__ = "0.1.0"


def run_sweep(spec, out_dir=None, **kwargs):
    """Run a sweep and return its results table; see :func:`phasebo.sweep.run_sweep`.

    (Imported lazily, so that ``python -m phasebo.sweep`` does not import its module twice.)
    """
    from .sweep import run_sweep as _run_sweep

    return _run_sweep(spec, out_dir, **kwargs)
