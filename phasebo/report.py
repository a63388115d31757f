"""Which figures a sweep gets: its ``[plot]`` table (checked before anything runs by
:mod:`phasebo.plot_spec`) or the default figures of a sweep and of a results directory, and their
file names.

The drawing itself is :mod:`phasebo.plot`'s; this module imports it (and matplotlib) only when it
draws, so that validating a sweep file loads no plotting.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from . import analysis as A
from .plot_spec import hue_of, plot_formats, pooled_axes
from .regimes import REGIMES


def _plot():
    from . import plot

    return plot


def map_axes(axes) -> tuple[str, str]:
    """The two axes a map draws from varying ``axes`` (longest first): ``signal_norm`` across
    and ``d`` up when both vary, else the first two."""
    return ("signal_norm", "d") if {"signal_norm", "d"} <= set(axes) else (axes[0], axes[1])


def tiles(df: pd.DataFrame, x: str, y: str) -> bool:
    """Whether ``df``'s cells tile an ``(x, y)`` map in every slice of its other axes."""
    P = _plot()
    return P.is_grid(df, x, y) and all(P.is_grid(A.select(df, w), x, y)
                                       for w in P.facet_slices(df, A.other_axes(df, x, y)))


def tiling_axes(df: pd.DataFrame, axes) -> tuple[str, str]:
    """:func:`map_axes`, turned round when only that tiles: a grid refined along ``d`` holds its
    own ``d`` values per ``signal_norm``, so it maps with ``d`` across, a row per ``signal_norm``."""
    x, y = map_axes(axes)
    return (y, x) if not tiles(df, x, y) and tiles(df, y, x) else (x, y)


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


def _map(df, h: Mapping, ax=None):
    P = _plot()
    x, y, value = h["x"], h["y"], h.get("value", "regime")
    where = h.get("where")
    theory = default_theory(A.select(df, where), x, y)
    if value == "regime":
        return P.regime_map(df, x, y, theory=theory, where=where, ax=ax)
    return P.value_map(df, value, x, y, theory=theory, where=where, cmap=h.get("cmap"),
                       vmin=h.get("vmin"), vmax=h.get("vmax"), stat=h.get("stat", "mean"),
                       ax=ax)


def map_figures(df, h: Mapping, name: str, cache: dict | None = None) -> list[tuple[object, str]]:
    """The figures of one map entry ``h`` as ``(fig, file stem)``: one map when only its two
    axes vary (after ``where``); small multiples, one panel per slice of the other varying axes,
    when there are at most :data:`phasebo.plot.MAX_PANELS` slices (``<name>_by_<axes>``); one
    file per slice beyond that (``<name>_<axis><value>...``). ``name`` already names ``where``."""
    P = _plot()
    x, y = h["x"], h["y"]
    where = h.get("where") or {}
    sel = A.select(df, where)
    # the axes that tell the slices apart, each named once (flow_* settings tied to dynamics)
    others = A.untied(sel, A.other_axes(sel, x, y))
    if not others:
        if cache is None:
            return [(_map(df, h)[0], name)]
        # the maps of one (x, y, where) share one aggregate (0.6 s each on 152,100 runs)
        key = (x, y, repr(sorted(where.items())))
        if key not in cache:
            cells = A.aggregate(sel, by=[x, y])
            if not P.is_grid(cells, x, y, "round" in sel.columns):
                P.regime_map(sel, x, y)  # raises the refusal with its reason
            cache[key] = cells
        return [(_map(cache[key], {k: v for k, v in h.items() if k != "where"})[0], name)]
    slices = P.facet_slices(sel, others)
    if not all(P.is_grid(A.select(sel, w), x, y) for w in slices):
        raise ValueError(f"the ({x}, {y}) cells of a slice do not tile a map (a [[cases]] "
                         "sweep?): a map would colour cells that never ran; fix: a line plot or "
                         "the cases figure")
    if len(slices) <= P.MAX_PANELS:
        value = h.get("value", "regime")
        fig, _ = P.facet_maps(sel, x, y, value, facets=others,
                              theory=default_theory(sel, x, y), stat=h.get("stat", "mean"),
                              cmap=h.get("cmap"), vmin=h.get("vmin"), vmax=h.get("vmax"))
        return [(fig, f"{name}_by_{'_'.join(others)}")]
    out = []
    for w in slices:
        fig, ax = _map(df, {**h, "where": {**where, **w}})
        ax.set_title(f"{P.slice_text(w)} — {ax.get_title()}", fontsize=9)
        out.append((fig, f"{name}_{P.slice_tag(w)}"))
    return out


