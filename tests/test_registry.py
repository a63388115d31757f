"""The model protocol: a model added from a test file with one table entry, errors at import for
a broken model, the import graph, and every setting of every model changing what it says."""

import ast
import re
from pathlib import Path

import jax
import jax.random as jr
import numpy as np
import pytest

import phasebo
from phasebo import registry
from phasebo.execute import matmul_precision
from phasebo.models.base import Model
from phasebo.settings import PROJECT, ConfigError
from phasebo.sweep import prepare_one, run_one, run_sweep

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# The worked examples of docs/architecture.md, run from the page itself (never a copy)
# --------------------------------------------------------------------------------------------


def _doc_module(name: str, index: int):
    """The ``index``-th Python block of the worked example in docs/architecture.md, executed as
    the module ``phasebo.models.<name>`` (its relative imports resolve as in the package)."""
    import sys
    import types

    text = (ROOT / "docs" / "architecture.md").read_text()
    text = text[text.index("## A worked example: adding a model"):]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class " in b]
    mod = types.ModuleType(f"phasebo.models.{name}")
    mod.__package__ = "phasebo.models"
    sys.modules[mod.__name__] = mod  # the second example imports the first
    exec(compile(blocks[index], f"docs/architecture.md ({name})", "exec"), mod.__dict__)
    return mod


MeanPoolModel = _doc_module("mean_pool", 0).MeanPoolModel
ScaledPoolModel = _doc_module("scaled_pool", 1).ScaledPoolModel


def test_a_model_added_from_a_test_file_runs_a_sweep(tmp_path, monkeypatch):
    model = MeanPoolModel()
    registry.check_model(model)
    monkeypatch.setitem(registry.MODELS, "mean_pool", model)  # the one registry line
    spec = phasebo.spec_from_dict({"model": "mean_pool", "d": 200, "steps": 200, "lr": 1.0,
                                   "n_test": 200, "record_every": 100},
                                  {"signal_norm": [2.0, 20.0]}, seeds=3, name="toy")
    df = run_sweep(spec, tmp_path / "toy", quiet=True)
    assert set(df["model"]) == {"mean_pool"} and set(df["engine"]) == {"direct"}
    assert {"w_norm", "w_align_e1", "train_acc", "test_acc", "regime", "mass_clean_rel"} <= \
        set(df.columns)
    assert "train" not in df.columns  # prompt attention's settings are not the toy's
    strong, weak = df[df["signal_norm"] == 20.0], df[df["signal_norm"] == 2.0]
    assert strong["test_acc"].mean() > 0.9 > weak["test_acc"].mean() + 0.2
    assert (df["w_norm"] > 0).all()
    assert np.allclose(df["mass_clean_rel"], 1 / 8)  # uniform attention over T = 8 tokens
    with pytest.raises(ConfigError, match="not a setting of model 'mean_pool'"):
        phasebo.spec_from_dict({"model": "mean_pool", "train": ["p", "W"]})


def test_a_setting_of_its_own_reaches_forward_untrained(tmp_path, monkeypatch):
    """The page's second example: a swept out_scale in the fixed tree stays what the sweep set
    (it is not trained), a static activation is part of the program, and both are checked and
    recorded as any setting."""
    model = ScaledPoolModel()
    registry.check_model(model, key="scaled_pool")
    monkeypatch.setitem(registry.MODELS, "scaled_pool", model)
    spec = phasebo.spec_from_dict({"model": "scaled_pool", "d": 100, "steps": 50, "lr": 1.0,
                                   "n_test": 100, "signal_norm": 20.0},
                                  {"out_scale": [0.5, 2.0], "activation": ["linear", "tanh"]},
                                  seeds=2, name="scaled")
    df = run_sweep(spec, tmp_path / "scaled", quiet=True, plots=False)
    assert set(df["out_scale"]) == {0.5, 2.0} and set(df["activation"]) == {"linear", "tanh"}
    assert (df["test_acc"] > 0.9).all()
    m, engine, program, sw, key = prepare_one(model="scaled_pool", d=40, steps=20, lr=1.0,
                                              out_scale=2.0, activation="tanh")
    batch = model.sample(program, sw, key, test=False)
    params, fixed = model.init(program, sw, key, batch)
    assert params.scale is None and float(fixed.scale) == 2.0  # the trained tree is w alone
    for bad, why in (({"out_scale": 0.0}, "out_scale = 0.0 must be > 0"),
                     ({"activation": "relu"}, "'relu' is not one of")):
        with pytest.raises(ConfigError, match=re.escape(why)):
            phasebo.spec_from_dict({"model": "scaled_pool", **bad})


