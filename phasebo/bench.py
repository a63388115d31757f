"""Side-by-side benchmarks: ``python -m phasebo.bench [--quick] [--sections A,B,...]``.

Unless a section says otherwise: prompt attention with ``p`` trained (W = I), n = 20, T = 8,
||mu|| = 20, 1000 full-batch GD steps of 0.005, timed after compilation (AOT-compiled, one warm-up
run, then the best of ``--repeat - 1`` timed runs). Every figure of a table is measured in the
same run, so the ratios compare like with like on this machine. Sections:

- **loop**: the sweep's batched block function fed as a sweep feeds it (runs sharded over the
  local devices, vmapped blocks) vs one jitted run at a time vs plain NumPy, d in
  {1000, 2000, 5000}, direct engine.
- **engines**: runs/s of the direct, gram and reduced engines at d = 10^3 .. 10^6 and their ratios
  (direct and per-run timed at two short step counts and extrapolated where they would take
  minutes; marked ``~``).
- **wp**: trained W and p (the papers' official runs): direct vs gram engine, d = 1000 .. 5000.
- **blocks**: runs/s per vmapped block size (the planner's choice is the best measured here).
- **dynamics**: S2's three regimes with ``record_every = 0`` / ``10`` / ``record_log = 20``.
- **traces**: traces per sweep for the README job, the heatmap, S2 and the Magen (SNR, n) map:
  one per compiled program, however many values of d or ||mu||.
- **readme**: ``python -m phasebo.sweep sweeps/default.toml`` as a subprocess, whole process,
  with an empty and then a warm compilation cache.
- **heatmap**: ``python -m phasebo.sweep sweeps/sakamoto_heatmap.toml`` (39 x 39 x
  ``--heatmap-seeds``) as a subprocess with an empty cache (:mod:`phasebo.bench_maps`).
- **wpmap**: the trained-W map ``sweeps/sakamoto_heatmap_official.toml`` (39 x 39 x 10) the same
  way, with its compile time and programs.
- **flow**: gradient flow to tau = 500 (Bosh3 and Tsit5) vs 10^5 GD steps (records included),
  and the long-horizon flow map (``sweeps/flow_horizons.toml``) as a subprocess.
- **vit**: the digits ViT's phase 2: a gradient step computing only the last block's CLS row
  vs the whole block, and the paper's recipe at n = 20 as a sweep.
- **precision**: the reduced engine in float32 vs float64 at the three S2 regimes, d = 10^3 .. 10^6.
- **gpu**: on an accelerator, the papers' sweeps each as its own ``python -m phasebo.sweep``
  process with an empty compilation cache: the p-only heatmap (100 seeds, figures and report),
  the trained-W heatmap (10 seeds), S2 with dynamics (10,000 seeds), the independent-noise map,
  the map with TF32 products and with smaller blocks (:data:`phasebo.bench_maps.GPU_JOBS`;
  ``--gpu-jobs`` picks some, ``--keep DIR`` keeps their tables to compare with a CPU run).

The default sections are ``loop,engines,wp,blocks,dynamics,traces,readme``; ``all`` runs every
section. ``--quick`` shrinks each one. Timings on a shared machine are noisy.
"""

from __future__ import annotations

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


def _group(engine: str, d: int, n_runs: int, steps: int, block: int | None = None, **extra):
    """``(group, arrays, n_devices)``: the sweep's plan for ``n_runs`` seeds of one setting."""
    import jax.numpy as jnp

    from .config import spec_from_dict
    from .grid import chunk_arrays
    from .plan import plan

    horizon = {} if extra.get("dynamics") == "flow" else {"steps": steps}  # a flow has flow_time
    spec = spec_from_dict({**SETTINGS, "engine": engine, "d": d, **horizon, **extra},
                          seeds=n_runs)
    pl = plan(spec, chunk_size=n_runs, block_size=block)
    g = pl.groups[0]
    arrays = chunk_arrays(spec, g, [(g.cells[0], np.arange(n_runs))], g.block * pl.n_dev)[0]
    return g, {k: jnp.asarray(v) for k, v in arrays.items()}, pl.n_dev


