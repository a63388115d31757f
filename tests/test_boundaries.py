"""Boundary estimation, power-law fits and adaptive refinement.

The estimator is checked on synthetic tables with a planted boundary (a logistic model whose
boundary follows a known power law), where the truth is known; refinement is checked on a real
small sweep."""

from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

import phasebo as pb
from phasebo import config as C
from phasebo.boundaries import boundaries, bounded
from phasebo.refine import parse_refine
from phasebo.scaling import fit_power_law, summary
from phasebo.settings import ConfigError

DS = (250, 500, 1000, 2000, 4000, 8000)


def planted(rng, alpha=0.5, prefactor=2.0, sharp=3.0, seeds=20, xs=None):
    """Runs whose regime is harmful with probability sigmoid(sharp * log(x / x*)), x* = 2 d^½."""
    xs = np.geomspace(5, 500, 14) if xs is None else xs
    d, s, x = np.meshgrid(DS, np.arange(seeds), xs, indexing="ij")
    d, s, x = d.ravel(), s.ravel(), x.ravel()
    p = 1 / (1 + np.exp(-sharp * (np.log(x) - np.log(prefactor * d**alpha))))
    reg = np.where(rng.random(len(d)) < p, "harmful", "benign")
    return pd.DataFrame({"d": d, "seed": s, "signal_norm": x, "regime": reg, "status": "ok"})


def test_planted_boundary_intervals_cover_the_truth_and_are_tight():
    """At 20 seeds x 14 x-values per slice, over 100 repetitions of the planted table (6 slices
    each), the 95 % intervals of the boundary and of the exponent cover the truth in >= 90 % of
    them, the boundary intervals in at most 98 % (measured at this seed: 554 of 600 boundary
    intervals, 92.3 %, and 95 of 100 exponent intervals), and they are tight: the median width
    of a boundary interval is below 0.40 of the true boundary and 95 % of them below 0.55
    (measured 0.311 and 0.41), the median width of the exponent interval below 0.15 (measured
    0.110). Coverage alone passes any interval that is too wide: intervals widened fivefold about
    the estimate cover 100 % and have a median width of 1.56 of the boundary (checked by
    wrapping ``boundaries``); widened 1.5-fold, 0.47 and 98.8 %; each fails here."""
    rng = np.random.default_rng(0)
    hits = exp_hits = total = 0
    widths, exp_widths = [], []
    R = 100
    for r in range(R):
        b = boundaries(planted(rng), "signal_norm", "d", ("benign", "harmful"), n_boot=200, seed=r)
        assert (b["status"].astype(str) == "ok").all()
        truth = 2.0 * b["d"] ** 0.5
        hits += int(((b["lo"] <= truth) & (truth <= b["hi"])).sum())
        total += len(b)
        widths += ((b["hi"] - b["lo"]) / truth).tolist()
        f = fit_power_law(b, "d")
        exp_hits += f["lo"] <= 0.5 <= f["hi"]
        exp_widths.append(f["hi"] - f["lo"])
    assert total == R * len(DS)
    assert 0.90 <= hits / total <= 0.98
    assert exp_hits / R >= 0.90
    assert np.median(widths) < 0.40 and np.quantile(widths, 0.95) < 0.55
    assert np.median(exp_widths) < 0.15


def test_boundary_estimate_is_accurate_with_many_seeds():
    """At 200 seeds the estimates lie within 5 % of the planted boundary and the intervals have
    narrowed about as 1 / sqrt(seeds): every one is below 0.13 of the boundary (measured 0.083 ..
    0.101, against a median of 0.31 at 20 seeds)."""
    b = boundaries(planted(np.random.default_rng(1), seeds=200), "signal_norm", "d", n_boot=100)
    truth = 2.0 * b["d"] ** 0.5
    rel = b["boundary"] / truth - 1
    assert np.abs(rel).max() < 0.05
    width = (b["hi"] - b["lo"]) / truth
    assert (width > 0).all() and width.max() < 0.13
    f = fit_power_law(b, "d")
    assert abs(f["exponent"] - 0.5) < 0.03 and abs(f["prefactor"] / 2.0 - 1) < 0.15


