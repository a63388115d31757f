"""One run: ``(model, static config, swept values, key) -> metrics``, as one pure, jittable function.

:func:`run` is the direct engine's run of any model (``phasebo.models``): it draws the training set,
the test set and the initial parameters from the run's key, then runs full-batch gradient descent
(optax, through the model's learning rule) as one ``lax.scan`` over steps. The span engines
(:mod:`phasebo.engines`) replace the parameters by coefficients and the optax step by a closed-form
one, and share everything else: :func:`run_loop` and its typed :class:`LoopState`, the metric
assembly :func:`evaluate`, and :func:`finish`.

Every step (from the forward pass the gradient needs anyway) the loop updates the step at which
each sample is first fitted (margin > 0), the cumulative sums ``cumS_g = sum_tau sum_{i in g}
s_R^(i)(tau) (1 - s_R^(i)(tau))`` for the four groups ``g`` = clean / flipped x clean class
(``s_R`` is the softmax mass on the relevant tokens), and the first step at which the loss, a
gradient or the updated parameters are not finite (divergence: ``status = diverged``; also, at
the last step, when a final loss, the smallest margin or a parameter norm is not finite). At the
recorded steps (``record_every`` / ``record_log``) it stores the full metric set in a fixed-size
buffer; ``lax.cond`` on an unbatched predicate keeps that cost off the other steps.

Step convention: "step t" is the state after ``t`` updates; step 0 is the initialisation.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax

from . import flow
from .data import Batch
from .flow import is_flow
from .limit import book as limit_book
from .limit import is_limit, minimise, no_steps, weight_decayed
from .metrics import (
    GROUPS,
    all_finite,
    group_masks,
    masked_mean,
    relevant_mass,
    tracked_default,
    tracked_token_metrics,
    train_metrics,
)
from .settings import epoch_steps, minibatched


class Status(enum.IntEnum):
    """A run's outcome, stored as an int32 in the metrics and as a category in the tables."""

    OK = 0
    DIVERGED = 1
    UNSOLVED = 2  # a gradient flow whose solver did not reach its horizon (phasebo.flow)

    @property
    def label(self) -> str:
        return self.name.lower()


class RunOutput(NamedTuple):
    """What a run returns: final scalars, recorded dynamics ``(R,)`` and per-sample arrays."""

    final: dict
    dynamics: dict
    samples: dict


class LoopState(NamedTuple):
    """The bookkeeping every GD loop carries, whatever represents its parameters."""

    first_fit: jax.Array  # (n,) int32: step at which each sample was first fitted, -1 never
    all_fit: jax.Array  # () int32: first step at which every sample was fitted, -1 never
    cumS: jax.Array  # (n,) cumulative s_R (1 - s_R) per sample (summed per group at the end)
    diverge: jax.Array  # () int32: first non-finite step, -1 never
    buf: jax.Array | None  # recorded metrics (R, M) inside the loop; a dict of (R,) after it
    margin_mid: jax.Array  # () smallest margin at the middle step steps // 2 (the trend's anchor)

    def observe(self, t, margin, s, relevant) -> LoopState:
        """First-fit steps and (when the model has token roles) the 𝔖 sums at step ``t``."""
        fitted = margin > 0
        first_fit = jnp.where((self.first_fit < 0) & fitted, t, self.first_fit)
        all_fit = jnp.where((self.all_fit < 0) & jnp.all(fitted), t, self.all_fit)
        cumS = self.cumS
        if relevant is not None:
            sR = relevant(s)
            cumS = cumS + sR * (1 - sR)
        return self._replace(first_fit=first_fit, all_fit=all_fit, cumS=cumS)

    def check(self, t, finite) -> LoopState:
        return self._replace(diverge=jnp.where((self.diverge < 0) & ~finite, t, self.diverge))


def dtype_of(static):
    return jnp.float64 if static.dtype == "float64" else jnp.float32


# A run's recorded states may take this many bytes (R x state); above it, the metrics are
# computed at each recorded step instead (e.g. a d x d W trained on the direct engine).
DEFER_BYTES = 32 << 20


