"""Tests written to kill the mutants that survived a mutation run of the code that decides what
users read (``docs/mutation.md``): the regime rule and its timeline, the seed aggregation, the
boundary fits and the run bookkeeping.

Each test pins an edge the other tests leave open: a threshold hit exactly, a default used when a
column is missing, an empty or one-row table, the first or last row of a table, a message. All of
them work on small planted tables: NumPy / pandas, and for the run bookkeeping a few eager
``jax.numpy`` operations on planted arrays (no sweep, no traced program)."""

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest

from phasebo import analysis as A
from phasebo.boundaries import _first_crossing, _slice
from phasebo.regimes import (
    REGIME_ORDER,
    REGIMES,
    TOL,
    classify_regime,
    classify_runs,
    projected_margin,
    regimes_over_time,
    timeline,
)
from phasebo.scaling import exponents_over_steps, fit_power_law

# --------------------------------------------------------------------------------------------
# phasebo.regimes: the rule at one step
# --------------------------------------------------------------------------------------------


def test_thresholds_are_inclusive_at_their_tolerance():
    """``train_acc >= train_acc_fit - 1e-6`` and ``test_acc >= 1 - test_eps - 1e-6``, both with
    equality: an accuracy exactly at the tolerance edge still fits / is benign."""
    got = classify_regime([1.0 - TOL, 1.0, 1.0], [1.0, 1 - 0.05 - TOL, 0.95 - 2 * TOL], "ok")
    assert got.tolist() == ["benign", "benign", "harmful"]


def test_a_projected_margin_of_exactly_zero_is_not_fitting():
    """'fitting' needs a *positive* projection: a smallest margin flat at 0 is not on its way."""
    assert projected_margin(0.0, 0.0, 1000, 500) == 0.0
    got = classify_regime([0.95], [1.0], ["ok"], margin=[0.0], margin_prev=[0.0], step=[1000],
                          step_prev=[500])
    assert got.tolist() == ["not_overfitting"]


def test_missing_values_are_nan_not_errors():
    """A missing margin, step or accuracy (``None``, as a Python list or an object column holds
    it) reads as NaN: no trend, not fitted; a diverged run with no accuracies is 'diverged'."""
    p = projected_margin([-0.1, None, -0.1, -0.1, -0.1], [-0.3, -0.3, None, -0.3, -0.3],
                         [1000, 1000, 1000, None, 1000], [500, 500, 500, 500, None])
    assert p.dtype == float and np.isfinite(p[0]) and np.isnan(p[1:]).all()
    got = classify_regime([None, None, 1.0], [None, 1.0, None], ["diverged", "ok", "ok"])
    assert got.tolist() == ["diverged", "not_overfitting", "harmful"]


def test_an_earlier_step_of_one_gives_a_trend():
    """``t' = 1`` is a valid earlier step (``t' >= 1``): with ``t = 10`` the projection is
    ``m + (m - m')`` exactly one decade on."""
    assert projected_margin(-0.1, -0.3, 10, 1) == pytest.approx(0.1, rel=1e-12)
    assert projected_margin(-0.1, -0.3, 20, 2) == pytest.approx(-0.1 + 0.2 * math.log(10) /
                                                                math.log(10), rel=1e-12)


def test_infinite_margins_give_no_trend_and_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(projected_margin(np.inf, np.inf, 1000, 500))


def test_classify_runs_defaults_for_missing_columns():
    """Without ``steps``, ``margin``/``margin_mid``, ``n_noisy``, ``test_eps`` or
    ``train_acc_fit`` the defaults apply: no trend, no 'no_noise', 0.05 and 1.0."""
    res = pd.DataFrame({"train_acc": [1.0, 1.0, 1.0, 0.95], "test_acc": [0.97, 0.9, 0.94, 1.0],
                        "status": ["ok"] * 4})
    assert classify_runs(res).tolist() == ["benign", "harmful", "harmful", "not_overfitting"]
    # margins but no steps: the middle step is unknown, so there is no trend
    no_steps = res.assign(margin=[0.1, 0.1, 0.1, -0.1], margin_mid=[0.1, 0.1, 0.1, -0.3])
    assert classify_runs(no_steps).tolist()[3] == "not_overfitting"
    assert classify_runs(no_steps.assign(steps=1000)).tolist()[3] == "fitting"


def test_classify_runs_reads_train_acc_fit_and_the_middle_step():
    """``train_acc_fit`` from the table; the trend's earlier step is ``steps // 2``: a margin
    rising from -0.14 to -0.1 between 500 and 1000 projects to +0.033 (fitting), which an
    earlier step of 333 would not (-0.016)."""
    res = pd.DataFrame({"train_acc": [0.95, 0.95], "test_acc": [1.0, 1.0], "status": "ok",
                        "train_acc_fit": [0.95, 1.0], "n_noisy": 4, "steps": 1000,
                        "margin": [-0.5, -0.1], "margin_mid": [-0.5, -0.14]})
    assert classify_runs(res).tolist() == ["benign", "fitting"]


# --------------------------------------------------------------------------------------------
# phasebo.regimes: over time and the timeline
# --------------------------------------------------------------------------------------------


def _random_dynamics(seed=0):
    """Four runs with margins that are *not* linear in log t (so the trend depends on which
    earlier record is used), recorded at irregular steps; the first run starts at step 2, one
    run has a single record, at the largest step."""
    rng = np.random.default_rng(seed)
    steps = {5: [2, 3, 5, 8, 13, 40, 41, 90], 6: [0, 1, 4, 9, 10, 30, 100], 6.5: [150],
             7: [1, 3, 7, 14, 15, 40, 80, 150]}
    rows = []
    for rid, ss in steps.items():
        for t in ss:
            rows.append({"run_id": rid, "step": t, "train_acc": 0.9, "test_acc": 1.0,
                         "margin": float(rng.uniform(-1, 0.5))})
    return pd.DataFrame(rows).sample(frac=1, random_state=seed)


