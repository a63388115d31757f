"""Run a sweep: plan -> execute -> assemble.

``python -m phasebo.sweep FILE [FILE ...] [--out DIR] [--set key=value ...] [--seeds N]``

1. **Plan** (:func:`plan`). The sweep file (plus ``--set`` overrides) is a grid of cells (the
   static settings) times the swept axes times the seeds (:mod:`phasebo.config`). Each cell is
   resolved to its model, its engine and the engine's *program* (:meth:`Engine.program`: for the
   reduced engine every ``d`` gives the same program); cells that share a program form one group,
   traced and compiled once. The planner streams: its memory does not grow with the run count.
2. **Execute** (:func:`execute`). A group's runs go through one compiled function in host chunks
   of a fixed width (a power of two times the block, so resumed and similar sweeps reuse it).
   Inside a chunk the run axis is split across the local devices (``shard_map``) and each device
   works through small vmapped blocks (``lax.map(batch_size=...)``). Each finished chunk is
   written at once as Parquet parts (atomic rename); rerunning the command resumes, and a sweep
   that grew (more seeds, more axis values) runs only its new runs.
3. **Assemble** (:func:`assemble`): the parts of the specification's runs become
   ``results.parquet``, ``results.csv``, ``dynamics.parquet`` and ``samples.parquet``, in the
   specification's order; then the figures are drawn.

A run's key derives from its identity (:func:`phasebo.config.run_ids`), so its numbers do not
depend on the chunk size, the block size, the number of devices or processes, or its position in
the grid.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import platform as _platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from . import config as C
from .config import Cell, SweepSpec, key_words, label_noise_notes, run_ids
from .registry import ENGINES, get_model, resolve_engine
from .settings import ConfigError, cache_dir, record_steps

log = logging.getLogger("phasebo")

MEMORY_FRACTION = 0.5  # default fraction of free memory a sweep may plan to use
SLICE = 1 << 16  # runs of a cell enumerated at once (keeps the planner's memory flat)
CHUNK_SECONDS = 4.0  # aim for about this much work per chunk (progress, cheap resume)
MAX_CHUNK = 4096
# Measured throughput (flop/s of each engine's cost model, 2-core CPU, `phasebo.bench`), used to
# size chunks and for the dry run's time estimates; accelerators: a conservative 20x.
RATE = {("direct", "cpu"): 2.0e10, ("gram", "cpu"): 2.0e10, ("reduced", "cpu"): 4.0e10}
COMPILE_SECONDS = 4.0  # typical trace + compile of one group on 2 cores (cold cache)

TRACES: dict[tuple, int] = {}  # (model, engine, program, block, devices) -> traces (tests, bench)


def _jax():
    import jax

    return jax


def platform_name() -> str:
    return _jax().local_devices()[0].platform


def rate(engine: str, platform: str) -> float:
    base = RATE.get((engine, "cpu"), 2e10)
    return base if platform == "cpu" else 20 * base


# --------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Group:
    """Cells that share one compiled program."""

    model: object
    engine: object
    program: object
    cells: list
    n_runs: int = 0
    bytes_per_run: int = 0
    cost_per_run: float = 0.0
    block: int = 1
    width: int = 1  # runs per chunk (all chunks of the group have this shape)

    @property
    def label(self) -> str:
        p = self.program
        shape = ", ".join(f"{k}={getattr(p, k)}" for k in ("n", "T", "steps") if hasattr(p, k))
        if self.engine.name != "reduced" and hasattr(p, "d"):
            shape = f"d={p.d}, " + shape
        return f"{self.model.name} on {self.engine.name} ({shape})"


@dataclasses.dataclass
class Plan:
    spec: SweepSpec
    groups: list
    n_dev: int
    budget: int
    platform: str

    @property
    def n_runs(self) -> int:
        return sum(g.n_runs for g in self.groups)


def free_memory_bytes() -> int:
    """Free memory of the first local device (accelerator) or of the host."""
    dev = _jax().local_devices()[0]
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


def _own(cell: Cell) -> tuple:
    model = get_model(cell.settings["model"])
    own = {k: v for k, v in cell.settings.items() if k in model.settings}
    return model, own


def _pow2_at_least(k: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(k, 1))))


def size_group(g: Group, n_dev: int, budget: int, platform: str, chunk_size=None,
               block_size=None) -> None:
    """Block (runs vmapped together per device) and chunk width of a group."""
    per_dev = budget / n_dev
    if g.bytes_per_run > per_dev:
        p = g.program
        shape = ", ".join(f"{k} = {getattr(p, k)}" for k in ("d", "n", "T", "n_test")
                          if hasattr(p, k))
        raise ConfigError(
            f"one run of {g.model.name} needs about {g.bytes_per_run / 2**30:.2f} GiB ({shape}) "
            f"but the memory budget is {per_dev / 2**30:.2f} GiB per device; fix: lower d, n or "
            "n_test, use test_mode = \"projected\", or raise --memory-budget")
    hint = block_size or g.engine.block_size(g.model, g.program, platform)
    g.block = max(1, min(hint, int(per_dev // max(g.bytes_per_run, 1))))
    if chunk_size is not None:  # a forced chunk smaller than a block shrinks the block
        g.block = max(1, min(g.block, chunk_size // n_dev))
    unit = g.block * n_dev
    if chunk_size is not None:
        width = max(1, chunk_size)
    else:
        seconds = g.cost_per_run / rate(g.engine.name, platform)
        width = int(max(unit, min(MAX_CHUNK, CHUNK_SECONDS * n_dev / max(seconds, 1e-9))))
    # a power of two times the unit: few shapes, so resume and similar sweeps reuse programs
    k = max(1, width // unit)
    width = unit * (1 << int(math.floor(math.log2(k))))
    g.width = min(width, unit * _pow2_at_least(math.ceil(g.n_runs / unit)))


def plan(spec: SweepSpec, *, n_devices: int | None = None, memory_budget: int | None = None,
         chunk_size: int | None = None, block_size: int | None = None) -> Plan:
    """Group the cells by compiled program and size every group (no run is enumerated)."""
    jax = _jax()
    n_avail = len(jax.local_devices())
    n_dev = max(1, min(n_devices or n_avail, n_avail))
    budget = memory_budget or int(MEMORY_FRACTION * free_memory_bytes())
    plat = platform_name()
    groups: dict[tuple, Group] = {}
    per_cell = spec.runs_per_cell()
    for cell in spec.cells():
        model, own = _own(cell)
        static = model.static_of(own)
        engine = resolve_engine(model, static)
        program = engine.program(model, static)
        key = (model.name, engine.name, program)
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(model, engine, program, [])
        g.cells.append(cell)
        g.n_runs += per_cell
        g.bytes_per_run = max(g.bytes_per_run, engine.bytes_per_run(model, static))
        g.cost_per_run = max(g.cost_per_run, engine.cost_per_run(model, static))
    out = list(groups.values())
    for g in out:
        size_group(g, n_dev, budget, plat, chunk_size, block_size)
    return Plan(spec, out, n_dev, budget, plat)


# --------------------------------------------------------------------------------------------
# Runs of a cell
# --------------------------------------------------------------------------------------------


def cell_runs(spec: SweepSpec, cell: Cell, j: np.ndarray) -> dict:
    """Settings that vary inside ``cell`` for its local run indices ``j`` (seeds fastest, then
    the swept axes in file order, the last fastest): ``seed`` and one array per swept axis."""
    j = np.asarray(j, np.int64)
    out = {"seed": j % spec.seeds}
    combo = j // spec.seeds
    shape = [len(spec.axes[a]) for a in cell.swept_axes]
    if shape:
        idx = np.unravel_index(combo, shape)
        for a, i in zip(cell.swept_axes, idx):
            vals = spec.axes[a]
            out[a] = np.asarray(vals, dtype=object if isinstance(vals[0], (tuple, str))
                                else None)[i]
    return out


def cell_run_ids(spec: SweepSpec, cell: Cell, j: np.ndarray) -> np.ndarray:
    model, own = _own(cell)
    var = cell_runs(spec, cell, j)
    seeds = var.pop("seed")
    return run_ids(model, own, {k: v for k, v in var.items() if k in model.settings}, seeds)


def spec_run_ids(spec: SweepSpec) -> np.ndarray:
    """Every run id of the specification, in its order (8 bytes per run)."""
    R = spec.runs_per_cell()
    parts = []
    for cell in spec.cells():
        for j0 in range(0, R, SLICE):
            parts.append(cell_run_ids(spec, cell, np.arange(j0, min(R, j0 + SLICE))))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def group_pieces(spec: SweepSpec, g: Group, done: np.ndarray, share: tuple[int, int] = (0, 1)
                 ) -> Iterator[tuple[Cell, np.ndarray]]:
    """``(cell, local run indices)`` of the group's runs still to do, in order; ``share =
    (process index, process count)`` keeps a fixed contiguous share of the group."""
    R = spec.runs_per_cell()
    pi, pc = share
    lo, hi = (g.n_runs * pi) // pc, (g.n_runs * (pi + 1)) // pc
    for ci, cell in enumerate(g.cells):
        a, b = max(lo - ci * R, 0), min(hi - ci * R, R)
        for j0 in range(a, b, SLICE):
            j = np.arange(j0, min(b, j0 + SLICE))
            if len(done):
                j = j[~np.isin(cell_run_ids(spec, cell, j), done, assume_unique=False)]
            if len(j):
                yield cell, j


def chunks(pieces: Iterator, width: int) -> Iterator[list]:
    """Consecutive lists of pieces holding ``width`` runs each (the last fewer)."""
    cur, n = [], 0
    for cell, j in pieces:
        while len(j):
            take = min(width - n, len(j))
            cur.append((cell, j[:take]))
            n += take
            j = j[take:]
            if n == width:
                yield cur
                cur, n = [], 0
    if cur:
        yield cur


def chunk_arrays(spec: SweepSpec, g: Group, pieces: list, width: int) -> tuple[dict, list]:
    """Host arrays of a chunk, padded to ``width``: the swept and derived values, the root seeds
    and the run-id words; plus, per piece, its settings columns for the rows."""
    model = g.model
    sw_parts: dict[str, list] = {}
    cols = []
    fdt = np.float64 if g.program.dtype == "float64" else np.float32
    for cell, j in pieces:
        _, own = _own(cell)
        var = cell_runs(spec, cell, j)
        seeds = var.pop("seed")
        var = {k: v for k, v in var.items() if k in model.settings}
        ids = run_ids(model, own, var, seeds)
        B = len(j)
        sw = {k: np.broadcast_to(np.asarray(var[k] if k in var else own[k], np.float64), (B,))
              for k in model.swept}
        static = model.static_of(own)
        sw.update(model.derived(static, sw))
        sw["root_seed"] = np.broadcast_to(np.asarray(var.get("root_seed", own["root_seed"])), (B,))
        hi, lo = key_words(ids)
        sw["_hi"], sw["_lo"] = hi, lo
        for k, v in sw.items():
            sw_parts.setdefault(k, []).append(np.asarray(v))
        cols.append((own, var, seeds, ids))
    arrays = {}
    for k, v in sw_parts.items():
        a = np.concatenate(v)
        if len(a) < width:  # pad with the last run (same shape: no new trace)
            a = np.concatenate([a, np.repeat(a[-1:], width - len(a))])
        if k in ("root_seed",):
            a = a.astype(np.int32)
        elif k in ("_hi", "_lo"):
            a = a.astype(np.uint32)
        elif np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int32)
        else:
            a = a.astype(fdt)
        arrays[k] = a
    return arrays, cols


# --------------------------------------------------------------------------------------------
# Compiled chunk functions
# --------------------------------------------------------------------------------------------

_COMPILED: dict = {}


def chunk_function(model, engine, program, block: int, n_dev: int) -> Callable:
    """``f(arrays (W,)) -> RunOutput`` with leading axis ``W``: one jitted function per (program,
    block, device count), traced once per chunk width."""
    key = (model.name, engine.name, program, block, n_dev)
    if key in _COMPILED:
        return _COMPILED[key]
    jax = _jax()
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    def local(arrays):
        TRACES[key] = TRACES.get(key, 0) + 1  # runs at trace time only

        def one(a):
            k = C.run_key(a["root_seed"], a["_hi"], a["_lo"])
            sw = {n: v for n, v in a.items() if n not in ("root_seed", "_hi", "_lo")}
            return engine.run(model, program, sw, k)

        return jax.lax.map(one, arrays, batch_size=block)

    if n_dev > 1:
        mesh = Mesh(np.array(jax.local_devices()[:n_dev]), ("runs",))
        fn = jax.shard_map(local, mesh=mesh, in_specs=(P("runs"),), out_specs=P("runs"),
                           check_vma=False)
    else:
        fn = local
    compiled = jax.jit(fn)
    _COMPILED[key] = compiled
    return compiled


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


def _column(v, B):
    if isinstance(v, tuple):
        v = "+".join(map(str, v))
    return np.full(B, v, dtype=object if isinstance(v, str) else None)


def rows(spec: SweepSpec, g: Group, cols: list, out) -> tuple:
    """Host outputs of a chunk -> (results, dynamics, samples) DataFrames."""
    import pandas as pd

    from .regimes import classify_runs, regimes_over_time, timeline
    from .results import derived_columns
    from .train import Status

    model = g.model
    frames = []
    for own, var, seeds, ids in cols:
        B = len(ids)
        d = {"sweep": np.full(B, spec.name, object), "run_id": ids, "model": np.full(B, model.name,
                                                                                    object),
             "seed": seeds.astype(np.int64)}
        for k in spec.axes:
            if k in model.settings:
                d[k] = var[k] if k in var else _column(own[k], B)
        for k in model.settings:
            if k not in d:
                d[k] = var[k] if k in var else _column(own[k], B)
        frames.append(pd.DataFrame(d))
    res = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    n = len(res)
    res["engine_setting"] = res["engine"]
    res["engine"] = g.engine.name
    final = {k: np.asarray(v)[:n] for k, v in out.final.items()}
    metrics = pd.DataFrame(final)
    labels = {int(s): s.label for s in Status}
    status = np.array([labels.get(int(s), "error") for s in final["status"]], object)
    metrics["status"] = status
    metrics["regime"] = classify_runs(pd.concat([res, metrics], axis=1))
    front = ["train_acc", "train_acc_clean", "train_acc_noisy", "test_acc", "train_loss",
             "test_loss", "status", "regime"]
    metrics = metrics[[c for c in front if c in metrics] + [c for c in metrics if c not in front]]
    res = pd.concat([res, metrics], axis=1)
    res = derived_columns(res)
    dyn = None
    rec = record_steps(g.program.steps, g.program.record_every, g.program.record_log) \
        if model.trains else ()
    if rec and out.dynamics:
        cols_d = {k: np.asarray(v)[:n].reshape(-1) for k, v in out.dynamics.items()}
        dyn = pd.DataFrame({"run_id": np.repeat(res["run_id"].to_numpy(), len(rec)),
                            "step": np.tile(np.asarray(rec, np.int64), n), **cols_d})
        if "margin" in dyn.columns:  # the regime at every recorded step, and each run's path
            dyn = dyn.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
            reg = regimes_over_time(dyn, res)
            dyn["regime"] = reg["regime"].to_numpy()
            res = res.merge(timeline(reg, res), on="run_id", how="left", validate="one_to_one")
    smp = None
    if out.samples:
        cols_s = {k: np.asarray(v)[:n] for k, v in out.samples.items()}
        m = next(iter(cols_s.values())).shape[1]
        smp = pd.DataFrame({"run_id": np.repeat(res["run_id"].to_numpy(), m),
                            "sample": np.tile(np.arange(m), n),
                            **{k: v.reshape(-1) for k, v in cols_s.items()}})
    return res, dyn, smp


# --------------------------------------------------------------------------------------------
# The output directory
# --------------------------------------------------------------------------------------------


def check_out_dir(out_dir: Path) -> None:
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a directory; fix: give a directory "
                          "(it is created if missing)")
    probe = out_dir
    while not probe.exists():
        probe = probe.parent
    if probe.is_file():
        raise ConfigError(f"--out {out_dir}: {probe} is a file; fix: choose another directory")
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"--out {out_dir}: {probe} is not writable; fix: choose another "
                          "directory")


def compatible(old: dict, new: SweepSpec) -> str | None:
    """Why the runs already in a directory (``old``: its manifest's spec) are not part of the
    sweep ``new`` (None: every old value of every setting is still a value of it, so the new sweep
    only grows the old one)."""
    old_spec = SweepSpec(name=old.get("name", ""), fixed=old.get("fixed", {}),
                         axes=old.get("axes", {}), seeds=old.get("seeds", 1),
                         cases=tuple(old.get("cases", [{}])))
    names = old_spec.setting_names() | new.setting_names()
    defaults = C.all_settings()

    def vals(spec, k):
        v = spec.values(k)
        if len(v) < len(spec.cases) or not v:
            v = [*v, defaults[k].default]
        return {json.dumps(x, default=list) for x in v}

    for k in sorted(names):
        if k not in defaults:
            continue
        before, after = vals(old_spec, k), vals(new, k)
        lost = before - after
        if lost:
            return (f"{k} had {', '.join(sorted(lost))} there, which this sweep no longer has "
                    f"(it has {', '.join(sorted(after))})")
    if new.seeds < old_spec.seeds:
        return f"it has {old_spec.seeds} seeds per cell, this sweep {new.seeds}"
    return None


def prepare_out_dir(out_dir: Path, spec: SweepSpec, overwrite: bool, process_index: int = 0,
                    wait_timeout: float = 600.0, provenance: dict | None = None) -> Path:
    """Create ``out_dir`` with its manifest. A directory holding another sweep's runs is refused
    unless this sweep only grows it (more seeds, more axis values) or ``overwrite``.

    With several processes, process 0 prepares the directory and the others wait for its
    manifest (a shared file system is assumed, as on a cluster).
    """
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    manifest = out_dir / "manifest.json"
    new = spec.to_dict()
    if process_index > 0:
        deadline = time.monotonic() + wait_timeout
        while time.monotonic() < deadline:
            try:
                if json.loads(manifest.read_text()).get("spec") == new and \
                        (out_dir / "parts").is_dir():
                    return out_dir
            except (OSError, json.JSONDecodeError):
                pass
            time.sleep(0.2)
        raise ConfigError(f"process {process_index}: process 0 did not prepare {out_dir} "
                          f"within {wait_timeout:.0f} s; is --out on a shared file system?")
    if manifest.exists() and not overwrite:
        try:
            old = json.loads(manifest.read_text()).get("spec", {})
        except json.JSONDecodeError:
            old = {}
        why = compatible(old, spec) if old else None
        if why:
            raise ConfigError(f"{out_dir} holds runs of another sweep: {why}; fix: choose another "
                              "--out, or pass --overwrite to discard them")
    if overwrite:
        shutil.rmtree(out_dir / "parts", ignore_errors=True)
        for f in ("results.parquet", "results.csv", "dynamics.parquet", "samples.parquet"):
            (out_dir / f).unlink(missing_ok=True)
    (out_dir / "parts").mkdir(parents=True, exist_ok=True)
    write_manifest(out_dir, spec, provenance or {})
    return out_dir


def write_manifest(out_dir: Path, spec: SweepSpec, provenance: dict) -> None:
    manifest = Path(out_dir) / "manifest.json"
    tmp = manifest.with_name(f".manifest.json.tmp-{os.getpid()}")
    body = {"name": spec.name, "n_runs": spec.n_runs, "spec": spec.to_dict(), **provenance}
    tmp.write_text(json.dumps(body, indent=1, default=repr))
    os.replace(tmp, manifest)


def provenance() -> dict:
    """Versions, commit, command line and devices: what a results directory was made by."""
    jax = _jax()
    from . import __version__

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    devs = jax.local_devices()
    return {"phasebo_version": __version__, "jax_version": jax.__version__, "git_commit": commit,
            "command": " ".join(sys.argv), "python": _platform.python_version(),
            "host": _platform.node(), "device_kind": devs[0].device_kind,
            "platform": devs[0].platform, "device_count": len(devs),
            "process_count": jax.process_count()}


# --------------------------------------------------------------------------------------------
# Execute
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Stats:
    n_new: int = 0
    compile_s: float = 0.0
    run_s: float = 0.0
    chunks: int = 0
    stopped: bool = False


class _Progress:
    """A tqdm bar whose rate and ETA count run time only (compilation is paused out of it)."""

    def __init__(self, total, done, quiet):
        self.bar = None
        if not quiet and total:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=done, unit="run", dynamic_ncols=True,
                            file=sys.stderr, smoothing=0.3, mininterval=0.5)

    def say(self, text):
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)

    def resume(self):
        if self.bar is not None:
            self.bar.unpause()  # the pause (compilation) does not count into the rate

    def update(self, n):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


TIMELINE = ("first_benign_step", "dip_step", "dip_test_acc", "recovery_step")


def output_columns(model, out) -> set[str]:
    """The columns a group's results rows will have: its model's settings, the derived columns,
    the final metrics of the traced program (``out``: its abstract ``RunOutput``) and, when it
    records a margin, each run's timeline (:func:`phasebo.regimes.timeline`)."""
    cols = set(model.settings) | set(out.final) | {"sweep", "run_id", "seed", "snr", "n_snr2",
                                                   "status", "regime", "engine_setting"}
    return cols | (set(TIMELINE) if out.dynamics and "margin" in out.dynamics else set())


def execute(pl: Plan, out_dir: Path, *, quiet: bool = False, max_chunks: int | None = None,
            share: tuple[int, int] = (0, 1), plots: bool = False) -> Stats:
    """Run every run of the plan not already in ``out_dir``'s parts (this process's share).

    Every group with work is traced first (``plots``: then the ``[plot]`` values are checked
    against the traced columns, before anything runs), then compiled and run group by group.
    """
    jax = _jax()
    from .results import done_run_ids

    parts = Path(out_dir) / "parts"
    done = done_run_ids(parts)
    spec = pl.spec
    stats = Stats()
    todo = []
    for g in pl.groups:
        n_mine = sum(len(j) for _, j in group_pieces(spec, g, np.zeros(0, np.int64), share)) \
            if share[1] > 1 else g.n_runs
        n_todo = sum(len(j) for _, j in group_pieces(spec, g, done, share)) if len(done) \
            else n_mine
        todo.append((g, n_mine, n_todo))
    total = sum(t[1] for t in todo)
    bar = _Progress(total, total - sum(t[2] for t in todo), quiet)
    active = []
    columns: set[str] = set()
    t = time.perf_counter()
    for g, _, n_todo in todo:
        if not n_todo:
            continue
        stream = chunks(group_pieces(spec, g, done, share), g.width)
        first = next(stream)
        arrays, cols = chunk_arrays(spec, g, first, g.width)
        fn = chunk_function(g.model, g.engine, g.program, g.block, pl.n_dev)
        lowered = fn.lower({n: jax.ShapeDtypeStruct(v.shape, v.dtype) for n, v in arrays.items()})
        columns |= output_columns(g.model, lowered.out_info)
        active.append((g, n_todo, lowered, itertools.chain([(first, arrays, cols)], stream)))
    stats.compile_s += time.perf_counter() - t
    if plots and active:
        from .plot import check_plot_spec

        check_plot_spec(spec, columns=columns)
    with _interruptible() as interrupted:
        _chunk_loop(spec, pl.n_dev, active, parts, stats, bar, max_chunks, interrupted)
    return stats


@contextlib.contextmanager
def _interruptible():
    """SIGINT raises KeyboardInterrupt as usual and also sets a flag that the chunk loop reads
    after every chunk: Python swallows an exception raised inside a garbage-collector callback
    (jax registers one), and a Ctrl-C landing there must still stop the sweep."""
    flag = [False]
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        flag[0] = True
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, old)


