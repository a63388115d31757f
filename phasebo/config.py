"""Sweep files: parsing, validation against each model's own settings, the grid, and run identity.

A sweep file (TOML) names fixed settings and axes; the grid is the cases times the Cartesian product
of the axes times the seeds::

    name = "default"            # optional, defaults to the file name
    include = "base.toml"       # optional: settings shared with other files (this file wins)
    seeds = 4                   # runs per grid cell
    [settings]                  # fixed values; a list or a range here is an axis too
    model = "prompt_attention"
    n = 20
    [axes]                      # each a list, or a range table
    d = [500, 1000, 2000]
    signal_norm = { start = 5, stop = 50, step = 5 }       # stop inclusive
    lr = { start = 1e-3, stop = 1e-1, num = 5, log = true }
    [[cases]]                   # optional: settings that vary *together* (not a product)
    d = 5000
    signal_norm = 5.0
    [regime]                    # thresholds of the benign / harmful / not_overfitting labels
    test_eps = 0.05
    [plot]                      # figures drawn after the sweep (optional)
    heatmaps = [{ x = "signal_norm", y = "d", value = "regime" }]

Every setting belongs to the models that declare it (``phasebo settings MODEL`` lists them); a
setting the chosen model does not take is refused, naming the models that do. Every problem is a
:class:`ConfigError` whose message names the field, the value and the fix; the CLI prints it on one
line and exits with status 2.

**Run identity.** A run is identified by its model's identity settings (every setting that changes
its numbers: not the engine, what is recorded or the regime thresholds) and its seed. The 63-bit
``run_id`` is a hash of them (:func:`run_ids`), and the run's random key is
``fold_in(fold_in(PRNGKey(root_seed), hi32(run_id)), lo32(run_id))``. So a run's numbers do not
depend on its position in the grid: growing a sweep (more seeds, more axis values), reordering
its axes or splitting it into several files leaves every existing run unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .registry import all_settings, defaults_text, get_model, models_using, resolve_engine
from .settings import ConfigError, Setting, epoch_steps, suggest

TOP_LEVEL_KEYS = ("name", "description", "include", "seeds", "settings", "axes", "cases",
                  "regime", "plot", "refine")
RESERVED = ("seed", "run_id")  # columns every sweep sets itself: not settings a file may give


def _setting(name: str, where: str) -> Setting:
    table = all_settings()
    if name in RESERVED:
        hint = "use seeds = N (or --seeds N)" if name == "seed" else "it is derived from the settings"
        raise ConfigError(f"{where}{name!r} is set by the sweep itself; {hint}")
    if name == "seeds":
        raise ConfigError(f"{where}'seeds' is not a setting; fix: seeds = N at the top of the "
                          "file, or --seeds N on the command line (in Python: spec_from_dict(..., "
                          "seeds=N); run_one is one run, its seed= picks which)")
    if name not in table:
        raise ConfigError(f"{where}unknown setting {name!r}{suggest(name, table)}; see the "
                          "settings with `phasebo settings` (known: " + ", ".join(sorted(table))
                          + ")")
    text = defaults_text(name)  # the model may come later (a case): its errors quote them all
    return dataclasses.replace(table[name], defaults_text=text) if text else table[name]


def expand_range(name: str, spec: Mapping, where: str = "") -> list:
    """``{start, stop, step}`` (stop inclusive) or ``{start, stop, num, log}`` -> list of values."""
    keys = set(spec)
    allowed = {"start", "stop", "step", "num", "log"}
    if keys - allowed:
        bad = sorted(keys - allowed)[0]
        raise ConfigError(f"{where}{name}: unknown range key {bad!r}; a range is "
                          "{start, stop, step} or {start, stop, num, log = true}")
    if not {"start", "stop"} <= keys or ("step" in keys) == ("num" in keys):
        raise ConfigError(f"{where}{name} = {dict(spec)!r}: a range needs start, stop and exactly "
                          "one of step or num, e.g. {start = 5, stop = 100, step = 2.5}")
    start, stop = spec["start"], spec["stop"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, stop)):
        raise ConfigError(f"{where}{name}: range start and stop must be numbers")
    is_int = all_settings().get(name) is not None and all_settings()[name].type is int
    if "step" in keys:
        step = spec["step"]
        if not isinstance(step, (int, float)) or not step or (stop - start) / step < 0:
            raise ConfigError(f"{where}{name}: range step {step!r} does not lead from {start!r} "
                              f"to {stop!r}; fix: step = {-step if step else 1!r}")
        count = int(math.floor((stop - start) / step + 1e-9)) + 1
        # round away float drift such as 5 + 3 * 2.5 = 12.499999
        vals = [round(start + i * step, 12) for i in range(count)]
    else:
        num = spec["num"]
        if not isinstance(num, int) or isinstance(num, bool) or num < 1:
            raise ConfigError(f"{where}{name}: range num = {num!r} must be a positive integer")
        if spec.get("log", False):
            if start <= 0 or stop <= 0:
                raise ConfigError(f"{where}{name}: a log range needs start and stop > 0")
            vals = [float(v) for v in np.geomspace(start, stop, num)]
        else:
            vals = [float(v) for v in np.linspace(start, stop, num)]
    if is_int:
        vals = sorted({int(round(v)) for v in vals})
    return vals


def _axis_values(s: Setting, value: Any, where: str) -> list | None:
    """A list or range -> axis values (None when the value is one fixed value)."""
    if isinstance(value, Mapping):
        vals = expand_range(s.name, value, where)
    elif isinstance(value, (list, tuple)):
        list_valued = s.type in (tuple, "ints")
        if list_valued and not (value and all(isinstance(v, (list, tuple)) for v in value)):
            return None  # one list-valued value, e.g. train = ["p", "W"]
        vals = list(value)
    else:
        return None
    if not vals:
        raise ConfigError(f"{where}axis {s.name!r} is empty; give at least one value")
    return vals


# --------------------------------------------------------------------------------------------
# The sweep specification
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cell:
    """A combination of the static settings (and the case's values): the runs of a cell differ
    only in the swept axes and the seed."""

    settings: dict  # every setting given or defaulted, resolved (swept axes at their first value)
    swept_axes: tuple  # names of the axes that vary inside the cell (not static)
    given: frozenset  # the setting names the sweep gives for this cell


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A parsed, validated sweep: fixed settings, axes (ordered), cases and seeds."""

    name: str
    fixed: dict[str, Any]
    axes: dict[str, list]
    seeds: int
    plot: dict = dataclasses.field(default_factory=dict)
    description: str = ""
    cases: tuple = ({},)  # settings that vary together; the grid is cases x axes x seeds
    refine: dict = dataclasses.field(default_factory=dict)
    # the sweep as its file has it, before --set (its [plot] is checked on these cells)
    filed: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def n_runs(self) -> int:
        return len(self.cases) * self.seeds * math.prod(len(v) for v in self.axes.values())

    def static_axes(self) -> list[str]:
        table = all_settings()
        return [a for a in self.axes if table[a].kind == "static"]

    def swept_axes(self) -> list[str]:
        table = all_settings()
        return [a for a in self.axes if table[a].kind != "static"]

    def runs_per_cell(self) -> int:
        return self.seeds * math.prod(len(self.axes[a]) for a in self.swept_axes())

    def cells(self) -> Iterator[Cell]:
        """Cases (slowest), then the static axes in file order."""
        static = self.static_axes()
        swept = tuple(self.swept_axes())
        for case in self.cases:
            names = frozenset(self.fixed) | frozenset(case) | frozenset(self.axes)
            for combo in itertools.product(*(self.axes[a] for a in static)):
                given = {**self.fixed, **case, **dict(zip(static, combo)),
                         **{a: self.axes[a][0] for a in swept}}
                yield Cell(resolve(given), swept, names)

    def values(self, name: str) -> list:
        """Every value ``name`` takes in this sweep (fixed, per case, or axis)."""
        if name in self.axes:
            return list(self.axes[name])
        vals = [c[name] for c in self.cases if name in c]
        if name in self.fixed and len(vals) < len(self.cases):
            vals.append(self.fixed[name])
        return vals

    def setting_names(self) -> set[str]:
        return set(self.fixed) | set(self.axes) | {k for c in self.cases for k in c}

    def to_dict(self) -> dict:
        d = {"name": self.name, "fixed": self.fixed, "axes": self.axes, "seeds": self.seeds}
        if self.cases != ({},):
            d["cases"] = list(self.cases)
        if self.refine:
            d["refine"] = self.refine
        return json.loads(json.dumps(d, default=list))


def resolve(given: Mapping[str, Any]) -> dict:
    """A run's full settings: its model's defaults, then ``given``."""
    model = get_model(given.get("model", "prompt_attention"))
    out = {k: s.default for k, s in model.settings.items()}
    out.update(given)
    if out.get("epochs"):  # steps counted in epochs: the step count follows from n and the batch
        out["steps"] = out["epochs"] * epoch_steps(out["n"], out.get("batch_size", 0))
    return out


def check_cell(settings: dict, given: Iterable[str] = (), where: str = "") -> dict:
    """Every given setting belongs to the model, the model's checks pass, an engine can run it;
    returns the settings of the model (those it does not take dropped)."""
    model = get_model(settings["model"])
    for k in sorted(given):
        if k not in model.settings:
            users = models_using(k)
            raise ConfigError(
                f"{where}{k} = {settings.get(k)!r} is not a setting of model {model.name!r} (it "
                f"would be ignored); it belongs to {', '.join(users) or 'no model'}; fix: remove "
                "it, or set it in [[cases]] together with model = one of those")
    own = {k: v for k, v in settings.items() if k in model.settings}
    if "epochs" in given and "steps" in given and own.get("epochs"):
        raise ConfigError(f"{where}steps and epochs = {own['epochs']!r} both set the run's "
                          "length; fix: remove one (a file's: --unset steps; steps = epochs x ceil(n/b))")
    for k in sorted(given):
        req = model.settings[k].requires
        if req is not None and own.get(req[0]) != req[1]:
            raise ConfigError(
                f"{where}{k} = {own[k]!r} has no effect unless {req[0]} = {_toml(req[1])} (it is "
                f"{_toml(own.get(req[0]))}); fix: set {req[0]} = {_toml(req[1])}, or remove {k} "
                f"(a file's: --unset {k})")
    if own.get("dynamics") == "limit" and "lr" in given and not own.get("limit_warmup"):
        raise ConfigError(f"{where}lr = {own['lr']!r} has no effect: dynamics = \"limit\" has no "
                          "step size (L-BFGS finds the minimiser directly) unless limit_warmup > 0 "
                          "(GD steps of lr first); fix: remove lr, or set limit_warmup")
    try:
        model.check(own)
        resolve_engine(model, model.static_of(own))
    except ConfigError as e:  # the model's own words, with the file and case they come from
        if where and not str(e).startswith(where):
            raise ConfigError(f"{where}{e}") from None
        raise
    return own


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, str) else repr(v)