def test_a_model_registered_under_another_name_is_refused(monkeypatch):
    """A variation that subclasses a model but keeps its name would record its runs as the
    other model's."""
    class Variation(MeanPoolModel):
        doc = "forgot to rename"

    with pytest.raises(TypeError, match="registered as 'mean_pool_v2' is named 'mean_pool'"):
        registry.check_model(Variation(), key="mean_pool_v2")
    monkeypatch.setitem(registry.MODELS, "mean_pool_v2", Variation())
    with pytest.raises(TypeError, match="its runs would be recorded as 'mean_pool'"):
        registry.get_model("mean_pool_v2")


def test_the_limit_for_a_model_without_weight_decay_says_what_it_lacks(monkeypatch):
    monkeypatch.setitem(registry.MODELS, "mean_pool", MeanPoolModel())
    with pytest.raises(ConfigError, match="model 'mean_pool' has no weight_decay setting; fix: "
                                          "dynamics = \"flow\""):
        phasebo.spec_from_dict({"model": "mean_pool", "dynamics": "limit", "dtype": "float64"})


def test_run_one_refuses_float64_without_64_bit_jax():
    """Else its numbers would be float32, labelled float64 (run_sweep refuses the same)."""
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(ConfigError, match="needs 64-bit JAX"):
            prepare_one(dtype="float64", steps=2)
    finally:
        jax.config.update("jax_enable_x64", old)


def test_a_broken_model_fails_at_registration():
    class NoForward(Model):  # forgets forward, test_output, ...
        name = "broken"
        doc = "x"

        def roles(self, static):
            return None

    with pytest.raises(TypeError, match="abstract"):
        NoForward()

    class ProjectWithoutRadii(MeanPoolModel):  # project = true would fail only at run time
        name = "project_without_radii"
        own_settings = (*PROJECT,)

    with pytest.raises(TypeError, match="declares project but no radii"):
        registry.check_model(ProjectWithoutRadii())

    class GramWithoutSpan(MeanPoolModel):
        name = "gram_without_span"
        engines = ("direct", "gram")

    with pytest.raises(TypeError, match="does not implement span_problem"):
        registry.check_model(GramWithoutSpan())

    class SpanWithoutItsCost(MeanPoolModel):  # the planner's memory and cost of a span run
        name = "span_without_its_cost"
        engines = ("direct", "reduced")

        def span_supports(self, static, reduced):
            return None

        def span_problem(self, static, sw, key, reduced):
            raise AssertionError("never run")

    with pytest.raises(TypeError, match="does not implement span_bytes"):
        registry.check_model(SpanWithoutItsCost())


def _is_main_guard(node) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports, anywhere but in its ``if __name__ == "__main__"``
    block (a script's entry point: ``python -m phasebo.sweep`` hands over to the command line)."""
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body if not _is_main_guard(n)]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = path.relative_to(ROOT / "phasebo").with_suffix("").parts[:-node.level]
            if node.module:
                out.add(".".join([*base, *node.module.split(".")]))
            else:  # from .. import rules: the modules named, not the package's __init__
                out.update(".".join([*base, a.name]) for a in node.names)
    return {m for m in out if m}


