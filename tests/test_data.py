"""The Sakamoto token distribution, label noise and the projected test set."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import phasebo
from phasebo.data import (
    materialised,
    n_flip_per_class,
    padded_draw,
    padded_width,
    projected_scores,
    sakamoto_sample,
    token_major,
    token_roles,
)
from phasebo.metrics import attend
from phasebo.models.prompt_attention import uniform_W, w_bound


def sample(n, d, r=0.2, mode="fraction", label_mode="balanced", norm=5.0, rho=0.1, sigma=1.0,
           seed=0):
    roles = token_roles(8, 1, 1, 1)
    sw = {"signal_norm": np.float32(norm), "rho": np.float32(rho), "sigma_eps": np.float32(sigma),
          "noise_ratio": np.float32(r), "n_flip_per_class": n_flip_per_class(n, r)}
    b = sakamoto_sample(jr.PRNGKey(seed), n, d, roles, sw, label_mode=label_mode,
                        label_noise=mode, dtype=np.float32)
    return {k: (None if v is None else np.asarray(v)) for k, v in b._asdict().items()}


def test_flip_counts_follow_the_papers_code():
    assert n_flip_per_class(20, 0.2) == 2  # k = 4: not 5 from float rounding
    assert n_flip_per_class(20, 0.15) == 1  # k = 3 -> floor(3/2) = 1 per class
    assert n_flip_per_class(100, 0.3) == 15
    assert n_flip_per_class(20, 0.0) == 0
    b = sample(20, 10)
    y, yc, fl = b["y"], b["y_clean"], b["flipped"]
    assert (yc[:10] == 1).all() and (yc[10:] == -1).all()
    assert fl.sum() == 4 and fl[:10].sum() == 2 and fl[10:].sum() == 2
    np.testing.assert_array_equal(y, np.where(fl, -yc, yc))


def test_bernoulli_flip_rate():
    b = sample(20000, 3, r=0.3, mode="bernoulli", label_mode="iid")
    assert abs(b["flipped"].mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 20000)
    assert abs((b["y_clean"] > 0).mean() - 0.5) < 4 * np.sqrt(0.25 / 20000)


def test_token_means_and_noise_covariance():
    n, d, norm, rho, sigma = 4000, 12, 5.0, 0.3, 1.5
    b = sample(n, d, norm=norm, rho=rho, sigma=sigma)
    X, yc = b["X"].astype(np.float64), b["y_clean"]
    pos = yc > 0
    se = 5 * sigma / np.sqrt(n / 2)
    expect = {  # token -> (mean on e1, mean on e2) for the positive class
        0: (norm, 0), 1: (rho * norm, 0), 2: (0, rho * norm), 3: (0, 0), 7: (0, 0)}
    for t, (m1, m2) in expect.items():
        mu = X[pos, t].mean(0)
        assert abs(mu[0] - m1) < se and abs(mu[1] - m2) < se
        assert np.all(np.abs(mu[2:]) < se)
        mu_neg = X[~pos, t].mean(0)  # the negative class mirrors e1 and e2
        assert abs(mu_neg[1] - m1) < se and abs(mu_neg[0] - m2) < se
    noise = X.copy()
    noise[..., :2] -= b["signal"]
    cov = np.cov(noise.reshape(-1, d).T)
    np.testing.assert_allclose(np.diag(cov), sigma**2, rtol=0.05)
    assert np.abs(cov - np.diag(np.diag(cov))).max() < 0.05 * sigma**2


def test_projected_scores_match_the_gaussian_law():
    """(eps.nu, eps.q) drawn by projection has the covariance sigma^2 [[nu.nu, nu.q], [., q.q]]."""
    rng = np.random.default_rng(0)
    d = 30
    q, nu = rng.normal(size=d), rng.normal(size=d)
    sig = np.zeros((50000, 1, 2), np.float32)
    z = jr.normal(jr.PRNGKey(1), sig.shape, np.float32)
    lg, hd = projected_scores(z, sig, q.astype(np.float32), nu.astype(np.float32),
                              np.float32(2.0))
    emp = np.cov(np.stack([np.asarray(hd).ravel(), np.asarray(lg).ravel()]))
    want = 4.0 * np.array([[nu @ nu, nu @ q], [nu @ q, q @ q]])
    np.testing.assert_allclose(emp, want, rtol=0.04, atol=0.04 * np.abs(want).max())


def test_token_major_test_pass_is_the_same_numbers():
    """The token-major layout the records read ((2, T, n), axis 0) gives the (n, T, 2) layout's
    logits, head scores and attention outputs exactly: a layout, not a different computation."""
    b = sample(500, None, norm=3.0)
    z = jr.normal(jr.PRNGKey(2), (500, 8, 2), jnp.float32)
    rng = np.random.default_rng(1)
    q, nu = (jnp.asarray(rng.normal(size=12), jnp.float32) for _ in range(2))
    sig = jnp.asarray(b["signal"])
    lg, hd = projected_scores(z, sig, q, nu, np.float32(1.5))
    lg_t, hd_t = projected_scores(token_major(z), token_major(sig), q, nu, np.float32(1.5), axis=0)
    assert token_major(z).shape == (2, 8, 500) and lg_t.shape == (8, 500)
    np.testing.assert_array_equal(np.asarray(lg_t), np.asarray(lg).T)
    np.testing.assert_array_equal(np.asarray(hd_t), np.asarray(hd).T)
    out, out_t = attend(lg, hd), attend(lg_t, hd_t, axis=0)
    np.testing.assert_array_equal(np.asarray(out_t), np.asarray(out))
    want = np.sum(np.asarray(jax.nn.softmax(lg, -1)) * np.asarray(hd), -1)
    np.testing.assert_allclose(np.asarray(out_t), want, rtol=1e-5, atol=1e-6)


def test_projected_test_set_agrees_with_sampled_tokens():
    """Same trained runs; test accuracy and loss from d-dimensional test tokens vs projections."""
    accs = {"projected": [], "sampled": []}
    losses = {"projected": [], "sampled": []}
    for run_id in range(3):
        for mode in accs:
            f = phasebo.run_one(dict(d=1000, signal_norm=4.0, steps=300, n_test=3000,
                                     engine="direct", test_mode=mode), seed=run_id).final
            accs[mode].append(float(f["test_acc"]))
            losses[mode].append(float(f["test_loss"]))
    a, b = np.mean(accs["projected"]), np.mean(accs["sampled"])
    se = np.sqrt(2 * a * (1 - a) / (3 * 3000))
    assert a < 0.99  # a setting where the test set matters
    assert abs(a - b) < 4 * se + 1e-3
    assert np.mean(losses["projected"]) == pytest.approx(np.mean(losses["sampled"]), rel=0.02)


def test_padded_draws_are_the_unpadded_draws_bit_for_bit(x64):
    """With d traced and the arrays zero-padded to a wider program, the noise, W_0 and a Gaussian
    init are exactly the draws an unpadded run makes (threefry draws each element from its flat
    index), in both precisions."""
    key = jr.PRNGKey(7)
    for dtype in (jnp.float32, jnp.float64):
        for d, width in [(250, 256), (300, 320), (97, 112), (5, 5)]:
            bound = w_bound(d, dtype.dtype.name)  # the host's 1/sqrt d, as the sweep passes it

            @jax.jit
            def draws(k, dim, width=width, dtype=dtype, bound=bound):
                return (padded_draw(jr.normal, k, (6, 3), width, dim, dtype),
                        padded_draw(jr.normal, k, (), width, dim, dtype),
                        uniform_W(k, width, dtype, (dim, bound)))

            noise, p, W = map(np.asarray, draws(key, d))
            np.testing.assert_array_equal(noise[..., :d], jr.normal(key, (6, 3, d), dtype))
            np.testing.assert_array_equal(p[:d], jr.normal(key, (d,), dtype))
            np.testing.assert_array_equal(W[:d, :d], uniform_W(key, d, dtype))
            assert not noise[..., d:].any() and not p[d:].any()
            assert not W[d:].any() and not W[:, d:].any()
    # a different flat layout would not be the same draws: the check can fail
    wrong = np.asarray(jr.normal(key, (6, 3, 256)))[..., :250]
    assert not np.array_equal(wrong, np.asarray(jr.normal(key, (6, 3, 250))))


def test_padded_widths_are_a_few_per_octave():
    """Every d maps to the next of 2^k x (1, 1.25, 1.5, 1.75): at most 25 % wider, monotone, small
    d kept; the trained-W map's 39 values of d share 16 widths."""
    ds = np.arange(65, 20000)
    w = np.array([padded_width(int(d)) for d in ds])
    assert (w >= ds).all() and (w <= 1.25 * ds).all() and (np.diff(w) >= 0).all()
    k = 2.0 ** np.floor(np.log2(w))
    assert np.isin(w / k, [1.0, 1.25, 1.5, 1.75]).all()
    assert [padded_width(d) for d in (1, 5, 64)] == [1, 5, 64]
    assert padded_width(50000) == 50000  # its square would overflow the int32 flat index
    # a draw of rows x width past 2^31 would wrap the int32 flat index: such d stay unpadded
    assert padded_width(3000, rows=10**6) == 3000 and padded_width(3000, rows=10**5) == 3072
    assert len({padded_width(d) for d in range(250, 5001, 125)}) == 16