def varying(df: pd.DataFrame, where=None) -> list[str]:
    """The cell axes of ``df`` (after ``where``), longest first, engine and model last."""
    sel = A.select(df, where)
    axes = sorted(A.cell_axes(sel), key=lambda a: -sel[a].nunique())
    return [a for a in axes if a not in ("engine", "model")] or axes


def _retarget(df, h: Mapping, kind: str, i: int, quiet: bool = False) -> tuple[str, Mapping] | None:
    """A ``[plot]`` entry whose axes no longer vary (fixed by ``--set``) draws the axes that do:
    ``(kind, entry)``, said on stderr (a note: not when ``quiet``); ``None`` when nothing
    varies (said all the same: a figure asked for is not drawn)."""
    need = ("x", "y") if kind == "heatmap" else ("x",)
    sel = A.select(df, h.get("where"))
    # fixed: one value in this run (a derived axis such as snr, or model, varies all the same)
    fixed = [h[k] for k in need if h[k] in sel.columns and sel[h[k]].nunique(dropna=False) <= 1]
    if not fixed:
        return kind, h
    was = kind
    axes = varying(df, h.get("where"))
    # the entry's own axis that still varies (snr of a map over (snr, n) with n fixed: a derived
    # column, not a cell axis) is the line's x
    still = [h[k] for k in need if h[k] not in fixed and h[k] in sel.columns]
    fixed = [f"{c} = {sel[c].iloc[0]}" for c in fixed]
    value = h.get("value", "regime" if kind == "heatmap" else "test_acc")
    if len(axes) >= 2 and kind == "heatmap":
        x, y = map_axes(axes)
        new = {**h, "x": x, "y": y}
    elif axes:  # the value against the longest axis left; the regime shares need it alone
        # an axis the entry colours by stays its hue where another is left for x; if not, it
        # becomes x and leaves the hue (one column cannot be both)
        x = next((a for a in (still or axes) if a not in hue_of(h)), (still or axes)[0])
        hue = [c for c in hue_of(h) if c != x]
        shares = value == "regime" and len(axes) == 1 and not hue
        new, kind = {"x": x, "value": value if value != "regime" or shares else "test_acc",
                     "where": h.get("where"), **({"hue": hue} if hue else {})}, "line"
    else:
        within = " within its where (" + ", ".join(f"{k} = {v}" for k, v in h["where"].items()) \
            + ")" if h.get("where") else ""
        print(f"phasebo.plot: [plot] {kind} #{i + 1} ({value}): {', '.join(fixed)} is the only "
              f"value in this sweep and no other axis varies{within}; nothing to draw",
              file=sys.stderr)
        return None
    what = f"{new['y']} vs {new['x']}" if kind == "heatmap" else \
        f"as the regime shares against {new['x']}" if new["value"] == "regime" else \
        f"as {new['value']} against {new['x']}"
    if not quiet:
        print(f"phasebo.plot: [plot] {was} #{i + 1} ({value}): {', '.join(fixed)} is the only "
              f"value in this sweep (fixed in the file or by --set), so it is drawn {what}",
              file=sys.stderr)
    return kind, new


