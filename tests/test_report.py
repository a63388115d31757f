"""Which figures a sweep gets (phasebo.report): small multiples instead of skipped maps, one file
per ``where`` slice, the axes that vary when a plot axis was fixed, no map for a ``[[cases]]``
sweep, and boundaries that say when their fit means nothing."""

import warnings

import numpy as np
import pandas as pd
import pytest

import phasebo as pb
from phasebo import analysis as A
from phasebo import plot as P
from phasebo import report as R
from phasebo.sweep import run_sweep

BASE = {"n": 12, "n_test": 64, "T": 6, "d": 48, "steps": 30, "lr": 0.05, "record_log": 6}


@pytest.fixture(scope="module")
def three_axes(tmp_path_factory):
    """(signal_norm, noise_ratio) maps at two step sizes: a third axis; two ``where`` entries."""
    out = tmp_path_factory.mktemp("report") / "three"
    plot = {"heatmaps": [{"x": "signal_norm", "y": "noise_ratio", "value": "regime"},
                         {"x": "signal_norm", "y": "noise_ratio", "value": "test_acc",
                          "where": {"lr": 0.05}},
                         {"x": "signal_norm", "y": "noise_ratio", "value": "test_acc",
                          "where": {"lr": 0.1}}]}
    base = {k: v for k, v in BASE.items() if k != "lr"}
    spec = pb.spec_from_dict(base, {"signal_norm": [1.0, 3.0, 9.0], "noise_ratio": [0.1, 0.4],
                                    "lr": [0.05, 0.1]}, seeds=2, name="three", plot=plot)
    run_sweep(spec, out, quiet=True)
    return out


def test_a_third_axis_is_drawn_as_small_multiples_with_one_key(three_axes):
    names = {p.name for p in three_axes.glob("heatmap_*.png")}
    assert "heatmap_regime_noise_ratio_vs_signal_norm_by_lr.png" in names
    runs = pb.load(three_axes)
    fig, axs = P.facet_maps(runs, "signal_norm", "noise_ratio")
    assert fig.slices == [{"lr": 0.05}, {"lr": 0.1}]
    assert [ax.get_title() for ax in axs.flat[:2]] == ["lr = 0.05", "lr = 0.1"]
    for ax, w in zip(axs.flat, fig.slices):  # each panel is its slice's own map
        expect = A.pivot(A.aggregate(A.select(runs, w), by=["signal_norm", "noise_ratio"]),
                         "signal_norm", "noise_ratio", "regime")
        codes = np.asarray(ax.collections[0].get_array()).reshape(expect.shape).astype(int)
        got = np.array(ax.regime_categories, dtype=object)[codes]
        assert (got == expect.to_numpy().astype(str)).all()
    assert axs.flat[0].regime_categories == axs.flat[1].regime_categories  # one key
    title = fig._suptitle.get_text()
    assert "2 seeds per cell" in title and "n 12" in title and "30 steps" in title
    P.plt.close(fig)


def test_two_where_entries_give_two_files_named_by_their_slice(three_axes):
    names = {p.name for p in three_axes.glob("heatmap_test_acc_*.png")}
    assert names == {"heatmap_test_acc_noise_ratio_vs_signal_norm_lr0.05.png",
                     "heatmap_test_acc_noise_ratio_vs_signal_norm_lr0.1.png"}
    # the same entry twice is never written over: the second gets its own name
    used: set = set()
    h = {"x": "signal_norm", "y": "d", "value": "regime"}
    assert [R._stem("heatmap", h, used) for _ in range(2)] == [
        "heatmap_regime_d_vs_signal_norm", "heatmap_regime_d_vs_signal_norm_2"]


def test_many_slices_get_one_file_each(three_axes, tmp_path, monkeypatch):
    monkeypatch.setattr(P, "MAX_PANELS", 1)
    runs = pb.load(three_axes)
    figs = R.map_figures(runs, {"x": "signal_norm", "y": "noise_ratio", "value": "regime"}, "m")
    assert [name for _, name in figs] == ["m_lr0.05", "m_lr0.1"]
    assert figs[0][0].axes[0].get_title().startswith("lr = 0.05 — regime")
    for fig, _ in figs:
        P.plt.close(fig)


