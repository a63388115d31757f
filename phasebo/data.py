"""Token distributions, label noise and exact test sets of both papers.

**Labels** (:func:`draw_labels`). Clean labels ``y~`` are ``balanced`` (first ``floor(n/2)`` samples
``+1``, the rest ``-1``, as Sakamoto & Sato's code) or ``iid`` (uniform). Label noise flips
``fraction``: ``floor(k/2)`` samples of each clean class with ``k = ceil(n r)`` (the paper's code;
the first ones of each class, a uniformly random choice because samples are i.i.d.);
``fixed_count``: ``k = ceil(n r)`` samples at uniformly random positions (the paper's first
version, with iid labels); ``bernoulli``: each label with probability ``r`` (Magen et al.).

**Sakamoto & Sato** (``sakamoto``). Signals ``mu_+ = ||mu|| e1``, ``mu_- = ||mu|| e2``; every token
carries isotropic noise ``eps ~ N(0, sigma_eps^2 I_d)``. For a sample of clean label ``y~``: tokens
``[0, n_relevant)`` are *relevant* ``mu_{y~} + eps``; the next ``n_weak`` *weakly relevant*
``rho mu_{y~} + eps``; the next ``n_weak_opp`` *weakly relevant, opposite class*
``rho mu_{-y~} + eps``; the rest *irrelevant* ``eps``.

**Magen et al.** (``magen``). Token 0 is the signal token ``mu_{y~}`` (``mu_1 = rho e1``,
``mu_2 = rho e2`` with ``rho`` the setting ``signal_norm``), noise-free unless ``signal_noise``;
tokens ``1..T-1`` are noise ``sigma_eps xi`` with ``xi ~ N(0, I - mu_1 mu_1^T/rho^2 -
mu_2 mu_2^T/rho^2)`` (``noise_mode = "projected"``: isotropic noise with coordinates 0, 1 zeroed,
never a d x d covariance) or ``N(0, I)`` (``"isotropic"``).

Shapes: a set is ``X: (n, T, d)`` with its signal part kept separately as coordinates on
``(e1, e2)``, ``signal: (n, T, 2)``, which is all an exact projected test set needs.

**Exact projected test sets.** A fresh token ``x = s + eps`` has ``s`` in span(e1, e2); for fixed
vectors ``a, b``, ``(eps.a, eps.b)`` is Gaussian with covariance ``sigma^2 Gram(P a, P b)`` (``P``
the projector of the noise), so two standard normals per token replace ``d``
(:func:`gaussian_pair`). Cost ``O(n_test T)`` instead of ``O(n_test T d)``.

**Reduced samplers** (for the ``reduced`` engine). The noise of the ``N = nT`` training tokens is
split into its e1, e2 coordinates (drawn explicitly) and its complement in the other ``d - 2``
dimensions, represented exactly in distribution by a Bartlett factor ``sigma L`` of
``Wishart(d - 2, I_N)`` (:mod:`phasebo.engines.wishart`): in a Haar-random orthonormal basis of
their span the complements *are* the rows of ``sigma L``. A token becomes a vector of
``R^{2 + m + r}``, ``m = min(N, d - 2)``; the last ``r`` coordinates hold the parts of a Gaussian
initialisation orthogonal to every token. ``d`` enters only as chi-square degrees of freedom,
read from the traced value ``sw["dim"]``, so the compiled program is the same for every ``d``
above :func:`reduced_d`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .engines.wishart import bartlett_factor, factor_width, n_normals, residual_norm
from .settings import ConfigError, Setting, nonneg, positive

ROLE_NAMES = ("rel", "weak", "weak_opp", "irr")
RELEVANT, WEAK, WEAK_OPP, IRRELEVANT = range(4)


class Batch(NamedTuple):
    """A labelled set of token sequences."""

    X: jax.Array | None  # (n, T, d) full tokens, or None where only projections are needed
    # (n, T, 2) signal coordinates on (e1, e2); token-major (2, T, n) in a projected test set
    # that is read so (prompt attention's: data.token_major)
    signal: jax.Array
    y: jax.Array  # (n,) observed labels in {-1, +1} (float)
    y_clean: jax.Array  # (n,) clean labels
    flipped: jax.Array  # (n,) bool
    z: jax.Array | None = None  # standard normals of an exact projected test set, drawn once
    # (n, T, 2), or token-major as signal
    # the noise part of X (X = noise + signal on e1, e2), where a span engine needs it apart:
    # runs that share their noise share its Gram (phasebo.engines.span.LowRank)
    noise: jax.Array | None = None


# --------------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------------


def n_flips(n, noise_ratio):
    """``k = ceil(n r)``, computed exactly on the host (20 * 0.2 must give 4, not 5); vectorised."""
    r = np.asarray(noise_ratio, np.float64)
    return np.ceil(np.round(n * r, 9)).astype(np.int32)


def n_flip_per_class(n: int, noise_ratio) -> int | np.ndarray:
    """``floor(ceil(n r) / 2)``: the flips per clean class of the ``fraction`` mode."""
    k = n_flips(n, noise_ratio) // 2
    return int(k) if np.ndim(k) == 0 else k


def label_values(n: int, noise_ratio) -> dict:
    """Host-computed traced values for :func:`draw_labels` (vectorised over ``noise_ratio``)."""
    k = n_flips(n, noise_ratio)
    return {"n_flip": k, "n_flip_per_class": k // 2}


def clean_labels(key: jax.Array, n: int, mode: str, dtype) -> jax.Array:
    if mode == "balanced":
        return jnp.where(jnp.arange(n) < n // 2, 1.0, -1.0).astype(dtype)
    return jnp.where(jr.bernoulli(key, 0.5, (n,)), 1.0, -1.0).astype(dtype)


def flip_mask(key: jax.Array, y_clean: jax.Array, mode: str, sw: dict) -> jax.Array:
    """Which labels flip (see the module docstring for the three modes)."""
    if mode == "bernoulli":
        return jr.bernoulli(key, sw["noise_ratio"], y_clean.shape)
    if mode == "fixed_count":
        u = jr.uniform(key, y_clean.shape)
        rank = jnp.argsort(jnp.argsort(u))  # a uniformly random ranking of the samples
        return rank < sw["n_flip"].astype(rank.dtype)
    per_class = sw["n_flip_per_class"]
    pos = y_clean > 0
    rank_pos = jnp.cumsum(pos, dtype=jnp.int32) - 1  # index of a sample among its class
    rank_neg = jnp.cumsum(~pos, dtype=jnp.int32) - 1
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
        flipped = flip_mask(k_flip, y_clean, label_noise, sw)
    return jnp.where(flipped, -y_clean, y_clean), y_clean, flipped


def embed_signal(signal: jax.Array, d: int) -> jax.Array:
    """Signal coordinates ``(..., 2)`` -> vectors ``(..., d)`` on the first two axes."""
    pad = [(0, 0)] * (signal.ndim - 1) + [(0, d - 2)]
    return jnp.pad(signal, pad)


def padded_draw(draw, key: jax.Array, lead: tuple, width: int, dim: jax.Array | None, dtype,
                **kw) -> jax.Array:
    """``draw(key, (*lead, dim))`` for a traced ``dim <= width``, zero-padded to ``(*lead, width)``:
    bit for bit the unpadded draw, so one compiled program serves every ``d`` up to ``width``.

    JAX's threefry (``jax_threefry_partitionable``, on by default) draws each element from its
    flat index alone, so an array's draws are the first entries of any larger draw with the same
    key: the ``prod(lead) * width`` numbers drawn here hold the unpadded array's ``prod(lead) * dim``
    at flat indices ``row * dim + j``, gathered to ``(row, j)``. ``dim=None``: the plain draw.
    A square ``lead = (width,)`` pads both axes (``W_0``)."""
    if dim is None:
        return draw(key, (*lead, width), dtype, **kw)
    rows = int(np.prod(lead))
    if rows * width >= 2**31:  # padded_width keeps such d unpadded: the int32 index would wrap
        raise ValueError(f"padded_draw: {rows} x {width} draws overflow the int32 flat index")
    flat = draw(key, (rows * width,), dtype, **kw)
    square = lead == (width,)
    r = jnp.arange(rows, dtype=jnp.int32)[:, None]
    j = jnp.arange(width, dtype=jnp.int32)[None, :]
    dim = jnp.asarray(dim, jnp.int32)
    inside = (j < dim) & ((r < dim) if square else True)
    out = jnp.where(inside, flat[jnp.where(inside, r * dim + j, 0)], 0)
    return out.reshape(*lead, width)


def padded_width(d: int, rows: int = 1) -> int:
    """The width a ``d``-dimensional run is padded to where an engine pads (:func:`padded_draw`):
    the next of ``2^k x (1, 1.25, 1.5, 1.75)``, at most 25 % wider (56 % more ``d^2`` work), so a
    map over ``d`` compiles a few programs per octave instead of one per ``d``. Small ``d`` stay as
    they are, and so do ``d`` where a padded draw of ``rows`` (the most rows any of the run's
    d-dimensional draws has) or ``width`` rows (a square ``W_0``) would overflow the int32 flat
    index of :func:`padded_draw`."""
    if d <= 64:
        return d
    k = 1 << (d.bit_length() - 1)  # 2^k <= d < 2^(k+1)
    width = next(k * f // 4 for f in (4, 5, 6, 7, 8) if k * f // 4 >= d)
    return width if width * max(width, rows) < 2**31 else d


def sakamoto_head(d: int, signal_norm: jax.Array, dtype) -> jax.Array:
    """``nu = (e1 - e2) / (sqrt(2) ||mu||)``."""
    nu = jnp.zeros(d, dtype).at[0].set(1.0).at[1].set(-1.0)
    return nu / (jnp.sqrt(jnp.asarray(2.0, dtype)) * signal_norm)


def project_off_signal(noise: jax.Array) -> jax.Array:
    """``(I - e1 e1^T - e2 e2^T) xi``: the projection off span(e1, e2) (zero coordinates 0, 1)."""
    return noise.at[..., :2].set(0.0)


def gaussian_pair(z: jax.Array, aa, ab, bb) -> tuple[jax.Array, jax.Array]:
    """``(g.a, g.b)`` for ``g ~ N(0, I)`` from standard normals ``z: (..., 2)``, given the Gram
    entries ``a.a, a.b, b.b`` (broadcastable to ``z[..., 0]``); exact and safe when ``a = 0``."""
    na = jnp.sqrt(aa)
    safe = jnp.where(na > 0, na, 1.0)
    b_par = jnp.where(na > 0, ab / safe, 0.0)
    b_perp = jnp.sqrt(jnp.maximum(bb - b_par**2, 0.0))
    return na * z[..., 0], b_par * z[..., 0] + b_perp * z[..., 1]


def projection_normals(key: jax.Array, shape, dtype) -> jax.Array:
    """The ``(n_test, T, 2)`` standard normals of an exact projected test set, drawn once per run
    and reused at every recorded step: each step's test metrics are exact in distribution, but
    across steps they are fully coupled, where one fixed d-dimensional test set would couple two
    steps only through the overlap of their query directions."""
    return materialised(jr.normal(jr.fold_in(key, 1), (*shape, 2), dtype))


def token_major(x: jax.Array) -> jax.Array:
    """``x: (n, T, 2) -> (2, T, n)``, computed once into memory (:func:`materialised`). A test set
    read at every recorded step is read this way: each token's component is then one contiguous
    row, and the test pass (:func:`projected_scores` with ``axis=0``, then
    :func:`phasebo.metrics.attend` over axis 0) runs on whole vectors, where the ``(n, T, 2)``
    layout reads every entry with a stride."""
    return materialised(jnp.transpose(x, (2, 1, 0)))


# Rows of the scatter that materialises a draw (see materialised)
MATERIALISE_ROWS = 8


def materialised(x: jax.Array) -> jax.Array:
    """``x``, computed once into memory (the same values). XLA fuses an elementwise producer into
    its consumers, so a draw read at every recorded step (inside the step loop, or vmapped over the
    recorded times after a flow's solve) is drawn again at each record: an ``erf_inv`` per normal,
    more than the record's own arithmetic. ``lax.optimization_barrier`` does not stop it on the CPU
    (the barrier is removed before fusion); a scatter is never fused into a consumer. Measured on a
    1000-sample projected test set: S2 recorded every 10 steps 1.1-1.5x faster, the flow with its
    records 1.07-1.12x (``python -m phasebo.bench --sections dynamics,flow``).

    The scatter writes :data:`MATERIALISE_ROWS` long rows, not one row per entry: vmapped, a
    scatter's updates put the scatter index before the runs, so with an index per entry XLA drew
    the values transposed (runs innermost, a strided write), ~4x slower per normal; with a few
    rows each run's values stay contiguous (a reduced run's setup 1.28x faster, d 2000). A
    single row would be an overwrite XLA removes."""
    L = x.size
    flat = jnp.pad(x.reshape(-1), (0, -L % MATERIALISE_ROWS)).reshape(MATERIALISE_ROWS, -1)
    rows = jnp.arange(MATERIALISE_ROWS)
    out = jnp.zeros_like(flat).at[rows].set(flat, indices_are_sorted=True, unique_indices=True)
    return out.reshape(-1)[:L].reshape(x.shape)


# --------------------------------------------------------------------------------------------
# Sakamoto & Sato
# --------------------------------------------------------------------------------------------


def _sakamoto_check(r: dict) -> None:
    T, nr, nw, nwo = r["T"], r["n_relevant"], r["n_weak"], r["n_weak_opp"]
    if T < 3:
        raise ConfigError(
            f"T = {T} is too small for the Sakamoto layout (relevant, weak, weak-opposite and "
            "irrelevant tokens); fix: T >= 3 (the paper uses T = 8)")
    if nr + nw + nwo > T:
        raise ConfigError(
            f"n_relevant + n_weak + n_weak_opp = {nr + nw + nwo} exceeds T = {T}; fix: raise T or "
            "lower the role counts")
    if r["d"] < 3:
        raise ConfigError(f"d = {r['d']} must be >= 3 (the signals live on e1 and e2)")


SAKAMOTO_SETTINGS = (
    Setting("d", 2000, int, "static", "token dimension", positive),
    Setting("T", 8, int, "static", "tokens per sequence", positive),
    Setting("n_relevant", 1, int, "static", "Sakamoto layout: relevant tokens (first)", positive),
    Setting("n_weak", 1, int, "static", "Sakamoto layout: weakly relevant tokens, same class",
            nonneg),
    Setting("n_weak_opp", 1, int, "static", "Sakamoto layout: weakly relevant, opposite class",
            nonneg),
    Setting("signal_norm", 20.0, float, "swept", "signal norm ||mu||", positive),
    Setting("rho", 0.1, float, "swept", "Sakamoto weak-relevance factor rho", nonneg),
    Setting("sigma_eps", 1.0, float, "swept", "token noise standard deviation", positive),
    Setting("common_noise", "none", str, "host",
            "runs that differ only along this axis share their random draws (noise, labels, "
            "test set, as the official code's seeded data, and W_0, which the official code "
            "draws per run): common random numbers along signal_norm; none: every run "
            "independent", choices=("none", "signal_norm"),
            silent_default=True),
)
COMMON_NOISE = SAKAMOTO_SETTINGS[8]


def token_roles(T: int, n_relevant: int, n_weak: int, n_weak_opp: int) -> np.ndarray:
    """Role code per token position (0 relevant, 1 weak, 2 weak opposite, 3 irrelevant)."""
    roles = np.full(T, IRRELEVANT, dtype=np.int32)
    roles[:n_relevant] = RELEVANT
    roles[n_relevant : n_relevant + n_weak] = WEAK
    roles[n_relevant + n_weak : n_relevant + n_weak + n_weak_opp] = WEAK_OPP
    return roles


def sakamoto_roles(static) -> np.ndarray:
    return token_roles(static.T, static.n_relevant, static.n_weak, static.n_weak_opp)


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


def signal_pattern(batch: Batch, roles: np.ndarray, sw: dict) -> jax.Array:
    """``S_0: (n T, 2)``, the signal per unit norm (``batch.signal = ||mu|| S_0``): a function
    of the labels, roles and ``rho`` alone, so runs that share their draws and differ only in
    ``||mu||`` share it (phasebo.engines.span.LowRank)."""
    return sakamoto_signal(batch.y_clean, roles, 1.0, sw["rho"]).reshape(-1, 2)


def sakamoto_sample(
    key: jax.Array, n: int, d: int | None, roles: np.ndarray, sw: dict, *, label_mode: str,
    label_noise: str | None, dtype, noise_mode: str = "isotropic", dim: jax.Array | None = None,
) -> Batch:
    """Draw ``n`` Sakamoto sequences. ``d=None`` skips the d-dimensional noise (projections only);
    ``label_noise=None`` keeps the labels clean (test sets). ``dim``: the true ``d <= d`` when the
    tokens are zero-padded to ``d`` (:func:`padded_draw`: the same draws as unpadded)."""
    k_lab, k_flip, k_noise = jr.split(key, 3)
    T = len(roles)
    y, y_clean, flipped = draw_labels(k_lab, k_flip, n, sw, label_mode=label_mode,
                                      label_noise=label_noise, dtype=dtype)
    signal = sakamoto_signal(y_clean, roles, sw["signal_norm"], sw["rho"])
    X = None
    if d is not None:
        noise = sw["sigma_eps"] * padded_draw(jr.normal, k_noise, (n, T), d, dim, dtype)
        if noise_mode == "projected":
            noise = project_off_signal(noise)
        X = noise + embed_signal(signal, d)
        return Batch(X, signal, y, y_clean, flipped, noise=noise)
    return Batch(X, signal, y, y_clean, flipped)


def projected_scores(
    z: jax.Array, signal: jax.Array, q: jax.Array, nu: jax.Array, sigma: jax.Array, axis: int = -1
) -> tuple[jax.Array, jax.Array]:
    """Exact fresh tokens' attention logits ``x.q`` and head scores ``x.nu`` (isotropic noise).

    With ``nu_hat = nu/|nu|``: ``eps.nu = sigma |nu| z1`` and
    ``eps.q = sigma ((q.nu_hat) z1 + |q - (q.nu_hat) nu_hat| z2)``, ``z`` from :func:`projection_normals`.
    ``z`` and ``signal`` hold their two components on ``axis``: ``(n_test, T, 2)`` gives
    ``(logits, head)`` each ``(n_test, T)``; token-major ``(2, T, n_test)`` (:func:`token_major`,
    ``axis=0``) gives them ``(T, n_test)``.
    """
    nu_norm = jnp.linalg.norm(nu)
    q_par = jnp.dot(q, nu) / nu_norm
    q_perp = jnp.sqrt(jnp.maximum(jnp.dot(q, q) - q_par**2, 0.0))
    s1, s2, z1, z2 = (jax.lax.index_in_dim(x, c, axis, keepdims=False)
                      for x in (signal, z) for c in (0, 1))
    # four scalars times four fixed (n_test, T) arrays: one fused pass (no contraction over 2)
    logits = s1 * q[0] + s2 * q[1] + (sigma * q_par) * z1 + (sigma * q_perp) * z2
    head = s1 * nu[0] + s2 * nu[1] + (sigma * nu_norm) * z1
    return logits, head


def reduced_d(n: int, T: int) -> int:
    """The smallest ``d`` from which the reduced engines' program no longer depends on ``d``."""
    return n * T + 4


