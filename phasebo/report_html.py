"""``report.html``: one self-contained, interactive page per sweep (plotly, its JavaScript inlined,
so it opens offline from ``file://`` and can be e-mailed).

What it shows, all computed from the sweep's tables:

- the regime map over the two longest axes, one panel per slice of the other axes (a slice menu
  past :data:`MAX_PANELS`); cells never run stay empty;
- hovering a cell: its coordinates, majority regime, every regime's fraction with its Wilson 95 %
  interval, the accuracies' and losses' means ± SE over seeds, the seeds (and failed runs), and
  the settings every run shares;
- a slider over the recorded steps when the sweep recorded its dynamics with regimes: the map
  (and the hover numbers) at each recorded step; the last position is the horizon;
- clicking a cell: its runs' train and test accuracy against the step (up to
  :data:`MAX_RUN_LINES` runs drawn, the count stated) and the mean attention mass per token role
  for clean and flipped samples;
- the boundaries benign / harmful and benign / not overfitting along the map's x axis per
  y value (:func:`phasebo.boundaries`, 95 % seed-bootstrap intervals) at the horizon;
- a ``[[cases]]`` sweep (cells that do not tile a map): a table of its cases instead of a map,
  each row clickable for its dynamics;
- the sweep as resolved (the file with its ``--set`` overrides), the provenance and timings.
"""

from __future__ import annotations

import html
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from . import analysis as A
from .plot_grid import facet_slices, is_grid, settings_text, slice_text
from .plot_style import REGIME_COLORS, ROLE_LABELS, _label, _num
from .regimes import REGIMES
from .report import pq_columns, tiling_axes

MAX_PANELS = 12  # more slices than this: a menu picks the panel
MAX_RUN_LINES = 10  # runs drawn per clicked cell
METRICS = ("test_acc", "train_acc", "train_acc_noisy", "test_loss", "train_loss",
           "frac_noisy_fitted")
ROLES = ("rel", "weak", "weak_opp", "irr")
PAIRS = (("benign", "harmful"), ("benign", "not_overfitting"))
CATS = (*REGIMES, "mixed", "failed")


def _r(v, digits: int = 4):
    """A JSON number to ``digits`` significant digits; ``None`` for NaN and infinities."""
    if v is None:
        return None
    v = float(v)
    if not math.isfinite(v):
        return None
    return float(f"{v:.{digits}g}")


MAX_FRAMES = 30  # slider positions at most: log-spaced recorded steps, the horizon last
MAX_POINTS = 200  # points per drawn run trajectory at most (log-spaced)


def _axes(runs: pd.DataFrame) -> list[str]:
    """The cell axes, longest first, ``model`` and ``engine`` last (a sweep of several models
    keeps them: they tell its cells apart)."""
    return sorted(A.cell_axes(runs), key=lambda a: (a in ("engine", "model"),
                                                     -runs[a].nunique(dropna=False)))


def _values(col: pd.Series) -> list:
    """A column's distinct values as keys: numbers in increasing order, then strings; a
    missing value (a setting another model has) is ``"none"``."""
    keys = {_key(v) for v in col.unique()}
    return sorted(k for k in keys if not isinstance(k, str)) + sorted(
        k for k in keys if isinstance(k, str))


def _log_axis(a: str | None, vals: list) -> bool:
    """Whether boundary positions interpolate in log: the map's own scale rule
    (:func:`phasebo.plot_grid._auto_log`) on a positive numeric axis."""
    from .plot_grid import _auto_log

    num = [v for v in vals if not isinstance(v, str)]
    return bool(a and num and len(num) == len(vals) and min(num) > 0
                and _auto_log(a, np.asarray(num, float)))


def _thin(steps: np.ndarray, k: int) -> np.ndarray:
    """Indices of at most ``k`` of sorted ``steps``, about log-spaced, the first and last kept."""
    if len(steps) <= k:
        return np.arange(len(steps))
    want = np.geomspace(1, len(steps), k) - 1
    return np.unique(np.concatenate([[0], np.round(want).astype(int), [len(steps) - 1]]))


