"""``python -m phasebo.sweep`` / ``phasebo sweep``: run sweep files from the command line.

Every refusal is a one-line error (exit 2) before anything runs; Ctrl-C exits 130 with the
finished chunks saved, and SIGTERM (a scheduler's time limit) stops it the same way and exits 143.
Process-wide JAX settings (CPU devices, 64-bit floats, the on-disk compilation cache) are this
module's: the library never changes them.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import re
import sys
import threading
from pathlib import Path

from .. import config as C
from ..config import SweepSpec
from ..execute import traced_columns
from ..interrupt import Abandoned, SigintLatch
from ..notes import sweep_notes
from ..plan import Plan, describe, plan
from ..registry import all_settings
from ..settings import ConfigError, enable_compilation_cache, suggest
from ..store import check_out_dir, count_done, holder, holds_runs, is_subset, read_manifest
from ..sweep import run_sweep
from .args import Parser, at_least, figure_formats, parse_set

DESCRIPTION = "Run a sweep: plan -> execute -> assemble -> report."


def _parse_bytes(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    try:
        n = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(float(t))
    except ValueError:
        raise ConfigError(f"--memory-budget {text!r}: expected bytes such as 8G or 512M") from None
    if n <= 0:
        raise ConfigError(f"--memory-budget {text!r}: must be more than 0 bytes, e.g. 8G")
    return n


EXAMPLES = """examples:
  python -m phasebo.sweep sweeps/default.toml                  # the default phase map
  python -m phasebo.sweep sweeps/default.toml --seeds 20       # grow it to 20 seeds per cell
  python -m phasebo.sweep sweeps/default.toml --set d=1000 --set 'signal_norm=[10, 40]'
  python -m phasebo.sweep sweeps/sakamoto_heatmap.toml --dry-run   # plan, time and memory only
  python -m phasebo.sweep sweeps/magen_*.toml                  # several sweep files in turn
