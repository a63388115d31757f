"""Magen et al.'s single-head attention (SPEC §2), its architecture extensions, and SPEC S1.

**Data** (``magen_sample``). Token 0 is the signal token ``mu_{y~}``: ``mu_1 = rho e1`` for
``y~ = +1``, ``mu_2 = rho e2`` for ``y~ = -1`` (``rho`` is the setting ``signal_norm``; the column
``rho`` stays Sakamoto's weak factor), noise-free unless ``signal_noise = true``. Tokens
``1..T-1`` are noise ``sigma_eps xi``. With ``noise_mode = "projected"`` (the default for these
models) ``xi ~ N(0, I - mu_1 mu_1^T/rho^2 - mu_2 mu_2^T/rho^2)``, drawn by projecting isotropic
noise off span(e1, e2), i.e. zeroing its first two coordinates (never a d x d covariance);
``"isotropic"`` keeps ``N(0, I)``. Labels: ``label_mode = "iid"`` and ``label_noise =
"bernoulli"`` with ``noise_ratio = eta`` give Magen's setting.

**Models** (equinox modules; each returns ``(f, s, a)``: outputs ``(n,)``, attention ``(n, T)``
and logits), registered by name for sweep files:

- ``single_head``: ``f(X) = v^T X^T S(X p)``; ``p, v`` trained, zero or ``N(0, init_scale^2)`` init.
- ``self_attention``: ``f(X) = v^T X^T S(X W x_1)``, query = first token; ``W, v`` trained.
- ``multi_layer``: ``L = n_layers`` single-head self-attention layers (see :class:`MultiLayer`).
- ``constructed_query``: SPEC S1's hand-built query on Sakamoto data, hard (argmax) selection,
  no training (:func:`run_constructed_query`).

Learning rules (:mod:`phasebo.rules`): ``weight_decay``, ``project`` with ``radius_v = r`` and
``radius_p = R``. Extra final/dynamics metrics: ``v_norm``, ``v_align_e1/e2``, ``margin_norm =
min_i y_i f_i / ||v||`` (f is 1-homogeneous in v), per-token mean attention ``attn_mean_clean_t{k}``
/ ``attn_mean_noisy_t{k}``, ``mass_{clean,noisy}_top_noise`` (mean largest noise-token mass).
Token role 0 is the signal token, so ``mass_clean_rel`` / ``mass_noisy_rel`` are the mean signal
probabilities of clean / flipped samples.

**Test sets.** With ``test_mode = "projected"``, ``single_head`` and ``self_attention`` draw test
tokens' scores exactly: for a noise token, ``(xi.v, xi.q)`` is Gaussian with covariance
``sigma^2 Gram(P v, P q)`` (``P`` the projector off span(e1, e2) in projected mode, ``I`` in
isotropic mode), so ``O(n_test T)`` normals replace ``n_test T d``. ``multi_layer`` and
``constructed_query`` need ``test_mode = "sampled"`` (nonlinear in the tokens / coordinates of the
selected token).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from . import config as C
from . import rules
from .config import ConfigError, Static, register_setting
from .data import (
    IRRELEVANT,
    RELEVANT,
    WEAK_OPP,
    Batch,
    draw_labels,
    embed_signal,
    n_flip_per_class,
    sakamoto_sample,
    token_roles,
)
from .models import sakamoto_head
from .train import (
    MODELS,
    ModelSpec,
    RunOutput,
    _masked_mean,
    _masked_mean_rows,
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

register_setting("noise_mode", "auto", str, "static",
                 "token noise: isotropic N(0, sigma^2 I), projected off span(mu_1, mu_2) (Magen), "
                 "or auto (projected for single_head / self_attention / multi_layer, isotropic "
                 "for Sakamoto-data models)", choices=("auto", "isotropic", "projected"))
register_setting("signal_noise", False, bool, "static",
                 "Magen data: add token noise to the signal token too (default: noise-free)")
register_setting("query_lambda", 0.06, float, "swept",
                 "constructed_query: lambda in p = mu_+ + mu_- + lambda (sum of memorised noise)",
                 lambda v: None if v >= 0 else "must be >= 0")
register_setting("n_layers", 4, int, "static",
                 "multi_layer: attention layers L (the last one is the readout)",
                 lambda v: None if v >= 1 else "must be >= 1")
register_setting("residual", True, bool, "static",
                 "multi_layer / encoder: residual connections around attention (and MLP)")

MAGEN_MODELS = ("single_head", "self_attention", "multi_layer")


def noise_mode(static, magen: bool) -> str:
    mode = static.noise_mode if isinstance(static, Static) else static["noise_mode"]
    if mode == "auto":
        return "projected" if magen else "isotropic"
    return mode


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def magen_roles(T: int) -> np.ndarray:
    """Role codes: token 0 is the signal token (role 0, "rel"), the rest noise (role 3, "irr")."""
    roles = np.full(T, IRRELEVANT, np.int32)
    roles[0] = RELEVANT
    return roles


def noisy_tokens(T: int, signal_noise: bool) -> np.ndarray:
    """Which token positions carry noise: ``(T,)`` bool."""
    m = np.ones(T, bool)
    m[0] = signal_noise
    return m


def project_off_signal(noise: jax.Array) -> jax.Array:
    """``(I - e1 e1^T - e2 e2^T) xi``: the projection off span(mu_1, mu_2) (zero coords 0, 1)."""
    return noise.at[..., :2].set(0.0)


def magen_sample(
    key: jax.Array, n: int, d: int | None, T: int, sw: dict, *, label_mode: str,
    label_noise: str | None, noise_mode: str, signal_noise: bool, dtype,
) -> Batch:
    """Draw ``n`` Magen sequences (``d=None``: signal coordinates only, for projected tests)."""
    k_lab, k_flip, k_noise = jr.split(key, 3)
    y, y_clean, flipped = draw_labels(k_lab, k_flip, n, sw, label_mode=label_mode,
                                      label_noise=label_noise, dtype=dtype)
    own = jnp.stack([(y_clean > 0), (y_clean < 0)], -1).astype(dtype)  # (n, 2)
    first = jnp.asarray(np.arange(T) == 0)[None, :, None]
    signal = jnp.where(first, sw["signal_norm"] * own[:, None, :], 0.0).astype(dtype)
    X = None
    if d is not None:
        noise = sw["sigma_eps"] * jr.normal(k_noise, (n, T, d), dtype)
        if noise_mode == "projected":
            noise = project_off_signal(noise)
        mask = jnp.asarray(noisy_tokens(T, signal_noise))[None, :, None]
        X = jnp.where(mask, noise, 0.0) + embed_signal(signal, d)
    return Batch(X, signal, y, y_clean, flipped)


def gaussian_pair(z: jax.Array, aa, ab, bb) -> tuple[jax.Array, jax.Array]:
    """``(g.a, g.b)`` for ``g ~ N(0, I)`` from standard normals ``z: (..., 2)``, given the Gram
    entries ``a.a, a.b, b.b`` (broadcastable to ``z[..., 0]``); exact and safe when ``a = 0``."""
    na = jnp.sqrt(aa)
    safe = jnp.where(na > 0, na, 1.0)
    b_par = jnp.where(na > 0, ab / safe, 0.0)
    b_perp = jnp.sqrt(jnp.maximum(bb - b_par**2, 0.0))
    return na * z[..., 0], b_par * z[..., 0] + b_perp * z[..., 1]


def projected_token_scores(
    z: jax.Array, signal: jax.Array, a: jax.Array, b: jax.Array, cls: jax.Array | None,
    sigma, mode: str, noisy: np.ndarray,
) -> tuple[jax.Array, jax.Array]:
    """Exact ``(X a, X b)``, each ``(n, T)``, for fresh tokens ``x = s + sigma xi``.

    ``a: (d,)``; ``b: (d,)`` or ``(2, d)`` (one vector per clean class, selected by ``cls`` (n,)
    = 0 for ``y~ = +1``, 1 for ``-1``). ``xi ~ N(0, P)`` with ``P`` the projector off span(e1, e2)
    (``mode = "projected"``) or ``I``; then ``(xi.a, xi.b) ~ N(0, Gram(P a, P b))``.
    """
    ap, bp = (project_off_signal(a), project_off_signal(b)) if mode == "projected" else (a, b)
    aa = jnp.dot(ap, ap)
    if b.ndim == 1:
        ab, bb = jnp.dot(ap, bp), jnp.dot(bp, bp)
        sa = signal @ a[:2]
        sb = signal @ b[:2]
    else:
        ab_c, bb_c = bp @ ap, jnp.sum(bp * bp, -1)  # (2,)
        ab, bb = ab_c[cls][:, None], bb_c[cls][:, None]
        sa = signal @ a[:2]
        sb = jnp.einsum("ntk,nk->nt", signal, b[cls, :2])
    ea, eb = gaussian_pair(z, aa, ab, bb)
    m = jnp.asarray(noisy)[None, :]
    return sa + sigma * jnp.where(m, ea, 0.0), sb + sigma * jnp.where(m, eb, 0.0)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class SingleHead(eqx.Module):
    """``f(X) = v^T X^T S(X p)`` (Magen et al.): query ``p: (d,)`` and head ``v: (d,)``."""

    p: jax.Array
    v: jax.Array

    def __call__(self, X: jax.Array):
        a = X @ self.p
        s = jax.nn.softmax(a, axis=-1)
        return jnp.sum(s * (X @ self.v), axis=-1), s, a


class SelfAttention(eqx.Module):
    """``f(X) = v^T X^T S(X W x_1)``: the first token queries through ``W: (d, d)``; head ``v``.

    ``x1_coords: (n, 2)`` (optional) says the first token lies in span(e1, e2) (noise-free signal
    token), so ``W x_1 = W[:, :2] x1_coords`` costs ``O(n d)`` instead of ``O(n d^2)``.
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
    """``L`` stacked single-head attention layers with the self-attention readout of M5.

    For ``l = 1..L-1`` (full self-attention, value = identity, no MLP, no normalisation)::

        A_l = S_rows(H_{l-1} W_l H_{l-1}^T)            (T x T, softmax over each row)
        H_l = H_{l-1} + A_l H_{l-1}   (residual = true) or   A_l H_{l-1}

    with ``H_0 = X``; then the readout ``f = v^T H_{L-1}^T S(H_{L-1} W_L h_1)`` with ``h_1`` the first
    token of ``H_{L-1}``. ``L = 1`` is exactly :class:`SelfAttention`. All ``W_l`` and ``v`` are
    trained. The call returns ``(f, s, (a, s_last))``: ``s`` is the *first* layer's attention of
    the first token (row 0 of ``A_1``, the signal token's query: "does layer 1 select the right
    token"), ``a`` its logits, ``s_last`` the readout attention. For ``L = 1`` all are the readout's.
    """

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