def _check_trend(dyn):
    """Brute force against :func:`regimes_over_time`: for every row the earlier record is the
    latest one of the same run with ``t' <= t / 2`` (including the run's first record), and the
    projected margin and regime follow from it."""
    res = pd.DataFrame({"run_id": sorted(dyn.run_id.unique()), "n_noisy": 4})
    reg = regimes_over_time(dyn, res)
    want_p, want_r = [], []
    for r in reg.itertuples():
        same = dyn[(dyn.run_id == r.run_id) & (dyn.step <= r.step / 2)]
        if len(same):
            prev = same.loc[same.step.idxmax()]
            p = float(projected_margin(r.margin, prev.margin, r.step, prev.step))
        else:
            p = np.nan
        want_p.append(p)
        want_r.append("fitting" if p > 0 else "not_overfitting")
    np.testing.assert_allclose(reg["projected_margin"], want_p, rtol=1e-12)
    assert reg["regime"].astype(str).tolist() == want_r
    return reg


def test_the_trend_uses_the_latest_record_at_or_before_half_the_step():
    dyn = _random_dynamics()
    reg = _check_trend(dyn)
    assert np.isfinite(reg["projected_margin"]).sum() >= 10  # the check is not vacuous
    # run 5 starts at step 2: its step-5 record's earlier record is its first row (step 2)
    r = reg[(reg.run_id == 5) & (reg.step == 5)].iloc[0]
    m2 = dyn[(dyn.run_id == 5) & (dyn.step == 2)].margin.iloc[0]
    assert r.projected_margin == pytest.approx(float(projected_margin(r.margin, m2, 5, 2)))
    # a table whose largest step is 2: the search keys of the runs must still not overlap
    tiny = pd.DataFrame({"run_id": [0, 0, 1, 1, 2], "step": [1, 2, 0, 2, 0], "train_acc": 0.9,
                         "test_acc": 1.0, "margin": [-0.5, -0.2, -0.9, -0.8, -0.1]})
    assert np.isfinite(_check_trend(tiny)["projected_margin"].iloc[1])


def _one_step_each(**cols):
    """A dynamics table with one run per entry, each recorded at step 10 and 20."""
    n = len(next(iter(cols.values())))
    rows = []
    for i in range(n):
        for t in (10, 20):
            rows.append({"run_id": i, "step": t, **{k: v[i] for k, v in cols.items()}})
    return pd.DataFrame(rows)


def test_regimes_over_time_defaults_with_minimal_tables():
    """Only the five required dynamics columns and a results table of run ids: status 'ok',
    test_eps 0.05, train_acc_fit 1, no 'no_noise'."""
    dyn = _one_step_each(train_acc=[1.0, 1.0, 0.9], test_acc=[0.97, 0.9, 1.0],
                         margin=[0.1, 0.1, -0.5])
    assert set(dyn.columns) == {"run_id", "step", "train_acc", "test_acc", "margin"}
    reg = regimes_over_time(dyn, pd.DataFrame({"run_id": [0, 1, 2]}))
    assert reg["regime"].astype(str).tolist() == ["benign"] * 2 + ["harmful"] * 2 + \
        ["not_overfitting"] * 2


def test_regimes_over_time_reads_the_per_run_settings():
    """``test_eps``, ``train_acc_fit``, ``n_noisy`` and ``status`` per run; a failed run without
    a ``diverge_step`` column is failed at every step (step 0 included)."""
    dyn = _one_step_each(train_acc=[1.0, 0.95, 1.0, 1.0], test_acc=[0.93, 1.0, 1.0, 1.0],
                         margin=[0.1, -0.1, 0.1, 0.1])
    dyn = pd.concat([dyn, dyn[dyn.step == 10].assign(step=0)])
    res = pd.DataFrame({"run_id": [0, 1, 2, 3], "test_eps": [0.1, 0.05, 0.05, 0.05],
                        "train_acc_fit": [1.0, 0.95, 1.0, 1.0], "n_noisy": [4, 4, 0, 4],
                        "status": ["ok", "ok", "ok", "diverged"]})
    reg = regimes_over_time(dyn, res)
    lab = reg.groupby("run_id")["regime"].agg(lambda r: sorted(set(r.astype(str))))
    assert lab.tolist() == [["benign"], ["benign"], ["no_noise"], ["diverged"]]
    assert (reg.loc[reg.run_id == 3, "step"] == [0, 10, 20]).all()


def test_regimes_over_time_errors_name_the_problem():
    dyn = _one_step_each(train_acc=[1.0], test_acc=[1.0], margin=[0.1])
    with pytest.raises(ValueError, match=re.escape("the dynamics table lacks ['margin']")):
        regimes_over_time(dyn.drop(columns="margin"), pd.DataFrame({"run_id": [0]}))
    with pytest.raises(ValueError, match="^regimes_over_time: dynamics rows of runs missing "
                                         "from the results$"):
        regimes_over_time(dyn, pd.DataFrame({"run_id": [7]}))


def test_an_index_column_and_a_run_listed_twice_are_tolerated():
    """A dynamics table with an ``index`` column (``df.reset_index()``) and a results table that
    lists a run twice (two sources) classify as the plain tables do."""
    dyn = _one_step_each(train_acc=[1.0, 1.0], test_acc=[1.0, 0.5], margin=[0.1, 0.1])
    res = pd.DataFrame({"run_id": [0, 0, 1], "source": ["a", "b", "a"], "test_eps": 0.05})
    want = regimes_over_time(dyn, res.drop_duplicates("run_id"))
    got = regimes_over_time(dyn.reset_index(), res)
    pd.testing.assert_frame_equal(got, want)
    tl = timeline(got.reset_index(), res)
    pd.testing.assert_frame_equal(tl, timeline(want, res.drop_duplicates("run_id")))