def test_power_law_fit_is_exact_on_exact_points():
    b = pd.DataFrame({"n": [25, 50, 100, 400], "boundary": 0.8 * np.array([25, 50, 100, 400.])
                      ** -0.5})
    f = fit_power_law(b, "n")
    assert f["exponent"] == pytest.approx(-0.5, abs=1e-12)
    assert f["prefactor"] == pytest.approx(0.8, rel=1e-12)
    fixed = fit_power_law(b, "n", exponent=-0.5)
    assert fixed["prefactor"] == pytest.approx(0.8, rel=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        fit_power_law(b.iloc[:1], "n")


def test_statuses_separated_and_one_sided_slices():
    rows = []
    for s in range(5):
        for x in (1.0, 2.0, 4.0, 8.0):
            rows.append({"d": 1, "seed": s, "m": x, "regime": "benign" if x < 3 else "harmful"})
            rows.append({"d": 2, "seed": s, "m": x, "regime": "benign"})
            rows.append({"d": 3, "seed": s, "m": x, "regime": "not_overfitting"})
    b = boundaries(pd.DataFrame(rows), "m", "d").set_index("d")
    assert b.loc[1, "status"] == "separated"
    # the data only say "between 2 and 4": the interval is that whole gap and no more (every
    # bootstrap replicate is separated the same way), the estimate its geometric middle
    assert b.loc[1, "lo"] == pytest.approx(2.0, rel=1e-9)
    assert b.loc[1, "hi"] == pytest.approx(4.0, rel=1e-9)
    assert b.loc[1, "boundary"] == pytest.approx(2 * np.sqrt(2.0), rel=1e-6)
    assert b.loc[2, "status"] == "all_A" and np.isnan(b.loc[2, "boundary"])
    assert b.loc[3, "status"] == "too_few" and b.loc[3, "n_other"] == 20


def test_outside_range_and_custom_regime_names():
    rng = np.random.default_rng(2)
    x = np.repeat(np.geomspace(1, 10, 6), 30)
    # P(hot) = sigmoid(log(x / 100)): the crossing is far right of the sampled range
    lab = np.where(rng.random(len(x)) < 1 / (1 + 100 / x), "hot", "cold")
    df = pd.DataFrame({"d": 1, "seed": np.tile(np.arange(30), 6), "u": x, "phase": lab})
    b = boundaries(df, "u", "d", between=("cold", "hot"), regime="phase")
    assert b["status"].iloc[0] in ("outside_range", "all_A")
    assert np.isnan(b["boundary"].iloc[0])


def test_varying_setting_inside_a_slice_is_refused():
    df = planted(np.random.default_rng(3), seeds=4)
    df["n"] = np.where(df["seed"] % 2 == 0, 20, 40)
    with pytest.raises(ValueError, match="n varies inside the slices"):
        boundaries(df, "signal_norm", "d")
    assert len(boundaries(df, "signal_norm", "d", by=["n"])) == 2 * len(DS)
    assert len(boundaries(df, "signal_norm", "d", over=["n"])) == len(DS)


def test_settings_that_follow_one_varying_setting_are_named_behind_it_with_one_fix():
    """Flow and limit runs in one table: the dynamics brings its own settings (lr, steps, ...);
    the refusal names the dynamics and its one --by, the others as following it."""
    df = planted(np.random.default_rng(3), seeds=4)
    flow = df["seed"] % 2 == 0
    df["dynamics"] = np.where(flow, "flow", "limit")
    df["lr"] = np.where(flow, 0.025, np.nan)
    df["flow_time"] = np.where(flow, 1e4, np.nan)
    with pytest.raises(ValueError, match=r"dynamics varies inside the slices of d \(and with it "
                       r"lr, flow_time\).*fix: add dynamics to by \(--by dynamics\)"):
        boundaries(df, "signal_norm", "d")
    assert len(boundaries(df, "signal_norm", "d", by=["dynamics"])) == 2 * len(DS)
    df["n"] = np.where(df["seed"] < 2, 20, 40)  # not set by the dynamics: every name, as before
    with pytest.raises(ValueError, match="vary inside the slices of d: a boundary fit"):
        boundaries(df, "signal_norm", "d")


def test_contradictory_axes_are_refused():
    """Pooling the boundary's own axis, or a boundary along an axis with one value: refused, not
    a table of empty slices."""
    df = planted(np.random.default_rng(3), seeds=4)
    for over, role in ((["signal_norm"], "x"), (["d"], "y")):
        with pytest.raises(ValueError, match=f"over names '{over[0]}', the boundary's {role}"):
            boundaries(df, "signal_norm", "d", over=over)
    df["noise_ratio"] = 0.2
    with pytest.raises(ValueError, match=r"x = 'noise_ratio' takes one value in these runs "
                                         r"\(0.2\).*varies \(d, signal_norm\)"):
        boundaries(df, "noise_ratio", "d", over=["signal_norm"])
    with pytest.raises(ValueError, match="between = 'benign': give two different regime names"):
        boundaries(df, "signal_norm", "d", between=("benign",))


def test_public_api_and_summary_names_theory():
    assert pb.boundaries is boundaries and pb.fit_power_law is fit_power_law
    b = boundaries(planted(np.random.default_rng(4)), "signal_norm", "d", n_boot=100)
    text = summary(b, "signal_norm", "d")
    assert "exponent +0.5" in text and "power law" in text


def small_spec(**kw):
    # harmful at ||mu|| = 4, benign at 16 and above (the p-only map's lower edge), reduced engine
    settings = dict(model="prompt_attention", train=["p"], n=20, T=8, rho=0.1,
                    noise_ratio=0.2, lr=5e-3, steps=1000, n_test=300)
    return C.spec_from_dict(settings, {"signal_norm": [2.0, 8.0, 32.0], "d": [1500, 4000]},
                            seeds=6, name="refine_small", **kw)


def test_refine_block_is_validated():
    spec = small_spec()
    r = parse_refine(spec, {"between": ["benign", "harmful"], "rounds": 2})
    assert (r.x, r.y) == ("signal_norm", "d")
    with pytest.raises(ConfigError, match="tol is not a refinement key"):
        parse_refine(spec, {"tol": 1})
    with pytest.raises(ConfigError, match="x = 'n' must be an axis"):
        parse_refine(spec, {"x": "n"})
    with pytest.raises(ConfigError, match="between"):
        parse_refine(spec, {"between": ["benign"]})
    # a misspelt regime is refused here, before any run (not after the first round)
    with pytest.raises(ConfigError, match="'not_overfiting' is not a regime .*did you mean"):
        parse_refine(spec, {"between": "not_overfiting,benign"})
    # a value of the wrong kind is one line with a fix, not a traceback nor a silent truncation
    for k, v in (("rounds", "three"), ("rounds", 2.5), ("target", "tight"), ("x", 3),
                 ("rounds", True)):
        with pytest.raises(ConfigError, match=f"{k} = .* is not .*; fix: e.g. {k} = "):
            parse_refine(spec, {k: v})
    assert parse_refine(spec, {"target": 1}).target == 1.0


def test_refinement_adds_points_between_disagreeing_neighbours_and_resumes(tmp_path):
    spec = small_spec()
    r = parse_refine(spec, {"between": ["harmful", "benign"], "rounds": 2,
                            "target": 0.01, "max_points": 1})
    # the plain sweep first, in the same directory (the README's order): the refinement's table
    # of every round then sits beside the plain sweep's manifest, and is read as it is
    plain = pb.run_sweep(spec, tmp_path / "ref", quiet=True, plots=False)
    part = sorted((tmp_path / "ref" / "parts").glob("results-*.parquet"))[0]
    mtime = part.stat().st_mtime_ns
    runs, b = pb.refine_sweep(spec, r, tmp_path / "ref", quiet=True)
    # the plain sweep's runs became round 0, moved, not run again; none of its tables is left
    # beside the refinement's (its manifest and samples would describe other runs)
    moved = tmp_path / "ref" / "round-0" / "parts" / part.name
    assert moved.stat().st_mtime_ns == mtime
    assert not (tmp_path / "ref" / "parts").exists()
    assert not (tmp_path / "ref" / "manifest.json").exists()
    assert not (tmp_path / "ref" / "samples.parquet").exists()
    pd.testing.assert_frame_equal(
        runs[runs["round"] == 0].drop(columns="round").reset_index(drop=True),
        plain.reset_index(drop=True), check_like=True, check_dtype=False, check_categorical=False)
    assert runs["run_id"].is_unique
    assert set(runs["round"]) >= {0, 1}
    # the power law through the refined boundaries is saved beside them (it was printed only)
    fit = pd.read_csv(tmp_path / "ref" / "boundaries_fit.csv")
    assert len(fit) == 1 and fit["n_slices"].iloc[0] == len(b) and "status" in fit
    first = runs[runs["round"] == 0]
    assert len(first) == spec.n_runs
    later = runs[runs["round"] > 0]
    assert len(later) > 0
    # round 0 brackets the boundary in every slice by (2, 8): all harmful at 2, all benign at 8
    for x, reg in ((2.0, "harmful"), (8.0, "benign")):
        assert (first.loc[first["signal_norm"] == x, "regime"].astype(str) == reg).all()
    new_x = set(later["signal_norm"]) - set(first["signal_norm"])
    assert new_x
    # every new point bisects (geometric midpoint: a log axis) the gap between two neighbouring
    # x values of its slice sampled in the rounds before it whose regimes disagree (more benign
    # above): so every one lies strictly inside the bracket (2, 8)
    for rnd in sorted(set(later["round"])):
        before, now = runs[runs["round"] < rnd], runs[runs["round"] == rnd]
        for d, g in now.groupby("d"):
            prev = before[before["d"] == d]
            xs = np.unique(prev["signal_norm"])
            for x in set(g["signal_norm"]) - set(xs):
                assert 2.0 < x < 8.0, (rnd, d, x)
                i = int(np.searchsorted(xs, x))
                lo, hi = xs[i - 1], xs[i]
                assert x == pytest.approx(np.sqrt(lo * hi), rel=1e-9), (rnd, d, x, lo, hi)

                def benign(v, prev=prev):
                    return (prev.loc[prev["signal_norm"] == v, "regime"].astype(str)
                            == "benign").mean()

                assert benign(lo) < benign(hi), (rnd, d, x, lo, hi)
    assert (tmp_path / "ref" / "boundaries.csv").exists()
    assert (tmp_path / "ref" / "boundary_harmful_benign.png").exists()
    again = pb.load(tmp_path / "ref")
    assert len(again) == len(runs) and "round" in again.columns
    # the same command again plans the same rounds and runs nothing new
    runs2, _ = pb.refine_sweep(spec, r, tmp_path / "ref", quiet=True)
    assert len(runs2) == len(runs) and set(runs2["run_id"]) == set(runs["run_id"])


def test_a_flat_slice_is_outside_range_without_a_warning():
    """harmful only at the middle x, in every seed: the fitted slope is exactly 0 and the estimate
    infinite; the row says outside_range (and, the suite turning warnings into errors, nothing
    warns)."""
    rows = [{"d": 1, "x": x, "seed": s, "regime": "harmful" if x == 10 else "benign"}
            for x in (1.0, 10.0, 100.0) for s in range(2)]
    b = boundaries(pd.DataFrame(rows), "x", "d", ("benign", "harmful"), n_boot=100, seed=0)
    assert b["status"].tolist() == ["outside_range"] and np.isnan(b["boundary"].iloc[0])


def test_the_power_law_reads_the_points_intervals_at_their_level():
    """The same points with intervals at 90 % and at 95 % (each its level's width) give one fit:
    the interval level travels with the table (ci_level)."""
    ds = np.array([100.0, 300.0, 1000.0, 3000.0])
    bx = 2.0 * ds ** 0.5 * np.array([1.0, 1.08, 0.95, 1.03])
    half = 0.1  # the log-sd of each point
    fits = []
    for level in (0.90, 0.95):
        z = NormalDist().inv_cdf(0.5 + level / 2)
        b = pd.DataFrame({"d": ds, "boundary": bx, "lo": bx * np.exp(-z * half),
                          "hi": bx * np.exp(z * half), "status": "ok", "ci_level": level})
        fits.append(fit_power_law(b, "d"))
    for k in ("exponent", "lo", "hi", "chi2_dof"):
        assert fits[0][k] == pytest.approx(fits[1][k], rel=1e-9), k


def test_pooling_runs_at_the_same_point_gives_the_run_by_run_fit():
    """A slice of 2000 runs at 10 x values fits as 20 pooled binomial points; the same slice with
    every run's u nudged apart by 1e-13 (no two runs pooled) gives the same bootstrap fits."""
    from phasebo.boundaries import _fit

    rng = np.random.default_rng(3)
    u = np.repeat(np.linspace(-1.5, 1.5, 10), 200)
    yb = (rng.random(u.size) < 1 / (1 + np.exp(-3 * u))).astype(float)
    w = np.vstack([np.ones(u.size), rng.poisson(1.0, size=(30, u.size))]).astype(float)
    pooled = _fit(u, yb, w)
    apart = _fit(u + 1e-13 * np.arange(u.size), yb, w)
    for a, b in zip(pooled, apart):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8)


