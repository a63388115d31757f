"""The exact fast engines (phasebo.engines): gram == direct on the same data, reduced ~ direct in
distribution, the Wishart sampler, the large projected test set, and no d-sized dimension.

Statistical tests use fixed seeds (root_seed 0), so they are deterministic; the default suite runs
reduced-size versions (fewer steps / test samples), the paper-size ones are marked ``slow``.
"""

import re

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from scipy import stats

import phasebo
from phasebo import data
from phasebo.data import (
    projected_scores,
    projection_normals,
    sakamoto_reduced_sample,
    sakamoto_sample,
    token_roles,
)
from phasebo.engines.span import SpanProblem, SpanWProblem, flat_gram, span_system, span_w_system
from phasebo.engines.wishart import bartlett_factor, factor_width
from phasebo.models.prompt_attention import sakamoto_head
from phasebo.registry import MODELS, resolve_engine
from phasebo.settings import ConfigError
from phasebo.sweep import prepare_one, run_one, run_sweep
from phasebo.train import run_loop


def _compare_outputs(a, b, rtol, atol):
    assert set(a.final) == set(b.final)
    assert set(a.dynamics) == set(b.dynamics)
    assert set(a.samples) == set(b.samples)
    for k in a.final:
        np.testing.assert_allclose(np.asarray(b.final[k]), np.asarray(a.final[k]), rtol=rtol,
                                   atol=atol, err_msg=f"final {k}")
    for k in a.dynamics:
        np.testing.assert_allclose(np.asarray(b.dynamics[k]), np.asarray(a.dynamics[k]),
                                   rtol=rtol, atol=atol, err_msg=f"dynamics {k}")
    for k in a.samples:
        np.testing.assert_allclose(np.asarray(b.samples[k]), np.asarray(a.samples[k]),
                                   rtol=rtol, atol=atol, err_msg=f"samples {k}")


# --------------------------------------------------------------------------------------------
# gram == direct on identical data
# --------------------------------------------------------------------------------------------

PROMPT_VARIANTS = {
    # W = I, zero init, dynamics recorded at steps 0, 15, 30, 45, 60
    "identity": {"record_every": 15},
    # a fixed random W, a Gaussian init and a d-dimensional (sampled) test set
    "random_W": {"W_init": "random", "init": "gaussian", "init_scale": 0.1,
                 "test_mode": "sampled"},
}


@pytest.mark.parametrize("variant", list(PROMPT_VARIANTS))
def test_gram_reproduces_direct_prompt_attention(x64, variant):
    s = dict(d=300, signal_norm=20.0, dtype="float64", steps=60, n_test=200,
             **PROMPT_VARIANTS[variant])
    direct = run_one(s, engine="direct", seed=5)
    gram = run_one(s, engine="gram", seed=5)
    if variant == "identity":  # logits and attention of the tracked samples at several steps
        assert np.asarray(direct.dynamics["logit_clean_t0"]).shape == (5,)
    _compare_outputs(direct, gram, rtol=1e-9, atol=1e-10)
    assert float(gram.final["p_norm"]) > 0


def test_gram_reproduces_direct_single_head(x64):
    s = dict(model="single_head", n=16, T=3, d=200, signal_norm=8.0, label_mode="iid",
             label_noise="bernoulli", noise_ratio=0.1, lr=0.05, dtype="float64", steps=40,
             n_test=200, init="gaussian", init_scale=0.05, weight_decay=0.05,
             noise_mode="isotropic", signal_noise=True)
    direct = run_one(s, engine="direct", seed=2)
    gram = run_one(s, engine="gram", seed=2)
    _compare_outputs(direct, gram, rtol=1e-9, atol=1e-10)


def test_gram_w_and_p_engine_equals_direct(x64):
    """The exact W+p span engine (prompt attention with W and p trained, W uniform at step 0) on
    the direct engine's data: every final metric, the dynamics and the per-sample first-fit steps
    in float64; and with W_0 = I and weight decay."""
    s = dict(d=120, signal_norm=8.0, dtype="float64", steps=50, lr=0.5, n_test=200,
             record_every=10, train=["p", "W"])
    for extra in ({}, {"W_init": "identity", "weight_decay": 0.02, "test_mode": "sampled"}):
        direct = run_one({**s, **extra}, engine="direct", seed=1)
        gram = run_one({**s, **extra}, engine="gram", seed=1)
        _compare_outputs(direct, gram, rtol=1e-9, atol=1e-10)
        assert float(gram.final["q_norm"]) > 0 and float(direct.final["train_loss"]) < 0.69
    assert resolve_engine(MODELS["prompt_attention"],
                          MODELS["prompt_attention"].static_of(
                              {**s, "train": ("p", "W"), "engine": "auto"})).name == "gram"