def test_regime_column_is_ordered_with_every_regime():
    dyn = _one_step_each(train_acc=[1.0], test_acc=[1.0], margin=[0.1])
    reg = regimes_over_time(dyn, pd.DataFrame({"run_id": [0]}))
    assert reg["regime"].cat.ordered
    assert tuple(reg["regime"].cat.categories) == REGIME_ORDER


def test_empty_tables_give_empty_results():
    dyn = pd.DataFrame({"run_id": pd.Series([], dtype=int), "step": pd.Series([], dtype=int),
                        "train_acc": [], "test_acc": [], "margin": []})
    reg = regimes_over_time(dyn, pd.DataFrame({"run_id": [1]}))
    assert len(reg) == 0 and "regime" in reg.columns
    tl = timeline(reg)
    assert len(tl) == 0 and list(tl.columns) == ["run_id", "first_benign_step", "dip_step",
                                                 "dip_test_acc", "recovery_step",
                                                 "held_recovery_step"]


def _timeline_table(runs):
    """``runs``: {run_id: [(step, test_acc, regime), ...]} -> a regimes-over-time table."""
    rows = [{"run_id": rid, "step": t, "test_acc": a, "regime": r}
            for rid, recs in runs.items() for t, a, r in recs]
    return pd.DataFrame(rows)


def test_timeline_edges():
    """Runs benign at their first or last row, never benign, never past step 0, dipping or
    recovering at the very last row of the table, and a one-row table."""
    reg = _timeline_table({
        0: [(1, 0.5, "benign"), (2, 0.7, "harmful")],  # first row of the table: benign, dip
        1: [(0, 1.0, "not_overfitting"), (5, 0.6, "harmful")],  # never benign, no recovery
        2: [(0, 0.9, "not_overfitting")],  # nothing after step 0: no dip
        3: [(0, 1.0, "harmful"), (4, 0.8, "harmful"), (8, 0.95, "benign")],  # last row
    })
    tl = timeline(reg).set_index("run_id")  # no res: test_eps 0.05
    assert tl["first_benign_step"].tolist() == [1, -1, -1, 8]
    assert tl["dip_step"].tolist() == [1, 5, -1, 4]
    np.testing.assert_array_equal(tl["dip_test_acc"].to_numpy(float), [0.5, 0.6, np.nan, 0.8])
    assert tl["dip_test_acc"].dtype == float
    assert tl["recovery_step"].tolist() == [-1, -1, -1, 8]  # 0.95 is back within 0.05
    # the dip at the last row of the table
    last = _timeline_table({0: [(0, 1.0, "benign"), (3, 1.0, "benign")],
                            1: [(0, 1.0, "benign"), (3, 0.7, "harmful")]})
    assert timeline(last)["dip_step"].tolist() == [3, 3]
    assert timeline(last)["dip_test_acc"].tolist() == [1.0, 0.7]
    one = timeline(_timeline_table({4: [(0, 1.0, "benign")]}))
    assert one.iloc[0].tolist()[:3] == [4, 0, -1] and np.isnan(one.iloc[0]["dip_test_acc"])


def test_timeline_threshold_edges_and_runs_missing_from_res():
    """Back at exactly ``1 - test_eps`` (and at ``1 - test_eps - 1e-6``) is a recovery; a run
    that ``res`` does not list gets the default 0.05."""
    reg = _timeline_table({
        0: [(0, 1.0, "benign"), (1, 0.5, "harmful"), (2, 0.95, "benign")],
        1: [(0, 1.0, "benign"), (1, 0.5, "harmful"), (2, 1 - 0.1 - TOL, "benign")],
        2: [(0, 1.0, "benign"), (1, 0.5, "harmful"), (2, 0.96, "benign")],
        3: [(0, 1.0, "benign"), (1, 0.5, "harmful"), (2, 0.92, "harmful")],
    })
    res = pd.DataFrame({"run_id": [0, 1], "test_eps": [0.05, 0.1]})
    tl = timeline(reg, res).set_index("run_id")
    assert tl["recovery_step"].tolist() == [2, 2, 2, -1]


# --------------------------------------------------------------------------------------------
# phasebo.analysis: aggregate, wilson, at_step, the "never" steps
# --------------------------------------------------------------------------------------------


def _runs(**extra):
    """Two cells of d, two seeds each, every run ok."""
    df = pd.DataFrame({"run_id": range(4), "d": [10, 10, 20, 20], "seed": [0, 1, 0, 1],
                       "status": "ok", "regime": ["benign", "harmful", "benign", "benign"],
                       "test_acc": [1.0, 0.5, 0.9, 0.8]})
    return df.assign(**extra)


def test_a_step_of_zero_is_a_step_and_minus_one_is_never():
    """``*_step`` columns: -1 is 'never' (NaN), 0 is the initialisation, a real step."""
    agg = A.aggregate(_runs(noisy_fit_step=[0, 4, -1, -1])).set_index("d")
    assert agg.loc[10, "noisy_fit_step_mean"] == 2.0
    assert np.isnan(agg.loc[20, "noisy_fit_step_mean"])
    assert agg.loc[10, "noisy_fit_step_min"] == 0


def test_aggregate_of_one_row_and_of_no_rows():
    one = A.aggregate(_runs().iloc[:1])
    assert len(one) == 1 and one["n_runs"].iloc[0] == 1 and "_cell" not in one.columns
    with pytest.raises(ValueError, match="^aggregate: the table is empty$"):
        A.aggregate(_runs().iloc[:0])


