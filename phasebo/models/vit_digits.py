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

**Backbone** (pre-LayerNorm ViT, equinox): 2 x 2 patches -> 16 tokens of 4 pixels, a linear patch
embedding of width ``vit_width``, a learned CLS token and position embeddings (17 tokens),
``vit_depth`` blocks ``h += MHA(LN(h)); h += MLP(LN(h))`` (``vit_heads`` heads, GELU MLP of width
``2 vit_width``), a final LayerNorm and a linear head on the CLS token.

**Phase 1 (pretraining, cached).** The whole backbone is trained on the clean pretraining split
(10 classes, AdamW 1e-3, full batch, ``pretrain_steps`` steps, seed ``pretrain_seed``), which
stands in for both the hub pretraining and the paper's clean classifier phase. Deterministic given
its settings; stored once under phasebo's cache directory (``~/.cache/phasebo/pretrained`` or
``$PHASEBO_CACHE/pretrained``) keyed by a hash of them, with its clean test accuracy and time, and
reused by every later run (``phasebo pretrain`` builds or shows it).

**Phase 2 (the run).** The last block's query and key (weights and biases) are re-initialised
(PyTorch's default ``U(-1/sqrt(w), 1/sqrt(w))``) and are the only trainable parameters; full-batch
GD on the cross-entropy of the noisy labels (plain GD as the synthetic models, where the paper
used Adam: the regimes are defined for GD, and one optimiser across models keeps the comparison
clean). Everything before the last block is fixed, so its output is computed once per run. The
attention handed to the metrics is the last layer's CLS row averaged over heads (17 tokens, the
CLS itself first); ``cls_max_attn`` is the mean over samples and heads of the largest CLS
attention weight (the paper's "max CLS attention", which rises toward 1 while noisy labels are
memorised).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from ..data import Batch, flip_mask, label_values
from ..metrics import cross_entropy, masked_mean, multiclass_margin, tree_norm
from ..settings import LABELS, ConfigError, Setting, at_least, cache_dir
from ..train import dtype_of
from .base import Model

SPLITS = {"pretrain": 900, "pool": 500, "test": 397}
PATCH = 2
N_TOKENS = (8 // PATCH) ** 2 + 1  # 16 patches + CLS
LN_EPS = 1e-6


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


@functools.cache
def digits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (patches (m, 16, 4) float32, labels (m,) int32)}`` of scikit-learn's digits."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 8 // PATCH, PATCH, 8 // PATCH, PATCH)
    x = x.transpose(0, 1, 3, 2, 4).reshape(len(d.data), -1, PATCH * PATCH)
    perm = np.random.default_rng(0).permutation(len(x))
    out, start = {}, 0
    for name, size in SPLITS.items():
        idx = perm[start:start + size]
        out[name] = (x[idx], d.target[idx].astype(np.int32))
        start += size
    return out