def test_gram_w_and_p_engine_diverges_at_the_direct_engines_step(x64):
    """A W + p run whose update overflows diverges at the same step on both engines."""
    s = dict(d=120, signal_norm=1000.0, dtype="float64", steps=6, lr=1e307, n_test=50,
             train=["p", "W"])
    direct = run_one(s, engine="direct", seed=1)
    gram = run_one(s, engine="gram", seed=1)
    assert int(direct.final["diverge_step"]) == int(gram.final["diverge_step"]) == 1
    assert int(gram.final["status"]) == int(direct.final["status"]) == 1


def test_w_and_p_span_state_is_checked_by_the_next_forward_pass(x64):
    """The W + p span system reads Gamma's finiteness from Gamma u (not a pass over Gamma), and
    run_loop records a non-finite update at the step that made it: at step 2 inside the loop, at
    the last step through ``final``."""
    n, T = 3, 4
    N = n * T
    B = jr.normal(jr.PRNGKey(0), (N, 7), jnp.float64)
    y = jnp.asarray([1.0, -1.0, 1.0])
    prob = SpanWProblem(None, None, B @ B.T, B @ B.T, jnp.ones((n, T)), None)
    state0, step, final, _, _ = span_w_system(prob, y, 0.1)
    alpha = jnp.linspace(-1.0, 1.0, N)
    for bad, ok in ((jnp.inf, False), (jnp.nan, False), (1.0, True)):
        state = state0._replace(alpha=alpha, Gamma=jnp.zeros((N, N)).at[3, 5].set(bad))
        assert bool(step(state)[3][0]) is ok and bool(final(state)[3]) is ok

    def toy(steps_bad):  # the update of step `steps_bad` is non-finite, seen one step later
        def tstep(state):
            k, x = state
            return state, (k + 1, jnp.where(k == steps_bad, jnp.inf, x)), fwd, \
                (jnp.isfinite(x), jnp.asarray(True))

        def tfinal(state):
            return state, fwd, jnp.asarray(0.5), jnp.isfinite(state[1])

        batch = data.Batch(None, None, y, y, jnp.zeros(n, bool))
        fwd = (jnp.ones(n), jnp.ones((n, T)) / T, jnp.zeros((n, T)))
        _, _, ls = run_loop((jnp.asarray(0), jnp.asarray(1.0)), tstep, tfinal, 5, (), None,
                            margin_fn=lambda f, y_: f * y_, batch=batch, relevant=None,
                            dtype=jnp.float64)
        return int(ls.diverge)

    assert toy(2) == 2 and toy(4) == 4 and toy(9) == -1


@pytest.mark.parametrize("wd", [None, 0.3])
def test_w_and_p_pending_updates_are_the_same_steps(x64, wd):
    """Gamma's rank-one updates kept as factors for 8 steps and added at once give the step-by-step
    trajectory (one update a step) to rounding in float64, with and without weight decay, at
    every step (a flush at steps 8 and 16, factors pending at the others)."""
    n, T = 3, 4
    N = n * T
    B = jr.normal(jr.PRNGKey(1), (N, 7), jnp.float64)
    C = jr.normal(jr.PRNGKey(2), (N, 9), jnp.float64)
    y = jnp.asarray([1.0, -1.0, 1.0])
    prob = SpanWProblem(None, None, B @ B.T, C @ C.T, jr.normal(jr.PRNGKey(3), (n, T)), None)
    runs = [span_w_system(prob, y, 0.5, wd, pending=k) for k in (1, 8)]
    states = [r[0] for r in runs]
    for t in range(20):
        outs = [r[1](st) for r, st in zip(runs, states)]
        states = [o[1] for o in outs]
        states = [r[4][1](st) if int(st.j) == r[4][0] else st for r, st in zip(runs, states)]
        f1, f8 = outs[0][2][0], outs[1][2][0]
        assert float(jnp.max(jnp.abs(f1 - f8))) < 1e-12, t
        gammas = [st.s * st.Gamma + st.Cb.T @ st.Ab for st in states]
        assert float(jnp.max(jnp.abs(gammas[0] - gammas[1]))) < 1e-12, t
        assert float(jnp.max(jnp.abs(states[0].alpha - states[1].alpha))) < 1e-12, t
    assert int(states[1].j) == 20 % 8 and int(states[0].j) == 0
    assert float(jnp.max(jnp.abs(gammas[0]))) > 1e-3  # the updates did something


