"""Every figure function on small real sweeps: a PNG of the right size, labelled axes, and a regime
map whose colours are the cells' regimes."""

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.image import imread

import phasebo as pb
from phasebo import analysis as A
from phasebo import plot as P
from phasebo import report as R
from phasebo.cli.plot import main as plot_main
from phasebo.results import REGIMES
from phasebo.sweep import run_sweep

BASE = {"n": 12, "n_test": 64, "T": 6, "d": 48, "steps": 40, "lr": 0.05, "record_log": 10}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One compile group: d fixed, (signal_norm, noise_ratio) swept, 2 seeds, dynamics recorded."""
    out = tmp_path_factory.mktemp("sweeps") / "grid"
    spec = pb.spec_from_dict(BASE, {"signal_norm": [1.0, 3.0, 9.0],
                                    "noise_ratio": [0.1, 0.25, 0.4]}, seeds=2, name="grid")
    run_sweep(spec, out, quiet=True)
    return out


def _png(fig, path, dpi=60):
    w, h = fig.get_size_inches()
    fig.savefig(path, dpi=dpi)
    P.plt.close(fig)
    img = imread(path)
    assert path.stat().st_size > 2000
    assert img.shape[:2] == (round(h * dpi), round(w * dpi))
    assert img[..., :3].std() > 0.05  # not blank
    return img


def test_sweep_figures_written_by_the_sweep(sweep):
    pngs = {p.name for p in sweep.glob("heatmap_*.png")}
    # four maps of the final metrics, and (dynamics recorded) the regime map over the steps
    assert len(pngs) == 5 and "heatmap_regime_noise_ratio_vs_signal_norm.png" in pngs
    assert "heatmap_regime_over_steps_noise_ratio_vs_signal_norm.png" in pngs


def test_regime_maps_over_time_are_the_regimes_at_each_recorded_step(sweep, tmp_path):
    dyn = pb.load(sweep, "dynamics")
    fig, axs = P.regime_maps_over_time(dyn, "signal_norm", "noise_ratio")
    steps = fig.regime_steps
    assert steps[-1] == 40 and len(steps) <= 6 and steps == sorted(steps)
    assert set(steps) <= set(dyn["step"].unique())
    for ax, s in zip(axs.flat, steps):
        assert ax.get_title() == f"step {s}"
        expect = A.pivot(pb.aggregate(dyn, step=s), "signal_norm", "noise_ratio", "regime")
        codes = np.asarray(ax.collections[0].get_array()).reshape(expect.shape)
        got = np.array(ax.regime_categories, dtype=object)[codes.astype(int)]
        assert (got == expect.to_numpy().astype(str)).all()
    # one colour key for every panel
    assert len({tuple(ax.regime_categories) for ax in axs.flat[:len(steps)]}) == 1
    _png(fig, tmp_path / "steps.png")


def test_boundary_trajectory_draws_a_line_per_slice(tmp_path):
    rows = [{"step": s, "d": d, "boundary": 10.0 * d / s, "lo": 8.0 * d / s, "hi": 12.0 * d / s,
             "status": "ok", "n_seeds": 10, "between": "benign/not_overfitting"}
            for s in (10, 100, 1000) for d in (100, 200)]
    fig, ax = P.boundary_trajectory(pd.DataFrame(rows), "signal_norm", "d")
    assert len(ax.get_lines()) >= 2 and ax.get_xscale() == "log"
    assert "benign / not overfitting over time" in ax.get_title()
    _png(fig, tmp_path / "traj.png")
    # the estimator is named where the boundaries recorded it
    fig, ax = P.boundary_trajectory(pd.DataFrame(rows).assign(fitting="apart"), "signal_norm", "d")
    assert "over time, runs still fitting left apart\n" in ax.get_title()
    # the horizon is one piece: a wrapped title broke it as "recorded to step / 2000 (time 10)"
    rows = [{**r, "steps": 2000, "time": r["step"] / 200} for r in rows]
    fig, ax = P.boundary_trajectory(pd.DataFrame(rows), "signal_norm", "d")
    lines = ax.get_title().split("\n")
    assert any("to\u00a0step\u00a01000\u00a0(time\u00a05)" in line for line in lines), lines
    # points resting on fewer seeds (an early step): the range, not the most
    rows[0]["n_seeds"] = 7
    fig, ax = P.boundary_trajectory(pd.DataFrame(rows), "signal_norm", "d")
    assert "95% intervals over 7–10 seeds" in ax.get_title()
    # more slices than it draws (six, spread): the title says how many of them
    many = [{**r, "d": d} for r in rows[:3] for d in (100, 200, 300, 400, 500, 600, 700)]
    fig, ax = P.boundary_trajectory(pd.DataFrame(many), "signal_norm", "d")
    assert len(ax.containers) == 6 and "6 of the 7 slices" in ax.get_title().replace("\n", " ")


def test_regime_map_colours_are_the_cell_regimes(sweep, tmp_path):
    runs = pb.load(sweep)
    fig, ax = P.regime_map(runs, "signal_norm", "noise_ratio",
                           theory={"r = 0.05 ‖μ‖": lambda mu: 0.05 * mu})
    fig.canvas.draw()
    expect = A.pivot(A.aggregate(runs), "signal_norm", "noise_ratio", "regime")
    mesh = ax.collections[0]
    codes = np.asarray(mesh.get_array()).reshape(expect.shape)
    faces = mesh.get_facecolors().reshape(*expect.shape, 4)
    for i, dval in enumerate(expect.index):
        for j, mu in enumerate(expect.columns):
            reg = expect.loc[dval, mu]
            assert ax.regime_categories[int(codes[i, j])] == reg
            assert np.allclose(faces[i, j], to_rgba(P.REGIME_COLORS[reg]))
    assert ax.get_xlabel().startswith("‖μ‖") and ax.get_ylabel() == "noise ratio"
    assert "2 seeds per cell" in ax.get_title()
    # the y axis increases upwards, the x axis to the right (origin at the lower left)
    assert ax.get_ylim()[0] < ax.get_ylim()[1] and ax.get_xlim()[0] < ax.get_xlim()[1]
    labels = [t.get_text() for t in fig.axes[-1].get_yticklabels()]
    assert labels[:3] == ["benign", "harmful", "not overfitting"]
    assert len(ax.get_legend().get_texts()) == 1  # the theory curve
    _png(fig, tmp_path / "regime.png")


def test_regime_map_on_synthetic_cells_log_axes(tmp_path):
    cells = pd.DataFrame({"n": [10, 100, 1000, 10, 100, 1000], "snr": [0.01] * 3 + [1.0] * 3,
                          "regime": ["harmful", "harmful", "benign", "benign", "benign",
                                     "mixed"], "n_seeds": 3, "n_ok": 3, "n_failed": 0})
    fig, ax = P.regime_map(cells, "n", "snr", theory=P.magen_overlay(c=1.0))
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.regime_categories == ["benign", "harmful", "not_overfitting", "mixed"]
    codes = np.asarray(ax.collections[0].get_array()).reshape(2, 3)
    assert codes.tolist() == [[1, 1, 0], [0, 0, 3]]
    _png(fig, tmp_path / "m7.png")


@pytest.mark.parametrize("value", R.MAP_VALUES[1:])
def test_value_maps(sweep, value, tmp_path):
    runs = pb.load(sweep)
    fig, ax = P.value_map(runs, value, "signal_norm", "noise_ratio")
    assert ax.get_xlabel().startswith("‖μ‖") and ax.get_ylabel() == "noise ratio"
    assert fig.axes[-1].get_ylabel().startswith(P._label(value))  # the colour bar
    _png(fig, tmp_path / f"{value}.png")


def test_dynamics_figures(sweep, tmp_path):
    dyn = pb.load_dynamics(sweep)
    w = {"noise_ratio": 0.25, "signal_norm": 3.0}
    fig, axes = P.attention_dynamics(dyn, where={**w, "seed": 0})
    assert [a.get_title() for a in axes] == ["clean sample", "flipped sample"]
    assert axes[0].get_ylabel() == "softmax probability" and axes[0].get_xlabel() == "step"
    assert len(axes[0].get_lines()) == 6  # one line per token
    legend = [x.get_text() for x in axes[-1].get_legend().get_texts()]
    assert legend == ["relevant", "weakly relevant", "weak, opposite class", "irrelevant"]
    _png(fig, tmp_path / "attn.png")
    # a model without Sakamoto & Sato's token layout (Magen et al.'s data): signal, then noise
    magen = dyn.drop(columns=["n_relevant", "n_weak", "n_weak_opp"]).assign(noise_mode="projected")
    fig, axes = P.attention_dynamics(magen, where={**w, "seed": 0})
    assert [x.get_text() for x in axes[-1].get_legend().get_texts()] == ["signal token",
                                                                         "noise token"]
    P.plt.close(fig)
    fig, axes = P.attention_dynamics(magen.drop(columns=["noise_mode"]), where={**w, "seed": 0})
    assert [x.get_text() for x in axes[-1].get_legend().get_texts()] == ["token (no roles)"]
    P.plt.close(fig)
    fig, ax = P.ss_dynamics(dyn, where=w)
    assert ax.get_ylabel().startswith("s(1 − s)") and "2 runs" in ax.get_title()
    _png(fig, tmp_path / "ss.png")
    fig, axes = P.accuracy_dynamics(dyn, where={"noise_ratio": 0.25}, hue=["signal_norm"])
    assert axes[0].get_xscale() == "symlog" and axes[1].get_ylabel() == "logistic loss"
    assert len(axes[0].get_lines()) == 6  # train + test for 3 cells
    _png(fig, tmp_path / "acc.png")
    fig, axes = P.gap_dynamics(dyn, where=w)
    assert axes[1].get_ylabel().startswith("g(gap)")
    _png(fig, tmp_path / "gaps.png")


def test_s_ratio_curves(sweep, tmp_path):
    runs = pb.load(sweep)
    fig, axes = P.s_ratio_curves(runs)
    assert axes[0].get_xlabel() == "noise ratio" and axes[0].get_yscale() == "log"
    # one line per signal norm, named once, in the legend beside the panels
    assert axes[0].get_legend() is None and len(axes[1].get_legend().get_texts()) == 3
    assert fig.get_suptitle().startswith("prompt_attention")  # the settings the lines share
    _png(fig, tmp_path / "s4.png")


def test_token_projection_on_constructed_query(tmp_path):
    if "constructed_query" not in pb.MODELS:
        pytest.skip("constructed_query is not registered")
    spec = pb.spec_from_dict({"model": "constructed_query", "d": 300, "n": 20, "n_test": 40,
                              "signal_norm": 10.0}, {"query_lambda": [0.01, 1.0]}, name="s1")
    run_sweep(spec, tmp_path / "s1", quiet=True, plots=False)
    smp = pb.load_samples(tmp_path / "s1")
    fig, ax = P.token_projection(smp, where={"query_lambda": 1.0})
    assert ax.get_xlabel().endswith("e₁") and ax.get_ylabel().endswith("e₂")
    n_points = sum(len(c.get_offsets()) for c in ax.collections[2:])
    assert n_points >= 60  # 20 train + 40 test (+ flipped outlines)
    _png(fig, tmp_path / "s1.png")
    assert plot_main([str(tmp_path / "s1"), "--out", str(tmp_path / "figs")]) == 0
    assert list((tmp_path / "figs").glob("token_projection_*.png"))


def test_token_projection_synthetic(tmp_path):
    pts = pd.DataFrame({"x1": [20.0, 0.1, 19.0, 1.0], "x2": [0.2, 20.0, 0.5, 18.0],
                        "label": [1, -1, 1, -1], "split": ["train", "train", "test", "test"],
                        "flipped": [True, False, False, False]})
    fig, ax = P.token_projection(pts)
    assert ax.get_xlim() == ax.get_ylim()
    _png(fig, tmp_path / "s1_syn.png")


def test_command_line_standard_figures(sweep, tmp_path, capsys):
    assert plot_main([str(sweep), "--out", str(tmp_path), "--format", "png,pdf"]) == 0
    names = {p.name for p in tmp_path.glob("*.png")}
    assert {"map_regime_noise_ratio_vs_signal_norm.png", "accuracy_dynamics.png",
            "s_ratio_curves.png"} <= names
    regimes = set(pb.aggregate(pb.load(sweep), by=["signal_norm", "noise_ratio"])["regime"]
                  .astype(str)) - {"failed"}
    # one representative cell per regime that occurs in the grid
    assert {n[len("attention_"):-4] for n in names if n.startswith("attention_")} == regimes
    pdf = tmp_path / "accuracy_dynamics.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 5000
    assert "replaced" not in capsys.readouterr().err  # a new directory: nothing replaced
    assert plot_main([str(sweep), "--out", str(tmp_path), "--format", "png"]) == 0
    err = capsys.readouterr().err  # the same figures again: said, not silent
    assert f"replaced {len(names)} figure(s) already in {tmp_path}" in err
    assert plot_main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_axis_scale_follows_the_grid():
    assert not P._auto_log("d", np.arange(250, 5001, 125))  # the paper's linear grid
    assert P._auto_log("signal_norm", np.array([2.5, 5, 10, 20, 40]))  # geometric
    # a sweep file's { start = 3, stop = 15, num = 9, log = true }: ratio 1.22 (was drawn linear)
    assert P._auto_log("signal_norm", np.geomspace(3, 15, 9))
    assert P._auto_log("n", np.array([10, 20, 50, 500]))  # uneven, spans > 10x
    assert not P._auto_log("noise_ratio", np.array([0.1, 0.2, 0.4, 0.9]))
    e = P._edges(np.array([10.0, 100.0, 1000.0]), log=True)
    assert np.allclose(np.log10(e), [0.5, 1.5, 2.5, 3.5])


def test_value_map_colour_scales_compare_across_sweeps_and_say_the_data_range(sweep):
    runs = pb.load(sweep)
    cells = pb.aggregate(runs, by=["signal_norm", "noise_ratio"])
    # accuracies on the fixed [0.5, 1]: two sweeps' maps compare by colour
    fig, ax = P.value_map(runs, "test_acc", "signal_norm", "noise_ratio")
    lo, hi = cells["test_acc_mean"].min(), cells["test_acc_mean"].max()
    mesh = ax.collections[0]
    assert lo >= 0.5 and (mesh.norm.vmin, mesh.norm.vmax) == (0.5, 1.0)
    assert P.range_text(lo, hi) in fig.axes[-1].get_ylabel()
    P.plt.close(fig)
    # other metrics span their data
    fig, ax = P.value_map(runs, "p_norm", "signal_norm", "noise_ratio")
    lo, hi = cells["p_norm_mean"].min(), cells["p_norm_mean"].max()
    mesh = ax.collections[0]
    assert mesh.norm.vmin == pytest.approx(lo) and mesh.norm.vmax == pytest.approx(hi)
    P.plt.close(fig)
    # the range has the digits that tell its ends apart
    assert P.range_text(0.9995, 1.0) == "0.9995–1" and P.range_text(0.5, 0.75) == "0.5–0.75"
    assert P.range_text(0.123456, 0.123457) == "0.123456–0.123457"
    assert P.fixed_scale("train_acc_noisy", 0.3) == (0.0, 1.0)
    assert P.fixed_scale("frac_noisy_fitted", 0.9) == (0.0, 1.0) and not P.fixed_scale("margin", 0)


def test_a_value_that_no_cell_has_draws_a_grey_map_that_says_so(sweep):
    runs = pb.load(sweep).assign(all_fit_step=np.nan)  # e.g. no run ever fitted every label
    fig, ax = P.value_map(runs, "all_fit_step", "signal_norm", "noise_ratio")
    assert "no value in any cell" in fig.axes[-1].get_ylabel()
    assert "never happened in any seed" in ax.get_title()
    assert ax.collections[0].get_array().mask.all()
    P.plt.close(fig)


def test_a_third_axis_is_refused_with_a_fix_in_the_sweep_files_syntax(sweep):
    runs = pb.load(sweep)
    with pytest.raises(ValueError) as e:
        P.value_map(runs, "test_acc", "signal_norm", "d")
    msg = str(e.value)
    assert "where = { noise_ratio = " in msg and " } in the [plot] entry" in msg
    assert "where={'noise_ratio': " in msg and "}}" not in msg


def test_small_grids_keep_positive_axes_positive_and_legends_honest():
    cells = pd.DataFrame({"d": [1000, 1000], "signal_norm": [5.0, 30.0],
                          "regime": ["harmful", "benign"], "n_seeds": 2, "n_ok": 2, "n_failed": 0,
                          "n": 20})
    fig, ax = P.regime_map(cells, theory=P.iso_snr_overlay(n=20))
    assert ax.get_xlim()[0] > 0  # a 1 x 2 grid: no edge at negative ||mu||
    # n SNR^2 = 0.1 at d = 1000 is ||mu|| = 2.2: outside this map, so not in the legend either
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["n‖μ‖²/(σ²d) = 4"]
    assert len(ax.get_lines()) == 1
    P.plt.close(fig)


def test_one_axis_sweeps_get_line_plots_with_se_bands(tmp_path):
    spec = pb.spec_from_dict({"d": 300, "steps": 30, "n_test": 100},
                             {"signal_norm": [3.0, 10.0, 30.0]}, seeds=3, name="line")
    run_sweep(spec, tmp_path / "l", quiet=True)
    pngs = sorted(p.name for p in (tmp_path / "l").glob("line_*.png"))
    assert pngs == ["line_test_acc_vs_signal_norm.png", "line_train_acc_vs_signal_norm.png"]
    fig, ax = P.line_plot(pb.load(tmp_path / "l"), "signal_norm", "test_acc")
    assert len(ax.get_lines()) == 1 and len(ax.collections) == 1  # the mean and its SE band
    assert "3 seeds" in ax.get_title()
    _png(fig, tmp_path / "line.png")
    # a run without a value (as a flipped-sample metric of a run that drew no flip) is not
    # counted in the title's seeds
    runs = pb.load(tmp_path / "l")
    runs.loc[runs.index[0], "test_acc"] = np.nan
    fig, ax = P.line_plot(runs, "signal_norm", "test_acc")
    assert "2–3 seeds" in ax.get_title()
    counts = A.finite_counts(runs.assign(status=np.where(runs["signal_norm"] == 3.0, "diverged",
                                                         runs["status"])), ["signal_norm"],
                             "test_acc")
    assert counts.tolist() == [0, 3, 3]  # a cell whose runs all failed counts none
    _png(fig, tmp_path / "line_missing.png")


def test_regime_shares_are_each_cells_counts_with_wilson_bands(tmp_path):
    spec = pb.spec_from_dict({"d": 300, "steps": 30, "n_test": 100},
                             {"signal_norm": [3.0, 10.0, 30.0]}, seeds=4, name="shares")
    runs = run_sweep(spec, tmp_path / "s", quiet=True, plots=False)
    fig, ax = P.line_plot(runs, "signal_norm", "regime")  # value = "regime": the shares
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    counts = runs.groupby("signal_norm")["regime"].value_counts().unstack(fill_value=0)
    present = [r for r in REGIMES if r in counts.columns and counts[r].any()]
    assert labels == [r.replace("_", " ") for r in present]  # only regimes that occur
    shares = np.array([line.get_ydata() for line in ax.get_lines()])
    np.testing.assert_allclose(shares.sum(axis=0), 1.0)  # each cell's shares add up to one
    for line, r in zip(ax.get_lines(), present):
        np.testing.assert_allclose(line.get_ydata(), counts[r].to_numpy() / 4)
    lo_hi = [c.get_paths()[0].vertices[:, 1] for c in ax.collections]
    assert all(v.min() >= 0 and v.max() <= 1 for v in lo_hi)  # Wilson bands stay in [0, 1]
    assert "4 seeds" in ax.get_title() and "30 steps" in ax.get_title()
    _png(fig, tmp_path / "shares.png")
    with pytest.raises(ValueError, match="no hue"):
        P.line_plot(runs, "signal_norm", "regime", hue=["d"])


def test_plot_command_at_a_recorded_step(sweep, tmp_path, capsys):
    dyn = dyn_all = pb.load(sweep, "dynamics")
    step = int(sorted(dyn["step"].unique())[5])
    assert plot_main([str(sweep), "--step", str(step), "--out", str(tmp_path)]) == 0
    names = {p.name for p in tmp_path.glob("*.png")}
    assert f"map_regime_noise_ratio_vs_signal_norm_step{step}.png" in names
    dyn = pb.at_step(dyn, step)
    fig, ax = R._map(dyn, {"x": "signal_norm", "y": "noise_ratio", "value": "regime"})
    horizon = int(dyn_all["steps"].iloc[0])
    assert f"step {step} of {horizon}" in ax.get_title()  # the map's step, not the horizon alone
    fig2, ax2 = P.value_map(dyn, "test_acc", "signal_norm", "noise_ratio")
    assert f"step {step} of {horizon}" in ax2.get_title()
    P.plt.close(fig2)
    expect = A.pivot(pb.aggregate(dyn), "signal_norm", "noise_ratio", "regime")
    codes = np.asarray(ax.collections[0].get_array()).reshape(expect.shape).astype(int)
    assert (np.array(ax.regime_categories, dtype=object)[codes] == expect.to_numpy()).all()
    P.plt.close(fig)
    assert plot_main([str(sweep), "--step", "41", "--out", str(tmp_path)]) == 2
    assert "step = 41 was not recorded" in capsys.readouterr().err
    last = int(dyn_all["step"].max())  # one horizon: "last" is named by its step
    assert plot_main([str(sweep), "--step", "last", "--out", str(tmp_path / "last")]) == 0
    assert (tmp_path / "last" / f"map_regime_noise_ratio_vs_signal_norm_step{last}.png").exists()


def test_titles_name_the_weight_decay_and_the_dynamics_only_when_they_apply():
    from phasebo.plot_grid import settings_text

    limit = pd.DataFrame({"model": ["single_head"], "n": [50], "dynamics": ["limit"],
                          "weight_decay": [0.01], "lr": [0.01], "steps": [100]})
    assert settings_text(limit) == "single_head, n 50, converged limit, weight decay 0.01"
    gd = limit.assign(dynamics="gd", weight_decay=0.0)
    assert settings_text(gd) == "single_head, n 50, lr 0.01, 100 steps"
    # a flow's map at a recorded step gives that step's time beside the horizon's (it gave the
    # horizon's alone: "step 1000 of 1000000, gradient flow, τ 5000")
    flow = gd.assign(dynamics="flow", steps=10**6, flow_time=5000.0, lr=0.005, step=1000,
                     time=5.0)
    assert settings_text(flow).replace("\n", " ") == (
        "single_head, n 50, lr 0.005, step 1000 (τ 5) of 1000000 (τ 5000), gradient flow")


def test_a_table_of_flow_and_limit_runs_gives_the_flows_horizon_and_solver_overrides():
    """The limit's rows have no steps: a flow-and-limit table read "0–4000 steps"; and a flow's
    solver cap set away from its default (it decides which runs are solved) was not named."""
    from phasebo.plot_grid import settings_text

    both = pd.DataFrame({"model": ["single_head"] * 2, "dynamics": ["flow", "limit"],
                         "steps": [4000, 0], "flow_max_steps": [50000, np.nan]})
    text = settings_text(both).replace("\n", " ")
    assert "4000 steps (the limit: none)" in text and "0–4000" not in text
    flow = both.iloc[:1]
    assert settings_text(flow).endswith("flow_max_steps 50000")
    assert "flow_max_steps" not in settings_text(flow.assign(flow_max_steps=20000))  # the default
    assert settings_text(flow.assign(flow_max_steps=20000, flow_solver="dopri8")).endswith(
        "flow_solver dopri8")


def test_a_grids_title_keeps_clear_of_its_panels_titles():
    """A three-line figure title over two-line panel titles (a panel without any value says
    so on a second line) overlapped them."""
    fig, axs, _ = P._panel_grid(2)
    axs.flat[0].set_title("dynamics = flow")
    axs.flat[1].set_title("dynamics = limit\n(no value in any cell)")
    P.panels_title(fig, axs, "a metric, 2 seeds per cell\nsingle_head, T 2, r 0.1, 4000 steps,\n‖μ‖ 30")
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    sup = fig._suptitle.get_window_extent(r)
    assert all(ax.title.get_window_extent(r).y1 < sup.y0 for ax in axs.flat)
    P.plt.close(fig)

def test_every_regime_colour_shows_on_white_and_apart_from_cells_without_a_value():
    """A regime's line (the regime shares) and cell must show on the white figure and not look
    like a cell never run: no_noise was white, an invisible line."""
    from matplotlib.colors import to_rgb

    from phasebo.plot_style import REGIME_COLORS

    for regime, c in REGIME_COLORS.items():
        assert max(1 - ch for ch in to_rgb(c)) > 0.1, regime  # not white or near it
        assert to_rgb(c) not in (to_rgb("#FFFFFF"), to_rgb("#f2f2f2")), regime
    assert len(set(REGIME_COLORS.values())) == len(REGIME_COLORS)  # each regime its own colour


def test_a_grid_with_a_hole_is_no_map_unless_refined():
    """Five of the six (d, ‖μ‖) cells (a [[cases]] sweep): a map would draw (250, 20), never
    run, as its neighbours' colours; a refined grid's rows (a ``round`` column) hold their own
    values, each cell drawn out to its neighbours'."""
    from phasebo.plot_grid import is_grid

    rows = [{"d": d, "signal_norm": m, "seed": s, "regime": "benign", "status": "ok"}
            for d in (250, 4000) for m in (5.0, 20.0, 80.0) for s in range(2)
            if (d, m) != (250, 20.0)]
    df = pd.DataFrame(rows)
    assert not is_grid(df, "signal_norm", "d")
    assert is_grid(df.assign(round=0), "signal_norm", "d")
    with pytest.raises(ValueError, match=r"only 5 of the 3 x 2 \(signal_norm, d\) cells were "
                                         r"run \(not \(20, 250\)"):
        P.regime_map(df, "signal_norm", "d")
    fig, _ = P.regime_map(df.assign(round=0), "signal_norm", "d")
    P.plt.close(fig)