def build_spec(raw: Mapping[str, Any], name: str, overrides: Mapping[str, Any] | None = None,
               seeds: int | None = None, where: str = "", overrides_as: str = "overrides:",
               as_written: SweepSpec | None = None) -> SweepSpec:
    """Validate a parsed sweep file (plus ``--set`` overrides) into a :class:`SweepSpec`; an
    error in an override names it ``overrides_as`` (the command line: ``--set``).
    ``as_written``: the file before ``--unset`` dropped settings from it, whose values a
    ``[plot] where`` must name (one the overrides leave out is a note, not refused)."""
    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            hint = suggest(key, TOP_LEVEL_KEYS)
            if key in all_settings():
                hint = f" (settings go under [settings] or [axes]: put {key} there)"
            raise ConfigError(f"{where}unknown top-level key {key!r}{hint}; allowed: "
                              f"{', '.join(TOP_LEVEL_KEYS)}")
    name = str(raw.get("name", name))
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"{where}name = {name!r}: the sweep's name is its results directory's "
                          "name, one path component; fix: e.g. name = \"my_sweep\" (--out picks "
                          "another directory)")
    fixed: dict[str, Any] = {}
    axes: dict[str, list] = {}
    origin: dict[str, str] = {}

    def add(key: str, value: Any, section: str, force_axis: bool = False, replace=False):
        w = f"{where}[{section}] " if section != "--set" else f"{overrides_as} "
        s = _setting(key, w)
        if key in origin and not replace:
            raise ConfigError(f"{w}{key!r} is also given in [{origin[key]}]; give it once: a "
                              "fixed value under [settings] or a list under [axes]")
        vals = _axis_values(s, value, w)
        if vals is None and force_axis:
            vals = [value]
        if vals is None:
            fixed[key] = s.coerce(value, w)
            axes.pop(key, None)
        else:
            coerced = [s.coerce(v, w) for v in vals]
            if len(set(map(repr, coerced))) != len(coerced):
                raise ConfigError(f"{w}axis {key!r} repeats a value: {vals!r}; fix: once each")
            axes[key] = coerced
            fixed.pop(key, None)
        origin[key] = section

    for section in ("settings", "axes"):
        block = raw.get(section, {})
        if not isinstance(block, Mapping):
            raise ConfigError(f"{where}[{section}] must be a table of setting = value")
        for k, v in block.items():
            add(k, v, section, force_axis=(section == "axes"))
    regime = raw.get("regime", {})
    if not isinstance(regime, Mapping):
        raise ConfigError(f"{where}[regime] must be a table")
    for k, v in regime.items():
        if k not in ("test_eps", "train_acc_fit"):
            raise ConfigError(f"{where}[regime] unknown key {k!r}"
                              f"{suggest(k, ['test_eps', 'train_acc_fit'])}; allowed: test_eps, "
                              "train_acc_fit")
        add(k, v, "regime")
    cases_raw = raw.get("cases", [{}])
    if not isinstance(cases_raw, list) or not cases_raw or \
            not all(isinstance(c, Mapping) for c in cases_raw):
        raise ConfigError(f"{where}cases must be a non-empty list of tables ([[cases]] blocks)")
    overrides = dict(overrides or {})
    cases: list[dict] = []
    for i, c in enumerate(cases_raw):
        w = f"{where}[[cases]] #{i + 1} "
        case = {}
        for k, v in c.items():
            s = _setting(k, w)
            if k in axes and k not in overrides:
                raise ConfigError(f"{w}{k!r} is also an axis; set it either per case or as an "
                                  "axis")
            if _axis_values(s, v, w) is not None:
                raise ConfigError(f"{w}{k} = {v!r}: a case holds single values; use [axes] for "
                                  "lists")
            case[k] = s.coerce(v, w)
            fixed.pop(k, None)
        cases.append(case)
    # the file's own values, before --set narrows them: a [plot] where must name one of these
    # (one --set leaves out is a note before the runs, phasebo.notes.plot_where_notes, not refused)
    as_filed = SweepSpec(name=name, fixed=dict(fixed), axes=dict(axes), seeds=1,
                         cases=tuple(dict(c) for c in cases))
    for k, v in overrides.items():
        add(k, v, "--set", replace=True)
        for case in cases:  # --set wins over a per-case value
            case.pop(k, None)
    n_seeds = raw.get("seeds", 1) if seeds is None else seeds
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
        src = "--seeds" if seeds is not None else f"{where}seeds"
        raise ConfigError(f"{src} = {n_seeds!r} must be a positive integer; fix: e.g. seeds = 10")
    plot = raw.get("plot", {})
    if not isinstance(plot, Mapping):
        raise ConfigError(f"{where}[plot] must be a table")
    refine = raw.get("refine", {})
    if not isinstance(refine, Mapping):
        raise ConfigError(f"{where}[refine] must be a table")
    spec = SweepSpec(name=name, fixed=fixed, axes=axes, seeds=n_seeds, plot=dict(plot),
                     description=str(raw.get("description", "")), cases=tuple(cases),
                     refine=dict(refine), filed=as_filed)
    validate(spec, where)
    check_plot_where(as_written or as_filed, plot, where)
    return spec


