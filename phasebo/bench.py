"""Side-by-side benchmarks: ``python -m phasebo.bench [--quick] [--heatmap] [--precision]``.

Everything is prompt attention with ``p`` trained (W = I), n = 20, T = 8, 1000 GD steps, the
default settings of SPEC S2 (``||mu|| = 20``), timed after compilation (AOT-compiled, then run):

1. **loop** (issue 2): phasebo's batched direct engine (the sweep's compiled chunk function:
   runs split over the local devices, ``lax.map`` over vmapped blocks) vs the same runs one at a
   time through a jitted per-run function vs a plain NumPy implementation, d in {1000, 2000, 5000}.
2. **engines** (issue 4): runs/s of the direct, gram and reduced engines for d = 10^3 .. 10^6, and
   their ratio to the direct engine and to the per-run loop. Where a direct or per-run measurement
   would take minutes (d >= 10^5) it is timed at two shorter step counts and extrapolated
   linearly to 1000 steps (marked ``~``).
3. **blocks**: runs/s of the direct engine (and the reduced one) for vmapped block sizes
   1, 2, 4, ... on this machine: the best is what ``plan_group`` / ``EngineSpec.block_size`` use.
4. **precision** (``--precision``): the reduced engine in float32 vs float64 on identical data
   (sampled in float64), d = 10^3 .. 10^6, at the three regimes of SPEC S2 (n SNR^2 = 0.1, 4, 200).
5. **heatmap** (``--heatmap``): wall time of ``python -m phasebo.sweep sweeps/sakamoto_heatmap.toml``
   (39 x 39 grid x ``--heatmap-seeds`` seeds), run in a subprocess with a fresh compilation cache.

``--quick`` shrinks every section (a few minutes, mostly compilation). Measured on the shared
2-core CPU: ``--precision`` with the default sections took 552 s and 623 s; ``--heatmap`` adds the
sweep's own time (232 s at 100 seeds). The whole record in one command (about 13-15 minutes)::

    python -m phasebo.bench --precision --heatmap --json bench.json

Timings on a shared machine are noisy: each figure is one warm-up run, then the best of
``--repeat - 1`` timed runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SETTINGS = {"model": "prompt_attention", "n": 20, "T": 8, "signal_norm": 20.0, "rho": 0.1,
            "noise_ratio": 0.2, "lr": 5e-3, "n_test": 1000, "train": ("p",)}


# --------------------------------------------------------------------------------------------
# Timing helpers
# --------------------------------------------------------------------------------------------


def _group(engine: str, d: int, n_runs: int, steps: int, **extra):
    import jax.numpy as jnp

    from . import config as C
    from .config import spec_from_dict
    from .train import MODELS, swept_arrays

    spec = spec_from_dict({**SETTINGS, "engine": engine, "d": d, "steps": steps, **extra},
                          seeds=n_runs)
    runs = spec.runs()
    static = C.make_static(runs[0])
    sw = swept_arrays(static, runs, MODELS[static.model])
    return static, runs, {k: jnp.asarray(v) for k, v in sw.items()}


def batched_rate(engine: str, d: int, n_runs: int, steps: int, block: int | None = None,
                 repeat: int = 1) -> float:
    """Runs/s of the sweep's compiled chunk function (all local devices)."""
    import jax
    import jax.numpy as jnp

    from . import sweep as S
    from .train import MODELS, resolve_engine

    static, runs, sw = _group(engine, d, n_runs, steps)
    n_dev = len(jax.local_devices())
    eng = resolve_engine(static)
    if block is None:
        nbytes = (eng.bytes_per_run or MODELS[static.model].bytes_per_run)(static)
        _, block = S.plan_group(static, n_runs, nbytes, n_dev, int(0.5 * S.free_memory_bytes()),
                                chunk_size=n_runs, engine=eng)
    unit = block * n_dev
    width = max(unit, math.ceil(n_runs / unit) * unit)
    if width != n_runs:
        return batched_rate(engine, d, width, steps, block, repeat)
    fn = S.chunk_function(static, block, n_dev)
    ids = jnp.arange(n_runs, dtype=jnp.uint32)
    root = jax.random.PRNGKey(0)
    compiled = fn.lower(sw, ids, root).compile()
    if repeat > 1:
        jax.block_until_ready(compiled(sw, ids, root))  # warm-up (thread pools, allocator)
    best = math.inf
    for _ in range(max(1, repeat - 1)):
        t = time.perf_counter()
        jax.block_until_ready(compiled(sw, ids, root))
        best = min(best, time.perf_counter() - t)
    return n_runs / best


