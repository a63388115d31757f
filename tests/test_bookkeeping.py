"""An independent oracle for the training bookkeeping of a run.

A tiny prompt-attention sweep (float64, direct engine, dynamics at every step) is recomputed here
with a NumPy implementation of the model, ``f(X) = nu^T X^T softmax(X p)`` (W = I, p trained from
0 by full-batch GD on the mean logistic loss), on the run's own training set (drawn through the
model's ``sample`` with the run's key). From that trajectory the oracle derives, with the
conventions of :mod:`phasebo.train` (step t is the state after t updates, steps 0..steps; a
sample is fitted when y f > 0 strictly):

- each sample's first-fit step (-1: never), checked against the ``samples`` table;
- ``all_fit_step``, ``noisy_fit_step`` (the last first-fit step of the flipped samples if every
  one was fitted, -1 if one never was or there is none), ``mean_noisy_fit_step``,
  ``frac_noisy_fitted`` (NaN without flipped samples) and ``n_noisy``;
- ``cumS_<group>``: the sum of s_R (1 - s_R) over steps 0..steps-1 (the states a gradient was
  taken at; not the final state) and the samples of the group;
- the recorded dynamics at every step (loss, accuracies, margins, ss_<group>);
- and ``phasebo.aggregate``: a noise-free run's ``noisy_fit_step = -1`` is not a step.
"""

import numpy as np
import pandas as pd
import pytest

import phasebo as pb
from phasebo.config import spec_from_dict
from phasebo.metrics import GROUPS
from phasebo.sweep import prepare_one, run_sweep

N, D, STEPS, LR = 10, 40, 50, 0.5
SETTINGS = dict(model="prompt_attention", engine="direct", dtype="float64", n=N, d=D,
                steps=STEPS, lr=LR, n_test=100, record_every=1)
# noise-free and 2 flipped labels (one per class); at ||mu|| = 3 both flipped samples get fitted
# (at steps 17 and 30 in the two seeds), at ||mu|| = 10 one of them never is, and one is fitted
# only at the final state (step 50): every branch of the bookkeeping is exercised
AXES = {"noise_ratio": [0.0, 0.2], "signal_norm": [3.0, 10.0]}
SEEDS = 2


@pytest.fixture(autouse=True, scope="module")
def _x64(x64_module):  # every run here is float64
    yield


# --------------------------------------------------------------------------------------------
# The oracle (NumPy, float64)
# --------------------------------------------------------------------------------------------


def softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def forward(p, X, nu):
    """``(f, s)``: ``f_i = sum_t softmax(X_i p)_t (X_i nu)_t``."""
    s = softmax(X @ p)
    return (s * (X @ nu)).sum(-1), s


def loss(p, X, nu, y):
    f, _ = forward(p, X, nu)
    return np.mean(np.logaddexp(0.0, -y * f))


def grad(p, X, nu, y):
    """d/dp of the mean logistic loss: df_i/dp = sum_t s_it (h_it - f_i) x_it with h = X nu,
    dL/df_i = -y_i sigmoid(-y_i f_i) / n."""
    f, s = forward(p, X, nu)
    h = X @ nu
    df = np.einsum("nt,ntd->nd", s * (h - f[:, None]), X)
    dl = -y / (1.0 + np.exp(y * f)) / len(y)
    return dl @ df


