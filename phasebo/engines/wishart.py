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


def bartlett_factor(key: jax.Array, N: int, k: int, dtype=jnp.float32) -> jax.Array:
    """``L: (N, min(N, k))`` with ``L L^T ~ Wishart(k, I_N)`` (see the module docstring)."""
    if k < N:
        return jr.normal(key, (N, k), dtype)
    k_chi, k_norm = jr.split(key)
    df = (k - jnp.arange(N)).astype(dtype)
    diag = jnp.sqrt(jr.chisquare(k_chi, df, (N,), dtype))
    below = jnp.tril(jr.normal(k_norm, (N, N), dtype), -1)
    return below + jnp.diag(diag)


def wishart(key: jax.Array, N: int, k: int, dtype=jnp.float32) -> jax.Array:
    """A draw of ``Wishart(k, I_N)``: ``(N, N)``, mean ``k I``, ``Var G_ii = 2k``, ``Var G_ij = k``."""
    L = bartlett_factor(key, N, k, dtype)
    return L @ L.T


def residual_norm(key: jax.Array, k: int, dtype=jnp.float32) -> jax.Array:
    """``sqrt(chi^2_k)``: the norm of a standard Gaussian vector in ``k`` dimensions (0 if k = 0)."""
    if k <= 0:
        return jnp.zeros((), dtype)
    return jnp.sqrt(jr.chisquare(key, jnp.asarray(k, dtype), (), dtype))