def test_the_import_graph_has_no_cycle_and_runs_one_way():
    mods = {}
    for p in (ROOT / "phasebo").rglob("*.py"):
        name = ".".join(p.relative_to(ROOT / "phasebo").with_suffix("").parts)
        name = name[:-len(".__init__")] if name.endswith(".__init__") else name
        mods[name] = {m for m in _imports(p)}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for dep in mods.get(m, ()):
            dep = dep if dep in mods else dep.rsplit(".", 1)[0]
            if dep not in mods or dep == m:
                continue
            assert state.get(dep) != 1, f"import cycle: {' -> '.join([*stack, m, dep])}"
            if dep not in state:
                visit(dep, [*stack, m])
        state[m] = 2

    mods.pop("__init__", None)  # the public API imports everything; nothing imports it back
    for m in mods:
        if m not in state:
            visit(m, [])
    for lib in ("analysis", "plot", "theory", "results", "models.prompt_attention", "train"):
        assert "sweep" not in mods[lib], f"{lib} imports sweep"
    assert not any(d.startswith("plot") for d in mods["theory"])
    assert not any(d.startswith(("registry", "config", "sweep")) for m in mods
                   if m.startswith("models") for d in mods[m])


# --------------------------------------------------------------------------------------------
# Every setting of every model: it changes some output, or it is refused
# --------------------------------------------------------------------------------------------

BASE = {
    "prompt_attention": dict(d=40, n=8, T=4, steps=6, n_test=40, signal_norm=3.0, lr=0.2),
    "single_head": dict(d=40, n=8, steps=4, n_test=40, signal_norm=3.0, lr=0.2),
    "self_attention": dict(d=16, n=8, steps=4, n_test=40, signal_norm=3.0, lr=0.2),
    "multi_layer": dict(d=12, n=8, steps=3, n_test=20, n_layers=2, signal_norm=3.0, lr=0.2),
    # n = 8: with n = 6 the fraction mode flips floor(ceil(6 r) / 2) = 1 label per class for both
    # r = 0.2 and r = 0.5, so the noise_ratio perturbation below would change nothing
    "encoder": dict(d=12, n=8, T=4, steps=3, n_test=10, mlp_width=6, signal_norm=3.0, lr=0.1),
    "constructed_query": dict(d=40, n=8, T=4, n_test=20, signal_norm=3.0),
}
# (base additions, perturbed value) where the plain default +/- a step would not do; a value
# that is the model's default already (label_noise = "bernoulli" on Magen et al.'s data) falls
# back to the generic perturbation, with the base additions. label_noise on both sides with
# r = 0.5: at a default r = 0.05 and n = 8 neither mode flips a label here.
PERTURB = {
    "noise_ratio": ({}, 0.5), "label_noise": ({"noise_ratio": 0.5}, "bernoulli"),
    "label_mode": ({}, "iid"),
    "init_scale": ({"init": "gaussian", "init_scale": 0.01}, 0.05),
    "radius_p": ({"project": True, "radius_p": 1e-3}, 2e-3),
    "radius_v": ({"project": True, "radius_v": 1e-3}, 2e-3),
    "project": ({}, True), "weight_decay": ({}, 0.3),
    "track": ({"record_every": 2}, (0, 1)), "record_every": ({}, 2), "record_log": ({}, 3),
    "train": ({}, ("p", "W")), "dtype": ({}, "float64"), "W_init": ({}, "random"),
    "test_mode": ({}, "sampled"), "init": ({}, "gaussian"), "n_relevant": ({}, 2),
    "noise_mode": ({}, None), "residual": ({}, False),
    # self_attention refuses a projected test set with a noisy (random) query
    "signal_noise": ({"test_mode": "sampled"}, True),
    "query_lambda": ({}, 0.5),
    # a flow that never runs out of solver steps is the same flow: 2 against 3 steps differ
    "flow_max_steps": ({"flow_max_steps": 2}, 3), "flow_time": ({}, 0.5),
    # converged at tau = 50 (weight decay 1: settled by then, the last decade's turn still
    # nonzero, measured for every model here) under a tolerance every turn meets, not under 1e-12.
    # In float64: the encoder's outputs decay towards zero, and in float32 their direction (the
    # turn) is NaN from underflow, so no tolerance is met (measured)
    "flow_converge_tol": (dict(flow_converge_tol=1e-12, weight_decay=1.0, flow_time=50.0,
                               dtype="float64"), 2.0),
    # the converged limit needs weight decay and float64; 2 against 3 iterations differ
    "limit_tol": (dict(weight_decay=0.1, dtype="float64", limit_tol=1e-3), 1e-9),
    "limit_max_iters": (dict(weight_decay=0.1, dtype="float64", limit_max_iters=2), 3),
    "limit_warmup": (dict(weight_decay=0.1, dtype="float64"), 3),
}
# settings that act only through another the model may lack
NEEDS = {"limit_tol": "weight_decay", "limit_max_iters": "weight_decay",
         "limit_warmup": "weight_decay"}
