"""Typed settings: the knobs of a run, each with a kind, a default, a validator and one line of doc.

A **setting** is a results column. Its **kind** says how it enters a run:

- ``static``: decides shapes, trip counts or code paths (``d``, ``n``, ``T``, ``steps``,
  ``train``...). Runs are grouped by what is static for their engine; each group compiles once.
- ``swept``: a number that enters the computation as an array (``signal_norm``, ``lr``,
  ``noise_ratio``...). Runs of one group differ only in these and are vmapped.
- ``host``: read on the host only (regime thresholds).
- ``key``: the root seed of the run's random key (an array, like a swept value).

Settings come in groups. Every model takes the :data:`CORE` settings; a model that trains takes
:data:`TRAINING`; each data distribution (``phasebo.data``) and each model add their own. A model
may change a setting's default (``single_head`` defaults to Magen et al.'s ``T = 2``), never its
type or meaning. ``identity = False`` marks settings that do not change a run's numbers (the engine,
what is recorded, the regime thresholds): they are left out of the run's identity, so changing them
does not change the run's random key.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


class ConfigError(ValueError):
    """A bad sweep file, setting or command-line value (message: field, value, fix)."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One knob: ``name`` (the results column), ``default``, ``type`` (int, float, str, bool,
    tuple of str, or ``"ints"`` for a tuple of ints), ``kind`` and a one-line ``doc``."""

    name: str
    default: Any
    type: Any
    kind: str
    doc: str
    check: Callable[[Any], str | None] | None = None
    choices: tuple | None = None
    identity: bool = True
    requires: tuple | None = None  # (setting, value) without which this one has no effect
    # a setting added after runs were stored: at its default it leaves a run's id (and key)
    # as it was, so earlier results directories and reference runs keep their runs
    silent_default: bool = False
    # defaults that differ by model ("20.0 (prompt_attention), 30.0 (single_head)"): set by
    # config when it reads a setting before the model is known, so its errors quote them all
    defaults_text: str = ""

    def __post_init__(self):
        if self.kind not in ("static", "swept", "host", "key"):
            raise ValueError(f"{self.name}: kind must be static, swept, host or key")

    def with_default(self, default) -> Setting:
        return dataclasses.replace(self, default=default)

    @property
    def type_name(self) -> str:
        if self.type == "ints":
            return "list of integers"
        if self.type is tuple:
            return "list of strings"
        return self.type.__name__

    def coerce(self, value: Any, where: str = "") -> Any:
        """Convert and validate one value (raises :class:`ConfigError` naming field and fix)."""
        fix = (f"fix: {self.name} = {show_value(self.default)} is the default ({self.doc})"
               if not self.defaults_text else
               f"fix: {self.name}'s default is {self.defaults_text} ({self.doc})")
        try:
            out = _convert(self.type, value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}{self.name} = {value!r} is not a valid {self.type_name}; "
                              f"{fix}") from None
        if isinstance(out, float) and not math.isfinite(out):
            raise ConfigError(f"{where}{self.name} = {value!r} must be finite; {fix}")
        if self.choices is not None and out not in self.choices:
            raise ConfigError(f"{where}{self.name} = {out!r} is not one of {list(self.choices)}; "
                              f"{fix}")
        if self.check is not None:
            problem = self.check(out)
            if problem:
                raise ConfigError(f"{where}{self.name} = {value!r} {problem}; {fix}")
        return out


def show_value(v) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(repr(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


def _convert(t, value):
    if t == "ints":
        if isinstance(value, str):  # --set track=3+7
            value = [float(v) for v in value.replace("+", ",").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise TypeError
        return tuple(_convert(int, v) for v in value)
    if t is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.replace("+", ",").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise TypeError
        return tuple(value)
    if t is bool:
        if isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0"):
                raise TypeError
            return value.lower() in ("true", "1")
        if not isinstance(value, (bool, int, np.bool_)):
            raise TypeError
        return bool(value)
    if t is int:  # a quoted number ("100") is refused: a typo in a file, not a number
        if isinstance(value, (bool, np.bool_, str)):
            raise TypeError
        if isinstance(value, float) and not value.is_integer():
            # float drift of a computed grid (np.geomspace: 499.99999999999994) is that integer
            if not (np.isfinite(value) and abs(value - round(value)) <= 1e-9 * max(1.0, abs(value))):
                raise TypeError
            value = round(value)
        return int(value)
    if t is float:
        if isinstance(value, (bool, np.bool_, str)) or isinstance(value, (list, tuple, dict)):
            raise TypeError
        return float(value)
    if not isinstance(value, str):
        raise TypeError
    return value


def suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --------------------------------------------------------------------------------------------
# Validators
# --------------------------------------------------------------------------------------------


def positive(v):
    return None if v > 0 else "must be > 0"


def nonneg(v):
    return None if v >= 0 else "must be >= 0"


def unit_interval(v):
    return None if 0 <= v < 1 else "must be in [0, 1)"


def at_least(k):
    def check(v):
        return None if v >= k else f"must be >= {k}"

    return check


def nonneg_ints(v):
    return None if all(i >= 0 for i in v) else "must be sample indices >= 0"


# --------------------------------------------------------------------------------------------
# The setting groups
# --------------------------------------------------------------------------------------------

S = Setting


# True while a dry run traces its programs for their shapes alone: a cached artefact that would
# have to be computed first (a pretrained backbone, minutes) is then stood in for by one of the
# same shapes, and nothing is written to the cache.
SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("phasebo_shapes_only",
                                                                   default=False)


def cache_dir() -> str:
    """phasebo's cache directory: ``$PHASEBO_CACHE``, else ``~/.cache/phasebo`` (compiled
    programs, pretrained backbones)."""
    return os.environ.get("PHASEBO_CACHE", os.path.join(os.path.expanduser("~"), ".cache",
                                                        "phasebo"))


def enable_compilation_cache() -> None:
    """Keep compiled programs on disk (``~/.cache/phasebo/jax``, or ``$PHASEBO_CACHE/jax``) unless
    the user chose a cache: a rerun, a resume or a similar sweep then skips compilation. The
    command line calls it; from Python (a notebook) it is a choice, since it changes JAX's
    configuration for the whole process. Call it before anything compiles: a program compiled
    before it is not stored."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    path = os.path.join(cache_dir(), "jax")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return  # read-only home: run without a cache
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


