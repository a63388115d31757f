"""Figures from results tables: phase diagrams, line plots, dynamics, token projections, 𝔖 ratios.

Every function reads tables (:mod:`phasebo.analysis`), draws on new axes (or on ``ax=`` /
``axes=`` when given) and returns ``(fig, ax)`` — ``ax`` is an array for multi-panel figures.
Nothing calls ``plt.show()``; importing this module selects the Agg backend unless a backend was
already chosen (``MPLBACKEND``, pyplot already imported, or a Jupyter kernel's inline backend).

=====================  ==============================================================
function               what
=====================  ==============================================================
``regime_map``         categorical phase diagram (colour-blind-safe), theory curves, any grid
``value_map``          continuous map of an aggregated metric, colours scaled to its data
``line_plot``          a metric against one axis, mean and SE band per hue (1-D sweeps)
``attention_dynamics`` softmax mass per token of the tracked samples (Sakamoto & Sato Figs. 3-5)
``ss_dynamics``        group means of s(1−s), clean vs flipped
``accuracy_dynamics``  train/test accuracy and losses vs log-step (delayed generalisation)
``gap_dynamics``       attention gaps Λ, Γ and g(gap) vs step
``token_projection``   selected-token projections on (e₁, e₂) (Sakamoto & Sato Fig. 1)
``s_ratio_curves``     𝔖 ratios and test accuracy over the noise ratio
=====================  ==============================================================

Which figures a sweep or a results directory gets is :mod:`phasebo.report`'s; the command line
(``python -m phasebo.plot RESULTS_DIR [--out DIR] [--format png,pdf] [--dpi 200]``) is
:mod:`phasebo.cli.plot`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
from matplotlib.colors import BoundaryNorm, ListedColormap, LogNorm, Normalize

from . import analysis as A
from . import theory as TH
from .plot_dynamics import (  # noqa: F401 (the figures of a run's path: re-exported)
    accuracy_dynamics,
    attention_dynamics,
    gap_dynamics,
    s_ratio_curves,
    ss_dynamics,
    token_projection,
    tracked_names,
)
from .plot_style import (  # noqa: F401 (ROLE_*, LABELS, plt: re-exported for notebooks)
    CORE_REGIMES,
    LABELS,
    LOG_AXES,
    REGIME_COLORS,
    ROLE_COLORS,
    ROLE_LABELS,
    Theory,
    _label,
    _new,
    _num,
    _plain_log,
    _short,
    plt,
)
from .results import REGIMES

# --------------------------------------------------------------------------------------------
# Grid helpers
# --------------------------------------------------------------------------------------------


def _auto_log(col: str, vals: np.ndarray) -> bool:
    """Linear for an evenly spaced grid, log for a geometric one (>= 3 values); otherwise log
    for a positive axis of :data:`LOG_AXES` spanning at least a factor 10."""
    vals = np.unique(np.asarray(vals, float))
    if len(vals) < 2 or (vals <= 0).any():
        return False
    if len(vals) >= 3:
        step, r = np.diff(vals), vals[1:] / vals[:-1]
        if np.allclose(step, step[0], rtol=0.02):
            return False
        if np.allclose(r, r[0], rtol=0.05) and r[0] > 1.3:
            return True
    return bool(col in LOG_AXES and vals.max() / vals.min() >= 10)


def _edges(vals: np.ndarray, log: bool) -> np.ndarray:
    """Cell edges around sorted centres (geometric midpoints on a log axis). A positive axis never
    gets an edge at or below zero: the outer half-cells are clipped to half the extreme value."""
    vals = np.asarray(vals, float)
    v = np.log(vals) if log else vals
    if len(v) == 1:
        h = 0.1 if log else max(abs(v[0]) * 0.1, 0.5)
        e = np.array([v[0] - h, v[0] + h])
    else:
        mid = (v[1:] + v[:-1]) / 2
        e = np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]])
    if log:
        return np.exp(e)
    if (vals > 0).all() and e[0] <= 0:
        e[0] = vals[0] / 2
    return e


def slice_hint(df: pd.DataFrame, other: str, x, y) -> str:
    """Why a figure of ``x`` and ``y`` cannot be drawn when ``other`` varies too, and the fix in
    a sweep file's syntax (and Python's)."""
    vals = np.sort(df[other].dropna().unique())
    v = vals[0].item() if hasattr(vals[0], "item") else vals[0]
    shown = ", ".join(map(str, vals[:6])) + (", ..." if len(vals) > 6 else "")
    toml = f'"{v}"' if isinstance(v, str) else v
    return (f"{other} varies besides {', '.join(a for a in (x, y) if a)} ({shown}); fix: draw "
            f"one slice with where = {{ {other} = {toml} }} in the [plot] entry (where={{"
            f"{other!r}: {v!r}}} in Python)")


def _cells(df: pd.DataFrame, where, x=None, y=None) -> pd.DataFrame:
    df = A.select(df, where)
    if A.is_aggregate(df):
        return df
    others = A.other_axes(df, x, y)
    if others:
        raise ValueError(slice_hint(df, others[0], x, y))
    return A.aggregate(df, by=[c for c in (x, y) if c is not None])


def _seed_text(cells: pd.DataFrame) -> str:
    k = cells["n_seeds"].to_numpy()
    f = int(cells["n_failed"].sum()) if "n_failed" in cells.columns else 0
    s = f"{k.min()}" if k.min() == k.max() else f"{k.min()}–{k.max()}"
    s += " seed per cell" if k.max() == 1 else " seeds per cell"
    return s + (f", {f} failed run{'s' if f > 1 else ''} left out" if f else "")


def _grid_ticks(axis, vals, log):
    """Ticks at the grid values when there are few of them, plain numbers otherwise."""
    if len(vals) <= 10:
        axis.set_major_locator(mticker.FixedLocator(vals))
        axis.set_major_formatter(mticker.FuncFormatter(_num))
        axis.set_minor_locator(mticker.NullLocator())
    elif log:
        _plain_log(axis)


def _setup_axes(ax, x, y, logx, logy, xe, ye, xs=None, ys=None):
    ax.set_xlabel(_label(x))
    ax.set_ylabel(_label(y))
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if xs is not None:
        _grid_ticks(ax.xaxis, xs, logx)
        _grid_ticks(ax.yaxis, ys, logy)
    else:  # a refined grid: no common x values to tick, plain numbers on a log axis
        if logx:
            _plain_log(ax.xaxis)
        if ys is not None:
            _grid_ticks(ax.yaxis, ys, logy)
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])


def _overlay(ax, theory: Theory | None, xe, logx, ye):
    """Draw ``theory`` curves ``y = f(x)`` across the map, clipped to it; the legend lists only
    the curves that cross the map."""
    if theory is None:
        return
    curves = theory if isinstance(theory, Mapping) else {"theory": theory}
    xx = np.geomspace(xe[0], xe[-1], 400) if logx else np.linspace(xe[0], xe[-1], 400)
    styles = ["--", ":", "-.", (0, (5, 1, 1, 1))]
    drawn = 0
    for i, (name, f) in enumerate(curves.items()):
        with np.errstate(all="ignore"):
            yy = np.asarray(f(xx), float)
        yy = np.where((yy >= ye[0]) & (yy <= ye[-1]), yy, np.nan)
        if np.isfinite(yy).sum() < 2:
            continue  # outside the map: neither drawn nor in the legend
        ax.plot(xx, yy, color="k", ls=styles[i % len(styles)], lw=1.6, label=name)
        drawn += 1
    ax.set_ylim(ye[0], ye[-1])
    if drawn:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=min(drawn, 3),
                  fontsize=8, frameon=False, handlelength=3)


def iso_snr_overlay(kappas: Sequence[float] = (0.1, 4.0, 200.0), n: float = 20,
                    sigma_eps: float = 1.0) -> dict:
    """Theory curves for a (x = ‖μ‖, y = d) map: ``d = n ‖μ‖² / (κ σ²)`` for each κ."""
    return {f"n·SNR² = {k:g}": (lambda x, k=k: TH.iso_snr_d(x, k, n, sigma_eps)) for k in kappas}


def magen_overlay(c: float = 1.0, x: str = "n") -> dict:
    """Theory curve SNR = c/√n for a (x = n, y = snr) map, or n = c²/SNR² for (x = snr, y = n);
    for (x = d, y = n) at a fixed ‖μ‖ use :func:`magen_d_overlay`."""
    if x == "n":
        return {f"SNR = {c:g}/√n": lambda nn: TH.magen_boundary_snr(nn, c)}
    return {f"SNR = {c:g}/√n": lambda s: (c / np.asarray(s, float)) ** 2}


def magen_step1_overlay(rho: float, eta: float, acc: float = 0.95) -> dict:
    """The step-1 closed form of single-head attention from zero init for an (x = SNR, y = n)
    map: test accuracy ``acc`` at ``SNR = 2 Φ⁻¹(acc) / ((1 − 2η) ρ √n)``
    (:func:`phasebo.theory.magen_step1_snr`), drawn as ``n(SNR)``."""
    c = float(TH.magen_step1_snr(1.0, rho, eta, acc))
    return {f"step 1: test acc {acc:g} (SNR = {c:.3g}/√n)":
            lambda s: (c / np.asarray(s, float)) ** 2}


# --------------------------------------------------------------------------------------------
# Phase diagrams
# --------------------------------------------------------------------------------------------


def _row_meshes(ax, g: pd.DataFrame, xs, ys, logx, logy, draw):
    """A rectilinear grid draws as one mesh; a refined (non-uniform) grid, whose rows hold
    different x values, draws row by row with each row's own cell edges."""
    full = g.notna().to_numpy().all() or len(ys) == 1
    ye = _edges(ys, logy)
    if full:
        return [draw(_edges(xs, logx), ye, g.to_numpy())], _edges(xs, logx), ye
    rows, lo, hi = [], np.inf, -np.inf
    for i in range(len(ys)):
        row = g.iloc[i]
        have = row.notna().to_numpy()
        if not have.any():
            continue
        xe = _edges(xs[have], logx)
        lo, hi = min(lo, xe[0]), max(hi, xe[-1])
        rows.append((i, xe, row.to_numpy()[have][None, :]))
    meshes = []
    for i, xe, z in rows:  # every row spans the same x range: no blank ends
        xe = xe.copy()
        xe[0], xe[-1] = lo, hi
        meshes.append(draw(xe, ye[i:i + 2], z))
    return meshes, np.array([lo, hi]), ye


