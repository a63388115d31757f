"""Smoke test of ``python -m phasebo.bench`` (timings are printed, never asserted)."""

import json

import numpy as np
import pytest

from phasebo import bench
from phasebo.cli.bench import main as bench_main


def test_numpy_reference_is_the_same_model():
    # the benign setting of Sakamoto & Sato's three-regime figures (d 2000, ||mu|| 20): fits
    # every label by step 400, generalises
    train_acc, test_acc = bench.numpy_run(d=2000, steps=400, seed=1)
    assert train_acc == 1.0 and test_acc >= 0.95


def test_bench_quick_loop_section_runs_and_reports(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench_main(["--quick", "--sections", "loop", "--steps", "5", "--repeat", "1",
                     "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "batched/per-run" in text and "batched/numpy" in text
    rec = json.loads(out.read_text())["loop"][0]
    assert rec["d"] == 1000 and rec["steps"] == 5
    assert all(np.isfinite(rec[k]) and rec[k] > 0 for k in ("batched", "per_run", "numpy"))


def test_bench_blocks_section_times_the_planners_own_block_beside_the_others(tmp_path, capsys):
    from phasebo.bench import _group

    out = tmp_path / "bench.json"
    rc = bench_main(["--quick", "--sections", "blocks", "--steps", "3", "--repeat", "1",
                     "--json", str(out)])
    assert rc == 0
    assert "planned: the sweep's own block on this machine" in capsys.readouterr().out
    for rec in json.loads(out.read_text())["blocks"]:
        n = 8 if rec["engine"] == "direct" else 64
        assert rec["planned"] == _group(rec["engine"], rec["d"], n, 3)[0].block
        assert rec["planned"] in rec["blocks"] and len(rec["rates"]) == len(rec["blocks"])
        assert rec["best"] == rec["blocks"][int(np.argmax(rec["rates"]))]


def test_bench_rejects_an_unknown_section(capsys):
    assert bench_main(["--sections", "nope"]) == 2
    assert "unknown section" in capsys.readouterr().err


def test_paired_ratio_is_the_median_of_the_rounds_ratios():
    # rounds 2/1, 3/3, 10/2: a slow round (the second) moves neither variant's ratio
    assert bench.paired_ratio([2.0, 3.0, 10.0], [1.0, 3.0, 2.0]) == 2.0


def test_bench_rejects_gpu_jobs_it_does_not_have(capsys):
    assert bench_main(["--sections", "gpu", "--gpu-jobs", "2,9"]) == 2
    err = capsys.readouterr().err
    assert "--gpu-jobs = '2,9'" in err and "from 1 to" in err


def test_bench_gpu_section_runs_a_job_as_a_user_and_keeps_its_table(tmp_path, capsys,
                                                                    monkeypatch):
    """The accelerator's section, quick, on the CPU: the S2 dynamics job (4 seeds per setting)
    as its own sweep process; its row and its kept results table."""
    import pandas as pd

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as the section sets it
    out = tmp_path / "bench.json"
    assert bench_main(["--quick", "--sections", "gpu", "--gpu-jobs", "3", "--keep",
                       str(tmp_path / "keep"), "--json", str(out)]) == 0
    assert "S2 dynamics, every 10" in capsys.readouterr().out
    rec = json.loads(out.read_text())["gpu"]
    assert [r["job"] for r in rec] == ["S2 dynamics, every 10"] and rec[0]["rc"] == 0
    assert rec[0]["runs"] == 12 and rec[0]["not_ok"] == 0 and rec[0]["run_s"] > 0
    kept = pd.read_parquet(tmp_path / "keep" / "S2_dynamics__every_10.parquet")
    assert len(kept) == 12 and {"run_id", "regime", "test_acc"} <= set(kept.columns)
    assert "/".join(str(int((kept["regime"] == r).sum())) for r in
                    ("benign", "fitting", "harmful", "not_overfitting")) == rec[0]["regimes"]


def test_whole_sweep_rate_is_total_runs_over_total_time():
    recs = [{"a": 1.0, "b": 10.0}, {"a": 4.0, "b": 10.0}]  # 1 s and 0.25 s per run of a
    assert bench.whole_sweep(recs, ("a", "b")) == {"a": 2 / 1.25, "b": 10.0}


@pytest.mark.slow  # 38 s; the quick loop section runs by default
def test_bench_dynamics_section_reports_the_ratios(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench_main(["--quick", "--sections", "dynamics", "--steps", "5", "--repeat", "1",
                       "--json", str(out)]) == 0
    assert "every10/none" in capsys.readouterr().out
    rec = json.loads(out.read_text())["dynamics"][0]
    assert all(np.isfinite(rec[k]) and rec[k] > 0 for k in ("none", "every 10", "log 20"))
    assert rec["rounds"] == 2 and rec["every10_over_none"] > 0  # timed in turns, paired


@pytest.mark.slow  # pretrains the quick width-32 backbone (~40 s) and runs the recipe sweep
def test_bench_vit_section_reports_the_cls_row_ratio(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PHASEBO_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "bench.json"
    assert bench_main(["--quick", "--sections", "vit", "--repeat", "1",
                       "--json", str(out)]) == 0
    assert "CLS row" in capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert [r["batch"] for r in rec["vit"]] == [16, 400]
    assert all(r["cls row"] > 0 and r["whole block"] > 0 for r in rec["vit"])
    assert rec["vit_recipe"]["runs"] == 4 and rec["vit_recipe"]["wall_s"] > 0


@pytest.mark.slow  # the trained-W map at one seed (1521 runs, 16 programs compiled cold): ~90 s
def test_bench_wpmap_section_runs_the_papers_map(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench_main(["--quick", "--sections", "wpmap", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "sakamoto_heatmap_official" in text and "FAILED" not in text
    rec = json.loads(out.read_text())["wpmap"]
    assert rec["runs"] == 1521 and rec["programs"] == 16 and rec["run_s"] > 0
