"""The engines: three ways to simulate a model, behind one interface.

- ``direct``: the model as written, in ``d`` dimensions, trained by optax (:func:`phasebo.train.run`);
  the ground truth, it runs every model and setting.
- ``gram``: the same run on the same sampled data, as gradient descent on the span coefficients
  (:mod:`phasebo.engines.span`); it reproduces the direct trajectory up to rounding (tested in
  float64). Prompt attention (p trained, W fixed or trained) and single-head attention.
- ``reduced``: the same *distribution* of runs, without ever forming a ``d``-dimensional vector:
  the Gram matrix of the noise is drawn from its Wishart law (:mod:`phasebo.data`). Its cost does
  not depend on ``d``, and neither does its compiled program (:meth:`Engine.program`).

``engine = "auto"`` picks the supporting engine of highest ``priority`` (reduced > gram > direct).
An engine declares which model methods it needs (``hooks``); the registry checks at import that
every model implements the hooks of the engines it lists.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ..data import padded_width, reduced_d
from ..flow import is_flow
from ..limit import is_limit
from ..metrics import relevant_mass
from ..train import (
    RunOutput,
    dtype_of,
    evaluate,
    finish,
    finish_limit,
    flow_loop,
    last_step,
    recorder_fn,
    run_loop,
)
from ..train import run as direct_run
from .span import (
    UNROLL,
    SpanWProblem,
    dense,
    span_field,
    span_limit,
    span_system,
    span_w_field,
    span_w_system,
)

# CPU blocks of the reduced engine: the Grams that fit in half a core's L2, where that is at least
# this many (fewer and the step's fixed cost per block dominates; see Reduced.block_size)
L2_BLOCK = 8

class Engine(abc.ABC):
    name: ClassVar[str]
    priority: ClassVar[int]
    doc: ClassVar[str]
    hooks: ClassVar[tuple[str, ...]] = ()
    # runs sharing their noise along an axis (common_noise) are vmapped as one group with the
    # shared draws unbatched, so the engine's products with them batch into matrix products
    steps_shared_noise: ClassVar[bool] = False

    @abc.abstractmethod
    def supports(self, model, static) -> str | None:
        """Why this engine cannot run ``static`` of ``model`` (None: it can)."""

    @abc.abstractmethod
    def run(self, model, static, sw: dict, key, grouped: bool = False):
        """One run: ``RunOutput``. ``grouped``: the run is vmapped inside its noise group (the
        executor's grouped mode), so its draws from ``key`` are shared with the group's."""

    def program(self, model, static):
        """The static configuration that decides this engine's compiled program: runs whose
        ``program`` is equal share one trace and one compilation."""
        return static

    def bytes_per_run(self, model, static) -> int:
        return model.bytes_per_run(static)

    def member_bytes(self, model, static) -> int:
        """Bytes each further run of a noise group adds (its shared draws counted once)."""
        return self.bytes_per_run(model, static)

    def cost_per_run(self, model, static) -> float:
        return model.cost_per_run(static)

    def member_cost(self, model, static) -> float:
        """The cost each run of a noise group has of its own (its draws and setup shared)."""
        return self.cost_per_run(model, static)

    def block_size(self, model, static, platform: str, l2: int | None = None) -> int:
        """Runs vmapped together per device (measured: ``python -m phasebo.bench``); ``l2``: a
        CPU core's level-2 cache in bytes, None where unknown."""
        return 2 if platform == "cpu" else 256

    def group_block_size(self, model, static, platform: str, members: int) -> int:
        """Noise groups of ``members`` runs vmapped together per device. Measured on 2 CPU
        cores (reduced engine, d 2000, 39 runs per group, 1000 steps): 2 groups 1381 runs/s,
        4: 1113, 8: 926, and 1 group only 171 (XLA's program for a batch of one is slow)."""
        if platform == "cpu":
            return 2
        return max(2, self.block_size(model, static, platform) // members)

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


class Direct(Engine):
    name = "direct"
    priority = 0
    doc = "the d-dimensional model as written, trained by optax (ground truth)"

    def supports(self, model, static):
        return None

    def run(self, model, static, sw, key, grouped=False):
        return direct_run(model, static, sw, key)

    def block_size(self, model, static, platform, l2=None):
        if platform != "cpu":
            return 256
        # Measured on 2 CPU cores: the direct engine is memory-bound, blocks of a few runs whose
        # tokens fit in cache beat big vmaps (python -m phasebo.bench --sections blocks). A run
        # over 2 MiB goes alone: prompt attention at d 2000 (4 MiB a run), 200 steps, runs/s by
        # block 1 / 2: 104 – 114 / 84 on an Intel Xeon (2 MiB L2), 23 – 26 / 25 – 26 on an AMD
        # EPYC; at d 5000, 41 / 40 – 41 (Xeon); at d 1000 (2 MiB) blocks of 2 stay: 210 – 216
        # against 183 – 186 alone (Xeon)
        return max(1, min(8, int(2**22 // max(model.bytes_per_run(static), 1))))


def run_span(model, static, sw: dict, key, reduced: bool, grouped: bool = False) -> RunOutput:
    """A run of ``model`` in span coordinates (gram or reduced engine). A run on its own steps
    with its Gram as one matrix (measured: 935 runs/s against 682 with the split form, 2 cores);
    inside a noise group, with the shared part apart (:class:`phasebo.engines.span.LowRank`)."""
    prob = model.span_problem(static, sw, key, reduced)
    if not grouped:
        prob = dense(prob)
    roles = model.roles(static)
    batch, test = prob.batch, prob.test
    dtype = dtype_of(static)
    wd = sw.get("weight_decay")

    def metrics(coef, f, s, a):
        return evaluate(model, static, sw, prob.params(coef), f, s, a, batch, test, roles)

    relevant = None if roles is None else (lambda s_: relevant_mass(s_, roles))
    record_fn = recorder_fn(model, static, sw, metrics, batch)
    flowed = None

    def margin_fn(f_, y_):
        return y_ * f_

    if is_limit(static):  # the minimiser of the weight-decayed loss (phasebo.limit)
        tol = static.limit_tol
        now, (f, s, a), k, gn = span_limit(dense(prob), batch.y, wd, tol=tol,
                                           max_iters=static.limit_max_iters,
                                           warmup=static.limit_warmup, lr=sw["lr"])
        final_metrics = finish_limit(metrics(now, f, s, a), margin_fn(f, batch.y), k, gn, tol,
                                     batch, roles, dtype)
        samples = model.samples(prob.params(now), f, s, a, batch, test, static, sw,
                                jnp.full(batch.y.shape, -1, jnp.int32))
        return RunOutput(final_metrics, {}, samples)
    if is_flow(static):  # the gradient flow of the same coefficients (phasebo.flow)
        w = isinstance(prob, SpanWProblem)
        state0, field, view = (span_w_field if w else span_field)(prob, batch.y, wd)
        now, (f, s, a), ls, flowed = flow_loop(
            state0, field, view, static, sw, record_fn, margin_fn=margin_fn, batch=batch,
            relevant=relevant, dtype=dtype)
    else:
        trip = None
        if isinstance(prob, SpanWProblem):
            state0, step, final, view, trip = span_w_system(prob, batch.y, sw["lr"], wd)
        else:
            project = getattr(static, "project", False)
            state0, step, final, view = span_system(
                prob, batch.y, sw["lr"], wd,
                sw["radius_p"] if project else None,
                sw.get("radius_v") if project and prob.K_head is not None else None)
        now, (f, s, a), ls = run_loop(
            state0, step, final, static.steps, model.recorded_steps(static), record_fn,
            margin_fn=margin_fn, batch=batch, relevant=relevant, dtype=dtype, view=view,
            unroll=UNROLL, trip=trip)
    final_metrics = finish(metrics(now, f, s, a), ls, batch, roles, dtype, flowed,
                           last_step(static, sw))
    samples = model.samples(prob.params(now), f, s, a, batch, test, static, sw, ls.first_fit)
    return RunOutput(final_metrics, ls.buf, samples)


class SpanEngine(Engine):
    """What the gram and reduced engines share: the model's span hooks, and noise groups."""

    reduced: ClassVar[bool]
    hooks = ("span_problem", "span_supports", "span_bytes", "span_cost")
    steps_shared_noise = True

    def supports(self, model, static):
        if is_limit(static):
            if not model.span_factor:
                return ("the converged limit in span coordinates needs a factor of the Gram, "
                        f"which model {model.name!r} does not give; use engine = \"direct\"")
            if "W" in getattr(static, "train", ()):
                return ("the converged limit in span coordinates covers p (and v), not a "
                        "trained W; use engine = \"direct\"")
            if getattr(static, "init", "zero") != "zero":
                return ("the converged limit in span coordinates starts from zero (init = "
                        "\"zero\"); use engine = \"direct\" for another initialisation")
        return model.plain_rule(static) or model.span_supports(static, reduced=self.reduced)

    def run(self, model, static, sw, key, grouped=False):
        return run_span(model, static, sw, key, reduced=self.reduced, grouped=grouped)

    def bytes_per_run(self, model, static):
        return model.span_bytes(static, reduced=self.reduced)

    def cost_per_run(self, model, static):
        return model.span_cost(static, reduced=self.reduced)

    def member_bytes(self, model, static):
        """A group member's own bytes: its span state and records, and (gram) its
        d-dimensional tokens; the noise, its Gram and W_0 are the group's."""
        own = model.span_bytes(static, reduced=True)
        if not self.reduced:
            own += 3 * static.n * static.T * static.d * model.item(static)
        return int(own)

    def member_cost(self, model, static):
        return min(model.span_cost(static, reduced=True), self.cost_per_run(model, static))


class Gram(SpanEngine):
    name = "gram"
    reduced = False
    priority = 10
    doc = "the same run on the same data, as GD on the span coefficients (N x N per step)"

    def program(self, model, static):
        # a model that pads (Model.span_pads_d) runs d zero-padded to the next of a few widths
        # per octave (phasebo.data.padded_width), d traced in sw["dim"], with bit-identical draws:
        # the trained-W map's 39 d values compile 16 programs, each ~4 s (cold, 2 cores)
        # the padded draws equal the unpadded ones only under partitionable threefry (JAX's
        # default since 0.5): with the flag off, each d keeps its own program
        if not model.span_pads_d or not jax.config.jax_threefry_partitionable:
            return static
        rows = static.n * static.T  # the most rows of a d-dimensional draw: data or sampled test
        if static.test_mode == "sampled":
            rows = max(rows, static.n_test * static.T)
        return dataclasses.replace(static, d=padded_width(static.d, rows))

    def block_size(self, model, static, platform, l2=None):
        return 4 if platform == "cpu" else 256


class Reduced(SpanEngine):
    name = "reduced"
    reduced = True
    priority = 20
    doc = ("the same distribution of runs from the Wishart law of the noise Gram: cost and "
           "program independent of d")

    def program(self, model, static):
        # d enters only as the traced sw["dim"] above reduced_d: one program for all larger d
        d0 = reduced_d(static.n, static.T)
        return dataclasses.replace(static, d=min(static.d, d0))

    def block_size(self, model, static, platform, l2=None):
        if platform != "cpu":
            # measured on an H200 (python -m phasebo.bench --sections gpu, TF32 products): 8192
            # runs against 1024, the independent-noise map 6.1 against 7.6 s of runs, S2 with
            # dynamics 11.1 against 12.8 s; the shared-noise map's noise groups (256 groups 2.5
            # s, 26 groups 4.0 s). Its 8192 // 39 = 210 groups then took 3.1 s in full float32,
            # against 4.5 s with 26 (another run, on another machine)
            return 8192
        if is_flow(static) or is_limit(static):
            return 16  # measured for GD (316 runs/s; 4: 238, 8: 297, 32: 304), kept for these
        # A GD step reads each run's Gram once (a matrix-vector product per run): the block is
        # the Grams that stay in the core's L2, where half of it holds at least L2_BLOCK of them.
        # Measured in turns on 2 cores, d 2000, 1000 steps, runs/s by block: an Intel Xeon (2 MiB
        # L2 per core) without records 8: 940, 10: 960, 12: 862, 16: 758, 32: 458, 64: 426; with
        # records every 10 steps 8: 593, 10: 576, 12: 608, 32: 350. An AMD EPYC, whose L2 holds
        # fewer than 8 (its Grams read from L3), 1536 runs: without records 16: 1137, 32: 1181,
        # 48: 1266, 64: 1290 (128: 814, out of L3); with records 24: 709, 32: 720, 48: 621; on
        # an older step 8 against 16, 741 against 773. 64 float32 Grams of N = 160 are 6.5 MiB:
        # the cap keeps larger N under 8 MiB
        gram = (static.n * static.T) ** 2 * model.item(static)
        in_l2 = (l2 or 0) // 2 // gram
        if in_l2 >= L2_BLOCK:
            return min(in_l2, 64)
        return max(4, min(32 if model.n_records(static) else 64, (8 << 20) // gram))
