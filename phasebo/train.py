"""One run: ``(static config, swept values, key) -> metrics``, as one pure, jittable function.

The whole gradient-descent loop is a ``lax.scan`` over steps; the optimiser is optax's ``sgd``
built from the traced step size, so different step sizes share one compilation. Data are drawn
inside the run from the run's key, so a run's numbers do not depend on how runs are batched.

Every step (cheap, from the forward pass the gradient needs anyway) the run updates:
the step at which each sample is first fitted (``y_i f_i > 0``), the cumulative sums
``cumS_g = sum_tau sum_{i in g} s_R^(i)(tau) (1 - s_R^(i)(tau))`` of SPEC §1 for the four groups
``g`` = clean/noisy x clean class (``s_R`` is the softmax mass on the relevant tokens), and the first
step at which the loss or a gradient is not finite (divergence). At the recorded steps
(``record_every`` / ``record_log``) it stores the full metric set (test metrics included) in a
fixed-size buffer; ``lax.cond`` on an unbatched predicate keeps that cost off the other steps.

Step convention: "step t" is the state after ``t`` updates; step 0 is the initialisation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax

from . import config as C
from .config import ConfigError, Static
from .data import (
    ROLE_NAMES,
    Batch,
    n_flip_per_class,
    projected_scores,
    sakamoto_sample,
    token_roles,
)
from .models import PromptAttention, init_prompt_attention

STATUS_OK, STATUS_DIVERGED = 0, 1
STATUS_NAMES = {STATUS_OK: "ok", STATUS_DIVERGED: "diverged"}
GROUPS = ("clean_pos", "clean_neg", "noisy_pos", "noisy_neg")


class RunOutput(NamedTuple):
    """What a run returns: final scalars, recorded dynamics ``(R,)`` and per-sample ``(n,)``."""

    final: dict
    dynamics: dict
    samples: dict


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How the sweep drives a model.

    ``run(static, swept, key) -> RunOutput``; ``check(settings)`` raises :class:`ConfigError`;
    ``derived(settings) -> dict`` adds host-computed swept values (e.g. flip counts);
    ``bytes_per_run(static)`` estimates the device memory one run needs.
    """

    name: str
    run: Callable
    check: Callable[[dict], None]
    derived: Callable[[dict], dict]
    bytes_per_run: Callable[[Static], int]
    doc: str = ""


MODELS: dict[str, ModelSpec] = {}


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """One way to simulate a model: ``run(static, swept, key) -> RunOutput``.

    ``supports(settings) -> None | str`` returns why the engine cannot serve a run (or None);
    ``engine = "auto"`` picks the supporting engine with the highest ``priority``.
    ``bytes_per_run`` (optional) overrides the model's memory estimate.
    """

    name: str
    model: str
    run: Callable
    supports: Callable[[dict], str | None]
    priority: int = 0
    bytes_per_run: Callable[[Static], int] | None = None
    # Planning hints for the sweep: flops of one run, and runs to vmap together on one device
    # of a platform ("cpu", "gpu", "tpu"); None uses the sweep's defaults.
    cost_per_run: Callable[[Static], float] | None = None
    block_size: Callable[[Static, str], int] | None = None


ENGINES: dict[str, dict[str, EngineSpec]] = {}  # model -> engine name -> spec


def register_engine(spec: EngineSpec) -> EngineSpec:
    ENGINES.setdefault(spec.model, {})[spec.name] = spec
    return spec