def test_a_plot_axis_fixed_by_set_draws_the_axes_that_vary(tmp_path, capsys):
    plot = {"heatmaps": [{"x": "signal_norm", "y": "d", "value": "regime"}]}
    spec = pb.spec_from_dict(BASE, {"signal_norm": [1.0, 9.0], "noise_ratio": [0.1, 0.4]},
                             seeds=1, name="fixed", plot=plot)  # d = 48 only
    from phasebo.report import plot_notes

    plot_notes(spec)  # what the dry run says, from the cells, before anything runs
    early = capsys.readouterr().err
    assert "d = 48 is the only value in this sweep" in early
    assert "so it is drawn noise_ratio vs signal_norm" in early
    run_sweep(spec, tmp_path / "f")
    assert (tmp_path / "f" / "heatmap_regime_noise_ratio_vs_signal_norm.png").exists()
    err = capsys.readouterr().err
    assert "d = 48 is the only value in this sweep" in err
    assert "so it is drawn noise_ratio vs signal_norm" in err
    run_sweep(spec, tmp_path / "f", quiet=True)  # drawn again: --quiet has no notes
    assert "drawn" not in capsys.readouterr().err


def test_a_regime_map_with_one_axis_left_draws_the_regime_shares(tmp_path, capsys):
    plot = {"heatmaps": [{"x": "signal_norm", "y": "d", "value": "regime"}]}
    spec = pb.spec_from_dict(BASE, {"signal_norm": [1.0, 9.0]}, seeds=2, name="one", plot=plot)
    run_sweep(spec, tmp_path / "o")
    assert (tmp_path / "o" / "line_regime_vs_signal_norm.png").exists()
    err = capsys.readouterr().err
    assert "heatmap #1 (regime): d = 48 is the only value in this sweep" in err
    assert "drawn as the regime shares against signal_norm" in err


def test_a_map_over_a_derived_axis_with_the_other_fixed_draws_lines_against_it(tmp_path, capsys):
    """A map over (snr, n) with n fixed: snr (a column derived from d) still varies, so the
    lines are drawn against snr, not against d, the axis behind it; the regime shares too."""
    plot = {"heatmaps": [{"x": "snr", "y": "n", "value": "regime"},
                         {"x": "snr", "y": "n", "value": "test_acc"}]}
    fixed = {k: v for k, v in BASE.items() if k != "d"}
    spec = pb.spec_from_dict(fixed, {"d": [40, 48, 64]}, seeds=2, name="snr", plot=plot)
    run_sweep(spec, tmp_path / "s")
    err = capsys.readouterr().err
    assert "drawn as the regime shares against snr" in err and "skipped" not in err, err
    assert "drawn as test_acc against snr" in err
    for name in ("line_regime_vs_snr.png", "line_test_acc_vs_snr.png"):
        assert (tmp_path / "s" / name).exists()
    runs = pb.load(tmp_path / "s")
    fig, ax = P.line_plot(runs, "snr", "test_acc")  # one line through the 3 snr, not 3 dots
    assert len(ax.get_lines()) == 1 and len(ax.get_lines()[0].get_xdata()) == 3
    P.plt.close(fig)


def test_a_plot_slice_that_set_left_out_is_skipped_and_said(tmp_path, capsys):
    plot = {"heatmaps": [{"x": "signal_norm", "y": "d", "value": "regime",
                          "where": {"noise_ratio": 0.1}}]}
    from phasebo.config import build_spec

    fixed = {k: v for k, v in BASE.items() if k != "d"}
    raw = {"settings": fixed, "axes": {"signal_norm": [1.0, 9.0], "d": [40, 48],
                                       "noise_ratio": [0.1, 0.2]}, "plot": plot}
    spec = build_spec(raw, "gone", overrides={"noise_ratio": 0.2})  # --set noise_ratio=0.2
    assert len(run_sweep(spec, tmp_path / "g", quiet=True)) == 4
    assert "skipped [plot] heatmap #1: select: noise_ratio = 0.1 is in no row" in \
        capsys.readouterr().err
    assert (tmp_path / "g" / "report.html").exists()  # the sweep finished: report included


