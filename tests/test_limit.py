"""The converged limit (phasebo.limit): where the weight-decayed flow converges, the same on the
span engines as on the direct engine, refused where it has no meaning, and a limit sweep's
tables (on two devices: a batched LAPACK call there deadlocked XLA's CPU pool)."""

import jax
import numpy as np
import pandas as pd
import pytest

import phasebo
from phasebo.registry import get_model, resolve_engine
from phasebo.settings import ConfigError
from phasebo.sweep import run_one, run_sweep

KEY = jax.random.PRNGKey(7)
MAGEN = dict(model="single_head", n=20, d=900, signal_norm=12.0, n_test=200, weight_decay=0.05,
             dtype="float64")
NORMS = ("p_norm", "v_norm", "train_loss", "margin")


# the converged map's settings (sweeps/magen_snr_n_converged.toml), one cell near its boundary
MAP = dict(model="single_head", T=2, n_test=500, label_mode="iid", label_noise="bernoulli",
           noise_ratio=0.1, noise_mode="projected", signal_norm=30.0, weight_decay=0.01, n=25,
           d=3316, dtype="float64")


def test_the_limit_is_where_the_weight_decayed_flow_converges(x64):
    """On the converged map's settings the flow to tau = 10^4 (converged by its criterion) and
    L-BFGS from the same start reach the same point. (Not a theorem: with several stationary
    points they may part; docs/experiments.md has a case.)"""
    key = jax.random.PRNGKey(101)
    flow = run_one({**MAP, "dynamics": "flow", "flow_time": 1e4, "lr": 0.01}, key=key).final
    limit = run_one({**MAP, "dynamics": "limit", "limit_tol": 1e-9}, key=key).final
    assert bool(flow["converged"]) and bool(limit["converged"])
    for k in NORMS:
        np.testing.assert_allclose(float(limit[k]), float(flow[k]), rtol=2e-3, err_msg=k)
    assert float(limit["test_acc"]) == pytest.approx(float(flow["test_acc"]), abs=0.005)
    assert float(limit["train_acc"]) == float(flow["train_acc"])
    # the limit in about a hundred L-BFGS iterations where the flow took thousands of steps
    assert 0 < int(limit["solver_steps"]) < int(flow["solver_steps"])


def test_a_warmup_takes_the_limit_to_where_the_flow_ends_not_to_another_minimum(x64):
    """At the limit map's top-SNR cell (n 25, d 900) L-BFGS from zero lands, on this key, in a
    harmful minimum with a higher weight-decayed loss than the flow's benign end; 400 GD steps of
    lr 0.025 first (flow time 10) take it to the flow's end."""
    cell = {**MAP, "d": 900, "n_test": 1000}
    key = jax.random.PRNGKey(100)

    def J(f):
        return float(f["train_loss"]) + 0.005 * (float(f["p_norm"]) ** 2 + float(f["v_norm"]) ** 2)

    flow = run_one({**cell, "dynamics": "flow", "flow_time": 1e4}, key=key).final
    cold = run_one({**cell, "dynamics": "limit"}, key=key).final
    warm = run_one({**cell, "dynamics": "limit", "limit_warmup": 400}, key=key).final
    assert bool(cold["converged"]) and bool(warm["converged"])
    assert J(cold) > 1.5 * J(flow) and float(cold["test_acc"]) < 0.8
    assert J(warm) == pytest.approx(J(flow), rel=1e-5)
    assert float(warm["test_acc"]) == float(flow["test_acc"]) == 1.0


def test_the_limit_on_span_engines_equals_the_direct_engines(x64):
    s = {**MAGEN, "dynamics": "limit"}
    direct = run_one(s, engine="direct", key=KEY)
    gram = run_one(s, engine="gram", key=KEY)
    assert set(direct.final) == set(gram.final)
    for k in direct.final:
        np.testing.assert_allclose(np.asarray(gram.final[k]), np.asarray(direct.final[k]),
                                   rtol=1e-7, atol=1e-10, err_msg=k)
    for k in direct.samples:
        np.testing.assert_allclose(np.asarray(gram.samples[k]), np.asarray(direct.samples[k]),
                                   rtol=1e-7, atol=1e-10, err_msg=k)
    assert int(direct.final["status"]) == 0 and float(direct.final["limit_grad_norm"]) <= 1e-6
    assert int(direct.final["noisy_fit_step"]) == -1  # no time: no step
    assert (np.asarray(direct.samples["first_fit_step"]) == -1).all()
    assert direct.dynamics == {}


