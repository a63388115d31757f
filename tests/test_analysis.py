"""The results API: aggregation against hand-computed numbers, pivot orientation, load, export."""

import math

import numpy as np
import pandas as pd
import pytest

import phasebo as pb
from phasebo import analysis as A
from phasebo.settings import ConfigError


def synthetic_runs() -> pd.DataFrame:
    """2 x 2 grid (d, signal_norm), 3 seeds per cell; one cell has a diverged run, one cell is
    missing entirely (d=200, signal_norm=10)."""
    rows = [
        # d, mu, seed, train_acc, test_acc, status, regime, noisy_fit_step
        (100, 5.0, 0, 1.0, 0.90, "ok", "harmful", 40),
        (100, 5.0, 1, 1.0, 0.96, "ok", "benign", 60),
        (100, 5.0, 2, 0.9, 0.99, "ok", "not_overfitting", -1),
        (100, 10.0, 0, 1.0, 1.00, "ok", "benign", 10),
        (100, 10.0, 1, 1.0, 0.98, "ok", "benign", 20),
        (100, 10.0, 2, np.nan, np.nan, "diverged", "diverged", -1),
        (200, 5.0, 0, 1.0, 0.80, "ok", "harmful", 5),
        (200, 5.0, 1, 1.0, 0.70, "ok", "harmful", 7),
        (200, 5.0, 2, 1.0, 0.97, "ok", "benign", 9),
    ]
    df = pd.DataFrame(rows, columns=["d", "signal_norm", "seed", "train_acc", "test_acc", "status",
                                     "regime", "noisy_fit_step"])
    df.insert(0, "run_id", np.arange(len(df)))
    df["n"] = 20
    df["model"] = "prompt_attention"
    return df


def test_aggregate_matches_hand_computed_numbers():
    agg = A.aggregate(synthetic_runs())
    assert list(agg[["d", "signal_norm"]].itertuples(index=False, name=None)) == [
        (100, 5.0), (100, 10.0), (200, 5.0)]
    c = agg.set_index(["d", "signal_norm"])
    a = c.loc[(100, 5.0)]
    vals = np.array([0.90, 0.96, 0.99])
    assert a["test_acc_mean"] == pytest.approx(vals.mean())
    assert a["test_acc_se"] == pytest.approx(vals.std(ddof=1) / math.sqrt(3))
    assert a["test_acc_min"] == pytest.approx(0.90)
    assert a["test_acc_max"] == pytest.approx(0.99)
    assert a["train_acc_mean"] == pytest.approx((1 + 1 + 0.9) / 3)
    assert (a["n_seeds"], a["n_runs"], a["n_ok"], a["n_failed"]) == (3, 3, 3, 0)
    assert a["frac_benign"] == pytest.approx(1 / 3)
    assert a["frac_harmful"] == pytest.approx(1 / 3)
    assert a["frac_not_overfitting"] == pytest.approx(1 / 3)
    assert a["regime"] == "mixed"  # no strict majority
    # the step "never" (-1) is left out of the mean
    assert a["noisy_fit_step_mean"] == pytest.approx(50.0)

    b = c.loc[(100, 10.0)]  # one diverged run: excluded and counted
    assert (b["n_seeds"], b["n_ok"], b["n_failed"]) == (3, 2, 1)
    assert b["test_acc_mean"] == pytest.approx(0.99)
    assert b["test_acc_se"] == pytest.approx(np.std([1.0, 0.98], ddof=1) / math.sqrt(2))
    assert b["frac_benign"] == 1.0 and b["regime"] == "benign"

    e = c.loc[(200, 5.0)]
    assert e["frac_harmful"] == pytest.approx(2 / 3) and e["regime"] == "harmful"
    assert e["noisy_fit_step_mean"] == pytest.approx(7.0)
    # constant settings are carried over, identifiers are not
    assert (agg["n"] == 20).all() and "seed" not in agg.columns and "run_id" not in agg.columns


