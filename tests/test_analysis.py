"""The results API: aggregation against hand-computed numbers, pivot orientation, load, export."""

import math

import numpy as np
import pandas as pd
import pytest

import phasebo as pb
from phasebo import analysis as A


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
    assert (a["n_seeds"], a["n_ok"], a["n_failed"]) == (3, 3, 0)
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


def test_load_several_sweeps_dynamics_join_and_export(tmp_path):
    for name, off in (("a", 0.0), ("b", 0.01)):
        d = tmp_path / name
        d.mkdir()
        runs = synthetic_runs().assign(test_acc=lambda t, off=off: t["test_acc"] + off)
        runs.to_parquet(d / "results.parquet")
        pd.DataFrame({"run_id": [0, 0, 1], "step": [0, 5, 0], "test_acc": [0.5, 0.6, 0.7]}
                     ).to_parquet(d / "dynamics.parquet")
    both = pb.load([tmp_path / "a", tmp_path / "b" / "results.parquet"])
    assert len(both) == 18 and both["source"].nunique() == 2
    assert "source" in A.cell_axes(both)
    agg = A.aggregate(both, by=["d", "signal_norm"])  # pool the two sweeps' seeds
    assert agg.set_index(["d", "signal_norm"]).loc[(100, 10.0), "n_seeds"] == 6
    dyn = pb.load_dynamics(tmp_path / "a")
    assert list(dyn["d"]) == [100, 100, 100] and list(dyn["seed"]) == [0, 0, 1]
    for suffix in ("csv", "parquet"):
        p = pb.export(agg, tmp_path / f"cells.{suffix}")
        back = pd.read_csv(p) if suffix == "csv" else pd.read_parquet(p)
        assert back.shape == agg.shape
        assert np.allclose(back["test_acc_mean"], agg["test_acc_mean"], equal_nan=True)
    with pytest.raises(ValueError, match="csv"):
        pb.export(agg, tmp_path / "cells.xlsx")
    with pytest.raises(FileNotFoundError):
        pb.load(tmp_path / "nope")
