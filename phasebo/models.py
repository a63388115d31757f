"""The attention models, as equinox modules.

Every model maps a batch of token sequences ``X: (n, T, d)`` to outputs ``f: (n,)`` and the
attention weights ``s: (n, T)`` it used, so metrics can read token selection directly.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr


class PromptAttention(eqx.Module):
    """Prompt attention with a fixed linear head (Sakamoto & Sato, SPEC §1).

    ``f(X) = nu^T X^T S(X W p)``: the query ``q = W p`` scores each token, ``S`` is the softmax over
    the ``T`` tokens, and the fixed head ``nu`` reads the attention-weighted token.

    **Fields:** ``p: (d,)`` the trainable prompt; ``W: (d, d)`` or ``None`` for the identity;
    ``nu: (d,)`` the head, ``(e1 - e2) / (sqrt(2) ||mu||)`` for the signals of SPEC §1.
    """

    p: jax.Array
    W: jax.Array | None
    nu: jax.Array

    def query(self) -> jax.Array:
        """``q = W p`` (``d``), computed before touching X: ``X (W p)`` costs ``nTd``, not ``nTd^2``."""
        return self.p if self.W is None else self.W @ self.p

    def logits(self, X: jax.Array) -> jax.Array:
        """Attention logits ``X W p``: ``(..., T)``."""
        return X @ self.query()

    def __call__(self, X: jax.Array, head: jax.Array | None = None):
        """Returns ``(f, s, logits)``; ``head = X nu`` may be passed precomputed (nu is fixed)."""
        a = self.logits(X)
        s = jax.nn.softmax(a, axis=-1)
        h = X @ self.nu if head is None else head
        return jnp.sum(s * h, axis=-1), s, a


def sakamoto_head(d: int, signal_norm: jax.Array, dtype) -> jax.Array:
    """``nu = (mu_+ - mu_-) / ||mu_+ - mu_-|| / ||mu|| = (e1 - e2) / (sqrt(2) ||mu||)``."""
    nu = jnp.zeros(d, dtype).at[0].set(1.0).at[1].set(-1.0)
    return nu / (jnp.sqrt(jnp.asarray(2.0, dtype)) * signal_norm)


def uniform_W(key: jax.Array, d: int, dtype) -> jax.Array:
    """``W ~ U(-1/sqrt d, 1/sqrt d)``, PyTorch's ``kaiming_uniform_(a=sqrt 5)`` for a d x d layer."""
    bound = 1.0 / jnp.sqrt(jnp.asarray(d, dtype))
    return jr.uniform(key, (d, d), dtype, -bound, bound)


def init_prompt_attention(
    key: jax.Array, d: int, signal_norm: jax.Array, *, W_mode: str, init: str,
    init_scale: jax.Array, dtype,
) -> PromptAttention:
    """``p`` at zero (or ``N(0, init_scale^2)``), ``W`` identity (``None``) or uniform."""
    k_p, k_w = jr.split(key)
    p = jnp.zeros(d, dtype)
    if init == "gaussian":
        p = init_scale * jr.normal(k_p, (d,), dtype)
    W = uniform_W(k_w, d, dtype) if W_mode == "random" else None
    return PromptAttention(p=p, W=W, nu=sakamoto_head(d, signal_norm, dtype))
