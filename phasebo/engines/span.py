"""Gradient descent in the span of the training tokens: the loop shared by the gram and reduced engines.

Let the ``N = n T`` training tokens (as seen by the trainable query) be the rows of ``B: (N, D)``
and the attention logits be ``a = B p``. Every gradient of the logistic loss with respect to ``p``
is ``B^T c`` with ``c = dL/da``, so from ``p_0`` gradient descent keeps

    ``p_t = p_0 + B^T alpha_t``,   ``alpha_{t+1} = alpha_t - lr c_t``,   ``a_t = a_0 + K alpha_t``

with ``a_0 = B p_0`` and the Gram matrix ``K = B B^T``. A trained head ``v`` (single-head attention,
``h = X v``) is the same: ``v_t = v_0 + X^T beta_t`` and ``h_t = h_0 + K_v beta_t``. Per step this
costs one ``N x N`` matrix-vector product instead of two ``N x D`` ones, and nothing in the loop
depends on ``D``.

With ``f_i = sum_t s_it h_it`` (``s = softmax(a)`` over the T tokens) and the mean logistic loss
``L = mean_i softplus(-y_i f_i)``:

    ``dL/df_i = -y_i sigmoid(-y_i f_i) / n``,
    ``c_it = dL/da_it = dL/df_i  s_it (h_it - f_i)``,   ``dL/dh_it = dL/df_i  s_it``.

The loop keeps the direct engine's bookkeeping exactly (:func:`phasebo.train.gd_loop`): at step
``t`` (the state after ``t`` updates) it updates the first-fit steps, adds ``s_R (1 - s_R)`` to the
cumulative sums, flags a non-finite loss or gradient, and writes the recorded metrics; after the
last update it evaluates the final state.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..data import Batch
from ..train import Recorder, fit_bookkeeping, group_masks

# Loop iterations per compiled loop trip: the per-step work is small (one N x N product), so the
# while-loop's own overhead matters on CPU.
UNROLL = 4


def flat_gram(B: jax.Array, C: jax.Array | None = None) -> jax.Array:
    """``B: (n, T, D) -> B B^T: (nT, nT)`` (or ``B C^T``)."""
    Bf = B.reshape(-1, B.shape[-1])
    Cf = Bf if C is None else C.reshape(-1, C.shape[-1])
    return Bf @ Cf.T


def span_gd(
    K: jax.Array,
    a0: jax.Array,
    h0: jax.Array,
    lr: jax.Array,
    steps: int,
    record_at: tuple[int, ...],
    record_fn: Callable,
    batch: Batch,
    relevant: np.ndarray,
    K_head: jax.Array | None = None,
    decay: jax.Array | None = None,
    unroll: int | None = None,
):
    """GD on the span coefficients; mirrors :func:`phasebo.train.gd_loop`.

    ``K: (N, N)`` the query-side Gram, ``a0, h0: (n, T)`` the logits and head scores at step 0,
    ``relevant: (T,)`` bool mask of the relevant tokens. ``K_head`` (``(N, N)`` or ``None``) trains
    the head too. ``decay`` (``lr * weight_decay`` or ``None``) shrinks every trained vector by
    ``1 - decay`` before the gradient step: the coefficients and the scale ``gamma`` of the initial
    vectors (``a = gamma a0 + K alpha``, ``h = gamma h0 + K_head beta``).
    ``record_fn(coef, f, s, a) -> dict`` with ``coef = (alpha, beta, gamma)``.

    Returns ``(coef, (f, s, a), first_fit, all_fit, cumS, div, buf)`` like ``gd_loop``.
    """
    n, T = a0.shape
    dtype = a0.dtype
    train_head = K_head is not None
    rec = Recorder.make(steps, record_at, record_fn)
    masks = jnp.stack(group_masks(batch.y_clean, batch.flipped)).astype(dtype)  # (4, n)
    y = batch.y
    rel = [int(t) for t in np.flatnonzero(relevant)]
    same = K_head is K  # one product for both when the head sees the same Gram

    def forward(coef):
        alpha, beta, gamma = coef
        a0_ = a0 if decay is None else gamma * a0
        h0_ = h0 if decay is None or not train_head else gamma * h0
        if train_head and same:
            ab = jnp.stack([alpha.reshape(-1), beta.reshape(-1)], -1)
            ab = (ab.T @ K).T  # K is symmetric; a row-vector product streams K in order
            a = a0_ + ab[:, 0].reshape(n, T)
            h = h0_ + ab[:, 1].reshape(n, T)
        else:
            a = a0_ + (alpha.reshape(-1) @ K).reshape(n, T)
            h = h0_ + (beta.reshape(-1) @ K_head).reshape(n, T) if train_head else h0_
        s = jax.nn.softmax(a, axis=-1)
        f = jnp.sum(s * h, axis=-1)
        return a, h, s, f

    def grads(h, s, f):
        gf = -y * jax.nn.sigmoid(-y * f) / n  # dL/df
        c = gf[:, None] * s * (h - f[:, None])  # dL/da
        ch = gf[:, None] * s if train_head else None  # dL/dh
        return c, ch

    def loss_of(f):
        return jnp.mean(jax.nn.softplus(-y * f))

    coef0 = (jnp.zeros((n, T), dtype), jnp.zeros((n, T), dtype), jnp.ones((), dtype))
    _, _, s0, f0 = jax.eval_shape(forward, coef0)
    a0s = jax.ShapeDtypeStruct((n, T), dtype)
    buf = rec.empty(coef0, f0, s0, a0s)

    def bookkeeping(t, f, first_fit, all_fit):
        return fit_bookkeeping(t, y, f, first_fit, all_fit)

    write = rec.write

    def step(carry, t):
        coef, first_fit, all_fit, cumS, div, buf = carry
        a, h, s, f = forward(coef)
        c, ch = grads(h, s, f)
        first_fit, all_fit = bookkeeping(t, f, first_fit, all_fit)
        sR = sum(s[:, t_] for t_ in rel) if rel else jnp.zeros(n, dtype)
        cumS = cumS + masks @ (sR * (1 - sR))
        buf = write(buf, t, coef, f, s, a)
        alpha, beta, gamma = coef
        if decay is not None:
            alpha, beta, gamma = (1 - decay) * alpha, (1 - decay) * beta, (1 - decay) * gamma
        alpha = alpha - lr * c
        if train_head:
            beta = beta - lr * ch
        # diverged at t (as gd_loop: loss, gradient or updated parameters not finite): f finite
        # makes the loss finite, and from finite coefficients the updated ones are finite iff
        # the gradients are.
        finite = jnp.all(jnp.isfinite(f)) & jnp.all(jnp.isfinite(alpha))
        if train_head:
            finite = finite & jnp.all(jnp.isfinite(beta))
        div = jnp.where((div < 0) & ~finite, t, div)
        return ((alpha, beta, gamma), first_fit, all_fit, cumS, div, buf), None

    carry = (coef0, jnp.full(n, -1, jnp.int32), jnp.asarray(-1, jnp.int32),
             jnp.zeros(4, dtype), jnp.asarray(-1, jnp.int32), buf)
    if steps:
        u = UNROLL if unroll is None else unroll
        carry, _ = jax.lax.scan(step, carry, jnp.arange(steps, dtype=jnp.int32),
                                unroll=max(1, min(u, steps)))
    coef, first_fit, all_fit, cumS, div, buf = carry
    a, h, s, f = forward(coef)
    loss = loss_of(f)
    first_fit, all_fit = bookkeeping(jnp.asarray(steps, jnp.int32), f, first_fit, all_fit)
    div = jnp.where((div < 0) & ~jnp.isfinite(loss), steps, div)
    buf = write(buf, steps, coef, f, s, a)
    return coef, (f, s, a), first_fit, all_fit, cumS, div, buf
