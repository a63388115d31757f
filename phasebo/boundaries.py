"""Phase boundaries as results: locate them with confidence intervals and test scaling laws.

**Boundary along a slice.** For every value of the slice column ``y`` (and of any ``by``
columns), keep the runs whose regime is one of ``between = (A, B)`` and fit

    P(regime = B | x) = sigmoid(a + c · u),     u = log x  (or x, with ``log=False``)

by maximum likelihood (a tiny ridge on ``c`` keeps perfectly separated slices finite). The
boundary is the ``x`` where P(B) = ½, ``x* = exp(-a / c)``. Its confidence interval is a percentile
bootstrap over *seeds*: a seed (a ``(seed, root_seed)`` pair) is one draw of the randomness across
the whole slice, so seeds, not runs, are resampled; the percentile interval is widened by the
small-sample factor t_{U-1}·√(U/(U-1))/z for U seeds (on planted boundaries at 20 seeds a
plain percentile bootstrap covers 91 % instead of 95 %; widened, 92 %). Runs of any third regime
are left out of the fit and counted in ``n_other``. A slice whose runs are all ``A`` or all
``B`` has no boundary (``status = "all_A"`` / ``"all_B"``); one whose estimate lies outside the
sampled ``x`` range is ``"outside_range"`` (an extrapolation is not a measurement); a slice whose
``A`` and ``B`` runs do not overlap in ``x`` is ``"separated"``: its interval is then at least the
gap between the last all-``A`` and the first all-``B`` value, since the data cannot place the
boundary inside it. Likewise a slice whose fitted transition is narrower than the gap between
the sampled ``x`` values on either side of its estimate, or whose runs at those two values (at
least :data:`PURE_RUNS` each) are all ``A`` on one side and all ``B`` on the other while its
interval lies inside the gap, is ``"unresolved"``, and its interval holds that gap.
A bootstrap replicate that drew no run of ``A`` (or of ``B``) has no boundary in the
range: it counts as beyond the range on that regime's side (+-inf), so an interval the seeds
cannot bound comes out infinite. A slice whose estimate lies in the range but whose interval the
seeds cannot bound (infinite, reaching 0 on a log axis or past the sampled ``x`` range, from
one seed, or, for a slice that would be ``ok``, from fewer than :data:`MIN_SEEDS` seeds or of
zero width because every seed drew the same regimes: no spread to resample; an unresolved
slice's interval holds its grid gap) is ``"unbounded"``:
more seeds, not a finer grid, would place it (a ``"separated"`` slice keeps its status, with the
open interval).

**Scaling law.** :func:`fit_power_law` fits ``boundary = prefactor · x^exponent`` by weighted least
squares on log axes, each boundary weighted by its CI (standard deviation ``log(hi/lo) / 2z``); the
exponent's interval is normal with the residual scatter folded in when it exceeds the CIs
(``chi2_dof > 1``). The theories' exponents:

- Sakamoto & Sato (prompt attention): the regimes are set by n·SNR², SNR = ‖μ‖ / (σ√d), so at fixed
  ``n`` an iso-SNR boundary has ``‖μ‖* ∝ d^½`` (boundary along ``signal_norm`` per ``d``, exponent
  ½), equivalently ``d* ∝ ‖μ‖²`` (along ``d`` per ``signal_norm``, exponent 2);
- Magen et al. (single-head attention): benign overfitting iff SNR ≳ c / √n, so ``SNR* ∝ n^-½``
  (boundary along ``x = "snr"`` per ``n``, then fit against ``n``: exponent −½).

Both functions take any regime names, including ones derived with your own thresholds: pass the
column with ``regime=``.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd

from .analysis import LEADING, STEP, at_step, is_aggregate, setting_columns
from .regimes import REGIME_ORDER
from .settings import suggest

# seeds below which a slice's bootstrap interval is not a measurement (status unbounded): four
# seeds give at most 35 distinct resamples, and a symmetric pattern (three seeds, one crossing
# the other way inside a grid gap) gives every resample one estimate: an interval of 3 in a gap
# of 112 where the data say only "in this gap"
MIN_SEEDS = 5

SLICE_STATUSES = ("ok", "unresolved", "separated", "unbounded", "outside_range", "all_A", "all_B",
                  "too_few")
Z95 = NormalDist().inv_cdf(0.975)
# bootstrap replicates below which a 95 % percentile interval is not an interval: with 5, its
# ends are the extreme replicates and can miss the estimate itself
MIN_BOOT = 100
PURE_RUNS = 3  # runs on each side of a gap before its pure sides make the slice unresolved
RIDGE = 1e-3  # on the slope of the standardised log x: finite fits of separated slices


# how runs still fitting their flipped labels count in a boundary fit (boundaries(fitting=...))
FITTING_RULES = ("apart", "not_overfitting")


def count_fitting(df: pd.DataFrame, fitting: str) -> pd.DataFrame:
    """``df`` with its ``regime`` column as the rule ``fitting`` counts it: unchanged for
    ``"apart"``; for ``"not_overfitting"`` the runs still fitting relabelled not overfitting (a
    categorical column keeps its categories)."""
    if fitting == "apart":
        return df
    reg = df["regime"]
    new = reg.astype(str).replace({"fitting": "not_overfitting"})
    if isinstance(reg.dtype, pd.CategoricalDtype):
        new = pd.Categorical(new, categories=reg.cat.categories, ordered=reg.cat.ordered)
    return df.assign(regime=new)


def bounded(lo, hi, log: bool = True):
    """Whether the intervals ``[lo, hi]`` are bounded: finite, and above 0 on a log axis (an
    interval reaching 0 there has no width to weigh or draw)."""
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    return np.isfinite(lo) & np.isfinite(hi) & ((lo > 0) if log else True)


def _fit(u: np.ndarray, yb: np.ndarray, w: np.ndarray, iters: int = 60):
    """Weighted logistic regression of ``yb`` on ``u`` for every row of weights ``w`` (R, N) at
    once (Newton steps on two parameters): the bootstrap fits all replicates in one array pass,
    where a per-replicate library fit would loop R times. Returns ``a``, ``c`` (R,) and the log
    likelihoods of the fit and of the intercept-only model.

    Runs with the same ``(u, yb)`` enter the likelihood identically, so they are pooled first
    (their weights summed): a slice of thousands of runs at a few dozen x values fits as a few
    dozen binomial points, the same fit (to rounding) in a fraction of the time."""
    pairs, inv = np.unique(np.column_stack([u, yb]), axis=0, return_inverse=True)
    if 4 * len(pairs) < len(u):  # where pooling pays; small slices fit run by run
        inv = inv.ravel()
        w = np.stack([np.bincount(inv, weights=row, minlength=len(pairs)) for row in w])
        u, yb = pairs[:, 0], pairs[:, 1]
    R = w.shape[0]
    a = np.zeros(R)
    c = np.zeros(R)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(a[:, None] + c[:, None] * u)))
        r = w * (yb - p)
        h = w * p * (1 - p) + 1e-12
        g0, g1 = r.sum(1), (r * u).sum(1) - RIDGE * c
        h00, h01, h11 = h.sum(1), (h * u).sum(1), (h * u * u).sum(1) + RIDGE
        det = h00 * h11 - h01 * h01
        da, dc = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
        a, c = a + da, c + dc
        if np.max(np.abs(da) + np.abs(dc)) < 1e-9:
            break
    p = np.clip(1.0 / (1.0 + np.exp(-(a[:, None] + c[:, None] * u))), 1e-12, 1 - 1e-12)
    ll = (w * (yb * np.log(p) + (1 - yb) * np.log(1 - p))).sum(1)
    p0 = np.clip((w * yb).sum(1) / w.sum(1), 1e-12, 1 - 1e-12)[:, None]
    ll0 = (w * (yb * np.log(p0) + (1 - yb) * np.log(1 - p0))).sum(1)
    return a, c, ll, ll0


def _quantiles(v: np.ndarray, q) -> np.ndarray:
    """``np.quantile`` (linear) of values that may be +-inf: a quantile that reaches an infinite
    value is that infinity (the plain call gives NaN from inf - inf)."""
    big = np.finfo(float).max
    out = np.quantile(np.clip(v, -big, big), q)
    return np.where(out >= big / 2, np.inf, np.where(out <= -big / 2, -np.inf, out))


def _t_quantile(p: float, nu: int) -> float:
    """Student-t quantile by the Cornish-Fisher expansion (error < 1e-3 for nu >= 3)."""
    z = NormalDist().inv_cdf(p)
    nu = max(nu, 1)
    return z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2) \
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * nu**3)


def _slice_rng(seed: int, key: tuple) -> np.random.Generator:
    """The bootstrap's generator of one slice, from ``seed`` and the slice's key alone (its step
    left out): a slice gets the same interval whichever other slices (steps, sweeps) are fitted
    beside it, and from the results table or the dynamics table at the same step."""
    words = [float(v) if isinstance(v, (int, float, np.number)) else str(v) for v in key]
    return np.random.default_rng([seed, zlib.crc32(repr(words).encode())])


def _one_value(col: pd.Series) -> float:
    """The value a slice's runs share (NaN when they differ: pooled on purpose with over)."""
    v = pd.unique(col.astype(float))
    return float(v[0]) if len(v) == 1 else np.nan