def test_a_cases_sweep_gets_no_map_and_one_dynamics_line_per_case(tmp_path):
    cases = [{"d": 48, "signal_norm": 1.0}, {"d": 64, "signal_norm": 3.0},
             {"d": 96, "signal_norm": 9.0}]
    spec = pb.spec_from_dict(BASE, {}, seeds=2, name="cases", cases=cases)
    run_sweep(spec, tmp_path / "c", quiet=True)
    assert sorted(p.name for p in (tmp_path / "c").glob("*.png")) == ["cases.png"]
    runs = pb.load(tmp_path / "c")
    with pytest.raises(ValueError, match="cases"):  # a map would colour 6 cells never run
        P.regime_map(runs, "signal_norm", "d")
    paths = R.standard_figures(tmp_path / "c")
    names = {p.name for p in paths}
    assert not any(n.startswith("map_") for n in names) and "cases.png" in names
    attention = sorted(n for n in names if n.startswith("attention_"))
    assert len(attention) == 3 and all("_d48_signal_norm1" in n or "_d64_signal_norm3" in n
                                       or "_d96_signal_norm9" in n for n in attention)
    fig, axs = P.accuracy_dynamics(pb.load(tmp_path / "c", "dynamics"), hue=["d", "signal_norm"])
    labels = [t.get_text() for t in axs[0].get_legend().get_texts()]
    assert len(labels) == 6  # train and test, one line per case
    P.plt.close(fig)


def _boundary_runs(slices, noise=0.0, seeds=6, spread=0.4):
    """Planted boundaries: benign below x* = 10 · y^0.5 (times a slice's ``noise`` factor),
    harmful above, at 12 x values per slice."""
    rows, rng = [], np.random.default_rng(0)
    for i, yv in enumerate(slices):
        xstar = 10 * yv ** 0.5 * (1 + noise * (-1) ** i)
        for s in range(seeds):
            for xv in np.geomspace(1, 1000, 12):
                shift = np.exp(rng.normal(0, spread))  # 0.4: regimes overlap, slices "ok"
                rows.append({"signal_norm": xv, "d": yv, "seed": s,
                             "regime": "harmful" if xv > xstar * shift else "benign",
                             "status": "ok", "test_acc": 1.0})
    return pd.DataFrame(rows)


def _note(fig) -> str:
    """A boundary figure's note on its fit: the title of its legend, below the map (or a text
    there when it has no legend), never over the cells."""
    ax = fig.axes[0]
    leg = ax.get_legend()
    texts = [t.get_text() for t in ax.texts] + ([leg.get_title().get_text()] if leg else [])
    assert all(t.get_position()[1] < 0 for t in ax.texts)  # below the axes
    return " ".join(texts).replace("\n", " ")


def test_no_power_law_is_drawn_through_fewer_than_three_slices():
    runs = _boundary_runs([100, 400])
    b = pb.boundaries(runs, "signal_norm", "d", ("benign", "harmful"), n_boot=100)
    fig = P.boundary_figure(runs, b, "signal_norm", "d")
    assert fig.boundary_fit["status"] == "too_few_slices"
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not any(lab.startswith(("fit", "theory")) for lab in labels)
    assert "no power-law fit" in _note(fig)
    P.plt.close(fig)


def test_a_scattered_boundary_is_flagged_in_the_fit_and_the_figure():
    runs = _boundary_runs([25, 100, 400, 1600, 6400], noise=0.8, seeds=10)
    b = pb.boundaries(runs, "signal_norm", "d", ("benign", "harmful"), n_boot=100)
    row = __import__("phasebo.scaling", fromlist=["x"]).power_law_row(b, "signal_norm", "d")
    assert row["status"] == "scattered" and row["chi2_dof"] > 4
    fig = P.boundary_figure(runs, b, "signal_norm", "d")
    assert "scattered" in _note(fig)
    P.plt.close(fig)
    clean = _boundary_runs([25, 100, 400, 1600, 6400], seeds=10)
    b = pb.boundaries(clean, "signal_norm", "d", ("benign", "harmful"), n_boot=100)
    fit = __import__("phasebo.scaling", fromlist=["x"]).power_law_row(b, "signal_norm", "d")
    assert fit["status"] == "ok" and abs(fit["exponent"] - 0.5) < 0.1


