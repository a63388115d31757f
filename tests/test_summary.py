"""The lines a finished sweep ends with (phasebo.summary)."""

from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from phasebo.execute import Stats
from phasebo.summary import MIN_REFERENCE, finished_lines, reference_notes


def test_the_summary_line_counts_a_models_setup_apart_from_its_compile():
    df = pd.DataFrame({"status": ["ok", "diverged"], "regime": ["benign", "harmful"]})
    pl = SimpleNamespace(n_dev=2, platform="cpu")
    stats = Stats(n_new=2, compile_s=4.0, setup_s=53.1, run_s=1.0)
    (line,) = finished_lines("s", df, stats, pl, Path("out"), 0.5, 60.0)
    assert "compile 4.0 s, setup 53.1 s (one-off, e.g. pretraining), run 1.0 s" in line
    assert "regimes: benign 1, harmful 1" in line and "1 diverged runs" in line
    (line,) = finished_lines("s", df, Stats(n_new=2, compile_s=4.0, setup_s=0.01, run_s=1.0), pl,
                             Path("out"), 0.5, 6.0)
    assert "setup" not in line  # reading a cached backbone back is no setup worth a word


def test_a_clean_reference_that_rests_on_little_is_noted():
    """Runs judged against the mean of fewer than three noise-free runs, or against noise-free
    runs that had not fitted their own labels, are said after the summary line."""
    def table(ref_runs, clean_train):
        return pd.DataFrame({"test_reference": "clean", "noise_ratio": [0.0, 0.2],
                             "status": "ok", "train_acc": [clean_train, 1.0],
                             "train_acc_fit": 1.0, "reference_runs": ref_runs})

    assert reference_notes(table(MIN_REFERENCE, 1.0)) == []
    (few,) = reference_notes(table(1, 1.0))
    assert few.startswith("note: 1 of 1 runs judged against the clean reference have it from "
                          "fewer than 3 noise-free runs")
    (unfit,) = reference_notes(table(MIN_REFERENCE, 0.8))
    assert "1 of 1 noise-free runs had not fitted their own training labels" in unfit
    assert reference_notes(table(1, 1.0).assign(test_reference="absolute")) == []