def test_line_figures_say_how_many_failed_runs_they_leave_out():
    rows = [{"noise_ratio": r, "seed": s, "test_acc": 0.9, "regime": "benign",
             "status": "diverged" if (r, s) == (0.2, 1) else "ok"}
            for r in (0.1, 0.2, 0.3) for s in range(3)]
    df = pd.DataFrame(rows)
    fig, ax = P.line_plot(df, "noise_ratio", "test_acc")
    assert "(1 failed run left out)" in ax.get_title()
    P.plt.close(fig)
    fig, ax = P.regime_shares(df, "noise_ratio")
    assert "(1 failed run left out)" in ax.get_title()
    P.plt.close(fig)
    fig, ax = P.line_plot(df.assign(status="ok"), "noise_ratio", "test_acc")
    assert "failed" not in ax.get_title()
    P.plt.close(fig)


def test_a_sweep_of_two_models_draws_a_line_per_model_and_plots_again(tmp_path):
    """Settings only one model has are NaN for the other: its line is drawn (not dropped as a NaN
    group), named by the model alone, and ``phasebo plot`` redraws the directory."""
    spec = pb.spec_from_dict({"n": 20, "d": 100, "noise_ratio": 0.2}, {"signal_norm": [5.0, 20.0]},
                             cases=[{"model": "prompt_attention", "steps": 20},
                                    {"model": "constructed_query"}], seeds=2, name="two")
    df = run_sweep(spec, tmp_path / "two", quiet=True, plots=False)
    fig, ax = P.line_plot(df, "signal_norm", "test_acc")
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["model=constructed_query", "model=prompt_attention"], labels
    assert all(len(line.get_xdata()) == 2 for line in ax.get_lines())
    assert "20 steps" in ax.get_title()  # the horizon of the model that has one
    assert plot_main([str(tmp_path / "two")]) == 0
    assert list((tmp_path / "two" / "figures").glob("token_projection_*constructed_query*.png"))


