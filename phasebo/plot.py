"""Figures from results tables: phase diagrams, dynamics, token projections, 𝔖 ratios.

Every function reads tables (:mod:`phasebo.analysis`), draws on new axes (or on ``ax=`` /
``axes=`` when given) and returns ``(fig, ax)`` — ``ax`` is an array for multi-panel figures.
Nothing calls ``plt.show()``; importing this module selects the Agg backend unless a backend was
already chosen (``MPLBACKEND``, pyplot already imported, or a Jupyter kernel's inline backend).

=====================  ============================================  ===========================
function               what                                          SPEC
=====================  ============================================  ===========================
``regime_map``         categorical phase diagram, theory overlay      S3, M7
``value_map``          continuous map of any aggregated metric        S3, M7
``attention_dynamics`` softmax mass per token, clean + flipped sample S2, S5
``ss_dynamics``        group means of s(1−s), clean vs flipped        S §1 (Fig. 2)
``accuracy_dynamics``  train/test accuracy and losses vs log-step     M1, delayed generalisation
``gap_dynamics``       attention gaps Λ, Γ and g(gap) vs step          S §1
``token_projection``   selected-token projections on (e₁, e₂)         S1
``s_ratio_curves``     𝔖 ratios and test accuracy over noise ratio    S4
=====================  ============================================  ===========================

Command line::

    python -m phasebo.plot RESULTS_DIR [--out DIR]   # the standard figures of a finished sweep
    python -m phasebo.plot --reference               # rebuild results/reference/*.png
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
from matplotlib.colors import BoundaryNorm, ListedColormap, LogNorm  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from . import analysis as A  # noqa: E402
from . import theory as TH  # noqa: E402
from .results import REGIMES  # noqa: E402

REGIME_COLORS = {"benign": "#4c9f70", "harmful": "#d1495b", "not_overfitting": "#edae49",
                 "mixed": "#b0b0b0", "failed": "#303030"}
ROLE_COLORS = {"rel": "#2a9d8f", "weak": "#457b9d", "weak_opp": "#e63946", "irr": "#9a9a9a"}
ROLE_LABELS = {"rel": "relevant", "weak": "weakly relevant", "weak_opp": "weak, opposite class",
               "irr": "irrelevant"}
LABELS = {
    "signal_norm": "‖μ‖ (signal norm)", "d": "d (dimension)", "n": "n (training samples)",
    "snr": "SNR", "n_snr2": "n·SNR²", "noise_ratio": "noise ratio", "lr": "step size",
    "step": "step", "test_acc": "test accuracy", "train_acc": "train accuracy",
    "test_loss": "test loss", "train_loss": "train loss",
    "frac_noisy_fitted": "fraction of flipped samples fitted (at some step)",
    "noisy_fit_step": "step all flipped samples fitted", "T": "T (tokens)",
}
LOG_AXES = {"d", "n", "snr", "n_snr2", "lr", "n_test", "signal_norm"}

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
    """Cell edges around sorted centres (geometric midpoints on a log axis)."""
    vals = np.asarray(vals, float)
    v = np.log(vals) if log else vals
    if len(v) == 1:
        h = 0.1 if log else max(abs(v[0]) * 0.1, 0.5)
        e = np.array([v[0] - h, v[0] + h])
    else:
        mid = (v[1:] + v[:-1]) / 2
        e = np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]])
    return np.exp(e) if log else e


def _cells(df: pd.DataFrame, where) -> pd.DataFrame:
    df = A.select(df, where)
    return df if A._is_aggregate(df) else A.aggregate(df)


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
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])


def _overlay(ax, theory: Theory | None, xe, logx, ye):
    """Draw ``theory`` curves ``y = f(x)`` across the map, clipped to it, with a legend."""
    if theory is None:
        return
    curves = theory if isinstance(theory, Mapping) else {"theory": theory}
    xx = np.geomspace(xe[0], xe[-1], 400) if logx else np.linspace(xe[0], xe[-1], 400)
    styles = ["--", ":", "-.", (0, (5, 1, 1, 1))]
    for i, (name, f) in enumerate(curves.items()):
        yy = np.asarray(f(xx), float)
        yy = np.where((yy >= ye[0]) & (yy <= ye[-1]), yy, np.nan)
        ax.plot(xx, yy, color="k", ls=styles[i % len(styles)], lw=1.6, label=name)
    ax.set_ylim(ye[0], ye[-1])
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=min(len(curves), 3),
              fontsize=8, frameon=False, handlelength=3)


def iso_snr_overlay(kappas: Sequence[float] = (0.1, 4.0, 200.0), n: float = 20,
                    sigma_eps: float = 1.0) -> dict:
    """Theory curves for a (x = ‖μ‖, y = d) map: ``d = n ‖μ‖² / (κ σ²)`` for each κ."""
    return {f"n·SNR² = {k:g}": (lambda x, k=k: TH.iso_snr_d(x, k, n, sigma_eps)) for k in kappas}


def magen_overlay(c: float = 1.0, x: str = "n") -> dict:
    """Theory curve SNR = c/√n for a (x = n, y = snr) map, or n = c²/SNR² for (x = snr, y = n)."""
    if x == "n":
        return {f"SNR = {c:g}/√n": lambda nn: TH.magen_boundary_snr(nn, c)}
    return {f"SNR = {c:g}/√n": lambda s: (c / np.asarray(s, float)) ** 2}


# --------------------------------------------------------------------------------------------
# Phase diagrams
# --------------------------------------------------------------------------------------------


def regime_map(df: pd.DataFrame, x: str = "signal_norm", y: str = "d", ax=None,
               theory: Theory | None = None, where: Mapping | None = None,
               logx: bool | None = None, logy: bool | None = None, title: str | None = None):
    """Categorical phase diagram: each cell coloured by the regime of a strict majority of its
    ok seeds (benign / harmful / not overfitting), grey where no regime has a majority.

    ``df``: a runs table or an aggregate; ``where`` fixes other axes. ``theory``: a callable
    ``y = f(x)`` or ``{label: f}`` drawn as dashed black lines. The cell codes are
    ``ax.collections[0].get_array()`` (indices into ``ax.regime_categories``).
    """
    cells = _cells(df, where)
    g = A.pivot(cells, x, y, "regime")
    present = [c for c in ("mixed", "failed") if (g == c).to_numpy().any()]
    cats = [*REGIMES, *present]
    code = np.full(g.shape, np.nan)
    for i, c in enumerate(cats):
        code[(g == c).to_numpy()] = i
    xs, ys = g.columns.to_numpy(float), g.index.to_numpy(float)
    logx = _auto_log(x, xs) if logx is None else logx
    logy = _auto_log(y, ys) if logy is None else logy
    xe, ye = _edges(xs, logx), _edges(ys, logy)
    fig, ax = _new(ax)
    cmap = ListedColormap([REGIME_COLORS[c] for c in cats])
    norm = BoundaryNorm(np.arange(len(cats) + 1) - 0.5, cmap.N)
    few = max(len(xs), len(ys)) <= 16  # cell borders only where cells are large
    mesh = ax.pcolormesh(xe, ye, np.ma.masked_invalid(code), cmap=cmap, norm=norm,
                         edgecolors="white" if few else "face", linewidth=0.3 if few else 0)
    cb = fig.colorbar(mesh, ax=ax, ticks=np.arange(len(cats)))
    cb.ax.set_yticklabels([{"mixed": "mixed\n(no majority)"}.get(c, c.replace("_", " "))
                           for c in cats])
    cb.ax.tick_params(length=0)
    _setup_axes(ax, x, y, logx, logy, xe, ye, xs, ys)
    _overlay(ax, theory, xe, logx, ye)
    ax.regime_categories = cats  # for tests and callers: code i <-> cats[i]
    ax.set_title(title or f"regime ({_seed_text(cells)})", fontsize=10)
    return fig, ax


def value_map(df: pd.DataFrame, value: str, x: str = "signal_norm", y: str = "d", ax=None,
              cmap: str | None = None, vmin=None, vmax=None, theory: Theory | None = None,
              where: Mapping | None = None, stat: str = "mean", logx: bool | None = None,
              logy: bool | None = None, lognorm: bool | None = None, title: str | None = None):
    """Continuous map of ``value`` (a metric; its seed ``stat``: mean, se, min, max) over two axes.

    Accuracies and fractions use the range [0, 1]; losses a log colour scale when they span more
    than a factor 10. Cells without a value (missing, or a step that never happened in any
    seed) are light grey.
    """
    cells = _cells(df, where)
    col = f"{value}_{stat}" if f"{value}_{stat}" in cells.columns else value
    if col not in cells.columns:
        raise KeyError(f"value_map: no column {value!r} (or {value}_{stat}) in the table")
    g = A.pivot(cells, x, y, col).astype(float)
    z = g.to_numpy()
    xs, ys = g.columns.to_numpy(float), g.index.to_numpy(float)
    logx = _auto_log(x, xs) if logx is None else logx
    logy = _auto_log(y, ys) if logy is None else logy
    xe, ye = _edges(xs, logx), _edges(ys, logy)
    bounded = value.endswith("_acc") or value.startswith("frac_") or "_acc_" in value
    if bounded and stat in ("mean", "min", "max"):
        vmin = 0.0 if vmin is None else vmin
        vmax = 1.0 if vmax is None else vmax
    fin = z[np.isfinite(z)]
    if lognorm is None:
        lognorm = "loss" in value and fin.size > 0 and fin.min() > 0 and fin.max() / fin.min() > 10
    norm = LogNorm(vmin=vmin, vmax=vmax) if lognorm else None
    fig, ax = _new(ax)
    ax.set_facecolor("#f2f2f2")
    mesh = ax.pcolormesh(xe, ye, np.ma.masked_invalid(z), cmap=cmap or "viridis", norm=norm,
                         vmin=None if lognorm else vmin, vmax=None if lognorm else vmax)
    fig.colorbar(mesh, ax=ax, label=_label(value) + ("" if stat == "mean" else f" ({stat})"))
    _setup_axes(ax, x, y, logx, logy, xe, ye, xs, ys)
    _overlay(ax, theory, xe, logx, ye)
    what = f"{_label(value)} ({stat} over seeds; {_seed_text(cells)})"
    if not np.isfinite(z).all():
        what += "\ngrey: no value" + (" (never happened in any seed)" if value.endswith("_step")
                                      else "")
    ax.set_title(title or what, fontsize=10)
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


def attention_dynamics(dyn: pd.DataFrame, run: int | None = None, where: Mapping | None = None,
                       axes=None, logx: bool = False, title: str | None = None):
    """Softmax probability of every token vs step, for the tracked clean and flipped sample (S2).

    ``dyn``: a dynamics table (:func:`phasebo.analysis.load_dynamics`); the run is ``run``
    (a run id) or the first run matching ``where``. Two panels; colours by token role.
    """
    d = _one_run(dyn, run, where)
    own = axes is None
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True, layout="constrained")
    fig = axes[0].figure
    step = d["step"].to_numpy()
    for ax, grp, name in zip(axes, ("clean", "noisy"), ("clean sample", "flipped sample")):
        cols = _tokens(d, f"attn_{grp}_t")
        roles = _roles(d, len(cols))
        for k, (c, r) in enumerate(zip(cols, roles)):
            ax.plot(step, d[c], color=ROLE_COLORS[r], lw=2.0 if r != "irr" else 1.0,
                    alpha=1.0 if r != "irr" else 0.7, label=f"token {k}")
        ax.set_title(f"{name}" + (f" — {title}" if title else ""), fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        _xstep(ax, logx)
    axes[0].set_ylabel("softmax probability")
    roles = _roles(d, len(_tokens(d, "attn_clean_t")))
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
    """Group means of ``𝔖 = s_R(1 − s_R)`` for clean vs flipped samples vs step (SPEC §1, Fig. 2).

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
    """Attention gaps Λ (clean sample) and Γ (flipped sample) and ``g(gap)`` vs step (SPEC §1).

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
# S1 and S4
# --------------------------------------------------------------------------------------------

_PROJ_NAMES = (("proj_e1", "proj_e2"), ("x1", "x2"), ("e1", "e2"), ("sel_e1", "sel_e2"))


def token_projection(points: pd.DataFrame, ax=None, title: str | None = None,
                     where: Mapping | None = None, run: int | None = None):
    """S1 scatter: the selected (argmax-attention) token of each sample projected on (e₁, e₂).

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
    """S4: the 𝔖 ratio (:func:`phasebo.theory.s_ratios`) and test accuracy vs ``x``.

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


def _save(fig, path: Path, dpi=110) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _map(df, x, y, value, where=None):
    theory = default_theory(A.select(df, where), x, y)
    if value == "regime":
        return regime_map(df, x, y, theory=theory, where=where)
    return value_map(df, value, x, y, theory=theory, where=where)


def sweep_figures(df: pd.DataFrame, spec, out_dir: Path) -> list[Path]:
    """Draw the heatmaps a sweep asks for (``[plot] heatmaps``) or the default set.

    Called by :func:`phasebo.sweep.run_sweep` after a sweep; files ``heatmap_<value>_<y>_vs_<x>
    .png``. A map is skipped (with a message) when the other axes of the sweep leave several cells
    per (x, y) pair and the sweep file gives no ``where``.
    """
    out_dir = Path(out_dir)
    wanted = list(spec.plot.get("heatmaps", []))
    if not wanted:
        ax = default_heatmap_axes(spec)
        if ax is None:
            return []
        wanted = [{"x": ax[0], "y": ax[1], "value": v}
                  for v in ("regime", "test_acc", "train_acc", "test_loss")]
    paths = []
    for h in wanted:
        x, y, value = h["x"], h["y"], h.get("value", "regime")
        try:
            fig, _ = _map(df, x, y, value, where=h.get("where"))
        except ValueError as e:
            print(f"phasebo.plot: skipped heatmap {value} {y} vs {x}: {e}", file=sys.stderr)
            continue
        paths.append(_save(fig, out_dir / f"heatmap_{value}_{y}_vs_{x}.png"))
    return paths


MAP_VALUES = ("regime", "test_acc", "test_loss", "train_loss", "frac_noisy_fitted",
              "noisy_fit_step")


def standard_figures(results_dir, out_dir=None, max_runs: int = 3) -> list[Path]:
    """Every standard figure a finished sweep's tables allow, as PNGs in ``out_dir``
    (default ``RESULTS_DIR/figures``): maps of :data:`MAP_VALUES` over the two longest axes, the
    𝔖-ratio curves when ``noise_ratio`` is an axis, and, when dynamics were recorded, the
    attention / 𝔖 / accuracy / gap dynamics of the first ``max_runs`` cells."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir / "figures"
    runs = A.load(results_dir)
    axes = sorted((a for a in A.cell_axes(runs) if a not in ("source", "sweep")),
                  key=lambda a: -runs[a].nunique())
    paths: list[Path] = []
    if len(axes) >= 2:
        x, y = ("signal_norm", "d") if {"signal_norm", "d"} <= set(axes) else (axes[0], axes[1])
        rest = [a for a in axes if a not in (x, y)]
        where = {a: runs[a].iloc[0] for a in rest} or None
        for v in MAP_VALUES:
            if v != "regime" and v not in runs.columns:
                continue
            fig, _ = _map(runs, x, y, v, where)
            paths.append(_save(fig, out / f"map_{v}_{y}_vs_{x}.png"))
    if "noise_ratio" in axes and "cumS_clean_pos" in runs.columns:
        fig, _ = s_ratio_curves(runs)
        paths.append(_save(fig, out / "s_ratio_curves.png"))
    smp_path = results_dir / "samples.parquet"
    if smp_path.exists() and "sel_e1" in pd.read_parquet(smp_path).columns:  # S1 sweeps
        smp = A.load_samples(results_dir)
        keys = [k for k in ("source", "run_id") if k in smp.columns]
        for row in smp[keys].drop_duplicates().head(max_runs).itertuples(index=False):
            one = smp[(smp[keys] == pd.Series(row._asdict())).all(axis=1)]
            r = runs[(runs["run_id"] == one["run_id"].iloc[0])].iloc[0]
            title = (", ".join(f"{_short(a)}={r[a]:.4g}" for a in axes) + " — " if axes else "") \
                + f"train {r['train_acc']:.2f} / test {r['test_acc']:.2f}"
            fig, _ = token_projection(one, title=title)
            paths.append(_save(fig, out / f"token_projection_run{int(r['run_id'])}.png"))
    if (results_dir / "dynamics.parquet").exists():
        dyn = A.load_dynamics(results_dir)
        cell_keys = [a for a in axes]
        cells = dyn[cell_keys].drop_duplicates().head(max_runs) if cell_keys else None
        wheres = [dict(zip(cell_keys, row)) for row in cells.itertuples(index=False)] \
            if cells is not None else [None]
        for i, w in enumerate(wheres):
            tag = "_".join(f"{k}{v:g}" if isinstance(v, (int, float, np.number)) else f"{k}{v}"
                           for k, v in (w or {}).items()) or f"cell{i}"
            sub = A.select(dyn, w)
            if "attn_clean_t0" in sub.columns:
                fig, _ = attention_dynamics(sub)
                paths.append(_save(fig, out / f"attention_{tag}.png"))
                fig, _ = gap_dynamics(sub)
                paths.append(_save(fig, out / f"gaps_{tag}.png"))
            if "ss_clean_pos" in sub.columns:
                fig, _ = ss_dynamics(sub)
                paths.append(_save(fig, out / f"ss_{tag}.png"))
        hue = axes[:2] if axes else None
        sel = dyn.merge(cells, on=cell_keys, how="inner") if cell_keys else dyn
        fig, _ = accuracy_dynamics(sel, hue=hue)
        paths.append(_save(fig, out / "accuracy_dynamics.png"))
    return paths


