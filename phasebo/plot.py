"""Figures from results tables: phase diagrams, line plots, dynamics, token projections, 𝔖 ratios.

Every function reads tables (:mod:`phasebo.analysis`), draws on new axes (or on ``ax=`` /
``axes=`` when given) and returns ``(fig, ax)`` — ``ax`` is an array for multi-panel figures.
Nothing calls ``plt.show()``; importing this module selects the Agg backend unless a backend was
already chosen (``MPLBACKEND``, pyplot already imported, or a Jupyter kernel's inline backend).

=====================  ==============================================================
function               what
=====================  ==============================================================
``regime_map``         categorical phase diagram (colour-blind-safe), theory curves, any grid
``value_map``          continuous map of an aggregated metric, accuracies on a fixed scale
``facet_maps``         small multiples of either map, one panel per slice of the other axes
``cases_figure``       the cells of a ``[[cases]]`` sweep side by side (no map of unrun cells)
``boundary_figure``    a regime map with boundaries, their fit (3+ slices) and the theory
``line_plot``          a metric against one axis, mean and SE band per hue (1-D sweeps)
``regime_shares``      the share of seeds in each regime against one axis, Wilson bands
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
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import BoundaryNorm, ListedColormap, LogNorm, Normalize

from . import analysis as A
from .plot_dynamics import (  # noqa: F401 (the figures of a run's path: re-exported)
    accuracy_dynamics,
    attention_dynamics,
    gap_dynamics,
    s_ratio_curves,
    ss_dynamics,
    token_projection,
    tracked_names,
)
from .plot_grid import (  # noqa: F401 (the grid helpers and overlays: re-exported)
    TITLE_SETTINGS,
    _auto_log,
    _cells,
    _edges,
    _grid_ticks,
    _overlay,
    _seed_text,
    _seeds,
    _setup_axes,
    _telling,
    _with_settings,
    boundary_overlay,
    facet_slices,
    is_grid,
    iso_snr_overlay,
    magen_overlay,
    magen_step1_overlay,
    panels_title,
    settings_text,
    slice_hint,
    slice_tag,
    slice_text,
)
from .plot_lines import line_plot, regime_shares  # noqa: F401 (re-exported)
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
# Phase diagrams
# --------------------------------------------------------------------------------------------


def _row_meshes(ax, g: pd.DataFrame, xs, ys, logx, logy, draw, ran: pd.DataFrame | None = None):
    """A rectilinear grid draws as one mesh; a refined (non-uniform) grid, whose rows hold
    different x values, draws row by row with each row's own cell edges. ``ran``: which cells
    were run (default: those with a value); a run cell without a value is drawn empty."""
    ran = g.notna() if ran is None else ran.reindex(index=g.index, columns=g.columns,
                                                     fill_value=False).astype(bool)
    have = ran.to_numpy()
    full = have.all() or not have.any() or len(ys) == 1  # no value anywhere: one grey mesh
    ye = _edges(ys, logy)
    if full:
        return [draw(_edges(xs, logx), ye, g.to_numpy())], _edges(xs, logx), ye
    rows, lo, hi = [], np.inf, -np.inf
    for i in range(len(ys)):
        row = g.iloc[i]
        have = ran.iloc[i].to_numpy()
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
    ax.set_title(title or _with_settings(f"regime ({_seed_text(cells)})", cells), fontsize=10)
    return fig, ax


def present_regimes(labels) -> list[str]:
    """The colour key of a regime map: the three regimes always, then whichever of fitting,
    no noise, mixed and failed occur in ``labels`` (a grid or a column of cell labels)."""
    have = set(np.asarray(labels, dtype=object).ravel().tolist())
    return [c for c in (*REGIMES, "mixed", "failed") if c in CORE_REGIMES or c in have]


def regime_colorbar(fig, mesh, cats: Sequence[str], ax, cax=None):
    cb = fig.colorbar(mesh, ax=ax, cax=cax, ticks=np.arange(len(cats)))
    cb.ax.set_yticklabels([{"mixed": "mixed\n(no majority)", "fitting": "fitting\n(still)",
                            "no_noise": "no noise\n(nothing to overfit)",
                            "no_baseline": "no baseline\n(no clean run)"}.get(
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
    """Small multiples of the regime map at recorded steps (:func:`phasebo.regimes.regimes_over_time`),
    one shared colour key. ``dyn``: a dynamics table with its settings (``pb.load(path,
    "dynamics")``); ``steps``: the recorded steps to draw (default: four, log-spaced over the two
    decades before the horizon, three for a flow, the horizon last).
    """
    dyn = A.select(dyn, where)
    tau = A.flow_times(dyn)  # a flow: a panel per decade of τ over the last three, titled with it
    steps = log_spaced_steps(dyn["step"], decades=2.0 if tau is None else 3.0) if steps is None \
        else list(steps)
    sel = A.at_step(dyn, steps)
    others = A.other_axes(sel, x, y)
    if others:
        raise ValueError(slice_hint(sel, others[0], x, y))
    # one aggregate for every panel (the step is a cell key), regime fractions only
    agg = A.aggregate(sel, by=[x, y], metrics=["test_acc"])
    cells = {s: agg[agg["step"] == s] for s in steps}
    cats = present_regimes(np.concatenate([c["regime"].astype(str).to_numpy()
                                           for c in cells.values()]))
    fig, axs, cax = _panel_grid(len(steps), ncols if len(steps) != 4 else 2)
    for ax, s in zip(axs.flat, steps):
        regime_map(cells[s], x, y, ax=ax, theory=theory, categories=cats, colorbar=False,
                   title=f"step {s}" + ("" if tau is None else f" (τ {_num(tau[s])})"))
    _figure_legend(fig, axs)
    regime_colorbar(fig, axs.flat[0].collections[0], cats, None, cax=cax)
    seeds = _seed_text(next(iter(cells.values())))
    text = settings_text(sel, skip=(x, y, "steps"))
    panels_title(fig, axs, title or f"regime at recorded steps ({seeds})" + (f"\n{text}" if text else ""))
    fig.regime_steps = steps  # for tests and callers
    return fig, axs


def boundary_trajectory(b: pd.DataFrame, x: str, y: str, slices: Sequence | None = None,
                        ax=None, title: str | None = None):
    """A boundary over time: for each slice value of ``y``, the boundary along ``x`` against the
    recorded step (log axis), with its interval; ``b`` is :func:`phasebo.boundaries` on a
    dynamics table (a ``step`` column). ``slices``: the ``y`` values to draw (default: up to six,
    spread over those with a boundary)."""
    from .scaling import estimator_text, horizon_text, resolved

    fig, ax = _new(ax, figsize=(6.8, 4.6))
    ok = resolved(b)  # the slices the text calls found: placed, with a bounded interval
    vals = every = np.sort(ok[y].unique())
    if slices is None and len(vals) > 6:
        vals = vals[np.unique(np.round(np.linspace(0, len(vals) - 1, 6)).astype(int))]
    elif slices is not None:
        vals = np.asarray(slices)
    cmap = plt.get_cmap("viridis")
    drawn = []  # the slices drawn: the title's seeds and count are theirs
    for i, v in enumerate(vals):
        g = ok[np.isclose(ok[y].to_numpy(float), float(v))].sort_values("step")
        if g.empty:
            continue
        drawn.append(g)
        # slices dodged a little along the log step axis: equal boundaries would hide each other
        st = g["step"].to_numpy(float) * 1.15 ** ((i - (len(vals) - 1) / 2) / max(len(vals) - 1, 1))
        bx = g["boundary"].to_numpy(float)
        err = np.vstack([bx - g["lo"].to_numpy(float), g["hi"].to_numpy(float) - bx])
        ax.errorbar(st, bx, yerr=err, fmt="-o", ms=3, capsize=2, lw=1.2,
                    color=cmap(i / max(len(vals) - 1, 1)), label=f"{_short(y)} = {_num(v)}")
    ax.set_xscale("log")
    _plain_log(ax.xaxis)
    if (ok["boundary"] > 0).all() and x in LOG_AXES:
        ax.set_yscale("log")
        _plain_log(ax.yaxis)
    ax.set_xlabel("recorded step (slices dodged apart)" if len(vals) > 1 else "recorded step")
    ax.set_ylabel(f"boundary {_label(x)}")
    # the seeds each point rests on: a slice at an early step may hold fewer with both regimes
    on = pd.concat(drawn) if drawn else ok
    seeds = _seeds(int(on["n_seeds"].min()), int(on["n_seeds"].max())) if len(on) else "0 seeds"
    how = estimator_text(b)
    last = b[b["step"] == b["step"].max()] if len(b) else b  # the horizon: its step (and time)
    horizon = horizon_text(last).replace(" at ", " to ", 1).strip().replace(" ", "\u00a0")  # unbroken
    shown = "" if len(drawn) == len(every) else f"{len(drawn)} of the {len(every)} "
    sub = f"(95% intervals over {seeds}; {shown}slices with a bounded interval; recorded {horizon})"
    ax.set_title(title or f"boundary {b['between'].iloc[0].replace('/', ' / ').replace('_', ' ')} over time"
                 f"{', ' + how if how else ''}\n{textwrap.fill(sub, 80)}", fontsize=10)
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


def color_range(value: str, finite: np.ndarray, vmin=None, vmax=None):
    """``(lo, hi, vmin, vmax)``: the data's range and the colour range of ``value`` — its fixed
    scale (:func:`fixed_scale`) or the data's, unless ``vmin`` / ``vmax`` are given."""
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 1.0
    fixed = fixed_scale(value, lo)
    vmin = (fixed[0] if fixed else lo) if vmin is None else vmin
    vmax = (fixed[1] if fixed else hi) if vmax is None else vmax
    return lo, hi, vmin, vmax


