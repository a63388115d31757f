"""The sweep driver and its command line: the results schema, regime thresholds from the file,
cases and includes, every shipped sweep file validated and dry-run, the CLI's errors (the grid,
the plan and the executor have test_grid.py, test_plan.py and test_execute.py)."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest

from phasebo.cli.sweep import main
from phasebo.config import load_sweep, spec_from_dict
from phasebo.settings import ConfigError
from phasebo.sweep import run_one, run_sweep

ROOT = Path(__file__).resolve().parents[1]

SMALL = {"settings": {"engine": "direct", "steps": 60, "lr": 0.05, "n_test": 200,
                      "record_every": 20},
         "axes": {"d": [40, 64], "signal_norm": [3.0, 30.0]}}


def small_spec(seeds=4, **kw):
    settings = {**SMALL["settings"], **kw}
    return spec_from_dict(settings, SMALL["axes"], seeds=seeds, name="small")


def read(out):
    return {k: pd.read_parquet(out / f"{k}.parquet") for k in ("results", "dynamics", "samples")}


def assert_same_tables(a, b, rtol=1e-5):
    for k in a:
        x, y = a[k], b[k]
        assert list(x.columns) == list(y.columns)
        assert len(x) == len(y)
        for c in x.columns:
            if pd.api.types.is_numeric_dtype(x[c]) and not pd.api.types.is_bool_dtype(x[c]):
                np.testing.assert_allclose(x[c].to_numpy(float), y[c].to_numpy(float),
                                           rtol=rtol, atol=1e-6, err_msg=f"{k}.{c}")
            else:
                assert (x[c].astype(str) == y[c].astype(str)).all(), f"{k}.{c}"












def test_results_schema(tmp_path):
    df = run_sweep(small_spec(seeds=1), tmp_path / "o", quiet=True, plots=False)
    assert list(df.columns[:6]) == ["sweep", "run_id", "model", "seed", "d", "signal_norm"]
    assert {"engine", "snr", "n_snr2", "noisy_fit_step", "cumS_clean_pos", "p_norm",
            "mass_noisy_weak_opp", "diverge_step", "train_acc", "test_acc", "status",
            "regime"} <= set(df.columns)
    # only the model's own settings: no Magen or encoder settings on a prompt-attention row
    assert not {"radius_v", "mlp_width", "query_lambda", "n_layers"} & set(df.columns)
    assert list(df["regime"].cat.categories) == ["benign", "harmful", "not_overfitting", "fitting",
                                                 "no_noise", "no_baseline", "diverged", "unsolved"]
    assert df["regime"].cat.ordered
    assert df["run_id"].dtype == np.int64 and df["noisy_fit_step"].dtype == np.int64
    np.testing.assert_allclose(df["snr"], df["signal_norm"] / np.sqrt(df["d"]))
    csv = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(csv.columns) == list(df.columns) and len(csv) == len(df)
    back = pd.read_parquet(tmp_path / "o" / "results.parquet")
    assert back["regime"].cat.ordered and back["model"].dtype == "category"


def test_regime_thresholds_from_the_sweep_file(tmp_path):
    """The harmful reference setting (d 5000, ||mu|| 5: every label fitted, test accuracy ~0.89)
    with test_eps = 0.5 from the file: benign, where the default 0.05 would say harmful."""
    f = tmp_path / "s.toml"
    f.write_text('seeds = 4\n[settings]\nd = 5000\nsignal_norm = 5.0\n'
                 '[regime]\ntest_eps = 0.5\n')
    df = run_sweep(load_sweep(f), tmp_path / "o", quiet=True, plots=False)
    assert (df["test_eps"] == 0.5).all()
    fits = df["train_acc"] >= 1
    between = fits & (df["test_acc"] >= 0.5) & (df["test_acc"] < 0.95)
    assert between.sum() >= 2  # the selection the threshold decides is not empty
    assert (df.loc[between, "regime"] == "benign").all()
    assert (df.loc[~fits, "regime"].isin(["not_overfitting", "fitting"])).all()


# --------------------------------------------------------------------------------------------
# The command line and its errors
# --------------------------------------------------------------------------------------------

GOOD = '[settings]\nd = 64\nsteps = 10\n[axes]\nsignal_norm = [3.0, 6.0]\n'
TWO = '[settings]\nsteps = 10\n[axes]\nsignal_norm = [3.0, 6.0]\nd = [64, 96]\n'


@pytest.mark.parametrize(
    "text, args, needles",
    [
        ("[settings]\ndd = 5\n", [], ["dd", "did you mean 'd'"]),
        (GOOD, ["--set", "lrr=0.1"], ["lrr", "lr"]),
        ("[settings]\nd = 0\n", [], ["d = 0", "> 0"]),
        ("[settings]\nd = -3\n", [], ["d = -3"]),
        ("[settings]\nT = 2\n", [], ["T = 2", "T >= 3"]),
        ("[settings]\nnoise_ratio = 1.0\n", [], ["noise_ratio = 1.0", "[0, 1)"]),
        ("[axes]\nnoise_ratio = [0.1, -0.2]\n", [], ["noise_ratio = -0.2"]),
        ("[settings]\nsteps = -1\n", [], ["steps = -1", ">= 0"]),
        (GOOD, ["--seeds", "0"], ["--seeds = 0"]),
        ("[axes]\nd = []\n", [], ["axis 'd' is empty"]),
        ("[settings]\nd = [\n", [], ["does not parse"]),
        ("[settings]\nmodel = \"nope\"\n", [], ["model = 'nope'"]),
        ("[settings]\nd = \"big\"\n", [], ["d = 'big'", "int"]),
        ("[axes]\nsignal_norm = { start = 5, stop = 1, step = 1 }\n", [], ["signal_norm"]),
        ("seeds = 2\nd = 5\n", [], ["'d'", "[settings]"]),
        (GOOD, ["--set", "d=0"], ["d = 0"]),
        (GOOD, ["--memory-budget", "lots"], ["--memory-budget"]),
        (GOOD, ["--set", "seeds=2"], ["'seeds' is not a setting", "--seeds"]),
        ("[settings]\nsignal_norm = 5.0\n[axes]\nsignal_norm = [5.0, 6.0]\n", [],
         ["'signal_norm' is also given in [settings]"]),
        ("[settings]\nweight_decay = 5.0\nmodel = \"encoder\"\nproject = true\n", [],
         ["project = True is not a setting of model 'encoder'", "prompt_attention"]),
        ("[settings]\nradius_v = 2.0\n", [],
         ["radius_v = 2.0 is not a setting of model 'prompt_attention'", "single_head"]),
        ("[settings]\nengine = \"reduced\"\ntrain = [\"p\", \"W\"]\n", [],
         ["engine = 'reduced' cannot run", "W is trained"]),
        (GOOD + '[plot]\nheatmaps = [{ x = "signal_norm", y = "d", value = "test_accuracy" }]\n',
         [], ["value = 'test_accuracy' is not a column", "test_acc"]),
        (GOOD + '[plot]\nheatmaps = [{ x = "sig", y = "d" }]\n', [], ["x = 'sig'"]),
        (GOOD + '[plot]\nheatmaps = [{ x = "signal_norm", y = "d", value = "test_acc", '
         'stat = "median" }]\n', [], ["stat = 'median'", "mean, se, min, max"]),
        (GOOD + '[plot]\nheatmaps = [{ x = "signal_norm", y = "d", value = "test_acc", vmin = "low" }]\n', [],
         ["vmin = 'low' is not a finite number"]),
        (GOOD + '[plot]\nheatmaps = [{ x = "signal_norm", y = "d", value = "test_acc", cmap = ["x"] }]\n', [],
         ["cmap = ['x'] is not a matplotlib colormap"]),
        (GOOD + '[plot]\nheatmaps = [{ x = "signal_norm", y = "d", value = "test_acc", '
         'cmap = "viridi" }]\n', [],
         ["cmap = 'viridi' is not a matplotlib colormap", "viridis"]),
        (GOOD + '[refine]\nrounds = "three"\n', [], ["rounds = 'three' is not a whole number"]),
        (GOOD + '[plot]\nlines = [{ x = "signal_norm", where = { signal_norm = 4.0 } }]\n', [],
         ["where signal_norm = 4.0 is not a value of this sweep (it has 3.0, 6.0)"]),
        (GOOD + '[plot]\nlines = [{ x = "signal_norm", where = { lr = 0.1 } }]\n', [],
         ["where lr = 0.1 is not a value of this sweep (it has 0.005)"]),
        (TWO + '[plot]\nlines = [{ x = "signal_norm", value = "regime" }]\n', [],
         ["lines #1: d (64, 96) also varies, so each point would pool", "where = { d = 64 }"]),
        (TWO + 'noise_ratio = [0.1, 0.2]\n[plot]\nlines = [{ x = "signal_norm", hue = ["d"] }]\n',
         [], ["noise_ratio (0.1, 0.2) also varies", "add 'noise_ratio' to hue"]),
        (GOOD + '[plot]\nlines = [{ x = "signal_norm", hue = ["dd"] }]\n', [],
         ["hue 'dd' is not a setting"]),
        (GOOD + '[plot]\nlines = [{ x = "signal_norm", where = { snr = 0.5 } }]\n', [],
         ["where snr = 0.5 is in no row", "0.375, 0.75"]),
        (GOOD + '[plot]\nheatmaps = [{ x = "signal_norm", y = "d", where = { dd = 1 } }]\n', [],
         ["heatmaps #1: where dd is not a setting or column of this sweep", "did you mean 'd'"]),
        (GOOD + '[plot]\ndpi = "high"\n', [], ["[plot] dpi = 'high' is not a resolution"]),
        (GOOD + '[plot]\ndpi = -5\n', [], ["[plot] dpi = -5", "from 10 to 2400"]),
        (GOOD + '[plot]\nformats = ["png", "gif"]\n', [], ["formats are png, pdf, svg"]),
        (GOOD, ["--format", "gif"], ["--format"]),
        (GOOD, ["--devices", "0"], ["--devices = 0"]),
        ('name = "../../up"\n' + GOOD, [], ["name = '../../up'", "one path component"]),
        (GOOD, ["--set", "signal_norm=[10, 40"], ["not a valid TOML list", "signal_norm=[10, 40]"]),
        (GOOD, ["--set", "model=[prompt_attention, single_head]"],
         ["'model=[\"prompt_attention\", \"single_head\"]' (words in quotes)"]),
        (GOOD + '[[cases]]\nn = 20\n[[cases]]\ntrain = "Wp"\n', [],
         ["bad.toml: [[cases]] #2: train = ['Wp'] is not supported"]),
        ("", [], ["is empty", "[settings]"]),
        ("include = \"base.toml\"\n[settings]\nd = 5\n", [], ["bad.toml: include = 'base.toml'"]),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, capsys, text, args, needles):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    out = tmp_path / "out"
    code = main([str(f), "--out", str(out), "--quiet", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("phasebo.sweep: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    assert not (out / "results.csv").exists() and not list(out.glob("parts/results-*"))


def test_plot_where_takes_a_cases_default_seed_and_derived_columns():
    """where names a value of some cell (a case left at its model's default included), the seed,
    or a derived column: accepted; only a setting value no cell has is refused."""
    from phasebo.config import build_spec

    raw = {"settings": {"steps": 10}, "axes": {"d": [64, 96]},
           "cases": [{"noise_ratio": 0.3}, {}]}
    for sel in ({"noise_ratio": 0.2}, {"noise_ratio": [0.2, 0.3]}, {"seed": 0}, {"snr": 0.1}):
        build_spec({**raw, "plot": {"lines": [{"x": "d", "where": sel}]}}, "w")
    with pytest.raises(ConfigError, match="where noise_ratio = 0.25 is not a value"):
        build_spec({**raw, "plot": {"lines": [{"x": "d", "where": {"noise_ratio": 0.25}}]}}, "w")


def test_out_pointing_at_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text(GOOD)
    target = tmp_path / "afile"
    target.write_text("x")
    assert main([str(f), "--out", str(target), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and len(err.strip().splitlines()) == 1
    assert main([str(f), "--out", str(target / "sub"), "--quiet"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_missing_sweep_file(tmp_path, capsys):
    assert main([str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "nope.toml" in err


def test_cli_from_a_subprocess_exit_code_and_no_traceback(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[settings]\nd = 0\n")
    p = subprocess.run([sys.executable, "-m", "phasebo.sweep", str(f)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert "d = 0" in p.stderr and "Traceback" not in p.stderr


def test_config_error_for_unknown_setting_in_python():
    with pytest.raises(ConfigError, match="unknown setting 'signal'"):
        spec_from_dict({"signal": 3})


@pytest.mark.parametrize("kw, match", [
    ({"formats": ("jpgx",)}, "formats = \\('jpgx',\\): a tuple of png"),
    ({"formats": "png"}, "formats = 'png'"),
    ({"dpi": -5}, "dpi = -5 is not a resolution"),
    ({"dpi": 10**6}, "dpi = 1000000"),
    ({"memory_budget": "8G"}, "memory_budget = '8G': expected a whole number"),
    ({"chunk_size": -3}, "chunk_size = -3"),
    ({"n_devices": 1.5}, "n_devices = 1.5"),
])
def test_run_sweep_refuses_bad_arguments_before_anything_runs(tmp_path, kw, match):
    """From Python as from the command line: a figure format the sweep would skip after its
    runs, or a size it would divide by, is one line before any run."""
    spec = spec_from_dict({"steps": 2, "d": 20, "n": 4, "n_test": 8})
    with pytest.raises(ConfigError, match=match):
        run_sweep(spec, tmp_path / "out", quiet=True, **kw)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="spec is a dict, not a sweep"):
        run_sweep({"d": 100}, tmp_path / "out")


def test_numpy_values_from_a_notebook():
    """An axis as a NumPy array (float drift of np.geomspace rounds to the integer it is, a
    fractional d does not), a NumPy scalar setting; one run takes one value per setting."""
    spec = spec_from_dict({"n": np.int64(20)}, {"d": np.geomspace(250, 4000, 5)})
    assert spec.axes["d"] == [250, 500, 1000, 2000, 4000] and spec.fixed["n"] == 20
    with pytest.raises(ConfigError, match=r"d = 250.5 is not a valid int"):
        spec_from_dict({}, {"d": np.array([250.5, 300.0])})
    with pytest.raises(ConfigError, match=r"T = \[2, 3\]: one run takes one value; fix: T = 2"):
        run_one({"T": [2, 3], "steps": 2})


def test_a_quoted_number_is_refused_and_a_bare_one_on_the_command_line_is_read(tmp_path):
    """``steps = "100"`` in a file is a typo, refused as seeds = "2" is; on the command line a
    number TOML does not read (``.005``) is still that number."""
    from phasebo.cli.args import parse_set
    from phasebo.config import load_sweep

    for line, msg in (('steps = "100"', "steps = '100' is not a valid int"),
                      ('lr = "0.01"', "lr = '0.01' is not a valid float"),
                      ('d = ["500", 1000]', "d = '500' is not a valid int")):
        f = tmp_path / "q.toml"
        f.write_text(f'name = "q"\n[settings]\n{line}\n' if "[" not in line else
                     f'name = "q"\n[axes]\n{line}\n')
        with pytest.raises(ConfigError, match=re.escape(msg)):
            load_sweep(f)
    assert parse_set(["lr=.005", "steps=1e3", "track=3+7"]) == {"lr": 0.005, "steps": 1000.0,
                                                                 "track": "3+7"}
    spec = load_sweep(ROOT / "sweeps" / "default.toml", parse_set(["lr=.005", "track=3+7"]))
    assert spec.fixed["lr"] == 0.005 and spec.fixed["track"] == (3, 7)
    with pytest.raises(ConfigError, match="lr = 'abc' is not a valid float"):
        load_sweep(ROOT / "sweeps" / "default.toml", parse_set(["lr=abc"]))
    # from Python no flag was used: the error names the overrides, not --set
    with pytest.raises(ConfigError, match="^overrides: unknown setting 'stepz'"):
        load_sweep(ROOT / "sweeps" / "default.toml", {"stepz": 3})


def readme_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    main_cmd = re.search(r"^(?:pip install [^\n]*&& )?(python -m phasebo\.sweep sweeps/default\.toml)"
                         r"\s*$", text, re.M)
    over = re.search(r"^(python -m phasebo\.sweep sweeps/default\.toml --set [^\n]+)$", text, re.M)
    assert main_cmd and over, "the README shows the main command and the override example"
    return [shlex.split(main_cmd.group(1)), shlex.split(over.group(1))]


def test_readme_main_command_then_override_example(tmp_path):
    """Both commands, in the README's order, in a fresh working directory (the second writes to
    results/default/<overrides>/ and must not collide with the first)."""
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "default.toml").write_text((ROOT / "sweeps" / "default.toml").read_text())
    env = {**os.environ, "MPLBACKEND": "Agg"}
    main_cmd, over = readme_commands()
    small = ["--set", "steps=50", "--set", "d=[250, 500]", "--seeds", "1", "--quiet"]
    p = subprocess.run([sys.executable, *main_cmd[1:], *small[:4], "--seeds", "1", "--quiet",
                        "--out", "results/default"], cwd=tmp_path, capture_output=True,
                       text=True, env=env)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "results" / "default"
    for f in ("results.csv", "results.parquet", "samples.parquet", "dynamics.parquet"):
        assert (out / f).stat().st_size > 0
    pngs = sorted(out.glob("heatmap_*.png"))
    assert pngs and all(png.stat().st_size > 5000 for png in pngs)
    q = subprocess.run([sys.executable, *over[1:], "--set", "steps=50", "--quiet"], cwd=tmp_path,
                       capture_output=True, text=True, env=env)
    assert q.returncode == 0, q.stderr
    sub = [d for d in out.iterdir() if d.is_dir() and d.name != "parts"]
    assert len(sub) == 1 and (sub[0] / "results.parquet").exists()
    df = pd.read_parquet(sub[0] / "results.parquet")
    assert set(df["d"]) == {1000}


def test_cases_vary_settings_together_and_set_overrides_them():
    spec = load_sweep(ROOT / "sweeps" / "sakamoto_fig3.toml")
    cells = list(spec.cells())
    assert spec.n_runs == 3 * spec.seeds
    assert [(c.settings["d"], c.settings["signal_norm"]) for c in cells] == [
        (5000, 5.0), (2000, 20.0), (1000, 100.0)]
    assert {c.settings["train"] for c in cells} == {("p",)}
    small = load_sweep(ROOT / "sweeps" / "sakamoto_fig3.toml", {"d": 300, "steps": 10}, seeds=2)
    assert [(c.settings["d"], c.settings["signal_norm"]) for c in small.cells()] == [
        (300, 5.0), (300, 20.0), (300, 100.0)]
    official = load_sweep(ROOT / "sweeps" / "sakamoto_fig3_official.toml")
    assert {c.settings["train"] for c in official.cells()} == {("p", "W")}


def test_bad_case_is_a_clear_error(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[axes]\nd = [100, 200]\n[[cases]]\nd = 300\n')
    with pytest.raises(ConfigError, match="'d' is also an axis"):
        load_sweep(f)
    f.write_text('[[cases]]\nsignal = 3\n')
    with pytest.raises(ConfigError, match=r"\[\[cases\]\] #1 unknown setting 'signal'"):
        load_sweep(f)


def test_include_merges_a_base_file_and_the_file_wins(tmp_path):
    (tmp_path / "base.toml").write_text('seeds = 3\n[settings]\nmodel = "single_head"\nd = 500\n'
                                        'n = 40\n')
    (tmp_path / "top.toml").write_text('include = "base.toml"\nname = "top"\n[settings]\nn = 60\n'
                                       '[axes]\nd = [100, 200]\n')
    spec = load_sweep(tmp_path / "top.toml")
    assert spec.name == "top" and spec.seeds == 3
    assert spec.fixed["model"] == "single_head" and spec.fixed["n"] == 60
    assert spec.axes["d"] == [100, 200] and "d" not in spec.fixed
    (tmp_path / "loop.toml").write_text('include = "loop.toml"\n')
    with pytest.raises(ConfigError, match="includes itself"):
        load_sweep(tmp_path / "loop.toml")


def test_several_sweep_files_in_one_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / f"{name}.toml").write_text(f'name = "{name}"\n[settings]\nd = 64\nsteps = 5\n'
                                               'n_test = 50\n')
    assert main([str(tmp_path / "a.toml"), str(tmp_path / "b.toml"), "--quiet",
                 "--no-plots"]) == 0
    assert (tmp_path / "results" / "a" / "results.parquet").exists()
    assert (tmp_path / "results" / "b" / "results.parquet").exists()


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("*.toml")), ids=lambda p: p.stem)
def test_every_sweep_file_validates(path):
    spec = load_sweep(path)
    assert spec.n_runs >= 1






# --------------------------------------------------------------------------------------------
# The dry run of every shipped sweep file, in-process
# --------------------------------------------------------------------------------------------

# Files whose full dry run is slow: it traces one run of every compile group (jax.eval_shape, for
# the [plot] columns), measured in-process on 2 busy cores. In the default suite these dry-run
# with --no-plots (validation and the plan, no trace); in full with -m slow. Every other file
# dry-runs in full in the default suite (0.1-1.5 s each, ~8 s together).
DRY_RUN_TRACES = {
    "magen_n_over_d": "12 compile groups, ~4 s",
    "magen_snr_n_heatmap": "6 compile groups, ~1-2.5 s",
    "magen_vary_d": "4 compile groups, ~1-1.4 s",
    "sakamoto_heatmap_official": "16 compile groups, ~3 s",
    "sakamoto_horizons": "5 compile groups, ~3 s",
    "real_digits": "3 ViT groups, ~10 s (+ ~3 s loading the digits)",
    "real_digits_noise": "5 ViT groups, ~3 s",
}


def _dry_run_cases():
    for p in sorted((ROOT / "sweeps").glob("*.toml")):
        if p.stem in DRY_RUN_TRACES:
            yield pytest.param(p, False, id=f"{p.stem}-plan")
            yield pytest.param(p, True, id=f"{p.stem}-traced", marks=pytest.mark.slow)
        else:
            yield pytest.param(p, True, id=p.stem)


@pytest.fixture
def restore_x64():
    """main() turns 64-bit JAX on for a float64 sweep (the CLI owns the process's flags): put it
    back for the tests after this one."""

    old = jax.config.jax_enable_x64
    yield
    jax.config.update("jax_enable_x64", old)


@pytest.fixture
def untrained_backbone(monkeypatch):
    """vit_digits' backbone with zero weights of its shapes. A dry run traces a run, whose init
    loads the pretrained backbone: from the cache, or pretrained there and then (500 AdamW steps,
    minutes here) where it is not cached, as on a fresh machine. The plan and the columns do not
    depend on the weights."""
    import functools

    import equinox as eqx
    import jax.random as jr

    from phasebo.models import vit_backbone as B
    from phasebo.models import vit_digits as V

    @functools.cache
    def zeros(width, depth, heads, patch, mixing):
        shapes = eqx.filter_eval_shape(B.init_vit, jr.PRNGKey(0), width, depth, heads,
                                       patch=patch, mixing=mixing)
        return jax.tree.map(lambda a: np.zeros(a.shape, a.dtype)
                            if isinstance(a, jax.ShapeDtypeStruct) else a, shapes)

    def load(static, quiet=False):
        cfg = B.backbone_settings(static)
        return zeros(cfg["width"], cfg["depth"], cfg["heads"], cfg.get("patch", 2),
                     cfg.get("mixing", "all"))

    monkeypatch.setattr(V, "load_backbone", load)
    monkeypatch.setattr(V, "backbone_record", lambda static: {"test_acc": float("nan")})


@pytest.mark.parametrize("path,traced", list(_dry_run_cases()))
def test_every_sweep_file_dry_runs(path, traced, tmp_path, capsys, restore_x64,
                                   untrained_backbone):
    """``--dry-run`` of each shipped file as a user runs it (in this process): exit 0, the plan
    printed (one line per compile group, their runs adding up to the sweep's) and nothing written.
    ``traced``: with the check of the [plot] columns against an abstract trace of each group."""
    out = tmp_path / "out"
    argv = [str(path), "--dry-run", "--out", str(out)] + ([] if traced else ["--no-plots"])
    assert main(argv) == 0
    printed = capsys.readouterr().out
    spec = load_sweep(path)
    first = out / "round-0" if spec.refine else out  # a refinement's round 0: its own directory
    head = re.search(rf"^{re.escape(spec.name)}: {spec.n_runs} runs in (\d+) compiled group\(s\) "
                     rf"on \d+ \w+ device\(s\); output {re.escape(str(first))}$", printed, re.M)
    assert head, printed
    assert ("then up to" in printed) == bool(spec.refine), printed
    groups = re.findall(r"^  .+: (\d+) runs in (\d+) cell\(s\); block \d+( noise group\(s\) of "
                        r"\d+ runs \(shared along \w+\))?, first chunk \d+; memory ~",
                        printed, re.M)
    assert len(groups) == int(head[1]) >= 1, printed
    assert sum(int(g[0]) for g in groups) == spec.n_runs, printed
    assert all(int(g[0]) == int(g[1]) * spec.seeds for g in groups), printed  # grid points
    assert re.search(r"^  estimated time ~.+ on disk, memory budget", printed, re.M), printed
    assert not out.exists()  # a dry run writes nothing


def test_growing_without_plots_removes_the_figures_of_the_runs_before(tmp_path, capsys):
    """Figures and report.html drawn from 2 seeds would read as current beside tables of 3:
    grown with plots=False they are removed, and said, with the commands that redraw them."""
    out = tmp_path / "g"
    run_sweep(small_spec(seeds=2, steps=10), out)
    drawn = json.loads((out / "manifest.json").read_text())["figures"]
    assert drawn and (out / "report.html").exists()
    capsys.readouterr()
    run_sweep(small_spec(seeds=3, steps=10), out, plots=False)
    assert not any((out / n).exists() for n in drawn) and not (out / "report.html").exists()
    err = capsys.readouterr().err
    assert f"removed {len(drawn)} figure(s)" in err and "and report.html of the runs" in err
    assert f"fix: phasebo plot {out}, phasebo report {out}" in err
    assert json.loads((out / "manifest.json").read_text())["figures"] == []
    run_sweep(small_spec(seeds=3, steps=10), out, plots=False)  # nothing changed: nothing said
    assert "removed" not in capsys.readouterr().err


def test_zero_steps_of_gradient_descent_are_refused():
    """steps = 0 ran, and judged every untrained run (not overfitting, test accuracy 0)."""
    for model in ("prompt_attention", "single_head"):
        with pytest.raises(ConfigError, match="steps = 0 trains nothing"):
            spec_from_dict({"model": model, "steps": 0})
    assert spec_from_dict({"steps": 1}).fixed["steps"] == 1