def oracle(X, y, y_clean, flipped, signal_norm, steps=STEPS, lr=LR):
    """The trajectory and every bookkeeping quantity, by plain loops."""
    n, T, d = X.shape
    nu = np.zeros(d)
    nu[0], nu[1] = 1.0, -1.0
    nu /= np.sqrt(2.0) * signal_norm
    p = np.zeros(d)
    margins, losses, ss = [], [], []
    for t in range(steps + 1):
        f, s = forward(p, X, nu)
        margins.append(y * f)
        losses.append(np.mean(np.logaddexp(0.0, -y * f)))
        sR = s[:, 0]  # the relevant token is token 0 (n_relevant = 1)
        ss.append(sR * (1 - sR))
        if t < steps:
            p = p - lr * grad(p, X, nu, y)
    margins, ss = np.array(margins), np.array(ss)  # (steps + 1, n)
    fitted = margins > 0
    first_fit = np.array([int(np.argmax(fitted[:, i])) if fitted[:, i].any() else -1
                          for i in range(n)])
    every = fitted.all(1)
    all_fit = int(np.argmax(every)) if every.any() else -1
    noisy = np.flatnonzero(flipped)
    k = len(noisy)
    fitted_noisy = [i for i in noisy if first_fit[i] >= 0]
    if k == 0 or len(fitted_noisy) < k:
        noisy_fit_step = -1
    else:
        noisy_fit_step = int(max(first_fit[i] for i in noisy))
    pos = y_clean > 0
    masks = {"clean_pos": ~flipped & pos, "clean_neg": ~flipped & ~pos,
             "noisy_pos": flipped & pos, "noisy_neg": flipped & ~pos}
    cumS = {g: float(ss[:steps][:, m].sum()) for g, m in masks.items()}  # steps 0..steps-1
    with np.errstate(invalid="ignore"):
        acc_noisy = fitted[:, flipped].mean(1) if k else np.full(steps + 1, np.nan)
        ss_mean = {g: ss[:, m].mean(1) if m.any() else np.full(steps + 1, np.nan)
                   for g, m in masks.items()}
    return {
        "margins": margins, "losses": np.array(losses), "first_fit": first_fit,
        "all_fit_step": all_fit, "noisy_fit_step": noisy_fit_step, "n_noisy": k,
        "frac_noisy_fitted": len(fitted_noisy) / k if k else np.nan,
        "mean_noisy_fit_step": float(np.mean([first_fit[i] for i in fitted_noisy]))
        if fitted_noisy else np.nan,
        "cumS": cumS, "train_acc": fitted.mean(1), "train_acc_noisy": acc_noisy,
        "train_acc_clean": fitted[:, ~flipped].mean(1), "ss": ss_mean, "p": p,
        "nu": nu,
    }


def run_data(row):
    """The run's training set, drawn as :func:`phasebo.train.run` draws it (same key)."""
    settings = {**SETTINGS, "noise_ratio": float(row["noise_ratio"]),
                "signal_norm": float(row["signal_norm"])}
    model, _, program, sw, key = prepare_one(settings, seed=int(row["seed"]))
    k_data, _, _ = model.keys(key)
    b = model.sample(program, sw, k_data, test=False)
    return (np.asarray(b.X, np.float64), np.asarray(b.y, np.float64),
            np.asarray(b.y_clean, np.float64), np.asarray(b.flipped, bool))


# --------------------------------------------------------------------------------------------
# The sweep, once for the module
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep(_x64, tmp_path_factory):
    out = tmp_path_factory.mktemp("bookkeeping") / "out"
    spec = spec_from_dict(SETTINGS, AXES, seeds=SEEDS, name="bookkeeping")
    df = run_sweep(spec, out, quiet=True, plots=False)
    dyn = pd.read_parquet(out / "dynamics.parquet")
    smp = pd.read_parquet(out / "samples.parquet")
    runs = []
    for _, row in df.iterrows():
        X, y, y_clean, flipped = run_data(row)
        runs.append({"row": row, "o": oracle(X, y, y_clean, flipped, float(row["signal_norm"])),
                     "flipped": flipped, "y_clean": y_clean,
                     "dyn": dyn[dyn["run_id"] == row["run_id"]].sort_values("step"),
                     "smp": smp[smp["run_id"] == row["run_id"]].sort_values("sample")})
    return df, runs


def test_oracle_gradient_matches_finite_differences():
    """The oracle's own gradient, against central differences (so the oracle is not checked
    only against phasebo)."""
    X, y, _, _ = run_data({"noise_ratio": 0.2, "signal_norm": 3.0, "seed": 0})
    rng = np.random.default_rng(0)
    nu = np.zeros(D)
    nu[0], nu[1] = 1.0, -1.0
    nu /= np.sqrt(2.0) * 3.0
    p = 0.3 * rng.standard_normal(D)
    g = grad(p, X, nu, y)
    eps = 1e-6
    fd = np.array([(loss(p + eps * e, X, nu, y) - loss(p - eps * e, X, nu, y)) / (2 * eps)
                   for e in np.eye(D)])
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9)