@pytest.mark.parametrize("settings, words", [
    (dict(MAGEN, dynamics="limit", weight_decay=0.0), "only for weight_decay > 0"),
    (dict(MAGEN, dynamics="limit", dtype="float32"), "fix: dtype = \"float64\""),
    (dict(MAGEN, dynamics="limit", lr=0.01), "lr = 0.01 has no effect"),
    (dict(MAGEN, dynamics="limit", record_log=5), "record_log = 5 has no effect"),
    (dict(MAGEN, dynamics="limit", steps=100), "steps = 100 has no effect unless dynamics"),
    (dict(MAGEN, limit_tol=1e-8), "limit_tol = 1e-08 has no effect unless dynamics"),
    (dict(MAGEN, limit_warmup=10), "limit_warmup = 10 has no effect unless dynamics"),
    (dict(MAGEN, dynamics="limit", limit_warmup=-1), "limit_warmup"),
    (dict(MAGEN, dynamics="limit", engine="reduced", init="gaussian"), "starts from zero"),
])
def test_limit_settings_that_cannot_run_are_refused(settings, words):
    with pytest.raises(ConfigError, match=words):
        phasebo.spec_from_dict(settings)


def test_a_warmups_step_size_is_a_setting_of_the_limit_and_a_column_of_its_results(tmp_path, x64):
    """lr is refused beside the limit alone (no step size), taken beside a warm-up (GD steps of
    lr first) and kept in the results there; without a warm-up the column is empty."""
    with pytest.raises(ConfigError, match="unless limit_warmup > 0"):
        phasebo.spec_from_dict(dict(MAGEN, dynamics="limit", lr=0.01))
    s = dict(MAGEN, d=200, n_test=50, dynamics="limit")
    warm = run_sweep(phasebo.spec_from_dict({**s, "lr": 0.01, "limit_warmup": 5}, seeds=2),
                     tmp_path / "w", quiet=True, plots=False)
    cold = run_sweep(phasebo.spec_from_dict(s, seeds=2), tmp_path / "c", quiet=True, plots=False)
    assert (warm["lr"] == 0.01).all() and (warm["limit_warmup"] == 5).all()
    assert cold["lr"].isna().all() and (cold["steps"] == 0).all()


def test_a_model_without_a_factored_span_form_finds_its_limit_on_the_direct_engine(x64):
    s = dict(d=60, n=6, T=4, signal_norm=5.0, n_test=50, weight_decay=0.05, dynamics="limit",
             dtype="float64", init="zero")
    model = get_model("prompt_attention")
    static = model.static_of({**phasebo.config.resolve({"model": "prompt_attention", **s})})
    assert resolve_engine(model, static).name == "direct"
    with pytest.raises(ConfigError, match="needs a factor of the Gram"):
        phasebo.spec_from_dict({**s, "engine": "reduced"})
    out = run_one(s, key=KEY).final
    assert int(out["status"]) == 0 and bool(out["converged"])


def test_a_limit_sweep_has_no_time_axis(tmp_path, x64):
    spec = phasebo.spec_from_dict(
        dict(model="single_head", n=20, signal_norm=12.0, n_test=100, weight_decay=0.05,
             dynamics="limit", dtype="float64"),
        axes={"d": [900, 40000]}, seeds=3, name="limit")
    assert spec  # two devices in the tests: the sweep's block runs on both at once
    df = run_sweep(spec, tmp_path / "l", quiet=True, plots=False)
    assert len(df) == 6 and (df["status"] == "ok").all() and df["converged"].all()
    assert (df["steps"] == 0).all() and np.isinf(df["time"]).all()
    assert (df["solver_steps"] > 0).all() and (df["limit_grad_norm"] <= 1e-6).all()
    assert df["flow_time"].isna().all() and (df["limit_tol"] == 1e-6).all()
    assert df["lr"].isna().all()  # no step size: the table shows none (it showed the default)
    assert set(df["regime"].astype(str)) <= {"benign", "harmful", "not_overfitting", "no_noise"}
    assert not (tmp_path / "l" / "dynamics.parquet").exists() or \
        len(pd.read_parquet(tmp_path / "l" / "dynamics.parquet")) == 0