class Recorder(NamedTuple):
    """The dynamics buffer: metrics at the static steps ``record_at`` (0..steps).

    *Deferred* (``view`` given and the states small): a recorded step stores its parameter state
    and the forward pass ``(f, s, a)`` the step computed from it (a few row updates), and every
    metric is computed after the loop, vectorised over the records (``record_fn(now, f, s, a)``,
    the numbers the step itself would have given). Stored, the forward pass is not computed
    again after the loop (``view(now)``, an N x N product per record): measured in turns on 2
    busy cores (S2, d 2000, record_every = 10), 0.57 -> 0.59 of the runs/s without records. The
    rest of a record's cost is its metrics, most of it the test set's 8,000 tokens (an exp each,
    read token-major: :func:`phasebo.data.token_major`); the row writes cost nothing measurable.
    Otherwise the recorded scalars are computed at the step, stacked into one ``(R, M)`` row.
    ``lax.cond`` on an unbatched predicate keeps either off the other steps.
    """

    slot: np.ndarray  # (steps + 1,) buffer row of each step, -1 where nothing is recorded
    record_fn: Callable
    view: Callable | None = None
    names: tuple = ()
    batch_step: bool = False  # the step's forward pass covers a minibatch: store view(now)

    @staticmethod
    def make(steps: int, record_at: tuple[int, ...], record_fn: Callable,
             view: Callable | None = None) -> Recorder:
        slot = np.full(steps + 1, -1, np.int32)
        slot[list(record_at)] = np.arange(len(record_at), dtype=np.int32)
        return Recorder(slot, record_fn, view)

    @property
    def n_rec(self) -> int:
        return int(np.sum(self.slot >= 0))

    def empty(self, dtype, now, *fwd):
        """``(recorder, buffer)`` from abstract values of the state and the forward pass;
        ``buffer`` is None when nothing is recorded."""
        R = self.n_rec
        if not R:
            return self, None
        leaves = jax.tree.leaves((now, fwd))
        nbytes = R * sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves)
        if self.view is not None and nbytes <= DEFER_BYTES:
            return self, jax.tree.map(lambda x: jnp.zeros((R, *x.shape), x.dtype), (now, fwd))
        names = tuple(jax.eval_shape(self.record_fn, now, *fwd))
        rec = self._replace(view=None, names=names)
        return rec, jnp.full((R, len(names)), jnp.nan, dtype)

    def write(self, buf, t, now, f, s, a):
        """Store the state (deferred) or the metrics at step ``t`` if ``t`` is recorded."""
        if buf is None:
            return buf
        k = jnp.asarray(self.slot)[t]

        def store(b):
            fwd = self.view(now) if self.batch_step else (f, s, a)
            return jax.tree.map(lambda bb, x: bb.at[k].set(x), b, (now, fwd))

        def compute(b):
            m = self.record_fn(now, f, s, a)
            row = jnp.stack([jnp.asarray(m[name]).astype(b.dtype) for name in self.names])
            return jax.lax.dynamic_update_slice(b, row[None, :], (k, jnp.zeros((), k.dtype)))

        return jax.lax.cond(k >= 0, store if self.view is not None else compute,
                            lambda b: b, buf)

    def unstack(self, buf) -> dict:
        """The recorded metrics as a dict of ``(R,)`` arrays."""
        if buf is None:
            return {}
        if self.view is not None:
            return jax.vmap(lambda rec: self.record_fn(rec[0], *rec[1]))(buf)
        return {name: buf[:, j] for j, name in enumerate(self.names)}