def test_the_runs_cover_every_branch(sweep):
    """The grid is only a good oracle test if it exercises the cases: noise-free runs, runs whose
    flipped samples are all fitted (after step 0), runs with a flipped sample never fitted, and a
    sample first fitted at the final state."""
    _, runs = sweep
    o = [r["o"] for r in runs]
    assert any(x["n_noisy"] == 0 for x in o)
    assert any(x["noisy_fit_step"] > 0 for x in o)
    assert any(x["n_noisy"] > 0 and x["noisy_fit_step"] == -1 and x["frac_noisy_fitted"] > 0
               for x in o)
    assert any((x["first_fit"] == STEPS).any() for x in o)
    assert any(x["all_fit_step"] > 0 for x in o) and any(x["all_fit_step"] == -1 for x in o)
    # the first-fit comparisons below are well posed: no margin within rounding of zero
    assert min(np.abs(x["margins"]).min() for x in o) > 1e-8


def test_trajectory_matches_the_oracle(sweep):
    """Same data, same steps: the recorded loss, accuracies and min margin at every step 0..steps
    and the final parameters agree with the NumPy run to float64 rounding."""
    df, runs = sweep
    for r in runs:
        o, dyn, row = r["o"], r["dyn"], r["row"]
        assert dyn["step"].tolist() == list(range(STEPS + 1))
        np.testing.assert_allclose(dyn["train_loss"], o["losses"], rtol=1e-10)
        np.testing.assert_allclose(dyn["margin"], o["margins"].min(1), rtol=1e-9, atol=1e-12)
        for k in ("train_acc", "train_acc_clean", "train_acc_noisy"):  # fractions of n: exact
            np.testing.assert_allclose(dyn[k], o[k], rtol=0, atol=1e-12, err_msg=k)
        assert row["train_loss"] == pytest.approx(o["losses"][-1], rel=1e-10)
        assert row["p_norm"] == pytest.approx(np.linalg.norm(o["p"]), rel=1e-9)
        np.testing.assert_allclose(r["smp"]["final_margin"], o["margins"][-1], rtol=1e-9,
                                   atol=1e-12)


def test_first_fit_steps_match_the_oracle_and_the_samples_table(sweep):
    _, runs = sweep
    for r in runs:
        o, smp, row = r["o"], r["smp"], r["row"]
        assert smp["sample"].tolist() == list(range(N))
        np.testing.assert_array_equal(smp["first_fit_step"], o["first_fit"])
        np.testing.assert_array_equal(smp["flipped"], r["flipped"])
        np.testing.assert_array_equal(smp["y_clean"], r["y_clean"])
        for k in ("n_noisy", "noisy_fit_step", "all_fit_step"):
            assert int(row[k]) == o[k], (k, row["run_id"])
        for k in ("frac_noisy_fitted", "mean_noisy_fit_step"):
            if np.isnan(o[k]):
                assert np.isnan(row[k]), (k, row["run_id"])
            else:
                assert row[k] == pytest.approx(o[k], rel=1e-12), (k, row["run_id"])
        # the same steps seen through the samples table alone
        ff = smp["first_fit_step"].to_numpy()
        fl = smp["flipped"].to_numpy(bool)
        if fl.any() and (ff[fl] >= 0).all():
            assert row["noisy_fit_step"] == ff[fl].max()
        else:
            assert row["noisy_fit_step"] == -1
        if (ff >= 0).all():
            assert row["all_fit_step"] >= ff.max()  # every sample at once: no earlier


def test_first_fit_steps_agree_with_the_recorded_noisy_accuracy(sweep):
    """``train_acc_noisy`` (recorded at every step) against the first-fit steps: no flipped sample
    is fitted before the first of them, and at each one at least one is; where every flipped
    sample stays fitted from some step on, ``noisy_fit_step`` is no later than it."""
    _, runs = sweep
    for r in runs:
        row, dyn, smp = r["row"], r["dyn"], r["smp"]
        acc = dyn["train_acc_noisy"].to_numpy()
        ff = smp.loc[smp["flipped"], "first_fit_step"].to_numpy()
        if not len(ff):
            assert np.isnan(acc).all()
            continue
        hit = ff[ff >= 0]
        if len(hit):
            assert (acc[: hit.min()] == 0).all()
            assert (acc[hit] > 0).all()
        else:
            assert (acc == 0).all()
        full = np.flatnonzero(acc == 1)
        if len(full):
            assert 0 <= row["noisy_fit_step"] <= full[0]
        if row["noisy_fit_step"] == -1:
            assert len(full) == 0  # at no step were all flipped samples fitted together