# settings that only gradient descent has (refused with dynamics = "flow" or "limit"), and the
# step size, which the limit has not either
GD_ONLY = ("steps", "record_every")


def _dynamics_only(x: dict) -> dict:
    """``x`` without the settings its dynamics does not have (which would be refused)."""
    kind = x.get("dynamics", "gd")
    drop = () if kind == "gd" else GD_ONLY + (("lr",) if kind == "limit" else ())
    return {k: v for k, v in x.items() if k not in drop}
# additions to the perturbed side only: the settings a perturbation needs to show, which the
# base may not carry (radius_p without project = true is refused as having no effect)
PERTURB_WITH = {"project": {"radius_p": 1e-3, "radius_v": 1e-3}}
# settings the perturbed side drops: epochs replaces the base's step count (both are refused)
PERTURB_WITHOUT = {"epochs": ("steps",)}
# Settings that by design do not change a run's numbers; each is checked elsewhere.
NO_NUMBERS = {
    "model": "which model (this whole test is per model)",
    "engine": "how the run is computed, not what: engines are compared in tests/test_engines.py",
    "test_eps": "a host-side regime threshold (tests/test_sweep.py, regime thresholds)",
    "train_acc_fit": "a host-side regime threshold (tests/test_sweep.py, regime thresholds)",
    "test_reference": "a host-side regime reference (tests/test_regimes.py, clean reference)",
}
# Both sides of a comparison run with this key: a run's own key derives from its id, which every
# identity setting changes, so with it any setting would "change the run", used or ignored. (A
# setting of kind "key", root_seed, acts only through that key: it is compared with its own.)
KEY = jr.PRNGKey(0)


def _flat(out):
    # a run that records nothing may hand back no dynamics (None) or an empty dict
    return {f"{part}/{k}": np.asarray(v) for part in ("final", "dynamics", "samples")
            for k, v in (getattr(out, part) or {}).items()}


def _run(settings, own_key=False):
    """What a run computes: every output array, with the fixed key (or the run's own)."""
    return _flat(run_one(settings, key=None if own_key else KEY))


def _program(settings):
    """What a run would compute, traced but not compiled (a trace costs ~0.3 s, an XLA compile
    ~2-5 s): the program's jaxpr and constants and the values it is fed, with the fixed key. A
    static setting the model ignores leaves all three unchanged."""
    model, engine, program, sw, _ = prepare_one(settings, key=KEY)
    with jax.default_matmul_precision(matmul_precision(program)):  # as the executor traces it
        closed = jax.make_jaxpr(lambda s, k: engine.run(model, program, s, k))(sw, KEY)
    out = {f"const/{i}": np.asarray(c) for i, c in enumerate(closed.consts)}
    out.update({f"input/{k}": np.asarray(v) for k, v in sw.items()})
    out["jaxpr"] = np.frombuffer(str(closed.jaxpr).encode(), np.uint8)
    return out


def _differs(fa, fb) -> bool:
    if set(fa) != set(fb):
        return True
    return any(fa[k].shape != fb[k].shape or not np.array_equal(fa[k], fb[k], equal_nan=True)
               for k in fa)


