"""The grid under every map: axis scales and cell edges, ticks, the cells of a slice (refused
when another axis varies, or when the cells do not tile a map), the words of titles and file
names (seeds, fixed settings, slices), and the theory curves and boundaries drawn across a map."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from . import analysis as A
from . import theory as TH
from .boundaries import bounded
from .plot_style import LOG_AXES, Theory, _label, _num, _plain_log, _short


def _auto_log(col: str, vals: np.ndarray) -> bool:
    """Linear for an evenly spaced grid, log for a geometric one (>= 3 values) or an uneven one
    spanning at least a factor 10 whose steps are more even on a log scale; otherwise log for a
    positive axis of :data:`LOG_AXES` spanning at least a factor 10."""
    vals = np.unique(np.asarray(vals, float))
    if len(vals) < 2 or (vals <= 0).any():
        return False
    if len(vals) >= 3:
        step, r = np.diff(vals), vals[1:] / vals[:-1]
        if np.allclose(step, step[0], rtol=0.02):
            return False
        if np.allclose(r, r[0], rtol=0.05) and r[0] > 1.1:  # geometric (log = true)
            return True
        lr = np.diff(np.log(vals))  # an uneven grid spanning a factor 10 or more: the scale on
        if vals.max() / vals.min() >= 10 and lr.max() / lr.min() < step.max() / step.min():
            return True  # which its steps are more even (0.001, 0.06, 1: log)
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
    text = settings_text(df, skip=(x, y))
    if A.is_aggregate(df):
        df = df.copy()
        df.attrs["settings"] = text
        return df
    others = A.other_axes(df, x, y)
    if others:
        raise ValueError(slice_hint(df, others[0], x, y))
    cells = A.aggregate(df, by=[c for c in (x, y) if c is not None])
    if x is not None and y is not None and not is_grid(cells, x, y, "round" in df.columns):
        raise ValueError(f"only {len(cells)} of the {cells[x].nunique()} x {cells[y].nunique()} "
                         f"({x}, {y}) cells were run (not {missing_cells(cells, x, y)}): a "
                         "map would show cells that never ran; fix: run the missing cells (grow "
                         "the sweep), pick a fully run part with where=, or, for a [[cases]] "
                         "sweep, draw the cases (phasebo.plot.cases_figure)")
    cells.attrs["settings"] = text
    return cells


def _with_settings(title: str, cells: pd.DataFrame) -> str:
    text = cells.attrs.get("settings", "")
    return f"{title}\n{text}" if text else title


def failed_text(n: int) -> str:
    """``3 failed runs left out`` (the runs a figure's statistics do not cover)."""
    return f"{n} failed run{'s' if n != 1 else ''} left out"


def _seed_text(cells: pd.DataFrame) -> str:
    f = int(cells["n_failed"].sum()) if "n_failed" in cells.columns else 0
    if cells.attrs.get("pooled_over"):  # a cell of aggregate(over=...): the ok runs it pools
        k = cells["n_ok"].to_numpy()
        return _seeds(int(k.min()), int(k.max())).replace("seed", "run") + " per cell (pooled)" \
            + (f", {failed_text(f)}" if f else "")
    k = cells["n_seeds"].to_numpy()
    s = _seeds(int(k.min()), int(k.max())) + " per cell"
    return s + (f", {failed_text(f)}" if f else "")


def _seeds(k_min: int, k_max: int) -> str:
    """``1 seed``, ``3 seeds``, ``3–5 seeds``."""
    return (f"{k_min}" if k_min == k_max else f"{k_min}–{k_max}") + (" seed" if k_max == 1
                                                                      else " seeds")


TITLE_SETTINGS = ("model", "train", "n", "T", "noise_ratio", "optimizer", "lr", "lr_schedule",
                  "batch_size", "steps", "epochs", "dynamics", "flow_time", "weight_decay", "d",
                  "signal_norm")


# Settings a title names only where one value, not the default, holds across the table: the
# regime rule's thresholds and the flow's and the limit's solver controls (a run's identity, and
# a cap or tolerance can decide whether a run is solved).
OVERRIDES = ("test_eps", "train_acc_fit", "flow_solver", "flow_rtol", "flow_atol", "flow_max_steps",
             "flow_converge_tol", "limit_tol", "limit_max_iters")

TITLE_WIDTH = 72  # characters of a title line at the figures' 10 pt on a 6.4-inch-wide figure


def settings_text(df: pd.DataFrame, skip: Sequence[str] = ()) -> str:
    """The settings that one value holds across ``df`` (model, trained parameters, n, T, r, lr,
    steps, and d or ‖μ‖ when fixed), for a title: ``prompt_attention (p), n 20, T 8, r 0.2,
    lr 0.005, 1000 steps``; a dynamics table says its recorded step: ``step 78 of 1000``."""
    def one(c):
        if c not in df.columns or c in skip or df[c].nunique(dropna=False) != 1:
            return None
        v = df[c].iloc[0]
        return v.item() if hasattr(v, "item") else v

    from .registry import all_settings

    default = {c: all_settings()[c].default for c in ("optimizer", "lr_schedule", "test_reference",
                                                       *OVERRIDES)}
    parts = []
    model, train = one("model"), one("train")
    if model is not None:
        parts.append(f"{model}" + (f" ({train})" if isinstance(train, str) and train else ""))
    for c in TITLE_SETTINGS[2:]:
        v = one(c)
        if c == "dynamics" and v == "flow":
            parts.append("gradient flow")
        if c == "dynamics" and v == "limit":
            w, lr = one("limit_warmup"), one("lr")
            parts.append("converged limit" + (f" (after {w} GD steps of {_num(lr)})"
                                               if w and lr is not None else ""))
        if c in ("lr", "steps") and one("dynamics") == "limit":
            continue  # a limit has no step size and no steps
        if c == "steps" and v is None and c in df.columns and c not in skip \
                and df[c].notna().any():  # the horizon varies with the lines: its range
            limit = df["dynamics"].eq("limit") if "dynamics" in df.columns else df[c].isna()
            stepped = df.loc[~limit, c]  # the limit's rows have no steps: not a horizon of 0
            if stepped.notna().any():
                lo, hi = _num(stepped.min()), _num(stepped.max())
                parts.append((f"{lo} steps" if lo == hi else f"{lo}–{hi} steps")
                             + (" (the limit: none)" if limit.any() else ""))
            continue
        if c == "optimizer" and isinstance(v, str) and v != default[c]:
            parts.append(v)  # plain GD (sgd), the papers' rule: nothing to say
            continue
        if c == "lr_schedule" and isinstance(v, str) and v != default[c]:
            parts.append(f"{v} schedule")
            continue
        if c in ("batch_size", "epochs") and v is not None and not v:
            continue  # 0: full batch, a step count
        if v is None or isinstance(v, str) or (isinstance(v, float) and not np.isfinite(v)):
            continue
        if c == "weight_decay":  # plain GD (0): nothing to say
            parts += [f"weight decay {_num(v)}"] if v else []
            continue
        if c == "steps" and "step" in df.columns:  # a dynamics table: the map is at its step
            at, tau, end = one("step"), one("time"), one("flow_time")
            if one("dynamics") == "flow" and at is not None and tau is not None and end:
                parts.append(f"step {_num(at)} (τ {_num(tau)}) of {_num(v)} (τ {_num(end)})")
                skip = (*skip, "flow_time")  # said here: the step's own time and the horizon
                continue
            parts.append(f"step {_num(at)} of {_num(v)}" if at is not None else
                         f"recorded steps {_num(df['step'].min())}–{_num(df['step'].max())} "
                         f"of {_num(v)}")
            continue
        parts.append(f"{_num(v)} steps" if c == "steps" else f"{_num(v)} epochs" if c == "epochs"
                     else f"batch {_num(v)}" if c == "batch_size"
                     else f"τ {_num(v)}" if c == "flow_time" else f"{_short(c)} {_num(v)}")
    for c, k in df.attrs.get("pooled_over", {}).items():  # cells of pb.aggregate(over=...)
        parts.append(f"pooled over {_short(c)} ({k} values)")
    ref = one("test_reference")  # the regime rule, where not the default
    if isinstance(ref, str) and ref != default["test_reference"]:
        parts.append(f"benign against the {ref} runs' test acc")
    for c in OVERRIDES:
        v = one(c)
        if isinstance(v, str) and v != default[c]:
            parts.append(f"{c} {v}")
        elif isinstance(v, (int, float)) and np.isfinite(v) and v != default[c]:
            parts.append(f"{c} {_num(v)}")
    lines = [""]
    for part in parts:  # lines of at most TITLE_WIDTH characters: a long title is not cut off
        if lines[-1] and len(lines[-1]) + 2 + len(part) > TITLE_WIDTH:
            lines[-1] += ","
            lines.append(part)
        else:
            lines[-1] += (", " if lines[-1] else "") + part
    return "\n".join(lines)


def panels_title(fig, axs, text: str) -> None:
    """``text`` as the title of a grid of panels, the panels moved down as far as its lines and
    the tallest panel title need (a three-line title met two-line panel titles)."""
    fig.suptitle(text, fontsize=10)
    panel = max((ax.get_title().count("\n") + 1 for ax in np.ravel(axs) if ax.get_visible()),
                default=1)
    need = 0.25 + 0.17 * (text.count("\n") + 1 + panel)  # inches, 10 pt lines
    fig.subplots_adjust(top=min(fig.subplotpars.top, 1 - need / fig.get_figheight()))


def _telling(cells: pd.DataFrame, cases: Sequence[str], most: int = 4) -> list[str]:
    """The few columns that tell the cases apart, in the order of a title (model, d, ‖μ‖, n, r,
    ...): two, or more until every case has its own label, at most ``most``."""
    order = sorted(cases, key=lambda a: TITLE_SETTINGS.index(a) if a in TITLE_SETTINGS
                   else len(TITLE_SETTINGS))
    keep: list[str] = []
    for a in order:
        if len(keep) >= most:
            break
        keep.append(a)
        if len(keep) >= min(2, len(order)) and not cells.duplicated(keep).any():
            break
    return keep


def slice_text(where: Mapping | None) -> str:
    """``r = 0.1, n = 20``: a slice in a title."""
    return ", ".join(f"{_short(a)} = {_num(v)}" for a, v in (where or {}).items())


def slice_tag(where: Mapping | None) -> str:
    """``noise_ratio0.1_n20``: a slice in a file name (letters, digits, ``.``, ``-``, ``_``)."""
    import re

    def text(v):  # to 6 digits (0.001 and 0.0010001 are two files), "+" kept (3.6e+07)
        if isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_)):
            v = float(v)
            return _num(v) if not np.isfinite(v) or (abs(v - round(v)) < 1e-9 and abs(v) < 1e7) \
                else f"{v:.6g}"
        return str(v)

    return "_".join(re.sub(r"[^A-Za-z0-9._+\-]+", "-", f"{a}{text(v)}")
                    for a, v in (where or {}).items())


