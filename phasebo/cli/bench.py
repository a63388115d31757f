"""``python -m phasebo.bench`` / ``phasebo bench``: the benchmark's command line (the sections
are in :mod:`phasebo.bench`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from ..bench import (
    DEFAULT_SECTIONS,
    SECTIONS,
    section_blocks,
    section_dynamics,
    section_engines,
    section_flow,
    section_loop,
    section_precision,
    section_readme,
    section_traces,
    section_wp,
)
from ..bench import __doc__ as BENCH_DOC
from ..bench_maps import GPU_JOBS, section_gpu, section_heatmap, section_wpmap
from ..bench_vit import section_vit
from ..settings import ConfigError
from .args import Parser, at_least, writable_file


def build_parser(prog: str = "python -m phasebo.bench") -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=BENCH_DOC.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    p.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                   help=f"comma list of {', '.join(SECTIONS)}, or all (default: "
                        f"{','.join(DEFAULT_SECTIONS)})")
    p.add_argument("--precision", action="store_true", help="add the float32/float64 section")
    p.add_argument("--heatmap", action="store_true",
                   help="add the timing of the full sweeps/sakamoto_heatmap.toml")
    p.add_argument("--heatmap-seeds", type=int, default=100, help="seeds per heatmap cell")
    p.add_argument("--repeat", type=int, default=2,
                   help="timed runs per figure: one warm-up, then the best of the rest")
    p.add_argument("--steps", type=int, help="GD steps per run (default: 1000, quick: 100)")
    p.add_argument("--json", help="also write the measurements to this JSON file")
    p.add_argument("--keep", help="gpu: keep each sweep's results table (a few columns) in this "
                                  "directory, to compare with a CPU run of the same sweep")
    p.add_argument("--gpu-jobs", help="gpu: comma list of the job numbers to run (from 1; "
                                      "default all)")
    p.add_argument("--job-timeout", type=float,
                   help="gpu: seconds before a sweep is stopped (default 300)")
    p.add_argument("--cpu-devices", type=int, help="split the CPU into this many devices "
                                                   "(default: one per core, as the sweep)")
    return p


def _gpu_options(args, sections: list[str]) -> tuple[list[int] | None, str | None]:
    """The gpu section's job numbers, and why its options are refused (None: they are fine):
    each must be a value it can use, and given only with that section."""
    given = [f for f, v in (("--gpu-jobs", args.gpu_jobs), ("--keep", args.keep),
                            ("--job-timeout", args.job_timeout)) if v is not None]
    if given and "gpu" not in sections:
        return None, f"{given[0]} applies to the gpu section only; fix: add --sections gpu"
    jobs = None
    if args.gpu_jobs is not None:
        try:
            jobs = [int(x) for x in args.gpu_jobs.split(",")]
        except ValueError:
            jobs = []
        if not jobs or not all(1 <= j <= len(GPU_JOBS) for j in jobs):
            return None, (f"--gpu-jobs = {args.gpu_jobs!r} must be job numbers from 1 to "
                          f"{len(GPU_JOBS)}; fix: e.g. --gpu-jobs 1,2,3")
    t = args.job_timeout
    if t is not None and not (math.isfinite(t) and t > 0):
        return None, f"--job-timeout = {t} must be a number of seconds > 0; fix: e.g. 300"
    if args.keep is not None and Path(args.keep).exists() and not Path(args.keep).is_dir():
        return None, f"--keep {args.keep} is a file, not a directory; fix: give a directory"
    return jobs, None


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = (build_parser(prog) if prog else build_parser()).parse_args(argv)
    cmd = prog or "phasebo.bench"  # as the errors name the command
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if args.precision and "precision" not in sections:
        sections.append("precision")
    try:  # every value before the first measurement (a run can take many minutes)
        for flag in ("steps", "repeat", "heatmap_seeds", "cpu_devices"):
            at_least(flag.replace("_", "-"), getattr(args, flag))
        if args.job_timeout is not None and not args.job_timeout > 0:
            raise ConfigError(f"--job-timeout = {args.job_timeout} must be > 0; fix: e.g. "
                              "--job-timeout 300")
        if args.json:
            writable_file(args.json, "--json")
    except ConfigError as e:
        print(f"{cmd}: error: {e}", file=sys.stderr)
        return 2
    if args.heatmap and "heatmap" not in sections:
        sections.append("heatmap")
    if sections == ["all"]:
        sections = list(SECTIONS)
    bad = [x for x in sections if x not in SECTIONS]
    if bad:
        from ..settings import suggest

        print(f"{cmd}: error: unknown section {bad[0]!r}{suggest(bad[0], [*SECTIONS, 'all'])}; "
              f"known: {', '.join(SECTIONS)}, all", file=sys.stderr)
        return 2
    gpu_jobs, why = _gpu_options(args, sections)
    if why:
        print(f"{cmd}: error: {why}", file=sys.stderr)
        return 2
    from .xla import tune_xla_cpu

    tune_xla_cpu()  # as the sweep command does
    if "gpu" in sections and "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ:
        # the gpu section runs its sweeps as child processes: this one must not take the
        # accelerator's memory (JAX takes 75 % of it at start); the children get the default back
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        os.environ["PHASEBO_BENCH_PREALLOCATE_SET"] = "1"
    import jax

    ncpu = args.cpu_devices or os.cpu_count() or 1
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:
            jax.config.update("jax_num_cpu_devices", ncpu)
        except RuntimeError:  # JAX already started (called in-process): keep its devices
            pass
    import phasebo  # noqa: F401  (registers models and engines)

    devs = jax.local_devices()
    print(f"phasebo.bench: {len(devs)} {devs[0].platform} device(s), {os.cpu_count()} cores, "
          f"jax {jax.__version__}, XLA_FLAGS {os.environ.get('XLA_FLAGS', '') or '-'}"
          f"{', quick' if args.quick else ''}")
    out: dict = {"devices": len(devs), "platform": devs[0].platform, "quick": args.quick}
    t0 = time.perf_counter()
    q, repeat = args.quick, args.repeat
    run = {
        "loop": lambda: section_loop(q, repeat, out, args.steps),
        "engines": lambda: section_engines(q, repeat, out, args.steps),
        "wp": lambda: section_wp(q, repeat, out, args.steps),
        "blocks": lambda: section_blocks(q, repeat, out, args.steps),
        "dynamics": lambda: section_dynamics(q, repeat, out, args.steps),
        "traces": lambda: section_traces(q, out),
        "readme": lambda: section_readme(q, out),
        "heatmap": lambda: section_heatmap(args.heatmap_seeds if not q else 1, out),
        "wpmap": lambda: section_wpmap(10 if not q else 1, out),
        "flow": lambda: section_flow(q, repeat, out),
        "vit": lambda: section_vit(q, repeat, out),
        "precision": lambda: section_precision(q, out, args.steps),
        "gpu": lambda: section_gpu(q, out, args.keep, args.job_timeout or 300.0, gpu_jobs),
    }
    # precision turns on float64 for the process: it runs after every float32 timing
    for name in [x for x in SECTIONS if x in sections]:
        if name == "precision":
            jax.config.update("jax_enable_x64", True)
        run[name]()
    out["total_s"] = time.perf_counter() - t0
    failed = [r["job"] for r in out.get("gpu", []) if isinstance(r, dict) and r.get("rc")]
    print(f"\nphasebo.bench: done in {out['total_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if failed:  # their rows say why; a script running the bench must not read success
        print(f"phasebo.bench: {len(failed)} gpu job(s) failed: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0