def test_titles_state_the_horizon_and_rule_and_spread_grids_get_a_log_axis():
    from phasebo.plot_grid import _auto_log, settings_text

    df = pd.DataFrame({"model": "vit_digits", "n": [20, 40], "steps": [60, 90], "epochs": 30,
                       "optimizer": "adamw", "batch_size": 16, "lr": 3e-4,
                       "lr_schedule": "linear"})
    text = settings_text(df, skip=("n",)).replace("\n", " ")
    for part in ("adamw", "linear schedule", "batch 16", "60–90 steps", "30 epochs"):
        assert part in text, text
    ref = pd.DataFrame({"model": "vit_digits", "n": 20, "test_reference": "clean",
                        "test_eps": 0.1}, index=[0])
    assert "benign against the clean runs' test acc, test_eps 0.1" in settings_text(ref)
    assert "test_eps" not in settings_text(ref.assign(test_eps=0.05, test_reference="absolute"))
    assert _auto_log("query_lambda", np.array([0.001, 0.06, 1.0]))
    assert not _auto_log("x", np.array([1.0, 2.0, 3.0, 5.0]))


def test_panels_are_named_by_the_axis_that_tells_them_apart_once():
    """GD against a flow in [[cases]]: flow_time (NaN for GD) is tied to dynamics; the panels
    are titled by dynamics alone (they listed every flow setting and overlapped)."""
    rows = [{"d": d, "signal_norm": m, "seed": s, "regime": "benign", "status": "ok",
             "dynamics": dyn, "flow_time": 5.0 if dyn == "flow" else np.nan}
            for dyn in ("gd", "flow") for d in (250, 4000) for m in (5.0, 20.0) for s in range(2)]
    fig, axs = P.facet_maps(pd.DataFrame(rows), "signal_norm", "d", "regime")
    titles = sorted(a.get_title() for a in np.ravel(axs) if a.get_title())
    assert titles == ["dynamics = flow", "dynamics = gd"]
    P.plt.close(fig)