def batched_rate(engine: str, d: int, n_runs: int, steps: int, block: int | None = None,
                 repeat: int = 1, **extra) -> float:
    """Runs/s of the sweep's compiled block function fed a chunk as a sweep feeds it (all local
    devices). The chunk is padded to whole blocks, and its padding computes as runs do: the rate
    counts every slot, the throughput of a long sweep, where padding is a sliver of a chunk."""
    from .execute import Executor

    g, arrays, n_dev = _group(engine, d, n_runs, steps, block, **extra)
    ex = Executor()
    compiled = ex.compile(g, ex.lower(g, arrays, n_dev), n_dev)
    width = len(next(iter(arrays.values())))
    unit = g.block * n_dev
    if repeat > 1:
        ex.compute(compiled, arrays, unit)  # warm-up (thread pools, allocator)
    best = math.inf
    for _ in range(max(1, repeat - 1)):
        t = time.perf_counter()
        ex.compute(compiled, arrays, unit)
        best = min(best, time.perf_counter() - t)
    return width * g.members / best  # a grouped chunk holds noise groups


def interleaved_rates(engine: str, d: int, n_runs: int, steps: int, variants: dict,
                      rounds: int, **common) -> dict[str, list[float]]:
    """Runs/s of several variants of one setting (``variants``: label -> extra settings), each
    compiled and warmed up first, then timed in turns: round r times every variant once, so a
    slow moment of a shared machine falls on all of them alike and their ratios can be taken
    round by round (:func:`paired_ratio`)."""
    from .execute import Executor

    ready = {}
    for label, extra in variants.items():
        g, arrays, n_dev = _group(engine, d, n_runs, steps, None, **common, **extra)
        ex = Executor()
        compiled = ex.compile(g, ex.lower(g, arrays, n_dev), n_dev)
        unit = g.block * n_dev
        ex.compute(compiled, arrays, unit)  # warm-up (thread pools, allocator)
        ready[label] = (compiled, arrays, unit, len(next(iter(arrays.values()))) * g.members)
    rates: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(max(1, rounds)):
        for label, (compiled, arrays, unit, n) in ready.items():
            t = time.perf_counter()
            Executor.compute(compiled, arrays, unit)
            rates[label].append(n / (time.perf_counter() - t))
    return rates


def paired_ratio(a: list[float], b: list[float]) -> float:
    """The median over rounds of ``a[r] / b[r]`` (rates timed side by side in each round)."""
    return float(np.median(np.asarray(a) / np.asarray(b)))


def per_run_rate(engine: str, d: int, n_runs: int, steps: int, repeat: int = 1,
                 **extra) -> float:
    """Runs/s of one jitted run at a time (a Python loop over runs, one device)."""
    import jax

    from .sweep import prepare_one

    model, eng, program, sw, key = prepare_one({**SETTINGS, "engine": engine, "d": d,
                                                "steps": steps, **extra})
    one = jax.jit(lambda s, k: eng.run(model, program, s, k))
    keys = [jax.random.fold_in(key, i) for i in range(n_runs)]
    from .execute import tracing

    with tracing(program):  # as the sweep's programs
        compiled = one.lower(sw, keys[0]).compile()
    if repeat > 1:
        jax.block_until_ready(compiled(sw, keys[0]))  # warm-up
    best = math.inf
    for _ in range(max(1, repeat - 1)):
        t = time.perf_counter()
        for k in keys:
            jax.block_until_ready(compiled(sw, k))
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
        a = (X.reshape(-1, d) @ p).reshape(h.shape)  # one BLAS matrix-vector product
        a = a - a.max(-1, keepdims=True)
        e = np.exp(a)
        sm = e / e.sum(-1, keepdims=True)
        return sm, (sm * h).sum(-1)

    Xf = X.reshape(n * T, d)
    for _ in range(steps):
        sm, f = forward(X, h, p)
        m = y * f
        gf = -y / (1.0 + np.exp(m)) / n
        c = gf[:, None] * sm * (h - f[:, None])
        p -= lr * (c.reshape(-1) @ Xf)  # BLAS, ~3x np.einsum("nt,ntd->d") at d 5000
    train_acc = float(np.mean(y * forward(X, h, p)[1] > 0))
    yt = np.where(np.arange(200) < 100, 1.0, -1.0)
    Xt = draw(yt, 200)
    test_acc = float(np.mean(yt * forward(Xt, Xt @ nu, p)[1] > 0))
    return train_acc, test_acc


