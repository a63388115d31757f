"""The digits ViT of model ``vit_digits``: its data, its layers and its cached pretraining.

**Data.** scikit-learn's 1,797 8 x 8 digits (shipped with the package, no download), pixel values
/ 16, split once by a fixed permutation (seed 0) into a *pretraining* split (900 images), a
*fine-tuning pool* (500) and a *test* split (397), disjoint; each image as ``(8/patch)^2`` patch
tokens of ``patch^2`` pixels.

**The ViT** (pre-LayerNorm, equinox): a linear patch embedding of width ``w``, a learned CLS token
and position embeddings, blocks ``h += MHA(LN(h)); h += MLP(LN(h))`` (GELU MLP of width ``2 w``),
a final LayerNorm and a linear head on the CLS token; PyTorch's default initialisation. With
``mixing = "cls"`` every block but the last is *local*: a patch token attends only to itself, the
CLS token to every token.

**Pretraining** (phase 1), cached: the whole ViT trained on the clean pretraining split (AdamW
1e-3, full batch), then for ``phase1 = "linear_probe"`` a fresh head trained alone on the frozen
features; stored under phasebo's cache directory keyed by a hash of its settings, with its clean
test accuracy and the seconds it took (:func:`load_backbone`, :func:`backbone_record`).
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

from ..metrics import cross_entropy
from ..settings import SHAPES_ONLY, cache_dir

SPLITS = {"pretrain": 900, "pool": 500, "test": 397}
PATCHES = (1, 2, 4)  # patch side lengths: 64, 16 or 4 patches of the 8 x 8 image


def n_tokens(patch: int) -> int:
    """Tokens of an image: ``(8 / patch)^2`` patches and the CLS token."""
    return (8 // patch) ** 2 + 1
LN_EPS = 1e-6


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


@functools.cache
def digits(patch: int = 2) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (patches (m, (8/patch)^2, patch^2) float32, labels (m,) int32)}`` of
    scikit-learn's digits (the same images and splits for every patch size)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    k = 8 // patch
    x = (d.data / 16.0).astype(np.float32).reshape(-1, k, patch, k, patch)
    x = x.transpose(0, 1, 3, 2, 4).reshape(len(d.data), -1, patch * patch)
    perm = np.random.default_rng(0).permutation(len(x))
    out, start = {}, 0
    for name, size in SPLITS.items():
        idx = perm[start:start + size]
        out[name] = (x[idx], d.target[idx].astype(np.int32))
        start += size
    return out


def split(name: str, classes: tuple[int, ...], patch: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """A split restricted to ``classes`` (labels renumbered 0..C-1 in that order)."""
    x, y = digits(patch)[name]
    if not classes:
        return x, y
    keep = np.isin(y, classes)
    index = {c: i for i, c in enumerate(classes)}
    return x[keep], np.array([index[v] for v in y[keep]], np.int32)


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
    local: bool = eqx.field(static=True, default=False)

    def attention(self, L):
        """Softmax attention weights ``(m, H, T, T)`` of the normalised tokens ``L (m, T, w)``;
        in a ``local`` block a patch token attends only to itself (the CLS row, the first, to
        every token)."""
        m, T, w = L.shape
        dh = w // self.heads
        q = _affine(L, self.Wq, self.bq).reshape(m, T, self.heads, dh)
        k = _affine(L, self.Wk, self.bk).reshape(m, T, self.heads, dh)
        a = jnp.einsum("mthd,mshd->mhts", q, k) / math.sqrt(dh)
        if self.local:
            allowed = np.eye(T, dtype=bool)
            allowed[0] = True  # the CLS row: every token
            a = jnp.where(allowed, a, -jnp.inf)
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


def init_vit(key, width: int, depth: int, heads: int, n_classes: int = 10,
             patch: int = 2, mixing: str = "all") -> ViT:
    """A ViT in PyTorch's default initialisation; ``mixing = "cls"`` makes every block but the
    last ``local`` (:meth:`Block.attention`)."""
    if mixing not in ("all", "cls"):
        raise ValueError(f"mixing = {mixing!r}: 'all' or 'cls'")
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
        one, zero = jnp.ones(width, jnp.float32), jnp.zeros(width, jnp.float32)
        blocks.append(Block(one, zero, Wq, bq, Wk, bk, Wv, bv, Wo, bo, one, zero, W1, b1, W2, b2,
                            heads, mixing == "cls" and i < depth - 1))
    We, be = _linear(ks[depth], patch * patch, width)
    Wh, bh = _linear(ks[depth + 1], width, n_classes)
    # float32 throughout (x64 on or off): the stored backbone is float32, whatever a run's dtype
    f32 = jnp.float32
    return ViT(We, be, 0.02 * jr.normal(ks[depth + 2], (1, width), f32),
               0.02 * jr.normal(ks[depth + 3], (n_tokens(patch), width), f32), tuple(blocks),
               jnp.ones(width, f32), jnp.zeros(width, f32), Wh, bh)


# --------------------------------------------------------------------------------------------
# Phase 1: pretraining, cached
# --------------------------------------------------------------------------------------------

# 2: every leaf float32 whatever x64 (a backbone stored by version 1 under x64 had float64
# leaves); the same weights as version 1 otherwise
PRETRAIN_VERSION = 2


def backbone_settings(static) -> dict:
    cfg = {"width": static.vit_width, "depth": static.vit_depth, "heads": static.vit_heads,
           "steps": static.pretrain_steps, "seed": static.pretrain_seed,
           "version": PRETRAIN_VERSION, "splits": SPLITS}
    # settings added later enter the key only away from their defaults (stored backbones stay)
    if getattr(static, "vit_patch", 2) != 2:
        cfg["patch"] = static.vit_patch
    if getattr(static, "vit_mixing", "all") != "all":
        cfg["mixing"] = static.vit_mixing
    if getattr(static, "phase1", "joint") == "linear_probe":
        cfg["probe_steps"] = static.probe_steps
    if getattr(static, "matmul_precision", "highest") != "highest":
        cfg["matmul_precision"] = static.matmul_precision
    return cfg


def _adamw_loop(loss, params, steps: int, desc: str, quiet: bool):
    """``steps`` full-batch AdamW (1e-3, decay 1e-4) steps of ``loss(params)``, in jitted chunks
    of 250 with a progress bar."""
    import optax
    from tqdm.auto import tqdm

    opt = optax.adamw(1e-3, weight_decay=1e-4)

    def chunk(state, k):
        def one(c, _):
            p, s = c
            u, s = opt.update(jax.grad(loss)(p), s, p)
            return (optax.apply_updates(p, u), s), None

        return jax.lax.scan(one, state, None, length=k)[0]

    chunk = jax.jit(chunk, static_argnums=1)
    bar = tqdm(total=steps, desc=desc, unit="step", disable=quiet, file=sys.stderr, leave=False)
    state, done = (params, opt.init(params)), 0
    # optax's Adam mixes its int32 step count with floats: standard promotion inside
    with jax.numpy_dtype_promotion("standard"):
        while done < steps:
            k = min(250, steps - done)
            state = jax.block_until_ready(chunk(state, k))  # the bar shows finished steps
            done += k
            bar.update(k)
    bar.close()
    return state[0]


def _accuracy(model: ViT, split_name: str, patch: int) -> float:
    x, y = (jnp.asarray(a) for a in digits(patch)[split_name])
    return float(jnp.mean(jnp.argmax(model(x), -1).astype(y.dtype) == y))  # int64 under x64


def linear_probe(model: ViT, cfg: dict, quiet: bool = False) -> tuple[ViT, dict]:
    """Phase 1 as the paper ran it: a fresh linear head (PyTorch's init, from the pretraining
    seed) trained alone on the frozen backbone's features of the clean pretraining split,
    ``probe_steps`` full-batch AdamW steps."""
    t0 = time.perf_counter()
    x, y = (jnp.asarray(a) for a in digits(cfg.get("patch", 2))["pretrain"])
    h = model.embed(x)
    for b in model.blocks:
        h = b(h)
    feats = layer_norm(h[:, 0], model.lnf_g, model.lnf_b)  # the head's input, fixed
    W, b = _linear(jr.fold_in(jr.PRNGKey(cfg["seed"]), 1), cfg["width"], model.W_head.shape[1])

    def loss(p):
        return cross_entropy(_affine(feats, *p), y)

    W, b = _adamw_loop(loss, (W, b), cfg["probe_steps"], "linear probe of the digits ViT", quiet)
    model = eqx.tree_at(lambda v: (v.W_head, v.b_head), model, (W, b))
    return model, {"probe_seconds": round(time.perf_counter() - t0, 2)}


def backbone_path(cfg: dict) -> Path:
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir()) / "pretrained" / f"vit_digits-{h}"


def pretrain(cfg: dict, quiet: bool = False) -> tuple[ViT, dict]:
    """Train the backbone on the clean pretraining split (then, for ``phase1 = linear_probe``,
    probe a fresh head: :func:`linear_probe`); returns it and its record. Its matrix products
    have the runs' precision (``matmul_precision``), whichever command asks for it first."""
    with jax.default_matmul_precision(cfg.get("matmul_precision", "highest")):
        return _pretrain(cfg, quiet)


