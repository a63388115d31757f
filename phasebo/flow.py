r"""Gradient flow: the ``lr -> 0`` limit of full-batch gradient descent, to long horizons.

A run with ``dynamics = "flow"`` integrates

    ``theta'(tau) = -grad L(theta(tau)) - lambda theta(tau)``,    ``theta(0) = theta_0``,

to the flow time ``tau = flow_time`` with diffrax (the explicit Runge-Kutta scheme
``flow_solver``, :data:`SOLVERS`; a PID step-size controller with the tolerances ``flow_rtol``,
``flow_atol``; at most ``flow_max_steps`` solver steps). Gradient
descent at step ``lr`` is this field's explicit Euler scheme, so GD's ``steps`` steps reach flow
time ``lr x steps``; the flow is what GD converges to as ``lr -> 0`` at a fixed ``tau``. The
state is whatever the engine steps: the model's parameters (direct engine) or the span
coefficients (gram and reduced engines, :func:`phasebo.engines.span.span_field`), so the flow's
cost does not depend on ``d`` where GD's does not. Attention gaps grow like ``log tau``, so an
adaptive solver takes about as many steps per decade of ``tau`` at ``tau = 10^5`` as at ``10``.

**The step axis.** Tables, regimes and figures count time in steps; a flow run counts its
**GD-equivalent steps** ``round(tau / lr)``: its ``steps`` column is ``round(flow_time / lr)``,
a recorded time ``tau_k`` is the dynamics row of step ``round(tau_k / lr)``, and the ``time``
column holds ``tau`` itself (``lr x step`` for a GD run), so flow and GD runs share every axis.

**Bookkeeping** as :func:`phasebo.train.run_loop` does it, in flow time:

- ``cumS`` (the 𝔖 sums) is integrated with the state, ``int_0^tau s_R (1 - s_R) dtau / lr``
  (a Riemann sum of GD's per-step sums);
- first-fit steps are read at :data:`N_CHECK` log-spaced check times over the last
  :data:`DECADES` decades of the horizon (about 12 % apart in time), at ``tau / 2`` and at the
  recorded times: a sample's margin is interpolated linearly in ``log tau`` between the last
  check at which it is negative and the first at which it is positive (a sample fitted before
  the first check time gets that time), in GD-equivalent steps;
- ``margin_mid`` is the smallest margin at ``tau / 2`` (the still-fitting rule's earlier point);
- a solve that does not reach ``tau`` (``flow_max_steps`` spent, or a non-finite state) is data:
  status ``unsolved`` (regime ``unsolved``, left out of the maps), ``diverge_step`` the first
  check time it did not reach, its losses and norms at the horizon and its recorded metrics past
  that time NaN (its final accuracies read 0, as a diverged GD run's). ``solver_steps`` counts
  the solver's steps.
"""

from __future__ import annotations

from collections.abc import Callable

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .metrics import all_finite

