"""The regime rule (phasebo.regimes) by table: every branch, its thresholds and tolerances, the
still-fitting trend, the regime at every recorded step and each run's timeline."""

import math

import numpy as np
import pandas as pd
import pytest

from phasebo.regimes import (
    DECADE,
    classify_regime,
    classify_runs,
    clean_reference,
    projected_margin,
    regimes_over_time,
    timeline,
)

F32 = float(np.float32(19 / 20))  # a k / n accuracy as float32 stores it

# train_acc, test_acc, status, test_eps, train_acc_fit, n_noisy, margin, margin_prev, step,
# step_prev -> regime
TABLE = [
    # fits every label: benign / harmful on either side of 1 - test_eps
    (1.0, 1.0, "ok", 0.05, 1.0, 4, 0.3, 0.1, 1000, 500, "benign"),
    (1.0, 0.95, "ok", 0.05, 1.0, 4, 0.3, 0.1, 1000, 500, "benign"),  # exactly 1 - eps: benign
    (1.0, 0.9499, "ok", 0.05, 1.0, 4, 0.3, 0.1, 1000, 500, "harmful"),
    (1.0, float(np.float32(0.95)), "ok", 0.05, 1.0, 4, 0.3, 0.1, 1000, 500, "benign"),
    (1.0, 0.93, "ok", 0.1, 1.0, 4, 0.3, 0.1, 1000, 500, "benign"),  # the sweep file's test_eps
    (1.0, 0.93, "ok", 0.05, 1.0, 4, 0.3, 0.1, 1000, 500, "harmful"),
    (1.0, 0.89, "ok", 0.1, 1.0, 4, 0.3, 0.1, 1000, 500, "harmful"),
    # some label unfitted: settled -> not overfitting, rising fast enough -> fitting
    (0.95, 1.0, "ok", 0.05, 1.0, 4, -0.5, -0.5, 1000, 500, "not_overfitting"),  # flat
    (0.95, 1.0, "ok", 0.05, 1.0, 4, -0.5, -0.6, 1000, 500, "not_overfitting"),  # too slow
    (0.95, 1.0, "ok", 0.05, 1.0, 4, -0.1, -0.3, 1000, 500, "fitting"),  # crosses 0 by 10^4
    (0.95, 0.6, "ok", 0.05, 1.0, 4, -0.1, -0.3, 1000, 500, "fitting"),  # test acc irrelevant
    (0.95, 1.0, "ok", 0.05, 1.0, 4, -0.1, 0.2, 1000, 500, "not_overfitting"),  # falling
    (0.95, 1.0, "ok", 0.05, 1.0, 4, -0.1, -0.3, 1000, 0, "not_overfitting"),  # no trend (t' 0)
    (0.95, 1.0, "ok", 0.05, 1.0, 4, -0.1, np.nan, 1000, 500, "not_overfitting"),  # unknown
    # train_acc_fit below 1: 19 of 20 counts as fitting every label (float32 19/20 included)
    (F32, 1.0, "ok", 0.05, 0.95, 4, -0.1, -0.3, 1000, 500, "benign"),
    (F32, 0.5, "ok", 0.05, 0.95, 4, -0.1, -0.3, 1000, 500, "harmful"),
    (0.9, 1.0, "ok", 0.05, 0.95, 4, -0.5, -0.5, 1000, 500, "not_overfitting"),
    # float32 tolerance on the fit threshold: 1 - 1e-7 still fits
    (1 - 1e-7, 1.0, "ok", 0.05, 1.0, 4, 0.1, 0.1, 1000, 500, "benign"),
    (1 - 1e-5, 1.0, "ok", 0.05, 1.0, 4, -0.5, -0.5, 1000, 500, "not_overfitting"),
    # nothing to overfit, whatever the accuracies
    (1.0, 1.0, "ok", 0.05, 1.0, 0, 0.3, 0.1, 1000, 500, "no_noise"),
    (0.9, 0.6, "ok", 0.05, 1.0, 0, -0.1, -0.3, 1000, 500, "no_noise"),
    # a failed run is its status, before everything else
    (1.0, 1.0, "diverged", 0.05, 1.0, 4, 0.3, 0.1, 1000, 500, "diverged"),
    (0.95, 1.0, "diverged", 0.05, 1.0, 0, -0.1, -0.3, 1000, 500, "diverged"),
]