def split(name: str, classes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A split restricted to ``classes`` (labels renumbered 0..C-1 in that order)."""
    x, y = digits()[name]
    if not classes:
        return x, y
    keep = np.isin(y, classes)
    index = {c: i for i, c in enumerate(classes)}
    return x[keep], np.array([index[v] for v in y[keep]], np.int32)


def noisy_labels(key: jax.Array, y: jax.Array, n_classes: int, mode: str, sw: dict):
    """``(y_noisy, flipped)``: the flipped labels become a uniformly random *other* class."""
    k_mask, k_shift = jr.split(key)
    flipped = flip_mask(k_mask, y, mode, sw)
    shift = jr.randint(k_shift, y.shape, 1, n_classes)  # 1..C-1: never the true class
    return jnp.where(flipped, (y + shift) % n_classes, y), flipped


# --------------------------------------------------------------------------------------------
# The backbone
# --------------------------------------------------------------------------------------------


def _b(b, x):
    """A feature vector ``(k,)`` shaped to broadcast against ``x: (..., k)`` explicitly."""
    return b.reshape((1,) * (x.ndim - 1) + b.shape)


def _affine(x, W, b):
    y = x @ W
    return y + _b(b, y)


def layer_norm(x, g, b):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + LN_EPS) * _b(g, x) + _b(b, x)


class Block(eqx.Module):
    ln1_g: jax.Array
    ln1_b: jax.Array
    Wq: jax.Array
    bq: jax.Array
    Wk: jax.Array
    bk: jax.Array
    Wv: jax.Array
    bv: jax.Array
    Wo: jax.Array
    bo: jax.Array
    ln2_g: jax.Array
    ln2_b: jax.Array
    W1: jax.Array
    b1: jax.Array
    W2: jax.Array
    b2: jax.Array
    heads: int = eqx.field(static=True)

    def attention(self, L):
        """Softmax attention weights ``(m, H, T, T)`` of the normalised tokens ``L (m, T, w)``."""
        m, T, w = L.shape
        dh = w // self.heads
        q = _affine(L, self.Wq, self.bq).reshape(m, T, self.heads, dh)
        k = _affine(L, self.Wk, self.bk).reshape(m, T, self.heads, dh)
        a = jnp.einsum("mthd,mshd->mhts", q, k) / math.sqrt(dh)
        return jax.nn.softmax(a, axis=-1), a

    def finish(self, h, L, s):
        """The block's output from its input ``h``, ``L = LN(h)`` and the attention ``s``."""
        m, T, w = L.shape
        v = _affine(L, self.Wv, self.bv).reshape(m, T, self.heads, w // self.heads)
        o = _affine(jnp.einsum("mhts,mshd->mthd", s, v).reshape(m, T, w), self.Wo, self.bo)
        h = h + o
        z = jax.nn.gelu(_affine(layer_norm(h, self.ln2_g, self.ln2_b), self.W1, self.b1))
        return h + _affine(z, self.W2, self.b2)

    def __call__(self, h):
        L = layer_norm(h, self.ln1_g, self.ln1_b)
        s, _ = self.attention(L)
        return self.finish(h, L, s)


class ViT(eqx.Module):
    W_embed: jax.Array
    b_embed: jax.Array
    cls: jax.Array
    pos: jax.Array
    blocks: tuple
    lnf_g: jax.Array
    lnf_b: jax.Array
    W_head: jax.Array
    b_head: jax.Array

    def embed(self, patches):
        m = patches.shape[0]
        t = _affine(patches, self.W_embed, self.b_embed)
        c = jnp.broadcast_to(self.cls[None], (m, 1, self.cls.shape[-1]))
        return jnp.concatenate([c, t], axis=1) + self.pos[None]

    def head(self, h):
        return _affine(layer_norm(h[:, 0], self.lnf_g, self.lnf_b), self.W_head, self.b_head)

    def __call__(self, patches):
        h = self.embed(patches)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def _linear(key, fan_in, fan_out):
    """PyTorch's default Linear init: weights and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
    kw, kb = jr.split(key)
    bound = 1.0 / math.sqrt(fan_in)
    return (jr.uniform(kw, (fan_in, fan_out), jnp.float32, -bound, bound),
            jr.uniform(kb, (fan_out,), jnp.float32, -bound, bound))


def init_vit(key, width: int, depth: int, heads: int, n_classes: int = 10) -> ViT:
    ks = jr.split(key, depth + 4)
    blocks = []
    for i in range(depth):
        kq, kk, kv, ko, k1, k2 = jr.split(ks[i], 6)
        Wq, bq = _linear(kq, width, width)
        Wk, bk = _linear(kk, width, width)
        Wv, bv = _linear(kv, width, width)
        Wo, bo = _linear(ko, width, width)
        W1, b1 = _linear(k1, width, 2 * width)
        W2, b2 = _linear(k2, 2 * width, width)
        one, zero = jnp.ones(width), jnp.zeros(width)
        blocks.append(Block(one, zero, Wq, bq, Wk, bk, Wv, bv, Wo, bo, one, zero, W1, b1, W2, b2,
                            heads))
    We, be = _linear(ks[depth], PATCH * PATCH, width)
    Wh, bh = _linear(ks[depth + 1], width, n_classes)
    return ViT(We, be, 0.02 * jr.normal(ks[depth + 2], (1, width)),
               0.02 * jr.normal(ks[depth + 3], (N_TOKENS, width)), tuple(blocks),
               jnp.ones(width), jnp.zeros(width), Wh, bh)


# --------------------------------------------------------------------------------------------
# Phase 1: pretraining, cached
# --------------------------------------------------------------------------------------------

PRETRAIN_VERSION = 1


def backbone_settings(static) -> dict:
    return {"width": static.vit_width, "depth": static.vit_depth, "heads": static.vit_heads,
            "steps": static.pretrain_steps, "seed": static.pretrain_seed,
            "version": PRETRAIN_VERSION, "splits": SPLITS}


def backbone_path(cfg: dict) -> Path:
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir()) / "pretrained" / f"vit_digits-{h}"


def pretrain(cfg: dict, quiet: bool = False) -> tuple[ViT, dict]:
    """Train the backbone on the clean pretraining split; returns it and its record."""
    import optax

    t0 = time.perf_counter()
    x, y = (jnp.asarray(a) for a in digits()["pretrain"])
    xt, yt = (jnp.asarray(a) for a in digits()["test"])
    model = init_vit(jr.PRNGKey(cfg["seed"]), cfg["width"], cfg["depth"], cfg["heads"])
    opt = optax.adamw(1e-3, weight_decay=1e-4)
    params, static = eqx.partition(model, eqx.is_array)

    def loss(p):
        return cross_entropy(eqx.combine(p, static)(x), y)

    def chunk(state, k):
        def one(c, _):
            p, s = c
            u, s = opt.update(jax.grad(loss)(p), s, p)
            return (optax.apply_updates(p, u), s), None

        return jax.lax.scan(one, state, None, length=k)[0]

    chunk = jax.jit(chunk, static_argnums=1)
    from tqdm.auto import tqdm

    bar = tqdm(total=cfg["steps"], desc="pretraining the digits ViT", unit="step",
               disable=quiet, file=sys.stderr, leave=False)
    state, done = (params, opt.init(params)), 0
    # optax's Adam mixes its int32 step count with floats: standard promotion inside
    with jax.numpy_dtype_promotion("standard"):
        while done < cfg["steps"]:
            k = min(250, cfg["steps"] - done)
            state = chunk(state, k)
            done += k
            bar.update(k)
    bar.close()
    model = eqx.combine(state[0], static)
    acc = float(jnp.mean(jnp.argmax(model(xt), -1) == yt))
    train_acc = float(jnp.mean(jnp.argmax(model(x), -1) == y))
    record = {**cfg, "test_acc": acc, "train_acc": train_acc,
              "seconds": round(time.perf_counter() - t0, 2)}
    return model, record


def load_backbone(static, quiet: bool = False) -> ViT:
    """The pretrained backbone of ``static``: from disk (a few milliseconds; a sweep loads it
    once per compiled program, when it traces it), or trained now and stored."""
    cfg = backbone_settings(static)
    path = backbone_path(cfg)
    # a run's init calls this while it is being traced: load (or train) eagerly, outside it
    with jax.ensure_compile_time_eval():
        like = init_vit(jr.PRNGKey(0), cfg["width"], cfg["depth"], cfg["heads"])
        weights = path.with_suffix(".eqx")
        if weights.exists():
            model = eqx.tree_deserialise_leaves(weights, like)
        else:
            model, record = pretrain(cfg, quiet=quiet)
            weights.parent.mkdir(parents=True, exist_ok=True)
            tmp = weights.with_name(f".{weights.name}.tmp-{os.getpid()}")
            eqx.tree_serialise_leaves(tmp, model)
            os.replace(tmp, weights)
            path.with_suffix(".json").write_text(json.dumps(record, indent=1))
            if not quiet:
                print(f"vit_digits: pretrained backbone, clean test accuracy "
                      f"{record['test_acc']:.4f} ({record['seconds']:.1f} s) -> {weights}",
                      file=sys.stderr)
        model = jax.tree.map(lambda a: np.asarray(a) if eqx.is_array(a) else a, model)
    return model


def backbone_record(static) -> dict:
    load_backbone(static, quiet=True)
    return json.loads(backbone_path(backbone_settings(static)).with_suffix(".json").read_text())


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
        Setting("pretrain_steps", 500, int, "static", "full-batch AdamW steps of the cached "
                "pretraining", at_least(1)),
        Setting("pretrain_seed", 0, int, "static", "seed of the pretraining", lambda v: None
                if v >= 0 else "must be >= 0"),
    )
    defaults = {"n": 20, "n_test": 397, "noise_ratio": 0.2, "lr": 0.5, "steps": 300}

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
                              f"{r['vit_heads']}")
        if C < 2:
            raise ConfigError("classes: at least two")

    def derived(self, static, sw):
        return label_values(static.n, sw["noise_ratio"])

    def roles(self, static):
        return None

    def n_classes(self, static) -> int:
        return len(static.classes) or 10

    def sample(self, static, sw, key, *, test):
        classes = tuple(static.classes)
        x, y = split("test" if test else "pool", classes)
        m = static.n_test if test else static.n
        # drawn through the key even for the whole test split, so the test set is not a compile
        # time constant (XLA would constant-fold the fixed backbone through it)
        idx = jr.permutation(key, len(y))[:m]
        x, y = jnp.asarray(x)[idx], jnp.asarray(y)[idx]
        x = x.astype(dtype_of(static))
        zeros = jnp.zeros((m, N_TOKENS, 2), x.dtype)
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

    def _last(self, qk, vit, h):
        last = vit.blocks[-1]
        L = layer_norm(h, last.ln1_g, last.ln1_b)
        blk = eqx.tree_at(lambda b: (b.Wq, b.bq, b.Wk, b.bk), last, (qk.Wq, qk.bq, qk.Wk, qk.bk))
        s, a = blk.attention(L)
        f = vit.head(blk.finish(h, L, s))
        return f, s[:, :, 0, :], a[:, :, 0, :]  # CLS rows (m, H, T)

    def precompute(self, m, batch, static):
        return self._hidden(m, batch.X)

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
        return self._last(QK(last.Wq, last.bq, last.Wk, last.bk), m, self._hidden(m, test.X))[0]

    def param_metrics(self, m, static, sw):
        last = m.blocks[-1]
        return {"qk_norm": tree_norm((last.Wq, last.bq, last.Wk, last.bk))}

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
        w, T = static.vit_width, N_TOKENS
        acts = (static.n + static.n_test) * T * w * (8 + 2 * static.vit_depth)
        params = static.vit_depth * 12 * w * w
        n_rec = self.n_records(static)
        return int((acts + 4 * params + n_rec * (60 + 4 * T)) * self.item(static))

    def cost_per_run(self, static):
        w, T = static.vit_width, N_TOKENS
        return 2.0 * static.n * T * 12 * w * w * max(self.loop_steps(static), 1) * 3
