"""The new models against plain-NumPy references (forward pass and gradient), and their wiring.

Forward passes are recomputed in float64 NumPy from the equations in the module docstrings
(computed the textbook way: all queries, keys and values, no shortcuts); gradients are checked
against hand-derived NumPy formulas (single_head, self_attention) and against central finite
differences of the NumPy forward pass (every model).
"""

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from scipy.special import erf

import phasebo
from phasebo.models.encoder import Encoder
from phasebo.models.self_attention import MultiLayer, SelfAttention
from phasebo.models.single_head import SingleHead
from phasebo.registry import MODELS, all_settings
from phasebo.sweep import run_one

N, T, D = 6, 3, 5


def rng(seed):
    """A fresh generator for each draw: what a test draws does not depend on which tests ran
    before it in the worker (a module-level generator made the data depend on the order)."""
    return np.random.default_rng(seed)


def softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_loss(f, y):
    return np.mean(np.log1p(np.exp(-y * f)))


def np_single_head(P, X):
    s = softmax(X @ P["p"])
    return (s * (X @ P["v"])).sum(-1)


def np_self_attention(P, X):
    q = X[:, 0, :] @ P["W"].T  # q_i = W x_i1
    s = softmax(np.einsum("ntd,nd->nt", X, q))
    return (s * (X @ P["v"])).sum(-1)


def np_multi_layer(P, X, residual=True):
    H = X
    for W in P["Ws"][:-1]:
        out = np.zeros_like(H)
        for i in range(H.shape[0]):
            A = softmax(H[i] @ W @ H[i].T)  # rows: queries
            out[i] = A @ H[i]
        H = H + out if residual else out
    return np_self_attention({"W": P["Ws"][-1], "v": P["v"]}, H)


def np_ln(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def np_encoder(P, X, residual=True):
    n, _, d = X.shape
    H = np.concatenate([np.broadcast_to(P["cls_token"], (n, 1, d)), X], axis=1)
    L = np_ln(H, P["ln1_g"], P["ln1_b"])
    Q, K, V = L @ P["Wq"], L @ P["Wk"], L @ P["Wv"]
    att = softmax(np.einsum("ntd,nud->ntu", Q, K) / np.sqrt(d))  # every query, keep CLS
    o = np.einsum("ntu,nud->ntd", att, V)[:, 0]
    h = H[:, 0] + o if residual else o
    z = np_ln(h, P["ln2_g"], P["ln2_b"]) @ P["W1"] + P["b1"]
    m = 0.5 * z * (1 + erf(z / np.sqrt(2))) @ P["W2"] + P["b2"]
    h = h + m if residual else m
    return np_ln(h, P["lnf_g"], P["lnf_b"]) @ P["head_w"] + P["head_b"]


def _params(model):
    """eqx module -> dict of float64 NumPy leaves (tuples kept as lists)."""
    out = {}
    for k in model.__dataclass_fields__:
        v = getattr(model, k)
        if isinstance(v, tuple):
            out[k] = [np.asarray(x, np.float64) for x in v]
        elif isinstance(v, jax.Array):
            out[k] = np.asarray(v, np.float64)
    return out


def _data(seed=1):
    g = rng(seed)
    X = g.normal(size=(N, T, D))
    y = np.where(g.random(N) < 0.5, 1.0, -1.0)
    return X, y


def _models(seed=0):
    """The models with their parameters, the same on every call."""
    g = rng(seed)
    r = lambda *s: jnp.asarray(g.normal(size=s) * 0.7, jnp.float32)  # noqa: E731
    w = 7
    enc_p = dict(
        cls_token=r(D), Wq=r(D, D), Wk=r(D, D), Wv=r(D, D), ln1_g=1 + r(D), ln1_b=r(D),
        ln2_g=1 + r(D), ln2_b=r(D), lnf_g=1 + r(D), lnf_b=r(D), W1=r(D, w), b1=r(w),
        W2=r(w, D), b2=r(D), head_w=r(D), head_b=r(),
    )
    enc = Encoder(**enc_p)
    return [
        ("single_head", SingleHead(p=r(D), v=r(D)), np_single_head),
        ("self_attention", SelfAttention(W=r(D, D), v=r(D)), np_self_attention),
        ("multi_layer", MultiLayer(Ws=(r(D, D), r(D, D), r(D, D)), v=r(D)), np_multi_layer),
        ("multi_layer_nores", MultiLayer(Ws=(r(D, D), r(D, D)), v=r(D), residual=False),
         lambda P, X: np_multi_layer(P, X, residual=False)),
        ("encoder", enc, np_encoder),
        ("encoder_nores", Encoder(**enc_p, residual=False),
         lambda P, X: np_encoder(P, X, residual=False)),
    ]


@pytest.mark.parametrize("name,model,ref", _models(), ids=[m[0] for m in _models()])
def test_forward_and_gradient_match_numpy(name, model, ref):
    X, y = _data()
    directions = rng(2)
    f = np.asarray(model(jnp.asarray(X, jnp.float32))[0], np.float64)
    P = _params(model)
    np.testing.assert_allclose(f, ref(P, X), rtol=2e-4, atol=2e-4)

    def loss(m):
        return jnp.mean(jax.nn.softplus(-jnp.asarray(y, jnp.float32) * m(jnp.asarray(X,
                                                                              jnp.float32))[0]))

    g = eqx.filter_jit(jax.grad(loss))(model)
    gP = _params(g)
    flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])  # noqa: E731
    gvec = flat(gP)
    eps = 1e-6
    for _ in range(3):  # directional derivatives by central differences of the NumPy forward
        Dir = jax.tree.map(lambda a: directions.normal(size=np.shape(a)), P)
        plus = jax.tree.map(lambda a, b: a + eps * b, P, Dir)
        minus = jax.tree.map(lambda a, b: a - eps * b, P, Dir)
        fd = (np_loss(ref(plus, X), y) - np_loss(ref(minus, X), y)) / (2 * eps)
        np.testing.assert_allclose(gvec @ flat(Dir), fd, rtol=2e-3, atol=2e-4 * np.abs(gvec).sum())


