"""Magen et al.: data, the two-step closed form and run, learning rules, Gaussian init; and
Sakamoto & Sato's hand-built query."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pandas as pd
import pytest

import phasebo
from phasebo import rules
from phasebo.data import magen_sample, projected_token_scores
from phasebo.models.single_head import SingleHead
from phasebo.registry import MODELS
from phasebo.sweep import run_one, run_sweep

KEY0 = jr.fold_in(jr.PRNGKey(0), 0)  # one data draw shared by the runs that compare rules

MAGEN = dict(model="single_head", T=2, label_mode="iid", label_noise="bernoulli",
             engine="direct")  # this file checks the direct engine (phasebo.train.run)


def _sw(**kw):
    base = {"signal_norm": 3.0, "sigma_eps": 1.0, "noise_ratio": 0.2, "n_flip_per_class": 0,
            "lr": 0.1, "weight_decay": 0.0, "radius_v": 1.0, "radius_p": 1.0}
    base.update(kw)
    return {k: jnp.asarray(v) for k, v in base.items()}


def _batch(key, n=20, d=64, T=2, mode="projected", **kw):
    return magen_sample(key, n, d, T, _sw(**kw), label_mode="iid", label_noise="bernoulli",
                        noise_mode=mode, signal_noise=False, dtype=jnp.float32)


# ------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------


def test_noise_is_orthogonal_to_the_signals_with_the_right_trace():
    d, n, T = 1000, 400, 5
    b = _batch(jr.PRNGKey(0), n=n, d=d, T=T, signal_norm=7.0)
    X = np.asarray(b.X, np.float64)
    mu = np.zeros((2, d))
    mu[0, 0] = mu[1, 1] = 7.0
    assert np.abs(X[:, 1:, :] @ mu.T).max() < 1e-5  # noise tokens orthogonal to mu_1, mu_2
    sig = np.where(np.asarray(b.y_clean)[:, None] > 0, mu[0], mu[1])
    np.testing.assert_array_equal(X[:, 0, :], sig)  # signal token first and noise-free
    # E||xi||^2 = tr(I - mu1 mu1^T/rho^2 - mu2 mu2^T/rho^2) = d - 2; sd of the mean ~ 1.1
    assert abs(np.mean(np.sum(X[:, 1:, :] ** 2, -1)) - (d - 2)) < 5
    iso = np.asarray(_batch(jr.PRNGKey(0), n=n, d=d, T=T, mode="isotropic").X)
    assert abs(np.mean(np.sum(iso[:, 1:, :] ** 2, -1)) - d) < 5
    assert np.abs(iso[:, 1:, :2]).max() > 0.5  # isotropic noise does touch the signal span
    flips = np.asarray(_batch(jr.PRNGKey(1), n=4000, d=3, noise_ratio=0.2).flipped)
    assert abs(flips.mean() - 0.2) < 0.03  # Bernoulli(eta) flips


def test_projected_test_scores_have_the_derived_covariance():
    """(xi.a, xi.b) for xi ~ N(0, P): covariance Gram(P a, P b), P off span(e1, e2)."""
    d, N = 30, 60000
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.normal(size=d), jnp.float32) for _ in range(2))
    z = jr.normal(jr.PRNGKey(2), (N, 2, 2))
    signal = jnp.zeros((N, 2, 2))
    for mode, P in (("projected", np.diag([0.0, 0.0] + [1.0] * (d - 2))), ("isotropic", np.eye(d))):
        xa, xb = projected_token_scores(z, signal, a, b, None, 1.5, mode, np.array([False, True]))
        assert float(jnp.abs(xa[:, 0]).max()) == 0.0  # the noise-free token has no noise
        emp = np.cov(np.stack([np.asarray(xa[:, 1]), np.asarray(xb[:, 1])]))
        A = np.stack([np.asarray(a), np.asarray(b)])
        want = 1.5**2 * A @ P @ A.T
        np.testing.assert_allclose(emp, want, rtol=0.03, atol=0.03 * np.abs(want).max())


# ------------------------------------------------------------------------------------------
# The two-step closed form
# ------------------------------------------------------------------------------------------


def _gd_step(model, batch, lr, wd=0.0):
    static = MODELS["single_head"].static_of({"project": False})
    opt = rules.make_optimizer(static, _sw(lr=lr, weight_decay=wd))
    state = opt.init(model)

    def loss(m):
        return jnp.mean(jax.nn.softplus(-batch.y * m(batch.X)[0]))

    u, _ = opt.update(jax.grad(loss)(model), state, model)
    return optax.apply_updates(model, u)


def test_two_step_closed_form():
    beta, n = 0.7, 20
    b = _batch(jr.PRNGKey(3), n=n, signal_norm=4.0)
    X, y = np.asarray(b.X, np.float64), np.asarray(b.y, np.float64)
    zero = SingleHead(p=jnp.zeros(64), v=jnp.zeros(64))
    m1 = _gd_step(zero, b, beta)
    v1 = beta / (4 * n) * np.einsum("n,nd->d", y, X[:, 0] + X[:, 1])
    np.testing.assert_array_equal(np.asarray(m1.p), 0.0)  # step 1 leaves p = 0
    np.testing.assert_allclose(m1.v, v1, rtol=1e-5, atol=1e-7)
    # step 2 (derived the same way): p_2 = beta/(4n) sum_i y_i sigma(-y_i f_i) (h_i1 - h_i2)
    # (x_i1 - x_i2), h = X v_1, f = (h_1 + h_2)/2; v_2 = v_1 + beta/(2n) sum y_i sigma(.) (x_i1 + x_i2)
    m2 = _gd_step(m1, b, beta)
    h = X @ v1
    f = h.mean(1)
    sg = 1 / (1 + np.exp(y * f))
    p2 = beta / (4 * n) * np.einsum("n,nd->d", y * sg * (h[:, 0] - h[:, 1]), X[:, 0] - X[:, 1])
    v2 = v1 + beta / (2 * n) * np.einsum("n,nd->d", y * sg, X[:, 0] + X[:, 1])
    np.testing.assert_allclose(m2.p, p2, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(m2.v, v2, rtol=1e-4, atol=1e-7)


SHARED = dict(MAGEN, d=200, n=40, signal_norm=6.0, noise_ratio=0.1, lr=1.0, steps=100,
              n_test=200, record_every=1, init="gaussian")


@pytest.fixture(scope="module")
def shared():
    """Four runs on the same data (run_id 0) and one compilation: (init_scale, weight_decay)
    in (0 = zero init, 0), (1e-6, 0), (0.3, 0), (0, 0.01); values are (final, dynamics) dicts of
    NumPy arrays."""
    out = {}
    for sigma, wd in ((0.0, 0.0), (1e-6, 0.0), (0.3, 0.0), (0.0, 0.01)):
        o = run_one(SHARED, init_scale=sigma, weight_decay=wd, key=KEY0)
        out[sigma, wd] = ({k: np.asarray(v) for k, v in o.final.items()},
                          {k: np.asarray(v) for k, v in o.dynamics.items()})
    return out


def test_two_step_closed_form_inside_a_run(shared):
    """The run's recorded step 1: p = 0 and v = beta/(4n) sum y_i (x_i1 + x_i2) (norm and
    alignment), on the run's own data (same key: fold_in(root, run_id), first split)."""
    g = shared[0.0, 0.0][1]
    b = _batch(jr.split(KEY0, 3)[0], n=40, d=200, signal_norm=6.0, noise_ratio=0.1)
    X, y = np.asarray(b.X, np.float64), np.asarray(b.y, np.float64)
    v1 = 1.0 / (4 * 40) * np.einsum("n,nd->d", y, X[:, 0] + X[:, 1])
    assert g["p_norm"][1] == 0.0
    np.testing.assert_allclose(g["v_norm"][1], np.linalg.norm(v1), rtol=1e-5)
    np.testing.assert_allclose(g["v_align_e1"][1], v1[0] / np.linalg.norm(v1), rtol=1e-4,
                               atol=1e-6)
    assert g["p_norm"][2] > 0


