"""The ``phasebo`` command end to end, as a user runs it: subprocesses, their exit codes and output.

Every subprocess starts a fresh Python (about 3 s of imports on 2 cores), so the commands that
compute nothing run side by side in one module fixture, and the sweeps share one tiny sweep file
and one set of flags: one command (``refined``) runs the grid and a refinement round and is
checked for the tables, ``--memory-budget``, float64, ``--format``/``--dpi`` and the refinement;
``phasebo boundaries`` reads its round 0. Every sweep here compiles the same program (float64,
block 1, chunk 4): the first compiles it, the others load it from the on-disk compilation cache
(``$PHASEBO_CACHE``, set by conftest). Under pytest-xdist the module fixtures' commands run once
per session, in whichever worker comes first (:func:`once`).
"""

import fcntl
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phasebo import plan as P
from phasebo.config import load_sweep
from phasebo.registry import ENGINES, MODELS, get_model

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}

# 2 (d) x 2 (||mu||) cells x 3 seeds; at d = 4000, ||mu|| = 5 is harmful and 40 benign, and every
# run at d = 250 is not overfitting (no harmful/benign boundary: the "too_few" slice)
TINY = """\
name = "tiny"
seeds = 3
[settings]
model = "prompt_attention"
steps = 300
n_test = 200
[axes]
d = [250, 4000]
signal_norm = [5, 40]
[plot]
heatmaps = [{ x = "signal_norm", y = "d", value = "regime" }]
"""
CHUNK = 4


def phasebo(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "phasebo", *map(str, args)], capture_output=True,
                          text=True, env=kw.pop("env", ENV), timeout=timeout, **kw)


