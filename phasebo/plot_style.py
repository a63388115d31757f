"""The look shared by phasebo's figures: the backend choice, colours, axis labels, tick labels."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

import matplotlib

# Agg unless a backend was chosen (MPLBACKEND, a notebook's inline backend, pyplot in use).
if "MPLBACKEND" not in os.environ and not ({"matplotlib.pyplot", "ipykernel"} & set(sys.modules)):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as mticker  # noqa: E402
import numpy as np  # noqa: E402

# Okabe & Ito's colour-blind-safe palette: blue / vermillion / yellow stay distinct under every
# common colour-vision deficiency. no_noise (nothing to overfit) is its bluish green, not white:
# a white cell reads as one never run, and a white line (the regime shares) is invisible.
REGIME_COLORS = {"benign": "#0072B2", "harmful": "#D55E00", "not_overfitting": "#F0E442",
                 "fitting": "#CC79A7", "no_noise": "#009E73", "no_baseline": "#E3E3E3",
                 "mixed": "#BBBBBB", "failed": "#303030"}
CORE_REGIMES = ("benign", "harmful", "not_overfitting")  # always in a regime map's key
ROLE_COLORS = {"rel": "#009E73", "weak": "#56B4E9", "weak_opp": "#D55E00", "irr": "#9a9a9a",
               "signal": "#009E73", "noise": "#9a9a9a",  # Magen et al.'s tokens
               "token": "#555555"}  # a model whose tokens have no roles
ROLE_LABELS = {"rel": "relevant", "weak": "weakly relevant", "weak_opp": "weak, opposite class",
               "irr": "irrelevant", "signal": "signal token", "noise": "noise token",
               "token": "token (no roles)"}
LABELS = {
    "signal_norm": "‖μ‖ (signal norm)", "d": "d (dimension)", "n": "n (training samples)",
    "snr": "SNR", "n_snr2": "n·SNR²", "noise_ratio": "noise ratio", "lr": "step size",
    "step": "step", "test_acc": "test accuracy", "train_acc": "train accuracy",
    "test_loss": "test loss", "train_loss": "train loss",
    "frac_noisy_fitted": "fraction of flipped samples fitted (at some step)",
    "noisy_fit_step": "step all flipped samples fitted", "T": "T (tokens)",
    "query_lambda": "λ (memorised noise in the query)", "weight_decay": "weight decay λ",
    "train_acc_clean": "train accuracy, clean samples",
    "train_acc_noisy": "train accuracy, flipped samples", "all_fit_step": "step all samples fitted",
    "mean_noisy_fit_step": "mean step a flipped sample is fitted", "margin": "margin",
    "cls_max_attn": "max CLS attention", "cls_max_attn_noisy": "max CLS attention, flipped",
    "cls_max_attn_clean": "max CLS attention, clean", "p_norm": "‖p‖", "q_norm": "‖q‖",
    "p_align_e1": "cos(p, e₁)", "p_align_e2": "cos(p, e₂)", "diverge_step": "step diverged",
    "first_benign_step": "first benign step", "dip_test_acc": "lowest test accuracy after fit",
    "dip_step": "step of the test-accuracy dip",
    "recovery_step": "first step test accuracy was back (may fall again)",
    "held_recovery_step": "step from which test accuracy stayed back",
    "rho": "ρ (weak-token signal)", "sigma_eps": "σ (noise scale)", "n_test": "test samples",
}
ROLE_WORDS = {"rel": "relevant", "weak": "weak", "weak_opp": "weak opposite", "irr": "irrelevant"}
LOG_AXES = {"d", "n", "snr", "n_snr2", "lr", "n_test", "signal_norm", "weight_decay"}
BOUNDED = ("_acc", "frac_")

Theory = Callable[[np.ndarray], np.ndarray] | Mapping[str, Callable[[np.ndarray], np.ndarray]]


def _label(col: str) -> str:
    """An axis label: the known name of a column, the token role and sample group of a
    ``mass_`` / ``ss_`` / ``cumS_`` column, else the column name in words."""
    if col in LABELS:
        return LABELS[col]
    for pre, what in (("mass_", "attention mass"), ("ss_", "s(1 − s)"), ("cumS_", "cumulative 𝔖")):
        if col.startswith(pre):
            group, _, rest = col[len(pre):].partition("_")
            group = {"clean": "clean", "noisy": "flipped"}.get(group, group)
            return f"{what}, {group} samples, {ROLE_WORDS.get(rest, rest.replace('_', ' '))}"
    return col.replace("_", " ")


def _new(ax, figsize=(6.4, 5.0)):
    if ax is not None:
        return ax.figure, ax
    return plt.subplots(figsize=figsize, layout="constrained")


def _plain_log(axis):
    """Plain numbers (250, 1000, 0.05) instead of powers of ten on a log axis: at 1, 2 and 5
    per decade, or at the decades alone when the data span more than three (their labels
    would crowd: a gradient flow's steps run to 10^6)."""
    lo, hi = sorted(abs(v) for v in axis.get_data_interval())
    # a 0 in the data (a loss that underflowed) spans every decade down to the axis' own limit
    wide = np.isfinite(hi) and (lo <= 0 or hi / lo > 1e3)
    axis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
    axis.set_major_formatter(mticker.FuncFormatter(_num))
    axis.set_minor_formatter(mticker.NullFormatter())


def _num(v, _=None) -> str:
    """A tick label: integers in full (4000, not 4e+03), other values to 3 significant digits;
    a name (a model, an engine) as it is."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
        return str(v)
    if not np.isfinite(v):  # a setting another model of the sweep has: no value here
        return "none" if np.isnan(v) else f"{v}"
    return f"{int(round(v))}" if abs(v - round(v)) < 1e-9 and abs(v) < 1e7 else f"{v:.3g}"


def line_colors(n: int):
    """``n`` line colours: tab10's, or past ten lines an ordered map, so no two lines share one."""
    return plt.get_cmap("tab10").colors if n <= 10 else \
        plt.get_cmap("viridis")(np.linspace(0, 0.95, n))


def _short(col: str) -> str:
    return {"signal_norm": "‖μ‖", "noise_ratio": "r"}.get(col, col)