def test_a_boundary_its_seeds_cannot_bound_is_unresolved():
    """Three seeds, seven runs with no clear order: the estimate lies inside the sampled range but
    the bootstrap interval is not bounded (a replicate of seed 1 alone has no benign run and
    places no boundary: +inf); such a slice is not placed (``unbounded``,
    not ``ok``), so a summary never counts it as a placed boundary, and refining it adds seeds
    beside its estimate (a finer grid would not bound it)."""
    df = pd.DataFrame({"d": 1, "seed": [0, 0, 1, 2, 2, 2, 2],
                       "m": [200.0, 400.0, 1600.0, 100.0, 200.0, 800.0, 1600.0],
                       "regime": ["benign", "harmful", "harmful", "harmful", "harmful", "benign",
                                  "benign"]})
    r = boundaries(df, "m", "d").iloc[0]
    assert 100 <= r["boundary"] <= 1600 and r["hi"] == np.inf
    assert r["status"] == "unbounded"
    from phasebo.refine import Refinement, plan_round

    cases, _ = plan_round(df, Refinement(between=("benign", "harmful"), x="m", y="d"), 1000, 1,
                          False, 1)
    assert cases and {c["m"] for c in cases} == {400.0, 800.0}, cases  # beside the estimate
    assert all("root_seed" in c for c in cases)  # new seeds, not new x values


