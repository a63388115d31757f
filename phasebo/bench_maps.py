"""The whole-sweep benchmark sections (``python -m phasebo.bench --sections heatmap,wpmap,gpu``):
the papers' maps run as a user runs them, ``python -m phasebo.sweep`` in a subprocess with an empty
compilation cache, timed whole process; and, on an accelerator, the same sweeps in-process."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from .bench import _print_table, _sweep_proc, batched_rate

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


def section_gpu(q: bool, out: dict) -> None:
    """For an accelerator: block sizes by measurement, then the p-only heatmap at 100 seeds, the
    trained-W heatmap at 10 seeds and S2 with dynamics at 10,000 seeds, each as a sweep; prints
    runs/s, the block and chunk sizes the planner chose and the peak device memory."""
    import jax

    from . import plan as P
    from . import sweep as S
    from .config import load_sweep

    dev = jax.local_devices()[0]
    if dev.platform == "cpu" and not q:
        print("\n## gpu: no accelerator here (the CPU figures are the other sections); run "
              "`python -m phasebo.bench --sections gpu` on a GPU or TPU machine")
        out["gpu"] = "no accelerator"
        return
    blocks = [64, 256, 1024, 4096] if not q else [16, 64]
    rates = [batched_rate("reduced", 2000, max(blocks) * 4 if not q else 128, 1000 if not q
                          else 50, block=b) for b in blocks]
    best = blocks[int(np.argmax(rates))]
    print("\n## gpu: reduced-engine runs/s by block: "
          + ", ".join(f"{b}: {r:.0f}" for b, r in zip(blocks, rates)) + f" -> block {best}")
    rows = []
    jobs = (("sakamoto_heatmap.toml", 100 if not q else 1, {}),
            ("sakamoto_heatmap_official.toml", 10 if not q else 1, {}),
            ("sakamoto_fig3.toml", 10_000 if not q else 4, {}))
    for name, seeds, _ in jobs:
        spec = load_sweep(SWEEPS / name, seeds=seeds)
        pl = P.plan(spec, block_size=best if name == "sakamoto_heatmap.toml" else None)
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            S.run_sweep(spec, Path(tmp) / "o", quiet=True, plots=False,
                        block_size=best if name == "sakamoto_heatmap.toml" else None)
            wall = time.perf_counter() - t
        stats = dev.memory_stats() or {}
        peak = stats.get("peak_bytes_in_use", float("nan"))
        g = pl.groups[0]
        out.setdefault("gpu", []).append({"sweep": name, "runs": spec.n_runs, "wall_s": wall,
                                          "block": g.block, "chunk": g.width, "peak_bytes": peak})
        rows.append([name, spec.n_runs, f"{wall:.1f}", f"{spec.n_runs / wall:.0f}", g.block,
                     g.width, f"{peak / 2**30:.2f}"])
    _print_table(f"gpu: sweeps on {dev.device_kind}", ["sweep", "runs", "wall s", "runs/s",
                                                       "block", "chunk", "peak GiB"], rows)


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