@pytest.mark.parametrize("row", TABLE, ids=[f"{i}-{r[-1]}" for i, r in enumerate(TABLE)])
def test_regime_rule_by_table(row):
    *args, want = row
    tr, te, st, eps, fit, n_noisy, m, m0, t, t0 = args
    got = classify_regime([tr], [te], [st], eps, fit, n_noisy=[n_noisy], margin=[m],
                          margin_prev=[m0], step=[t], step_prev=[t0])
    assert got.tolist() == [want]


def test_rule_without_the_optional_inputs_has_three_regimes_and_statuses():
    got = classify_regime([1.0, 1.0, 0.9, 0.9], [1.0, 0.5, 1.0, 1.0],
                          ["ok", "ok", "ok", "diverged"])
    assert got.tolist() == ["benign", "harmful", "not_overfitting", "diverged"]


def test_projection_is_one_decade_linear_in_log_step():
    # m(t) = a + b ln t exactly: the projection is m(10 t)
    a, b = -2.0, 0.25
    t, t0 = 800.0, 300.0
    m = a + b * math.log(t)
    got = projected_margin(m, a + b * math.log(t0), t, t0)
    assert got == pytest.approx(a + b * math.log(DECADE * t), rel=1e-12)
    assert np.isnan(projected_margin(-1.0, -2.0, 10, 0))
    assert np.isnan(projected_margin(-1.0, -2.0, 10, 10))


def test_classify_runs_reads_the_thresholds_and_the_middle_step_from_the_table():
    res = pd.DataFrame({
        "train_acc": [1.0, 1.0, 0.95, 0.95, 0.95], "test_acc": [0.93, 0.93, 1.0, 1.0, 1.0],
        "status": ["ok"] * 5, "test_eps": [0.1, 0.05, 0.05, 0.05, 0.05],
        "train_acc_fit": [1.0] * 5, "n_noisy": [4, 4, 4, 4, 0], "steps": [1000] * 5,
        "margin": [0.2, 0.2, -0.1, -0.5, -0.1], "margin_mid": [0.1, 0.1, -0.3, -0.5, -0.3]})
    assert classify_runs(res).tolist() == ["benign", "harmful", "fitting", "not_overfitting",
                                           "no_noise"]


def planted_dynamics():
    """Three runs with regimes that change at known recorded steps."""
    steps = np.array([0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])
    rows = []
    # run 1: settled not-overfitting until 50, then benign from 100 on (fits at 100)
    # run 2: fits at 20 with test accuracy 0.7 (harmful), recovers to 0.97 at 200 (benign)
    # run 3: margin rising linearly in ln t, fits at ~990
    for rid in (1, 2, 3):
        for t in steps:
            if rid == 1:
                fit = t >= 100
                margin = 0.1 if fit else -1.0
                acc = 1.0
            elif rid == 2:
                fit = t >= 20
                margin = 0.2 if fit else -1.0
                acc = 1.0 if t < 20 else (0.7 if t < 200 else 0.97)
            else:
                margin = -1.0 + 0.145 * math.log(max(t, 1))  # crosses 0 at t ~ 990
                fit = margin > 0
                acc = 1.0
            rows.append({"run_id": rid, "step": int(t), "train_acc": 1.0 if fit else 0.9,
                         "train_acc_clean": 1.0, "train_acc_noisy": 1.0 if fit else 0.5,
                         "test_acc": acc, "margin": margin})
    dyn = pd.DataFrame(rows).sample(frac=1, random_state=0)  # any row order
    res = pd.DataFrame({"run_id": [1, 2, 3], "status": ["ok"] * 3, "test_eps": 0.05,
                        "train_acc_fit": 1.0, "n_noisy": 4})
    return dyn, res


