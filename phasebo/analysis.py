"""The results API: load sweeps, aggregate over seeds, pivot two axes to a grid, export.

A sweep directory holds three long tables (:mod:`phasebo.results`): ``results.parquet`` (one row
per run), ``dynamics.parquet`` (per run and recorded step) and ``samples.parquet`` (per run and
training sample)::

    import phasebo as pb
    runs = pb.load("results/default")                    # one or several sweeps
    cells = pb.aggregate(runs)                           # one row per grid cell
    g = pb.pivot(cells, x="signal_norm", y="d", value="test_acc_mean")
    pb.export(cells, "cells.csv")

**Cells.** By default a cell is a combination of *every* setting that varies across the loaded
runs, so an aggregate never pools runs of different settings silently. ``by=[...]`` names the
cell axes explicitly; a setting that still varies inside those cells is an error unless it is
pooled explicitly with ``over=[...]`` (its column, and every column that varies with it, is then
dropped, never filled from one row). Runs whose ``status`` is not ``"ok"`` are left out of every
statistic and counted in ``n_failed``.

**Columns.** Per cell: ``n_runs``; ``n_seeds`` (distinct ``(seed, root_seed)`` pairs); ``n_ok``,
``n_failed``; for each regime ``frac_<regime>`` (of the ok runs) with its standard error
``frac_<regime>_se`` and Wilson 95 % interval ``frac_<regime>_lo`` / ``_hi``; ``regime`` (the
regime of a strict majority of the ok runs, ``"mixed"`` without one, ``"failed"`` if half or more
of the cell's runs failed, none ok included);
and for every metric ``m``: ``m_mean``, ``m_se`` (``std(ddof=1)/sqrt(k)`` over the ``k`` ok runs
with a finite value; NaN when ``k < 2``), ``m_min``, ``m_max``. Settings constant in every cell are
kept as they are (not with ``metrics=``).

Step columns (``*_step``) use ``-1`` for "never"; they are read as NaN before aggregation, so
``noisy_fit_step_mean`` is the mean over the runs where every flipped sample was fitted.

**Orientation.** :func:`pivot` returns rows indexed by the ``y`` values and columns by the ``x``
values, both increasing; every combination of the values present appears, missing cells NaN.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .registry import all_settings
from .results import (  # noqa: F401 (the column groups: re-exported)
    DERIVED,
    LABEL_COLUMNS,
    REGIMES,
    RUN_COLUMNS,
    STEP,
    load_results,
    merge_groups,
    read_table,
)
from .settings import ConfigError, suggest

PathLike = str | Path
CELL_REGIMES = (*REGIMES, "mixed", "failed")

Z95 = 1.959963984540054


def setting_names(df: pd.DataFrame | None = None) -> set[str]:
    """The setting columns' names: those ``df``'s file recorded (``df.attrs["column_groups"]``,
    kept by pandas through filtering and indexing), else every setting this version's models
    know."""
    groups = df.attrs.get("column_groups") if df is not None else None
    if groups:
        return set(groups["settings"])
    return set(all_settings())


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
    return path if table == "results" else path.with_name(f"{table}.parquet")


def _limit_only(d: Path) -> bool:
    """Whether the sweep in ``d`` ran the converged limit only (it records no dynamics)."""
    try:
        dyn = pd.read_parquet(d / "results.parquet", columns=["dynamics"])["dynamics"]
    except (OSError, KeyError, ValueError, ImportError):
        return False
    return len(dyn) > 0 and bool((dyn.astype(str) == "limit").all())


def load(paths: PathLike | Iterable[PathLike], table: str = "results", *, partial: bool = False,
         duplicates: str = "drop", notes: bool = True) -> pd.DataFrame:
    """Load one or several sweeps' ``table`` (``results``, ``dynamics`` or ``samples``).

    ``paths``: a sweep directory, a ``results.parquet`` file, or a list of them. A ``source``
    column says where each row came from. The same run (same ``run_id``, which hashes every
    setting and the seed, and the same ``engine``) loaded twice is kept once, with a warning
    (``duplicates="drop"``), or is an error (``"error"``). ``partial``: read the finished parts of
    an interrupted sweep. ``dynamics`` and ``samples`` rows get their run's settings joined.
    ``notes``: say on stderr when a directory's tables hold a subset of its runs.
    """
    if table not in ("results", "dynamics", "samples"):
        raise ValueError(f"table = {table!r}: expected 'results', 'dynamics' or 'samples'")
    if duplicates not in ("drop", "error"):
        raise ValueError("duplicates must be 'drop' or 'error'")
    res_frames = []
    for p in _as_paths(paths):
        if not p.exists():
            raise ConfigError(f"{p} does not exist; fix: give a sweep directory or a "
                              "results.parquet file")
        res = load_results(p, partial=partial, notes=notes)
        if "run_id" not in res.columns:
            raise ConfigError(f"{p} holds no runs (no run_id column: an aggregate or another "
                              "table); fix: pd.read_parquet it, or give a sweep directory")
        if "source" not in res.columns:  # a saved table of loaded sweeps keeps its own
            res.insert(0, "source", str(p if p.is_dir() else p.parent))
        res_frames.append(res)
    if not res_frames:
        raise ValueError("no sweep given")
    res = _concat(res_frames)
    groups = merge_groups([f.attrs.get("column_groups") for f in res_frames])
    if groups is not None:
        res.attrs["column_groups"] = groups
    key = ["run_id", "engine"] if "engine" in res.columns else ["run_id"]
    dup = res.duplicated(key, keep="first")
    if dup.any():
        msg = (f"{int(dup.sum())} runs appear in more than one of the loaded sweeps (same settings, "
               "seed and engine)")
        if duplicates == "error":
            raise ConfigError(msg + "; fix: load each run once")
        warnings.warn(msg + "; each is kept once", stacklevel=2)
    keep = ~dup
    if table == "results":
        return res[keep].reset_index(drop=True)
    frames = []
    for p in _as_paths(paths):
        tp = _table_path(p, table)
        if not tp.exists():
            rounds = sorted(tp.parent.glob("round-*"))
            if rounds and (rounds[0] / tp.name).exists():  # a refined sweep: per round
                raise ConfigError(f"{tp} does not exist: a refined sweep keeps each round's "
                                  f"{table} in its round-*/ directory; fix: load those, e.g. "
                                  f"{tp.parent}/round-* on the command line (in Python, "
                                  f"pb.load(sorted(Path(dir).glob('round-*')), {table!r}))")
            hint = "; set record_every or record_log to record dynamics" if table == "dynamics" \
                else ""
            if table == "dynamics" and _limit_only(tp.parent):
                hint = ("; the converged limit has no time axis (one state, the minimiser): its "
                        "numbers are the results table's (without --step on the command line)")
            raise ConfigError(f"{tp} does not exist: this sweep did not record {table}{hint}")
        t = read_table(tp)
        if "source" not in t.columns:
            t.insert(0, "source", str(p if p.is_dir() else p.parent))
        frames.append(t)
    attrs = merge_groups([groups, *(f.attrs.get("column_groups") for f in frames)])
    t = _concat(frames)
    cols = [c for c in res.columns if c in setting_names(res) or c in (*RUN_COLUMNS, *DERIVED,
                                                                         *LABEL_COLUMNS,
                                                                         "model", "engine")]
    cols = [c for c in cols if c not in t.columns or c in ("source", "run_id")]
    # a dynamics row's status is its run's at that step: the same merge brings diverge_step
    div = table == "dynamics" and "diverge_step" in res.columns and "diverge_step" not in t
    t = t.merge(res.loc[keep, cols + ["diverge_step"] * div], on=["source", "run_id"],
                how="inner", validate="many_to_one")
    if div:
        t = _status_at_step(t)
    if attrs is not None:
        t.attrs["column_groups"] = attrs
    return t


def _status_at_step(dyn: pd.DataFrame) -> pd.DataFrame:
    """A dynamics row's ``status`` is its run's at that step: a run that diverged (or a flow
    left unsolved) at ``diverge_step`` was ``ok`` at the steps recorded before it, as its
    regime there says; the run's final status holds from that step on. Drops the joined
    ``diverge_step``."""
    div = dyn.pop("diverge_step").to_numpy(float)
    if "status" not in dyn.columns or STEP not in dyn.columns:
        return dyn
    before = (div >= 0) & (dyn[STEP].to_numpy(float) < div)
    if before.any():
        status = dyn["status"].astype(object).to_numpy().copy()
        status[before] = "ok"
        dyn["status"] = pd.Categorical(status, categories=dyn["status"].cat.categories
                                       if isinstance(dyn["status"].dtype, pd.CategoricalDtype)
                                       else None)
    return dyn


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if len(frames) == 1:
        return frames[0]
    cats = {}
    for f in frames:
        for c in f.columns:
            if isinstance(f[c].dtype, pd.CategoricalDtype):
                cats.setdefault(c, []).append(f[c].dtype)
    out = pd.concat(frames, ignore_index=True)
    for c, dts in cats.items():
        ordered = dts[0].ordered
        union = list(dict.fromkeys(x for d in dts for x in d.categories))
        out[c] = pd.Categorical(out[c].astype(object), categories=union, ordered=ordered)
    return out


def load_dynamics(paths: PathLike | Iterable[PathLike], **kw) -> pd.DataFrame:
    """Shorthand for ``load(paths, "dynamics")``."""
    return load(paths, "dynamics", **kw)


def load_samples(paths: PathLike | Iterable[PathLike], **kw) -> pd.DataFrame:
    """Shorthand for ``load(paths, "samples")``."""
    return load(paths, "samples", **kw)


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------


def setting_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` that are settings (:func:`setting_names`), ``model`` and ``engine``
    included, run identifiers excluded."""
    names = setting_names(df) | {"model", "engine"}
    return [c for c in df.columns if c in names and c not in RUN_COLUMNS]


