"""The grid: a cell and a run index -> the run's settings and id (phasebo.grid, phasebo.config)."""

import numpy as np
import pandas as pd
from test_sweep import small_spec

import phasebo as pb
from phasebo import config as C
from phasebo import grid as G
from phasebo.config import spec_from_dict


def test_grid_cells_and_run_ids():
    spec = small_spec(seeds=3)
    assert spec.n_runs == 2 * 2 * 3
    assert spec.static_axes() == ["d"] and spec.swept_axes() == ["signal_norm"]
    cells = list(spec.cells())
    assert [c.settings["d"] for c in cells] == [40, 64]
    ids = G.spec_run_ids(spec)
    assert len(ids) == len(set(ids)) == 12 and (ids >= 0).all()
    # local run order: seeds fastest, then the swept axes
    var = G.cell_runs(spec, cells[0], np.arange(6))
    assert var["seed"].tolist() == [0, 1, 2, 0, 1, 2]
    assert var["signal_norm"].tolist() == [3.0, 3.0, 3.0, 30.0, 30.0, 30.0]


def test_ranges_expand_inclusively():
    spec = spec_from_dict({}, {"signal_norm": {"start": 5, "stop": 100, "step": 2.5},
                               "d": {"start": 250, "stop": 5000, "step": 125}})
    assert len(spec.axes["signal_norm"]) == 39 and spec.axes["signal_norm"][-1] == 100.0
    assert len(spec.axes["d"]) == 39 and spec.axes["d"][:2] == [250, 375]
    log = spec_from_dict({}, {"lr": {"start": 1e-3, "stop": 1e-1, "num": 3, "log": True}})
    np.testing.assert_allclose(log.axes["lr"], [1e-3, 1e-2, 1e-1])


def test_run_id_of_a_fixed_run_is_pinned():
    """A run's id is its identity: it names its parts on disk, decides which runs a grown or
    resumed sweep still has to do, and seeds its random key. These values were computed once
    (prompt_attention with every default, ||mu|| = 10, seeds 0 and 1) and are hard-coded on
    purpose: a change to the hashing (phasebo.config.run_ids, value_bits, _splitmix) or to the
    identity settings of the model (a new one, or a changed default) changes every run's id and
    numbers and orphans the runs of every existing results directory. If this fails, the change
    must be deliberate: update the numbers and say so in the commit message."""
    pinned = [3978004595962495337, 8327796549513603194]
    as_axis = spec_from_dict({"model": "prompt_attention"}, {"signal_norm": [10.0]}, seeds=2)
    assert G.spec_run_ids(as_axis).tolist() == pinned
    # the same run as a fixed setting, on another engine, recording dynamics: the same id
    fixed = spec_from_dict({"model": "prompt_attention", "signal_norm": 10.0, "engine": "direct",
                            "record_every": 5}, seeds=2)
    assert G.spec_run_ids(fixed).tolist() == pinned


def _cn_runs(tmp_path, mode, seeds, norms=(3.0, 3.001), engine="auto"):
    from phasebo.sweep import run_sweep

    base = {"n": 12, "n_test": 200, "T": 6, "d": 48, "steps": 30, "lr": 0.05,
            "common_noise": mode, "engine": engine}
    spec = pb.spec_from_dict(base, {"signal_norm": list(norms)}, seeds=seeds, name=f"cn_{mode}")
    return run_sweep(spec, tmp_path / f"{mode}_{engine}", quiet=True, plots=False)


def test_common_noise_shares_the_draws_along_the_signal_axis_only(tmp_path):
    """With common_noise = "signal_norm" a seed's runs at ‖μ‖ 3 and 3.001 see the same noise,
    labels and test set (their losses agree to ~1e-4); independent runs do not; the run ids
    stay distinct, and common_noise = "none" keeps the ids runs had before it existed."""
    shared = _cn_runs(tmp_path, "signal_norm", 4).sort_values(["seed", "signal_norm"])
    indep = _cn_runs(tmp_path, "none", 4).sort_values(["seed", "signal_norm"])
    for df, close in ((shared, True), (indep, False)):
        a = df[df["signal_norm"] == 3.0]["train_loss"].to_numpy()
        b = df[df["signal_norm"] == 3.001]["train_loss"].to_numpy()
        assert (np.abs(a - b).max() < 1e-3) == close
    assert shared["run_id"].nunique() == len(shared)
    assert not set(shared["run_id"]) & set(indep["run_id"])
    assert (shared["common_noise"] == "signal_norm").all()  # the results say which was used
    from phasebo.sweep import run_sweep  # as an axis: the same runs, run by run

    base = {"n": 12, "n_test": 200, "T": 6, "d": 48, "steps": 30, "lr": 0.05}
    both = run_sweep(pb.spec_from_dict(base, {"common_noise": ["none", "signal_norm"],
                                              "signal_norm": [3.0, 3.001]}, seeds=4,
                                       name="cn_axis"), tmp_path / "axis", quiet=True,
                     plots=False)
    key = ["common_noise", "seed", "signal_norm"]
    got = both.sort_values(key)["train_loss"].to_numpy()
    want = pd.concat([indep, shared]).sort_values(key)["train_loss"].to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    model = pb.MODELS["prompt_attention"]
    own = {k: s.default for k, s in model.settings.items()}
    before = C.run_ids(model, {k: v for k, v in own.items() if k != "common_noise"} | {
        "common_noise": "none"}, {}, np.arange(3))
    assert (C.key_ids(model, own, {}, np.arange(3)) == before).all()


