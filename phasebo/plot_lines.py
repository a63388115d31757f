"""Figures of one swept axis: a metric's mean over seeds (:func:`line_plot`) and the share of
seeds in each regime (:func:`regime_shares`) against it. Re-exported by :mod:`phasebo.plot`."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from . import analysis as A
from .plot_grid import TITLE_SETTINGS, TITLE_WIDTH, _auto_log, _seeds, failed_text, settings_text
from .plot_style import REGIME_COLORS, _label, _new, _num, _plain_log, _short, line_colors
from .results import REGIMES


def line_plot(df: pd.DataFrame, x: str, value: str = "test_acc", hue: Sequence[str] | None = None,
              ax=None, where: Mapping | None = None, logx: bool | None = None,
              title: str | None = None):
    """``value`` against ``x``: the mean over seeds with a ±1 SE band, one line per ``hue`` cell
    (default: the other axes that vary). For 1-D sweeps and slices of maps; ``value =
    "regime"`` draws :func:`regime_shares` (no ``hue``)."""
    if value == "regime":
        if hue:
            raise ValueError(f"value = 'regime' against {x} draws one line per regime: no hue "
                             f"({', '.join(hue)}); fix: fix them with where")
        return regime_shares(df, x, ax=ax, where=where, logx=logx, title=title)
    runs = A.select(df, where)
    cells = runs if A.is_aggregate(runs) else None
    if cells is not None and f"{value}_mean" not in cells.columns:  # test_acc_mean: test_acc
        if value.endswith("_mean") and value in cells.columns:
            value = value.removesuffix("_mean")
        else:
            have = [c.removesuffix("_mean") for c in cells.columns if c.endswith("_mean")]
            raise ValueError(f"line_plot: no column {value}_mean in the cells; fix: value = a "
                             f"metric they hold, e.g. {', '.join(have[:8]) or '(none)'}")
    if hue is None:
        hue = A.untied(runs, A.other_axes(runs, x)) if cells is None else []
    if pooled := A.untied(runs, A.other_axes(runs, x, *hue)):  # runs or cells alike
        raise ValueError(f"line_plot: {', '.join(pooled)} also "
                         f"{'varies' if len(pooled) == 1 else 'vary'}: each point would average "
                         f"them; fix: hue = [{pooled[0]!r}], where = {{{pooled[0]!r}: ...}}, or "
                         f"pool them on purpose: pb.aggregate(runs, over=[{pooled[0]!r}])")
    # settings that follow a hue setting are named on its lines too: a model's depth, and a
    # title's setting where more than one line has it (T of two models; not the settings that
    # one model of two has and the other lacks)
    tied = [] if A.is_aggregate(runs) else [
        c for c in A.other_axes(runs, x) if c not in hue and c in (*TITLE_SETTINGS, "n_layers")]
    if cells is None:
        cells = A.aggregate(runs, by=[x, *hue, *tied], metrics=[value])  # tied: no new cells
    fig, ax = _new(ax, (6.0, 4.0))
    # dropna=False: a setting only some models of the sweep have is NaN for the others, and
    # their lines are lines too
    groups = list(cells.groupby(list(hue), sort=True, dropna=False)) if hue else [((), cells)]
    tied = [c for c in tied if c == "n_layers" or sum(g[c].notna().any() for _, g in groups) > 1]
    colors = line_colors(len(groups))
    for i, (key, sub) in enumerate(groups):
        sub = sub.sort_values(x)
        xv = sub[x].to_numpy(float)
        m = sub[f"{value}_mean"].to_numpy(float)
        se = np.nan_to_num(sub[f"{value}_se"].to_numpy(float))
        key = key if isinstance(key, tuple) else (key,)
        named = [*zip(hue, key), *((c, sub[c].iloc[0]) for c in tied
                                   if c in sub.columns and sub[c].nunique(dropna=False) == 1)]
        lab = ", ".join(f"{_short(h)}={_num(k)}" for h, k in named
                        if not pd.isna(k)) or None  # a setting this line's model lacks: unnamed
        c = colors[i]
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
    k = cells["n_seeds"] if A.is_aggregate(runs) else A.finite_counts(runs, [x, *hue], value)
    text = settings_text(runs, skip=(x, *hue))
    failed = 0 if A.is_aggregate(runs) or "status" not in runs.columns else \
        int((runs["status"].astype(str) != "ok").sum())
    empty = "" if A.is_aggregate(runs) else ", ".join(  # cells with no value (no flipped sample)
        sorted({_num(v) for v in k[k == 0].index.get_level_values(0)}, key=float))
    over = _seeds(int(k.min()), int(k.max()))
    if runs.attrs.get("pooled_over"):  # a point is the mean of its pooled ok runs, not seeds
        k = cells["n_ok"]
        over = _seeds(int(k.min()), int(k.max())).replace("seed", "run")
    head = (f"{_label(value)}: mean ± SE over {over}"
            + (f" ({failed_text(failed)})" if failed else "")
            + (f"; no value at {_short(x)} = {empty}" if empty else ""))
    # wrapped as the settings are: a long label would run off both sides of the figure
    ax.set_title(title or textwrap.fill(head, TITLE_WIDTH) + (f"\n{text}" if text else ""),
                 fontsize=10)
    return fig, ax


def regime_shares(df: pd.DataFrame, x: str, ax=None, where: Mapping | None = None,
                  logx: bool | None = None, title: str | None = None):
    """The share of each cell's ok seeds in each regime against ``x``, with its Wilson 95 %
    band: the regime "map" of a sweep with one varying axis. Only regimes that occur are drawn;
    the shares of a cell add up to 1. Every other axis must be fixed (``where``)."""
    runs = A.select(df, where)
    if A.is_aggregate(runs):
        raise ValueError("regime shares need the runs table (pb.load(path)): the aggregate's "
                         "fractions are of its own cells")
    others = A.other_axes(runs, x)  # an axis tied to x one to one (d behind snr) is x itself
    if others:
        verb = "varies" if len(others) == 1 else "vary"
        raise ValueError(f"{', '.join(others)} also {verb}: a line per regime would pool them; "
                         f"fix: fix them with where = {{{others[0]} = ...}}")
    cells = A.aggregate(runs, by=[x], metrics=[]).sort_values(x)
    fig, ax = _new(ax, (6.0, 4.0))
    xv = cells[x].to_numpy(float)
    for r in REGIMES:
        p = cells[f"frac_{r}"].to_numpy(float)
        if not np.nan_to_num(p).any():
            continue
        c = REGIME_COLORS[r]
        ax.plot(xv, p, "o-", color=c, ms=3, lw=1.6, label=r.replace("_", " "))
        ax.fill_between(xv, cells[f"frac_{r}_lo"].to_numpy(float),
                        cells[f"frac_{r}_hi"].to_numpy(float), color=c, alpha=0.2, lw=0)
    logx = _auto_log(x, xv) if logx is None else logx
    if logx:
        ax.set_xscale("log")
        _plain_log(ax.xaxis)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(_label(x))
    ax.set_ylabel("share of ok seeds")
    if any(ax.get_legend_handles_labels()[1]):
        ax.legend(fontsize=7)
    k = cells["n_ok"]
    text = settings_text(runs, skip=(x,))
    failed = int(cells["n_failed"].sum())
    ax.set_title(title or f"regime shares (Wilson 95 % band) over "
                 f"{_seeds(int(k.min()), int(k.max()))}"
                 + (f" ({failed_text(failed)})" if failed else "")
                 + (f"\n{text}" if text else ""), fontsize=10)
    return fig, ax
