"""Prompt attention with a fixed linear head (Sakamoto & Sato, ICML 2025), model ``prompt_attention``.

``f(X) = nu^T X^T S(X W p)``: the query ``q = W p`` scores each of the ``T`` tokens, ``S`` is the
softmax over them, and the fixed head ``nu = (mu_+ - mu_-) / ||mu_+ - mu_-|| / ||mu|| =
(e1 - e2) / (sqrt(2) ||mu||)`` reads the attention-weighted token. ``p`` starts at zero (or
``N(0, init_scale^2)``). The theory trains **p only** with ``W = I`` (``train = ["p"]``, the
default); the official code since January 2025 trains **W and p together**, ``W`` initialised
uniform on ``(-1/sqrt d, 1/sqrt d)`` (PyTorch's ``kaiming_uniform_(a = sqrt 5)``):
``train = ["p", "W"]``. Learning rules: plain GD, weight decay, and norm-constrained GD on ``p``.

Engines: ``direct``; ``gram`` (p trained with W fixed, and, new, W and p trained from ``p_0 = 0``:
:func:`phasebo.engines.span.span_w_system`); ``reduced`` (p trained, W = I, projected test set).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from ..data import (
    SAKAMOTO,
    embed_signal,
    factor_width,
    padded_draw,
    projected_scores,
    projection_normals,
    sakamoto_head,
    sakamoto_reduced_init,
    sakamoto_reduced_sample,
    sakamoto_roles,
    sakamoto_sample,
    signal_pattern,
    token_major,
)
from ..engines.span import SpanProblem, SpanWProblem, gamma_dot, gram_dot, signal_gram
from ..metrics import attend, query_metrics
from ..settings import INIT, PROJECT, TEST_MODE, WEIGHT_DECAY, ConfigError, Setting
from ..train import dtype_of
from .base import Model


class PromptAttention(eqx.Module):
    """``f(X) = nu^T X^T S(X W p)``; fields ``p: (d,)``, ``W: (d, d)`` or ``None`` (identity),
    ``nu: (d,)`` the fixed head."""

    p: jax.Array
    W: jax.Array | None
    nu: jax.Array

    def query(self) -> jax.Array:
        """``q = W p`` (``d``), computed before touching X: ``X (W p)`` costs ``nTd``, not ``nTd^2``."""
        return self.p if self.W is None else self.W @ self.p

    def __call__(self, X: jax.Array, head: jax.Array | None = None):
        """Returns ``(f, s, logits)``; ``head = X nu`` may be passed precomputed (nu is fixed)."""
        a = X @ self.query()
        s = jax.nn.softmax(a, axis=-1)
        h = X @ self.nu if head is None else head
        return jnp.sum(s * h, axis=-1), s, a


class PromptQuery(eqx.Module):
    """The query ``q = W p`` held directly (the W+p span engine never forms W)."""

    p: jax.Array
    q: jax.Array
    nu: jax.Array

    def query(self) -> jax.Array:
        return self.q


def uniform_W(key: jax.Array, d: int, dtype, pad: tuple | None = None) -> jax.Array:
    """``W ~ U(-1/sqrt d, 1/sqrt d)``, PyTorch's ``kaiming_uniform_(a=sqrt 5)`` for a d x d layer.
    ``pad = (dim, bound)``: the true ``d`` and its bound (:func:`w_bound`), zero-padded to ``d``
    (:func:`phasebo.data.padded_draw`: the same draws)."""
    if pad is None:
        dim, bound = None, 1.0 / jnp.sqrt(jnp.asarray(d, dtype))
    else:
        dim, bound = pad
    return padded_draw(jr.uniform, key, (d,), d, dim, dtype, minval=-bound, maxval=bound)


def w_bound(d: int, dtype_name: str):
    """``1/sqrt d`` correctly rounded in the run's precision, computed on the host: from a traced
    ``d`` XLA would rewrite ``1 / sqrt`` into an approximate ``rsqrt`` (measured: 1-4 ulp off
    in float32, so a padded run's ``W_0`` would not be the unpadded run's)."""
    dt = np.float64 if dtype_name == "float64" else np.float32
    return dt(1) / np.sqrt(dt(d))


def head_scores(batch, nu: jax.Array) -> jax.Array:
    """``X nu: (n, T)`` without forming ``X = noise + signal on (e1, e2)`` (inside a noise group
    the signal, hence ``X``, is each run's own; the noise is shared)."""
    return batch.noise @ nu + batch.signal @ nu[:2]


def init_prompt_attention(key, d: int, signal_norm, *, W_mode: str, init: str, init_scale,
                          dtype, pad: tuple | None = None) -> PromptAttention:
    """``p`` at zero (or ``N(0, init_scale^2)``), ``W`` identity (``None``) or uniform; ``pad``:
    ``(dim, bound)`` of a true ``d`` zero-padded to ``d`` (:func:`uniform_W`; the same draws)."""
    k_p, k_w = jr.split(key)
    p = jnp.zeros(d, dtype)
    if init == "gaussian":
        p = init_scale * padded_draw(jr.normal, k_p, (), d, pad and pad[0], dtype)
    W = uniform_W(k_w, d, dtype, pad) if W_mode == "random" else None
    return PromptAttention(p=p, W=W, nu=sakamoto_head(d, signal_norm, dtype))


def W_mode(static) -> str:
    if static.W_init != "auto":
        return static.W_init
    return "random" if "W" in static.train else "identity"


class PromptAttentionModel(Model):
    name = "prompt_attention"
    doc = "f = nu^T X^T S(X W p) with a fixed head (Sakamoto & Sato); train p, or p and W"
    data = SAKAMOTO
    engines = ("direct", "gram", "reduced")
    own_settings = (
        Setting("train", ("p",), tuple, "static",
                "trained parameters: [\"p\"] (the theory) or [\"p\", \"W\"] (the official code)"),
        Setting("W_init", "auto", str, "static",
                "W when fixed or at step 0: identity, random (uniform on (-1/sqrt d, 1/sqrt d)) or "
                "auto (identity when only p is trained, random when W is trained)",
                choices=("auto", "identity", "random")),
        *INIT, *TEST_MODE, *WEIGHT_DECAY, *PROJECT,
    )
    radii = ("radius_p",)
    span_pads_d = True

    def check(self, r):
        super().check(r)
        if tuple(sorted(r["train"])) not in (("p",), ("W", "p")):
            raise ConfigError(f"train = {list(r['train'])!r} is not supported by prompt_attention; "
                              "fix: train = [\"p\"] (theory) or [\"p\", \"W\"] (the official code)")
        if r["project"] and "W" in r["train"]:
            raise ConfigError("project = true constrains p; with W trained too it would leave W "
                              "unconstrained; fix: train = [\"p\"] or project = false")

    def derived(self, static, sw):
        out = super().derived(static, sw)
        out["w_bound"] = np.full(len(out["dim"]), w_bound(static.d, static.dtype))
        return out

    def roles(self, static):
        return sakamoto_roles(static)

    def sample(self, static, sw, key, *, test, dim=None):
        """``dim``: the true ``d`` of tokens zero-padded to ``static.d`` (the gram engine's
        program serves a range of ``d``: :meth:`phasebo.engines.base.Gram.program`)."""
        dtype = dtype_of(static)
        roles = self.roles(static)
        if not test:
            return sakamoto_sample(key, static.n, static.d, roles, sw, label_mode=static.label_mode,
                                   label_noise=static.label_noise, dtype=dtype, dim=dim)
        sampled = static.test_mode == "sampled"
        b = sakamoto_sample(key, static.n_test, static.d if sampled else None, roles, sw,
                            label_mode=static.label_mode, label_noise=None, dtype=dtype, dim=dim)
        if sampled:
            return b
        # token-major (see token_major): the test pass of every record reads it
        return b._replace(z=token_major(projection_normals(key, (static.n_test, static.T), dtype)),
                          signal=token_major(b.signal))

    def init(self, static, sw, key, batch):
        dtype = dtype_of(static)
        m = init_prompt_attention(key, static.d, sw["signal_norm"], W_mode=W_mode(static),
                                  init=static.init, init_scale=sw["init_scale"], dtype=dtype)
        if "W" in static.train and m.W is None:  # W = I at step 0, then trained
            m = eqx.tree_at(lambda m: m.W, m, jnp.eye(static.d, dtype=dtype),
                            is_leaf=lambda x: x is None)
        spec = jax.tree.map(lambda _: False, m)
        spec = eqx.tree_at(lambda m: m.p, spec, True)
        if "W" in static.train:
            spec = eqx.tree_at(lambda m: m.W, spec, True)
        return eqx.partition(m, spec)

    def precompute(self, m, batch, static):
        return batch.X @ m.nu  # nu is fixed: X nu once, not every step

    def forward(self, m, batch, aux):
        return m(batch.X, aux)

    def test_output(self, m, test, static, sw):
        q = m.query()
        if static.test_mode == "sampled":
            lg, hd = test.X @ q, test.X @ m.nu
        else:
            lg, hd = projected_scores(test.z, test.signal, q, m.nu, sw["sigma_eps"], axis=0)
            return attend(lg, hd, axis=0)
        return attend(lg, hd)

    def param_metrics(self, m, static, sw):
        return query_metrics(m.query(), m.p)

    def norm_groups(self, m):
        return (m.p,)

    def bytes_per_run(self, static):
        d, n, T = static.d, static.n, static.T
        b = 3 * n * T * d  # X, its noise draw, gradient intermediates
        if "W" in static.train or W_mode(static) == "random":
            b += 4 * d * d  # W, its gradient, the update, the uniform draw
        b += 4 * d
        b += 2 * static.n_test * T * d if static.test_mode == "sampled" else 4 * static.n_test * T
        b += self.n_records(static) * (40 + 4 * T)
        return int(b * self.item(static))

    def cost_per_run(self, static):
        d, n, T, steps = static.d, static.n, static.T, max(self.loop_steps(static), 1)
        c = 6.0 * n * T * d * steps
        if "W" in static.train:
            c += 6.0 * d * d * steps
        return c

    # ---------------------------------------------------------------------------------------
    # Span forms
    # ---------------------------------------------------------------------------------------

    def span_supports(self, static, reduced):
        w_trained = "W" in static.train
        if w_trained and static.init != "zero":
            return ("W and p trained from a Gaussian p_0 leave the span form of the exact W+p "
                    "engine (which needs p_0 = 0); use engine = \"direct\"")
        if not reduced:
            return None
        if w_trained:
            return ("W is trained, so the query W p leaves the span of the tokens; the exact "
                    "W+p engine is engine = \"gram\" (same data as direct)")
        if W_mode(static) != "identity":
            return ("a fixed random W mixes the noise directions (the Gram of X W is not "
                    "Wishart); use engine = \"gram\" for W_init = \"random\"")
        if static.test_mode != "projected":
            return ("test_mode = \"sampled\" asks for d-dimensional test tokens; use test_mode = "
                    "\"projected\" (exact in distribution) or engine = \"gram\"")
        return None

    def span_problem(self, static, sw, key, reduced):
        dtype = dtype_of(static)
        d, n, T = static.d, static.n, static.T
        roles = self.roles(static)
        k_data, k_test, k_init = self.keys(key)
        # gram: zero-padded to the program's d, the true d and W_0's bound traced
        pad = None if reduced else (sw["dim"], sw["w_bound"])
        dim = pad and pad[0]
        test = self.sample(static, sw, k_test, test=True, dim=dim)
        if "W" in static.train:
            return self._span_w_problem(static, sw, k_data, k_init, test, pad)
        if reduced:
            batch = sakamoto_reduced_sample(k_data, n, d, roles, sw, label_mode=static.label_mode,
                                            label_noise=static.label_noise, dtype=dtype)
            D = batch.X.shape[-1]
            p0 = sakamoto_reduced_init(k_init, d, n * T, static.init, sw["init_scale"], dtype,
                                       sw["dim"])
            nu, W = sakamoto_head(D, sw["signal_norm"], dtype), None
        else:
            batch = self.sample(static, sw, k_data, test=False, dim=dim)
            m0 = init_prompt_attention(k_init, d, sw["signal_norm"], W_mode=W_mode(static),
                                       init=static.init, init_scale=sw["init_scale"], dtype=dtype,
                                       pad=pad)
            p0, nu, W = m0.p, m0.nu, m0.W
        N = n * T
        S12, S0 = batch.signal.reshape(N, 2), signal_pattern(batch, roles, sw)
        W12 = None if W is None else W[:2]
        # the tokens as the prompt sees them, B = X W = E W + S W_12 (a = B p), and their Gram
        # with the noise part apart: runs sharing their noise share E W and (E W)(E W)^T. B is
        # never formed: inside a noise group each run's B (its signal is its own) would be an
        # N x D array per run, where the products below touch the shared E W once per group
        # (measured: the setup and final metrics of a grouped run 0.4 -> 0.06 ms).
        E = batch.noise.reshape(N, -1)
        EW = E if W is None else E @ W
        D = EW.shape[-1]

        def signal_in(v2):  # coordinates on the signal's (e1, e2) as a D-vector of B's rows
            return embed_signal(v2, D) if W is None else v2 @ W12

        def params(coef):
            alpha = coef.alpha.reshape(-1)
            p = coef.gp * p0 + EW.T @ alpha + signal_in(S12.T @ alpha)
            return PromptAttention(p=p, W=W, nu=nu)

        p0_12 = p0[:2] if W is None else W12 @ p0
        a0 = (EW @ p0 + S12 @ p0_12).reshape(n, T)
        h0 = head_scores(batch, nu)
        zero = jnp.zeros((), dtype)
        return SpanProblem(batch, test, signal_gram(EW, S0, sw["signal_norm"], W12), a0,
                           h0, None, jnp.sum(p0**2), zero, params)

    def _span_w_problem(self, static, sw, k_data, k_init, test, pad):
        dtype = dtype_of(static)
        d, n, T = static.d, static.n, static.T
        N = n * T
        batch = self.sample(static, sw, k_data, test=False, dim=pad[0])
        m0 = init_prompt_attention(k_init, d, sw["signal_norm"], W_mode=W_mode(static),
                                   init="zero", init_scale=sw["init_scale"], dtype=dtype, pad=pad)
        Ef = batch.noise.reshape(N, d)
        S12, S0 = batch.signal.reshape(N, 2), signal_pattern(batch, self.roles(static), sw)
        W0 = m0.W
        # X = E + S_12 on (e1, e2) and X W_0 = E W_0 + S_12 W_12 are never formed: their
        # signal part is each run's own, so inside a noise group they would be an N x d array
        # per run; the products below touch the shared E and E W_0 once per group
        if W0 is None:  # W_0 = I
            EW, W12 = Ef, None
        else:  # E W_0: the O(N d^2) product once per noise group
            EW, W12 = Ef @ W0, W0[:2]
        nu = m0.nu

        def XT(v):  # X^T v
            return Ef.T @ v + embed_signal(S12.T @ v, d)

        def params(state):
            alpha, g = state[0], state[2]
            p = XT(alpha) if W0 is None else EW.T @ alpha + (S12.T @ alpha) @ W12  # (X W_0)^T alpha
            Wp = p if W0 is None else W0 @ p  # W_0 W_0^T X^T alpha, never formed as d x N
            q = g * Wp + XT(gamma_dot(state, gram_dot(alpha, G)))
            return PromptQuery(p=p, q=q, nu=nu)

        K = signal_gram(Ef, S0, sw["signal_norm"])
        G = K if W0 is None else signal_gram(EW, S0, sw["signal_norm"], W12)
        return SpanWProblem(batch, test, K, G, head_scores(batch, nu), params)

    def span_bytes(self, static, reduced):
        N = static.n * static.T
        D = (2 + factor_width(N, static.d - 2) + 1) if reduced else static.d
        b = 3 * N * N + 3 * N * D + 4 * static.n_test * static.T
        b += self.n_records(static) * (40 + 4 * static.T)
        if not reduced:
            b += 2 * N * static.d + 4 * static.d
            if "W" in static.train:
                b += 2 * static.d * static.d + 3 * N * static.d + 3 * N * N
            elif W_mode(static) == "random":
                b += 2 * static.d * static.d
            if static.test_mode == "sampled":
                b += 2 * static.n_test * static.T * static.d
        return int(b * self.item(static))

    def span_cost(self, static, reduced):
        N, d = static.n * static.T, static.d
        steps = max(self.loop_steps(static), 1)
        c = steps * (2.0 * N * N + 40.0 * N) + self.n_records(static) * 20.0 * static.n_test
        if reduced:
            return c + 2.0 * N**3
        c += 2.0 * N * N * d + 4.0 * N * d * (self.n_records(static) + 1)
        if "W" in static.train:
            c += steps * 10.0 * N * N + 2.0 * N * N * d
            if W_mode(static) == "random":
                c += 4.0 * N * d * d
        elif W_mode(static) == "random":
            c += 2.0 * N * d * d
        return c

