"""The one-layer transformer encoder of Sakamoto & Sato's appendix (SPEC S5), model ``encoder``.

With a learnable CLS token ``c`` (``N(0, 1)`` init) prepended, ``H = [c; X]`` (``T + 1`` tokens,
row vectors), pre-LayerNorm single-head attention without bias or output projection::

    L   = LN_1(H)
    s   = S(L_0 W_q (L W_k)^T / sqrt(d))            (the CLS row, over the T + 1 tokens)
    h   = H_0 + s L W_v                             (residual = true; else s L W_v)
    h'  = h + W_2^T gelu(W_1^T LN_2(h) + b_1) + b_2  (GELU MLP of width mlp_width; residual)
    f   = w^T LN_f(h') + b                          (linear head on the CLS token)

Only the CLS row matters for ``f`` (one layer), so the forward pass computes the CLS query alone:
``q.k_t = L_t (W_k q)`` costs ``O(n d^2)`` instead of ``O(n T d^2)``. All parameters are trained
(full-batch GD via :func:`phasebo.rules.make_optimizer`). Initialisation follows PyTorch's
defaults: linear weights and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, LayerNorm ``(1, 0)``,
exact (erf) GELU, LayerNorm eps 1e-5. Data: Sakamoto's (SPEC §1), sampled test set
(``test_mode = "sampled"``). The attention ``s`` handed to the metrics is the CLS row restricted to
the ``T`` data tokens (``mass_noisy_weak_opp`` is the CLS attention on token 2 for flipped
samples); ``attn_cls`` is the mass the CLS token keeps on itself.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

from . import config as C
from . import rules
from .config import ConfigError, Static, register_setting
from .data import n_flip_per_class, token_roles
from .magen import attention_metrics, sakamoto_batch, test_metrics
from .train import (
    MODELS,
    ModelSpec,
    RunOutput,
    _masked_mean,
    dtype_of,
    finish,
    gd_loop,
    logistic_loss,
    register_model,
    relevant_mass,
    tracked_samples,
    tracked_token_metrics,
    train_metrics,
)

register_setting("mlp_width", 2000, int, "static", "encoder: hidden width of the GELU MLP",
                 lambda v: None if v >= 1 else "must be >= 1")

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


def run_encoder(static: Static, sw: dict, key: jax.Array) -> RunOutput:
    """Train the encoder on Sakamoto data by full-batch GD; sampled test set."""
    dtype = dtype_of(static)
    d, T = static.d, static.T
    roles = token_roles(T, static.n_relevant, static.n_weak, static.n_weak_opp)
    k_data, k_test, k_init = jr.split(key, 3)
    batch = sakamoto_batch(k_data, static.n, d, roles, sw, static, static.label_noise, dtype)
    test = sakamoto_batch(k_test, static.n_test, d, roles, sw, static, None, dtype)
    model = init_encoder(k_init, d, static.mlp_width, static.residual, dtype)

    def loss_aux(m):
        f, s, a = m(batch.X)
        return logistic_loss(batch.y * f), (f, s, a)

    def metrics(m, f, s, a):
        out = train_metrics(f, s, a[0], batch, roles)
        out.update(test_metrics(m(test.X)[0], test.y_clean))
        out.update(attention_metrics(s, batch))
        out["attn_cls"] = jnp.mean(a[1])
        out["attn_cls_noisy"] = _masked_mean(a[1], batch.flipped)
        out["cls_norm"] = jnp.linalg.norm(m.cls_token)
        out["params_norm"] = rules.tree_norm(m)
        return out

    i_clean, i_noisy = tracked_samples(batch)

    def record_fn(m, f, s, a):
        out = metrics(m, f, s, a)
        out.update(tracked_token_metrics(s, a, i_clean, i_noisy, logits=False))
        return out

    opt = rules.make_optimizer(static, sw)
    record_at = C.record_steps(static.steps, static.record_every, static.record_log)
    m, (f, s, a), first_fit, all_fit, cumS, div, buf = gd_loop(
        model, loss_aux, sw["lr"], static.steps, record_at, record_fn, batch,
        lambda s_: relevant_mass(s_, roles), optimizer=opt,
    )
    final = finish(metrics(m, f, s, a), first_fit, all_fit, cumS, div, batch)
    samples = {"flipped": batch.flipped, "y_clean": batch.y_clean.astype(jnp.int32),
               "first_fit_step": first_fit, "final_margin": batch.y * f}
    return RunOutput(final, buf, samples)


def _check_encoder(r: dict) -> None:
    MODELS["prompt_attention"].check(r)  # Sakamoto layout rules
    if r["test_mode"] != "sampled":
        raise ConfigError("encoder has no exact projected test set; fix: test_mode = \"sampled\" "
                          "(and a modest n_test)")
    if r["project"]:
        raise ConfigError("encoder has no norm groups for project = true; fix: project = false "
                          "(weight_decay works)")
    if r["init"] != "zero":
        raise ConfigError("encoder uses PyTorch's default initialisation (init is not used); "
                          "fix: leave init at its default \"zero\"")


def _bytes_encoder(static: Static) -> int:
    item = 8 if static.dtype == "float64" else 4
    d, w, n, T = static.d, static.mlp_width, static.n, static.T
    params = 3 * d * d + 2 * d * w + 12 * d + w
    b = 4 * params + 6 * n * (T + 1) * d + 3 * n * w + 2 * static.n_test * (T + 1) * d
    return int(b * item)


register_model(ModelSpec(
    name="encoder", run=run_encoder, check=_check_encoder,
    derived=lambda r: {"n_flip_per_class": n_flip_per_class(r["n"], r["noise_ratio"])},
    bytes_per_run=_bytes_encoder,
    doc="one-layer pre-LN transformer encoder with a CLS token (Sakamoto & Sato, SPEC S5)",
))
