"""Exact fast engines: gradient descent in the span of the training tokens.

- ``direct`` (:mod:`phasebo.train`, :mod:`phasebo.magen`): the d-dimensional simulation, the
  ground truth.
- ``gram``: the same run on the same sampled data, as gradient descent on the span coefficients
  with the Gram matrix of the tokens; reproduces the direct trajectory up to rounding.
- ``reduced``: samples the Gram matrix directly (explicit e1, e2 coordinates + a Bartlett factor of
  the Wishart(d - 2) complement); the same distribution of runs at a cost independent of ``d``.

Models: ``prompt_attention`` with p trained (:mod:`phasebo.engines.prompt`) and ``single_head``
(:mod:`phasebo.engines.single_head`). The shared loop is :mod:`phasebo.engines.span`, the sampler
:mod:`phasebo.engines.wishart`.

``engine = "auto"`` picks the supporting engine with the highest priority: reduced (20) > gram (10)
> direct (0). Importing this package registers the engines.
"""

from . import prompt as prompt  # noqa: F401  (registers gram and reduced for prompt attention)
from . import single_head as single_head  # noqa: F401  (and for single-head attention)
