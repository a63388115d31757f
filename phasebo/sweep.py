"""Run a sweep: grid -> shape groups -> chunks -> ``jit(lax.map(vmap(run)))`` -> Parquet parts.

``python -m phasebo.sweep FILE [--out DIR] [--set key=value ...] [--seeds N]``

1. The sweep file (plus ``--set`` overrides) becomes a grid of runs (:mod:`phasebo.config`).
2. Runs are grouped by their static settings; each group is compiled once.
3. A group's runs go through the compiled function in host chunks. Inside a chunk the run axis
   is split across the local devices (``shard_map`` over a 1-D mesh) and each device works through
   its share in small vmapped blocks (``lax.map(batch_size=...)``): on CPU the direct engine is
   memory-bound, and blocks that keep a few runs' tokens in cache are faster per run than one
   huge vmap.
4. Each finished chunk is written at once as Parquet parts (atomic rename). Re-running the same
   command resumes: runs already in the parts are skipped. A different sweep in the same
   directory is refused unless ``--overwrite``.
5. The parts are assembled into ``results.parquet``, ``results.csv`` (and ``dynamics.parquet``,
   ``samples.parquet``), then heatmaps are drawn.

Run keys are ``fold_in(PRNGKey(root_seed), run_id)`` and data are drawn inside each run, so a
run's numbers do not depend on the chunk size, the block size or the number of devices.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import config as C
from .config import ConfigError, Static, SweepSpec

# Default fraction of free memory a sweep may plan to use.
MEMORY_FRACTION = 0.5


def _jax():
    import jax

    return jax


# --------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------


def group_runs(runs: list[dict]) -> list[tuple[Static, list[dict]]]:
    """Runs grouped by static settings, groups in order of first appearance."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(C.static_key(r), []).append(r)
    return [(Static(k), v) for k, v in groups.items()]


def free_memory_bytes() -> int:
    """Free memory of the first local device (accelerator) or of the host."""
    jax = _jax()
    dev = jax.local_devices()[0]
    if dev.platform != "cpu":
        try:
            st = dev.memory_stats()
            return int(st["bytes_limit"] - st.get("bytes_in_use", 0))
        except Exception:  # memory_stats is optional for a backend
            pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def _cost_per_run(static: Static) -> float:
    """Rough flop count of one run (only used to size chunks for progress and resume)."""
    d, n, T, steps = static.d, static.n, static.T, max(static.steps, 1)
    c = 6.0 * n * T * d * steps
    if "W" in getattr(static, "train", ()):
        c += 6.0 * d * d * steps
    return c