def test_aggregate_single_seed_has_nan_se_and_all_failed_cell_is_failed():
    df = synthetic_runs()
    df = df[~((df["d"] == 100) & (df["signal_norm"] == 10.0) & (df["seed"] < 2))]
    df = pd.concat([df, synthetic_runs().iloc[[0]].assign(d=300)])
    agg = A.aggregate(df).set_index(["d", "signal_norm"])
    assert agg.loc[(100, 10.0), "regime"] == "failed"
    assert agg.loc[(100, 10.0), "n_ok"] == 0
    assert np.isnan(agg.loc[(100, 10.0), "test_acc_mean"])
    assert np.isnan(agg.loc[(300, 5.0), "test_acc_se"])  # one seed: no standard error
    assert agg.loc[(300, 5.0), "test_acc_mean"] == pytest.approx(0.90)


def test_pivot_orientation_and_missing_cells():
    runs = synthetic_runs().sample(frac=1.0, random_state=0)  # order must not matter
    g = A.pivot(runs, x="signal_norm", y="d", value="test_acc")
    assert list(g.index) == [100, 200]  # rows: y increasing away from the origin
    assert list(g.columns) == [5.0, 10.0]  # columns: x increasing
    assert g.index.name == "d" and g.columns.name == "signal_norm"
    assert g.loc[100, 5.0] == pytest.approx(np.mean([0.90, 0.96, 0.99]))
    assert g.loc[100, 10.0] == pytest.approx(0.99)
    assert np.isnan(g.loc[200, 10.0])  # missing cell
    r = A.pivot(A.aggregate(runs), "signal_norm", "d", "regime")
    assert r.loc[200, 5.0] == "harmful" and pd.isna(r.loc[200, 10.0])


def test_pivot_refuses_an_unfixed_third_axis():
    df = pd.concat([synthetic_runs().assign(n=20), synthetic_runs().assign(n=40)])
    with pytest.raises(ValueError, match="n"):
        A.pivot(df, "signal_norm", "d", "test_acc")
    g = A.pivot(df, "signal_norm", "d", "test_acc", where={"n": 40})
    assert g.shape == (2, 2)
    # a misspelt axis is named as missing, not as "n varies besides it"
    with pytest.raises(KeyError, match="no column 'dim'"):
        A.pivot(df, "signal_norm", "dim", "test_acc")


def _write_sweep(d, runs):
    d.mkdir()
    runs.to_parquet(d / "results.parquet")
    pd.DataFrame({"run_id": [0, 0, 1], "step": [0, 5, 0], "test_acc": [0.5, 0.6, 0.7]}
                 ).to_parquet(d / "dynamics.parquet")


def test_load_several_sweeps_dynamics_join_and_export(tmp_path):
    base = synthetic_runs().assign(root_seed=0)
    _write_sweep(tmp_path / "a", base)
    # the same settings under another root seed: other runs (other ids), more seeds per cell
    _write_sweep(tmp_path / "b", base.assign(root_seed=1, run_id=base["run_id"] + 100,
                                             test_acc=base["test_acc"] + 0.01))
    both = pb.load([tmp_path / "a", tmp_path / "b" / "results.parquet"])
    assert len(both) == 18 and both["source"].nunique() == 2
    assert "source" not in A.cell_axes(both) and "root_seed" not in A.cell_axes(both)
    agg = A.aggregate(both)
    c = agg.set_index(["d", "signal_norm"])
    assert c.loc[(100, 10.0), "n_seeds"] == 6  # distinct (seed, root_seed) pairs
    dyn = pb.load_dynamics(tmp_path / "a")
    assert list(dyn["d"]) == [100, 100, 100] and list(dyn["seed"]) == [0, 0, 1]
    for suffix in ("csv", "parquet"):
        p = pb.export(agg, tmp_path / f"cells.{suffix}")
        back = pd.read_csv(p) if suffix == "csv" else pd.read_parquet(p)
        assert back.shape == agg.shape
        assert np.allclose(back["test_acc_mean"], agg["test_acc_mean"], equal_nan=True)
    with pytest.raises(ValueError, match="csv"):
        pb.export(agg, tmp_path / "cells.xlsx")
    with pytest.raises(pb.ConfigError, match="does not exist"):
        pb.load(tmp_path / "nope")
    (tmp_path / "notes.md").write_text("not a table")  # a file pyarrow cannot read: one line
    with pytest.raises(pb.ConfigError, match="notes.md is not a Parquet table .*; fix: give a "):
        pb.load(tmp_path / "notes.md")


