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

Command line::

    python -m phasebo.plot RESULTS_DIR [--out DIR] [--format png,pdf] [--dpi 200]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib

# Agg unless a backend was chosen (MPLBACKEND, a notebook's inline backend, pyplot in use).
if "MPLBACKEND" not in os.environ and not ({"matplotlib.pyplot", "ipykernel"} & set(sys.modules)):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as mticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap, LogNorm, Normalize  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from . import analysis as A  # noqa: E402
from . import theory as TH  # noqa: E402
from .results import REGIMES  # noqa: E402
from .settings import ConfigError  # noqa: E402

# Okabe & Ito's colour-blind-safe palette: blue / vermillion / yellow stay distinct under every
# common colour-vision deficiency.
REGIME_COLORS = {"benign": "#0072B2", "harmful": "#D55E00", "not_overfitting": "#F0E442",
                 "fitting": "#CC79A7", "no_noise": "#FFFFFF", "mixed": "#BBBBBB",
                 "failed": "#303030"}
CORE_REGIMES = ("benign", "harmful", "not_overfitting")  # always in a regime map's key
ROLE_COLORS = {"rel": "#009E73", "weak": "#56B4E9", "weak_opp": "#D55E00", "irr": "#9a9a9a"}
ROLE_LABELS = {"rel": "relevant", "weak": "weakly relevant", "weak_opp": "weak, opposite class",
               "irr": "irrelevant"}
LABELS = {
    "signal_norm": "‖μ‖ (signal norm)", "d": "d (dimension)", "n": "n (training samples)",
    "snr": "SNR", "n_snr2": "n·SNR²", "noise_ratio": "noise ratio", "lr": "step size",
    "step": "step", "test_acc": "test accuracy", "train_acc": "train accuracy",
    "test_loss": "test loss", "train_loss": "train loss",
    "frac_noisy_fitted": "fraction of flipped samples fitted (at some step)",
    "noisy_fit_step": "step all flipped samples fitted", "T": "T (tokens)",
    "query_lambda": "λ (memorised noise in the query)", "weight_decay": "weight decay λ",
}
LOG_AXES = {"d", "n", "snr", "n_snr2", "lr", "n_test", "signal_norm", "weight_decay"}
BOUNDED = ("_acc", "frac_")

Theory = Callable[[np.ndarray], np.ndarray] | Mapping[str, Callable[[np.ndarray], np.ndarray]]


def _label(col: str) -> str:
    return LABELS.get(col, col.replace("_", " "))


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


def _cells(df: pd.DataFrame, where, x=None, y=None) -> pd.DataFrame:
    df = A.select(df, where)
    if A.is_aggregate(df):
        return df
    others = A.other_axes(df, x, y)
    if others:
        raise ValueError(f"{others[0]} varies besides {x} and {y}; fix: where={{{others[0]!r}: "
                         "value}} to draw one slice")
    return A.aggregate(df, by=[c for c in (x, y) if c is not None])


def _seed_text(cells: pd.DataFrame) -> str:
    k = cells["n_seeds"].to_numpy()
    f = int(cells["n_failed"].sum()) if "n_failed" in cells.columns else 0
    s = f"{k.min()}" if k.min() == k.max() else f"{k.min()}–{k.max()}"
    s += " seed per cell" if k.max() == 1 else " seeds per cell"
    return s + (f", {f} failed run{'s' if f > 1 else ''} left out" if f else "")


def _new(ax, figsize=(6.4, 5.0)):
    if ax is not None:
        return ax.figure, ax
    return plt.subplots(figsize=figsize, layout="constrained")


def _plain_log(axis):
    """Plain numbers (250, 1000, 0.05) instead of powers of ten on a log axis."""
    axis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(mticker.FuncFormatter(_num))
    axis.set_minor_formatter(mticker.NullFormatter())


def _num(v, _=None) -> str:
    """A tick label: integers in full (4000, not 4e+03), other values to 3 significant digits."""
    return f"{int(round(v))}" if abs(v - round(v)) < 1e-9 and abs(v) < 1e7 else f"{v:.3g}"


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
        raise ValueError(f"{others[0]} varies besides {x} and {y}; fix: where = "
                         f"{{ {others[0]} = value }} to draw one slice")
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