def test_boundaries_command_writes_the_fit_verdict(tmp_path, capsys):
    from phasebo.cli import boundaries_main

    runs = _boundary_runs([100, 400])
    runs["run_id"] = np.arange(len(runs))
    runs.to_parquet(tmp_path / "results.parquet")
    assert boundaries_main([str(tmp_path / "results.parquet"), "--out", str(tmp_path),
                            "--boot", "100"]) == 0
    fit = pd.read_csv(tmp_path / "boundaries_benign_harmful_along_signal_norm_per_d_fit.csv")
    assert fit["status"].tolist() == ["too_few_slices"] and np.isnan(fit["exponent"][0])
    assert "no power-law fit" in capsys.readouterr().out
    assert boundaries_main([str(tmp_path / "results.parquet"), "--between", "benign,harmfull",
                            "--no-plots"]) == 2
    assert "did you mean 'harmful'" in capsys.readouterr().err


def test_titles_count_seeds_in_good_grammar_and_name_columns_in_words():
    cells = pd.DataFrame({"signal_norm": [1.0, 2.0], "test_acc": [0.9, 1.0], "seed": 0,
                          "status": "ok", "regime": "benign"})
    fig, ax = P.line_plot(cells, "signal_norm", "test_acc")
    assert "over 1 seed" in ax.get_title() and "1 seeds" not in ax.get_title()
    P.plt.close(fig)
    assert P._label("cls_max_attn") == "max CLS attention"
    assert P._label("mass_noisy_weak_opp") == ("attention mass, flipped samples, weak "
                                               "opposite")


def test_map_tick_labels_do_not_crowd_on_a_log_axis():
    fig, ax = P.plt.subplots()
    P._grid_ticks(ax.xaxis, np.array([5, 7.5, 10, 15, 20, 30, 40, 60, 80, 100.0]), log=True)
    ticks = np.log(ax.xaxis.get_major_locator().tick_values(0, 1))
    assert np.diff(ticks).min() >= np.log(20) / 10 - 1e-12 and np.isclose(np.exp(ticks[-1]), 100)
    P.plt.close(fig)


def test_figures_leak_no_warning(three_axes):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig, _ = P.facet_maps(pb.load(three_axes), "signal_norm", "noise_ratio", "test_loss")
        P.plt.close(fig)


def test_slice_names_keep_signs_and_digits_and_boundary_fits_need_positive_slices():
    assert P.slice_tag({"d": 3.6e7}) == "d3.6e+07" and P.slice_tag({"x": 3.6e-7}) == "x3.6e-07"
    assert P.slice_tag({"lr": 0.001}) != P.slice_tag({"lr": 0.0010001})
    assert P.slice_tag({"d": 2000, "train": "W,p"}) == "d2000_trainW-p"
    from phasebo.scaling import power_law_row

    b = pd.DataFrame({"weight_decay": [0.0, 0.1, 0.2], "boundary": [1.0, 2.0, 3.0],
                      "lo": [0.9, 1.8, 2.7], "hi": [1.1, 2.2, 3.3], "status": "ok",
                      "between": "benign/harmful"})
    assert power_law_row(b, "snr", "weight_decay")["status"] == "too_few_slices"  # log 0


def test_a_cases_sweep_with_an_axis_gets_no_map(tmp_path, capsys):
    cases = [{"d": 48, "signal_norm": 1.0}, {"d": 64, "signal_norm": 9.0}]
    plot = {"heatmaps": [{"x": "signal_norm", "y": "d", "value": "regime"}]}
    spec = pb.spec_from_dict({k: v for k, v in BASE.items() if k != "lr"}, {"lr": [0.05, 0.1]},
                             seeds=1, name="cases_axis", cases=cases, plot=plot)
    run_sweep(spec, tmp_path / "ca", quiet=True)
    assert not list((tmp_path / "ca").glob("heatmap_regime_d_vs_signal_norm*.png"))
    assert "do not tile a map" in capsys.readouterr().err


