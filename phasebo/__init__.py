"""phasebo: a JAX simulation engine for benign-overfitting phase sweeps of softmax attention."""

from . import train as _train  # noqa: F401  (registers the models)
from .config import ConfigError as ConfigError
from .config import load_sweep as load_sweep
from .config import spec_from_dict as spec_from_dict
from .train import MODELS as MODELS
from .train import run_one as run_one

__version__ = "0.1.0"
from . import encoder as _encoder  # noqa: E402, F401  (registers the encoder)
from . import magen as _magen  # noqa: E402, F401  (registers single_head, self_attention, ...)