def resolve_engine(settings) -> EngineSpec:
    """The engine that runs ``settings`` (a run dict or a :class:`Static`)."""
    get = settings.get if isinstance(settings, dict) else lambda k: getattr(settings, k)
    model, engine = get("model"), get("engine")
    table = ENGINES.get(model, {})
    as_dict = settings if isinstance(settings, dict) else settings.asdict()
    if engine == "auto":
        ok = [e for e in table.values() if e.supports(as_dict) is None]
        if not ok:
            raise ConfigError(f"no engine can run model = {model!r} with these settings")
        return max(ok, key=lambda e: e.priority)
    if engine not in table:
        raise ConfigError(
            f"engine = {engine!r} does not exist for model = {model!r}; fix: engine = "
            f"{' or '.join(repr(e) for e in ['auto', *table])}"
        )
    why = table[engine].supports(as_dict)
    if why:
        raise ConfigError(f"engine = {engine!r} cannot run this {model} run: {why}; "
                          "fix: engine = \"auto\" or \"direct\"")
    return table[engine]


def register_model(spec: ModelSpec) -> ModelSpec:
    """Register a model, its settings check, and its direct engine (the ground truth)."""
    MODELS[spec.name] = spec
    register_engine(EngineSpec("direct", spec.name, spec.run, lambda r: None, priority=0))

    def check(r: dict) -> None:
        spec.check(r)
        resolve_engine(r)

    C.MODEL_CHECKS[spec.name] = check
    return spec


def dtype_of(static: Static):
    return jnp.float64 if static.dtype == "float64" else jnp.float32


# --------------------------------------------------------------------------------------------
# Metrics shared by the attention models
# --------------------------------------------------------------------------------------------


def _masked_mean(x, mask):
    cnt = jnp.sum(mask)
    return jnp.where(cnt > 0, jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(cnt, 1), jnp.nan)


def _masked_mean_rows(x, mask):
    """Mean over rows of ``x: (n, k)`` where ``mask`` (n,) holds: (k,), NaN if none."""
    cnt = jnp.sum(mask)
    tot = jnp.sum(jnp.where(mask[:, None], x, 0.0), axis=0)
    return jnp.where(cnt > 0, tot / jnp.maximum(cnt, 1), jnp.nan)


def group_masks(y_clean, flipped):
    clean = ~flipped
    pos = y_clean > 0
    return (clean & pos, clean & ~pos, flipped & pos, flipped & ~pos)


def relevant_mass(s, roles):
    return jnp.sum(jnp.where(jnp.asarray(roles) == 0, s, 0.0), axis=-1)


def logistic_loss(margin):
    """Mean logistic loss ``softplus(-y f)`` over samples."""
    return jnp.mean(jax.nn.softplus(-margin))


def train_metrics(f, s, a, batch: Batch, roles: np.ndarray) -> dict:
    """Scalar metrics of a training forward pass (``f: (n,)``, ``s, a: (n, T)``)."""
    margin = batch.y * f
    correct = margin > 0  # f = 0 counts as an error (SPEC)
    clean = ~batch.flipped
    onehot = jax.nn.one_hot(jnp.asarray(roles), len(ROLE_NAMES), dtype=s.dtype)  # (T, 4)
    mass = s @ onehot  # (n, 4)
    m_clean = _masked_mean_rows(mass, clean)
    m_noisy = _masked_mean_rows(mass, batch.flipped)
    sR = relevant_mass(s, roles)
    ss = sR * (1 - sR)
    out = {
        "train_loss": logistic_loss(margin),
        "train_acc": jnp.mean(correct.astype(f.dtype)),
        "train_acc_clean": _masked_mean(correct.astype(f.dtype), clean),
        "train_acc_noisy": _masked_mean(correct.astype(f.dtype), batch.flipped),
        "margin": jnp.min(margin),
    }
    for k, r in enumerate(ROLE_NAMES):
        out[f"mass_clean_{r}"] = m_clean[k]
        out[f"mass_noisy_{r}"] = m_noisy[k]
    for g, mask in zip(GROUPS, group_masks(batch.y_clean, batch.flipped)):
        out[f"ss_{g}"] = _masked_mean(ss, mask)
    return out


