"""Metrics shared by the models: accuracies, losses, attention mass per token role, 𝔖 sums.

Conventions: a sample is *fitted* when its margin is strictly positive (``y f > 0`` for a binary
model; ``f_y > max_{c != y} f_c`` for a multiclass one), so ``f = 0`` is an error. The loss is the
mean logistic loss ``softplus(-y f)`` (binary) or the mean cross-entropy (multiclass). The four
*groups* are clean / flipped samples x clean class (``pos``: clean label +1, or class 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .data import ROLE_NAMES, Batch

GROUPS = ("clean_pos", "clean_neg", "noisy_pos", "noisy_neg")


def masked_mean(x, mask):
    """Mean of ``x`` where ``mask`` holds; NaN if it holds nowhere."""
    cnt = jnp.sum(mask).astype(x.dtype)
    return jnp.where(cnt > 0, jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(cnt, 1), jnp.nan)


def masked_mean_rows(x, mask):
    """Mean over rows of ``x: (n, k)`` where ``mask`` (n,) holds: (k,), NaN if none."""
    cnt = jnp.sum(mask).astype(x.dtype)
    tot = jnp.sum(jnp.where(mask[:, None], x, 0.0), axis=0)
    return jnp.where(cnt > 0, tot / jnp.maximum(cnt, 1), jnp.nan)


def group_masks(y_clean, flipped):
    clean = ~flipped
    pos = y_clean > 0
    return (clean & pos, clean & ~pos, flipped & pos, flipped & ~pos)


def _tokens(x, axis=-1):
    return [jax.lax.index_in_dim(x, t, axis, keepdims=False) for t in range(x.shape[axis])]


def softmax_tokens(a):
    """``softmax(a)`` over the last (token) axis, unrolled over its few entries: XLA on CPU runs
    reductions over a short minor axis slowly, and T elementwise passes fast."""
    cols = _tokens(a)
    m = cols[0]
    for c in cols[1:]:
        m = jnp.maximum(m, c)
    m = jax.lax.stop_gradient(m)
    e = [jnp.exp(c - m) for c in cols]
    den = e[0]
    for c in e[1:]:
        den = den + c
    return jnp.stack([c / den for c in e], axis=-1)


def sum_tokens(x):
    """``x.sum(-1)`` unrolled over the token axis (see :func:`softmax_tokens`)."""
    cols = _tokens(x)
    out = cols[0]
    for c in cols[1:]:
        out = out + c
    return out


def attend(logits, values, axis=-1):
    """``sum_t softmax(logits)_t values_t`` over the token ``axis`` as ``sum(e v) / sum(e)`` with
    ``e = exp(logits - max)``: one division per row, unrolled over the tokens (the test sets of
    every recorded step go through here). With the tokens first (``axis=0``, a token-major test
    set) each token is a contiguous row and every pass runs on whole vectors."""
    ls, vs = _tokens(logits, axis), _tokens(values, axis)
    m = ls[0]
    for c in ls[1:]:
        m = jnp.maximum(m, c)
    m = jax.lax.stop_gradient(m)
    num = den = None
    for c, v in zip(ls, vs):
        e = jnp.exp(c - m)
        num = e * v if num is None else num + e * v
        den = e if den is None else den + e
    return num / den


def relevant_mass(s, roles):
    """``s_R``: the softmax mass on the relevant tokens (role 0), ``(..., T) -> (...)``."""
    rel = [int(t) for t in np.flatnonzero(np.asarray(roles) == 0)]
    if not rel:
        return jnp.zeros(s.shape[:-1], s.dtype)
    return sum(s[..., t] for t in rel)


def logistic_loss(margin):
    """Mean logistic loss ``softplus(-y f)`` over samples."""
    return jnp.mean(jax.nn.softplus(-margin))


def binary_margin(f, y):
    return y * f


def multiclass_margin(f, y):
    """``f_y - max_{c != y} f_c`` for logits ``f: (n, C)`` and integer labels ``y: (n,)``."""
    fy = jnp.take_along_axis(f, y[:, None], axis=-1)[:, 0]
    other = jnp.where(jax.nn.one_hot(y, f.shape[-1], dtype=bool), -jnp.inf, f)
    return fy - jnp.max(other, axis=-1)


def cross_entropy(f, y):
    return jnp.mean(jax.nn.logsumexp(f, axis=-1) - jnp.take_along_axis(f, y[:, None], -1)[:, 0])


def train_metrics(margin, loss, s, batch: Batch, roles: np.ndarray | None) -> dict:
    """Scalar metrics of a training forward pass: loss, accuracies on all / clean / flipped
    samples, the smallest margin, and (with token roles) the mean softmax mass per role for clean
    and flipped samples and the mean ``s_R (1 - s_R)`` per group (``s_R`` the relevant mass)."""
    correct = (margin > 0).astype(margin.dtype)
    clean = ~batch.flipped
    out = {
        "train_loss": loss,
        "train_acc": jnp.mean(correct),
        "train_acc_clean": masked_mean(correct, clean),
        "train_acc_noisy": masked_mean(correct, batch.flipped),
        "margin": jnp.min(margin),
    }
    if roles is not None:
        onehot = jax.nn.one_hot(jnp.asarray(roles), len(ROLE_NAMES), dtype=s.dtype)  # (T, 4)
        mass = s @ onehot  # (n, 4)
        m_clean = masked_mean_rows(mass, clean)
        m_noisy = masked_mean_rows(mass, batch.flipped)
        sR = relevant_mass(s, roles)
        ss = sR * (1 - sR)
        for k, r in enumerate(ROLE_NAMES):
            out[f"mass_clean_{r}"] = m_clean[k]
            out[f"mass_noisy_{r}"] = m_noisy[k]
        for g, mask in zip(GROUPS, group_masks(batch.y_clean, batch.flipped)):
            out[f"ss_{g}"] = masked_mean(ss, mask)
    return out


def tracked_default(batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Index of the first clean and the first flipped sample (0 if there is none)."""
    return jnp.argmax(~batch.flipped), jnp.argmax(batch.flipped)