def test_a_stray_run_far_away_does_not_place_the_boundary_inside_a_pure_gap():
    """Four seeds: harmful at SNR 0.0158, benign at 0.0281, and one harmful run far above at
    0.158. The two values around the boundary say only "somewhere between them"; the stray run
    tilts the fit, which without the rule was "ok" with an estimate at one end of its interval:
    the slice is unresolved and its interval holds the whole gap."""
    xs = [0.0158] * 4 + [0.0281] * 4 + [0.158] * 4
    reg = ["harmful"] * 4 + ["benign"] * 4 + ["benign"] * 3 + ["harmful"]
    df = pd.DataFrame({"n": 50, "seed": list(range(4)) * 3, "snr": xs, "regime": reg})
    r = boundaries(df, "snr", "n", ("benign", "harmful")).iloc[0]
    assert 0.0158 < r["boundary"] < 0.0281
    assert r["status"] == "unresolved", r
    assert r["lo"] <= 0.0158 + 1e-12 and r["hi"] >= 0.0281 - 1e-12
    # without the stray run the slice is separated, with the same gap
    s = boundaries(df.iloc[:11], "snr", "n", ("benign", "harmful")).iloc[0]
    assert s["status"] == "separated" and s["lo"] <= 0.0158 + 1e-12 and s["hi"] >= 0.0281 - 1e-12
    # one run per x value is always "pure": clean logistic transitions sampled at 20 seeds x 10
    # random x values each stay ok (a rule that read one run as a pure side flipped half of them)
    rng = np.random.default_rng(1)
    for _ in range(10):
        x = np.exp(rng.uniform(-2, 2, size=(20, 10)))
        hit = rng.random((20, 10)) < 1 / (1 + np.exp(-3 * np.log(x)))
        one = pd.DataFrame({"n": 1, "seed": np.repeat(np.arange(20), 10), "snr": x.ravel(),
                            "regime": np.where(hit.ravel(), "harmful", "benign")})
        assert boundaries(one, "snr", "n", ("benign", "harmful")).iloc[0]["status"] == "ok"


