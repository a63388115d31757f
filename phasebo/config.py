"""Typed settings, sweep-file parsing and validation.

Every knob of a run is a *setting* with a name (the results column), a default, a type, a
validator and a **kind**:

- ``static``: decides shapes, trip counts or code paths (``d``, ``n``, ``T``, ``steps``, ``model``,
  ``train``...). Runs are grouped by their static settings; each group compiles once.
- ``swept``: a number that enters the computation as an array (``signal_norm``, ``lr``,
  ``noise_ratio``...). Runs of one group differ only in these and are vmapped.
- ``host``: read on the host only (regime thresholds, the root seed).

A sweep file (TOML) names fixed settings and axes; the grid is the Cartesian product of the axes
times the seeds::

    name = "default"            # optional, defaults to the file name
    seeds = 4                   # runs per grid cell
    [settings]                  # fixed values; a list or a range here is an axis too
    model = "prompt_attention"
    n = 20
    [axes]                      # each a list, or a range table
    d = [500, 1000, 2000]
    signal_norm = { start = 5, stop = 50, step = 5 }       # stop inclusive
    lr = { start = 1e-3, stop = 1e-1, num = 5, log = true }
    [[cases]]                   # optional: settings that vary *together* (not a product);
    d = 5000                    # the grid is cases x axes x seeds
    signal_norm = 5.0
    [[cases]]
    d = 2000
    signal_norm = 20.0
    [regime]                    # thresholds of the benign / harmful / not_overfitting labels
    test_eps = 0.05
    [plot]                      # heatmaps drawn after the sweep (optional)
    heatmaps = [{ x = "signal_norm", y = "d", value = "regime" }]

Every problem is reported as a :class:`ConfigError` whose message names the field, the value and
the fix; the CLI prints it on one line and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


class ConfigError(ValueError):
    """A bad sweep file, setting or command-line value (message: field, value, fix)."""


# --------------------------------------------------------------------------------------------
# The settings registry
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    type: type  # int, float, str, bool or tuple (tuple of str)
    kind: str  # "static" | "swept" | "host"
    doc: str
    check: Callable[[Any], str | None] | None = None  # returns a problem description or None
    choices: tuple | None = None


SETTINGS: dict[str, Setting] = {}


def register_setting(
    name: str,
    default: Any,
    type_: type,
    kind: str,
    doc: str,
    check: Callable[[Any], str | None] | None = None,
    choices: Iterable | None = None,
) -> Setting:
    """Add a setting to the registry (models and engines call this at import time)."""
    if kind not in ("static", "swept", "host"):
        raise ValueError(f"kind must be static, swept or host, not {kind!r}")
    s = Setting(name, default, type_, kind, doc, check, tuple(choices) if choices else None)
    SETTINGS[name] = s
    return s


def _positive(v):
    return None if v > 0 else "must be > 0"


def _nonneg(v):
    return None if v >= 0 else "must be >= 0"


def _unit_interval(v):
    return None if 0 <= v < 1 else "must be in [0, 1)"


def _at_least(k):
    def check(v):
        return None if v >= k else f"must be >= {k}"

    return check


_S = register_setting
_S("model", "prompt_attention", str, "static", "which model to train (see phasebo.MODELS)")
_S("engine", "auto", str, "static", "simulation engine: direct (d-dimensional) or auto")
_S("d", 2000, int, "static", "token dimension", _positive)
_S("n", 20, int, "static", "training samples", _at_least(2))
_S("n_test", 1000, int, "static", "independent clean test samples", _positive)
_S("T", 8, int, "static", "tokens per sequence", _positive)
_S("n_relevant", 1, int, "static", "Sakamoto layout: relevant tokens (first)", _positive)
_S("n_weak", 1, int, "static", "Sakamoto layout: weakly relevant tokens, same class", _nonneg)
_S("n_weak_opp", 1, int, "static", "Sakamoto layout: weakly relevant, opposite class", _nonneg)
_S("signal_norm", 20.0, float, "swept", "signal norm ||mu||", _positive)
_S("rho", 0.1, float, "swept", "Sakamoto weak-relevance factor rho", _nonneg)
_S("sigma_eps", 1.0, float, "swept", "token noise standard deviation", _positive)
_S("noise_ratio", 0.2, float, "swept", "label-noise ratio r (fraction) or eta (bernoulli)",
   _unit_interval)
_S("label_noise", "fraction", str, "static",
   "fraction: k = ceil(n r) flips, floor(k/2) per class (as the paper's code); "
   "bernoulli: each label flips with probability noise_ratio", choices=("fraction", "bernoulli"))
_S("label_mode", "balanced", str, "static",
   "balanced: first floor(n/2) samples y=+1, rest -1; iid: uniform labels",
   choices=("balanced", "iid"))
_S("lr", 5e-3, float, "swept", "gradient-descent step size", _positive)
_S("steps", 1000, int, "static", "gradient-descent steps", _nonneg)
_S("train", ("p",), tuple, "static", "trained parameters: p, or p and W")
_S("W_init", "auto", str, "static",
   "W when fixed or at step 0: identity, random (uniform on (-1/sqrt d, 1/sqrt d)) or auto "
   "(identity when only p is trained, random when W is trained)",
   choices=("auto", "identity", "random"))
_S("init", "zero", str, "static", "initial trainable vectors: zero, or gaussian N(0, init_scale^2)",
   choices=("zero", "gaussian"))
_S("init_scale", 0.01, float, "swept", "standard deviation of a gaussian init", _nonneg)
_S("dtype", "float32", str, "static", "floating-point precision", choices=("float32", "float64"))
_S("test_mode", "projected", str, "static",
   "projected: test tokens drawn as exact Gaussian projections on the query and head "
   "(O(n_test T) per run); sampled: full d-dimensional test tokens",
   choices=("projected", "sampled"))
_S("record_every", 0, int, "static", "record dynamics every k steps (0: off)", _nonneg)
_S("record_log", 0, int, "static", "record dynamics at about k log-spaced steps (0: off)",
   _nonneg)
_S("root_seed", 0, int, "host", "root PRNG seed; run keys are fold_in(root, run_id)", _nonneg)
_S("test_eps", 0.05, float, "host", "regime: benign iff train acc = 1 and test acc >= 1 - test_eps",
   _unit_interval)
_S("train_acc_fit", 1.0, float, "host", "regime: train accuracy that counts as fitting all labels",
   lambda v: None if 0 < v <= 1 else "must be in (0, 1]")

# --------------------------------------------------------------------------------------------
# Models and their static layout checks (registered by phasebo.train and friends)
# --------------------------------------------------------------------------------------------

# model name -> function(settings dict) raising ConfigError for a setting the model cannot take
MODEL_CHECKS: dict[str, Callable[[dict], None]] = {}

TOP_LEVEL_KEYS = ("name", "description", "seeds", "settings", "axes", "cases", "regime", "plot")


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _known_list() -> str:
    return ", ".join(sorted(SETTINGS))


def coerce(name: str, value: Any, where: str = "") -> Any:
    """Convert and validate one value of setting ``name``."""
    if name not in SETTINGS:
        raise ConfigError(
            f"{where}unknown setting {name!r}{_suggest(name, SETTINGS)}; known settings: "
            f"{_known_list()}"
        )
    s = SETTINGS[name]
    fix = f"fix: {s.name} = {s.default!r} is the default ({s.doc})"
    try:
        if s.type is tuple:
            if isinstance(value, str):
                value = [v.strip() for v in value.replace("+", ",").split(",") if v.strip()]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise TypeError
            out: Any = tuple(value)
        elif s.type is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise TypeError
                value = value.lower() in ("true", "1")
            out = bool(value)
        elif s.type is int:
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, str):
                value = float(value)
            if isinstance(value, float):
                if not value.is_integer():
                    raise TypeError
            out = int(value)
        elif s.type is float:
            if isinstance(value, bool):
                raise TypeError
            out = float(value)
            if not math.isfinite(out):
                raise ConfigError(f"{where}{name} = {value!r} must be finite; {fix}")
        else:
            if not isinstance(value, str):
                raise TypeError
            out = value
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(
            f"{where}{name} = {value!r} is not a valid {s.type.__name__}; {fix}"
        ) from None
    if s.choices is not None and out not in s.choices:
        raise ConfigError(f"{where}{name} = {out!r} is not one of {list(s.choices)}; {fix}")
    if s.check is not None:
        problem = s.check(out)
        if problem:
            raise ConfigError(f"{where}{name} = {value!r} {problem}; {fix}")
    return out


def expand_range(name: str, spec: Mapping, where: str = "") -> list:
    """``{start, stop, step}`` (stop inclusive) or ``{start, stop, num, log}`` -> list of values."""
    keys = set(spec)
    allowed = {"start", "stop", "step", "num", "log"}
    if keys - allowed:
        bad = sorted(keys - allowed)[0]
        raise ConfigError(
            f"{where}{name}: unknown range key {bad!r}; a range is "
            "{start, stop, step} or {start, stop, num, log = true}"
        )
    if not {"start", "stop"} <= keys or ("step" in keys) == ("num" in keys):
        raise ConfigError(
            f"{where}{name} = {dict(spec)!r}: a range needs start, stop and exactly one of step "
            "or num, e.g. {start = 5, stop = 100, step = 2.5}"
        )
    start, stop = spec["start"], spec["stop"]
    is_int = SETTINGS[name].type is int if name in SETTINGS else False
    if "step" in keys:
        step = spec["step"]
        if not step or (stop - start) / step < 0:
            raise ConfigError(
                f"{where}{name}: range step {step!r} does not lead from {start!r} to {stop!r}"
            )
        count = int(math.floor((stop - start) / step + 1e-9)) + 1
        vals = [start + i * step for i in range(count)]
        # round away float drift such as 5 + 3 * 2.5 = 12.499999
        vals = [round(v, 12) for v in vals]
    else:
        num = spec["num"]
        if not isinstance(num, int) or num < 1:
            raise ConfigError(f"{where}{name}: range num = {num!r} must be a positive integer")
        if spec.get("log", False):
            if start <= 0 or stop <= 0:
                raise ConfigError(f"{where}{name}: a log range needs start and stop > 0")
            vals = list(np.geomspace(start, stop, num))
        else:
            vals = list(np.linspace(start, stop, num))
        vals = [float(v) for v in vals]
    if is_int:
        vals = sorted({int(round(v)) for v in vals})
    return vals


def _axis_values(name: str, value: Any, where: str) -> list | None:
    """A list or range -> axis values (None when the value is a single fixed value)."""
    s = SETTINGS.get(name)
    if isinstance(value, Mapping):
        vals = expand_range(name, value, where)
    elif isinstance(value, (list, tuple)) and not (
        s is not None and s.type is tuple and all(isinstance(v, str) for v in value)
    ):
        vals = list(value)
    elif s is not None and s.type is tuple and isinstance(value, (list, tuple)) and value and \
            all(isinstance(v, (list, tuple)) for v in value):
        vals = list(value)
    else:
        return None
    if not vals:
        raise ConfigError(f"{where}axis {name!r} is empty; give at least one value")
    return vals


# --------------------------------------------------------------------------------------------
# The sweep specification
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A parsed, validated sweep: fixed settings, axes (ordered) and seeds."""

    name: str
    fixed: dict[str, Any]
    axes: dict[str, list]
    seeds: int
    plot: dict = dataclasses.field(default_factory=dict)
    description: str = ""
    cases: tuple = ({},)  # settings that vary together; the grid is cases x axes x seeds

    def runs(self) -> list[dict[str, Any]]:
        """The grid: one dict of *all* settings per run, with ``run_id`` and ``seed``.

        Order: cases (slowest), then axes in file order, seeds fastest. ``run_id`` is the
        position.
        """
        base = {name: s.default for name, s in SETTINGS.items()}
        base.update(self.fixed)
        names = list(self.axes)
        out = []
        run_id = 0
        for case in self.cases:
            for combo in itertools.product(*(self.axes[a] for a in names)):
                for seed in range(self.seeds):
                    r = dict(base)
                    r.update(case)
                    r.update(zip(names, combo))
                    r["seed"] = seed
                    r["run_id"] = run_id
                    run_id += 1
                    out.append(r)
        return out

    @property
    def n_runs(self) -> int:
        return len(self.cases) * self.seeds * math.prod(len(v) for v in self.axes.values())

    def to_dict(self) -> dict:
        d = {"name": self.name, "fixed": self.fixed, "axes": self.axes, "seeds": self.seeds}
        if self.cases != ({},):
            d["cases"] = list(self.cases)
        return d