CORE = (
    S("model", "prompt_attention", str, "static", "which model to train (phasebo settings lists "
      "them)"),
    S("engine", "auto", str, "static", "simulation engine: direct (the model as written), gram, "
      "reduced, or auto (the fastest exact engine that can run the settings)", identity=False),
    S("n", 20, int, "static", "training samples", at_least(2)),
    S("n_test", 1000, int, "static", "independent clean test samples", positive),
    S("dtype", "float32", str, "static", "floating-point precision",
      choices=("float32", "float64")),
    S("matmul_precision", "highest", str, "static", "float32 matrix products (JAX's names): "
      "highest computes them in full float32 on every device; tensorfloat32, bfloat16 or default "
      "let a GPU or TPU round their operands (faster there; other numbers)",
      choices=("highest", "tensorfloat32", "bfloat16", "default"), identity=False),
    S("root_seed", 0, int, "key", "root PRNG seed; a run's key is derived from it and from the "
      "run's identity (its settings and seed)", nonneg),
    S("test_eps", 0.05, float, "host", "regime: benign iff train acc = 1 and test acc >= "
      "A - test_eps (A: 1, or the clean reference: test_reference)", unit_interval, identity=False),
    S("train_acc_fit", 1.0, float, "host", "regime: train accuracy that counts as fitting every "
      "label", lambda v: None if 0 < v <= 1 else "must be in (0, 1]", identity=False),
    S("test_reference", "absolute", str, "host", "regime: benign iff test acc >= A - test_eps "
      "with A = 1 (absolute) or A = the mean test accuracy of the sweep's noise-free runs "
      "(noise_ratio = 0) of the same settings (clean)", choices=("absolute", "clean"),
      identity=False),
)

LABELS = (
    S("noise_ratio", 0.2, float, "swept", "label-noise ratio r (fraction, fixed_count) or flip "
      "probability eta (bernoulli)", unit_interval),
    S("label_noise", "fraction", str, "static",
      "fraction: k = ceil(n r) flips, floor(k/2) per class (the paper's code); fixed_count: k = "
      "ceil(n r) flips at random positions; bernoulli: each label flips with probability r",
      choices=("fraction", "fixed_count", "bernoulli")),
    S("label_mode", "balanced", str, "static",
      "balanced: first floor(n/2) samples y = +1, the rest -1; iid: uniform labels",
      choices=("balanced", "iid")),
)