def range_text(lo: float, hi: float) -> str:
    """``lo–hi`` with the fewest significant digits (3 to 8) that tell them apart."""
    for digits in range(3, 9):
        a, b = f"{lo:.{digits}g}", f"{hi:.{digits}g}"
        if a != b or lo == hi:
            return f"{a}–{b}" if lo != hi else a
    return f"{a}–{b}"


def colour_key(cbar, what: str, lo: float, hi: float, any_value: bool) -> None:
    """Label a value map's colour bar with the data's range, or say no cell has a value."""
    cbar.set_label(f"{what}\n(data range {range_text(lo, hi)})" if any_value else
                   f"{what}\n(no value in any cell)")
    if not any_value:
        cbar.set_ticks([])


def value_map(df: pd.DataFrame, value: str, x: str = "signal_norm", y: str = "d", ax=None,
              cmap: str | None = None, vmin=None, vmax=None, theory: Theory | None = None,
              where: Mapping | None = None, stat: str = "mean", logx: bool | None = None,
              logy: bool | None = None, lognorm: bool | None = None, title: str | None = None,
              colorbar: bool = True):
    """Continuous map of ``value`` (a metric; its seed ``stat``: mean, se, min, max) over two axes.

    Accuracies are drawn on a fixed scale, [0.5, 1] (chance to perfect on a balanced binary task;
    [0, 1] when a cell is below chance), so maps of different sweeps compare by colour and
    0.9995 against 1.0 is not navy against yellow; fractions on [0, 1]; other metrics span the
    data. ``vmin`` / ``vmax`` override. The colour bar states the data range to as many digits as
    tell its ends apart. Losses use a log scale when they span more than a factor 10. Cells
    without a value are light grey.
    """
    if stat not in STATS:
        raise ValueError(f"value_map: stat = {stat!r}; fix: one of {', '.join(STATS)}")
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
    lo, hi, vmin, vmax = color_range(value, fin, vmin, vmax)
    vmax = vmax if vmax > vmin else vmin + 1e-9
    if lognorm is None:
        lognorm = "loss" in value and fin.size > 0 and lo > 0 and hi / lo > 10
    norm = LogNorm(vmin=vmin, vmax=vmax) if lognorm else Normalize(vmin=vmin, vmax=vmax)
    fig, ax = _new(ax)
    ax.set_facecolor("#f2f2f2")

    def draw(xe, ye, zz):
        return ax.pcolormesh(xe, ye, np.ma.masked_invalid(zz.astype(float)),
                             cmap=cmap or "cividis", norm=norm)

    ran = A.pivot(cells, x, y, "n_runs").notna() if "n_runs" in cells.columns else None
    meshes, xe, ye = _row_meshes(ax, g, xs, ys, logx, logy, draw, ran)  # failed cells: empty
    what = _label(value) + ("" if stat == "mean" else f" ({stat})")
    if colorbar:
        colour_key(fig.colorbar(meshes[0], ax=ax), what, lo, hi, fin.size > 0)
    _setup_axes(ax, x, y, logx, logy, xe, ye, xs if len(meshes) == 1 else None, ys)
    _overlay(ax, theory, xe, logx, ye)
    text = f"{_label(value)} ({stat} over seeds; {_seed_text(cells)})"
    if value.endswith("_step") and not A.is_aggregate(df):  # a step only where it happened
        k = A.finite_counts(A.select(df, where), [x, y], value)
        text = (f"{_label(value)} ({stat} over the seeds where it happened: "
                f"{_seeds(int(k.min()), int(k.max()))} per cell; {_seed_text(cells)})")
    if not np.isfinite(z).all():
        text += "\ngrey: no value" + (" (never happened in any seed)" if value.endswith("_step")
                                      else "")
    ax.set_title(title or _with_settings(text, cells), fontsize=10)
    return fig, ax