def _same(a, b) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b or (isinstance(a, list | tuple) and isinstance(b, list | tuple)
                      and list(a) == list(b))


def check_plot_where(spec: SweepSpec, plot: Mapping, where: str = "") -> None:
    """Each ``[plot]`` ``where`` names a value the file has (or its default): a misspelt one
    would select no run, and its figure could only be skipped after every run had finished."""
    for w, k, one, have in plot_where_misses(spec, plot, where):
        raise ConfigError(f"{w}{k} = {one!r} is not a value of this sweep (it has "
                          f"{', '.join(map(repr, have[:12]))}); fix: one of those")


def plot_where_misses(spec: SweepSpec, plot: Mapping, where: str = ""):
    """``(entry, key, value, values)`` for each ``[plot]`` ``where`` value no cell of ``spec`` has."""
    settings, cells = all_settings(), None
    for kind in ("heatmaps", "lines"):
        entries = plot.get(kind, [])
        for i, h in enumerate(entries if isinstance(entries, list) else []):
            sel = h.get("where") if isinstance(h, Mapping) else None
            w = f"{where}[plot] {kind} #{i + 1}: where "
            if sel is not None and not isinstance(sel, Mapping):
                raise ConfigError(f"{w}= {sel!r} must be a table; fix: e.g. where = "
                                  "{ noise_ratio = 0.2 }")
            for k, v in (sel or {}).items():
                if k not in settings:  # seed or a derived column (snr, ...): the table's
                    continue
                if cells is None:  # every cell as resolved: its own value or its default
                    cells = list(spec.cells())
                have = list(spec.axes[k]) if k in spec.axes else \
                    list({repr(c.settings[k]): c.settings[k] for c in cells
                          if k in c.settings}.values())
                for one in (v if isinstance(v, list) else [v]):
                    if not any(_same(one, x) for x in have):
                        yield w, k, one, have