def test_aggregate_without_varying_setting_seeds_or_status():
    """One cell (nothing varies): one row with the counts; without ``seed`` columns every run is
    its own seed; without ``status`` every run is ok."""
    df = _runs().drop(columns=["seed", "status"])
    df["d"] = 10
    agg = A.aggregate(df)
    assert len(agg) == 1 and "_cell" not in agg.columns
    row = agg.iloc[0]
    assert (row["n_runs"], row["n_seeds"], row["n_ok"], row["n_failed"]) == (4, 4, 4, 0)
    assert row["frac_benign"] == 0.75 and row["regime"] == "benign"
    assert agg["n_ok"].dtype == np.int64 and agg["n_seeds"].dtype == np.int64


def test_aggregate_cells_are_sorted_and_keep_nan_and_unused_categories_out():
    """Cells come out sorted whatever the row order; a setting that is NaN for some runs is its
    own cell (not dropped); an unused category of a categorical setting makes no cell."""
    df = _runs(rho=[0.1, 0.1, np.nan, np.nan]).iloc[::-1]
    agg = A.aggregate(df)
    assert agg["d"].tolist() == [10, 20]
    assert agg["n_runs"].tolist() == [2, 2] and agg["n_seeds"].tolist() == [2, 2]
    assert agg["frac_benign"].tolist() == [0.5, 1.0]
    assert agg["test_acc_mean"].tolist() == [0.75, pytest.approx(0.85)]
    assert np.isnan(agg["rho"].iloc[1])
    by_rho = A.aggregate(df.drop(columns="d").assign(d=10), by=["rho"])
    assert len(by_rho) == 2 and by_rho["n_runs"].tolist() == [2, 2]
    assert by_rho["frac_benign"].tolist() == [0.5, 1.0]
    assert by_rho["test_acc_mean"].tolist() == [0.75, pytest.approx(0.85)]
    cat = _runs(model=pd.Categorical(["a", "a", "b", "b"], categories=["a", "b", "c"]))
    agg = A.aggregate(cat, by=["model"])
    assert agg["model"].astype(str).tolist() == ["a", "b"]
    assert agg["n_runs"].tolist() == [2, 2] and agg["frac_benign"].tolist() == [0.5, 1.0]
    assert agg["n_seeds"].tolist() == [2, 2] and agg["test_acc_mean"].tolist() == \
        [0.75, pytest.approx(0.85)]


def test_aggregate_column_order_and_carried_columns():
    """Cell keys, counts, regime columns, then the metric statistics; a label column is carried
    over only where it is one value (NaN counting as a value) in every cell."""
    df = _runs(note=["x", "x", "y", "y"], tag=["x", "y", "x", "x"], gap=["x", None, "x", "x"])
    agg = A.aggregate(df)
    fr = [f"frac_{r}{s}" for r in REGIMES for s in ("", "_se", "_lo", "_hi")]
    assert list(agg.columns) == ["d", "note", "n_runs", "n_seeds", "n_ok", "n_failed", *fr,
                                 "regime", "test_acc_mean", "test_acc_se", "test_acc_min",
                                 "test_acc_max"]
    assert agg["note"].tolist() == ["x", "y"]
    bare = A.aggregate(_runs().drop(columns="regime"))
    assert list(bare.columns) == ["d", "n_runs", "n_seeds", "n_ok", "n_failed", "test_acc_mean",
                                  "test_acc_se", "test_acc_min", "test_acc_max"]


def test_aggregate_inside_check_counts_nan_and_allows_constant_settings():
    """A setting left out of ``by`` is an error only if it varies inside a cell, NaN counting as
    a value; one that is constant inside every cell (tied to ``d``) is allowed."""
    tied = _runs(n=[5, 5, 8, 8])
    assert A.aggregate(tied, by=["d"])["n_runs"].tolist() == [2, 2]
    nan_inside = _runs(rho=[0.1, np.nan, 0.1, 0.1])
    with pytest.raises(ValueError, match="rho varies inside the cells"):
        A.aggregate(nan_inside, by=["d"])


def test_aggregate_missing_column_message():
    with pytest.raises(KeyError, match=re.escape("aggregate: no column 'nope'; fix: one of "
                                                 "run_id, d, seed, status, regime, test_acc")):
        A.aggregate(_runs(), by=["d", "nope"])
    with pytest.raises(KeyError, match=re.escape("no column 'test_accc' (did you mean "
                                                 "'test_acc'?); fix: one of")):
        A.aggregate(_runs(), by=["d"], metrics=["test_accc"])
    with pytest.raises(KeyError, match=re.escape("select: no column 'dd' (did you mean 'd'?)")):
        A.select(_runs(), {"dd": 1})


def test_aggregate_fractions_of_failed_single_and_tied_cells():
    """A cell with no ok run has NaN fractions; a single ok run is a fraction of 1; half and
    half is 'mixed' (the label needs a strict majority); the label is ordered over every cell
    label."""
    df = pd.DataFrame({"run_id": range(5), "d": [1, 1, 2, 3, 3], "seed": [0, 1, 0, 0, 1],
                       "status": ["diverged", "diverged", "ok", "ok", "ok"],
                       "regime": ["diverged", "diverged", "benign", "benign", "harmful"]})
    agg = A.aggregate(df).set_index("d")
    assert np.isnan(agg.loc[1, "frac_benign"]) and agg.loc[1, "regime"] == "failed"
    assert agg.loc[2, "frac_benign"] == 1.0 and agg.loc[2, "regime"] == "benign"
    assert agg.loc[3, "frac_benign"] == 0.5 and agg.loc[3, "regime"] == "mixed"
    assert tuple(agg["regime"].cat.categories) == A.CELL_REGIMES and agg["regime"].cat.ordered


