"""Figures from results tables: regime maps and continuous heatmaps over two axes.

Functions return ``(fig, ax)`` and never call ``plt.show()``; the Agg backend is used when no
display is configured.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402

from .results import REGIMES  # noqa: E402

REGIME_COLORS = {"benign": "#4c9f70", "harmful": "#d1495b", "not_overfitting": "#edae49"}
LOG_AXES = {"d", "n", "snr", "n_snr2", "lr", "n_test"}


def _edges(vals: np.ndarray, log: bool) -> np.ndarray:
    """Cell edges around sorted centres (geometric midpoints on a log axis)."""
    v = np.log(vals) if log else vals.astype(float)
    if len(v) == 1:
        e = np.array([v[0] - 0.5, v[0] + 0.5]) if not log else np.array([v[0] - 0.1, v[0] + 0.1])
    else:
        mid = (v[1:] + v[:-1]) / 2
        e = np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]])
    return np.exp(e) if log else e


def _is_log(df: pd.DataFrame, col: str) -> bool:
    vals = np.unique(df[col].to_numpy(float))
    if col in LOG_AXES and len(vals) > 2 and (vals > 0).all():
        return vals.max() / vals.min() >= 20
    return False


def grid(df: pd.DataFrame, x: str, y: str, value: str, agg="mean") -> pd.DataFrame:
    """Pivot ``value`` over (y rows, x columns), aggregated over seeds and any other axis;
    rows and columns increasing, missing cells NaN. Runs whose status is not ok are left out."""
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    return ok.pivot_table(index=y, columns=x, values=value, aggfunc=agg).sort_index().sort_index(
        axis=1)


def regime_fractions(df: pd.DataFrame, x: str, y: str) -> dict[str, pd.DataFrame]:
    ok = df[df["status"] == "ok"]
    out = {}
    for r in REGIMES:
        out[r] = (ok.assign(_hit=(ok["regime"] == r).astype(float))
                  .pivot_table(index=y, columns=x, values="_hit", aggfunc="mean")
                  .sort_index().sort_index(axis=1))
    return out


def regime_map(df: pd.DataFrame, x: str = "signal_norm", y: str = "d", ax=None, theory=None):
    """Discrete regime map: each cell coloured by the regime of the majority of its seeds.

    ``theory``: optional callable ``x_values -> y_values`` drawn over the map.
    """
    fr = regime_fractions(df, x, y)
    stack = np.stack([fr[r].to_numpy() for r in REGIMES])  # (3, ny, nx)
    empty = np.all(np.isnan(stack), axis=0)
    code = np.where(empty, np.nan, np.argmax(np.nan_to_num(stack, nan=-1), axis=0))
    xs, ys = fr[REGIMES[0]].columns.to_numpy(float), fr[REGIMES[0]].index.to_numpy(float)
    logx, logy = _is_log(df, x), _is_log(df, y)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.4, 5))
    cmap = ListedColormap([REGIME_COLORS[r] for r in REGIMES])
    norm = BoundaryNorm([-0.5, 0.5, 1.5, 2.5], cmap.N)
    mesh = ax.pcolormesh(_edges(xs, logx), _edges(ys, logy), np.ma.masked_invalid(code),
                         cmap=cmap, norm=norm)
    cb = fig.colorbar(mesh, ax=ax, ticks=[0, 1, 2])
    cb.ax.set_yticklabels([r.replace("_", " ") for r in REGIMES])
    _axes(ax, x, y, logx, logy)
    if theory is not None:
        xx = np.linspace(xs.min(), xs.max(), 200) if not logx else np.geomspace(xs.min(),
                                                                                 xs.max(), 200)
        ax.plot(xx, theory(xx), "k--", lw=1.5, label="theory")
        ax.set_ylim(_edges(ys, logy)[[0, -1]])
        ax.legend(loc="best", fontsize=8)
    seeds = int(df.groupby([x, y]).size().max()) if len(df) else 0
    ax.set_title(f"regime (majority of {seeds} seeds per cell)")
    return fig, ax


def value_map(df: pd.DataFrame, value: str, x: str = "signal_norm", y: str = "d", ax=None,
              cmap="viridis", vmin=None, vmax=None):
    """Continuous heatmap of the seed-mean of ``value`` over two axes."""
    g = grid(df, x, y, value)
    xs, ys = g.columns.to_numpy(float), g.index.to_numpy(float)
    logx, logy = _is_log(df, x), _is_log(df, y)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.4, 5))
    mesh = ax.pcolormesh(_edges(xs, logx), _edges(ys, logy), np.ma.masked_invalid(g.to_numpy()),
                         cmap=cmap, vmin=vmin, vmax=vmax)
    fig.colorbar(mesh, ax=ax, label=value.replace("_", " "))
    _axes(ax, x, y, logx, logy)
    seeds = int(df.groupby([x, y]).size().max()) if len(df) else 0
    ax.set_title(f"{value.replace('_', ' ')} (mean of {seeds} seeds)")
    return fig, ax


def _axes(ax, x, y, logx, logy):
    labels = {"signal_norm": "‖μ‖ (signal norm)", "d": "d (dimension)", "n": "n (samples)",
              "snr": "SNR", "noise_ratio": "noise ratio", "lr": "step size"}
    ax.set_xlabel(labels.get(x, x))
    ax.set_ylabel(labels.get(y, y))
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")


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


def sweep_figures(df: pd.DataFrame, spec, out_dir: Path) -> list[Path]:
    """Draw the heatmaps a sweep asks for (``[plot] heatmaps``) or the default pair."""
    out_dir = Path(out_dir)
    wanted = list(spec.plot.get("heatmaps", []))
    if not wanted:
        ax = default_heatmap_axes(spec)
        if ax is None:
            return []
        wanted = [{"x": ax[0], "y": ax[1], "value": v}
                  for v in ("regime", "test_acc", "train_acc", "test_loss")]
    paths = []
    for h in wanted:
        x, y, value = h["x"], h["y"], h.get("value", "regime")
        if value == "regime":
            fig, _ = regime_map(df, x, y)
        else:
            lim = (0, 1) if value.endswith("_acc") else (None, None)
            fig, _ = value_map(df, value, x, y, vmin=lim[0], vmax=lim[1])
        p = out_dir / f"heatmap_{value}_{y}_vs_{x}.png"
        fig.savefig(p, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)
    return paths