"""


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("files", nargs="+", metavar="FILE", help="sweep file(s) (TOML)")
    p.add_argument("--out", help="output directory (default: results/<sweep name>/, or "
                                 "results/<name>/<overrides>/ with --set)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting; a list [a, b] or a range {start=..,stop=..,step=..} "
                        "makes an axis")
    p.add_argument("--unset", action="append", default=[], metavar="KEY",
                   help="drop a setting the file (or a file it includes) gives, so its default "
                        "applies: e.g. --unset steps --set dynamics=flow --set flow_time=50")
    p.add_argument("--seeds", type=int, help="seeds per grid cell (more seeds grow a finished "
                                             "sweep in place)")
    p.add_argument("--chunk-size", type=int, help="runs per host chunk (default: sized by "
                   "measurement, ~3 s of work)")
    p.add_argument("--block-size", type=int, help="runs vmapped together per device")
    p.add_argument("--memory-budget", help="bytes the sweep may plan for, e.g. 8G "
                                           "(default: half the free memory)")
    p.add_argument("--devices", type=int, help="use at most this many local devices")
    p.add_argument("--cpu-devices", type=int,
                   help="split the CPU into this many devices (default: one per core)")
    p.add_argument("--overwrite", action="store_true",
                   help="discard the runs of another sweep in --out")
    p.add_argument("--no-plots", action="store_true", help="skip the figures")
    p.add_argument("--format", default="png", help="figure formats, e.g. png,pdf,svg")
    p.add_argument("--dpi", type=int, default=150, help="resolution of raster figures")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar, notes or summary line (errors still print)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the planner decides")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and print the plan (groups, engines, memory, time, disk) only")
    p.add_argument("--refine", metavar="A,B",
                   help="refine the grid around the boundary between regimes A and B (or a "
                        "[refine] block in the file; README: Adaptive refinement)")
    p.add_argument("--along", metavar="AXIS",
                   help="the axis a refined boundary lies along (the [refine] block's x; default: "
                        "the map's x axis)")
    p.add_argument("--rounds", type=int, help="refinement rounds after the first grid")
    p.add_argument("--target", type=float,
                   help="refine until each boundary CI is at most this fraction of it")
    g = p.add_argument_group("many hosts (jax.distributed)")
    g.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize; without the flags below JAX reads the "
                        "cluster from the environment (SLURM, TPU pods, ...)")
    g.add_argument("--coordinator", help="coordinator address host:port (process 0's host)")
    g.add_argument("--num-processes", type=int, help="number of processes")
    g.add_argument("--process-id", type=int, help="this process's id, 0..num-processes-1")
    return p


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m phasebo.sweep", description=DESCRIPTION,
               epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_arguments(p)


def _fmt_value(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (tuple, list)):
        return "-".join(map(_fmt_value, v))
    return str(v)


def load_unset(path, unset, overrides: dict, seeds) -> SweepSpec:
    """:func:`phasebo.config.load_sweep` with the settings ``unset`` names dropped from the file
    (and the files it includes) first: ``[settings]``, ``[axes]``, ``[regime]`` and every case."""
    if not unset:
        return C.load_sweep(path, overrides, seeds, overrides_as="--set")
    raw = C.read_sweep_file(path)
    try:  # the file as written: a [plot] where names one of its values
        written = C.build_spec(copy.deepcopy(raw), Path(path).stem, None, seeds,
                               where=f"{Path(path).name}: ").filed
    except ConfigError:  # refused as written: checked against the file less the unset keys
        written = None
    for key in unset:
        if key not in all_settings():
            raise ConfigError(f"--unset {key}: no such setting{suggest(key, all_settings())}; "
                              "fix: phasebo settings lists them")
        held = [raw.get(sec, {}) for sec in ("settings", "axes", "regime")] + list(
            raw.get("cases", []))
        if not any(key in h for h in held):
            raise ConfigError(f"--unset {key}: {path} does not set it (nor a file it includes); "
                              "fix: drop --unset, or --set it")
        if key in overrides:
            raise ConfigError(f"--unset {key} and --set {key} both given; fix: --set alone "
                              "replaces the file's value")
        for h in held:
            h.pop(key, None)
    return C.build_spec(raw, Path(path).stem, overrides, seeds, where=f"{Path(path).name}: ",
                        overrides_as="--set", as_written=written)


def override_slug(overrides: dict, spec: SweepSpec, unset=()) -> str:
    """A directory name for a set of ``--set`` overrides, canonical: the keys sorted, each value
    as the sweep expanded it (a range written out, ``10`` and ``10.0`` alike), so that the same
    overrides in another order or spelling name the same directory: ``d=1000,signal_norm=10+40``.
    An axis' values are sorted (its order changes no run). A name over 120 characters ends in a
    hash of the whole."""
    import hashlib

    parts = []
    for k in sorted(overrides):
        vals = spec.axes.get(k)
        if vals is not None:  # an axis' order does not change its runs: [40, 10] is [10, 40]
            try:
                vals = sorted(vals)
            except TypeError:  # values that do not compare (tuples of mixed types)
                pass
        text = "+".join(map(_fmt_value, vals)) if vals is not None else \
            _fmt_value(spec.fixed.get(k, overrides[k]))
        parts.append(f"{k}={text}")
    parts += [f"{k}=unset" for k in sorted(set(unset))]  # the file's value dropped
    slug = re.sub(r"[^A-Za-z0-9_.+=,-]", "_", ",".join(parts))
    if len(slug) > 120:
        slug = slug[:103] + "-" + hashlib.sha1(slug.encode()).hexdigest()[:16]
    return slug


def start_jax(args) -> None:
    """Process-wide JAX settings, before any backend starts: one CPU device per core (XLA runs a
    vmapped program on one core), XLA's CPU fusion (:func:`phasebo.cli.xla.tune_xla_cpu`), 64-bit
    floats, the on-disk compilation cache."""
    from .xla import tune_xla_cpu

    if getattr(args, "distributed", False):
        check_distributed(args)  # before JAX or XLA's flags are touched
    tune_xla_cpu()
    import jax

    ncpu = args.cpu_devices or os.cpu_count() or 1
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:
            jax.config.update("jax_num_cpu_devices", ncpu)
        except RuntimeError:  # JAX already started (main() called in-process): keep it
            pass
    if getattr(args, "distributed", False):
        if getattr(args, "dry_run", False):  # a dry run computes nothing: it joins no cluster
            print("phasebo: the dry run does not join the other processes: its plan is this "
                  "process's devices alone", file=sys.stderr)
        else:
            import signal

            ours = signal.getsignal(signal.SIGTERM)
            try:
                jax.distributed.initialize(coordinator_address=args.coordinator,
                                           num_processes=args.num_processes,
                                           process_id=args.process_id)
                if threading.current_thread() is threading.main_thread():
                    # JAX's preemption notifier took SIGTERM: a time limit must stop the sweep
                    # as Ctrl-C does (the blocks in flight saved), so take it back
                    signal.signal(signal.SIGTERM, ours if isinstance(ours, SigtermAsSigint)
                                  else SigtermAsSigint())
            except (RuntimeError, ValueError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(f"--distributed: JAX could not join the processes ({first}); "
                                  "fix: check --coordinator, --num-processes and --process-id, "
                                  "or the cluster's environment") from None
    elif any(getattr(args, k, None) is not None for k in ("coordinator", "num_processes",
                                                          "process_id")):
        raise ConfigError("--coordinator / --num-processes / --process-id need --distributed")
    enable_compilation_cache()


def check_distributed(args) -> None:
    """The ``--distributed`` flags, checked before JAX is asked to join anything."""
    at_least("num-processes", args.num_processes)
    pid, n = args.process_id, args.num_processes
    if pid is not None and (pid < 0 or (n is not None and pid >= n)):
        raise ConfigError(f"--process-id = {pid} must be in 0..{n - 1 if n else 'N-1'} (one per "
                          "process); fix: 0 on the coordinator's host, then 1, 2, ...")
    c = args.coordinator
    if c is not None:
        host, _, port = c.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--coordinator = {c!r} is not host:port; fix: e.g. --coordinator "
                              "host0:1234 (process 0's host and a free port)")


def dry_run(spec: SweepSpec, pl: Plan, out: Path, overwrite: bool = False) -> None:
    """Print the plan (:func:`phasebo.plan.describe`) and what the directory already holds: the
    runs done and to run, or why the real run would refuse it."""
    print(describe(pl, out))
    for note in sweep_notes(spec):  # the notes the run will print
        print(f"  {note}")
    busy = holder(out)
    if busy:  # the real run would be refused now
        print(f"  {out} is being written now by another phasebo command ({busy}): running "
              "this now would be refused until it finishes")
    old = read_manifest(out)
    if not (out / "parts").is_dir():
        print(f"  {spec.n_runs} runs to run ({out} holds none)")
        return
    if overwrite:
        from ..results import done_run_ids

        print(f"  --overwrite: the {len(done_run_ids(out / 'parts'))} runs there are discarded; "
              f"{spec.n_runs} runs to run")
        return
    if is_subset(out, spec, old):
        print(f"  all {spec.n_runs} runs done: a subset of the {old.get('n_runs')} runs there "
              "(its tables and figures will be of these runs)")
        return
    done = count_done(out, spec)
    print(f"  {done} of {spec.n_runs} runs done, {spec.n_runs - done} to run")


def refine_dry_run(r, out: Path, overwrite: bool = False) -> None:
    """What a refinement adds to round 0's plan: its rounds, and the runs the rounds already
    done hold (their points come from the boundaries of the rounds before them)."""
    from ..results import done_run_ids

    done = [(d.name, len(done_run_ids(d / "parts"))) for d in sorted(
        out.glob("round-*"), key=lambda d: int(d.name.split("-")[1]) if d.name.split("-")[1]
        .isdigit() else 0) if d.name != "round-0" and (d / "parts").is_dir()]
    held = "" if overwrite or not done else \
        "; already done: " + ", ".join(f"{n} {k} runs" for n, k in done)
    busy = holder(out)
    if busy:  # the refinement itself holds the directory above its rounds
        print(f"  {out} is being refined now by another phasebo command ({busy}): running "
              "this now would be refused until it finishes")
    print(f"  then up to {r.rounds} refinement round(s) of the {r.between[0]}-{r.between[1]} "
          f"boundary along {r.x} (per {r.y}), until its intervals are narrower than {r.target:g} "
          f"of it: their points are known only once the round before has run{held}; the "
          f"combined runs and boundaries go to {out}")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The sweep command (see the module docstring); its exit code."""
    import signal

    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.getsignal(signal.SIGINT)
    old_term = signal.getsignal(signal.SIGTERM)
    SigintLatch.install()  # a Ctrl-C while the programs are traced is never lost
    if main_thread:  # a cluster's time limit: stop as a Ctrl-C does, saving the blocks in flight
        signal.signal(signal.SIGTERM, SigtermAsSigint())
    try:
        return _main(argv, prog)
    finally:
        if main_thread and old is not None:
            signal.signal(signal.SIGINT, old)
        if main_thread and old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