def cell_axes(df: pd.DataFrame) -> list[str]:
    """The settings that vary across ``df``'s runs (the cell axes), in column order. Run
    identifiers (``run_id``, ``seed``, ``root_seed``, ``source``) are repetitions, not axes."""
    return [c for c in setting_columns(df) if df[c].nunique(dropna=False) > 1]


def tied(df: pd.DataFrame, col: str, to: str | None) -> bool:
    """Whether ``col`` and ``to`` determine each other across ``df`` (``d`` and the derived
    ``snr`` at a fixed signal norm): an axis of ``to`` is then an axis of ``col`` too."""
    if to is None or to not in df.columns or col == to:
        return False
    return bool(df.groupby(to, observed=True)[col].nunique(dropna=False).max() == 1 and
                df.groupby(col, observed=True)[to].nunique(dropna=False).max() == 1)


def other_axes(df: pd.DataFrame, *axes: str | None) -> list[str]:
    """The cell axes of ``df`` besides ``axes`` and the settings tied to one of them. An axis
    that is no column of ``df`` is a :class:`KeyError` (a misspelt axis would otherwise read as
    every real axis varying besides it)."""
    for ax in axes:
        if ax is not None and ax not in df.columns:
            raise KeyError(f"no column {ax!r}{suggest(str(ax), map(str, df.columns))}; fix: one "
                           f"of the table's axes, {', '.join(cell_axes(df)) or 'none'}")
    return [a for a in cell_axes(df) if a not in axes
            and not any(tied(df, a, ax) for ax in axes)]