def _init_vec(key, shape, static, sw, dtype):
    if static.init == "gaussian":
        return sw["init_scale"] * jr.normal(key, shape, dtype)
    return jnp.zeros(shape, dtype)


def init_model(static: Static, sw: dict, key: jax.Array, dtype):
    d = static.d
    k1, k2 = jr.split(key)
    if static.model == "single_head":
        return SingleHead(p=_init_vec(k1, (d,), static, sw, dtype),
                          v=_init_vec(k2, (d,), static, sw, dtype))
    if static.model == "self_attention":
        return SelfAttention(W=_init_vec(k1, (d, d), static, sw, dtype),
                             v=_init_vec(k2, (d,), static, sw, dtype))
    # the readout W_L uses self_attention's key, so n_layers = 1 is exactly self_attention
    ks = list(jr.split(jr.fold_in(k1, 1), static.n_layers - 1)) + [k1]
    return MultiLayer(Ws=tuple(_init_vec(k, (d, d), static, sw, dtype) for k in ks),
                      v=_init_vec(k2, (d,), static, sw, dtype), residual=static.residual)


def norm_groups(model):
    """``(head, query)`` parameter groups for the radii ``(radius_v, radius_p)``."""
    if isinstance(model, SingleHead):
        return (model.v, model.p)
    if isinstance(model, SelfAttention):
        return (model.v, model.W)
    return (model.v, model.Ws)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def attention_metrics(s: jax.Array, batch: Batch) -> dict:
    """Mean attention per token position for clean / flipped samples, and top noise-token mass."""
    out = {}
    clean = ~batch.flipped
    mc = _masked_mean_rows(s, clean)
    mn = _masked_mean_rows(s, batch.flipped)
    for t in range(s.shape[-1]):
        out[f"attn_mean_clean_t{t}"] = mc[t]
        out[f"attn_mean_noisy_t{t}"] = mn[t]
    if s.shape[-1] > 1:
        top = jnp.max(s[:, 1:], axis=-1)
        out["mass_clean_top_noise"] = _masked_mean(top, clean)
        out["mass_noisy_top_noise"] = _masked_mean(top, batch.flipped)
    return out