def per_run_rate(engine: str, d: int, n_runs: int, steps: int, repeat: int = 1) -> float:
    """Runs/s of one jitted run at a time (a Python loop over runs, one device)."""
    import jax

    from .train import resolve_engine

    static, runs, sw = _group(engine, d, n_runs, steps)
    run = resolve_engine(static).run
    one = jax.jit(lambda s, k: run(static, s, k))
    root = jax.random.PRNGKey(0)
    args = [({k: v[i] for k, v in sw.items()}, jax.random.fold_in(root, i)) for i in range(n_runs)]
    compiled = one.lower(*args[0]).compile()
    if repeat > 1:
        jax.block_until_ready(compiled(*args[0]))  # warm-up
    best = math.inf
    for _ in range(max(1, repeat - 1)):
        t = time.perf_counter()
        for a in args:
            jax.block_until_ready(compiled(*a))
        best = min(best, time.perf_counter() - t)
    return n_runs / best


def extrapolated(rate_fn, target: int = 1000, steps_pair=(20, 60)) -> float:
    """Runs/s at ``target`` steps from two shorter measurements (time linear in steps).

    When noise makes the longer run look no slower, falls back to scaling the longer run's time
    by ``target / s2`` (which overstates the time of the fixed part: a conservative rate)."""
    s1, s2 = steps_pair
    t1, t2 = 1.0 / rate_fn(s1), 1.0 / rate_fn(s2)
    if t2 <= t1:
        return 1.0 / (t2 * target / s2)
    return 1.0 / (t1 + (t2 - t1) * (target - s1) / (s2 - s1))