def regime_map(df: pd.DataFrame, x: str = "signal_norm", y: str = "d", ax=None,
               theory: Theory | None = None, where: Mapping | None = None,
               logx: bool | None = None, logy: bool | None = None, title: str | None = None,
               categories: Sequence[str] | None = None, colorbar: bool = True):
    """Categorical phase diagram: each cell coloured by the regime of a strict majority of its
    ok seeds (benign / harmful / not overfitting, and fitting / no noise where they occur), grey
    where no regime has a majority.

    ``df``: a runs table or an aggregate (or a dynamics table at one recorded step); ``where``
    fixes other axes. ``theory``: a callable ``y = f(x)`` or ``{label: f}`` drawn as black
    lines. ``categories``: the colour key (default: the three regimes and whatever else occurs);
    small multiples pass one key to every panel. The cell codes are
    ``ax.collections[0].get_array()`` (indices into ``ax.regime_categories``).
    """
    cells = _cells(df, where, x, y)
    g = A.pivot(cells, x, y, "regime")
    cats = list(categories) if categories is not None else present_regimes(g)
    code = np.full(g.shape, np.nan)
    for i, c in enumerate(cats):
        code[(g == c).to_numpy()] = i
    codes = pd.DataFrame(code, index=g.index, columns=g.columns)
    xs, ys = g.columns.to_numpy(float), g.index.to_numpy(float)
    logx = _auto_log(x, xs) if logx is None else logx
    logy = _auto_log(y, ys) if logy is None else logy
    fig, ax = _new(ax)
    cmap = ListedColormap([REGIME_COLORS[c] for c in cats])
    norm = BoundaryNorm(np.arange(len(cats) + 1) - 0.5, cmap.N)
    few = max(len(xs), len(ys)) <= 16  # cell borders only where cells are large

    def draw(xe, ye, z):
        return ax.pcolormesh(xe, ye, np.ma.masked_invalid(z), cmap=cmap, norm=norm,
                             edgecolors="white" if few else "face", linewidth=0.3 if few else 0)

    meshes, xe, ye = _row_meshes(ax, codes, xs, ys, logx, logy, draw)
    if colorbar:
        regime_colorbar(fig, meshes[0], cats, ax)
    _setup_axes(ax, x, y, logx, logy, xe, ye, xs if len(meshes) == 1 else None, ys)
    _overlay(ax, theory, xe, logx, ye)
    ax.regime_categories = cats  # for tests and callers: code i <-> cats[i]
    ax.set_title(title or f"regime ({_seed_text(cells)})", fontsize=10)
    return fig, ax