# The optimiser (phasebo.rules, optax); added after runs were stored (silent_default)
OPTIMIZER = (
    S("optimizer", "sgd", str, "static", "sgd (full-batch GD, the papers' rule), adam or adamw "
      "(optax; adamw's decoupled decay is weight_decay where the model has it, so without "
      "it, or at 0, adamw is adam)",
      choices=("sgd", "adam", "adamw"), silent_default=True),
    S("clip_norm", 0.0, float, "static", "clip the gradient to this global l2 norm before the "
      "update (optax.clip_by_global_norm; 0: no clipping)", nonneg, silent_default=True),
    S("lr_schedule", "constant", str, "static", "constant, or linear: the step size decays "
      "linearly from lr to 0 over the run's steps (the Hugging Face Trainer's default)",
      choices=("constant", "linear"), silent_default=True),
    S("batch_size", 0, int, "static", "minibatch size: every epoch visits the n samples in a "
      "fresh random order, in batches of this size (the last one smaller when it does not "
      "divide n), one step per batch; 0 (or >= n): full batch", nonneg,
      requires=("dynamics", "gd"), silent_default=True),
    S("epochs", 0, int, "static", "train for this many epochs instead of a step count: steps = "
      "epochs x ceil(n / batch_size) (epochs x 1 in full batch); 0: `steps` counts the steps",
      nonneg, requires=("dynamics", "gd"), silent_default=True),
)