def plan_group(
    static: Static,
    n_runs: int,
    bytes_per_run: int,
    n_dev: int,
    memory_budget: int,
    chunk_size: int | None = None,
    block_size: int | None = None,
    engine=None,
) -> tuple[int, int]:
    """Pick ``(chunk, block)``: runs per host chunk and runs vmapped together on a device.

    The block is what occupies memory at once (``block`` runs per device); the chunk only adds
    its small outputs. Raises :class:`ConfigError` when one run exceeds the budget.
    """
    per_dev_budget = memory_budget / n_dev
    if bytes_per_run > per_dev_budget:
        raise ConfigError(
            f"one run of this group needs about {bytes_per_run / 2**30:.2f} GiB (d = {static.d}, "
            f"n = {static.n}, T = {static.T}, n_test = {static.n_test}) but the memory budget is "
            f"{per_dev_budget / 2**30:.2f} GiB per device; fix: lower d, n or n_test, use "
            "test_mode = \"projected\", or raise --memory-budget"
        )
    platform = _jax().local_devices()[0].platform
    if block_size is None and engine is not None and engine.block_size is not None:
        block_size = engine.block_size(static, platform)
    if block_size is None:
        # Measured on 2 CPU cores: the direct engine is memory-bound, blocks of a few runs whose
        # tokens fit in cache beat big vmaps (see phasebo.bench). Accelerators want wide blocks.
        if platform == "cpu":
            # python -m phasebo.bench: 2 was best or within 10 % at d = 1000-2000; >= 16 slower
            block_size = max(2, min(8, int(2**22 // max(bytes_per_run, 1))))
        else:
            block_size = 256
    block = max(1, min(block_size, int(per_dev_budget // bytes_per_run)))
    unit = block * n_dev
    if chunk_size is not None:
        chunk = max(1, chunk_size)
    else:
        # ~4 s of work per chunk on a 2-core CPU: frequent progress and cheap resume.
        target = 4 * 2e10 * n_dev
        cost = engine.cost_per_run(static) if engine is not None and engine.cost_per_run else \
            _cost_per_run(static)
        chunk = int(max(unit, min(4096, target // max(cost, 1.0))))
        chunk = unit * max(1, chunk // unit)
    return min(chunk, max(n_runs, 1)), block


def spec_hash(spec: SweepSpec) -> str:
    """Hash of everything that decides the rows (not the chunking or the device count)."""
    blob = json.dumps(
        {"fixed": spec.fixed, "axes": spec.axes, "seeds": spec.seeds,
         "cases": list(spec.cases), "settings": sorted(C.SETTINGS)},
        sort_keys=True, default=repr,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Compiled chunk functions
# --------------------------------------------------------------------------------------------

_COMPILED: dict = {}


def chunk_function(static: Static, block: int, n_dev: int) -> Callable:
    """``f(swept (B,), run_ids (B,), root_key) -> RunOutput`` with leading axis ``B``.

    One jitted function per (static group, block, device count); jit's own cache then compiles
    it once per chunk shape (the last chunk is padded to the same shape).
    """
    key = (static, block, n_dev)
    if key in _COMPILED:
        return _COMPILED[key]
    jax = _jax()
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from .train import resolve_engine

    run = resolve_engine(static).run

    def local(sw, ids, root):
        def one(args):
            sw1, i = args
            return run(static, sw1, jax.random.fold_in(root, i))

        return jax.lax.map(one, (sw, ids), batch_size=block)

    if n_dev > 1:
        mesh = Mesh(np.array(jax.local_devices()[:n_dev]), ("runs",))
        fn = jax.shard_map(local, mesh=mesh, in_specs=(P("runs"), P("runs"), P()),
                           out_specs=P("runs"), check_vma=False)
    else:
        fn = local
    compiled = jax.jit(fn)
    _COMPILED[key] = compiled
    return compiled


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


def rows_from_output(spec: SweepSpec, runs: list[dict], out, static: Static):
    """Host arrays of a chunk -> (results, dynamics, samples) DataFrames."""
    import pandas as pd

    from .results import classify_regime, derived_columns
    from .train import STATUS_NAMES

    B = len(runs)
    final = {k: np.asarray(v)[:B] for k, v in out.final.items()}
    res = pd.DataFrame(runs)
    res.insert(0, "sweep", spec.name)
    res["engine_setting"] = res["engine"]
    res["engine"] = _engine_used(static)  # the engine that ran (auto resolved)
    res["train"] = res["train"].map(lambda t: "+".join(t))
    for k, v in final.items():
        res[k] = v
    res["status"] = [STATUS_NAMES.get(int(s), "error") for s in final["status"]]
    res["regime"] = classify_regime(
        res["train_acc"], res["test_acc"], res["status"], res["test_eps"], res["train_acc_fit"]
    )
    res = derived_columns(res)
    front = ["sweep", "run_id", "model", "seed", "d", "signal_norm", "n", "n_test", "T", "rho",
             "noise_ratio", "lr", "steps", "train_acc", "train_acc_clean", "train_acc_noisy",
             "test_acc", "train_loss", "test_loss", "status", "regime"]
    res = res[front + [c for c in res.columns if c not in front]]

    dyn = None
    rec = C.record_steps(static.steps, static.record_every, static.record_log)
    if rec and out.dynamics:
        cols = {k: np.asarray(v)[:B].reshape(-1) for k, v in out.dynamics.items()}
        dyn = pd.DataFrame({
            "run_id": np.repeat([r["run_id"] for r in runs], len(rec)),
            "step": np.tile(np.asarray(rec, np.int64), B),
            **cols,
        })
    smp = None
    if out.samples:
        cols = {k: np.asarray(v)[:B] for k, v in out.samples.items()}
        n = next(iter(cols.values())).shape[1]
        smp = pd.DataFrame({
            "run_id": np.repeat([r["run_id"] for r in runs], n),
            "sample": np.tile(np.arange(n), B),
            **{k: v.reshape(-1) for k, v in cols.items()},
        })
    return res, dyn, smp


def _engine_used(static: Static) -> str:
    from .train import resolve_engine

    return resolve_engine(static).name


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


def _progress(total: int, done: int, quiet: bool):
    if quiet:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, unit="run", dynamic_ncols=True, file=sys.stderr,
                smoothing=0.1)


def prepare_out_dir(
    out_dir: Path, spec: SweepSpec, overwrite: bool, process_index: int = 0,
    wait_timeout: float = 600.0,
) -> Path:
    """Create ``out_dir`` with its manifest; refuse a different sweep unless ``overwrite``.

    With several processes, process 0 prepares the directory and the others wait for its
    manifest (a shared file system is assumed, as on a cluster).
    """
    out_dir = Path(out_dir)
    manifest = out_dir / "manifest.json"
    h = spec_hash(spec)
    if process_index > 0:
        deadline = time.monotonic() + wait_timeout
        while True:
            if manifest.exists():
                try:
                    old = json.loads(manifest.read_text())
                except json.JSONDecodeError:
                    old = {}
                if old.get("spec_hash") == h and (out_dir / "parts").is_dir():
                    return out_dir
                if old.get("spec_hash") not in (None, h) and not overwrite:
                    raise ConfigError(
                        f"{out_dir} holds results of a different sweep specification "
                        f"(hash {old.get('spec_hash')} vs {h}); fix: choose another --out or "
                        "pass --overwrite to discard them"
                    )
            if time.monotonic() > deadline:
                raise ConfigError(f"process {process_index}: process 0 did not prepare {out_dir} "
                                  f"within {wait_timeout:.0f} s; is --out on a shared file system?")
            time.sleep(0.2)
    if manifest.exists():
        old = json.loads(manifest.read_text())
        if old.get("spec_hash") != h:
            if not overwrite:
                raise ConfigError(
                    f"{out_dir} holds results of a different sweep specification "
                    f"(hash {old.get('spec_hash')} vs {h}); fix: choose another --out or pass "
                    "--overwrite to discard them"
                )
        if overwrite and old.get("spec_hash") != h:
            shutil.rmtree(out_dir / "parts", ignore_errors=True)
            for f in ("results.parquet", "results.csv", "dynamics.parquet", "samples.parquet"):
                (out_dir / f).unlink(missing_ok=True)
    elif overwrite and (out_dir / "parts").exists():
        shutil.rmtree(out_dir / "parts", ignore_errors=True)
    (out_dir / "parts").mkdir(parents=True, exist_ok=True)
    tmp = manifest.with_name(f".manifest.json.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"spec_hash": h, "name": spec.name, "n_runs": spec.n_runs,
                               "spec": spec.to_dict()}, indent=1, default=repr))
    os.replace(tmp, manifest)
    return out_dir


def run_sweep(
    spec: SweepSpec,
    out_dir: str | Path | None = None,
    *,
    chunk_size: int | None = None,
    block_size: int | None = None,
    memory_budget: int | None = None,
    n_devices: int | None = None,
    overwrite: bool = False,
    quiet: bool = False,
    plots: bool = True,
    max_chunks: int | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
    wait_timeout: float = 24 * 3600.0,
):
    """Run every run of ``spec`` not already in ``out_dir`` and assemble the results.

    With several processes (``jax.distributed`` initialised, or ``process_index`` /
    ``process_count`` given) each process runs a fixed contiguous share of every shape group and
    writes its own parts; process 0 assembles when every run id is present.

    Returns the results DataFrame (``None`` on processes other than 0, or when ``max_chunks``
    stopped the sweep early).
    """
    import jax.numpy as jnp

    from .results import assemble, done_run_ids, write_table_atomic
    from .train import MODELS, resolve_engine, swept_arrays

    jax = _jax()
    out_dir = Path(out_dir) if out_dir is not None else Path("results") / spec.name
    pi = jax.process_index() if process_index is None else process_index
    pc = jax.process_count() if process_count is None else process_count
    runs = spec.runs()
    if any(r["dtype"] == "float64" for r in runs):
        jax.config.update("jax_enable_x64", True)
    check_disk(spec, runs, out_dir)
    out_dir = prepare_out_dir(out_dir, spec, overwrite, pi)
    parts = out_dir / "parts"
    done = done_run_ids(parts)
    n_dev_avail = len(jax.local_devices())
    n_dev = max(1, min(n_devices or n_dev_avail, n_dev_avail))
    budget = memory_budget or int(MEMORY_FRACTION * free_memory_bytes())
    groups = group_runs(runs)
    plans = []
    for static, g_runs in groups:
        mspec = MODELS[static.model]
        mine = process_share(g_runs, pi, pc)
        todo = [r for r in mine if r["run_id"] not in done]
        eng = resolve_engine(static)
        nbytes = (eng.bytes_per_run or mspec.bytes_per_run)(static)
        chunk, block = plan_group(static, len(g_runs), nbytes, n_dev, budget, chunk_size,
                                  block_size, engine=eng)
        plans.append((static, todo, chunk, block))
    n_mine = sum(len(process_share(g, pi, pc)) for _, g in groups)
    bar = _progress(n_mine, n_mine - sum(len(t) for _, t, _, _ in plans), quiet)
    root = jax.random.PRNGKey(runs[0]["root_seed"]) if runs else None
    chunks_run = 0
    t0 = time.perf_counter()
    try:
        for static, todo, chunk, block in plans:
            if not todo:
                continue
            mspec = MODELS[static.model]
            fn = chunk_function(static, block, n_dev)
            # equal chunks (a short last chunk would be padded: wasted compute), each a
            # multiple of block x devices
            step = math.ceil(len(todo) / math.ceil(len(todo) / chunk))
            width = math.ceil(step / (block * n_dev)) * block * n_dev
            for start in range(0, len(todo), step):
                if max_chunks is not None and chunks_run >= max_chunks:
                    return None
                part = todo[start : start + step]
                padded = part + [part[-1]] * (width - len(part))  # same shape: no recompile
                sw = swept_arrays(static, padded, mspec)
                ids = np.asarray([r["run_id"] for r in padded], np.uint32)
                out = fn({k: jnp.asarray(v) for k, v in sw.items()}, jnp.asarray(ids), root)
                out = jax.device_get(out)
                res, dyn, smp = rows_from_output(spec, part, out, static)
                tag = f"{part[0]['run_id']:09d}-{part[-1]['run_id']:09d}"
                # samples and dynamics first: a results part marks the runs as done
                if dyn is not None:
                    write_table_atomic(dyn, parts / f"dynamics-{tag}.parquet")
                if smp is not None:
                    write_table_atomic(smp, parts / f"samples-{tag}.parquet")
                write_table_atomic(res, parts / f"results-{tag}.parquet")
                chunks_run += 1
                if bar is not None:
                    bar.update(len(part))
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        print(f"interrupted: finished chunks are saved under {parts}; run the same command "
              "again to resume", file=sys.stderr)
        raise
    if bar is not None:
        bar.close()
    elapsed = time.perf_counter() - t0
    if pc > 1:
        if pi != 0:
            if not quiet:
                print(f"process {pi}/{pc}: share done; process 0 assembles the results",
                      file=sys.stderr)
            return None
        wait_for_runs(parts, spec.n_runs, wait_timeout, quiet)
    df = assemble(out_dir, spec.n_runs)
    if plots:
        from .plot import sweep_figures

        sweep_figures(df, spec, out_dir)
    if not quiet:
        n_new = sum(len(t) for _, t, _, _ in plans)
        n_div = int((df["status"] == "diverged").sum())
        regimes = ", ".join(f"{k} {v}" for k, v in df["regime"].value_counts().items())
        print(f"{spec.name}: {n_new} runs in {elapsed:.1f} s on {n_dev} device(s) "
              f"({n_new / max(elapsed, 1e-9):.1f} runs/s); regimes: {regimes}"
              + (f"; {n_div} diverged runs (status = diverged, left out of the maps)"
                 if n_div else "") + f"; results in {out_dir}", file=sys.stderr)
    return df


def process_share(g_runs: list[dict], pi: int, pc: int) -> list[dict]:
    """Process ``pi``'s contiguous share of a group: the same on every host, whatever its
    memory or device count, so no run is done twice or skipped."""
    if pc <= 1:
        return g_runs
    k = len(g_runs)
    return g_runs[(k * pi) // pc : (k * (pi + 1)) // pc]


def wait_for_runs(parts: Path, n_runs: int, timeout: float, quiet: bool) -> None:
    """Process 0: wait until the other processes' parts hold every run id."""
    from .results import done_run_ids

    deadline = time.monotonic() + timeout
    said = False
    while len(done_run_ids(parts)) < n_runs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for the other processes' parts in {parts}")
        if not quiet and not said:
            print("process 0: waiting for the other processes' parts", file=sys.stderr)
            said = True
        time.sleep(1.0)


def check_disk(spec: SweepSpec, runs: list[dict], out_dir: Path) -> None:
    """Refuse a sweep whose recorded dynamics would not fit on disk (before any compute)."""
    total = 0
    for r in runs[:: max(spec.seeds, 1)]:
        n_rec = len(C.record_steps(r["steps"], r["record_every"], r["record_log"]))
        total += spec.seeds * n_rec * (60 + 4 * r.get("T", 8)) * 8
    probe = Path(out_dir)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if total > 0.5 * free:
        raise ConfigError(
            f"recording dynamics (record_every / record_log) for {spec.n_runs} runs needs about "
            f"{total / 2**30:.1f} GiB but {free / 2**30:.1f} GiB are free under {probe}; fix: "
            "record fewer steps (raise record_every, lower record_log) or fewer runs"
        )


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _parse_bytes(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(float(t))
    except ValueError:
        raise ConfigError(f"--memory-budget {text!r}: expected bytes such as 8G or 512M") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own exit code is 2 as well; keep its one line
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m phasebo.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="sweep file (TOML), e.g. sweeps/default.toml")
    p.add_argument("--out", help="output directory (default: results/<sweep name>/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting; a list [a, b] or a range {start=..,stop=..,step=..} "
                        "makes an axis")
    p.add_argument("--seeds", type=int, help="seeds per grid cell")
    p.add_argument("--chunk-size", type=int, help="runs per host chunk (default: sized to ~4 s)")
    p.add_argument("--block-size", type=int, help="runs vmapped together per device")
    p.add_argument("--memory-budget", help="bytes the sweep may plan for, e.g. 8G "
                                           "(default: half the free memory)")
    p.add_argument("--devices", type=int, help="use at most this many local devices")
    p.add_argument("--cpu-devices", type=int,
                   help="split the CPU into this many devices (default: one per core)")
    p.add_argument("--overwrite", action="store_true",
                   help="discard results of a different sweep in --out")
    p.add_argument("--no-plots", action="store_true", help="skip the heatmaps")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan only")
    g = p.add_argument_group("many hosts (jax.distributed)")
    g.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize; without the flags below JAX reads the "
                        "cluster from the environment (SLURM, TPU pods, ...)")
    g.add_argument("--coordinator", help="coordinator address host:port (process 0's host)")
    g.add_argument("--num-processes", type=int, help="number of processes")
    g.add_argument("--process-id", type=int, help="this process's id, 0..num-processes-1")
    return p


def enable_compilation_cache(jax) -> None:
    """Keep compiled programs on disk (``~/.cache/phasebo/jax``) unless the user chose a cache:
    a rerun, a resume, or another shape group with the same program (the reduced engine's is the
    same for every d) then skips compilation."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    path = os.environ.get("PHASEBO_CACHE", os.path.join(os.path.expanduser("~"), ".cache",
                                                        "phasebo", "jax"))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return  # read-only home: run without a cache
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.seeds is not None and args.seeds < 1:
            raise ConfigError(f"--seeds = {args.seeds} must be a positive integer")
        if args.chunk_size is not None and args.chunk_size < 1:
            raise ConfigError(f"--chunk-size = {args.chunk_size} must be >= 1")
        if args.block_size is not None and args.block_size < 1:
            raise ConfigError(f"--block-size = {args.block_size} must be >= 1")
        budget = _parse_bytes(args.memory_budget) if args.memory_budget else None
        # Use every CPU core: XLA runs one vmapped program on one core, so split the host into
        # devices before JAX starts its backends.
        import jax

        ncpu = args.cpu_devices or os.cpu_count() or 1
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            try:
                jax.config.update("jax_num_cpu_devices", ncpu)
            except RuntimeError:  # JAX already started (main() called in-process): keep it
                pass
        if args.distributed:
            jax.distributed.initialize(
                coordinator_address=args.coordinator, num_processes=args.num_processes,
                process_id=args.process_id,
            )
        elif any(v is not None for v in (args.coordinator, args.num_processes, args.process_id)):
            raise ConfigError("--coordinator / --num-processes / --process-id need --distributed")
        enable_compilation_cache(jax)
        from . import train  # noqa: F401  (registers models)

        spec = C.load_sweep(args.file, C.parse_set(args.set), args.seeds)
        if args.dry_run:
            for static, g in group_runs(spec.runs()):
                print(f"group d={static.d} n={static.n} T={static.T} steps={static.steps}: "
                      f"{len(g)} runs")
            print(f"{spec.n_runs} runs in all")
            return 0
        run_sweep(spec, args.out, chunk_size=args.chunk_size, block_size=args.block_size,
                  memory_budget=budget, n_devices=args.devices, overwrite=args.overwrite,
                  quiet=args.quiet, plots=not args.no_plots)
    except ConfigError as e:
        print(f"phasebo.sweep: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