STATS = ("mean", "se", "min", "max")  # what pb.aggregate gives of each metric
MAX_PANELS = 12  # more slices than this: one file per slice instead of small multiples
MAX_CASES = 40  # more cells than this: no cases figure (its table and report.html instead)


def _panel_grid(n: int, ncols: int | None = None, key_width: float = 2.6):
    """A fixed grid of ``n`` map panels with room on the right for one shared colour key (no
    layout engine: constrained layout measured every tick label of every panel, doubling the
    drawing time); returns ``fig, axs, cax``."""
    ncols = ncols or (2 if n == 4 else min(n, 3))
    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    height, width = 3.5 * nrows + 1.2, 3.9 * ncols + key_width
    fig, axs = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    fig.subplots_adjust(left=0.75 / width, right=1 - (key_width - 0.3) / width,
                        bottom=1.0 / height, top=1 - 0.9 / height, wspace=0.3, hspace=0.45)
    for ax in axs.flat[n:]:
        ax.set_visible(False)
    cax = fig.add_axes((1 - (key_width - 0.6) / width, 0.15, 0.2 / width, 0.7))
    return fig, axs, cax


def _figure_legend(fig, axs):
    """The panels' theory curves named once, below the grid, instead of under every panel."""
    handles, labels = axs.flat[0].get_legend_handles_labels()
    for ax in axs.flat:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(handles), 3), fontsize=8,
                   frameon=False, handlelength=3)