def plot_notes(spec) -> None:
    """The notes the run will print for ``[plot]`` entries whose axes take one value (drawn over
    the axes that vary instead), said by the dry run from the sweep's cells before anything
    runs."""
    from .plot_spec import cells_table

    if not (spec.plot.get("heatmaps") or spec.plot.get("lines")):
        return  # the default figures draw axes that vary, by construction
    heat, lines = wanted_figures(spec)
    table = cells_table(spec)
    if table is None:
        return
    # the swept axes in the file's order, as the results table has them (ties of map_axes)
    first = [a for a in spec.axes if a in table.columns]
    table = table[first + [c for c in table.columns if c not in first]]
    for i, (kind, h) in enumerate([("heatmap", h) for h in heat] + [("line", h) for h in lines]):
        try:
            _retarget(table, h, kind, i if kind == "heatmap" else i - len(heat))
        except (ValueError, KeyError):  # a where the cells lack: the run says it, skipping
            continue


def _stem(kind: str, h: Mapping, used: set) -> str:
    """A figure's file stem, naming its value, axes, ``where`` slice and non-default ``stat``;
    a second entry that would reuse a stem gets ``_2``, ``_3`` (never overwritten)."""
    P = _plot()
    value = h.get("value", "regime" if kind == "heatmap" else "test_acc")
    stem = (f"heatmap_{value}_{h['y']}_vs_{h['x']}" if kind == "heatmap"
            else f"line_{value}_vs_{h['x']}")
    if h.get("stat", "mean") != "mean":
        stem += f"_{h['stat']}"
    if h.get("where"):
        stem += f"_{P.slice_tag(h['where'])}"
    return _unique(stem, used)


def _unique(name: str, used: set) -> str:
    """``name``, or ``name_2``, ``name_3``... if taken; recorded in ``used``."""
    base, k = name, 2
    while name in used:
        name, k = f"{base}_{k}", k + 1
    used.add(name)
    return name


def sweep_figures(df: pd.DataFrame, spec, out_dir: Path, formats=("png",), dpi=150,
                  quiet: bool = False) -> list[Path]:
    """Draw the figures a sweep asks for (``[plot]``) or the defaults (:func:`wanted_figures`):
    ``heatmap_<value>_<y>_vs_<x>[_<stat>][_<where slice>]`` and ``line_<value>_vs_<x>...``. A map
    whose other axes vary becomes small multiples (or one file per slice,
    :func:`map_figures`); an entry whose axes were fixed by ``--set`` draws the axes that vary;
    the cells of a ``[[cases]]`` sweep get :func:`phasebo.plot.cases_figure`, never a map.
    ``quiet``: without the notes (a figure skipped is still said)."""
    P = _plot()
    out_dir = Path(out_dir)
    formats = plot_formats(spec.plot, formats)
    dpi = int(spec.plot.get("dpi", dpi))
    heat, lines = wanted_figures(spec)
    paths, used, cache = [], set(), {}
    if spec.cases and not heat and not lines and len(df) > 0:
        try:
            fig, _ = P.cases_figure(df)
            paths += P.save(fig, out_dir / "cases", formats, dpi)
        except ValueError as e:
            print(f"phasebo.plot: skipped the cases figure: {e}", file=sys.stderr)
    todo = [("heatmap", h) for h in heat] + [("line", h) for h in lines]
    for i, (kind, h) in enumerate(todo):
        try:
            got = _retarget(df, h, kind, i if kind == "heatmap" else i - len(heat), quiet)
        except ValueError as e:  # its where names a value --set left out: said, not fatal
            print(f"phasebo.plot: skipped [plot] {kind} #{i + 1}: {e}", file=sys.stderr)
            continue
        if got is None:
            continue
        kind, h = got
        value = h.get("value", "regime" if kind == "heatmap" else "test_acc")
        stem = _stem(kind, h, used)
        try:
            if kind == "heatmap":
                figs = map_figures(df, h, stem, cache)
            else:
                figs = _line_figures(df, h, value, stem, i - len(heat), quiet)
        except ValueError as e:
            print(f"phasebo.plot: skipped {kind} {value}: {e}", file=sys.stderr)
            continue
        for fig, name in figs:  # a slice's file never replaces another's
            paths += P.save(fig, out_dir / (name if name == stem else _unique(name, used)),
                            formats, dpi)
        if kind == "heatmap" and value == "regime":
            paths += _regime_steps_figure(df, h, out_dir, formats, dpi)
    return paths