N_CHECK = 100  # check times for the first-fit steps, log-spaced over the last DECADES decades
DECADES = 5.0
ACC_TOL = 0.005  # test accuracy moves by at most this over a settled decade
MOVED = 0.8  # a settled decade moves the outputs by at most this fraction of their move since 0
class Bosh3Unrolled(diffrax.Bosh3):
    """diffrax's Bosh3 (Bogacki-Shampine 3(2), FSAL, Hermite dense output) with its three stages
    written out, for diffrax to drive: the step-size controller, the saves, the interpolation and
    the result codes stay diffrax's. diffrax runs an RK step's stages as an inner loop (one code
    for every tableau, explicit or implicit), with the stages written into a buffer: on the CPU a
    vmapped block pays each operation's dispatch, so the loop's bookkeeping cost as much as the
    small stages themselves. Written out, XLA fuses the stages' arithmetic: 1.09-1.17x the flow's
    runs/s at (d, ||mu||) = (1000, 100) (same runs, interleaved, 2 cores), with every stage,
    weight and error estimate the same as :class:`diffrax.Bosh3` (tested in float64).

    ``k_i = h f(t_0 + c_i h, y_0 + h sum_j a_ij f_j)`` with ``c = (0, 1/2, 3/4, 1)``,
    ``y_1 = y_0 + (2/9) k_1 + (1/3) k_2 + (4/9) k_3``, ``f_4 = f(t_1, y_1)`` reused as the next
    step's ``f_1`` (FSAL), error ``(2/9 - 7/24) k_1 + (1/3 - 1/4) k_2 + (4/9 - 1/3) k_3 - k_4/8``."""

    def init(self, terms, t0, t1, y0, args):
        return jnp.array(False), terms.vf(t0, y0, args)  # f(t_0, y_0): the first step's f_1

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        _, f1 = solver_state
        if made_jump is not False:  # diffrax resolves it to False at trace time without jumps
            f1 = jax.lax.cond(made_jump, lambda: terms.vf(t0, y0, args), lambda: f1)
        tree, dt, h = jax.tree.map, terms.contr(t0, t1), t1 - t0

        def k(t, y):
            f = terms.vf(t, y, args)
            return f, terms.prod(f, dt)

        k1 = terms.prod(f1, dt)
        _, k2 = k(t0 + 0.5 * h, tree(lambda y, a: y + 0.5 * a, y0, k1))
        _, k3 = k(t0 + 0.75 * h, tree(lambda y, b: y + 0.75 * b, y0, k2))
        y1 = tree(lambda y, a, b, c: y + (2 / 9) * a + (1 / 3) * b + (4 / 9) * c, y0, k1, k2, k3)
        f4, k4 = k(t1, y1)
        err = tree(lambda a, b, c, e: (2 / 9 - 7 / 24) * a + (1 / 3 - 1 / 4) * b
                   + (4 / 9 - 1 / 3) * c - e / 8, k1, k2, k3, k4)
        # the Hermite interpolation reads the first and the last increment (from_k)
        dense = dict(y0=y0, y1=y1, k=tree(lambda a, e: jnp.stack([a, e]), k1, k4))
        return y1, err, dense, (jnp.array(False), f4), diffrax.RESULTS.successful


# flow_solver -> diffrax solver. Bosh3 is the default: where the flow is stiff (large ||mu||: the
# step size is held by stability, loosening rtol adds steps) it reaches tau with fewer gradients
# (3 per step against Tsit5's 6, and a larger stability interval per gradient), and at the default
# tolerances it is as accurate as Tsit5 (python -m phasebo.bench --sections flow; docs/science.md)
SOLVERS = {"bosh3": Bosh3Unrolled, "tsit5": diffrax.Tsit5, "dopri5": diffrax.Dopri5,
           "dopri8": diffrax.Dopri8}
STEP_MAX = np.iinfo(np.int32).max  # GD-equivalent steps are int32 in a run (checked in config)
STEP_MAX_F32 = 2**24  # ... and exact integers in float32 up to here


def is_flow(static) -> bool:
    """Whether a run's settings ask for the gradient flow (``dynamics = "flow"``)."""
    return getattr(static, "dynamics", "gd") == "flow"


def record_times(flow_time: float, record_log: int) -> tuple[float, ...]:
    """Flow times at which a flow run records its dynamics: 0, ``record_log`` log-spaced times
    over the last :data:`DECADES` decades of ``flow_time``, and every decade end
    ``flow_time * 10^-j`` (so the maps at tau / 10, tau / 100, ... are recorded exactly)."""
    if not record_log:
        return ()
    t = np.geomspace(flow_time * 10.0**-DECADES, flow_time, record_log)
    t = np.r_[0.0, t, decade_ends(flow_time)]
    return tuple(float(v) for v in np.unique(_stored(t)))


def _stored(t) -> np.ndarray:
    """Flow times as the tables hold them: rounded to 12 decimals (a tidy ``time`` column) where
    that moves them by at most 1e-9 of themselves."""
    t = np.asarray(t, dtype=float)
    r = np.round(t, 12)
    return np.where(np.abs(r - t) <= 1e-9 * np.abs(t), r, t)