def vec_metrics(name: str, v: jax.Array) -> dict:
    vn = jnp.linalg.norm(v)
    safe = jnp.where(vn > 0, vn, 1.0)
    return {f"{name}_norm": vn, f"{name}_align_e1": jnp.where(vn > 0, v[0] / safe, 0.0),
            f"{name}_align_e2": jnp.where(vn > 0, v[1] / safe, 0.0)}


def param_metrics(model) -> dict:
    out = vec_metrics("v", model.v)
    if isinstance(model, SingleHead):
        out.update(vec_metrics("p", model.p))
        out["q_norm"] = out["p_norm"]
    else:
        W = model.W if isinstance(model, SelfAttention) else model.Ws[-1]
        out["W_norm"] = jnp.linalg.norm(W)
        out["q_norm"] = jnp.linalg.norm(W[:, :2])  # ||W e1||, ||W e2|| together
        out["p_norm"] = rules.tree_norm(norm_groups(model)[1])  # the group radius_p constrains
    return out


def test_metrics(f: jax.Array, y_clean: jax.Array) -> dict:
    margin = y_clean * f
    return {"test_acc": jnp.mean((margin > 0).astype(f.dtype)), "test_loss": logistic_loss(margin)}


# --------------------------------------------------------------------------------------------
# Trained Magen models
# --------------------------------------------------------------------------------------------