# the settings that bring others with them (a model its own settings, a dynamics its horizon and
# solver): named first when settings tied to one another are named once
LEADING = ("model", "dynamics")


def untied(df: pd.DataFrame, axes: Sequence[str]) -> list[str]:
    """``axes`` less those tied to an earlier one (:func:`tied`): the settings that tell the
    cells apart, each named once (a sweep of two models: ``model``, not also the engine and
    every setting only one of them has; flow and limit runs: ``dynamics``, not ``lr``), the
    :data:`LEADING` settings first."""
    kept: list[str] = []
    for a in sorted(axes, key=lambda a: a not in LEADING):
        if not any(tied(df, a, k) for k in kept):
            kept.append(a)
    return kept


def metric_columns(df: pd.DataFrame) -> list[str]:
    """Numeric columns of a results table that are measurements (not settings)."""
    skip = setting_names(df) | set(RUN_COLUMNS) | set(DERIVED) | {STEP}
    return [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])
            and not pd.api.types.is_bool_dtype(df[c])]


def _never_as_nan(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    df = df.copy()
    for c in cols:
        if c.endswith("_step"):
            v = df[c].astype(float)
            df[c] = v.where(v >= 0)
    return df


def finite_counts(df: pd.DataFrame, by: Sequence[str], metric: str) -> pd.Series:
    """Per cell of ``by``: the ok runs with a finite ``metric`` (what its ``_mean`` and ``_se``
    average over; fewer than ``n_seeds`` where a run has no value, e.g. a flipped-sample metric
    of a run that drew no flip)."""
    work = _never_as_nan(df, [metric])
    ok = (work["status"].astype(str) == "ok") if "status" in work.columns else True
    v = pd.to_numeric(work[metric], errors="coerce").astype(float)
    # grouped as aggregate groups (NaN keys kept); a cell whose runs all failed counts 0
    return (np.isfinite(v) & ok).groupby([work[k] for k in by], sort=True, dropna=False,
                                         observed=True).sum()


def wilson(k, n, z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of a proportion ``k / n`` (NaN where ``n = 0``), inside [0, 1]:
    exactly 0 below ``k = 0`` and 1 above ``k = n``, which rounding alone misses
    (``1 - 1e-16``)."""
    k, n = np.asarray(k, float), np.asarray(n, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        den = 1 + z**2 / n
        mid = (p + z**2 / (2 * n)) / den
        half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / den
    lo = np.where((k == 0) & (n > 0), 0.0, np.clip(mid - half, 0.0, 1.0))  # NaN stays NaN
    hi = np.where((k == n) & (n > 0), 1.0, np.clip(mid + half, 0.0, 1.0))
    return (lo[()], hi[()]) if lo.ndim == 0 else (lo, hi)


def at_step(df: pd.DataFrame, step) -> pd.DataFrame:
    """The rows of a dynamics table (one row per run and recorded step) at ``step``: an int, a
    list of them, or ``"last"`` (each run's last recorded step, its horizon). A step that no run
    recorded is an error that lists the recorded ones."""
    if STEP not in df.columns:
        raise ValueError("at_step: the table has no step column (load the dynamics: "
                         "pb.load(path, 'dynamics'))")
    if isinstance(step, str):
        if step != "last":
            raise ValueError(f"step = {step!r}: give a recorded step, a list of them or 'last'")
        keys = ["run_id"] if "run_id" in df.columns else (setting_columns(df) or
                                                             [c for c in df.columns if c != STEP][:1])
        last = df.groupby(keys, sort=False, dropna=False, observed=True)[STEP].transform("max")
        return df[df[STEP] == last]
    asked = np.atleast_1d(np.asarray(step))
    if not np.issubdtype(asked.dtype, np.number) or np.any(asked != np.round(asked)):
        raise ValueError(f"step = {step!r}: a step is a whole number; give a recorded step, a "
                         "list of them or 'last'")
    want = asked.astype(np.int64)
    have = np.unique(df[STEP].to_numpy(np.int64))
    bad = [int(s) for s in want if s not in have]
    if bad:
        shown = ", ".join(map(str, have[:40])) + (" ..." if len(have) > 40 else "")
        raise ValueError(f"step = {bad[0]} was not recorded; fix: one of the recorded steps "
                         f"{shown}")
    return df[np.isin(df[STEP].to_numpy(np.int64), want)]


def flow_times(dyn: pd.DataFrame) -> pd.Series | None:
    """Each recorded step's flow time τ (indexed by step) of a dynamics table of gradient flows,
    whose steps count GD-equivalent steps of lr; ``None`` for GD, or where runs at one step have
    different times (cases of different lr), so that no single τ would be right."""
    if not {"dynamics", "time", STEP} <= set(dyn.columns) or \
            not (dyn["dynamics"].astype(str) == "flow").all():
        return None
    times = dyn.groupby(STEP)["time"]
    return times.first() if times.nunique(dropna=False).max() == 1 else None


def aggregate(df: pd.DataFrame, by: Sequence[str] | None = None,
              metrics: Sequence[str] | None = None, over: Sequence[str] | None = None,
              step=None) -> pd.DataFrame:
    """Pool the seeds of each cell: one row per combination of ``by`` (see the module docstring).

    ``by``: the cell axes (default: every setting that varies); ``over``: settings pooled on
    purpose (default none; a setting that varies inside a cell and is not named here is an
    error); ``metrics``: the metrics to summarise (default every numeric measurement column).
    On a dynamics table (a ``step`` column) the recorded step is always a cell key: every
    recorded step by default, or ``step`` (an int, a list, ``"last"``; :func:`at_step`).
    """
    if len(df) == 0:
        raise ValueError("aggregate: the table is empty")
    if is_aggregate(df):
        raise ValueError("aggregate: this table is an aggregate already (one row per cell); fix: "
                         "aggregate the runs table (pb.load(path))")
    if step is not None:
        df = at_step(df, step)
    over = list(over or [])
    varying = cell_axes(df)
    by = [c for c in (varying if by is None else by) if c not in over]
    if STEP in df.columns and STEP not in by:
        by = [*by, STEP]
    metric_list = list(metric_columns(df) if metrics is None else metrics)
    if "regime" in metric_list and metrics is not None:
        raise ValueError("aggregate: regime is a category, not a metric: every aggregate has its "
                         "per-cell fractions (frac_<regime>, with Wilson intervals) and majority "
                         "(regime); fix: leave it out of metrics=")
    missing = [c for c in [*by, *over, *metric_list] if c not in df.columns]
    if missing:
        raise KeyError(f"aggregate: no column {missing[0]!r}"
                       f"{suggest(str(missing[0]), map(str, df.columns))}; fix: one of "
                       + ", ".join(map(str, list(df.columns)[:20]))
                       + (", ..." if len(df.columns) > 20 else ""))
    keys = by or ["_cell"]
    work = _never_as_nan(df, metric_list)
    if not by:
        work["_cell"] = 0
    grouped = work.groupby(keys, sort=True, dropna=False, observed=True)
    inside = [c for c in varying if c not in by and c not in over]
    if inside:
        n_in = grouped[inside].nunique(dropna=False).max()
        bad = [c for c in inside if n_in[c] > 1]
        if bad:
            raise ValueError(
                f"aggregate: {bad[0]} varies inside the cells of by={by} ({int(n_in[bad[0]])} "
                f"values); fix: add it to by, or pool over it on purpose with over={[bad[0]]}")
    status = work["status"].astype(str) if "status" in work.columns else \
        pd.Series("ok", index=work.index)
    work["_ok"] = (status == "ok").to_numpy()
    out = grouped.size().rename("n_runs").to_frame()
    seed_cols = [c for c in ("seed", "root_seed") if c in work.columns]
    if seed_cols:
        out["n_seeds"] = (work.drop_duplicates([*keys, *seed_cols])
                          .groupby(keys, sort=True, dropna=False, observed=True).size())
    else:
        out["n_seeds"] = out["n_runs"]
    out["n_ok"] = grouped["_ok"].sum().astype(np.int64)
    out["n_failed"] = out["n_runs"] - out["n_ok"]
    ok = work[work["_ok"]]
    g_ok = ok.groupby(keys, sort=True, dropna=False, observed=True)
    if "regime" in work.columns:
        n_ok = out["n_ok"].to_numpy(float)
        fr = []
        for r in REGIMES:
            hits = (ok["regime"].astype(str) == r).groupby(
                [ok[k] for k in keys], dropna=False, observed=True).sum()
            k_hit = hits.reindex(out.index).fillna(0).to_numpy(float)
            with np.errstate(invalid="ignore", divide="ignore"):
                p = np.where(n_ok > 0, k_hit / np.where(n_ok > 0, n_ok, 1), np.nan)
                se = np.sqrt(p * (1 - p) / n_ok)
            lo, hi = wilson(k_hit, n_ok)
            out[f"frac_{r}"], out[f"frac_{r}_se"] = p, se
            out[f"frac_{r}_lo"], out[f"frac_{r}_hi"] = lo, hi
            fr.append(p)
        lab = np.full(len(out), "mixed", dtype=object)
        for i, r in enumerate(REGIMES):
            lab[np.nan_to_num(fr[i]) > 0.5] = r
        # a cell whose failed runs (diverged, unsolved) are half or more: its few ok runs do
        # not speak for it (one benign run of four, three unsolved, is not a benign cell)
        n_bad = out["n_failed"].to_numpy(float)  # every run failed included (n_ok == 0)
        lab[(n_bad > 0) & (2 * n_bad >= out["n_runs"].to_numpy(float))] = "failed"
        out["regime"] = pd.Categorical(lab, categories=CELL_REGIMES, ordered=True)
    stats = {}
    for m in metric_list:
        col = g_ok[m]
        mean, std, cnt = col.mean(), col.std(ddof=1), col.count()
        stats[f"{m}_mean"] = mean
        stats[f"{m}_se"] = (std / np.sqrt(cnt)).where(cnt >= 2)
        stats[f"{m}_min"] = col.min()
        stats[f"{m}_max"] = col.max()
    if stats:
        out = out.join(pd.DataFrame(stats), how="left")
    const = []
    if metrics is None:
        cand = [c for c in df.columns if c not in keys and c not in over and c not in metric_list
                and c not in (*RUN_COLUMNS, *LABEL_COLUMNS) and c not in inside]
        if cand:
            nun = grouped[cand].nunique(dropna=False).max()
            const = [c for c in cand if nun[c] <= 1]
            if const:
                out = out.join(grouped[const].first(), how="left")
    out = out.reset_index()
    if not by:
        out = out.drop(columns="_cell")
    lead = [*by, *const]
    counts = ["n_runs", "n_seeds", "n_ok", "n_failed"]
    regime_cols = [c for c in out.columns if c.startswith("frac_")] + \
        (["regime"] if "regime" in out.columns else [])
    rest = [c for c in out.columns if c not in [*lead, *counts, *regime_cols]]
    out = out[[*lead, *counts, *regime_cols, *rest]]
    pooled = {c: int(work[c].nunique(dropna=False)) for c in over
              if c not in ("seed", "root_seed")}  # seeds are what a cell averages anyway
    if any(k > 1 for k in pooled.values()):  # said by the titles of what is drawn from it
        out.attrs["pooled_over"] = {c: k for c, k in pooled.items() if k > 1}
    return out


def is_aggregate(df: pd.DataFrame) -> bool:
    return "n_seeds" in df.columns and "n_ok" in df.columns


# --------------------------------------------------------------------------------------------
# Pivot
# --------------------------------------------------------------------------------------------


def select(df: pd.DataFrame, where: Mapping[str, object] | None = None) -> pd.DataFrame:
    """Rows of ``df`` whose columns equal the given values (floats compared with ``isclose``).
    A value that no row holds is an error naming the values there (a misspelt ``d = 999`` would
    otherwise select nothing, silently); values that each occur but never together select no
    row."""
    if not where:
        return df
    mask = np.ones(len(df), bool)
    for k, v in where.items():
        if k not in df.columns:
            raise KeyError(f"select: no column {k!r}{suggest(str(k), map(str, df.columns))}; "
                           "fix: where names a column of the table (a setting, seed, step, ...)")
        col = df[k]
        if isinstance(v, float) and np.isnan(v):  # a setting this slice's runs do not have
            hit = col.isna().to_numpy()
        elif pd.api.types.is_float_dtype(col) and isinstance(v, (int, float)):
            hit = np.isclose(col.to_numpy(float), float(v), rtol=1e-9, atol=0)
        else:
            hit = (col.astype(object) == v).to_numpy()
        if len(df) and not hit.any():
            have = pd.unique(col.dropna())
            try:
                have = sorted(have)
            except TypeError:
                have = sorted(have, key=str)
            shown = ", ".join(map(str, have[:20])) + (" ..." if len(have) > 20 else "")
            near = ""
            if isinstance(v, (int, float)) and pd.api.types.is_numeric_dtype(col) and len(have):
                # a value copied as displayed (0.088914 for 0.0889140...): the one it rounds
                best = have[int(np.argmin(np.abs(np.asarray(have, float) - float(v))))]
                best = best.item() if isinstance(best, np.generic) else best
                near = f"; fix: {k} = {best!r}, the nearest"
            raise ValueError(f"select: {k} = {v!r} is in no row; the table has {k} = {shown}"
                             + near)
        mask &= hit
    return df[mask]


def pivot(df: pd.DataFrame, x: str, y: str, value: str,
          where: Mapping[str, object] | None = None, step=None) -> pd.DataFrame:
    """A ``(y, x)`` grid of ``value``: rows = increasing ``y``, columns = increasing ``x``.

    ``df`` is an aggregate (:func:`aggregate`) or a runs table, which is aggregated first (then
    ``value`` may name a metric, meaning its ``_mean``, or ``regime``). ``where`` fixes other axes
    (``{"n": 20}``); if an axis other than ``x`` and ``y`` still varies, a :class:`ValueError`
    names it. On a table with recorded steps (dynamics, or an aggregate of them) ``step`` picks
    one (an int or ``"last"``); it is required when several are present.
    """
    if where:
        df = select(df, where)
        if df.empty:
            raise ValueError(f"pivot: no rows have {where}; fix: where= values the table holds")
    if step is not None and STEP not in df.columns:
        at_step(df, step)  # a table without recorded steps: its error says what to load
    if STEP in df.columns and STEP not in (x, y):
        if step is None and df[STEP].nunique() > 1:
            have = np.unique(df[STEP].to_numpy(np.int64))
            shown = ", ".join(map(str, have[:12])) + (" ..." if len(have) > 12 else "")
            raise ValueError(f"the table holds {len(have)} recorded steps; fix: pick one, "
                             f"pb.at_step(table, S) (or pivot's step=S), S one of {shown} or "
                             "'last'")
        if step is not None:
            df = at_step(df, step)
    if not is_aggregate(df):
        others = other_axes(df, x, y)
        if others:
            raise ValueError(f"pivot: {others[0]} varies besides {x} and {y}; fix: "
                             f"where={{{others[0]!r}: value}} to pick one slice")
        df = aggregate(df, by=[c for c in (x, y) if c in df.columns])
    if value not in df.columns and f"{value}_mean" in df.columns:  # a metric: its mean
        value = f"{value}_mean"
    cols = [str(c) for c in df.columns]
    known = cols + [c.removesuffix("_mean") for c in cols if c.endswith("_mean")]  # a metric
    for c in (x, y, value):
        if c not in df.columns:
            raise KeyError(f"pivot: no column {c!r}{suggest(str(c), known)}; fix: one of "
                           f"{', '.join(known[:12])}{' ...' if len(known) > 12 else ''}")
    if df.duplicated([x, y]).any():
        others = [a for a in setting_columns(df) if a not in (x, y)
                  and df[a].nunique(dropna=False) > 1]
        hint = f" (it varies: {', '.join(others)})" if others else ""
        raise ValueError(f"pivot: several cells share each ({x}, {y}) pair{hint}; fix: "
                         f"where={{{(others or ['axis'])[0]!r}: value}} to pick one slice")
    xs = np.sort(df[x].dropna().unique())
    ys = np.sort(df[y].dropna().unique())
    vals = df[value].astype(object) if isinstance(df[value].dtype, pd.CategoricalDtype) \
        else df[value]
    g = pd.DataFrame({x: df[x].to_numpy(), y: df[y].to_numpy(), "_v": vals.to_numpy()}).pivot(
        index=y, columns=x, values="_v")
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