def tracked_samples(batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Index of the first clean and the first noisy sample (0 if there is none)."""
    return jnp.argmax(~batch.flipped), jnp.argmax(batch.flipped)


def tracked_token_metrics(s, a, i_clean, i_noisy, logits: bool = True) -> dict:
    """Softmax weight (and logit) of every token of the tracked clean and flipped samples."""
    out = {}
    for t in range(s.shape[-1]):
        out[f"attn_clean_t{t}"] = s[i_clean, t]
        out[f"attn_noisy_t{t}"] = s[i_noisy, t]
        if logits:
            out[f"logit_clean_t{t}"] = a[i_clean, t]
            out[f"logit_noisy_t{t}"] = a[i_noisy, t]
    return out


def query_metrics(q: jax.Array, p: jax.Array) -> dict:
    pn = jnp.linalg.norm(p)
    safe = jnp.where(pn > 0, pn, 1.0)
    return {
        "p_norm": pn,
        "p_align_e1": jnp.where(pn > 0, p[0] / safe, 0.0),
        "p_align_e2": jnp.where(pn > 0, p[1] / safe, 0.0),
        "q_norm": jnp.linalg.norm(q),
    }


# --------------------------------------------------------------------------------------------
# The generic GD loop
# --------------------------------------------------------------------------------------------


def fit_bookkeeping(t, y, f, first_fit, all_fit):
    """First step at which each sample, and all samples at once, are fitted (``y f > 0``)."""
    fitted = y * f > 0
    first_fit = jnp.where((first_fit < 0) & fitted, t, first_fit)
    all_fit = jnp.where((all_fit < 0) & jnp.all(fitted), t, all_fit)
    return first_fit, all_fit


class Recorder(NamedTuple):
    """Fixed-size dynamics buffer: metrics at the static steps ``record_at`` (0..steps)."""

    slot: np.ndarray  # (steps + 1,) buffer row of each step, -1 where nothing is recorded
    record_fn: Callable

    @staticmethod
    def make(steps: int, record_at: tuple[int, ...], record_fn: Callable) -> Recorder:
        slot = np.full(steps + 1, -1, np.int32)
        slot[list(record_at)] = np.arange(len(record_at), dtype=np.int32)
        return Recorder(slot, record_fn)

    def empty(self, *example_args) -> dict:
        """NaN buffers shaped like ``record_fn(*example_args)`` (abstract evaluation, no compute);
        ``{}`` when nothing is recorded (zero-length buffers would break lax.map's reshape)."""
        n_rec = int(np.sum(self.slot >= 0))
        if not n_rec:
            return {}
        shape = jax.eval_shape(self.record_fn, *example_args)
        return jax.tree.map(lambda x: jnp.full((n_rec,), jnp.nan, x.dtype), shape)

    def write(self, buf, t, *args):
        """Store ``record_fn(*args)`` at step ``t`` if ``t`` is recorded; ``lax.cond`` on an
        unbatched predicate keeps the cost off the other steps."""
        if not buf:
            return buf
        k = jnp.asarray(self.slot)[t]

        def do(b):
            m = self.record_fn(*args)
            return jax.tree.map(lambda bb, mm: bb.at[k].set(mm.astype(bb.dtype)), b, m)

        return jax.lax.cond(k >= 0, do, lambda b: b, buf)


def gd_loop(
    params,
    loss_aux: Callable,
    lr: jax.Array,
    steps: int,
    record_at: tuple[int, ...],
    record_fn: Callable,
    batch: Batch,
    relevant_mass_fn: Callable,
    optimizer: optax.GradientTransformation | None = None,
):
    """Full-batch GD ``steps`` times; returns final params and the bookkeeping.

    ``loss_aux(params) -> (loss, (f, s, a))``; ``record_fn(params, f, s, a) -> dict of scalars``.
    """
    opt = optimizer if optimizer is not None else optax.sgd(lr)
    opt_state = opt.init(params)
    n = batch.y.shape[0]
    masks = group_masks(batch.y_clean, batch.flipped)
    rec = Recorder.make(steps, record_at, record_fn)
    _, (f0, s0, a0) = jax.eval_shape(loss_aux, params)
    buf = rec.empty(params, f0, s0, a0)
    write = rec.write

    def bookkeeping(t, f, first_fit, all_fit):
        return fit_bookkeeping(t, batch.y, f, first_fit, all_fit)

    def step(carry, t):
        params, opt_state, first_fit, all_fit, cumS, div, buf = carry
        (loss, (f, s, a)), g = jax.value_and_grad(loss_aux, has_aux=True)(params)
        first_fit, all_fit = bookkeeping(t, f, first_fit, all_fit)
        sR = relevant_mass_fn(s)
        ss = sR * (1 - sR)
        cumS = cumS + jnp.stack([jnp.sum(jnp.where(m, ss, 0.0)) for m in masks])
        buf = write(buf, t, params, f, s, a)
        updates, opt_state = opt.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
        # diverged at t: the loss, a gradient or the updated parameters are not finite
        finite = jnp.isfinite(loss) & all_finite(g) & all_finite(params)
        div = jnp.where((div < 0) & ~finite, t, div)
        return (params, opt_state, first_fit, all_fit, cumS, div, buf), None

    dtype = batch.y.dtype
    carry = (
        params, opt_state, jnp.full(n, -1, jnp.int32), jnp.asarray(-1, jnp.int32),
        jnp.zeros(4, dtype), jnp.asarray(-1, jnp.int32), buf,
    )
    if steps:
        carry, _ = jax.lax.scan(step, carry, jnp.arange(steps, dtype=jnp.int32))
    params, _, first_fit, all_fit, cumS, div, buf = carry
    loss, (f, s, a) = loss_aux(params)
    first_fit, all_fit = bookkeeping(jnp.asarray(steps, jnp.int32), f, first_fit, all_fit)
    div = jnp.where((div < 0) & ~jnp.isfinite(loss), steps, div)
    buf = write(buf, steps, params, f, s, a)
    return params, (f, s, a), first_fit, all_fit, cumS, div, buf


def all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def finish(final: dict, first_fit, all_fit, cumS, div, batch: Batch) -> dict:
    """Add the step-wise bookkeeping to the final metrics."""
    noisy = batch.flipped
    n_noisy = jnp.sum(noisy)
    fitted_noisy = noisy & (first_fit >= 0)
    all_noisy = jnp.sum(fitted_noisy) == n_noisy
    final = dict(final)
    final["n_noisy"] = n_noisy.astype(jnp.int32)
    final["frac_noisy_fitted"] = jnp.where(
        n_noisy > 0, jnp.sum(fitted_noisy) / jnp.maximum(n_noisy, 1), jnp.nan
    )
    # step by which every flipped sample had been fitted once (-1 if one never was)
    final["noisy_fit_step"] = jnp.where(
        all_noisy, jnp.max(jnp.where(noisy, first_fit, 0)), -1
    ).astype(jnp.int32)
    final["noisy_fit_step_mean"] = _masked_mean(first_fit.astype(batch.y.dtype), fitted_noisy)
    final["all_fit_step"] = all_fit
    for k, g in enumerate(GROUPS):
        final[f"cumS_{g}"] = cumS[k]
    final["diverge_step"] = div
    final["status"] = jnp.where(div >= 0, STATUS_DIVERGED, STATUS_OK).astype(jnp.int32)
    return final


# --------------------------------------------------------------------------------------------
# Prompt attention (Sakamoto & Sato)
# --------------------------------------------------------------------------------------------


def _sakamoto_roles(static: Static) -> np.ndarray:
    return token_roles(static.T, static.n_relevant, static.n_weak, static.n_weak_opp)


def _W_mode(static: Static) -> str:
    if static.W_init != "auto":
        return static.W_init
    return "random" if "W" in static.train else "identity"


def test_metrics(logits, head, y_clean) -> dict:
    f = jnp.sum(jax.nn.softmax(logits, axis=-1) * head, axis=-1)
    margin = y_clean * f
    return {"test_acc": jnp.mean((margin > 0).astype(f.dtype)), "test_loss": logistic_loss(margin)}


def run_prompt_attention(static: Static, sw: dict, key: jax.Array) -> RunOutput:
    """Train prompt attention ``f = nu^T X^T S(X W p)`` (p, or p and W) by full-batch GD.

    ``sw`` holds scalar arrays: ``signal_norm, rho, sigma_eps, noise_ratio, lr, init_scale,
    n_flip_per_class``.
    """
    dtype = dtype_of(static)
    d, n = static.d, static.n
    roles = _sakamoto_roles(static)
    k_data, k_test, k_init = jr.split(key, 3)
    batch = sakamoto_sample(
        k_data, n, d, roles, sw, label_mode=static.label_mode,
        label_noise=static.label_noise, dtype=dtype,
    )
    test = sakamoto_sample(
        k_test, static.n_test, d if static.test_mode == "sampled" else None, roles, sw,
        label_mode=static.label_mode, label_noise=None, dtype=dtype,
    )
    k_testz = jr.fold_in(k_test, 1)
    model = init_prompt_attention(
        k_init, d, sw["signal_norm"], W_mode=_W_mode(static), init=static.init,
        init_scale=sw["init_scale"], dtype=dtype,
    )
    trainable = ("p", "W") if "W" in static.train else ("p",)
    if "W" in trainable and model.W is None:  # W = I at step 0, then trained
        model = eqx.tree_at(lambda m: m.W, model, jnp.eye(d, dtype=dtype),
                            is_leaf=lambda x: x is None)
    spec = jax.tree.map(lambda _: False, model)
    spec = eqx.tree_at(lambda m: m.p, spec, True)
    if "W" in trainable:
        spec = eqx.tree_at(lambda m: m.W, spec, True)
    params, fixed = eqx.partition(model, spec)
    head = batch.X @ model.nu  # nu is fixed: compute X nu once, not every step

    def loss_aux(params):
        m = eqx.combine(params, fixed)
        f, s, a = m(batch.X, head)
        return logistic_loss(batch.y * f), (f, s, a)

    i_clean, i_noisy = tracked_samples(batch)

    def evaluate_test(m: PromptAttention):
        q = m.query()
        if static.test_mode == "sampled":
            return test_metrics(test.X @ q, test.X @ m.nu, test.y_clean)
        lg, hd = projected_scores(k_testz, test.signal, q, m.nu, sw["sigma_eps"])
        return test_metrics(lg, hd, test.y_clean)

    def record_fn(params, f, s, a):
        m = eqx.combine(params, fixed)
        out = train_metrics(f, s, a, batch, roles)
        out.update(evaluate_test(m))
        out.update(query_metrics(m.query(), m.p))
        out.update(tracked_token_metrics(s, a, i_clean, i_noisy))
        return out

    record_at = C.record_steps(static.steps, static.record_every, static.record_log)
    params, (f, s, a), first_fit, all_fit, cumS, div, buf = gd_loop(
        params, loss_aux, sw["lr"], static.steps, record_at, record_fn, batch,
        lambda s_: relevant_mass(s_, roles),
    )
    m = eqx.combine(params, fixed)
    final = train_metrics(f, s, a, batch, roles)
    final.update(evaluate_test(m))
    final.update(query_metrics(m.query(), m.p))
    final = finish(final, first_fit, all_fit, cumS, div, batch)
    samples = {
        "flipped": batch.flipped, "y_clean": batch.y_clean.astype(jnp.int32),
        "first_fit_step": first_fit, "final_margin": batch.y * f,
    }
    return RunOutput(final, buf, samples)


def _check_prompt_attention(r: dict) -> None:
    T, nr, nw, nwo = r["T"], r["n_relevant"], r["n_weak"], r["n_weak_opp"]
    if T < 3:
        raise ConfigError(
            f"T = {T} is too small for the Sakamoto layout (relevant, weak, weak-opposite and "
            "irrelevant tokens); fix: T >= 3 (the paper uses T = 8)"
        )
    if nr + nw + nwo > T:
        raise ConfigError(
            f"n_relevant + n_weak + n_weak_opp = {nr + nw + nwo} exceeds T = {T}; fix: raise T or "
            "lower the role counts"
        )
    if r["d"] < 2:
        raise ConfigError(f"d = {r['d']} must be >= 2 (the signals live on e1 and e2)")
    train = r["train"]
    if train not in (("p",), ("p", "W"), ("W", "p")):
        raise ConfigError(
            f"train = {list(train)!r} is not supported by prompt_attention; fix: train = [\"p\"] "
            "(theory) or train = [\"p\", \"W\"] (the official code)"
        )


def _derived_sakamoto(r: dict) -> dict:
    # "dim": d as a traced value too, for engines whose shapes do not depend on d (reduced): their
    # program is then the same for every d, and a compilation cache shares it across d groups.
    return {"n_flip_per_class": n_flip_per_class(r["n"], r["noise_ratio"]), "dim": r["d"]}


def _bytes_prompt_attention(static: Static) -> int:
    item = 8 if static.dtype == "float64" else 4
    d, n, T = static.d, static.n, static.T
    b = 3 * n * T * d  # X, its noise draw, gradient intermediates
    if "W" in static.train or _W_mode(static) == "random":
        b += 4 * d * d  # W, its gradient, the update, the uniform draw
    b += 4 * d
    if static.test_mode == "sampled":
        b += 2 * static.n_test * T * d
    else:
        b += 4 * static.n_test * T
    n_rec = len(C.record_steps(static.steps, static.record_every, static.record_log))
    b += n_rec * (40 + 4 * T)
    return int(b * item)


register_model(ModelSpec(
    name="prompt_attention",
    run=run_prompt_attention,
    check=_check_prompt_attention,
    derived=_derived_sakamoto,
    bytes_per_run=_bytes_prompt_attention,
    doc="f = nu^T X^T S(X W p) with a fixed head (Sakamoto & Sato); train p, or p and W",
))


def run_one(settings: dict | None = None, run_id: int = 0, **kw) -> RunOutput:
    """Convenience: one run from a settings dict (defaults filled in), jitted, for notebooks."""
    s = {name: st.default for name, st in C.SETTINGS.items()}
    s.update(settings or {})
    s.update(kw)
    s = {k: (C.coerce(k, v) if k in C.SETTINGS else v) for k, v in s.items()}
    C.MODEL_CHECKS[s["model"]](s)
    spec = MODELS[s["model"]]
    static = C.make_static(s)
    sw = swept_arrays(static, [s], spec)
    sw = {k: v[0] for k, v in sw.items()}
    key = jr.fold_in(jr.PRNGKey(s["root_seed"]), run_id)
    if static not in _RUN_ONE:
        run = resolve_engine(static).run
        _RUN_ONE[static] = jax.jit(lambda sw_, k_: run(static, sw_, k_))
    return _RUN_ONE[static](sw, key)


_RUN_ONE: dict = {}  # one compiled function per static configuration


def swept_arrays(static: Static, runs: list[dict], spec: ModelSpec) -> dict[str, np.ndarray]:
    """Stack the swept (and derived) values of ``runs`` into host arrays ``(B,)``."""
    fdt = np.float64 if static.dtype == "float64" else np.float32
    out = {k: np.asarray([r[k] for r in runs], fdt) for k in C.swept_names()}
    derived = [spec.derived(r) for r in runs]
    for k in derived[0] if derived else ():
        vals = [dd[k] for dd in derived]
        dt = np.int32 if isinstance(vals[0], (int, np.integer)) else fdt
        out[k] = np.asarray(vals, dt)
    return out
