"""Adaptive refinement: spend runs where a phase boundary lies, not across the whole grid.

Round 0 runs the sweep file's grid (a coarse one). Each later round estimates the boundary
between ``A`` and ``B`` along ``x`` for every value of ``y`` (:func:`phasebo.boundaries`) and, for
each slice whose boundary interval is wider than ``target`` (relative: ``(hi - lo) / boundary``),

- while the grid does not resolve the transition there (status ``separated`` or ``unresolved``:
  the regime changes between two neighbouring ``x`` values), adds the midpoints (geometric on a
  log axis) of the gaps inside the interval — bisection between disagreeing neighbours, at most
  ``max_points`` per slice;
- once it does, adds seeds at the two sampled points either side of the boundary instead, as
  many as the interval needs to reach the target (its width falls as one over the square root of
  the runs), at most twice those already there; each batch of seeds has its own ``root_seed``, so they
  are fresh independent runs.

A round is an ordinary sweep in ``<out>/round-<r>/`` (resumable, same schema); its plan depends only
on the results of the rounds before it, so a killed refinement resumes where it stopped by running
the same command. ``<out>/results.parquet`` / ``.csv`` hold every round's runs with a ``round``
column, ``<out>/boundaries.parquet`` / ``.csv`` the final boundaries, and the figures draw the
refined (non-uniform) grid with the boundary and its band on top.

Sweep-file block (or ``--refine A,B --rounds K --target F`` on the command line)::

    [refine]
    between = ["benign", "harmful"]   # the two regimes whose boundary is wanted
    x = "signal_norm"                 # the axis the boundary is located along
    y = "d"                           # the slice axis (one boundary per value)
    rounds = 3                        # refinement rounds after the coarse grid
    target = 0.05                     # stop refining a slice when (hi - lo) / boundary <= target
    max_points = 2                    # new x values per slice per round
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from . import config as C
from .boundaries import boundaries, bounded
from .regimes import REGIME_ORDER
from .results import write_csv_atomic
from .scaling import power_law_row, summary
from .settings import ConfigError, suggest
from .store import (
    TABLES,
    clear_boundaries,
    clear_derived,
    hold_dir,
    holds_runs,
    is_boundary_file,
    is_subset,
    read_manifest,
    said_cleared,
    tables_digest,
)

REFINE_KEYS = {"between": list, "x": str, "y": str, "rounds": int, "target": float,
               "max_points": int, "seeds": int}


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# each key's kind: (is the value of it, what it is, an example)
KINDS = {int: (lambda v: _number(v) and isinstance(v, int), "a whole number", "3"),
         float: (_number, "a number", "0.05"),
         list: (lambda v: isinstance(v, list | str), "two regimes", '["benign", "harmful"]'),
         str: (lambda v: isinstance(v, str), "an axis name", '"d"')}


@dataclasses.dataclass(frozen=True)
class Refinement:
    between: tuple[str, str]
    x: str
    y: str
    rounds: int = 3
    target: float = 0.05
    max_points: int = 2
    seeds: int | None = None  # seeds per new point (default: the sweep's)


def parse_refine(spec: C.SweepSpec, block: dict, where: str = "") -> Refinement:
    """A validated :class:`Refinement` from a ``[refine]`` block (merged with command-line flags)."""
    for k in block:
        if k not in REFINE_KEYS:
            raise ConfigError(f"{where}[refine] {k} is not a refinement key; keys: "
                              f"{', '.join(REFINE_KEYS)}")
        v = block[k]
        is_kind, what, eg = KINDS[REFINE_KEYS[k]]
        if not is_kind(v) and not (k == "seeds" and v is None):
            raise ConfigError(f"{where}[refine] {k} = {v!r} is not {what}; fix: e.g. {k} = {eg}")
    between = block.get("between", ["benign", "harmful"])
    if isinstance(between, str):
        between = [b.strip() for b in between.split(",")]
    if not (isinstance(between, list) and len(between) == 2 and between[0] != between[1]):
        raise ConfigError(f"{where}[refine] between = {between!r} must name two different regimes, "
                          "e.g. [\"benign\", \"harmful\"]")
    for b in between:  # before any run, not after the first round
        if b not in REGIME_ORDER:
            raise ConfigError(f"{where}[refine] between = {between!r}: {b!r} is not a regime"
                              f"{suggest(b, REGIME_ORDER)}; regimes: {', '.join(REGIME_ORDER)}")
    axes = [a for a, v in spec.axes.items() if len(v) > 1]
    x, y = block.get("x"), block.get("y")
    if x is not None and y is None and len(axes) == 2 and x in axes:  # the other axis
        y = next(a for a in axes if a != x)
    if x is None or y is None:
        from .report import default_heatmap_axes

        dx = default_heatmap_axes(spec) or (None, None)
        x, y = x or dx[0], y or dx[1]
    for name, v in (("x", x), ("y", y)):
        if v not in axes:
            raise ConfigError(f"{where}[refine] {name} = {v!r} must be an axis of the sweep with "
                              f"several values (it has {', '.join(axes) or 'none'})")
    if x == y:
        raise ConfigError(f"{where}[refine] x and y are both {x!r}; fix: two different axes")
    extra = [a for a in axes if a not in (x, y)]
    if extra or len(spec.cases) > 1:
        raise ConfigError(f"{where}[refine] refines one (x, y) map, but the sweep also varies "
                          f"{', '.join(extra) or 'its [[cases]]'}; fix: fix those settings (one "
                          "refined sweep per value)")
    num = [float(v) for v in spec.axes[x] if isinstance(v, int | float)]
    if len(num) != len(spec.axes[x]):
        raise ConfigError(f"{where}[refine] x = {x!r} must be a numeric axis")
    r = Refinement(between=(str(between[0]), str(between[1])), x=x, y=y,
                   rounds=int(block.get("rounds", 3)), target=float(block.get("target", 0.05)),
                   max_points=int(block.get("max_points", 2)), seeds=block.get("seeds"))
    if r.rounds < 0:
        raise ConfigError(f"{where}[refine] rounds = {r.rounds} must be >= 0; fix: e.g. rounds = 3")
    if not r.target > 0:
        raise ConfigError(f"{where}[refine] target = {r.target} must be > 0 (a relative width); "
                          "fix: e.g. target = 0.05")
    if r.max_points < 1:
        raise ConfigError(f"{where}[refine] max_points = {r.max_points} must be >= 1; fix: e.g. "
                          "max_points = 2")
    if r.seeds is not None and int(r.seeds) < 1:
        raise ConfigError(f"{where}[refine] seeds = {r.seeds} must be >= 1; fix: e.g. seeds = 10, "
                          "or leave it out (the sweep's seeds)")
    return r


def _mid(a: float, b: float, log: bool, integer: bool):
    m = float(np.sqrt(a * b)) if log else (a + b) / 2
    return int(round(m)) if integer else round(m, 10)


def plan_round(df: pd.DataFrame, r: Refinement, base_root_seed: int, rnd: int,
               integer_x: bool, seeds: int) -> tuple[list[dict], pd.DataFrame]:
    """The cases of round ``rnd`` (new ``(x, y)`` points, or more seeds at existing ones) from the
    runs so far, and the boundaries they were planned from."""
    with warnings.catch_warnings():  # a round without one of the regimes says so in its line
        warnings.filterwarnings("ignore", "boundaries: no run is")
        b = boundaries(df, r.x, r.y, r.between)
    log = bool((df[r.x] > 0).all())
    cases: list[dict] = []
    for _, row in b.iterrows():
        if str(row["status"]) not in ("ok", "unresolved", "separated", "unbounded"):
            continue
        # an unbounded interval is no width at all (too few seeds, or none of them spread; or
        # open, reaching 0 on a log axis): more seeds or points, whatever its lo and hi say
        width = np.inf if str(row["status"]) == "unbounded" or not bounded(
            row["lo"], row["hi"], log) else (row["hi"] - row["lo"]) / row["boundary"]
        if not width > r.target:
            continue
        xs = np.unique(df.loc[df[r.y] == row[r.y], r.x].to_numpy(float))
        # the neighbouring x values that bracket the interval [lo, hi]
        i0 = max(int(np.searchsorted(xs, row["lo"], side="right")) - 1, 0)
        i1 = min(int(np.searchsorted(xs, row["hi"], side="left")), len(xs) - 1)
        y = row[r.y].item() if hasattr(row[r.y], "item") else row[r.y]
        mids = set()
        if str(row["status"]) in ("unresolved", "separated"):  # the grid does not resolve it
            gaps = [(xs[i], xs[i + 1]) for i in range(i0, i1)]
            gaps.sort(key=lambda g: -(np.log(g[1] / g[0]) if log else g[1] - g[0]))
            mids = {_mid(a, c, log, integer_x) for a, c in gaps[: r.max_points]} - set(xs.tolist())
        if mids:
            cases += [{r.x: m, r.y: y} for m in sorted(mids)]
        else:  # resolved (or as fine as it gets): more seeds at the two sampled points either
            # side of the boundary (they place it), as many as the interval needs (its width
            # falls as 1 / sqrt(runs)), at most twice those already there
            below, above = xs[xs <= row["boundary"]], xs[xs > row["boundary"]]
            pts = np.array([v for v in (below[-1:], above[:1]) for v in v])
            have = int(((df[r.y] == row[r.y]) & df[r.x].isin(pts)).sum())
            want = min(have * ((width / r.target) ** 2 - 1), 2 * max(have, 1))
            per_point = max(1, math.ceil(want / (len(pts) * seeds)))
            for v in pts:
                v = int(v) if integer_x else float(v)
                cases += [{r.x: v, r.y: y, "root_seed": base_root_seed + 100 * rnd + j}
                          for j in range(per_point)]
    return cases, b


def _round_spec(spec: C.SweepSpec, r: Refinement, cases: list[dict], rnd: int) -> C.SweepSpec:
    axes = {k: v for k, v in spec.axes.items() if k not in (r.x, r.y)}
    fixed = {k: v for k, v in spec.fixed.items() if k not in (r.x, r.y)}
    merged = [{**spec.cases[0], **c} for c in cases]
    new = C.SweepSpec(name=f"{spec.name}-round{rnd}", fixed=fixed, axes=axes,
                      seeds=int(r.seeds or spec.seeds), plot={}, description=spec.description,
                      cases=tuple(merged))
    C.validate(new, where=f"refinement round {rnd}: ")
    return new


def _combine(tables: list, r: Refinement, log: list, out_dir: Path, quiet: bool = False):
    """Every round's runs as one table with the final boundaries, written beside the rounds;
    the files ``phasebo boundaries`` made from other combined runs are removed, and said."""
    runs = pd.concat(tables, ignore_index=True)
    runs["round"] = runs["round"].astype("int64")
    b = boundaries(runs, r.x, r.y, r.between)
    from .results import write_table_atomic

    digest = tables_digest(runs["run_id"])
    try:
        old = json.loads((out_dir / "refine.json").read_text()).get("tables")
    except (OSError, ValueError, AttributeError):
        old = None
    gone = clear_boundaries(out_dir) if old != digest else []
    if gone and not quiet:
        print(said_cleared(out_dir.name, gone), file=sys.stderr)

    write_table_atomic(runs, out_dir / "results.parquet")
    write_csv_atomic(runs, out_dir / "results.csv")
    write_table_atomic(b, out_dir / "boundaries.parquet")
    write_csv_atomic(b, out_dir / "boundaries.csv")
    (out_dir / "refine.json").write_text(json.dumps(
        {"refinement": dataclasses.asdict(r), "rounds": log, "tables": digest}, indent=1,
        allow_nan=False))
    return runs, b


def adopt_sweep(out_dir: Path, spec: C.SweepSpec, dry: bool = False) -> bool:
    """A refinement writes its rounds under ``out_dir/round-<k>`` and the combined tables in
    ``out_dir`` itself. A directory that holds a plain sweep's runs (the same command without
    ``--refine`` ran first) has them moved into ``round-0``, where round 0 finds them done:
    nothing is computed twice, and no table of the plain sweep is left beside the refinement's.
    Runs of another sweep are refused before anything moves. What moves: the parts (last, so an
    interrupted move is finished by the next command), the manifest, the tables, the figures the
    manifest lists, ``report.html`` and the boundary files ``phasebo boundaries`` wrote; a file of
    the user's own stays. True when there is such a sweep (``dry``: nothing is moved)."""
    out_dir = Path(out_dir)
    r0 = out_dir / "round-0"
    if not holds_runs(out_dir):
        return False
    if (r0 / "parts").exists():
        raise ConfigError(f"{out_dir} holds the runs of a sweep and a refinement's round-0: the "
                          "refined tables would replace the sweep's; fix: --out another "
                          "directory, or --overwrite to discard them")
    manifest = read_manifest(out_dir)
    if manifest:
        is_subset(out_dir, spec, manifest)  # raises for runs of another sweep: nothing moved
    if dry:
        return True
    r0.mkdir(exist_ok=True)
    names = {"manifest.json", "report.html", "figures", *TABLES, *manifest.get("figures", [])}
    for f in sorted(out_dir.iterdir()):
        if f.name in names or is_boundary_file(f):
            f.rename(r0 / f.name)
    (out_dir / "parts").rename(r0 / "parts")
    return True


