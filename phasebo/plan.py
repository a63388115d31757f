"""The plan: a sweep's cells grouped by compiled program, each group sized to the machine.

Each cell is resolved to its model, its engine and the engine's *program*
(:meth:`phasebo.engines.base.Engine.program`: for the reduced engine every ``d`` gives the same
program); cells that share a program form one :class:`Group`, traced and compiled once. The
compiled shape is one *block* per device (:attr:`Group.block` runs vmapped together), whatever
the sweep's size: every sweep of a program, small or large, resumed or grown, reuses one
executable (and JAX's persistent compilation cache across processes). The executor feeds a
chunk's blocks through it and writes each chunk as Parquet parts; :attr:`Group.width` is the
first chunk's size, from the engines' cost models (``cost_per_run``) and the measured throughput
:data:`RATE`, after which the executor sizes chunks by the time it measures. Block sizes come from
the engines' memory models (``bytes_per_run``) and measured hints; the same models give the dry
run's time, memory and disk estimates. No run is enumerated here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import shutil
from pathlib import Path

from .config import SweepSpec
from .grid import own_settings, shared_axis
from .registry import resolve_engine
from .settings import ConfigError

MEMORY_FRACTION = 0.5  # default fraction of free memory a sweep may plan to use
CHUNK_SECONDS = 3.0  # aim for about this much compute per chunk (progress, Ctrl-C, resume)
FIRST_CHUNK_SECONDS = 1.0  # the first chunk, sized by the cost model before any measurement
MAX_CHUNK = 65536
# Measured throughput (flop/s of each engine's cost model, 2-core CPU, `phasebo.bench`), used to
# size chunks and for the dry run's time estimates; accelerators: a conservative 20x.
RATE = {("direct", "cpu"): 2.0e10, ("gram", "cpu"): 2.0e10, ("reduced", "cpu"): 4.0e10}
COMPILE_SECONDS = 4.0  # typical trace + compile of one group on 2 cores (cold cache)


def _jax():
    import jax

    return jax


def platform_name() -> str:
    return _jax().local_devices()[0].platform


def rate(engine: str, platform: str) -> float:
    base = RATE.get((engine, "cpu"), 2e10)
    return base if platform == "cpu" else 20 * base


@dataclasses.dataclass
class Group:
    """Cells that share one compiled program."""

    model: object
    engine: object
    program: object
    cells: list
    axis: str | None = None  # noise shared along this axis, stepped together (grouped mode)
    members: int = 1  # runs per noise group (the axis' values), 1 run by run
    n_runs: int = 0
    bytes_per_run: int = 0  # per vmapped item: a run, or a noise group of `members` runs
    cost_per_run: float = 0.0
    block: int = 1  # items (runs or noise groups) vmapped together per device: compiled shape
    width: int = 1  # runs in the first chunk (a multiple of unit_runs)
    fixed: bool = False  # chunk width given by the user: not resized by measurement

    def unit_runs(self, n_dev: int) -> int:
        """Runs in one dispatch of the compiled function (a block per device)."""
        return self.block * self.members * n_dev

    @property
    def label(self) -> str:
        p = self.program
        kind = getattr(p, "dynamics", "gd")
        horizon = {"flow": "flow_time", "limit": "dynamics"}.get(kind, "steps")
        shape = ", ".join(f"{k}={getattr(p, k)}" for k in ("n", "T", horizon) if hasattr(p, k))
        if self.engine.name != "reduced" and hasattr(p, "d"):
            ds = sorted({c.settings.get("d", p.d) for c in self.cells})
            if ds and (len(ds) > 1 or ds[0] != p.d):  # d zero-padded (Gram.program)
                span = f"{ds[0]}" if len(ds) == 1 else f"{ds[0]}..{ds[-1]}"
                shape = f"d={span} padded to {p.d}, " + shape
            else:
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


def core_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The level-2 cache a CPU core has to itself in bytes (Linux sysfs: the L2 of cpu0 divided
    among the logical CPUs that share it, hyperthreads or a cluster), or None where it cannot be
    read. The reduced engine sizes its CPU blocks by it (:meth:`phasebo.engines.base.Reduced.block_size`)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for index in sorted(Path(root).glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):  # unreadable, or not text
            continue
        if level != "2" or kind not in ("Data", "Unified") or not size:
            continue
        try:
            n = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        except ValueError:
            return None
        return n // _cpu_count(index / "shared_cpu_list")
    return None


def _cpu_count(path: Path) -> int:
    """The logical CPUs of a sysfs CPU list ("0-1,4"); 1 where it cannot be read."""
    try:
        text = path.read_text().strip()
        total = 0
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            total += int(hi or lo) - int(lo) + 1
        return max(total, 1)
    except (OSError, ValueError):
        return 1


def size_text(n_bytes: float) -> str:
    """Bytes in the largest binary unit that keeps them >= 1 (KiB at least): 1.5 GiB, 12 KiB."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n_bytes >= 2**shift:
            return f"{n_bytes / 2**shift:.3g} {unit}"
    return f"{n_bytes / 2**10:.3g} KiB"