def run_loop(state, step: Callable, final: Callable, steps: int, record_at, record_fn, *,
             margin_fn: Callable, batch: Batch, relevant: Callable | None, dtype,
             view: Callable | None = None, unroll: int = 1, seen: Callable | None = None,
             mid_margin: Callable | None = None, trip: tuple[int, Callable] | None = None):
    """``steps`` GD steps (full-batch, or minibatches: ``seen``) with the shared bookkeeping.

    ``step(state) -> (now, new, (f, s, a), finite)``: ``now`` is the state at this step (as the
    metrics see it), ``new`` the state after the update, ``finite`` whether the loss, the gradient
    and the update are finite. ``final(state) -> (now, (f, s, a), loss)``. A system whose update
    is cheaper to check from the next forward pass than by reading it (W + p in span form: an
    ``N x N`` matrix per run) gives ``finite = (previous, this)`` and ``final`` a fourth value:
    whether the update of the step before each forward pass was finite, recorded at that step.
    ``record_fn(now, f, s, a) -> dict of scalars``; ``view(now) -> (f, s, a)`` (optional) lets
    the recorder defer the metrics to after the loop (:class:`Recorder`).
    ``seen(new) -> (n,)`` (minibatch steps, whose ``f`` covers one batch): each sample's margin
    when it was last in a batch, read from the new state; the first-fit bookkeeping uses it.
    ``mid_margin(now) -> (n,)``: the margins of the full training set at the middle step (the
    regime's trend needs every sample's current margin, which a batch does not give).
    ``trip = (k, flush)``: the loop runs ``k`` steps per compiled trip and applies ``flush(state)``
    (which must not change what the state means) after each trip and after the last step (W + p
    adds its pending updates to Gamma there: :func:`phasebo.engines.span.span_w_system`).

    Returns ``(now, (f, s, a), LoopState)`` at the last step.
    """
    n = batch.y.shape[0]
    now0, fwd0, *_ = jax.eval_shape(final, state)
    rec, buf = Recorder.make(steps, record_at, record_fn, view)._replace(
        batch_step=seen is not None).empty(dtype, now0, *fwd0)
    ls = LoopState(jnp.full(n, -1, jnp.int32), jnp.asarray(-1, jnp.int32), jnp.zeros(n, dtype),
                   jnp.asarray(-1, jnp.int32), buf, jnp.asarray(jnp.nan, dtype))
    mid = steps // 2

    def one(carry, t):
        state, ls = carry
        now, new, (f, s, a), finite = step(state)
        if isinstance(finite, tuple):  # (the previous step's update, this step)
            ls = ls.check(t - 1, finite[0])
            finite = finite[1]
        margin = margin_fn(f, batch.y) if seen is None else seen(new)
        ls = ls.observe(t, margin, s, relevant)
        if mid_margin is None:
            ls = ls._replace(margin_mid=jnp.where(t == mid, jnp.min(margin).astype(dtype),
                                                  ls.margin_mid))
        else:  # one full pass, at the middle step only (an unbatched predicate: a real branch)
            ls = ls._replace(margin_mid=jax.lax.cond(
                t == mid, lambda: jnp.min(mid_margin(now)).astype(dtype), lambda: ls.margin_mid))
        ls = ls._replace(buf=rec.write(ls.buf, t, now, f, s, a))
        return new, ls.check(t, finite)

    def scanned(carry, t):
        return one(carry, t), None

    if trip is None:
        if steps:
            (state, ls), _ = jax.lax.scan(scanned, (state, ls), jnp.arange(steps, dtype=jnp.int32),
                                          unroll=max(1, min(unroll, steps)))
    else:  # k steps per trip, flushed at its end (a static place: no branch per step)
        k, flush = trip

        def body(carry, t0):  # the k steps as a loop of their own: a step this heavy (an
            # N x N matrix per run) gains nothing from unrolling, and each copy costs compile time
            carry, _ = jax.lax.scan(scanned, carry, t0 + jnp.arange(k, dtype=jnp.int32))
            return (flush(carry[0]), carry[1]), None

        trips = steps // k
        if trips:
            (state, ls), _ = jax.lax.scan(body, (state, ls),
                                          k * jnp.arange(trips, dtype=jnp.int32))
        if steps > trips * k:  # the last steps % k, one loop (not a copy of the step each)
            (state, ls), _ = jax.lax.scan(scanned, (state, ls),
                                          jnp.arange(trips * k, steps, dtype=jnp.int32))
        state = flush(state)
    now, (f, s, a), loss, *previous = final(state)
    t = jnp.asarray(steps, jnp.int32)
    if previous:
        ls = ls.check(t - 1, previous[0])
    ls = ls.observe(t, margin_fn(f, batch.y), s, None)
    ls = ls._replace(buf=rec.write(ls.buf, t, now, f, s, a))
    ls = ls.check(t, jnp.isfinite(loss))
    return now, (f, s, a), ls._replace(buf=rec.unstack(ls.buf))


