"""Theory: known values of the formulas, the two-step closed form against autodiff, gaps, 𝔖."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from phasebo import theory as TH


@pytest.mark.parametrize("T", [2, 5, 8])
def test_g_at_log_T_and_inverse(T):
    assert TH.g(math.log(T), T) == pytest.approx(2 * math.log(T))
    x = np.linspace(-3, 6, 13)
    assert np.allclose(TH.g_inverse(TH.g(x, T), T), x, atol=1e-9)
    assert np.all(np.diff(TH.g(x, T)) > 0)
    # g(0) = -2 sinh(log T) = -(T - 1/T)
    assert TH.g(0.0, T) == pytest.approx(-(T - 1 / T))


def test_iso_snr_curves_pass_through_the_spec_s2_points():
    for name, p in TH.S2_POINTS.items():
        d, mu, n, kappa = p["d"], p["signal_norm"], p["n"], p["n_snr2"]
        assert TH.n_snr2(mu, d, n) == pytest.approx(kappa), name
        assert TH.iso_snr_signal_norm(d, kappa, n) == pytest.approx(mu), name
        assert TH.iso_snr_d(mu, kappa, n) == pytest.approx(d), name
    assert [p["n_snr2"] for p in TH.S2_POINTS.values()] == [0.1, 4.0, 200.0]
    # the curve scales as sqrt(d) and with sigma
    assert TH.iso_snr_signal_norm(4000, 4.0, 20) / TH.iso_snr_signal_norm(1000, 4.0, 20) == \
        pytest.approx(2.0)
    assert TH.snr_sakamoto(20.0, 2000, sigma_eps=2.0) == pytest.approx(20 / (2 * math.sqrt(2000)))


def test_magen_boundary():
    assert TH.snr_magen(30.0, 40000) == pytest.approx(0.15)
    assert TH.magen_boundary_snr(100, c=2.0) == pytest.approx(0.2)
    n = np.array([10.0, 1000.0])
    # a slope -1/2 line on log-log axes
    slope = np.diff(np.log(TH.magen_boundary_snr(n))) / np.diff(np.log(n))
    assert slope[0] == pytest.approx(-0.5)
    # n rho^2 / d = c^2 on the boundary
    rho = TH.magen_boundary_rho(50, 2000, c=1.5)
    assert 50 * rho**2 / 2000 == pytest.approx(1.5**2)
    assert TH.snr_magen(rho, 2000) == pytest.approx(TH.magen_boundary_snr(50, 1.5))


def _single_head_loss(v, p, X, y):
    s = jax.nn.softmax(X @ p, axis=-1)  # (n, T)
    f = jnp.einsum("nt,ntd,d->n", s, X, v)
    return jnp.mean(jax.nn.softplus(-y * f))


@pytest.mark.parametrize("T", [2, 5])
def test_two_step_closed_form_matches_gradient_descent(T):
    rng = np.random.default_rng(0)
    n, d, beta = 7, 11, 0.3
    X = rng.normal(size=(n, T, d))
    y = rng.choice([-1.0, 1.0], size=n)
    v1, p2, v2 = TH.two_step(X, y, beta)
    if T == 2:  # Magen et al.'s printed form
        assert np.allclose(v1, beta / (4 * n) * np.einsum("i,id->d", y, X[:, 0] + X[:, 1]))
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    grad = jax.grad(_single_head_loss, argnums=(0, 1))
    v, p = jnp.zeros(d), jnp.zeros(d)
    gv, gp = grad(v, p, Xj, yj)
    v, p = v - beta * gv, p - beta * gp
    assert np.allclose(p, 0.0) and np.allclose(v, v1, rtol=1e-5, atol=1e-6)
    gv, gp = grad(v, p, Xj, yj)
    v, p = v - beta * gv, p - beta * gp
    assert np.allclose(p, p2, rtol=1e-4, atol=1e-6)
    assert np.allclose(v, v2, rtol=1e-4, atol=1e-6)
    assert np.linalg.norm(p2) > 0


def test_attention_gaps_by_hand():
    T = 4
    rows = []
    for step, (lc, ln) in enumerate([
        ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]),
        ([2.0, 0.5, -1.0, 1.0], [0.1, 0.0, 3.0, 1.0]),
    ]):
        r = {"run_id": 0, "step": step * 10}
        r.update({f"logit_clean_t{k}": lc[k] for k in range(T)})
        r.update({f"logit_noisy_t{k}": ln[k] for k in range(T)})
        rows.append(r)
    gaps = TH.attention_gaps(pd.DataFrame(rows[::-1]))  # order must not matter
    assert list(gaps["step"]) == [0, 10]
    assert list(gaps["lambda_min"]) == pytest.approx([0.0, 1.0])  # 2 - max(0.5, -1, 1)
    assert list(gaps["winner"]) == [2, 2]  # token 2 wins at the last step
    assert list(gaps["gamma_min"]) == pytest.approx([0.0, 2.0])  # 3 - max(0.1, 0, 1)
    assert gaps["g_lambda"].iloc[1] == pytest.approx(2 + 2 * math.sinh(1 - math.log(T)))


def test_s_ratios_by_hand():
    df = pd.DataFrame({"cumS_clean_pos": [8.0, 1.0], "cumS_clean_neg": [4.0, 2.0],
                       "cumS_noisy_pos": [2.0, 0.0], "cumS_noisy_neg": [1.0, 4.0]})
    r = TH.s_ratios(df)
    assert list(r["s_ratio_pos"].iloc[:1]) == [4.0] and np.isnan(r["s_ratio_pos"].iloc[1])
    assert list(r["s_ratio_neg"]) == [4.0, 0.5]
    assert list(r["s_ratio_min"]) == [4.0, 0.5]  # NaN ignored in the minimum
    assert list(r["s_class_balance"]) == [2.0, 0.5]
    # the official code's grouping by observed label: clean + with flipped labelled + (clean -)
    assert list(r["s_ratio_obs_pos"]) == [8.0, 0.25]
    assert list(r["s_ratio_obs_neg"].iloc[:1]) == [2.0] and np.isnan(r["s_ratio_obs_neg"].iloc[1])
    assert list(r["s_ratio_obs_min"]) == [2.0, 0.25]
    with pytest.raises(KeyError, match="cumS"):
        TH.s_ratios(df.drop(columns="cumS_noisy_neg"))


def test_theory_does_not_import_plot():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(TH))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not any("plot" in m or "matplotlib" in m for m in names)


def test_theory_exponents_are_the_theory_modules_slopes():
    """Each tabled exponent is the log-log slope of the theory module's own curve: the iso-SNR
    curves (Sakamoto & Sato), Magen et al.'s SNR* = c / sqrt(n) and its rho* at fixed d; the
    weak-relevance factor rho has no exponent (it is not Magen's rho)."""
    from phasebo import theory as th
    from phasebo.theory import THEORY_EXPONENTS, theory_exponent

    def slope(f, a=100.0, b=1e4):
        return math.log(f(b) / f(a)) / math.log(b / a)

    curves = {("signal_norm", "d"): lambda d: th.iso_snr_signal_norm(d, 4.0, 20),
              ("d", "signal_norm"): lambda mu: th.iso_snr_d(mu, 4.0, 20),
              ("snr", "n"): lambda n: th.magen_boundary_snr(n),
              ("signal_norm", "n"): lambda n: th.magen_boundary_rho(n, 2000.0)}
    assert set(curves) == set(THEORY_EXPONENTS)
    for key, f in curves.items():
        assert slope(f) == pytest.approx(theory_exponent(*key)[0], abs=1e-9), key
    # Sakamoto & Sato's iso-SNR along n at fixed d is the same -1/2
    assert slope(lambda n: th.iso_snr_signal_norm(2000.0, 4.0, n)) == pytest.approx(-0.5)
    assert theory_exponent("rho", "n") is None
    # single-head GD's step-1 exponent is said for single_head's runs, not for another model's
    assert "single-head GD at step 1: 4" in theory_exponent("d", "signal_norm", "single_head")[1]
    assert "single-head" not in theory_exponent("d", "signal_norm", "prompt_attention")[1]
    assert "single-head" not in theory_exponent("d", "signal_norm")[1]  # mixed or unknown
    # the step-1 closed form of single-head GD: -1/2 along snr, as the table says
    assert slope(lambda n: th.magen_step1_snr(n, 30.0, 0.1)) == pytest.approx(-0.5)