def _line_figures(df, h: Mapping, value: str, stem: str, i: int, quiet: bool) -> list:
    """A ``[plot]`` line as ``[(figure, name)]``. An axis that ``--set`` turned into one, which
    the file's line would pool into each point, gets lines of its own (added to the hue), or,
    for the regime shares, a file per value (``<stem>_<axis><value>``), said unless ``quiet``."""
    P = _plot()
    x, hue, where = h["x"], hue_of(h), h.get("where") or None
    sel = A.select(df, where)
    extra = [] if x in A.DERIVED else pooled_axes(sel, x, hue, value == "regime")
    if not extra:
        return [(P.line_plot(df, x, value, hue=hue or None, where=where)[0], stem)]
    if not quiet:
        print(f"phasebo.plot: [plot] line #{i + 1} ({value}): {', '.join(extra)} also var"
              f"{'y' if len(extra) > 1 else 'ies'} in this sweep (turned into an axis by --set), "
              + ("so each value gets a figure of its own" if value == "regime" else
                 "so each value gets lines of its own"), file=sys.stderr)
    if value != "regime":
        return [(P.line_plot(df, x, value, hue=[*hue, *extra], where=where)[0], stem)]
    return [(P.line_plot(df, x, value, where={**(where or {}), **w})[0],
             f"{stem}_{P.slice_tag(w)}") for w in P.facet_slices(sel, extra)]


def _regime_steps_figure(df, h: Mapping, out_dir: Path, formats, dpi) -> list[Path]:
    """With recorded dynamics, the regime map of ``h`` at log-spaced recorded steps."""
    P = _plot()
    dyn_path = Path(out_dir) / "dynamics.parquet"
    if not dyn_path.exists() or "regime" not in pq_columns(dyn_path):
        return []
    dyn = A.load(out_dir, "dynamics")
    if dyn["step"].nunique() < 2:
        return []
    where = h.get("where") or {}
    sel = A.select(dyn, where)
    others = A.untied(sel, A.other_axes(sel, h["x"], h["y"], "step"))
    tag = f"_{P.slice_tag(where)}" if where else ""
    paths = []
    for w in P.facet_slices(A.select(dyn, where), others):
        fig, _ = P.regime_maps_over_time(dyn, h["x"], h["y"], where={**where, **w})
        if w:
            fig.suptitle(f"{P.slice_text(w)} — {fig._suptitle.get_text()}", fontsize=10)
        stem = f"heatmap_regime_over_steps_{h['y']}_vs_{h['x']}{tag}" + (
            f"_{P.slice_tag(w)}" if w else "")
        paths += P.save(fig, out_dir / stem, formats, dpi)
    return paths


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
            # numbers or words; a setting only some runs have (a flow's solver beside limit
            # runs) is NaN for the others, which rank as the middle (no pull either way)
            vals = pd.Index(cells[a].dropna().unique()).sort_values()
            pos = vals.get_indexer(sub[a]).astype(float)
            pos[pos < 0] = (len(vals) - 1) / 2
            ranks += np.abs(pos / max(len(vals) - 1, 1) - 0.5)
        row = sub.iloc[int(np.argmin(ranks))]
        out.append((r, {a: row[a] for a in axes}))
    return out