def _perturbed(s, value):
    extra, v = PERTURB.get(s.name, ({}, None))
    if v is not None and v != value:
        return extra, v
    if s.choices:
        return extra, next(c for c in s.choices if c != value)
    if s.type is bool:
        return extra, not value
    if s.type is int:
        return extra, value + 1
    if s.type is float:
        return extra, value * 1.5 if value else 0.1
    raise AssertionError(f"no perturbation for {s.name}")


def _walk(model_name, kinds, observe=_run, skip=frozenset()):
    """Perturb each setting of ``kinds`` (but those in ``skip``) in turn from ``BASE`` and assert
    that ``observe`` sees a difference; returns the names checked."""
    model = phasebo.MODELS[model_name]
    base = {"model": model_name, "engine": "direct", **BASE[model_name]}
    seen: dict = {}

    def look(settings, kind):
        k = (kind == "key", repr(sorted(settings.items())))
        if k not in seen:
            seen[k] = _run(settings, own_key=True) if kind == "key" else observe(settings)
        return seen[k]

    checked = []
    for name, s in model.settings.items():
        if name in NO_NUMBERS:
            assert not s.identity or name == "model", name
            continue
        if s.kind not in kinds or name in skip:
            continue
        if NEEDS.get(name, name) not in model.settings:  # a model without weight decay has no
            continue  # converged limit (refused, saying so): nothing of it to change
        extra, new = _perturbed(s, base.get(name, s.default))
        b = {**base, **{k: v for k, v in extra.items() if k in model.settings}}
        if s.requires:  # both sides with the setting it needs (else it is refused: below)
            b.setdefault(*s.requires)
        with_ = {k: v for k, v in PERTURB_WITH.get(name, {}).items() if k in model.settings}
        side = {k: v for k, v in {**b, name: new, **with_}.items()
                if k not in PERTURB_WITHOUT.get(name, ())}
        b, side = _dynamics_only(b), _dynamics_only(side)
        c = look(side, s.kind)
        assert _differs(look(b, s.kind), c), f"{model_name}: {name} = {new!r} changed nothing"
        checked.append(name)
    return checked


# models whose settings are not walked here, and why
NOT_WALKED = {"vit_digits": "each run loads a pretrained backbone; tests/test_vit_digits.py checks "
                            "its settings' refusals and what each phase trains"}


def test_every_registered_model_has_its_settings_walked():
    """A model added to the registry gets the walks below by one BASE entry (a small run of it);
    without one, this fails rather than leaving its settings unchecked."""
    missing = sorted(set(phasebo.MODELS) - set(BASE) - set(NOT_WALKED))
    assert not missing, f"add a BASE entry (the settings of one small run) for {missing}"


# the generic run is shared: two models in the default suite, every model with -m slow
@pytest.mark.parametrize("model", [m if m in ("prompt_attention", "single_head") else
                                   pytest.param(m, marks=pytest.mark.slow) for m in BASE])
def test_every_swept_setting_changes_the_run(model):
    assert len(_walk(model, ("swept", "key"))) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("model", list(BASE))
def test_every_static_setting_changes_the_run(model, x64):
    # matmul_precision gives the same numbers on a CPU, bit for bit (it changes the traced
    # program: test_every_static_setting_changes_the_traced_program; numbers on a GPU: the docs)
    assert len(_walk(model, ("static",), skip={"matmul_precision"})) >= 3


def _static_names(model_name):
    return {n for n, s in phasebo.MODELS[model_name].settings.items()
            if s.kind == "static" and n not in NO_NUMBERS}


# every static setting of the models above: all of prompt_attention's and single_head's (Sakamoto's
# and Magen et al.'s data), then the few only multi_layer (its depth) and encoder (its MLP) have
STATIC_TOUR = ("prompt_attention", "single_head", "multi_layer", "encoder")