# ------------------------------------------------------------------------------------------
# Magen et al.: two steps of GD interpolate and generalise at SNR ~ 1/sqrt(n)
# ------------------------------------------------------------------------------------------


@pytest.mark.slow  # 42 s; the two-step closed form, in and out of a run, is checked by default
@pytest.mark.optimized
def test_m1_two_steps_benign_at_rho_30_and_worse_at_rho_5(tmp_path):
    spec = phasebo.spec_from_dict(
        dict(MAGEN, n=200, d=40000, noise_ratio=0.05, lr=0.025, steps=2, n_test=1000),
        {"signal_norm": [30.0, 5.0]}, seeds=10, name="m1",
    )
    df = run_sweep(spec, tmp_path / "m1", quiet=True, plots=False)
    hi, lo = df[df.signal_norm == 30.0], df[df.signal_norm == 5.0]
    assert (hi.train_acc == 1.0).all()
    assert hi.test_acc.mean() >= 0.98
    noisy = hi[hi.n_noisy > 0]
    assert (noisy.mass_clean_rel > noisy.mass_noisy_rel).all()
    assert noisy.mass_clean_rel.mean() > 0.5 > 0.1 > noisy.mass_noisy_rel.mean()
    assert lo.test_acc.mean() < hi.test_acc.mean() - 0.1  # re-runs: ~0.77 at rho = 5
    assert (df.status == "ok").all()
    assert np.allclose(df.snr, df.signal_norm / 200.0)  # snr = rho / sqrt(d)


# ------------------------------------------------------------------------------------------
# Learning rules
# ------------------------------------------------------------------------------------------