def reduced_normals(key, N: int, d: int, dtype) -> jax.Array:
    """The standard normals of a reduced training set's noise, in one draw: ``2N`` for its
    ``(e1, e2)`` coordinates, then the Wishart factor's (:func:`n_normals`). Materialised: fused
    into the factor's gather, XLA drew every normal again per gathered entry (Threefry and
    ``erf_inv`` inside the gather; a run's setup 0.49 -> 0.36 ms, d 2000)."""
    return materialised(jr.normal(key, (2 * N + n_normals(N, d - 2),), dtype))


def sakamoto_reduced_sample(key, n: int, d: int, roles, sw: dict, *, label_mode, label_noise,
                            dtype) -> Batch:
    """A Sakamoto training set in the reduced coordinates ``(e1, e2, Q, rest)``: ``X: (n, T, m+3)``.

    Labels, flips and signals come from :func:`sakamoto_sample` with the same key (``d = None``
    draws no noise), so a reduced run has the direct run's labels; the noise is drawn here.
    """
    T = len(roles)
    N = n * T
    base = sakamoto_sample(key, n, None, roles, sw, label_mode=label_mode,
                           label_noise=label_noise, dtype=dtype)
    k_noise = jr.split(key, 3)[2]
    k_perp, k_z = jr.split(k_noise)
    sigma = sw["sigma_eps"]
    z = reduced_normals(k_z, N, d, dtype)
    e12 = sigma * z[: 2 * N].reshape(n, T, 2)
    L = sigma * bartlett_factor(k_perp, N, d - 2, dtype, z=z[2 * N :], k_traced=sw["dim"] - 2)
    rest = [L.reshape(n, T, -1), jnp.zeros((n, T, 1), dtype)]
    X = jnp.concatenate([base.signal + e12, *rest], axis=-1)
    return base._replace(X=X, noise=jnp.concatenate([e12, *rest], axis=-1))


