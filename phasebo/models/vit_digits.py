"""Real data: a small ViT pretrained on handwritten digits, then its last attention layer's query
and key fine-tuned on noisy labels, model ``vit_digits``.

The real-data experiment of Sakamoto & Sato (a pretrained ViT-B/16 fine-tuned on MNIST and others,
only the last layer's query and key re-initialised and trained), offline: the data are
scikit-learn's 1,797 8 x 8 digits (shipped with the package, no download) and the backbone is one
phasebo pretrains itself.

**Data.** Pixel values / 16, split once by a fixed permutation (seed 0) into a *pretraining* split
(900 images), a *fine-tuning pool* (500) and a *test* split (397), disjoint. ``classes`` picks the
digit classes of phase 2 (all ten by default; two, e.g. ``[3, 8]``, make a binary task, where the
2-class cross-entropy is exactly the logistic loss of the margin ``f_y - f_other``, so the
synthetic models' regimes apply unchanged). A run draws its ``n`` training samples from the pool
(without replacement, from the run's key) and uses ``n_test`` test images (all of the split by
default). Label noise replaces a label by a *uniformly random other class*: exactly
``ceil(n r)`` labels at random positions (``label_noise = "fixed_count"``) or each label with
probability ``r`` (``"bernoulli"``).

**Backbone** (pre-LayerNorm ViT, equinox): ``vit_patch`` x ``vit_patch`` patches (2: 16 tokens
of 4 pixels; 1: 64 tokens of one pixel), a linear patch embedding of width ``vit_width``, a
learned CLS token and position embeddings, ``vit_depth`` blocks ``h += MHA(LN(h));
h += MLP(LN(h))`` (``vit_heads`` heads, GELU MLP of width ``2 vit_width``), a final LayerNorm and
a linear head on the CLS token. ``vit_mixing = "cls"``: in every block before the last a patch
token attends only to itself and the CLS token to every token, so the last block sees patch
tokens that still describe their own patch and a CLS input that differs per image (with full
mixing, a search of the last block's attention reaches fewer wrong classes and fewer flipped
labels are memorised; ``docs/experiments.md``).

**Phase 1 (pretraining, cached).** The whole backbone is trained on the clean pretraining split
(10 classes, AdamW 1e-3, full batch, ``pretrain_steps`` steps, seed ``pretrain_seed``), which
stands in for the hub pretraining. Its head is the classifier of phase 1 (``phase1 = "joint"``),
or is replaced by a fresh one trained alone on the frozen features for ``probe_steps`` AdamW steps
(``"linear_probe"``: the paper's phase 1, a linear probe on clean images). Deterministic given its
settings; stored once under phasebo's cache directory (``~/.cache/phasebo/pretrained`` or
``$PHASEBO_CACHE/pretrained``) keyed by a hash of them, with its clean test accuracy and the
seconds it took, and reused by every later run (``phasebo pretrain`` builds or shows it; a run
reports the accuracy as ``backbone_test_acc``).

**Phase 2 (the run).** The last block's query and key (weights and biases) are re-initialised
(PyTorch's default ``U(-1/sqrt(w), 1/sqrt(w))``) and are the only trainable parameters, trained on
the cross-entropy of the noisy labels by the run's optimiser: full-batch GD by default (the
synthetic models' rule), or the paper's recipe through the optimiser settings (AdamW, a linear
decay, clipping, minibatches of 16, a number of epochs; ``sweeps/real_digits_recipe.toml``).
Everything before the last block is fixed, so it is computed once per run; and since the head
reads only the CLS token, only the CLS row of the last block is computed at each step
(:meth:`ViTDigitsModel._last`). The attention handed to the metrics is that CLS row averaged over
heads (the CLS itself first); ``cls_max_attn`` is the mean over samples and heads of the largest
CLS attention weight (the paper's "max CLS attention", which rises toward 1 while noisy labels are
memorised).

**Regimes** are judged against the clean reference by default (``test_reference = "clean"``): a
run that fits every label is benign when its test accuracy is within ``test_eps`` of the mean
test accuracy of the sweep's noise-free runs at the same settings (``phasebo.regimes``), since on
ten classes even a noise-free run stays well short of accuracy 1.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from ..data import Batch, flip_mask, label_values
from ..metrics import cross_entropy, masked_mean, multiclass_margin, tree_norm
from ..settings import LABELS, ConfigError, Setting, at_least, minibatched
from ..train import dtype_of
from .base import Model
from .vit_backbone import (
    PATCHES,
    ViT,
    _affine,
    _linear,
    backbone_path,
    backbone_record,
    backbone_settings,
    layer_norm,
    load_backbone,
    n_tokens,
    split,
)


def noisy_labels(key: jax.Array, y: jax.Array, n_classes: int, mode: str, sw: dict):
    """``(y_noisy, flipped)``: the flipped labels become a uniformly random *other* class."""
    k_mask, k_shift = jr.split(key)
    flipped = flip_mask(k_mask, y, mode, sw)
    shift = jr.randint(k_shift, y.shape, 1, n_classes, y.dtype)  # 1..C-1: never the true class
    return jnp.where(flipped, (y + shift) % n_classes, y), flipped


# --------------------------------------------------------------------------------------------
# Phase 2: the model
# --------------------------------------------------------------------------------------------


def _qk(v: ViT):
    """The last block's query and key, weights and biases: phase 2's only trained arrays."""
    b = v.blocks[-1]
    return b.Wq, b.bq, b.Wk, b.bk


class QK(eqx.Module):
    """The trainable parameters: the last block's query and key, weights and biases."""

    Wq: jax.Array
    bq: jax.Array
    Wk: jax.Array
    bk: jax.Array


