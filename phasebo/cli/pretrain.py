"""``phasebo pretrain``: build (or show) the cached digits backbone of the ``vit_digits``
model."""

from __future__ import annotations

import json
import sys

from ..models.vit_backbone import backbone_path, backbone_record, backbone_settings
from ..models.vit_digits import ViTDigitsModel
from ..settings import ConfigError
from .args import Parser


def main(argv: list[str] | None = None) -> int:
    """``phasebo pretrain [--vit-width W] [--phase1 linear_probe] ...``: build (or show) the
    cached backbone, with its clean test accuracy and the seconds its training took."""
    model = ViTDigitsModel()
    p = Parser(prog="phasebo pretrain", description=main.__doc__)
    for k in ("vit_width", "vit_depth", "vit_heads", "pretrain_steps", "pretrain_seed",
              "probe_steps"):
        st = model.settings[k]
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=st.default, help=st.doc)
    for k in ("vit_patch", "vit_mixing", "phase1"):
        st = model.settings[k]
        p.add_argument(f"--{k.replace('_', '-')}", type=st.type, choices=st.choices,
                       default=st.default, help=st.doc)
    args = p.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v != model.settings[k].default}
    try:  # each value and the model's own checks: a setting without effect is refused, as in
        # a sweep file
        from ..config import check_cell, resolve

        given = {k: model.settings[k].coerce(v) for k, v in given.items()}
        check_cell(resolve({"model": model.name, **given}), given)
    except ConfigError as e:  # its own fix: not argparse's "see --help"
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    static = model.static_of({k: getattr(args, k) for k in vars(args)})
    rec = backbone_record(static)
    print(json.dumps(rec, indent=1))
    print(f"weights: {backbone_path(backbone_settings(static)).with_suffix('.eqx')}")
    return 0