def validate(spec: SweepSpec, where: str = "") -> None:
    """Check every cell once (a layout or engine problem surfaces before anything compiles)."""
    seen = set()
    for i, case in enumerate(spec.cases):  # a refusal names the case it comes from
        w = f"{where}[[cases]] #{i + 1}: " if spec.cases != ({},) else where
        for cell in dataclasses.replace(spec, cases=(case,)).cells():
            key = (cell.given, tuple(sorted((k, repr(v)) for k, v in cell.settings.items())))
            if key not in seen:
                seen.add(key)
                check_cell(cell.settings, cell.given, w)


def read_sweep_file(path: str | Path, _seen: tuple = ()) -> dict:
    """The raw TOML of a sweep file with its ``include`` files merged under it."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"sweep file {str(path)!r} does not exist; see sweeps/ for examples")
    if path.is_dir():
        raise ConfigError(f"sweep file {str(path)!r} is a directory; give a .toml file")
    if path.resolve() in _seen:
        raise ConfigError(f"sweep file {str(path)!r} includes itself (through {_seen[-1].name})")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"sweep file {str(path)!r} does not parse as TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"sweep file {str(path)!r} is not UTF-8 text") from None
    if not raw:
        raise ConfigError(f"sweep file {str(path)!r} is empty; fix: set at least a [settings] or "
                          "[axes] table (see sweeps/default.toml)")
    inc = raw.pop("include", None)
    if inc is None:
        return raw
    incs = [inc] if isinstance(inc, str) else inc
    if not isinstance(incs, list) or not all(isinstance(i, str) for i in incs):
        raise ConfigError(f"{path.name}: include = {inc!r} must be a file name or a list of them")
    base: dict = {}
    for i in incs:
        if not (path.parent / i).is_file():
            raise ConfigError(f"{path.name}: include = {i!r}: {str(path.parent / i)!r} is not a "
                              "file; fix: a sweep file's name relative to this file's folder")
        sub = read_sweep_file(path.parent / i, (*_seen, path.resolve()))
        base = _merge(base, sub)
    base.pop("name", None)  # the including file names the sweep
    return _merge(base, raw)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        if k in ("settings", "axes", "regime", "plot", "refine") and isinstance(v, Mapping):
            merged = dict(out.get(k, {}))
            merged.update(v)
            if k in ("settings", "axes"):  # a key moved between settings and axes: the top wins
                other = "axes" if k == "settings" else "settings"
                for kk in v:
                    if kk in out.get(other, {}) and kk not in top.get(other, {}):
                        out[other] = {a: b for a, b in out[other].items() if a != kk}
            out[k] = merged
        else:
            out[k] = v
    return out


def load_sweep(path: str | Path, overrides: Mapping[str, Any] | None = None,
               seeds: int | None = None, overrides_as: str = "overrides:") -> SweepSpec:
    """Read and validate a sweep file, with ``overrides`` of its settings (a list or range makes
    an axis, as ``--set`` does)."""
    path = Path(path)
    raw = read_sweep_file(path)
    return build_spec(raw, path.stem, overrides, seeds, where=f"{path.name}: ",
                      overrides_as=overrides_as)


def spec_from_dict(settings: Mapping[str, Any] | None = None, axes: Mapping[str, Any] | None = None,
                   seeds: int = 1, name: str = "sweep", **extra) -> SweepSpec:
    """Build a sweep in Python: ``spec_from_dict({"n": 20}, {"d": [500, 1000]}, seeds=4)``; an
    axis may be a NumPy array (``np.geomspace(250, 5000, 10)``), a value a NumPy scalar."""
    def plain(part):  # NumPy values as the file's lists and numbers
        return {k: v.tolist() if isinstance(v, np.ndarray | np.generic) else v
                for k, v in (part or {}).items()}
    raw = {"name": name, "settings": plain(settings), "axes": plain(axes), "seeds": seeds, **extra}
    return build_spec(raw, name)


# --------------------------------------------------------------------------------------------
# Run identity: ids and keys
# --------------------------------------------------------------------------------------------

_MASK63 = np.uint64((1 << 63) - 1)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash64(text: str) -> np.uint64:
    return np.frombuffer(hashlib.sha256(text.encode()).digest()[:8], np.uint64)[0]


def value_bits(s: Setting, values) -> np.ndarray:
    """64-bit codes of a setting's values: float64 bits, int64, or a hash (str, lists)."""
    if s.type is float:
        return np.asarray(values, np.float64).view(np.uint64)
    if s.type in (int, bool):
        return np.asarray(values, np.int64).view(np.uint64)
    return np.asarray([_hash64(json.dumps(list(v) if isinstance(v, tuple) else v))
                       for v in values], np.uint64)