def _validate_run(r: dict) -> None:
    model = r["model"]
    if model not in MODEL_CHECKS:
        raise ConfigError(
            f"model = {model!r} is not a known model{_suggest(model, MODEL_CHECKS)}; "
            f"known models: {', '.join(sorted(MODEL_CHECKS))}"
        )
    MODEL_CHECKS[model](r)


def build_spec(
    raw: Mapping[str, Any],
    name: str,
    overrides: Mapping[str, Any] | None = None,
    seeds: int | None = None,
    where: str = "",
) -> SweepSpec:
    """Validate a parsed sweep file (plus ``--set`` overrides) into a :class:`SweepSpec`."""
    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            hint = _suggest(key, TOP_LEVEL_KEYS)
            if key in SETTINGS:
                hint = f" (settings go under [settings] or [axes]: put {key} there)"
            raise ConfigError(
                f"{where}unknown top-level key {key!r}{hint}; allowed: {', '.join(TOP_LEVEL_KEYS)}"
            )
    name = str(raw.get("name", name))
    fixed: dict[str, Any] = {}
    axes: dict[str, list] = {}

    def add(key: str, value: Any, section: str, force_axis: bool = False):
        w = f"{where}[{section}] "
        if key in ("seed", "run_id"):
            raise ConfigError(f"{w}{key!r} is set by the sweep itself; use seeds = N instead")
        if key not in SETTINGS:
            raise ConfigError(
                f"{w}unknown setting {key!r}{_suggest(key, SETTINGS)}; known settings: "
                f"{_known_list()}"
            )
        vals = _axis_values(key, value, w)
        if vals is None and force_axis:
            vals = [value]
        if vals is None:
            fixed[key] = coerce(key, value, w)
            axes.pop(key, None)
        else:
            coerced = [coerce(key, v, w) for v in vals]
            if len(set(map(repr, coerced))) != len(coerced):
                raise ConfigError(f"{w}axis {key!r} repeats a value: {vals!r}")
            axes[key] = coerced
            fixed.pop(key, None)

    for section in ("settings", "axes"):
        block = raw.get(section, {})
        if not isinstance(block, Mapping):
            raise ConfigError(f"{where}[{section}] must be a table of setting = value")
        for k, v in block.items():
            add(k, v, section, force_axis=(section == "axes"))
    cases_raw = raw.get("cases", [{}])
    if not isinstance(cases_raw, list) or not cases_raw or \
            not all(isinstance(c, Mapping) for c in cases_raw):
        raise ConfigError(f"{where}cases must be a non-empty list of tables ([[cases]] blocks)")
    cases: list[dict] = []
    for i, c in enumerate(cases_raw):
        w = f"{where}[[cases]] #{i + 1} "
        case = {}
        for k, v in c.items():
            if k not in SETTINGS:
                raise ConfigError(f"{w}unknown setting {k!r}{_suggest(k, SETTINGS)}; known "
                                  f"settings: {_known_list()}")
            if k in axes:
                raise ConfigError(f"{w}{k!r} is also an axis; set it either per case or as an axis")
            if _axis_values(k, v, w) is not None:
                raise ConfigError(f"{w}{k} = {v!r}: a case holds single values; use [axes] for lists")
            case[k] = coerce(k, v, w)
            fixed.pop(k, None)
        cases.append(case)
    regime = raw.get("regime", {})
    for k, v in regime.items():
        if k not in ("test_eps", "train_acc_fit"):
            raise ConfigError(
                f"{where}[regime] unknown key {k!r}{_suggest(k, ['test_eps', 'train_acc_fit'])}; "
                "allowed: test_eps, train_acc_fit"
            )
        add(k, v, "regime")
    for k, v in (overrides or {}).items():
        add(k, v, "--set")
        for case in cases:  # --set wins over a per-case value
            case.pop(k, None)
    n_seeds = raw.get("seeds", 1) if seeds is None else seeds
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
        src = "--seeds" if seeds is not None else f"{where}seeds"
        raise ConfigError(f"{src} = {n_seeds!r} must be a positive integer, e.g. seeds = 10")
    plot = raw.get("plot", {})
    if not isinstance(plot, Mapping):
        raise ConfigError(f"{where}[plot] must be a table")
    spec = SweepSpec(name=name, fixed=fixed, axes=axes, seeds=n_seeds, plot=dict(plot),
                     description=str(raw.get("description", "")), cases=tuple(cases))
    # Validate every distinct combination of static settings once, and swept values per axis:
    # a layout problem must surface before anything compiles.
    seen = set()
    for r in spec.runs()[:: spec.seeds]:
        key = tuple((k, repr(r[k])) for k in sorted(r) if k not in ("seed", "run_id"))
        if key in seen:
            continue
        seen.add(key)
        _validate_run(r)
    return spec


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """``--set key=value`` strings -> dict; a value in TOML syntax may be a list or a range."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set d=1000")
        key, text = (x.strip() for x in item.split("=", 1))
        if not key:
            raise ConfigError(f"--set {item!r}: the key is empty; expected key=value")
        if key not in SETTINGS:
            raise ConfigError(
                f"--set: unknown setting {key!r}{_suggest(key, SETTINGS)}; known settings: "
                f"{_known_list()}"
            )
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text  # a bare word such as --set model=prompt_attention
        out[key] = value
    return out


def load_sweep(
    path: str | Path,
    overrides: Mapping[str, Any] | None = None,
    seeds: int | None = None,
) -> SweepSpec:
    """Read and validate a sweep file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"sweep file {str(path)!r} does not exist; see sweeps/ for examples")
    if path.is_dir():
        raise ConfigError(f"sweep file {str(path)!r} is a directory; give a .toml file")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"sweep file {str(path)!r} does not parse as TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"sweep file {str(path)!r} is not UTF-8 text") from None
    return build_spec(raw, path.stem, overrides, seeds, where=f"{path.name}: ")


