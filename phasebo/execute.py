"""Execution: each group's compiled block function, the chunk loop, progress and one run.

A group's compiled function takes one block per local device (:attr:`phasebo.plan.Group.block`
runs, vmapped; the devices through ``shard_map``), so its shape does not depend on the sweep: a
small study of an already-compiled program compiles nothing. The runs go through it in host
chunks: a chunk's blocks are dispatched a few at a time (the device never waits for the host) and
its rows (:func:`phasebo.results.rows`) written at once as Parquet parts (atomic rename), samples
and dynamics before results: a results part marks its runs as done. The first chunk's size comes
from the cost model (:func:`phasebo.plan.size_group`); every later one from the time the previous
one took (:func:`phasebo.plan.next_width`), so progress, saving and Ctrl-C come every few seconds
on any machine. A Ctrl-C stops dispatching, saves the blocks already computed and stops.

The block function is one module-level ``jax.jit`` with the model, engine, program, block and
device count as static arguments, so JAX's own caches reuse its trace and executable across
sweeps in one process; nothing here keeps state between calls. An :class:`Executor` counts what
it traced (the block function's Python body runs only on a real trace) and compiled (JAX's
backend-compile events).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import itertools
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from . import config as C
from .config import key_ids, key_words
from .grid import chunk_arrays, chunks, group_pieces, select
from .interrupt import Background, in_worker, interruptible
from .plan import next_width
from .registry import get_model, resolve_engine
from .results import done_run_ids, output_columns, rows, write_table_atomic
from .settings import SHAPES_ONLY, ConfigError

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
IN_FLIGHT = 2  # blocks dispatched ahead of the one being waited for
# Where a trace of the block function reports itself: the executor lowering it sets a counter for
# the duration of the lowering (a trace runs the Python body; a cache hit does not).
_TRACE_SINK: contextvars.ContextVar = contextvars.ContextVar("phasebo_trace_sink", default=None)


def _jax():
    import jax

    return jax


def _one_run(a, model, engine, program):
    """One run from its chunk row: the key from the run-id words, the rest its swept values."""
    sw = {n: v for n, v in a.items() if n not in ("root_seed", "_hi", "_lo")}
    return engine.run(model, program, sw, C.run_key(a["root_seed"], a["_hi"], a["_lo"]))


def _one_group(a, model, engine, program, axis: str):
    """The runs of one noise group: one key, ``a[axis]: (members,)``, every other value shared.
    vmapped over the axis alone, so everything drawn from the key (the noise, its Gram, W_0) is
    computed once and the engine's products with it batch into matrix products."""
    jax = _jax()
    k = C.run_key(a["root_seed"], a["_hi"], a["_lo"])
    shared = {n: v for n, v in a.items() if n not in ("root_seed", "_hi", "_lo", axis)}
    return jax.vmap(lambda v: engine.run(model, program, {**shared, axis: v}, k, grouped=True))(
        a[axis])


def _block(arrays, model, engine, program, block: int, n_dev: int, axis: str | None = None):
    """``arrays (block * n_dev, ...) -> RunOutput``, a row per run: a vmapped block of ``block``
    runs (noise groups with ``axis``: rows group-major) on each of ``n_dev`` devices."""
    jax = _jax()
    sink = _TRACE_SINK.get()
    if sink is not None:  # runs at trace time only
        sink[0] += 1

    def local(a):
        if axis is None:
            return jax.vmap(lambda r: _one_run(r, model, engine, program))(a)
        out = jax.vmap(lambda r: _one_group(r, model, engine, program, axis))(a)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    if n_dev == 1:
        return local(arrays)
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.local_devices()[:n_dev]), ("runs",))
    return jax.shard_map(local, mesh=mesh, in_specs=(P("runs"),), out_specs=P("runs"),
                         check_vma=False)(arrays)


