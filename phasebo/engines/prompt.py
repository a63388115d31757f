"""Gram and reduced engines for prompt attention ``f(X) = nu^T X^T S(X W p)`` with ``p`` trained.

**gram** -- the same run as the direct engine, in other coordinates. It draws exactly what
:func:`phasebo.train.run_prompt_attention` draws (same keys, same ``sakamoto_sample`` and
``init_prompt_attention`` calls), sets ``B = X W`` (``X`` when ``W = I``), and runs gradient descent
on ``alpha`` with ``p_t = p_0 + B^T alpha_t`` (:mod:`phasebo.engines.span`): the logits are
``a_t = a_0 + K alpha_t`` with ``K = B B^T`` (``nT x nT``, built once for ``O((nT)^2 d)``), the head
scores ``h = X nu`` are fixed. At the recorded steps and at the end ``p`` (and ``q = W p``) are
rebuilt in ``d`` dimensions and every metric is computed by the direct engine's own functions,
so the trajectory equals the direct one up to rounding (tested in float64).

**reduced** -- the same distribution of runs, at a cost independent of ``d`` (``W = I``).
Write every token as ``x = s + eps`` with the signal ``s`` in span(e1, e2) and
``eps ~ N(0, sigma^2 I_d)``. Split ``eps`` into its coordinates on e1, e2 (``N(0, sigma^2)``, drawn
explicitly) and its complement ``eps_perp`` in the other ``d - 2`` dimensions. The ``N = nT``
complements are Gaussian in ``R^{d-2}``; by the Bartlett decomposition
(:mod:`phasebo.engines.wishart`) they are, in a Haar-random orthonormal basis ``Q`` of their span,
the rows of ``sigma L`` with ``L L^T ~ Wishart(d - 2, I_N)``. So a training set is exactly
(in distribution) the ``N`` vectors

    ``x_j = (s_j + eps_j[e1, e2],  sigma L_j,  0)``  in ``R^{2 + m + 1}``, ``m = min(N, d - 2)``,

and the Gram of the complements is ``G_perp = sigma^2 L L^T``. The last coordinate carries the part
of a Gaussian initial ``p_0`` orthogonal to every token and to e1, e2: in the basis
``(e1, e2, Q, rest)`` ``p_0``'s coordinates are i.i.d. ``N(0, init_scale^2)`` (rotation invariance,
``p_0`` independent of the tokens) and the rest has norm ``init_scale sqrt(chi^2_{d-2-m})``; no
gradient ever touches it. The run then proceeds as the gram engine in ``R^{m+3}``. The head
``nu = (e1 - e2)/(sqrt 2 ||mu||)`` lives on the first two coordinates, so ``h = X nu`` is exact.
The test set only needs each fresh token's projections on ``nu`` and ``q``
(:func:`phasebo.data.projected_scores`): a fresh noise vector projects on ``q`` with variance
``sigma^2 ||q||^2``, and ``||q||^2 = ||q_12||^2 + ||q_perp||^2`` with
``||q_perp||^2 = alpha^T G_perp alpha`` (+ the residual of ``p_0``), which is the squared norm of the
reduced vector's complement coordinates. ``n_test = 10^5`` costs ``O(n_test T)``.

**Cost.** No array has a dimension of size ``d`` (tested on the lowered program). ``d`` enters
only as the chi-square degrees of freedom, read from the traced ``sw["dim"]`` when the sweep
provides it, so for ``d >= nT + 3`` the compiled program is the same for every ``d`` and a
compilation cache (``JAX_COMPILATION_CACHE_DIR``) compiles a whole ``d`` axis once.

Labels and label flips are drawn with the same keys as the direct engine, so a reduced run has
the direct run's labels; only the noise differs (same distribution, not the same draw).

Metrics, all exact functions of the reduced state: ``p_norm = ||p||``, ``p_align_e1 = p[e1]/||p||``
(e1, e2 are coordinates 0 and 1), ``q_norm``, the logits, softmax masses, role masses, margins,
``s_R (1 - s_R)`` sums and first-fit steps of the training set (functions of ``a`` and ``h``), and the
test metrics from the projections above.

**Precision.** Entries of ``K`` reach ``sigma^2 d`` (``10^6`` at ``d = 10^6``) while the logits
that decide the run are differences of ``O(1 - 100)``; see ``docs/engines.md`` for the float32 vs
float64 comparison (``phasebo.bench --precision``). The engine computes in the run's ``dtype``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .. import config as C
from ..config import Static
from ..data import projected_scores, sakamoto_sample
from ..models import init_prompt_attention, sakamoto_head
from ..train import (
    EngineSpec,
    RunOutput,
    _sakamoto_roles,
    _W_mode,
    dtype_of,
    finish,
    query_metrics,
    register_engine,
    test_metrics,
    tracked_samples,
    tracked_token_metrics,
    train_metrics,
)
from .span import flat_gram, span_gd
from .wishart import bartlett_factor, factor_width, n_normals, residual_norm

MODEL = "prompt_attention"


# --------------------------------------------------------------------------------------------
# Drawing the training set
# --------------------------------------------------------------------------------------------


def reduced_width(n: int, T: int, d: int) -> int:
    """Dimension of the reduced token space: e1, e2, the complement factor, the p_0 residual."""
    return 2 + factor_width(n * T, d - 2) + 1


def reduced_sample(key, n: int, d: int, roles, sw: dict, *, label_mode, label_noise, dtype):
    """A training set in the reduced coordinates ``(e1, e2, Q, rest)``: ``X: (n, T, m + 3)``.

    Labels, flips and signals come from :func:`phasebo.data.sakamoto_sample` with the same key
    (``d = None`` draws no noise); the noise is drawn here.
    """
    T = len(roles)
    N = n * T
    base = sakamoto_sample(key, n, None, roles, sw, label_mode=label_mode,
                           label_noise=label_noise, dtype=dtype)
    k_noise = jr.split(key, 3)[2]
    k_perp, k_z = jr.split(k_noise)
    sigma = sw["sigma_eps"]
    z = jr.normal(k_z, (2 * N + n_normals(N, d - 2),), dtype)  # one draw: e1, e2 and the factor
    e12 = sigma * z[: 2 * N].reshape(n, T, 2)
    dim = sw.get("dim", d)  # traced when the sweep passes it: one program for every d
    L = sigma * bartlett_factor(k_perp, N, d - 2, dtype, z=z[2 * N :], k_traced=dim - 2)  # (N, m)
    X = jnp.concatenate(
        [base.signal + e12, L.reshape(n, T, -1), jnp.zeros((n, T, 1), dtype)], axis=-1
    )
    return base._replace(X=X)


def reduced_init(key, d: int, N: int, init: str, init_scale, dtype, dim=None) -> jax.Array:
    """``p_0`` in the reduced coordinates (see the module docstring)."""
    m = factor_width(N, d - 2)
    if init != "gaussian":
        return jnp.zeros(m + 3, dtype)
    k_p, k_r = jr.split(key)
    inside = jr.normal(k_p, (m + 2,), dtype)
    rest = residual_norm(k_r, d - 2 - m, dtype, None if dim is None else dim - 2 - m)
    return init_scale * jnp.concatenate([inside, rest[None]])


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def _run(static: Static, sw: dict, key: jax.Array, reduced: bool) -> RunOutput:
    dtype = dtype_of(static)
    d, n, T = static.d, static.n, static.T
    roles = _sakamoto_roles(static)
    k_data, k_test, k_init = jr.split(key, 3)
    if reduced:
        batch = reduced_sample(k_data, n, d, roles, sw, label_mode=static.label_mode,
                               label_noise=static.label_noise, dtype=dtype)
        D = batch.X.shape[-1]
        p0 = reduced_init(k_init, d, n * T, static.init, sw["init_scale"], dtype, sw.get("dim"))
        nu = sakamoto_head(D, sw["signal_norm"], dtype)
        W = None
    else:
        batch = sakamoto_sample(k_data, n, d, roles, sw, label_mode=static.label_mode,
                                label_noise=static.label_noise, dtype=dtype)
        model = init_prompt_attention(
            k_init, d, sw["signal_norm"], W_mode=_W_mode(static), init=static.init,
            init_scale=sw["init_scale"], dtype=dtype,
        )
        p0, nu, W = model.p, model.nu, model.W
    test = sakamoto_sample(
        k_test, static.n_test, d if static.test_mode == "sampled" else None, roles, sw,
        label_mode=static.label_mode, label_noise=None, dtype=dtype,
    )
    k_testz = jr.fold_in(k_test, 1)

    X = batch.X
    B = X if W is None else X @ W  # tokens as the prompt sees them: a = B p
    head = X @ nu
    a0 = B @ p0
    K = flat_gram(B)
    Bf = B.reshape(n * T, -1)

    def params(alpha):
        p = p0 + Bf.T @ alpha.reshape(-1)
        return p, (p if W is None else W @ p)

    def evaluate_test(q):
        if static.test_mode == "sampled":
            return test_metrics(test.X @ q, test.X @ nu, test.y_clean)
        lg, hd = projected_scores(k_testz, test.signal, q, nu, sw["sigma_eps"])
        return test_metrics(lg, hd, test.y_clean)

    i_clean, i_noisy = tracked_samples(batch)

    def metrics(coef, f, s, a):
        p, q = params(coef[0])
        out = train_metrics(f, s, a, batch, roles)
        out.update(evaluate_test(q))
        out.update(query_metrics(q, p))
        return out

    def record_fn(coef, f, s, a):
        out = metrics(coef, f, s, a)
        out.update(tracked_token_metrics(s, a, i_clean, i_noisy))
        return out

    record_at = C.record_steps(static.steps, static.record_every, static.record_log)
    coef, (f, s, a), first_fit, all_fit, cumS, div, buf = span_gd(
        K, a0, head, sw["lr"], static.steps, record_at, record_fn, batch, np.asarray(roles) == 0,
    )
    final = finish(metrics(coef, f, s, a), first_fit, all_fit, cumS, div, batch)
    samples = {
        "flipped": batch.flipped, "y_clean": batch.y_clean.astype(jnp.int32),
        "first_fit_step": first_fit, "final_margin": batch.y * f,
    }
    return RunOutput(final, buf, samples)


def run_gram(static: Static, sw: dict, key: jax.Array) -> RunOutput:
    """Prompt attention by the gram engine (same data as the direct engine)."""
    return _run(static, sw, key, reduced=False)


def run_reduced(static: Static, sw: dict, key: jax.Array) -> RunOutput:
    """Prompt attention by the reduced engine (same distribution, cost independent of d)."""
    return _run(static, sw, key, reduced=True)


# --------------------------------------------------------------------------------------------
# What each engine can serve, and planning hints
# --------------------------------------------------------------------------------------------


def _w_mode(r: dict) -> str:
    if r.get("W_init", "auto") != "auto":
        return r["W_init"]
    return "random" if "W" in r.get("train", ("p",)) else "identity"


def supports_gram(r: dict) -> str | None:
    if "W" in r.get("train", ("p",)):
        return ("W is trained, so the query W p leaves the span of the tokens; only the direct "
                "engine runs train = [\"p\", \"W\"]")
    return None


def supports_reduced(r: dict) -> str | None:
    why = supports_gram(r)
    if why:
        return why
    if _w_mode(r) != "identity":
        return ("a fixed random W mixes the noise directions (the Gram of X W is not Wishart); "
                "use engine = \"gram\" for W_init = \"random\"")
    if r.get("test_mode", "projected") != "projected":
        return ("test_mode = \"sampled\" asks for d-dimensional test tokens; use test_mode = "
                "\"projected\" (exact in distribution) or engine = \"gram\"")
    if r.get("noise_mode", "auto") not in ("auto", "isotropic"):
        return f"noise_mode = {r['noise_mode']!r} is not isotropic Gaussian noise"
    return None


def _item(static: Static) -> int:
    return 8 if static.dtype == "float64" else 4


def _n_rec(static: Static) -> int:
    return len(C.record_steps(static.steps, static.record_every, static.record_log))


def _bytes_common(static: Static, D: int) -> int:
    N = static.n * static.T
    b = 3 * N * N + 3 * N * D + 4 * static.n_test * static.T + _n_rec(static) * (40 + 4 * static.T)
    return b


def bytes_gram(static: Static) -> int:
    d = static.d
    b = _bytes_common(static, d) + 2 * static.n * static.T * d + 4 * d
    if _W_mode(static) == "random":
        b += 2 * d * d
    if static.test_mode == "sampled":
        b += 2 * static.n_test * static.T * d
    return int(b * _item(static))


def bytes_reduced(static: Static) -> int:
    return int(_bytes_common(static, reduced_width(static.n, static.T, static.d)) * _item(static))


def _loop_cost(static: Static) -> float:
    N = static.n * static.T
    return max(static.steps, 1) * (2.0 * N * N + 40.0 * N) + _n_rec(static) * 20.0 * static.n_test


def cost_gram(static: Static) -> float:
    N, d = static.n * static.T, static.d
    c = _loop_cost(static) + 2.0 * N * N * d + 4.0 * N * d * (_n_rec(static) + 1)
    if _W_mode(static) == "random":
        c += 2.0 * N * d * d
    return c


def cost_reduced(static: Static) -> float:
    N = static.n * static.T
    return _loop_cost(static) + 2.0 * N**3


def block_reduced(static: Static, platform: str) -> int:
    if platform != "cpu":
        return 1024
    # measured (python -m phasebo.bench, blocks section, d = 2000, 2 cores): 4 was best in two
    # runs (1082 / 536 runs/s vs 1063 / 504 at 8, 880 / 409 at 1, 768 / 333 at 32)
    return 4


def block_gram(static: Static, platform: str) -> int:
    if platform != "cpu":
        return 256
    return 4


register_engine(EngineSpec(
    "gram", MODEL, run_gram, supports_gram, priority=10, bytes_per_run=bytes_gram,
    cost_per_run=cost_gram, block_size=block_gram,
))
register_engine(EngineSpec(
    "reduced", MODEL, run_reduced, supports_reduced, priority=20, bytes_per_run=bytes_reduced,
    cost_per_run=cost_reduced, block_size=block_reduced,
))