def numpy_rate(d: int, n_runs: int, steps: int, s=SETTINGS) -> float:
    t = time.perf_counter()
    for i in range(n_runs):
        numpy_run(d, steps, i, s)
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
        f"loop: direct engine, batched vs one at a time vs NumPy ({steps} steps, runs/s)",
        ["d", "batched", "per-run jit", "numpy", "batched/per-run", "batched/numpy"], rows,
        f"batched: {n_batch} runs through the sweep's block function; per-run: {n_loop} runs; "
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
        f"engines: runs/s per engine ({steps} steps)",
        ["d", "direct", "per-run", "gram", "reduced", "gram/direct", "reduced/direct",
         "reduced/per-run"], rows,
        f"~ : direct and per-run timed at 50 and 150 steps (d = 1e5) or 20 and 60 steps (d = 1e6) "
        f"and extrapolated linearly to {steps} steps",
    )


def section_blocks(q: bool, repeat: int, out: dict, steps: int | None = None) -> None:
    """Runs/s by block size: the direct engine (a few runs of d-dimensional tokens) and the reduced
    engine (N x N Grams; its CPU default: the Grams half a core's L2 holds where that is at least
    8, else 64 runs without records, 32 with), the planner's own block among them."""
    from .plan import core_cache_bytes

    steps = steps or (100 if q else 1000)
    sizes = {"direct": [1, 4] if q else [1, 2, 4, 8, 16, 32],
             "reduced": [4, 16] if q else [8, 16, 32, 64, 128]}
    rows, chosen = [], {}
    for engine, ds, n in (("direct", [1000, 2000], 8 if q else 64),
                          ("reduced", [2000], 64 if q else 1024)):
        for d in ([ds[0]] if q else ds):
            chosen[engine, d] = _group(engine, d, n, steps)[0].block
            blocks = sorted({*sizes[engine], chosen[engine, d]})
            rates = [batched_rate(engine, d, n, steps, block=b, repeat=repeat) for b in blocks]
            best = blocks[int(np.argmax(rates))]
            out.setdefault("blocks", []).append({"engine": engine, "d": d, "blocks": blocks,
                                                 "rates": rates, "best": best,
                                                 "planned": chosen[engine, d]})
            rows.append([engine, d, " / ".join(f"{b}: {_fmt(r)}" for b, r in zip(blocks, rates)),
                         best, chosen[engine, d]])
    l2 = core_cache_bytes() if out.get("platform", "cpu") == "cpu" else None
    _print_table(f"block size: runs/s per vmapped block ({steps} steps, all devices)",
                 ["engine", "d", "block: runs/s", "best", "planned"], rows,
                 "planned: the sweep's own block on this machine"
                 + (f" (a core's L2: {l2 >> 10} KiB)" if l2 else ""))


def section_wp(q: bool, repeat: int, out: dict, steps: int | None = None) -> None:
    """Trained W and p (the papers' official setting): the direct engine touches d x d numbers
    per step, the gram engine trains W in the span of the data exactly (same numbers)."""
    ds = [1000] if q else [1000, 2000, 5000]
    steps = steps or (100 if q else 1000)
    rows = []
    for d in ds:
        pair = (10, 30) if d >= 2000 else (20, 60)
        direct = extrapolated(lambda s, d=d: batched_rate("direct", d, 2, s, repeat=repeat,
                                                          train=("p", "W")), steps, pair)
        gram = batched_rate("gram", d, 16, steps, repeat=repeat, train=("p", "W"))
        out.setdefault("wp", []).append({"d": d, "steps": steps, "direct": direct, "gram": gram})
        rows.append([d, _fmt(direct, True), _fmt(gram), _fmt(gram / direct, True),
                     f"{1 / direct:.1f}", f"{1 / gram:.3f}"])
    _print_table(f"trained W and p: direct vs gram engine ({steps} steps)",
                 ["d", "direct runs/s", "gram runs/s", "gram/direct", "direct s/run", "gram s/run"],
                 rows, "~ : direct timed at two short step counts and extrapolated linearly")


S2_CASES = ((5000, 5.0), (2000, 20.0), (1000, 100.0))


def whole_sweep(records: list[dict], keys) -> dict:
    """Runs/s of a sweep made of ``records``' settings with equal runs each: seconds per run add
    up, so each rate is the harmonic mean of the settings' rates."""
    return {k: len(records) / sum(1.0 / r[k] for r in records) for k in keys}


