"""Scale and reliability: resume after SIGKILL, determinism across chunks / devices / processes,
memory budgets, divergence as data, and the specification guard."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phasebo import plan as P
from phasebo.cli.sweep import main as sweep_main
from phasebo.config import load_sweep, spec_from_dict
from phasebo.execute import count_compiles
from phasebo.registry import MODELS
from phasebo.results import done_run_ids
from phasebo.settings import ConfigError
from phasebo.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
# The same static settings as tests/test_sweep.py: the compiled programs are shared.
SWEEP = """name = "rel"
seeds = {seeds}
[settings]
engine = "direct"
steps = {steps}
lr = 0.05
n_test = 200
record_every = 20
[axes]
d = [40, 64]
signal_norm = [3.0, 30.0]
"""


def write_sweep(tmp_path, seeds=3, steps=60):
    f = tmp_path / "rel.toml"
    f.write_text(SWEEP.format(seeds=seeds, steps=steps))
    return f


def cli(args, env_extra=None, **kw):
    env = {**os.environ, "MPLBACKEND": "Agg", **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "phasebo.sweep", *map(str, args)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kw)


def tables(out):
    return {k: pd.read_parquet(Path(out) / f"{k}.parquet").sort_values(
        ["run_id"] + (["step"] if k == "dynamics" else ["sample"] if k == "samples" else []),
        kind="stable").reset_index(drop=True) for k in ("results", "dynamics", "samples")}


def assert_same(a, b, rtol=1e-4):
    for k in a:
        x, y = a[k], b[k]
        assert len(x) == len(y) and list(x.columns) == list(y.columns), k
        for c in x.columns:
            if pd.api.types.is_numeric_dtype(x[c]) and not pd.api.types.is_bool_dtype(x[c]):
                np.testing.assert_allclose(x[c].to_numpy(float), y[c].to_numpy(float), rtol=rtol,
                                           atol=1e-5, err_msg=f"{k}.{c}")
            else:
                assert (x[c].astype(str) == y[c].astype(str)).all(), f"{k}.{c}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted single-process, single-device run of the sweep."""
    tmp = tmp_path_factory.mktemp("ref")
    f = write_sweep(tmp, seeds=6)
    run_sweep(load_sweep(f), tmp / "out", n_devices=1, quiet=True, plots=False)
    return f, tables(tmp / "out")


def test_sigkill_then_resume_gives_every_run_once(tmp_path, reference):
    f, ref = reference
    out = tmp_path / "out"
    p = cli([f, "--out", out, "--chunk-size", 2, "--block-size", 1, "--quiet", "--no-plots"])
    deadline = time.monotonic() + 300
    while len(list((out / "parts").glob("results-*.parquet"))) < 2:
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    n_before = len(done_run_ids(out / "parts"))
    assert 2 <= n_before < 24 and not (out / "results.parquet").exists()
    q = cli([f, "--out", out, "--chunk-size", 5, "--quiet", "--no-plots"])
    _, err = q.communicate(timeout=600)
    assert q.returncode == 0, err
    got = tables(out)
    assert len(got["results"]) == 24 and got["results"]["run_id"].is_unique  # each run once
    assert_same(got, ref)


def test_resume_skips_finished_chunks(tmp_path):
    spec = load_sweep(write_sweep(tmp_path))
    out = tmp_path / "out"
    assert run_sweep(spec, out, chunk_size=4, max_chunks=2, quiet=True, plots=False) is None
    first = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("results-*.parquet")}
    assert len(first) == 2
    df = run_sweep(spec, out, chunk_size=4, quiet=True, plots=False)
    assert len(df) == spec.n_runs and df["run_id"].is_unique
    for name, mtime in first.items():  # finished parts were not recomputed
        assert (out / "parts" / name).stat().st_mtime_ns == mtime