def test_a_flows_regime_maps_over_time_give_each_panels_flow_time():
    """A flow's recorded steps are GD-equivalent steps of lr: each panel says its flow time too
    (the figure's settings give only the horizon's)."""
    rows = [{"signal_norm": m, "d": d, "seed": 0, "status": "ok", "step": s, "time": s * 0.005,
             "dynamics": "flow", "regime": "benign", "test_acc": 1.0}
            for m in (1.0, 3.0) for d in (100, 300) for s in (0, 1000, 10000)]
    fig, axs = P.regime_maps_over_time(pd.DataFrame(rows), "signal_norm", "d", steps=[1000, 10000])
    assert [ax.get_title() for ax in axs.flat[:2]] == ["step 1000 (τ 5)", "step 10000 (τ 50)"]
    P.plt.close(fig)
    # by default a panel per decade of τ over the last three (GD: two decades of steps)
    cells = [r for r in rows if r["step"] == 0]  # one row per (signal_norm, d)
    many = pd.DataFrame([{**r, "step": s, "time": s * 0.005} for r in cells
                         for s in (0, 10, 100, 1000, 10**4, 10**5, 10**6)])
    fig, _ = P.regime_maps_over_time(many, "signal_norm", "d")
    assert fig.regime_steps == [1000, 10**4, 10**5, 10**6]
    P.plt.close(fig)
    fig, _ = P.regime_maps_over_time(many.assign(dynamics="gd"), "signal_norm", "d")
    assert fig.regime_steps[0] == 10**4 and fig.regime_steps[-1] == 10**6
    P.plt.close(fig)


