"""The one-layer transformer encoder of Sakamoto & Sato's appendix, model ``encoder``.

With a learnable CLS token ``c`` (``N(0, 1)`` init) prepended, ``H = [c; X]`` (``T + 1`` tokens,
row vectors), pre-LayerNorm single-head attention without bias or output projection::

    L   = LN_1(H)
    s   = S(L_0 W_q (L W_k)^T / sqrt(d))            (the CLS row, over the T + 1 tokens)
    h   = H_0 + s L W_v                             (residual = true; else s L W_v)
    h'  = h + W_2^T gelu(W_1^T LN_2(h) + b_1) + b_2  (GELU MLP of width mlp_width; residual)
    f   = w^T LN_f(h') + b                          (linear head on the CLS token)

Only the CLS row matters for ``f`` (one layer), so the forward pass computes the CLS query alone:
``q.k_t = L_t (W_k q)`` costs ``O(n d^2)`` instead of ``O(n T d^2)``. All parameters are trained
(full-batch GD, optionally with weight decay). Initialisation follows PyTorch's defaults: linear
weights and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, LayerNorm ``(1, 0)``, exact (erf) GELU,
LayerNorm eps 1e-5; except the output bias ``b``, which starts at 0 (PyTorch's ``nn.Linear(d, 1)``
draws it from ``U(-1/sqrt d, 1/sqrt d)``, about +-0.022 at d 2000).
Data: Sakamoto & Sato's, with a sampled test set (the network is nonlinear in
the tokens). The attention handed to the metrics is the CLS row restricted to the ``T`` data
tokens (``mass_noisy_weak_opp`` is the CLS attention on token 2 for flipped samples); ``attn_cls``
is the mass the CLS token keeps on itself.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

from ..metrics import attention_metrics, masked_mean, tree_norm
from ..settings import NOISE_MODE, WEIGHT_DECAY, Setting, at_least
from ..train import dtype_of
from .common import SakamotoSampledModel

LN_EPS = 1e-5


def layer_norm(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + LN_EPS) * _bc(g, x) + _bc(b, x)


def _bc(b: jax.Array, x: jax.Array) -> jax.Array:
    """A feature vector ``(k,)`` shaped to broadcast against ``x: (..., k)`` (no rank promotion)."""
    return b.reshape((1,) * (x.ndim - 1) + b.shape)


class Encoder(eqx.Module):
    """One-layer pre-LN encoder with a CLS token (see the module docstring for the equations)."""

    cls_token: jax.Array
    Wq: jax.Array
    Wk: jax.Array
    Wv: jax.Array
    ln1_g: jax.Array
    ln1_b: jax.Array
    ln2_g: jax.Array
    ln2_b: jax.Array
    lnf_g: jax.Array
    lnf_b: jax.Array
    W1: jax.Array
    b1: jax.Array
    W2: jax.Array
    b2: jax.Array
    head_w: jax.Array
    head_b: jax.Array
    residual: bool = eqx.field(static=True, default=True)

    def __call__(self, X: jax.Array):
        """``X: (n, T, d)`` -> ``(f, s, (a, s_cls))``: outputs, CLS attention on the T data tokens,
        their logits and the CLS self-attention mass."""
        n, _, d = X.shape
        H = jnp.concatenate([jnp.broadcast_to(self.cls_token, (n, 1, d)), X], axis=1)
        L = layer_norm(H, self.ln1_g, self.ln1_b)
        q = L[:, 0, :] @ self.Wq
        a = jnp.einsum("ntd,nd->nt", L, q @ self.Wk.T) / jnp.sqrt(jnp.asarray(d, X.dtype))
        s = jax.nn.softmax(a, axis=-1)
        o = jnp.einsum("nt,ntd->nd", s, L) @ self.Wv
        h = H[:, 0, :] + o if self.residual else o
        z = layer_norm(h, self.ln2_g, self.ln2_b) @ self.W1
        m = jax.nn.gelu(z + _bc(self.b1, z), approximate=False) @ self.W2
        m = m + _bc(self.b2, m)
        h = h + m if self.residual else m
        f = layer_norm(h, self.lnf_g, self.lnf_b) @ self.head_w + self.head_b
        return f, s[:, 1:], (a[:, 1:], s[:, 0])


def init_encoder(key: jax.Array, d: int, width: int, residual: bool, dtype) -> Encoder:
    ks = jr.split(key, 9)

    def u(k, shape, fan_in):
        bound = 1.0 / jnp.sqrt(jnp.asarray(fan_in, dtype))
        return jr.uniform(k, shape, dtype, -bound, bound)

    one, zero = jnp.ones(d, dtype), jnp.zeros(d, dtype)
    return Encoder(
        cls_token=jr.normal(ks[0], (d,), dtype), Wq=u(ks[1], (d, d), d), Wk=u(ks[2], (d, d), d),
        Wv=u(ks[3], (d, d), d), ln1_g=one, ln1_b=zero, ln2_g=one, ln2_b=zero, lnf_g=one,
        lnf_b=zero, W1=u(ks[4], (d, width), d), b1=u(ks[5], (width,), d),
        W2=u(ks[6], (width, d), width), b2=u(ks[7], (d,), width), head_w=u(ks[8], (d,), d),
        head_b=jnp.zeros((), dtype), residual=residual,
    )


class EncoderModel(SakamotoSampledModel):
    name = "encoder"
    doc = "one-layer pre-LN transformer encoder with a CLS token (Sakamoto & Sato's appendix)"
    track_logits = False
    own_settings = (
        *NOISE_MODE, *WEIGHT_DECAY,
        Setting("mlp_width", 2000, int, "static", "hidden width of the GELU MLP", at_least(1)),
        Setting("residual", True, bool, "static", "residual connections around attention and "
                "the MLP"),
    )

    def init(self, static, sw, key, batch):
        m = init_encoder(key, static.d, static.mlp_width, static.residual, dtype_of(static))
        return eqx.partition(m, eqx.is_array)

    def forward(self, m, batch, aux):
        return m(batch.X)

    def test_output(self, m, test, static, sw):
        return m(test.X)[0]

    def param_metrics(self, m, static, sw):
        return {"cls_norm": jnp.linalg.norm(m.cls_token), "params_norm": tree_norm(m)}

    def extra_metrics(self, m, f, s, a, batch, metrics):
        out = attention_metrics(s, batch)
        out["attn_cls"] = jnp.mean(a[1])
        out["attn_cls_noisy"] = masked_mean(a[1], batch.flipped)
        return out

    def bytes_per_run(self, static):
        d, w, n, T = static.d, static.mlp_width, static.n, static.T
        params = 3 * d * d + 2 * d * w + 12 * d + w
        b = 4 * params + 6 * n * (T + 1) * d + 3 * n * w + 2 * static.n_test * (T + 1) * d
        n_rec = self.n_records(static)
        return int((b + n_rec * (60 + 4 * T)) * self.item(static))

    def cost_per_run(self, static):
        d, w, n = static.d, static.mlp_width, static.n
        return 6.0 * n * (3 * d * d + 2 * d * w) * max(self.loop_steps(static), 1)
