"""Tidy results tables: rows from run outputs, regimes, Parquet parts and their assembly.

Three long-format tables, one row per:

- ``results``: run (settings, derived SNR columns, final metrics, ``status``, ``regime``);
- ``dynamics``: (run, recorded step), when the sweep records dynamics;
- ``samples``: (run, training sample): clean label, flipped, first-fit step, final margin.

Parts are written atomically (temporary file + rename) as a sweep goes; ``assemble`` joins them,
checks that every run id appears exactly once, and writes ``results.parquet`` / ``results.csv``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

REGIMES = ("benign", "harmful", "not_overfitting")


def classify_regime(
    train_acc, test_acc, status, test_eps=0.05, train_acc_fit=1.0
) -> np.ndarray:
    """SPEC §3: not_overfitting if train acc < fit threshold; else benign iff test acc >=
    1 - test_eps, harmful otherwise. Runs whose status is not ``ok`` get their status instead."""
    train_acc = np.asarray(train_acc, float)
    test_acc = np.asarray(test_acc, float)
    status = np.asarray(status, object)
    test_eps = np.broadcast_to(np.asarray(test_eps, float), train_acc.shape)
    fit_thr = np.broadcast_to(np.asarray(train_acc_fit, float), train_acc.shape)
    fits = train_acc >= fit_thr - 1e-6  # accuracies are k/n in float32
    good = test_acc >= 1 - test_eps - 1e-6
    out = np.where(fits, np.where(good, "benign", "harmful"), "not_overfitting").astype(object)
    bad = status != "ok"
    out[bad] = status[bad]
    return out


def derived_columns(df: pd.DataFrame) -> pd.DataFrame:
    """SNR columns: ``snr = ||mu|| / (sigma_eps sqrt d)`` and ``n_snr2 = n snr^2`` (SPEC §1, §2)."""
    if {"signal_norm", "d"} <= set(df.columns):
        sigma = df["sigma_eps"] if "sigma_eps" in df.columns else 1.0
        df["snr"] = df["signal_norm"] / (sigma * np.sqrt(df["d"].astype(float)))
        if "n" in df.columns:
            df["n_snr2"] = df["n"] * df["snr"] ** 2
    return df


def write_table_atomic(df: pd.DataFrame, path: Path) -> None:
    """Write Parquet through a temporary file and an atomic rename (never a half-written file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")  # unique across hosts
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp)
    os.replace(tmp, path)


def write_csv_atomic(df: pd.DataFrame, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    df.to_csv(tmp, index=False)
    os.replace(tmp, path)


def read_parts(parts_dir: Path, kind: str, tags: set[str] | None = None) -> pd.DataFrame | None:
    """Concatenate the ``kind`` parts; with ``tags``, only the chunks whose tag is in it."""
    files = sorted(Path(parts_dir).glob(f"{kind}-*.parquet"))
    if tags is not None:
        files = [f for f in files if f.name[len(kind) + 1 :] in tags]
    if not files:
        return None
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def done_run_ids(parts_dir: Path) -> set[int]:
    """Run ids already written as parts (each part is complete: it was renamed into place)."""
    ids: set[int] = set()
    for f in sorted(Path(parts_dir).glob("results-*.parquet")):
        ids.update(pq.read_table(f, columns=["run_id"]).column(0).to_pylist())
    return ids


def assemble(out_dir: Path, n_runs: int) -> pd.DataFrame:
    """Join the parts into ``results.parquet``/``.csv`` (+ ``dynamics``/``samples`` Parquet)."""
    out_dir = Path(out_dir)
    parts = out_dir / "parts"
    df = read_parts(parts, "results")
    if df is None:
        raise RuntimeError(f"no result parts under {parts}")
    df = df.sort_values("run_id", kind="stable").reset_index(drop=True)
    dup = df["run_id"].duplicated()
    if dup.any():
        raise RuntimeError(f"run ids written twice: {df.loc[dup, 'run_id'].tolist()[:10]}")
    missing = sorted(set(range(n_runs)) - set(df["run_id"]))
    if missing:
        raise RuntimeError(f"{len(missing)} runs missing from the parts, e.g. {missing[:10]}")
    write_table_atomic(df, out_dir / "results.parquet")
    write_csv_atomic(df, out_dir / "results.csv")
    # A chunk killed after its dynamics/samples parts but before its results part was rerun
    # (maybe in other chunks): read only the parts of chunks whose results part exists.
    tags = {f.name[len("results-") :] for f in parts.glob("results-*.parquet")}
    for kind in ("dynamics", "samples"):
        t = read_parts(parts, kind, tags)
        if t is not None:
            sort = ["run_id", "step" if kind == "dynamics" else "sample"]
            t = t.sort_values(sort, kind="stable").reset_index(drop=True)
            write_table_atomic(t, out_dir / f"{kind}.parquet")
    return df


def load_results(path: str | Path) -> pd.DataFrame:
    """Read a sweep's results: a results directory or a ``results.parquet`` file."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.parquet"
    return pd.read_parquet(path)
