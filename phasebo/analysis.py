"""The results API: load sweeps, aggregate over seeds, pivot two axes to a grid, export.

A sweep directory holds three long tables (:mod:`phasebo.results`): ``results.parquet`` (one row
per run), ``dynamics.parquet`` (one row per run and recorded step) and ``samples.parquet`` (one
row per run and training sample). This module reads them with pandas and reduces them::

    import phasebo as pb
    runs = pb.load("results/default")                    # one or several sweeps
    cells = pb.aggregate(runs)                           # one row per grid cell
    g = pb.pivot(cells, x="signal_norm", y="d", value="test_acc_mean")
    pb.export(cells, "cells.csv")

**Cells.** A *cell* is a combination of the settings that vary across the loaded runs (the grid
axes), with the seeds pooled. Runs whose ``status`` is not ``"ok"`` (diverged, ...) are left out
of every statistic and counted in ``n_failed``.

**Aggregate columns.** For every numeric metric ``m``: ``m_mean``, ``m_se`` (standard error,
``std(ddof=1)/sqrt(k)`` over the ``k`` ok runs with a finite value; NaN when ``k < 2``),
``m_min``, ``m_max``. Per cell also ``n_seeds`` (runs in the cell), ``n_ok``, ``n_failed``,
``frac_benign``, ``frac_harmful``, ``frac_not_overfitting`` (fractions of the ok runs) and
``regime``: the regime of a strict majority of the ok runs, ``"mixed"`` when there is none, and
``"failed"`` when no run of the cell is ok.

Step columns (``*_step``, e.g. ``noisy_fit_step``) use ``-1`` for "never"; they are read as NaN
("never happened") before aggregation, so ``noisy_fit_step_mean`` is the mean over the runs that
did fit every flipped sample.

**Orientation.** :func:`pivot` returns rows indexed by the ``y`` values and columns by the ``x``
values, both increasing (row 0 and column 0 are the cell nearest the origin of a plot drawn with
``pcolormesh``); every combination of the axis values appears, missing cells are NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from . import config as C
from .results import REGIMES

PathLike = str | Path
CELL_REGIMES = (*REGIMES, "mixed", "failed")

# Columns that identify a run or a repetition rather than a cell, and columns that are functions of
# the cell's settings (kept once, as the cell's value, not aggregated).
_RUN_COLUMNS = ("run_id", "seed", "root_seed", "source", "engine_setting")
_DERIVED_SETTINGS = ("snr", "n_snr2", "n_flip_per_class")


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _as_paths(paths) -> list[Path]:
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    return [Path(p) for p in paths]


def _table_path(path: Path, table: str) -> Path:
    if path.is_dir():
        return path / f"{table}.parquet"
    if table == "results":
        return path
    # a results.parquet file was given: its siblings hold the other tables
    return path.with_name(f"{table}.parquet")


def load(paths: PathLike | Iterable[PathLike], table: str = "results") -> pd.DataFrame:
    """Load one or several sweeps' ``table`` (``results``, ``dynamics`` or ``samples``).

    ``paths``: a sweep directory, a ``results.parquet`` file, or a list of them. A ``source``
    column (the directory) is added so that ``run_id`` stays unique across sweeps:
    ``(source, run_id)`` identifies a run. ``dynamics`` and ``samples`` rows get the run's
    settings (``d``, ``signal_norm``, ``seed``, ...) joined from its results table.
    """
    if table not in ("results", "dynamics", "samples"):
        raise ValueError(f"table = {table!r}: expected 'results', 'dynamics' or 'samples'")
    frames = []
    for p in _as_paths(paths):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist; give a sweep directory or a "
                                    "results.parquet file")
        src = str(p if p.is_dir() else p.parent)
        res = pd.read_parquet(_table_path(p, "results"))
        res.insert(0, "source", src)
        if table == "results":
            frames.append(res)
            continue
        tp = _table_path(p, table)
        if not tp.exists():
            raise FileNotFoundError(
                f"{tp} does not exist: this sweep did not record {table}"
                + ("; set record_every or record_log to record dynamics" if table == "dynamics"
                   else ""))
        t = pd.read_parquet(tp)
        keep = [c for c in res.columns if c not in t.columns or c == "run_id"]
        keep = [c for c in keep if c in _settings_like(res)]
        t = t.merge(res[keep], on="run_id", how="left", validate="many_to_one")
        t = t[["source", *[c for c in t.columns if c != "source"]]]
        frames.append(t)
    if not frames:
        raise ValueError("no sweep given")
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def load_dynamics(paths: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """Shorthand for ``load(paths, "dynamics")``."""
    return load(paths, "dynamics")


def load_samples(paths: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """Shorthand for ``load(paths, "samples")``."""
    return load(paths, "samples")


def _settings_like(df: pd.DataFrame) -> list[str]:
    """Columns of a results table that are settings, run identifiers or derived settings."""
    names = set(C.SETTINGS) | set(_RUN_COLUMNS) | set(_DERIVED_SETTINGS) | {"sweep", "model",
                                                                              "engine", "status",
                                                                              "regime"}
    return [c for c in df.columns if c in names]


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------


def cell_axes(df: pd.DataFrame) -> list[str]:
    """The settings that vary across ``df``'s runs (the grid axes), in column order.

    Run identifiers (``run_id``, ``seed``, ``root_seed``) are not axes; ``source`` and ``sweep``
    are, when several sweeps were loaded.
    """
    out = []
    for c in df.columns:
        if c in ("run_id", "seed", "root_seed", "engine_setting") or c in _DERIVED_SETTINGS:
            continue
        if c in C.SETTINGS or c in ("sweep", "source", "engine"):
            if df[c].nunique(dropna=False) > 1:
                out.append(c)
    return out


def metric_columns(df: pd.DataFrame) -> list[str]:
    """Numeric columns of a results table that are measurements (not settings)."""
    skip = set(C.SETTINGS) | set(_RUN_COLUMNS) | set(_DERIVED_SETTINGS)
    return [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])
            and not pd.api.types.is_bool_dtype(df[c])]


def _never_as_nan(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    df = df.copy()
    for c in cols:
        if c.endswith("_step"):
            v = df[c].astype(float)
            df[c] = v.where(v >= 0)
    return df


def aggregate(
    df: pd.DataFrame,
    by: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Pool the seeds of each cell: one row per combination of ``by`` (default :func:`cell_axes`).

    Returns the ``by`` columns, the constant settings (as they were), the derived SNR columns,
    ``n_seeds, n_ok, n_failed``, ``frac_<regime>`` for each regime, ``regime`` (strict majority of
    the ok runs, else ``"mixed"``; ``"failed"`` if none is ok), and ``<m>_mean, <m>_se, <m>_min,
    <m>_max`` for each metric (default :func:`metric_columns`). Rows sorted by ``by``.
    """
    if len(df) == 0:
        raise ValueError("aggregate: the table is empty")
    by = list(cell_axes(df) if by is None else by)
    metrics = list(metric_columns(df) if metrics is None else metrics)
    missing = [c for c in [*by, *metrics] if c not in df.columns]
    if missing:
        raise KeyError(f"aggregate: no column {missing[0]!r}; columns: {', '.join(df.columns)}")
    status = df["status"] if "status" in df.columns else pd.Series("ok", index=df.index)
    ok_mask = (status == "ok").to_numpy()
    work = _never_as_nan(df, metrics)
    work["_ok"] = ok_mask
    if not by:
        work["_cell"] = 0
        keys = ["_cell"]
    else:
        keys = by
    grouped = work.groupby(keys, sort=True, dropna=False)
    out = grouped.size().rename("n_seeds").to_frame()
    out["n_ok"] = grouped["_ok"].sum().astype(int)
    out["n_failed"] = out["n_seeds"] - out["n_ok"]
    ok = work[ok_mask]
    g_ok = ok.groupby(keys, sort=True, dropna=False)
    if "regime" in df.columns:
        for r in REGIMES:
            hits = (ok["regime"] == r).groupby([ok[k] for k in keys], dropna=False).sum()
            out[f"frac_{r}"] = (hits.reindex(out.index).fillna(0) / out["n_ok"].where(
                out["n_ok"] > 0)).astype(float)
        fr = out[[f"frac_{r}" for r in REGIMES]].to_numpy()
        lab = np.full(len(out), "mixed", dtype=object)
        for i, r in enumerate(REGIMES):
            lab[fr[:, i] > 0.5] = r
        lab[out["n_ok"].to_numpy() == 0] = "failed"
        out["regime"] = lab
    stats = {}
    for m in metrics:
        col = g_ok[m]
        mean, std, cnt = col.mean(), col.std(ddof=1), col.count()
        stats[f"{m}_mean"] = mean
        stats[f"{m}_se"] = (std / np.sqrt(cnt)).where(cnt >= 2)
        stats[f"{m}_min"] = col.min()
        stats[f"{m}_max"] = col.max()
    if stats:
        out = out.join(pd.DataFrame(stats), how="left")
    # constant settings and derived SNR columns: the cell's (first) value
    const = [c for c in df.columns if c not in keys and c not in metrics and c not in
             ("run_id", "seed", "status", "regime", "source") and
             (c in C.SETTINGS or c in _DERIVED_SETTINGS or c in ("sweep", "model", "engine"))]
    if const:
        first = work.groupby(keys, sort=True, dropna=False)[const].first()
        out = out.join(first, how="left")
    out = out.reset_index()
    if not by:
        out = out.drop(columns="_cell")
    lead = [*by, *[c for c in const if c not in by]]
    counts = ["n_seeds", "n_ok", "n_failed"]
    regimes = [c for c in out.columns if c.startswith("frac_")] + (["regime"] if "regime" in
                                                                   out.columns else [])
    rest = [c for c in out.columns if c not in [*lead, *counts, *regimes]]
    return out[[*lead, *counts, *regimes, *rest]]