def facet_maps(df: pd.DataFrame, x: str = "signal_norm", y: str = "d", value: str = "regime",
               facets: Sequence[str] | None = None, where: Mapping | None = None,
               theory: Theory | None = None, stat: str = "mean", cmap: str | None = None,
               vmin=None, vmax=None, ncols: int | None = None, title: str | None = None):
    """Small multiples: the map of ``value`` (``"regime"`` or a metric) over ``x`` and ``y``,
    one panel per slice of the ``facets`` (default: the other axes that vary), with one shared
    colour key (regimes) or one colour scale (metrics: the fixed scale of
    :func:`fixed_scale`, else the range of every panel). Each panel is titled by its slice;
    the figure's title states the seeds and the settings every panel shares. ``fig.slices``:
    the panels' slices, in order."""
    if stat not in STATS:
        raise ValueError(f"facet_maps: stat = {stat!r}; fix: one of {', '.join(STATS)}")
    df = A.select(df, where)
    facets = list(A.untied(df, A.other_axes(df, x, y)) if facets is None else facets)
    slices = facet_slices(df, facets)
    if len(slices) > 4 * MAX_PANELS:
        raise ValueError(f"facet_maps: {len(slices)} slices of {', '.join(facets)}; fix: fix "
                         "some with where= (or draw one file per slice)")
    cells = A.aggregate(df, by=[x, y, *facets], metrics=None if value == "regime" else
                        [value]) if not A.is_aggregate(df) else df
    fig, axs, cax = _panel_grid(len(slices), ncols)
    col = f"{value}_{stat}"
    if value == "regime":
        cats = present_regimes(cells["regime"].astype(str))
    else:
        fin = cells[col].to_numpy(float)
        lo, hi, vmin, vmax = color_range(value, fin[np.isfinite(fin)], vmin, vmax)
    for ax, w in zip(axs.flat, slices):
        sub = A.select(cells, w)
        if value == "regime":
            regime_map(sub, x, y, ax=ax, theory=theory, categories=cats, colorbar=False,
                       title=slice_text(w))
        else:  # a panel without any value says so (a step metric at the limit, which has none)
            empty = not np.isfinite(sub[col].to_numpy(float)).any()
            value_map(sub, value, x, y, ax=ax, theory=theory, stat=stat, cmap=cmap, vmin=vmin,
                      vmax=vmax, colorbar=False,
                      title=slice_text(w) + ("\n(no value in any cell)" if empty else ""))
    _figure_legend(fig, axs)
    mesh = axs.flat[0].collections[0]
    if value == "regime":
        regime_colorbar(fig, mesh, cats, None, cax=cax)
        what = "regime"
    else:
        what = _label(value) + ("" if stat == "mean" else f" ({stat})")
        colour_key(fig.colorbar(mesh, cax=cax), what, lo, hi, bool(np.isfinite(fin).any()))
        what += f" ({stat} over seeds)"
        if not np.isfinite(fin).all():
            what += "; grey: no value"
    text = settings_text(df, skip=(x, y, *facets))
    panels_title(fig, axs, title or f"{what}, {_seed_text(cells)}" + (f"\n{text}" if text else ""))
    fig.slices = slices
    return fig, axs


