"""The ``[plot]`` table of a sweep file, checked before anything runs: its keys, axes, colours,
``where`` slices and line plots that would pool cells (:func:`check_plot_spec`). What it draws is
:mod:`phasebo.report`'s; this module loads no plotting (matplotlib's colormap list aside).

``[plot]`` keys: ``heatmaps`` (a list of ``{x, y, value, where, cmap, vmin, vmax, stat}``),
``lines`` (a list of ``{x, value, hue, where}``), ``formats`` and ``dpi``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np
import pandas as pd

from . import analysis as A
from .results import LABEL_COLUMNS, RUN_COLUMNS
from .settings import ConfigError

HEATMAP_KEYS = ("x", "y", "value", "where", "cmap", "vmin", "vmax", "stat")
LINE_KEYS = ("x", "value", "hue", "where")
PLOT_KEYS = ("heatmaps", "lines", "formats", "dpi")
FIGURE_FORMATS = ("png", "pdf", "svg")


def plot_formats(plot: Mapping, default=("png",)) -> tuple[str, ...]:
    """``[plot] formats`` as a tuple (a list, or one format or a comma list as a string)."""
    f = plot.get("formats", default)
    return tuple(x.strip().lower() for x in f.split(",") if x.strip()) if isinstance(f, str) \
        else tuple(str(x).lower() for x in f)


def _bad_formats(formats) -> bool:
    return not formats or not all(isinstance(x, str) and x.lower() in FIGURE_FORMATS
                                  for x in formats)


def _bad_dpi(d) -> bool:
    return isinstance(d, bool) or not isinstance(d, numbers.Integral) or not 10 <= d <= 2400


def _check_output(plot: Mapping) -> None:
    """``[plot] formats`` and ``dpi``: checked here, not after every run has finished."""
    if "formats" in plot:
        f = plot["formats"]
        if not isinstance(f, str | list) or _bad_formats(plot_formats(plot)):
            raise ConfigError(f"[plot] formats = {f!r}: formats are {', '.join(FIGURE_FORMATS)}; "
                              "fix: e.g. formats = [\"png\", \"pdf\"]")
    if "dpi" in plot and _bad_dpi(plot["dpi"]):
        raise ConfigError(f"[plot] dpi = {plot['dpi']!r} is not a resolution in dots per inch; "
                          "fix: a whole number from 10 to 2400, e.g. dpi = 200")


def check_figure_args(formats, dpi) -> None:
    """The figure formats and resolution a sweep is given (the Python API's ``formats`` and
    ``dpi``; the command line checks its flags), before anything runs: the rules of ``[plot]``."""
    if isinstance(formats, str) or _bad_formats(formats):
        raise ConfigError(f"formats = {formats!r}: a tuple of {', '.join(FIGURE_FORMATS)}; fix: "
                          "e.g. formats=(\"png\", \"pdf\")")
    if _bad_dpi(dpi):
        raise ConfigError(f"dpi = {dpi!r} is not a resolution in dots per inch; fix: a whole "
                          "number from 10 to 2400, e.g. dpi=150")


def check_plot_spec(spec, columns: set[str] | None = None) -> None:
    """Refuse a ``[plot]`` entry that names an unknown key or column before anything runs.

    ``columns``: the columns the sweep's tables will have (the planner passes the traced metric
    names of its first group); without it only the axes are checked."""
    plot = spec.plot
    for k in plot:
        if k not in PLOT_KEYS:
            raise ConfigError(f"[plot] unknown key {k!r}; allowed: {', '.join(PLOT_KEYS)}")
    _check_output(plot)
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
            _check_colours(h, w, h.get("value", "regime" if kind == "heatmaps" else "test_acc"))
            hue = h.get("hue", [])
            if not isinstance(hue, str | list) or not all(isinstance(k, str) for k in hue_of(h)):
                raise ConfigError(f"{w}hue = {hue!r} must be a list of settings; fix: e.g. hue = "
                                  "[\"d\"]")
            for k in hue_of(h):
                if k not in settings:
                    raise ConfigError(f"{w}hue {k!r} is not a setting or derived column; fix: a "
                                      "list of axes of the sweep, e.g. hue = [\"d\"]")
            for k in (h.get("where") or {}) if isinstance(h.get("where"), Mapping) else ():
                if columns is not None and k not in {*settings, *columns, *RUN_COLUMNS,
                                                     *LABEL_COLUMNS}:
                    from .settings import suggest

                    raise ConfigError(f"{w}where {k} is not a setting or column of this sweep"
                                      f"{suggest(k, settings)}; fix: where = {{ an axis = "
                                      "a value }")
            value = h.get("value", "regime" if kind == "heatmaps" else "test_acc")
            if columns is not None and value != "regime" and value not in columns:
                from .settings import suggest

                raise ConfigError(f"{w}value = {value!r} is not a column of this sweep's results"
                                  f"{suggest(value, columns)}; fix: one of regime, "
                                  + ", ".join(sorted(c for c in columns if not c.startswith("_"))
                                              [:12]) + ", ...")


    if plot.get("lines") or plot.get("heatmaps"):  # (the dry run's traced check repeats it)
        _check_cells(spec, plot)


def hue_of(h: Mapping) -> list[str]:
    """A line entry's ``hue`` as a list (one column may be given as a string)."""
    hue = h.get("hue")
    return [hue] if isinstance(hue, str) else list(hue or [])