def test_a_line_names_the_settings_that_follow_its_model():
    """A sweep of single_head against a four-layer model: the lines read "model=multi_layer"
    without its n_layers (tied to the model, so not a hue of its own)."""
    rows = [dict(model=m, n_layers=nl, signal_norm=sn, seed=s, test_acc=0.8 + 0.05 * sn,
                 status="ok", regime="benign", d=100, n=20)
            for m, nl in (("single_head", np.nan), ("multi_layer", 4))
            for sn in (1.0, 2.0, 3.0) for s in range(2)]
    fig, ax = P.line_plot(pd.DataFrame(rows), "signal_norm")
    assert ax.get_legend_handles_labels()[1] == ["model=multi_layer, n_layers=4",
                                                "model=single_head"]
    assert [len(line.get_xdata()) for line in ax.lines] == [3, 3]  # no cell split by n_layers
    P.plt.close(fig)


def test_a_boundary_the_grid_places_only_in_a_gap_is_drawn_apart_from_a_fitted_one():
    """A separated slice's point (the middle of its gap) looked like a located boundary."""
    b = pd.DataFrame({"d": [100.0, 200.0, 400.0], "boundary": [5.0, 7.0, 10.0],
                      "lo": [4.5, 5.0, 8.0], "hi": [5.5, 9.0, 12.0],
                      "status": ["ok", "separated", "unresolved"], "between": "benign/harmful"})
    fig, ax = P.plt.subplots()
    P.boundary_overlay(ax, b, "signal_norm", "d")
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["boundary benign/harmful (95% CI)",
                      "boundary benign/harmful (in a grid gap: unresolved or separated)"]
    markers = [c.lines[0].get_marker() for c in ax.containers]
    assert markers == ["o", "s"]
    P.plt.close(fig)
    # a separated slice open on one side (0 on a log axis) is a gap too, not "unbounded"
    fig, ax = P.plt.subplots()
    ax.set_xscale("log")
    P.boundary_overlay(ax, b.assign(lo=[4.5, 0.0, 8.0], status=["unbounded", "separated", "ok"]),
                       "signal_norm", "d")
    labels = ax.get_legend_handles_labels()[1]
    assert "boundary benign/harmful, in a grid gap open on one side" in labels
    assert any("interval unbounded" in lab for lab in labels)
    P.plt.close(fig)