@pytest.mark.parametrize("rule", ["weight_decay", pytest.param("project", marks=pytest.mark.slow)])
def test_learning_rules_of_prompt_attention_on_every_engine(x64, rule):
    """weight_decay and project change prompt attention's run exactly as on the direct engine:
    gram reproduces direct to 1e-9 on the same data; reduced (another draw of the same law) moves
    the same way: a smaller ||p|| than plain GD, and within the ball."""
    base = dict(d=200, signal_norm=10.0, dtype="float64", steps=60, lr=0.5, n_test=300,
                record_every=20)
    extra = {"weight_decay": 0.05} if rule == "weight_decay" else \
        {"project": True, "radius_p": 0.3}
    plain = run_one(base, engine="direct", seed=3)
    direct = run_one({**base, **extra}, engine="direct", seed=3)
    gram = run_one({**base, **extra}, engine="gram", seed=3)
    _compare_outputs(direct, gram, rtol=1e-9, atol=1e-10)
    assert float(direct.final["p_norm"]) < 0.9 * float(plain.final["p_norm"])
    reduced = run_one({**base, **extra}, engine="reduced", seed=3)
    plain_r = run_one(base, engine="reduced", seed=3)
    assert float(reduced.final["p_norm"]) < 0.9 * float(plain_r.final["p_norm"])
    if rule == "project":
        for o in (direct, gram, reduced):
            assert np.all(np.asarray(o.dynamics["p_norm"]) <= 0.3 * (1 + 1e-9))
            assert float(o.final["p_norm"]) == pytest.approx(0.3, rel=1e-9)  # the ball is active


@pytest.mark.slow
def test_projected_single_head_on_the_span_engines(x64):
    s = dict(model="single_head", n=16, d=150, signal_norm=6.0, noise_ratio=0.1, lr=1.0,
             dtype="float64", steps=40, n_test=200, record_every=10, project=True,
             radius_v=2.0, radius_p=0.7, init="gaussian", init_scale=0.05)
    direct = run_one(s, engine="direct", seed=4)
    gram = run_one(s, engine="gram", seed=4)
    _compare_outputs(direct, gram, rtol=1e-9, atol=1e-10)
    reduced = run_one(s, engine="reduced", seed=4)
    for o in (gram, reduced):
        assert np.all(np.asarray(o.dynamics["v_norm"]) <= 2.0 * (1 + 1e-9))
        assert np.all(np.asarray(o.dynamics["p_norm"]) <= 0.7 * (1 + 1e-9))


# --------------------------------------------------------------------------------------------
# The Wishart sampler
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N,k", [(6, 40), (6, 6), (6, 3)])
def test_bartlett_factor_has_wishart_moments(N, k):
    M = 20000
    keys = jr.split(jr.PRNGKey(3), M)
    L = jax.jit(jax.vmap(lambda kk: bartlett_factor(kk, N, k)))(keys)
    assert L.shape == (M, N, factor_width(N, k))
    G = np.asarray(L @ jnp.swapaxes(L, 1, 2), np.float64)
    mean = G.mean(0)
    var = G.var(0)
    se_mean = np.sqrt(var / M)
    # mean k I: within 4 standard errors entrywise
    assert np.all(np.abs(mean - k * np.eye(N)) < 4 * se_mean + 1e-6), mean
    # Var G_ii = 2k, Var G_ij = k (i != j); the sample variance has relative SE ~ sqrt(2 / M)
    # times a kurtosis factor, so 6 % is about 4 SE here
    expect = np.where(np.eye(N, dtype=bool), 2.0 * k, float(k))
    np.testing.assert_allclose(var, expect, rtol=0.06)


def test_bartlett_factor_with_traced_k_is_the_same_draw():
    key = jr.PRNGKey(0)
    a, b = jax.jit(lambda k: (bartlett_factor(key, 10, 500),
                              bartlett_factor(key, 10, 500, k_traced=k)))(jnp.int32(500))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    assert np.all(np.triu(np.asarray(a), 1) == 0)


