"""Token distributions, label noise and test sets.

Sakamoto & Sato layout (SPEC §1). Signals ``mu_+ = ||mu|| e1``, ``mu_- = ||mu|| e2``; every token
carries isotropic noise ``eps ~ N(0, sigma_eps^2 I_d)``. For a sample with clean label ``y~``:

- tokens ``[0, n_relevant)`` are *relevant*: ``mu_{y~} + eps``;
- the next ``n_weak`` are *weakly relevant*: ``rho mu_{y~} + eps``;
- the next ``n_weak_opp`` are *weakly relevant, opposite class*: ``rho mu_{-y~} + eps``;
- the rest are *irrelevant*: ``eps``.

Shapes: a training set is ``X: (n, T, d)``; its signal part is kept separately as coordinates on
``(e1, e2)``, ``signal: (n, T, 2)``, which is all the projected test set and the span-of-tokens
engines need.

Labels: ``balanced`` (first ``floor(n/2)`` samples ``y~ = +1``, the rest ``-1``, as the paper's code)
or ``iid`` (uniform). Label noise: ``fraction`` flips ``floor(k/2)`` samples of each clean class with
``k = ceil(n r)`` (the paper's code; the flips are the first ones of each class, which is a uniformly
random choice because samples are i.i.d.), or ``bernoulli`` flips each label with probability ``r``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

ROLE_NAMES = ("rel", "weak", "weak_opp", "irr")
RELEVANT, WEAK, WEAK_OPP, IRRELEVANT = range(4)


class Batch(NamedTuple):
    """A labelled set of token sequences."""

    X: jax.Array | None  # (n, T, d) full tokens, or None where only projections are needed
    signal: jax.Array  # (n, T, 2) signal coordinates on (e1, e2)
    y: jax.Array  # (n,) observed labels in {-1, +1} (float)
    y_clean: jax.Array  # (n,) clean labels
    flipped: jax.Array  # (n,) bool


def token_roles(T: int, n_relevant: int, n_weak: int, n_weak_opp: int) -> np.ndarray:
    """Role code per token position (0 relevant, 1 weak, 2 weak opposite, 3 irrelevant)."""
    roles = np.full(T, IRRELEVANT, dtype=np.int32)
    roles[:n_relevant] = RELEVANT
    roles[n_relevant : n_relevant + n_weak] = WEAK
    roles[n_relevant + n_weak : n_relevant + n_weak + n_weak_opp] = WEAK_OPP
    return roles


def n_flip_per_class(n: int, noise_ratio: float) -> int:
    """``floor(ceil(n r) / 2)``, computed exactly on the host (20 * 0.2 must give 4, not 5)."""
    k = math.ceil(round(n * noise_ratio, 9))
    return k // 2


def clean_labels(key: jax.Array, n: int, mode: str, dtype) -> jax.Array:
    if mode == "balanced":
        return jnp.where(jnp.arange(n) < n // 2, 1.0, -1.0).astype(dtype)
    return jnp.where(jr.bernoulli(key, 0.5, (n,)), 1.0, -1.0).astype(dtype)


def flip_mask(
    key: jax.Array, y_clean: jax.Array, mode: str, noise_ratio: jax.Array, per_class: jax.Array
) -> jax.Array:
    """Which labels flip: ``per_class`` first samples of each clean class, or Bernoulli(r)."""
    if mode == "bernoulli":
        return jr.bernoulli(key, noise_ratio, y_clean.shape)
    pos = y_clean > 0
    rank_pos = jnp.cumsum(pos) - 1  # index of a sample among its class
    rank_neg = jnp.cumsum(~pos) - 1
    return jnp.where(pos, rank_pos < per_class, rank_neg < per_class)


def draw_labels(
    k_lab: jax.Array, k_flip: jax.Array, n: int, sw: dict, *, label_mode: str,
    label_noise: str | None, dtype,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(y, y_clean, flipped)``: clean labels, then flips (none when ``label_noise`` is None)."""
    y_clean = clean_labels(k_lab, n, label_mode, dtype)
    if label_noise is None:
        flipped = jnp.zeros(n, bool)
    else:
        flipped = flip_mask(k_flip, y_clean, label_noise, sw["noise_ratio"], sw["n_flip_per_class"])
    return jnp.where(flipped, -y_clean, y_clean), y_clean, flipped