def flow_loop(state0, field: Callable, view: Callable, static, sw: dict, record_fn, *,
              margin_fn: Callable, batch: Batch, relevant: Callable | None, dtype):
    """The gradient flow of ``field`` to ``static.flow_time`` (:func:`phasebo.flow.solve`) with
    the bookkeeping of :func:`run_loop`: ``(now, (f, s, a), LoopState, flow outputs)``."""
    records = flow.record_times(static.flow_time, static.record_log)
    size = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(state0))
    now, fwd, book = flow.solve(
        state0, field, view, flow_time=static.flow_time, records=records, record_fn=record_fn,
        margin_fn=margin_fn, y=batch.y, relevant=relevant, lr=sw["lr"], rtol=static.flow_rtol,
        atol=static.flow_atol, max_steps=static.flow_max_steps,
        converge_tol=static.flow_converge_tol, dtype=dtype, solver=static.flow_solver,
        defer=len(flow.save_times(static.flow_time, records)) * size <= DEFER_BYTES)
    ls = LoopState(**{k: book[k] for k in LoopState._fields})
    return now, fwd, ls, {k: v for k, v in book.items() if k not in LoopState._fields}


def finish_limit(final: dict, margin, iterations, grad_norm, tol: float, batch: Batch, roles,
                 dtype) -> dict:
    """:func:`finish` for a converged limit (:mod:`phasebo.limit`): its bookkeeping has no time,
    so no step columns."""
    book = limit_book(margin, iterations, grad_norm, tol, dtype)
    ls = LoopState(**{k: book[k] for k in LoopState._fields})
    return no_steps(finish(final, ls, batch, roles, dtype, book), dtype)


# final metrics that are finite in any run that did not diverge (with every ``*_norm``)
FINITE_FINAL = ("train_loss", "test_loss", "margin")


ACCURACIES = ("train_acc", "train_acc_clean", "train_acc_noisy", "test_acc")


def final_finite(final: dict) -> jax.Array:
    """Whether the final losses, smallest margin and parameter norms are finite. Parameters near
    the edge of the float range can train with finite losses and still overflow there (a norm,
    the test logits): such a run diverged at its last step; it is not a phase."""
    keys = [k for k in final if k in FINITE_FINAL or k.endswith("_norm")]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(final[k])) for k in keys])) if keys \
        else jnp.asarray(True)


def last_step(static, sw: dict):
    """The step of a run's final metrics: ``steps`` for GD, ``round(flow_time / lr)`` (its
    GD-equivalent steps, as its ``steps`` column) for a flow."""
    if is_flow(static):
        return jnp.round(static.flow_time / sw["lr"]).astype(jnp.int32)
    return getattr(static, "steps", 0)