# --------------------------------------------------------------------------------------------
# reduced ~ direct in distribution
# --------------------------------------------------------------------------------------------


def _sweep_finals(settings, engine, seeds, out, metrics):
    spec = phasebo.spec_from_dict({**settings, "engine": engine}, seeds=seeds,
                                  name=f"dist_{engine}")
    df = run_sweep(spec, out / engine, quiet=True, plots=False)
    assert set(df["engine"]) == {engine}
    return {m: df[m].to_numpy(np.float64) for m in metrics}


def _assert_same_distribution(x, y, name):
    n1, n2 = len(x), len(y)
    se = np.sqrt(x.var(ddof=1) / n1 + y.var(ddof=1) / n2)
    diff = abs(x.mean() - y.mean())
    assert diff <= 3 * se + 1e-12, f"{name}: means {x.mean():.4f} vs {y.mean():.4f}, 3 SE = {3 * se:.4f}"
    if np.ptp(np.concatenate([x, y])) > 0:
        p = stats.ks_2samp(x, y, method="asymp").pvalue  # n = 200 + 200: asymptotic
        assert p > 0.01, f"{name}: KS p = {p:.2g}"


S2_SETTINGS = {  # Sakamoto & Sato's Figs. 3-5: harmful, benign, not overfitting
    "harmful": {"d": 5000, "signal_norm": 5.0},
    "benign": {"d": 2000, "signal_norm": 20.0},
    "not_overfitting": {"d": 1000, "signal_norm": 100.0},
}
METRICS = ("train_acc", "test_acc", "test_loss")
# The default suite's reduced size (200 seeds): 300 steps, where the benign setting's flipped
# labels are being fitted (train accuracy 0.8 -> 1 by ~300), and continuous metrics only, each
# asserted to vary across seeds, so that no comparison is between two constants.
SHORT = {"steps": 300, "n_test": 400}
SHORT_METRICS = ("train_loss", "test_loss", "margin", "train_acc_noisy")


@pytest.fixture(scope="module")
def s2_short(tmp_path_factory):
    from conftest import xla_optimised

    out = {}
    with xla_optimised():  # large direct runs: running, not compiling, is the cost here
        for name, s in S2_SETTINGS.items():
            tmp = tmp_path_factory.mktemp(name)
            out[name] = tuple(_sweep_finals({**s, **SHORT}, e, 200, tmp, SHORT_METRICS)
                              for e in ("direct", "reduced"))
    return out


@pytest.mark.parametrize("setting", list(S2_SETTINGS))
def test_reduced_matches_direct_distribution_short(setting, s2_short):
    a, b = s2_short[setting]
    for m in SHORT_METRICS:
        assert np.ptp(a[m]) > 0 and np.ptp(b[m]) > 0, f"{setting} {m} is constant"
        _assert_same_distribution(a[m], b[m], f"{setting} {m}")


def test_distribution_check_detects_a_wrong_wishart(s2_short, tmp_path, monkeypatch):
    # mutation: the reduced engine with Wishart(d/2 - 2) noise must be rejected by the same check
    real = data.bartlett_factor

    def wrong(key, N, k, dtype, z=None, k_traced=None):  # half the chi-square degrees of freedom
        return real(key, N, k, dtype, z=z, k_traced=None if k_traced is None else k_traced // 2)

    monkeypatch.setattr(data, "bartlett_factor", wrong)
    # n_test 401: a new static group, so the mutated engine is compiled afresh
    b = _sweep_finals({**S2_SETTINGS["benign"], **SHORT, "n_test": 401}, "reduced", 200,
                      tmp_path, SHORT_METRICS)
    a = s2_short["benign"][0]
    with pytest.raises(AssertionError):
        for m in SHORT_METRICS:
            _assert_same_distribution(a[m], b[m], m)


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(S2_SETTINGS))
def test_reduced_matches_direct_distribution_paper_size(setting, tmp_path):
    s = {**S2_SETTINGS[setting], "steps": 1000, "n_test": 1000}
    a = _sweep_finals(s, "direct", 200, tmp_path, METRICS)
    b = _sweep_finals(s, "reduced", 200, tmp_path, METRICS)
    for m in METRICS:
        _assert_same_distribution(a[m], b[m], f"{setting} {m}")