def test_regimes_over_time_on_a_planted_table():
    dyn, res = planted_dynamics()
    reg = regimes_over_time(dyn, res)
    assert list(reg.columns[:7]) == ["run_id", "step", "train_acc", "train_acc_clean",
                                     "train_acc_noisy", "test_acc", "margin"]
    lab = {(r.run_id, r.step): str(r.regime) for r in reg.itertuples()}
    assert [lab[1, t] for t in (0, 50, 100, 1000)] == ["not_overfitting"] * 2 + ["benign"] * 2
    assert [lab[2, t] for t in (10, 20, 100, 200, 1000)] == \
        ["not_overfitting", "harmful", "harmful", "benign", "benign"]
    # run 3 fits at t* ~ 990 with a margin exactly linear in ln t: the projection is exact, so
    # the run is fitting from the first step within a decade of t* (100) on, not before
    assert all(lab[3, t] == "not_overfitting" for t in (0, 1, 2, 5, 10, 20, 50))
    assert all(lab[3, t] == "fitting" for t in (100, 200, 500))
    assert lab[3, 1000] == "benign"
    # the trend's earlier record is the latest one <= t / 2
    r = reg[(reg.run_id == 3) & (reg.step == 100)].iloc[0]
    m50 = -1.0 + 0.145 * math.log(50)
    assert r.projected_margin == pytest.approx(r.margin + (r.margin - m50) * math.log(10) /
                                               math.log(2))


def test_diverged_run_is_diverged_from_its_divergence_step_on():
    dyn, res = planted_dynamics()
    res = res.assign(status=["ok", "diverged", "ok"], diverge_step=[-1, 100, -1])
    reg = regimes_over_time(dyn, res)
    two = reg[reg.run_id == 2].set_index("step")["regime"].astype(str)
    assert two[50] == "harmful" and two[100] == "diverged" and two[1000] == "diverged"


def test_timeline_first_benign_dip_and_recovery_steps():
    dyn, res = planted_dynamics()
    tl = timeline(regimes_over_time(dyn, res), res).set_index("run_id")
    assert tl.loc[1, "first_benign_step"] == 100 and tl.loc[1, "recovery_step"] == -1
    assert tl.loc[2, "first_benign_step"] == 200
    assert tl.loc[2, "dip_step"] == 20 and tl.loc[2, "dip_test_acc"] == pytest.approx(0.7)
    assert tl.loc[2, "recovery_step"] == 200
    assert tl.loc[3, "dip_step"] == 1 and tl.loc[3, "recovery_step"] == -1  # never dipped


def test_a_recovery_that_does_not_hold_has_no_held_recovery_step():
    """Run 2 recovers at 200 and stays (held at 200 too); the same run falling back below at
    500 and back again at 1000 holds from 1000; one that ends below holds nowhere (-1), though
    its first recovery is still its recovery_step."""
    dyn, res = planted_dynamics()
    tl = timeline(regimes_over_time(dyn, res), res).set_index("run_id")
    assert tl.loc[2, "held_recovery_step"] == 200 and tl.loc[1, "held_recovery_step"] == -1
    assert tl.loc[3, "held_recovery_step"] == -1  # never dipped
    two = dyn["run_id"] == 2
    relapse = dyn.assign(test_acc=np.where(two & (dyn["step"] == 500), 0.8, dyn["test_acc"]))
    tl = timeline(regimes_over_time(relapse, res), res).set_index("run_id")
    assert (tl.loc[2, "recovery_step"], tl.loc[2, "held_recovery_step"]) == (200, 1000)
    ends = relapse.assign(test_acc=np.where(two & (relapse["step"] == 1000), 0.8,
                                            relapse["test_acc"]))
    tl = timeline(regimes_over_time(ends, res), res).set_index("run_id")
    assert (tl.loc[2, "recovery_step"], tl.loc[2, "held_recovery_step"]) == (200, -1)


def test_recovery_needs_the_run_threshold():
    dyn, res = planted_dynamics()
    strict = res.assign(test_eps=0.01)  # 0.97 is not back within 0.01
    tl = timeline(regimes_over_time(dyn, strict), strict).set_index("run_id")
    assert tl.loc[2, "recovery_step"] == -1