def setting_terms(model, name: str, values) -> np.ndarray:
    """The terms ``g(name, value)`` whose sum (mod 2^64) identifies a run's settings."""
    s = model.settings[name]
    with np.errstate(over="ignore"):
        return _splitmix(_splitmix(np.asarray([_hash64(name)], np.uint64)) ^ value_bits(s, values))


def identity_names(model) -> list[str]:
    return sorted(k for k, s in model.settings.items() if s.identity)


def run_ids(model, constant: dict, varying: dict[str, np.ndarray], seeds: np.ndarray) -> np.ndarray:
    """``run_id`` (int64, 63 bits) of runs with settings ``constant`` plus ``varying`` (arrays
    over runs) and seed indices ``seeds``: a hash of every identity setting and the seed,
    independent of which settings were axes."""
    total = np.zeros(len(seeds), np.uint64)
    with np.errstate(over="ignore"):
        for name in identity_names(model):
            s = model.settings[name]
            if name in varying:
                terms = setting_terms(model, name, varying[name])
                if s.silent_default:
                    terms = np.where(np.asarray(varying[name]) == s.default, np.uint64(0), terms)
                total = total + terms
            elif not (s.silent_default and constant[name] == s.default):
                total = total + setting_terms(model, name, [constant[name]])[0]
        seed_term = _splitmix(np.asarray(seeds, np.uint64) + np.uint64(0x5EED))
        return (_splitmix(total ^ seed_term) & _MASK63).astype(np.int64)