def _ints(v):
    if len(set(v)) != len(v) or any(not 0 <= c <= 9 for c in v):
        return "must be distinct digits 0..9"
    if len(v) == 1:
        return "must name at least two classes (or none: all ten)"
    return None


class ViTDigitsModel(Model):
    name = "vit_digits"
    doc = ("small ViT pretrained on scikit-learn's digits; the last layer's query/key "
           "re-initialised and fine-tuned on noisy labels (Sakamoto & Sato's real-data runs)")
    labels = False  # its label noise replaces a label by another of C classes
    track_logits = False
    own_settings = (
        LABELS[0],
        LABELS[1].with_default("bernoulli"),  # the paper: each label replaced w.p. r
        Setting("classes", (), "ints", "static", "digit classes of the fine-tuning task (empty: "
                "all ten; two classes: a binary task)", _ints),
        Setting("vit_width", 32, int, "static", "ViT width (the pretrained backbone's)",
                at_least(4)),
        Setting("vit_depth", 2, int, "static", "ViT blocks (the last one's query/key are "
                "fine-tuned)", at_least(1)),
        Setting("vit_heads", 2, int, "static", "attention heads per block", at_least(1)),
        Setting("vit_patch", 2, int, "static", "patch side: the 8 x 8 image as (8/patch)^2 "
                "tokens of patch^2 pixels (1: 64 tokens, 2: 16, 4: 4), plus the CLS token",
                choices=PATCHES, silent_default=True),
        Setting("vit_mixing", "all", str, "static", "attention in the blocks before the last: "
                "all (every token attends to every token, a standard ViT) or cls (only the CLS "
                "token attends across the image; a patch token attends to itself, so it stays a "
                "feature of its own patch)", choices=("all", "cls"), silent_default=True),
        Setting("pretrain_steps", 500, int, "static", "full-batch AdamW steps of the cached "
                "pretraining", at_least(1)),
        Setting("pretrain_seed", 0, int, "static", "seed of the pretraining", lambda v: None
                if v >= 0 else "must be >= 0"),
        Setting("phase1", "joint", str, "static", "the classifier of phase 1: joint (trained "
                "with the backbone in the pretraining) or linear_probe (then replaced by a fresh "
                "head trained alone on the frozen features, as the paper's phase 1)",
                choices=("joint", "linear_probe"), silent_default=True),
        Setting("probe_steps", 300, int, "static", "full-batch AdamW steps of the linear probe",
                at_least(1), requires=("phase1", "linear_probe"), silent_default=True),
    )
    defaults = {"n": 20, "n_test": 397, "noise_ratio": 0.2, "lr": 0.5, "steps": 300,
                "test_reference": "clean"}

    def check(self, r):
        super().check(r)
        C = len(r["classes"]) or 10
        pool = len(split("pool", tuple(r["classes"]))[1])
        test = len(split("test", tuple(r["classes"]))[1])
        if r["n"] > pool:
            raise ConfigError(f"n = {r['n']} is more than the {pool} fine-tuning images of "
                              f"classes {list(r['classes']) or 'all'}; fix: n <= {pool}")
        if r["n_test"] > test:
            raise ConfigError(f"n_test = {r['n_test']} is more than the {test} test images of "
                              f"classes {list(r['classes']) or 'all'}; fix: n_test <= {test}")
        if r["label_noise"] == "fraction":
            raise ConfigError("label_noise = \"fraction\" is the binary per-class rule of the "
                              "synthetic data; fix: \"fixed_count\" (exactly ceil(n r) labels "
                              "replaced) or \"bernoulli\"")
        if r["vit_width"] % r["vit_heads"]:
            raise ConfigError(f"vit_width = {r['vit_width']} must be a multiple of vit_heads = "
                              f"{r['vit_heads']}; fix: e.g. vit_heads = "
                              f"{max(h for h in range(1, r['vit_heads'] + 1) if r['vit_width'] % h == 0)}")
        if C < 2:
            raise ConfigError("classes: at least two; fix: e.g. classes = [3, 8], or [] for all ten")
        if r["vit_mixing"] == "cls" and r["vit_depth"] == 1:
            raise ConfigError("vit_mixing = \"cls\" changes the blocks before the last, and "
                              "vit_depth = 1 has none; fix: vit_depth >= 2 or drop vit_mixing")

    def derived(self, static, sw):
        return label_values(static.n, sw["noise_ratio"])

    def roles(self, static):
        return None

    def n_classes(self, static) -> int:
        return len(static.classes) or 10

    def sample(self, static, sw, key, *, test):
        classes = tuple(static.classes)
        x, y = split("test" if test else "pool", classes, static.vit_patch)
        m = static.n_test if test else static.n
        # drawn through the key even for the whole test split, so the test set is not a compile
        # time constant (XLA would constant-fold the fixed backbone through it)
        idx = jr.permutation(key, len(y))[:m]
        x, y = jnp.asarray(x)[idx], jnp.asarray(y)[idx]
        x = x.astype(dtype_of(static))
        zeros = jnp.zeros((m, n_tokens(static.vit_patch), 2), x.dtype)
        if test:
            return Batch(x, zeros, y, y, jnp.zeros(m, bool))
        yn, flipped = noisy_labels(jr.fold_in(key, 1), y, self.n_classes(static),
                                   static.label_noise, sw)
        return Batch(x, zeros, yn, y, flipped)

    def _backbone(self, static):
        vit = load_backbone(static)
        if static.classes:  # the pretrained head's rows of the chosen classes
            idx = np.asarray(static.classes)
            vit = eqx.tree_at(lambda v: (v.W_head, v.b_head), vit,
                              (vit.W_head[:, idx], vit.b_head[idx]))
        # NumPy leaves: constants of the compiled program (jax.Array constants captured by a
        # trace are hoisted into arguments, which the sweep's ahead-of-time compile does not pass)
        dt = np.float64 if static.dtype == "float64" else np.float32
        return jax.tree.map(lambda a: np.asarray(a, dt) if eqx.is_array(a) else a, vit)

    def init(self, static, sw, key, batch):
        vit = self._backbone(static)
        w = static.vit_width
        kq, kk = jr.split(key)
        Wq, bq = _linear(kq, w, w)
        Wk, bk = _linear(kk, w, w)
        dt = dtype_of(static)
        full = eqx.tree_at(_qk, vit, (Wq.astype(dt), bq.astype(dt), Wk.astype(dt), bk.astype(dt)))
        trainable = eqx.tree_at(_qk, jax.tree.map(lambda _: False, full), (True,) * 4)
        return eqx.partition(full, trainable)

    def _hidden(self, vit: ViT, x):
        """The input of the last block (fixed in phase 2)."""
        h = vit.embed(x)
        for b in vit.blocks[:-1]:
            h = b(h)
        return h

    def _fixed(self, vit: ViT, x) -> tuple:
        """What phase 2 never changes, per sample: the last block's CLS input ``h_0 (m, w)``, its
        normalised tokens ``L (m, T, w)`` and their values ``V = L Wv + bv (m, T, w)``."""
        h = self._hidden(vit, x)
        last = vit.blocks[-1]
        L = layer_norm(h, last.ln1_g, last.ln1_b)
        return h[:, 0], L, _affine(L, last.Wv, last.bv)

    def _last(self, qk, vit, fixed):
        """The logits and the CLS row of the last block's attention, from the CLS token alone.

        The head reads only the CLS token, so of the last block only the CLS row matters: per
        head ``q = (L_0 Wq + bq)_h`` and the logits ``a_t = q . (L_t Wk + bk)_h / sqrt(dh)``,
        computed as ``L_t . (Wk_h q) + q . bk_h`` (no key matrix for the T tokens); then
        ``h_0 + softmax(a) V Wo + bo`` through the block's MLP and the head. Equal to the full
        block's CLS output (``ViT.__call__``; tested); with 17 tokens about 1/13 of its work
        (``python -m phasebo.bench --sections vit``).
        Returns ``(f, s, a)`` with the attention weights and logits ``(m, H, T)``.
        """
        h0, L, V = fixed
        last = vit.blocks[-1]
        m, T, w = L.shape
        H = last.heads
        dh = w // H
        q = _affine(L[:, 0], qk.Wq, qk.bq).reshape(m, H, dh)
        u = jnp.einsum("whd,mhd->mhw", qk.Wk.reshape(w, H, dh), q)
        a = (jnp.einsum("mtw,mhw->mht", L, u)
             + jnp.einsum("mhd,hd->mh", q, qk.bk.reshape(H, dh))[..., None]) / math.sqrt(dh)
        s = jax.nn.softmax(a, axis=-1)
        o = _affine(jnp.einsum("mht,mthd->mhd", s, V.reshape(m, T, H, dh)).reshape(m, w),
                    last.Wo, last.bo)
        c = h0 + o
        z = jax.nn.gelu(_affine(layer_norm(c, last.ln2_g, last.ln2_b), last.W1, last.b1))
        c = c + _affine(z, last.W2, last.b2)
        f = _affine(layer_norm(c, vit.lnf_g, vit.lnf_b), vit.W_head, vit.b_head)
        return f, s, a

    def precompute(self, m, batch, static):
        return self._fixed(m, batch.X)

    def forward(self, m, batch, aux):
        # ``m`` is the combined tree: the fixed backbone with the trained QK in its last block
        last = m.blocks[-1]
        qk = QK(last.Wq, last.bq, last.Wk, last.bk)
        f, s, a = self._last(qk, m, aux)
        return f, jnp.mean(s, axis=1), (jnp.mean(a, axis=1), jnp.max(s, axis=-1))

    def margin_loss(self, f, y):
        return multiclass_margin(f, y), cross_entropy(f, y)

    def test_output(self, m, test, static, sw):
        last = m.blocks[-1]
        return self._last(QK(last.Wq, last.bq, last.Wk, last.bk), m, self._fixed(m, test.X))[0]

    def param_metrics(self, m, static, sw):
        last = m.blocks[-1]
        # the backbone's clean test accuracy on all ten classes (from its cached record): what
        # phase 2 starts from
        pre = backbone_record(static)["test_acc"]
        return {"qk_norm": tree_norm((last.Wq, last.bq, last.Wk, last.bk)),
                "backbone_test_acc": jnp.asarray(pre, dtype_of(static))}

    def extra_metrics(self, m, f, s, a, batch, metrics):
        smax = jnp.mean(a[1], axis=-1)  # (n,): max CLS weight, mean over heads
        return {"cls_max_attn": jnp.mean(smax),
                "cls_max_attn_noisy": masked_mean(smax, batch.flipped),
                "cls_max_attn_clean": masked_mean(smax, ~batch.flipped),
                "cls_self_attn": jnp.mean(s[:, 0])}

    def samples(self, m, f, s, a, batch, test, static, sw, first_fit):
        margin, _ = self.margin_loss(f, batch.y)
        return {"flipped": batch.flipped, "y_clean": batch.y_clean.astype(jnp.int32),
                "y_noisy": batch.y.astype(jnp.int32), "first_fit_step": first_fit,
                "final_margin": margin}

    def bytes_per_run(self, static):
        w, T = static.vit_width, n_tokens(static.vit_patch)
        acts = (static.n + static.n_test) * T * w * (8 + 2 * static.vit_depth)
        params = static.vit_depth * 12 * w * w
        n_rec = self.n_records(static)
        return int((acts + 4 * params + n_rec * (60 + 4 * T)) * self.item(static))

    def setup(self, static):
        load_backbone(static)  # pretrained and cached the first time, read back after

    def setup_note(self, static):
        cfg = backbone_settings(static)
        if backbone_path(cfg).with_suffix(".eqx").exists():
            return None
        # the stored record of the default backbone: 37 s on 2 cores (500 AdamW steps)
        return (f"the vit_digits backbone ({cfg['steps']} pretraining steps, width "
                f"{cfg['width']}, depth {cfg['depth']}) is not cached yet: the first run "
                "pretrains it once, ~40 s on 2 cores per 500 steps, outside this estimate "
                "(`phasebo pretrain` builds it alone)")

    def cost_per_run(self, static):
        # per sample and step: the CLS row of the last block (_last), ~7 w^2 + T w multiply-adds,
        # x 3 with the backward pass; a step sees a batch of samples
        w, T = static.vit_width, n_tokens(static.vit_patch)
        per_step = static.batch_size if minibatched(static) else static.n
        return 2.0 * 3 * per_step * (7 * w * w + T * w) * max(self.loop_steps(static), 1)