# --------------------------------------------------------------------------------------------
# The still-fitting rule on real runs
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory):
    """p-only prompt attention (n 20, r 0.2) for 10^4 steps, records every 500: at (375, 30) the
    flipped labels are still being fitted at step 1000 and fitted by 10^4 (measured: 10 of 10
    seeds unfitted at 10^3, 1 at 10^4); at (500, 100) they stay unfitted to 10^5 steps."""
    from phasebo.config import spec_from_dict
    from phasebo.sweep import run_sweep

    spec = spec_from_dict({"steps": 10_000, "record_every": 500}, seeds=5, name="long",
                          cases=[{"d": 375, "signal_norm": 30.0}, {"d": 500, "signal_norm": 100.0}])
    out = tmp_path_factory.mktemp("long")
    res = run_sweep(spec, out, quiet=True, plots=False)
    return res, pd.read_parquet(out / "dynamics.parquet")


def test_a_run_still_fitting_is_marked_and_a_settled_one_is_not(long_runs):
    res, dyn = long_runs
    lab = dyn.merge(res[["run_id", "d"]], on="run_id")
    at = {s: lab[lab.step == s].groupby("d")["regime"].agg(lambda r: r.astype(str).tolist())
          for s in (1000, 10_000)}
    fitting, settled = at[1000][375], at[1000][500]
    assert fitting.count("fitting") >= 4 and "not_overfitting" not in fitting
    assert settled == ["not_overfitting"] * 5
    # ten times later the first have fitted every label; the second still have not
    assert at[10_000][375].count("benign") >= 4
    assert at[10_000][500] == ["not_overfitting"] * 5


def test_the_horizon_label_equals_the_label_of_the_last_record(long_runs):
    """At the horizon the rule reads the in-run margin at steps // 2 (``margin_mid``); in the
    dynamics it reads the record at 5000: the same step, so the same label and margin."""
    res, dyn = long_runs
    last = dyn[dyn.step == 10_000].set_index("run_id")
    mid = dyn[dyn.step == 5_000].set_index("run_id")["margin"]
    r = res.set_index("run_id")
    assert (r["regime"].astype(str) == last.loc[r.index, "regime"].astype(str)).all()
    np.testing.assert_allclose(r["margin_mid"], mid.loc[r.index], rtol=1e-5, atol=1e-6)


def test_a_run_with_no_flipped_label_is_no_noise_and_the_sweep_says_why(tmp_path, capsys):
    from phasebo.config import spec_from_dict
    from phasebo.sweep import run_sweep

    spec = spec_from_dict({"d": 300, "signal_norm": 20.0, "steps": 50},
                          {"noise_ratio": [0.05, 0.2]}, seeds=2, name="nonoise")
    res = run_sweep(spec, tmp_path / "nn", plots=False)
    err = capsys.readouterr().err
    assert "noise_ratio = 0.05 at n = 20 flips 0 labels" in err and "no_noise" in err
    assert "noise_ratio = 0.2" not in err  # 4 flips of 20: the ratio it asks for
    zero = res[res["noise_ratio"] == 0.05]
    assert (zero["n_noisy"] == 0).all() and (zero["regime"] == "no_noise").all()
    assert (zero["noisy_fit_step"] == -1).all() and zero["frac_noisy_fitted"].isna().all()
    assert (res.loc[res["noise_ratio"] == 0.2, "regime"] != "no_noise").all()


def test_boundaries_over_steps_recover_a_planted_trajectory():
    """Runs whose regime at step t is benign with probability sigmoid(4 (ln x - ln b(t))),
    b(t) = 20 t^0.25: the boundary at every step lies inside its interval, and the trajectory's
    exponent (fitted over the steps) is the planted 0.25."""
    from phasebo.boundaries import boundaries
    from phasebo.scaling import fit_power_law

    rng = np.random.default_rng(7)
    xs = np.geomspace(10, 1000, 13)
    steps = np.array([10, 100, 1000, 10_000])
    rows = []
    for seed in range(30):
        z = rng.logistic(size=len(xs))  # one draw per (seed, x), shared by the steps
        for t in steps:
            b = 20 * t ** 0.25
            benign = 4 * (np.log(xs) - np.log(b)) + z > 0
            rows += [{"seed": seed, "d": 1000, "signal_norm": x, "step": int(t),
                      "regime": "benign" if g else "not_overfitting", "status": "ok"}
                     for x, g in zip(xs, benign)]
    dyn = pd.DataFrame(rows)
    b = boundaries(dyn, "signal_norm", "d", ("not_overfitting", "benign"), seed=1)
    assert sorted(b["step"]) == steps.tolist() and (b["status"] == "ok").all()
    truth = 20 * b["step"].to_numpy(float) ** 0.25
    assert ((b["lo"] <= truth) & (truth <= b["hi"])).all()
    assert (np.diff(b.sort_values("step")["boundary"].to_numpy()) > 0).all()
    fit = fit_power_law(b.assign(t=b["step"].astype(float)), "t")
    assert fit["lo"] <= 0.25 <= fit["hi"] and fit["hi"] - fit["lo"] < 0.1
    one = boundaries(dyn, "signal_norm", "d", ("not_overfitting", "benign"), step=100, seed=1)
    assert len(one) == 1 and one["step"].iloc[0] == 100