def value_map(df: pd.DataFrame, value: str, x: str = "signal_norm", y: str = "d", ax=None,
              cmap: str | None = None, vmin=None, vmax=None, theory: Theory | None = None,
              where: Mapping | None = None, stat: str = "mean", logx: bool | None = None,
              logy: bool | None = None, lognorm: bool | None = None, title: str | None = None):
    """Continuous map of ``value`` (a metric; its seed ``stat``: mean, se, min, max) over two axes.

    Colours span the data (``vmin``/``vmax`` override) and the colour bar says the range, so a map
    of accuracies between 0.89 and 1 uses the whole colour scale. Losses use a log scale when they
    span more than a factor 10. Cells without a value are light grey.
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
    vmin = lo if vmin is None else vmin
    vmax = (hi if hi > vmin else vmin + 1e-9) if vmax is None else vmax
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
    fig.colorbar(meshes[0], ax=ax, label=f"{what}\n(data range {lo:.3g}–{hi:.3g})")
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


def _tokens(dyn: pd.DataFrame, prefix: str) -> list[str]:
    cols = [c for c in dyn.columns if c.startswith(prefix) and c[len(prefix):].isdigit()]
    return sorted(cols, key=lambda c: int(c[len(prefix):]))


def _roles(dyn: pd.DataFrame, T: int) -> list[str]:
    def first(c, default):
        return int(dyn[c].iloc[0]) if c in dyn.columns else default

    nr, nw, nwo = first("n_relevant", 1), first("n_weak", 1), first("n_weak_opp", 1)
    return ["rel"] * nr + ["weak"] * nw + ["weak_opp"] * nwo + ["irr"] * (T - nr - nw - nwo)


def _one_run(dyn: pd.DataFrame, run, where) -> pd.DataFrame:
    d = A.select(dyn, where)
    keys = [k for k in ("source", "run_id") if k in d.columns]
    step = "step" if "step" in d.columns else ("sample" if "sample" in d.columns else None)
    if run is not None:
        d = d[d["run_id"] == run]
    if d.empty:
        raise ValueError(f"no dynamics rows for run={run!r}, where={where!r}")
    first = d[keys].drop_duplicates().iloc[0]
    for k in keys:
        d = d[d[k] == first[k]]
    return d.sort_values(step) if step else d


def _run_title(d: pd.DataFrame) -> str:
    parts = []
    for c, fmt in (("d", "d={:g}"), ("signal_norm", "‖μ‖={:g}"), ("n", "n={:g}"),
                   ("noise_ratio", "r={:g}"), ("seed", "seed {:g}")):
        if c in d.columns:
            parts.append(fmt.format(float(d[c].iloc[0])))
    return ", ".join(parts)


def _xstep(ax, logx: bool):
    ax.set_xlabel("step")
    if logx:
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(left=0)


def tracked_names(dyn: pd.DataFrame) -> list[str]:
    """The tracked samples of a dynamics table: ``clean``/``noisy`` (the default pair) or
    ``i<index>`` (``track = [...]``)."""
    names = []
    for c in dyn.columns:
        if c.startswith("attn_") and c.endswith("_t0") and not c.startswith("attn_mean_"):
            names.append(c[len("attn_"):-len("_t0")])
    return names


def attention_dynamics(dyn: pd.DataFrame, run: int | None = None, where: Mapping | None = None,
                       axes=None, logx: bool = False, title: str | None = None,
                       samples: Sequence[str] | None = None):
    """Softmax probability of every token vs step, for the tracked samples (Sakamoto & Sato
    Figs. 3-5): the first clean and first flipped sample, or those of ``track = [...]``
    (``samples=["i0", "i11"]`` picks some). ``dyn``: a dynamics table; the run is ``run`` (a run
    id) or the first run matching ``where``. One panel per sample; colours by token role."""
    d = _one_run(dyn, run, where)
    names = list(samples or tracked_names(d))
    if not names:
        raise KeyError("attention_dynamics: the table has no attn_*_t* columns (record dynamics)")
    own = axes is None
    if axes is None:
        fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.8), sharey=True,
                                 layout="constrained", squeeze=False)
        axes = axes[0]
    fig = axes[0].figure
    step = d["step"].to_numpy()
    for ax, grp in zip(axes, names):
        cols = _tokens(d, f"attn_{grp}_t")
        roles = _roles(d, len(cols))
        for k, (c, r) in enumerate(zip(cols, roles)):
            ax.plot(step, d[c], color=ROLE_COLORS[r], lw=2.0 if r != "irr" else 1.0,
                    alpha=1.0 if r != "irr" else 0.7, label=f"token {k}")
        name = {"clean": "clean sample", "noisy": "flipped sample"}.get(grp, f"sample {grp[1:]}")
        ax.set_title(f"{name}" + (f" — {title}" if title else ""), fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        _xstep(ax, logx)
    axes[0].set_ylabel("softmax probability")
    roles = _roles(d, len(_tokens(d, f"attn_{names[0]}_t")))
    handles = [Line2D([], [], color=ROLE_COLORS[r], lw=2, label=ROLE_LABELS[r])
               for r in dict.fromkeys(roles)]
    axes[-1].legend(handles=handles, fontsize=8, loc="center right")
    if own and title is None:
        fig.suptitle(f"attention per token ({_run_title(d)})", fontsize=10)
    return fig, np.asarray(axes)


def _band(ax, d: pd.DataFrame, col: str, color, label, hue_keys=("source", "run_id")):
    """Mean over runs per step and the min–max band."""
    g = d.groupby("step")[col]
    m, lo, hi = g.mean(), g.min(), g.max()
    x = m.index.to_numpy()
    ax.plot(x, m.to_numpy(), color=color, lw=1.8, label=label)
    if d["run_id"].nunique() > 1 or ("source" in d.columns and d["source"].nunique() > 1):
        ax.fill_between(x, lo.to_numpy(), hi.to_numpy(), color=color, alpha=0.2, lw=0)


def _n_runs(d: pd.DataFrame) -> int:
    keys = [k for k in ("source", "run_id") if k in d.columns]
    return len(d[keys].drop_duplicates())


def ss_dynamics(dyn: pd.DataFrame, where: Mapping | None = None, ax=None, logx: bool = False):
    """Group means of ``𝔖 = s_R(1 − s_R)`` for clean vs flipped samples vs step (Sakamoto & Sato, Fig. 2).

    Per run the clean value is the mean over both classes of ``ss_clean_pos/neg``; lines are the
    mean over the selected runs, bands their min–max.
    """
    d = A.select(dyn, where).copy()
    d["ss_clean"] = d[["ss_clean_pos", "ss_clean_neg"]].mean(axis=1)
    d["ss_noisy"] = d[["ss_noisy_pos", "ss_noisy_neg"]].mean(axis=1)
    fig, ax = _new(ax, (6.0, 4.0))
    _band(ax, d, "ss_clean", "#2a9d8f", "clean samples")
    _band(ax, d, "ss_noisy", "#e63946", "flipped samples")
    ax.set_ylabel("s(1 − s),  s = mass on relevant tokens")
    _xstep(ax, logx)
    ax.legend(fontsize=8)
    ax.set_title(f"diminishing updates (mean over {_n_runs(d)} runs, band min–max)", fontsize=10)
    return fig, ax


def _hue_groups(d: pd.DataFrame, hue: Sequence[str] | None):
    if not hue:
        return [("", d)]
    out = []
    for key, sub in d.groupby(list(hue), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        out.append((", ".join(f"{_short(h)}={k:.4g}" if isinstance(k, (int, float, np.number))
                              else f"{_short(h)}={k}" for h, k in zip(hue, key)), sub))
    return out


def _short(col: str) -> str:
    return {"signal_norm": "‖μ‖", "noise_ratio": "r"}.get(col, col)


def accuracy_dynamics(dyn: pd.DataFrame, where: Mapping | None = None, hue: Sequence[str] |
                      None = None, axes=None, logx: bool = True):
    """Train/test accuracy (left) and train/test loss (right) vs step on a log-step axis, mean over
    seeds with a min–max band; one colour per ``hue`` cell (e.g. ``hue=["signal_norm"]``).
    Delayed generalisation shows as a test loss that keeps falling long after train accuracy is 1.
    """
    d = A.select(dyn, where)
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8), layout="constrained")
    fig = axes[0].figure
    groups = _hue_groups(d, hue)
    colors = plt.get_cmap("tab10").colors
    for i, (lab, sub) in enumerate(groups):
        c = colors[i % 10]
        pre = f"{lab}: " if lab else ""
        _band(axes[0], sub, "train_acc", c, f"{pre}train")
        _band(axes[0], sub, "test_acc", c, f"{pre}test")
        axes[0].lines[-1].set_linestyle("--")
        _band(axes[1], sub, "train_loss", c, f"{pre}train")
        _band(axes[1], sub, "test_loss", c, f"{pre}test")
        axes[1].lines[-1].set_linestyle("--")
    axes[0].set_ylabel("accuracy")
    axes[1].set_ylabel("logistic loss")
    axes[1].set_yscale("log")
    _plain_log(axes[1].yaxis)
    for ax in axes:
        _xstep(ax, logx)
        ax.legend(fontsize=7)
    axes[0].set_title("accuracy (solid train, dashed test)", fontsize=10)
    k = sorted({_n_runs(sub) for _, sub in groups})
    per = f"{k[0]}" if len(k) == 1 else f"{k[0]}–{k[-1]}"
    axes[1].set_title(f"loss (mean of {per} run{'s' if k[-1] > 1 else ''} per line, band "
                      "min–max)", fontsize=10)
    return fig, np.asarray(axes)


def gap_dynamics(dyn: pd.DataFrame, where: Mapping | None = None, axes=None, n_relevant=None):
    """Attention gaps Λ (clean sample) and Γ (flipped sample) and ``g(gap)`` vs step (Sakamoto & Sato).

    Theory: ``g(gap)`` grows about linearly in the step, so the gaps grow logarithmically.
    Mean over the selected runs, band min–max.
    """
    d = A.select(dyn, where)
    nr = n_relevant or (int(d["n_relevant"].iloc[0]) if "n_relevant" in d.columns else 1)
    gaps = TH.attention_gaps(d, n_relevant=nr)
    T = len(_tokens(d, "logit_clean_t"))
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8), layout="constrained")
    fig = axes[0].figure
    _band(axes[0], gaps, "lambda_min", "#2a9d8f", "Λ (clean: relevant − others)")
    _band(axes[0], gaps, "gamma_min", "#e63946", "Γ (flipped: winner − others)")
    axes[0].axhline(np.log(T), color="k", lw=0.8, ls=":", label="log T")
    _band(axes[1], gaps, "g_lambda", "#2a9d8f", "g(Λ)")
    _band(axes[1], gaps, "g_gamma", "#e63946", "g(Γ)")
    axes[0].set_ylabel("attention gap (logits)")
    axes[1].set_ylabel("g(gap) = 2x + 2 sinh(x − log T)")
    for ax in axes:
        _xstep(ax, False)
        ax.legend(fontsize=8)
    axes[0].set_title(f"gaps (mean of {_n_runs(gaps)} runs)", fontsize=10)
    axes[1].set_title("theory: g(gap) ≈ linear in step", fontsize=10)
    return fig, np.asarray(axes)


# --------------------------------------------------------------------------------------------
# Sakamoto & Sato's Fig. 1 and 𝔖 ratios
# --------------------------------------------------------------------------------------------

_PROJ_NAMES = (("proj_e1", "proj_e2"), ("x1", "x2"), ("e1", "e2"), ("sel_e1", "sel_e2"))


def token_projection(points: pd.DataFrame, ax=None, title: str | None = None,
                     where: Mapping | None = None, run: int | None = None):
    """Sakamoto & Sato's Fig. 1 scatter: the selected (argmax-attention) token of each sample
    projected on (e₁, e₂).

    ``points``: e.g. the ``samples`` table of a ``constructed_query`` sweep (one run; pick it
    with ``where``/``run``). Columns: the two projections (``sel_e1``/``sel_e2``, ``proj_e1``/
    ``proj_e2`` or ``x1``/``x2``), the label (``label`` or ``y``: observed label ±1; colour), the
    split (``split`` = train/test, or ``is_test`` = 0/1: train squares, test circles) and
    optionally ``flipped`` (black edge). The diagonal ``e₁ = e₂`` is the decision boundary of the
    fixed head ``ν ∝ e₁ − e₂``; the half-planes are shaded by the class they predict.
    """
    if where is not None or run is not None or ("run_id" in points.columns and
                                                 points["run_id"].nunique() > 1):
        points = _one_run(points, run, where)
    cx, cy = next(((a, b) for a, b in _PROJ_NAMES if a in points.columns), (None, None))
    if cx is None:
        raise KeyError(f"token_projection: need projection columns, one of {_PROJ_NAMES}")
    if "label" not in points.columns:
        points = points.assign(label=points["y"])
    if "split" not in points.columns and "is_test" in points.columns:
        points = points.assign(split=np.where(points["is_test"].astype(int) == 1, "test", "train"))
    fig, ax = _new(ax, (5.4, 5.0))
    px, py = points[cx].to_numpy(float), points[cy].to_numpy(float)
    lo = min(px.min(), py.min())
    hi = max(px.max(), py.max())
    pad = 0.08 * (hi - lo or 1.0)
    lo, hi = lo - pad, hi + pad
    ax.fill_between([lo, hi], [lo, hi], [lo, lo], color="#1f77b4", alpha=0.07, lw=0)
    ax.fill_between([lo, hi], [lo, hi], [hi, hi], color="#d62728", alpha=0.07, lw=0)
    ax.plot([lo, hi], [lo, hi], color="k", lw=1, ls="--", label="decision boundary")
    split = points["split"] if "split" in points.columns else pd.Series("train", index=points.index)
    flipped = points["flipped"].astype(bool) if "flipped" in points.columns else \
        pd.Series(False, index=points.index)
    for sp, marker, size in (("train", "s", 34), ("test", "o", 14)):
        for lab, color in ((1, "#1f77b4"), (-1, "#d62728")):
            m = (split == sp) & (points["label"] == lab)
            if not m.any():
                continue
            mm = m.to_numpy()
            ax.scatter(px[mm], py[mm], marker=marker, s=size, color=color, linewidths=0,
                       alpha=0.85 if sp == "train" else 0.5, label=f"{sp}, y = {lab:+d}")
        fm = ((split == sp) & flipped).to_numpy()
        if fm.any():
            ax.scatter(px[fm], py[fm], marker=marker, s=size * 1.6, facecolors="none",
                       edgecolors="k", linewidths=1.0, label=f"{sp}, flipped label")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("projection of selected token on e₁")
    ax.set_ylabel("projection of selected token on e₂")
    ax.legend(fontsize=7, loc="best")
    ax.set_title(title or "selected-token projection (squares train, circles test)", fontsize=10)
    return fig, ax


def s_ratio_curves(df: pd.DataFrame, x: str = "noise_ratio", hue: Sequence[str] | None = None,
                   ratio: str = "s_ratio_min", axes=None, where: Mapping | None = None):
    """The 𝔖 ratio (:func:`phasebo.theory.s_ratios`) and test accuracy vs ``x`` (Sakamoto & Sato).

    One line per ``hue`` cell (default: the axes other than ``x`` that vary, e.g. ``d`` and
    ``signal_norm``); mean over seeds, band min–max; ok runs only. The dotted line is ratio 1.
    """
    runs = A.select(df, where)
    runs = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    runs = pd.concat([runs, TH.s_ratios(runs)], axis=1)
    if hue is None:
        hue = [a for a in A.cell_axes(runs) if a not in (x, "source", "sweep")]
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8), layout="constrained")
    fig = axes[0].figure
    colors = plt.get_cmap("tab10").colors
    for i, (lab, sub) in enumerate(_hue_groups(runs, hue)):
        c = colors[i % 10]
        for ax, col in ((axes[0], ratio), (axes[1], "test_acc")):
            g = sub.groupby(x)[col]
            m, lo, hi = g.mean(), g.min(), g.max()
            xv = m.index.to_numpy(float)
            ax.plot(xv, m.to_numpy(), "o-", color=c, ms=3, lw=1.5, label=lab or None)
            ax.fill_between(xv, lo.to_numpy(), hi.to_numpy(), color=c, alpha=0.18, lw=0)
    axes[0].axhline(1.0, color="k", ls=":", lw=1)
    axes[0].set_yscale("log")
    _plain_log(axes[0].yaxis)
    axes[0].set_ylabel({"s_ratio_min": r"min over classes of $\Sigma\mathfrak{S}$ clean / flipped",
                        "s_ratio_pos": r"$\Sigma\mathfrak{S}$ clean / flipped (class +)",
                        "s_ratio_neg": r"$\Sigma\mathfrak{S}$ clean / flipped (class −)",
                        "s_class_balance": r"$\Sigma\mathfrak{S}$ clean+ / clean−"}.get(ratio, ratio))
    axes[1].set_ylabel("test accuracy")
    axes[1].set_ylim(0.4, 1.02)
    for ax in axes:
        ax.set_xlabel(_label(x))
        if any(ax.get_legend_handles_labels()[1]):
            ax.legend(fontsize=7)
    axes[0].set_title(r"$\mathfrak{S}$ ratio (mean over seeds, band min–max)", fontsize=10)
    axes[1].set_title("test accuracy", fontsize=10)
    return fig, np.asarray(axes)


# --------------------------------------------------------------------------------------------
# Sweep and command-line figures
# --------------------------------------------------------------------------------------------

HEATMAP_KEYS = ("x", "y", "value", "where", "cmap", "vmin", "vmax", "stat")
LINE_KEYS = ("x", "value", "hue", "where")
PLOT_KEYS = ("heatmaps", "lines", "formats", "dpi")


def default_heatmap_axes(spec) -> tuple[str, str] | None:
    """The two axes to map when the sweep file does not say: ``signal_norm`` on x and ``d`` on
    y when both are axes, else the two longest axes."""
    axes = [a for a, v in spec.axes.items() if len(v) > 1]
    if len(axes) < 2:
        return None
    if "signal_norm" in axes and "d" in axes:
        return "signal_norm", "d"
    a, b = sorted(axes, key=lambda a: -len(spec.axes[a]))[:2]
    return a, b


def wanted_figures(spec) -> tuple[list[dict], list[dict]]:
    """The heatmaps and line plots a sweep asks for (``[plot]``), or the defaults: the regime,
    test accuracy, train accuracy and test loss maps over the two longest axes, or, for a sweep
    with one axis, test accuracy and train accuracy against it."""
    heat = list(spec.plot.get("heatmaps", []))
    lines = list(spec.plot.get("lines", []))
    if heat or lines:
        return heat, lines
    ax = default_heatmap_axes(spec)
    if ax is not None:
        return [{"x": ax[0], "y": ax[1], "value": v}
                for v in ("regime", "test_acc", "train_acc", "test_loss")], []
    axes = [a for a, v in spec.axes.items() if len(v) > 1]
    if len(axes) == 1 or (len(axes) == 0 and len(spec.cases) > 1):
        x = axes[0] if axes else None
        if x is not None:
            return [], [{"x": x, "value": v} for v in ("test_acc", "train_acc")]
    return [], []


def check_plot_spec(spec, columns: set[str] | None = None) -> None:
    """Refuse a ``[plot]`` entry that names an unknown key or column before anything runs.

    ``columns``: the columns the sweep's tables will have (the planner passes the traced metric
    names of its first group); without it only the axes are checked."""
    plot = spec.plot
    for k in plot:
        if k not in PLOT_KEYS:
            raise ConfigError(f"[plot] unknown key {k!r}; allowed: {', '.join(PLOT_KEYS)}")
    from .registry import all_settings

    settings = set(all_settings()) | {"snr", "n_snr2", "seed"}
    for kind, keys, need in (("heatmaps", HEATMAP_KEYS, ("x", "y")), ("lines", LINE_KEYS, ("x",))):
        entries = plot.get(kind, [])
        if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
            raise ConfigError(f"[plot] {kind} must be a list of tables, e.g. {kind} = "
                              "[{ x = \"signal_norm\", y = \"d\", value = \"regime\" }]")
        for i, h in enumerate(entries):
            w = f"[plot] {kind} #{i + 1}: "
            for k in h:
                if k not in keys:
                    raise ConfigError(f"{w}unknown key {k!r}; allowed: {', '.join(keys)}")
            for k in need:
                if k not in h:
                    raise ConfigError(f"{w}missing {k!r}")
                if h[k] not in settings:
                    raise ConfigError(f"{w}{k} = {h[k]!r} is not a setting or derived column; fix: "
                                      "an axis of the sweep such as " +
                                      ", ".join(repr(a) for a in spec.axes) if spec.axes else
                                      f"{w}{k} = {h[k]!r} is not a setting")
            value = h.get("value", "regime" if kind == "heatmaps" else "test_acc")
            if columns is not None and value != "regime" and value not in columns:
                from .settings import suggest

                raise ConfigError(f"{w}value = {value!r} is not a column of this sweep's results"
                                  f"{suggest(value, columns)}; fix: one of regime, "
                                  + ", ".join(sorted(c for c in columns if not c.startswith("_"))
                                              [:12]) + ", ...")


def default_theory(df: pd.DataFrame, x: str, y: str) -> dict | None:
    """The theory overlay that fits a map's axes (None when none applies)."""
    n = df["n"].unique() if "n" in df.columns else []
    sig = df["sigma_eps"].unique() if "sigma_eps" in df.columns else [1.0]
    if (x, y) == ("signal_norm", "d") and len(n) == 1 and len(sig) == 1:
        return iso_snr_overlay(n=float(n[0]), sigma_eps=float(sig[0]))
    if (x, y) == ("n", "snr"):
        return magen_overlay(x="n")
    if (x, y) == ("snr", "n"):
        return magen_overlay(x="snr")
    return None


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