def _frame(cells: pd.DataFrame, keys: list[str], index: dict, metrics: list[str]) -> dict:
    """One slider position: per cell (in ``index`` order) the regime code and hover numbers."""
    n = len(index)
    out = {"code": [None] * n, "n_seeds": [None] * n, "n_failed": [None] * n}
    for m in metrics:
        out[f"{m}_mean"], out[f"{m}_se"] = [None] * n, [None] * n
    for r in REGIMES:
        out[f"frac_{r}"], out[f"frac_{r}_lo"], out[f"frac_{r}_hi"] = [None] * n, [None] * n, \
            [None] * n
    cols = {c: cells[c].to_numpy() for c in out if c in cells.columns}
    reg = cells["regime"].astype(str).to_numpy()
    key_vals = [cells[k].to_numpy() for k in keys]
    for i in range(len(cells)):
        j = index.get(tuple(_key(v[i]) for v in key_vals))
        if j is None:
            continue
        out["code"][j] = CATS.index(reg[i]) if reg[i] in CATS else None
        for c, v in cols.items():
            if c != "code":
                out[c][j] = _r(v[i]) if not c.startswith("n_") else int(v[i])
    return out


def _key(v):
    """A cell coordinate as JSON: a number (rounded), ``"true"`` / ``"false"``, a string, or
    ``"none"`` for a missing value."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, float, np.number)):
        v = float(v)
        return round(v, 12) if math.isfinite(v) else "none"
    return "none" if v is None or v is pd.NA else str(v)


def _cell_dynamics(dyn: pd.DataFrame, keys: list[str], index: dict) -> dict:
    """Per cell: its runs' train / test accuracy by recorded step (up to MAX_RUN_LINES runs) and
    the mean attention mass per token role, clean and flipped. Plain arrays throughout: a pandas
    operation per cell copies the table's metadata, which cost seconds on a small sweep."""
    out: dict = {}
    mass = [c for c in (f"mass_{g}_{r}" for g in ("clean", "noisy") for r in ROLES)
            if c in dyn.columns]
    accs = [c for c in ("train_acc", "test_acc") if c in dyn.columns]
    run = pd.factorize(pd.MultiIndex.from_frame(dyn[[c for c in ("source", "run_id")
                                                     if c in dyn.columns]].astype(str)))[0]
    plain = pd.DataFrame({**{k: [_key(v) for v in dyn[k].to_numpy()] for k in keys},
                          "_run": run, "_all": 0, "step": dyn["step"].to_numpy(np.int64)})
    order = np.lexsort((plain["step"].to_numpy(), run))
    arr = {c: dyn[c].to_numpy()[order] for c in [*accs, *mass, "seed"] if c in dyn.columns}
    steps, runs_of = plain["step"].to_numpy()[order], run[order]
    plain = plain.iloc[order].reset_index(drop=True)
    for key, idx in plain.groupby(keys or ["_all"], sort=True, observed=True).indices.items():
        key = (key if isinstance(key, tuple) else (key,)) if keys else ()
        j = index.get(tuple(key))
        if j is None:
            continue
        r_ids = pd.unique(runs_of[idx])
        lines = []
        for rid in r_ids[:MAX_RUN_LINES]:
            sel = idx[runs_of[idx] == rid]
            sel = sel[_thin(steps[sel], MAX_POINTS)]
            lines.append({"seed": int(arr["seed"][sel[0]]) if "seed" in arr else None,
                          "step": steps[sel].tolist(),
                          **{a: [_r(v) for v in arr[a][sel]] for a in accs}})
        u, inv = np.unique(steps[idx], return_inverse=True)
        means = {}
        for c in mass:  # over the runs with a finite value (a diverged run does not blank it)
            v = arr[c][idx].astype(float)
            ok = np.isfinite(v)
            cnt = np.bincount(inv[ok], minlength=len(u))
            tot = np.bincount(inv[ok], weights=v[ok], minlength=len(u))
            with np.errstate(invalid="ignore", divide="ignore"):
                means[c[5:]] = [_r(x) for x in tot / cnt]
        keep = _thin(u, MAX_POINTS)
        u, means = u[keep], {c: [m[i] for i in keep] for c, m in means.items()}
        out[str(j)] = {"runs": lines, "n_runs": len(r_ids), "mass_step": u.tolist(),
                       "mass": means}
    return out