def epoch_steps(n: int, batch_size: int) -> int:
    """Steps per epoch: ``ceil(n / batch_size)`` batches (1 in full batch)."""
    return -(-n // batch_size) if 0 < batch_size < n else 1


def minibatched(static) -> bool:
    """Whether a run takes minibatch steps (``0 < batch_size < n``)."""
    return 0 < getattr(static, "batch_size", 0) < static.n

# Gradient flow (phasebo.flow): settings added after runs were stored, so at their defaults they
# leave every earlier run's id and numbers as they were (silent_default)
FLOW = (
    S("dynamics", "gd", str, "static", "gd: full-batch gradient descent for `steps` steps of `lr`; "
      "flow: the gradient flow theta' = -grad L - weight_decay theta to flow time `flow_time`, "
      "integrated by diffrax "
      "(`flow_solver`, adaptive steps); its step axis counts GD-equivalent steps of `lr` (time / lr); "
      "limit: where the flow converges with weight_decay > 0, the minimiser of "
      "L + (weight_decay/2)||theta||^2, found directly by L-BFGS (no time axis)",
      choices=("gd", "flow", "limit"), silent_default=True),
    S("flow_time", 500.0, float, "static", "the flow's horizon tau (flow time; GD's equivalent "
      "is lr x steps)", positive, requires=("dynamics", "flow"), silent_default=True),
    S("flow_rtol", 1e-5, float, "static", "relative tolerance of the flow's adaptive step-size "
      "controller", positive, requires=("dynamics", "flow"), silent_default=True),
    S("flow_solver", "bosh3", str, "static", "the flow's explicit Runge-Kutta scheme (diffrax): "
      "bosh3 (3rd order, 3 gradients per step) is as accurate as tsit5 (5th order, 6 per step) at "
      "the default tolerances and faster where the flow is stiff (large ||mu||); tsit5, dopri5 or "
      "dopri8 for tight tolerances (flow_rtol <= 1e-7)", choices=("bosh3", "tsit5", "dopri5", "dopri8"),
      requires=("dynamics", "flow"), silent_default=True),
    S("flow_atol", 1e-7, float, "static", "absolute tolerance of the flow's adaptive step-size "
      "controller", positive, requires=("dynamics", "flow"), silent_default=True),
    S("flow_max_steps", 20000, int, "static", "solver steps a flow may take before it stops "
      "(status unsolved)", at_least(1), requires=("dynamics", "flow"), silent_default=True),
    S("flow_converge_tol", 1e-3, float, "static", "converged: over the last decade of flow time "
      "the same labels fitted, test accuracy within 0.005, and the directions of the logits and "
      "outputs turned by a cosine distance <= this (and the outputs moved over it by at most 0.8 "
      "of their move since time 0)", positive, requires=("dynamics", "flow"),
      silent_default=True),
    S("limit_tol", 1e-6, float, "static", "the limit is reached (converged) when the gradient "
      "norm of L + (weight_decay/2)||theta||^2 is at most this", positive,
      requires=("dynamics", "limit"), silent_default=True),
    S("limit_max_iters", 5000, int, "static", "L-BFGS iterations the limit may take before it "
      "stops (status unsolved)", at_least(1), requires=("dynamics", "limit"),
      silent_default=True),
    S("limit_warmup", 0, int, "static", "gradient-descent steps of lr on the weight-decayed loss "
      "before L-BFGS (flow time limit_warmup * lr): L-BFGS then starts in the basin where "
      "training goes, instead of jumping from the initialisation to another minimum",
      at_least(0), requires=("dynamics", "limit"), silent_default=True),
)

TRAINING = (
    S("lr", 5e-3, float, "swept", "gradient-descent step size", positive),
    S("steps", 1000, int, "static", "gradient-descent steps", nonneg,
      requires=("dynamics", "gd")),
    S("record_every", 0, int, "static", "record dynamics every k steps (0: off)", nonneg,
      identity=False, requires=("dynamics", "gd")),
    S("record_log", 0, int, "static", "record dynamics at about k log-spaced steps (0: off)",
      nonneg, identity=False),
    S("track", (), "ints", "static", "training samples whose per-token attention is recorded "
      "(empty: the first clean and the first flipped sample)", nonneg_ints, identity=False),
    *OPTIMIZER,
    *FLOW,
)

INIT = (
    S("init", "zero", str, "static", "initial trainable vectors: zero, or gaussian "
      "N(0, init_scale^2)", choices=("zero", "gaussian")),
    S("init_scale", 0.01, float, "swept", "standard deviation of a gaussian init", nonneg,
      requires=("init", "gaussian")),
)

WEIGHT_DECAY = (
    S("weight_decay", 0.0, float, "swept", "weight decay lambda: GD on L + (lambda/2)||theta||^2 "
      "(optax.add_decayed_weights before sgd)", nonneg),
)

PROJECT = (
    S("project", False, bool, "static", "norm-constrained GD: after every step project the query "
      "parameters on ||.|| <= radius_p (and the head on ||v|| <= radius_v where trained)"),
    S("radius_p", 1.0, float, "swept", "R: radius of the query ball ||p|| <= R (Frobenius norm "
      "for a matrix)", positive, requires=("project", True)),
)

RADIUS_V = (
    S("radius_v", 1.0, float, "swept", "r: radius of the head ball ||v|| <= r", positive,
      requires=("project", True)),
)

TEST_MODE = (
    S("test_mode", "projected", str, "static",
      "projected: test tokens drawn as exact Gaussian projections on the query and head "
      "(O(n_test T) per run); sampled: full d-dimensional test tokens",
      choices=("projected", "sampled")),
)

NOISE_MODE = (
    S("noise_mode", "isotropic", str, "static",
      "token noise: isotropic N(0, sigma^2 I_d), or projected off span(mu_1, mu_2) (Magen et al.)",
      choices=("isotropic", "projected")),
)


def record_steps(steps: int, every: int, log: int) -> tuple[int, ...]:
    """Steps (0..steps inclusive) at which dynamics are recorded."""
    pts: set[int] = set()
    if every:
        pts.update(range(0, steps + 1, every))
        pts.add(steps)
    if log:
        pts.add(0)
        pts.update(int(v) for v in np.unique(np.round(np.geomspace(1, max(steps, 1), log))))
        pts.add(steps)
    return tuple(sorted(p for p in pts if 0 <= p <= steps))


# Settings that do not make a cell (how it is run, recorded or judged; the seed): runs that differ
# only in these are repetitions of one cell (the clean reference of phasebo.regimes pools them)
NOT_CELL = frozenset(s.name for s in (*CORE, *TRAINING)
                     if not s.identity or s.kind in ("host", "key"))
