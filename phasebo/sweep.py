"""Run a sweep: plan -> execute -> assemble -> report.

``python -m phasebo.sweep FILE [FILE ...] [--out DIR] [--set key=value ...] [--seeds N]``

The door to the pipeline, one module per step:

1. :mod:`phasebo.config` reads the sweep file (plus ``--set`` overrides) into a grid of cells
   (the static settings) times the swept axes times the seeds; :mod:`phasebo.grid` turns a cell
   and a run index into the run's settings, id, key and arrays.
2. :mod:`phasebo.plan` groups the cells by compiled program and sizes each group.
3. :mod:`phasebo.execute` runs each group's chunks through its compiled function and writes every
   finished chunk as Parquet parts (:mod:`phasebo.store` owns the directory); rerunning the
   command resumes, and a sweep that grew (more seeds, more axis values) runs only its new runs.
4. :func:`phasebo.results.assemble` joins the parts of the specification's runs into
   ``results.parquet``, ``results.csv``, ``dynamics.parquet`` and ``samples.parquet``, in the
   specification's order; then :mod:`phasebo.report` draws the figures and
   :mod:`phasebo.report_html` writes ``report.html``.

A run's key derives from its identity (:func:`phasebo.config.run_ids`), so its numbers do not
depend on the chunk size, the block size, the number of devices or processes, or its position in
the grid.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .config import SweepSpec
from .execute import (  # noqa: F401 (the door: run_one)
    Executor,
    need_x64,
    prepare_one,
    run_one,
)
from .grid import spec_run_ids
from .interrupt import Abandoned, AbandonedCompile
from .notes import sweep_notes
from .plan import check_disk, plan
from .registry import ENGINES
from .settings import ConfigError
from .store import (
    check_out_dir,
    check_peers,
    clear_boundaries,
    clear_figures,
    hold_dir,
    prepare_out_dir,
    provenance,
    read_manifest,
    record_figures,
    record_tables,
    said_cleared,
    tables_spec,
    wait_for_runs,
    write_manifest,
)
from .summary import finished_lines


def _removed(names: list[str]) -> str:
    """``3 figure(s) (a.png, b.png, c.png, ...) and report.html``: what clear_figures removed."""
    figs = [n for n in names if n != "report.html"]
    shown = f"{len(figs)} figure(s) ({', '.join(figs[:3])}{', ...' if len(figs) > 3 else ''})"
    return " and ".join(([shown] if figs else []) + (["report.html"] if "report.html" in names
                                                     else []))


def run_sweep(spec: SweepSpec, out_dir: str | Path | None = None, *, chunk_size=None,
              block_size=None, memory_budget=None, n_devices=None, overwrite: bool = False,
              quiet: bool = False, plots: bool = True, max_chunks: int | None = None,
              process_index: int | None = None, process_count: int | None = None,
              wait_timeout: float = 24 * 3600.0, formats=("png",), dpi: int = 150,
              executor: Executor | None = None):
    """Run every run of ``spec`` not already in ``out_dir`` and assemble the results.

    With several processes (``jax.distributed`` initialised, or ``process_index`` /
    ``process_count`` given) each process runs a fixed contiguous share of every group and writes
    its own parts; process 0 assembles once every run is there. ``executor``: one to reuse (its
    ``traces`` / ``compiles`` count what the sweep traced and compiled).

    Returns the results DataFrame (``None`` on processes other than 0, or when ``max_chunks``
    stopped the sweep early).
    """
    import jax

    t_start = time.time()
    if not isinstance(spec, SweepSpec):
        raise ConfigError(f"run_sweep: spec is a {type(spec).__name__}, not a sweep; fix: "
                          "pb.spec_from_dict(settings, axes) or pb.load_sweep(file)")
    out_dir = Path(out_dir) if out_dir is not None else Path("results") / spec.name
    pi = jax.process_index() if process_index is None else process_index
    pc = jax.process_count() if process_count is None else process_count
    need_x64(spec.values("dtype"))
    check_out_dir(out_dir)
    pl = plan(spec, n_devices=n_devices, memory_budget=memory_budget, chunk_size=chunk_size,
              block_size=block_size)
    check_disk(pl, out_dir)
    if not quiet:
        for note in sweep_notes(spec):
            print(f"{spec.name}: {note}", file=sys.stderr)
    check = None
    if plots:
        from .plot_spec import check_figure_args, check_plot_spec

        check_figure_args(formats, dpi)
        check_plot_spec(spec)  # keys and axes now; the values once the programs are traced

        def check(columns):
            check_plot_spec(spec, columns=columns)
    prov = provenance()
    prov["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start))
    # a second command into it is refused, not run twice; the lock names the sweep for the others
    with hold_dir(out_dir, pi, spec=spec.to_dict() if pc > 1 else None):
        old_manifest = read_manifest(out_dir)
        before = tables_spec(old_manifest)  # what its tables held until now
        before_history = old_manifest.get("history", []) if old_manifest else []
        out_dir = prepare_out_dir(out_dir, spec, overwrite, pi, provenance=prov)
        if pc > 1 and pi == 0:  # a process of another sweep already there: before any run
            check_peers(out_dir, spec.to_dict())
        executor = executor or Executor()
        try:
            stats = executor.execute(pl, out_dir, quiet=quiet, max_chunks=max_chunks, share=(pi, pc),
                                     check_columns=check)
        except KeyboardInterrupt as e:
            if pi == 0:  # the history says this invocation stopped, and when
                _stopped(out_dir, spec, prov, t_start, getattr(e, "stats", None))
            lost = "" if not isinstance(e, Abandoned) else " (the compile in progress was given up)" \
                if isinstance(e, AbandonedCompile) else " (the blocks in flight were given up)"
            st = getattr(e, "stats", None)
            kept = "" if st is None else f" ({st.n_new} new run(s) this time)"
            print(f"interrupted: finished chunks are saved under {out_dir / 'parts'}{kept}{lost}; "
                  "run the same command again to resume", file=sys.stderr)
            raise
        if stats.stopped:
            return None
        if prov.get("subset") and not quiet:
            own = next((h.get("command") for h in reversed(before_history)  # the last to add runs
                        if h.get("new_runs") and h.get("command")), None)
            print(f"{spec.name}: every run of this sweep is already in {out_dir} (a subset of its "
                  "runs): its tables and figures are of this sweep's runs; the directory's own "
                  "command assembles all of them again" + (f" ({own})" if own else ""),
                  file=sys.stderr)
        if pc > 1:
            if pi != 0:
                if not quiet:
                    print(f"process {pi}/{pc}: share done; process 0 assembles the results",
                          file=sys.stderr)
                return None
            wait_for_runs(out_dir / "parts", spec.n_runs, wait_timeout, quiet, spec.to_dict())
        from .results import assemble

        t = time.perf_counter()
        try:
            df = assemble(out_dir, spec_run_ids(spec), engines=sorted(ENGINES))
            changed = record_tables(out_dir, df["run_id"])  # None: an older directory
            if changed or changed is None and (stats.n_new or before != spec.to_dict()):
                gone = clear_boundaries(out_dir)  # made from the tables these replace
                if gone and not quiet:
                    print(said_cleared(spec.name, gone), file=sys.stderr)
                old = [] if plots else clear_figures(out_dir)  # not redrawn: not left as current
                if old and not quiet:
                    print(f"{spec.name}: removed {_removed(old)}"
                          + " of the runs before: the tables changed and no figures are drawn "
                          f"(--no-plots, plots=False); fix: phasebo plot {out_dir}, phasebo "
                          f"report {out_dir}",
                          file=sys.stderr)
            if plots:
                from .report import sweep_figures

                stale = record_figures(out_dir, sweep_figures(df, spec, out_dir, formats=formats,
                                                              dpi=dpi, quiet=quiet))
                if stale and not quiet:
                    print(f"{spec.name}: removed {len(stale)} figure(s) of the previous drawing that "
                          f"this one does not draw ({', '.join(stale[:3])}"
                          f"{', ...' if len(stale) > 3 else ''})", file=sys.stderr)
        except KeyboardInterrupt:
            _stopped(out_dir, spec, prov, t_start, stats)
            # the figures and report of the runs before, beside tables that may be new, would
            # read as current: they go, and the same command draws them again
            gone = clear_figures(out_dir)
            print(f"interrupted while writing the tables and figures: every run is saved under "
                  f"{out_dir / 'parts'}" + (f"; removed the {_removed(gone)} of the runs before"
                                            if gone else "")
                  + "; run the same command again to write them", file=sys.stderr)
            raise
        t_write = time.perf_counter() - t
        wall = time.time() - t_start
        prov.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_s=round(wall, 3),
                    compile_s=round(stats.compile_s, 3), setup_s=round(stats.setup_s, 3),
                    compile_beside_s=round(stats.compile_beside_s, 3), run_s=round(stats.run_s, 3),
                    tables_figures_s=round(t_write, 3), new_runs=stats.n_new)
        write_manifest(out_dir, spec, prov)
        report_txt = ""
        if plots:  # last: the report shows the manifest's provenance and timings
            from .report_html import write_report

            try:  # the runs and tables are saved: a report that fails must not lose them
                path, t_report = write_report(out_dir, notes=False)
                report_txt = (f", report {t_report:.1f} s ({path.stat().st_size / 2**20:.1f} MiB, "
                              f"{path.name})")
            except KeyboardInterrupt:
                _stopped(out_dir, spec, prov, t_start, stats)
                (out_dir / "report.html").unlink(missing_ok=True)  # the runs before's, if any
                print(f"interrupted while writing report.html: the runs, tables and figures are "
                      f"saved; fix: phasebo report {out_dir}", file=sys.stderr)
                raise
            except Exception as e:  # noqa: BLE001 (said, never silent)
                print(f"{spec.name}: report.html not written ({type(e).__name__}: {e}); the "
                      f"results are saved; fix: phasebo report {out_dir}", file=sys.stderr)
            wall = time.time() - t_start
        if not quiet:
            for line in finished_lines(spec.name, df, stats, pl, out_dir, t_write, wall, report_txt):
                print(line, file=sys.stderr)
        return df


def _stopped(out_dir: Path, spec, prov: dict, t_start: float, done) -> None:
    """Record in the manifest's history that this invocation was interrupted, with what it had
    done (``done``: the executor's stats; None when stopped while its programs were traced)."""
    prov.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), interrupted=True,
                wall_s=round(time.time() - t_start, 3), new_runs=done.n_new if done else 0,
                compile_s=round(done.compile_s if done else 0.0, 3),
                setup_s=round(done.setup_s if done else 0.0, 3),
                compile_beside_s=round(done.compile_beside_s if done else 0.0, 3),
                run_s=round(done.run_s if done else 0.0, 3))
    write_manifest(out_dir, spec, prov)


if __name__ == "__main__":  # python -m phasebo.sweep: the command line's module runs it
    from .cli import guarded
    from .cli.sweep import main

    sys.exit(guarded(main))
