"""The model protocol: what a model declares so that every engine, the sweep and the tables can
drive it without knowing it.

A model is one subclass of :class:`Model` in one module of :mod:`phasebo.models`, registered by one
line in :mod:`phasebo.registry`. It declares

- its **settings**: the :data:`~phasebo.settings.CORE` ones, label noise
  (:data:`~phasebo.settings.LABELS`), its data distribution's (``data``), the training ones
  (:data:`~phasebo.settings.TRAINING`, when ``trains``) and its own (``own_settings``), with
  ``defaults`` overriding defaults. A setting the model does not declare is refused for it;
- its **data**: :meth:`sample` draws a training set (noisy labels) or a test set (clean labels);
- its **parameters**: :meth:`init` returns ``(trainable, fixed)`` equinox trees;
- its **forward pass** :meth:`forward` ``-> (f, s, a)``: outputs, the attention weights the
  metrics read (``(n, T)``) and the logits (or a tuple whose first entry is them);
- its **test output** :meth:`test_output` (exact projections or sampled tokens),
  :meth:`param_metrics`, optional :meth:`extra_metrics` and :meth:`samples` columns;
- its **cost**: :meth:`bytes_per_run` (memory of one run) and :meth:`cost_per_run` (flops);
- which **engines** can run it (``engines``); the span engines need :meth:`span_problem`.

Abstract methods are enforced when the registry instantiates the model at import: a forgotten
method is an ``TypeError`` there, never a silent fallback.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .. import rules
from ..data import Batch, Distribution, label_values
from ..flow import STEP_MAX, STEP_MAX_F32, is_flow, record_times
from ..limit import is_limit
from ..metrics import binary_margin, logistic_loss
from ..settings import CORE, LABELS, TRAINING, ConfigError, Setting, minibatched, record_steps


class Model(abc.ABC):
    """Base class of every model (see the module docstring)."""

    name: ClassVar[str]
    doc: ClassVar[str]
    data: ClassVar[Distribution | None] = None
    labels: ClassVar[bool] = True
    trains: ClassVar[bool] = True
    own_settings: ClassVar[tuple[Setting, ...]] = ()
    defaults: ClassVar[dict[str, Any]] = {}
    engines: ClassVar[tuple[str, ...]] = ("direct",)
    track_logits: ClassVar[bool] = True  # record the tracked samples' logits too
    # its span problem gives a factor of the Gram (SpanProblem.factor), so the gram and reduced
    # engines can find the converged limit (phasebo.limit); elsewhere the direct engine does
    span_factor: ClassVar[bool] = False
    # its gram-engine span problem draws its d-dimensional arrays zero-padded to the program's
    # d with the true d from sw["dim"] (phasebo.data.padded_draw): nearby d share one program
    span_pads_d: ClassVar[bool] = False
    radii: ClassVar[tuple[str, ...]] = ()  # the radius settings of the norm groups, in order

    def __init__(self):
        table: dict[str, Setting] = {}
        groups = [CORE, LABELS if self.labels else (), self.data.settings if self.data else (),
                  TRAINING if self.trains else (), self.own_settings]
        for group in groups:
            for s in group:
                if s.name in table:
                    raise TypeError(f"{self.name}: setting {s.name!r} declared twice")
                table[s.name] = s
        for k, v in self.defaults.items():
            if k not in table:
                raise TypeError(f"{self.name}: default for undeclared setting {k!r}")
            table[k] = table[k].with_default(table[k].coerce(v))
        table["model"] = table["model"].with_default(self.name)
        self.settings: dict[str, Setting] = table
        fields = [(k, Any) for k, s in table.items() if s.kind == "static"]
        self.Static = dataclasses.make_dataclass(f"{type(self).__name__}Static", fields,
                                                 frozen=True, eq=True)
        self.swept = tuple(k for k, s in table.items() if s.kind == "swept")

    def __repr__(self) -> str:
        return f"<model {self.name}>"

    # ---------------------------------------------------------------------------------------
    # Settings
    # ---------------------------------------------------------------------------------------

    def static_of(self, run: dict, **overrides):
        """The :attr:`Static` dataclass of a run's settings (defaults filled in)."""
        vals = {k: run.get(k, s.default) for k, s in self.settings.items() if s.kind == "static"}
        vals.update(overrides)
        return self.Static(**vals)

    def check(self, r: dict) -> None:
        """Raise :class:`ConfigError` for a combination of settings the model cannot run."""
        if self.data is not None:
            self.data.check(r)
        if r.get("test_reference") == "clean" and "noise_ratio" not in self.settings:
            raise ConfigError(f"test_reference = \"clean\" judges runs against the noise-free "
                              f"runs of their sweep, but model {self.name!r} has no noise_ratio; "
                              "fix: test_reference = \"absolute\"")
        if r.get("dynamics", "gd") == "gd" and self.trains and r.get("steps", 1) < 1:
            raise ConfigError(f"steps = {r['steps']} trains nothing: every run would stay at its "
                              "initialisation and be judged there; fix: steps >= 1 (or "
                              "dynamics = \"flow\" / \"limit\")")
        if r.get("dynamics") in ("flow", "limit"):
            rule = [f"{k} = {r[k]!r}" for k, v in (("optimizer", "sgd"), ("clip_norm", 0.0),
                                                   ("lr_schedule", "constant"),
                                                   ("batch_size", 0))
                    if r.get(k, v) != v]
            if rule:
                what = ("has no gradient flow (the flow is the limit of plain full-batch GD)"
                        if r["dynamics"] == "flow" else "has no converged limit in phasebo (the "
                        "limit minimises the loss itself, whatever optimiser would reach it)")
                raise ConfigError(f"{rule[0]} {what}; fix: dynamics = \"gd\", or leave "
                                  f"{rule[0].split(' ')[0]} at its default")
        if r.get("dynamics") == "limit":
            if "weight_decay" not in self.settings:  # no fix by a setting: say what the model lacks
                raise ConfigError(f"dynamics = \"limit\" minimises L + (weight_decay/2)||theta||^2, "
                                  f"but model {self.name!r} has no weight_decay setting; fix: "
                                  "dynamics = \"flow\" (or give the model WEIGHT_DECAY in its "
                                  "own_settings)")
            if not r.get("weight_decay", 0.0) > 0:
                raise ConfigError(f"dynamics = \"limit\" minimises L + (weight_decay/2)||theta||^2, "
                                  f"which has a minimiser only for weight_decay > 0 (it is "
                                  f"{r.get('weight_decay', 0.0)!r}); fix: weight_decay > 0 (e.g. "
                                  "0.01), or dynamics = \"flow\"")
            if r.get("dtype", "float32") != "float64":
                raise ConfigError(f"dynamics = \"limit\" with dtype = {r.get('dtype', 'float32')!r}: "
                                  "the weight-decayed loss is too flat near its minimiser for "
                                  "float32 (measured: L-BFGS stopped 30 % away in norm); fix: "
                                  "dtype = \"float64\"")
            if r.get("project"):
                raise ConfigError("project = true (norm-constrained GD) has no converged limit in "
                                  "phasebo; fix: dynamics = \"gd\", or project = false")
            if r.get("record_log"):
                raise ConfigError(f"record_log = {r['record_log']} has no effect: the converged "
                                  "limit has no time axis; fix: remove it, or dynamics = "
                                  "\"flow\" (records over flow time)")
        if r.get("dynamics") == "flow":
            if r.get("project"):
                raise ConfigError("project = true (norm-constrained GD) has no gradient flow in "
                                  "phasebo; fix: dynamics = \"gd\", or project = false (weight "
                                  "decay has one: theta' = -grad L - lambda theta)")
            if r["flow_time"] / r["lr"] < 1:  # its records would all share step 0
                raise ConfigError(f"flow_time = {r['flow_time']:g} is less than one GD-equivalent "
                                  f"step of lr = {r['lr']:g} (a flow's steps count flow_time / "
                                  "lr); fix: a smaller lr (the flow's step unit only)")
            most = STEP_MAX_F32 if r.get("dtype", "float32") == "float32" else STEP_MAX - 255
            if r["flow_time"] / r["lr"] > most:
                raise ConfigError(f"flow_time = {r['flow_time']:g} is {r['flow_time'] / r['lr']:.3g} "
                                  f"GD-equivalent steps of lr = {r['lr']:g}, more than a step "
                                  f"count holds exactly in {r.get('dtype', 'float32')} ({most}); "
                                  "fix: a larger lr (the flow's step unit), a shorter "
                                  "flow_time, or dtype = \"float64\"")
        if r.get("track"):
            bad = [i for i in r["track"] if i >= r["n"]]
            if bad:
                raise ConfigError(f"track = {list(r['track'])} names sample {bad[0]} but n = "
                                  f"{r['n']}; fix: indices in 0..{r['n'] - 1}")
            if not (r["record_every"] or r["record_log"]):
                raise ConfigError(f"track = {list(r['track'])} has no effect without recording; "
                                  "fix: set record_every or record_log")

    def derived(self, static, sw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Host-computed traced values ``(B,)`` from the swept values ``sw`` of runs sharing
        ``static``: label-flip counts, and ``dim`` (d as an array, for engines whose program does
        not depend on d)."""
        out = {}
        if self.labels:
            out.update(label_values(static.n, sw["noise_ratio"]))
        if self.data is not None:
            out["dim"] = np.full(len(sw["noise_ratio"]), static.d, np.int32)
        return out

    # ---------------------------------------------------------------------------------------
    # The run
    # ---------------------------------------------------------------------------------------

    def keys(self, key: jax.Array):
        """``(k_data, k_test, k_init)`` from the run's key."""
        return jr.split(key, 3)

    @abc.abstractmethod
    def roles(self, static) -> np.ndarray | None:
        """Token role codes ``(T,)`` (0 relevant .. 3 irrelevant), or None without roles."""

    @abc.abstractmethod
    def sample(self, static, sw: dict, key: jax.Array, *, test: bool) -> Batch:
        """A training set (noisy labels) or, with ``test``, a clean test set."""

    @abc.abstractmethod
    def init(self, static, sw: dict, key: jax.Array, batch: Batch):
        """Initial parameters as ``(trainable, fixed)`` equinox trees (``fixed`` None: every
        array leaf is trained)."""

    def precompute(self, m, batch: Batch, static):
        """Constants of the forward pass computed once per run (e.g. fixed head scores)."""
        return None

    @abc.abstractmethod
    def forward(self, m, batch: Batch, aux) -> tuple:
        """``(f, s, a)``: outputs, attention weights ``(n, T)`` and logits (or a tuple)."""

    def margin_loss(self, f, y):
        """``(margin (n,), mean loss)``; binary: ``y f`` and the logistic loss."""
        margin = binary_margin(f, y)
        return margin, logistic_loss(margin)

    @abc.abstractmethod
    def test_output(self, m, test: Batch, static, sw: dict):
        """The model's outputs on the test set."""

    @abc.abstractmethod
    def param_metrics(self, m, static, sw: dict) -> dict:
        """Norms and alignments of the parameters."""

    def extra_metrics(self, m, f, s, a, batch: Batch, metrics: dict) -> dict:
        """Model-specific scalars added to the metrics (``metrics``: those computed so far)."""
        return {}

    def samples(self, m, f, s, a, batch: Batch, test: Batch, static, sw, first_fit) -> dict:
        """Per-training-sample columns of the samples table."""
        margin, _ = self.margin_loss(f, batch.y)
        return {"flipped": batch.flipped, "y_clean": batch.y_clean.astype(jnp.int32),
                "first_fit_step": first_fit, "final_margin": margin}

    def norm_groups(self, m):
        """The parameter groups the radii of ``project = true`` constrain (None: no groups)."""
        return None

    def optimizer(self, static, sw: dict):
        groups = self.norm_groups if self.radii else None
        return rules.make_optimizer(static, sw, groups, self.radii)

    # ---------------------------------------------------------------------------------------
    # Cost
    # ---------------------------------------------------------------------------------------

    @abc.abstractmethod
    def bytes_per_run(self, static) -> int:
        """Device memory one run of the direct engine needs (an estimate)."""

    def cost_per_run(self, static) -> float:
        """Flops of one direct run (an estimate, for planning and the dry run): a step sees n
        samples, or a batch of them."""
        d, T = getattr(static, "d", 1), getattr(static, "T", 1)
        n = static.batch_size if minibatched(static) else static.n
        return 6.0 * n * T * d * max(self.loop_steps(static), 1)

    def setup(self, static) -> None:
        """One-off host work before a program of ``static`` is traced (vit_digits pretrains its
        backbone, once, into the cache), timed apart from the compile."""
        return None

    def setup_note(self, static) -> str | None:
        """One-off work a run of ``static`` does before its program compiles and that the cost
        model leaves out (the dry run's estimate names it); ``None`` where there is none."""
        return None

    def loop_steps(self, static) -> int:
        """GD steps' worth of work in one run, for the cost estimates: its steps, or for a flow
        ~180 gradient evaluations per decade of flow time (Tsit5: 6 per solver step, ~30 steps per
        decade; Bosh3: 3 per step, up to twice the steps; the p-only map to tau = 5000 took 81
        Tsit5 steps on average; a weight-decayed flow takes more) and
        4x a GD step's time per evaluation (the solver's own work, measured on 2 cores)."""
        if is_flow(static):
            return int(4 * 180 * (1 + math.log10(1 + static.flow_time)))
        if is_limit(static):  # ~100 L-BFGS iterations of ~3 gradients (measured: 9 - 101)
            return 300
        return getattr(static, "steps", 0)

    def item(self, static) -> int:
        return 8 if static.dtype == "float64" else 4

    def recorded_steps(self, static) -> tuple[int, ...]:
        """The steps at which a run records its dynamics (none for a model that does not
        train): ``record_every`` and ``record_log`` over ``steps``
        (:func:`phasebo.settings.record_steps`)."""
        if not self.trains or is_flow(static) or is_limit(static):
            return ()
        return tuple(record_steps(static.steps, static.record_every, static.record_log))

    def n_records(self, static) -> int:
        """How many dynamics rows one run writes (the memory and disk estimates scale with it):
        its recorded steps, or a flow's recorded times (:func:`phasebo.flow.record_times`)."""
        if self.trains and is_flow(static):
            return len(record_times(static.flow_time, static.record_log))
        return len(self.recorded_steps(static))

    # ---------------------------------------------------------------------------------------
    # Span engines (gram, reduced)
    # ---------------------------------------------------------------------------------------

    def span_supports(self, static, reduced: bool) -> str | None:
        """Why the gram (or reduced) engine cannot run ``static`` (None: it can)."""
        return "this model has no span form"

    @staticmethod
    def plain_rule(static) -> str | None:
        """Why the span engines cannot run ``static``'s optimiser (None: plain GD, which they
        run exactly on the span coefficients)."""
        if getattr(static, "optimizer", "sgd") != "sgd":
            return (f"optimizer = \"{static.optimizer}\" is not a linear map of the gradient, so "
                    "the parameters leave the span form; use engine = \"direct\"")
        if getattr(static, "clip_norm", 0.0) > 0 or getattr(static, "lr_schedule",
                                                           "constant") != "constant":
            return ("gradient clipping and step-size schedules run on engine = \"direct\" (the "
                    "span engines step with a constant lr)")
        if minibatched(static):
            return ("minibatch training runs on engine = \"direct\" (the span engines take "
                    "full-batch steps)")
        return None

    def span_problem(self, static, sw: dict, key: jax.Array, reduced: bool):
        """The run in span coordinates (:class:`phasebo.engines.span.SpanProblem`)."""
        raise NotImplementedError(f"{self.name} has no span form")

    def span_bytes(self, static, reduced: bool) -> int:
        """Device memory one run of the gram (or reduced) engine needs (an estimate)."""
        raise NotImplementedError(f"{self.name} has no span form")

    def span_cost(self, static, reduced: bool) -> float:
        """Flops of one gram (or reduced) run (an estimate, for planning and the dry run)."""
        raise NotImplementedError(f"{self.name} has no span form")