def test_seeds_that_miss_a_regime_leave_the_interval_open_on_that_side():
    """Three seeds whose separated slice is benign below 0.2 and not overfitting above it, one
    seed having only the benign runs: a bootstrap replicate drawing that seed alone has no
    boundary anywhere in range, so the interval is open (inf) where the not-overfitting runs
    would be, instead of a huge number the logistic fit's ridge made up (the recipe's
    three-seed slice read [-5.7e10, 1.2e11] before)."""
    rows = [{"n": 20, "seed": s, "r": r, "regime": reg}
            for s, pairs in ((0, [(0.1, "benign"), (0.3, "not_overfitting")]),
                             (1, [(0.1, "benign"), (0.3, "not_overfitting")]),
                             (2, [(0.1, "benign")]))
            for r, reg in pairs]
    b = boundaries(pd.DataFrame(rows), "r", "n", ("benign", "not_overfitting"), log=False)
    r = b.iloc[0]
    assert r["status"] == "separated" and 0.1 <= r["boundary"] <= 0.3
    assert r["hi"] == np.inf and r["lo"] <= 0.1
    # a replicate that draws seed 2 three times has no B run: (1/3)^3 = 3.7 % of them, more than
    # the interval's 2.5 % upper tail, so the upper end is open
    assert not bounded(r["lo"], r["hi"], log=False)


def test_the_power_law_leaves_out_unbounded_slices_and_refuses_to_pool_steps():
    """``fit_power_law`` on a boundaries table fits the slices the CLI's verdict fits: a slice
    whose interval is unbounded (even one called separated) gives no weight, not the median
    point's; a table of several recorded steps for the same slices is refused, not pooled."""
    y = np.array([1.0, 2.0, 4.0, 8.0])
    b = pd.DataFrame({"m": y, "boundary": 3.0 * y**0.5, "lo": 2.9 * y**0.5, "hi": 3.1 * y**0.5,
                      "status": "ok"})
    clean = fit_power_law(b, "m")
    bad = pd.concat([b, pd.DataFrame({"m": [16.0], "boundary": [100.0], "lo": [1.0],
                                      "hi": [np.inf], "status": ["separated"]})])
    fit = fit_power_law(bad, "m")
    assert fit["n_points"] == 4 and fit["exponent"] == pytest.approx(clean["exponent"])
    assert fit["exponent"] == pytest.approx(0.5, abs=1e-9)
    steps = pd.concat([b.assign(step=10), b.assign(step=100)])
    with pytest.raises(ValueError, match="2 recorded steps for the same m"):
        fit_power_law(steps, "m")
    with pytest.raises(ValueError, match="no column 'd'"):
        fit_power_law(b, "d")


def test_runs_still_fitting_count_apart_or_as_not_overfitting():
    """The same table read with both rules: fitting runs left apart move the boundary to the
    settled runs; counted as not overfitting they side with it; the table and summary say which."""
    rows = []
    for s in range(6):
        for x in (1.0, 2.0, 4.0, 8.0):
            # benign above x = 3; below it, half the seeds still fitting, half not overfitting
            reg = "benign" if x > 3 else ("fitting" if s % 2 else "not_overfitting")
            rows.append({"d": 1, "seed": s, "m": x, "regime": reg, "status": "ok"})
    df = pd.DataFrame(rows)
    apart = boundaries(df, "m", "d", between=("not_overfitting", "benign"), n_boot=100)
    counted = boundaries(df, "m", "d", between=("not_overfitting", "benign"), n_boot=100,
                         fitting="not_overfitting")
    assert apart["n_other"].iloc[0] == 6 and counted["n_other"].iloc[0] == 0
    assert apart["n_a"].iloc[0] == 6 and counted["n_a"].iloc[0] == 12
    assert (apart["fitting"] == "apart").all() and (counted["fitting"] == "not_overfitting").all()
    assert "left apart" in summary(apart, "m", "d")
    assert "counted as not overfitting" in summary(counted, "m", "d")
    with pytest.raises(ValueError, match="between names 'fitting'"):
        boundaries(df, "m", "d", between=("fitting", "benign"), fitting="not_overfitting")
    with pytest.raises(ValueError, match="fitting = 'ignore'"):
        boundaries(df, "m", "d", between=("not_overfitting", "benign"), fitting="ignore")