def cases_figure(df: pd.DataFrame, metrics: Sequence[str] = ("train_acc", "test_acc"),
                 cases: Sequence[str] | None = None, ax=None, title: str | None = None):
    """The cells of a ``[[cases]]`` sweep (or any few cells) side by side: each metric's mean ±
    SE over seeds per case, one row per case labelled by its settings and majority regime.
    ``cases``: the columns that tell the cases apart (default: the axes that vary)."""
    cases = list(A.cell_axes(df) if cases is None else cases)
    cells = df if A.is_aggregate(df) else A.aggregate(df, by=cases or None,
                                                      metrics=list(metrics))
    if len(cells) > MAX_CASES:
        raise ValueError(f"{len(cells)} cells are too many to draw side by side (at most "
                         f"{MAX_CASES}); fix: pb.aggregate(runs) gives their table, or report.html")
    fig, ax = _new(ax, (6.4, 2.4 + 0.55 * len(cells) * max(1, len(metrics) / 2)))
    colors = ["#009E73", "#0072B2", "#D55E00", "#CC79A7", "#56B4E9"]
    rows = np.arange(len(cells))
    width = 0.8 / max(len(metrics), 1)
    for i, m in enumerate(metrics):
        mean = cells[f"{m}_mean"].to_numpy(float)
        se = np.nan_to_num(cells[f"{m}_se"].to_numpy(float))
        pos = rows - 0.4 + width * (i + 0.5)
        ax.barh(pos, mean, height=width * 0.9, xerr=se, color=colors[i % len(colors)],
                label=_label(m), capsize=2)
    labels = []
    for _, r in cells.iterrows():
        w = {a: r[a] for a in _telling(cells, cases) if not (isinstance(r[a], float)
                                                             and np.isnan(r[a]))}
        text = "\n".join(textwrap.wrap(slice_text(w), 34))
        reg = str(r["regime"]).replace("_", " ") if "regime" in cells.columns else None
        labels.append(text + (f"\n{'mixed (no majority regime)' if reg == 'mixed' else reg}"
                              if reg else ""))
    ax.set_yticks(rows, labels, fontsize=8)
    ax.invert_yaxis()
    lo = min(0.0, float(np.nanmin([cells[f"{m}_mean"].min() for m in metrics])))
    ax.set_xlim(lo, 1.02 if all(m.endswith("_acc") for m in metrics) else None)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=2,
              frameon=False)
    text = settings_text(df, skip=cases)
    ax.set_title(title or f"mean ± SE, {_seed_text(cells)}" + (f"\n{text}" if text else ""),
                 fontsize=10)
    return fig, ax


