"""The whole-sweep benchmark sections (``python -m phasebo.bench --sections heatmap,wpmap,gpu``):
the papers' maps run as a user runs them, ``python -m phasebo.sweep`` in a subprocess with an empty
compilation cache, timed whole process; and, on an accelerator, the same sweeps in-process."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .bench import _print_table, _sweep_proc

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"


def section_heatmap(seeds: int, out: dict) -> None:
    """``python -m phasebo.sweep sweeps/sakamoto_heatmap.toml`` (39 x 39 cells x ``seeds``) in a
    subprocess with an empty compilation cache, the whole job as a user runs it: with its noise
    shared along ||mu|| (the file's setting: noise groups stepped by matrix products) and with
    independent noise (``--set common_noise=none``, run by run), side by side."""
    sweep_file = SWEEPS / "sakamoto_heatmap.toml"
    n_runs = 39 * 39 * seeds
    rows, walls, outputs = [], {}, None
    for mode in ("signal_norm", "none"):
        with tempfile.TemporaryDirectory() as tmp:
            res = Path(tmp) / "out"
            wall, rc, err = _sweep_proc([str(sweep_file), "--seeds", str(seeds), "--set",
                                         f"common_noise={mode}", "--out", str(res),
                                         "--no-plots", "--quiet"], Path(tmp) / "cache")
            engines = ""
            if rc == 0:
                import pandas as pd

                df = pd.read_parquet(res / "results.parquet", columns=["engine"])
                engines = ",".join(sorted(map(str, df["engine"].unique())))
            if rc == 0 and mode == "signal_norm":
                # the same command again with figures: every run is there, so it measures the
                # tables, figures and report around the engine
                w2, rc2, _ = _sweep_proc([str(sweep_file), "--seeds", str(seeds), "--out",
                                          str(res), "--quiet"], Path(tmp) / "cache")
                man = json.loads((res / "manifest.json").read_text())
                rep = res / "report.html"
                outputs = [[f"{man.get('tables_figures_s', float('nan')):.1f}",
                            f"{rep.stat().st_size / 2**20:.1f}" if rep.exists() else "-",
                            f"{w2:.1f}", "ok" if rc2 == 0 else f"FAILED rc={rc2}"]]
        walls[mode] = wall
        status = "ok" if rc == 0 else f"FAILED rc={rc}: {err[-500:]}"
        rows.append([mode, seeds, n_runs, engines, f"{wall:.1f}", f"{n_runs / wall:.0f}", status])
    ratio = walls["none"] / walls["signal_norm"]
    out["heatmap"] = {"seeds": seeds, "runs": n_runs, "wall_s": walls["signal_norm"],
                      "wall_independent_s": walls["none"], "shared_speedup": ratio}
    _print_table(
        "heatmap: python -m phasebo.sweep sweeps/sakamoto_heatmap.toml (empty compilation cache)",
        ["common_noise", "seeds", "runs", "engine", "wall s", "runs/s", "status"], rows,
        f"shared noise {ratio:.2f}x independent (whole process); targets at 100 seeds: shared "
        "<= 100 s, independent <= 150 s")
    if outputs:
        _print_table("heatmap: the same command again (every run done): tables, figures, report",
                     ["tables and figures s", "report MiB", "whole process s", "status"],
                     outputs, "target: tables, maps and figures <= 10 s")


# The accelerator's jobs, most important first: (label, sweep file, seeds, extra arguments).
# Each runs as a user runs it, in its own process with an empty compilation cache; the last
# ones rerun a map with the matrix units' TF32 rounding (JAX's GPU default; phasebo's default is
# full float32) and with the planner's smaller blocks of before.
GPU_JOBS = (
    ("p-only map, shared noise", "sakamoto_heatmap.toml", 100, []),
    ("W + p map", "sakamoto_heatmap_official.toml", 10, ["--no-plots"]),
    ("S2 dynamics, every 10", "sakamoto_fig3.toml", 10_000, ["--no-plots"]),
    ("p-only map, independent", "sakamoto_heatmap.toml", 100,
     ["--set", "common_noise=none", "--no-plots"]),
    ("p-only map, shared, TF32 dots", "sakamoto_heatmap.toml", 100,
     ["--no-plots", "--set", "matmul_precision=tensorfloat32"]),
    ("p-only map, shared, block 26 groups", "sakamoto_heatmap.toml", 100,
     ["--no-plots", "--block-size", "26"]),
    ("p-only map, independent, block 1024", "sakamoto_heatmap.toml", 100,
     ["--set", "common_noise=none", "--no-plots", "--block-size", "1024"]),
    ("S2 dynamics, block 1024", "sakamoto_fig3.toml", 10_000,
     ["--no-plots", "--block-size", "1024"]),
)
KEEP_COLUMNS = ("run_id", "seed", "d", "signal_norm", "status", "regime", "train_acc", "test_acc",
                "train_loss", "train_acc_flipped")


def section_gpu(q: bool, out: dict, keep: str | None = None, timeout: float = 300.0,
                jobs: list[int] | None = None) -> None:
    """For an accelerator: the p-only heatmap (100 seeds, noise shared along ||mu||, figures and
    report included), the trained-W heatmap (10 seeds) and S2 with dynamics (10,000 seeds), then
    the independent-noise map, the shared map with TF32 matrix products (JAX's default on a GPU;
    phasebo computes them in full float32), and smaller blocks than the planner's. Each is
    ``python -m phasebo.sweep`` in its own process with an empty compilation cache; printed as
    each finishes: whole-process wall, runs/s, the manifest's split, the final regime counts.
    ``keep``: a directory for each job's results table (a few columns), to compare with a CPU
    run of the same sweep (the same run ids draw the same data on every backend); ``jobs``: the
    numbers (from 1) of the :data:`GPU_JOBS` to run (default: all)."""
    import jax
    import pandas as pd

    dev = jax.local_devices()[0]
    if dev.platform == "cpu" and not q:
        print("\n## gpu: no accelerator here (the CPU figures are the other sections); run "
              "`python -m phasebo.bench --sections gpu` on a GPU or TPU machine")
        out["gpu"] = "no accelerator"
        return
    chosen = [GPU_JOBS[i - 1] for i in jobs] if jobs else list(GPU_JOBS)
    if q:  # one seed per map cell, 4 per S2 setting; without --gpu-jobs the first five jobs
        chosen = [(lab, f, 1 if "heatmap" in f else 4, a)
                  for lab, f, _, a in (chosen if jobs else chosen[:5])]
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
    print(f"\n## gpu: sweeps on {dev.device_kind}, each a new process with an empty compilation "
          "cache (wall = whole process)", flush=True)
    header = ["job", "runs", "wall s", "runs/s", "compile s", "runs s", "tables s", "regimes b/f/h/n",
              "not ok", "status"]
    rows = []
    base = dict(os.environ)
    if base.pop("PHASEBO_BENCH_PREALLOCATE_SET", None):  # set by the bench for itself only
        base.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    for label, name, seeds, extra in chosen:
        spec_runs = _n_runs(name, seeds)
        with tempfile.TemporaryDirectory() as tmp:
            res = Path(tmp) / "out"
            wall, rc, err = _sweep_proc([str(SWEEPS / name), "--seeds", str(seeds), "--out",
                                         str(res), "--quiet", *extra], Path(tmp) / "cache",
                                        env=base, timeout=timeout)
            man = json.loads((res / "manifest.json").read_text()) \
                if (res / "manifest.json").exists() else {}
            counts, bad = "-", "-"
            if rc == 0:
                df = pd.read_parquet(res / "results.parquet")
                reg = df["regime"].value_counts()
                counts = "/".join(str(int(reg.get(r, 0))) for r in
                                  ("benign", "fitting", "harmful", "not_overfitting"))
                bad = int((df["status"] != "ok").sum())
                if keep and "--block-size" not in extra:  # same runs as the default
                    slug = "".join(c if c.isalnum() else "_" for c in label).strip("_")
                    df[[c for c in KEEP_COLUMNS if c in df]].to_parquet(
                        Path(keep) / f"{slug}.parquet")
        row = {"job": label, "sweep": name, "seeds": seeds, "runs": spec_runs, "wall_s": wall,
               "rc": rc, "compile_s": man.get("compile_s"), "run_s": man.get("run_s"),
               "tables_figures_s": man.get("tables_figures_s"), "regimes": counts,
               "not_ok": bad, "device": dev.device_kind}
        out.setdefault("gpu", []).append(row)
        rows.append([label, spec_runs, f"{wall:.1f}", f"{spec_runs / wall:.0f}",
                     *(_s(row[k]) for k in ("compile_s", "run_s", "tables_figures_s")), counts, bad,
                     "ok" if rc == 0 else f"FAILED rc={rc}"])
        print(f"  {label}: {rows[-1][2:]}" + ("" if rc == 0 else f"\n{err[-1500:]}"),
              flush=True)
    _print_table(f"gpu: sweeps on {dev.device_kind} (whole process, empty compilation cache)",
                 header, rows, "regimes at the last step: benign / fitting / harmful / not "
                 "overfitting; not ok = diverged or failed runs")


def _s(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _n_runs(name: str, seeds: int) -> int:
    from .config import load_sweep

    return load_sweep(SWEEPS / name, seeds=seeds).n_runs


def section_wpmap(seeds: int, out: dict) -> None:
    """The paper's own map (``sweeps/sakamoto_heatmap_official.toml``: W and p trained, 39 x 39
    cells x ``seeds``, noise shared along ||mu||) in a subprocess with an empty compilation
    cache, figures and report included: its whole-process time, the compiled programs (nearby d
    share one, zero-padded: :meth:`phasebo.engines.base.Gram.program`), and the manifest's split
    into compiling (waited for, and beside the runs), running, and tables and figures."""
    from . import plan as P
    from .config import load_sweep

    sweep_file = SWEEPS / "sakamoto_heatmap_official.toml"
    spec = load_sweep(sweep_file, seeds=seeds)
    programs, steps = len(P.plan(spec).groups), spec.fixed.get("steps", "?")
    n_runs = 39 * 39 * seeds
    with tempfile.TemporaryDirectory() as tmp:
        res = Path(tmp) / "out"
        wall, rc, err = _sweep_proc([str(sweep_file), "--seeds", str(seeds), "--out", str(res),
                                     "--quiet"], Path(tmp) / "cache")
        man = json.loads((res / "manifest.json").read_text()) if rc == 0 else {}
        counts = ""
        if rc == 0:
            import pandas as pd

            reg = pd.read_parquet(res / "results.parquet", columns=["regime"])["regime"]
            counts = " / ".join(f"{k} {v}" for k, v in reg.value_counts().items() if v)
    status = "ok" if rc == 0 else f"FAILED rc={rc}: {err[-500:]}"

    def get(k):
        return f"{man[k]:.1f}" if isinstance(man.get(k), (int, float)) else "-"

    out["wpmap"] = {"seeds": seeds, "runs": n_runs, "programs": programs, "wall_s": wall,
                    **{k: man.get(k) for k in ("compile_s", "compile_beside_s", "run_s",
                                               "tables_figures_s")}}
    _print_table(
        "wpmap: python -m phasebo.sweep sweeps/sakamoto_heatmap_official.toml (W and p trained, "
        "empty compilation cache, figures and report included)",
        ["seeds", "runs", "programs", "wall s", "runs/s", "compile waited s", "compile beside s",
         "runs s", "tables and figures s", "status"],
        [[seeds, n_runs, programs, f"{wall:.1f}", f"{n_runs / wall:.0f}", get("compile_s"),
          get("compile_beside_s"), get("run_s"), get("tables_figures_s"), status]],
        f"regimes at step {steps}: {counts}; target at 10 seeds: <= 300 s whole process")
