"""The models, one module each, behind the protocol of :mod:`phasebo.models.base`; the table that
names them is :data:`phasebo.registry.MODELS`."""