def sakamoto_signal(
    y_clean: jax.Array, roles: np.ndarray, signal_norm: jax.Array, rho: jax.Array
) -> jax.Array:
    """Signal coordinates ``(n, T, 2)`` on ``(e1, e2)`` for clean labels ``y_clean``."""
    dtype = y_clean.dtype
    own = jnp.stack([(y_clean > 0), (y_clean < 0)], -1).astype(dtype)  # mu_{y~} / ||mu||
    opp = own[:, ::-1]
    r = jnp.asarray(roles)
    scale = jnp.where(r == RELEVANT, 1.0, jnp.where(r == IRRELEVANT, 0.0, rho)).astype(dtype)
    is_opp = (r == WEAK_OPP)[None, :, None]
    direction = jnp.where(is_opp, opp[:, None, :], own[:, None, :])  # (n, T, 2)
    return signal_norm * scale[None, :, None] * direction


def embed_signal(signal: jax.Array, d: int) -> jax.Array:
    """Signal coordinates ``(..., 2)`` -> vectors ``(..., d)`` on the first two axes."""
    pad = [(0, 0)] * (signal.ndim - 1) + [(0, d - 2)]
    return jnp.pad(signal, pad)


def sakamoto_sample(
    key: jax.Array,
    n: int,
    d: int | None,
    roles: np.ndarray,
    sw: dict,
    *,
    label_mode: str,
    label_noise: str | None,
    dtype,
) -> Batch:
    """Draw ``n`` Sakamoto sequences. ``d=None`` skips the d-dimensional noise (projections only);
    ``label_noise=None`` keeps the labels clean (test sets)."""
    k_lab, k_flip, k_noise = jr.split(key, 3)
    T = len(roles)
    y, y_clean, flipped = draw_labels(k_lab, k_flip, n, sw, label_mode=label_mode,
                                      label_noise=label_noise, dtype=dtype)
    signal = sakamoto_signal(y_clean, roles, sw["signal_norm"], sw["rho"])
    X = None
    if d is not None:
        noise = sw["sigma_eps"] * jr.normal(k_noise, (n, T, d), dtype)
        X = noise + embed_signal(signal, d)
    return Batch(X, signal, y, y_clean, flipped)


def projected_scores(
    key: jax.Array, signal: jax.Array, q: jax.Array, nu: jax.Array, sigma: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Exact draw of fresh tokens' attention logits ``x.q`` and head scores ``x.nu``.

    A fresh token is ``x = s + eps`` with ``s`` in span(e1, e2) and ``eps ~ N(0, sigma^2 I_d)``.
    Then ``(eps.nu, eps.q)`` is Gaussian with covariance ``sigma^2 [[nu.nu, nu.q], [nu.q, q.q]]``;
    writing ``nu_hat = nu/|nu|``, ``eps.nu = sigma |nu| z1`` and
    ``eps.q = sigma ((q.nu_hat) z1 + |q - (q.nu_hat) nu_hat| z2)`` with ``z1, z2`` i.i.d. N(0, 1).
    Cost ``O(n_test T)`` instead of ``O(n_test T d)``. ``key`` fixes ``z`` so repeated calls at
    different ``q`` (dynamics) reuse the same standard normals.

    Returns ``(logits, head)``, each ``(n_test, T)``.
    """
    z = jr.normal(key, signal.shape, signal.dtype)  # (n_test, T, 2)
    nu_norm = jnp.linalg.norm(nu)
    q_par = jnp.dot(q, nu) / nu_norm
    q_perp = jnp.sqrt(jnp.maximum(jnp.dot(q, q) - q_par**2, 0.0))
    eps_nu = sigma * nu_norm * z[..., 0]
    eps_q = sigma * (q_par * z[..., 0] + q_perp * z[..., 1])
    logits = signal @ q[:2] + eps_q
    head = signal @ nu[:2] + eps_nu
    return logits, head