def test_single_head_and_self_attention_gradients_closed_form():
    """Hand-derived: dL/df_i = -y_i sigmoid(-y_i f_i)/n; df/dv = X^T s;
    df/dq = sum_t s_t (h_t - f) x_t; p = q for single_head, dL/dW = sum_i (dL/dq_i) x_i1^T."""
    X, y = _data()
    for name, model, _ in _models()[:2]:
        P = _params(model)
        q = P["p"][None, :].repeat(N, 0) if name == "single_head" else X[:, 0, :] @ P["W"].T
        s = softmax(np.einsum("ntd,nd->nt", X, q))
        h = X @ P["v"]
        f = (s * h).sum(-1)
        gf = -y / (1 + np.exp(y * f)) / N
        gv = np.einsum("n,nt,ntd->d", gf, s, X)
        gq = np.einsum("n,nt,ntd->nd", gf, s * (h - f[:, None]), X)
        g = _params(jax.grad(lambda m: jnp.mean(jax.nn.softplus(
            -jnp.asarray(y, jnp.float32) * m(jnp.asarray(X, jnp.float32))[0])))(model))
        np.testing.assert_allclose(g["v"], gv, rtol=1e-4, atol=1e-6)
        if name == "single_head":
            np.testing.assert_allclose(g["p"], gq.sum(0), rtol=1e-4, atol=1e-6)
        else:
            np.testing.assert_allclose(g["W"], gq.T @ X[:, 0, :], rtol=1e-4, atol=1e-6)


def test_self_attention_fast_query_path_is_exact():
    """W[:, :2] c equals W x_1 when the first token lies in span(e1, e2)."""
    X, _ = _data()
    X[:, 0, 2:] = 0.0
    m = _models()[1][1]
    Xj = jnp.asarray(X, jnp.float32)
    full = m(Xj)[0]
    fast = m(Xj, Xj[:, 0, :2])[0]
    np.testing.assert_allclose(full, fast, rtol=1e-5, atol=1e-6)


