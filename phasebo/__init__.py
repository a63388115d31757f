"""phasebo: a JAX simulation engine for benign-overfitting phase sweeps of softmax attention."""

from . import train as _train  # noqa: F401  (registers the models)
from .config import ConfigError as ConfigError
from .config import load_sweep as load_sweep
from .config import spec_from_dict as spec_from_dict
from .train import MODELS as MODELS
from .train import run_one as run_one

__version__ = "0.1.0"
from . import encoder as _encoder  # noqa: E402, F401  (registers the encoder)
from . import engines as _engines  # noqa: F401,E402  (registers the gram and reduced engines)
from . import magen as _magen  # noqa: E402, F401  (registers single_head, self_attention, ...)
from .analysis import aggregate as aggregate  # noqa: E402
from .analysis import export as export  # noqa: E402
from .analysis import load as load  # noqa: E402
from .analysis import load_dynamics as load_dynamics  # noqa: E402
from .analysis import load_samples as load_samples  # noqa: E402
from .analysis import pivot as pivot  # noqa: E402
from .analysis import select as select  # noqa: E402
