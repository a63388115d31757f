"""Figures of a run's path: attention dynamics, s(1-s), accuracies and gaps over steps, token
projections and 𝔖 ratios. Re-exported by :mod:`phasebo.plot`, whose style helpers they share."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from . import analysis as A
from . import theory as TH
from .plot_grid import settings_text
from .plot_style import (
    ROLE_COLORS,
    ROLE_LABELS,
    _label,
    _new,
    _num,
    _plain_log,
    _short,
    line_colors,
    plt,
)


def _tokens(dyn: pd.DataFrame, prefix: str) -> list[str]:
    cols = [c for c in dyn.columns if c.startswith(prefix) and c[len(prefix):].isdigit()]
    return sorted(cols, key=lambda c: int(c[len(prefix):]))


def _roles(dyn: pd.DataFrame, T: int) -> list[str]:
    """Each token's role: Sakamoto & Sato's layout from the run's ``n_relevant`` / ``n_weak`` /
    ``n_weak_opp``; Magen et al.'s data (a ``noise_mode`` setting) one signal token, then noise;
    any other model's tokens (the digits ViT's patches) no role."""
    def has(c):
        return c in dyn.columns and not pd.isna(dyn[c].iloc[0])

    if not has("n_relevant"):
        return ["signal"] + ["noise"] * (T - 1) if has("noise_mode") else ["token"] * T
    nr, nw, nwo = (int(dyn[c].iloc[0]) for c in ("n_relevant", "n_weak", "n_weak_opp"))
    return (["rel"] * nr + ["weak"] * nw + ["weak_opp"] * nwo + ["irr"] * (T - nr - nw - nwo))[:T]


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
    if samples is None:  # a sample the run does not have (no flipped one without label noise)
        names = [g for g in names if d[f"attn_{g}_t0"].notna().any()] or names
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
            faint = r in ("irr", "noise", "token")
            ax.plot(step, d[c], color=ROLE_COLORS[r], lw=1.0 if faint else 2.0,
                    alpha=0.7 if faint else 1.0, label=f"token {k}")
        name = {"clean": "clean sample", "noisy": "flipped sample"}.get(grp, f"sample {grp[1:]}")
        ax.set_title(f"{name}" + (f" — {title}" if title else ""), fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        _xstep(ax, logx)
    axes[0].set_ylabel("softmax probability")
    roles = _roles(d, len(_tokens(d, f"attn_{names[0]}_t")))
    handles = [Line2D([], [], color=ROLE_COLORS[r], lw=2, label=ROLE_LABELS[r])
               for r in dict.fromkeys(roles)]
    axes[-1].legend(handles=handles, fontsize=8, loc="center right")
    if own:  # which run this is: its settings and seed, its own regime, and of how many
        sel = A.select(dyn, where)
        for c in A.cell_axes(sel):  # the run's own cell: its settings, any seed
            sel = sel[sel[c].eq(d[c].iloc[0]) | (sel[c].isna() & pd.isna(d[c].iloc[0]))]
        keys = [k for k in ("source", "run_id") if k in sel.columns]
        n_runs = len(sel[keys].drop_duplicates()) if run is None else 1
        own_reg = (f"; this run {str(d['regime'].iloc[-1]).replace('_', ' ')} at step "
                   f"{int(d['step'].iloc[-1])}") if "regime" in d.columns else ""
        text = (f"attention per token ({_run_title(d)}{own_reg})"
                + (f" — 1 of the cell's {n_runs} runs" if n_runs > 1 else ""))
        # wrapped to the figure's width (one panel: ~5 inches, ~75 characters at 10 pt)
        fig.suptitle(textwrap.fill(text, int(14 * fig.get_figwidth())), fontsize=10)
    return fig, np.asarray(axes)


def _band(ax, d: pd.DataFrame, col: str, color, label, hue_keys=("source", "run_id")):
    """Mean over runs per step and the min–max band."""
    g = d.groupby("step")[col]
    m, lo, hi = g.mean(), g.min(), g.max()
    x = m.index.to_numpy()
    # dots at the recorded steps (a segment between two is not data)
    ax.plot(x, m.to_numpy(), color=color, lw=1.8, label=label,
            marker="o" if len(x) <= 60 else None, ms=2.5)
    if d["run_id"].nunique() > 1 or ("source" in d.columns and d["source"].nunique() > 1):
        ax.fill_between(x, lo.to_numpy(), hi.to_numpy(), color=color, alpha=0.2, lw=0)


def _no_pooling(d: pd.DataFrame, hue: Sequence[str] | None, what: str) -> None:
    """Refuse lines that would average runs of different settings: every axis that varies in
    ``d`` must be a ``hue`` (or tied to one); seeds are what a line averages."""
    pooled = A.untied(d, A.other_axes(d, *(hue or ())))
    if pooled:
        verb = "varies" if len(pooled) == 1 else "vary"
        fix = f"where = {{{pooled[0]!r}: ...}}" + (f" or hue = [{pooled[0]!r}]" if hue is not None
                                                   else "")
        raise ValueError(f"{what}: {', '.join(pooled)} {verb} in the selected runs: a line would "
                         f"average them; fix: {fix}")


def _n_runs(d: pd.DataFrame) -> int:
    keys = [k for k in ("source", "run_id") if k in d.columns]
    return len(d[keys].drop_duplicates())


def ss_dynamics(dyn: pd.DataFrame, where: Mapping | None = None, ax=None, logx: bool = False,
                title: str | None = None):
    """Group means of ``𝔖 = s_R(1 − s_R)`` for clean vs flipped samples vs step (Sakamoto & Sato, Fig. 2).

    Per run the clean value is the mean over both classes of ``ss_clean_pos/neg``; lines are the
    mean over the selected runs, bands their min–max.
    """
    d = A.select(dyn, where).copy()
    _no_pooling(d, None, "ss_dynamics")
    d["ss_clean"] = d[["ss_clean_pos", "ss_clean_neg"]].mean(axis=1)
    d["ss_noisy"] = d[["ss_noisy_pos", "ss_noisy_neg"]].mean(axis=1)
    fig, ax = _new(ax, (6.0, 4.0))
    _band(ax, d, "ss_clean", "#2a9d8f", "clean samples")
    _band(ax, d, "ss_noisy", "#e63946", "flipped samples")
    ax.lines[-1].set_linestyle("--")  # a flipped line on the clean one leaves both visible
    ax.set_ylabel("s(1 − s),  s = mass on relevant tokens")
    _xstep(ax, logx)
    ax.legend(fontsize=8)
    cell = settings_text(d)  # the cell the runs share (where's slice too)
    ax.set_title((f"{title}\n" if title else "")
                 + f"diminishing updates (mean over {_n_runs(d)} runs, band min–max)"
                 + (f"\n{cell}" if cell and not title else ""), fontsize=10)
    return fig, ax


def _hue_groups(d: pd.DataFrame, hue: Sequence[str] | None):
    if not hue:
        return [("", d)]
    out = []
    for key, sub in d.groupby(list(hue), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        out.append((", ".join(f"{_short(h)}={_num(k)}" for h, k in zip(hue, key)), sub))
    return out




def accuracy_dynamics(dyn: pd.DataFrame, where: Mapping | None = None, hue: Sequence[str] |
                      None = None, axes=None, logx: bool = True):
    """Train/test accuracy (left) and train/test loss (right) vs step on a log-step axis, mean over
    seeds with a min–max band; one colour per ``hue`` cell (e.g. ``hue=["signal_norm"]``).
    Delayed generalisation shows as a test loss that keeps falling long after train accuracy is 1.
    """
    d = A.select(dyn, where)
    _no_pooling(d, list(hue or ()), "accuracy_dynamics")
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8), layout="constrained")
    fig = axes[0].figure
    groups = _hue_groups(d, hue)
    colors = line_colors(len(groups))
    for i, (lab, sub) in enumerate(groups):
        c = colors[i]
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
    fixed = settings_text(d, skip=tuple(hue or ()))  # what the lines share (where's slice too)
    if fixed and axes[0].figure is fig and fig.get_suptitle() == "":
        fig.suptitle(fixed, fontsize=10)
    return fig, np.asarray(axes)


def gap_dynamics(dyn: pd.DataFrame, where: Mapping | None = None, axes=None, n_relevant=None):
    """Attention gaps Λ (clean sample) and Γ (flipped sample) and ``g(gap)`` vs step (Sakamoto & Sato).

    Theory: ``g(gap)`` grows about linearly in the step, so the gaps grow logarithmically.
    Mean over the selected runs, band min–max.
    """
    d = A.select(dyn, where)
    _no_pooling(d, None, "gap_dynamics")
    nr = n_relevant or (int(d["n_relevant"].iloc[0]) if "n_relevant" in d.columns
                        and not pd.isna(d["n_relevant"].iloc[0]) else 1)  # 1: Magen's signal token
    gaps = TH.attention_gaps(d, n_relevant=nr)
    T = len(_tokens(d, "logit_clean_t"))
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8), layout="constrained")
    fig = axes[0].figure
    flipped = gaps["gamma_min"].notna().any()  # no flipped sample without label noise
    _band(axes[0], gaps, "lambda_min", "#2a9d8f", "Λ (clean: relevant − others)")
    if flipped:
        _band(axes[0], gaps, "gamma_min", "#e63946", "Γ (flipped: winner − others)")
    axes[0].axhline(np.log(T), color="k", lw=0.8, ls=":", label="log T")
    _band(axes[1], gaps, "g_lambda", "#2a9d8f", "g(Λ)")
    if flipped:
        _band(axes[1], gaps, "g_gamma", "#e63946", "g(Γ)")
    axes[0].set_ylabel("attention gap (logits)")
    axes[1].set_ylabel("g(gap) = 2x + 2 sinh(x − log T)")
    for ax in axes:
        _xstep(ax, False)
        ax.legend(fontsize=8)
    axes[0].set_title(f"gaps (mean of {_n_runs(gaps)} runs)", fontsize=10)
    axes[1].set_title("theory: g(gap) ≈ linear in step", fontsize=10)
    cell = settings_text(d)  # the cell the runs share
    if cell and fig.get_suptitle() == "":
        fig.suptitle(cell, fontsize=10)
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
    ``ratio``: a column of :func:`~phasebo.theory.s_ratios` (``"s_ratio_obs_min"``: grouped by
    observed label, as the official code).
    """
    runs = A.select(df, where)
    runs = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    runs = pd.concat([runs, TH.s_ratios(runs)], axis=1)
    if hue is None:
        hue = [a for a in A.cell_axes(runs) if a not in (x, "source", "sweep")]
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8), layout="constrained")
    fig = axes[0].figure
    groups = list(_hue_groups(runs, hue))
    colors = line_colors(len(groups))
    for i, (lab, sub) in enumerate(groups):
        c = colors[i]
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
                        "s_class_balance": r"$\Sigma\mathfrak{S}$ clean+ / clean−",
                        "s_ratio_obs_min": r"min over observed labels of $\Sigma\mathfrak{S}$ "
                                           "clean / flipped",
                        "s_ratio_obs_pos": r"$\Sigma\mathfrak{S}$ clean / flipped (labelled +)",
                        "s_ratio_obs_neg": r"$\Sigma\mathfrak{S}$ clean / flipped (labelled −)",
                        }.get(ratio, ratio))
    axes[1].set_ylabel("test accuracy")
    axes[1].set_ylim(0.4, 1.02)
    for ax in axes:
        ax.set_xlabel(_label(x))
    if any(axes[1].get_legend_handles_labels()[1]):  # one legend, beside the panels: inside
        # either it hid the curves
        axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                       ncol=1 if len(groups) <= 14 else 2, frameon=False)
    axes[0].set_title(r"$\mathfrak{S}$ ratio (mean over seeds, band min–max)", fontsize=10)
    axes[1].set_title("test accuracy", fontsize=10)
    fixed = settings_text(runs, skip=(x, *hue))
    if fixed and len(axes) == 2 and axes[0].figure is fig:
        fig.suptitle(fixed, fontsize=10)
    return fig, np.asarray(axes)