def _dynamics():
    """Two runs of two settings recorded at different steps (run 1 stops at 20)."""
    return pd.DataFrame({"run_id": [0, 0, 0, 1, 1], "d": [10, 10, 10, 20, 20],
                         "step": [0, 10, 30, 0, 20], "test_acc": [0.5, 0.7, 0.9, 0.4, 0.8]})


def test_aggregate_of_dynamics_keeps_the_step_and_selects_steps():
    dyn = _dynamics()
    agg = A.aggregate(dyn)
    assert list(zip(agg["d"], agg["step"])) == [(10, 0), (10, 10), (10, 30), (20, 0), (20, 20)]
    agg = A.aggregate(dyn, by=["d"])
    assert list(zip(agg["d"], agg["step"])) == [(10, 0), (10, 10), (10, 30), (20, 0), (20, 20)]
    last = A.aggregate(dyn, step="last")
    assert list(zip(last["d"], last["step"], last["test_acc_mean"])) == [(10, 30, 0.9),
                                                                         (20, 20, 0.8)]
    at0 = A.aggregate(dyn, step=0)
    assert at0["test_acc_mean"].tolist() == [0.5, 0.4]


def test_at_step_last_is_each_runs_own_last_record():
    dyn = _dynamics()
    assert A.at_step(dyn, "last")["step"].tolist() == [30, 20]
    # no run_id: the settings tell the runs apart; with none either, the first other column
    assert A.at_step(dyn.drop(columns="run_id"), "last")["step"].tolist() == [30, 20]
    bare = dyn.drop(columns=["run_id", "d"]).assign(key=[0, 0, 0, 1, 1])[["key", "step",
                                                                          "test_acc"]]
    assert A.at_step(bare, "last")["step"].tolist() == [30, 20]
    # a setting that is NaN for some runs is a key like any other value
    nan_d = dyn.drop(columns="run_id").assign(d=[np.nan] * 3 + [20.0] * 2)
    assert A.at_step(nan_d, "last")["step"].tolist() == [30, 20]
    assert A.at_step(dyn, [0, 20])["step"].tolist() == [0, 0, 20]
    # two runs of the same setting stop at different steps: the run id decides
    two = pd.concat([dyn, pd.DataFrame({"run_id": 2, "d": 10, "step": [0, 10], "test_acc": 1.0})])
    assert A.at_step(two, "last")["run_id"].tolist() == [0, 1, 2]


def test_at_step_messages():
    dyn = _dynamics()
    with pytest.raises(ValueError, match=re.escape(
            "at_step: the table has no step column (load the dynamics: pb.load(path, "
            "'dynamics'))")):
        A.at_step(dyn.drop(columns="step"), 10)
    with pytest.raises(ValueError, match=re.escape(
            "step = 'first': give a recorded step, a list of them or 'last'")):
        A.at_step(dyn, "first")
    with pytest.raises(ValueError, match=re.escape(
            "step = 5 was not recorded; fix: one of the recorded steps 0, 10, 20, 30")):
        A.at_step(dyn, [10, 5, 7])
    forty = pd.DataFrame({"run_id": 0, "step": np.arange(40), "test_acc": 1.0})
    with pytest.raises(ValueError) as e:
        A.at_step(forty, 99)
    assert str(e.value).endswith(", 38, 39")
    with pytest.raises(ValueError) as e:
        A.at_step(pd.concat([forty, forty.iloc[:1].assign(step=40)]), 99)
    assert str(e.value).endswith(", 38, 39 ...")


# --------------------------------------------------------------------------------------------
# phasebo.boundaries: one slice, the power law, the trajectory, the crossing
# --------------------------------------------------------------------------------------------

SLICE_KEYS = {"n_runs", "n_a", "n_b", "n_other", "boundary", "lo", "hi", "slope", "pseudo_r2",
              "n_seeds", "n_x", "status", "ci_level"}


def _fit_slice(rows, log=False, seed=0):
    return _slice(pd.DataFrame(rows), "x", "regime", ("A", "B"), log, 200, 0.95,
                  np.random.default_rng(seed))


def test_one_sided_slices_have_every_column_and_their_status():
    a = _fit_slice([{"x": x, "seed": s, "regime": "A"} for x in (1.0, 2.0) for s in range(3)])
    b = _fit_slice([{"x": x, "seed": s, "regime": "B"} for x in (1.0, 2.0) for s in range(3)])
    assert set(a) == SLICE_KEYS and set(b) == SLICE_KEYS
    assert (a["status"], b["status"]) == ("all_A", "all_B")
    assert (a["n_seeds"], a["n_x"], a["n_a"], b["n_b"]) == (3, 2, 6, 6)
    # a single A run is not "all B": the slice is fitted
    one = _fit_slice([{"x": x, "seed": s, "regime": "A" if (x, s) == (1.0, 0) else "B"}
                      for x in (1.0, 2.0, 3.0, 4.0) for s in range(3)], log=True)
    assert one["n_a"] == 1 and one["status"] not in ("all_A", "all_B", "too_few")


def test_a_steep_fit_through_one_mixed_point_is_unresolved_in_linear_x():
    """x = 1 all A, x = 3 all B, x = 2 half and half (log=False): the estimate is 2 exactly
    (the symmetric middle, in x's own units), the fit is far steeper than the grid spacing, so
    the status is 'unresolved' and the interval is the whole gap 1 .. 3."""
    rows = []
    for s in range(10):
        rows += [{"x": 1.0, "seed": s, "regime": "A"}, {"x": 3.0, "seed": s, "regime": "B"},
                 {"x": 2.0, "seed": s, "regime": "A" if s < 5 else "B"}]
    o = _fit_slice(rows)
    assert o["status"] == "unresolved"
    assert o["boundary"] == 2.0 and (o["lo"], o["hi"]) == (1.0, 3.0)
    assert set(o) == SLICE_KEYS and 0 < o["pseudo_r2"] < 1 and o["slope"] > 4


