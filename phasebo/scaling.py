"""Scaling laws of phase boundaries: power-law fits through the slices of a boundary table
(:func:`phasebo.boundaries.boundaries`), with their verdict, over recorded steps, and as text.

``boundary = prefactor · x^exponent`` is fitted by weighted least squares on log axes, each
boundary weighted by its CI (standard deviation ``log(hi/lo) / 2z``); the exponent's interval is
normal with the residual scatter folded in when it exceeds the CIs (``chi2_dof > 1``). Only
*resolved* slices enter a fit (:func:`resolved`); fewer than :data:`MIN_FIT_POINTS` give no
exponent. The theories' exponents are in :func:`phasebo.theory.theory_exponent`.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd

from .analysis import STEP
from .boundaries import bounded
from .theory import theory_exponent


def fit_power_law(b: pd.DataFrame, x: str, y: str = "boundary", *, level: float = 0.95,
                  exponent: float | None = None) -> dict:
    """Fit ``y = prefactor · x^exponent`` to the rows of ``b`` with a finite ``y`` (by default the
    output of :func:`boundaries`, whose ``lo``/``hi`` weight the points).

    Returns ``exponent``, ``lo``, ``hi`` (its ``level`` interval), ``prefactor``, ``n_points``
    and ``chi2_dof`` (of the weighted residuals; > 1 when the points scatter more than their
    CIs, and the interval is then widened by √chi2_dof). With ``exponent=`` given, only the
    prefactor is fitted (the theory's curve with its constant fitted).
    """
    missing = [c for c in (x, y) if c not in b.columns]
    if missing:
        raise ValueError(f"fit_power_law: no column {missing[0]!r} in the boundary table; its "
                         f"columns: {', '.join(map(str, b.columns))}")
    one_step(b, x, "fit_power_law")
    ok = b[np.isfinite(b[y].to_numpy(float))]
    if "status" in ok.columns:
        ok = ok[ok["status"].astype(str).isin(("ok", "unresolved", "separated"))]
    if {"lo", "hi"} <= set(ok.columns):  # an unbounded interval has no weight to give the fit
        ok = ok[bounded(ok["lo"], ok["hi"], log=True)]
    X = np.log(ok[x].to_numpy(float))
    Y = np.log(ok[y].to_numpy(float))
    z = NormalDist().inv_cdf(0.5 + level / 2)
    if {"lo", "hi"} <= set(ok.columns):
        lo_, hi_ = ok["lo"].to_numpy(float), ok["hi"].to_numpy(float)
        good = (lo_ > 0) & (hi_ > 0)  # an interval reaching 0 has no width on log axes
        sd = np.full(len(ok), np.nan)
        # the points' own interval level (boundaries' ``level``; 95 % when the table lacks it)
        lv = ok["ci_level"].to_numpy(float) if "ci_level" in ok.columns else np.full(len(ok), .95)
        zb = np.array([NormalDist().inv_cdf(0.5 + v / 2) for v in lv])
        sd[good] = (np.log(hi_[good]) - np.log(lo_[good])) / (2 * zb[good])
        sd = np.where(np.isfinite(sd) & (sd > 0), sd, np.nan)
        sd = np.where(np.isnan(sd), np.nanmedian(sd) if np.isfinite(sd).any() else 1.0, sd)
        sd = np.maximum(sd, 1e-6)
    else:
        sd = np.ones(len(X))
    k = len(X)
    need = 1 if exponent is not None else 2
    if k < need:
        raise ValueError(f"fit_power_law needs at least {need} finite boundaries; got {k}")
    w = 1.0 / sd**2
    if exponent is not None:
        c0 = float(np.sum(w * (Y - exponent * X)) / w.sum())
        res = Y - c0 - exponent * X
        dof = max(k - 1, 1)
        return {"exponent": float(exponent), "lo": float(exponent), "hi": float(exponent),
                "prefactor": math.exp(c0), "n_points": k,
                "chi2_dof": float(np.sum(w * res**2) / dof)}
    A = np.column_stack([np.ones(k), X])
    cov = np.linalg.inv(A.T @ (A * w[:, None]))
    beta = cov @ (A.T @ (w * Y))
    res = Y - A @ beta
    chi2_dof = float(np.sum(w * res**2) / (k - 2)) if k > 2 else float("nan")
    scale = max(1.0, chi2_dof) if np.isfinite(chi2_dof) else 1.0
    se = math.sqrt(cov[1, 1] * scale)
    return {"exponent": float(beta[1]), "lo": float(beta[1] - z * se),
            "hi": float(beta[1] + z * se), "prefactor": math.exp(beta[0]), "n_points": k,
            "chi2_dof": chi2_dof}


MIN_FIT_POINTS = 3  # fewer resolved slices than this give no exponent worth stating
SCATTER = 4.0  # chi2/dof above this: one power law does not describe the boundary


def exponents_over_steps(b: pd.DataFrame, y: str) -> pd.DataFrame:
    """The power-law fit of :func:`boundaries` rows at each recorded step (a boundary
    trajectory): ``step``, ``n_slices``, ``n_found`` (the slices a power law may go through,
    :func:`resolved`), ``exponent``, ``lo``, ``hi``, ``chi2_dof`` (NaN where fewer than
    :data:`MIN_FIT_POINTS` slices were found) and ``status``, the fit's verdict
    (:func:`power_law_row`)."""
    x = str(b["x"].iloc[0]) if "x" in b.columns and len(b) else ""
    rows = []
    for step, g in b.groupby(STEP, sort=True):
        fit = power_law_row(g, x, y)
        rows.append({STEP: int(step), "n_slices": len(g), "n_found": fit["n_points"],
                     **{k: fit[k] for k in ("exponent", "lo", "hi", "chi2_dof", "status")}})
    return pd.DataFrame(rows)


FIT_STATUSES = ("ok", "scattered", "grid_limited", "too_few_slices")


def resolved(b: pd.DataFrame, y: str | None = None) -> pd.DataFrame:
    """The slices a power law may go through: a finite boundary of status ok, unresolved or
    separated, with a bounded interval (an unbounded one would weigh as much as the median point)
    and, for ``y``, a positive slice value (log y)."""
    keep = np.isfinite(b["boundary"].to_numpy(float)) & b["status"].astype(str).isin(
        ("ok", "unresolved", "separated"))
    if {"lo", "hi"} <= set(b.columns):  # the fit is on log axes
        keep &= bounded(b["lo"], b["hi"], log=True)
    if y is not None and y in b.columns:
        keep &= b[y].to_numpy(float) > 0
    return b[keep]


def placed(b: pd.DataFrame, y: str) -> str:
    """How the fit's slices place their boundaries: ``3 placed by their fit, 8 only bracketed by
    the grid`` (unresolved or separated: their interval is a grid gap)."""
    st = resolved(b, y)["status"].astype(str)
    ok = int((st == "ok").sum())
    return f"{ok} placed by their fit, {len(st) - ok} only bracketed by the grid"


def power_law_row(b: pd.DataFrame, x: str, y: str) -> dict:
    """The power-law fit of a boundary table as one row, with its verdict: ``status`` is
    ``too_few_slices`` (fewer than :data:`MIN_FIT_POINTS` resolved slices: no exponent is
    stated), ``scattered`` (χ²/dof above :data:`SCATTER`: the slices scatter about the fit more
    than their intervals allow, so one power law does not describe the boundary),
    ``grid_limited`` (no slice is ``ok``: every boundary is only bracketed by the grid, so the
    exponent is that of gap midpoints; refine the grid) or ``ok``;
    ``theory_exponent`` and ``theory_prefactor`` (its constant fitted) where a theory applies."""
    along(b, x)
    one_step(b, y, "power_law_row")  # on the whole table: the step count it says is the table's
    usable = resolved(b, y)
    th = theory_exponent(x, y)
    row = {"between": str(b["between"].iloc[0]) if len(b) and "between" in b.columns else "",
           "x": x, "slice": y,
           "n_slices": len(b), "n_points": len(usable), "exponent": np.nan, "lo": np.nan,
           "hi": np.nan, "prefactor": np.nan, "chi2_dof": np.nan,
           "theory_exponent": th[0] if th else np.nan, "theory_prefactor": np.nan,
           "status": "too_few_slices",
           "n_seeds_min": int(usable["n_seeds"].min()) if len(usable) and "n_seeds" in usable
           else 0, "horizon": horizon_text(b).removeprefix(" at "),
           "fitting": str(b["fitting"].iloc[0]) if len(b) and "fitting" in b.columns else "",
           "n_boot": int(b["n_boot"].iloc[0]) if len(b) and "n_boot" in b.columns else 0}
    if len(usable) < MIN_FIT_POINTS:
        return row
    fit = fit_power_law(usable, y)
    row.update({k: fit[k] for k in ("exponent", "lo", "hi", "prefactor", "chi2_dof")})
    if not np.isfinite(fit["exponent"]):
        row["status"] = "too_few_slices"
        return row
    row["status"] = "scattered" if fit["chi2_dof"] > SCATTER else "ok"
    if (usable["status"].astype(str) != "ok").all():
        # every slice only bracketed by the grid: the fit runs through gap midpoints
        row["status"] = "grid_limited"
    if th:
        row["theory_prefactor"] = fit_power_law(usable, y, exponent=th[0])["prefactor"]
    return row


def one_step(b: pd.DataFrame, x: str, who: str) -> None:
    """Refuse a table with boundaries at several recorded steps for the same ``x`` (the slice
    values): one fit would pool them."""
    if STEP in b.columns and x != STEP and x in b.columns and len(b) \
            and b.groupby(x)[STEP].nunique().max() > 1:
        raise ValueError(f"{who}: the table holds boundaries at {b[STEP].nunique()} recorded "
                         f"steps for the same {x}, which one fit would pool; fix: "
                         f"b[b.{STEP} == S] for one step, or exponents_over_steps(b, {x!r}) for "
                         "each")


def along(b: pd.DataFrame, x: str) -> None:
    """Refuse an ``x`` other than the one ``b``'s boundaries lie along (its ``x`` column): the
    boundaries are values of that axis, which another axis would misread."""
    if "boundary" not in b.columns:
        raise ValueError("not a boundary table (no boundary column); fix: pb.boundaries(runs, x, "
                         "y, between) first, and fit its rows")
    if "x" in b.columns and len(b) and str(b["x"].iloc[0]) != x:
        raise ValueError(f"x = {x!r}, but these boundaries lie along {b['x'].iloc[0]!r}; fix: "
                         f"x = {b['x'].iloc[0]!r} (or fit the boundaries along {x!r} first)")


def horizon_text(b: pd.DataFrame) -> str:
    """Where a boundary table was measured: ``at step 1000 (time 5)``, or the range of horizons
    of its slices; empty when the table does not say (a table built by hand)."""
    def span(col, fmt):
        v = np.unique(b[col].to_numpy(float)) if col in b.columns else np.zeros(0)
        v = v[~np.isnan(v)]
        if not len(v):
            return ""
        return fmt(v[0]) if len(v) == 1 else f"{fmt(v[0])}–{fmt(v[-1])}"

    def num(v):
        return "∞" if np.isinf(v) else f"{v:g}"

    if STEP in b.columns:  # each row is a recorded step: one step is the table's horizon
        k = b[STEP].dropna().unique()
        t = span("time", num)  # that step's time (a flow's tau, lr x step for GD)
        return (f" at step {int(k[0])}" + (f" (time {t})" if t and "–" not in t else "")
                if len(k) == 1 else "")
    steps, time = span("steps", lambda v: f"{int(v)}" if np.isfinite(v) else num(v)), \
        span("time", num)
    if not (steps or time) and any(c in b.columns and len(b) and b[c].isna().all()
                                   for c in ("steps", "time")):
        return " at pooled horizons"  # over= pooled slices run to different horizons
    if time == "∞":  # the converged limit (steps 0): no step is its horizon
        return " at the converged limit"
    if steps and time:
        return f" at step {steps} (time {time})"
    return f" at step {steps}" if steps else f" at time {time}" if time else ""


def seeds_text(b: pd.DataFrame) -> str:
    """``10 seeds`` (or ``8–10 seeds per slice``) from the table's ``n_seeds``."""
    if "n_seeds" not in b.columns or not len(b):
        return ""
    v = b["n_seeds"].to_numpy(int)
    if v.min() == v.max():
        return f"{v.min()} seed{'s' if v.min() != 1 else ''}"
    return f"{v.min()}–{v.max()} seeds per slice"


def estimator_text(b: pd.DataFrame) -> str | None:
    """How the boundaries ``b`` treat runs still fitting, in words (``None``: not recorded)."""
    if "fitting" not in b.columns or not len(b):
        return None
    return ("runs still fitting counted as not overfitting"
            if b["fitting"].iloc[0] == "not_overfitting" else "runs still fitting left apart")


def summary(b: pd.DataFrame, x: str, y: str, model: str | None = None) -> str:
    """A short text: the boundaries found, the power-law fit and the theory's exponent (at each
    recorded step, for a boundary trajectory); ``model``: the runs' model, when one (the theory
    line then says only what applies to it)."""
    how = estimator_text(b)
    rule = f" ({how})" if how else ""
    level = float(b["ci_level"].iloc[0]) if "ci_level" in b.columns and len(b) else 0.95
    reps = f" ({int(b['n_boot'].iloc[0])} replicates)" if "n_boot" in b.columns and len(b) else ""
    crossing = "=" in str(b["between"].iloc[0]) if "between" in b.columns and len(b) else False
    fit_how = (f"{'seed-mean crossing' if crossing else 'logistic fit'} per slice, {level:.0%} "
               f"bootstrap over seeds{reps}")
    if STEP in b.columns:
        k = b[STEP].nunique()
        lines = [f"boundary {b['between'].iloc[0]} along {x} per {y}{rule}, {seeds_text(b)}, "
                 f"{fit_how}, at {k} recorded step{'s' if k != 1 else ''}:"]
        for _, r in exponents_over_steps(b, y).iterrows():
            fit = (f"exponent {r['exponent']:.3f} (95% CI {r['lo']:.3f} .. {r['hi']:.3f}, "
                   f"chi2/dof {r['chi2_dof']:.2f})" if np.isfinite(r["exponent"])
                   else f"no fit (fewer than {MIN_FIT_POINTS} slices)")
            if r["chi2_dof"] > SCATTER:
                fit += " — scattered: one power law does not describe it"
            if r["status"] == "grid_limited":
                fit += (" — grid-limited: no slice places its boundary, so the exponent is that "
                        "of grid-gap midpoints and says little")
            t = horizon_text(b[b[STEP] == r[STEP]]).removeprefix(f" at step {int(r[STEP])}")
            lines.append(f"  step {int(r[STEP])}{t}: {int(r['n_found'])} of {int(r['n_slices'])} "
                         f"slices placed with a bounded interval ({placed(b[b[STEP] == r[STEP]], y)}); "
                         f"{fit}")
        return "\n".join(lines)
    counts = b["status"].astype(str).value_counts()
    lines = [f"boundary {b['between'].iloc[0]} along {x}{rule}{horizon_text(b)}, "
             f"{seeds_text(b)}, {fit_how}; {len(b)} slices of {y}: "
             + ", ".join(f"{k} {v}" for k, v in counts.items() if v)]
    row = power_law_row(b, x, y)
    if row["status"] == "too_few_slices":
        lines.append(f"no power-law fit: {row['n_points']} slices placed with bounded "
                     f"intervals, fewer than {MIN_FIT_POINTS}")
        return "\n".join(lines)
    fit = {k: row[k] for k in ("exponent", "lo", "hi", "prefactor", "chi2_dof", "n_points")}
    used = seeds_text(resolved(b, y))  # the seeds of the slices the fit goes through
    lines.append(f"power law {x}* = {fit['prefactor']:.4g} * {y}^{fit['exponent']:.3f}"
                 f"{horizon_text(b)} (95% CI {fit['lo']:.3f} .. {fit['hi']:.3f}; "
                 f"{fit['n_points']} slices: {placed(b, y)}{', ' if used else ''}{used}, "
                 f"chi2/dof {fit['chi2_dof']:.2f})")
    if fit["chi2_dof"] > SCATTER:  # also when grid-limited: both are said
        lines.append(f"warning: the boundaries scatter about their fit {fit['chi2_dof']:.1f} "
                     "times more than their intervals allow: one power law does not describe "
                     "this boundary (it bends, or the slices differ)")
    if row["status"] == "grid_limited":
        lines.append("warning: no slice places its boundary (all separated or unresolved): the "
                     "fit runs through the midpoints of grid gaps, so its exponent says little; "
                     "fix: refine the grid around the boundary (phasebo sweep --refine)")
        return "\n".join(lines)
    th = theory_exponent(x, y, model)
    if th is not None:
        inside = fit["lo"] <= th[0] <= fit["hi"]
        lines.append(f"theory: exponent {th[0]:+g} ({th[1]}); "
                     + ("inside the CI" if inside else "outside the CI"))
    return "\n".join(lines)