# slices whose runs hold both regimes but whose boundary is not placed, and why
UNPLACED = {"unbounded": "its interval is not bounded by the runs: more seeds",
            "outside_range": "the fit crosses outside the sampled range",
            "too_few": "too few runs"}


def _boundaries(runs: pd.DataFrame, x: str, y: str | None, facets: list[str]) -> list[dict]:
    """The benign / harmful and benign / not-overfitting boundaries along ``x`` per ``y`` (and
    facet slice) at the horizon, found ones only (status ok, unresolved or separated), and one
    line per pair on the slices with both regimes that were not placed (the page says so)."""
    from .boundaries import boundaries

    if runs[x].nunique() < 3 or not pd.api.types.is_numeric_dtype(runs[x]):
        return [], []
    if y is None:  # a sweep of one axis: the whole sweep is its one slice
        y, runs = "_whole", runs.assign(_whole=0)
    out, left = [], []
    for a, b in PAIRS:
        have = set(runs["regime"].astype(str))
        if a not in have or b not in have:
            continue
        try:
            with warnings.catch_warnings():  # a regime only failed runs have: no boundary, quietly
                warnings.filterwarnings("ignore", "boundaries: no run is")
                t = boundaries(runs, x, y, (a, b), by=facets)  # as `phasebo boundaries` gives it
        except ValueError:
            continue
        found = np.isfinite(t["boundary"].to_numpy(float)) & \
            t["status"].astype(str).isin(("ok", "unresolved", "separated"))
        both = (t["n_a"] > 0) & (t["n_b"] > 0)  # a noise-free row holds neither: no boundary
        missed = t.loc[~found & both & t["status"].astype(str).isin(UNPLACED), "status"].astype(str)
        if len(missed):
            left.append(f"{a} / {b.replace('_', ' ')}: " + ", ".join(
                f"{k} slice{'s' if k > 1 else ''} {s} ({UNPLACED[s]})"
                for s, k in missed.value_counts().items()))
        t = t[found]
        for _, r in t.iterrows():
            out.append({"between": f"{a} / {b}", "y": None if y == "_whole" else _key(r[y]),
                        "slice": {f: _key(r[f]) for f in facets},
                        # a lower end at or below 0 on a positive axis is no bound
                        "boundary": _r(r["boundary"]),
                        "lo": _r(r["lo"]) if r["lo"] > 0 or runs[x].min() <= 0 else None,
                        "hi": _r(r["hi"]),
                        "status": str(r["status"]), "n_seeds": int(r["n_seeds"]),
                        "n_other": int(r["n_other"])})  # runs of neither: left apart
    return out, left


def _manifest(results_dir: Path) -> dict:
    """The directory's ``manifest.json``; a refined directory (its rounds in ``round-*/``, no
    manifest of its own) shows round 0's sweep with the refinement and its rounds' log."""
    path = results_dir / "manifest.json"
    if path.exists():
        return json.loads(path.read_text())
    refine, first = results_dir / "refine.json", results_dir / "round-0" / "manifest.json"
    if not refine.exists():
        return {}
    base = json.loads(first.read_text()) if first.exists() else {}
    # a refine.json of an earlier version may hold NaN, which the page's strict JSON cannot
    log = json.loads(refine.read_text(), parse_constant=lambda _: None)
    # the counts and timings of round 0 are round 0's, said so; the rounds' log has the rest
    spec, history = base.pop("spec", None), base.pop("history", [])
    rounds = log.get("rounds", []) if isinstance(log, dict) else []
    total = rounds[-1].get("total_runs") if rounds and isinstance(rounds[-1], dict) else None
    return {"name": results_dir.name, "spec": spec, "history": history,
            **({"n_runs": total} if total is not None else {}), "refine": log,
            "round 0 (the sweep file's grid)": base}


