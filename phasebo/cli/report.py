"""``phasebo report RESULTS_DIR``: write (or rewrite) a finished sweep's ``report.html``."""

from __future__ import annotations

import sys
from pathlib import Path

from .args import Parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = Parser(
        prog=prog or "phasebo report",
        description="Write a finished sweep's interactive report.html: one self-contained file "
                    "(plotly inlined) that opens offline.",
        epilog="example: phasebo report results/default")
    p.add_argument("results_dir", help="a sweep's output directory")
    p.add_argument("--out", help="the file to write (default: RESULTS_DIR/report.html)")
    args = p.parse_args(argv)
    name = p.prog
    results = Path(args.results_dir)
    if not (results / "results.parquet").exists():
        from ..results import not_results, unfinished

        why = (unfinished(results) if (results / "parts").is_dir() else
               not_results(results) if results.suffix == ".toml" and results.is_file() else
               f"{results} holds no results.parquet; fix: give a finished sweep's --out "
               "directory")
        print(f"{name}: error: {why}", file=sys.stderr)
        return 2
    if args.out and Path(args.out).suffix != ".html":
        print(f"{name}: error: --out {args.out!r} must end in .html", file=sys.stderr)
        return 2
    from ..report_html import write_report
    from ..settings import ConfigError

    if args.out and not Path(args.out).parent.exists():
        print(f"{name}: error: --out {args.out!r}: no directory {Path(args.out).parent}; fix: "
              "create it, or give a path in an existing one", file=sys.stderr)
        return 2
    try:
        path, seconds = write_report(results, args.out)
    except ConfigError as e:  # e.g. tables older than the sweep's latest command
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, OSError) as e:
        print(f"{name}: error: {results}: the report could not be written ({type(e).__name__}: "
              f"{e})", file=sys.stderr)
        return 1
    size = path.stat().st_size / 2**20
    print(f"{path} ({size:.1f} MiB, written in {seconds:.1f} s)")
    return 0
