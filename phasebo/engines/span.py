r"""Gradient descent in the span of the training tokens: the closed-form steps of the gram and
reduced engines.

**Query only, or query and head** (:func:`span_system`). Let the ``N = n T`` training tokens as the
trainable query sees them be the rows of ``B: (N, D)`` and the logits ``a = B p``. Every gradient
of the loss with respect to ``p`` is ``B^T c`` with ``c = dL/da``, so from ``p_0`` gradient descent
keeps

    ``p_t = g_t p_0 + B^T alpha_t``,   ``a_t = g_t a_0 + K alpha_t``,   ``K = B B^T``,

with ``a_0 = B p_0``. A trained head ``v`` (``h = X v``) is the same:
``v_t = g'_t v_0 + X^T beta_t``, ``h_t = g'_t h_0 + K_v beta_t``. With ``f_i = sum_t s_it h_it``
(``s = softmax(a)``) and the mean logistic loss,

    ``dL/df_i = -y_i sigmoid(-y_i f_i) / n``,  ``c_it = dL/df_i s_it (h_it - f_i)``,
    ``dL/dh_it = dL/df_i s_it``.

Weight decay (``theta <- (1 - lr lambda) theta - lr grad``) multiplies ``alpha, beta, g, g'`` by
``1 - lr lambda``. Norm-constrained GD projects ``p`` (and ``v``) on their balls after every step:
the norms are exact functions of the coefficients and the logits the next forward pass computes
anyway, ``||p||^2 = g^2 ||p_0||^2 + g a_0.alpha + alpha.a`` (because ``alpha.K alpha =
alpha.(a - g a_0)``), so the projection rescales ``(alpha, g)`` (and ``a``) by
``R / sqrt(max(||p||^2, R^2))`` at the start of the next step, exactly as
``optax.projections.projection_l2_ball``. Per step: one ``N x N`` product (two with a head of
another Gram), nothing of size ``D``.

**Query and a trained W** (:func:`span_w_system`, prompt attention ``f = nu^T X^T S(X W p)`` with
``p_0 = 0``). The gradients are ``dL/dp = W^T X^T c`` and ``dL/dW = X^T c p^T``, rank one. By
induction

    ``p_t = W_0^T X^T alpha_t``,    ``W_t = g_t W_0 + X^T Gamma_t X W_0``,

since ``p_{t+1} = (1 - lr lambda) p_t - lr W_t^T X^T c_t = W_0^T X^T [(1 - lr lambda) alpha_t -
lr (g_t c_t + Gamma_t^T K c_t)]`` and ``W_{t+1} = (1 - lr lambda) W_t - lr X^T c_t alpha_t^T X W_0``,
i.e. ``Gamma_{t+1} = (1 - lr lambda) Gamma_t - lr c_t alpha_t^T``, ``g_{t+1} = (1 - lr lambda) g_t``.
The logits are ``a = X W p = g G alpha + K Gamma G alpha`` with ``K = X X^T`` and
``G = (X W_0)(X W_0)^T``. The state is an ``N``-vector and an ``N x N`` matrix; per step five
``N x N`` products and a rank-one update replace the direct engine's ``O(d^2)`` work on W. The
rank-one updates are kept as factors and added to Gamma a few at a time (:class:`WState`), so
Gamma is read twice per step and written once per few steps.
Building ``K, G`` (and, for the metrics, ``X W_0`` and ``W_0 W_0^T X^T``) costs ``O(N d^2)`` once.

**Noise shared along an axis** (:class:`LowRank`). The tokens are noise plus a signal on
``(e1, e2)`` proportional to ``||mu||``: ``X = E + S``, ``S_12 = ||mu|| S_0`` with the pattern
``S_0: (N, 2)`` set by the labels and roles alone, so

    ``X X^T = E E^T + A D A^T``,  ``A = [E_12, S_0]``,  ``D = [[0, ||mu|| I], [||mu|| I, ||mu||^2 I]]``,

and with a ``W``: ``X W = E W + S_12 W_12`` (``W_12`` the first two rows of ``W``), so
``(X W)(X W)^T = (E W)(E W)^T + A' D' A'^T`` with ``A' = [P, S_0]``, ``P = (E W) W_12^T`` and
``D' = [[0, ||mu|| I], [||mu|| I, ||mu||^2 Q]]``, ``Q = W_12 W_12^T`` (:func:`signal_gram`).
Runs that share their noise ``E`` (and ``W_0``) share ``C = E E^T`` and ``A``; only the
``4 x 4`` matrix ``D`` depends on the signal. Written this way, a group of such runs vmapped with
the shared part unbatched steps by one ``(M x N) (N x (N + 4))`` matrix product with ``[C | A]``
and one ``(M x 4) (4 x N)`` product with ``A^T`` instead of ``M`` matrix-vector products, and
builds ``E E^T`` and ``E W_0`` once (the executor's grouped mode, :mod:`phasebo.execute`).
Alone, a run computes the same numbers with ``K`` as one matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..data import Batch
from ..metrics import logistic_loss

# Steps per compiled loop trip. Unrolled, XLA fused the finiteness check of the trip's updates
# into one pass that computed every step's update again (softmax included); one step per trip
# reads each update once. Measured in turns on 2 cores (block of 16 independent runs, d 2000,
# 1000 steps): 1 step per trip 1.08-1.12x the runs/s of 4, 2 steps 1.08x; with records every 10
# steps and for noise groups no measurable change; the same numbers bit for bit.
UNROLL = 1


def flat_gram(B: jax.Array, C: jax.Array | None = None) -> jax.Array:
    """``B: (n, T, D) -> B B^T: (nT, nT)`` (or ``B C^T``)."""
    Bf = B.reshape(-1, B.shape[-1])
    Cf = Bf if C is None else C.reshape(-1, C.shape[-1])
    return Bf @ Cf.T


class LowRank(NamedTuple):
    """``K = C + A D A^T`` stored as ``CA = [C | A]: (N, N + r)`` (shared by the runs of a noise
    group: one matrix product serves both) and ``D: (r, r)`` (symmetric, the run's own)."""

    CA: jax.Array
    D: jax.Array

    @property
    def A(self) -> jax.Array:
        return self.CA[:, self.CA.shape[0]:]


def signal_gram(EW: jax.Array, S0: jax.Array, mu: jax.Array,
                W12: jax.Array | None = None) -> LowRank:
    """The Gram of ``B = E W + ||mu|| S_0 W_12`` as :class:`LowRank` (module docstring): ``EW:
    (N, D)`` the noise as the query sees it (``W = I``: the noise itself, ``W_12 = I``), ``S0:
    (N, 2)`` the signal pattern on ``(e1, e2)`` per unit norm, ``mu`` the signal norm, ``W12:
    (2, D)`` the first two rows of ``W``."""
    mu = jnp.asarray(mu, EW.dtype)
    I2 = jnp.eye(2, dtype=EW.dtype)
    P, Q = (EW[:, :2], I2) if W12 is None else (EW @ W12.T, W12 @ W12.T)
    D = jnp.block([[jnp.zeros_like(I2), mu * I2], [mu * I2, mu**2 * Q]])
    return LowRank(jnp.concatenate([EW @ EW.T, P, S0], 1), D)


def gram_dot(v: jax.Array, K) -> jax.Array:
    """``v K`` for a row vector (or rows) ``v``, ``K`` an array or a :class:`LowRank`
    (``[v C | v A] = v [C | A]``, then ``+ ((v A) D) A^T``: with ``C, A`` shared, a group's rows
    make one matrix product, the rest fused). Every Gram here is symmetric, so ``v K`` is also
    ``(K v^T)^T``."""
    if isinstance(K, LowRank):
        N = K.CA.shape[0]
        P = v @ K.CA
        # (v A) D as multiply-and-sum: XLA fuses it into the step, where a batched
        # (1 x 4)(4 x 4) dot per run would be a slow library call on CPU
        w = jnp.sum(P[..., N:, None] * K.D, axis=-2)
        # and w A^T the same way: as a (rows x 4)(4 x N) dot it was a library call of its own
        # each step (16-20 us for a block of groups, 2 cores), as multiply-and-sum a fusion
        # (~11 us): the shared-noise step 1.055x faster (12 interleaved passes, d 2000)
        return P[..., :N] + jnp.sum(w[..., :, None] * K.A.T, axis=-2)
    return v @ K


def gram_full(K) -> jax.Array:
    """The ``N x N`` matrix of ``K``."""
    if isinstance(K, LowRank):
        N = K.CA.shape[0]
        return K.CA[:, :N] + K.A @ K.D @ K.A.T
    return K


def dense(prob):
    """``prob`` (a :class:`SpanProblem` or :class:`SpanWProblem`) with every :class:`LowRank`
    Gram as one matrix: a run stepped on its own does one product, not three."""
    fields = {f: getattr(prob, f) for f in ("K", "G", "K_head") if hasattr(prob, f)}
    out = {f: gram_full(v) for f, v in fields.items() if isinstance(v, LowRank)}
    if "K_head" in out and fields["K_head"] is fields["K"]:
        out["K_head"] = out["K"]  # one Gram for both: span_system shares their product
    return prob._replace(**out) if out else prob


class SpanCoef(NamedTuple):
    """Coefficients of the query (``alpha``, scale ``gp`` of ``p_0``) and head (``beta``, ``gv``)."""

    alpha: jax.Array
    beta: jax.Array
    gp: jax.Array
    gv: jax.Array


class SpanProblem(NamedTuple):
    """A run in span coordinates: the training and test sets, the Grams, the logits and head
    scores at step 0, and ``params(coef) -> model parameters`` for the metrics."""

    batch: Batch
    test: Batch
    K: jax.Array | LowRank  # (N, N) query-side Gram
    a0: jax.Array  # (n, T)
    h0: jax.Array  # (n, T)
    K_head: jax.Array | None  # (N, N) Gram of the trained head, or None (fixed head)
    p0_sq: jax.Array  # ||p_0||^2 (the projection needs it)
    v0_sq: jax.Array  # ||v_0||^2
    params: Callable
    # () -> F: (N, D) with K = F F^T (the tokens as the query sees them), for the converged
    # limit (span_limit); None where the model does not give one
    factor: Callable | None = None


class SpanWProblem(NamedTuple):
    """Prompt attention with W trained in span coordinates (see the module docstring)."""

    batch: Batch
    test: Batch
    K: jax.Array | LowRank  # X X^T
    G: jax.Array | LowRank  # (X W_0)(X W_0)^T
    h0: jax.Array  # (n, T) head scores (the head is fixed)
    params: Callable  # ((alpha, Gamma, g)) -> model parameters for the metrics


def _softmax_out(a, h):
    s = jax.nn.softmax(a, axis=-1)
    return s, jnp.sum(s * h, axis=-1)


def _grad_logits(y, h, s, f, n):
    gf = -y * jax.nn.sigmoid(-y * f) / n  # dL/df
    return gf, gf[:, None] * s * (h - f[:, None])  # dL/da


def _span_logits(prob: SpanProblem, coef: SpanCoef, scaled: bool):
    """``(a, h)``: logits and head scores of the coefficients (``scaled``: with the scales
    ``gp, gv`` of the initial ones, which only weight decay and the projection change)."""
    K, a0, h0, K_head = prob.K, prob.a0, prob.h0, prob.K_head
    n, T = a0.shape
    head = K_head is not None
    alpha, beta, gp, gv = coef
    a0_ = gp * a0 if scaled else a0
    h0_ = gv * h0 if scaled and head else h0
    if head and K_head is K:  # one product for both when the head sees the same Gram
        ab = jnp.stack([alpha.reshape(-1), beta.reshape(-1)], -1)
        ab = gram_dot(ab.T, K).T  # K is symmetric; a row-vector product streams K in order
        return a0_ + ab[:, 0].reshape(n, T), h0_ + ab[:, 1].reshape(n, T)
    a = a0_ + gram_dot(alpha.reshape(-1), K).reshape(n, T)
    h = h0_ + gram_dot(beta.reshape(-1), K_head).reshape(n, T) if head else h0_
    return a, h


def span_system(prob: SpanProblem, y, lr, weight_decay=None, radius_p=None, radius_v=None):
    """``(state0, step, final, view)`` for :func:`phasebo.train.run_loop` (module docstring).

    ``weight_decay`` None: plain GD (no scaling ops at all); ``radius_p`` (and ``radius_v`` for a
    trained head) None: no projection.
    """
    a0, h0, K_head = prob.a0, prob.h0, prob.K_head
    n, T = a0.shape
    dtype = a0.dtype
    head = K_head is not None
    decay = None if weight_decay is None else lr * weight_decay
    project = radius_p is not None

    def logits(coef):
        return _span_logits(prob, coef, scaled=decay is not None or project)

    def ball(sq, r):
        return r / jnp.sqrt(jnp.maximum(sq, r**2))

    def forward(state):
        coef, pending = state
        a, h = logits(coef)
        if project:  # the projection of the last update (see the module docstring)
            alpha, beta, gp, gv = coef
            cp = ball(jnp.maximum(gp**2 * prob.p0_sq + gp * jnp.sum(a0 * alpha)
                                  + jnp.sum(alpha * a), 0.0), radius_p)
            cp = jnp.where(pending, cp, 1.0)
            alpha, gp, a = cp * alpha, cp * gp, cp * a
            if head:
                cv = ball(jnp.maximum(gv**2 * prob.v0_sq + gv * jnp.sum(h0 * beta)
                                      + jnp.sum(beta * h), 0.0), radius_v)
                cv = jnp.where(pending, cv, 1.0)
                beta, gv, h = cv * beta, cv * gv, cv * h
            coef = SpanCoef(alpha, beta, gp, gv)
        s, f = _softmax_out(a, h)
        return coef, a, h, s, f

    def step(state):
        coef, a, h, s, f = forward(state)
        gf, c = _grad_logits(y, h, s, f, n)
        alpha, beta, gp, gv = coef
        if decay is not None:
            keep = 1 - decay
            alpha, gp = keep * alpha, keep * gp
            if head:
                beta, gv = keep * beta, keep * gv
        alpha = alpha - lr * c
        if head:
            beta = beta - lr * (gf[:, None] * s)
        # diverged at t (as the direct engine: loss, gradient or updated parameters not finite).
        # A non-finite f makes the gradient c non-finite (inf - inf, 0 * inf), so the updated
        # coefficients are finite iff the loss, the gradients and the update all are.
        finite = jnp.all(jnp.isfinite(alpha))
        if head:
            finite = finite & jnp.all(jnp.isfinite(beta))
        new = (SpanCoef(alpha, beta, gp, gv), jnp.asarray(True) if project else None)
        return coef, new, (f, s, a), finite

    def final(state):
        coef, a, h, s, f = forward(state)
        return coef, (f, s, a), jnp.mean(jax.nn.softplus(-y * f))

    def view(coef):  # the forward pass of an (already projected) state
        _, a, _, s, f = forward((coef, jnp.asarray(False) if project else None))
        return f, s, a

    zeros = jnp.zeros((n, T), dtype)
    one = jnp.ones((), dtype)
    coef0 = SpanCoef(zeros, zeros if head else None, one, one if head else None)
    return (coef0, jnp.asarray(False) if project else None), step, final, view


def span_field(prob: SpanProblem, y, weight_decay=None):
    """``(coef0, field, view)`` of the gradient flow in span coordinates: the limit ``lr -> 0`` of
    :func:`span_system`'s steps, ``alpha' = -c - lambda alpha``, ``g' = -lambda g``,
    ``beta' = -dL/dh - lambda beta``, ``g'' = -lambda g'`` (each GD step is an Euler step of
    this field). ``field(coef) -> (coef', (f, s, a))``."""
    a0 = prob.a0
    n, T = a0.shape
    head = prob.K_head is not None
    lam = weight_decay

    def view(coef):
        a, h = _span_logits(prob, coef, scaled=lam is not None)
        s, f = _softmax_out(a, h)
        return f, s, a

    def field(coef):
        alpha, beta, gp, gv = coef
        a, h = _span_logits(prob, coef, scaled=lam is not None)
        s, f = _softmax_out(a, h)
        gf, c = _grad_logits(y, h, s, f, n)
        d_alpha, d_gp = -c, jnp.zeros_like(gp)
        d_beta = -(gf[:, None] * s) if head else None
        d_gv = jnp.zeros_like(gv) if head else None
        if lam is not None:
            d_alpha, d_gp = d_alpha - lam * alpha, d_gp - lam * gp
            if head:
                d_beta, d_gv = d_beta - lam * beta, d_gv - lam * gv
        return SpanCoef(d_alpha, d_beta, d_gp, d_gv), (f, s, a)

    zeros = jnp.zeros((n, T), a0.dtype)
    one = jnp.ones((), a0.dtype)
    return SpanCoef(zeros, zeros if head else None, one, one if head else None), field, view


class WState(NamedTuple):
    """GD's state of prompt attention with W trained: ``Gamma_t = s Gamma + Cb^T Ab``, the last
    ``j`` rank-one updates kept as factors (rows ``Cb[i] = -lr c_i``, ``Ab[i] = alpha_i``, the rows
    after ``j`` zero) and added into ``Gamma`` every :data:`PENDING` steps (see
    :func:`span_w_system`)."""

    alpha: jax.Array
    Gamma: jax.Array
    g: jax.Array
    s: jax.Array
    Cb: jax.Array
    Ab: jax.Array
    j: jax.Array


# Rank-one updates of Gamma kept as factors before one rank-PENDING update adds them. Each update
# read and wrote the N x N Gamma of every run, a quarter of a W + p step (profiled); the factors
# cost a few fused (PENDING x N) products per step instead. Measured on one core (d 1000, two noise
# groups of 39 runs, 1000 steps, interleaved): 55-67 runs/s updating every step, 93-121 with 4
# pending, 68-107 with 8 and 43-100 with 16.
PENDING = 4


def gamma_dot(state, u):
    """``Gamma u`` of a W + p state (:class:`WState`, or ``(alpha, Gamma, g)`` of the flow)."""
    if isinstance(state, WState):  # the factors' products as multiply-and-sum: XLA fuses them,
        # where a batched (PENDING x N) dot per run is a slow library call on CPU (measured)
        return state.s * (state.Gamma @ u) + _rows_t(state.Cb, _rows(state.Ab, u))
    return state[1] @ u


def gamma_t_dot(state, w):
    """``Gamma^T w`` of a W + p state (:func:`gamma_dot`)."""
    if isinstance(state, WState):
        return state.s * (w @ state.Gamma) + _rows_t(state.Ab, _rows(state.Cb, w))
    return w @ state[1]


def _rows(M, v):  # M v for a few rows M
    return jnp.sum(M * v[..., None, :], axis=-1)


def _rows_t(M, r):  # M^T r for a few rows M
    return jnp.sum(M * r[..., :, None], axis=-2)


def span_w_system(prob: SpanWProblem, y, lr, weight_decay=None, pending: int = PENDING):
    """``(state0, step, final, view, trip)`` of prompt attention with W trained (module
    docstring).

    Gamma's rank-one update ``-lr c_t alpha_t^T`` is kept as factors for ``pending`` steps and
    then added at once (:class:`WState`): ``Gamma u`` and ``Gamma^T w`` add the factors' part,
    ``Cb^T (Ab u)``, so every step sees the same ``Gamma_t``; with weight decay the scale ``s``
    and the factors shrink by ``1 - lr lambda`` per step. ``trip = (pending, flush)`` for
    :func:`phasebo.train.run_loop`, which flushes after every ``pending`` steps at a static place
    in its loop (a branch on the step count inside the step cost more than it saved)."""
    K, G, h0 = prob.K, prob.G, prob.h0
    n, T = h0.shape
    N = n * T
    dtype = h0.dtype
    decay = None if weight_decay is None else lr * weight_decay
    k = max(1, int(pending))

    def forward(state):
        alpha, g = state[0], state[2]
        u = gram_dot(alpha, G)
        v = gamma_dot(state, u)
        a = (g * u + gram_dot(v, K)).reshape(n, T)
        s, f = _softmax_out(a, h0)
        # Gamma is finite iff Gamma u is, for a finite u: a non-finite entry of row i makes
        # (Gamma u)_i inf or NaN whatever u_j (inf * 0 is NaN). Reading Gamma for it again
        # (an N x N pass per run and step) cost W + p a third of its time.
        gamma_ok = jnp.all(jnp.isfinite(v)) | ~jnp.all(jnp.isfinite(u))
        return a, s, f, gamma_ok

    def flush(st):
        # one pass over Gamma: the rank-k sum fused into it (a dot would write it apart)
        update = jnp.sum(st.Cb[..., :, :, None] * st.Ab[..., :, None, :], axis=-3)
        return st._replace(Gamma=st.s * st.Gamma + update, s=jnp.ones_like(st.s),
                           Cb=jnp.zeros_like(st.Cb), Ab=jnp.zeros_like(st.Ab),
                           j=jnp.zeros_like(st.j))

    def step(state):
        alpha, g = state.alpha, state.g
        a, s, f, gamma_ok = forward(state)
        _, c = _grad_logits(y, h0, s, f, n)
        c = c.reshape(-1)
        z = gamma_t_dot(state, gram_dot(c, K))
        keep = 1 if decay is None else 1 - decay
        Cb = jax.lax.dynamic_update_index_in_dim(keep * state.Cb, -lr * c, state.j, 0)
        Ab = jax.lax.dynamic_update_index_in_dim(state.Ab, alpha, state.j, 0)
        new = WState(keep * alpha - lr * (g * c + z), state.Gamma, keep * g, keep * state.s,
                     Cb, Ab, state.j + 1)
        # the new Gamma is checked by the next forward pass (gamma_ok there), for the step that
        # made it (phasebo.train.run_loop): a run diverges at the same step as if it were read here
        finite = jnp.all(jnp.isfinite(f)) & jnp.all(jnp.isfinite(new.alpha))
        return state, new, (f, s, a), (gamma_ok, finite)

    def final(state):
        a, s, f, gamma_ok = forward(state)
        return state, (f, s, a), jnp.mean(jax.nn.softplus(-y * f)), gamma_ok

    def view(state):
        a, s, f, _ = forward(state)
        return f, s, a

    one = jnp.ones((), dtype)
    state0 = WState(jnp.zeros(N, dtype), jnp.zeros((N, N), dtype), one, one,
                    jnp.zeros((k, N), dtype), jnp.zeros((k, N), dtype), jnp.zeros((), jnp.int32))
    return state0, step, final, view, (k, flush)


def span_w_field(prob: SpanWProblem, y, weight_decay=None):
    """``(state0, field, view)`` of the gradient flow of prompt attention with W trained, in the
    coordinates of :func:`span_w_system`: ``alpha' = -(g c + Gamma^T K c) - lambda alpha``,
    ``Gamma' = -c alpha^T - lambda Gamma``, ``g' = -lambda g`` (GD's steps are its Euler steps)."""
    state0, _, _, view, _ = span_w_system(prob, y, jnp.ones((), prob.h0.dtype), weight_decay)
    state0 = (state0.alpha, state0.Gamma, state0.g)  # no pending updates in a flow
    K, h0 = prob.K, prob.h0
    n = h0.shape[0]

    def field(state):
        alpha, Gamma, g = state
        f, s, a = view(state)
        _, c = _grad_logits(y, h0, s, f, n)
        c = c.reshape(-1)
        d = (-(g * c + Gamma.T @ gram_dot(c, K)), -jnp.outer(c, alpha), jnp.zeros_like(g))
        if weight_decay is not None:
            d = (d[0] - weight_decay * alpha, d[1] - weight_decay * Gamma, -weight_decay * g)
        return d, (f, s, a)

    return state0, field, view


def span_limit(prob: SpanProblem, y, weight_decay, *, tol: float, max_iters: int,
               warmup: int = 0, lr=None):
    """``(coef, (f, s, a), iterations, grad norm)``: the minimiser of the weight-decayed loss in
    span coordinates (:mod:`phasebo.limit`), for a run trained from zero (``p_0 = v_0 = 0``) whose
    head, if trained, sees the same Gram. With a factor ``F`` of the Gram (``K = F F^T``, the
    tokens themselves: ``prob.factor``), ``u = F^T alpha`` is the parameter itself
    (``||p|| = ||u||``, ``a = F u``), so L-BFGS on ``u`` takes the same iterates as the direct
    engine on ``p``; ``alpha`` then solves ``K alpha = F u`` (conjugate gradients: a batched
    LAPACK call deadlocks XLA's CPU thread pool when two devices run it at once)."""
    from jax.scipy.sparse.linalg import cg

    from ..limit import minimise, weight_decayed

    F = prob.factor()
    K = gram_full(prob.K)
    h0 = prob.h0
    n, T = h0.shape
    head = prob.K_head is not None
    if head and prob.K_head is not prob.K:
        raise NotImplementedError("span_limit: a head with a Gram of its own")

    def forward(x):
        u, w = x
        a = (F @ u).reshape(n, T)
        h = h0 + (F @ w).reshape(n, T) if head else h0
        s, f = _softmax_out(a, h)
        return f, s, a

    J = weight_decayed(lambda x: logistic_loss(y * forward(x)[0]), weight_decay)
    zero = jnp.zeros(F.shape[1], h0.dtype)
    x, k, g = minimise(J, (zero, zero if head else None), tol=tol, max_iters=max_iters,
                       warmup=warmup, lr=lr)
    u, w = x

    def coefficients(v):  # alpha with F^T alpha = v, v in the row space of F^T
        return cg(lambda z: K @ z, F @ v, tol=1e-13, maxiter=10 * K.shape[0])[0].reshape(n, T)

    one = jnp.ones((), h0.dtype)
    coef = SpanCoef(coefficients(u), coefficients(w) if head else None, one,
                    one if head else None)
    return coef, forward(x), k, g