def section_dynamics(q: bool, repeat: int, out: dict, steps: int | None = None) -> None:
    """S2 (the fig. 3 sweep's three regimes) recorded every 10 steps, at 20 log-spaced steps and
    not at all (the sweep's block function), timed in turns (:func:`interleaved_rates`: the
    ratios are medians of round-by-round ratios); beside it a plain NumPy loop over the same
    runs one at a time (p only, W = I, no records: what a user would script), timed once per
    round (median). The last row is the fig. 3 sweep as a whole: its three settings with equal
    runs each, so its rates are the harmonic means of the rows'."""
    steps = steps or 1000
    n = 256 if q else 1000
    n_np = 1 if q else 2
    rounds = max(2 if q else 3, repeat)
    rows = []
    variants = {"none": {}, "every 10": {"record_every": 10}, "log 20": {"record_log": 20}}
    for d, mu in ([S2_CASES[1]] if q else S2_CASES):
        timed = interleaved_rates("reduced", d, n, steps, variants, rounds, signal_norm=mu)
        rates = {k: float(np.median(v)) for k, v in timed.items()}
        r10, r20 = (paired_ratio(timed[k], timed["none"]) for k in ("every 10", "log 20"))
        npr = float(np.median([numpy_rate(d, n_np, steps, {**SETTINGS, "signal_norm": mu})
                               for _ in range(rounds)]))
        out.setdefault("dynamics", []).append({"d": d, "signal_norm": mu, "runs": n, **rates,
                                               "rounds": rounds, "every10_over_none": r10,
                                               "numpy": npr})
        rows.append([d, mu, _fmt(rates["none"]), _fmt(rates["every 10"]), _fmt(rates["log 20"]),
                     f"{r10:.2f}", f"{r20:.2f}", _fmt(npr), f"{rates['every 10'] / npr:.0f}"])
    got = out.get("dynamics", [])[-len(rows):]
    if len(got) > 1:
        whole = out["dynamics_sweep"] = whole_sweep(got, ("none", "every 10", "log 20", "numpy"))
        rows.append(["all", "", _fmt(whole["none"]), _fmt(whole["every 10"]),
                     _fmt(whole["log 20"]), f"{whole['every 10'] / whole['none']:.2f}",
                     f"{whole['log 20'] / whole['none']:.2f}", _fmt(whole["numpy"]),
                     f"{whole['every 10'] / whole['numpy']:.0f}"])
    _print_table(f"dynamics: S2 runs/s with and without records ({n} runs, {steps} steps, "
                 f"reduced engine; medians of {rounds} rounds timed in turns)",
                 ["d", "||mu||", "no records", "every 10", "log 20", "every10/none", "log20/none",
                  "numpy", "every10/numpy"], rows,
                 f"numpy: {n_np} run(s) one at a time, no records, median of {rounds}; all: the "
                 "three settings as one sweep (equal runs each); targets: every10/none >= 0.7, "
                 "every10/numpy >= 200")


def section_flow(q: bool, repeat: int, out: dict) -> None:
    """Gradient flow to tau = 500 against 10^5 GD steps of 5e-3 (the same flow time) on runs of
    the same settings through the sweep's block function (reduced engine, 20 log-spaced records),
    the flow by Bosh3 (the default) and Tsit5; then ``sweeps/flow_horizons.toml`` (tau = 5000,
    39 x 39 x seeds) as a subprocess with an empty compilation cache."""
    n, rows = (32 if q else 64), []
    for d, mu in ([S2_CASES[1]] if q else S2_CASES):
        gd = batched_rate("reduced", d, n, 100_000, repeat=1, signal_norm=mu, record_log=20)
        fl, ts = (batched_rate("reduced", d, n, 0, repeat=repeat, signal_norm=mu, record_log=20,
                               dynamics="flow", flow_time=500.0, flow_solver=solver)
                  for solver in ("bosh3", "tsit5"))
        out.setdefault("flow", []).append({"d": d, "signal_norm": mu, "runs": n, "gd": gd,
                                           "flow": fl, "flow_tsit5": ts})
        rows.append([d, mu, n, _fmt(gd), _fmt(fl), f"{fl / gd:.0f}", _fmt(ts), f"{ts / gd:.0f}"])
    _print_table("flow: runs/s to tau = 500, GD (10^5 steps of 5e-3) vs gradient flow (rtol 1e-5, "
                 "Bosh3; Tsit5 draws its own data), reduced engine, 20 log-spaced records",
                 ["d", "||mu||", "runs", "GD runs/s", "flow runs/s", "flow/GD", "tsit5 runs/s",
                  "tsit5/GD"], rows, "target: flow >= 50x GD")
    seeds = 1 if q else 10
    sweep_file = Path(__file__).resolve().parent.parent / "sweeps" / "flow_horizons.toml"
    with tempfile.TemporaryDirectory() as tmp:
        wall, rc, err = _sweep_proc([str(sweep_file), "--seeds", str(seeds), "--out",
                                     str(Path(tmp) / "out"), "--quiet"], Path(tmp) / "cache")
    n_runs = 39 * 39 * seeds
    out["flow_map"] = {"seeds": seeds, "runs": n_runs, "wall_s": wall, "rc": rc}
    _print_table("flow: python -m phasebo.sweep sweeps/flow_horizons.toml (tau = 5000, empty "
                 "compilation cache, figures and report included)",
                 ["seeds", "runs", "wall s", "runs/s", "status"],
                 [[seeds, n_runs, f"{wall:.1f}", f"{n_runs / wall:.0f}",
                   "ok" if rc == 0 else f"FAILED rc={rc}: {err[-500:]}"]])