def test_a_value_map_keeps_the_columns_of_failed_cells_as_cells_without_a_value():
    """Diverged step sizes dropped out of a value map: 2 of 4 columns drawn, the axis spanning
    step sizes never run, while the regime map beside it showed all 4."""
    rows = [dict(model="single_head", lr=lr, signal_norm=mu, seed=s, n=20, d=200,
                 status="ok" if lr < 1e6 else "diverged", regime="benign" if lr < 1e6 else
                 "diverged", test_acc=0.9 if lr < 1e6 else np.nan)
            for lr in (0.025, 1e4, 1e20, 1e36) for mu in (5.0, 10.0) for s in range(2)]
    fig, ax = P.value_map(pd.DataFrame(rows), "test_acc", "lr", "signal_norm")
    z = ax.collections[0].get_array()
    assert z.size == 8 and int(np.ma.count_masked(z)) == 4  # every cell, the failed ones empty
    assert "grey: no value" in ax.get_title()
    P.plt.close(fig)


def test_a_grid_value_whose_label_has_no_room_keeps_an_unlabelled_tick():
    """Step sizes 0.025, 1e4, 1e20, 1e36 on a log axis: the label of 1e4 has no room beside
    0.025's, and the cell had no tick at all."""
    rows = [dict(model="single_head", lr=lr, signal_norm=mu, seed=0, n=20, d=200, status="ok",
                 regime="benign", test_acc=0.9)
            for lr in (0.025, 1e4, 1e20, 1e36) for mu in (5.0, 10.0)]
    fig, ax = P.regime_map(pd.DataFrame(rows), "lr", "signal_norm")
    marked = np.sort(np.concatenate([ax.get_xticks(), ax.xaxis.get_minorticklocs()]))
    np.testing.assert_allclose(marked, [0.025, 1e4, 1e20, 1e36])
    assert len(ax.get_xticks()) < 4  # one label left out: no room for it
    P.plt.close(fig)


