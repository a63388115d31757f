"""Which figures a sweep gets: the ``[plot]`` table, checked before anything runs, the default
figures of a sweep and of a results directory, and their file names.

The drawing itself is :mod:`phasebo.plot`'s; this module imports it (and matplotlib) only when it
draws, so that validating a sweep file loads no plotting.

``[plot]`` keys: ``heatmaps`` (a list of ``{x, y, value, where, cmap, vmin, vmax, stat}``),
``lines`` (a list of ``{x, value, hue, where}``), ``formats`` and ``dpi``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from . import analysis as A
from .regimes import REGIMES
from .settings import ConfigError


def _plot():
    from . import plot

    return plot


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

    settings = set(all_settings()) | set(A.DERIVED) | {"seed"}
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
    P = _plot()
    n = df["n"].unique() if "n" in df.columns else []
    sig = df["sigma_eps"].unique() if "sigma_eps" in df.columns else [1.0]
    if (x, y) == ("signal_norm", "d") and len(n) == 1 and len(sig) == 1:
        return P.iso_snr_overlay(n=float(n[0]), sigma_eps=float(sig[0]))
    if (x, y) == ("n", "snr"):
        return P.magen_overlay(x="n")
    if (x, y) == ("snr", "n"):
        return P.magen_overlay(x="snr")
    return None


def _map(df, h: Mapping):
    P = _plot()
    x, y, value = h["x"], h["y"], h.get("value", "regime")
    where = h.get("where")
    theory = default_theory(A.select(df, where), x, y)
    if value == "regime":
        return P.regime_map(df, x, y, theory=theory, where=where)
    return P.value_map(df, value, x, y, theory=theory, where=where, cmap=h.get("cmap"),
                     vmin=h.get("vmin"), vmax=h.get("vmax"), stat=h.get("stat", "mean"))


def sweep_figures(df: pd.DataFrame, spec, out_dir: Path, formats=("png",), dpi=150) -> list[Path]:
    """Draw the figures a sweep asks for (``[plot]``) or the defaults (:func:`wanted_figures`):
    ``heatmap_<value>_<y>_vs_<x>.<format>``, ``line_<value>_vs_<x>.<format>``. A figure whose other
    axes leave several cells per point (and no ``where``) is skipped with a message."""
    P = _plot()
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
        paths += P.save(fig, out_dir / name, formats, dpi)
        if h.get("value", "regime") == "regime":
            paths += _regime_steps_figure(df, h, out_dir, formats, dpi)
    for h in lines:
        try:
            fig, _ = P.line_plot(df, h["x"], h.get("value", "test_acc"), hue=h.get("hue"),
                               where=h.get("where"))
        except ValueError as e:
            print(f"phasebo.plot: skipped line plot {h.get('value')}: {e}", file=sys.stderr)
            continue
        paths += P.save(fig, out_dir / f"line_{h.get('value', 'test_acc')}_vs_{h['x']}", formats,
                      dpi)
    return paths


def _regime_steps_figure(df, h: Mapping, out_dir: Path, formats, dpi) -> list[Path]:
    """With recorded dynamics, the regime map of ``h`` at log-spaced recorded steps."""
    P = _plot()
    dyn_path = Path(out_dir) / "dynamics.parquet"
    if not dyn_path.exists() or "regime" not in pq_columns(dyn_path):
        return []
    dyn = A.load(out_dir, "dynamics")
    if dyn["step"].nunique() < 2:
        return []
    fig, _ = P.regime_maps_over_time(dyn, h["x"], h["y"], where=h.get("where"))
    return P.save(fig, out_dir / f"heatmap_regime_over_steps_{h['y']}_vs_{h['x']}", formats, dpi)


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
    return _maps_or_lines(dyn, axes, out, formats, dpi, step=step)


def _maps_or_lines(df, axes, out: Path, formats, dpi, step=None) -> list[Path]:
    """The maps of :data:`MAP_VALUES` over the two longest ``axes`` (the others at their first
    value), or line plots over the one axis; ``step``: titles and names say the step."""
    P = _plot()
    tag = f"_step{step}" if step is not None else ""
    paths: list[Path] = []

    def saved(fig, ax, name):
        if step is not None:
            ax.set_title(f"{ax.get_title()} — step {step}", fontsize=10)
        return P.save(fig, out / f"{name}{tag}", formats, dpi)

    if len(axes) >= 2:
        x, y = ("signal_norm", "d") if {"signal_norm", "d"} <= set(axes) else (axes[0], axes[1])
        where = {a: df[a].iloc[0] for a in axes if a not in (x, y)} or None
        for v in MAP_VALUES:
            if v != "regime" and v not in df.columns:
                continue
            fig, ax = _map(df, {"x": x, "y": y, "value": v, "where": where})
            paths += saved(fig, ax, f"map_{v}_{y}_vs_{x}")
    elif len(axes) == 1:
        for v in ("test_acc", "train_acc", "test_loss"):
            fig, ax = P.line_plot(df, axes[0], v)
            paths += saved(fig, ax, f"line_{v}_vs_{axes[0]}")
    return paths


def standard_figures(results_dir, out_dir=None, formats=("png",), dpi=150) -> list[Path]:
    """Every standard figure a finished sweep's tables allow, in ``out_dir`` (default
    ``RESULTS_DIR/figures``): maps of :data:`MAP_VALUES` over the two longest axes (line plots for
    one axis), the 𝔖-ratio curves when ``noise_ratio`` is an axis, the Fig. 1 token projections of
    a ``constructed_query`` sweep, and, with recorded dynamics, the regime map at log-spaced
    recorded steps, the attention / 𝔖 / gap dynamics of one representative cell per regime and
    the accuracy dynamics of those cells (of every cell when there are at most six)."""
    P = _plot()
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir / "figures"
    runs = A.load(results_dir)
    axes = sorted(A.cell_axes(runs), key=lambda a: -runs[a].nunique())
    axes = [a for a in axes if a not in ("engine", "model")] or axes
    paths = _maps_or_lines(runs, axes, out, formats, dpi)
    if "noise_ratio" in axes and "cumS_clean_pos" in runs.columns:
        fig, _ = P.s_ratio_curves(runs)
        paths += P.save(fig, out / "s_ratio_curves", formats, dpi)
    smp_path = results_dir / "samples.parquet"
    reps = representative_cells(runs, axes[:2] if len(axes) <= 2 else axes)
    if smp_path.exists() and "sel_e1" in pd.read_parquet(smp_path).columns:  # constructed_query sweeps
        smp = A.load_samples(results_dir)
        for r, w in reps:
            one = A.select(smp, {**w, "seed": 0})
            rr = A.select(runs, {**w, "seed": 0}).iloc[0]
            title = (", ".join(f"{P._short(a)}={P._num(v)}" for a, v in w.items()) + " — " if w
                     else "") + f"train {rr['train_acc']:.2f} / test {rr['test_acc']:.2f} ({r})"
            fig, _ = P.token_projection(one, title=title)
            paths += P.save(fig, out / f"token_projection_{r}", formats, dpi)
    if (results_dir / "dynamics.parquet").exists():
        dyn = A.load_dynamics(results_dir)
        for r, w in reps:
            sub = A.select(dyn, w)
            label = ", ".join(f"{P._short(a)}={P._num(v)}" for a, v in w.items())
            if any(c.startswith("attn_clean_t") for c in sub.columns):
                fig, _ = P.attention_dynamics(sub, title=f"{r}: {label}" if label else r)
                paths += P.save(fig, out / f"attention_{r}", formats, dpi)
            if any(c.startswith("logit_clean_t") for c in sub.columns):
                fig, _ = P.gap_dynamics(sub)
                paths += P.save(fig, out / f"gaps_{r}", formats, dpi)
            if "ss_clean_pos" in sub.columns:
                fig, _ = P.ss_dynamics(sub)
                paths += P.save(fig, out / f"ss_{r}", formats, dpi)
        if len(axes) >= 2 and "regime" in dyn.columns and dyn["step"].nunique() > 1:
            x, y = ("signal_norm", "d") if {"signal_norm", "d"} <= set(axes) else (axes[0],
                                                                                   axes[1])
            where = {a: runs[a].iloc[0] for a in axes if a not in (x, y)} or None
            fig, _ = P.regime_maps_over_time(dyn, x, y, where=where)
            paths += P.save(fig, out / f"map_regime_over_steps_{y}_vs_{x}", formats, dpi)
        keys = [a for a in axes if a in dyn.columns][:3]
        n_cells = len(runs.drop_duplicates(keys)) if keys else 1
        # every cell when there are few (a line per case or per value), else one per regime
        sel = pd.concat([A.select(dyn, w) for _, w in reps]) if keys and n_cells > 6 else dyn
        fig, _ = P.accuracy_dynamics(sel, hue=keys or None)
        paths += P.save(fig, out / "accuracy_dynamics", formats, dpi)
    return paths