def test_padded_draw_refuses_an_overflowing_flat_index():
    """rows x width >= 2^31 would wrap the int32 gather index into silently wrong draws; it is
    refused at trace time, before anything is drawn."""
    with pytest.raises(ValueError, match="int32"):
        padded_draw(jr.normal, jr.PRNGKey(0), (2**20, 64), 40000, 30000, jnp.float32)


def test_materialised_is_the_same_array_bit_for_bit(x64):
    """The test set's normals are materialised once (a scatter XLA does not fuse into the records'
    evaluation) and keep every value: jitted, vmapped, in both precisions."""
    key = jr.PRNGKey(3)
    for dtype in (jnp.float32, jnp.float64):
        # sizes a multiple of its 8 rows, not one (padded), and under 8 entries
        for shape in ((5, 1000, 8, 2), (5, 13, 3), (5, 3)):
            z = jr.normal(key, shape, dtype)
            fn = jax.jit(jax.vmap(materialised))
            got = fn(z)
            assert got.dtype == z.dtype and got.shape == z.shape
            np.testing.assert_array_equal(np.asarray(got), np.asarray(z))
            # the scatter survives XLA's simplification: it is what keeps the draw out of the
            # consumers' fusions
            assert "scatter" in fn.lower(z).compile().as_text()