def report_data(results_dir, notes: bool = True) -> dict:
    """Everything the page shows, as JSON-ready data (see the module docstring); ``notes``: as
    :func:`phasebo.analysis.load`'s."""
    results_dir = Path(results_dir)
    runs = A.load(results_dir, notes=notes)
    manifest = _manifest(results_dir)
    axes = _axes(runs)
    if len(axes) >= 2:
        x, y = tiling_axes(runs, axes)  # a grid refined along d: d across
    else:
        x, y = (axes[0] if axes else None), None
    mode = "map" if x is not None and (y is None or is_grid(runs, x, y)) else "cases"
    if mode == "map":  # a facet per slice of the axes not tied to x or y
        facets = [a for a in A.other_axes(runs, x, y) if a in axes]
        facets = [a for a in facets if a not in ("engine", "model")] + [
            a for a in facets if a in ("engine", "model")]
        keys = [a for a in (x, y) if a] + facets
        slices = facet_slices(runs, facets)
        if not all(is_grid(A.select(runs, w), x, y) for w in slices if y is not None):
            mode = "cases"
    if mode == "cases":
        x, y, facets, slices = None, None, [], [{}]
        keys = axes
    metrics = [m for m in METRICS if m in runs.columns]
    final = A.aggregate(runs, by=keys or None, metrics=metrics)
    cells = final[keys].drop_duplicates() if keys else pd.DataFrame(index=[0])
    index = {tuple(_key(r[k]) for k in keys): i for i, (_, r) in enumerate(cells.iterrows())}
    coords = [{k: _key(r[k]) for k in keys} for _, r in cells.iterrows()]
    frames = []
    dyn_path = results_dir / "dynamics.parquet"
    dyn = A.load(results_dir, "dynamics", notes=notes) if dyn_path.exists() else None
    horizon = int(runs["steps"].max()) if "steps" in runs.columns and \
        runs["steps"].nunique() == 1 else None
    # a regime at each recorded step only when the dynamics file has one (loading joins the
    # final regime onto every step otherwise, which would replay the horizon)
    if dyn is not None and "regime" in pq_columns(dyn_path) and dyn["step"].nunique() > 1:
        dm = [m for m in metrics if m in dyn.columns]
        steps = np.unique(dyn["step"].to_numpy(np.int64))
        steps = steps[steps < horizon] if horizon is not None else steps[:-1]
        steps = steps[_thin(steps, MAX_FRAMES - 1)] if len(steps) else steps
        agg = A.aggregate(A.at_step(dyn, steps.tolist()), by=keys or None, metrics=dm) \
            if len(steps) else None
        tau = A.flow_times(dyn)  # a flow's steps count lr: say its time too
        for s_ in steps:
            frames.append({"label": f"step {int(s_)}" + ("" if tau is None else
                                                        f" (τ {_num(tau[s_])})"),
                           "step": int(s_), **_frame(agg[agg["step"] == s_], keys, index, dm)})
    limit = "dynamics" in runs.columns and (runs["dynamics"].astype(str) == "limit").all()
    end = runs["flow_time"].iloc[0] if "flow_time" in runs.columns and "dynamics" in runs.columns \
        and (runs["dynamics"].astype(str) == "flow").all() and runs["flow_time"].nunique() == 1 \
        else None  # a flow's horizon in flow time
    last = "the converged limit" if limit else \
        f"step {horizon} ({'' if end is None else f'τ {_num(end)}, '}horizon)" if horizon is not None \
        else "horizon"
    frames.append({"label": last, "step": horizon, **_frame(final, keys, index, metrics)})
    xs = _values(runs[x]) if x else []
    ys = _values(runs[y]) if y else []
    t0 = time.perf_counter()
    bnd, left = _boundaries(runs, x, y, facets) if mode == "map" else ([], [])
    k = final["n_seeds"]
    return {
        "name": manifest.get("name", results_dir.name), "mode": mode, "x": x, "y": y,
        "xs": [_key(v) for v in xs], "ys": [_key(v) for v in ys], "facets": facets,
        "slices": [{f: _key(v) for f, v in w.items()} for w in slices],
        "slice_text": [slice_text(w) for w in slices], "max_panels": MAX_PANELS,
        "keys": keys, "coords": coords, "frames": frames, "metrics": metrics,
        "labels": {c: _label(c) for c in [*keys, *metrics]},
        "cats": list(CATS), "regimes": list(REGIMES), "colors": [REGIME_COLORS[c] for c in CATS],
        "settings": settings_text(runs, skip=keys), "n_runs": len(runs),
        "seeds": f"{int(k.min())}" + ("" if k.min() == k.max() else f"–{int(k.max())}"),
        "log": {a: _log_axis(a, v) for a, v in ((x, xs), (y, ys)) if a},
        "boundaries": bnd, "boundaries_left": left,
        "boundaries_s": round(time.perf_counter() - t0, 3),
        "dynamics": _cell_dynamics(dyn, keys, index) if dyn is not None else {},
        "spec": manifest.get("spec"),
        "provenance": {k: v for k, v in manifest.items() if k not in ("spec", "history")},
        "history": manifest.get("history", []),
        "role_labels": ROLE_LABELS,
    }