def _map(df, h: Mapping):
    x, y, value = h["x"], h["y"], h.get("value", "regime")
    where = h.get("where")
    theory = default_theory(A.select(df, where), x, y)
    if value == "regime":
        return regime_map(df, x, y, theory=theory, where=where)
    return value_map(df, value, x, y, theory=theory, where=where, cmap=h.get("cmap"),
                     vmin=h.get("vmin"), vmax=h.get("vmax"), stat=h.get("stat", "mean"))


def sweep_figures(df: pd.DataFrame, spec, out_dir: Path, formats=("png",), dpi=150) -> list[Path]:
    """Draw the figures a sweep asks for (``[plot]``) or the defaults (:func:`wanted_figures`):
    ``heatmap_<value>_<y>_vs_<x>.<format>``, ``line_<value>_vs_<x>.<format>``. A figure whose other
    axes leave several cells per point (and no ``where``) is skipped with a message."""
    out_dir = Path(out_dir)
    formats = tuple(spec.plot.get("formats", formats))
    dpi = int(spec.plot.get("dpi", dpi))
    heat, lines = wanted_figures(spec)
    paths = []
    for h in heat:
        try:
            fig, _ = _map(df, h)
        except ValueError as e:
            print(f"phasebo.plot: skipped heatmap {h.get('value', 'regime')}: {e}",
                  file=sys.stderr)
            continue
        name = f"heatmap_{h.get('value', 'regime')}_{h['y']}_vs_{h['x']}"
        paths += save(fig, out_dir / name, formats, dpi)
        if h.get("value", "regime") == "regime":
            paths += _regime_steps_figure(df, h, out_dir, formats, dpi)
    for h in lines:
        try:
            fig, _ = line_plot(df, h["x"], h.get("value", "test_acc"), hue=h.get("hue"),
                               where=h.get("where"))
        except ValueError as e:
            print(f"phasebo.plot: skipped line plot {h.get('value')}: {e}", file=sys.stderr)
            continue
        paths += save(fig, out_dir / f"line_{h.get('value', 'test_acc')}_vs_{h['x']}", formats,
                      dpi)
    return paths