def test_a_shallow_fit_is_resolved_even_across_a_wide_gap():
    """96 runs at x = 1 (30 B), 96 at x = 2 (72 B): the transition is wider (4.39 / 1.89 in x)
    than the gap between the two values, so the estimate (1.418) stands with status 'ok' (its
    interval, 1.27 .. 1.60, inside the sampled range). With 4 runs at x = 2 (3 B) the same
    estimate's interval reaches past x = 2 (0.86 .. 5.1): the runs do not bound it, unbounded."""
    few = [{"x": 1.0, "regime": "B" if i < 30 else "A"} for i in range(96)] + \
        [{"x": 2.0, "regime": "B" if i < 3 else "A"} for i in range(4)]
    o = _fit_slice(few)
    assert o["status"] == "unbounded" and o["boundary"] == pytest.approx(1.4178, abs=1e-3)
    assert o["lo"] < 1.0 and o["hi"] > 2.0
    rows = [{"x": 1.0, "regime": "B" if i < 30 else "A"} for i in range(96)] + \
        [{"x": 2.0, "regime": "B" if i < 72 else "A"} for i in range(96)]
    o = _fit_slice(rows)
    assert o["status"] == "ok" and o["boundary"] == pytest.approx(1.4178, abs=1e-3)
    assert 1.0 < o["lo"] < o["boundary"] < o["hi"] < 2.0
    # two x values: the fit is saturated, so the slope per unit x is the logit difference and
    # the pseudo R^2 compares the two group proportions with the pooled one
    p1, p2, p0 = 30 / 96, 3 / 4, 102 / 192

    def ll(n, p):
        return n * (p * math.log(p) + (1 - p) * math.log(1 - p))

    assert o["slope"] == pytest.approx(math.log(p2 / (1 - p2)) - math.log(p1 / (1 - p1)),
                                       rel=1e-3)
    assert o["pseudo_r2"] == pytest.approx(1 - (ll(96, p1) + ll(96, p2)) / ll(192, p0), rel=1e-3)