def sakamoto_reduced_init(key, d: int, N: int, init: str, init_scale, dtype, dim) -> jax.Array:
    """A Gaussian (or zero) ``p_0`` in the reduced coordinates: i.i.d. ``N(0, init_scale^2)`` on
    ``(e1, e2, Q)`` (rotation invariance, ``p_0`` independent of the tokens) and the norm
    ``init_scale sqrt(chi^2_{d-2-m})`` of the rest, which no gradient ever touches."""
    m = factor_width(N, d - 2)
    if init != "gaussian":
        return jnp.zeros(m + 3, dtype)
    k_p, k_r = jr.split(key)
    inside = jr.normal(k_p, (m + 2,), dtype)
    rest = residual_norm(k_r, d - 2 - m, dtype, dim - 2 - m)
    return init_scale * jnp.concatenate([inside, rest[None]])


# --------------------------------------------------------------------------------------------
# Magen et al.
# --------------------------------------------------------------------------------------------


def _magen_check(r: dict) -> None:
    model = r["model"]
    if r["T"] < 2:
        raise ConfigError(f"T = {r['T']} must be >= 2 for {model} (one signal token and T-1 "
                          "noise tokens); fix: T = 2 (Magen et al.) or T = 5 (multi-token variant)")
    if r["d"] < 3:
        raise ConfigError(f"d = {r['d']} must be >= 3 (the signals live on e1 and e2)")