def finish(final: dict, ls: LoopState, batch: Batch, roles, dtype, flowed: dict | None = None,
           final_step: int | None = None) -> dict:
    """Add the step-wise bookkeeping to the final metrics (``flowed``: a flow's solver steps,
    convergence and whether it was solved, :func:`flow_loop`). A run whose final metrics are not
    finite (:func:`final_finite`) is diverged, at ``final_step`` (:func:`last_step`) if nothing
    diverged before."""
    noisy = batch.flipped
    first_fit = ls.first_fit
    n_noisy = jnp.sum(noisy)
    fitted_noisy = noisy & (first_fit >= 0)
    all_noisy = jnp.sum(fitted_noisy) == n_noisy
    final = dict(final)
    final["n_noisy"] = n_noisy.astype(jnp.int32)
    final["frac_noisy_fitted"] = jnp.where(
        n_noisy > 0, jnp.sum(fitted_noisy) / jnp.maximum(n_noisy, 1), jnp.nan)
    # step by which every flipped sample had been fitted once: -1 if one never was, and -1 when
    # there is no flipped sample (nothing to fit: not a step, as frac_noisy_fitted is NaN then)
    final["noisy_fit_step"] = jnp.where(
        all_noisy & (n_noisy > 0), jnp.max(jnp.where(noisy, first_fit, 0)), -1).astype(jnp.int32)
    final["mean_noisy_fit_step"] = masked_mean(first_fit.astype(dtype), fitted_noisy)
    final["all_fit_step"] = ls.all_fit
    if roles is not None:
        masks = group_masks(batch.y_clean, batch.flipped)
        for g, mask in zip(GROUPS, masks):
            final[f"cumS_{g}"] = jnp.sum(jnp.where(mask, ls.cumS, 0.0))
    finite = final_finite(final)
    diverge = ls.diverge if final_step is None else \
        jnp.where((ls.diverge < 0) & ~finite, jnp.asarray(final_step, jnp.int32), ls.diverge)
    final["diverge_step"] = diverge
    # the smallest margin at step steps // 2: with the final one, the trend that tells a run still
    # fitting its labels from a settled one (phasebo.regimes)
    final["margin_mid"] = ls.margin_mid
    final["status"] = jnp.where((diverge >= 0) | ~finite, int(Status.DIVERGED),
                                int(Status.OK)).astype(jnp.int32)
    if flowed is not None:
        for k in ("solver_steps", "converged", "converged_step", "converged_time"):
            final[k] = flowed[k]
        if "grad_norm" in flowed:  # the converged limit (phasebo.limit)
            final["limit_grad_norm"] = flowed["grad_norm"]
        final["status"] = jnp.where(
            flowed["solved"], jnp.where(finite, int(Status.OK), int(Status.DIVERGED)),
            int(Status.UNSOLVED)).astype(jnp.int32)
    # at a state that is not finite (diverged, or a flow whose solve stopped: NaN) the outputs
    # are NaN and "margin > 0" holds nowhere: an accuracy of 0 would be a measurement; NaN says
    # there is none (as the losses and margins say)
    for k in [k for k in final if k in ACCURACIES or k.startswith("p_align_")]:
        final[k] = jnp.where(finite, final[k], jnp.nan).astype(final[k].dtype)
    return final


# --------------------------------------------------------------------------------------------
# Metrics of a model at a state
# --------------------------------------------------------------------------------------------


def evaluate(model, static, sw: dict, m, f, s, a, batch: Batch, test: Batch, roles) -> dict:
    """Every metric of ``model`` at parameters ``m`` and training forward pass ``(f, s, a)``."""
    margin, loss = model.margin_loss(f, batch.y)
    out = train_metrics(margin, loss, s, batch, roles)
    ft = model.test_output(m, test, static, sw)
    tm, tl = model.margin_loss(ft, test.y_clean)
    out["test_acc"] = jnp.mean((tm > 0).astype(tm.dtype))
    out["test_loss"] = tl
    out.update(model.param_metrics(m, static, sw))
    out.update(model.extra_metrics(m, f, s, a, batch, out))
    return out


def tracked(static, batch: Batch):
    """The samples whose per-token attention is recorded: ``static.track`` or the default pair."""
    track = getattr(static, "track", ())
    return tuple(track) if track else tracked_default(batch)


def recorder_fn(model, static, sw, metrics: Callable, batch: Batch) -> Callable:
    """``record_fn(m, f, s, a)``: the metrics plus the tracked samples' per-token attention."""
    track = tracked(static, batch)
    present = None if getattr(static, "track", ()) else (jnp.any(~batch.flipped),
                                                           jnp.any(batch.flipped))

    def record(m, f, s, a):
        out = metrics(m, f, s, a)
        logits = a[0] if isinstance(a, tuple) else a
        out.update(tracked_token_metrics(s, logits, track, logits=model.track_logits,
                                         present=present))
        return out

    return record