def test_weight_decay_and_projection_steps_are_exact():
    b = _batch(jr.PRNGKey(4), n=16, d=32, signal_norm=4.0)
    m0 = SingleHead(p=0.3 * jnp.ones(32), v=0.2 * jnp.ones(32))
    plain = _gd_step(m0, b, 0.5)
    wd = _gd_step(m0, b, 0.5, wd=0.1)
    np.testing.assert_allclose(wd.v, plain.v - 0.5 * 0.1 * m0.v, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(wd.p, plain.p - 0.5 * 0.1 * m0.p, rtol=1e-5, atol=1e-7)
    static = MODELS["single_head"].static_of({"project": True})
    opt = rules.make_optimizer(static, _sw(lr=0.5, radius_v=0.5, radius_p=3.0),
                               lambda m: (m.v, m.p), ("radius_v", "radius_p"))
    u, _ = opt.update(jax.tree.map(lambda x: -x, m0), opt.init(m0), m0)  # step +2 m0
    m = optax.apply_updates(m0, u)
    np.testing.assert_allclose(jnp.linalg.norm(m.v), 0.5, rtol=1e-6)  # 3 v0 projected to r
    np.testing.assert_allclose(m.v, 0.5 * m0.v / jnp.linalg.norm(m0.v), rtol=1e-6)
    np.testing.assert_allclose(m.p, 1.5 * m0.p, rtol=1e-6)  # inside the ball: unchanged


def test_projected_gd_keeps_the_constraint_and_grows_the_margin():
    s = dict(MAGEN, d=200, n=40, signal_norm=6.0, noise_ratio=0.1, lr=1.0, steps=100,
             n_test=200, record_every=1, project=True, radius_v=2.0, radius_p=0.7)
    dyn = run_one(s).dynamics
    assert np.all(np.asarray(dyn["v_norm"]) <= 2.0 * (1 + 1e-5))
    assert np.all(np.asarray(dyn["p_norm"]) <= 0.7 * (1 + 1e-5))
    assert float(dyn["v_norm"][-1]) > 1.99 and float(dyn["p_norm"][-1]) > 0.699  # both active
    margin = np.asarray(dyn["margin"])
    assert margin[-1] > 0 and margin[-1] > margin[20] > margin[1]
    assert float(dyn["train_acc"][-1]) == 1.0


def test_weight_decay_bounds_the_norm_and_grows_the_margin(shared):
    plain, wd = shared[0.0, 0.0][0], shared[0.0, 0.01][0]
    assert wd["v_norm"] < plain["v_norm"] and wd["p_norm"] < plain["p_norm"]
    assert wd["train_acc"] == 1.0
    g = shared[0.0, 0.01][1]
    for m in (g["margin"], g["margin_norm"]):  # min_i y_i f_i (/ ||v||)
        assert m[-1] > 0 and m[-1] > m[20] > m[1]


# ------------------------------------------------------------------------------------------
# Sakamoto & Sato's Fig. 1: the hand-built query
# ------------------------------------------------------------------------------------------


@pytest.mark.optimized
def test_s1_constructed_query_benign_and_not_overfitting(tmp_path):
    spec = phasebo.spec_from_dict(
        dict(model="constructed_query", d=10000, n=100, n_test=200, T=8, rho=0.2,
             signal_norm=20.0, noise_ratio=0.2),
        {"query_lambda": [0.06, 0.001]}, seeds=3, name="s1",
    )
    df = run_sweep(spec, tmp_path / "s1", quiet=True, plots=False)
    benign, under = df[df.query_lambda == 0.06], df[df.query_lambda == 0.001]
    # paper: 1.0 / 1.0; a seed can leave one sample unfitted (measured 1.0, 1.0, 0.99)
    assert benign.train_acc.mean() >= 0.99 and benign.train_acc.max() == 1.0
    assert benign.test_acc.mean() >= 0.95
    assert (under.train_acc_noisy < 1.0).all() and (under.train_acc < 1.0).all()
    assert (under.test_acc >= 0.95).all()
    smp = pd.read_parquet(tmp_path / "s1" / "samples.parquet")
    assert len(smp) == 6 * 300 and {"sel_e1", "sel_e2", "is_test"} <= set(smp.columns)
    assert smp[smp.is_test == 1].flipped.sum() == 0


# ------------------------------------------------------------------------------------------
# Magen et al.'s small Gaussian init: sigma -> 0 approaches zero init
# ------------------------------------------------------------------------------------------


def test_gaussian_init_approaches_zero_init(shared):
    """init_scale = 0 is zero init exactly; 1e-6 stays within 1e-4 of it over 100 steps of
    dynamics; 0.3 does not (so the check can fail)."""
    zero = shared[0.0, 0.0][1]
    assert zero["v_norm"][0] == 0.0 and zero["p_norm"][0] == 0.0
    keys = ["train_loss", "test_loss", "v_norm", "p_norm", "mass_noisy_rel", "margin"]

    def gap(sigma):
        g = shared[sigma, 0.0][1]
        return max(float(np.max(np.abs(g[k] - zero[k]))) for k in keys)

    assert gap(1e-6) < 1e-4 < 1e-2 < gap(0.3)