def refine_sweep(spec: C.SweepSpec, r: Refinement, out_dir: str | Path | None = None, *,
                 run_sweep, quiet: bool = False, plots: bool = True, formats=("png",),
                 dpi: int = 150, **run_kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run ``spec`` (round 0) and up to ``r.rounds`` refinement rounds through ``run_sweep``
    (:func:`phasebo.sweep.run_sweep`, passed in: the sweep driver calls this module, not the
    other way round); returns the runs of every round (with a ``round`` column) and the final
    boundaries. ``phasebo.refine_sweep`` passes it for you."""
    out_dir = Path(out_dir) if out_dir is not None else Path("results") / spec.name
    pi = run_kw.get("process_index")
    if pi is None:
        import jax

        pi = jax.process_index()
    with hold_dir(out_dir, pi, "refinement"):  # a second refinement into it is refused
        # process 0 alone clears or moves; the others wait for round 0's manifest
        if pi == 0 and run_kw.get("overwrite") and holds_runs(out_dir):  # the sweep's runs go
            clear_derived(out_dir)
            (out_dir / "manifest.json").unlink(missing_ok=True)
        if pi == 0 and adopt_sweep(out_dir, spec) and not quiet:
            print(f"refine: the runs already in {out_dir} are round 0: moved to "
                  f"{out_dir / 'round-0'}", file=sys.stderr)
        integer_x = all(isinstance(v, int) for v in spec.axes[r.x])
        root = int(spec.fixed.get("root_seed", 0))
        tables, log = [], []
        cur = spec
        for rnd in range(r.rounds + 1):
            # round 0 is the sweep's own grid: its [plot] figures and report; a later round's
            # points do not tile a map (the refined map with its boundary is drawn below)
            df = run_sweep(cur, out_dir / f"round-{rnd}", quiet=quiet, plots=plots and rnd == 0,
                           formats=formats, dpi=dpi, **run_kw)
            if df is None:  # another process's share, or stopped early
                return None, None
            tables.append(df.assign(round=rnd))
            runs = pd.concat(tables, ignore_index=True)
            cases, b = plan_round(runs, r, root + 1000, rnd + 1, integer_x,
                                  int(r.seeds or spec.seeds))
            # the slices with a bounded interval (not unbounded, nor open at 0 on a log axis)
            placed = b[(b["status"].astype(str) != "unbounded") & bounded(
                b["lo"], b["hi"], bool((runs[r.x] > 0).all()))] if len(b) else b
            widths = ((placed["hi"] - placed["lo"]) / placed["boundary"]).to_numpy(float) \
                if len(placed) else np.array([])
            widths = widths[np.isfinite(widths)]
            log.append({"round": rnd, "runs": len(df), "total_runs": len(runs),
                        "slices_open": int(len({c[r.y] for c in cases})),
                        # None (JSON null) when no slice has a bounded interval yet
                        "median_rel_width": float(np.median(widths)) if len(widths) else None,
                        "boundaries": int(len(widths))})
            if not quiet:
                width = (f"median boundary CI width {log[-1]['median_rel_width']:.3f} of the "
                         f"boundary over {len(widths)} slices with a bounded interval"
                         if len(widths) else
                         f"no slice has a {r.between[0]}-{r.between[1]} boundary with an interval yet")
                print(f"refine round {rnd}: {len(df)} runs ({len(runs)} in all); {width}; "
                      f"{log[-1]['slices_open']} slice(s) to refine (above the target "
                      f"{r.target}, or not yet bounded)", file=sys.stderr)
            if not cases or rnd == r.rounds:
                break
            cur = _round_spec(spec, r, cases, rnd + 1)
        try:
            runs, b = _combine(tables, r, log, out_dir, quiet)
        except KeyboardInterrupt:
            print(f"interrupted while combining the rounds: every round is saved under "
                  f"{out_dir}/round-*; run the same command again to combine them", file=sys.stderr)
            raise
        model = runs["model"].iloc[0] if "model" in runs and runs["model"].nunique() == 1 else None
        if not quiet:
            print(summary(b, r.x, r.y, model), file=sys.stderr)
        # the power law through the refined boundaries, as phasebo boundaries writes it
        write_csv_atomic(pd.DataFrame([power_law_row(b, r.x, r.y)]), out_dir / "boundaries_fit.csv")
        saved = []
        if plots:
            from .plot import boundary_figure, save

            fig = boundary_figure(runs, b, r.x, r.y)
            saved = save(fig, out_dir / f"boundary_{r.between[0]}_{r.between[1]}", formats, dpi)
        if not quiet:  # where the results went, as phasebo boundaries says
            print(f"table: {out_dir / 'boundaries.csv'}; fit: {out_dir / 'boundaries_fit.csv'}; "
                  f"runs: {out_dir / 'results.parquet'}"
                  + "".join(f"; figure: {p}" for p in saved), file=sys.stderr)
        return runs, b


if __name__ == "__main__":  # a library module: the refinement runs through the sweep command
    print("python -m phasebo.refine: a refinement runs through the sweep command; fix: "
          "python -m phasebo.sweep FILE --refine A,B [--rounds R --target W], or a [refine] "
          "block in the file", file=sys.stderr)
    sys.exit(2)