def _chunk_loop(spec, n_dev, active, parts, stats, bar, max_chunks, interrupted) -> None:
    """Compile each group, then run its chunks, writing every chunk's parts as it finishes."""
    from .results import write_table_atomic

    jax = _jax()
    try:
        for k, (g, n_todo, lowered, stream) in enumerate(active):
            bar.say(f"compiling group {k + 1}/{len(active)}: {g.label}, {n_todo} runs, block "
                    f"{g.block} x {n_dev} device(s), chunk {g.width}")
            t = time.perf_counter()
            compiled = lowered.compile()
            stats.compile_s += time.perf_counter() - t
            bar.resume()
            for item in stream:
                if interrupted[0]:
                    raise KeyboardInterrupt
                if max_chunks is not None and stats.chunks >= max_chunks:
                    stats.stopped = True
                    return
                if isinstance(item, tuple):
                    _, arrays, cols = item
                else:
                    arrays, cols = chunk_arrays(spec, g, item, g.width)
                t = time.perf_counter()
                dev = {n: jax.numpy.asarray(v) for n, v in arrays.items()}
                out = jax.device_get(compiled(dev))
                res, dyn, smp = rows(spec, g, cols, out)
                first_id, last_id = res["run_id"].iloc[0], res["run_id"].iloc[-1]
                tag = f"{first_id:019d}-{last_id:019d}-{stats.chunks:06d}-{os.getpid()}.parquet"
                # samples and dynamics first: a results part marks the runs as done
                if dyn is not None:
                    write_table_atomic(dyn, parts / f"dynamics-{tag}")
                if smp is not None:
                    write_table_atomic(smp, parts / f"samples-{tag}")
                write_table_atomic(res, parts / f"results-{tag}")
                stats.run_s += time.perf_counter() - t
                stats.chunks += 1
                stats.n_new += len(res)
                bar.update(len(res))
        if interrupted[0]:
            raise KeyboardInterrupt
    finally:
        bar.close()


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