def test_one_layer_multi_layer_is_self_attention():
    """Same forward pass, and the same Gaussian initialisation from the same key."""
    X, _ = _data()
    m = _models()[1][1]
    Xj = jnp.asarray(X, jnp.float32)
    ml = MultiLayer(Ws=(m.W,), v=m.v)
    for a, b in zip(m(Xj), ml(Xj)[:2]):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    sa, ml = MODELS["self_attention"], MODELS["multi_layer"]
    sw = {"init_scale": jnp.asarray(0.1)}
    key = jax.random.PRNGKey(3)
    a = sa.init(sa.static_of({"d": D, "init": "gaussian"}), sw, key, None)[0]
    b = ml.init(ml.static_of({"d": D, "init": "gaussian", "n_layers": 1}), sw, key, None)[0]
    np.testing.assert_array_equal(a.W, b.Ws[0])
    np.testing.assert_array_equal(a.v, b.v)


def test_settings_and_checks():
    for m in ("single_head", "self_attention", "multi_layer", "encoder", "constructed_query"):
        assert m in phasebo.MODELS
    for k in ("weight_decay", "project", "radius_v", "radius_p", "query_lambda", "n_layers",
              "residual", "mlp_width", "noise_mode", "signal_noise"):
        assert k in all_settings()
    for model in ("multi_layer", "encoder", "constructed_query"):  # their test sets are sampled
        with pytest.raises(phasebo.ConfigError, match="test_mode = 'sampled' is not a setting"):
            phasebo.spec_from_dict({"model": model, "test_mode": "sampled"})
    with pytest.raises(phasebo.ConfigError, match="noise_mode = 'projected' is not a setting of "
                                                  "model 'prompt_attention'"):
        phasebo.spec_from_dict({"model": "prompt_attention", "noise_mode": "projected"})
    with pytest.raises(phasebo.ConfigError, match="T = 1"):
        phasebo.spec_from_dict({"model": "single_head", "T": 1})


SWEEP_DIR = Path(__file__).parent.parent / "sweeps"
SMALL = {"d": 64, "n": 20, "n_test": 50, "steps": 3}


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(SWEEP_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_sweep_files_run_small(path, tmp_path):
    """Each sweep file through the CLI at toy sizes (one seed, d 64, 3 steps)."""
    from phasebo.cli.sweep import main
    from phasebo.config import load_sweep

    spec = load_sweep(path)
    models = set(spec.values("model")) or {"prompt_attention"}
    small = dict(SMALL)
    if "encoder" in models:
        small["mlp_width"] = 16
    names = set().union(*(MODELS[m].settings for m in models))
    keep = {(spec.refine or {}).get(a) for a in ("x", "y")}  # the axes a refinement needs
    if "constructed_query" in models or spec.values("epochs") or \
            set(spec.values("dynamics")) - {"gd"}:  # no steps, or the length set otherwise
        keep.add("steps")
    args = [str(path), "--out", str(tmp_path / "o"), "--seeds", "1", "--quiet", "--no-plots"]
    for k, v in small.items():
        if k in names and k not in keep:
            args += ["--set", f"{k}={v}"]
    assert main(args) == 0
    df = pd.read_parquet(tmp_path / "o" / "results.parquet")
    assert (df.status == "ok").all() and df.test_acc.notna().all()


def test_encoder_trains_and_reports_attention():
    o = run_one(dict(model="encoder", d=16, n=12, T=4, signal_norm=6.0, noise_ratio=0.2,
                     lr=5e-2, steps=4, n_test=20, mlp_width=8, record_every=4))
    f = {k: float(v) for k, v in o.final.items()}
    assert f["status"] == 0 and f["train_loss"] < float(o.dynamics["train_loss"][0])
    assert 0 < f["attn_cls"] < 1 and 0 < f["mass_noisy_weak_opp"] < 1