def test_a_grid_limited_fit_is_said_at_every_recorded_step():
    rows = []
    for step in (10, 20):
        for d in (1, 2, 4, 8):
            for s in range(5):
                for x in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0):  # separated between 2d^0 grid points
                    rows.append({"d": d, "seed": s, "m": x, "step": step, "status": "ok",
                                 "regime": "benign" if x < 2 * d ** 0.5 + 0.1 else "harmful"})
    b = boundaries(pd.DataFrame(rows), "m", "d", n_boot=100)
    assert set(b["status"].astype(str)) <= {"separated", "unresolved"}
    text = summary(b, "m", "d")
    assert "at 2 recorded steps" in text and text.count("grid-limited") == 2, text
    one = summary(b[b["step"] == 10], "m", "d")
    assert "at 1 recorded step:" in one and "grid-limited" in one


def test_a_slice_gets_the_same_interval_whatever_is_fitted_beside_it():
    """Each slice's bootstrap is seeded by the slice's key: the table of six slices and each
    slice alone give one interval (the report, the command and a filtered table agree)."""
    df = planted(np.random.default_rng(3), seeds=8)
    both = boundaries(df, "signal_norm", "d").set_index("d")
    for d in (500, 4000):
        one = boundaries(df[df["d"] == d], "signal_norm", "d").set_index("d")
        assert (one.loc[d, "lo"], one.loc[d, "hi"]) == (both.loc[d, "lo"], both.loc[d, "hi"])
    other = boundaries(df, "signal_norm", "d", seed=1).set_index("d")
    assert not np.allclose(other["lo"], both["lo"])  # the seed still matters


def test_one_seed_or_an_interval_past_the_grid_is_unbounded():
    """One seed has no spread to resample (its bootstrap interval has width 0), and an interval
    reaching past the sampled x is an extrapolation: neither is an ok boundary."""
    rng = np.random.default_rng(0)
    one = planted(rng, seeds=1, xs=np.geomspace(5, 500, 40))
    b = boundaries(one, "signal_norm", "d")
    assert "ok" not in set(b["status"].astype(str)) and (b["n_seeds"] == 1).all()
    assert (b["status"].astype(str).isin(("unbounded", "separated", "unresolved",
                                           "outside_range"))).all()
    # a shallow slice: its estimate (3.68) inside the sampled 3 .. 15, its finite interval
    # (1.83 .. 7.80) reaching below the smallest x run
    counts = {3.0: (3, 1), 3.67: (2, 2), 4.5: (1, 3), 6.0: (1, 4), 9.0: (0, 5), 12.0: (1, 5),
              15.0: (0, 5)}
    rows = [{"d": 1, "seed": s, "m": m, "regime": "not_overfitting" if s < na else "benign"}
            for m, (na, nb) in counts.items() for s in range(na + nb)]
    r = boundaries(pd.DataFrame(rows), "m", "d", ("not_overfitting", "benign")).iloc[0]
    assert 3.0 < r["boundary"] < 15.0 and 0 < r["lo"] < 3.0 < r["hi"] < 15.0, r
    assert r["status"] == "unbounded", r


def test_seeds_with_no_spread_to_resample_give_no_ok_interval():
    """Two seeds, or seeds that all drew the same regimes (noise shared along the map): the
    bootstrap has no spread, and its zero-width interval is no measurement (unbounded)."""
    xs = [250, 375, 500, 625, 750, 875, 1000, 1125]
    pattern = ["A", "A", "A", "B", "A", "B", "B", "B"]  # non-monotone, as a shared-noise map
    for seeds in (2, 6):
        rows = [{"mu": 1.0, "seed": s, "d": x, "regime": {"A": "not_overfitting", "B": "benign"}[p]}
                for s in range(seeds) for x, p in zip(xs, pattern)]
        r = boundaries(pd.DataFrame(rows), "d", "mu", ("not_overfitting", "benign")).iloc[0]
        # never an ok zero-width interval: unbounded, or (enough runs on each side of the gap)
        # unresolved with the whole gap
        assert r["status"] == "unbounded" or r["status"] == "unresolved" and (
            r["lo"] <= 625 + 1e-9 and r["hi"] >= 750 - 1e-9), (seeds, r)
    # three seeds, one crossing the other way inside the gap: every resample gives one estimate
    # (symmetry), an interval of a few units inside a gap of 125; too few seeds for an ok one
    three = [["A", "A", "B", "B"], ["A", "B", "A", "B"], ["A", "A", "B", "B"]]
    rows = [{"mu": 1.0, "seed": s, "d": x, "regime": {"A": "not_overfitting", "B": "benign"}[p]}
            for s, pat in enumerate(three) for x, p in zip([375, 500, 625, 750], pat)]
    r = boundaries(pd.DataFrame(rows), "d", "mu", ("not_overfitting", "benign")).iloc[0]
    assert r["status"] != "ok", r
    # and a dynamics table at one step gives the results table's interval (the step is no key)
    df = planted(np.random.default_rng(3), seeds=8)
    a = boundaries(df, "signal_norm", "d").set_index("d")
    b = boundaries(df.assign(step=1000), "signal_norm", "d").set_index("d")
    np.testing.assert_array_equal(a["lo"].to_numpy(), b["lo"].to_numpy())


