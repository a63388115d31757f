"""Engines (:mod:`phasebo.engines.base`) and the mathematics they share: the span-of-tokens steps
(:mod:`phasebo.engines.span`) and the Wishart sampler (:mod:`phasebo.engines.wishart`)."""