def run_sweep(spec: SweepSpec, out_dir: str | Path | None = None, *, chunk_size=None,
              block_size=None, memory_budget=None, n_devices=None, overwrite: bool = False,
              quiet: bool = False, plots: bool = True, max_chunks: int | None = None,
              process_index: int | None = None, process_count: int | None = None,
              wait_timeout: float = 24 * 3600.0, formats=("png",), dpi: int = 150):
    """Run every run of ``spec`` not already in ``out_dir`` and assemble the results.

    With several processes (``jax.distributed`` initialised, or ``process_index`` /
    ``process_count`` given) each process runs a fixed contiguous share of every group and writes
    its own parts; process 0 assembles once every run is there.

    Returns the results DataFrame (``None`` on processes other than 0, or when ``max_chunks``
    stopped the sweep early).
    """
    jax = _jax()
    t_start = time.time()
    out_dir = Path(out_dir) if out_dir is not None else Path("results") / spec.name
    pi = jax.process_index() if process_index is None else process_index
    pc = jax.process_count() if process_count is None else process_count
    if any(v == "float64" for v in spec.values("dtype")) and not jax.config.jax_enable_x64:
        raise ConfigError("dtype = \"float64\" needs 64-bit JAX; fix: run through `python -m "
                          "phasebo.sweep` (it enables it) or set JAX_ENABLE_X64=1")
    check_out_dir(out_dir)
    pl = plan(spec, n_devices=n_devices, memory_budget=memory_budget, chunk_size=chunk_size,
              block_size=block_size)
    check_disk(pl, out_dir)
    if not quiet:
        for note in label_noise_notes(spec):
            print(f"{spec.name}: {note}", file=sys.stderr)
    if plots:
        from .plot import check_plot_spec

        check_plot_spec(spec)  # keys and axes now; the values once the programs are traced
    prov = provenance()
    prov["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start))
    out_dir = prepare_out_dir(out_dir, spec, overwrite, pi, provenance=prov)
    try:
        stats = execute(pl, out_dir, quiet=quiet, max_chunks=max_chunks, share=(pi, pc),
                        plots=plots)
    except KeyboardInterrupt:
        print(f"interrupted: finished chunks are saved under {out_dir / 'parts'}; run the same "
              "command again to resume", file=sys.stderr)
        raise
    if stats.stopped:
        return None
    if pc > 1:
        if pi != 0:
            if not quiet:
                print(f"process {pi}/{pc}: share done; process 0 assembles the results",
                      file=sys.stderr)
            return None
        wait_for_runs(out_dir / "parts", spec.n_runs, wait_timeout, quiet)
    from .results import assemble

    t = time.perf_counter()
    df = assemble(out_dir, spec_run_ids(spec), engines=sorted(ENGINES))
    if plots:
        from .plot import sweep_figures

        sweep_figures(df, spec, out_dir, formats=formats, dpi=dpi)
    t_write = time.perf_counter() - t
    wall = time.time() - t_start
    prov.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_s=round(wall, 3),
                compile_s=round(stats.compile_s, 3), run_s=round(stats.run_s, 3),
                new_runs=stats.n_new)
    write_manifest(out_dir, spec, prov)
    if not quiet:
        n_div = int((df["status"] == "diverged").sum())
        counts = df["regime"].value_counts()
        regimes = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
        rate_txt = f"{stats.n_new / stats.run_s:.0f} runs/s" if stats.run_s > 0 else "-"
        print(f"{spec.name}: {stats.n_new} new runs ({len(df)} in the table); compile "
              f"{stats.compile_s:.1f} s, run {stats.run_s:.1f} s ({rate_txt}), tables and "
              f"figures {t_write:.1f} s, {wall:.1f} s in all on {pl.n_dev} {pl.platform} "
              f"device(s); regimes: {regimes}"
              + (f"; {n_div} diverged runs (status = diverged, left out of the maps)"
                 if n_div else "") + f"; results in {out_dir}", file=sys.stderr)
    return df


