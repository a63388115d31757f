"""Self-attention with a first-token query and its multi-layer stack (Magen et al.'s extensions),
models ``self_attention`` and ``multi_layer``.

``self_attention``: ``f(X) = v^T X^T S(X W x_1)``; the first (signal) token queries through
``W: (d, d)``; ``W`` and ``v`` trained. The signal token lies in span(e1, e2) when it is noise-free,
so ``W x_1 = W[:, :2] c`` costs ``O(n d)`` instead of ``O(n d^2)``. Exact projected test set: one
query ``W mu_{+/-}`` per clean class.

``multi_layer``: ``L = n_layers`` single-head self-attention layers, for ``l = 1..L-1`` (full
self-attention, value = identity, no MLP, no normalisation)::

    A_l = S_rows(H_{l-1} W_l H_{l-1}^T)            (T x T, softmax over each row)
    H_l = H_{l-1} + A_l H_{l-1}   (residual = true) or   A_l H_{l-1}

with ``H_0 = X``, then the readout ``f = v^T H_{L-1}^T S(H_{L-1} W_L h_1)``. ``L = 1`` is exactly
``self_attention`` (same forward, same initialisation from the same key). The metrics read the
**first** layer's attention of the first token (row 0 of ``A_1``: does layer 1 select the right
token?) as ``mass_*_rel`` / ``attn_*``, and the readout's as ``mass_*_rel_last``. Its test set is
sampled (the layers are nonlinear in the tokens).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

from ..data import noisy_tokens, projected_token_scores
from ..metrics import attend, masked_mean, tree_norm, vec_metrics
from ..settings import TEST_MODE, ConfigError, Setting, at_least
from ..train import dtype_of
from .common import MAGEN_DEFAULTS, MagenDataModel, init_vec


class SelfAttention(eqx.Module):
    """``f(X) = v^T X^T S(X W x_1)``: the first token queries through ``W: (d, d)``; head ``v``.

    ``x1_coords: (n, 2)`` (optional) says the first token lies in span(e1, e2) (noise-free signal
    token), so ``W x_1 = W[:, :2] x1_coords``.
    """

    W: jax.Array
    v: jax.Array

    def query(self, X: jax.Array, x1_coords: jax.Array | None = None) -> jax.Array:
        if x1_coords is not None:
            return x1_coords @ self.W[:, :2].T
        return X[..., 0, :] @ self.W.T

    def __call__(self, X: jax.Array, x1_coords: jax.Array | None = None):
        q = self.query(X, x1_coords)  # (n, d)
        a = jnp.einsum("ntd,nd->nt", X, q)
        s = jax.nn.softmax(a, axis=-1)
        return jnp.sum(s * (X @ self.v), axis=-1), s, a


class MultiLayer(eqx.Module):
    """``L`` stacked single-head attention layers with the self-attention readout (module
    docstring). The call returns ``(f, s, (a, s_last))``: ``s`` the first layer's attention of the
    first token, ``a`` its logits, ``s_last`` the readout attention."""

    Ws: tuple
    v: jax.Array
    residual: bool = eqx.field(static=True, default=True)

    def __call__(self, X: jax.Array):
        H = X
        first = None
        for W in self.Ws[:-1]:
            logits = jnp.einsum("ntd,nud->ntu", H @ W, H)
            A = jax.nn.softmax(logits, axis=-1)
            if first is None:
                first = (A[:, 0, :], logits[:, 0, :])
            upd = jnp.einsum("ntu,nud->ntd", A, H)
            H = H + upd if self.residual else upd
        q = H[:, 0, :] @ self.Ws[-1].T
        a = jnp.einsum("ntd,nd->nt", H, q)
        s = jax.nn.softmax(a, axis=-1)
        f = jnp.sum(s * (H @ self.v), axis=-1)
        if first is None:
            first = (s, a)
        return f, first[0], (first[1], s)


def _matrix_metrics(m, W) -> dict:
    out = vec_metrics("v", m.v)
    out["W_norm"] = jnp.linalg.norm(W)
    out["q_norm"] = jnp.linalg.norm(W[:, :2])  # ||W e1||, ||W e2|| together
    return out


class SelfAttentionModel(MagenDataModel):
    name = "self_attention"
    doc = "f = v^T X^T S(X W x_1), W and v trained (Magen et al.'s self-attention extension)"
    own_settings = (*MagenDataModel.own_settings, *TEST_MODE)
    defaults = {**MAGEN_DEFAULTS, "d": 2000, "signal_norm": 6.7}

    def check(self, r):
        super().check(r)
        if r["signal_noise"] and r["test_mode"] != "sampled":
            raise ConfigError("self_attention with signal_noise = true has a random query, so its "
                              "test set cannot be projected exactly; fix: test_mode = \"sampled\"")

    def init(self, static, sw, key, batch):
        dtype = dtype_of(static)
        k1, k2 = jr.split(key)
        d = static.d
        m = SelfAttention(W=init_vec(k1, (d, d), static, sw, dtype),
                          v=init_vec(k2, (d,), static, sw, dtype))
        return eqx.partition(m, eqx.is_array)

    def precompute(self, m, batch, static):
        # a noise-free signal token lies in span(e1, e2): W x_1 from W's first two columns
        return None if static.signal_noise else batch.signal[:, 0, :]

    def forward(self, m, batch, aux):
        return m(batch.X, aux)

    def test_output(self, m, test, static, sw):
        if static.test_mode == "sampled":
            x1 = None if static.signal_noise else test.signal[:, 0, :]
            return m(test.X, x1)[0]
        rho = sw["signal_norm"]
        Q = jnp.stack([rho * m.W[:, 0], rho * m.W[:, 1]])  # one query per clean class, W mu_+/-
        cls = (test.y_clean < 0).astype(jnp.int32)
        h, a = projected_token_scores(test.z, test.signal, m.v, Q, cls, sw["sigma_eps"],
                                      static.noise_mode, noisy_tokens(static.T, static.signal_noise))
        return attend(a, h)

    def param_metrics(self, m, static, sw):
        out = _matrix_metrics(m, m.W)
        out["p_norm"] = tree_norm(m.W)  # the group radius_p constrains
        return out

    def norm_groups(self, m):
        return (m.v, m.W)

    def bytes_per_run(self, static):
        d, n, T = static.d, static.n, static.T
        b = 3 * n * T * d + 8 * d + 4 * d * d
        b += 2 * static.n_test * T * d if static.test_mode == "sampled" else 6 * static.n_test * T
        return int((b + self.n_records(static) * (60 + 4 * T)) * self.item(static))

    def cost_per_run(self, static):
        return 6.0 * static.d * (static.n * static.T + static.d) * max(self.loop_steps(static), 1)


class MultiLayerModel(MagenDataModel):
    name = "multi_layer"
    doc = "L self-attention layers + a self-attention readout (Magen et al.'s multi-layer case)"
    own_settings = (
        *MagenDataModel.own_settings,
        Setting("n_layers", 4, int, "static", "attention layers L (the last one is the readout)",
                at_least(1)),
        Setting("residual", True, bool, "static", "residual connections around attention"),
    )
    defaults = {**MAGEN_DEFAULTS, "d": 500, "n": 100, "signal_norm": 4.7, "n_test": 1000}

    def init(self, static, sw, key, batch):
        dtype = dtype_of(static)
        d = static.d
        k1, k2 = jr.split(key)
        # the readout W_L uses self_attention's key, so n_layers = 1 is exactly self_attention
        ks = list(jr.split(jr.fold_in(k1, 1), static.n_layers - 1)) + [k1]
        m = MultiLayer(Ws=tuple(init_vec(k, (d, d), static, sw, dtype) for k in ks),
                       v=init_vec(k2, (d,), static, sw, dtype), residual=static.residual)
        return eqx.partition(m, eqx.is_array)

    def forward(self, m, batch, aux):
        return m(batch.X)

    def test_output(self, m, test, static, sw):
        return m(test.X)[0]

    def param_metrics(self, m, static, sw):
        out = _matrix_metrics(m, m.Ws[-1])
        out["p_norm"] = tree_norm(m.Ws)
        return out

    def extra_metrics(self, m, f, s, a, batch, metrics):
        out = super().extra_metrics(m, f, s, a, batch, metrics)
        s_last = a[1]
        out["mass_clean_rel_last"] = masked_mean(s_last[:, 0], ~batch.flipped)
        out["mass_noisy_rel_last"] = masked_mean(s_last[:, 0], batch.flipped)
        return out

    def norm_groups(self, m):
        return (m.v, m.Ws)

    def bytes_per_run(self, static):
        d, n, T, L = static.d, static.n, static.T, static.n_layers
        b = 3 * n * T * d + 8 * d + 4 * L * d * d + 3 * L * n * T * d
        b += 2 * static.n_test * T * d
        return int((b + self.n_records(static) * (60 + 4 * T)) * self.item(static))

    def cost_per_run(self, static):
        L, d, N = static.n_layers, static.d, static.n * static.T
        return 6.0 * L * (N * d * d + N * static.T * d) * max(self.loop_steps(static), 1)