def _seed_units(d: pd.DataFrame) -> np.ndarray:
    cols = [c for c in ("seed", "root_seed") if c in d.columns]
    if not cols:
        return np.arange(len(d))
    return d.groupby(cols, sort=True, observed=True).ngroup().to_numpy()


def _slice(d: pd.DataFrame, x: str, regime: str, between, log: bool, n_boot: int, level: float,
           rng: np.random.Generator) -> dict:
    A, B = between
    reg = d[regime].astype(str).to_numpy()
    keep = (reg == A) | (reg == B)
    out = {"n_runs": int(keep.sum()), "n_a": int((reg == A).sum()), "n_b": int((reg == B).sum()),
           "n_other": int((~keep).sum()), "boundary": np.nan, "lo": np.nan, "hi": np.nan,
           "slope": np.nan, "pseudo_r2": np.nan, "ci_level": level}
    d = d[keep]
    xv = d[x].to_numpy(float)
    out["n_seeds"] = int(len(np.unique(_seed_units(d)))) if len(d) else 0
    out["n_x"] = int(len(np.unique(xv)))
    if out["n_a"] == 0 or out["n_b"] == 0:
        out["status"] = "too_few" if len(d) == 0 else ("all_A" if out["n_b"] == 0 else "all_B")
        return out
    if out["n_x"] < 2:
        out["status"] = "too_few"
        return out
    t = np.log(xv) if log else xv
    m, s = t.mean(), t.std() or 1.0
    u = (t - m) / s
    yb = (d[regime].astype(str).to_numpy() == B).astype(float)
    units = _seed_units(d)
    U = units.max() + 1
    counts = rng.multinomial(U, np.full(U, 1.0 / U), size=n_boot).astype(float)
    w = np.vstack([np.ones(len(d)), counts[:, units]])
    a, c, ll, ll0 = _fit(u, yb, w)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a ridge's slope ~0
        t_star = m + s * (-a / c)
    # a replicate that drew no A run (or no B run) places the boundary nowhere in the range: its
    # fit is the ridge's, not the data's (a huge finite x). It lies beyond the sampled x on the
    # side the full fit puts that regime's absence: +-inf, so that too few seeds read unbounded
    has_a, has_b = (w[1:] * (yb == 0)).sum(1) > 0, (w[1:] * (yb == 1)).sum(1) > 0
    up = 1.0 if c[0] >= 0 else -1.0  # B toward larger x
    t_star[1:] = np.where(~has_b, up * np.inf, np.where(~has_a, -up * np.inf, t_star[1:]))
    back = np.exp if log else (lambda v: v)
    est = float(t_star[0])
    boots = t_star[1:][~np.isnan(t_star[1:])]
    alpha = (1 - level) / 2
    lo, hi = (_quantiles(boots, [alpha, 1 - alpha]) if len(boots) else (np.nan, np.nan))
    # a bootstrap over U seeds underestimates the spread by sqrt((U - 1) / U) and ignores that
    # the spread itself is estimated: widen by t_{U-1} sqrt(U / (U - 1)) / z (≈ 1.10 at U = 20)
    f = _t_quantile(1 - alpha, U - 1) * math.sqrt(U / max(U - 1, 1)) / NormalDist().inv_cdf(
        1 - alpha) if U > 1 else 1.0
    with np.errstate(invalid="ignore"):  # a flat fit (slope 0): est is infinite, so are these
        lo, hi = est - f * (est - lo), est + f * (hi - est)
    # separated: the B runs all on one side of the A runs; the data say only "in this gap"
    xa, xb = t[yb == 0], t[yb == 1]
    status = "ok"
    if xa.max() < xb.min() or xb.max() < xa.min():
        status = "separated"
        g0, g1 = (xa.max(), xb.min()) if xa.max() < xb.min() else (xb.max(), xa.min())
        lo, hi = min(lo, g0), max(hi, g1)
    if not (t.min() <= est <= t.max()):
        out["status"] = "outside_range"
        return out
    # unresolved: the fitted transition (logit -2.2 .. 2.2) is narrower than the gap between the
    # sampled x values on either side of the estimate, so the grid cannot place the boundary
    # inside that gap (a steep fit through one mixed point is not a precise boundary)
    # Likewise when every run at the sampled x just below the estimate is one regime and every
    # run just above it the other: wherever the fit puts the boundary inside that gap, it is put
    # there by runs elsewhere in the slice (a stray run far away tilts it), not by the gap's sides
    ts = np.unique(t)
    below, above = ts[ts < est], ts[ts > est]
    if status == "ok" and len(below) and len(above):
        yl, yr = yb[t == below[-1]], yb[t == above[0]]
        steep = 2 * math.log(9) * s / max(abs(float(c[0])), 1e-300) < above[0] - below[-1]
        # pure sides say something only with a few runs each (one run per x is always "pure"),
        # only matter when the interval does not already hold the gap, and only when no mixed x
        # value lies between them (an estimate on a sampled x)
        sides = (est not in ts and min(len(yl), len(yr)) >= PURE_RUNS and np.ptp(yl) == 0
                 and np.ptp(yr) == 0 and yl[0] != yr[0])
        # an interval reaching past the sampled x is an extrapolation: the runs do not bound it
        # where they were run; with pure sides the gap is what the data say (the grid is short)
        past = not (t.min() <= lo and hi <= t.max())
        pure = sides and (past or not (lo <= below[-1] and hi >= above[0]))
        if steep or pure:
            status = "unresolved"
            lo, hi = min(lo, below[-1]), max(hi, above[0])
    # a few seeds have no spread to resample (one seed: one resample; MIN_SEEDS), nor do seeds that
    # all drew the same regimes (noise shared along the map, a settled slice): a zero-width
    # interval says nothing. An ok interval past the sampled x: more seeds would bound it. (An
    # unresolved interval holds its grid gap: bounded by the grid, not by the resamples.)
    flat = len(boots) > 0 and np.isfinite(boots).all() and np.ptp(boots) == 0
    beyond = U < 2 or status == "ok" and (U < MIN_SEEDS or flat
                                          or not (t.min() <= lo and hi <= t.max()))
    with np.errstate(over="ignore"):  # a bootstrap interval wider than floats reach: inf
        est, lo, hi = float(back(est)), float(back(lo)), float(back(hi))
    if status in ("ok", "unresolved") and (beyond or not bounded(lo, hi, log)):
        status = "unbounded"  # too few seeds to bound it (e.g. 3): not placed, whatever the grid
    out.update(boundary=est, lo=lo, hi=hi, slope=float(c[0] / s), status=status,
               pseudo_r2=float(1 - ll[0] / ll0[0]) if ll0[0] < 0 else np.nan)
    return out