def write_report(results_dir, out: str | Path | None = None, notes: bool = True
                 ) -> tuple[Path, float]:
    """Write ``report.html`` (default ``RESULTS_DIR/report.html``); returns its path and the
    seconds it took. ``notes``: as :func:`phasebo.analysis.load`'s (a sweep writing its own
    report has said them)."""
    from plotly.offline import get_plotlyjs

    t = time.perf_counter()
    results_dir = Path(results_dir)
    out = Path(out) if out is not None else results_dir / "report.html"
    data = report_data(results_dir, notes=notes)
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    page = (_TEMPLATE.replace("%TITLE%", html.escape(f"phasebo report: {data['name']}"))
            .replace("%PLOTLY%", get_plotlyjs()).replace("%DATA%", payload)
            .replace("%SCRIPT%", (Path(__file__).parent / "report.js").read_text()))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out, time.perf_counter() - t


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%TITLE%</title>
<style>
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:18px;color:#222;
max-width:1400px}
h1{font-size:20px;margin:0 0 4px} .sub{color:#555;font-size:13px;margin-bottom:10px}
#controls{display:flex;gap:18px;align-items:center;margin:8px 0;font-size:14px}
#panels{display:flex;flex-wrap:wrap;gap:6px} .panel{width:440px;height:400px}
#dyn{display:flex;flex-wrap:wrap;gap:6px;margin-top:8px} .dynplot{width:560px;height:340px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ccc;padding:3px 8px}
tr.case{cursor:pointer} tr.case:hover{background:#eef}
pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto;max-height:300px}
.note{color:#555;font-size:12px}
.swatch{display:inline-block;width:12px;height:12px;margin:0 3px 0 10px;border:1px solid #999;
vertical-align:middle}
</style>
<script>%PLOTLY%</script>
</head><body>
<h1 id="title"></h1><div class="sub" id="subtitle"></div>
<div id="controls"></div><div id="key" class="note"></div>
<div id="panels"></div>
<div class="note" id="hint"></div>
<div id="dyn"></div>
<h2 style="font-size:16px">Boundaries at the horizon</h2><div id="bounds" class="note"></div>
<h2 style="font-size:16px">Sweep, provenance and timings</h2>
<pre id="spec"></pre><pre id="prov"></pre>
<script type="application/json" id="data">%DATA%</script>
<script>%SCRIPT%</script>
</body></html>
"""