def key_ids(model, constant: dict, varying: dict[str, np.ndarray], seeds: np.ndarray,
            ids: np.ndarray | None = None) -> np.ndarray:
    """The ids the runs' random keys derive from: their :func:`run_ids`, except that with
    ``common_noise = AXIS`` the runs that differ only along ``AXIS`` share one (the id of the
    run with ``AXIS`` left out), so they draw the same noise, labels, test set and W_0 — the
    official code's ``np.random.seed(seed)`` along the signal axis. Each run's distribution is
    unchanged; runs along the axis are correlated. ``ids``: the runs' ids when the caller has
    them (hashed once per chunk, not twice)."""
    ids = run_ids(model, constant, varying, seeds) if ids is None else ids
    if "common_noise" not in model.settings:
        return ids
    mode = np.broadcast_to(np.asarray(varying.get("common_noise",
                                                  constant.get("common_noise", "none")),
                                      dtype=object), (len(seeds),))
    for axis in {str(m) for m in mode} - {"none"}:  # an axis of its own: run by run
        const = {**constant, axis: 0.0}
        shared = run_ids(model, const, {k: v for k, v in varying.items() if k != axis}, seeds)
        ids = np.where(mode == axis, shared, ids)
    return ids


def key_words(run_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two 32-bit words of ``run_id`` that are folded into the root key."""
    u = np.asarray(run_id, np.int64).view(np.uint64)
    return (u >> np.uint64(32)).astype(np.uint32), (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def run_key(root_seed, hi, lo):
    """``fold_in(fold_in(PRNGKey(root_seed), hi), lo)``: traceable, vmappable."""
    import jax

    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(root_seed), hi), lo)