def size_group(g: Group, n_dev: int, budget: int, platform: str, chunk_size=None,
               block_size=None, l2: int | None = None) -> None:
    """Block (runs vmapped together per device) and chunk width of a group; ``l2``: a CPU
    core's level-2 cache in bytes (:func:`core_cache_bytes`), None where unknown."""
    per_dev = budget / n_dev
    if g.bytes_per_run > per_dev:
        p = g.program
        what = "one run" if g.members == 1 else f"one noise group ({g.members} runs)"
        shape = ", ".join(f"{k} = {getattr(p, k)}" for k in ("d", "n", "T", "n_test")
                          if hasattr(p, k))
        d_max = max((c.settings.get("d", 0) for c in g.cells), default=0)
        if hasattr(p, "d") and 0 < d_max < p.d:  # sized by its zero-padded program
            shape = shape.replace(f"d = {p.d}", f"d = {d_max} run padded to {p.d}", 1)
        elif hasattr(p, "d") and d_max > p.d:  # an engine that steps in the span of the data
            shape = shape.replace(f"d = {p.d}", f"d = {d_max} run in {p.d} span coordinates", 1)
        projected = getattr(p, "test_mode", "projected") == "projected"  # nothing to switch to
        raise ConfigError(
            f"{what} of {g.model.name} needs about {size_text(g.bytes_per_run)} ({shape}) but the "
            f"memory budget is {size_text(per_dev)} per device; fix: lower d, n or n_test, "
            + ("" if projected else "use test_mode = \"projected\", ") + "or raise --memory-budget")
    hint = block_size or (g.engine.block_size(g.model, g.program, platform, l2) if g.members == 1
                          else g.engine.group_block_size(g.model, g.program, platform, g.members))
    g.block = max(1, min(hint, int(per_dev // max(g.bytes_per_run, 1))))
    if chunk_size is not None:  # a forced chunk smaller than a block shrinks the block
        g.block = max(1, min(g.block, chunk_size // (n_dev * g.members)))
    unit = g.unit_runs(n_dev)
    whole = unit * math.ceil(g.n_runs / unit)  # the group in whole blocks
    if chunk_size is not None:
        g.fixed = True
        width = unit * math.ceil(max(1, chunk_size) / unit)
    else:
        seconds = g.cost_per_run / rate(g.engine.name, platform)
        width = unit * max(1, int(FIRST_CHUNK_SECONDS * n_dev / max(seconds, 1e-9)) // unit)
    g.width = max(unit, min(width, unit * (MAX_CHUNK // unit or 1), whole))


def next_width(g: Group, n_dev: int, n_runs: int, seconds: float) -> int:
    """The next chunk's width once a chunk of ``n_runs`` runs took ``seconds`` to compute:
    about :data:`CHUNK_SECONDS` of work, in whole blocks."""
    unit = g.unit_runs(n_dev)
    if g.fixed or seconds <= 0:
        return g.width
    k = int(CHUNK_SECONDS * n_runs / seconds) // unit
    return unit * max(1, min(k, MAX_CHUNK // unit or 1))


def _coinciding(spec: SweepSpec, i: int, j: int) -> str:
    """Why cells ``i`` and ``j`` are one: the cases they come from, once the overrides applied."""
    per_case = len(list(spec.cells())) // max(len(spec.cases), 1)
    ci, cj = i // per_case + 1, j // per_case + 1
    if ci != cj:
        a, b = spec.cases[ci - 1], spec.cases[cj - 1]
        what = f"they are {a} and {b}" if a or b else "--set overrides every setting they vary"
        return (f"[[cases]] #{ci} and #{cj} are the same runs once --set is applied ({what}); "
                "fix: drop the --set of a setting the cases vary, or one of the cases")
    return (f"two cells of the grid are the same runs (cells {i + 1} and {j + 1}); fix: give each "
            "axis distinct values")


def _same_runs(a: dict, b: dict) -> str:
    """Why two cells that differ only in settings outside a run's identity are refused."""
    diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    vals = "; ".join(f"{k} = {a.get(k)!r} and {b.get(k)!r}" for k in diff)
    how = (" (an engine is how a run is computed, not which run: the reduced engine draws the "
           "same run's noise from its Wishart law, so its numbers differ)" if "engine" in diff
           else "")
    return (f"two cells differ only in {', '.join(diff)} ({vals}), which are not part of a run's "
            f"identity{how}: their runs have the same ids and keys, and one directory holds each "
            f"run once; fix: run each value into its own --out (e.g. --set {diff[0]}={b.get(diff[0])}"
            " --out results/<name>-<value>) and pb.load([...]) them together")


def plan(spec: SweepSpec, *, n_devices: int | None = None, memory_budget: int | None = None,
         chunk_size: int | None = None, block_size: int | None = None) -> Plan:
    """Group the cells by compiled program and size every group (no run is enumerated)."""
    for name, v in (("chunk_size", chunk_size), ("block_size", block_size),
                    ("memory_budget", memory_budget), ("n_devices", n_devices)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1):
            raise ConfigError(f"{name} = {v!r}: expected a whole number of at least 1"
                              + (" (bytes, e.g. 8 * 2**30)" if name == "memory_budget" else "")
                              + f"; fix: {name}=None to size it automatically")
    jax = _jax()
    n_avail = len(jax.local_devices())
    n_dev = max(1, min(n_devices or n_avail, n_avail))
    budget = memory_budget or int(MEMORY_FRACTION * free_memory_bytes())
    plat = platform_name()
    l2 = core_cache_bytes() if plat == "cpu" else None
    groups: dict[tuple, Group] = {}
    per_cell = spec.runs_per_cell()
    seen: dict[str, int] = {}
    same_id: dict[str, dict] = {}
    for i, cell in enumerate(spec.cells()):
        model, own = own_settings(cell)
        same = seen.setdefault(json.dumps(own, sort_keys=True, default=repr), i)
        if same != i:
            raise ConfigError(_coinciding(spec, same, i))
        ident = {k: v for k, v in own.items() if model.settings[k].identity}
        first = same_id.setdefault(json.dumps([model.name, ident], sort_keys=True, default=repr),
                                   own)
        if first is not own:  # the same runs (ids, keys, numbers) under another name
            raise ConfigError(_same_runs(first, own))
        for a in cell.swept_axes:  # an axis swept inside the cell that changes no run: likewise
            vals = spec.axes.get(a, ())
            if a in model.settings and not model.settings[a].identity and len(vals) > 1:
                raise ConfigError(
                    f"{a} = {vals!r} as an axis changes no run (the runs of its values are the "
                    "same runs: same ids, data and keys) and one directory holds each run once; "
                    f"fix: one value per sweep (--set {a}=<value>, each into its own --out), "
                    f"or the loaded runs' regimes again with pb.classify_regime(..., {a}=...)"
                    if a in ("test_eps", "train_acc_fit") else
                    f"fix: one value per sweep (--set {a}=<value>, each into its own --out)")
        # (beside GD cells that need it, an lr axis is the sweep's: those are told by their maps)
        if own.get("dynamics") == "flow" and len(spec.axes.get("lr", ())) > 1 and \
                {str(v) for v in spec.values("dynamics")} == {"flow"}:
            raise ConfigError(
                f"lr = {spec.axes['lr']!r} as an axis of a gradient flow: the flow does not "
                "depend on lr, which only sets the unit of its GD-equivalent steps (step = tau / "
                "lr), so its runs would differ by their step labels and their data alone; fix: one "
                "lr (--set lr=<value>), and flow_time for the horizon")
        static = model.static_of(own)
        engine = resolve_engine(model, static)
        program = engine.program(model, static)
        axis = shared_axis(cell) if engine.steps_shared_noise else None
        members = len(spec.axes[axis]) if axis else 1
        if members == 1:  # one value: nothing to step together; its key is still the group's
            axis = None
        key = (model.name, engine.name, program, axis, members)
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(model, engine, program, [], axis, members)
        g.cells.append(cell)
        g.n_runs += per_cell
        # sized as the program runs (the gram engine's arrays are as wide as its padded d)
        item = engine.bytes_per_run(model, program)
        if members > 1:  # the shared part once, each member's own part
            item += (members - 1) * engine.member_bytes(model, program)
        g.bytes_per_run = max(g.bytes_per_run, item)
        cost = engine.cost_per_run(model, program)
        if members > 1:  # what a run shares with its group counted once per group
            own = engine.member_cost(model, program)
            cost = own + (cost - own) / members
        g.cost_per_run = max(g.cost_per_run, cost)
    out = list(groups.values())
    for g in out:
        size_group(g, n_dev, budget, plat, chunk_size, block_size, l2)
    return Plan(spec, out, n_dev, budget, plat)



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
        n_rec = g.model.n_records(p)
        T = getattr(p, "T", 8)
        total += g.n_runs * (400 + n_rec * (60 + 4 * T) * 8 + p.n * 40)
    return int(total)



def fmt_time(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def describe(pl: Plan, out: Path) -> str:
    """The dry run's text: per group the engine, runs, memory and time; the totals."""
    spec = pl.spec
    lines = [f"{spec.name}: {spec.n_runs} runs in {len(pl.groups)} compiled group(s) on "
             f"{pl.n_dev} {pl.platform} device(s); output {out}"]
    total_t = 0.0
    for g in pl.groups:
        t = g.n_runs * g.cost_per_run / (rate(g.engine.name, pl.platform) * pl.n_dev)
        total_t += t + COMPILE_SECONDS
        block = f"{g.block}" if g.members == 1 else \
            f"{g.block} noise group(s) of {g.members} runs (shared along {g.axis})"
        # a Cell holds every combination of the swept (traced) axes: count grid points
        points = g.n_runs // max(spec.seeds, 1)
        lines.append(f"  {g.label}: {g.n_runs} runs in {points} cell(s); block {block}, "
                     f"first chunk {g.width}; memory ~{g.block * g.bytes_per_run / 2**20:.1f} MiB per "
                     f"device; ~{fmt_time(t)}")
    lines.append(f"  estimated time ~{fmt_time(total_t)} (cost model of `phasebo bench`), tables "
                 f"~{estimated_disk(pl) / 2**20:.1f} MiB on disk, memory budget "
                 f"{pl.budget / 2**30:.1f} GiB ({size_text(pl.budget / pl.n_dev)} per device)")
    for note in dict.fromkeys(filter(None, (g.model.setup_note(g.program) for g in pl.groups))):
        lines.append(f"  plus: {note}")
    if any(getattr(g.program, "dynamics", "gd") == "flow" for g in pl.groups):
        # the solver's steps are set by the flow's stiffness, unknown before it runs
        lines.append("  a flow's time is its solver's steps, which the estimate takes as ~30 per "
                     "decade of flow time: a stiff flow (large signal, weight decay) can take "
                     "10x longer")
    return "\n".join(lines)
