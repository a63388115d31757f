"""The sweep driver: grid expansion, compile groups, chunking invariance, the CLI and its errors."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phasebo import sweep as S
from phasebo.config import ConfigError, load_sweep, spec_from_dict
from phasebo.sweep import main, run_sweep

ROOT = Path(__file__).resolve().parents[1]

SMALL = {"settings": {"engine": "direct", "steps": 60, "lr": 0.05, "n_test": 200,
                      "record_every": 20},
         "axes": {"d": [40, 64], "signal_norm": [3.0, 30.0]}}


def small_spec(seeds=4, **kw):
    settings = {**SMALL["settings"], **kw}
    return spec_from_dict(settings, SMALL["axes"], seeds=seeds, name="small")


def read(out):
    return {k: pd.read_parquet(out / f"{k}.parquet") for k in ("results", "dynamics", "samples")}


def assert_same_tables(a, b):
    for k in a:
        x, y = a[k], b[k]
        assert list(x.columns) == list(y.columns)
        assert len(x) == len(y)
        for c in x.columns:
            if pd.api.types.is_numeric_dtype(x[c]) and not pd.api.types.is_bool_dtype(x[c]):
                np.testing.assert_allclose(x[c].to_numpy(float), y[c].to_numpy(float),
                                           rtol=1e-5, atol=1e-6, err_msg=f"{k}.{c}")
            else:
                assert (x[c].astype(str) == y[c].astype(str)).all(), f"{k}.{c}"


def test_grid_expansion_and_run_ids():
    spec = small_spec(seeds=3)
    runs = spec.runs()
    assert spec.n_runs == len(runs) == 2 * 2 * 3
    assert [r["run_id"] for r in runs] == list(range(12))
    assert [r["seed"] for r in runs[:4]] == [0, 1, 2, 0]
    assert {(r["d"], r["signal_norm"]) for r in runs} == {(40, 3.0), (40, 30.0), (64, 3.0),
                                                          (64, 30.0)}
    groups = S.group_runs(runs)
    assert [s.d for s, _ in groups] == [40, 64]  # one compile group per static shape


def test_ranges_expand_inclusively():
    spec = spec_from_dict({}, {"signal_norm": {"start": 5, "stop": 100, "step": 2.5},
                               "d": {"start": 250, "stop": 5000, "step": 125}})
    assert len(spec.axes["signal_norm"]) == 39 and spec.axes["signal_norm"][-1] == 100.0
    assert len(spec.axes["d"]) == 39 and spec.axes["d"][:2] == [250, 375]
    log = spec_from_dict({}, {"lr": {"start": 1e-3, "stop": 1e-1, "num": 3, "log": True}})
    np.testing.assert_allclose(log.axes["lr"], [1e-3, 1e-2, 1e-1])


def test_chunk_size_does_not_change_rows(tmp_path):
    spec = small_spec()
    tables = []
    for cs in (1, 7, spec.n_runs):
        out = tmp_path / f"c{cs}"
        run_sweep(spec, out, chunk_size=cs, quiet=True, plots=False)
        tables.append(read(out))
    assert sorted(tables[0]["results"]["run_id"]) == list(range(spec.n_runs))
    assert len(tables[0]["dynamics"]) == spec.n_runs * 4  # steps 0, 20, 40, 60
    assert_same_tables(tables[0], tables[1])
    assert_same_tables(tables[0], tables[2])


def test_one_compilation_per_static_group(tmp_path):
    S._COMPILED.clear()
    spec = small_spec(seeds=5)  # 10 runs per d group: chunks of 3 -> 4 chunks, the last padded
    run_sweep(spec, tmp_path / "o", chunk_size=3, block_size=1, quiet=True, plots=False)
    fns = list(S._COMPILED.values())
    assert len(fns) == 2  # d = 40 and d = 64
    assert all(f._cache_size() == 1 for f in fns)


def test_results_schema(tmp_path):
    df = run_sweep(small_spec(seeds=1), tmp_path / "o", quiet=True, plots=False)
    need = ("sweep run_id model seed d signal_norm n n_test T rho noise_ratio lr steps train_acc "
            "train_acc_clean train_acc_noisy test_acc train_loss test_loss status regime").split()
    assert list(df.columns[: len(need)]) == need
    assert {"engine", "snr", "n_snr2", "noisy_fit_step", "cumS_clean_pos", "p_norm",
            "mass_noisy_weak_opp", "diverge_step"} <= set(df.columns)
    assert set(df["regime"]) <= {"benign", "harmful", "not_overfitting"}
    np.testing.assert_allclose(df["snr"], df["signal_norm"] / np.sqrt(df["d"]))
    csv = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(csv.columns) == list(df.columns) and len(csv) == len(df)


def test_regime_thresholds_from_the_sweep_file(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('seeds = 2\n[settings]\nengine = "direct"\nd = 64\nsignal_norm = 3.0\n'
                 'steps = 60\nlr = 0.05\n[regime]\ntest_eps = 0.5\n')
    df = run_sweep(load_sweep(f), tmp_path / "o", quiet=True, plots=False)
    assert (df["test_eps"] == 0.5).all()
    fits = df["train_acc"] >= 1
    assert (df.loc[fits & (df["test_acc"] >= 0.5), "regime"] == "benign").all()


# --------------------------------------------------------------------------------------------
# The command line and its errors
# --------------------------------------------------------------------------------------------

GOOD = '[settings]\nd = 64\nsteps = 10\n[axes]\nsignal_norm = [3.0, 6.0]\n'


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
    assert not (out / "results.csv").exists() and not (out / "results.parquet").exists()


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


def readme_main_command() -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^(?:pip install [^\n]*&& )?(python -m phasebo\.sweep sweeps/default\.toml)\s*$",
                  text, re.M)
    assert m, "the README shows the main command"
    return shlex.split(m.group(1))


def test_readme_main_command_at_reduced_size(tmp_path):
    cmd = readme_main_command()
    out = tmp_path / "results" / "default"
    p = subprocess.run(
        [sys.executable, *cmd[1:], "--out", str(out), "--seeds", "1", "--set", "steps=50",
         "--set", "d=[250, 500]", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert p.returncode == 0, p.stderr
    for f in ("results.csv", "results.parquet", "samples.parquet"):
        assert (out / f).stat().st_size > 0
    pngs = sorted(out.glob("heatmap_*.png"))
    assert pngs and all(png.stat().st_size > 5000 for png in pngs)
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 2 * len(load_sweep(ROOT / "sweeps" / "default.toml").axes["signal_norm"])


def test_cases_vary_settings_together_and_set_overrides_them():
    spec = load_sweep(ROOT / "sweeps" / "sakamoto_fig3.toml")
    runs = spec.runs()
    assert spec.n_runs == len(runs) == 3 * 20
    assert [(r["d"], r["signal_norm"]) for r in runs[::20]] == [(5000, 5.0), (2000, 20.0),
                                                                (1000, 100.0)]
    assert {r["train"] for r in runs} == {("p",)}
    small = load_sweep(ROOT / "sweeps" / "sakamoto_fig3.toml", {"d": 300, "steps": 10}, seeds=2)
    assert [(r["d"], r["signal_norm"]) for r in small.runs()[::2]] == [(300, 5.0), (300, 20.0),
                                                                      (300, 100.0)]
    official = load_sweep(ROOT / "sweeps" / "sakamoto_fig3_official.toml")
    assert {r["train"] for r in official.runs()} == {("p", "W")}
    assert S.spec_hash(spec) != S.spec_hash(official)


def test_bad_case_is_a_clear_error(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[axes]\nd = [100, 200]\n[[cases]]\nd = 300\n')
    with pytest.raises(ConfigError, match="'d' is also an axis"):
        load_sweep(f)
    f.write_text('[[cases]]\nsignal = 3\n')
    with pytest.raises(ConfigError, match=r"\[\[cases\]\] #1 unknown setting 'signal'"):
        load_sweep(f)


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("*.toml")), ids=lambda p: p.stem)
def test_every_sweep_file_validates(path):
    spec = load_sweep(path)
    assert spec.n_runs >= 1 and spec.runs()[0]["run_id"] == 0
