"""Theory next to the simulations: SNRs, phase boundaries, gap growth, closed forms, 𝔖 ratios.

Every function states its source ([S] or [M] below); **reconstruction** marks a formula that
neither paper states in this form and that phasebo derived or chose (the docstring says how).
NumPy only: this module reads tables and arrays and never imports :mod:`phasebo.plot` (plot
imports theory).

Papers:

- [S] Sakamoto & Sato, *Benign Overfitting in Token Selection of Attention Mechanism*, ICML 2025,
  arXiv 2409.17625 — prompt attention ``f(X) = ν^T X^T S(X W p)``.
- [M] Magen, Shang, Xu, Frei, Hu, Vardi, *Benign Overfitting in Single-Head Attention*,
  NeurIPS 2025, arXiv 2410.07746 — single head ``f(X) = v^T X^T S(X p)``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# The three reference settings of [S]'s Figs. 3-5 (n = 20): (d, ||mu||) and their n SNR^2.
S2_POINTS = {
    "harmful": {"d": 5000, "signal_norm": 5.0, "n": 20, "n_snr2": 0.1},
    "benign": {"d": 2000, "signal_norm": 20.0, "n": 20, "n_snr2": 4.0},
    "not_overfitting": {"d": 1000, "signal_norm": 100.0, "n": 20, "n_snr2": 200.0},
}


# --------------------------------------------------------------------------------------------
# Signal-to-noise ratios and boundaries
# --------------------------------------------------------------------------------------------


def snr_sakamoto(signal_norm, d, sigma_eps=1.0):
    """``SNR = ‖μ‖ / (σ_ε √d)`` for the Sakamoto data (every token has noise ``N(0, σ_ε² I_d)``).

    Source: [S]'s data model (a natural form for it); [S]'s theorems are phrased through
    ``‖μ‖``, ``σ_ε``, ``d`` and ``n`` separately, so this single-number form is a
    **reconstruction** chosen so that ``n·SNR²`` orders the settings of [S]'s Figs. 3-5 (0.1, 4, 200).
    """
    return np.asarray(signal_norm, float) / (np.asarray(sigma_eps, float) *
                                             np.sqrt(np.asarray(d, float)))


def snr_magen(rho, d):
    """``SNR = ρ / √d`` with ``ρ = ‖μ₁‖ = ‖μ₂‖`` the signal norm ([M]; noise ``σ = 1``)."""
    return np.asarray(rho, float) / np.sqrt(np.asarray(d, float))


def n_snr2(signal_norm, d, n, sigma_eps=1.0):
    """``n·SNR²`` — the combination that orders the regimes of [S] (**reconstruction**; see
    :func:`snr_sakamoto`)."""
    return np.asarray(n, float) * snr_sakamoto(signal_norm, d, sigma_eps) ** 2


def iso_snr_signal_norm(d, kappa, n, sigma_eps=1.0):
    """The iso-SNR curve ``n·SNR² = κ`` as ``‖μ‖(d) = σ_ε √(κ d / n)`` (from :func:`n_snr2`)."""
    return np.asarray(sigma_eps, float) * np.sqrt(np.asarray(kappa, float) *
                                                  np.asarray(d, float) / np.asarray(n, float))


def iso_snr_d(signal_norm, kappa, n, sigma_eps=1.0):
    """The same curve solved for ``d``: ``d(‖μ‖) = n ‖μ‖² / (κ σ_ε²)`` (for a (‖μ‖ on x, d on y)
    map)."""
    mu = np.asarray(signal_norm, float)
    return np.asarray(n, float) * mu**2 / (np.asarray(kappa, float) *
                                           np.asarray(sigma_eps, float) ** 2)


def magen_boundary_snr(n, c=1.0):
    """The benign/harmful boundary ``SNR = c/√n`` of [M] (max-margin / min-norm solutions are
    benign iff ``SNR ≳ 1/√n``). The constant ``c`` is not given by the paper (its
    results are up to constants): ``c = 1`` is a **reconstruction**/choice, fit it to a map."""
    return float(c) / np.sqrt(np.asarray(n, float))


def magen_boundary_rho(n, d, c=1.0):
    """The same boundary as a signal norm: ``n ρ² / d = c²`` ⇔ ``ρ = c √(d / n)`` ([M])."""
    return float(c) * np.sqrt(np.asarray(d, float) / np.asarray(n, float))


def magen_step1_test_acc(snr, n, rho, eta):
    """Test accuracy after GD step 1 from zero of single-head attention ([M], two tokens):
    ``Φ((1 − 2η) ρ SNR √n / 2)``.

    Step 1 leaves p = 0 (uniform attention) and sets ``v₁ ∝ Σᵢ yᵢ (xᵢ⁽¹⁾ + xᵢ⁽²⁾)``; on a clean
    test sample the signal part of ``f`` has mean ``ρ² n (1 − 2η) / 2`` and the noise part standard
    deviation ``√(n d)`` (noise tokens nearly orthogonal to the signals and to each other), so the
    margin is positive with probability ``Φ((1 − 2η) ρ² √n / (2 √d))`` and ``SNR = ρ / √d``."""
    from statistics import NormalDist

    z = (1 - 2 * np.asarray(eta, float)) * np.asarray(rho, float) * np.asarray(snr, float) \
        * np.sqrt(np.asarray(n, float)) / 2
    return np.vectorize(NormalDist().cdf)(z)


def magen_step1_snr(n, rho, eta, acc=0.95):
    """The SNR at which :func:`magen_step1_test_acc` equals ``acc``:
    ``SNR* = 2 Φ⁻¹(acc) / ((1 − 2η) ρ √n)`` — exponent −½ in n, constant ∝ 1/ρ (0.137 / √n at
    ρ = 30, η = 0.1, acc = 0.95: the benign / harmful threshold of ``test_eps = 0.05``)."""
    from statistics import NormalDist

    return 2 * NormalDist().inv_cdf(acc) / ((1 - 2 * float(eta)) * float(rho)
                                            * np.sqrt(np.asarray(n, float)))


# --------------------------------------------------------------------------------------------
# Gap growth and attention gaps (Sakamoto)
# --------------------------------------------------------------------------------------------


THEORY_EXPONENTS = {
    # (boundary axis, slice axis): (exponent, where it comes from)
    # The iso-SNR exponents are Sakamoto & Sato's n SNR^2 = const, SNR = ||mu|| / (sigma sqrt d),
    # and Magen et al.'s converged limit SNR* ~ c / sqrt(n) alike. Plain GD of single-head
    # attention from zero at step 1 has test accuracy Phi((1 - 2 eta) ||mu|| SNR sqrt(n) / 2) at
    # sigma 1, a function of ||mu||^2 sqrt(n / d): along snr the same -1/2, along ||mu|| half the
    # iso-SNR exponents.
    # the third entry: single-head GD's step-1 exponent, said only for single_head's runs
    ("signal_norm", "d"): (0.5, "iso-SNR: n SNR^2 fixed, SNR = ||mu|| / (sigma sqrt d)",
                           "single-head GD at step 1: 1/4"),
    ("d", "signal_norm"): (2.0, "iso-SNR: d* = n ||mu||^2 / (sigma^2 n SNR^2) at fixed n SNR^2",
                           "single-head GD at step 1: 4"),
    ("snr", "n"): (-0.5, "Magen et al.: SNR* ~ c / sqrt(n)", "single-head GD at step 1 alike"),
    ("signal_norm", "n"): (-0.5, "iso-SNR at fixed d: ||mu||* ~ sqrt(d / n)",
                           "single-head GD at step 1: -1/4"),
}


def theory_exponent(x: str, y: str, model: str | None = None) -> tuple[float, str] | None:
    """The theory's exponent of the boundary along ``x`` against the slice axis ``y``, and where
    it comes from; single-head GD's step-1 exponent is said beside it where ``model`` is
    single_head (not for another model, mixed models or an unknown one)."""
    if (x, y) not in THEORY_EXPONENTS:
        return None
    exponent, where, step1 = THEORY_EXPONENTS[(x, y)]
    return exponent, where + (f" ({step1})" if model == "single_head" else "")


def g(x, T):
    """Growth function ``g(x) = 2x + 2 sinh(x − log T)`` of [S]: under gradient flow
    ``g(gap(τ))`` grows about linearly in τ, so gaps grow about logarithmically. ``g(log T) =
    2 log T``; ``g`` is strictly increasing (``g' = 2 + 2 cosh > 0``)."""
    x = np.asarray(x, float)
    return 2 * x + 2 * np.sinh(x - np.log(T))


def g_inverse(y, T, tol=1e-12):
    """The inverse of :func:`g` (vectorised bisection; exact to ``tol``)."""
    y = np.asarray(y, float)
    # g(x) >= 2x - 2 sinh(|...|) bounds: bracket by |y| + log T + 2 on either side
    lo = -np.abs(y) - np.log(T) - 2.0
    hi = np.abs(y) + np.log(T) + 2.0
    lo, hi = np.broadcast_to(lo, y.shape).copy(), np.broadcast_to(hi, y.shape).copy()
    for _ in range(200):
        mid = (lo + hi) / 2
        up = g(mid, T) < y
        lo = np.where(up, mid, lo)
        hi = np.where(up, hi, mid)
        if np.all(hi - lo < tol):
            break
    return (lo + hi) / 2


def _tokens(df: pd.DataFrame, prefix: str) -> list[str]:
    cols = [c for c in df.columns if c.startswith(prefix)]
    return sorted(cols, key=lambda c: int(c[len(prefix):]))


def attention_gaps(dyn: pd.DataFrame, n_relevant: int = 1) -> pd.DataFrame:
    """Attention gaps Λ (clean) and Γ (noisy) of the tracked samples, from the dynamics table.

    The dynamics table records, per run and step, the attention logits ``logit_clean_t{k}`` and
    ``logit_noisy_t{k}`` of one clean and one flipped training sample (the first of each).

    - ``lambda_min`` — for the clean sample, ``Λ_t = a_R − a_t`` (``a_R`` the largest logit among
      the ``n_relevant`` relevant tokens) minimised over the non-relevant tokens ``t`` [S].
    - ``gamma_min`` — for the noisy sample, ``Γ_u,t = a_u − a_t`` with ``u`` its *winning* token,
      minimised over ``t ≠ u`` [S]. [S] fixes ``u`` as the token the noisy sample learns to attend
      (token 2, the opposite-class weak token); here ``u`` is the argmax of the logits at the
      run's last recorded step (a **reconstruction** that needs no role knowledge); ``winner``
      gives it.
    - ``g_lambda``, ``g_gamma`` — :func:`g` of the gaps with ``T`` = the number of tokens.

    Returns one row per (``source`` if present, ``run_id``, ``step``).
    """
    clean, noisy = _tokens(dyn, "logit_clean_t"), _tokens(dyn, "logit_noisy_t")
    if not clean or not noisy:
        raise KeyError("attention_gaps: the table has no logit_clean_t*/logit_noisy_t* columns "
                       "(record dynamics with record_every or record_log)")
    T = len(clean)
    keys = [k for k in ("source", "run_id") if k in dyn.columns]
    d = dyn.sort_values([*keys, "step"], kind="stable")
    a = d[clean].to_numpy(float)
    b = d[noisy].to_numpy(float)
    aR = a[:, :n_relevant].max(axis=1)
    lam = (aR[:, None] - a[:, n_relevant:]).min(axis=1)
    # winner u of the noisy sample: argmax at the last recorded step of its run
    last = d.groupby(keys, sort=False)["step"].transform("max").to_numpy() == d["step"].to_numpy()
    win_last = pd.Series(np.argmax(b, axis=1), index=d.index)[last]
    run_key = d[keys].astype(str).agg("|".join, axis=1) if keys else pd.Series("", index=d.index)
    winner_of = dict(zip(run_key[last], win_last))
    u = run_key.map(winner_of).to_numpy(int)
    bu = b[np.arange(len(b)), u]
    others = np.where(np.arange(T)[None, :] == u[:, None], np.inf, bu[:, None] - b)
    gam = others.min(axis=1)
    out = d[[*keys, "step"]].copy()
    out["lambda_min"] = lam
    out["gamma_min"] = gam
    out["winner"] = u
    out["g_lambda"] = g(lam, T)
    out["g_gamma"] = g(gam, T)
    return out.reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# Magen: the two-step closed form
# --------------------------------------------------------------------------------------------


def two_step(X, y, beta):
    """The first two GD steps of ``f = v^T X^T S(X p)`` from ``v = p = 0`` (step ``β``, mean
    logistic loss), in closed form. ``X: (n, T, d)``, ``y: (n,)`` in ``{±1}``.

    Step 1 ([M]): at ``p = 0`` the softmax is uniform and ``f = 0``; ``∂_p f = 0`` because
    ``v = 0``, so ``p₁ = 0``, and ``ℓ'(0) = −½`` gives ``v₁ = (β / (2nT)) Σᵢ yᵢ Σₜ xᵢₜ``, i.e.
    ``v₁ = (β/(4n)) Σᵢ yᵢ (xᵢ⁽¹⁾ + xᵢ⁽²⁾)`` for ``T = 2``.

    Step 2 (**reconstruction**, the chain rule at ``p = 0``, uniform ``s = 1/T``): with
    ``fᵢ = v₁ᵀ x̄ᵢ`` (``x̄ᵢ`` the token mean), ``ℓ'(z) = −σ(−z)``,

    - ``p₂ = (β/n) Σᵢ σ(−yᵢfᵢ) yᵢ Xᵢᵀ (diag(s) − s sᵀ) Xᵢ v₁`` (moves p toward the tokens whose
      projection on v₁ agrees with yᵢ: the signal for clean samples, their noise token for flipped
      ones);
    - ``v₂ = v₁ + (β/n) Σᵢ σ(−yᵢfᵢ) yᵢ x̄ᵢ``.

    Returns ``(v1, p2, v2)``.
    """
    X = np.asarray(X, float)
    y = np.asarray(y, float)
    n, T, _ = X.shape
    xbar = X.mean(axis=1)  # (n, d)
    v1 = beta / (2 * n * T) * np.einsum("i,id->d", y, X.sum(axis=1))
    f1 = xbar @ v1
    w = 1.0 / (1.0 + np.exp(y * f1))  # sigma(-y f) = -l'(y f)
    proj = X @ v1  # (n, T): x_it . v1
    s = np.full(T, 1.0 / T)
    # X^T (diag(s) - s s^T) X v1 = sum_t s_t x_t (proj_t - s . proj)
    centred = proj - (proj @ s)[:, None]
    grad_p = np.einsum("i,it,itd->d", w * y, s[None, :] * centred, X)
    p2 = beta / n * grad_p
    v2 = v1 + beta / n * np.einsum("i,id->d", w * y, xbar)
    return v1, p2, v2


# --------------------------------------------------------------------------------------------
# Sakamoto: the 𝔖 ratios
# --------------------------------------------------------------------------------------------


def s_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """The 𝔖 ratios of each run from its ``cumS_*`` columns ([S]).

    ``cumS_g = Σ_τ Σ_{i∈g} 𝔖⁽ⁱ⁾(τ)``, ``𝔖⁽ⁱ⁾ = s_R(1 − s_R)``, for the groups ``g`` =
    clean/noisy × clean class (pos: clean label +1). Clean samples of class c pull p toward
    ``μ_c``; flipped samples whose clean class is c push it away (their relevant token carries
    ``μ_c`` but their observed label is −c). Returned columns:

    - ``s_ratio_pos = cumS_clean_pos / cumS_noisy_pos`` and ``s_ratio_neg`` likewise: clean must
      dominate (≫ 1 at low noise, → 1 as noise grows; below ≈ 1 test accuracy collapses);
    - ``s_ratio_min``: the smaller of the two;
    - ``s_class_balance = cumS_clean_pos / cumS_clean_neg`` (the two classes must balance; [S]
      report ≈ 0.5–2.5).

    The pairing by clean class is a **reconstruction** of [S]'s per-class condition from the
    gradient's direction (the paper's statement is asymptotic). The official code
    (``main_math_frak.py``) groups the samples by their **observed** label instead: its class +
    sums are the clean samples of class + and the flipped samples labelled + (clean class −).
    Those ratios are ``s_ratio_obs_pos = cumS_clean_pos / cumS_noisy_neg``,
    ``s_ratio_obs_neg = cumS_clean_neg / cumS_noisy_pos`` and ``s_ratio_obs_min``. A ratio is NaN
    where its denominator is 0 (e.g. no flipped sample of that class).
    """
    need = ["cumS_clean_pos", "cumS_clean_neg", "cumS_noisy_pos", "cumS_noisy_neg"]
    miss = [c for c in need if c not in df.columns]
    if miss:
        raise KeyError(f"s_ratios: missing column {miss[0]!r} (a prompt_attention results table "
                       "has cumS_* columns)")
    cp, cn, npos, nneg = (df[c].to_numpy(float) for c in need)
    with np.errstate(divide="ignore", invalid="ignore"):
        rp = np.where(npos > 0, cp / np.where(npos > 0, npos, 1), np.nan)
        rn = np.where(nneg > 0, cn / np.where(nneg > 0, nneg, 1), np.nan)
        bal = np.where(cn > 0, cp / np.where(cn > 0, cn, 1), np.nan)
        op = np.where(nneg > 0, cp / np.where(nneg > 0, nneg, 1), np.nan)
        on = np.where(npos > 0, cn / np.where(npos > 0, npos, 1), np.nan)
    out = pd.DataFrame({"s_ratio_pos": rp, "s_ratio_neg": rn,
                        "s_ratio_min": np.fmin(rp, rn), "s_class_balance": bal,
                        "s_ratio_obs_pos": op, "s_ratio_obs_neg": on,
                        "s_ratio_obs_min": np.fmin(op, on)}, index=df.index)
    return out
