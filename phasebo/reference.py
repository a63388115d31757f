"""The reference figures in ``results/reference/``: rebuilt by ``phasebo reference``.

- ``s3_regime_map.png`` / ``s3_regime_map_official.png``: Sakamoto & Sato's (d, ‖μ‖) phase
  diagram on the paper's 39 x 39 grid, prompt attention with **p trained, W = I** (the theory's
  model; reduced engine) and with **W and p trained, W uniform at step 0** (the official code's
  model, which made the paper's figure; exact W+p span engine), with the iso-SNR curves through
  the paper's three reference settings;
- ``s3_test_loss.png``: the p-only map's seed-mean test loss;
- ``s2_attention_dynamics.png`` / ``s2_accuracy_dynamics.png``: the three reference settings'
  softmax probability per token and accuracy/loss vs step.

This is the one module that runs sweeps to draw figures (the sweep driver never imports it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import analysis as A
from . import theory as TH
from .config import load_sweep, spec_from_dict
from .plot import (
    _seed_text,
    accuracy_dynamics,
    attention_dynamics,
    plt,
    regime_map,
    save,
    value_map,
)
from .report import default_theory
from .sweep import run_sweep

REFERENCE_DIR = Path("results/reference")
REFERENCE_RUNS = Path("results/reference-runs")
S2 = {"n": 20, "T": 8, "rho": 0.1, "noise_ratio": 0.2, "lr": 5e-3, "steps": 1000, "n_test": 1000}


def reference_specs(seeds: int = 2, official_seeds: int = 1, root: Path = Path(".")):
    """``(s3 p only, s3 W and p, [s2 settings])``: the sweeps behind the reference figures."""
    s3 = load_sweep(root / "sweeps" / "sakamoto_heatmap.toml", seeds=seeds)
    s3w = load_sweep(root / "sweeps" / "sakamoto_heatmap_official.toml", seeds=official_seeds)
    s2 = [spec_from_dict({**S2, "d": p["d"], "signal_norm": p["signal_norm"], "record_every": 10,
                          "record_log": 30}, {}, seeds=4, name=f"ref_s2_{name}")
          for name, p in TH.S2_POINTS.items()]
    return s3, s3w, s2


def make_reference(out_dir: Path = REFERENCE_DIR, runs_dir: Path = REFERENCE_RUNS,
                   quiet: bool = False, seeds: int = 2, official_seeds: int = 1) -> list[Path]:
    """Run the reference sweeps (resuming finished ones) and draw the reference PNGs."""
    s3, s3w, s2 = reference_specs(seeds, official_seeds)
    out_dir, runs_dir = Path(out_dir), Path(runs_dir)
    paths = []
    for spec, name, what in ((s3, "s3_regime_map", "p trained, W = I (theory)"),
                             (s3w, "s3_regime_map_official", "W and p trained (official code)")):
        df = run_sweep(spec, runs_dir / spec.name, quiet=quiet, plots=False, overwrite=True)
        fig, ax = regime_map(df, theory=default_theory(df, "signal_norm", "d"))
        # three short lines: a map's title is as wide as the map, and one long line ran off it
        ax.set_title(f"prompt attention, {what}\nn = 20, r = 0.2, 1000 GD steps; regime "
                     f"({_seed_text(A.aggregate(df, by=['d', 'signal_norm']))})", fontsize=10)
        paths += save(fig, out_dir / name, dpi=90)
        if spec is s3:
            fig, ax = value_map(df, "test_loss", theory=default_theory(df, "signal_norm", "d"))
            paths += save(fig, out_dir / "s3_test_loss", dpi=90)
    dirs = []
    for s in s2:
        run_sweep(s, runs_dir / s.name, quiet=quiet, plots=False, overwrite=True)
        dirs.append(runs_dir / s.name)
    dyn = A.load_dynamics(dirs)
    res = A.load(dirs)
    fig, axes = plt.subplots(3, 2, figsize=(9.5, 9.0), sharex=True, sharey=True,
                             layout="constrained")
    for row, (name, p) in zip(axes, TH.S2_POINTS.items()):
        w = {"d": p["d"], "signal_norm": p["signal_norm"]}
        r = A.aggregate(A.select(res, w), by=[])
        tr, te, k = r["train_acc_mean"].iloc[0], r["test_acc_mean"].iloc[0], r["n_seeds"].iloc[0]
        attention_dynamics(dyn, where={**w, "seed": 0}, axes=row)
        row[0].set_ylabel(f"{name.replace('_', ' ')}: d={p['d']}, ‖μ‖={p['signal_norm']:g}\n"
                          f"final train {tr:.2f} / test {te:.3f} ({k} seeds)\nsoftmax probability",
                          fontsize=9)
    for ax in axes[:-1].ravel():
        ax.set_xlabel("")
    fig.suptitle("the three reference settings: softmax probability per token (seed 0), n = 20, "
                 "r = 0.2, lr 5e-3", fontsize=11)
    paths += save(fig, out_dir / "s2_attention_dynamics", dpi=80)
    fig, _ = accuracy_dynamics(dyn, hue=["d", "signal_norm"])
    paths += save(fig, out_dir / "s2_accuracy_dynamics", dpi=90)
    return paths


if __name__ == "__main__":  # python -m phasebo.reference: the command line's module runs it
    from .cli import guarded
    from .cli.reference import main

    sys.exit(guarded(main))
