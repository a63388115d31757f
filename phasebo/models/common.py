"""What models on the same data share: :class:`SakamotoSampledModel` (``encoder``,
``constructed_query``: Sakamoto & Sato's tokens with a sampled test set), and what the models
trained on Magen et al.'s data share (``single_head``, ``self_attention``,
``multi_layer``): the data and its defaults (Magen et al.'s M1 setting), the learning rules with a
head and a query group, and the attention metrics of a signal token and T - 1 noise tokens.

Token role 0 is the signal token, so ``mass_clean_rel`` / ``mass_noisy_rel`` are the mean signal
probabilities of clean / flipped training samples. Extra metrics: ``margin_norm = min_i y_i f_i /
||v||`` (f is 1-homogeneous in v), per-position mean attention ``attn_mean_clean_t{k}`` /
``attn_mean_noisy_t{k}``, ``mass_{clean,noisy}_top_noise`` (mean largest noise-token mass).
"""

from __future__ import annotations

import jax.numpy as jnp
import jax.random as jr

from ..data import (
    MAGEN,
    SAKAMOTO,
    magen_roles,
    magen_sample,
    projection_normals,
    sakamoto_roles,
    sakamoto_sample,
)
from ..metrics import attention_metrics, margin_norm
from ..settings import INIT, PROJECT, RADIUS_V, WEIGHT_DECAY
from ..train import dtype_of
from .base import Model

MAGEN_DEFAULTS = {  # Magen et al.'s M1 setting
    "T": 2, "n": 200, "n_test": 2000, "signal_norm": 30.0, "label_mode": "iid",
    "label_noise": "bernoulli", "noise_ratio": 0.05, "lr": 0.025, "steps": 100,
}


class SakamotoSampledModel(Model):
    """Base of the models on Sakamoto & Sato's tokens whose test set is sampled tokens (not
    registered itself)."""

    data = SAKAMOTO

    def roles(self, static):
        return sakamoto_roles(static)

    def sample(self, static, sw, key, *, test):
        return sakamoto_sample(key, static.n_test if test else static.n, static.d,
                               self.roles(static), sw, label_mode=static.label_mode,
                               label_noise=None if test else static.label_noise,
                               dtype=dtype_of(static), noise_mode=static.noise_mode)


def init_vec(key, shape, static, sw, dtype):
    if static.init == "gaussian":
        return sw["init_scale"] * jr.normal(key, shape, dtype)
    return jnp.zeros(shape, dtype)


class MagenDataModel(Model):
    """Base of the models on Magen et al.'s data (not registered itself)."""

    data = MAGEN
    track_logits = False
    own_settings = (*INIT, *WEIGHT_DECAY, *PROJECT, *RADIUS_V)
    radii = ("radius_v", "radius_p")

    def roles(self, static):
        return magen_roles(static.T)

    def sample(self, static, sw, key, *, test):
        dtype = dtype_of(static)
        common = dict(noise_mode=static.noise_mode, signal_noise=static.signal_noise,
                      label_mode=static.label_mode, dtype=dtype)
        if not test:
            return magen_sample(key, static.n, static.d, static.T, sw,
                                label_noise=static.label_noise, **common)
        sampled = getattr(static, "test_mode", "sampled") == "sampled"
        b = magen_sample(key, static.n_test, static.d if sampled else None, static.T, sw,
                         label_noise=None, **common)
        return b if sampled else b._replace(z=projection_normals(key, (static.n_test, static.T), dtype))

    def extra_metrics(self, m, f, s, a, batch, metrics):
        out = {"margin_norm": margin_norm(metrics["margin"], metrics["v_norm"])}
        out.update(attention_metrics(s, batch))
        return out

    def samples(self, m, f, s, a, batch, test, static, sw, first_fit):
        out = super().samples(m, f, s, a, batch, test, static, sw, first_fit)
        out["signal_prob"] = s[:, 0]
        return out
