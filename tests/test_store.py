"""The results directory: the manifest's history, --overwrite, canonical override directories,
the dry run's account of what is done, and a quoted command line."""

import json
import re
import shlex
from pathlib import Path

import pytest

from phasebo.cli.args import parse_set
from phasebo.cli.sweep import main, override_slug
from phasebo.config import load_sweep, spec_from_dict
from phasebo.settings import ConfigError
from phasebo.store import command_line, read_manifest
from phasebo.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(engine="reduced", d=40, steps=4, n_test=20)


def tiny(seeds=1, mus=(3.0, 30.0)):
    return spec_from_dict(TINY, {"signal_norm": list(mus)}, seeds=seeds, name="tiny")


def test_the_manifest_keeps_every_invocation_and_the_provenance_of_the_runs(tmp_path):
    out = tmp_path / "o"
    run_sweep(tiny(), out, quiet=True, plots=False)
    first = read_manifest(out)
    assert first["new_runs"] == 2 and len(first["history"]) == 1
    run_sweep(tiny(), out, quiet=True, plots=False)  # nothing to do
    again = read_manifest(out)
    assert [h["new_runs"] for h in again["history"]] == [2, 0]
    # the top level still describes the invocation that made the runs
    assert again["invocation"] == first["invocation"] and again["new_runs"] == 2
    run_sweep(tiny(seeds=2), out, quiet=True, plots=False)  # grown: 2 new runs
    grown = read_manifest(out)
    assert [h["new_runs"] for h in grown["history"]] == [2, 0, 2]
    assert grown["new_runs"] == 2
    assert grown["invocation"] == grown["history"][-1]["invocation"] != first["invocation"]


def test_overwrite_removes_the_parts_tables_and_figures(tmp_path):
    out = tmp_path / "o"
    run_sweep(tiny(), out, quiet=True, plots=True)
    figures = sorted(p.name for p in out.glob("*.png"))
    assert figures and (out / "results.parquet").exists()
    (out / "figures").mkdir()
    (out / "figures" / "map_regime_d_vs_signal_norm.png").write_bytes(b"old")
    (out / "notes.txt").write_text("the user's own file")
    for f in ("boundaries_harmful_benign_along_signal_norm_per_d.csv",
              "boundaries_harmful_benign_along_signal_norm_per_d_fit.csv",
              "boundaries_harmful_benign_along_signal_norm_per_d.parquet"):
        (out / f).write_text("the discarded runs' boundary")
    run_sweep(tiny(mus=(5.0, 50.0)), out, overwrite=True, quiet=True, plots=False)
    assert not list(out.glob("*.png")) and not (out / "figures").exists()
    assert not list(out.glob("boundaries*"))  # made from the runs discarded
    assert (out / "notes.txt").exists()  # not phasebo's: kept
    assert len(list((out / "parts").glob("results-*"))) >= 1
    assert [h["new_runs"] for h in read_manifest(out)["history"]] == [2]  # a new directory


def test_reordered_or_respelled_overrides_name_the_same_directory():
    spec_file = ROOT / "sweeps" / "default.toml"
    forms = (["d=[100, 1000]", "noise_ratio=0.2"], ["noise_ratio=0.2", "d=[100, 1000]"],
             ["noise_ratio = 0.20", "d=[100,1000]"], ["d=[1000, 100]", "noise_ratio=0.2"])
    slugs = {override_slug(parse_set(f), load_sweep(spec_file, parse_set(f))) for f in forms}
    assert slugs == {"d=100+1000,noise_ratio=0.2"}
    rng = parse_set(["lr={start=0.1, stop=0.4, step=0.1}"])
    listed = parse_set(["lr=[0.1, 0.2, 0.3, 0.4]"])
    a = override_slug(rng, load_sweep(spec_file, rng))
    assert a == "lr=0.1+0.2+0.3+0.4"
    assert a == override_slug(listed, load_sweep(spec_file, listed))
    long = parse_set([f"signal_norm={list(range(1, 80))}"])
    s = override_slug(long, load_sweep(spec_file, long))
    assert len(s) <= 120 and s != override_slug(
        parse_set([f"signal_norm={list(range(1, 81))}"]),
        load_sweep(spec_file, parse_set([f"signal_norm={list(range(1, 81))}"])))