@pytest.mark.slow  # 35 s; the default suite shards every sweep over 2 simulated devices
def test_four_simulated_devices_match_one(tmp_path, reference):
    f, ref = reference
    out = tmp_path / "out"
    p = cli([f, "--out", out, "--devices", 4, "--quiet", "--no-plots"],
            env_extra={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    assert_same(tables(out), ref)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(tmp_path, reference):
    f, ref = reference
    out = tmp_path / "out"
    port = free_port()
    procs = [cli([f, "--out", out, "--quiet", "--no-plots", "--distributed", "--coordinator",
                  f"127.0.0.1:{port}", "--num-processes", 2, "--process-id", i, "--cpu-devices",
                  1]) for i in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    parts = sorted((out / "parts").glob("results-*.parquet"))
    assert len(parts) >= 2  # each process wrote its own share
    assert_same(tables(out), ref)


def test_processes_of_different_sweeps_stop_at_once_naming_the_difference(tmp_path, reference):
    """Process 1 started with another --seeds used to wait 10 minutes for a manifest of its own
    sweep and blame the file system, and process 0 to wait a day for its runs: whichever sees
    the other's sweep in its lock first stops, leaving why for the other, which stops with the
    same line naming the setting."""
    f, _ = reference
    out = tmp_path / "out"
    port = free_port()
    procs = [cli([f, "--out", out, "--quiet", "--no-plots", "--distributed", "--coordinator",
                  f"127.0.0.1:{port}", "--num-processes", 2, "--process-id", i, "--cpu-devices",
                  1, *(["--seeds", 3] if i else [])]) for i in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 2, err
        assert re.search(r"process [01] runs another sweep than process [01]", err)
        assert re.search(r"seeds = (3 in process 1, 6 in process 0|6 in process 0, 3 in process "
                         r"1)", err) and "Traceback" not in err


def test_small_memory_budget_still_completes(tmp_path):
    spec = load_sweep(write_sweep(tmp_path, seeds=2))
    model = MODELS["prompt_attention"]
    per_run = max(model.bytes_per_run(model.static_of(c.settings)) for c in spec.cells())
    pl = P.plan(spec, n_devices=1, memory_budget=2 * per_run)
    assert all(g.block <= 2 for g in pl.groups)
    df = run_sweep(spec, tmp_path / "o", memory_budget=2 * per_run, n_devices=1, quiet=True,
                   plots=False)
    assert len(df) == spec.n_runs


def test_single_run_over_budget_is_a_clear_error_before_compiling(tmp_path):
    spec = spec_from_dict({"d": 100_000, "n": 20, "engine": "direct", "test_mode": "sampled"})
    with count_compiles() as seen, pytest.raises(
            ConfigError, match=r"one run of prompt_attention needs about .* [KMGT]iB.*--memory"):
        run_sweep(spec, tmp_path / "o", memory_budget=1 << 30, quiet=True, plots=False)
    assert seen == {"compiles": 0}
    assert not list((tmp_path / "o" / "parts").glob("*.parquet"))


def test_diverging_run_is_data_and_leaves_its_chunk_alone(tmp_path):
    settings = {"engine": "direct", "d": 64, "steps": 50, "signal_norm": 1000.0}
    spec = spec_from_dict(settings, {"lr": [0.05, 1e38]}, seeds=2)
    df = run_sweep(spec, tmp_path / "o", chunk_size=4, quiet=True, plots=False)
    bad = df["lr"] > 1
    assert (df.loc[bad, "status"] == "diverged").all()
    assert (df.loc[bad, "regime"] == "diverged").all()
    assert (df.loc[bad, "diverge_step"] >= 0).all()
    assert (df.loc[~bad, "status"] == "ok").all() and (df.loc[~bad, "diverge_step"] == -1).all()
    alone = run_sweep(spec_from_dict({**settings, "lr": 0.05}, seeds=2), tmp_path / "a",
                      quiet=True, plots=False)
    # the same runs (same settings and seeds) have the same ids, hence keys and numbers
    assert df.loc[~bad, "run_id"].tolist() == alone["run_id"].tolist()
    np.testing.assert_allclose(df.loc[~bad, "test_loss"], alone["test_loss"], rtol=1e-6)


@pytest.mark.parametrize("engine", ["direct", "reduced"])
def test_a_run_whose_final_metrics_overflow_is_diverged_at_its_last_step(tmp_path, engine):
    """lr 1e30 on p alone: the losses and parameters stay finite through training (its entries
    near 1e36), but the norm and the test logits overflow float32; the run is diverged at its
    last step, not a regime with a NaN test loss."""
    settings = {"engine": engine, "d": 250, "n": 20, "steps": 60, "n_test": 50,
                "noise_ratio": 0.2}
    df = run_sweep(spec_from_dict(settings, {"lr": [1e3, 1e30]}, seeds=2), tmp_path / "o",
                   quiet=True, plots=False)
    bad = df["lr"] > 1e10
    assert not np.isfinite(df.loc[bad, "test_loss"]).any()  # what the run overflowed
    assert (df.loc[bad, "status"] == "diverged").all() and (df.loc[bad, "regime"] == "diverged").all()
    assert (df.loc[bad, "diverge_step"] == 60).all()
    assert (df.loc[~bad, "status"] == "ok").all() and np.isfinite(df.loc[~bad, "test_loss"]).all()


def test_changed_spec_in_the_same_directory_is_refused(tmp_path, capsys):
    f = write_sweep(tmp_path, seeds=1)
    out = tmp_path / "out"
    assert sweep_main([str(f), "--out", str(out), "--quiet", "--no-plots"]) == 0
    spec = json.loads((out / "manifest.json").read_text())["spec"]
    capsys.readouterr()
    assert sweep_main([str(f), "--out", str(out), "--quiet", "--no-plots", "--set", "lr=0.1"]) == 2
    err = capsys.readouterr().err
    assert "holds runs of another sweep: lr had 0.05 there" in err and "--overwrite" in err
    assert json.loads((out / "manifest.json").read_text())["spec"] == spec
    assert sweep_main([str(f), "--out", str(out), "--quiet", "--no-plots", "--set", "lr=0.1",
                   "--overwrite"]) == 0
    df = pd.read_parquet(out / "results.parquet")
    assert (df["lr"] == 0.1).all() and len(df) == 4


def test_orphan_parts_of_a_killed_chunk_are_not_assembled(tmp_path):
    """Killed between a chunk's samples part and its results part: the rerun recomputes those
    runs in other chunks, and the orphan part must not add duplicate rows."""
    spec = load_sweep(write_sweep(tmp_path, seeds=2))
    out = tmp_path / "out"
    run_sweep(spec, out, chunk_size=4, quiet=True, plots=False)
    parts = out / "parts"
    victim = sorted(parts.glob("results-*.parquet"))[0]
    victim.unlink()  # as if killed just before this results part was renamed into place
    df = run_sweep(spec, out, chunk_size=3, quiet=True, plots=False)
    assert len(df) == spec.n_runs and df["run_id"].is_unique
    smp = pd.read_parquet(out / "samples.parquet")
    dyn = pd.read_parquet(out / "dynamics.parquet")
    assert not smp.duplicated(["run_id", "sample"]).any() and len(smp) == spec.n_runs * 20
    assert not dyn.duplicated(["run_id", "step"]).any() and len(dyn) == spec.n_runs * 4


# --------------------------------------------------------------------------------------------
# Sweeps that grow: runs are identified by their settings and seed, not their grid position
# --------------------------------------------------------------------------------------------

GROW = dict(engine="reduced", steps=40, lr=0.05, n_test=200, record_every=20)


def _grow_spec(seeds, mus=(3.0, 30.0), ds=(40, 64), order=("d", "signal_norm")):
    axes = {"d": list(ds), "signal_norm": list(mus)}
    return spec_from_dict(GROW, {k: axes[k] for k in order}, seeds=seeds, name="grow")


@pytest.mark.slow  # 47 s; growth at toy size and a grown seed count are checked by default
def test_adding_seeds_runs_only_the_new_ones_and_equals_a_fresh_sweep(tmp_path):
    out = tmp_path / "grown"
    run_sweep(_grow_spec(10), out, quiet=True, plots=False)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("results-*")}
    grown = run_sweep(_grow_spec(20), out, quiet=True, plots=False)
    after = list((out / "parts").glob("results-*"))
    assert all((out / "parts" / n).stat().st_mtime_ns == t for n, t in before.items())
    new_rows = sum(len(pd.read_parquet(p)) for p in after if p.name not in before)
    assert new_rows == 4 * 10  # exactly the 10 new seeds of each of the 4 cells
    fresh = run_sweep(_grow_spec(20), tmp_path / "fresh", quiet=True, plots=False)
    assert_same(tables(out), tables(tmp_path / "fresh"), rtol=0)
    assert grown["seed"].max() == 19 and len(fresh) == 80


@pytest.mark.slow
def test_growing_an_axis_reordering_axes_and_splitting_files_keep_every_run(tmp_path):
    base = run_sweep(_grow_spec(3), tmp_path / "a", quiet=True, plots=False)
    more = run_sweep(_grow_spec(3, mus=(3.0, 30.0, 10.0)), tmp_path / "a", quiet=True,
                     plots=False)
    assert len(more) == 18
    swapped = run_sweep(_grow_spec(3, order=("signal_norm", "d")), tmp_path / "b", quiet=True,
                        plots=False)
    half = run_sweep(_grow_spec(3, ds=(64,)), tmp_path / "c", quiet=True, plots=False)
    key = ["run_id"]
    for other in (more, swapped, half):
        m = base.merge(other, on=key, suffixes=("", "_o"))
        assert len(m) == len(base) if other is not half else len(m) == 6
        for c in ("test_loss", "train_loss", "p_norm"):
            np.testing.assert_array_equal(m[c].to_numpy(), m[f"{c}_o"].to_numpy())
    # the grown table keeps the file's order: d, then signal_norm in the order given, seeds
    assert more["signal_norm"].tolist()[:9] == [3.0] * 3 + [30.0] * 3 + [10.0] * 3


# The toy version for the default suite: both axes swept, so every sweep below is one compile
# group (one program, compiled once) whose runs sit at other positions of its blocks and chunks in
# each sweep; one seed, 4 steps. The test above (-m slow) grows and splits along a static axis.
TOY_GROW = dict(engine="reduced", d=40, steps=4, n_test=20)


def _toy_spec(lrs=(0.05, 0.2), mus=(3.0, 30.0), order=("lr", "signal_norm")):
    axes = {"lr": list(lrs), "signal_norm": list(mus)}
    return spec_from_dict(TOY_GROW, {k: axes[k] for k in order}, seeds=1, name="grow")


def test_a_grown_reordered_or_split_toy_grid_keeps_every_runs_id_and_numbers(tmp_path):
    out = tmp_path / "a"
    base = run_sweep(_toy_spec(), out, quiet=True, plots=False)
    before = {p.name for p in (out / "parts").glob("results-*")}
    more = run_sweep(_toy_spec(mus=(3.0, 30.0, 10.0)), out, quiet=True, plots=False)
    new_rows = sum(len(pd.read_parquet(p)) for p in (out / "parts").glob("results-*")
                   if p.name not in before)
    assert len(more) == 6 and new_rows == 2  # only the new column of cells ran
    swapped = run_sweep(_toy_spec(order=("signal_norm", "lr")), tmp_path / "b", quiet=True,
                        plots=False)
    half = run_sweep(_toy_spec(lrs=(0.2,)), tmp_path / "c", quiet=True, plots=False)
    assert len(P.plan(_toy_spec(), n_devices=1).groups) == 1
    numbers = [c for c in base.columns if pd.api.types.is_numeric_dtype(base[c])]
    assert {"test_loss", "train_loss", "p_norm", "margin", "test_acc"} <= set(numbers)
    for other, n in ((more, 4), (swapped, 4), (half, 2)):
        m = base.merge(other, on="run_id", suffixes=("", "_o"))
        assert len(m) == n  # the same runs under the same ids
        for c in base.columns:
            if c == "run_id":
                continue
            if c in numbers:  # bit for bit, NaN where NaN
                np.testing.assert_array_equal(m[c].to_numpy(), m[f"{c}_o"].to_numpy(),
                                              err_msg=c)
            else:
                assert (m[c].astype(str) == m[f"{c}_o"].astype(str)).all(), c
    # each table keeps its file's order: lr, then signal_norm in the order given
    assert more["signal_norm"].tolist() == [3.0, 30.0, 10.0] * 2
    assert swapped["signal_norm"].tolist() == [3.0, 3.0, 30.0, 30.0]


def test_a_changed_fixed_setting_is_refused_not_mixed(tmp_path):
    run_sweep(_grow_spec(2), tmp_path / "a", quiet=True, plots=False)
    changed = spec_from_dict({**GROW, "steps": 80}, {"d": [40, 64], "signal_norm": [3.0, 30.0]},
                             seeds=2, name="grow")
    with pytest.raises(ConfigError, match="steps had 40 there"):
        run_sweep(changed, tmp_path / "a", quiet=True, plots=False)
    # fewer values but also a new one: neither a subset nor a growth of the directory's runs
    with pytest.raises(ConfigError, match="signal_norm had 30.0 there"):
        run_sweep(_grow_spec(2, mus=(3.0, 10.0)), tmp_path / "a", quiet=True, plots=False)


def test_tables_of_a_grow_that_did_not_finish_are_refused_until_it_does(tmp_path, capsys,
                                                                      monkeypatch):
    import phasebo as pb
    from phasebo import report
    from phasebo.store import prepare_out_dir

    out = tmp_path / "a"
    run_sweep(_toy_spec(), out, quiet=True, plots=False)
    grown = _toy_spec(mus=(3.0, 30.0, 10.0, 100.0, 1.0))
    # a grow refused before it ran anything (its manifest written): the table is still every run
    prepare_out_dir(out, grown, overwrite=False)
    assert len(pb.load(out)) == 4
    assert run_sweep(grown, out, quiet=True, plots=False, chunk_size=1, max_chunks=1) is None
    with pytest.raises(ConfigError, match="holds 4 runs, not the 10 of its sweep.*has not fin"):
        pb.load(out)
    with pytest.raises(ConfigError, match="holds 4 runs"):  # the table named by its file too
        pb.load(out / "results.parquet")
    first = len(pb.load(out, partial=True))  # the old four and the one new chunk's runs
    assert 4 < first < 10

    def stop(*a, **k):  # Ctrl-C while the figures are drawn: the tables are written by then
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "sweep_figures", stop)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(grown, out, quiet=True)
    assert "interrupted while writing the tables and figures" in capsys.readouterr().err
    history = json.loads((out / "manifest.json").read_text())["history"]
    assert history[-1]["interrupted"] and history[-1]["new_runs"] == 10 - first
    assert len(pb.load(out)) == 10  # every run was saved before the figures: the tables are whole
    monkeypatch.undo()
    run_sweep(grown, out, quiet=True)  # the same command again draws the figures and the report
    assert (out / "report.html").exists() and len(pb.load(out)) == 10


def test_ctrl_c_while_drawing_leaves_no_figure_of_the_runs_before(tmp_path, capsys, monkeypatch):
    """Interrupted while the grown sweep's figures are drawn: the old figures and report.html
    (of fewer runs) are removed, not left beside the new tables as current."""
    import phasebo as pb
    from phasebo import report

    out = tmp_path / "a"
    run_sweep(_toy_spec(), out, quiet=True)
    old = json.loads((out / "manifest.json").read_text())["figures"]
    assert old and (out / "report.html").exists()

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "sweep_figures", stop)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_toy_spec(mus=(3.0, 30.0, 10.0)), out, quiet=True)
    assert "removed the" in capsys.readouterr().err
    assert not (out / "report.html").exists()
    assert not any((out / f).exists() for f in old)
    assert len(pb.load(out)) == 6  # the tables are whole