def wait_for_runs(parts: Path, n_runs: int, timeout: float, quiet: bool) -> None:
    """Process 0: wait until the other processes' parts hold every run."""
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


def check_disk(pl: Plan, out_dir: Path) -> None:
    """Refuse a sweep whose tables would not fit on disk (before any compute)."""
    total = estimated_disk(pl)
    probe = Path(out_dir)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if total > 0.5 * free:
        raise ConfigError(
            f"this sweep's tables need about {total / 2**30:.1f} GiB but {free / 2**30:.1f} GiB "
            f"are free under {probe}; fix: record fewer steps (raise record_every, lower "
            "record_log) or run fewer runs")


def estimated_disk(pl: Plan) -> int:
    total = 0
    for g in pl.groups:
        p = g.program
        n_rec = len(record_steps(p.steps, p.record_every, p.record_log)) if g.model.trains else 0
        T = getattr(p, "T", 8)
        total += g.n_runs * (400 + n_rec * (60 + 4 * T) * 8 + p.n * 40)
    return int(total)


# --------------------------------------------------------------------------------------------
# One run, for notebooks and tests
# --------------------------------------------------------------------------------------------

_RUN_ONE: dict = {}


def prepare_one(settings: dict | None = None, *, seed: int = 0, key=None, **kw):
    """``(model, engine, program, swept values, key)`` of one run from a settings dict (its
    model's defaults filled in, validated as a sweep would); ``key`` overrides the
    identity-derived key ``fold_in(fold_in(PRNGKey(root_seed), hi32), lo32)`` of its run id."""
    jax = _jax()
    given = {**(settings or {}), **kw}
    given = {k: C._setting(k, "").coerce(v) for k, v in given.items()}
    own = C.check_cell(C.resolve(given), given)
    model = get_model(own["model"])
    static = model.static_of(own)
    engine = resolve_engine(model, static)
    program = engine.program(model, static)
    sw = {k: np.asarray([own[k]], np.float64) for k in model.swept}
    sw.update(model.derived(static, sw))
    fdt = np.float64 if static.dtype == "float64" else np.float32
    sw = {k: jax.numpy.asarray(v[0], np.int32 if np.issubdtype(np.asarray(v).dtype, np.integer)
                               else fdt) for k, v in sw.items()}
    if key is None:
        hi, lo = key_words(run_ids(model, own, {}, np.asarray([seed])))
        key = C.run_key(own["root_seed"], int(hi[0]), int(lo[0]))
    return model, engine, program, sw, key


