"""Single-head attention of Magen et al. (NeurIPS 2025), model ``single_head``.

``f(X; p, v) = v^T X^T S(X p)``; **both** the query ``p`` and the head ``v`` are trained, from zero
(the theory) or ``N(0, init_scale^2)``. Data: Magen et al.'s signal token and T - 1 noise tokens
(:mod:`phasebo.data`). Learning rules: plain GD, weight decay (min-norm limit) and norm-constrained
GD (``||v|| <= radius_v``, ``||p|| <= radius_p``: the max-margin rule).

Span form: ``dL/dp = X^T c`` and ``dL/dv = X^T e`` with ``c_it = dL/df_i s_it (v.x_it - f_i)`` and
``e_it = dL/df_i s_it``, so ``p_t = g_t p_0 + X^T alpha_t``, ``v_t = g'_t v_0 + X^T beta_t`` and
both logits and head scores are ``K = X X^T`` products (:func:`phasebo.engines.span.span_system`).
The reduced engine represents the noise by a Bartlett factor (projected noise: complement only);
a Gaussian init leaves two Gaussian vectors outside the tokens' span, represented by their own
2-row factor. The exact projected test set needs only ``(p, v)``'s e1, e2 coordinates and the Gram
of their complements, which the reduced vectors carry exactly.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

from ..data import (
    magen_reduced_init,
    magen_reduced_sample,
    magen_reduced_width,
    noisy_tokens,
    projected_token_scores,
)
from ..engines.span import SpanProblem, flat_gram
from ..metrics import attend, vec_metrics
from ..settings import TEST_MODE
from ..train import dtype_of
from .common import MAGEN_DEFAULTS, MagenDataModel, init_vec


class SingleHead(eqx.Module):
    """``f(X) = v^T X^T S(X p)``: query ``p: (d,)`` and head ``v: (d,)``."""

    p: jax.Array
    v: jax.Array

    def __call__(self, X: jax.Array):
        a = X @ self.p
        s = jax.nn.softmax(a, axis=-1)
        return jnp.sum(s * (X @ self.v), axis=-1), s, a


class SingleHeadModel(MagenDataModel):
    name = "single_head"
    span_factor = True
    doc = "f = v^T X^T S(X p), p and v trained (Magen et al.)"
    engines = ("direct", "gram", "reduced")
    own_settings = (*MagenDataModel.own_settings, *TEST_MODE)
    defaults = {**MAGEN_DEFAULTS, "d": 40000}

    def init(self, static, sw, key, batch):
        dtype = dtype_of(static)
        k1, k2 = jr.split(key)
        d = static.d
        m = SingleHead(p=init_vec(k1, (d,), static, sw, dtype),
                       v=init_vec(k2, (d,), static, sw, dtype))
        return eqx.partition(m, eqx.is_array)

    def forward(self, m, batch, aux):
        return m(batch.X)

    def test_output(self, m, test, static, sw):
        if static.test_mode == "sampled":
            return m(test.X)[0]
        h, a = projected_token_scores(test.z, test.signal, m.v, m.p, None, sw["sigma_eps"],
                                      static.noise_mode, noisy_tokens(static.T, static.signal_noise))
        return attend(a, h)

    def param_metrics(self, m, static, sw):
        out = vec_metrics("v", m.v)
        out.update(vec_metrics("p", m.p))
        out["q_norm"] = out["p_norm"]
        return out

    def norm_groups(self, m):
        return (m.v, m.p)

    def bytes_per_run(self, static):
        d, n, T = static.d, static.n, static.T
        b = 3 * n * T * d + 8 * d
        b += 2 * static.n_test * T * d if static.test_mode == "sampled" else 6 * static.n_test * T
        b += self.n_records(static) * (60 + 4 * T)
        return int(b * self.item(static))

    # ---------------------------------------------------------------------------------------
    # Span forms
    # ---------------------------------------------------------------------------------------

    def span_supports(self, static, reduced):
        if reduced and static.test_mode != "projected":
            return ("test_mode = \"sampled\" asks for d-dimensional test tokens; use test_mode = "
                    "\"projected\" (exact in distribution) or engine = \"gram\"")
        return None

    def span_problem(self, static, sw, key, reduced):
        dtype = dtype_of(static)
        n, T, d = static.n, static.T, static.d
        k_data, k_test, k_init = self.keys(key)
        if reduced:
            batch = magen_reduced_sample(k_data, n, d, T, sw, label_mode=static.label_mode,
                                         label_noise=static.label_noise,
                                         noise_mode=static.noise_mode,
                                         signal_noise=static.signal_noise, dtype=dtype)
            p0, v0 = magen_reduced_init(k_init, n, T, d, batch.X.shape[-1], static.init,
                                        sw["init_scale"], dtype, sw["dim"])
        else:
            batch = self.sample(static, sw, k_data, test=False)
            m0, _ = self.init(static, sw, k_init, batch)
            p0, v0 = m0.p, m0.v
        test = self.sample(static, sw, k_test, test=True)
        X = batch.X
        Xf = X.reshape(n * T, -1)
        K = flat_gram(X)

        def params(coef):
            return SingleHead(p=coef.gp * p0 + Xf.T @ coef.alpha.reshape(-1),
                              v=coef.gv * v0 + Xf.T @ coef.beta.reshape(-1))

        return SpanProblem(batch, test, K, X @ p0, X @ v0, K, jnp.sum(p0**2), jnp.sum(v0**2),
                           params, lambda: Xf)

    def span_bytes(self, static, reduced):
        N = static.n * static.T
        D = magen_reduced_width(static.n, static.T, static.d) if reduced else static.d
        b = 3 * N * N + 4 * N * D + 6 * D + 6 * static.n_test * static.T
        if not reduced and static.test_mode == "sampled":
            b += 2 * static.n_test * static.T * static.d
        return int((b + self.n_records(static) * (60 + 4 * static.T)) * self.item(static))

    def span_cost(self, static, reduced):
        N, d = static.n * static.T, static.d
        loop = (max(self.loop_steps(static), 1) * (2.0 * N * N + 40.0 * N)
                + self.n_records(static) * 20.0 * static.n_test)
        if reduced:
            return 2 * loop + 2.0 * N**3
        return 2 * loop + 2.0 * N * N * d + 8.0 * N * d * (self.n_records(static) + 1)

