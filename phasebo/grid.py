"""The grid: a sweep's runs as settings, ids, keys and host arrays.

A cell (:class:`phasebo.config.Cell`) holds the static settings; its runs are the product of its
swept axes times the seeds, numbered by a local index ``j`` (seeds fastest, then the swept axes in
file order, the last fastest). This is the only module that turns a ``(cell, j)`` into a run's
settings: :func:`cell_runs` for its values, :func:`cell_run_ids` for its identity (from which its
key derives, :func:`phasebo.config.run_ids`), :func:`chunk_arrays` for the arrays a compiled chunk
is fed and the settings columns of its rows. Run sets are streamed in slices of :data:`SLICE`
runs, so memory stays flat in the run count.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .config import Cell, SweepSpec, key_ids, key_words, run_ids
from .registry import get_model

SLICE = 1 << 16  # runs of a cell enumerated at once (keeps the planner's memory flat)


def own_settings(cell: Cell) -> tuple:
    """``(model, the cell's settings that the model has)``."""
    model = get_model(cell.settings["model"])
    own = {k: v for k, v in cell.settings.items() if k in model.settings}
    return model, own


def shared_axis(cell: Cell) -> str | None:
    """The swept axis along which the cell's runs share their noise (``common_noise``, set as a
    constant), or None."""
    axis = cell.settings.get("common_noise", "none")
    return axis if isinstance(axis, str) and axis in cell.swept_axes else None


def cell_runs(spec: SweepSpec, cell: Cell, j: np.ndarray) -> dict:
    """Settings that vary inside ``cell`` for its local run indices ``j``: ``seed`` and one array
    per swept axis. Order: seeds fastest, then the swept axes in file order, the last fastest;
    with noise shared along an axis (:func:`shared_axis`) that axis comes first, so the runs that
    share their noise are consecutive."""
    j = np.asarray(j, np.int64)
    out = {}
    first = shared_axis(cell)
    if first is not None:
        m = len(spec.axes[first])
        out[first] = _values(spec.axes[first])[j % m]
        j = j // m
    out["seed"] = j % spec.seeds
    combo = j // spec.seeds
    rest = [a for a in cell.swept_axes if a != first]
    if rest:
        idx = np.unravel_index(combo, [len(spec.axes[a]) for a in rest])
        for a, i in zip(rest, idx):
            out[a] = _values(spec.axes[a])[i]
    return out


def _values(vals) -> np.ndarray:
    return np.asarray(vals, dtype=object if isinstance(vals[0], (tuple, str)) else None)


def cell_run_ids(spec: SweepSpec, cell: Cell, j: np.ndarray) -> np.ndarray:
    model, own = own_settings(cell)
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


def group_pieces(spec: SweepSpec, g, done: np.ndarray, share: tuple[int, int] = (0, 1)
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


def chunks(pieces: Iterator, width) -> Iterator[list]:
    """Consecutive lists of pieces holding ``width`` runs each (the last fewer). ``width``: an
    int, or a callable read at the start of every chunk (the executor sizes chunks as it
    measures them)."""
    size = width if callable(width) else (lambda: width)
    cur, n, w = [], 0, size()
    for cell, j in pieces:
        while len(j):
            take = min(w - n, len(j))
            cur.append((cell, j[:take]))
            n += take
            j = j[take:]
            if n == w:
                yield cur
                cur, n, w = [], 0, size()
    if cur:
        yield cur


def select(pieces: list, keep: np.ndarray) -> list:
    """The runs of a chunk's pieces where ``keep`` (over the chunk's runs, in order) is true."""
    out, i = [], 0
    for cell, j in pieces:
        k = keep[i:i + len(j)]
        i += len(j)
        if k.any():
            out.append((cell, j[k]))
    return out


def chunk_arrays(spec: SweepSpec, g, pieces: list, multiple: int = 1) -> tuple:
    """Host arrays of a chunk, padded to whole blocks of ``multiple``; per piece, its settings
    columns for the rows; and where each run's outputs will be.

    Run by run (``g.members == 1``): every array is ``(runs,)``, padded with the last run; the
    outputs are in run order (``slots`` None). Grouped (noise shared along ``g.axis``): the runs
    that share their key are one group of ``g.members`` slots, the axis' values ``(groups,
    members)`` and every other value ``(groups,)`` (checked equal within a group); a group short
    of members (a resumed or grown sweep) repeats its first run in the empty slots, and
    ``slots[i]`` is the output row of run ``i``."""
    arrays, cols = _run_arrays(spec, g, pieces)
    if g.members == 1:
        return _pad(arrays, multiple), cols, None
    M, axis = g.members, g.axis
    key = arrays["_hi"].astype(np.uint64) << np.uint64(32) | arrays["_lo"].astype(np.uint64)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # groups in order of their first run
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    grp = rank[inv.reshape(-1)]
    by = np.argsort(grp, kind="stable")  # runs by group, in run order inside each
    counts = np.bincount(grp, minlength=len(order))
    pos = np.empty(len(grp), np.int64)  # a run's place inside its group
    pos[by] = np.arange(len(grp)) - np.repeat(np.cumsum(counts) - counts, counts)
    if counts.max(initial=0) > M:
        raise RuntimeError(f"a noise group holds {counts.max()} runs but {axis} has {M} values")
    lead = first[order]  # the first run of each group
    out = {}
    for k, v in arrays.items():
        if k == axis:
            a = np.repeat(v[lead][:, None], M, axis=1)
            a[grp, pos] = v
        else:
            a = v[lead]
            if not np.array_equal(a[grp], v, equal_nan=v.dtype.kind == "f"):
                raise RuntimeError(f"{k} differs between runs that share their noise along "
                                   f"{axis}; it must be one value per noise group")
        out[k] = a
    return _pad(out, multiple), cols, grp * M + pos


def _pad(arrays: dict, multiple: int) -> dict:
    """Pad the leading axis to a multiple of ``multiple`` with its last entry (whole blocks:
    the compiled shape)."""
    out = {}
    for k, a in arrays.items():
        pad = -len(a) % multiple
        out[k] = np.concatenate([a, np.repeat(a[-1:], pad, axis=0)]) if pad else a
    return out


def _run_arrays(spec: SweepSpec, g, pieces: list) -> tuple[dict, list]:
    """``(arrays (runs,), cols)`` of a chunk's runs: the swept and derived values, the root
    seeds and the run-id words."""
    model = g.model
    sw_parts: dict[str, list] = {}
    cols = []
    fdt = np.float64 if g.program.dtype == "float64" else np.float32
    for cell, j in pieces:
        _, own = own_settings(cell)
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
        hi, lo = key_words(key_ids(model, own, var, seeds, ids))  # = ids unless common_noise
        sw["_hi"], sw["_lo"] = hi, lo
        for k, v in sw.items():
            sw_parts.setdefault(k, []).append(np.asarray(v))
        cols.append((own, var, seeds, ids))
    arrays = {}
    for k, v in sw_parts.items():
        a = np.concatenate(v)
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