def present_regimes(labels) -> list[str]:
    """The colour key of a regime map: the three regimes always, then whichever of fitting,
    no noise, mixed and failed occur in ``labels`` (a grid or a column of cell labels)."""
    have = set(np.asarray(labels, dtype=object).ravel().tolist())
    return [c for c in (*REGIMES, "mixed", "failed") if c in CORE_REGIMES or c in have]


def regime_colorbar(fig, mesh, cats: Sequence[str], ax, cax=None):
    cb = fig.colorbar(mesh, ax=ax, cax=cax, ticks=np.arange(len(cats)))
    cb.ax.set_yticklabels([{"mixed": "mixed\n(no majority)", "fitting": "fitting\n(still)",
                            "no_noise": "no noise\n(nothing to overfit)"}.get(
                               c, c.replace("_", " ")) for c in cats])
    cb.ax.tick_params(length=0)
    return cb


def log_spaced_steps(steps, k: int = 4, decades: float = 2.0) -> list[int]:
    """Up to ``k`` of the recorded ``steps``, about evenly spaced in log step over the last
    ``decades`` decades before the horizon, the horizon always among them (step 0 only when it is
    the only one)."""
    have = np.unique(np.asarray(steps, np.int64))
    pos = have[have >= 1]
    if len(pos) == 0:
        return have.tolist()
    lo = max(float(pos[0]), float(pos[-1]) / 10**decades)
    want = np.geomspace(lo, pos[-1], min(k, len(pos)))
    pick = {int(pos[np.argmin(np.abs(np.log(pos) - np.log(w)))]) for w in want}
    return sorted(pick | {int(pos[-1])})


