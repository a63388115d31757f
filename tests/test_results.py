"""The results schema: every table records its column groups, and a reader tells settings from
metrics by them, not by this version's model registry."""

import numpy as np
import pandas as pd
import pytest
from test_sweep import small_spec

import phasebo as pb
from phasebo import analysis as A
from phasebo import results as R
from phasebo.sweep import run_sweep


def test_column_groups_split_by_role():
    g = R.column_groups(["sweep", "run_id", "seed", "d", "model", "engine", "lr", "snr", "step",
                         "status", "regime", "test_acc", "p_norm"], settings={"d", "lr"})
    assert g == {"settings": ["d", "model", "engine", "lr"], "run": ["sweep", "run_id", "seed"],
                 "derived": ["snr"], "keys": ["step"], "labels": ["status", "regime"],
                 "metrics": ["test_acc", "p_norm"]}
    merged = R.merge_groups([None, {"settings": ["d"], "metrics": ["x"]},
                             {"settings": ["x", "lr"], "metrics": ["test_acc"]}])
    assert merged["settings"] == ["d", "x", "lr"] and merged["metrics"] == ["test_acc"]
    assert R.merge_groups([None, None]) is None


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("res") / "out"
    run_sweep(small_spec(seeds=2), out, quiet=True, plots=False)
    return out


def test_every_table_records_its_groups(swept):
    from phasebo.registry import get_model

    settings = set(get_model("prompt_attention").settings)
    for table, key in (("results", None), ("dynamics", "step"), ("samples", "sample")):
        g = R.groups_of(swept / f"{table}.parquet")
        cols = list(pd.read_parquet(swept / f"{table}.parquet").columns)
        assert sorted(c for v in g.values() for c in v) == sorted(cols), table  # each once
        assert g["keys"] == ([key] if key else [])
        if table == "results":
            assert set(g["settings"]) == ((settings | {"model", "engine"}) & set(cols)) - {"root_seed"}
            assert {"test_acc", "train_loss", "margin"} <= set(g["metrics"])
            assert g["labels"] == ["status", "regime"] and "run_id" in g["run"]
    # the parts carry them too (a reader of an unfinished sweep)
    part = next((swept / "parts").glob("results-*.parquet"))
    assert R.groups_of(part)["settings"] == R.groups_of(swept / "results.parquet")["settings"]


def test_loading_needs_no_registry(swept, tmp_path):
    """A file whose model and settings this version does not know (a later version's, a user's
    own model) is read by its recorded groups: its setting is an axis, not a metric."""
    df = pb.load(swept).drop(columns="source")
    df["model"] = "future_model"
    df["future_width"] = np.where(df["seed"] == 0, 8, 16)  # a setting no model here has
    df["future_metric"] = df["test_acc"] * 2
    g = R.merge_groups([{"settings": ["future_width"], "metrics": ["future_metric"]},
                        df.attrs["column_groups"]])
    R.write_table_atomic(df, tmp_path / "results.parquet", g)
    back = pb.load(tmp_path / "results.parquet")
    assert "future_width" in A.cell_axes(back) and "future_width" not in A.metric_columns(back)
    assert "future_metric" in A.metric_columns(back)
    # it survives filtering, as analyses do
    assert "future_width" in A.setting_columns(back[back["d"] == back["d"].iloc[0]])
    # a table without recorded groups (an older file) falls back to this version's settings
    plain = tmp_path / "plain.parquet"
    older = pd.read_parquet(tmp_path / "results.parquet")
    assert older.attrs["column_groups"] == back.attrs["column_groups"]  # pandas keeps them too
    resaved = tmp_path / "resaved.parquet"  # pb.load, filter, to_parquet: both readers agree
    back[back["seed"] == 0].to_parquet(resaved)
    assert R.groups_of(resaved) == back.attrs["column_groups"]
    older.attrs = {}
    older.to_parquet(plain)
    old = pb.load(plain)
    assert R.groups_of(plain) is None
    assert "column_groups" not in old.attrs and "future_width" in A.metric_columns(old)
    assert "d" in A.setting_columns(old)


def test_dynamics_rows_get_their_runs_groups(swept):
    dyn = pb.load(swept, "dynamics")
    g = dyn.attrs["column_groups"]
    assert "d" in g["settings"] and g["keys"] == ["step"] and "step" not in A.metric_columns(dyn)