def run_magen(static: Static, sw: dict, key: jax.Array) -> RunOutput:
    """Train ``single_head`` / ``self_attention`` / ``multi_layer`` on Magen data by full-batch
    GD (with the rule of :func:`phasebo.rules.make_optimizer`)."""
    dtype = dtype_of(static)
    d, n, T = static.d, static.n, static.T
    mode = noise_mode(static, magen=True)
    roles = magen_roles(T)
    noisy = noisy_tokens(T, static.signal_noise)
    k_data, k_test, k_init = jr.split(key, 3)
    common = dict(noise_mode=mode, signal_noise=static.signal_noise, label_mode=static.label_mode,
                  dtype=dtype)
    batch = magen_sample(k_data, n, d, T, sw, label_noise=static.label_noise, **common)
    sampled = static.test_mode == "sampled"
    test = magen_sample(k_test, static.n_test, d if sampled else None, T, sw, label_noise=None,
                        **common)
    z_test = jr.normal(jr.fold_in(k_test, 1), (static.n_test, T, 2), dtype)
    cls_test = (test.y_clean < 0).astype(jnp.int32)
    model = init_model(static, sw, k_init, dtype)
    fast = None if static.signal_noise else batch.signal[:, 0, :]

    def forward(m, X, x1=None):
        if isinstance(m, SelfAttention):
            return m(X, x1)
        return m(X)

    def loss_aux(m):
        f, s, a = forward(m, batch.X, fast)
        return logistic_loss(batch.y * f), (f, s, a)

    def evaluate_test(m) -> dict:
        if sampled:
            x1 = None if static.signal_noise else test.signal[:, 0, :]
            f = forward(m, test.X, x1)[0]
        else:
            if isinstance(m, SingleHead):
                h, a = projected_token_scores(z_test, test.signal, m.v, m.p, None,
                                              sw["sigma_eps"], mode, noisy)
            else:  # self-attention: one query per clean class, W mu_{+/-}
                rho = sw["signal_norm"]
                Q = jnp.stack([rho * m.W[:, 0], rho * m.W[:, 1]])  # (2, d)
                h, a = projected_token_scores(z_test, test.signal, m.v, Q, cls_test,
                                              sw["sigma_eps"], mode, noisy)
            f = jnp.sum(jax.nn.softmax(a, axis=-1) * h, axis=-1)
        return test_metrics(f, test.y_clean)

    def metrics(m, f, s, a) -> dict:
        out = train_metrics(f, s, a if not isinstance(a, tuple) else a[0], batch, roles)
        out.update(evaluate_test(m))
        out.update(param_metrics(m))
        out["margin_norm"] = jnp.where(out["v_norm"] > 0,
                                       out["margin"] / jnp.where(out["v_norm"] > 0,
                                                                 out["v_norm"], 1.0), 0.0)
        out.update(attention_metrics(s, batch))
        if isinstance(a, tuple):  # multi_layer: readout attention too
            s_last = a[1]
            out["mass_clean_rel_last"] = _masked_mean(s_last[:, 0], ~batch.flipped)
            out["mass_noisy_rel_last"] = _masked_mean(s_last[:, 0], batch.flipped)
        return out

    i_clean, i_noisy = tracked_samples(batch)

    def record_fn(m, f, s, a):
        out = metrics(m, f, s, a)
        out.update(tracked_token_metrics(s, a, i_clean, i_noisy, logits=False))
        return out

    opt = rules.make_optimizer(static, sw, norm_groups)
    record_at = C.record_steps(static.steps, static.record_every, static.record_log)
    m, (f, s, a), first_fit, all_fit, cumS, div, buf = gd_loop(
        model, loss_aux, sw["lr"], static.steps, record_at, record_fn, batch,
        lambda s_: relevant_mass(s_, roles), optimizer=opt,
    )
    final = finish(metrics(m, f, s, a), first_fit, all_fit, cumS, div, batch)
    samples = {
        "flipped": batch.flipped, "y_clean": batch.y_clean.astype(jnp.int32),
        "first_fit_step": first_fit, "final_margin": batch.y * f, "signal_prob": s[:, 0],
    }
    return RunOutput(final, buf, samples)


