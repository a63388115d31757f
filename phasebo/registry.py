"""The literal tables of models and engines, and the lookups over them.

Adding a model is one new module in :mod:`phasebo.models`, its import and one line in :data:`MODELS`
(``docs/architecture.md`` walks through an example). :func:`check_model` runs on every entry at
import: a model that lists an engine without implementing that engine's hooks, or that declares a
setting name with another meaning than a model before it, is an error here, not at run time.
"""

from __future__ import annotations

from .engines.base import Direct, Engine, Gram, Reduced
from .models.base import Model
from .models.constructed_query import ConstructedQueryModel
from .models.encoder import EncoderModel
from .models.prompt_attention import PromptAttentionModel
from .models.self_attention import MultiLayerModel, SelfAttentionModel
from .models.single_head import SingleHeadModel
from .models.vit_digits import ViTDigitsModel
from .settings import ConfigError, Setting, show_value, suggest

ENGINES: dict[str, Engine] = {
    "direct": Direct(),
    "gram": Gram(),
    "reduced": Reduced(),
}

MODELS: dict[str, Model] = {
    "prompt_attention": PromptAttentionModel(),
    "single_head": SingleHeadModel(),
    "self_attention": SelfAttentionModel(),
    "multi_layer": MultiLayerModel(),
    "encoder": EncoderModel(),
    "constructed_query": ConstructedQueryModel(),
    "vit_digits": ViTDigitsModel(),
}


def check_model(model: Model, models: dict[str, Model] | None = None,
                key: str | None = None) -> None:
    """Raise ``TypeError`` if ``model`` lists an unknown engine, misses an engine's hooks, gives
    a setting name another type, kind, choices, identity or requirement than the other models do
    (its one-line doc is not compared), or is registered under another ``key`` than its name."""
    if key is not None and key != model.name:
        raise TypeError(f"model registered as {key!r} is named {model.name!r}: its runs would be "
                        f"recorded as {model.name!r}; fix: name = {key!r} in its class, or "
                        f"register it as {model.name!r}")
    if "project" in model.settings and not model.radii:
        raise TypeError(f"{model.name} declares project but no radii: norm-constrained GD needs "
                        "the radius settings in radii and the groups they bound in norm_groups")
    for e in model.engines:
        if e not in ENGINES:
            raise TypeError(f"{model.name}: unknown engine {e!r}")
        for hook in ENGINES[e].hooks:
            if getattr(type(model), hook) is getattr(Model, hook):
                raise TypeError(f"{model.name} lists engine {e!r} but does not implement {hook}")
    for other in (models or MODELS).values():
        if other is model:
            continue
        for name, s in model.settings.items():
            t = other.settings.get(name)
            if t is not None and name != "model" and _meaning(s) != _meaning(t):
                raise TypeError(f"setting {name!r} means different things in {model.name} and "
                                f"{other.name}")


def _meaning(s: Setting):
    return (s.type, s.kind, s.choices, s.identity, s.requires)


for _k, _m in MODELS.items():
    check_model(_m, key=_k)


def get_model(name: str) -> Model:
    if name not in MODELS:
        raise ConfigError(f"model = {name!r} is not a known model{suggest(name, MODELS)}; fix: "
                          f"one of {', '.join(MODELS)} (phasebo models describes them)")
    if MODELS[name].name != name:  # an entry added after import (a test, a notebook)
        check_model(MODELS[name], key=name)
    return MODELS[name]


def all_settings() -> dict[str, Setting]:
    """Every setting name any model takes (first declaration; defaults may differ by model:
    :func:`defaults_text`)."""
    out: dict[str, Setting] = {}
    for m in MODELS.values():
        for k, s in m.settings.items():
            out.setdefault(k, s)
    return out


def defaults_text(name: str) -> str:
    """Each model's default of setting ``name`` where they differ (``"20.0 (prompt_attention,
    encoder), 30.0 (single_head)"``), for errors raised before the model is known; ``""`` where
    every model has the same."""
    by: dict[str, list[str]] = {}
    for m in MODELS.values():
        if name in m.settings:
            by.setdefault(show_value(m.settings[name].default), []).append(m.name)
    return ", ".join(f"{v} ({', '.join(ms)})" for v, ms in by.items()) if len(by) > 1 else ""


def models_using(name: str) -> list[str]:
    return [m.name for m in MODELS.values() if name in m.settings]


def resolve_engine(model: Model, static) -> Engine:
    """The engine that runs ``static`` (``engine = "auto"``: the supporting one of highest
    priority); a :class:`ConfigError` naming the reason when the asked engine cannot."""
    table = {e: ENGINES[e] for e in model.engines}
    ok = [e for e, eng in table.items() if eng.supports(model, static) is None]
    best = max(ok, key=lambda e: table[e].priority)  # what auto runs
    if static.engine == "auto":
        return table[best]
    if static.engine not in table:
        raise ConfigError(
            f"engine = {static.engine!r} does not run model = {model.name!r}; fix: engine = "
            f"{' or '.join(repr(e) for e in ['auto', *table])}")
    why = table[static.engine].supports(model, static)
    if why:
        raise ConfigError(f"engine = {static.engine!r} cannot run this {model.name} run: {why}; "
                          f"fix: engine = \"auto\" (it picks \"{best}\" here)"
                          + "".join(f" or \"{e}\"" for e in ok))
    return table[static.engine]