def facet_slices(df: pd.DataFrame, facets: Sequence[str]) -> list[dict]:
    """The combinations of the ``facets`` columns present in ``df``, in sorted order."""
    if not facets:
        return [{}]
    combos = df[list(facets)].drop_duplicates().sort_values(list(facets))
    return [{a: (v.item() if hasattr(v, "item") else v) for a, v in zip(facets, row)}
            for row in combos.itertuples(index=False)]


def is_grid(cells: pd.DataFrame, x: str, y: str, refined: bool | None = None) -> bool:
    """Whether the ``(x, y)`` cells that were run tile a map: every pair of the grid, or, for a
    refined grid (``refined``; default: the table has the refinement's ``round`` column), every
    row with at least two ``x`` values (its rows hold their own values, each cell drawn out to
    its neighbours'). Any other hole (a ``[[cases]]`` sweep) does not: a map would colour cells
    never run."""
    pairs = cells[[x, y]].drop_duplicates()
    full = len(pairs) == cells[x].nunique() * cells[y].nunique()
    if refined is None:
        refined = "round" in cells.columns
    return bool(full or (refined and pairs.groupby(y)[x].nunique().min() >= 2))


def missing_cells(cells: pd.DataFrame, x: str, y: str) -> str:
    """The ``(x, y)`` pairs of the grid that no run has (a few, for a message)."""
    have = set(map(tuple, cells[[x, y]].drop_duplicates().to_numpy().tolist()))
    gone = [(a, b) for b in sorted(cells[y].unique()) for a in sorted(cells[x].unique())
            if (a, b) not in have]
    shown = ", ".join(f"({_num(a)}, {_num(b)})" for a, b in gone[:3])
    return shown + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")