def test_loading_the_same_runs_twice_keeps_them_once(tmp_path):
    _write_sweep(tmp_path / "a", synthetic_runs())
    _write_sweep(tmp_path / "b", synthetic_runs())
    with pytest.warns(UserWarning, match="9 runs appear in more than one"):
        both = pb.load([tmp_path / "a", tmp_path / "b"])
    assert len(both) == 9
    assert A.aggregate(both).set_index(["d", "signal_norm"]).loc[(100, 5.0), "n_seeds"] == 3
    with pytest.raises(pb.ConfigError, match="load each run once"):
        pb.load([tmp_path / "a", tmp_path / "b"], duplicates="error")


def test_aggregate_never_pools_a_varying_setting_silently():
    runs = synthetic_runs()
    with pytest.raises(ValueError, match=r"signal_norm varies inside the cells of by=\['d'\]"):
        A.aggregate(runs, by=["d"])
    pooled = A.aggregate(runs, by=["d"], over=["signal_norm"])
    assert "signal_norm" not in pooled.columns  # dropped, not filled from the first row
    assert pooled.set_index("d").loc[100, "n_runs"] == 6
    assert pooled.set_index("d").loc[100, "n_seeds"] == 3  # the same 3 seeds in both cells
    assert (pooled["n"] == 20).all()  # constant settings stay


def test_aggregate_metrics_and_names():
    agg = A.aggregate(synthetic_runs(), metrics=["test_acc"])
    stats = [c for c in agg.columns if c.startswith("test_acc")]
    assert stats == ["test_acc_mean", "test_acc_se", "test_acc_min", "test_acc_max"]
    assert not [c for c in agg.columns if c.startswith("train_acc")]
    assert "n" not in agg.columns  # metrics=: just the cells, counts, regimes and those metrics
    full = A.aggregate(synthetic_runs())
    assert full.columns.is_unique and not [c for c in full.columns if c.endswith("_mean_mean")]


def test_regime_fractions_have_wilson_intervals():
    agg = A.aggregate(synthetic_runs()).set_index(["d", "signal_norm"])
    e = agg.loc[(200, 5.0)]  # 2 harmful of 3
    lo, hi = pb.wilson(2, 3)
    assert e["frac_harmful_lo"] == pytest.approx(lo) and e["frac_harmful_hi"] == pytest.approx(hi)
    # Wilson's interval at z = 1.96 for 2/3: (0.2077, 0.9385)
    assert (lo, hi) == pytest.approx((0.2077, 0.9385), abs=1e-4)
    assert e["frac_harmful_se"] == pytest.approx(np.sqrt(2 / 3 * 1 / 3 / 3))
    assert agg["regime"].dtype == "category" and agg["regime"].cat.ordered


def test_loading_an_interrupted_sweep(tmp_path):
    parts = tmp_path / "s" / "parts"
    parts.mkdir(parents=True)
    synthetic_runs().iloc[:4].to_parquet(parts / "results-a.parquet")
    with pytest.raises(pb.ConfigError, match="unfinished sweep.*partial=True"):
        pb.load(tmp_path / "s")
    assert len(pb.load(tmp_path / "s", partial=True)) == 4
    # the error names the command that finishes it, from the manifest
    (tmp_path / "s" / "manifest.json").write_text('{"command": "phasebo sweep big.toml"}')
    with pytest.raises(pb.ConfigError, match=r"run its command again \(phasebo sweep big.toml\)"):
        pb.load(tmp_path / "s")
    from phasebo.cli import run as cli

    assert cli(["report", str(tmp_path / "s")]) == 2  # the report says the same


