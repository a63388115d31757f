"""Sakamoto & Sato's hand-built query (their Fig. 1), model ``constructed_query``: no training.

``p = mu_+ + mu_- + lambda (sum_clean eps_{i,rel} + sum_noisy eps_{i,tok2})`` with ``eps`` the
training tokens' noise, ``rel`` the first relevant token and ``tok2`` the first weakly relevant
opposite-class token; ``W = I``, the fixed head ``nu = (e1 - e2)/(sqrt 2 ||mu||)``, and **hard**
(argmax) token selection: ``f(X) = nu^T x_sel``, ``sel = argmax_t x_t.p``. ``lambda =
query_lambda``: small lambda memorises nothing (not overfitting), a middle one memorises the flipped
samples' token 2 (benign), a large one memorises noise everywhere (harmful).

The samples table has ``n + n_test`` rows per run: the training samples, then the test samples
(``is_test = 1``, clean labels); per row ``sel_token`` (the selected token), ``sel_e1``,
``sel_e2`` (its coordinates on e1, e2: the paper's scatter plot), ``y``, ``y_clean``, ``flipped``
and ``final_margin = y f``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from ..data import RELEVANT, WEAK_OPP, Batch, embed_signal, sakamoto_head
from ..metrics import vec_metrics
from ..settings import NOISE_MODE, Setting, nonneg
from ..train import dtype_of
from .common import SakamotoSampledModel


class ConstructedQuery(eqx.Module):
    p: jax.Array
    nu: jax.Array


def constructed_query(batch: Batch, roles: np.ndarray, signal_norm, lam) -> jax.Array:
    """The hand-built query of the module docstring."""
    d = batch.X.shape[-1]
    eps = batch.X - embed_signal(batch.signal, d)
    rel = int(np.argmax(roles == RELEVANT))
    tok2 = int(np.argmax(roles == WEAK_OPP))
    clean = (~batch.flipped)[:, None]
    mem = jnp.sum(jnp.where(clean, eps[:, rel, :], eps[:, tok2, :]), axis=0)
    mu = jnp.zeros(d, batch.X.dtype).at[0].set(signal_norm).at[1].set(signal_norm)
    return mu + lam * mem


def hard_select(X: jax.Array, p: jax.Array, nu: jax.Array):
    """Argmax token selection: ``(f, one-hot s, logits, selected token index, its (e1, e2))``."""
    a = X @ p
    sel = jnp.argmax(a, axis=-1)
    x_sel = jnp.take_along_axis(X, sel[:, None, None], axis=1)[:, 0, :]
    s = jax.nn.one_hot(sel, X.shape[1], dtype=X.dtype)
    return x_sel @ nu, s, a, sel, x_sel[:, :2]


class ConstructedQueryModel(SakamotoSampledModel):
    name = "constructed_query"
    doc = "the hand-built query p = mu_+ + mu_- + lambda (memorised noise), argmax selection"
    trains = False
    own_settings = (
        *NOISE_MODE,
        Setting("query_lambda", 0.06, float, "swept", "lambda in p = mu_+ + mu_- + lambda "
                "(sum of memorised noise)", nonneg),
    )

    def keys(self, key):
        k_data, k_test = jr.split(key)
        return k_data, k_test, None

    def init(self, static, sw, key, batch):
        p = constructed_query(batch, self.roles(static), sw["signal_norm"], sw["query_lambda"])
        m = ConstructedQuery(p=p, nu=sakamoto_head(static.d, sw["signal_norm"], dtype_of(static)))
        return eqx.partition(m, lambda _: False)

    def forward(self, m, batch, aux):
        f, s, a, _, _ = hard_select(batch.X, m.p, m.nu)
        return f, s, a

    def test_output(self, m, test, static, sw):
        return hard_select(test.X, m.p, m.nu)[0]

    def param_metrics(self, m, static, sw):
        out = vec_metrics("p", m.p)
        out["q_norm"] = out["p_norm"]
        return out

    def samples(self, m, f, s, a, batch, test, static, sw, first_fit):
        _, _, _, sel, coords = hard_select(batch.X, m.p, m.nu)
        ft, _, _, sel_t, coords_t = hard_select(test.X, m.p, m.nu)
        n, n_test = static.n, static.n_test
        return {
            "is_test": jnp.concatenate([jnp.zeros(n, jnp.int32), jnp.ones(n_test, jnp.int32)]),
            "flipped": jnp.concatenate([batch.flipped, test.flipped]),
            "y": jnp.concatenate([batch.y, test.y]).astype(jnp.int32),
            "y_clean": jnp.concatenate([batch.y_clean, test.y_clean]).astype(jnp.int32),
            "first_fit_step": jnp.concatenate([first_fit, jnp.where(test.y * ft > 0, 0, -1)]),
            "final_margin": jnp.concatenate([batch.y * f, test.y * ft]),
            "sel_token": jnp.concatenate([sel, sel_t]).astype(jnp.int32),
            "sel_e1": jnp.concatenate([coords[:, 0], coords_t[:, 0]]),
            "sel_e2": jnp.concatenate([coords[:, 1], coords_t[:, 1]]),
        }

    def bytes_per_run(self, static):
        return int(self.item(static) * 3 * (static.n + static.n_test) * static.T * static.d)

    def cost_per_run(self, static):
        return 4.0 * (static.n + static.n_test) * static.T * static.d