def _label_room(axis, vals) -> float:
    """The share of ``axis``' length one tick label needs (10 pt: ~0.085 inch a character across,
    ~0.2 inch up), so that labels of a small panel do not run into each other."""
    ax = axis.axes
    box = ax.get_position()
    if axis is ax.xaxis:
        inches = box.width * ax.figure.get_figwidth()
        need = 0.085 * max(len(_num(v)) for v in vals) + 0.1
    else:
        inches, need = box.height * ax.figure.get_figheight(), 0.2
    return need / max(inches, 1e-3)


def _grid_ticks(axis, vals, log):
    """Ticks at the grid values when there are few of them (as many as their labels have room
    for), plain numbers otherwise."""
    if len(vals) <= 10:
        vals = every = np.sort(np.asarray(vals, float))
        if len(vals) > 2:  # labels closer than their width collide (80, 100; 0.0158, 0.0281)
            u, keep = (np.log(vals) if log else vals), [0]
            gap = (u[-1] - u[0]) * len(u) / (len(u) - 1) * max(_label_room(axis, vals), 0.1 if log else 0.0)
            for i in range(1, len(u)):
                if u[i] - u[keep[-1]] >= gap:
                    keep.append(i)
            if keep[-1] != len(u) - 1:
                keep[-1] = len(u) - 1
            vals = vals[keep]
        axis.set_major_locator(mticker.FixedLocator(vals))
        axis.set_major_formatter(mticker.FuncFormatter(_num))
        # a value whose label has no room keeps a tick mark (unlabelled): every cell run is marked
        axis.set_minor_locator(mticker.FixedLocator(np.setdiff1d(every, vals)))
        axis.set_minor_formatter(mticker.NullFormatter())
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
    # the legend spells SNR out: n·SNR² = n ‖μ‖² / (σ² d), phasebo's reading of the theory
    return {f"n‖μ‖²/(σ²d) = {k:g}": (lambda x, k=k: TH.iso_snr_d(x, k, n, sigma_eps))
            for k in kappas}


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