def _regime_steps_figure(df, h: Mapping, out_dir: Path, formats, dpi) -> list[Path]:
    """With recorded dynamics, the regime map of ``h`` at log-spaced recorded steps."""
    dyn_path = Path(out_dir) / "dynamics.parquet"
    if not dyn_path.exists() or "regime" not in pq_columns(dyn_path):
        return []
    dyn = A.load(out_dir, "dynamics")
    if dyn["step"].nunique() < 2:
        return []
    fig, _ = regime_maps_over_time(dyn, h["x"], h["y"], where=h.get("where"))
    return save(fig, out_dir / f"heatmap_regime_over_steps_{h['y']}_vs_{h['x']}", formats, dpi)


def pq_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_schema(path).names


MAP_VALUES = ("regime", "test_acc", "test_loss", "train_loss", "frac_noisy_fitted",
              "noisy_fit_step")


def representative_cells(runs: pd.DataFrame, axes: Sequence[str]) -> list[tuple[str, dict]]:
    """One cell per regime that occurs (benign, harmful, not overfitting, mixed): the cell of
    that majority regime nearest the middle of the grid, as ``(regime, {axis: value})``."""
    if not axes:
        return [("all", {})]
    cells = A.aggregate(runs, by=list(axes), metrics=["test_acc"])
    out = []
    for r in (*REGIMES, "mixed"):
        sub = cells[cells["regime"].astype(str) == r]
        if sub.empty:
            continue
        ranks = np.zeros(len(sub))
        for a in axes:
            vals = np.sort(cells[a].unique())
            pos = np.searchsorted(vals, sub[a].to_numpy())
            ranks += np.abs(pos / max(len(vals) - 1, 1) - 0.5)
        row = sub.iloc[int(np.argmin(ranks))]
        out.append((r, {a: row[a] for a in axes}))
    return out