def test_an_interval_beyond_the_floats_is_infinite_without_a_warning():
    """Four seeds and a weak trend: bootstrap replicates with almost no slope put the interval
    at 0 .. inf (in x); the estimate itself stands, and the slice is ``unbounded`` (placed by
    no interval: not ``ok``)."""
    grid = {0: "BBAB", 1: "ABAA", 2: "ABBB", 3: "AAAB"}  # seed -> regime at x = 1, 10, 100, 1000
    rows = [{"x": x, "seed": s, "regime": r} for s, regs in grid.items()
            for x, r in zip((1.0, 10.0, 100.0, 1000.0), regs)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o = _slice(pd.DataFrame(rows), "x", "regime", ("A", "B"), True, 50, 0.95,
                   np.random.default_rng(0))
    assert o["status"] == "unbounded"
    assert o["boundary"] == pytest.approx(math.sqrt(1000), rel=1e-6)
    assert (o["lo"], o["hi"]) == (0.0, math.inf)


def test_the_unresolved_decision_uses_the_fit_not_a_bootstrap_replicate():
    """A slice just on the 'ok' side of the unresolved rule: the decision reads the slope of the
    fit to all runs; the first bootstrap replicate's slope would call it 'unresolved'."""
    mid = {0: "BB", 1: "A", 2: "B", 3: "B", 4: "AA", 5: "B"}  # seed -> regime at x = 2 (, 2.5)
    rows = []
    for s, regs in mid.items():
        rows += [{"x": 1.0, "seed": s, "regime": "A"}, {"x": 3.0, "seed": s, "regime": "B"},
                 {"x": 2.0, "seed": s, "regime": regs[0]}]
        if len(regs) > 1:
            rows.append({"x": 2.5, "seed": s, "regime": regs[1]})
    o = _slice(pd.DataFrame(rows), "x", "regime", ("A", "B"), False, 20, 0.95,
               np.random.default_rng(1))
    assert o["status"] == "ok"


def test_a_slice_without_trend_has_no_boundary_and_no_warning():
    rows = [{"x": x, "seed": s, "regime": r} for x in (1.0, 2.0) for s, r in enumerate("AB")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o = _fit_slice(rows)
    assert o["status"] == "outside_range" and np.isnan(o["boundary"])


def _power_law_points(noise=(0.0, 0.0, 0.0), rel=1.1):
    n = np.array([25.0, 100.0, 400.0])
    y = 0.8 * n ** -0.5 * np.exp(np.array(noise))
    return pd.DataFrame({"n": n, "boundary": y, "lo": y / rel, "hi": y * rel, "status": "ok"})


def test_power_law_with_two_points_and_the_result_keys():
    """Two points fit exactly; chi2/dof is undefined (NaN, no warning) and the interval is the
    CIs' alone: half-width z·sd·√2 / ln 4 with sd = ln 1.1 / z95."""
    b = _power_law_points().iloc[[0, 1]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = fit_power_law(b, "n")
    keys = {"exponent", "lo", "hi", "prefactor", "n_points", "chi2_dof"}
    assert set(f) == keys and f["n_points"] == 2 and np.isnan(f["chi2_dof"])
    assert f["exponent"] == pytest.approx(-0.5, abs=1e-12)
    z = 1.959963984540054
    half = z * (math.log(1.1) / z) * math.sqrt(2) / math.log(4)
    assert (f["lo"], f["hi"]) == (pytest.approx(-0.5 - half, rel=1e-9),
                                  pytest.approx(-0.5 + half, rel=1e-9))
    fixed = fit_power_law(b, "n", exponent=-0.5)
    assert set(fixed) == keys and (fixed["lo"], fixed["hi"]) == (-0.5, -0.5)
    assert fixed["n_points"] == 2 and fixed["prefactor"] == pytest.approx(0.8, rel=1e-12)


def test_power_law_fixed_exponent_chi2_on_scattered_points():
    """With the exponent given, chi2/dof is the weighted residual sum over k - 1 degrees of
    freedom (no CIs: unit weights)."""
    b = _power_law_points(noise=(0.1, -0.1, 0.05)).drop(columns=["lo", "hi"])
    f = fit_power_law(b, "n", exponent=-0.5)
    r = np.log(b["boundary"]) + 0.5 * np.log(b["n"])
    assert f["chi2_dof"] == pytest.approx(np.sum((r - r.mean()) ** 2) / 2, rel=1e-12)
    assert f["prefactor"] == pytest.approx(math.exp(r.mean()), rel=1e-12)


def test_power_law_weights_a_zero_width_interval_like_the_median():
    """An interval of zero width (lo = hi) has no information about its width: it gets the
    median width of the others, not an infinite weight; 'separated' rows are fitted, rows of
    other statuses are not."""
    b = _power_law_points(noise=(0.1, -0.1, 0.05))
    b.loc[0, "lo"] = b.loc[0, "hi"] = b.loc[0, "boundary"]
    b.loc[1, ["lo", "hi"]] = b.loc[1, "boundary"] / 1.3, b.loc[1, "boundary"] * 1.3
    b.loc[2, "status"] = "separated"
    b = pd.concat([b, pd.DataFrame({"n": [1000.0], "boundary": [5.0], "lo": [4.0], "hi": [6.0],
                                    "status": ["outside_range"]})], ignore_index=True)
    f = fit_power_law(b, "n")
    z = 1.959963984540054
    sd = np.array([np.nan, math.log(1.3 ** 2), math.log(1.1 ** 2)]) / (2 * z)
    sd[0] = np.median(sd[1:])
    X, Y = np.log(b["n"][:3].to_numpy()), np.log(b["boundary"][:3].to_numpy())
    w = 1 / sd ** 2
    Aw = np.column_stack([np.ones(3), X]) * np.sqrt(w)[:, None]
    beta = np.linalg.lstsq(Aw, Y * np.sqrt(w), rcond=None)[0]
    assert f["n_points"] == 3 and f["exponent"] == pytest.approx(beta[1], rel=1e-10)


def test_exponents_over_steps_fit_each_step_with_enough_slices():
    b = _power_law_points()
    rows = [b.assign(step=10, d=[1, 2, 3]),
            pd.DataFrame({"n": [50.0], "boundary": [np.nan], "lo": np.nan, "hi": np.nan,
                          "status": ["all_A"], "step": 10, "d": 4}),
            b.assign(step=20, d=[1, 2, 3], status=["ok", "unresolved", "separated"]),
            b.iloc[:2].assign(step=30, d=[1, 2]),
            b.iloc[[2]].assign(step=30, d=3, status="outside_range")]
    traj = exponents_over_steps(pd.concat(rows, ignore_index=True).sample(frac=1, random_state=1),
                                "n")
    assert list(traj.columns) == ["step", "n_slices", "n_found", "exponent", "lo", "hi",
                                  "chi2_dof", "status"]
    assert traj["status"].tolist()[2] == "too_few_slices"
    assert traj["step"].tolist() == [10, 20, 30]
    assert traj["n_slices"].tolist() == [4, 3, 3] and traj["n_found"].tolist() == [3, 3, 2]
    full = fit_power_law(b, "n")
    for i in (0, 1):
        for k in ("exponent", "lo", "hi", "chi2_dof"):
            assert traj[k].iloc[i] == pytest.approx(full[k], rel=1e-12, abs=1e-12), k
    assert traj.iloc[2][["exponent", "lo", "hi", "chi2_dof"]].isna().all()


def test_first_crossing_interpolates_and_counts():
    u = np.array([0.0, 1.0, 2.0, 3.0])
    x, n = _first_crossing(u, np.array([0.5, 0.9, 0.97, 0.99]), 0.95)
    assert x == pytest.approx(1 + 0.05 / 0.07, rel=1e-12) and n == 1
    # a NaN mean is skipped: the crossing is between the finite neighbours
    x, n = _first_crossing(u[:3], np.array([0.5, np.nan, 0.97]), 0.95)
    assert x == pytest.approx(2 * 0.45 / 0.47, rel=1e-12) and n == 1
    # on the level counts as reached
    x, n = _first_crossing(u[:3], np.array([0.9, 0.95, 0.97]), 0.95)
    assert x == pytest.approx(1.0, rel=1e-12) and n == 1
    # not monotone: the first crossing, and every sign change counted
    x, n = _first_crossing(u, np.array([0.9, 0.96, 0.9, 0.97]), 0.95)
    assert x == pytest.approx(0.05 / 0.06, rel=1e-12) and n == 3
    # downwards, and never
    x, n = _first_crossing(u[:2] + 5, np.array([0.99, 0.9]), 0.95)
    assert x == pytest.approx(5 + 0.04 / 0.09, rel=1e-12) and n == 1
    for m in ([0.5, 0.6, 0.7, 0.8], [0.96, 0.97, 0.98, 0.99]):
        x, n = _first_crossing(u, np.array(m), 0.95)
        assert np.isnan(x) and n == 0


# --------------------------------------------------------------------------------------------
# phasebo.train: the bookkeeping of a run, called directly on planted arrays
# --------------------------------------------------------------------------------------------


def _loop_state(first_fit, diverge=-1):
    import jax.numpy as jnp

    from phasebo.train import LoopState

    n = len(first_fit)
    return LoopState(jnp.asarray(first_fit, jnp.int32), jnp.asarray(-1, jnp.int32),
                     jnp.arange(n, dtype=jnp.float64), jnp.asarray(diverge, jnp.int32), None,
                     jnp.asarray(-0.25, jnp.float64))


def _batch(flipped):
    import jax.numpy as jnp

    from phasebo.data import Batch

    n = len(flipped)
    y_clean = jnp.asarray([1.0, -1.0] * (n // 2), jnp.float64)
    fl = jnp.asarray(flipped, bool)
    return Batch(None, jnp.zeros((n, 2, 2)), jnp.where(fl, -y_clean, y_clean), y_clean, fl)


def test_finish_bookkeeping_on_planted_first_fit_steps(x64):
    import jax.numpy as jnp

    from phasebo.train import Status, finish

    def fin(first_fit, flipped, diverge=-1, roles=None, dtype=jnp.float64):
        out = finish({"train_acc": jnp.asarray(1.0)}, _loop_state(first_fit, diverge),
                     _batch(flipped), roles, dtype)
        return {k: np.asarray(v) for k, v in out.items()}

    F, T = False, True
    # three flipped samples fitted at 1, 2 and 4 (clean ones at 0, 3 and never)
    a = fin([0, 1, 2, 4, -1, 3], [F, T, T, T, F, F])
    assert set(a) == {"train_acc", "n_noisy", "frac_noisy_fitted", "noisy_fit_step",
                      "mean_noisy_fit_step", "all_fit_step", "diverge_step", "margin_mid",
                      "status"}
    assert (a["n_noisy"], a["noisy_fit_step"], a["frac_noisy_fitted"]) == (3, 4, 1.0)
    assert a["mean_noisy_fit_step"] == pytest.approx(7 / 3, rel=1e-14)
    assert a["noisy_fit_step"].dtype == np.int32 and a["status"].dtype == np.int32
    assert a["n_noisy"].dtype == np.int32
    assert (a["all_fit_step"], a["diverge_step"], a["margin_mid"]) == (-1, -1, -0.25)
    assert a["status"] == int(Status.OK)
    # the mean step is computed in the run's dtype, also a float32 run in a 64-bit session
    a32 = fin([0, 1, 2, 4, -1, 3], [F, T, T, T, F, F], dtype=jnp.float32)
    assert a32["mean_noisy_fit_step"].dtype == np.float32
    # one flipped sample never fitted: no noisy-fit step, 2 of 3 fitted
    b = fin([0, 1, -1, 4, 5, 3], [F, T, T, T, F, F], diverge=7)
    assert (b["noisy_fit_step"], b["frac_noisy_fitted"]) == (-1, pytest.approx(2 / 3))
    assert b["mean_noisy_fit_step"] == pytest.approx(2.5)
    assert b["status"] == int(Status.DIVERGED) and b["diverge_step"] == 7
    # a single flipped sample is a fraction like any other; none at all is NaN and -1
    c = fin([0, 5, 2, 2], [F, T, F, F])
    assert (c["n_noisy"], c["noisy_fit_step"], c["frac_noisy_fitted"]) == (1, 5, 1.0)
    d = fin([0, 5, 2, 2], [F, F, F, F])
    assert d["noisy_fit_step"] == -1 and np.isnan(d["frac_noisy_fitted"])
    assert np.isnan(d["mean_noisy_fit_step"])
    # with token roles: cumS summed per group (cumS of sample i is i here)
    e = fin([0, 5, 2, 2, 1, 1], [F, T, T, F, F, F], roles=object())
    # y_clean = +, -, +, -, +, -; flipped = 1, 2
    assert {g: float(e[f"cumS_{g}"]) for g in ("clean_pos", "clean_neg", "noisy_pos",
                                               "noisy_neg")} == \
        {"clean_pos": 0 + 4, "clean_neg": 3 + 5, "noisy_pos": 2, "noisy_neg": 1}


def test_observe_first_fit_all_fit_and_cumS(x64):
    """A sample fitted at step 0 keeps first-fit step 0 however often it is fitted again; one
    with margin 0.5 is fitted (margin > 0); every sample fitted together first at step 2;
    cumS adds s_R (1 - s_R) at every step."""
    import jax.numpy as jnp

    from phasebo.train import LoopState

    ls = LoopState(jnp.full(3, -1, jnp.int32), jnp.asarray(-1, jnp.int32),
                   jnp.zeros(3, jnp.float64), jnp.asarray(-1, jnp.int32), None,
                   jnp.asarray(0.0, jnp.float64))
    margins = [[0.5, -1.0, -1.0], [0.5, 0.5, -1.0], [0.5, -0.1, 0.0], [0.5, 0.5, 2.0],
               [0.5, 0.5, 2.0]]
    s = jnp.asarray([0.2, 0.5, 0.9], jnp.float64)
    for t, m in enumerate(margins):
        ls = ls.observe(t, jnp.asarray(m, jnp.float64), s, lambda s: s)
    assert np.asarray(ls.first_fit).tolist() == [0, 1, 3]
    assert int(ls.all_fit) == 3
    np.testing.assert_allclose(np.asarray(ls.cumS), 5 * np.array([0.16, 0.25, 0.09]),
                               rtol=1e-14)
    same = ls.observe(9, jnp.asarray([0.5, 0.5, 2.0]), s, None)
    np.testing.assert_array_equal(np.asarray(same.cumS), np.asarray(ls.cumS))
    assert int(same.all_fit) == 3 and np.asarray(same.first_fit).tolist() == [0, 1, 3]