# --------------------------------------------------------------------------------------------
# Reference figures
# --------------------------------------------------------------------------------------------

REFERENCE_DIR = Path("results/reference")
REFERENCE_RUNS = Path("results/reference-runs")


def reference_specs(size: str = "paper", seeds: int = 2):
    """The sweeps behind ``results/reference/*.png``: the S3 (d, ‖μ‖) map and the S2 dynamics.

    ``paper`` (default): S3 on the paper's 39 × 39 grid (``sweeps/sakamoto_heatmap.toml`` when
    present) with ``seeds`` seeds per cell (the paper had 1); ``small``: S3 on an 8 × 9 log grid.
    S2: the three SPEC settings, 1000 steps, dynamics every 10 steps and at 30 log-spaced steps,
    4 seeds.
    """
    from .config import load_sweep, spec_from_dict

    heat = Path("sweeps/sakamoto_heatmap.toml")
    if size == "paper" and heat.exists():
        s3 = load_sweep(heat, seeds=seeds)
    elif size == "paper":
        s3 = spec_from_dict(
            {"n": 20, "T": 8, "rho": 0.1, "noise_ratio": 0.2, "lr": 5e-3, "steps": 1000,
             "n_test": 1000},
            {"d": {"start": 250, "stop": 5000, "step": 125},
             "signal_norm": {"start": 5, "stop": 100, "step": 2.5}}, seeds=seeds,
            name="ref_s3_paper")
    else:
        s3 = spec_from_dict(
            {"n": 20, "T": 8, "rho": 0.1, "noise_ratio": 0.2, "lr": 5e-3, "steps": 1000,
             "n_test": 1000},
            {"d": [250, 400, 630, 1000, 1600, 2500, 4000, 6300],
             "signal_norm": [2.5, 4, 6.3, 10, 16, 25, 40, 63, 100]}, seeds=seeds, name="ref_s3")
    pts = TH.S2_POINTS
    s2 = []
    for name, p in pts.items():
        s2.append(spec_from_dict(
            {"n": 20, "T": 8, "rho": 0.1, "noise_ratio": 0.2, "lr": 5e-3, "steps": 1000,
             "n_test": 1000, "d": p["d"], "signal_norm": p["signal_norm"], "record_every": 10,
             "record_log": 30},
            {}, seeds=4, name=f"ref_s2_{name}"))
    return s3, s2