def _concat(outs: list):
    """Host outputs of consecutive blocks joined along the run axis."""
    if len(outs) == 1:
        return outs[0]
    return _jax().tree.map(lambda *xs: np.concatenate(xs), *outs)


@contextlib.contextmanager
def count_compiles(this_thread: bool = False):
    """Count JAX's backend compilations (of any function) while the block runs:
    ``{"compiles": n}``; with ``this_thread``, only those of the calling thread (JAX reports a
    compile in the thread that compiles: a program compiling beside the runs is not charged
    with what the main thread compiles meanwhile)."""
    import jax.monitoring as mon

    seen = {"compiles": 0}
    me = threading.get_ident()

    def listen(event, duration, **kw):
        if event == COMPILE_EVENT and (not this_thread or threading.get_ident() == me):
            seen["compiles"] += 1

    mon.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        mon.unregister_event_duration_listener(listen)


@dataclasses.dataclass
class Stats:
    n_new: int = 0
    compile_s: float = 0.0  # waited for compiling
    setup_s: float = 0.0  # the models' one-off work before tracing (Model.setup: pretraining)
    compile_beside_s: float = 0.0  # compiled beside the runs (not waited for)
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


def _program_key(g, n_dev: int) -> tuple:
    return (g.model.name, g.engine.name, g.program, g.block, n_dev, g.axis, g.members)