MAGEN_SETTINGS = (
    SAKAMOTO_SETTINGS[0],  # d
    SAKAMOTO_SETTINGS[1],  # T
    Setting("signal_norm", 20.0, float, "swept", "signal norm ||mu|| (Magen et al.'s rho)",
            positive),
    SAKAMOTO_SETTINGS[7],  # sigma_eps
    Setting("noise_mode", "projected", str, "static",
            "token noise: isotropic N(0, sigma^2 I_d), or projected off span(mu_1, mu_2) "
            "(Magen et al.)", choices=("isotropic", "projected")),
    Setting("signal_noise", False, bool, "static",
            "add token noise to the signal token too (default: noise-free, as Magen et al.)"),
    COMMON_NOISE,
)


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


def projected_token_scores(
    z: jax.Array, signal: jax.Array, a: jax.Array, b: jax.Array, cls: jax.Array | None,
    sigma, mode: str, noisy: np.ndarray,
) -> tuple[jax.Array, jax.Array]:
    """Exact ``(X a, X b)``, each ``(n, T)``, for fresh Magen tokens ``x = s + sigma xi``.

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


N_MAGEN_VEC = 2  # p and v: the Gaussian-init residual of the reduced single-head engine


def magen_reduced_width(n: int, T: int, d: int) -> int:
    m = factor_width(n * T, d - 2)
    return 2 + m + factor_width(N_MAGEN_VEC, d - 2 - m)


def magen_reduced_sample(key, n: int, d: int, T: int, sw: dict, *, label_mode, label_noise,
                         noise_mode, signal_noise, dtype) -> Batch:
    """A Magen training set in reduced coordinates ``(e1, e2, Q, rest)``: ``X: (n, T, D)`` with
    ``D = magen_reduced_width(n, T, d)``; rows of noise-free tokens are zero in the factor (a
    subset of the rows of a Bartlett factor is a factor of the subset)."""
    N = n * T
    base = magen_sample(key, n, None, T, sw, label_mode=label_mode, label_noise=label_noise,
                        noise_mode=noise_mode, signal_noise=signal_noise, dtype=dtype)
    k_perp, k_z = jr.split(jr.split(key, 3)[2])
    sigma = sw["sigma_eps"]
    noisy = jnp.asarray(noisy_tokens(T, signal_noise))[None, :, None]
    z = reduced_normals(k_z, N, d, dtype)
    e12 = sigma * z[: 2 * N].reshape(n, T, 2)
    if noise_mode == "projected":
        e12 = jnp.zeros_like(e12)
    m = factor_width(N, d - 2)
    L = sigma * bartlett_factor(k_perp, N, d - 2, dtype, z=z[2 * N :],
                                k_traced=sw["dim"] - 2).reshape(n, T, m)
    r = factor_width(N_MAGEN_VEC, d - 2 - m)
    X = jnp.concatenate(
        [base.signal + jnp.where(noisy, e12, 0.0), jnp.where(noisy, L, 0.0),
         jnp.zeros((n, T, r), dtype)], axis=-1)
    return base._replace(X=X)


def magen_reduced_init(key, n: int, T: int, d: int, D: int, init: str, init_scale, dtype, dim):
    """Gaussian (or zero) ``(p_0, v_0)`` in the reduced coordinates: i.i.d. on ``(e1, e2, Q)``;
    their parts in the ``d - 2 - m`` remaining dimensions are two Gaussian vectors represented by
    their own 2-row Bartlett factor (their norms and inner product are all any metric sees)."""
    if init != "gaussian":
        zero = jnp.zeros(D, dtype)
        return zero, zero
    m = factor_width(n * T, d - 2)
    r = D - 2 - m
    k_in, k_rest = jr.split(key)
    inside = jr.normal(k_in, (N_MAGEN_VEC, 2 + m), dtype)
    rest = bartlett_factor(k_rest, N_MAGEN_VEC, d - 2 - m, dtype,
                           k_traced=None if d - 2 - m < N_MAGEN_VEC else dim - 2 - m)
    pv = init_scale * jnp.concatenate([inside, rest[:, :r]], axis=-1)
    return pv[0], pv[1]


# --------------------------------------------------------------------------------------------
# Distributions: the settings they add and their checks
# --------------------------------------------------------------------------------------------


class Distribution(NamedTuple):
    """A data distribution: its name (as the papers'), the settings it adds, and its check."""

    name: str
    settings: tuple
    check: object
    doc: str


SAKAMOTO = Distribution("sakamoto", SAKAMOTO_SETTINGS, _sakamoto_check,
                        "Sakamoto & Sato: relevant / weak / weak-opposite / irrelevant tokens")
MAGEN = Distribution("magen", MAGEN_SETTINGS, _magen_check,
                     "Magen et al.: one signal token and T - 1 noise tokens")
