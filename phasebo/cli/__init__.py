"""The ``phasebo`` command: one entry point for sweeps, figures, benchmarks and the settings.

::

    phasebo sweep sweeps/default.toml            # run a sweep (python -m phasebo.sweep)
    phasebo plot results/default                 # the standard figures of a finished sweep
    phasebo report results/default               # its interactive report.html (offline)
    phasebo boundaries results/default --x signal_norm --y d --between benign,harmful
    phasebo settings single_head                 # every setting of a model: kind, default, doc
    phasebo models                               # the models and the engines that run them
    phasebo bench --sections readme,dynamics     # side-by-side benchmarks
    phasebo reference                            # rebuild the reference figures
    phasebo pretrain                             # pretrain the digits backbone of vit_digits

``python -m phasebo`` is the same command.
"""

from __future__ import annotations

import os
import sys
import textwrap

COMMANDS = {
    "sweep": "run a sweep file (or several)",
    "plot": "draw the standard figures of a finished sweep",
    "report": "write a finished sweep's interactive report.html",
    "boundaries": "estimate phase boundaries (and their scaling) from a finished sweep",
    "settings": "list every setting of a model (or of all models)",
    "models": "list the models and their engines",
    "bench": "side-by-side benchmarks",
    "reference": "rebuild the reference figures in results/reference/",
    "pretrain": "pretrain (or show) the cached digits backbone of the vit_digits model",
}


def usage() -> str:
    lines = ["usage: phasebo COMMAND [ARGS]  (phasebo COMMAND --help for each)", "", "commands:"]
    lines += [f"  {k:11s} {v}" for k, v in COMMANDS.items()]
    lines += ["", "examples:", "  phasebo sweep sweeps/default.toml",
              "  phasebo settings prompt_attention", "  phasebo plot results/default --format pdf"]
    return "\n".join(lines)


def settings_table(model_name: str | None = None, width: int = 100) -> str:
    """Every setting of a model (or of every model): name, kind, default and one-line doc."""
    from ..registry import MODELS, get_model

    models = [get_model(model_name)] if model_name else list(MODELS.values())
    out = []
    for m in models:
        out.append(f"{m.name}: {m.doc}")
        out.append(f"  engines: {', '.join(m.engines)}; data: "
                   f"{m.data.name if m.data else 'its own'}")
        nw = max(15, *map(len, m.settings))  # the longest name sets the column
        pad = 2 + nw + 1 + 7 + 1 + 22 + 1
        out.append(f"  {'setting':{nw}s} {'kind':7s} {'default':22s} doc")
        for name, s in m.settings.items():
            default = s.default
            if isinstance(default, tuple):
                default = "[" + ", ".join(repr(x) for x in default) + "]"
            elif isinstance(default, bool):
                default = "true" if default else "false"
            elif isinstance(default, str):
                default = f'"{default}"'
            doc = s.doc + (f" (choices: {', '.join(map(str, s.choices))})" if s.choices else "")
            if s.requires:
                doc += f" [needs {s.requires[0]} = {s.requires[1]}]"
            wrapped = textwrap.wrap(doc, max(40, width - pad)) or [""]
            out.append(f"  {name:{nw}s} {s.kind:7s} {str(default):22s} {wrapped[0]}")
            out += [" " * pad + w for w in wrapped[1:]]
        out.append("")
    return "\n".join(out)