def _recorded(dyn: pd.DataFrame, where: dict) -> bool:
    """Whether the dynamics table holds rows of the cell ``where`` (values it lacks: none)."""
    try:
        return not A.select(dyn, {k: v for k, v in where.items() if k in dyn.columns}).empty
    except ValueError:
        return False


def step_figures(results_dir, step, out_dir=None, formats=("png",), dpi=150) -> list[Path]:
    """The maps (or line plots) of a sweep at one recorded step: the regime and the recorded
    metrics of :data:`MAP_VALUES` from ``dynamics.parquet`` (``step``: an int or ``"last"``),
    named ``..._step<S>`` (``_steplast`` only when the runs' last recorded steps differ)."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir / "figures"
    dyn = A.at_step(A.load(results_dir, "dynamics"), step)
    if step == "last" and dyn["step"].nunique() == 1:  # one horizon: name the step itself
        step = int(dyn["step"].iloc[0])
    axes = sorted(A.cell_axes(dyn), key=lambda a: -dyn[a].nunique())
    axes = [a for a in axes if a not in ("engine", "model")] or axes
    return _maps_or_lines(dyn, axes, out, formats, dpi, step=step)


def _maps_or_lines(df, axes, out: Path, formats, dpi, step=None) -> list[Path]:
    """The maps of :data:`MAP_VALUES` over the two longest ``axes`` (small multiples over the
    others, :func:`map_figures`), the cases figure when the cells do not tile a map (a
    ``[[cases]]`` sweep), or line plots over the one axis; ``step``: titles and names say the
    step."""
    P = _plot()
    tag = f"_step{step}" if step is not None else ""
    paths: list[Path] = []

    def saved(fig, name):
        if step is not None:  # unless the settings line already says it ("step S of N")
            sup = getattr(fig, "_suptitle", None)
            if sup is not None and f"step {step} of" not in sup.get_text():
                sup.set_text(f"{sup.get_text()} — step {step}")
            elif sup is None and f"step {step} of" not in fig.axes[0].get_title():
                ax = fig.axes[0]
                ax.set_title(f"{ax.get_title()} — step {step}", fontsize=10)
        return P.save(fig, out / f"{name}{tag}", formats, dpi)

    if len(axes) >= 2:
        x, y = tiling_axes(df, axes)
        if (x, y) != map_axes(axes):
            print(f"phasebo.plot: the ({y}, {x}) cells tile a map only with {x} across (a grid "
                  f"refined along {x}): maps drawn that way round", file=sys.stderr)
        elif not tiles(df, x, y):
            metrics = [m for m in ("train_acc", "test_acc", "frac_noisy_fitted")
                       if m in df.columns]
            try:
                return saved(P.cases_figure(df, metrics, cases=axes)[0], "cases")
            except ValueError as e:
                print(f"phasebo.plot: skipped the cases figure: {e}", file=sys.stderr)
                return []
        for v in MAP_VALUES:
            if v != "regime" and v not in df.columns:
                continue
            for fig, name in map_figures(df, {"x": x, "y": y, "value": v}, f"map_{v}_{y}_vs_{x}"):
                paths += saved(fig, name)
    elif len(axes) == 1:
        for v in ("test_acc", "train_acc", "test_loss"):
            fig, ax = P.line_plot(df, axes[0], v)
            paths += saved(fig, f"line_{v}_vs_{axes[0]}")
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
    # the cells: the axes every run has, and the model when it tells cells apart too (a
    # [[cases]] sweep of two models, whose own settings are NaN for the other)
    keys = [a for a in axes if runs[a].notna().all()]
    if "model" in A.cell_axes(runs) and "model" not in keys:
        keys.append("model")
    n_cells = len(runs.drop_duplicates(keys)) if keys else 1
    if 1 < n_cells <= 6:  # few cells (a [[cases]] sweep): every one, never one per regime
        cells = A.aggregate(runs, by=keys, metrics=["test_acc"])
        reps = [(f"{c['regime']}_{P.slice_tag(w)}", str(c["regime"]), w)
                for _, c in cells.iterrows() for w in [{a: c[a] for a in keys}]]
    else:
        reps = [(r, r, w) for r, w in
                representative_cells(runs, axes[:2] if len(axes) <= 2 else axes)]
    if smp_path.exists() and "sel_e1" in pd.read_parquet(smp_path).columns:  # constructed_query sweeps
        smp = A.load_samples(results_dir)
        for name, r, w in reps:
            one = A.select(smp, {**w, "seed": 0})
            if one["sel_e1"].isna().all():  # a cell of another model of the sweep
                continue
            rr = A.select(runs, {**w, "seed": 0}).iloc[0]
            title = (", ".join(f"{P._short(a)}={P._num(v)}" for a, v in w.items()) + " — " if w
                     else "") + f"train {rr['train_acc']:.2f} / test {rr['test_acc']:.2f} ({r})"
            fig, _ = P.token_projection(one, title=title)
            paths += P.save(fig, out / f"token_projection_{name}", formats, dpi)
    if (results_dir / "dynamics.parquet").exists():
        dyn = A.load_dynamics(results_dir)
        # the cells with recorded dynamics (the converged limit beside a flow records none)
        reps = [rep for rep in reps if _recorded(dyn, rep[2])]
        for name, r, w in reps:
            sub = A.select(dyn, w)
            label = ", ".join(f"{P._short(a)}={P._num(v)}" for a, v in w.items())
            if any(c.startswith("attn_clean_t") for c in sub.columns):
                fig, _ = P.attention_dynamics(sub, title=f"{r}: {label}" if label else r)
                paths += P.save(fig, out / f"attention_{name}", formats, dpi)
            if any(c.startswith("logit_clean_t") for c in sub.columns):
                fig, _ = P.gap_dynamics(sub)
                paths += P.save(fig, out / f"gaps_{name}", formats, dpi)
            if "ss_clean_pos" in sub.columns:
                fig, _ = P.ss_dynamics(sub, title=f"{r}: {label}" if label else r)
                paths += P.save(fig, out / f"ss_{name}", formats, dpi)
        if len(axes) >= 2 and "regime" in pq_columns(results_dir / "dynamics.parquet") \
                and dyn["step"].nunique() > 1:
            x, y = tiling_axes(runs, axes)
            slices = P.facet_slices(runs, A.untied(runs, A.other_axes(runs, x, y)))
            if tiles(runs, x, y):
                for w in (w for w in slices if _recorded(dyn, w)):
                    fig, _ = P.regime_maps_over_time(dyn, x, y, where=w or None)
                    if w:
                        fig.suptitle(f"{P.slice_text(w)} — {fig._suptitle.get_text()}",
                                     fontsize=10)
                    paths += P.save(fig, out / (f"map_regime_over_steps_{y}_vs_{x}" + (
                        f"_{P.slice_tag(w)}" if w else "")), formats, dpi)
        keys = [a for a in axes if a in dyn.columns]
        # every cell when there are few (a line per case or per value), else one per regime
        sel = pd.concat([A.select(dyn, w) for *_, w in reps]) if keys and n_cells > 6 and reps \
            else dyn
        if n_cells > 6:  # a line per chosen cell: every axis that tells them apart names it
            keys = [k for k in keys if sel[k].nunique(dropna=False) > 1] or keys[:1]
        try:  # cells told apart by no axis it names (two models alone) would be averaged
            fig, _ = P.accuracy_dynamics(sel, hue=keys or None)
            paths += P.save(fig, out / "accuracy_dynamics", formats, dpi)
        except ValueError as e:
            print(f"phasebo.plot: skipped the accuracy dynamics figure: {e}", file=sys.stderr)
    return paths


if __name__ == "__main__":  # python -m phasebo.report: the command of the same name
    from .cli import guarded, main

    sys.exit(guarded(main, ["report", *sys.argv[1:]]))