def test_no_figure_averages_runs_of_different_settings_unasked(sweep):
    """The dynamics figures averaged every run of the table (d and ‖μ‖ of 100 cells, titled
    "mean of 1000 runs"), line_plot(hue=[]) averaged an axis, and cells pooled with
    aggregate(over=...) were titled as seeds of one cell."""
    dyn, runs = pb.load_dynamics(sweep), pb.load(sweep)
    for draw in (P.accuracy_dynamics, P.ss_dynamics, P.gap_dynamics):
        with pytest.raises(ValueError, match="vary in the selected runs: a line would average"):
            draw(dyn)
    with pytest.raises(ValueError, match="signal_norm varies in the selected runs"):
        P.accuracy_dynamics(dyn, where={"noise_ratio": 0.25})
    with pytest.raises(ValueError, match="noise_ratio also varies: each point would average"):
        P.line_plot(runs, "signal_norm", hue=[])
    pooled = pb.aggregate(runs, over=["noise_ratio"])
    assert pooled.attrs["pooled_over"] == {"noise_ratio": 3}
    fig, ax = P.line_plot(pooled, "signal_norm", "test_acc")
    assert "mean ± SE over 6 runs" in ax.get_title() and "pooled over r (3 values)" in \
        ax.get_title().replace("\n", " ")
    P.plt.close(fig)
    # a cell's mean named as the aggregate's column is the metric; a missing one is one line
    cells = pb.aggregate(runs)
    fig, ax = P.line_plot(cells, "signal_norm", "test_acc_mean", where={"noise_ratio": 0.25})
    P.plt.close(fig)
    with pytest.raises(ValueError, match="no column test_acx_mean in the cells"):
        P.line_plot(cells, "signal_norm", "test_acx", where={"noise_ratio": 0.25})
    with pytest.raises(ValueError, match="stat = 'median'; fix: one of mean, se, min, max"):
        P.value_map(runs, "test_acc", "signal_norm", "noise_ratio", stat="median")
    # a step's mean is over the seeds where it happened, and the title says how many
    fig, ax = P.value_map(runs, "noisy_fit_step", "signal_norm", "noise_ratio")
    assert "mean over the seeds where it happened:" in ax.get_title()
    P.plt.close(fig)
    # the 𝔖 and gap figures name the cell their runs share (they named nothing)
    w = {"noise_ratio": 0.25, "signal_norm": 3.0}
    fig, ax = P.ss_dynamics(dyn, where=w)
    assert "r 0.25" in ax.get_title() and "‖μ‖ 3" in ax.get_title()
    P.plt.close(fig)
    fig, _ = P.gap_dynamics(dyn, where=w)
    assert "r 0.25" in fig.get_suptitle() and "‖μ‖ 3" in fig.get_suptitle()
    P.plt.close(fig)
    # one run's attention: of how many runs of its own cell (it counted the whole table)
    fig, _ = P.attention_dynamics(dyn)
    assert "1 of the cell's 2 runs" in fig._suptitle.get_text()
    P.plt.close(fig)