# --------------------------------------------------------------------------------------------
# Dynamics
# --------------------------------------------------------------------------------------------


def save(fig, path: Path, formats: Sequence[str] = ("png",), dpi: int = 150) -> list[Path]:
    """Save ``fig`` as ``path`` with each suffix in ``formats`` (png, pdf, svg); closes it.
    ``path`` is a stem (a slice's ``r0.1`` is part of the name, not a suffix to replace); a
    trailing ``.png`` / ``.pdf`` / ``.svg`` is dropped first."""
    path = Path(path)
    if path.suffix in (".png", ".pdf", ".svg"):
        path = path.with_suffix("")
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for f in formats:
        p = path.with_name(f"{path.name}.{f}")
        fig.savefig(p, dpi=dpi)
        out.append(p)
    plt.close(fig)
    return out


def boundary_figure(runs: pd.DataFrame, b: pd.DataFrame, x: str, y: str, title: str | None = None):
    """The regime map of ``runs`` (refined grids drawn row by row) with the boundaries ``b``,
    their power-law fit and the theory's exponent on top."""
    from .scaling import along, estimator_text, power_law_row

    along(b, x)
    if "step" in runs.columns and "step" in b.columns and b["step"].nunique() == 1:
        runs = runs[runs["step"] == b["step"].iloc[0]]  # the map at the boundaries' step
    fig, ax = regime_map(runs, x, y, title=title)
    how = estimator_text(b)
    if title is None and how:  # the estimator, on the figure
        head, *rest = ax.get_title().split("\n", 1)
        ax.set_title("\n".join([f"{head}, {how}", *rest]), fontsize=10)
    row = power_law_row(b, x, y)
    fit = th = None
    if row["status"] != "too_few_slices":
        fit = {k: row[k] for k in ("exponent", "lo", "hi", "prefactor", "chi2_dof")}
        if np.isfinite(row["theory_exponent"]):
            th = {"exponent": row["theory_exponent"], "prefactor": row["theory_prefactor"]}
    boundary_overlay(ax, b, x, y, fit, th, band=row["status"] == "ok")
    n = row["n_points"]
    note = {"too_few_slices": f"no power-law fit: {n} usable slice{'s' if n != 1 else ''} "
                              "(placed, with a bounded interval; 3 needed)",
            "scattered": f"scattered: χ²/dof {row['chi2_dof']:.1f}, one power law does not "
                         "describe this boundary",
            "grid_limited": "grid-limited: every boundary only bracketed by the grid (a fit "
                            "through gap midpoints); refine the grid"}.get(row["status"])
    # wrapped: a line running past the axes shrank the map to make room
    note = textwrap.fill(note, 70) if note else None
    if ax.get_legend() is not None:  # below the map, the note its title: inside, they hid cells
        n = len(ax.get_legend().get_texts()) + (note.count("\n") + 1 if note else 0)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=1,
                  frameon=False, title=note, title_fontsize=7)
        w, h = fig.get_size_inches()
        fig.set_size_inches(w, h + 0.17 * n)
    elif note:
        ax.text(0.5, -0.1, note, transform=ax.transAxes, fontsize=7, ha="center", va="top")
        w, h = fig.get_size_inches()
        fig.set_size_inches(w, h + 0.17 * (note.count("\n") + 1))
    fig.boundary_fit = row  # for tests and callers
    return fig


if __name__ == "__main__":
    from .cli import guarded
    from .cli.plot import main

    sys.exit(guarded(main))