def test_clean_reference_judges_against_the_noise_free_runs_of_the_same_cell():
    """Under test_reference = clean, A is the mean test accuracy of the ok noise-free runs of the
    same cell (here: the same n); a cell without one is no_baseline; a clean run is no_noise
    (never harmful, though its test accuracy is far below 1); absolute rows keep A = 1."""
    res = pd.DataFrame({
        "run_id": np.arange(9), "n": [20, 20, 20, 20, 20, 100, 100, 400, 20],
        "noise_ratio": [0.0, 0.0, 0.0, 0.2, 0.2, 0.0, 0.2, 0.2, 0.2],
        "status": ["ok", "ok", "diverged", "ok", "ok", "ok", "ok", "ok", "ok"],
        "test_acc": [0.80, 0.70, 0.0, 0.70, 0.64, 0.90, 0.70, 0.9, 0.97],
        "train_acc": [1.0] * 9, "n_noisy": [0, 0, 0, 4, 4, 0, 20, 80, 4],
        "test_eps": [0.05] * 9,
        "test_reference": ["clean"] * 8 + ["absolute"]})
    ref, runs, _ = clean_reference(res, ["n", "noise_ratio", "test_reference"])
    # the diverged clean run is left out of the mean; the absolute row is its own cell
    np.testing.assert_allclose(ref, [0.75] * 5 + [0.9, 0.9, np.nan, 1.0])
    np.testing.assert_array_equal(runs, [2] * 5 + [1, 1, 0, np.nan])
    regime = classify_runs(res, ref)
    assert list(regime) == ["no_noise", "no_noise", "diverged", "benign", "harmful", "no_noise",
                            "harmful", "no_baseline", "benign"]


def test_a_step_size_decayed_to_zero_stops_the_still_fitting_trend_at_the_horizon():
    """lr_schedule = linear: lr is 0 at the horizon, so a run with an unfitted label there is
    not_overfitting, whatever its margin's trend (constant lr: fitting)."""
    res = pd.DataFrame({"train_acc": [0.95, 0.95], "test_acc": [1.0, 1.0], "status": ["ok"] * 2,
                        "n_noisy": [4, 4], "margin": [-0.1, -0.1], "margin_mid": [-0.3, -0.3],
                        "steps": [1000, 1000], "lr_schedule": ["constant", "linear"]})
    assert list(classify_runs(res)) == ["fitting", "not_overfitting"]
    dyn = pd.DataFrame({"run_id": [0, 0, 1, 1], "step": [500, 1000] * 2,
                        "train_acc": [0.9, 0.95] * 2, "test_acc": [1.0] * 4,
                        "margin": [-0.3, -0.1] * 2})
    reg = regimes_over_time(dyn, res.assign(run_id=[0, 1]))
    assert list(reg.loc[reg["step"] == 1000, "regime"].astype(str)) == ["fitting",
                                                                        "not_overfitting"]