def make_reference(size: str = "paper", out_dir: Path = REFERENCE_DIR,
                   runs_dir: Path = REFERENCE_RUNS, quiet: bool = False,
                   seeds: int = 2) -> list[Path]:
    """Run the reference sweeps (resuming finished ones) and draw the reference PNGs."""
    from .sweep import run_sweep

    s3, s2 = reference_specs(size, seeds)
    out_dir, runs_dir = Path(out_dir), Path(runs_dir)
    # the reference directories belong to this command: a changed spec replaces their runs
    df3 = run_sweep(s3, runs_dir / s3.name, quiet=quiet, plots=False, overwrite=True)
    paths = []
    fig, ax = regime_map(df3, theory=default_theory(df3, "signal_norm", "d"))
    ax.set_title(f"S3 prompt attention, n = 20, r = 0.2, 1000 GD steps\n"
                 f"regime ({_seed_text(A.aggregate(df3))})", fontsize=10)
    paths.append(_save(fig, out_dir / "s3_regime_map.png", dpi=90))
    fig, ax = value_map(df3, "test_loss", theory=default_theory(df3, "signal_norm", "d"))
    paths.append(_save(fig, out_dir / "s3_test_loss.png", dpi=90))
    dirs = []
    for s in s2:
        run_sweep(s, runs_dir / s.name, quiet=quiet, plots=False, overwrite=True)
        dirs.append(runs_dir / s.name)
    dyn = A.load_dynamics(dirs)
    res = A.load(dirs)
    fig, axes = plt.subplots(3, 2, figsize=(9.5, 9.0), sharex=True, sharey=True,
                             layout="constrained")
    for row, (name, p) in zip(axes, TH.S2_POINTS.items()):
        w = {"d": p["d"], "signal_norm": p["signal_norm"], "seed": 0}
        r = A.aggregate(A.select(res, {"d": p["d"], "signal_norm": p["signal_norm"]}), by=[])
        tr, te, k = r["train_acc_mean"].iloc[0], r["test_acc_mean"].iloc[0], r["n_seeds"].iloc[0]
        label = name.replace("_", " ")
        attention_dynamics(dyn, where=w, axes=row)
        row[0].set_ylabel(f"{label}: d={p['d']}, ‖μ‖={p['signal_norm']:g}\nfinal train {tr:.2f} "
                          f"/ test {te:.3f} ({k} seeds)\nsoftmax probability", fontsize=9)
    for ax in axes[:-1].ravel():
        ax.set_xlabel("")
    fig.suptitle("S2: softmax probability per token (seed 0), n = 20, r = 0.2, lr 5e-3",
                 fontsize=11)
    paths.append(_save(fig, out_dir / "s2_attention_dynamics.png", dpi=80))
    fig, _ = accuracy_dynamics(dyn, hue=["d", "signal_norm"])
    paths.append(_save(fig, out_dir / "s2_accuracy_dynamics.png", dpi=90))
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m phasebo.plot",
                                description="Draw the standard figures of a finished sweep, or "
                                            "rebuild the reference figures.")
    p.add_argument("results_dir", nargs="?", help="a sweep's output directory")
    p.add_argument("--out", help="where to write PNGs (default: RESULTS_DIR/figures, or "
                                 "results/reference with --reference)")
    p.add_argument("--reference", action="store_true",
                   help="run the reference sweeps and rebuild results/reference/*.png")
    p.add_argument("--size", choices=("small", "paper"), default="paper",
                   help="reference S3 grid: paper (39 x 39, default) or small (8 x 9)")
    p.add_argument("--seeds", type=int, default=2,
                   help="seeds per cell of the reference S3 map (default 2)")
    p.add_argument("--max-cells", type=int, default=3,
                   help="draw the dynamics figures of at most this many cells (default 3)")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.reference:
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            import jax  # one CPU device per core, as the sweep CLI does

            jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)
        paths = make_reference(args.size, Path(args.out or REFERENCE_DIR), quiet=args.quiet,
                               seeds=args.seeds)
    elif args.results_dir:
        if not Path(args.results_dir).exists():
            print(f"phasebo.plot: error: {args.results_dir} does not exist", file=sys.stderr)
            return 2
        paths = standard_figures(args.results_dir, args.out, max_runs=args.max_cells)
    else:
        build_parser().print_usage(sys.stderr)
        print("phasebo.plot: error: give RESULTS_DIR or --reference", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