def regime_maps_over_time(dyn: pd.DataFrame, x: str = "signal_norm", y: str = "d",
                          steps: Sequence[int] | None = None, where: Mapping | None = None,
                          theory: Theory | None = None, ncols: int = 3, title: str | None = None):
    """Small multiples of the regime map at recorded steps (the regime at every recorded step,
    :func:`phasebo.regimes.regimes_over_time`), one shared colour key.

    ``dyn``: a dynamics table with its settings (``pb.load(path, "dynamics")``); ``steps``:
    the recorded steps to draw (default: four, log-spaced over the two decades before the
    horizon, the horizon last).
    """
    dyn = A.select(dyn, where)
    steps = log_spaced_steps(dyn["step"]) if steps is None else list(steps)
    sel = A.at_step(dyn, steps)
    others = A.other_axes(sel, x, y)
    if others:
        raise ValueError(slice_hint(sel, others[0], x, y))
    # one aggregate for every panel (the step is a cell key), regime fractions only
    agg = A.aggregate(sel, by=[x, y], metrics=["test_acc"])
    cells = {s: agg[agg["step"] == s] for s in steps}
    cats = present_regimes(np.concatenate([c["regime"].astype(str).to_numpy()
                                           for c in cells.values()]))
    ncols = max(1, min(ncols, len(steps), 2 if len(steps) == 4 else ncols))
    nrows = -(-len(steps) // ncols)
    # a fixed grid, no layout engine: constrained layout measured every tick label of every
    # panel and doubled the drawing time of the README's sweep
    height, width = 3.5 * nrows + 0.6, 3.9 * ncols + 2.6  # 2 in on the right for the key
    fig, axs = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    fig.subplots_adjust(left=0.75 / width, right=1 - 2.3 / width, bottom=0.7 / height,
                        top=1 - 0.6 / height, wspace=0.3, hspace=0.45)
    for ax, s in zip(axs.flat, steps):
        regime_map(cells[s], x, y, ax=ax, theory=theory, categories=cats, colorbar=False,
                   title=f"step {s}")
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    for ax in axs.flat[len(steps):]:
        ax.set_visible(False)
    regime_colorbar(fig, axs.flat[0].collections[0], cats, None,
                    cax=fig.add_axes((1 - 2.0 / width, 0.15, 0.2 / width, 0.7)))
    seeds = _seed_text(next(iter(cells.values())))
    fig.suptitle(title or f"regime at recorded steps ({seeds})", fontsize=11)
    fig.regime_steps = steps  # for tests and callers
    return fig, axs


def boundary_trajectory(b: pd.DataFrame, x: str, y: str, slices: Sequence | None = None,
                        ax=None, title: str | None = None):
    """A boundary over time: for each slice value of ``y``, the boundary along ``x`` against the
    recorded step (log axis), with its interval; ``b`` is :func:`phasebo.boundaries` on a
    dynamics table (a ``step`` column). ``slices``: the ``y`` values to draw (default: up to six,
    spread over those with a boundary)."""
    fig, ax = _new(ax, figsize=(6.8, 4.6))
    ok = b[np.isfinite(b["boundary"].to_numpy(float))
           & b["status"].astype(str).isin(("ok", "unresolved", "separated"))]
    vals = np.sort(ok[y].unique())
    if slices is None and len(vals) > 6:
        vals = vals[np.unique(np.round(np.linspace(0, len(vals) - 1, 6)).astype(int))]
    elif slices is not None:
        vals = np.asarray(slices)
    cmap = plt.get_cmap("viridis")
    for i, v in enumerate(vals):
        g = ok[np.isclose(ok[y].to_numpy(float), float(v))].sort_values("step")
        if g.empty:
            continue
        st = g["step"].to_numpy(float)
        bx = g["boundary"].to_numpy(float)
        err = np.vstack([bx - g["lo"].to_numpy(float), g["hi"].to_numpy(float) - bx])
        ax.errorbar(st, bx, yerr=err, fmt="-o", ms=3, capsize=2, lw=1.2,
                    color=cmap(i / max(len(vals) - 1, 1)), label=f"{_short(y)} = {_num(v)}")
    ax.set_xscale("log")
    _plain_log(ax.xaxis)
    if (ok["boundary"] > 0).all() and x in LOG_AXES:
        ax.set_yscale("log")
        _plain_log(ax.yaxis)
    ax.set_xlabel("recorded step")
    ax.set_ylabel(f"boundary {_label(x)}")
    n_seeds = int(ok["n_seeds"].max()) if len(ok) else 0
    ax.set_title(title or f"boundary {b['between'].iloc[0].replace('/', ' / ').replace('_', ' ')} over time "
                 f"(95% CI over {n_seeds} seeds)", fontsize=10)
    if len(vals):
        ax.legend(fontsize=8, loc="best", framealpha=0.8)
    return fig, ax


def fixed_scale(value: str, lo: float) -> tuple[float, float] | None:
    """The fixed colour range of a metric: accuracies [0.5, 1] ([0, 1] below chance), fractions
    [0, 1]; ``None``: the data's own range."""
    if value.endswith("_acc") or "_acc_" in value:
        return (0.5 if lo >= 0.5 else 0.0, 1.0)
    if value.startswith("frac_") or value.endswith("_frac"):
        return (0.0, 1.0)
    return None


def range_text(lo: float, hi: float) -> str:
    """``lo–hi`` with the fewest significant digits (3 to 8) that tell them apart."""
    for digits in range(3, 9):
        a, b = f"{lo:.{digits}g}", f"{hi:.{digits}g}"
        if a != b or lo == hi:
            return f"{a}–{b}" if lo != hi else a
    return f"{a}–{b}"


def value_map(df: pd.DataFrame, value: str, x: str = "signal_norm", y: str = "d", ax=None,
              cmap: str | None = None, vmin=None, vmax=None, theory: Theory | None = None,
              where: Mapping | None = None, stat: str = "mean", logx: bool | None = None,
              logy: bool | None = None, lognorm: bool | None = None, title: str | None = None):
    """Continuous map of ``value`` (a metric; its seed ``stat``: mean, se, min, max) over two axes.

    Accuracies are drawn on a fixed scale, [0.5, 1] (chance to perfect on a balanced binary task;
    [0, 1] when a cell is below chance), so maps of different sweeps compare by colour and
    0.9995 against 1.0 is not navy against yellow; fractions on [0, 1]; other metrics span the
    data. ``vmin`` / ``vmax`` override. The colour bar states the data range to as many digits as
    tell its ends apart. Losses use a log scale when they span more than a factor 10. Cells
    without a value are light grey.
    """
    cells = _cells(df, where, x, y)
    col = f"{value}_{stat}" if f"{value}_{stat}" in cells.columns else value
    if col not in cells.columns:
        raise KeyError(f"value_map: no column {value!r} (or {value}_{stat}) in the table")
    g = A.pivot(cells, x, y, col).astype(float)
    z = g.to_numpy()
    xs, ys = g.columns.to_numpy(float), g.index.to_numpy(float)
    logx = _auto_log(x, xs) if logx is None else logx
    logy = _auto_log(y, ys) if logy is None else logy
    fin = z[np.isfinite(z)]
    lo = float(fin.min()) if fin.size else 0.0
    hi = float(fin.max()) if fin.size else 1.0
    fixed = fixed_scale(value, lo)
    vmin = (fixed[0] if fixed else lo) if vmin is None else vmin
    vmax = (fixed[1] if fixed else hi) if vmax is None else vmax
    vmax = vmax if vmax > vmin else vmin + 1e-9
    if lognorm is None:
        lognorm = "loss" in value and fin.size > 0 and lo > 0 and hi / lo > 10
    norm = LogNorm(vmin=vmin, vmax=vmax) if lognorm else Normalize(vmin=vmin, vmax=vmax)
    fig, ax = _new(ax)
    ax.set_facecolor("#f2f2f2")

    def draw(xe, ye, zz):
        return ax.pcolormesh(xe, ye, np.ma.masked_invalid(zz.astype(float)),
                             cmap=cmap or "cividis", norm=norm)

    meshes, xe, ye = _row_meshes(ax, g, xs, ys, logx, logy, draw)
    what = _label(value) + ("" if stat == "mean" else f" ({stat})")
    fig.colorbar(meshes[0], ax=ax, label=f"{what}\n(data range {range_text(lo, hi)})")
    _setup_axes(ax, x, y, logx, logy, xe, ye, xs if len(meshes) == 1 else None, ys)
    _overlay(ax, theory, xe, logx, ye)
    text = f"{_label(value)} ({stat} over seeds; {_seed_text(cells)})"
    if not np.isfinite(z).all():
        text += "\ngrey: no value" + (" (never happened in any seed)" if value.endswith("_step")
                                      else "")
    ax.set_title(title or text, fontsize=10)
    return fig, ax


def line_plot(df: pd.DataFrame, x: str, value: str = "test_acc", hue: Sequence[str] | None = None,
              ax=None, where: Mapping | None = None, logx: bool | None = None,
              title: str | None = None):
    """``value`` against ``x``: the mean over seeds with a ±1 SE band, one line per ``hue`` cell
    (default: the other axes that vary). For 1-D sweeps and slices of maps."""
    runs = A.select(df, where)
    cells = runs if A.is_aggregate(runs) else None
    if hue is None:
        hue = [a for a in A.cell_axes(runs) if a != x] if cells is None else []
    if cells is None:
        cells = A.aggregate(runs, by=[x, *hue], metrics=[value])
    fig, ax = _new(ax, (6.0, 4.0))
    colors = plt.get_cmap("tab10").colors
    groups = cells.groupby(list(hue), sort=True) if hue else [((), cells)]
    for i, (key, sub) in enumerate(groups):
        sub = sub.sort_values(x)
        xv = sub[x].to_numpy(float)
        m = sub[f"{value}_mean"].to_numpy(float)
        se = np.nan_to_num(sub[f"{value}_se"].to_numpy(float))
        key = key if isinstance(key, tuple) else (key,)
        lab = ", ".join(f"{_short(h)}={_num(k) if isinstance(k, (int, float, np.number)) else k}"
                        for h, k in zip(hue, key)) or None
        c = colors[i % 10]
        ax.plot(xv, m, "o-", color=c, ms=3, lw=1.6, label=lab)
        ax.fill_between(xv, m - se, m + se, color=c, alpha=0.2, lw=0)
    logx = _auto_log(x, cells[x].to_numpy(float)) if logx is None else logx
    if logx:
        ax.set_xscale("log")
        _plain_log(ax.xaxis)
    ax.set_xlabel(_label(x))
    ax.set_ylabel(_label(value))
    if any(ax.get_legend_handles_labels()[1]):
        ax.legend(fontsize=7)
    k = cells["n_seeds"]
    ax.set_title(title or f"{_label(value)}: mean ± SE over {k.min()}"
                 f"{'' if k.min() == k.max() else f'–{k.max()}'} seeds", fontsize=10)
    return fig, ax


# --------------------------------------------------------------------------------------------
# Dynamics
# --------------------------------------------------------------------------------------------


def save(fig, path: Path, formats: Sequence[str] = ("png",), dpi: int = 150) -> list[Path]:
    """Save ``fig`` as ``path`` with each suffix in ``formats`` (png, pdf, svg); closes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for f in formats:
        p = path.with_suffix(f".{f}")
        fig.savefig(p, dpi=dpi)
        out.append(p)
    plt.close(fig)
    return out


def boundary_overlay(ax, b: pd.DataFrame, x: str, y: str, fit: dict | None = None,
                     theory: dict | None = None, color: str = "black"):
    """Draw boundaries (:func:`phasebo.boundaries`) on a map with ``x`` across and ``y`` up: each
    slice's boundary with its interval as a horizontal bar, the fitted power law
    ``x* = prefactor · y^exponent`` (solid) with the band its exponent interval spans around the
    fit's centre, and the theory's exponent with its prefactor fitted (dashed)."""
    ok = b[np.isfinite(b["boundary"].to_numpy(float))]
    if ok.empty:
        return ax
    yv = ok[y].to_numpy(float)
    bx = ok["boundary"].to_numpy(float)
    err = np.vstack([bx - ok["lo"].to_numpy(float), ok["hi"].to_numpy(float) - bx])
    ax.errorbar(bx, yv, xerr=err, fmt="o", ms=3, color=color, ecolor=color, elinewidth=1,
                capsize=2, label=f"boundary {ok['between'].iloc[0]} (95% CI)", zorder=5)
    ys = np.geomspace(yv.min(), yv.max(), 100) if (yv > 0).all() else np.linspace(yv.min(),
                                                                                   yv.max(), 100)
    if fit is not None:
        ax.plot(fit["prefactor"] * ys ** fit["exponent"], ys, color=color, lw=1.2,
                label=f"fit: exponent {fit['exponent']:.2f} [{fit['lo']:.2f}, {fit['hi']:.2f}]")
        yc = float(np.exp(np.mean(np.log(yv))))
        xc = fit["prefactor"] * yc ** fit["exponent"]
        lo, hi = (xc * (ys / yc) ** fit["lo"], xc * (ys / yc) ** fit["hi"])
        ax.fill_betweenx(ys, np.minimum(lo, hi), np.maximum(lo, hi), color=color, alpha=0.15,
                         lw=0)
    if theory is not None:
        ax.plot(theory["prefactor"] * ys ** theory["exponent"], ys, color=color, ls="--", lw=1.2,
                label=f"theory: exponent {theory['exponent']:+g}")
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
    return ax


def boundary_figure(runs: pd.DataFrame, b: pd.DataFrame, x: str, y: str, title: str | None = None):
    """The regime map of ``runs`` (refined grids drawn row by row) with the boundaries ``b``,
    their power-law fit and the theory's exponent on top."""
    from .boundaries import fit_power_law, theory_exponent

    fig, ax = regime_map(runs, x, y, title=title)
    fit = th = None
    try:
        fit = fit_power_law(b, y)
        t = theory_exponent(x, y)
        th = fit_power_law(b, y, exponent=t[0]) if t else None
    except ValueError:
        pass
    boundary_overlay(ax, b, x, y, fit, th)
    return fig


if __name__ == "__main__":
    from .cli.plot import main

    sys.exit(main())