def run_one(settings: dict | None = None, *, seed: int = 0, key=None, **kw):
    """One run (jitted, one compilation per program): ``RunOutput(final, dynamics, samples)``.
    See :func:`prepare_one` for the arguments."""
    jax = _jax()
    model, engine, program, sw, key = prepare_one(settings, seed=seed, key=key, **kw)
    cache = (model.name, engine.name, program)
    if cache not in _RUN_ONE:
        _RUN_ONE[cache] = jax.jit(lambda s, k: engine.run(model, program, s, k))
    return _RUN_ONE[cache](sw, key)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


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


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own exit code is 2 as well; keep its one line
        self.exit(2, f"{self.prog}: error: {message}\n")


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
    p.add_argument("--seeds", type=int, help="seeds per grid cell (more seeds grow a finished "
                                             "sweep in place)")
    p.add_argument("--chunk-size", type=int, help="runs per host chunk (default: ~4 s of work)")
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
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the planner decides")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and print the plan (groups, engines, memory, time, disk) only")
    p.add_argument("--refine", metavar="A,B",
                   help="refine the grid around the boundary between regimes A and B (see "
                        "phasebo.refine; or a [refine] block in the file)")
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
    p = Parser(prog="python -m phasebo.sweep", description=__doc__.split("\n\n")[0],
               epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_arguments(p)


def override_slug(items: list[str]) -> str:
    """A directory name for a set of ``--set`` overrides: ``d=1000,signal_norm=10+40``."""
    parts = []
    for item in items:
        k, _, v = item.partition("=")
        v = re.sub(r"[\s\[\]{}\"']", "", v).replace(",", "+").replace("=", "-")
        parts.append(f"{k.strip()}={v}")
    return re.sub(r"[^A-Za-z0-9_.+=,-]", "_", ",".join(parts))[:120]


def start_jax(args) -> None:
    """Process-wide JAX settings, before any backend starts: one CPU device per core (XLA runs a
    vmapped program on one core), 64-bit floats, the on-disk compilation cache."""
    import jax

    ncpu = args.cpu_devices or os.cpu_count() or 1
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:
            jax.config.update("jax_num_cpu_devices", ncpu)
        except RuntimeError:  # JAX already started (main() called in-process): keep it
            pass
    if getattr(args, "distributed", False):
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.num_processes, process_id=args.process_id)
    elif any(getattr(args, k, None) is not None for k in ("coordinator", "num_processes",
                                                          "process_id")):
        raise ConfigError("--coordinator / --num-processes / --process-id need --distributed")
    enable_compilation_cache(jax)