def _leading(df: pd.DataFrame, keys: list, varying: list) -> str | None:
    """The setting among ``varying`` whose value fixes every other inside each slice (the
    fewest distinct values first, the model and the dynamics before the settings they bring),
    or None: the one ``--by`` that a fix needs."""
    def fixes(c):
        g = df.groupby([*keys, c], observed=True, dropna=False)
        return all(g[o].nunique(dropna=False).max() <= 1 for o in varying if o != c)

    for c in sorted(varying, key=lambda c: (df[c].nunique(dropna=False), c not in LEADING)):
        if fixes(c):
            return c
    return None


def boundaries(df: pd.DataFrame, x: str, y: str, between: Sequence[str] = ("benign", "harmful"), *,
               by: Sequence[str] = (), over: Sequence[str] = (), regime: str = "regime",
               log: bool | None = None, n_boot: int = 400, level: float = 0.95,
               seed: int = 0, step=None, fitting: str = "apart") -> pd.DataFrame:
    """The boundary between regimes ``A`` and ``B`` (``between``) along ``x`` for each value of
    ``y`` (and of the ``by`` columns), from a table of runs (:func:`phasebo.load`).

    Returns one row per slice: ``y`` (named as the column), the ``by`` columns, ``boundary`` (the
    ``x`` where P(B) = ½), ``lo``/``hi`` (its ``level`` bootstrap-over-seeds interval), ``n_runs``
    (runs of ``A`` or ``B``), ``n_a``, ``n_b``, ``n_other``, ``n_seeds``, ``n_x`` (distinct ``x``
    values), ``slope`` (d logit / d log x), ``pseudo_r2`` (McFadden), ``status`` (one of
    ``ok``, ``unresolved``, ``separated``, ``unbounded``, ``outside_range``, ``all_A``, ``all_B``,
    ``too_few``), ``x``, ``between``, ``fitting``, ``n_boot`` (the bootstrap replicates, at
    least :data:`MIN_BOOT`), ``ci_level`` and the horizon: ``steps`` and ``time`` shared
    by the slice's runs (NaN where they differ; on a dynamics table ``step`` is a slice key and
    ``time`` its flow time). A setting other than ``x``, ``y``, ``by`` and the seed that varies inside a slice
    is an error (the fit would pool it) unless it is named in ``over`` or ``x`` determines it one
    to one (``d`` along ``x = "snr"`` at a fixed signal norm).

    On a dynamics table (regimes at every recorded step, ``pb.load(path, "dynamics")``) every
    recorded step is a slice key of its own, so the rows trace the boundary over time; ``step``
    (an int, a list or ``"last"``) keeps only those steps (:func:`phasebo.analysis.at_step`).

    ``fitting``: how runs still fitting their flipped labels at the step count (the estimator,
    recorded in the ``fitting`` column): ``"apart"`` (the default) on neither side, so the
    boundary is between settled runs; ``"not_overfitting"`` as not overfitting ("a label still
    unfitted at t"), the rule of earlier versions, whose boundary moves with the horizon.
    """
    if fitting not in FITTING_RULES:
        raise ValueError(f"fitting = {fitting!r}: one of {', '.join(FITTING_RULES)}")
    _check_boot(n_boot)
    if isinstance(between, str):  # the command line's form "A,B"
        between = tuple(s.strip() for s in between.split(","))
    if len(between) != 2 or between[0] == between[1]:
        raise ValueError(f"between = {','.join(map(str, between))!r}: give two different regime "
                         "names, e.g. 'benign,harmful' (in Python also ('benign', 'harmful'))")
    if is_aggregate(df):
        raise ValueError("boundaries: this is an aggregate (one row per cell), but the fit needs "
                         "one row per run, resampled by seed; fix: pass the runs table "
                         "(pb.load(path)), not pb.aggregate's output")
    for col, what in ((x, "x"), (y, "y")):
        if col in (regime, "status"):
            raise ValueError(f"boundaries: {what} = {col!r} is what the fit classifies; fix: "
                             f"{what} names a swept setting (e.g. 'd', 'signal_norm')")
    if x == y:
        raise ValueError(f"boundaries: x and y are both {x!r}; fix: y names the slices, another "
                         "setting than x")
    if regime == "regime":
        for r in between:
            if r not in REGIME_ORDER:
                raise ValueError(f"between: {r!r} is not a regime{suggest(r, REGIME_ORDER)}; "
                                 f"regimes: {', '.join(REGIME_ORDER)}")
    if step is not None and STEP not in df.columns:
        at_step(df, step)  # a table without recorded steps: its error says what to load
    if STEP in df.columns:
        if step is not None:
            df = at_step(df, step)
        if STEP not in (x, y, *by):
            by = (*by, STEP)
    for col in (x, y, regime, *by, *over):
        if col not in df.columns:
            raise ValueError(f"column {col!r} is not in the table"
                             f"{suggest(col, map(str, df.columns))}; it has "
                             f"{', '.join(map(str, df.columns[:30]))}")
    if df.empty:  # said as such, not as an axis with one value, ()
        raise ValueError("boundaries: the table holds no runs (a selection that matched "
                         "nothing?); fix: select runs the table has")
    if df[x].nunique(dropna=False) <= 1:
        axes = [c for c in setting_columns(df) if df[c].nunique(dropna=False) > 1
                and c not in ("seed", "root_seed")]
        raise ValueError(f"x = {x!r} takes one value in these runs "
                         f"({', '.join(map(str, pd.unique(df[x])[:1]))}): a boundary along it "
                         "needs several; fix: x names an axis that varies"
                         + (f" ({', '.join(axes)})" if axes else ""))
    if not pd.api.types.is_numeric_dtype(df[x]):
        raise ValueError(f"x = {x!r} is not numeric ({', '.join(map(str, pd.unique(df[x])[:3]))}"
                         "): a boundary lies along a numeric axis; fix: x names a numeric axis "
                         f"and {x} goes in y or by")
    if "status" in df.columns:
        status = df["status"].astype(str)
        if not (status == "ok").any():
            counts = ", ".join(f"{k} {v}" for k, v in status.value_counts().items())
            raise ValueError(f"boundaries: none of the {len(df)} runs is ok ({counts}): a fit "
                             "needs runs that finished; fix: a smaller lr or fewer steps, or, "
                             "on a dynamics table, an earlier --step")
        df = df[status == "ok"]
    if fitting == "not_overfitting":
        if "fitting" in between:
            raise ValueError("between names 'fitting', which fitting = 'not_overfitting' counts "
                             "as not overfitting; fix: fitting='apart'")
        if regime != "regime":
            raise ValueError("fitting = 'not_overfitting' relabels the regime column; fix: "
                             "regime='regime', or relabel your own column")
        df = count_fitting(df, fitting)
    seen = set(df[regime].astype(str))
    absent = [r for r in between if r not in seen]
    if absent:  # every slice would read all_A / all_B, or too_few: said, not left to the status
        warnings.warn(f"boundaries: no run is {' or '.join(absent)} in these runs (they are "
                      f"{', '.join(sorted(seen))}): no slice can have a boundary", stacklevel=2)
    keys = [y, *by]
    both = [c for c in over if c in (x, *keys)]
    if both:
        role = "x" if both[0] == x else "y" if both[0] == y else "by"
        raise ValueError(f"over names {both[0]!r}, the boundary's {role}: it is the boundary's "
                         f"own axis, never pooled; fix: leave it out of over (--over)")
    seeds = [c for c in over if c in ("seed", "root_seed")]
    if seeds:
        raise ValueError(f"over names {seeds[0]!r}: a slice's runs of every seed are always "
                         "pooled (the interval is a bootstrap over seeds); fix: leave it out of "
                         "over (--over)")
    fixed = {x, *keys, *over, "seed", "root_seed"}
    def tied_to_x(c):  # a setting that x determines one to one (d when x is the snr)
        return all(g.groupby(x)[c].nunique(dropna=False).max() == 1 and
                   g.groupby(c)[x].nunique(dropna=False).max() == 1
                   for _, g in df.groupby(keys, observed=True))

    varying = [c for c in setting_columns(df) if c not in fixed
               and df.groupby(keys, observed=True)[c].nunique(dropna=False).max() > 1
               and not tied_to_x(c)]
    if varying:
        lead = _leading(df, keys, varying)
        if lead is not None and len(varying) > 1:  # one setting the others follow (dynamics)
            rest = [c for c in varying if c != lead]
            raise ValueError(f"{lead} varies inside the slices of {', '.join(keys)} (and with it "
                             f"{', '.join(rest)}): a boundary fit would pool them; fix: add "
                             f"{lead} to by (--by {lead}), or select one value first")
        verb = "varies" if len(varying) == 1 else "vary"
        raise ValueError(f"{', '.join(varying)} {verb} inside the slices of {', '.join(keys)}: a "
                         "boundary fit would pool them; fix: add them to by (--by), select "
                         "one value first, or name them in over (--over) to pool them")
    if log is None:
        log = bool((df[x] > 0).all())
    if log and (df[x] <= 0).any():
        raise ValueError(f"log = True needs {x} > 0; fix: log=False")
    # the horizon of each slice: its runs' steps and time (a dynamics table's step is a key)
    horizon = [c for c in (("time",) if STEP in df.columns else ("steps", "time"))
               if c in df.columns and c not in (x, *keys)]
    rows = []
    for key, d in df.groupby(keys, sort=True, observed=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, key)),
                     **{c: _one_value(d[c]) for c in horizon},
                     **_slice(d, x, regime, tuple(between), log, n_boot, level,
                              _slice_rng(seed, tuple(v for k, v in zip(keys, key)
                                                     if k not in (STEP, "time"))))})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["status"] = pd.Categorical(out["status"], categories=SLICE_STATUSES)
    out["x"] = x
    out["between"] = f"{between[0]}/{between[1]}"
    out["fitting"] = fitting
    out["n_boot"] = n_boot
    return out