def test_no_ok_run_and_a_text_axis_are_refused_in_one_line():
    df = planted(np.random.default_rng(0), seeds=3).assign(status="diverged")
    with pytest.raises(ValueError, match=r"none of the \d+ runs is ok \(diverged \d+\)"):
        boundaries(df, "signal_norm", "d")
    txt = planted(np.random.default_rng(0), seeds=3)
    txt["mode"] = np.where(txt["seed"] % 2 == 0, "iid", "balanced")
    with pytest.raises(ValueError, match="x = 'mode' is not numeric"):
        boundaries(txt, "mode", "d")


def test_the_table_and_summary_state_horizon_seeds_and_estimator():
    df = planted(np.random.default_rng(1), seeds=6).assign(steps=1000, time=5.0)
    b = boundaries(df, "signal_norm", "d")
    assert (b["steps"] == 1000).all() and (b["time"] == 5.0).all()
    text = summary(b, "signal_norm", "d")
    assert "at step 1000 (time 5)" in text and "6 seeds" in text
    assert "logistic fit per slice, 95% bootstrap over seeds" in text
    row = pb.power_law_row(b, "signal_norm", "d")
    assert row["horizon"] == "step 1000 (time 5)" and row["n_seeds_min"] == 6
    assert row["fitting"] == "apart"
    # pooled on purpose over two horizons: the slice has no one horizon, and the text says so
    two = pd.concat([df, df.assign(steps=2000, time=10.0, seed=df["seed"] + 100)])
    b2 = boundaries(two, "signal_norm", "d", over=["steps", "time"])
    assert b2["steps"].isna().all() and b2["time"].isna().all()
    assert "at pooled horizons" in summary(b2, "signal_norm", "d")


def test_a_fit_along_another_axis_is_refused_and_one_step_is_a_horizon():
    b = boundaries(planted(np.random.default_rng(2), seeds=6), "signal_norm", "d")
    with pytest.raises(ValueError, match="x = 'd', but these boundaries lie along 'signal_norm'"):
        pb.power_law_row(b, "d", "signal_norm")
    with pytest.raises(ValueError, match="not a boundary table"):  # the runs themselves
        pb.power_law_row(planted(np.random.default_rng(2), seeds=6), "signal_norm", "d")
    one = b.assign(step=400)  # a dynamics table's boundaries at one recorded step
    assert pb.power_law_row(one, "signal_norm", "d")["horizon"] == "step 400"
    assert pb.power_law_row(b.assign(step=[400, 800] * 3), "signal_norm", "d")["horizon"] == ""


def test_pooled_steps_are_counted_alike_by_the_fit_and_its_row():
    """Boundaries at 3 recorded steps per slice, one of them unplaced at one step: both refusals
    count the table's 3 steps (the row once counted only the steps left after its filter)."""
    b = boundaries(planted(np.random.default_rng(4), seeds=6), "signal_norm", "d")
    many = pd.concat([b.assign(step=s) for s in (100, 200, 300)], ignore_index=True)
    many.loc[(many["step"] == 300), "status"] = "all_A"
    for fn in (lambda: pb.fit_power_law(many, "d"), lambda: pb.power_law_row(many, "signal_norm", "d")):
        with pytest.raises(ValueError, match="boundaries at 3 recorded steps for the same d"):
            fn()


def test_a_slice_unbounded_for_too_few_seeds_gets_more_seeds_whatever_its_width():
    """Three seeds on a fine grid: a narrow bootstrap interval, but too few seeds for an ok one
    (unbounded); refining adds seeds at the points beside its estimate instead of calling the
    slice done because its interval looks narrow."""
    from phasebo.refine import Refinement, plan_round

    df = planted(np.random.default_rng(2), seeds=3, xs=np.geomspace(5, 500, 31))
    b = boundaries(df, "signal_norm", "d")
    unb = b[b["status"].astype(str) == "unbounded"]
    assert len(unb) and ((unb["hi"] - unb["lo"]) / unb["boundary"] < 0.5).any()
    cases, _ = plan_round(df, Refinement(between=("benign", "harmful"), x="signal_norm", y="d",
                                         target=0.5), 1000, 1, False, 3)
    for d in unb["d"]:
        mine = [c for c in cases if c["d"] == d]
        assert mine and all("root_seed" in c for c in mine), (d, mine)


def test_a_refinement_refuses_another_sweeps_runs_before_moving_anything(tmp_path):
    spec = small_spec()
    other = C.spec_from_dict({"model": "prompt_attention", "n": 20, "steps": 50, "n_test": 100},
                             {"signal_norm": [2.0, 8.0], "d": [1500]}, seeds=2, name="other")
    pb.run_sweep(other, tmp_path / "ref", quiet=True, plots=False)
    r = parse_refine(spec, {"between": ["harmful", "benign"], "rounds": 1})
    with pytest.raises(ConfigError, match="holds runs of another sweep"):
        pb.refine_sweep(spec, r, tmp_path / "ref", quiet=True)
    assert (tmp_path / "ref" / "parts").is_dir() and (tmp_path / "ref" / "manifest.json").exists()
    assert not (tmp_path / "ref" / "round-0" / "parts").exists()


def test_over_seed_is_refused_since_seeds_are_always_pooled():
    """--over seed changed nothing but the output files' names."""
    runs = planted(np.random.default_rng(2), seeds=6)
    with pytest.raises(ValueError, match="over names 'seed': a slice's runs of every seed"):
        boundaries(runs, "signal_norm", "d", over=["seed"])


