"""``phasebo reference``: run the reference sweeps and rebuild ``results/reference/*.png``."""

from __future__ import annotations

import os
import sys

from ..reference import REFERENCE_DIR, make_reference
from ..settings import ConfigError
from .args import Parser, at_least, out_dir


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="phasebo reference",
               description="Run the reference sweeps and rebuild results/reference/*.png.")
    p.add_argument("--out", default=str(REFERENCE_DIR),
                   help="where the figures go (default: %(default)s); the runs always go to "
                        "results/reference-runs")
    p.add_argument("--seeds", type=int, default=2, help="seeds per cell of the p-only S3 map")
    p.add_argument("--official-seeds", type=int, default=1,
                   help="seeds per cell of the W-and-p S3 map (the paper had 1)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    try:  # before the first of its sweeps runs
        at_least("seeds", args.seeds)
        at_least("official-seeds", args.official_seeds)
        out = out_dir(args.out)
    except ConfigError as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    from .xla import tune_xla_cpu

    tune_xla_cpu()  # as the sweep command does
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        import jax  # one CPU device per core, as the sweep command does

        jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)
    for path in make_reference(out, quiet=args.quiet, seeds=args.seeds,
                               official_seeds=args.official_seeds):
        print(path)
    return 0