def step_figures(results_dir, step, out_dir=None, formats=("png",), dpi=150) -> list[Path]:
    """The maps (or line plots) of a sweep at one recorded step: the regime and the recorded
    metrics of :data:`MAP_VALUES` from ``dynamics.parquet`` (``step``: an int or ``"last"``),
    named ``..._step<S>``."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir / "figures"
    dyn = A.at_step(A.load(results_dir, "dynamics"), step)
    axes = sorted(A.cell_axes(dyn), key=lambda a: -dyn[a].nunique())
    axes = [a for a in axes if a not in ("engine", "model")] or axes
    tag = f"step{step}"
    paths: list[Path] = []
    if len(axes) >= 2:
        x, y = ("signal_norm", "d") if {"signal_norm", "d"} <= set(axes) else (axes[0], axes[1])
        where = {a: dyn[a].iloc[0] for a in axes if a not in (x, y)} or None
        for v in MAP_VALUES:
            if v != "regime" and v not in dyn.columns:
                continue
            fig, ax = _map(dyn, {"x": x, "y": y, "value": v, "where": where})
            ax.set_title(f"{ax.get_title()} — step {step}", fontsize=10)
            paths += save(fig, out / f"map_{v}_{y}_vs_{x}_{tag}", formats, dpi)
    elif len(axes) == 1:
        for v in ("test_acc", "train_acc", "test_loss"):
            fig, ax = line_plot(dyn, axes[0], v)
            ax.set_title(f"{ax.get_title()} — step {step}", fontsize=10)
            paths += save(fig, out / f"line_{v}_vs_{axes[0]}_{tag}", formats, dpi)
    return paths


def standard_figures(results_dir, out_dir=None, formats=("png",), dpi=150) -> list[Path]:
    """Every standard figure a finished sweep's tables allow, in ``out_dir`` (default
    ``RESULTS_DIR/figures``): maps of :data:`MAP_VALUES` over the two longest axes (line plots for
    one axis), the 𝔖-ratio curves when ``noise_ratio`` is an axis, the Fig. 1 token projections of
    a ``constructed_query`` sweep, and, with recorded dynamics, the regime map at log-spaced
    recorded steps, the attention / 𝔖 / gap dynamics of one representative cell per regime and
    the accuracy dynamics of those cells (of every cell when there are at most six)."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir / "figures"
    runs = A.load(results_dir)
    axes = sorted(A.cell_axes(runs), key=lambda a: -runs[a].nunique())
    axes = [a for a in axes if a not in ("engine", "model")] or axes
    paths: list[Path] = []
    if len(axes) >= 2:
        x, y = ("signal_norm", "d") if {"signal_norm", "d"} <= set(axes) else (axes[0], axes[1])
        where = {a: runs[a].iloc[0] for a in axes if a not in (x, y)} or None
        for v in MAP_VALUES:
            if v != "regime" and v not in runs.columns:
                continue
            fig, _ = _map(runs, {"x": x, "y": y, "value": v, "where": where})
            paths += save(fig, out / f"map_{v}_{y}_vs_{x}", formats, dpi)
    elif len(axes) == 1:
        for v in ("test_acc", "train_acc", "test_loss"):
            fig, _ = line_plot(runs, axes[0], v)
            paths += save(fig, out / f"line_{v}_vs_{axes[0]}", formats, dpi)
    if "noise_ratio" in axes and "cumS_clean_pos" in runs.columns:
        fig, _ = s_ratio_curves(runs)
        paths += save(fig, out / "s_ratio_curves", formats, dpi)
    smp_path = results_dir / "samples.parquet"
    reps = representative_cells(runs, axes[:2] if len(axes) <= 2 else axes)
    if smp_path.exists() and "sel_e1" in pd.read_parquet(smp_path).columns:  # constructed_query sweeps
        smp = A.load_samples(results_dir)
        for r, w in reps:
            one = A.select(smp, {**w, "seed": 0})
            rr = A.select(runs, {**w, "seed": 0}).iloc[0]
            title = (", ".join(f"{_short(a)}={_num(v)}" for a, v in w.items()) + " — " if w
                     else "") + f"train {rr['train_acc']:.2f} / test {rr['test_acc']:.2f} ({r})"
            fig, _ = token_projection(one, title=title)
            paths += save(fig, out / f"token_projection_{r}", formats, dpi)
    if (results_dir / "dynamics.parquet").exists():
        dyn = A.load_dynamics(results_dir)
        for r, w in reps:
            sub = A.select(dyn, w)
            label = ", ".join(f"{_short(a)}={_num(v)}" for a, v in w.items())
            if any(c.startswith("attn_clean_t") for c in sub.columns):
                fig, _ = attention_dynamics(sub, title=f"{r}: {label}" if label else r)
                paths += save(fig, out / f"attention_{r}", formats, dpi)
            if any(c.startswith("logit_clean_t") for c in sub.columns):
                fig, _ = gap_dynamics(sub)
                paths += save(fig, out / f"gaps_{r}", formats, dpi)
            if "ss_clean_pos" in sub.columns:
                fig, _ = ss_dynamics(sub)
                paths += save(fig, out / f"ss_{r}", formats, dpi)
        if len(axes) >= 2 and "regime" in dyn.columns and dyn["step"].nunique() > 1:
            x, y = ("signal_norm", "d") if {"signal_norm", "d"} <= set(axes) else (axes[0],
                                                                                   axes[1])
            where = {a: runs[a].iloc[0] for a in axes if a not in (x, y)} or None
            fig, _ = regime_maps_over_time(dyn, x, y, where=where)
            paths += save(fig, out / f"map_regime_over_steps_{y}_vs_{x}", formats, dpi)
        keys = [a for a in axes if a in dyn.columns][:3]
        n_cells = len(runs.drop_duplicates(keys)) if keys else 1
        # every cell when there are few (a line per case or per value), else one per regime
        sel = pd.concat([A.select(dyn, w) for _, w in reps]) if keys and n_cells > 6 else dyn
        fig, _ = accuracy_dynamics(sel, hue=keys or None)
        paths += save(fig, out / "accuracy_dynamics", formats, dpi)
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m phasebo.plot",
                                description="Draw the standard figures of a finished sweep.",
                                epilog="example: python -m phasebo.plot results/default "
                                       "--format png,pdf --dpi 200")
    p.add_argument("results_dir", help="a sweep's output directory")
    p.add_argument("--out", help="where to write figures (default: RESULTS_DIR/figures)")
    p.add_argument("--format", default="png", help="png, pdf, svg or a comma list")
    p.add_argument("--dpi", type=int, default=150)
    p.add_argument("--step", default=None,
                   help="draw the maps at this recorded step (or 'last') from dynamics.parquet "
                        "instead of the standard figures at each run's horizon")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = build_parser()
    if prog:
        p.prog = prog
    args = p.parse_args(argv)
    formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
    try:
        if any(f not in ("png", "pdf", "svg") for f in formats) or not formats:
            raise ConfigError(f"--format {args.format!r}: formats are png, pdf and svg")
        if not Path(args.results_dir).exists():
            raise ConfigError(f"{args.results_dir} does not exist; fix: give a sweep's --out "
                              "directory")
        if args.step is not None:
            step = args.step if args.step == "last" else int(args.step) \
                if args.step.isdigit() else None
            if step is None:
                raise ConfigError(f"--step {args.step!r}: give a recorded step or 'last'")
            paths = step_figures(args.results_dir, step, args.out, formats, args.dpi)
        else:
            paths = standard_figures(args.results_dir, args.out, formats, args.dpi)
    except (ConfigError, ValueError) as e:
        print(f"phasebo.plot: error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())


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