def test_a_setting_given_twice_by_set_is_refused_unless_the_same():
    assert parse_set(["n=20", "n = 20"]) == {"n": 20}
    with pytest.raises(ConfigError, match="--set n is given twice \\(20 and 30\\)"):
        parse_set(["n=20", "n=30"])


def test_the_dry_run_says_what_is_done_and_refuses_what_the_run_would(tmp_path, capsys):
    f = tmp_path / "tiny.toml"
    f.write_text('name = "tiny"\nseeds = 2\n[settings]\nengine = "reduced"\nd = 40\nsteps = 4\n'
                 'n_test = 20\n[axes]\nsignal_norm = [3.0, 30.0]\n')
    out = tmp_path / "o"
    assert main([str(f), "--out", str(out), "--dry-run", "--no-plots"]) == 0
    assert "4 runs to run" in capsys.readouterr().out
    run_sweep(load_sweep(f, seeds=1), out, quiet=True, plots=False)
    assert main([str(f), "--out", str(out), "--dry-run", "--no-plots"]) == 0
    assert "2 of 4 runs done, 2 to run" in capsys.readouterr().out
    # another setting than the directory's runs: the real run refuses, so does the dry run
    run_sweep(load_sweep(f), out, quiet=True, plots=False)
    assert main([str(f), "--out", str(out), "--dry-run", "--no-plots", "--set", "lr=0.1"]) == 2
    err = capsys.readouterr().err
    assert "holds runs of another sweep: lr had " in err
    assert len(err.strip().splitlines()) == 1
    # fewer seeds: a subset of the runs there, nothing to run
    assert main([str(f), "--out", str(out), "--dry-run", "--no-plots", "--seeds", "1"]) == 0
    assert "all 2 runs done: a subset of the 4 runs there" in capsys.readouterr().out
    # --overwrite: what the run would refuse it discards, and the dry run says so
    assert main([str(f), "--out", str(out), "--dry-run", "--no-plots", "--set", "lr=0.1",
                 "--overwrite"]) == 0
    assert "--overwrite: the 4 runs there are discarded; 4 runs to run" in capsys.readouterr().out


def test_coinciding_cases_are_refused_before_anything_runs(tmp_path, capsys):
    f = ROOT / "sweeps" / "sakamoto_fig3.toml"
    rc = main([str(f), "--set", "d=1500", "--set", "signal_norm=10", "--out", str(tmp_path / "o"),
               "--quiet", "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 2 and "[[cases]] #1 and #2 are the same runs" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,expected", [
    (["/x/phasebo/sweep.py", "sweeps/default.toml", "--set", "signal_norm=[10, 40]"],
     "python -m phasebo.sweep sweeps/default.toml --set 'signal_norm=[10, 40]'"),
    (["/usr/bin/phasebo", "sweep", "a b.toml"], "phasebo sweep 'a b.toml'"),
])
def test_the_manifest_command_can_be_pasted_back(argv, expected):
    assert command_line(argv) == expected
    assert shlex.split(command_line(argv))[-1] == argv[-1]


def test_the_manifest_is_json_with_the_spec(tmp_path):
    out = tmp_path / "o"
    run_sweep(tiny(), out, quiet=True, plots=False)
    m = json.loads((out / "manifest.json").read_text())
    assert m["spec"]["axes"] == {"signal_norm": [3.0, 30.0]} and m["n_runs"] == 2
    # what made the runs: the commit, whether the checkout had changes, where it ran from
    assert m["cwd"] == str(Path.cwd()) and m["history"][-1]["cwd"] == str(Path.cwd())
    if m["git_commit"] is not None:
        assert isinstance(m["git_dirty"], bool)