SINGLE_HEAD = {"model": "single_head", "n": 40, "T": 2, "d": 1000, "signal_norm": 5.0,
               "label_mode": "iid", "label_noise": "bernoulli", "noise_ratio": 0.1, "lr": 0.05,
               "steps": 20, "n_test": 300}


@pytest.mark.slow
def test_reduced_matches_direct_distribution_single_head(tmp_path):
    metrics = ("train_acc", "test_acc", "test_loss", "v_norm")
    a = _sweep_finals(SINGLE_HEAD, "direct", 200, tmp_path, metrics)
    b = _sweep_finals(SINGLE_HEAD, "reduced", 200, tmp_path, metrics)
    for m in metrics:
        _assert_same_distribution(a[m], b[m], f"single_head {m}")


# --------------------------------------------------------------------------------------------
# The projected test set at n_test = 1e5 against a direct d-dimensional test set
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_reduced_projected_test_accuracy_matches_a_direct_test_set():
    # a harmful setting (n SNR^2 = 0.1), where test accuracy is far from 1: a trained reduced run,
    # its query embedded in R^d (e1, e2, then the factor's coordinates), scored on 20000 sampled
    # d-dimensional test sequences vs the engine's exact projections at n_test = 1e5
    n, T, d, steps, mu = 20, 8, 2000, 300, np.sqrt(0.1 * 2000 / 20)
    roles = token_roles(T, 1, 1, 1)
    sw = {"signal_norm": jnp.float32(mu), "rho": jnp.float32(0.1), "sigma_eps": jnp.float32(1.0),
          "noise_ratio": jnp.float32(0.2), "n_flip_per_class": jnp.int32(2), "dim": jnp.int32(d)}
    key = jr.PRNGKey(7)
    k_data, k_test, k_big = jr.split(key, 3)
    b = sakamoto_reduced_sample(k_data, n, d, roles, sw, label_mode="balanced",
                                label_noise="fraction", dtype=jnp.float32)
    D = b.X.shape[-1]
    nu = sakamoto_head(D, sw["signal_norm"], jnp.float32)
    zero = jnp.zeros((), jnp.float32)
    prob = SpanProblem(b, None, flat_gram(b.X), jnp.zeros((n, T)), b.X @ nu, None, zero, zero,
                       None)
    state, step, final, _ = span_system(prob, b.y, jnp.float32(5e-3))
    state = jax.lax.fori_loop(0, steps, lambda i, st: step(st)[1], state)
    coef, (f, _, _), _ = final(state)
    assert float(jnp.mean(b.y * f > 0)) == 1.0  # it interpolates
    q = b.X.reshape(n * T, D).T @ coef.alpha.reshape(-1)  # reduced coordinates
    test = sakamoto_sample(k_test, 100_000, None, roles, sw, label_mode="balanced",
                           label_noise=None, dtype=jnp.float32)
    lg, hd = projected_scores(projection_normals(k_test, (100_000, T), jnp.float32), test.signal, q,
                              nu, sw["sigma_eps"])
    f = jnp.sum(jax.nn.softmax(lg, -1) * hd, -1)
    acc_proj = float(jnp.mean(test.y_clean * f > 0))

    q_d = jnp.zeros(d).at[: D - 1].set(q[: D - 1])  # the last reduced coordinate is 0 (zero init)
    nu_d = sakamoto_head(d, sw["signal_norm"], jnp.float32)
    score = jax.jit(lambda k: jnp.sum(_big_correct(k, q_d, nu_d, roles, sw, d)))
    m_big, chunks = 5000, 4
    correct = sum(int(score(jr.fold_in(k_big, i))) for i in range(chunks))
    acc_direct = correct / (m_big * chunks)
    assert 0.6 < acc_direct < 0.97, acc_direct  # harmful: the comparison is informative
    se = np.sqrt(acc_direct * (1 - acc_direct) * (1 / (m_big * chunks) + 1 / 100_000))
    assert abs(acc_proj - acc_direct) < 4 * se, (acc_proj, acc_direct, se)


def _big_correct(key, q, nu, roles, sw, d, m=5000):
    big = sakamoto_sample(key, m, d, roles, sw, label_mode="balanced", label_noise=None,
                          dtype=jnp.float32)
    f = jnp.sum(jax.nn.softmax(big.X @ q, -1) * (big.X @ nu), -1)
    return big.y_clean * f > 0


# --------------------------------------------------------------------------------------------
# Cost independent of d: no dimension of size d in the compiled computation
# --------------------------------------------------------------------------------------------