def _sweep_proc(args: list[str], cache: Path, env: dict | None = None,
                timeout: float | None = None) -> tuple[float, int, str]:
    """``python -m phasebo.sweep ARGS`` with its compilation cache at ``cache``: (whole-process
    seconds, exit status, stderr); a run past ``timeout`` seconds is killed (status -9).
    ``env``: the child's whole environment (default: this process's); a compilation cache of the
    user's own (``JAX_COMPILATION_CACHE_DIR``) is left out, so ``cache`` is the one it uses."""
    env = dict(os.environ if env is None else env, PHASEBO_CACHE=str(cache))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "phasebo.sweep", *args], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else \
            (e.stderr or "")
        return time.perf_counter() - t, -9, f"killed after {timeout:.0f} s\n{err}"
    return time.perf_counter() - t, proc.returncode, proc.stderr


def section_readme(q: bool, out: dict) -> None:
    """The README's main job (``python -m phasebo.sweep sweeps/default.toml``: 1000 runs with
    dynamics, tables and figures), whole process, with an empty and with a warm compilation
    cache; then, on that cache, new 4-run studies (the README's ``--set`` example and another
    like it): their whole-process time and the compile time their manifests record."""

    sweep_file = Path(__file__).resolve().parent.parent / "sweeps" / "default.toml"
    rows = []
    studies = (("4-run study (README --set)", ["--set", "d=1000", "--set", "signal_norm=[10, 40]",
                                              "--seeds", "2"]),
               ("another 4-run study", ["--set", "d=300", "--set", "signal_norm=[20, 30]",
                                        "--seeds", "2"]))
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        jobs = [(label, f"o{run}", []) for label, run in (("cold", 0), ("warm", 1), ("warm", 2))]
        if q:
            jobs = jobs[:2]
        for label, name, extra in jobs + [(lab, f"s{i}", ex) for i, (lab, ex) in
                                          enumerate(studies)]:
            o = Path(tmp) / name
            wall, rc, err = _sweep_proc([str(sweep_file), "--out", str(o), "--quiet", *extra],
                                        cache)
            compile_s = json.loads((o / "manifest.json").read_text()).get("compile_s") \
                if rc == 0 else None
            out.setdefault("readme", []).append({"job": label, "wall_s": wall, "rc": rc,
                                                 "compile_s": compile_s})
            rows.append([label, f"{wall:.1f}", f"{compile_s:.1f}" if compile_s is not None
                         else "-", "ok" if rc == 0 else f"FAILED: {err[-300:]}"])
        outputs = []
        warm = Path(tmp) / "o1"
        if (warm / "manifest.json").exists():  # what the job writes besides its runs
            from .report_html import write_report

            man = json.loads((warm / "manifest.json").read_text())
            path, t_report = write_report(warm)
            size = path.stat().st_size / 2**20
            out["readme_outputs"] = {"run_s": man.get("run_s"),
                                     "tables_figures_s": man.get("tables_figures_s"),
                                     "report_s": t_report, "report_mib": size}
            outputs = [["runs (manifest)", f"{man.get('run_s', float('nan')):.1f}", ""],
                       ["tables and figures (manifest)",
                        f"{man.get('tables_figures_s', float('nan')):.1f}", ""],
                       ["report.html (write_report, in process)", f"{t_report:.1f}",
                        f"{size:.1f} MiB"]]
    _print_table("readme: python -m phasebo.sweep sweeps/default.toml, whole process; then new "
                 "small studies on the same cache",
                 ["job (compilation cache)", "wall s", "compile s", "status"], rows,
                 "targets: <= 20 s cold, <= 10 s warm on 2 cores; a new small study compiles "
                 "<= 5 s")
    if outputs:
        _print_table("readme: where the warm job's time goes after its runs",
                     ["part", "s", "size"], outputs)