def _check_magen(r: dict) -> None:
    model = r["model"]
    if r["T"] < 2:
        raise ConfigError(f"T = {r['T']} must be >= 2 for {model} (one signal token and T-1 noise "
                          "tokens); fix: T = 2 (Magen et al.) or T = 5 (multi-token variant)")
    if r["d"] < 3:
        raise ConfigError(f"d = {r['d']} must be >= 3 (the signals live on e1 and e2)")
    if model == "multi_layer" and r["test_mode"] != "sampled":
        raise ConfigError("multi_layer has no exact projected test set; fix: test_mode = "
                          "\"sampled\" (and a modest n_test)")
    if model == "self_attention" and r["signal_noise"] and r["test_mode"] != "sampled":
        raise ConfigError("self_attention with signal_noise = true has a random query, so its "
                          "test set cannot be projected exactly; fix: test_mode = \"sampled\"")


def _derived_magen(r: dict) -> dict:
    return {"n_flip_per_class": n_flip_per_class(r["n"], r["noise_ratio"])}


def _bytes_magen(static: Static) -> int:
    item = 8 if static.dtype == "float64" else 4
    d, n, T = static.d, static.n, static.T
    b = 3 * n * T * d + 8 * d
    if static.model == "self_attention":
        b += 4 * d * d
    if static.model == "multi_layer":
        b += 4 * static.n_layers * d * d + 3 * static.n_layers * n * T * d
    b += 2 * static.n_test * T * d if static.test_mode == "sampled" else 6 * static.n_test * T
    n_rec = len(C.record_steps(static.steps, static.record_every, static.record_log))
    b += n_rec * (60 + 4 * T)
    return int(b * item)


for _name, _doc in (
    ("single_head", "f = v^T X^T S(X p), p and v trained (Magen et al.)"),
    ("self_attention", "f = v^T X^T S(X W x_1), W and v trained (Magen et al. M5)"),
    ("multi_layer", "L self-attention layers + self-attention readout (Magen et al. M9)"),
):
    register_model(ModelSpec(name=_name, run=run_magen, check=_check_magen,
                             derived=_derived_magen, bytes_per_run=_bytes_magen, doc=_doc))


# --------------------------------------------------------------------------------------------
# SPEC S1: the hand-built query of Sakamoto & Sato (no training)
# --------------------------------------------------------------------------------------------


def sakamoto_batch(key, n, d, roles, sw, static, label_noise, dtype) -> Batch:
    """:func:`phasebo.data.sakamoto_sample`, with the noise projected off span(e1, e2) when
    ``noise_mode = "projected"``."""
    b = sakamoto_sample(key, n, d, roles, sw, label_mode=static.label_mode,
                        label_noise=label_noise, dtype=dtype)
    if noise_mode(static, magen=False) == "projected" and b.X is not None:
        emb = embed_signal(b.signal, d)
        b = b._replace(X=emb + project_off_signal(b.X - emb))
    return b


def constructed_query(batch: Batch, roles: np.ndarray, signal_norm, lam) -> jax.Array:
    """``p = mu_+ + mu_- + lam (sum_clean eps_{i,rel} + sum_noisy eps_{i,tok2})`` (SPEC S1):
    ``eps`` are the training tokens' noise; ``rel`` the first relevant token, ``tok2`` the first
    weakly relevant opposite-class token (token 2 of the default layout)."""
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