def _tensor_dims(text: str) -> set[int]:
    dims = set()
    for shape in re.findall(r"tensor<([0-9x?]+)x[a-z]", text):
        dims.update(int(v) for v in shape.split("x") if v.isdigit())
    return dims


@pytest.mark.parametrize("model", ["prompt_attention", "single_head"])
def test_reduced_engine_has_no_dimension_of_size_d(model):
    d = 1237  # no other size of the run is 1237 or 1235 (d - 2)
    s = dict(model=model, d=d, steps=5, record_every=2, n_test=300, init="gaussian")
    if model == "single_head":
        s.update(T=2, n=16)

    def dims_for(engine):
        m, eng, program, sw, key = prepare_one({**s, "engine": engine})
        text = jax.jit(lambda sw_, k_: eng.run(m, program, sw_, k_)).lower(sw, key).as_text()
        return _tensor_dims(text)

    reduced = dims_for("reduced")
    assert d not in reduced and d - 2 not in reduced, sorted(reduced)
    # the check sees d where it is there (prompt attention's gram program pads it to 1280)
    assert prepare_one({**s, "engine": "gram"})[2].d in dims_for("gram")


@pytest.mark.parametrize("model", ["prompt_attention", "single_head"])
def test_reduced_program_is_the_same_for_every_d(model):
    """d enters the reduced engines only as a traced value: one program for all large d."""
    texts = []
    for d in (1000, 4875):
        s = dict(model=model, d=d, steps=5, engine="reduced", init="gaussian", n_test=100)
        m, eng, program, sw, key = prepare_one(s)
        texts.append(jax.jit(lambda sw_, k_, m=m, eng=eng, p=program: eng.run(m, p, sw_, k_))
                     .lower(sw, key).as_text())
    assert texts[0] == texts[1]


# --------------------------------------------------------------------------------------------
# auto, errors, and the same tables
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings,expected", [
    ({}, "reduced"),
    ({"W_init": "random"}, "gram"),
    ({"test_mode": "sampled"}, "gram"),
    ({"train": ("p", "W")}, "gram"),
    ({"train": ("p", "W"), "init": "gaussian"}, "direct"),
    ({"model": "single_head"}, "reduced"),
    ({"model": "single_head", "test_mode": "sampled"}, "gram"),
    ({"model": "single_head", "project": True}, "reduced"),
    ({"model": "self_attention"}, "direct"),
])
def test_auto_picks_the_fastest_exact_engine(settings, expected):
    model = MODELS[settings.get("model", "prompt_attention")]
    assert resolve_engine(model, model.static_of(settings)).name == expected


@pytest.mark.parametrize("settings,engine,words", [
    ({"train": ["p", "W"]}, "reduced", "W is trained"),
    ({"train": ["p", "W"], "init": "gaussian"}, "gram", "Gaussian p_0"),
    ({"W_init": "random"}, "reduced", "random W"),
    ({"test_mode": "sampled"}, "reduced", "sampled"),
    ({"model": "self_attention"}, "gram", "does not run model"),
])
def test_unsupported_settings_are_a_clear_config_error(settings, engine, words):
    with pytest.raises(ConfigError, match=words):
        phasebo.spec_from_dict({**settings, "engine": engine, "d": 100})


def test_engines_write_the_same_tables(tmp_path):
    s = {"d": 300, "steps": 10, "record_every": 5, "n_test": 100}
    frames = {}
    for engine in ("direct", "auto"):
        spec = phasebo.spec_from_dict({**s, "engine": engine}, seeds=3, name=f"t_{engine}")
        df = run_sweep(spec, tmp_path / engine, quiet=True, plots=False)
        dyn = phasebo.load_dynamics(tmp_path / engine)
        smp = phasebo.load_samples(tmp_path / engine)
        frames[engine] = (df, dyn, smp)
        assert df["status"].eq("ok").all()
    assert set(frames["auto"][0]["engine"]) == {"reduced"}  # the engine that ran
    assert set(frames["auto"][0]["engine_setting"]) == {"auto"}
    for i in range(3):
        assert list(frames["auto"][i].columns) == list(frames["direct"][i].columns)
        assert len(frames["auto"][i]) == len(frames["direct"][i])
    # reduced runs draw the same labels and flips as direct runs, not the same noise
    np.testing.assert_array_equal(frames["auto"][2]["flipped"], frames["direct"][2]["flipped"])