def test_a_derived_plot_axis_that_varies_is_kept(three_axes, capsys):
    runs = pb.load(three_axes)
    h = {"x": "snr", "y": "noise_ratio", "value": "regime"}
    assert R._retarget(runs, h, "heatmap", 0) == ("heatmap", h)  # snr varies with signal_norm
    assert capsys.readouterr().err == ""


def test_the_fit_verdict_at_one_recorded_step(three_axes, tmp_path):
    from phasebo.cli import boundaries_main

    assert boundaries_main([str(three_axes), "--x", "signal_norm", "--y", "noise_ratio",
                            "--by", "lr", "--step", "last", "--boot", "100", "--no-plots",
                            "--out", str(tmp_path)]) == 0
    fit = pd.read_csv(tmp_path / "boundaries_benign_harmful_along_signal_norm_per_noise_ratio_by_lr"
                                  "_steps_last_fit.csv")
    assert sorted(fit["lr"]) == [0.05, 0.1]  # one verdict per --by group
    assert set(fit["status"]) <= {"ok", "scattered", "too_few_slices"}
    # over time: a verdict per group and recorded step, in a file of its own as the table's
    assert boundaries_main([str(three_axes), "--x", "signal_norm", "--y", "noise_ratio",
                            "--by", "lr", "--step", "all", "--boot", "100", "--no-plots",
                            "--out", str(tmp_path)]) == 0
    stem = "boundaries_benign_harmful_along_signal_norm_per_noise_ratio_by_lr_steps_all"
    table, fit = pd.read_csv(tmp_path / f"{stem}.csv"), pd.read_csv(tmp_path / f"{stem}_fit.csv")
    assert len(fit) == table.groupby(["lr", "step"]).ngroups
    # the one-step fit's row at each step: its horizon, estimator and replicates say what it is
    assert {"lr", "step", "exponent", "status", "n_boot", "horizon", "fitting", "n_points",
            "theory_exponent"} <= set(fit.columns) and (fit["n_boot"] == 100).all()
    # a comma list of recorded steps (as pb.boundaries takes a list): those steps' rows
    two = sorted(table["step"].unique())[-2:]
    assert boundaries_main([str(three_axes), "--x", "signal_norm", "--y", "noise_ratio",
                            "--by", "lr", "--step", ",".join(map(str, two)), "--boot", "100",
                            "--no-plots", "--out", str(tmp_path)]) == 0
    stem = stem.replace("_steps_all", "_steps_" + "-".join(map(str, two)))
    some = pd.read_csv(tmp_path / f"{stem}.csv")
    assert sorted(some["step"].unique()) == two
    assert len(some) == len(table[table["step"].isin(two)])
    assert boundaries_main([str(three_axes), "--x", "signal_norm", "--y", "noise_ratio",
                            "--step", "10,x"]) == 2


def test_a_fit_through_grid_gaps_only_is_grid_limited():
    """Every slice separated (its regimes do not overlap on the grid): the fit runs through gap
    midpoints, which the verdict, the command's summary and the figure say."""
    from phasebo.scaling import power_law_row, summary

    runs = _boundary_runs([25, 100, 400, 1600, 6400], seeds=10, spread=0.01)
    b = pb.boundaries(runs, "signal_norm", "d", ("benign", "harmful"), n_boot=100)
    assert set(b["status"]) <= {"separated", "unresolved", "all_A", "all_B"}
    assert power_law_row(b, "signal_norm", "d")["status"] == "grid_limited"
    assert "midpoints of grid gaps" in summary(b, "signal_norm", "d")
    fig = P.boundary_figure(runs, b, "signal_norm", "d")
    assert "grid-limited" in _note(fig)
    P.plt.close(fig)