def test_a_sweep_file_given_for_its_results_says_to_run_it(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('name = "wide"\n[settings]\nd = 40\n')
    with pytest.raises(pb.ConfigError, match=r"is a sweep file, not its results; fix: run it "
                                             r"first \(phasebo sweep .*mine.toml\), then give "
                                             r"its output directory \(results/wide\)"):
        pb.load(f)


def test_at_step_refuses_a_step_that_is_not_whole():
    dyn = pd.DataFrame({"run_id": [1, 1, 2, 2], "step": [0, 100, 0, 100], "test_acc": [.5, .9, .5, .8]})
    assert len(A.at_step(dyn, 100)) == 2 and len(A.at_step(dyn, np.float64(100.0))) == 2
    for bad in (100.5, [0, 99.99999]):
        with pytest.raises(ValueError, match="whole number"):
            A.at_step(dyn, bad)


def test_wilson_intervals_stay_in_zero_one():
    lo, hi = pb.wilson(10, 10)
    assert hi == 1.0 and 0 < lo < 1
    lo, hi = pb.wilson(0, 10)
    assert lo == 0.0 and 0 < hi < 1
    lo, hi = pb.wilson(np.array([0, 3, 7, 7]), np.array([7, 7, 7, 0]))
    assert lo[0] == 0.0 and hi[2] == 1.0 and np.isnan(lo[3]) and np.isnan(hi[3])
    assert np.all((lo[:3] >= 0) & (hi[:3] <= 1) & (lo[:3] < hi[:3]))
    assert np.isnan(pb.wilson(0, 0)[0])


def test_pivot_says_what_it_cannot_do_instead_of_returning_less():
    """A ``where`` no row matches, a ``step`` on a table without recorded steps and a misspelt
    value are errors (they returned an empty grid, the final step, a column dump); a metric's
    name means its mean on an aggregate too."""
    runs = synthetic_runs()
    with pytest.raises(ValueError, match="n = 40 is in no row; the table has n = 20"):
        A.pivot(runs, "signal_norm", "d", "test_acc", where={"n": 40})
    with pytest.raises(ValueError, match="d = 999 is in no row"):  # select says it too
        pb.select(runs, {"d": 999})
    # a value copied as displayed, rounded: the nearest the table holds is named
    cells = pd.DataFrame({"snr": [0.0889140123, 0.12]})
    with pytest.raises(ValueError, match=r"fix: snr = 0.0889140123, the nearest"):
        pb.select(cells, {"snr": 0.088914})
    both = pb.select(runs, {"d": runs["d"].iloc[0], "n": 20})  # values present select their rows
    assert len(both) and (both["d"] == runs["d"].iloc[0]).all()
    # NaN: the runs without the setting (a model that does not take it), as slices name them
    mixed = runs.assign(flow_time=np.where(np.arange(len(runs)) % 2, np.nan, 5.0))
    assert len(pb.select(mixed, {"flow_time": float("nan")})) == len(runs) // 2
    with pytest.raises(ValueError, match="no step column"):
        A.pivot(runs, "signal_norm", "d", "test_acc", step=1000)
    with pytest.raises(KeyError, match="did you mean 'test_acc'"):
        A.pivot(runs, "signal_norm", "d", "test_ac")
    cells = A.aggregate(runs)
    g = A.pivot(cells, "signal_norm", "d", "test_acc")
    assert g.loc[100, 5.0] == pytest.approx(np.mean([0.90, 0.96, 0.99]))


def test_boundaries_refuses_an_aggregate_a_stepless_step_and_one_axis_twice():
    runs = synthetic_runs()
    with pytest.raises(ValueError, match="one row per run"):
        pb.boundaries(A.aggregate(runs), "signal_norm", "d", ("benign", "harmful"))
    with pytest.raises(ValueError, match="no step column"):
        pb.boundaries(runs, "signal_norm", "d", ("benign", "harmful"), step=500)
    with pytest.raises(ValueError, match="x and y are both 'd'"):
        pb.boundaries(runs, "d", "d", ("benign", "harmful"))
    a = pb.boundaries(runs, "signal_norm", "d", "benign,harmful")  # the command line's form
    b = pb.boundaries(runs, "signal_norm", "d", ("benign", "harmful"))
    pd.testing.assert_frame_equal(a, b)


def test_aggregate_refuses_an_aggregate_and_the_regime_as_a_metric():
    cells = A.aggregate(synthetic_runs())
    with pytest.raises(ValueError, match="an aggregate already"):
        A.aggregate(cells)
    with pytest.raises(ValueError, match="regime is a category"):
        A.aggregate(synthetic_runs(), metrics=["regime"])


def test_a_dynamics_row_has_its_runs_status_at_that_step(tmp_path):
    """A run that diverged at step 5 was ok at step 0: its dynamics rows before ``diverge_step``
    are data (ok, counted in the aggregates and the maps at that step), from it on diverged; a
    run that never diverged (-1) is ok at every step."""
    runs = synthetic_runs()
    runs["diverge_step"] = -1
    runs.loc[runs["status"] == "diverged", "diverge_step"] = 5
    d = tmp_path / "a"
    d.mkdir()
    runs.to_parquet(d / "results.parquet")
    bad = int(runs.loc[runs["status"] == "diverged", "run_id"].iloc[0])
    pd.DataFrame({"run_id": [bad, bad, bad, 0], "step": [0, 4, 5, 5],
                  "test_acc": [0.5, 0.6, np.nan, 0.7]}).to_parquet(d / "dynamics.parquet")
    dyn = pb.load_dynamics(d).set_index(["run_id", "step"])
    assert [dyn.loc[(bad, s), "status"] for s in (0, 4, 5)] == ["ok", "ok", "diverged"]
    assert dyn.loc[(0, 5), "status"] == "ok"
    assert pb.aggregate(pb.load_dynamics(d), step=4)["n_ok"].sum() == 1


def test_loading_a_table_without_runs_is_one_line(tmp_path):
    """An exported aggregate has no run_id: pb.load says what it is instead of a KeyError."""
    A.aggregate(synthetic_runs()).to_parquet(tmp_path / "cells.parquet")
    with pytest.raises(ConfigError, match="holds no runs"):
        A.load(tmp_path / "cells.parquet")


def test_the_dynamics_of_a_limit_sweep_are_refused_with_the_limits_reason(tmp_path):
    """The converged limit refuses record_every and record_log: the error about its missing
    dynamics must not suggest them."""
    synthetic_runs().assign(dynamics="limit").to_parquet(tmp_path / "results.parquet")
    with pytest.raises(ConfigError, match="the converged limit has no time axis") as e:
        A.load(tmp_path, "dynamics")
    assert "record_every" not in str(e.value)


def test_a_cell_with_half_or_more_of_its_runs_failed_is_failed_not_its_few_ok_runs_regime():
    """One benign run beside three unsolved ones is not a benign cell; one failed run of three
    leaves the cell to its two ok runs (the failed run counted in n_failed)."""
    df = synthetic_runs()
    cell = (df["d"] == 100) & (df["signal_norm"] == 10.0)
    for n_bad, want in ((1, "benign"), (2, "failed"), (3, "failed")):
        runs = df[cell].iloc[:3].copy().assign(regime="benign", status="ok")
        runs = pd.concat([runs, runs.iloc[[0]].assign(seed=99)])  # four runs
        runs.iloc[:n_bad, runs.columns.get_loc("status")] = "unsolved"
        runs.iloc[:n_bad, runs.columns.get_loc("regime")] = "unsolved"
        agg = A.aggregate(runs).iloc[0]
        assert (agg["n_runs"], agg["n_failed"]) == (4, n_bad)
        assert agg["regime"] == want, (n_bad, agg["regime"])
