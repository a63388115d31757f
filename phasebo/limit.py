r"""The converged limit: the minimiser of the weight-decayed loss, found directly.

With weight decay ``lambda > 0`` the objective

    ``J(theta) = L(theta) + (lambda / 2) ||theta||^2``

is bounded below and grows without bound, so its gradient flow ``theta' = -grad J`` (and gradient
descent with a small enough step) converges to a stationary point of ``J``: where a run ends up
when it is trained to convergence, the "fully converged" solutions the max-margin theorems are
about as ``lambda -> 0``. A run with ``dynamics = "limit"`` finds that point directly by L-BFGS
(``optax.lbfgs`` with its zoom line search) from the run's initialisation, until
``||grad J|| <= limit_tol`` (``converged``) or ``limit_max_iters`` iterations (status
``unsolved``, as a flow whose solver stopped early). There is no time axis: no records, no
first-fit steps; the results' ``steps`` is 0, ``time`` is infinite, ``solver_steps`` counts the
L-BFGS iterations.

**Which stationary point.** ``J`` is not convex, and a different path may end elsewhere. Both the
flow and L-BFGS start from ``theta_0`` and move along gradients of the same ``J``; measured on
Magen et al.'s converged map (single-head attention, ``lambda = 0.01``, p and v from zero, float64,
10 runs near its boundary), L-BFGS reached the state of the flow at ``tau = 10^4`` (the flow
converged by its own criterion): p-norm to 4 digits, ``J`` to 6; the map takes 15 - 101
iterations where the flow took 600 - 14,000 Tsit5 steps (a test compares the two). Off the
map it can part: at n 20, d 900, ||mu|| 12, lambda 0.05 the flow ends at ``J = 0.0191`` (test
accuracy 1.00) and L-BFGS at another stationary point, ``J = 0.0207`` (0.68). On the limit map's
high-SNR cells (n <= 100, SNR >= 0.52) it parted in 1 - 5 of 8 runs per cell, always at a harmful
local minimum of higher ``J``: L-BFGS's first line search jumps from ``theta_0`` into another
basin. ``limit_warmup`` GD steps of ``lr`` first (400 of 0.025, flow time 10) put it on the
flow's path, and it reached the flow's end in all 32 runs compared there. Float64 only:
the loss is so flat near the minimiser that in float32 L-BFGS stopped 30 % away in norm.

**In span coordinates** (gram and reduced engines; p, and a head v seeing the same Gram, trained
from zero): every gradient lies in the span of the tokens, so does the limit, ``p = F^T alpha``
with ``F`` the tokens as the query sees them (``K = F F^T``). L-BFGS runs on ``u = F^T alpha``,
which is ``p`` itself in the engine's coordinates (``a = F u``, ``||p|| = ||u||``), so it takes the
direct engine's iterates (tested: equal to 1e-15 on the gram engine); ``alpha`` then solves
``K alpha = F u`` by conjugate gradients (:func:`phasebo.engines.span.span_limit`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax


def is_limit(static) -> bool:
    """Whether a run's settings ask for the converged limit (``dynamics = "limit"``)."""
    return getattr(static, "dynamics", "gd") == "limit"


def weight_decayed(loss: Callable, weight_decay) -> Callable:
    """``J(x) = loss(x) + (weight_decay / 2) ||x||^2`` over every leaf of the pytree ``x``."""
    return lambda x: loss(x) + weight_decay / 2 * sum(jnp.sum(v**2) for v in jax.tree.leaves(x))


def minimise(J: Callable, x0, *, tol: float, max_iters: int, warmup: int = 0, lr=None):
    """``(x, iterations, ||grad J(x)||)``: L-BFGS on ``J`` from ``x0`` (a pytree) until the
    gradient norm is at most ``tol``, ``max_iters`` iterations, or a non-finite value; first
    ``warmup`` gradient-descent steps of ``lr`` on ``J`` (the flow's path to time warmup * lr)."""
    if warmup:
        grad = jax.grad(J)
        x0 = jax.lax.fori_loop(0, warmup, lambda _, x: jax.tree.map(
            lambda xi, gi: xi - lr * gi, x, grad(x)), x0)
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(J)

    def body(c):
        x, state, k = c
        v, g = value_and_grad(x, state=state)
        u, state = opt.update(g, state, x, value=v, grad=g, value_fn=J)
        return optax.apply_updates(x, u), state, k + 1

    def more(c):
        x, state, k = c
        g = optax.tree.norm(optax.tree.get(state, "grad"))  # at the previous iterate
        go = (g > tol) & jnp.isfinite(g) & jnp.isfinite(optax.tree.get(state, "value"))
        return (k == 0) | ((k < max_iters) & go)

    # optax's L-BFGS mixes its integer counters' widths (int32 and int64 under x64): standard
    # promotion inside, whatever the caller's
    with jax.numpy_dtype_promotion("standard"):
        x, _, k = jax.lax.while_loop(more, body, (x0, opt.init(x0), jnp.asarray(0, jnp.int32)))
    return x, k, optax.tree.norm(jax.grad(J)(x))


def book(margin, iterations, grad_norm, tol: float, dtype) -> dict:
    """The bookkeeping a run's final metrics take from its dynamics (:func:`phasebo.train.finish`),
    at the limit: samples fitted there count as fitted (at no step), nothing was observed in time
    (first-fit steps ``-1``, the 𝔖 sums and the middle margin NaN), ``converged`` when the
    gradient norm reached ``tol``, unsolved otherwise or when not finite."""
    nan = jnp.asarray(jnp.nan, dtype)
    never = jnp.asarray(-1, jnp.int32)
    solved = (grad_norm <= tol) & jnp.isfinite(grad_norm)
    fitted = margin > 0
    return dict(first_fit=jnp.where(fitted, 0, -1).astype(jnp.int32),
                all_fit=jnp.where(jnp.all(fitted), 0, -1).astype(jnp.int32),
                cumS=jnp.full(margin.shape, nan), diverge=never, buf={}, margin_mid=nan,
                solver_steps=iterations.astype(jnp.int32), solved=solved, converged=solved,
                converged_time=nan, converged_step=never, grad_norm=grad_norm.astype(dtype))


def no_steps(final: dict, dtype) -> dict:
    """The final metrics of a limit without the step columns that :func:`book`'s placeholder
    first-fit steps (0 for a sample fitted at the limit) would fill: no time, no step."""
    out = dict(final)
    for k in ("noisy_fit_step", "all_fit_step"):
        if k in out:
            out[k] = jnp.asarray(-1, jnp.int32)
    if "mean_noisy_fit_step" in out:
        out["mean_noisy_fit_step"] = jnp.asarray(jnp.nan, dtype)
    return out
