"""``python -m phasebo``: the ``phasebo`` command (:mod:`phasebo.cli`)."""

import sys

from .cli import run

sys.exit(run())