def test_clean_reference_over_time_reads_the_clean_runs_at_the_same_step():
    res = pd.DataFrame({"run_id": [1, 2, 3], "n": [20, 20, 20], "noise_ratio": [0.0, 0.0, 0.2],
                        "status": ["ok"] * 3, "test_acc": [0.8, 0.9, 0.5],
                        "test_reference": ["clean"] * 3})
    dyn = pd.DataFrame({"run_id": [3, 3, 1, 1, 2, 2], "step": [0, 10, 0, 10, 0, 10],
                        "test_acc": [0.1, 0.5, 0.2, 0.8, 0.4, 0.9]})
    ref, _, ref_dyn = clean_reference(res, ["n"], dyn)
    np.testing.assert_allclose(ref, [0.85] * 3)
    np.testing.assert_allclose(ref_dyn, [0.3, 0.85, 0.3, 0.85, 0.3, 0.85])


def test_classify_regime_takes_run_ones_status_codes():
    """run_one returns the status as its code (0 ok, 1 diverged, 2 unsolved): the same regime
    as the name gives, not the code passed through as a regime."""
    import phasebo as pb

    assert pb.classify_regime(1.0, 1.0, 0) == pb.classify_regime(1.0, 1.0, "ok") == "benign"
    assert list(pb.classify_regime([1.0, 1.0, 1.0], [1.0, 0.5, 1.0], np.array([0, 1, 2]))) == [
        "benign", "diverged", "unsolved"]


def test_regimes_over_time_reads_a_clean_reference_from_the_results_table():
    """Called as the docs show (dynamics and results tables alone), runs judged against their
    noise-free runs get the sweep's own labels, not a reference of 1: a run at test accuracy 0.82
    is benign beside noise-free runs at 0.85, harmful against 1."""
    res = pd.DataFrame({"run_id": [1, 2, 3], "n": [20, 20, 20], "noise_ratio": [0.0, 0.0, 0.2],
                        "status": ["ok"] * 3, "test_acc": [0.8, 0.9, 0.82], "n_noisy": [0, 0, 4],
                        "test_reference": ["clean"] * 3})
    dyn = pd.DataFrame({"run_id": [3, 1, 2], "step": [10] * 3, "train_acc": [1.0] * 3,
                        "test_acc": [0.82, 0.8, 0.9], "margin": [0.1] * 3})
    with pytest.raises(ValueError, match="does not record which columns are settings"):
        regimes_over_time(dyn, res)
    res.attrs["column_groups"] = {"settings": ["n", "noise_ratio", "test_reference"]}
    reg = regimes_over_time(dyn, res)
    np.testing.assert_allclose(reg["reference_acc"], 0.85)
    assert reg.set_index("run_id").loc[3, "regime"] == "benign"
    assert regimes_over_time(dyn, res, np.ones(3)).set_index("run_id").loc[3, "regime"] == "harmful"


@pytest.mark.parametrize("args, kw, match", [
    ((1.0, 1.0, "okay"), {}, "status 'okay' is not a run status"),
    ((1.0, 1.0, 7), {}, "status code 7"),
    ((1.0, 1.0, "ok"), {"test_eps": 2.0}, "test_eps = 2 is out of range"),
    ((1.0, 1.0, "ok"), {"train_acc_fit": 1.2}, "train_acc_fit = 1.2 is out of range"),
    ((0.9, 1.0, "ok"), {"margin": -0.1, "margin_prev": -0.3}, "needs margin, margin_prev, step"),
])
def test_classify_regime_refuses_what_it_cannot_judge(args, kw, match):
    """A status that is not a run's would come back as a regime, and margins without their steps
    would be ignored silently (not_overfitting where the trend says fitting)."""
    import phasebo as pb

    with pytest.raises(ValueError, match=match):
        pb.classify_regime(*args, **kw)


def test_regimes_over_time_fill_thresholds_a_joined_table_lacks():
    """Tables of two models joined: a run whose model has no test_eps holds NaN there; it is
    judged at the default, not refused as an out-of-range threshold."""
    res = pd.DataFrame({"run_id": [1, 2], "status": ["ok", "ok"], "test_eps": [0.05, np.nan],
                        "train_acc_fit": [1.0, np.nan], "n_noisy": [2, 2]})
    dyn = pd.DataFrame({"run_id": [1, 2], "step": [10, 10], "train_acc": [1.0, 1.0],
                        "test_acc": [1.0, 0.5], "margin": [0.1, 0.1]})
    assert regimes_over_time(dyn, res)["regime"].tolist() == ["benign", "harmful"]