def test_a_subset_of_the_directorys_runs_is_analysed_from_it(tmp_path, capsys):
    """The README's command on a directory grown beyond it (more seeds, more values): nothing
    runs, nothing is deleted, the tables hold the smaller sweep's runs (the same numbers), and the
    bigger sweep's command assembles every run again."""
    out = tmp_path / "o"
    big = run_sweep(tiny(seeds=3, mus=(3.0, 10.0, 30.0)), out, quiet=True, plots=False)
    parts = sorted(p.name for p in (out / "parts").iterdir())
    small = run_sweep(tiny(seeds=2, mus=(3.0, 30.0)), out, quiet=True)  # figures, report
    assert sorted(p.name for p in (out / "parts").iterdir()) == parts  # nothing ran or went
    assert len(small) == 4 and set(small["signal_norm"]) == {3.0, 30.0}
    same = big.set_index("run_id").loc[small["run_id"], "test_loss"].to_numpy()
    assert (same == small["test_loss"].to_numpy()).all()
    m = read_manifest(out)
    assert m["n_runs"] == 9 and m["tables_n_runs"] == 4 and m["history"][-1]["subset"] is True
    import phasebo as pb

    assert "its tables hold" not in capsys.readouterr().err  # the sweep's own report: not said
    assert len(pb.load(out)) == 4  # loading it says the table is a subset of the directory
    assert "its tables hold 4 of its 9 runs" in capsys.readouterr().err
    assert m["spec"]["seeds"] == 3  # the directory's runs, for the next sweep's check
    again = run_sweep(tiny(seeds=3, mus=(3.0, 10.0, 30.0)), out, quiet=True, plots=False)
    assert len(again) == 9 and "tables_spec" not in read_manifest(out)