def test_a_grid_refined_along_d_maps_with_d_across():
    """A refinement along d adds d values per signal_norm: rows of signal_norm tile a map,
    rows of d do not (a d value run at one signal_norm only), so the map turns round instead of
    falling back to the cases figure."""
    cells = [(20.0, d) for d in (250, 500, 1000)] + [(50.0, d) for d in (250, 354, 500, 1000)]
    df = pd.DataFrame(cells, columns=["signal_norm", "d"]).assign(round=0)  # a refined table
    assert R.map_axes(["signal_norm", "d"]) == ("signal_norm", "d")
    assert not R.tiles(df, "signal_norm", "d") and R.tiles(df, "d", "signal_norm")
    assert R.tiling_axes(df, ["signal_norm", "d"]) == ("d", "signal_norm")
    full = pd.DataFrame([(m, d) for m in (20.0, 50.0) for d in (250, 500)], columns=["signal_norm", "d"])
    assert R.tiling_axes(full, ["signal_norm", "d"]) == ("signal_norm", "d")  # as before
    # the same cells without the refinement's rounds: a sweep's holes, which no map fills
    assert not R.tiles(df.drop(columns="round"), "d", "signal_norm")


def test_an_axis_set_adds_gets_lines_or_files_of_its_own(tmp_path, capsys):
    """The file's lines fix noise_ratio by leaving it out; --set makes it an axis: the value
    line gets a line per noise_ratio (hue widened), the regime shares a file per noise_ratio,
    each said; nothing is pooled and nothing skipped."""
    from phasebo.config import build_spec

    fixed = {k: v for k, v in BASE.items() if k != "d"}
    raw = {"settings": fixed, "axes": {"signal_norm": [1.0, 9.0], "d": [40, 48]},
           "plot": {"lines": [{"x": "signal_norm", "hue": ["d"]},
                              {"x": "signal_norm", "value": "regime", "where": {"d": 40}}]}}
    spec = build_spec(raw, "added", overrides={"noise_ratio": [0.1, 0.4]})
    run_sweep(spec, tmp_path / "a")
    err = capsys.readouterr().err
    assert "skipped" not in err, err
    assert "line #1 (test_acc): noise_ratio also varies in this sweep (turned into an axis by " \
           "--set), so each value gets lines of its own" in err
    assert "line #2 (regime): noise_ratio also varies" in err
    names = {p.name for p in (tmp_path / "a").glob("line_*.png")}
    assert "line_test_acc_vs_signal_norm.png" in names
    assert len([n for n in names if n.startswith("line_regime_vs_signal_norm_d40_")]) == 2, names


def test_a_line_whose_x_is_fixed_is_drawn_against_its_hue_axis(tmp_path, capsys):
    """``x = "n"`` coloured by ``noise_ratio``, with n fixed by --set: the only axis left is the
    hue's, so the line is drawn against it without a hue (it was skipped: a column cannot be
    both), and with two axes left the hue stays and x takes the other."""
    lines = {"lines": [{"x": "n", "value": "test_acc", "hue": ["noise_ratio"]}]}
    base = {k: v for k, v in BASE.items() if k != "n"}
    spec = pb.spec_from_dict(base, {"noise_ratio": [0.1, 0.4]}, seeds=1, name="hue",
                             plot={**lines, "lines": [{**lines["lines"][0]}]},
                             cases=[{"n": 12}])
    run_sweep(spec, tmp_path / "h", quiet=True)
    assert [p.name for p in (tmp_path / "h").glob("line_*.png")] == \
        ["line_test_acc_vs_noise_ratio.png"]
    assert "skipped" not in capsys.readouterr().err
    two = pd.DataFrame({"n": 12, "noise_ratio": [0.1, 0.1, 0.4, 0.4], "d": [48, 96, 48, 96],
                        "seed": 0})
    assert R._retarget(two, lines["lines"][0], "line", 0, quiet=True) == \
        ("line", {"x": "d", "value": "test_acc", "where": None, "hue": ["noise_ratio"]})
    # the regime, coloured by the axis that becomes x: drawn as regime shares (no hue left)
    one = two[two["d"] == 48]
    shares = {"x": "n", "value": "regime", "hue": ["noise_ratio"]}
    assert R._retarget(one, shares, "line", 0, quiet=True) == \
        ("line", {"x": "noise_ratio", "value": "regime", "where": None})