def check_times(flow_time: float, records: tuple[float, ...]) -> tuple[np.ndarray, int]:
    """``(times, mid)``: the check times (sorted, unique, ``flow_time`` last) and the index of
    ``flow_time / 2`` among them."""
    t = np.geomspace(flow_time * 10.0**-DECADES, flow_time, N_CHECK)
    t = np.unique(np.r_[t, flow_time / 2, flow_time, [r for r in records if r > 0]])
    return t, int(np.searchsorted(t, flow_time / 2))


def steps_of(t, lr) -> jax.Array:
    """GD-equivalent steps ``round(t / lr)`` (int32)."""
    return jnp.clip(jnp.round(t / lr), 0, STEP_MAX - 255).astype(jnp.int32)  # f32-exact bound


def save_times(flow_time: float, records: tuple[float, ...]) -> np.ndarray:
    """Every flow time at which a run's state is read: the check times, the decade ends and the
    recorded times (sorted, unique)."""
    return np.unique(np.r_[check_times(flow_time, records)[0], decade_ends(flow_time),
                           np.asarray(records, dtype=float)])


def decade_ends(flow_time: float) -> np.ndarray:
    """``flow_time * 10^-j`` for ``j = DECADES .. 0``: where convergence is judged."""
    # rounded as record_times rounds, so that the decade ends are recorded times exactly
    return _stored(flow_time * 10.0 ** -np.arange(int(DECADES), -1, -1, dtype=float))


def _cos_distance(u, v):
    """``1 - cos(u, v)`` along the last axis (0 for two zero vectors)."""
    nu, nv = jnp.linalg.norm(u, axis=-1), jnp.linalg.norm(v, axis=-1)
    both = (nu > 0) & (nv > 0)
    c = jnp.sum(u * v, axis=-1) / jnp.where(both, nu * nv, 1.0)
    return jnp.where(both, 1.0 - c, jnp.where((nu > 0) | (nv > 0), 1.0, 0.0))


def settled(margins, outputs, logits, test_acc, tol, start=None):
    """Whether each decade ``(e_{i-1}, e_i]`` of :func:`decade_ends` is settled (``(J,)`` for
    ``J + 1`` decade ends): the same training samples fitted at both ends, test accuracy within
    :data:`ACC_TOL`, and the directions of the attention logits (the first entry of a model's
    logits: the first layer's for a stack) and of the outputs on the training set each turned
    by a cosine distance of at most ``tol``.

    ``start``: the outputs on the training set at time 0. The outputs must then also have moved
    over the decade by at most :data:`MOVED` of their move since time 0 (Euclidean): early in a
    flow, on its first straight stretch, a decade's turn is small only because the whole path is,
    and the decade holds 90 % of it, which is no convergence (a flow to 0.05 read as converged
    from 5e-6)."""
    same_fit = jnp.all((margins[1:] > 0) == (margins[:-1] > 0), axis=-1)
    acc = jnp.abs(test_acc[1:] - test_acc[:-1]) <= ACC_TOL + 1e-6  # accuracies are k / n_test
    turn_lg = _cos_distance(logits[1:], logits[:-1])
    turn_out = _cos_distance(outputs[1:], outputs[:-1])
    ok = same_fit & acc & (jnp.maximum(turn_lg, turn_out) <= tol)
    if start is not None:
        step = jnp.linalg.norm(outputs[1:] - outputs[:-1], axis=-1)
        ok &= step <= MOVED * jnp.linalg.norm(outputs[1:] - start[None], axis=-1)
    return ok


