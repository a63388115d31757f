"""``phasebo pretrain``: build (or show) the cached digits backbone of the ``vit_digits``
model."""

from __future__ import annotations

import argparse
import json

from ..models.vit_backbone import backbone_path, backbone_record, backbone_settings
from ..models.vit_digits import ViTDigitsModel


def main(argv: list[str] | None = None) -> int:
    """``phasebo pretrain [--vit-width W] [--phase1 linear_probe] ...``: build (or show) the
    cached backbone, with its clean test accuracy and the seconds its training took."""
    model = ViTDigitsModel()
    p = argparse.ArgumentParser(prog="phasebo pretrain", description=main.__doc__)
    for k in ("vit_width", "vit_depth", "vit_heads", "vit_patch", "pretrain_steps",
              "pretrain_seed", "probe_steps"):
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=model.settings[k].default)
    p.add_argument("--phase1", choices=model.settings["phase1"].choices,
                   default=model.settings["phase1"].default, help=model.settings["phase1"].doc)
    args = p.parse_args(argv)
    static = model.static_of({k: getattr(args, k) for k in vars(args)})
    rec = backbone_record(static)
    print(json.dumps(rec, indent=1))
    print(f"weights: {backbone_path(backbone_settings(static)).with_suffix('.eqx')}")
    return 0