class Executor:
    """Runs a plan's runs not yet in a directory's parts, chunk by chunk. ``traces`` / ``compiles``:
    per program key ``(model, engine, program, block, devices)``, the traces and backend
    compilations this executor caused (0 where JAX's caches had the program)."""

    def __init__(self):
        self.traces: collections.Counter = collections.Counter()
        self.compiles: collections.Counter = collections.Counter()

    def lower(self, g, arrays: dict, n_dev: int):
        """The group's block function lowered for one block per device of ``arrays``' dtypes
        (traced, not compiled)."""
        jax = _jax()
        # a new jit wrapper of the same function shares JAX's trace and executable caches
        fn = jax.jit(_block, static_argnames=("model", "engine", "program", "block", "n_dev",
                                              "axis"))
        unit = g.block * n_dev
        shapes = {n: jax.ShapeDtypeStruct((unit,) + v.shape[1:], v.dtype)
                  for n, v in arrays.items()}
        sink = [0]
        token = _TRACE_SINK.set(sink)
        try:
            with tracing(g.program):
                lowered = fn.lower(shapes, model=g.model, engine=g.engine, program=g.program,
                                   block=g.block, n_dev=n_dev, axis=g.axis)
        finally:
            _TRACE_SINK.reset(token)
        self.traces[_program_key(g, n_dev)] += sink[0]
        return lowered

    def compile(self, g, lowered, n_dev: int):
        with count_compiles(this_thread=True) as seen:
            compiled = lowered.compile()
        self.compiles[_program_key(g, n_dev)] += seen["compiles"]
        return compiled

    @staticmethod
    def compute(compiled, arrays: dict, unit: int, stop=None, done=None) -> tuple:
        """``(host outputs, items computed)`` of a chunk's arrays (a multiple of ``unit`` items:
        runs, or noise groups) through a compiled block function, :data:`IN_FLIGHT` blocks
        dispatched ahead; ``stop()`` true before a dispatch ends the chunk early (the blocks
        already dispatched finish); ``done(unit)`` is called as each block's outputs arrive
        (progress)."""
        jax = _jax()
        n = len(next(iter(arrays.values())))
        outs, pending = [], collections.deque()
        for i in range(0, n, unit):
            if stop is not None and stop():
                break
            pending.append(compiled({k: v[i:i + unit] for k, v in arrays.items()}))
            if len(pending) > IN_FLIGHT:
                outs.append(jax.device_get(pending.popleft()))
                if done is not None:
                    done(unit)
        for out in pending:
            outs.append(jax.device_get(out))
            if done is not None:
                done(unit)
        return (_concat(outs) if outs else None), len(outs) * unit

    def execute(self, pl, out_dir: Path, *, quiet: bool = False, max_chunks: int | None = None,
                share: tuple[int, int] = (0, 1), check_columns=None) -> Stats:
        """Run every run of the plan not already in ``out_dir``'s parts (this process's share).

        Every group with work is traced first (``check_columns``: then called with the union of
        the traced results columns, before anything runs), then compiled and run group by group.
        """
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
            width = [g.width]  # the chunk loop resizes it as it measures
            stream = chunks(group_pieces(spec, g, done, share), lambda w=width: w[0])
            first = next(stream)
            t_setup = time.perf_counter()
            g.model.setup(g.program)  # timed apart from compiling
            stats.setup_s += time.perf_counter() - t_setup
            prepared = chunk_arrays(spec, g, first, g.block * pl.n_dev)
            lowered = self.lower(g, prepared[0], pl.n_dev)
            columns |= output_columns(g.model, lowered.out_info)
            active.append((g, n_todo, lowered, width,
                           itertools.chain([(first, *prepared)], stream)))
        stats.compile_s += time.perf_counter() - t - stats.setup_s
        if check_columns is not None and active:
            check_columns(columns)
        try:
            with interruptible() as interrupted:
                self._chunk_loop(spec, pl.n_dev, active, parts, stats, bar, max_chunks,
                                 interrupted)
        except KeyboardInterrupt as e:
            e.stats = stats  # what was saved before the stop: the manifest's history says it
            raise
        return stats

    def _chunk_loop(self, spec, n_dev, active, parts, stats, bar, max_chunks, interrupted) -> None:
        """Compile each group, then run its chunks, writing every chunk's parts as it finishes
        and sizing the next chunk by the time this one took."""
        ahead = None  # the next group's compile, started beside this group's runs
        try:
            for k, (g, n_todo, lowered, width, stream) in enumerate(active):
                unit = g.block * n_dev
                block = f"{g.block}" if g.members == 1 else \
                    f"{g.block} noise group(s) of {g.members} runs"
                ready = ahead is not None and ahead.done.is_set()
                # in a worker, as a chunk: a Ctrl-C is answered at once, and JAX's compile is
                # never cut half way (a KeyboardInterrupt raised inside it made the process
                # crash at exit), a first one stops the sweep when it returns. Marked before the
                # line that announces it, so a Ctrl-C right after that line is answered so too.
                interrupted.compiling = True
                try:
                    bar.say(f"{'group' if ready else 'compiling group'} {k + 1}/{len(active)}: "
                            f"{g.label}, {n_todo} runs, block {block} x {n_dev} device(s), first "
                            f"chunk {g.width}" + (" (compiled beside the previous group's runs)"
                                                  if ready else ""))
                    if interrupted.stop:
                        raise KeyboardInterrupt
                    t = time.perf_counter()
                    if ahead is None:
                        compiled = in_worker(self.compile, g, lowered, n_dev)
                    else:
                        compiled = ahead.result()
                        stats.compile_beside_s += max(0.0, ahead.seconds
                                                      - (time.perf_counter() - t))
                        ahead = None
                finally:
                    interrupted.compiling = False
                stats.compile_s += time.perf_counter() - t
                if interrupted.stop:
                    raise KeyboardInterrupt
                if k + 1 < len(active):  # the compile and the runs share the cores, so this
                    # saves less than the compile takes (the trained-W map when it had 39
                    # programs, 2 cores: 445 -> 408 s whole process). Compiling 4 at once beside
                    # an H200's runs (16 host cores) did not help: the trained-W map (16
                    # programs), 133 s one at a time, was not done after 150 s
                    nxt = active[k + 1]
                    ahead = Background(self.compile, nxt[0], nxt[2], n_dev)
                bar.resume()
                for item in stream:
                    if interrupted.stop:
                        raise KeyboardInterrupt
                    if max_chunks is not None and stats.chunks >= max_chunks:
                        stats.stopped = True
                        return
                    pieces, arrays, cols, slots = item if isinstance(item, tuple) else \
                        (item, *chunk_arrays(spec, g, item, unit))
                    n_real = sum(len(j) for _, j in pieces)
                    left = [n_real]

                    def tick(m, left=left, per=g.members):  # real runs, not the padding
                        m *= per
                        bar.update(min(m, left[0]))
                        left[0] -= min(m, left[0])

                    t = time.perf_counter()
                    interrupted.saving = True  # a Ctrl-C from here on stops after the writes
                    interrupted.computing = True
                    try:
                        out, m = in_worker(self.compute, compiled, arrays, unit,
                                            lambda: interrupted.stop, tick)
                    finally:
                        interrupted.computing = False
                    # the rows computed, in run order: padding dropped, noise groups unfolded
                    slot = np.arange(n_real) if slots is None else slots
                    kept = slot < m * g.members
                    if out is not None and slots is not None:
                        out = _jax().tree.map(lambda x, i=slot[kept]: np.asarray(x)[i], out)
                    if not kept.all():  # stopped early: keep the blocks that were computed
                        cols = chunk_arrays(spec, g, select(pieces, kept), unit)[1] \
                            if kept.any() else []
                    width[0] = next_width(g, n_dev, int(kept.sum()), time.perf_counter() - t)
                    if cols:
                        self._write(spec, g, cols, out, parts, stats)
                    interrupted.saving = False
                    stats.run_s += time.perf_counter() - t
            if interrupted.stop:
                raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            # a compile still running in its (non-daemon) thread: the command leaves with
            # os._exit once everything is saved; Python waits for it at a normal exit
            e.compile_in_flight = ahead is not None and not ahead.done.is_set()
            raise
        finally:
            bar.close()

    @staticmethod
    def _write(spec, g, cols, out, parts: Path, stats: Stats) -> None:
        res, dyn, smp = rows(spec, g, cols, out)
        first_id, last_id = res["run_id"].iloc[0], res["run_id"].iloc[-1]
        tag = f"{first_id:019d}-{last_id:019d}-{stats.chunks:06d}-{os.getpid()}.parquet"
        # samples and dynamics first: a results part marks the runs as done
        if dyn is not None:
            write_table_atomic(dyn, parts / f"dynamics-{tag}")
        if smp is not None:
            write_table_atomic(smp, parts / f"samples-{tag}")
        write_table_atomic(res, parts / f"results-{tag}")
        stats.chunks += 1
        stats.n_new += len(res)