def test_common_noise_along_an_axis_of_one_value_runs_the_same_runs(tmp_path):
    """One value of the shared axis (a slice of the paper's map, --set signal_norm=[20]): the
    sweep raised a traceback (a noise group of one run lost its member axis); it now runs each
    run alone with its group's key, so the run is the one a wider sweep holds."""
    one = _cn_runs(tmp_path / "one", "signal_norm", 3, norms=(3.0,))
    two = _cn_runs(tmp_path / "two", "signal_norm", 3, norms=(3.0, 3.001))
    two = two[two["signal_norm"] == 3.0].sort_values("seed")
    one = one.sort_values("seed")
    assert one["run_id"].tolist() == two["run_id"].tolist()
    np.testing.assert_allclose(one["train_loss"], two["train_loss"], rtol=1e-5)


def test_common_noise_leaves_each_cells_distribution_unchanged(tmp_path):
    """Kolmogorov–Smirnov over 400 seeds: a cell's final metrics under shared noise against
    independent runs (other keys, so two independent samples of each cell's law)."""
    from scipy.stats import ks_2samp

    shared = _cn_runs(tmp_path, "signal_norm", 400, norms=(3.0, 6.0))
    indep = _cn_runs(tmp_path, "none", 400, norms=(3.0, 6.0))
    for norm in (3.0, 6.0):
        for m in ("train_loss", "test_acc", "train_acc"):
            a = shared[shared["signal_norm"] == norm][m]
            b = indep[indep["signal_norm"] == norm][m]
            assert ks_2samp(a, b, method="asymp").pvalue > 1e-3, (norm, m)


def test_shared_noise_runs_consecutively_and_groups_in_the_plan():
    """With noise shared along ‖μ‖ the axis is the fastest index, so a chunk holds whole noise
    groups; the span engines step each group as one vmapped unit (the plan says so), the direct
    engine run by run."""
    from phasebo.plan import plan

    spec = spec_from_dict({"d": 48, "common_noise": "signal_norm"},
                          {"signal_norm": [3.0, 6.0, 9.0]}, seeds=2)
    var = G.cell_runs(spec, next(spec.cells()), np.arange(6))
    assert var["signal_norm"].tolist() == [3.0, 6.0, 9.0] * 2
    assert var["seed"].tolist() == [0, 0, 0, 1, 1, 1]
    g = plan(spec).groups[0]
    assert (g.engine.name, g.axis, g.members, g.unit_runs(1)) == ("reduced", "signal_norm", 3,
                                                                  3 * g.block)
    direct = plan(spec_from_dict({"d": 48, "common_noise": "signal_norm", "engine": "direct"},
                                 {"signal_norm": [3.0, 6.0]})).groups[0]
    assert (direct.axis, direct.members) == (None, 1)


def _grouped_vs_alone(tmp_path, settings, norms, seeds, grow=None):
    """A grouped sweep's rows and dynamics against each run alone (``run_one``: the same key,
    no group), worst absolute difference over the final metrics and the recorded ones."""
    from phasebo.execute import run_one
    from phasebo.sweep import run_sweep

    st = {"n": 10, "T": 4, "n_test": 100, "steps": 40, "lr": 0.05, "dtype": "float64",
          "record_every": 10, "common_noise": "signal_norm", **settings}
    out = tmp_path / "grouped"
    run_sweep(pb.spec_from_dict(st, {"signal_norm": norms}, seeds=seeds), out, quiet=True,
              plots=False)
    if grow is not None:  # a grown axis: every noise group gets one new member (padded group)
        run_sweep(pb.spec_from_dict(st, {"signal_norm": grow}, seeds=seeds), out, quiet=True,
                  plots=False)
    res, dyn = pb.load_results(out), pb.load_dynamics(out)
    worst = 0.0
    for _, r in res.iterrows():
        alone = run_one({**st, "signal_norm": float(r.signal_norm)}, seed=int(r.seed))
        for k in ("train_loss", "test_loss", "test_acc", "margin_mid", "cumS_noisy_pos"):
            worst = max(worst, abs(float(alone.final[k]) - r[k]))
        mine = dyn[dyn["run_id"] == r.run_id].sort_values("step")
        for k in ("train_loss", "test_acc", "max_attn"):
            if k in mine:
                worst = max(worst, np.abs(np.asarray(alone.dynamics[k]) - mine[k].to_numpy())
                            .max())
    return len(res), worst


def test_grouped_stepping_equals_each_run_alone_in_float64(tmp_path, x64):
    """A noise group stepped as one unit (shared Gram, one matrix product per step) gives every
    run the trajectory and final metrics it has alone, to 1e-10 in float64: reduced and gram
    engines, p only, a fixed random W, and W + p."""
    for i, settings in enumerate(({"d": 60}, {"d": 30, "engine": "gram"},
                                  {"d": 30, "engine": "gram", "W_init": "random"},
                                  {"d": 30, "train": ["p", "W"]})):
        n, worst = _grouped_vs_alone(tmp_path / str(i), settings, [2.0, 5.0, 9.0], 2)
        assert n == 6 and worst < 1e-10, (settings, worst)


def test_grown_axis_fills_partial_noise_groups(tmp_path, x64):
    """Growing the shared axis leaves each noise group with one run to do: the group is padded
    (its first run repeated in the empty slots, the padding never written) and every row is
    still the run alone, none lost or duplicated."""
    n, worst = _grouped_vs_alone(tmp_path, {"d": 60}, [2.0, 5.0], 3, grow=[2.0, 5.0, 9.0])
    assert n == 9 and worst < 1e-10