def test_a_sweep_refused_after_its_manifest_does_not_bind_the_directory(tmp_path, capsys):
    """A plot spec naming a column no run has is refused once the programs are traced, after the
    manifest is written; the corrected sweep (here also with other axis values) takes the
    directory, which holds no run."""
    f = tmp_path / "tiny.toml"
    body = ('name = "tiny"\nseeds = 1\n[settings]\nengine = "reduced"\nd = 40\nsteps = 4\n'
            'n_test = 20\n[axes]\nsignal_norm = [3.0, 30.0]\n')
    f.write_text(body + '[plot]\nheatmaps = [{ x = "signal_norm", y = "seed", value = "tets_acc" }]\n')
    out = tmp_path / "o"
    assert main([str(f), "--out", str(out), "--quiet"]) == 2
    assert "tets_acc" in capsys.readouterr().err
    f.write_text(body.replace("[3.0, 30.0]", "[5.0, 30.0]"))
    assert main([str(f), "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert main([str(f), "--out", str(out), "--dry-run", "--no-plots"]) == 0
    assert "2 of 2 runs done" in capsys.readouterr().out


def test_writing_out_a_models_own_default_grows_its_sweep_instead_of_being_refused(tmp_path):
    """A single_head sweep left at its own signal_norm default (30, not prompt_attention's 20),
    then the same sweep with that default written out and one seed more: the same runs plus the
    new seed's, not a refusal claiming the directory held signal_norm = 20."""
    base = {"model": "single_head", "d": 60, "n": 8, "n_test": 16, "steps": 3}
    out = tmp_path / "o"
    first = run_sweep(spec_from_dict(base, seeds=2, name="s"), out, quiet=True, plots=False)
    grown = run_sweep(spec_from_dict({**base, "signal_norm": 30.0}, seeds=3, name="s"), out,
                      quiet=True, plots=False)
    assert len(grown) == 3 and set(first["run_id"]) <= set(grown["run_id"])
    with pytest.raises(ConfigError, match="signal_norm had 30.0 there"):
        run_sweep(spec_from_dict({**base, "signal_norm": 20.0}, seeds=3, name="s"), out,
                  quiet=True, plots=False)


def cases_spec(pairs, seeds=1):
    return spec_from_dict(TINY, seeds=seeds, name="c",
                          cases=[{"d": d, "signal_norm": mu} for d, mu in pairs])


def test_cases_paired_differently_are_refused_not_silently_dropped(tmp_path, capsys):
    """The same values of d and signal_norm in [[cases]] paired the other way: every value is
    still there, but not one run; the directory is refused (the dry run too) instead of tables
    that silently drop its runs. Adding a case keeps the old ones: that grows it."""
    out = tmp_path / "o"
    run_sweep(cases_spec([(40, 3.0), (60, 30.0)]), out, quiet=True, plots=False)
    swapped = cases_spec([(40, 30.0), (60, 3.0)])
    why = (r"its run at \(d = 40, signal_norm = 3.0, seed 0\) is not a run of this sweep, "
           r"whose \[\[cases\]\] pair the values differently; fix: choose another --out")
    with pytest.raises(ConfigError, match=why):
        run_sweep(swapped, out, quiet=True, plots=False)
    f = tmp_path / "c.toml"
    f.write_text('name = "c"\n[settings]\nengine = "reduced"\nsteps = 4\nn_test = 20\n'
                 '[[cases]]\nd = 40\nsignal_norm = 30.0\n[[cases]]\nd = 60\nsignal_norm = 3.0\n')
    assert main([str(f), "--out", str(out), "--dry-run", "--no-plots"]) == 2
    assert re.search(why, capsys.readouterr().err)
    grown = run_sweep(cases_spec([(40, 3.0), (60, 30.0), (60, 3.0)], seeds=2), out, quiet=True,
                      plots=False)
    assert len(grown) == 6


def test_cases_picked_from_a_grid_are_a_subset_of_it(tmp_path):
    """Cells of a finished grid named as [[cases]] (a setting fixed in the grid left to the
    cases' shared [settings]): every run is there, made with the same settings, so it is a subset,
    not a refusal; the grid's command assembles the grid again."""
    out = tmp_path / "o"
    grid = spec_from_dict(TINY, {"signal_norm": [3.0, 30.0], "lr": [0.1, 0.2]}, name="g")
    run_sweep(grid, out, quiet=True, plots=False)
    picked = spec_from_dict(TINY, name="g", cases=[{"signal_norm": 3.0, "lr": 0.1},
                                                    {"signal_norm": 30.0, "lr": 0.2}])
    assert len(run_sweep(picked, out, quiet=True, plots=False)) == 2
    assert len(run_sweep(grid, out, quiet=True, plots=False)) == 4


@pytest.mark.parametrize("setting,value", [("test_eps", 0.1), ("record_every", 2)])
def test_a_subset_with_other_labelling_or_records_is_refused(tmp_path, setting, value):
    """Every run of the sweep is in the directory, but made with another regime threshold or
    other records: its tables would keep the old labels and records, so it is refused; the same
    settings select a subset as before."""
    out = tmp_path / "o"
    run_sweep(tiny(seeds=2), out, quiet=True, plots=False)
    s = spec_from_dict({**TINY, setting: value}, {"signal_norm": [3.0, 30.0]}, seeds=1,
                       name="tiny")
    with pytest.raises(ConfigError, match=rf"holds these runs made with other settings: this "
                                          rf"sweep has {setting} = {value}, they were made with "
                                          r".*; fix: give this sweep another --out"):
        run_sweep(s, out, quiet=True, plots=False)
    assert len(run_sweep(tiny(seeds=1), out, quiet=True, plots=False)) == 2


def test_a_grown_sweep_removes_the_figures_it_no_longer_draws(tmp_path, capsys):
    """One d: line plots against signal_norm; grown to two d: maps. The old lines would read as
    current; they are removed (and said), a file of the user's own is kept, and the manifest
    lists the figures now there."""
    base = dict(engine="reduced", steps=4, n_test=20)
    out = tmp_path / "o"
    run_sweep(spec_from_dict(base, {"signal_norm": [3.0, 30.0], "d": [40]}, name="g"), out,
              quiet=True)
    lines = sorted(p.name for p in out.glob("line_*.png"))
    assert lines and read_manifest(out)["figures"] == sorted(p.name for p in out.glob("*.png"))
    (out / "mine.png").write_bytes(b"the user's own figure")
    capsys.readouterr()
    run_sweep(spec_from_dict(base, {"signal_norm": [3.0, 30.0], "d": [40, 60]}, name="g"), out)
    assert not list(out.glob("line_*.png")) and (out / "mine.png").exists()
    assert f"removed {len(lines)} figure(s) of the previous drawing" in capsys.readouterr().err
    drawn = read_manifest(out)["figures"]
    assert drawn and all(n.startswith("heatmap_") for n in drawn)
    assert sorted(p.name for p in out.glob("heatmap_*.png")) == drawn
    # drawn again in another format: the PNGs show the same runs and stay
    run_sweep(spec_from_dict(base, {"signal_norm": [3.0, 30.0], "d": [40, 60]}, name="g"), out,
              quiet=True, formats=("svg",))
    assert sorted(p.name for p in out.glob("heatmap_*.png")) == drawn
    assert set(read_manifest(out)["figures"]) == set(drawn) | {
        n.replace(".png", ".svg") for n in drawn}


def test_a_second_command_into_a_directory_being_written_is_refused(tmp_path, capsys):
    """Two commands into one --out: the second is refused in one line naming the first (its pid
    and command), not run a second time; a killed holder frees the directory at once."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "o"
    holder_code = ("import sys, time; from phasebo.store import hold_dir\n"
                   "with hold_dir(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", holder_code, str(out)], stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    try:
        assert p.stdout.readline().strip() == "held"
        argv = ["sweeps/default.toml", "--out", str(out), "--seeds", "1", "--set", "d=[40]",
                "--set", "signal_norm=[3.0]", "--set", "steps=4", "--no-plots"]
        assert main(argv + ["--dry-run"]) == 0
        assert "being written now by another phasebo command (a sweep, pid" in \
            capsys.readouterr().out
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"pid {p.pid}" in err and "another --out" in err
        assert not (out / "parts").exists()  # nothing ran
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()
    assert main(argv) == 0  # the kernel released the killed holder's lock
    assert (out / "results.parquet").exists()


def test_a_directory_held_twice_is_refused_even_in_one_process(tmp_path):
    from phasebo.store import hold_dir

    out = tmp_path / "new"
    with hold_dir(out, what="refinement"), pytest.raises(
            ConfigError, match=r"being written by another phasebo command \(a refinement, pid"), \
            hold_dir(out):
        pass
    with hold_dir(out), hold_dir(out, process_index=1):  # a cluster's processes: one lock each
        assert (out / ".phasebo-lock-1").exists()


def test_the_dry_run_of_a_refinement_counts_its_rounds(tmp_path, capsys):
    """A refinement's round 0 lives in round-0/: the dry run counts the runs there (not in the
    directory above) and says what the rounds add, with the runs the rounds done hold."""
    out = tmp_path / "r"
    argv = ["sweeps/default.toml", "--refine", "not_overfitting,benign", "--rounds", "1",
            "--target", "0.1", "--seeds", "2", "--set", "steps=300", "--out", str(out)]
    assert main(argv + ["--dry-run"]) == 0
    said = capsys.readouterr().out
    assert f"200 runs to run ({out / 'round-0'} holds none)" in said
    assert "then up to 1 refinement round(s) of the not_overfitting-benign boundary" in said
    assert main(argv + ["--quiet", "--no-plots"]) == 0
    capsys.readouterr()
    assert main(argv + ["--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "200 of 200 runs done, 0 to run" in said
    rounds = json.loads((out / "refine.json").read_text())["rounds"]
    if len(rounds) > 1:  # round 1 ran: its runs are counted
        assert f"already done: round-1 {rounds[1]['runs']} runs" in said
    else:
        assert "already done" not in said and not (out / "round-1").exists()


def test_boundaries_of_tables_a_sweep_replaced_are_removed_and_said(tmp_path, capsys):
    """phasebo boundaries writes into the sweep's directory; a sweep that then changes its tables
    (grown, or a subset) removes those tables and figures, and says so; one that adds nothing
    keeps them."""
    out = tmp_path / "o"
    run_sweep(tiny(), out, quiet=True, plots=False)
    made = ["boundaries_harmful_benign_along_signal_norm_per_d.csv",
            "boundaries_harmful_benign_along_signal_norm_per_d_fit.csv",
            "boundary_harmful_benign_along_signal_norm_per_d.png"]
    for f in made:
        (out / f).write_text("from the 2-run tables")
    (out / "figures").mkdir()  # phasebo plot's figures of those tables
    made.append("figures/map_regime_d_vs_signal_norm_step10.png")
    (out / made[-1]).write_text("from the 2-run tables")
    (out / "boundary_sketch.png").write_text("the user's own: not named as phasebo names them")
    run_sweep(tiny(), out, plots=False)  # the same runs: the same tables
    assert all((out / f).exists() for f in made) and "removed" not in capsys.readouterr().err
    run_sweep(tiny(seeds=2), out, plots=False)  # grown: new tables
    assert not any((out / f).exists() for f in made) and (out / "boundary_sketch.png").exists()
    assert "removed 4 table(s) and figure(s) of phasebo boundaries or phasebo plot" in \
        capsys.readouterr().err
    (out / made[0]).write_text("from the 4-run tables")
    run_sweep(tiny(), out, quiet=True, plots=False)  # a subset: its own tables
    assert not (out / made[0]).exists()
