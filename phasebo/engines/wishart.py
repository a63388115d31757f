"""Sampling the Gram matrix of Gaussian vectors without forming them (Bartlett decomposition).

Let ``Z: (N, k)`` have i.i.d. N(0, 1) entries (N token noise vectors in a ``k``-dimensional
space). Its LQ decomposition ``Z = L Q^T`` has ``Q: (k, m)`` with orthonormal columns,
``m = min(N, k)``, and ``L: (N, m)`` lower triangular; ``Q`` is Haar-distributed and independent of
``L``, and (Bartlett) for ``k >= N`` the entries of ``L`` are independent with

    ``L_ii = sqrt(chi^2_{k - i})`` (``i = 0..N-1``),   ``L_ij ~ N(0, 1)`` for ``i > j``,

so ``G = Z Z^T = L L^T ~ Wishart(k, I_N)``. ``L`` is more than the Gram: its rows *are* the
vectors, written in the orthonormal basis ``Q`` of their span. For ``k < N`` the Gaussian matrix
itself (``m = k`` columns) is the cheapest exact factor. Cost ``O(N^2)`` samples, whatever ``k``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.random as jr


def factor_width(N: int, k: int) -> int:
    """Columns of the factor: ``min(N, k)``."""
    return min(N, k)


def bartlett_from(chi2: jax.Array, z_below: jax.Array) -> jax.Array:
    """``L: (N, N)`` from ``chi2: (N,)`` (``L_ii^2``) and ``N (N - 1) / 2`` standard normals."""
    N = chi2.shape[0]
    i = jnp.arange(N, dtype=jnp.int32)[:, None]
    j = jnp.arange(N, dtype=jnp.int32)[None, :]
    idx = jnp.where(i > j, i * (i - 1) // 2 + j + 1, 0)  # row-major order of the strict lower part
    below = jnp.concatenate([jnp.zeros((1,), z_below.dtype), z_below])[idx]
    return below + jnp.diag(jnp.sqrt(chi2))


def bartlett_chi2(key: jax.Array, N: int, k: int, dtype=jnp.float32) -> jax.Array:
    """The squared diagonal of the Bartlett factor: ``chi^2_{k - i}``, ``i = 0..N-1`` (k >= N)."""
    return jr.chisquare(key, (jnp.asarray(k).astype(dtype) - jnp.arange(N, dtype=dtype)), (N,), dtype)


def n_normals(N: int, k: int) -> int:
    """Standard normals one factor consumes: ``N (N - 1) / 2`` (k >= N) or ``N k``."""
    return N * (N - 1) // 2 if k >= N else N * k


def bartlett_factor(
    key: jax.Array, N: int, k: int, dtype=jnp.float32, z=None, k_traced=None
) -> jax.Array:
    """``L: (N, min(N, k))`` with ``L L^T ~ Wishart(k, I_N)`` (see the module docstring).

    ``z`` (optional): the :func:`n_normals` standard normals to use, so a caller can draw all of
    its normals in one call (each random call is a sizeable piece of compiled code).
    ``k_traced`` (optional): ``k`` as an array, so the compiled program does not depend on ``k``
    beyond ``k >= N``.
    """
    k_chi, k_norm = jr.split(key)
    if z is None:
        z = jr.normal(k_norm, (n_normals(N, k),), dtype)
    if k < N:
        return z.reshape(N, k)
    return bartlett_from(bartlett_chi2(k_chi, N, k if k_traced is None else k_traced, dtype), z)


def wishart(key: jax.Array, N: int, k: int, dtype=jnp.float32) -> jax.Array:
    """A draw of ``Wishart(k, I_N)``: ``(N, N)``, mean ``k I``, ``Var G_ii = 2k``, ``Var G_ij = k``."""
    L = bartlett_factor(key, N, k, dtype)
    return L @ L.T


def residual_norm(key: jax.Array, k: int, dtype=jnp.float32, k_traced=None) -> jax.Array:
    """``sqrt(chi^2_k)``: the norm of a standard Gaussian vector in ``k`` dimensions (0 if k = 0)."""
    if k <= 0:
        return jnp.zeros((), dtype)
    df = jnp.asarray(k if k_traced is None else k_traced).astype(dtype)
    return jnp.sqrt(jr.chisquare(key, df, (), dtype))