def solve(state0, field: Callable, view: Callable, *, flow_time: float, records, record_fn,
          margin_fn: Callable, y, relevant: Callable | None, lr, rtol: float, atol: float,
          max_steps: int, converge_tol: float, dtype, solver: str = "bosh3", defer: bool = True):
    """Integrate ``field`` from ``state0`` to ``flow_time``.

    ``field(state) -> (state', (f, s, a))``: the flow's right-hand side and the forward pass it
    computed; ``view(state) -> (f, s, a)``; ``record_fn(state, f, s, a) -> dict`` of scalars;
    ``margin_fn(f, y) -> (n,)``; ``solver``: a key of :data:`SOLVERS`; ``defer``: save the
    states at :func:`save_times` and compute everything read from them after the solve,
    vectorised (else at each save, for states too large to keep that many of). Returns
    ``(now, (f, s, a), bookkeeping)`` with ``bookkeeping`` the fields of
    :class:`phasebo.train.LoopState` (``buf``: the recorded metrics with their ``step`` and
    ``time``) and ``solver_steps``, ``solved``.
    """
    n = y.shape[0]

    def rhs(t, yy, args):
        state, _ = yy
        d, (_, s, _) = field(state)
        if relevant is None:
            return d, jnp.zeros(n, dtype)
        sR = relevant(s)
        return d, sR * (1 - sR)

    checks, mid = check_times(flow_time, records)

    def margins_of(state):
        return margin_fn(view(state)[0], y)

    ends = decade_ends(flow_time)

    def at_end(state, with_test=True):  # what convergence is judged on (settled)
        f, s, a = view(state)
        lg = a[0] if isinstance(a, tuple) else a
        out = margin_fn(f, y), f.reshape(-1), lg.reshape(-1)
        return (*out, record_fn(state, f, s, a)["test_acc"]) if with_test else out

    def record(state):
        return record_fn(state, *view(state))

    if defer:
        # one save of the state at every time anything is read, the metrics computed after the
        # solve, batched: inside the vmapped solve, a save's function runs for every run of the
        # block whenever any of them crosses a save time (measured: 1.3x faster at (1000, 100)
        # than computing the margins and the decade ends' test metrics at each save)
        saves = save_times(flow_time, records)
        subs = [diffrax.SubSaveAt(ts=jnp.asarray(saves, dtype), fn=lambda t, yy, args: yy[0]),
                diffrax.SubSaveAt(t1=True)]
    else:
        subs = [diffrax.SubSaveAt(ts=jnp.asarray(checks, dtype),
                                  fn=lambda t, yy, args: margins_of(yy[0])),
                diffrax.SubSaveAt(t1=True),
                diffrax.SubSaveAt(ts=jnp.asarray(ends, dtype),
                                  fn=lambda t, yy, args: at_end(yy[0]))]
        if records:
            subs.append(diffrax.SubSaveAt(ts=jnp.asarray(records, dtype),
                                          fn=lambda t, yy, args: record(yy[0])))
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs), SOLVERS[solver](), t0=0.0, t1=flow_time, dt0=None,
        y0=(state0, jnp.zeros(n, dtype)), saveat=diffrax.SaveAt(subs=subs),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol, norm=_state_rms),
        max_steps=max_steps,
        throw=False)
    solved = (sol.result == diffrax.RESULTS.successful) & all_finite(sol.ys[1])
    if defer:
        def read(ts, fn):  # fn over the saved states at ts; a time not reached holds inf
            picked = jax.tree.map(lambda v: v[np.searchsorted(saves, ts)], sol.ys[0])
            return jax.vmap(fn)(picked), jax.vmap(all_finite)(picked)

        margins, ok = read(checks, margins_of)
        margins = jnp.where(ok[:, None], margins, jnp.inf)
        buf = dict(read(np.asarray(records), record)[0]) if records else None
        rec = np.asarray(records, dtype=float)
        at = np.minimum(np.searchsorted(rec, ends), max(len(rec) - 1, 0))
        if buf is not None and np.array_equal(rec[at], ends):
            # the decade ends are recorded times (record_times): their test accuracies are the
            # records', not evaluated twice (a test set is most of what a record costs)
            at_ends = (*read(ends, lambda st: at_end(st, False))[0], buf["test_acc"][at])
        else:
            at_ends = read(ends, at_end)[0]
    else:
        margins, at_ends = sol.ys[0], sol.ys[2]
        buf = dict(sol.ys[3]) if records else None
    # margins: (checks, n), not finite where the solve did not reach
    reached = jnp.all(jnp.isfinite(margins), axis=1)
    times = jnp.asarray(checks, dtype)
    t_steps = steps_of(times, lr)
    never = jnp.int32(-1)
    first_fit = _crossing(margins, reached[:, None], times, lr)
    all_fit = _crossing(jnp.min(margins, axis=1), reached, times, lr)
    lost = ~reached
    diverge = jnp.where(solved, never, jnp.where(jnp.any(lost), t_steps[jnp.argmax(lost)],
                                                 t_steps[-1]))
    state, cum = jax.tree.map(lambda v: v[0], sol.ys[1])
    nan = jnp.asarray(jnp.nan, dtype)
    state = jax.tree.map(lambda v: jnp.where(solved, v, nan), state)
    f, s, a = view(state)
    ok = settled(*at_ends, converge_tol, start=view(state0)[0].reshape(-1)) & solved
    # converged since the end of the first decade of the final settled streak
    streak = jnp.flip(jnp.cumprod(jnp.flip(ok).astype(jnp.int32))).astype(bool)
    since = jnp.argmax(streak)  # index into the decades; decade i ends at ends[i + 1]
    converged = ok[-1]
    t_conv = jnp.where(converged, jnp.asarray(ends, dtype)[1:][since], nan)
    if records:
        # a recorded time the solve did not reach holds no state: NaN, not the metrics of inf
        at = np.searchsorted(checks, np.asarray(records))  # records > 0 are check times
        got = jnp.where(jnp.asarray(records) > 0, reached[np.minimum(at, len(checks) - 1)], True)
        buf = {k: jnp.where(got, v, jnp.nan) if jnp.issubdtype(v.dtype, jnp.floating) else v
               for k, v in buf.items()}
        buf["step"] = steps_of(jnp.asarray(records, dtype), lr)
        buf["time"] = jnp.asarray(records, dtype)
    book = dict(first_fit=first_fit, all_fit=all_fit, cumS=jnp.where(solved, cum / lr, nan),
                diverge=diverge, buf=buf,
                margin_mid=jnp.where(reached[mid], jnp.min(margins[mid]), nan).astype(dtype),
                solver_steps=sol.stats["num_steps"].astype(jnp.int32), solved=solved,
                converged=converged, converged_time=t_conv,
                converged_step=jnp.where(converged, steps_of(t_conv, lr), never))
    return state, (f, s, a), book