def enable_compilation_cache(jax) -> None:
    """Keep compiled programs on disk (``~/.cache/phasebo/jax``, or ``$PHASEBO_CACHE/jax``) unless
    the user chose a cache: a rerun, a resume or a similar sweep then skips compilation."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    path = os.path.join(cache_dir(), "jax")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return  # read-only home: run without a cache
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)




def traced_columns(pl: Plan) -> set[str]:
    """The results columns of every group, from an abstract trace of one run (no compilation)."""
    jax = _jax()
    cols: set[str] = set()
    for g in pl.groups:
        cell = g.cells[0]
        arrays, _ = chunk_arrays(pl.spec, g, [(cell, np.arange(1))], 1)
        one = {k: jax.ShapeDtypeStruct((), v.dtype) for k, v in arrays.items()}

        def run(a, g=g):
            k = C.run_key(a["root_seed"], a["_hi"], a["_lo"])
            sw = {n: v for n, v in a.items() if n not in ("root_seed", "_hi", "_lo")}
            return g.engine.run(g.model, g.program, sw, k)

        cols |= output_columns(g.model, jax.eval_shape(run, one))
    return cols


def dry_run(spec: SweepSpec, pl: Plan, out: Path) -> None:
    """Print the plan: per group the engine, runs, memory, time and disk estimates."""
    print(f"{spec.name}: {spec.n_runs} runs in {len(pl.groups)} compiled group(s) on "
          f"{pl.n_dev} {pl.platform} device(s); output {out}")
    total_t = 0.0
    for g in pl.groups:
        t = g.n_runs * g.cost_per_run / (rate(g.engine.name, pl.platform) * pl.n_dev)
        total_t += t + COMPILE_SECONDS
        print(f"  {g.label}: {g.n_runs} runs in {len(g.cells)} cell(s); block {g.block}, chunk "
              f"{g.width}; memory ~{g.block * g.bytes_per_run / 2**20:.1f} MiB per device; "
              f"~{_fmt_time(t)}")
    print(f"  estimated time ~{_fmt_time(total_t)} (cost model of `phasebo bench`), tables "
          f"~{estimated_disk(pl) / 2**20:.1f} MiB on disk, memory budget "
          f"{pl.budget / 2**30:.1f} GiB")


def _fmt_time(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = build_parser()
    if prog:
        p.prog = prog
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="phasebo: %(message)s")
    try:
        if args.seeds is not None and args.seeds < 1:
            raise ConfigError(f"--seeds = {args.seeds} must be a positive integer")
        for flag in ("chunk_size", "block_size", "dpi"):
            v = getattr(args, flag)
            if v is not None and v < 1:
                raise ConfigError(f"--{flag.replace('_', '-')} = {v} must be >= 1")
        formats = tuple(f.strip().lower() for f in args.format.split(",") if f.strip())
        bad = [f for f in formats if f not in ("png", "pdf", "svg")]
        if bad or not formats:
            raise ConfigError(f"--format {args.format!r}: formats are png, pdf and svg, e.g. "
                              "--format png,pdf")
        budget = _parse_bytes(args.memory_budget) if args.memory_budget else None
        if args.out and len(args.files) > 1:
            raise ConfigError("--out names one directory but several sweep files were given; fix: "
                              "one file per command with --out, or no --out (each goes to "
                              "results/<its name>/)")
        start_jax(args)
        specs = [(f, C.load_sweep(f, C.parse_set(args.set), args.seeds)) for f in args.files]
        if any("float64" in spec.values("dtype") for _, spec in specs):
            import jax

            jax.config.update("jax_enable_x64", True)  # the CLI owns process-wide flags
        for _, spec in specs:
            out = Path(args.out) if args.out else Path("results") / spec.name
            if args.set and not args.out:
                out = out / override_slug(args.set)
            check_out_dir(out)
            if args.dry_run:
                pl = plan(spec, n_devices=args.devices, memory_budget=budget,
                          chunk_size=args.chunk_size, block_size=args.block_size)
                if not args.no_plots:
                    from .plot import check_plot_spec

                    check_plot_spec(spec, columns=traced_columns(pl))
                dry_run(spec, pl, out)
                continue
            block = dict(spec.refine)
            if args.refine:
                block["between"] = args.refine
            for k in ("rounds", "target"):
                if getattr(args, k) is not None:
                    block[k] = getattr(args, k)
            if (args.rounds is not None or args.target is not None) and not block.get(
                    "between") and not spec.refine:
                raise ConfigError("--rounds/--target refine a boundary; fix: add --refine A,B "
                                  "(e.g. --refine benign,harmful) or a [refine] block")
            if block:
                from .refine import parse_refine, refine_sweep

                r = parse_refine(spec, block, where=f"{spec.name}: ")
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
        print(f"{p.prog.split()[-1] if prog else 'phasebo.sweep'}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