def traced_columns(pl) -> set[str]:
    """The results columns of every group of plan ``pl``, from an abstract trace of one run (no
    compilation)."""
    jax = _jax()
    cols: set[str] = set()
    token = SHAPES_ONLY.set(True)  # a dry run computes nothing: no pretraining for a shape
    try:
        for g in pl.groups:
            arrays = chunk_arrays(pl.spec, g, [(g.cells[0], np.arange(1))], 1)[0]
            one = {k: jax.ShapeDtypeStruct((), v.dtype) for k, v in arrays.items()}
            out = jax.eval_shape(lambda a, g=g: _one_run(a, g.model, g.engine, g.program), one)
            cols |= output_columns(g.model, out)
    finally:
        SHAPES_ONLY.reset(token)
    return cols


def need_x64(dtypes) -> None:
    """Refuse ``dtype = "float64"`` while 64-bit JAX is off: JAX would compute in float32 and
    the results would say float64."""
    if "float64" in dtypes and not _jax().config.jax_enable_x64:
        raise ConfigError("dtype = \"float64\" needs 64-bit JAX; fix: run through `python -m "
                          "phasebo.sweep` (it enables it), or jax.config.update(\"jax_enable_x64\", "
                          "True) before the first run (or JAX_ENABLE_X64=1)")