def once(tmp_path_factory, name, make):
    """``(directory, make(directory))``, where ``make`` runs processes in a fresh directory and
    returns them (CompletedProcess objects, by name), once per test session: pytest-xdist's
    workers share it (the first to come runs it, under a file lock; the others wait and read its
    processes back), so a module whose tests are spread over two workers does not run its
    fixtures' commands twice."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        d = tmp_path_factory.mktemp(name)
        return d, make(d)
    root = tmp_path_factory.getbasetemp().parent / f"shared-{name}"  # this session's, shared
    with open(root.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = root / "processes.json"
        if not saved.exists():
            root.mkdir(exist_ok=True)
            procs = make(root)
            saved.write_text(json.dumps({k: [p.args, p.returncode, p.stdout, p.stderr]
                                         for k, p in procs.items()}))
    return root, {k: subprocess.CompletedProcess(*v)
                  for k, v in json.loads(saved.read_text()).items()}


def assert_clean(p, code=0):
    assert p.returncode == code, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("cli") / "tiny.toml"
    f.write_text(TINY)
    return f


@pytest.fixture(scope="module")
def flags(tiny_file):
    """Flags every sweep here passes: float64, a chunk of 4 runs, the devices of this process (2,
    from conftest's XLA_FLAGS, which the subprocesses inherit) and a memory budget of 1.5 runs per
    device, which (the planner says, in this process) cuts the block to one run."""
    spec = load_sweep(tiny_file, {"dtype": "float64"})
    pl = P.plan(spec, chunk_size=CHUNK)
    default = pl.groups[0]
    budget_kib = math.ceil(pl.n_dev * 1.5 * default.bytes_per_run / 1024)
    budgeted = P.plan(spec, chunk_size=CHUNK, memory_budget=budget_kib * 1024).groups[0]
    assert default.block > budgeted.block == 1
    return ["--set", "dtype=float64", "--chunk-size", CHUNK, "--devices", pl.n_dev,
            "--memory-budget", f"{budget_kib}K"]


@pytest.fixture(scope="module")
def refined(tiny_file, flags, tmp_path_factory):
    """The tiny sweep through ``phasebo sweep`` with a refinement round: round 0 (an ordinary
    finished sweep, in ``round-0/``) is the grid, round 1 bisects the separated d = 4000 slice; the
    boundary figure as PNG at 40 dpi and as SVG. ``(its output directory, the process)``."""

    def make(d):
        return {"sweep": phasebo("sweep", tiny_file, "--out", d / "refined", *flags, "--refine",
                                 "harmful,benign", "--rounds", 1, "--target", 0.5, "--format",
                                 "png,svg", "--dpi", 40)}

    d, procs = once(tmp_path_factory, "refined", make)
    return d / "refined", procs["sweep"]


# --------------------------------------------------------------------------------------------
# Commands that compute nothing: all started at once
# --------------------------------------------------------------------------------------------

QUICK = {
    "no_args": [],
    "unknown": ["frobnicate", "--x"],
    "settings_model": ["settings", "prompt_attention"],
    "models": ["models"],
    "reference_help": ["reference", "--help"],
    "pretrain_help": ["pretrain", "--help"],
}
# values refused in one line (exit 2) before anything runs: name: (argv, what the line says)
REFUSED = {
    "reference_seeds": (["reference", "--seeds", "0"], "--seeds = 0 must be >= 1; fix:"),
    "reference_out": (["reference", "--out", "/dev/null"], "--out /dev/null is a file"),
    "pretrain_width": (["pretrain", "--vit-width", "0"], "vit_width = 0 must be >= 4; fix:"),
    "pretrain_steps": (["pretrain", "--pretrain-steps", "-1"], "pretrain_steps = -1 must be"),
    "bench_json": (["bench", "--json", "/nonexistent/b.json"], "the directory '/nonexistent' "
                   "does not exist; fix:"),
    "bench_repeat": (["bench", "--repeat", "0"], "--repeat = 0 must be >= 1; fix:"),
    "coordinator": (["sweep", str(ROOT / "sweeps" / "default.toml"), "--dry-run", "--out", "o",
                     "--distributed", "--coordinator", "nonsense"], "is not host:port; fix:"),
    "process_id": (["sweep", str(ROOT / "sweeps" / "default.toml"), "--dry-run", "--out", "o",
                    "--distributed", "--num-processes", "2", "--process-id", "2"],
                   "--process-id = 2 must be in 0..1"),
}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """``{name: CompletedProcess}`` of the commands in QUICK, run side by side, and ``"cache"``:
    their cache, an empty directory of their own (a command that trains or compiles would leave
    something in it)."""

    def make(d):
        cache = d / "cache"
        cache.mkdir()
        env = {**ENV, "PHASEBO_CACHE": str(cache)}
        procs = {k: subprocess.Popen([sys.executable, "-m", "phasebo", *a],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=d)
                 for k, a in QUICK.items()}
        done = {}
        for k, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            done[k] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        return done

    d, done = once(tmp_path_factory, "quick", make)
    return {**done, "cache": d / "cache"}


def test_no_arguments_prints_the_usage_and_exits_2(quick, capsys):
    from phasebo.cli import COMMANDS, main

    p = quick["no_args"]
    assert_clean(p, 2)
    assert p.stdout == "" and p.stderr.startswith("usage: phasebo COMMAND")  # an error: stderr
    for cmd in COMMANDS:
        assert re.search(rf"^  {cmd} +\S", p.stderr, re.M), cmd
    assert main(["--help"]) == 0  # asked for, the same usage is not an error, on stdout
    assert capsys.readouterr().out == p.stderr


@pytest.mark.parametrize("name", REFUSED)
def test_bad_values_are_refused_in_one_line_before_anything_runs(name, tmp_path, capsys,
                                                                 monkeypatch):
    from phasebo.cli import main

    monkeypatch.chdir(tmp_path)  # nothing may be written; anything that were would land here
    argv, says = REFUSED[name]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and "fix: " in lines[0], lines
    assert says in lines[0]
    assert not list(tmp_path.iterdir())


def test_unknown_command_is_an_error_without_traceback(quick):
    p = quick["unknown"]
    assert_clean(p, 2)
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("phasebo: error: unknown command 'frobnicate';")
    assert "commands: sweep, plot" in lines[0]


def test_a_misspelt_command_gets_a_suggestion(capsys):
    from phasebo.cli import main

    assert main(["swep", "x.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("phasebo: error: unknown command 'swep' (did you mean 'sweep'?)")
    assert main(["settings", "prompt_attention", "bogus"]) == 2
    assert "unexpected argument 'bogus'" in capsys.readouterr().err
    assert main(["models", "prompt_attention"]) == 2  # models takes no argument
    assert "unexpected argument 'prompt_attention'" in capsys.readouterr().err
    assert main(["models", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: phasebo models") and "prompt_attention" not in out


def test_settings_of_a_model_lists_its_settings(quick):
    p = quick["settings_model"]
    assert_clean(p)
    assert re.findall(r"^(\w+): ", p.stdout, re.M) == ["prompt_attention"]
    model = get_model("prompt_attention")
    kinds = "|".join({s.kind for s in model.settings.values()})
    rows = re.findall(rf"^  (\S+) +({kinds}) +(\S+)", p.stdout, re.M)
    assert [r[0] for r in rows] == list(model.settings)
    table = {r[0]: (r[1], r[2]) for r in rows}
    assert table["dtype"] == ("static", '"float32"')
    assert table["n"] == ("static", "20") and table["train"][1] == "['p']"
    assert table["signal_norm"] == ("swept", "20.0")
    # the model's own settings only: a setting of single_head is not listed
    assert "radius_v" in get_model("single_head").settings and "radius_v" not in table


def test_settings_of_every_model_and_of_an_unknown_one(capsys):
    """In this process (the command's wiring is tested above): every model's table in turn, and
    an unknown model is one line and exit 2."""
    from phasebo.cli import main

    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^(\w+): ", out, re.M) == list(MODELS)
    assert main(["settings", "no_such_model"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1
    assert cap.err.startswith("phasebo settings: error: model = 'no_such_model' is not a known "
                              "model") and "prompt_attention" in cap.err


def test_models_lists_models_and_engines(quick):
    p = quick["models"]
    assert_clean(p)
    for name, m in MODELS.items():
        assert re.search(rf"^{name} +{re.escape(', '.join(m.engines))} ", p.stdout, re.M), name
    for name, e in ENGINES.items():
        assert re.search(rf"^{name} +{e.priority} ", p.stdout, re.M), name


def test_reference_and_pretrain_help_run_nothing(quick):
    r = quick["reference_help"]
    assert_clean(r)
    assert r.stdout.startswith("usage: phasebo reference")
    assert "--seeds" in r.stdout and "--official-seeds" in r.stdout
    p = quick["pretrain_help"]
    assert_clean(p)
    assert p.stdout.startswith("usage: phasebo pretrain")
    for flag in ("--vit-width", "--vit-depth", "--vit-heads", "--pretrain-steps",
                 "--pretrain-seed"):
        assert flag in p.stdout
    assert r.stderr == p.stderr == ""
    # nothing was pretrained (or compiled) into the commands' cache
    assert not any(quick["cache"].rglob("*"))


# --------------------------------------------------------------------------------------------
# Sweeps
# --------------------------------------------------------------------------------------------


def test_sweep_command_runs_the_grid_then_the_refinement(refined):
    """--refine/--rounds/--target on a file without a [refine] block: the flags reach the
    refinement; round 1 bisects the separated slice (||mu|| = sqrt(5 * 40) at d = 4000), and
    --rounds 1 stops there."""
    out, p = refined
    assert_clean(p)
    grid = pd.read_parquet(out / "round-0" / "results.parquet")
    assert len(grid) == 12 and (grid["status"] == "ok").all()
    assert set(grid["d"]) == {250, 4000} and set(grid["signal_norm"]) == {5.0, 40.0}
    assert len(pd.read_csv(out / "round-0" / "results.csv")) == 12
    assert "tiny: 12 new runs (12 in the table)" in p.stderr
    log = json.loads((out / "refine.json").read_text())
    assert log["refinement"]["between"] == ["harmful", "benign"]
    assert (log["refinement"]["rounds"], log["refinement"]["target"]) == (1, 0.5)
    assert (log["refinement"]["x"], log["refinement"]["y"]) == ("signal_norm", "d")
    assert [r["runs"] for r in log["rounds"]] == [12, 3]
    df = pd.read_parquet(out / "results.parquet")
    assert df.groupby("round").size().to_dict() == {0: 12, 1: 3}
    new = df[df["round"] == 1]
    assert set(new["d"]) == {4000}, grid[["d", "signal_norm", "regime"]]
    assert new["signal_norm"].to_numpy() == pytest.approx(np.full(3, math.sqrt(200)), rel=1e-9)
    assert len(pd.read_parquet(out / "round-1" / "results.parquet")) == 3
    assert not (out / "round-2").exists()
    # round 0, the grid, draws the sweep's figures (in the asked formats) and report; round 1's
    # three points tile no map: tables only
    assert list((out / "round-0").glob("heatmap_regime_*.svg")) and \
        (out / "round-0" / "report.html").exists()
    assert not list((out / "round-1").glob("*.png")) and not (out / "round-1" / "report.html").exists()
    assert pd.read_csv(out / "boundaries.csv")["d"].tolist() == [250, 4000]


def test_a_refined_directory_reports_its_sweep_and_rounds(refined, tmp_path):
    """A refined directory has no manifest of its own: its report shows round 0's sweep (the
    file as run), with the refinement and its rounds' log as provenance, not ``null``."""
    from phasebo.report_html import report_data

    out, p = refined
    assert_clean(p)
    data = report_data(out)
    first = json.loads((out / "round-0" / "manifest.json").read_text())
    assert data["spec"] == first["spec"] and data["name"] == "refined"
    assert data["provenance"]["refine"] == json.loads((out / "refine.json").read_text())
    assert data["n_runs"] == 15
    # a round whose slices had no bounded interval yet logs null (strict JSON), and a log of an
    # earlier version with NaN there still makes a page
    import shutil

    from phasebo.report_html import write_report

    log = json.loads((out / "refine.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    copy = tmp_path / "refined"
    shutil.copytree(out, copy)
    log["rounds"][0]["median_rel_width"] = float("nan")
    (copy / "refine.json").write_text(json.dumps(log))
    page, _ = write_report(copy)
    assert page.stat().st_size > 1e5


def test_memory_budget_sets_the_block(refined, flags):
    """The budget of the shared flags is 1.5 runs per device: both rounds ran blocks of one run
    (and the same chunk shape: one compiled program)."""
    _, p = refined
    assert_clean(p)
    n_dev = flags[flags.index("--devices") + 1]
    for runs in (12, 3):
        assert re.search(rf"\b{runs} runs, block 1 x {n_dev} device\(s\), first chunk 4\b",
                         p.stderr), p.stderr


def test_float64_through_the_command_line(refined):
    out, p = refined
    assert_clean(p)
    for r in (0, 1):
        manifest = json.loads((out / f"round-{r}" / "manifest.json").read_text())
        assert manifest["spec"]["fixed"]["dtype"] == "float64"
    df = pd.read_parquet(out / "results.parquet")
    assert (df["dtype"] == "float64").all()
    # numbers computed in float64, not float32 widened: float32 cannot hold them
    for col in ("train_loss", "test_loss", "p_norm"):
        v = df[col].to_numpy(np.float64)
        assert (v.astype(np.float32).astype(np.float64) != v).all(), col


def test_figure_formats_and_dpi(refined):
    from PIL import Image

    out, p = refined
    assert_clean(p)
    stem = out / "boundary_harmful_benign"
    svg = stem.with_suffix(".svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    with Image.open(stem.with_suffix(".png")) as im:
        dpi, size = im.info["dpi"], im.size
    assert dpi == pytest.approx((40, 40), abs=0.1)
    assert max(size) < 500, size  # at the default 150 dpi the figure is > 900 pixels wide
    assert not list(out.glob("*.pdf"))


def test_boundaries_command_on_a_finished_sweep(refined, tmp_path):
    out, p = refined
    assert_clean(p)
    grid = out / "round-0"
    q = phasebo("boundaries", grid, "--x", "signal_norm", "--y", "d", "--between",
                "harmful,benign", "--boot", 100, "--out", tmp_path)
    assert_clean(q)
    stem = "harmful_benign_along_signal_norm_per_d"
    b = pd.read_csv(tmp_path / f"boundaries_{stem}.csv")
    assert b["d"].tolist() == [250, 4000]
    assert b["status"].tolist() == ["too_few", "separated"], b
    # separated: the boundary is the geometric midpoint of the two sampled values
    assert b["boundary"].iloc[1] == pytest.approx(math.sqrt(5 * 40), rel=1e-6)
    assert pd.read_parquet(tmp_path / f"boundaries_{stem}.parquet").shape[0] == 2
    assert (tmp_path / f"boundary_{stem}.png").stat().st_size > 5000
    assert f"table: {tmp_path / f'boundaries_{stem}.csv'}" in q.stdout
    assert "separated 1" in q.stdout
    assert not list(grid.glob("boundar*"))  # --out: nothing written beside the sweep
    from phasebo.cli import run  # another rule or other axes write their own files, never these

    assert run(["boundaries", str(grid), "--between", "harmful,benign", "--boot", "100",
                "--fitting", "not_overfitting", "--no-plots", "--out", str(tmp_path)]) == 0
    other = pd.read_csv(tmp_path / f"boundaries_{stem}_fitting-not_overfitting.csv")
    assert set(other["fitting"]) == {"not_overfitting"}
    assert run(["boundaries", str(grid), "--x", "d", "--y", "signal_norm", "--between",
                "harmful,benign", "--boot", "100", "--no-plots", "--out", str(tmp_path)]) == 0
    swapped = pd.read_csv(tmp_path / "boundaries_harmful_benign_along_d_per_signal_norm.csv")
    assert "signal_norm" in swapped.columns and "d" not in swapped.columns
    assert set(pd.read_csv(tmp_path / f"boundaries_{stem}.csv")["fitting"]) == {"apart"}
    assert pd.read_csv(tmp_path / f"boundaries_{stem}.csv")["d"].tolist() == [250, 4000]
    # a column to pool that the table does not have is refused, as one to slice by
    assert run(["boundaries", str(grid), "--over", "nosuch", "--no-plots", "--out",
                str(tmp_path)]) == 2
    # the same analysis again (here with other replicates) replaces its files, and says so
    again = phasebo("boundaries", grid, "--x", "signal_norm", "--y", "d", "--between",
                    "harmful,benign", "--boot", 100, "--out", tmp_path)
    assert_clean(again)
    assert f"replacing {tmp_path / f'boundaries_{stem}'}" in again.stderr
    assert "figure (replaced): " in again.stdout
    # the table states its horizon: the runs' steps and time
    assert {"steps", "time"} <= set(pd.read_csv(tmp_path / f"boundaries_{stem}.csv").columns)


@pytest.mark.slow  # 19 s; test_execute's Ctrl-C test covers the default (measured) chunking
def test_ctrl_c_exits_130_without_traceback(tiny_file, flags, tmp_path):
    """SIGINT once the sweep is computing (a run done, per the progress bar): exit 130 within
    5 s, a one-line note on stderr, every computed block kept as parts (its results, dynamics
    and samples; the chunk being computed keeps its finished blocks), no assembled tables."""
    from test_execute import sigint_when_counted

    out = tmp_path / "big"
    code, took, text, _ = sigint_when_counted(
        [sys.executable, "-m", "phasebo", "sweep", str(tiny_file), "--out", str(out),
         *map(str, flags), "--seeds", "500", "--no-plots"], ENV, 2000)
    assert code is not None, f"still running 30 s after SIGINT:\n{text}"
    assert code == 130, f"exit {code} after SIGINT:\n{text}"
    assert took <= 5.0, f"{took:.1f} s from SIGINT to exit"
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "interrupted: finished chunks are saved under" in text
    parts = list((out / "parts").glob("results-*.parquet"))
    assert 1 <= len(parts) < 500
    assert not (out / "results.parquet").exists()
    for p in parts:  # whole blocks: each part holds its runs, with their other tables
        assert 1 <= len(pd.read_parquet(p)) <= CHUNK, p.name
        tag = p.name.removeprefix("results-")
        assert {q.name.split("-")[0] for q in (out / "parts").glob(f"*-{tag}")} >= {"results",
                                                                                     "samples"}


def test_xla_cpu_tuning_is_added_once_and_only_where_asked(monkeypatch):
    from phasebo.cli.xla import YNN_FUSION, YNN_MEASURED, tune_xla_cpu

    monkeypatch.setattr("importlib.metadata.version", lambda name: "{}.{}.7".format(*YNN_MEASURED))
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert tune_xla_cpu(env) and env["XLA_FLAGS"].endswith(" " + YNN_FUSION)
    assert not tune_xla_cpu(env) and env["XLA_FLAGS"].count("ynn") == 1  # once
    mine = {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="}  # the user's choice stays
    assert not tune_xla_cpu(mine) and mine["XLA_FLAGS"].endswith("type=")
    off = {"PHASEBO_XLA_TUNING": "0"}
    assert not tune_xla_cpu(off) and "XLA_FLAGS" not in off
    monkeypatch.setattr("importlib.metadata.version", lambda name: "9.99.0")
    other = {}  # a jaxlib it was not measured on may not know the flag (XLA would stop)
    assert not tune_xla_cpu(other) and "XLA_FLAGS" not in other


def test_a_sweep_gives_the_same_numbers_with_and_without_the_xla_cpu_tuning(tiny_file, tmp_path):
    """The sweep command's XLA fusion changes how matrix products are computed, not what: the
    noise groups of the tiny map (float32, where it speeds the step up) give the same regimes and
    the same numbers to float32 rounding."""
    plain = " ".join(f for f in ENV.get("XLA_FLAGS", "").split() if "ynn" not in f)
    env0 = {**ENV, "PHASEBO_XLA_TUNING": "0", "XLA_FLAGS": plain}
    procs = {k: subprocess.Popen(
        [sys.executable, "-m", "phasebo", "sweep", str(tiny_file), "--out", str(tmp_path / k),
         "--set", "common_noise=signal_norm", "--no-plots", "--quiet"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=e) for k, e in (("off", env0), ("on", ENV))}
    for p in procs.values():
        out, err = p.communicate(timeout=300)
        assert_clean(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    a, b = (pd.read_parquet(tmp_path / k / "results.parquet").sort_values(["d", "signal_norm",
                                                                         "seed"])
            for k in ("off", "on"))
    assert len(a) == 12 and list(a["regime"]) == list(b["regime"])
    for c in ("train_loss", "test_loss", "test_acc", "p_norm", "margin"):
        np.testing.assert_allclose(b[c].to_numpy(), a[c].to_numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=c)


@pytest.mark.parametrize("dry", [True, False])
def test_a_bad_refinement_is_refused_before_anything_runs(tiny_file, tmp_path, capsys, dry):
    """A misspelt regime in --refine (or a [refine] block) is a one-line error, exit 2, with
    and without --dry-run, and nothing is written (it was a traceback after the first round)."""
    from phasebo.cli import main

    out = tmp_path / "r"
    args = ["sweep", str(tiny_file), "--out", str(out), "--refine", "not_overfiting,benign"]
    assert main(args + (["--dry-run"] if dry else [])) == 2
    err = capsys.readouterr().err.strip()
    assert "'not_overfiting' is not a regime" in err and "did you mean" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_refinement_along_the_other_axis_from_the_command_line(tiny_file, tmp_path, capsys):
    """--along: the boundary refined along the map's y axis took a file with a [refine]
    block; without --refine it is refused, one line."""
    from phasebo.cli import main

    spec = load_sweep(tiny_file)
    x, y = [a for a, v in spec.axes.items() if len(v) > 1]
    out = str(tmp_path / "r")
    for along, per in ((x, y), (y, x)):
        assert main(["sweep", str(tiny_file), "--out", out, "--refine", "harmful,benign",
                     "--along", along, "--dry-run"]) == 0
        assert f"boundary along {along} (per {per})" in capsys.readouterr().out
    assert main(["sweep", str(tiny_file), "--out", out, "--along", x, "--dry-run"]) == 2
    assert "fix: add --refine A,B" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["sweep", "plot", "report", "boundaries"])
def test_every_command_names_itself_in_its_errors(cmd, tmp_path, capsys):
    """An error of ``phasebo CMD`` starts with ``phasebo CMD: error:`` (as argparse's own do), one
    line, exit 2."""
    from phasebo.cli import run

    missing = str(tmp_path / "missing")
    args = {"sweep": [missing + ".toml"], "plot": [missing], "report": [missing],
            "boundaries": [missing, "--x", "d", "--y", "signal_norm"]}[cmd]
    assert run([cmd, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"phasebo {cmd}: error: "), err


@pytest.mark.parametrize("cmd", ["plot", "boundaries"])
def test_bad_flags_of_the_figure_commands_are_one_line_errors(cmd, tmp_path, capsys):
    """Formats, counts and --out are checked before anything is read or written; a file or an
    impossible place as --out names the flag and the fix."""
    from phasebo.cli import run

    a_file = tmp_path / "results.csv"
    a_file.write_text("x\n")
    bad = [["--format", "bmpx"], ["--format", "jpg,png"], ["--out", str(a_file)],
           ["--out", str(a_file / "below")]]
    bad += [["--boot", "-3"], ["--boot", "1"], ["--boot", "50"]] if cmd == "boundaries" else \
        [["--dpi", "0"]]
    for flags in bad:
        assert run([cmd, str(tmp_path), *flags]) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"phasebo {cmd}: error: --"), (flags, err)
        assert flags[0] in err[0], (flags, err)
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # nothing written


def test_boundaries_by_draws_a_figure_per_slice_and_over_none(tmp_path, capsys):
    """--by lr: a map per value of lr (a map holds one); --over lr pools lr into each slice's
    fit, which no map does: no figure, said. A finished table of planted regimes."""
    from test_boundaries import planted

    from phasebo.cli import run

    df = pd.concat([planted(np.random.default_rng(0), seeds=4).assign(lr=lr)
                    for lr in (0.01, 0.02)], ignore_index=True)
    df["run_id"], df["steps"] = np.arange(len(df)), 100
    df.to_parquet(tmp_path / "results.parquet")
    common = [str(tmp_path), "--x", "signal_norm", "--y", "d", "--boot", "100", "--between",
              "benign,harmful"]
    assert run(["boundaries", *common, "--by", "lr"]) == 0
    stem = "boundary_benign_harmful_along_signal_norm_per_d_by_lr"
    assert sorted(p.name for p in tmp_path.glob("boundary_*.png")) == [
        f"{stem}_lr=0.01.png", f"{stem}_lr=0.02.png"]
    out = capsys.readouterr().out
    assert "at step 100, 4 seeds" in out
    # one summary per lr, as the fit table has one row per lr (not one fit pooling both)
    assert "lr = 0.01: boundary" in out and "lr = 0.02: boundary" in out
    assert run(["boundaries", *common, "--over", "lr"]) == 0
    assert "no figure: the slices pool lr (--over)" in capsys.readouterr().out
    assert len(list(tmp_path.glob("boundary_*.png"))) == 2


def test_unset_drops_an_included_setting_so_another_rule_applies(tmp_path, capsys):
    """A file whose include sets steps cannot become a flow by --set alone (steps would be
    ignored, which is refused); --unset steps drops it, names its own directory, and refuses a
    setting the file does not give or does not exist."""
    from phasebo.cli.sweep import main

    base = tmp_path / "base.toml"
    base.write_text('[settings]\nmodel = "prompt_attention"\nd = 300\nsteps = 50\n')
    f = tmp_path / "f.toml"
    f.write_text('include = "base.toml"\nname = "f"\n[axes]\nsignal_norm = [5.0, 20.0]\n')
    flow = ["--set", "dynamics=flow", "--set", "flow_time=2.0", "--dry-run"]
    assert main([str(f), *flow]) == 2
    assert "--unset steps" in capsys.readouterr().err
    assert main([str(f), "--unset", "steps", *flow]) == 0
    assert "steps=unset" in capsys.readouterr().out
    assert main([str(f), "--unset", "weight_decay", "--dry-run"]) == 2
    assert "does not set it" in capsys.readouterr().err
    assert main([str(f), "--unset", "stepz", "--dry-run"]) == 2
    assert "did you mean 'steps'" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["phasebo.sweep", "phasebo"])
def test_a_closed_output_pipe_ends_quietly(module, tmp_path):
    """``python -m phasebo.sweep FILE --dry-run | head -1``: the reader gone, the command ends
    without a BrokenPipeError traceback (every entry point runs through cli.guarded)."""
    import os

    args = [str(ROOT / "sweeps" / "default.toml"), "--dry-run", "--out", str(tmp_path / "o")]
    r, w = os.pipe()
    os.close(r)  # nobody reads: every write to stdout fails
    try:
        p = subprocess.run([sys.executable, "-m", module, *(["sweep"] if module == "phasebo"
                                                           else []), *args],
                           stdout=w, stderr=subprocess.PIPE, text=True, env=ENV, timeout=300)
    finally:
        os.close(w)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr


def test_boundaries_of_runs_in_neither_regime_say_what_the_runs_are(tmp_path, capsys):
    """No flipped label, so no run is benign or harmful: the command says what the runs are and
    how to ask for regimes they have, instead of only 'too_few' slices."""
    from phasebo.cli import run
    from phasebo.config import spec_from_dict
    from phasebo.sweep import run_sweep

    spec = spec_from_dict({"n": 12, "n_test": 64, "T": 6, "d": 48, "steps": 5, "noise_ratio": 0.0},
                          {"signal_norm": [1.0, 3.0, 9.0]}, seeds=2, name="clean")
    run_sweep(spec, tmp_path / "c", quiet=True, plots=False)
    capsys.readouterr()
    assert run(["boundaries", str(tmp_path / "c"), "--y", "d", "--no-plots"]) == 0
    assert "no run is benign or harmful: no_noise 6 runs; fix: --between two regimes the runs " \
        "have" in capsys.readouterr().out


def test_a_commands_warnings_are_one_line_each(capsys):
    """A command's warning printed Python's source location and line (``cli/__init__.py:228:
    UserWarning: ...`` and the code): one line that says what happened instead."""
    import warnings

    from phasebo.cli import guarded

    def command():
        warnings.warn("24 runs appear in more than one of the loaded sweeps", UserWarning,
                      stacklevel=2)
        return 0

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert guarded(command) == 0
    assert capsys.readouterr().err == (
        "phasebo: warning: 24 runs appear in more than one of the loaded sweeps\n")