def _is_aggregate(df: pd.DataFrame) -> bool:
    return "n_seeds" in df.columns and "n_ok" in df.columns


# --------------------------------------------------------------------------------------------
# Pivot
# --------------------------------------------------------------------------------------------


def select(df: pd.DataFrame, where: Mapping[str, object] | None = None) -> pd.DataFrame:
    """Rows of ``df`` whose columns equal the given values (floats compared with ``isclose``)."""
    if not where:
        return df
    mask = np.ones(len(df), bool)
    for k, v in where.items():
        if k not in df.columns:
            raise KeyError(f"select: no column {k!r}")
        col = df[k]
        if pd.api.types.is_float_dtype(col) and isinstance(v, (int, float)):
            mask &= np.isclose(col.to_numpy(float), float(v), rtol=1e-9, atol=0)
        else:
            mask &= (col == v).to_numpy()
    return df[mask]


def pivot(
    df: pd.DataFrame,
    x: str,
    y: str,
    value: str,
    where: Mapping[str, object] | None = None,
) -> pd.DataFrame:
    """A ``(y, x)`` grid of ``value``: rows = increasing ``y``, columns = increasing ``x``.

    ``df`` is an aggregate (:func:`aggregate`) or a runs table, which is aggregated first (then
    ``value`` may name a metric, meaning its ``_mean``, or ``regime``). ``where`` fixes other axes
    (``{"n": 20}``); if an axis other than ``x`` and ``y`` still varies, a :class:`ValueError`
    names it. Every (y, x) combination of the values present appears; missing cells are NaN.
    """
    if where:
        df = select(df, where)
    if not _is_aggregate(df):
        df = aggregate(df)
        if value not in df.columns and f"{value}_mean" in df.columns:
            value = f"{value}_mean"
    for c in (x, y, value):
        if c not in df.columns:
            raise KeyError(f"pivot: no column {c!r}; columns: {', '.join(df.columns)}")
    others = [a for a in df.columns if a not in (x, y) and (a in C.SETTINGS or a in ("sweep",
              "source")) and df[a].nunique(dropna=False) > 1]
    dup = df.duplicated([x, y]).any()
    if dup:
        hint = f" (it varies: {', '.join(others)})" if others else ""
        raise ValueError(
            f"pivot: several cells share each ({x}, {y}) pair{hint}; fix: "
            f"where={{{(others or ['axis'])[0]!r}: value}} to pick one slice")
    xs = np.sort(df[x].dropna().unique())
    ys = np.sort(df[y].dropna().unique())
    g = df.pivot(index=y, columns=x, values=value)
    g = g.reindex(index=ys, columns=xs)
    g.index.name, g.columns.name = y, x
    return g


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


def export(df: pd.DataFrame, path: PathLike) -> Path:
    """Write a table as CSV (``.csv``) or Parquet (``.parquet``); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix in (".parquet", ".pq"):
        df.to_parquet(path, index=False)
    else:
        raise ValueError(f"export: {path.name!r} must end in .csv or .parquet")
    return path