def spec_from_dict(
    settings: Mapping[str, Any] | None = None,
    axes: Mapping[str, Any] | None = None,
    seeds: int = 1,
    name: str = "sweep",
    **extra,
) -> SweepSpec:
    """Build a sweep in Python: ``spec_from_dict({"n": 20}, {"d": [500, 1000]}, seeds=4)``."""
    raw = {"name": name, "settings": dict(settings or {}), "axes": dict(axes or {}),
           "seeds": seeds, **extra}
    return build_spec(raw, name)


# --------------------------------------------------------------------------------------------
# Static configuration of one compiled group
# --------------------------------------------------------------------------------------------


def static_key(run: Mapping[str, Any]) -> tuple:
    """The static settings of a run, as a hashable, sorted tuple (the compile-group key)."""
    return tuple((k, run[k]) for k in sorted(run) if k in SETTINGS and SETTINGS[k].kind == "static")


def swept_names() -> list[str]:
    return sorted(k for k, s in SETTINGS.items() if s.kind == "swept")


@dataclasses.dataclass(frozen=True)
class Static:
    """Hashable static configuration of one compile group; attribute access to its settings."""

    items: tuple

    def __getattr__(self, name):
        for k, v in self.items:
            if k == name:
                return v
        raise AttributeError(name)

    def asdict(self) -> dict:
        return dict(self.items)

    def replace(self, **kw) -> Static:
        d = self.asdict()
        d.update(kw)
        return Static(tuple(sorted(d.items())))


def make_static(run: Mapping[str, Any] | None = None, **kw) -> Static:
    """A :class:`Static` from a run dict (defaults filled in) and keyword overrides."""
    base = {name: s.default for name, s in SETTINGS.items()}
    base.update(run or {})
    base.update(kw)
    return Static(static_key(base))


def record_steps(steps: int, every: int, log: int) -> tuple[int, ...]:
    """Steps (0..steps inclusive) at which dynamics are recorded."""
    pts: set[int] = set()
    if every:
        pts.update(range(0, steps + 1, every))
        pts.add(steps)
    if log:
        pts.add(0)
        pts.update(int(v) for v in np.unique(np.round(np.geomspace(1, max(steps, 1), log))))
        pts.add(steps)
    return tuple(sorted(p for p in pts if 0 <= p <= steps))