def test_cumulative_S_sums_match_the_oracle(sweep):
    """``cumS_<group>``: s_R (1 - s_R) summed over steps 0..steps-1 and the group's samples, and
    the same sums from the recorded per-step group means ``ss_<group>``."""
    _, runs = sweep
    for r in runs:
        o, row, dyn = r["o"], r["row"], r["dyn"]
        for g in GROUPS:
            assert row[f"cumS_{g}"] == pytest.approx(o["cumS"][g], rel=1e-10, abs=1e-12), g
            np.testing.assert_allclose(dyn[f"ss_{g}"], o["ss"][g], rtol=1e-9, atol=1e-14)
            size = int(((~r["flipped"] if g.startswith("clean") else r["flipped"])
                        & ((r["y_clean"] > 0) if g.endswith("pos") else (r["y_clean"] < 0))).sum())
            from_dyn = size * np.nansum(dyn[f"ss_{g}"].to_numpy()[:STEPS]) if size else 0.0
            assert row[f"cumS_{g}"] == pytest.approx(from_dyn, rel=1e-9, abs=1e-12), g



def test_noise_free_runs_have_no_noisy_fit_step(sweep):
    """noise_ratio = 0: no flipped sample, so ``noisy_fit_step = -1`` (not 0: there is nothing to
    fit), ``frac_noisy_fitted`` and ``mean_noisy_fit_step`` NaN, and the aggregate counts no step;
    with flipped labels the aggregate's mean is over the runs that fitted all of them."""
    df, runs = sweep
    clean = df[df["noise_ratio"] == 0]
    assert len(clean) == len(AXES["signal_norm"]) * SEEDS
    assert (clean["n_noisy"] == 0).all()
    assert (clean["noisy_fit_step"] == -1).all()
    assert clean["frac_noisy_fitted"].isna().all() and clean["mean_noisy_fit_step"].isna().all()
    assert (clean["cumS_noisy_pos"] == 0).all() and (clean["cumS_noisy_neg"] == 0).all()
    cells = pb.aggregate(df).set_index(["noise_ratio", "signal_norm"]).sort_index()
    for mu in AXES["signal_norm"]:
        c = cells.loc[(0.0, mu)]
        assert np.isnan(c["noisy_fit_step_mean"]) and np.isnan(c["frac_noisy_fitted_mean"])
        noisy = df[(df["noise_ratio"] == 0.2) & (df["signal_norm"] == mu)]
        steps = noisy["noisy_fit_step"][noisy["noisy_fit_step"] >= 0]
        want = steps.mean() if len(steps) else np.nan
        got = cells.loc[(0.2, mu), "noisy_fit_step_mean"]
        assert (np.isnan(got) and np.isnan(want)) or got == pytest.approx(want)
    # the grid has a cell where every flipped sample was fitted and one where none was, per run
    assert np.isfinite(cells.loc[(0.2, 3.0), "noisy_fit_step_mean"])
    assert np.isnan(cells.loc[(0.2, 10.0), "noisy_fit_step_mean"])


def test_metrics_computed_at_each_recorded_step_equal_the_deferred_ones(monkeypatch):
    """A run whose states are too large to keep computes its recorded metrics at each recorded
    step (:class:`phasebo.train.Recorder`); in float64 (64-bit indices) as in float32, the same
    dynamics as computing them after the loop."""
    import jax

    import phasebo.train
    from phasebo.sweep import run_one

    s = dict(d=60, n=8, T=4, signal_norm=10.0, n_test=50, steps=20, record_every=5,
             dtype="float64")
    kept = run_one(s, seed=1)
    monkeypatch.setattr(phasebo.train, "DEFER_BYTES", 0)
    jax.clear_caches()  # a new trace, not the first run's program
    each = run_one(s, seed=1)
    assert set(kept.dynamics) == set(each.dynamics)
    for k in kept.dynamics:
        np.testing.assert_allclose(np.asarray(kept.dynamics[k]), np.asarray(each.dynamics[k]),
                                   rtol=1e-12, err_msg=k)
