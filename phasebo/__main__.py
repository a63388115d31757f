"""``python -m phasebo``: the ``phasebo`` command (:mod:`phasebo.cli`)."""

import sys

from .cli import main

sys.exit(main())