def run_constructed_query(static: Static, sw: dict, key: jax.Array) -> RunOutput:
    """SPEC S1 on Sakamoto data with ``W = I`` and the fixed head ``nu``; no training.

    The ``samples`` table has ``n + n_test`` rows per run: training samples first, then the test
    samples (``is_test = 1``, clean labels); per row ``sel_token`` (argmax-attention token),
    ``sel_e1``, ``sel_e2`` (its coordinates on e1, e2: the S1 scatter plot), ``y``, ``y_clean``,
    ``flipped``, ``final_margin = y f``.
    """
    dtype = dtype_of(static)
    d = static.d
    roles = token_roles(static.T, static.n_relevant, static.n_weak, static.n_weak_opp)
    k_data, k_test = jr.split(key)
    batch = sakamoto_batch(k_data, static.n, d, roles, sw, static, static.label_noise, dtype)
    test = sakamoto_batch(k_test, static.n_test, d, roles, sw, static, None, dtype)
    p = constructed_query(batch, roles, sw["signal_norm"], sw["query_lambda"])
    nu = sakamoto_head(d, sw["signal_norm"], dtype)
    f, s, a, sel, coords = hard_select(batch.X, p, nu)
    ft, _, _, sel_t, coords_t = hard_select(test.X, p, nu)
    final = train_metrics(f, s, a, batch, roles)
    final.update(test_metrics(ft, test.y_clean))
    final.update(vec_metrics("p", p))
    final["q_norm"] = final["p_norm"]
    fitted = batch.y * f > 0
    first_fit = jnp.where(fitted, 0, -1).astype(jnp.int32)
    all_fit = jnp.where(jnp.all(fitted), 0, -1).astype(jnp.int32)
    final = finish(final, first_fit, all_fit, jnp.zeros(4, dtype), jnp.asarray(-1, jnp.int32),
                   batch)
    n_test = static.n_test
    samples = {
        "is_test": jnp.concatenate([jnp.zeros(static.n, jnp.int32), jnp.ones(n_test, jnp.int32)]),
        "flipped": jnp.concatenate([batch.flipped, test.flipped]),
        "y": jnp.concatenate([batch.y, test.y]).astype(jnp.int32),
        "y_clean": jnp.concatenate([batch.y_clean, test.y_clean]).astype(jnp.int32),
        "first_fit_step": jnp.concatenate([first_fit, jnp.where(test.y * ft > 0, 0, -1)]),
        "final_margin": jnp.concatenate([batch.y * f, test.y * ft]),
        "sel_token": jnp.concatenate([sel, sel_t]).astype(jnp.int32),
        "sel_e1": jnp.concatenate([coords[:, 0], coords_t[:, 0]]),
        "sel_e2": jnp.concatenate([coords[:, 1], coords_t[:, 1]]),
    }
    return RunOutput(final, {}, samples)


def _check_constructed(r: dict) -> None:
    MODELS["prompt_attention"].check(r)  # same Sakamoto layout rules
    if r["test_mode"] != "sampled":
        raise ConfigError("constructed_query reports the selected test tokens' coordinates, so it "
                          "needs full test tokens; fix: test_mode = \"sampled\"")


def _bytes_constructed(static: Static) -> int:
    item = 8 if static.dtype == "float64" else 4
    return int(item * 3 * (static.n + static.n_test) * static.T * static.d)


register_model(ModelSpec(
    name="constructed_query", run=run_constructed_query, check=_check_constructed,
    derived=lambda r: {"n_flip_per_class": n_flip_per_class(r["n"], r["noise_ratio"])},
    bytes_per_run=_bytes_constructed,
    doc="SPEC S1: hand-built query p = mu_+ + mu_- + lambda (memorised noise), argmax selection",
))


def _refuse_projected_noise(model: str) -> None:
    """prompt_attention draws isotropic noise only: reject ``noise_mode = "projected"`` there."""
    inner = C.MODEL_CHECKS[model]

    def check(r: dict) -> None:
        if r.get("noise_mode", "auto") == "projected":
            raise ConfigError(f"model = {model!r} draws isotropic token noise only; fix: "
                              "noise_mode = \"auto\" or \"isotropic\"")
        inner(r)

    C.MODEL_CHECKS[model] = check


_refuse_projected_noise("prompt_attention")