def cells_table(spec, limit: int = 200_000) -> pd.DataFrame | None:
    """One row per cell of ``spec`` (its settings and swept values, with the derived columns;
    no seeds): the table the line plots will slice, known before anything runs. ``None`` past
    ``limit`` cells."""
    import itertools

    from .results import derived_columns

    swept = spec.swept_axes()
    rows = []
    for cell in spec.cells():
        for combo in itertools.product(*(spec.axes[a] for a in swept)):
            rows.append({k: v if not isinstance(v, list) else tuple(v)
                         for k, v in {**cell.settings, **dict(zip(swept, combo))}.items()})
            if len(rows) > limit:
                return None
    return derived_columns(pd.DataFrame(rows))


def pooled_axes(sel: pd.DataFrame, x: str, hue: list[str], regime: bool) -> list[str]:
    """The axes of ``sel`` (runs or cells) a line plot of ``x`` would pool into each point: for
    the regime shares (``regime``) every other axis not tied to ``x``; with a ``hue``, the axes
    that vary inside its (``x``, hue) cells (:func:`phasebo.analysis.aggregate`'s rule); none for
    the default hue (one line per cell of the other axes)."""
    if regime:
        return A.other_axes(sel, x)
    if not hue:
        return []
    by = [x, *hue]
    inside = [c for c in A.cell_axes(sel) if c not in by]
    if not inside:
        return []
    n_in = sel.groupby(by, dropna=False, observed=True)[inside].nunique(dropna=False).max()
    return [c for c in inside if n_in[c] > 1]