def numpy_run(d: int, steps: int, seed: int, s=SETTINGS) -> tuple[float, float]:
    """Plain NumPy prompt attention (p only, W = I): returns (train acc, test acc)."""
    rng = np.random.default_rng(seed)
    n, T, mu, rho, lr = s["n"], s["T"], s["signal_norm"], s["rho"], s["lr"]
    y_clean = np.where(np.arange(n) < n // 2, 1.0, -1.0)
    k = math.ceil(round(n * s["noise_ratio"], 9)) // 2
    pos_rank = np.cumsum(y_clean > 0) - 1
    neg_rank = np.cumsum(y_clean < 0) - 1
    flipped = np.where(y_clean > 0, pos_rank < k, neg_rank < k)
    y = np.where(flipped, -y_clean, y_clean)

    def draw(yc, m):
        X = rng.standard_normal((m, T, d))
        own = np.where(yc > 0, 0, 1)
        X[np.arange(m), 0, own] += mu
        X[np.arange(m), 1, own] += rho * mu
        X[np.arange(m), 2, 1 - own] += rho * mu
        return X

    X = draw(y_clean, n)
    nu = np.zeros(d)
    nu[0], nu[1] = 1.0, -1.0
    nu /= np.sqrt(2.0) * mu
    h = X @ nu
    p = np.zeros(d)

    def forward(X, h, p):
        a = X @ p
        a = a - a.max(-1, keepdims=True)
        e = np.exp(a)
        sm = e / e.sum(-1, keepdims=True)
        return sm, (sm * h).sum(-1)

    for _ in range(steps):
        sm, f = forward(X, h, p)
        m = y * f
        gf = -y / (1.0 + np.exp(m)) / n
        c = gf[:, None] * sm * (h - f[:, None])
        p -= lr * np.einsum("nt,ntd->d", c, X)
    train_acc = float(np.mean(y * forward(X, h, p)[1] > 0))
    yt = np.where(np.arange(200) < 100, 1.0, -1.0)
    Xt = draw(yt, 200)
    test_acc = float(np.mean(yt * forward(Xt, Xt @ nu, p)[1] > 0))
    return train_acc, test_acc


def numpy_rate(d: int, n_runs: int, steps: int) -> float:
    t = time.perf_counter()
    for i in range(n_runs):
        numpy_run(d, steps, i)
    return n_runs / (time.perf_counter() - t)


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def _print_table(title: str, header: list[str], rows: list[list], note: str = "") -> None:
    print(f"\n## {title}")
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    if note:
        print(note)
    sys.stdout.flush()


def _fmt(x: float, approx: bool = False) -> str:
    s = f"{x:.3g}" if x < 100 else f"{x:.0f}"
    return ("~" + s) if approx else s


def section_loop(q: bool, repeat: int, out: dict, steps: int | None = None) -> None:
    ds = [1000] if q else [1000, 2000, 5000]
    steps = steps or (100 if q else 1000)
    n_batch, n_loop, n_np = (8, 2, 1) if q else (64, 8, 2)
    rows = []
    for d in ds:
        b = batched_rate("direct", d, n_batch, steps, repeat=repeat)
        lp = per_run_rate("direct", d, n_loop, steps, repeat=repeat)
        npr = numpy_rate(d, n_np, steps)
        out.setdefault("loop", []).append({"d": d, "steps": steps, "batched": b, "per_run": lp,
                                           "numpy": npr})
        rows.append([d, _fmt(b), _fmt(lp), _fmt(npr), f"{b / lp:.2f}", f"{b / npr:.1f}"])
    _print_table(
        f"issue 2: direct engine, batched vs one at a time vs NumPy ({steps} steps, runs/s)",
        ["d", "batched", "per-run jit", "numpy", "batched/per-run", "batched/numpy"], rows,
        f"batched: {n_batch} runs through the sweep's chunk function; per-run: {n_loop} runs; "
        f"numpy: {n_np} run(s)",
    )


def section_engines(q: bool, repeat: int, out: dict, steps: int | None = None) -> None:
    ds = [1000, 10_000] if q else [1000, 10_000, 100_000, 1_000_000]
    steps = steps or (100 if q else 1000)
    rows = []
    for d in ds:
        big = d >= 50_000
        rec = {"d": d}
        # direct, batched and per-run: extrapolated from short runs where d is large
        if big:
            pair = (50, 150) if d <= 200_000 else (20, 60)
            rec["direct"] = extrapolated(
                lambda s, d=d: batched_rate("direct", d, 2, s, repeat=repeat), steps, pair)
            rec["per_run"] = extrapolated(
                lambda s, d=d: per_run_rate("direct", d, 1, s, repeat=repeat), steps, pair)
        else:
            n = 4 if q else 16
            rec["direct"] = batched_rate("direct", d, n, steps, repeat=repeat)
            rec["per_run"] = per_run_rate("direct", d, 2 if q else 4, steps, repeat=repeat)
        n_g = 2 if d >= 1_000_000 else (4 if big or q else 32)
        rec["gram"] = batched_rate("gram", d, n_g, steps, repeat=repeat)
        rec["reduced"] = batched_rate("reduced", d, 64 if q else 512, steps, repeat=repeat)
        rec["approx"] = big
        out.setdefault("engines", []).append(rec)
        rows.append([d, _fmt(rec["direct"], big), _fmt(rec["per_run"], big), _fmt(rec["gram"]),
                     _fmt(rec["reduced"]), _fmt(rec["gram"] / rec["direct"], big),
                     _fmt(rec["reduced"] / rec["direct"], big),
                     _fmt(rec["reduced"] / rec["per_run"], big)])
    _print_table(
        f"issue 4: runs/s per engine ({steps} steps)",
        ["d", "direct", "per-run", "gram", "reduced", "gram/direct", "reduced/direct",
         "reduced/per-run"], rows,
        f"~ : direct and per-run timed at 50 and 150 steps (d = 1e5) or 20 and 60 steps (d = 1e6) "
        f"and extrapolated linearly to {steps} steps",
    )


def section_blocks(q: bool, repeat: int, out: dict, steps: int | None = None) -> None:
    blocks = [1, 4] if q else [1, 2, 4, 8, 16, 32]
    steps = steps or (100 if q else 1000)
    rows = []
    for engine, ds, n in (("direct", [1000, 2000], 8 if q else 64),
                          ("reduced", [2000], 64 if q else 512)):
        for d in ([ds[0]] if q else ds):
            rates = [batched_rate(engine, d, n, steps, block=b, repeat=repeat) for b in blocks]
            best = blocks[int(np.argmax(rates))]
            out.setdefault("blocks", []).append({"engine": engine, "d": d, "blocks": blocks,
                                                 "rates": rates, "best": best})
            rows.append([engine, d] + [_fmt(r) for r in rates] + [best])
    _print_table(f"block size: runs/s per vmapped block ({steps} steps, all devices)",
                 ["engine", "d"] + [f"b={b}" for b in blocks] + ["best"], rows)


def section_precision(q: bool, out: dict, steps: int | None = None) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import jax.random as jr

    from .data import Batch
    from .engines.prompt import reduced_sample
    from .engines.span import flat_gram, span_gd
    from .models import sakamoto_head

    ds = [1000, 1_000_000] if q else [1000, 10_000, 100_000, 1_000_000]
    seeds = 4 if q else 16
    steps = steps or (200 if q else 1000)
    n, T = SETTINGS["n"], SETTINGS["T"]
    roles = np.array([0, 1, 2] + [3] * (T - 3))
    rows = []
    for d in ds:
        for kappa in (0.1, 4.0, 200.0):
            mu = math.sqrt(kappa * d / n)
            sw = {"signal_norm": jnp.float64(mu), "rho": jnp.float64(0.1),
                  "sigma_eps": jnp.float64(1.0), "noise_ratio": jnp.float64(0.2),
                  "n_flip_per_class": jnp.int32(2), "dim": jnp.int32(d)}

            def one(key, dtype, sw=sw, d=d):
                b64 = reduced_sample(key, n, d, roles, sw, label_mode="balanced",
                                     label_noise="fraction", dtype=jnp.float64)
                b = Batch(*(x.astype(dtype) if x.dtype == jnp.float64 else x for x in b64))
                nu = sakamoto_head(b.X.shape[-1], sw["signal_norm"].astype(dtype), dtype)
                h = b.X @ nu
                K = flat_gram(b.X)
                res = span_gd(K, jnp.zeros((n, T), dtype), h, jnp.asarray(SETTINGS["lr"], dtype),
                              steps, (), lambda *a: {}, b, roles == 0)
                f, s, a = res[1]
                return a.astype(jnp.float64), res[2], jnp.mean(b.y * f > 0)

            keys = jax.vmap(lambda i: jr.fold_in(jr.PRNGKey(1), i))(jnp.arange(seeds))
            a64, ff64, acc64 = jax.jit(jax.vmap(lambda k: one(k, jnp.float64)))(keys)
            a32, ff32, acc32 = jax.jit(jax.vmap(lambda k: one(k, jnp.float32)))(keys)
            a64, a32 = np.asarray(a64), np.asarray(a32)
            gap64 = a64 - a64.max(-1, keepdims=True)
            gap32 = a32 - a32.max(-1, keepdims=True)
            err = float(np.max(np.abs(gap64 - gap32)))
            rel = err / max(float(np.max(np.abs(gap64))), 1e-30)
            ff_diff = float(np.mean(np.any(np.asarray(ff64) != np.asarray(ff32), axis=-1)))
            acc_diff = float(np.max(np.abs(np.asarray(acc64) - np.asarray(acc32))))
            out.setdefault("precision", []).append(
                {"d": d, "n_snr2": kappa, "logit_gap_err": err, "rel": rel,
                 "runs_first_fit_differs": ff_diff, "train_acc_diff": acc_diff})
            rows.append([d, kappa, f"{mu:.3g}", f"{err:.2e}", f"{rel:.1e}", f"{ff_diff:.2f}",
                         f"{acc_diff:.2f}"])
    _print_table(
        f"precision: reduced engine float32 vs float64 on identical data ({seeds} runs, "
        f"{steps} steps)",
        ["d", "n SNR^2", "||mu||", "max |logit gap err|", "relative", "runs w/ first-fit diff",
         "max train-acc diff"], rows,
        "logit gap = a_t - max_t a_t (what the softmax sees); data drawn in float64, then cast",
    )


def section_heatmap(seeds: int, out: dict) -> None:
    root = Path(__file__).resolve().parent.parent
    sweep_file = root / "sweeps" / "sakamoto_heatmap.toml"
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(Path(tmp) / "jax-cache"))
        cmd = [sys.executable, "-m", "phasebo.sweep", str(sweep_file), "--seeds", str(seeds),
               "--out", str(Path(tmp) / "out"), "--no-plots", "--quiet"]
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        engines = ""
        if proc.returncode == 0:
            import pandas as pd

            df = pd.read_parquet(Path(tmp) / "out" / "results.parquet", columns=["engine"])
            engines = ",".join(sorted(df["engine"].unique()))
    n_runs = 39 * 39 * seeds
    out["heatmap"] = {"seeds": seeds, "runs": n_runs, "wall_s": wall, "rc": proc.returncode,
                      "engine": engines}
    status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}: {proc.stderr[-500:]}"
    _print_table(
        "heatmap: python -m phasebo.sweep sweeps/sakamoto_heatmap.toml (fresh compilation cache)",
        ["seeds", "runs", "engine", "wall s", "runs/s", "status"],
        [[seeds, n_runs, engines, f"{wall:.1f}", f"{n_runs / wall:.0f}", status]],
    )


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m phasebo.bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    p.add_argument("--sections", default="loop,engines,blocks",
                   help="comma list of loop, engines, blocks, precision, heatmap "
                        "(default: loop,engines,blocks)")
    p.add_argument("--precision", action="store_true", help="add the float32/float64 section")
    p.add_argument("--heatmap", action="store_true",
                   help="add the timing of the full sweeps/sakamoto_heatmap.toml")
    p.add_argument("--heatmap-seeds", type=int, default=100, help="seeds per heatmap cell")
    p.add_argument("--repeat", type=int, default=2,
                   help="timed runs per figure: one warm-up, then the best of the rest")
    p.add_argument("--steps", type=int, help="GD steps per run (default: 1000, quick: 100)")
    p.add_argument("--json", help="also write the measurements to this JSON file")
    p.add_argument("--cpu-devices", type=int, help="split the CPU into this many devices "
                                                   "(default: one per core, as the sweep)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import jax

    ncpu = args.cpu_devices or os.cpu_count() or 1
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:
            jax.config.update("jax_num_cpu_devices", ncpu)
        except RuntimeError:  # JAX already started (called in-process): keep its devices
            pass
    import phasebo  # noqa: F401  (registers models and engines)

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if args.precision and "precision" not in sections:
        sections.append("precision")
    if args.steps is not None and args.steps < 1:
        print(f"phasebo.bench: error: --steps = {args.steps} must be >= 1", file=sys.stderr)
        return 2
    if args.heatmap and "heatmap" not in sections:
        sections.append("heatmap")
    known = {"loop", "engines", "blocks", "precision", "heatmap"}
    bad = [s for s in sections if s not in known]
    if bad:
        print(f"phasebo.bench: error: unknown section {bad[0]!r}; known: {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    devs = jax.local_devices()
    print(f"phasebo.bench: {len(devs)} {devs[0].platform} device(s), {os.cpu_count()} cores, "
          f"jax {jax.__version__}{', quick' if args.quick else ''}")
    out: dict = {"devices": len(devs), "platform": devs[0].platform, "quick": args.quick}
    t0 = time.perf_counter()
    repeat = args.repeat
    # precision turns on float64: run it after the float32 timings
    order = [s for s in ("loop", "engines", "blocks", "heatmap", "precision") if s in sections]
    for s in order:
        if s == "loop":
            section_loop(args.quick, repeat, out, args.steps)
        elif s == "engines":
            section_engines(args.quick, repeat, out, args.steps)
        elif s == "blocks":
            section_blocks(args.quick, repeat, out, args.steps)
        elif s == "heatmap":
            section_heatmap(args.heatmap_seeds if not args.quick else 1, out)
        elif s == "precision":
            section_precision(args.quick, out, args.steps)
    out["total_s"] = time.perf_counter() - t0
    print(f"\nphasebo.bench: done in {out['total_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