# --------------------------------------------------------------------------------------------
# The direct engine's run
# --------------------------------------------------------------------------------------------


def run(model, static, sw: dict, key: jax.Array) -> RunOutput:
    """Train ``model`` on data drawn from ``key`` by GD (optax, the model's rule), full-batch or
    in minibatches (``batch_size``, :func:`minibatch_step`).

    ``sw`` holds scalar arrays: the model's swept settings and its derived values
    (:meth:`phasebo.models.Model.derived`).
    """
    k_data, k_test, k_init = model.keys(key)
    roles = model.roles(static)
    batch = model.sample(static, sw, k_data, test=False)
    test = model.sample(static, sw, k_test, test=True)
    params, fixed = model.init(static, sw, k_init, batch)

    def combine(p):
        return p if fixed is None else eqx.combine(p, fixed)

    aux = model.precompute(combine(params), batch, static)

    def forward(p):
        m = combine(p)
        f, s, a = model.forward(m, batch, aux)
        return model.margin_loss(f, batch.y)[1], (f, s, a)

    def metrics(p, f, s, a):
        return evaluate(model, static, sw, combine(p), f, s, a, batch, test, roles)

    steps = getattr(static, "steps", 0) if model.trains else 0
    opt = model.optimizer(static, sw) if model.trains and not (is_flow(static) or is_limit(static)) \
        else None
    state = (params, opt.init(params) if opt is not None else None)

    def step(state):
        p, opt_state = state
        (loss, (f, s, a)), g = jax.value_and_grad(forward, has_aux=True)(p)
        updates, opt_state = opt.update(g, opt_state, p)
        new = optax.apply_updates(p, updates)
        finite = jnp.isfinite(loss) & all_finite(g) & all_finite(new)
        return p, (new, opt_state), (f, s, a), finite

    def final(state):
        loss, fwd = forward(state[0])
        return state[0], fwd, loss

    relevant = None if roles is None else (lambda s_: relevant_mass(s_, roles))
    record_fn = recorder_fn(model, static, sw, metrics, batch)
    dtype = dtype_of(static)
    seen = None
    if minibatched(static) and opt is not None:
        step, seen = minibatch_step(model, static, opt, combine, batch, aux, jr.fold_in(key, 3))
        state = (*state, jnp.zeros((), jnp.int32), jnp.full(batch.y.shape[0], -jnp.inf, dtype))
        relevant = None  # the attention sums need every sample at every step: not kept
        full_record = record_fn

        def record_fn(now, f, s, a):  # the step's (f, s, a) covers one batch: the full pass
            return full_record(now, *forward(now)[1])

    def margin_fn(f_, y_):
        return model.margin_loss(f_, y_)[0]

    flowed = None
    if is_limit(static):  # the minimiser of the weight-decayed loss (phasebo.limit)
        objective = weight_decayed(lambda p_: forward(p_)[0], sw["weight_decay"])
        p, k, gn = minimise(objective, params, tol=static.limit_tol,
                            max_iters=static.limit_max_iters, warmup=static.limit_warmup,
                            lr=sw["lr"])
        f, s, a = forward(p)[1]
        final_metrics = finish_limit(metrics(p, f, s, a), margin_fn(f, batch.y), k, gn,
                                     static.limit_tol, batch, roles, dtype)
        samples = model.samples(combine(p), f, s, a, batch, test, static, sw,
                                jnp.full(batch.y.shape, -1, jnp.int32))
        return RunOutput(final_metrics, {}, samples)
    if is_flow(static):
        wd = sw.get("weight_decay")

        def field(p):  # theta' = -grad L - lambda theta (phasebo.flow)
            (_, fwd), g = jax.value_and_grad(forward, has_aux=True)(p)
            if wd is None:
                return jax.tree.map(jnp.negative, g), fwd
            return jax.tree.map(lambda gi, pi: -gi - wd * pi, g, p), fwd

        p, (f, s, a), ls, flowed = flow_loop(
            params, field, lambda p_: forward(p_)[1], static, sw, record_fn,
            margin_fn=margin_fn, batch=batch, relevant=relevant, dtype=dtype)
    else:
        p, (f, s, a), ls = run_loop(state, step, final, steps, model.recorded_steps(static),
                                    record_fn, margin_fn=margin_fn, batch=batch,
                                    relevant=relevant, dtype=dtype,
                                    view=lambda p_: forward(p_)[1], seen=seen,
                                    mid_margin=None if seen is None else
                                    (lambda p_: margin_fn(forward(p_)[1][0], batch.y)))
    final_metrics = finish(metrics(p, f, s, a), ls, batch, roles, dtype, flowed,
                           last_step(static, sw) if model.trains else 0)
    if seen is not None and roles is not None:
        for g in GROUPS:  # not accumulated in minibatch training (above): not a measured zero
            final_metrics[f"cumS_{g}"] = jnp.asarray(jnp.nan, dtype)
    samples = model.samples(combine(p), f, s, a, batch, test, static, sw, ls.first_fit)
    return RunOutput(final_metrics, ls.buf, samples)