def test_representative_cells_rank_a_setting_only_some_runs_have_and_words():
    """Flow and limit runs in one table: the flow's solver is a word for the flow runs and NaN
    for the limit's, which np.sort could not order (phasebo plot stopped with a TypeError)."""
    rows = []
    for dyn, solver in (("flow", "bosh3"), ("limit", np.nan)):
        for d in (900, 3600):
            for seed in range(3):
                reg = "benign" if d == 900 else "harmful"
                rows.append({"dynamics": dyn, "flow_solver": solver, "d": d, "seed": seed,
                             "regime": reg, "status": "ok", "test_acc": 1.0})
    runs = pd.DataFrame(rows)
    got = R.representative_cells(runs, ["d", "dynamics", "flow_solver"])
    assert [r for r, _ in got] == ["benign", "harmful"]
    assert {w["d"] for _, w in got} == {900, 3600}


def test_a_cell_without_recorded_dynamics_is_not_drawn_from_the_dynamics_table():
    dyn = pd.DataFrame({"dynamics": ["flow"] * 2, "d": [900, 3600], "step": [0, 0]})
    assert R._recorded(dyn, {"dynamics": "flow", "d": 900})
    assert not R._recorded(dyn, {"dynamics": "limit", "d": 900})  # the limit records nothing
    assert R._recorded(dyn, {"d": 900, "steps": 0})  # a column the dynamics lack: ignored


@pytest.mark.slow
def test_phasebo_plot_draws_a_flow_and_limit_sweep_by_dynamics(tmp_path, x64):
    f = tmp_path / "s.toml"
    f.write_text('name = "fl"\nseeds = 2\n[settings]\nmodel = "single_head"\nT = 2\n'
                 'n_test = 200\nnoise_ratio = 0.1\nsignal_norm = 30\nweight_decay = 0.01\n'
                 'dtype = "float64"\n[axes]\nn = [20, 40]\nd = [900, 3600]\n[[cases]]\n'
                 'dynamics = "limit"\n[[cases]]\ndynamics = "flow"\nflow_time = 100.0\n'
                 'record_log = 5\n')
    spec = pb.load_sweep(f)
    run_sweep(spec, tmp_path / "o", quiet=True, plots=False)
    names = {p.name for p in R.standard_figures(tmp_path / "o")}
    assert "map_regime_d_vs_n_by_dynamics.png" in names
    assert "map_regime_over_steps_d_vs_n_dynamicsflow.png" in names
    assert "accuracy_dynamics.png" in names


def test_a_pooled_analysis_has_files_of_its_own_and_no_plots_removes_a_stale_figure(
        three_axes, tmp_path, capsys):
    """Two result directories pooled wrote over the first one's own analysis, with nothing in
    the files to say which runs went in; --no-plots left the earlier figure beside new tables."""
    import json
    import shutil

    import pyarrow.parquet as pq

    from phasebo.cli import boundaries_main

    other = tmp_path / "other"
    shutil.copytree(three_axes, other)
    args = ["--x", "signal_norm", "--y", "noise_ratio", "--by", "lr", "--boot", "100"]
    assert boundaries_main([str(other), *args]) == 0
    own = {p.name: p.stat().st_mtime_ns for p in other.glob("boundar*")}
    figs = [p for p in other.glob("boundary_*.png")]
    assert figs
    capsys.readouterr()
    with pytest.warns(UserWarning, match="appear in more than one"):  # a copy: the same runs
        assert boundaries_main([str(other), str(three_axes), *args, "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "pooled from 2 result sets" in err and "replacing" not in err
    assert {p.name: p.stat().st_mtime_ns for p in other.glob("boundar*") if p.name in own} == own
    pooled = [p for p in other.glob("boundar*") if p.name not in own]
    assert pooled and all("_pooled-" in p.name for p in pooled)
    meta = pq.read_schema(next(p for p in pooled if p.suffix == ".parquet")).metadata
    assert json.loads(meta[b"phasebo.sources"]) == sorted(str(p.resolve())
                                                          for p in (other, three_axes))
    # the same analysis again without figures: the earlier figures go, and it says so
    assert boundaries_main([str(other), *args, "--no-plots"]) == 0
    assert "removed" in capsys.readouterr().err
    assert not any(p.exists() for p in figs)
