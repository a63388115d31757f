"""Gram and reduced engines for single-head attention ``f(X) = v^T X^T S(X p)`` (SPEC §2).

Both ``p`` and ``v`` are trained. The gradients are ``dL/dp = X^T c`` and ``dL/dv = X^T e`` with
``c_it = dL/df_i s_it (v.x_it - f_i)`` and ``e_it = dL/df_i s_it``, so from ``(p_0, v_0)``

    ``p_t = gamma_t p_0 + X^T alpha_t``,   ``v_t = gamma_t v_0 + X^T beta_t``,
    ``a_t = gamma_t X p_0 + K alpha_t``,    ``h_t = gamma_t X v_0 + K beta_t``,   ``K = X X^T``,

where ``gamma_t = (1 - lr weight_decay)^t`` carries weight decay (optax ``add_decayed_weights``
before ``sgd``: every parameter shrinks by ``1 - lr lambda`` before the gradient step, so do the
coefficients). One ``N x N`` by ``N x 2`` product per step (:mod:`phasebo.engines.span`).

**gram**: same keys and draws as :func:`phasebo.magen.run_magen` (``magen_sample``,
``init_model``); every metric is computed from the rebuilt ``d``-dimensional ``p`` and ``v`` by the
same formulas as the direct run.

**reduced**: Magen's data put the signal token ``rho e_{1|2}`` on span(e1, e2) and the noise
either isotropic (explicit e1, e2 coordinates + complement) or projected off span(e1, e2)
(complement only). The ``N = nT`` complements are represented exactly by the Bartlett factor
``sigma L`` of ``Wishart(d - 2, I_N)`` (:mod:`phasebo.engines.wishart`), with the rows of noise-free
tokens set to zero (a subset of the rows is the factor of the subset). A Gaussian init puts
``p_0, v_0`` i.i.d. on ``(e1, e2, Q)`` coordinates and leaves two Gaussian vectors in the
``d - 2 - m`` remaining dimensions, represented by their own 2-row Bartlett factor (their norms and
their inner product are all that any metric sees). Tokens live in ``R^{2 + m + r}``, ``m = min(N,
d - 2)``, ``r = min(2, d - 2 - m)``. The projected test set of
:func:`phasebo.magen.projected_token_scores` needs only ``(p, v)``'s e1, e2 coordinates and the
Gram of their complements, which the reduced vectors carry exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .. import config as C
from ..config import Static
from ..magen import (
    SingleHead,
    attention_metrics,
    init_model,
    magen_roles,
    magen_sample,
    noise_mode,
    noisy_tokens,
    param_metrics,
    projected_token_scores,
)
from ..magen import test_metrics as magen_test_metrics
from ..train import (
    EngineSpec,
    RunOutput,
    dtype_of,
    finish,
    register_engine,
    tracked_samples,
    tracked_token_metrics,
    train_metrics,
)
from .prompt import _item, _loop_cost, _n_rec
from .span import flat_gram, span_gd
from .wishart import bartlett_factor, factor_width, n_normals

MODEL = "single_head"
N_VEC = 2  # p and v


def reduced_width(n: int, T: int, d: int) -> int:
    m = factor_width(n * T, d - 2)
    return 2 + m + factor_width(N_VEC, d - 2 - m)


def _reduced_data(static: Static, sw: dict, key, dtype):
    n, T, d = static.n, static.T, static.d
    N = n * T
    mode = noise_mode(static, magen=True)
    base = magen_sample(key, n, None, T, sw, label_mode=static.label_mode,
                        label_noise=static.label_noise, noise_mode=mode,
                        signal_noise=static.signal_noise, dtype=dtype)
    k_perp, k_z = jr.split(jr.split(key, 3)[2])
    sigma = sw["sigma_eps"]
    noisy = jnp.asarray(noisy_tokens(T, static.signal_noise))[None, :, None]
    z = jr.normal(k_z, (2 * N + n_normals(N, d - 2),), dtype)  # one draw: e1, e2 and the factor
    e12 = sigma * z[: 2 * N].reshape(n, T, 2)
    if mode == "projected":
        e12 = jnp.zeros_like(e12)
    m = factor_width(N, d - 2)
    L = sigma * bartlett_factor(k_perp, N, d - 2, dtype, z=z[2 * N :]).reshape(n, T, m)
    r = factor_width(N_VEC, d - 2 - m)
    X = jnp.concatenate(
        [base.signal + jnp.where(noisy, e12, 0.0), jnp.where(noisy, L, 0.0),
         jnp.zeros((n, T, r), dtype)], axis=-1,
    )
    return base._replace(X=X)


def _reduced_init(static: Static, sw: dict, key, D: int, dtype):
    if static.init != "gaussian":
        z = jnp.zeros(D, dtype)
        return z, z
    m = factor_width(static.n * static.T, static.d - 2)
    r = D - 2 - m
    k_in, k_rest = jr.split(key)
    inside = jr.normal(k_in, (N_VEC, 2 + m), dtype)
    rest = bartlett_factor(k_rest, N_VEC, static.d - 2 - m, dtype)  # (2, r)
    pv = sw["init_scale"] * jnp.concatenate([inside, rest[:, :r]], axis=-1)
    return pv[0], pv[1]


def _run(static: Static, sw: dict, key: jax.Array, reduced: bool) -> RunOutput:
    dtype = dtype_of(static)
    d, n, T = static.d, static.n, static.T
    mode = noise_mode(static, magen=True)
    roles = magen_roles(T)
    noisy = noisy_tokens(T, static.signal_noise)
    k_data, k_test, k_init = jr.split(key, 3)
    common = dict(noise_mode=mode, signal_noise=static.signal_noise, label_mode=static.label_mode,
                  dtype=dtype)
    if reduced:
        batch = _reduced_data(static, sw, k_data, dtype)
        p0, v0 = _reduced_init(static, sw, k_init, batch.X.shape[-1], dtype)
    else:
        batch = magen_sample(k_data, n, d, T, sw, label_noise=static.label_noise, **common)
        model0 = init_model(static, sw, k_init, dtype)
        p0, v0 = model0.p, model0.v
    sampled = static.test_mode == "sampled"
    test = magen_sample(k_test, static.n_test, d if sampled else None, T, sw, label_noise=None,
                        **common)
    z_test = jr.normal(jr.fold_in(k_test, 1), (static.n_test, T, 2), dtype)

    X = batch.X
    Xf = X.reshape(n * T, -1)
    K = flat_gram(X)
    a0, h0 = X @ p0, X @ v0

    def model(coef) -> SingleHead:
        alpha, beta, gamma = coef
        return SingleHead(p=gamma * p0 + Xf.T @ alpha.reshape(-1),
                          v=gamma * v0 + Xf.T @ beta.reshape(-1))

    def evaluate_test(m: SingleHead) -> dict:
        if sampled:
            f = m(test.X)[0]
        else:
            h, a = projected_token_scores(z_test, test.signal, m.v, m.p, None, sw["sigma_eps"],
                                          mode, noisy)
            f = jnp.sum(jax.nn.softmax(a, axis=-1) * h, axis=-1)
        return magen_test_metrics(f, test.y_clean)

    def metrics(coef, f, s, a) -> dict:
        m = model(coef)
        out = train_metrics(f, s, a, batch, roles)
        out.update(evaluate_test(m))
        out.update(param_metrics(m))
        vn = out["v_norm"]
        out["margin_norm"] = jnp.where(vn > 0, out["margin"] / jnp.where(vn > 0, vn, 1.0), 0.0)
        out.update(attention_metrics(s, batch))
        return out

    i_clean, i_noisy = tracked_samples(batch)

    def record_fn(coef, f, s, a):
        out = metrics(coef, f, s, a)
        out.update(tracked_token_metrics(s, a, i_clean, i_noisy, logits=False))
        return out

    record_at = C.record_steps(static.steps, static.record_every, static.record_log)
    coef, (f, s, a), first_fit, all_fit, cumS, div, buf = span_gd(
        K, a0, h0, sw["lr"], static.steps, record_at, record_fn, batch, np.asarray(roles) == 0,
        K_head=K, decay=sw["lr"] * sw["weight_decay"],
    )
    final = finish(metrics(coef, f, s, a), first_fit, all_fit, cumS, div, batch)
    samples = {
        "flipped": batch.flipped, "y_clean": batch.y_clean.astype(jnp.int32),
        "first_fit_step": first_fit, "final_margin": batch.y * f, "signal_prob": s[:, 0],
    }
    return RunOutput(final, buf, samples)


def run_gram(static: Static, sw: dict, key: jax.Array) -> RunOutput:
    """Single-head attention by the gram engine (same data as the direct engine)."""
    return _run(static, sw, key, reduced=False)


def run_reduced(static: Static, sw: dict, key: jax.Array) -> RunOutput:
    """Single-head attention by the reduced engine (same distribution, cost independent of d)."""
    return _run(static, sw, key, reduced=True)


def supports_gram(r: dict) -> str | None:
    if r.get("project", False):
        return ("project = true rescales p and v onto norm balls every step; the span engines "
                "do not implement the projection, use engine = \"direct\"")
    return None


def supports_reduced(r: dict) -> str | None:
    why = supports_gram(r)
    if why:
        return why
    if r.get("test_mode", "projected") != "projected":
        return ("test_mode = \"sampled\" asks for d-dimensional test tokens; use test_mode = "
                "\"projected\" (exact in distribution) or engine = \"gram\"")
    return None


def bytes_gram(static: Static) -> int:
    N, d = static.n * static.T, static.d
    b = 3 * N * N + 4 * N * d + 6 * d + 6 * static.n_test * static.T
    if static.test_mode == "sampled":
        b += 2 * static.n_test * static.T * d
    return int((b + _n_rec(static) * (60 + 4 * static.T)) * _item(static))


def bytes_reduced(static: Static) -> int:
    N, D = static.n * static.T, reduced_width(static.n, static.T, static.d)
    b = 3 * N * N + 4 * N * D + 6 * static.n_test * static.T
    return int((b + _n_rec(static) * (60 + 4 * static.T)) * _item(static))


def cost_gram(static: Static) -> float:
    N, d = static.n * static.T, static.d
    return 2 * _loop_cost(static) + 2.0 * N * N * d + 8.0 * N * d * (_n_rec(static) + 1)


def cost_reduced(static: Static) -> float:
    N = static.n * static.T
    return 2 * _loop_cost(static) + 2.0 * N**3


register_engine(EngineSpec(
    "gram", MODEL, run_gram, supports_gram, priority=10, bytes_per_run=bytes_gram,
    cost_per_run=cost_gram, block_size=lambda s, p: 4 if p == "cpu" else 256,
))
register_engine(EngineSpec(
    "reduced", MODEL, run_reduced, supports_reduced, priority=20, bytes_per_run=bytes_reduced,
    cost_per_run=cost_reduced, block_size=lambda s, p: 4 if p == "cpu" else 1024,
))
