"""The regime rule, at the horizon and at every recorded step.

A run's regime is a statement about one step ``t`` (its horizon, or a recorded step):

- a run whose ``status`` is not ``ok`` gets its status (``diverged``);
- ``no_noise``: the run has no flipped label, so there is nothing to overfit (``n_noisy = 0``);
- train accuracy ``< train_acc_fit`` (default 1: some label unfitted):

  - ``fitting`` when the run is still fitting its labels at ``t`` (the rule below),
  - ``not_overfitting`` otherwise (its margins have settled at ``t``);
- train accuracy ``>= train_acc_fit``: ``benign`` iff test accuracy ``>= A - test_eps``, else
  ``harmful``, where the reference accuracy ``A`` is set by ``test_reference``:

  - ``absolute`` (the synthetic models' default): ``A = 1``;
  - ``clean`` (real data's default, where even a noise-free run stays short of 1): ``A`` is the
    mean test accuracy of the sweep's noise-free runs (``noise_ratio = 0``, status ok) that share
    every other setting but the seed (at the same recorded step, over time). A run with no such
    runs in its sweep gets ``no_baseline`` instead of benign / harmful. The noise-free runs
    themselves are ``no_noise``, never harmful.

**Still fitting.** Let ``m(t)`` be the smallest training margin ``min_i y_i f(x_i)`` at step ``t``
(negative while a label is unfitted) and ``t'`` an earlier step, ``t' <= t / 2`` (the run's middle
step ``steps // 2`` at its horizon, in the results and at the horizon's recorded step alike; the
latest recorded step ``<= t / 2`` at the dynamics' earlier steps).
Margins of attention models grow about linearly in ``log t`` (the attention gaps grow
logarithmically), so the rule extrapolates the smallest margin linearly in ``log t`` by one
decade::

    m(10 t)  ≈  m(t) + (m(t) - m(t')) · ln 10 / ln(t / t')

and calls the run ``fitting`` when that is positive: at the trend of its last half, it would fit
every label within ten times its horizon, so its label at ``t`` is not yet a phase. Without an
earlier step ``t' >= 1`` (horizons of one step) the trend is unknown and the run keeps the
``not_overfitting`` label; so does a run whose step size decays to 0 at its horizon
(``lr_schedule = "linear"``), at that horizon: its training has stopped. The rule was checked
on real runs by running them ten times longer (``docs/science.md``).

Accuracies are ``k / n`` in float32, so the thresholds carry a ``1e-6`` tolerance.

**Over time.** :func:`regimes_over_time` labels every row of a dynamics table (one per run and
recorded step) with the same rule, and :func:`timeline` condenses each run's recorded path: the
first recorded step at which it is benign, the step of its lowest test accuracy after step 0
(``dip_step``, ``dip_test_acc``), and the **recovery step**: the first recorded step after a dip
below ``A - test_eps`` at which test accuracy is back at ``>= A - test_eps`` (``-1``: no recovery
by the horizon, or no dip); a recovery can be transient (test accuracy falls back below later),
so ``held_recovery_step`` is the first recorded step from which it stays back to the horizon
(``-1``: not back at the horizon, below or without a value, or no dip).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

REGIMES = ("benign", "harmful", "not_overfitting", "fitting", "no_noise", "no_baseline")
REGIME_ORDER = (*REGIMES, "diverged", "unsolved")
DECADE = 10.0  # how far ahead the still-fitting rule extrapolates (a factor on the step)
TOL = 1e-6  # accuracies are k / n in float32


def projected_margin(margin, margin_prev, step, step_prev) -> np.ndarray:
    """``m(10 t) ≈ m(t) + (m(t) - m(t')) ln 10 / ln(t / t')``; NaN where ``t' < 1`` or
    ``t' >= t`` (no trend)."""
    m, m0 = np.asarray(margin, float), np.asarray(margin_prev, float)
    t, t0 = np.asarray(step, float), np.asarray(step_prev, float)
    ok = (t0 >= 1) & (t > t0)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (m - m0) / np.log(np.where(ok, t / np.where(ok, t0, 1.0), 2.0))
    return np.where(ok, m + slope * math.log(DECADE), np.nan)


def classify_regime(train_acc, test_acc, status, test_eps=0.05, train_acc_fit=1.0, *,
                    n_noisy=None, margin=None, margin_prev=None, step=None,
                    step_prev=None, reference=1.0) -> np.ndarray:
    """The regime of each run at one step (module docstring); every argument broadcasts.

    ``n_noisy`` (flipped labels), and ``margin`` / ``margin_prev`` (smallest margin at ``step``
    and at the earlier ``step_prev``) are optional: without them no run is ``no_noise`` or
    ``fitting``. ``reference``: the accuracy ``A`` benign is judged against (NaN: none, so a run
    that fits every label is ``no_baseline``). ``status``: a run's status name (``"ok"``, ...)
    or its code as :func:`phasebo.run_one` returns it (0 ok, 1 diverged, 2 unsolved).
    """
    train_acc = np.asarray(train_acc, float)
    shape = train_acc.shape
    test_acc = np.broadcast_to(np.asarray(test_acc, float), shape)
    codes = np.asarray(status)
    names = np.array(["ok", "diverged", "unsolved"], object)
    if codes.dtype.kind in "iu":  # run_one's codes (phasebo.train.Status)
        if ((codes < 0) | (codes > 2)).any():
            raise ValueError(f"classify_regime: status code {codes[(codes < 0) | (codes > 2)][0]} "
                             "is not a run's; fix: 0 (ok), 1 (diverged) or 2 (unsolved)")
        status = names[codes]
    status = np.broadcast_to(np.asarray(status, object), shape)
    known = np.isin(status.astype(str), [*names, "error"])  # "error": a table's unknown code
    if not known.all():
        raise ValueError(f"classify_regime: status {status[~known][0]!r} is not a run status; "
                         "fix: ok, diverged or unsolved (or their codes 0, 1, 2)")
    test_eps = np.broadcast_to(np.asarray(test_eps, float), shape)
    fit_thr = np.broadcast_to(np.asarray(train_acc_fit, float), shape)
    for name, v, ok, fix in (("test_eps", test_eps, (test_eps >= 0) & (test_eps <= 1), "0 .. 1"),
                             ("train_acc_fit", fit_thr, (fit_thr > 0) & (fit_thr <= 1), "(0, 1]")):
        if not ok.all():
            raise ValueError(f"classify_regime: {name} = {v[~ok][0]:g} is out of range; fix: "
                             f"{name} in {fix}")
    if (margin is None) != (margin_prev is None) or margin is not None and (
            step is None or step_prev is None):
        raise ValueError("classify_regime: the still-fitting trend needs margin, margin_prev, "
                         "step and step_prev together; fix: give all four, or none")
    reference = np.broadcast_to(np.asarray(reference, float), shape)
    fits = train_acc >= fit_thr - TOL
    good = test_acc >= reference - test_eps - TOL
    judged = np.where(np.isnan(reference), "no_baseline", np.where(good, "benign", "harmful"))
    out = np.where(fits, judged, "not_overfitting").astype(object)
    if margin is not None and margin_prev is not None:
        proj = np.broadcast_to(projected_margin(margin, margin_prev, step, step_prev), shape)
        out[~fits & (np.nan_to_num(proj, nan=-1.0) > 0)] = "fitting"
    if n_noisy is not None:
        out[np.broadcast_to(np.asarray(n_noisy) == 0, shape)] = "no_noise"
    bad = status != "ok"
    out[bad] = status[bad]
    return out


def classify_runs(res: pd.DataFrame, reference=1.0) -> np.ndarray:
    """The regime at the horizon of every row of a results table: its final metrics, thresholds
    (``test_eps``, ``train_acc_fit``), ``n_noisy``, the smallest margin at the horizon and at
    the middle step (``margin``, ``margin_mid``) and the reference accuracy of each row
    (:func:`clean_reference`; 1 by default)."""
    steps = res["steps"].to_numpy(float) if "steps" in res.columns else np.zeros(len(res))
    kw = {}
    if {"margin", "margin_mid"} <= set(res.columns):
        mid = np.where(stops_at_horizon(res), np.nan, res["margin_mid"].to_numpy(float))
        kw = dict(margin=res["margin"].to_numpy(float), margin_prev=mid,
                  step=steps, step_prev=np.floor(steps / 2))
    return classify_regime(res["train_acc"].to_numpy(float), res["test_acc"].to_numpy(float),
                           res["status"].astype(str).to_numpy(object),
                           _col(res, "test_eps", 0.05), _col(res, "train_acc_fit", 1.0),
                           n_noisy=res["n_noisy"].to_numpy() if "n_noisy" in res.columns else None,
                           reference=reference, **kw)


def stops_at_horizon(res: pd.DataFrame) -> np.ndarray:
    """Runs whose step size decays to 0 at their horizon (``lr_schedule = "linear"``): training
    has stopped there, so no trend carries them on and none is ``fitting`` at its horizon."""
    if "lr_schedule" not in res.columns:
        return np.zeros(len(res), bool)
    return res["lr_schedule"].astype(str).to_numpy() == "linear"


def _cells(res: pd.DataFrame, by: list[str]) -> np.ndarray:
    """An integer per row naming its cell: the values of ``by`` (NaN a value like any other)."""
    if not by:
        return np.zeros(len(res), np.int64)
    keys = res[by].astype(str)
    return keys.groupby(by, sort=False, dropna=False).ngroup().to_numpy(np.int64)


def clean_reference(res: pd.DataFrame, by: list[str], dyn: pd.DataFrame | None = None):
    """The reference accuracy of every run (and dynamics row) under ``test_reference``.

    ``by``: the setting columns that make two runs the same cell but for their noise ratio and
    seed. Returns ``(reference, runs, reference_dyn)``: per results row, 1.0 under ``absolute``
    and under ``clean`` the mean final test accuracy of the ok runs with ``noise_ratio = 0`` of
    its cell (NaN when there are none), with how many there are (``runs``; NaN under absolute);
    per dynamics row (``dyn`` sorted or not), the same at its recorded step.
    """
    mode = res["test_reference"].astype(str).to_numpy() if "test_reference" in res.columns \
        else np.full(len(res), "absolute")
    clean = mode == "clean"
    ref = np.ones(len(res))
    runs = np.full(len(res), np.nan)
    ref_dyn = None if dyn is None else np.ones(len(dyn))
    if not clean.any():
        return ref, runs, ref_dyn
    cell = _cells(res, [c for c in by if c in res.columns and c != "noise_ratio"])
    base = (res["noise_ratio"].to_numpy(float) == 0) & \
        (res["status"].astype(str).to_numpy() == "ok")
    acc = pd.Series(res["test_acc"].to_numpy(float)[base]).groupby(cell[base])
    mean, count = acc.mean(), acc.size()
    ref = np.where(clean, mean.reindex(cell).to_numpy(float), 1.0)
    runs = np.where(clean, count.reindex(cell).fillna(0).to_numpy(float), np.nan)
    if dyn is not None:
        pos = pd.Index(res["run_id"].to_numpy()).get_indexer(dyn["run_id"].to_numpy())
        dcell, dbase, dclean = cell[pos], base[pos], clean[pos]
        step = dyn["step"].to_numpy(np.int64)
        key = pd.MultiIndex.from_arrays([dcell, step])
        table = pd.Series(dyn["test_acc"].to_numpy(float)[dbase]).groupby(
            [dcell[dbase], step[dbase]]).mean()
        ref_dyn = np.where(dclean, table.reindex(key).to_numpy(float), 1.0)
    return ref, runs, ref_dyn


def _col(df: pd.DataFrame, name: str, default: float) -> np.ndarray:
    # a table joined from models that lack the setting: their runs take its default
    return df[name].to_numpy(float, na_value=default) if name in df.columns else \
        np.full(len(df), default)


def _blocks(run: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start of each run's block of rows (rows sorted by run) and each row's block start."""
    start = np.r_[0, np.flatnonzero(run[1:] != run[:-1]) + 1] if len(run) else np.zeros(0, int)
    return start, np.repeat(start, np.diff(np.r_[start, len(run)]))


def _previous_record(dyn: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For every row of a dynamics table sorted by (run, step): the latest recorded step
    ``t' <= t / 2`` of the same run and its smallest margin (step -1, margin NaN if none)."""
    step = dyn["step"].to_numpy(np.int64)
    margin = dyn["margin"].to_numpy(float)
    _, first = _blocks(dyn["run_id"].to_numpy())
    width = int(step.max()) + 2 if len(step) else 1
    key = first * width + step  # increasing along the sorted rows
    pos = np.searchsorted(key, first * width + step // 2, side="right") - 1
    ok = pos >= first
    pos = np.clip(pos, 0, None)
    return np.where(ok, step[pos], -1), np.where(ok, margin[pos], np.nan)


def _clean_reference_of(dyn: pd.DataFrame, res: pd.DataFrame):
    """Per row of ``dyn``: the reference accuracy its run is judged against, when some runs of
    ``res`` are judged against their noise-free runs (``None``: every reference is 1). The cells
    are made by the table's recorded setting columns, as :func:`phasebo.results.judge` makes them."""
    if "test_reference" not in res.columns or not (res["test_reference"].astype(str) == "clean").any():
        return None
    settings = (res.attrs.get("column_groups") or {}).get("settings")
    if settings is None:
        raise ValueError("regimes_over_time: runs with test_reference = 'clean' are judged against "
                         "the noise-free runs of their cell, and this results table does not record "
                         "which columns are settings; fix: a table from pb.load, or reference=...")
    return clean_reference(res, cell_keys(settings, res.columns), dyn)[2]


def cell_keys(settings, columns) -> list[str]:
    """The setting columns that make two runs one cell (but for their seed): ``settings`` that are
    in ``columns``, less :data:`phasebo.settings.NOT_CELL`."""
    from .settings import NOT_CELL

    return [c for c in settings if c not in NOT_CELL and c in columns]


def regimes_over_time(dyn: pd.DataFrame, res: pd.DataFrame, reference=None) -> pd.DataFrame:
    """The regime of every run at every recorded step.

    ``dyn``: a dynamics table (``run_id``, ``step``, ``train_acc``, ``test_acc``, ``margin``, ...);
    ``res``: the results table of the same runs (their thresholds, ``n_noisy`` and ``status``).
    Returns the tidy table ``run_id, step, train_acc, train_acc_clean, train_acc_noisy,
    test_acc, regime`` (rows sorted by run and step), plus the trend's ``margin`` and
    ``projected_margin`` and the ``reference_acc`` (``reference``: one per row of ``dyn``, in its
    order; by default 1, or under ``test_reference = "clean"`` the noise-free runs' mean at each
    step, :func:`clean_reference`, as the sweep's own dynamics table). A run that diverged is
    ``diverged`` from its ``diverge_step`` on.
    """
    need = {"run_id", "step", "train_acc", "test_acc", "margin"}
    if not need <= set(dyn.columns):
        raise ValueError(f"regimes_over_time: the dynamics table lacks {sorted(need - set(dyn))}")
    if reference is None:
        reference = _clean_reference_of(dyn, res)
    ref = np.ones(len(dyn)) if reference is None else np.asarray(reference, float)
    order = np.lexsort((dyn["step"].to_numpy(), dyn["run_id"].to_numpy()))
    d = dyn.iloc[order].reset_index(drop=True)
    ref = ref[order]
    per_run = res.drop_duplicates("run_id").set_index("run_id")
    idx = per_run.index.get_indexer(d["run_id"].to_numpy())
    if (idx < 0).any():
        raise ValueError("regimes_over_time: dynamics rows of runs missing from the results")

    def col(name, default):
        if name not in per_run.columns:
            return np.full(len(d), default)
        return per_run[name].to_numpy()[idx]

    step = d["step"].to_numpy(np.int64)
    status = col("status", "ok").astype(str).astype(object)
    div = col("diverge_step", -1).astype(float)
    status = np.where((status != "ok") & ((div < 0) | (step >= div)), status, "ok").astype(object)
    prev_step, prev_margin = _previous_record(d)
    # at the horizon the trend is read from the middle step, as the results table's regime is,
    # so the last map over time and the map at the horizon are one map
    horizon = col("steps", -1).astype(float)
    mid = col("margin_mid", np.nan).astype(float)
    at_h = (step == horizon) & np.isfinite(mid)
    prev_step = np.where(at_h, np.floor(horizon / 2), prev_step)
    prev_margin = np.where(at_h, mid, prev_margin)
    # a step size decayed to 0 at the horizon: no trend there (classify_runs alike)
    prev_margin = np.where((step == horizon) & stops_at_horizon(per_run)[idx], np.nan,
                           prev_margin)
    regime = classify_regime(d["train_acc"].to_numpy(float), d["test_acc"].to_numpy(float),
                             status, _col(per_run, "test_eps", 0.05)[idx],
                             _col(per_run, "train_acc_fit", 1.0)[idx], n_noisy=col("n_noisy", 1),
                             margin=d["margin"].to_numpy(float), margin_prev=prev_margin,
                             step=step, step_prev=prev_step, reference=ref)
    keep = [c for c in ("run_id", "step", "train_acc", "train_acc_clean", "train_acc_noisy",
                        "test_acc", "margin") if c in d.columns]
    out = d[keep].copy()
    out["projected_margin"] = projected_margin(d["margin"].to_numpy(float), prev_margin, step,
                                               prev_step)
    out["reference_acc"] = ref
    out["regime"] = pd.Categorical(regime, categories=REGIME_ORDER, ordered=True)
    return out


def timeline(reg: pd.DataFrame, res: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run from its regimes over time (:func:`regimes_over_time`):
    ``first_benign_step``, ``dip_step``, ``dip_test_acc``, ``recovery_step``,
    ``held_recovery_step`` (module docstring;
    ``-1`` for never). ``res`` supplies each run's ``test_eps`` (default 0.05)."""
    d = reg.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    run = d["run_id"].to_numpy()
    step = d["step"].to_numpy(np.int64)
    acc = d["test_acc"].to_numpy(float)
    start, _ = _blocks(run)
    ids = run[start] if len(run) else run
    eps = np.full(len(d), 0.05)
    if res is not None and "test_eps" in res.columns:
        e = res.drop_duplicates("run_id").set_index("run_id")["test_eps"]
        eps = e.reindex(run).fillna(0.05).to_numpy(float)
    ref = d["reference_acc"].to_numpy(float) if "reference_acc" in d.columns else 1.0
    good = acc >= ref - eps - TOL  # NaN reference (no baseline): never good, so no recovery
    idx = np.arange(len(d))
    never = len(d) + 1

    def first_where(mask):  # per run: the first row where mask holds (never if none)
        return np.minimum.reduceat(np.where(mask, idx, never), start) if len(d) else idx

    out = pd.DataFrame({"run_id": ids})
    fb = first_where(d["regime"].astype(str).to_numpy() == "benign")
    out["first_benign_step"] = np.where(fb < never, step[np.clip(fb, 0, len(d) - 1)], -1)
    later = (step >= 1) & np.isfinite(acc)
    low = np.minimum.reduceat(np.where(later, acc, np.inf), start) if len(d) else acc
    j = first_where(later & (acc == np.repeat(low, np.diff(np.r_[start, len(d)]))))
    has = j < never
    jj = np.clip(j, 0, max(len(d) - 1, 0))
    out["dip_step"] = np.where(has, step[jj], -1)
    out["dip_test_acc"] = np.where(has, low, np.nan)
    dipped = has & ~good[jj]
    after = idx > np.repeat(jj, np.diff(np.r_[start, len(d)]))
    back = first_where(after & good)
    out["recovery_step"] = np.where(dipped & (back < never), step[np.clip(back, 0, len(d) - 1)],
                                    -1)
    # held: the row after the last one below the threshold, when the run ends above it
    end = np.r_[start[1:], len(d)] if len(d) else start
    last_bad = np.maximum.reduceat(np.where(after & ~good, idx, -1), start) if len(d) else idx
    held = np.where(last_bad >= 0, last_bad + 1, back)  # no bad row after the dip: its recovery
    ok = dipped & (back < never) & (held < end)
    out["held_recovery_step"] = np.where(ok, step[np.clip(held, 0, max(len(d) - 1, 0))], -1)
    return out