def test_every_static_setting_changes_the_traced_program(x64):
    """The default-suite version of the walk above, without compiling: each static setting of
    prompt_attention and single_head, and the few that only multi_layer and encoder have,
    changes the traced program, its constants or its inputs (an ignored setting changes none).
    The compiled runs and their numbers, per model, are test_every_static_setting_changes_the_run
    (-m slow)."""
    base = {"model": "prompt_attention", "engine": "direct", **BASE["prompt_attention"]}
    assert not _differs(_program(base), _program(base))  # a trace is reproducible, so ...
    done: set = set()
    for i, model in enumerate(STATIC_TOUR):  # ... a difference is the setting's
        names = _walk(model, ("static",), observe=_program, skip=done if i >= 2 else set())
        assert len(names) >= 1, model
        done |= set(names)
    for model in (m for m in BASE if m not in STATIC_TOUR):  # a model's own static settings
        rest = _static_names(model) - done
        if rest:
            done |= set(_walk(model, ("static",), observe=_program, skip=done))
    every = set().union(*(_static_names(m) for m in BASE))  # the models this walk covers
    assert done == every, f"static settings no model of the tour walks: {sorted(every - done)}"


def test_settings_without_effect_are_refused():
    cases = [({"init_scale": 0.1}, "init_scale = 0.1 has no effect unless init"),
             ({"radius_p": 2.0}, "radius_p = 2.0 has no effect unless project"),
             ({"model": "single_head", "radius_v": 2.0}, "radius_v = 2.0 has no effect"),
             ({"track": [0, 3]}, "track = \\[0, 3\\] has no effect without recording"),
             ({"weight_decay": 0.1, "model": "constructed_query"}, "not a setting"),
             ({"model": "single_head", "rho": 0.5}, "rho = 0.5 is not a setting of model"),
             ({"flow_time": 50.0}, "flow_time = 50.0 has no effect unless dynamics = \"flow\""),
             ({"dynamics": "flow", "steps": 100}, "steps = 100 has no effect unless dynamics"),
             ({"dynamics": "flow", "record_every": 5}, "record_every = 5 has no effect unless")]
    for settings, words in cases:
        with pytest.raises(ConfigError, match=words):
            phasebo.spec_from_dict(settings)


def test_a_bad_value_quotes_every_models_default_where_they_differ():
    """Values are checked before the model is known (it may come from a case), so the fix must
    not quote one model's default as every model's."""
    with pytest.raises(ConfigError, match=r"signal_norm's default is 20.0 \(prompt_attention.*"
                                          r"30.0 \(single_head"):
        phasebo.spec_from_dict({"model": "single_head", "signal_norm": -3.0})
    with pytest.raises(ConfigError, match=r"fix: sigma_eps = 1.0 is the default"):  # one default
        phasebo.spec_from_dict({"sigma_eps": -1.0})


def test_results_carry_only_their_models_settings_and_a_mixed_sweep_gets_the_union(tmp_path):
    spec = phasebo.spec_from_dict({"d": 40, "n_test": 40, "steps": 3, "engine": "direct"},
                                  cases=[{"model": "prompt_attention", "rho": 0.2},
                                         {"model": "single_head", "n": 10}], name="mixed")
    df = run_sweep(spec, tmp_path / "m", quiet=True, plots=False)
    pa, sh = df[df["model"] == "prompt_attention"], df[df["model"] == "single_head"]
    assert pa["rho"].notna().all() and sh["rho"].isna().all()  # rho is not single_head's
    assert pa["radius_v"].isna().all() and sh["radius_v"].notna().all()
    assert pa["train"].notna().all() and sh["train"].isna().all()


def test_an_engine_that_cannot_run_a_setting_names_the_engines_that_can():
    """W trained: the reduced engine cannot run it; the fix names the engine auto picks and every
    engine that runs it (it said "auto or direct", while naming gram as the exact one)."""
    with pytest.raises(ConfigError, match=r'fix: engine = "auto" \(it picks "gram" here\) or '
                                          r'"direct" or "gram"$'):
        phasebo.spec_from_dict({"engine": "reduced", "train": ["W", "p"], "d": 50})