def _pretrain(cfg: dict, quiet: bool) -> tuple[ViT, dict]:
    t0 = time.perf_counter()
    patch = cfg.get("patch", 2)
    extra = {}
    if "probe_steps" in cfg:  # the jointly pretrained backbone (cached too), then the probe
        joint = {k: v for k, v in cfg.items() if k != "probe_steps"}
        model = _load(joint, quiet)
        extra = {"joint_test_acc": _accuracy(model, "test", patch)}
        model, more = linear_probe(model, cfg, quiet)
        extra.update(more)
    else:
        x, y = (jnp.asarray(a) for a in digits(patch)["pretrain"])
        model = init_vit(jr.PRNGKey(cfg["seed"]), cfg["width"], cfg["depth"], cfg["heads"],
                         patch=patch, mixing=cfg.get("mixing", "all"))
        params, static = eqx.partition(model, eqx.is_array)

        def loss(p):
            return cross_entropy(eqx.combine(p, static)(x), y)

        model = eqx.combine(_adamw_loop(loss, params, cfg["steps"],
                                        "pretraining the digits ViT", quiet), static)
    record = {**cfg, "test_acc": _accuracy(model, "test", patch),
              "train_acc": _accuracy(model, "pretrain", patch),
              **extra, "seconds": round(time.perf_counter() - t0, 2)}
    return model, record


def load_backbone(static, quiet: bool = False) -> ViT:
    """The pretrained backbone of ``static``: from disk (a few milliseconds; a sweep loads it
    once per compiled program, when it traces it), or trained now and stored."""
    return _load(backbone_settings(static), quiet)


def _load(cfg: dict, quiet: bool = False) -> ViT:
    path = backbone_path(cfg)
    # a run's init calls this while it is being traced: load (or train) eagerly, outside it
    with jax.ensure_compile_time_eval():
        like = init_vit(jr.PRNGKey(0), cfg["width"], cfg["depth"], cfg["heads"],
                        patch=cfg.get("patch", 2), mixing=cfg.get("mixing", "all"))
        weights = path.with_suffix(".eqx")
        if weights.exists():
            model = eqx.tree_deserialise_leaves(weights, like)
        elif SHAPES_ONLY.get():  # a dry run's trace: the shapes are the untrained ViT's
            model = like
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
    record = backbone_path(backbone_settings(static)).with_suffix(".json")
    if SHAPES_ONLY.get() and not record.exists():  # a dry run's trace: no pretraining for it
        return {"test_acc": float("nan")}
    load_backbone(static, quiet=True)
    return json.loads(record.read_text())