def test_the_converged_limit_is_named_as_its_horizon_not_step_0():
    """The limit's runs have steps 0 and time inf: "at step 0 (time ∞)" read as the
    initialisation."""
    from phasebo.scaling import horizon_text

    b = boundaries(planted(np.random.default_rng(2), seeds=6), "signal_norm", "d")
    assert horizon_text(b.assign(steps=0, time=np.inf)) == " at the converged limit"
    assert pb.power_law_row(b.assign(steps=0, time=np.inf), "signal_norm", "d")["horizon"] == \
        "the converged limit"
    assert horizon_text(b.assign(steps=1000, time=5.0)) == " at step 1000 (time 5)"
    # a recorded step of a dynamics table: its time too (a flow's tau is not step x lr of 1)
    assert horizon_text(b.assign(step=100000, time=500.0)) == " at step 100000 (time 500)"


def test_an_interval_open_at_zero_on_a_log_axis_is_refined_whatever_its_width():
    """A separated slice whose bootstrap replicates often draw no run of its lower regime has an
    interval reaching 0 on a log axis: no width at all. Refining it splits its grid gap even when
    (hi - 0) / boundary looks narrower than the target (it used to be called done)."""
    from phasebo.refine import Refinement, plan_round

    rows = [{"d": 1, "seed": s, "m": m, "regime": "harmful" if m < 150 else "benign"}
            for s in range(6) for m in ([100.0, 200.0, 400.0] if s == 0 else [200.0, 400.0])]
    df = pd.DataFrame(rows)
    b = boundaries(df, "m", "d", ("harmful", "benign")).iloc[0]
    assert b["status"] == "separated" and b["lo"] == 0 and b["hi"] / b["boundary"] < 50
    cases, _ = plan_round(df, Refinement(between=("harmful", "benign"), x="m", y="d",
                                         target=50.0), 1000, 1, False, 6)
    assert [c["m"] for c in cases] == [pytest.approx(np.sqrt(100 * 200))]


def test_too_few_bootstrap_replicates_are_refused_and_the_count_is_stated():
    """Five replicates put a 95 % interval's ends on single replicates (one missed its own
    estimate); fewer than MIN_BOOT are refused, and the summary says how many were drawn."""
    from phasebo.boundaries import MIN_BOOT
    from phasebo.scaling import summary

    df = planted(np.random.default_rng(3), seeds=6)
    for n in (5, MIN_BOOT - 1, 2.5, True):
        with pytest.raises(ValueError, match=f"at least {MIN_BOOT} replicates"):
            boundaries(df, "signal_norm", "d", n_boot=n)
        with pytest.raises(ValueError, match=f"at least {MIN_BOOT} replicates"):
            pb.crossings(df.assign(test_acc=1.0), "signal_norm", "d", n_boot=n)
    b = boundaries(df, "signal_norm", "d", n_boot=MIN_BOOT)
    assert (b["n_boot"] == MIN_BOOT).all()
    assert f"95% bootstrap over seeds ({MIN_BOOT} replicates)" in summary(b, "signal_norm", "d")


def test_a_fit_says_how_many_of_its_slices_the_grid_alone_brackets():
    """A fit through one slice its fit placed and nine only bracketed by grid gaps read as a
    plain "ok" fit of 10 slices: the summary now says how they were placed."""
    from phasebo.scaling import placed, summary

    b = pd.DataFrame({"d": [100.0, 200.0, 400.0, 800.0], "boundary": [5.0, 7.1, 10.0, 14.2],
                      "lo": [4.5, 6.0, 8.0, 12.0], "hi": [5.5, 8.0, 12.0, 16.0],
                      "status": ["ok", "separated", "unresolved", "unbounded"],
                      "between": "benign/harmful", "n_seeds": 10, "n_runs": 40})
    assert placed(b, "d") == "1 placed by their fit, 2 only bracketed by the grid"
    assert "3 slices: 1 placed by their fit, 2 only bracketed by the grid" in summary(
        b, "signal_norm", "d")


def test_an_empty_table_is_said_to_be_empty():
    """It read "x = 'd' takes one value in these runs ()"."""
    df = pd.DataFrame({"d": [], "signal_norm": [], "regime": [], "seed": []})
    with pytest.raises(ValueError, match="the table holds no runs"):
        boundaries(df, "signal_norm", "d", ("benign", "harmful"))


def test_regimes_that_no_run_has_are_a_warning():
    """("benign", "no_noise") on runs with label noise returned a table of all_A, silently."""
    df = pd.DataFrame({"d": [100.0] * 4 + [200.0] * 4, "signal_norm": [1.0, 2.0, 4.0, 8.0] * 2,
                       "regime": ["harmful", "harmful", "benign", "benign"] * 2, "seed": 0})
    with pytest.warns(UserWarning, match="no run is no_noise in these runs"):
        b = boundaries(df, "signal_norm", "d", ("benign", "no_noise"))
    assert set(b["status"].astype(str)) <= {"all_A", "too_few"}