def _state_rms(scaled_error) -> jax.Array:
    """The step-size controller's error norm: the RMS of the scaled error of the state alone, not
    of the 𝔖 sums integrated beside it. Those are a quadrature of the state, read out, not
    dynamics (as SUNDIALS' CVODES leaves quadratures out of its error test by default). With
    them in, their sharp integrand s_R (1 - s_R) set the step: 1.2-1.8x the solver steps for
    𝔖 sums within 5e-5 of the tight flow, against 4e-4 now (docs/science.md)."""
    leaves = jax.tree.leaves(scaled_error[0])
    return jnp.sqrt(sum(jnp.sum(v**2) for v in leaves) / sum(v.size for v in leaves))


def _crossing(m, reached, times, lr) -> jax.Array:
    """GD-equivalent step at which the margins ``m: (checks, ...)`` first turn positive, -1 never:
    between the two check times around it, the margin is interpolated linearly in log time."""
    fitted = reached & (m > 0)
    k = jnp.argmax(fitted, axis=0)
    kp = jnp.maximum(k - 1, 0)
    m1 = jnp.take_along_axis(m, k[None], 0)[0] if m.ndim > 1 else m[k]
    m0 = jnp.take_along_axis(m, kp[None], 0)[0] if m.ndim > 1 else m[kp]
    lt1, lt0 = jnp.log(times[k]), jnp.log(times[kp])
    w = jnp.where((k > 0) & (m0 <= 0), -m0 / jnp.where(m1 > m0, m1 - m0, 1.0), 1.0)
    t = jnp.exp(lt0 + jnp.clip(w, 0.0, 1.0) * (lt1 - lt0))
    return jnp.where(jnp.any(fitted, axis=0), steps_of(t, lr), jnp.int32(-1))
