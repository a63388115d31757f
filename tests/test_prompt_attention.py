"""The prompt-attention run against a plain NumPy implementation, on the same sampled data.

The NumPy side writes the forward pass and the gradient by hand (no autodiff):
``a = X q``, ``s = softmax(a)``, ``h = X nu``, ``f = s.h``; ``df/da_t = s_t (h_t - f)``;
loss ``L = mean softplus(-y f)`` so ``dL/df_i = -y_i sigmoid(-y_i f_i) / n``;
``dL/dq = sum_i dL/df_i X_i^T (s_i * (h_i - f_i))``, ``dL/dp = W^T dL/dq``, ``dL/dW = dL/dq p^T``.
"""

import jax.random as jr
import numpy as np
import pytest

import phasebo
from phasebo.data import sakamoto_sample, token_roles
from phasebo.models.prompt_attention import uniform_W


@pytest.fixture(autouse=True, scope="module")
def _x64(x64_module):  # every run here is float64
    yield


def numpy_gd(X, y, nu, W, lr, steps, train_W):
    """Plain NumPy full-batch GD on the prompt-attention model; returns losses per step."""
    n, T, d = X.shape
    p = np.zeros(d)
    W = np.eye(d) if W is None else W.copy()
    losses = []
    h = X @ nu
    for t in range(steps + 1):
        q = W @ p
        a = X @ q
        a = a - a.max(1, keepdims=True)
        s = np.exp(a) / np.exp(a).sum(1, keepdims=True)
        f = (s * h).sum(1)
        losses.append(np.mean(np.logaddexp(0, -y * f)))
        if t == steps:
            break
        dLdf = -y / (1 + np.exp(y * f)) / n
        dfda = s * (h - f[:, None])
        dLdq = np.einsum("i,it,itd->d", dLdf, dfda, X)
        gp = W.T @ dLdq
        if train_W:
            W = W - lr * np.outer(dLdq, p)
        p = p - lr * gp
    return np.asarray(losses), p, W


def phasebo_data(settings, run_id=0):
    """The training set and initial W of a phasebo run, drawn with the run's own keys."""
    key = jr.fold_in(jr.PRNGKey(0), run_id)
    k_data, _, k_init = jr.split(key, 3)
    roles = token_roles(settings["T"], 1, 1, 1)
    sw = {"signal_norm": np.float64(settings["signal_norm"]), "rho": np.float64(0.1),
          "sigma_eps": np.float64(1.0), "noise_ratio": np.float64(0.2), "n_flip_per_class": 2}
    b = sakamoto_sample(k_data, settings["n"], settings["d"], roles, sw, label_mode="balanced",
                        label_noise="fraction", dtype=np.float64)
    W = np.asarray(uniform_W(jr.split(k_init)[1], settings["d"], np.float64))
    return np.asarray(b.X), np.asarray(b.y), W


@pytest.mark.parametrize("train", [("p",), ("p", "W")])
def test_gd_trajectory_matches_numpy(train):
    s = dict(d=60, n=20, T=8, signal_norm=6.0, steps=40, lr=0.5, record_every=10,
             engine="direct", dtype="float64", train=train)
    out = phasebo.run_one(s, key=jr.fold_in(jr.PRNGKey(0), 0))
    X, y, W = phasebo_data(s)
    d = s["d"]
    nu = np.zeros(d)
    nu[0], nu[1] = 1, -1
    nu /= np.sqrt(2) * s["signal_norm"]
    losses, p, W_end = numpy_gd(X, y, nu, W if "W" in train else None, s["lr"], s["steps"],
                                "W" in train)
    rec = np.asarray(out.dynamics["train_loss"])
    np.testing.assert_allclose(rec, losses[::10], rtol=1e-10, atol=1e-12)
    # the final query and the tracked loss moved: the comparison is not trivial
    assert losses[-1] < losses[0] - 1e-3
    q = W_end @ p
    assert float(out.final["q_norm"]) == pytest.approx(np.linalg.norm(q), rel=1e-9)
    assert float(out.final["p_norm"]) == pytest.approx(np.linalg.norm(p), rel=1e-9)
    assert float(out.final["p_align_e1"]) == pytest.approx(p[0] / np.linalg.norm(p), rel=1e-8)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_output_dtype_follows_setting(dtype):
    out = phasebo.run_one(dict(d=50, steps=5, engine="direct", dtype=dtype, record_every=1))
    assert out.final["train_loss"].dtype == np.dtype(dtype)
    assert out.dynamics["test_loss"].dtype == np.dtype(dtype)


def test_train_accuracy_bookkeeping_matches_margins():
    out = phasebo.run_one(dict(d=300, n=20, signal_norm=5.0, steps=200, lr=0.05,
                               engine="direct"))
    m = np.asarray(out.samples["final_margin"])
    flipped = np.asarray(out.samples["flipped"])
    assert float(out.final["train_acc"]) == pytest.approx(np.mean(m > 0))
    assert float(out.final["train_acc_noisy"]) == pytest.approx(np.mean(m[flipped] > 0))
    assert float(out.final["margin"]) == pytest.approx(m.min(), rel=1e-5)
    ff = np.asarray(out.samples["first_fit_step"])
    # a sample fitted at the end was fitted first at some step <= steps
    assert np.all(ff[m > 0] >= 0) and np.all(ff <= 200)


@pytest.mark.parametrize("engine", ["direct", "reduced"])
def test_a_run_without_label_noise_has_no_flipped_sample_to_follow(engine):
    """The default tracked pair is the first clean and the first flipped sample; without label
    noise there is no flipped one (its index would be 0, a clean sample), so its attention and
    logit columns are NaN, and the clean sample's are the data."""
    out = phasebo.run_one(dict(d=200, steps=4, engine=engine, noise_ratio=0.0, record_every=2))
    dyn = out.dynamics
    assert np.isnan(dyn["attn_noisy_t0"]).all() and np.isnan(dyn["logit_noisy_t1"]).all()
    assert np.isfinite(dyn["attn_clean_t0"]).all()
    noisy = phasebo.run_one(dict(d=200, steps=4, engine=engine, record_every=2)).dynamics
    assert np.isfinite(noisy["attn_noisy_t0"]).all()