def minibatch_step(model, static, opt, combine: Callable, batch: Batch, aux, key: jax.Array):
    """``(step, seen)`` of minibatch training for :func:`run_loop`.

    Epoch ``e = t // k`` (``k = ceil(n / B)`` batches of ``B = batch_size``) visits the samples in
    the order ``permutation(fold_in(key, e), n)``; step ``t`` takes batch ``t mod k`` of it, the
    last one holding the ``n - (k - 1) B`` remaining samples (padded to ``B`` and masked out of
    the mean loss), as a PyTorch ``DataLoader(shuffle=True)``. The gradient is that of the batch's
    mean loss. The state is ``(params, opt_state, t, seen)``: ``seen`` holds each sample's margin
    from the last batch it was in (``-inf`` before), so a sample counts as fitted from the step
    at which a batch first saw it fitted: up to two epochs after it was (a fresh order each
    epoch), and a fit that comes and goes between two visits is not seen. The final accuracies
    and margins, and the middle step's margin of the regime's trend, are full passes.
    """
    n, B = batch.y.shape[0], static.batch_size
    k = epoch_steps(n, B)
    data = (batch._replace(z=None), aux)

    def batch_loss(p, sub, valid):
        f, s, a = model.forward(combine(p), sub[0], sub[1])
        # per-sample losses: the model's mean loss of each sample alone, averaged over the batch
        per = jax.vmap(lambda fi, yi: model.margin_loss(fi[None], yi[None])[1])(f, sub[0].y)
        loss = jnp.sum(jnp.where(valid, per, 0.0)) / jnp.sum(valid).astype(per.dtype)
        return loss, (f, s, a)

    def step(state):
        p, opt_state, t, seen = state
        order = jr.permutation(jr.fold_in(key, t // k), n)
        pos = (t % k) * B + jnp.arange(B, dtype=jnp.int32)
        valid = pos < n
        idx = order[jnp.minimum(pos, n - 1)]
        sub = jax.tree.map(lambda x: x[idx], data)
        (loss, (f, s, a)), g = jax.value_and_grad(batch_loss, has_aux=True)(p, sub, valid)
        updates, opt_state = opt.update(g, opt_state, p)
        new = optax.apply_updates(p, updates)
        finite = jnp.isfinite(loss) & all_finite(g) & all_finite(new)
        margin = model.margin_loss(f, sub[0].y)[0].astype(seen.dtype)
        # padded rows repeat the last sample: write only the valid ones (a drop-mode scatter)
        seen = seen.at[jnp.where(valid, idx, n)].set(margin, mode="drop")
        return p, (new, opt_state, t + 1, seen), (f, s, a), finite

    return step, lambda state: state[3]