def _check_boot(n_boot) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, int | np.integer) or n_boot < MIN_BOOT:
        raise ValueError(f"n_boot = {n_boot!r}: a bootstrap interval needs at least {MIN_BOOT} "
                         f"replicates; fix: n_boot >= {MIN_BOOT} (--boot {MIN_BOOT}; default 400)")


def _first_crossing(u: np.ndarray, m: np.ndarray, level: float) -> tuple[float, int]:
    """Where ``m(u)`` first crosses ``level`` (linear between the bracketing points) and how many
    sign changes ``m - level`` has; NaN if none."""
    ok = np.isfinite(m)
    u, m = u[ok], m[ok]
    side = np.sign(m - level)
    side[side == 0] = 1  # on the level counts as reached
    change = np.flatnonzero(side[1:] != side[:-1])
    if not len(change):
        return np.nan, 0
    i = change[0]
    t = (level - m[i]) / (m[i + 1] - m[i])
    return float(u[i] + t * (u[i + 1] - u[i])), int(len(change))


def crossings(df: pd.DataFrame, x: str, y: str, value: str = "test_acc", level: float = 0.95,
              *, by: Sequence[str] = (), log: bool | None = None, n_boot: int = 400,
              ci: float = 0.95, seed: int = 0, step=None) -> pd.DataFrame:
    """A second boundary estimator: where the seed mean of ``value`` crosses ``level`` along ``x``,
    for each slice of ``y`` (and ``by``), interpolated linearly in ``log x`` between the two
    sampled ``x`` values that bracket it; its ``ci`` interval is a percentile bootstrap over seeds
    (seeds as in :func:`boundaries`: a seed is one draw across the whole slice).

    Rows have the columns of :func:`boundaries` (so :func:`fit_power_law` takes them; ``n_boot``
    replicates, at least :data:`MIN_BOOT`), with
    ``status`` ``ok`` or ``no_crossing`` and ``n_crossings`` (more than 1: the mean is not
    monotone in ``x``; the first crossing from small ``x`` is reported). Failed runs are left
    out. On a dynamics table every recorded step is a slice (or ``step`` selects some).
    """
    for col in (x, y, value, *by):
        if col not in df.columns:
            raise ValueError(f"column {col!r} is not in the table")
    _check_boot(n_boot)
    if "status" in df.columns:
        df = df[df["status"].astype(str) == "ok"]
    if STEP in df.columns:
        if step is not None:
            df = at_step(df, step)
        if STEP not in (x, y, *by):
            by = (*by, STEP)
    keys = [y, *by]
    if log is None:
        log = bool((df[x] > 0).all())
    rng = np.random.default_rng(seed)
    alpha = (1 - ci) / 2
    rows = []
    for key, d in df.groupby(keys, sort=True, observed=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        d = d.assign(_unit=_seed_units(d))
        grid = d.pivot_table(index="_unit", columns=x, values=value, aggfunc="mean")
        xs = grid.columns.to_numpy(float)
        u = np.log(xs) if log else xs
        vals = grid.to_numpy(float)
        est, nc = _first_crossing(u, np.nanmean(vals, axis=0), level)
        U = len(vals)
        boots = np.array([_first_crossing(u, np.nanmean(vals[rng.integers(0, U, U)], axis=0),
                                          level)[0] for _ in range(n_boot)])
        boots = boots[np.isfinite(boots)]
        lo, hi = (np.quantile(boots, [alpha, 1 - alpha]) if len(boots) else (np.nan, np.nan))
        back = np.exp if log else (lambda v: v)
        rows.append({**dict(zip(keys, key)), "boundary": float(back(est)),
                     "lo": float(back(lo)), "hi": float(back(hi)), "n_seeds": U,
                     "n_x": len(xs), "n_crossings": nc, "ci_level": ci,
                     "status": "ok" if np.isfinite(est) else "no_crossing"})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["x"] = x
    out["between"] = f"{value}={level:g}"
    out["n_boot"] = n_boot
    return out
