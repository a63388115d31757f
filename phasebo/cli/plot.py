"""``python -m phasebo.plot`` / ``phasebo plot``: the standard figures of a finished sweep."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..report import standard_figures, step_figures
from ..settings import ConfigError
from .args import Parser, at_least, figure_formats, out_dir


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m phasebo.plot",
               description="Draw the standard figures of a finished sweep.",
               epilog="example: python -m phasebo.plot results/default --format png,pdf --dpi 200")
    p.add_argument("results_dir", help="a sweep's output directory")
    p.add_argument("--out", help="where to write figures (default: RESULTS_DIR/figures)")
    p.add_argument("--format", default="png", help="png, pdf, svg or a comma list")
    p.add_argument("--dpi", type=int, default=150, help="resolution of raster figures")
    p.add_argument("--step", default=None,
                   help="draw the maps at this recorded step (or 'last') from dynamics.parquet "
                        "instead of the standard figures at each run's horizon")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = build_parser()
    if prog:
        p.prog = prog
    args = p.parse_args(argv)
    try:
        formats = figure_formats(args.format)
        at_least("dpi", args.dpi)
        if not Path(args.results_dir).exists():
            raise ConfigError(f"{args.results_dir} does not exist; fix: give a sweep's --out "
                              "directory")
        if args.out:
            out_dir(args.out)
        target = Path(args.out) if args.out else Path(args.results_dir) / "figures"
        before = {q.name for q in target.iterdir()} if target.is_dir() else set()
        if args.step is not None:
            step = args.step if args.step == "last" else int(args.step) \
                if args.step.isdigit() else None
            if step is None:
                raise ConfigError(f"--step {args.step!r}: give a recorded step or 'last'")
            paths = step_figures(args.results_dir, step, args.out, formats, args.dpi)
        else:
            paths = standard_figures(args.results_dir, args.out, formats, args.dpi)
    except (ConfigError, ValueError) as e:
        print(f"{prog or 'phasebo.plot'}: error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    replaced = [q.name for q in paths if q.parent == target and q.name in before]
    if replaced:  # said, never silent: a figure of another drawing is gone
        print(f"{prog or 'phasebo.plot'}: replaced {len(replaced)} figure(s) already in {target} "
              f"({', '.join(replaced[:3])}{', ...' if len(replaced) > 3 else ''})",
              file=sys.stderr)
    return 0
