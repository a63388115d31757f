"""What a finished sweep says on its last lines: how many runs, where the time went (compiling,
the models' one-off setup, running, tables, figures, report), the regimes at the horizon, the
diverged runs, and what the clean references rest on when it is little."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .regimes import TOL


def finished_lines(name: str, df: pd.DataFrame, stats, pl, out_dir: Path, t_write: float,
                   wall: float, report_txt: str = "") -> list[str]:
    """The summary line of sweep ``name`` (its tables ``df``, the executor's ``stats``, its plan
    ``pl``), then its notes on the clean references (:func:`reference_notes`)."""
    n_div = int((df["status"] == "diverged").sum())
    counts = df["regime"].value_counts()
    regimes = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    rate = stats.n_new / stats.run_s if stats.run_s > 0 else 0.0
    rate_txt = (f"{rate:.0f} runs/s" if rate >= 10 else f"{rate:.2g} runs/s") if rate else "-"
    beside = (f" (and {stats.compile_beside_s:.1f} s beside the runs)"
              if stats.compile_beside_s >= 0.05 else "")
    # a model's one-off work before its trace (vit_digits' pretraining): not a compile
    setup = f", setup {stats.setup_s:.1f} s (one-off, e.g. pretraining)" if stats.setup_s >= 0.5 \
        else ""
    line = (f"{name}: {stats.n_new} new runs ({len(df)} in the table); compile "
            f"{stats.compile_s:.1f} s{beside}{setup}, run {stats.run_s:.1f} s ({rate_txt}), tables "
            f"and figures {t_write:.1f} s{report_txt}, {wall:.1f} s in all on {pl.n_dev} "
            f"{pl.platform} device(s); regimes: {regimes}"
            + (" (fitting: still fitting its flipped labels at the horizon)"
               if counts.get("fitting", 0) else "")
            + (f"; {n_div} diverged runs (status = diverged, left out of the maps)"
               if n_div else "") + f"; results in {out_dir}")
    return [line] + [f"{name}: {note}" for note in reference_notes(df)]


MIN_REFERENCE = 3  # noise-free runs below which a clean reference is said to rest on little


def reference_notes(df: pd.DataFrame) -> list[str]:
    """What a results table's clean references rest on, when it is little: runs judged against
    the mean of fewer than :data:`MIN_REFERENCE` noise-free runs, or noise-free runs that had not
    fitted their own labels at the horizon (their test accuracy, and so the reference, is of an
    unfinished run: a noisy run beside it reads benign more easily)."""
    if "reference_runs" not in df.columns or "noise_ratio" not in df.columns:
        return []
    clean = df["test_reference"].astype(str).to_numpy() == "clean"
    noisy = df["noise_ratio"].to_numpy(float) > 0
    judged = df[clean & noisy]
    out = []
    few = judged["reference_runs"].between(1, MIN_REFERENCE - 1)
    if few.any():
        out.append(f"note: {int(few.sum())} of {len(judged)} runs judged against the clean "
                   f"reference have it from fewer than {MIN_REFERENCE} noise-free runs "
                   "(column reference_runs); fix: more seeds")
    base = df[clean & ~noisy & (df["status"].astype(str).to_numpy() == "ok")]
    need = base["train_acc_fit"].to_numpy(float, na_value=1.0) if "train_acc_fit" in base.columns \
        else 1.0  # a table without the setting: its default
    unfit = base["train_acc"].to_numpy(float) < need - TOL
    if unfit.any() and len(judged):
        out.append(f"note: {int(unfit.sum())} of {len(base)} noise-free runs had not fitted "
                   "their own training labels at the horizon (train_acc < train_acc_fit), so "
                   "the clean reference they give is of unfinished runs; fix: more steps")
    return out