def prepare_one(settings: dict | None = None, *, seed: int = 0, key=None, **kw):
    """``(model, engine, program, swept values, key)`` of one run from a settings dict (its
    model's defaults filled in, validated as a sweep would); ``key`` overrides the
    identity-derived key ``fold_in(fold_in(PRNGKey(root_seed), hi32), lo32)`` of its run id."""
    jax = _jax()
    given = {**(settings or {}), **kw}
    for k, v in given.items():
        if isinstance(v, list | np.ndarray) and C._setting(k, "").type not in (tuple, "ints"):
            raise ConfigError(f"{k} = {v!r}: one run takes one value; fix: {k} = {v[0]!r}, or "
                              f"sweep it: pb.spec_from_dict(settings, {{{k!r}: {list(v)!r}}}) "
                              "and pb.run_sweep")
    given = {k: C._setting(k, "").coerce(v) for k, v in given.items()}
    own = C.check_cell(C.resolve(given), given)
    model = get_model(own["model"])
    static = model.static_of(own)
    need_x64([static.dtype])
    engine = resolve_engine(model, static)
    program = engine.program(model, static)
    sw = {k: np.asarray([own[k]], np.float64) for k in model.swept}
    sw.update(model.derived(static, sw))
    fdt = np.float64 if static.dtype == "float64" else np.float32
    sw = {k: jax.numpy.asarray(v[0], np.int32 if np.issubdtype(np.asarray(v).dtype, np.integer)
                               else fdt) for k, v in sw.items()}
    if key is None:
        hi, lo = key_words(key_ids(model, own, {}, np.asarray([seed])))
        key = C.run_key(own["root_seed"], int(hi[0]), int(lo[0]))
    return model, engine, program, sw, key


def matmul_precision(program) -> str:
    """The precision a program's matrix products are traced with: its ``matmul_precision``
    setting (default ``"highest"``: full float32 products on every device, whatever JAX's own
    default is).

    JAX's default lets a GPU round float32 products' operands to TF32 (10 mantissa bits).
    Measured on an H200 (the p-only map, 152,100 runs, noise shared along ||mu||): with it 35 -
    36 runs (two runs) took another regime than on the CPU and 118 - 122 another train accuracy,
    losses up to 1.7 % apart; with ``"highest"`` every regime, train and test accuracy equals
    the CPU's (losses within 1e-4 relative), at more compile time there (19.5 s against 12.1 s
    for the map's one program). On a CPU it changes nothing (the same numbers, bit for bit)."""
    return getattr(program, "matmul_precision", "highest")


@contextlib.contextmanager
def tracing(program):
    """What a program is traced and lowered under: its :func:`matmul_precision`, and Threefry
    unrolled on the CPU (:mod:`phasebo.threefry`: the same random bits, drawn ~3.5x faster)."""
    from .threefry import unroll_threefry_cpu

    unroll_threefry_cpu()
    with _jax().default_matmul_precision(matmul_precision(program)):
        yield


def _run(sw, key, model, engine, program):
    return engine.run(model, program, sw, key)


def run_one(settings: dict | None = None, *, seed: int = 0, key=None, **kw):
    """One run (jitted, one compilation per program): ``RunOutput(final, dynamics, samples)``.
    See :func:`prepare_one` for the arguments. Recorded dynamics carry their ``step`` and
    ``time`` (as the dynamics table's columns)."""
    jax = _jax()
    model, engine, program, sw, key = prepare_one(settings, seed=seed, key=key, **kw)
    fn = jax.jit(_run, static_argnames=("model", "engine", "program"))
    with tracing(program):
        out = fn(sw, key, model=model, engine=engine, program=program)
    rec = model.recorded_steps(program)
    if out.dynamics and "step" not in out.dynamics and rec:  # GD: the static recorded steps
        step = np.asarray(rec, np.int32)
        lr = float(sw["lr"]) if "lr" in sw else np.nan
        out = out._replace(dynamics={**out.dynamics, "step": step, "time": step * lr})
    return out