def models_table() -> str:
    from ..registry import ENGINES, MODELS

    lines = [f"{'model':18s} {'engines':24s} doc"]
    lines += [f"{m.name:18s} {', '.join(m.engines):24s} {m.doc}" for m in MODELS.values()]
    lines += ["", f"{'engine':18s} {'priority':24s} doc"]
    lines += [f"{e.name:18s} {e.priority!s:24s} {e.doc}" for e in ENGINES.values()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # not asked for: the usage goes where errors go
        print(usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "sweep":
        from .sweep import main as sweep_main

        return sweep_main(rest, prog="phasebo sweep")
    if cmd == "plot":
        from .plot import main as plot_main

        return plot_main(rest, prog="phasebo plot")
    if cmd == "report":
        from .report import main as report_main

        return report_main(rest, prog="phasebo report")
    if cmd == "boundaries":
        return boundaries_main(rest, prog="phasebo boundaries")
    if cmd == "bench":
        from .bench import main as bench_main

        return bench_main(rest, prog="phasebo bench")
    if cmd == "reference":
        from .reference import main as ref_main

        return ref_main(rest)
    if cmd == "pretrain":
        from .pretrain import main as pre_main

        return pre_main(rest)
    if cmd == "settings":
        from ..settings import ConfigError

        if rest and rest[0] in ("-h", "--help"):
            print("usage: phasebo settings [MODEL]  (every setting of MODEL, or of every model)")
            return 0
        try:
            if len(rest) > 1 or (rest and rest[0].startswith("-")):
                raise ConfigError(f"unexpected argument {rest[-1]!r}; usage: phasebo settings "
                                  "[MODEL]")
            print(settings_table(rest[0] if rest else None))
        except ConfigError as e:
            print(f"phasebo settings: error: {e}", file=sys.stderr)
            return 2
        return 0
    if cmd == "models":
        if rest and rest[0] in ("-h", "--help"):
            print("usage: phasebo models  (the models, their engines and what each computes)")
            return 0
        if rest:  # nothing to choose: an argument would be ignored
            print(f"phasebo models: error: unexpected argument {rest[0]!r}; usage: phasebo models",
                  file=sys.stderr)
            return 2
        print(models_table())
        return 0
    from ..settings import suggest

    print(f"phasebo: error: unknown command {cmd!r}{suggest(cmd, COMMANDS)}; commands: "
          f"{', '.join(COMMANDS)} (phasebo --help)", file=sys.stderr)
    return 2


def guarded(command, *args) -> int:
    """``command(*args)``, quiet when its output pipe closes early (``phasebo settings | head``,
    ``python -m phasebo.sweep FILE --dry-run | head -1``), its warnings one line each
    (``phasebo: warning: ...``, not Python's source line): every entry point runs through it."""
    import warnings

    def one_line(message, category, filename, lineno, file=None, line=None):  # not the source
        print(f"phasebo: warning: {message}", file=sys.stderr if file is None else file)

    warnings.showwarning = one_line  # a command's warnings are its output, read by people
    try:
        return command(*args)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def run(argv: list[str] | None = None) -> int:
    """The console entry point ``phasebo``: :func:`main`, :func:`guarded`."""
    return guarded(main, argv)


def sweep_entry() -> int:
    """The console entry point ``phasebo-sweep``: :func:`phasebo.cli.sweep.main`, :func:`guarded`."""
    from .sweep import main as sweep_main

    return guarded(sweep_main)


def boundaries_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``phasebo boundaries RESULTS --x X --y Y --between A,B``: boundaries.parquet/csv, the
    power-law fit against the theory, and the map with the boundary drawn on it."""
    import hashlib
    import json
    import sys
    import warnings
    from pathlib import Path

    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..analysis import load
    from ..boundaries import FITTING_RULES, MIN_BOOT, boundaries, count_fitting
    from ..scaling import power_law_row, summary
    from ..settings import ConfigError
    from .args import Parser, at_least, figure_formats, out_dir

    p = Parser(prog=prog or "phasebo boundaries",
               description="Estimate phase boundaries of finished sweep(s).")
    p.add_argument("results", nargs="+", help="sweep directories (or results files)")
    p.add_argument("--x", default="signal_norm", help="axis the boundary lies along (default: signal_norm)")
    p.add_argument("--y", default="d", help="slice axis: one boundary per value (default: d)")
    p.add_argument("--between", default="benign,harmful", help="two regimes, A,B (default: benign,harmful)")
    p.add_argument("--by", default="", help="more slice columns, comma separated")
    p.add_argument("--over", default="", help="settings to pool inside a slice, comma separated")
    p.add_argument("--boot", type=int, default=400,
                   help=f"bootstrap replicates (default: 400; at least {MIN_BOOT})")
    p.add_argument("--fitting", default="apart", choices=FITTING_RULES,
                   help="runs still fitting their flipped labels: on neither side (apart, the "
                        "default) or counted as not overfitting (a label unfitted at the step)")
    p.add_argument("--out", help="output directory (default: the first results directory)")
    p.add_argument("--format", default="png", help="figure formats: png, pdf, svg or a comma list")
    p.add_argument("--no-plots", action="store_true", help="write the tables only")
    p.add_argument("--step", default=None,
                   help="a recorded step (the regimes of the dynamics at that step), a comma "
                        "list of them, 'all' for every recorded step (the boundary over time), "
                        "or 'last'; default: the "
                        "regime at each run's horizon (results table)")
    args = p.parse_args(argv)
    name = p.prog

    def split(text):
        return [c for c in text.split(",") if c]

    try:
        formats = figure_formats(args.format)
        at_least("boot", args.boot, MIN_BOOT)  # fewer: the interval's ends are a few replicates
        out = out_dir(args.out) if args.out else None
        between = tuple(s.strip() for s in args.between.split(","))
        step = args.step
        if step is not None and step not in ("all", "last"):
            if not all(s.strip().isdigit() for s in step.split(",")):
                raise ValueError(f"--step {step!r}: give a recorded step (an integer), a comma "
                                 "list of them (181,2000), 'all' or 'last'")
            step = [int(s) for s in step.split(",")]
            step = step[0] if len(step) == 1 else step
        df = load(args.results, "dynamics") if step is not None else load(args.results)
        with warnings.catch_warnings(record=True) as said:  # printed below, one line each
            warnings.simplefilter("always")
            b = boundaries(df, args.x, args.y, between, by=split(args.by), over=split(args.over),
                           n_boot=args.boot, step=None if step == "all" else step,
                           fitting=args.fitting)
    except (ValueError, ConfigError, FileNotFoundError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    neither = len(b) and not int(b["n_runs"].sum())  # said below with what the runs are
    for w in said:
        if not (neither and str(w.message).startswith("boundaries: no run is")):
            print(f"{name}: warning: {w.message}", file=sys.stderr)
    if out is None:  # the first sweep's directory (a results file: the directory holding it)
        first = Path(args.results[0])
        out = first if first.is_dir() else first.parent
    when = "" if step is None else f"_step{step}" if isinstance(step, int) else \
        f"_steps_{'-'.join(map(str, step))}" if isinstance(step, list) else f"_steps_{step}"
    rule = "" if args.fitting == "apart" else f"_fitting-{args.fitting}"  # both rules kept
    # every choice that changes the table is in its name: another analysis of the same sweep
    # writes its own files, never over these
    # several result directories pooled: their own files name them (a hash of the directories),
    # so a pooled analysis never replaces one sweep's own analysis beside its runs
    sources = sorted({str((Path(r) if Path(r).is_dir() else Path(r).parent).resolve())
                      for r in args.results})  # a directory given twice, or with its table: one
    pool = "" if len(sources) == 1 else \
        f"_pooled-{hashlib.sha1(chr(10).join(sources).encode()).hexdigest()[:8]}"
    what = f"{between[0]}_{between[1]}_along_{args.x}_per_{args.y}" + "".join(
        f"_{k}_{'-'.join(split(v))}" for k, v in (("by", args.by), ("over", args.over)) if v) + pool
    stem = f"boundaries_{what}{when}{rule}"
    if pool:
        print(f"pooled from {len(sources)} result sets: {', '.join(args.results)}", file=sys.stderr)
    if (out / f"{stem}.csv").exists():  # the same analysis again (other runs, --boot): said
        print(f"replacing {out / stem}.{{csv,parquet}} (and its fit and figure) from an earlier "
              "run of this analysis", file=sys.stderr)
    table = pa.Table.from_pandas(b, preserve_index=False)
    pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                  b"phasebo.sources": json.dumps(sources).encode()}),
                   out / f"{stem}.parquet")
    b.to_csv(out / f"{stem}.csv", index=False)
    lead = ["step"] if "step" in b.columns else []
    cols = [*lead, args.y, *split(args.by), "boundary", "lo", "hi", "n_runs", "n_seeds", "status"]
    with pd.option_context("display.width", 120, "display.max_rows", 400):
        print(b[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    model = str(df["model"].iloc[0]) if "model" in df.columns and df["model"].nunique() == 1 \
        else None  # the theory line says only what applies to the runs' model
    if split(args.by):  # one summary and fit per --by group, as the fit table holds them
        for key, g in b.groupby(split(args.by), sort=True, dropna=False):
            key = key if isinstance(key, tuple) else (key,)
            print(", ".join(f"{k} = {v}" for k, v in zip(split(args.by), key)) + ": "
                  + summary(g, args.x, args.y, dict(zip(split(args.by), key)).get("model", model)))
    else:
        print(summary(b, args.x, args.y, model))
    if len(b) and not int(b["n_runs"].sum()):  # nothing to place: say what the runs are instead
        from ..analysis import at_step

        sel = df if step in (None, "all") else at_step(df, step)
        seen = count_fitting(sel, args.fitting)["regime"].astype(str).value_counts()
        print(f"no run is {between[0]} or {between[1]}"
              + (" at these steps" if step is not None else "") + ": "
              + ", ".join(f"{k} {v}" for k, v in seen.items() if v)
              + (" (runs x recorded steps)" if step == "all" else " runs")
              + "; fix: --between two regimes the runs have")
    one_step = "step" not in b.columns or b["step"].nunique() == 1
    # the fit and its verdict (ok, scattered, too_few_slices) per --by group, and per recorded
    # step for a boundary over time
    by = split(args.by)
    rows = []
    for key, g in (b.groupby(by, sort=True, dropna=False) if by else [((), b)]):
        key = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        if one_step:
            rows.append({**key, **power_law_row(g, args.x, args.y)})
        else:  # the same row, one per recorded step
            rows += [{**key, "step": int(st), **power_law_row(gs, args.x, args.y)}
                     for st, gs in g.groupby("step", sort=True)]
    pd.DataFrame(rows).to_csv(out / f"{stem}_fit.csv", index=False)
    if not args.no_plots:  # a table-only analysis does not import the figures
        from ..plot import boundary_figure, boundary_trajectory, save

    figs = []  # (file name, () -> figure): drawn, or with --no-plots an earlier one removed
    by = split(args.by)
    # one figure per --by slice (a map holds one value of each); none when --over pools
    # settings into a slice: a map would have to pool them too, which it never does
    groups = b.groupby(by, sort=True, dropna=False) if by else [((), b)]
    for key, g in ([] if split(args.over) else groups):
        key = key if isinstance(key, tuple) else (key,)
        tag = "".join(f"_{k}={v:g}" if isinstance(v, float) else f"_{k}={v}"
                      for k, v in zip(by, key))
        if "step" in g.columns and g["step"].nunique() > 1:
            figs.append((f"boundary_trajectory_{what}{when}{rule}{tag}", tag,
                         lambda g=g: boundary_trajectory(g, args.x, args.y)[0]))
            continue
        runs = df if "step" not in df.columns else df[df["step"].isin(g["step"].unique())]
        for k, v in zip(by, key):
            runs = runs[runs[k] == v]
        runs = count_fitting(runs, args.fitting)  # the map coloured as the fit counted
        figs.append((f"boundary_{what}{when}{rule}{tag}", tag,
                     lambda g=g, runs=runs: boundary_figure(runs, g, args.x, args.y)))
    if split(args.over) and not args.no_plots:
        print(f"no figure: the slices pool {args.over} (--over), which a regime map does "
              "not; the table has the boundaries")
    for fname, tag, draw in figs:
        old = [out / f"{fname}.{f}" for f in ("png", "pdf", "svg") if (out / f"{fname}.{f}").exists()]
        if args.no_plots:  # an earlier run's figure would sit beside these tables, not of them
            for f in old:
                f.unlink()
            if old:
                print(f"removed {', '.join(map(str, old))}: an earlier run's figure of this "
                      "analysis (--no-plots draws none)", file=sys.stderr)
            continue
        try:
            fig = draw()
        except ValueError as e:  # the runs do not tile a map: the table stands alone
            for f in old:  # an earlier run's figure is not of these tables
                f.unlink()
            print(f"no figure{tag.replace('_', ' ')}: {e}" + (
                f" (removed {', '.join(map(str, old))}, an earlier run's)" if old else ""),
                file=sys.stderr)
            continue
        replaced = any((out / f"{fname}.{f}").exists() for f in formats)
        print(("figure (replaced): " if replaced else "figure: ") + ", ".join(
            map(str, save(fig, out / fname, formats))))
    print(f"table: {out / (stem + '.csv')}; fit: {out / (stem + '_fit.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
