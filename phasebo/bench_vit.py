"""The digits ViT's benchmark section (``python -m phasebo.bench --sections vit``): phase 2's
gradient step computing only the last block's CLS row against the whole block, and the paper's
recipe at n = 20 as a sweep."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from .bench import _fmt, _print_table


def _vit_step_rates(model, backbone: dict, m_size: int, runs: int, repeat: int) -> dict:
    """Gradient steps/s per run of vit_digits' phase 2 on ``m_size`` samples, ``runs`` runs
    vmapped: the CLS row of the last block (what a run computes) and the whole block."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import jax.random as jr

    from .models import vit_digits as V

    st = model.static_of({**backbone, "n": m_size})
    sw = {"noise_ratio": jnp.float32(0.2), **{k: jnp.asarray(v) for k, v in
                                               V.label_values(m_size, 0.2).items()}}
    batch = model.sample(st, sw, jr.PRNGKey(0), test=False)
    keys = jr.split(jr.PRNGKey(1), runs)
    params = jax.vmap(lambda k: model.init(st, sw, k, batch)[0])(keys)
    fixed = model.init(st, sw, keys[0], batch)[1]
    m0 = eqx.combine(jax.tree.map(lambda a: a[0], params), fixed)
    aux, h = model.precompute(m0, batch, st), model._hidden(m0, batch.X)

    def cls_row(p):
        f = model.forward(eqx.combine(p, fixed), batch, aux)[0]
        return model.margin_loss(f, batch.y)[1]

    def whole_block(p):
        m = eqx.combine(p, fixed)
        return model.margin_loss(m.head(m.blocks[-1](h)), batch.y)[1]

    rates = {}
    for name, fn in (("cls row", cls_row), ("whole block", whole_block)):
        step = jax.jit(jax.vmap(jax.value_and_grad(fn)))
        jax.block_until_ready(step(params))
        best = math.inf
        for _ in range(max(repeat, 2)):
            t = time.perf_counter()
            for _ in range(20):
                jax.block_until_ready(step(params))
            best = min(best, (time.perf_counter() - t) / 20)
        rates[name] = runs / best
    return rates


def section_vit(q: bool, repeat: int, out: dict) -> None:
    """vit_digits phase 2: the loss and gradient of one step for 40 runs (vmapped), on a batch of
    16 (the paper's recipe) and on n = 400 (full batch), computing only the CLS row of the last
    block (what a run does) vs the whole last block on every token (the same numbers,
    ``tests/test_vit_digits.py``); then the recipe's n = 20 phase 2 as a sweep."""
    from .config import spec_from_dict
    from .models import vit_digits as V
    from .registry import get_model
    from .sweep import run_sweep

    model = get_model("vit_digits")
    backbone = {"vit_width": 32, "vit_heads": 2} if q else {"vit_width": 128, "vit_heads": 8}
    V.load_backbone(model.static_of(backbone), quiet=True)  # pretrained (cached) off the clock
    runs, rows = 8 if q else 40, []
    for m_size in (16, 400):
        rates = _vit_step_rates(model, backbone, m_size, runs, repeat)
        out.setdefault("vit", []).append({"batch": m_size, "runs": runs, **rates})
        rows.append([m_size, runs, _fmt(rates["cls row"]), _fmt(rates["whole block"]),
                     f"{rates['cls row'] / rates['whole block']:.1f}"])
    _print_table(f"vit: phase-2 gradient steps/s per run (width {backbone['vit_width']}, "
                 f"{backbone['vit_heads']} heads, 17 tokens)",
                 ["samples", "runs", "CLS row", "whole block", "ratio"], rows)
    seeds, epochs = (2, 200) if q else (10, 2000)
    spec = spec_from_dict({"model": "vit_digits", **backbone, "optimizer": "adamw", "lr": 5e-5,
                           "lr_schedule": "linear", "clip_norm": 1.0, "batch_size": 16,
                           "epochs": epochs, "n": 20},
                          {"noise_ratio": [0.0, 0.2]}, seeds=seeds, name="bench_vit")
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        run_sweep(spec, Path(tmp) / "out", quiet=True, plots=False)
        wall = time.perf_counter() - t
    steps = epochs * 2  # ceil(20 / 16) batches an epoch
    out["vit_recipe"] = {"runs": 2 * seeds, "steps": steps, "wall_s": wall}
    _print_table("vit: the recipe's phase 2 at n = 20 (AdamW, batch 16, clip 1, linear decay) as a "
                 "sweep, compile and tables included",
                 ["runs", "steps", "wall s", "runs/s"],
                 [[2 * seeds, steps, f"{wall:.1f}", f"{2 * seeds / wall:.2f}"]])