def boundary_overlay(ax, b: pd.DataFrame, x: str, y: str, fit: dict | None = None,
                     theory: dict | None = None, color: str = "black", band: bool = True):
    """Draw boundaries (:func:`phasebo.boundaries`) on a map with ``x`` across and ``y`` up: each
    slice's boundary with its interval as a horizontal bar, the fitted power law
    ``x* = prefactor · y^exponent`` (solid) with the band its exponent interval spans around the
    fit's centre, and the theory's exponent with its prefactor fitted (dashed). A boundary the
    grid places only in a gap is a square; one whose interval the seeds cannot bound, hollow."""
    ok = b[np.isfinite(b["boundary"].to_numpy(float))]
    if ok.empty:
        return ax
    yv, bx, between = ok[y].to_numpy(float), ok["boundary"].to_numpy(float), ok["between"].iloc[0]
    lo_, hi_ = ok["lo"].to_numpy(float), ok["hi"].to_numpy(float)
    st = ok["status"].astype(str).to_numpy() if "status" in ok.columns else np.full(len(ok), "")
    # an unbounded interval has no bar: drawn hollow and named, not as a bar too small to see
    has = bounded(lo_, hi_, log=ax.get_xscale() == "log") & (st != "unbounded")
    # a boundary the grid places only inside a gap (unresolved, separated) is drawn apart from
    # one the fit places: a square at the middle of its interval, which holds the gap
    gap = has & np.isin(st, ("unresolved", "separated"))
    for sel, fmt, ms, what in ((has & ~gap, "o", 3, "95% CI"),
                               (gap, "s", 4.5, "in a grid gap: unresolved or separated")):
        if sel.any():
            err = np.vstack([bx - lo_, hi_ - bx])[:, sel]
            ax.errorbar(bx[sel], yv[sel], xerr=err, fmt=fmt, ms=ms, color=color, ecolor=color,
                        elinewidth=1, capsize=2, label=f"boundary {between} ({what})", zorder=5)
    # a gap open on one side (separated where too few seeds hold both regimes): a hollow square
    open_gap = ~has & np.isin(st, ("unresolved", "separated"))
    for sel, fmt, what in ((~has & ~open_gap, "o", "interval unbounded (too few seeds, or past "
                            "the grid)"), (open_gap, "s", "in a grid gap open on one side")):
        if sel.any():
            ax.plot(bx[sel], yv[sel], fmt, ms=4.5, mfc="none", color=color, zorder=5,
                    label=f"boundary {between}, {what}")
    ys = np.geomspace(yv.min(), yv.max(), 100) if (yv > 0).all() else np.linspace(yv.min(),
                                                                                   yv.max(), 100)
    if fit is not None:
        ax.plot(fit["prefactor"] * ys ** fit["exponent"], ys, color=color, lw=1.2,
                label=f"fit: exponent {fit['exponent']:.2f} [{fit['lo']:.2f}, {fit['hi']:.2f}]"
                if band else f"fit (not trustworthy): exponent {fit['exponent']:.2f}")
    if fit is not None and band:  # no band for a scattered fit: its interval means nothing
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
