"""Notes a sweep prints before it runs: where its settings do not do quite what they say (a flip
count that changes the noise ratio, runs that will have no clean baseline, records sparser than
the runs). Each note is one line; none refuses anything."""

from __future__ import annotations

import itertools
import math

from .config import SweepSpec, plot_where_misses, resolve


def label_noise_notes(spec: SweepSpec) -> list[str]:
    """One line per (n, noise ratio, flip rule) of the sweep whose flip count changes the requested
    ratio: ``fraction`` flips ``floor(ceil(n r) / 2)`` labels of each class, ``fixed_count``
    ``ceil(n r)``; Bernoulli flips keep the ratio in expectation and get no note. More than
    :data:`NOTES_EACH` such ratios at one (rule, n) share one line."""
    every: dict[tuple, dict] = {}  # (mode, n) -> {r: (flips, how, exact)}
    names = ("model", "n", "noise_ratio", "label_noise")
    for case in spec.cases:
        base = {**spec.fixed, **case}
        axes = {k: spec.axes[k] for k in names if k in spec.axes}
        for combo in itertools.product(*axes.values()):
            st = resolve({**base, **dict(zip(axes, combo))})
            mode, n, r = st.get("label_noise"), st.get("n"), st.get("noise_ratio")
            if mode not in ("fraction", "fixed_count") or n is None or r is None or r <= 0:
                continue
            k = int(math.ceil(round(n * r, 9)))
            flips = 2 * (k // 2) if mode == "fraction" else k
            how = (f"floor(ceil({n} * {r:g}) / 2) = {k // 2} per class" if mode == "fraction"
                   else f"ceil({n} * {r:g}) = {k}")
            every.setdefault((mode, n), {})[r] = (flips, how, abs(flips - n * r) < 1e-9)
    notes = []
    for (mode, n), all_r in every.items():
        ratios = {r: (f, how) for r, (f, how, exact) in all_r.items() if not exact}  # rounded
        if not ratios:
            continue
        if len(ratios) <= NOTES_EACH:
            for r, (flips, how) in ratios.items():
                tail = ("no label is flipped, so these runs have nothing to overfit (regime "
                        "no_noise)" if flips == 0 else f"an effective ratio of {flips / n:g}")
                notes.append(f"note: noise_ratio = {r:g} at n = {n} flips {flips} labels "
                             f"({mode}: {how}): {tail}")
            continue
        by_count: dict[int, list] = {}  # exact ratios too: 0.05 at n = 20 flips 1, as 0.01 does
        for r, (flips, _, _) in sorted(all_r.items()):
            by_count.setdefault(flips, []).append(r)
        rule = "2 floor(ceil(n r) / 2)" if mode == "fraction" else "ceil(n r)"
        r0, (f0, _) = next(iter(sorted(ratios.items())))
        k_most = max(by_count, key=lambda k: len(by_count[k]))
        most, none = by_count[k_most], len(by_count.get(0, []))
        same = (f"; values that round to the same number draw runs of the same distribution "
                f"({most[0]:g} to {most[-1]:g} all flip {k_most})" if len(most) > 1 else "")
        notes.append(
            f"note: {len(ratios)} noise_ratio values at n = {n} flip a rounded number of labels "
            f"({mode}: {rule}), so their effective ratio is that number / {n} (e.g. {r0:g} flips "
            f"{f0}){same}" + (f"; {none} flip none: nothing to overfit (regime no_noise)"
                              if none else ""))
    return notes


NOTES_EACH = 3  # flip-count notes at one (rule, n) said one by one; more share one line


def baseline_notes(spec: SweepSpec) -> list[str]:
    """A line when runs judged against the clean reference (``test_reference = "clean"``) have
    no noise-free run in the sweep: those that fit every label will read ``no_baseline``."""
    cells = list(spec.cells())
    if not any(c.settings.get("test_reference") == "clean" for c in cells):
        return []
    ratios = spec.values("noise_ratio") or [c.settings.get("noise_ratio") for c in cells]
    if 0.0 in [float(v) for v in ratios if v is not None]:
        return []
    return ["note: test_reference = \"clean\" judges benign / harmful against the sweep's "
            "noise-free runs, and noise_ratio is never 0 here: runs that fit every label will "
            "be no_baseline; add 0 to noise_ratio to judge them"]


def record_notes(spec: SweepSpec) -> list[str]:
    """A line per (record_every, steps) of the sweep whose record interval is longer than its
    runs: their dynamics hold step 0 and the last step only."""
    seen = set()
    for c in spec.cells():
        every, steps = c.settings.get("record_every") or 0, c.settings.get("steps")
        if steps and every > steps and c.settings.get("dynamics", "gd") == "gd":
            seen.add((every, steps))
    return [f"note: record_every = {e} is more than steps = {s}: the dynamics hold step 0 and "
            f"step {s} only; fix: a record_every of at most {s}, or record_log = k for k "
            "log-spaced steps" for e, s in sorted(seen)]


def rule_notes(spec: SweepSpec) -> list[str]:
    """A line per training-rule setting that does less than its name: a ``batch_size`` of at
    least ``n`` (every step sees all samples: full batch), ``optimizer = "adamw"`` on a model
    without ``weight_decay`` (its decay is 0: plain Adam), single_head's converged limit without
    a warm-up (L-BFGS from the initialisation can stop in a worse local minimum than the flow's
    end)."""
    from .registry import get_model

    seen: dict[tuple, str] = {}
    for c in spec.cells():
        st = c.settings
        b, n = st.get("batch_size") or 0, st.get("n")
        if b and n and b >= n:
            seen[("batch", b, n)] = (f"note: batch_size = {b} is at least n = {n}: every step "
                                     "sees every sample (full batch), as batch_size = 0")
        model = get_model(st["model"]) if "model" in st else None
        if st.get("optimizer") == "adamw" and model is not None and \
                "weight_decay" not in model.settings:
            seen[("adamw", model.name)] = (f"note: optimizer = \"adamw\" on {model.name}, which "
                                           "has no weight_decay setting: its decay is 0, so it "
                                           "runs as adam")
        # measured on single_head only: on prompt_attention the same warm-up can end worse
        if st.get("dynamics") == "limit" and not st.get("limit_warmup") and \
                st.get("model") == "single_head":
            seen[("limit",)] = ("note: dynamics = \"limit\" without a warm-up starts L-BFGS "
                                "at the initialisation, from where single_head's limit stopped "
                                "in a worse (harmful) local minimum than the flow's end in 1 - 5 "
                                "of 8 runs per cell (n <= 100, SNR >= 0.5); fix: limit_warmup = "
                                "400 with lr = 0.025 (400 GD steps first)")
    return list(seen.values())


def sweep_notes(spec: SweepSpec) -> list[str]:
    """Every note a sweep prints before it runs (and its dry run prints)."""
    return (label_noise_notes(spec) + baseline_notes(spec) + record_notes(spec)
            + rule_notes(spec) + precision_notes(spec) + plot_where_notes(spec)
            + common_noise_notes(spec))


def common_noise_notes(spec: SweepSpec) -> list[str]:
    """A note when ``common_noise`` names a setting that takes one value in the sweep: no two
    runs differ only along it, so nothing is shared and every run draws its own noise."""
    out = []
    for axis in dict.fromkeys(str(v) for v in spec.values("common_noise")):
        vals = {repr(v) for v in spec.values(axis)} if axis != "none" else set()
        if axis != "none" and len(vals) <= 1:
            out.append(f"note: common_noise = \"{axis}\" shares nothing here: {axis} takes one "
                       f"value in this sweep, so every run draws its own noise (as "
                       f"common_noise = \"none\"); fix: sweep {axis}, or common_noise = \"none\"")
    return out


def plot_where_notes(spec: SweepSpec) -> list[str]:
    """A note for each ``[plot]`` figure whose ``where`` names a value ``--set`` or ``--unset``
    left out of the sweep (the file's own values are checked when it is read): that figure
    will be skipped."""
    return [f"note: {w}{k} = {one!r} selects no run now that the overrides (--set, --unset) "
            f"leave {k} = {', '.join(map(repr, have[:12]))}: that figure will be skipped (fix: "
            f"override {k} to include it, or draw no figures)"
            for w, k, one, have in plot_where_misses(spec, spec.plot)]


def precision_notes(spec: SweepSpec) -> list[str]:
    """A note when a lower ``matmul_precision`` is asked for on CPU, where it changes nothing, and
    when JAX's own default matmul precision is set: phasebo's runs follow their setting instead."""
    import jax

    out = []
    lower = sorted({str(v) for v in spec.values("matmul_precision")} - {"highest"})
    if lower and jax.default_backend() == "cpu":
        out.append(f"note: matmul_precision = {', '.join(lower)} changes nothing on CPU (its "
                   "matrix products are full precision there); it lowers the precision of "
                   "float32 products on GPU and TPU only")
    own = jax.config.jax_default_matmul_precision
    if own is None:
        return out
    vals = ", ".join(sorted(map(str, spec.values("matmul_precision")))) or "highest"
    return out + [f"JAX's default matmul precision is set to {own!r}, but phasebo's runs "
                  f"compute their matrix products at their matmul_precision setting ({vals}); "
                  "to change it, set matmul_precision in the sweep (e.g. --set "
                  "matmul_precision=tensorfloat32)"]