def tracked_token_metrics(s, a, track, logits: bool = True, present=None) -> dict:
    """Softmax weight (and logit) of every token of the tracked samples.

    ``track``: ``None`` for the first clean and the first flipped sample (columns
    ``attn_clean_t{k}``, ``attn_noisy_t{k}``), else a tuple of sample indices (columns
    ``attn_i{idx}_t{k}``); ``s, a: (n, T)``. ``present``: for the default pair, whether the run
    has a clean and a flipped sample at all; an absent one's columns are NaN (a run without
    label noise has no flipped sample to follow, and index 0 is a clean one).
    """
    out = {}
    if isinstance(track, tuple) and track and isinstance(track[0], int):
        names = [(f"i{i}", i, None) for i in track]
    else:
        has = (None, None) if present is None else present
        names = [("clean", track[0], has[0]), ("noisy", track[1], has[1])]
    for t in range(s.shape[-1]):
        for name, i, ok in names:
            out[f"attn_{name}_t{t}"] = s[i, t] if ok is None else jnp.where(ok, s[i, t], jnp.nan)
            if logits:
                out[f"logit_{name}_t{t}"] = a[i, t] if ok is None else \
                    jnp.where(ok, a[i, t], jnp.nan)
    return out


def query_metrics(q: jax.Array, p: jax.Array) -> dict:
    """``p_norm = ||p||``, ``p_align_e1/e2 = p[e1|e2] / ||p||``, ``q_norm = ||q||``."""
    pn = jnp.linalg.norm(p)
    safe = jnp.where(pn > 0, pn, 1.0)
    return {
        "p_norm": pn,
        "p_align_e1": jnp.where(pn > 0, p[0] / safe, 0.0),
        "p_align_e2": jnp.where(pn > 0, p[1] / safe, 0.0),
        "q_norm": jnp.linalg.norm(q),
    }


def vec_metrics(name: str, v: jax.Array) -> dict:
    vn = jnp.linalg.norm(v)
    safe = jnp.where(vn > 0, vn, 1.0)
    return {f"{name}_norm": vn, f"{name}_align_e1": jnp.where(vn > 0, v[0] / safe, 0.0),
            f"{name}_align_e2": jnp.where(vn > 0, v[1] / safe, 0.0)}


def attention_metrics(s: jax.Array, batch: Batch) -> dict:
    """Mean attention per token position for clean / flipped samples, and the mean largest
    non-first-token mass (``mass_*_top_noise``)."""
    out = {}
    clean = ~batch.flipped
    mc = masked_mean_rows(s, clean)
    mn = masked_mean_rows(s, batch.flipped)
    for t in range(s.shape[-1]):
        out[f"attn_mean_clean_t{t}"] = mc[t]
        out[f"attn_mean_noisy_t{t}"] = mn[t]
    if s.shape[-1] > 1:
        top = jnp.max(s[:, 1:], axis=-1)
        out["mass_clean_top_noise"] = masked_mean(top, clean)
        out["mass_noisy_top_noise"] = masked_mean(top, batch.flipped)
    return out


def tree_norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(tree)))


def margin_norm(margin_min, v_norm):
    """``min_i y_i f_i / ||v||``: the normalised margin (f is 1-homogeneous in v)."""
    return jnp.where(v_norm > 0, margin_min / jnp.where(v_norm > 0, v_norm, 1.0), 0.0)


def all_finite(tree) -> jax.Array:
    """Whether every array of ``tree`` is finite (a run's divergence and a flow's solve)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