class SigtermAsSigint:
    """SIGTERM (what SLURM and most schedulers send at a time limit, before SIGKILL) handled as
    the Ctrl-C it stands for: whatever handles SIGINT now stops the sweep, so the blocks in flight
    are saved and the manifest's history says the invocation was interrupted. ``hit`` remembers
    it came, so that the command exits 143 (128 + SIGTERM), as a terminated process does, where a
    Ctrl-C exits 130."""

    stops_as_ctrl_c = True  # read by the SIGINT handler's messages (interrupt.interruptible)

    def __init__(self):
        self.hit = False

    def __call__(self, signum, frame) -> None:
        import signal

        self.hit = True
        print("\nterminated (SIGTERM): stopping as for Ctrl-C", file=sys.stderr, flush=True)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt


def interrupted_code() -> int:
    """The exit code of a stopped sweep: 143 when SIGTERM stopped it, 130 for Ctrl-C."""
    import signal

    h = signal.getsignal(signal.SIGTERM)
    return 143 if isinstance(h, SigtermAsSigint) and h.hit else 130


def _main(argv: list[str] | None, prog: str | None) -> int:
    p = build_parser()
    if prog:
        p.prog = prog
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="phasebo: %(message)s")
    current = None  # the sweep file being handled, for an error that does not name it
    try:
        if args.seeds is not None and args.seeds < 1:
            raise ConfigError(f"--seeds = {args.seeds} must be a positive integer; fix: e.g. "
                              "--seeds 10")
        for flag in ("chunk_size", "block_size", "dpi", "devices", "cpu_devices"):
            at_least(flag.replace("_", "-"), getattr(args, flag))
        formats = figure_formats(args.format)
        budget = _parse_bytes(args.memory_budget) if args.memory_budget else None
        if args.out and len(args.files) > 1:
            raise ConfigError("--out names one directory but several sweep files were given; fix: "
                              "one file per command with --out, or no --out (each goes to "
                              "results/<its name>/)")
        start_jax(args)
        specs = [(f, load_unset(f, args.unset, parse_set(args.set), args.seeds))
                 for f in args.files]
        if any("float64" in spec.values("dtype") for _, spec in specs):
            import jax

            jax.config.update("jax_enable_x64", True)  # the CLI owns process-wide flags
        for f, spec in specs:
            current = f
            out = Path(args.out) if args.out else Path("results") / spec.name
            if (args.set or args.unset) and not args.out:
                out = out / override_slug(parse_set(args.set), spec, args.unset)
            check_out_dir(out)
            block = dict(spec.refine)
            if args.refine:
                block["between"] = args.refine
            if args.along:
                if not block:
                    raise ConfigError("--along refines a boundary along an axis; fix: add "
                                      "--refine A,B (e.g. --refine benign,harmful)")
                block["x"] = args.along
                if block.get("y") == args.along:  # the file's slices were along it: the other
                    del block["y"]
            for k in ("rounds", "target"):
                if getattr(args, k) is not None:
                    block[k] = getattr(args, k)
            if (args.rounds is not None or args.target is not None) and not block.get(
                    "between") and not spec.refine:
                raise ConfigError("--rounds/--target refine a boundary; fix: add --refine A,B "
                                  "(e.g. --refine benign,harmful) or a [refine] block")
            if block:  # checked before anything runs, and by the dry run as by the run
                from ..refine import adopt_sweep, parse_refine, refine_sweep

                r = parse_refine(spec, block, where=f"{spec.name}: ")
                adopt = not args.overwrite and adopt_sweep(out, spec, dry=True)
            if args.dry_run:
                pl = plan(spec, n_devices=args.devices, memory_budget=budget,
                          chunk_size=args.chunk_size, block_size=args.block_size)
                if not args.no_plots:
                    from ..plot_spec import check_plot_spec

                    check_plot_spec(spec, columns=traced_columns(pl))
                    from ..report import plot_notes

                    plot_notes(spec)  # the notes the run will print about [plot] entries
                if block:  # round 0 is a sweep of its own directory; the rounds follow it
                    if adopt:
                        print(f"  the runs already in {out} become round 0 (moved to "
                              f"{out / 'round-0'})")
                    elif args.overwrite and holds_runs(out):
                        print(f"  --overwrite: the {count_done(out, spec)} runs of this sweep "
                              f"already in {out} (and any others there) are discarded")
                    dry_run(spec, pl, out if adopt else out / "round-0", overwrite=args.overwrite)
                    refine_dry_run(r, out, overwrite=args.overwrite)
                else:
                    dry_run(spec, pl, out, overwrite=args.overwrite)
                continue
            if block:
                refine_sweep(spec, r, out, run_sweep=run_sweep, chunk_size=args.chunk_size,
                             block_size=args.block_size, memory_budget=budget,
                             n_devices=args.devices, overwrite=args.overwrite,
                             quiet=args.quiet, plots=not args.no_plots, formats=formats,
                             dpi=args.dpi)
                continue
            if spec.n_runs >= 10**6 and not args.quiet:
                print(f"phasebo.sweep: warning: {spec.n_runs} runs; `--dry-run` estimates the "
                      "time; Ctrl-C stops it and the same command resumes", file=sys.stderr)
            run_sweep(spec, out, chunk_size=args.chunk_size, block_size=args.block_size,
                      memory_budget=budget, n_devices=args.devices, overwrite=args.overwrite,
                      quiet=args.quiet, plots=not args.no_plots, formats=formats, dpi=args.dpi)
    except ConfigError as e:
        said = str(e)
        if said.startswith("[plot]") and current is not None:  # checked once the programs are
            said = f"{Path(current).name}: {said}"  # traced: named by its file, as the rest
        print(f"{p.prog if prog else 'phasebo.sweep'}: error: {said}", file=sys.stderr)
        return 2
    except Abandoned:
        # blocks given up are still computing in a worker thread: leave without waiting for them
        # (every saved part is complete: parts are written whole, then renamed)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(interrupted_code())
    except KeyboardInterrupt as e:
        if getattr(e, "compile_in_flight", False):
            # the next group's program still compiling beside the stopped runs: everything is
            # saved, so leave now rather than wait for it
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(interrupted_code())
        return interrupted_code()
    return 0