def section_traces(q: bool, out: dict) -> None:
    """Traces per sweep: every group of runs that share a compiled program is traced once."""
    import jax

    from . import plan as P
    from . import sweep as S
    from .config import load_sweep
    from .execute import Executor

    root = Path(__file__).resolve().parent.parent / "sweeps"
    rows = []
    for name, seeds in (("default.toml", 1), ("sakamoto_heatmap.toml", 1),
                        ("sakamoto_fig3.toml", 2), ("magen_snr_n_heatmap.toml", 1)):
        spec = load_sweep(root / name, seeds=seeds)
        pl = P.plan(spec)
        jax.clear_caches()  # a fresh process's count
        ex = Executor()
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            S.run_sweep(spec, Path(tmp) / "o", quiet=True, plots=False, executor=ex)
            wall = time.perf_counter() - t
        traces = sum(ex.traces.values())
        cells = sum(len(g.cells) for g in pl.groups)
        out.setdefault("traces", []).append({"sweep": name, "cells": cells, "groups":
                                             len(pl.groups), "traces": traces, "wall_s": wall})
        rows.append([name, spec.n_runs, cells, len(pl.groups), traces, f"{wall:.1f}"])
    _print_table("traces: one trace per compiled program (1-2 seeds per cell)",
                 ["sweep", "runs", "static cells", "groups", "traces", "wall s (incl. compile)"],
                 rows)


def section_precision(q: bool, out: dict, steps: int | None = None) -> None:
    """The reduced engine in float32 vs float64 (same keys; the normals are drawn in each
    precision, so runs agree in distribution, not bit for bit): the cell means of test accuracy
    and the regime fractions at S2's three regimes and at d = 10^3 .. 10^6."""
    from . import sweep as S
    from .config import spec_from_dict

    ds = [1000, 1_000_000] if q else [1000, 10_000, 100_000, 1_000_000]
    seeds = 32 if q else 128
    steps = steps or (200 if q else 1000)
    rows = []
    for d in ds:
        for kappa in (0.1, 4.0, 200.0):
            mu = math.sqrt(kappa * d / SETTINGS["n"])
            res = {}
            for dtype in ("float32", "float64"):
                spec = spec_from_dict({**SETTINGS, "d": d, "signal_norm": mu, "steps": steps,
                                       "dtype": dtype}, seeds=seeds)
                with tempfile.TemporaryDirectory() as tmp:
                    res[dtype] = S.run_sweep(spec, Path(tmp) / "o", quiet=True, plots=False)
            a, b = res["float32"], res["float64"]
            dacc = float(a["test_acc"].mean() - b["test_acc"].mean())
            se = float(np.hypot(a["test_acc"].std() / np.sqrt(seeds),
                                b["test_acc"].std() / np.sqrt(seeds)))
            dreg = {r: float((a["regime"] == r).mean() - (b["regime"] == r).mean())
                    for r in ("benign", "harmful", "not_overfitting")}
            div = int((a["status"] != "ok").sum()), int((b["status"] != "ok").sum())
            out.setdefault("precision", []).append({"d": d, "n_snr2": kappa, "test_acc_diff": dacc,
                                                    "se": se, "regime_diff": dreg,
                                                    "not_ok": div})
            rows.append([d, kappa, f"{mu:.3g}", f"{b['test_acc'].mean():.4f}", f"{dacc:+.4f}",
                         f"{se:.4f}", " ".join(f"{v:+.2f}" for v in dreg.values()),
                         f"{div[0]}/{div[1]}"])
    _print_table(
        f"precision: reduced engine float32 - float64 ({seeds} seeds, {steps} steps)",
        ["d", "n SNR^2", "||mu||", "test acc f64", "diff f32-f64", "se", "frac diff b/h/n",
         "not ok f32/f64"], rows)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


SECTIONS = ("loop", "engines", "wp", "blocks", "dynamics", "traces", "readme", "heatmap",
            "wpmap", "flow", "vit", "precision", "gpu")
DEFAULT_SECTIONS = ("loop", "engines", "wp", "blocks", "dynamics", "traces", "readme")


if __name__ == "__main__":  # python -m phasebo.bench: the command line's module runs it
    from .cli import guarded
    from .cli.bench import main

    sys.exit(guarded(main))
