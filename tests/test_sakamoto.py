"""The three reference settings of Sakamoto & Sato (Figs. 3-5) land in their regimes.

Full paper settings (n = 20, T = 8, rho = 0.1, r = 0.2, lr = 5e-3, 1000 steps), 20 seeds each,
n_test = 1000 independent clean samples (projected test set, exact in law). ``engine = "auto"``:
the reduced engine for p only, the exact W+p span engine when W is trained (both checked against
the direct engine in tests/test_engines.py).
"""

import pytest

from phasebo.config import spec_from_dict
from phasebo.sweep import run_sweep

SEEDS = 20


def sweep(tmp_path, name, **settings):
    spec = spec_from_dict(settings, seeds=SEEDS, name=name)
    return run_sweep(spec, tmp_path / name, quiet=True, plots=False)


def test_benign_setting(tmp_path):
    df = sweep(tmp_path, "benign", d=2000, signal_norm=20.0)
    assert len(df) == SEEDS and (df["status"] == "ok").all()
    assert df["test_acc"].mean() >= 0.99
    assert df["train_acc_clean"].min() == 1.0
    # Most seeds fit every flipped label by step 1000 (we measured 16/20); the rest leave one.
    assert (df["regime"] == "benign").mean() >= 0.6
    assert df["train_acc"].mean() >= 0.97
    # token selection: clean samples attend to the relevant token, noisy ones away from it
    assert df["mass_clean_rel"].mean() > 0.9
    assert df["mass_noisy_rel"].mean() < 0.1


def test_harmful_setting(tmp_path):
    df = sweep(tmp_path, "harmful", d=5000, signal_norm=5.0)
    # Measured over root seeds 0-19 (20 seeds each, 400 runs): 4.75 % of runs leave exactly one
    # flipped label, so at most 4 of 20 short fails 0.2 % of root seeds; the 20-seed mean test
    # accuracy spans 0.886-0.895, so the window catches a 1.5-point bias either way.
    assert df["train_acc_clean"].min() == 1.0 and df["train_acc"].min() >= 0.95
    assert df["train_acc"].mean() >= 0.99 and (df["train_acc"] == 1.0).mean() >= 0.8
    assert 0.875 <= df["test_acc"].mean() <= 0.905
    # every run that fits every label is harmful, and no run is benign
    assert ((df["regime"] == "harmful") == (df["train_acc"] == 1.0)).all()
    assert (df["regime"] == "harmful").mean() >= 0.8


@pytest.mark.slow  # W and p at d = 1000 on the paper's grid point (~5 s); the engine is
# checked against direct in float64 in the default suite (test_engines)
@pytest.mark.optimized
def test_not_overfitting_setting_with_W_and_p(tmp_path):
    df = sweep(tmp_path, "notover", d=1000, signal_norm=100.0, train=["p", "W"])
    assert set(df["train"]) == {"p+W"}
    assert df["train_acc"].mean() < 1.0
    assert df["test_acc"].mean() >= 0.99
    assert (df["noisy_fit_step"] == -1).mean() >= 0.9  # (almost) no seed fits every flipped label
    # The paper's last-step label is "not overfitting" (train 0.8, test 1.0). Under the
    # still-fitting rule a part of the seeds are `fitting` at step 1000 (their smallest margin
    # still rising). Measured, 20 seeds: not_overfitting 10, fitting 9, benign 1; train 0.885,
    # test 1.0
    assert df["regime"].isin(["not_overfitting", "fitting"]).mean() >= 0.9, df["regime"].value_counts()
    assert (df["regime"] == "not_overfitting").mean() >= 0.3
    assert set(df["engine"]) == {"gram"}


@pytest.mark.slow
def test_not_overfitting_setting_p_only_fits_by_step_1000(tmp_path):
    """Observed in re-runs (not a paper claim): with p only, the (1000, 100) setting fits all
    noisy samples by step 1000."""
    df = sweep(tmp_path, "notover_p", d=1000, signal_norm=100.0)
    assert df["train_acc"].mean() > 0.95