def _check_cells(spec, plot: Mapping) -> None:
    """Refuse, before anything runs, a ``[plot]`` entry whose ``where`` selects no cell (a
    derived value such as ``snr`` no cell has), or a line that would pool cells: one per regime
    (``value = "regime"``) while other axes vary, or a ``hue`` that leaves a varying axis out
    of its lines. Drawn, they could only be skipped once every run had finished. Checked on the
    sweep as its file has it: an axis ``--set`` adds gets its own lines (or files) when drawn,
    and a value ``--set`` leaves out skips its figure then, saying so."""
    filed = getattr(spec, "filed", None) or spec
    table = cells_table(filed)
    if table is None:
        return
    entries = [("heatmaps", i, h) for i, h in enumerate(plot.get("heatmaps", []))] + \
        [("lines", i, h) for i, h in enumerate(plot.get("lines", []))]
    for kind, i, h in entries:
        x, hue, where = h["x"], hue_of(h), h.get("where") or {}
        if not isinstance(where, Mapping) or any(k not in table.columns
                                                 for k in (x, *hue, *where)):
            continue  # seed or a recorded column: the tables' to check
        w = f"[plot] {kind} #{i + 1}: "
        try:  # a derived value (snr) no cell has
            A.select(table, {k: v for k, v in where.items() if k in A.DERIVED})
        except ValueError as e:
            said = str(e).removeprefix("select: ")  # it names the nearest value as the fix
            raise ConfigError(f"{w}where {said}" + ("" if "fix:" in said else
                                                     "; fix: one of those")) from None
        try:
            sel = A.select(table, where)
        except ValueError:  # (config.check_plot_where has said which values the file has)
            continue
        if kind == "heatmaps" or sel.empty or sel[x].nunique(dropna=False) <= 1:
            continue  # a map draws small multiples; a line with x fixed, the axes that vary
        if h.get("value") == "regime" and hue:
            raise ConfigError(f"{w}value = \"regime\" draws one line per regime, so it takes no "
                              f"hue ({', '.join(hue)}); fix: drop hue and fix those axes with "
                              "where")
        others = pooled_axes(sel, x, hue, h.get("value") == "regime")
        if not others:
            continue
        order = list(filed.axes)  # in the file's order of axes
        others = sorted(others, key=lambda a: order.index(a) if a in order else len(order))
        vals = {a: [v.item() if isinstance(v, np.generic) else v for v in pd.unique(sel[a])]
                for a in others}
        said = " and ".join(f"{a} ({', '.join(map(str, v[:4]))}{', ...' if len(v) > 4 else ''})"
                            for a, v in vals.items())
        if x in A.DERIVED:  # equal values of a derived x at several cells of its axes
            raise ConfigError(f"{w}{x} takes the same value at several cells of {said}, so each "
                              f"point would pool them; fix: x = {others[0]!r} with the others "
                              "fixed by where, or a grid whose cells all differ in " + x)
        fix = ", ".join(f"{a} = {v[0]!r}" for a, v in vals.items())
        raise ConfigError(f"{w}{said} also var{'y' if len(others) > 1 else 'ies'}, so each "
                          f"point would pool their values; fix: where = {{ {fix} }}"
                          + ("" if h.get("value") == "regime" else
                             f", or add {' and '.join(map(repr, others))} to hue"))


STATS = ("mean", "se", "min", "max")  # the seed statistics a map can draw (analysis.aggregate)


def _check_colours(h: Mapping, w: str, value: str) -> None:
    """A heatmap entry's ``stat``, ``vmin`` / ``vmax`` and ``cmap``, before anything runs
    (``value``: the entry's, its default filled in)."""
    if value == "regime":
        given = [k for k in ("stat", "vmin", "vmax", "cmap") if k in h]
        if given:
            raise ConfigError(f"{w}{given[0]} = {h[given[0]]!r} has no effect on a regime map "
                              "(its colours are the regimes', each cell its seeds' majority); "
                              f"fix: leave {given[0]} out (it is for a numeric value, e.g. "
                              "value = \"test_acc\")")
    if "stat" in h and h["stat"] not in STATS:
        raise ConfigError(f"{w}stat = {h['stat']!r} is not a seed statistic; fix: one of "
                          + ", ".join(STATS))
    for k in ("vmin", "vmax"):
        if k in h and (isinstance(h[k], bool) or not isinstance(h[k], int | float)
                       or not np.isfinite(h[k])):
            raise ConfigError(f"{w}{k} = {h[k]!r} is not a finite number; fix: e.g. {k} = 0.5")
    if "vmin" in h and "vmax" in h and not h["vmin"] < h["vmax"]:
        raise ConfigError(f"{w}vmin = {h['vmin']!r} is not below vmax = {h['vmax']!r}; fix: "
                          "swap them")
    if "cmap" in h:
        from matplotlib import colormaps

        if not isinstance(h["cmap"], str) or h["cmap"] not in colormaps:
            from .settings import suggest

            raise ConfigError(f"{w}cmap = {h['cmap']!r} is not a matplotlib colormap"
                              f"{suggest(str(h['cmap']), list(colormaps))}; fix: e.g. cmap = "
                              "\"viridis\" (matplotlib's list: matplotlib.colormaps)")
