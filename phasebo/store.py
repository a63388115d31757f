"""The results directory: its manifest (with the history of every invocation), its parts and
their provenance, and the wait of process 0 for the other processes' parts.

Layout of ``results/<sweep>/``: ``manifest.json`` (the specification, the provenance of the latest
invocation that added runs, and ``history``: one entry per invocation), ``parts/`` (one Parquet
part per finished chunk and table, written atomically; a ``results-*`` part marks its runs as
done), then the assembled tables (``results.parquet``, ``results.csv``, ``dynamics.parquet``,
``samples.parquet``) and the figures. A directory holding runs of another sweep is refused unless
the new sweep only grows it (:func:`compatible`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform as _platform
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from . import config as C
from .config import SweepSpec
from .settings import ConfigError

try:  # advisory locks: POSIX only; elsewhere a directory is not held (two commands both run)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

TABLES = ("results.parquet", "results.csv", "dynamics.parquet", "samples.parquet")
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".html")  # what a sweep draws into its directory
HISTORY_KEYS = ("invocation", "subset", "started", "finished", "interrupted", "command",
                "new_runs", "wall_s", "compile_s", "setup_s", "compile_beside_s", "run_s", "phasebo_version",
                "git_commit", "git_dirty", "cwd", "host", "platform", "device_count")
# manifest keys that describe the directory, not an invocation's provenance (an interruption is
# one invocation's: its history entry says it)
NOT_PROVENANCE = ("name", "n_runs", "spec", "history", "subset", "tables_spec", "tables_n_runs",
                  "interrupted", "figures", "tables")


def check_out_dir(out_dir: Path) -> None:
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a directory; fix: give a directory "
                          "(it is created if missing)")
    probe = out_dir
    while not probe.exists():
        probe = probe.parent
    if probe.is_file():
        raise ConfigError(f"--out {out_dir}: {probe} is a file; fix: choose another directory")
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"--out {out_dir}: {probe} is not writable; fix: choose another "
                          "directory")


LOCK = ".phasebo-lock"  # held (flock) by the invocation writing the directory; says who
MISMATCH = ".phasebo-mismatch"  # why a process refused to run beside another of a cluster


@contextlib.contextmanager
def hold_dir(out_dir: Path, process_index: int = 0, what: str = "sweep", spec: dict | None = None):
    """Hold ``out_dir`` while this invocation writes runs into it: a second command into the same
    directory (the same process index of a cluster) is refused in one line naming the holder,
    instead of computing every run a second time. The lock is the kernel's (``flock``), so a
    killed holder releases it. The file is never removed (removing it would let a third command
    lock a new file while the second still holds the old one); it keeps the last holder's pid,
    host, command and kind. A lock file of another user that this one cannot write is locked
    read-only (the holder's details are then not rewritten). ``spec``: the sweep this process
    runs, kept in its lock file so that the other processes of a cluster can check they run the
    same one (:func:`peer_mismatch`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (LOCK if process_index == 0 else f"{LOCK}-{process_index}")
    try:
        f, writable = open(path, "a+"), True  # noqa: SIM115 (held open for the lock's lifetime)
    except PermissionError:  # another user's lock file in a shared directory
        try:
            f, writable = open(path), False  # noqa: SIM115
        except OSError:
            yield out_dir  # cannot even read it: the directory is not held
            return
    try:
        if fcntl is not None:
            _lock(f, out_dir)
        if process_index == 0 and spec is not None:  # a refusal of a cluster run before this one
            (out_dir / MISMATCH).unlink(missing_ok=True)
        if writable:
            f.seek(0)
            f.truncate()
            f.write(json.dumps({"pid": os.getpid(), "host": _platform.node(),
                                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                "command": command_line(), "what": what,
                                **({"spec": spec} if spec is not None else {})},
                               default=repr) + "\n")
            f.flush()
        yield out_dir
    finally:
        f.close()


def _lock(f, out_dir: Path, tries: int = 10) -> None:
    """``flock`` ``f`` exclusively, retried for ~0.2 s (a dry run's look at the lock, or a holder
    between its lock and its details, is a moment), else refuse naming the holder."""
    for i in range(tries):
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if i + 1 < tries:
                time.sleep(0.02)
        except OSError:  # a file system without locks: the directory is not held
            return
    f.seek(0)
    raise ConfigError(f"{out_dir} is being written by another phasebo command "
                      f"({_who(f.read())}); fix: wait for it to finish (then this command adds "
                      "only what it lacks), or give this one another --out")


def _who(text: str) -> str:
    """A lock file's holder in words."""
    try:
        w = json.loads(text)
        return (f"a {w.get('what', 'sweep')}, pid {w['pid']} on {w['host']}, started "
                f"{w['started']}: {w['command']}")
    except (ValueError, KeyError, TypeError):
        return text.strip() or "holder unknown"


def holder(out_dir: Path) -> str | None:
    """Who holds ``out_dir`` now (:func:`hold_dir`), or ``None`` when nobody does."""
    details = _held(Path(out_dir) / LOCK)
    return None if details is None else _who(details)


def _held(path: Path) -> str | None:
    """The details a live holder wrote into the lock file ``path``; ``None`` when none holds it."""
    if fcntl is None or not path.is_file():
        return None
    try:
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return f.read()
            except OSError:
                return None
    except OSError:
        return None
    return None


def peer_mismatch(out_dir: Path, spec: dict, process_index: int) -> str | None:
    """Why another live process of this cluster runs a different sweep into ``out_dir`` (its lock
    file's ``spec``, :func:`hold_dir`), naming the first setting that differs; ``None`` if none
    does. Process 0 looks at every other process's lock, the others at process 0's."""
    out_dir = Path(out_dir)
    spec = json.loads(json.dumps(spec, default=repr))  # as the lock file holds it
    if process_index == 0:
        peers = sorted(out_dir.glob(f"{LOCK}-*"))
    else:
        peers = [out_dir / LOCK]
    for path in peers:
        details = _held(path)
        try:
            theirs = json.loads(details).get("spec") if details else None
        except ValueError:  # being written: looked at again on the next poll
            theirs = None
        if theirs is None or theirs == spec:
            continue
        who = "process 0" if path.name == LOCK else f"process {path.name.rsplit('-', 1)[1]}"
        diff = spec_difference(spec, theirs, f"process {process_index}", who)
        return (f"process {process_index} runs another sweep than {who} into {out_dir}: {diff}; "
                "fix: start every process with the same sweep file and flags (--set, --seeds, "
                "...)")
    return None


def refuse_peer(out_dir: Path, why: str):
    """Refuse to run beside a process of another sweep, leaving why in ``.phasebo-mismatch`` for
    the others (process 0 would wait for the runs of a process that has gone)."""
    with contextlib.suppress(OSError):
        (Path(out_dir) / MISMATCH).write_text(why + "\n")
    raise ConfigError(why)


def spec_difference(a: dict, b: dict, one: str = "one", other: str = "the other") -> str:
    """The first setting in which two sweeps (:meth:`SweepSpec.to_dict`) differ, in words."""
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            return spec_difference(x, y, one, other)
        return f"{k} = {x!r} in {one}, {y!r} in {other}"
    return "the same settings"


def spec_of(d: dict) -> SweepSpec:
    """A manifest's ``spec`` (:meth:`SweepSpec.to_dict`) as a :class:`SweepSpec`: the settings and
    cases that make its runs."""
    return SweepSpec(name=d.get("name", ""), fixed=d.get("fixed", {}), axes=d.get("axes", {}),
                     seeds=d.get("seeds", 1), cases=tuple(d.get("cases", [{}])))


def _lost_values(old_spec: SweepSpec, new: SweepSpec) -> tuple[str, str, str] | None:
    """The first setting with values in ``old_spec`` that ``new`` does not have: ``(name, those
    values, new's values)`` as text."""
    names = old_spec.setting_names() | new.setting_names()
    defaults = C.all_settings()

    def vals(spec, k):
        if k in spec.axes:
            return {json.dumps(x, default=list) for x in spec.axes[k]}
        v = []
        for case in spec.cases:  # a case's own value, the fixed one, or its model's default
            if k in case or k in spec.fixed:
                v.append(case.get(k, spec.fixed.get(k)))
                continue
            models = [case["model"]] if "model" in case else spec.values("model") or \
                [defaults["model"].default]
            own = [C.get_model(m).settings[k].default for m in models
                   if k in C.get_model(m).settings]
            v += own or [defaults[k].default]
        return {json.dumps(x, default=list) for x in v}

    for k in sorted(names):
        if k not in defaults:
            continue
        before, after = vals(old_spec, k), vals(new, k)
        lost = before - after
        if lost:
            return k, _in_order(lost), _in_order(after)
    return None


def _in_order(values: set[str]) -> str:
    """JSON-encoded values as text, numbers in numeric order (375 before 1000)."""
    def key(v):
        x = json.loads(v)
        num = isinstance(x, int | float) and not isinstance(x, bool)
        return (0, x, "") if num else (1, 0, v)

    return ", ".join(sorted(values, key=key))


def _lost_cell(old_spec: SweepSpec, new: SweepSpec) -> str | None:
    """A cell of ``old_spec`` whose runs ``new`` does not have although every value of every
    setting remains (``[[cases]]`` that pair the values differently), as a reason."""
    import numpy as np

    from .grid import cell_run_ids, cell_runs, spec_run_ids

    new_ids = spec_run_ids(new)
    if np.isin(spec_run_ids(old_spec), new_ids).all():
        return None
    named = sorted({k for c in old_spec.cases for k in c} | set(old_spec.axes))
    R = old_spec.runs_per_cell()
    for cell in old_spec.cells():
        missing = ~np.isin(cell_run_ids(old_spec, cell, np.arange(R)), new_ids)
        if missing.any():  # name its first such run by the values that place it
            run = {k: v[0] for k, v in cell_runs(old_spec, cell, np.flatnonzero(missing)[:1])
                   .items()}
            where = ", ".join(f"{k} = {run.get(k, cell.settings.get(k))!r}" for k in named)
            how = ", whose [[cases]] pair the values differently" if len(new.cases) > 1 or \
                len(old_spec.cases) > 1 else ""
            return (f"its run at ({where}{', ' if where else ''}seed {int(run['seed'])}) is not "
                    f"a run of this sweep{how}")
    return "some of its runs are not runs of this sweep"


def compatible(old: dict, new: SweepSpec) -> str | None:
    """Why the runs already in a directory (``old``: its manifest's spec) are not part of the
    sweep ``new`` (None: every old value of every setting is still a value of it, every old run
    is a run of it, and it has as many seeds, so the new sweep only grows the old one)."""
    old_spec = spec_of(old)
    lost = _lost_values(old_spec, new)
    if lost:
        k, gone, now = lost
        return f"{k} had {gone} there, which this sweep no longer has (it has {now})"
    if new.seeds < old_spec.seeds:
        return (f"it has {old_spec.seeds} seeds per cell, this sweep {new.seeds} (--seeds "
                f"{old_spec.seeds} keeps them, if nothing else differs)")
    return _lost_cell(old_spec, new)


def added(old: dict, new: SweepSpec) -> str | None:
    """A setting value of ``new`` that the directory's sweep ``old`` does not have, as a reason
    (None: ``new`` only selects among the directory's runs and settings). A sweep whose runs are
    all in the directory but whose other settings differ (a regime threshold, what is recorded)
    is not a subset: its tables would keep the values the runs were made with."""
    extra = _lost_values(new, spec_of(old))
    if extra:
        k, new_values, there = extra
        return f"this sweep has {k} = {new_values}, they were made with {there}"
    return None


def read_manifest(out_dir: Path) -> dict:
    """The directory's manifest, or ``{}`` when there is none (or it is unreadable)."""
    try:
        return json.loads((Path(out_dir) / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def clear_derived(out_dir: Path) -> None:
    """Remove the parts and everything made from them: tables and figures (``--overwrite``)."""
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir / "parts", ignore_errors=True)
    shutil.rmtree(out_dir / "figures", ignore_errors=True)
    for f in TABLES:
        (out_dir / f).unlink(missing_ok=True)
    if out_dir.is_dir():
        for f in out_dir.iterdir():  # figures, and the boundary tables of the runs discarded
            if f.is_file() and (f.suffix in FIGURE_SUFFIXES or f.name.startswith("boundaries")
                                and f.suffix in (".csv", ".parquet")):
                f.unlink()


def is_boundary_file(f: Path) -> bool:
    """Whether ``f`` is a table or figure ``phasebo boundaries`` wrote (named
    ``boundar{ies,y}_<A>_<B>_along_<x>_per_<y>...``; a file of the user's own is not)."""
    ours = "_along_" in f.name and "_per_" in f.name
    return f.is_file() and ours and (
        f.name.startswith("boundaries_") and f.suffix in (".csv", ".parquet")
        or f.name.startswith("boundary_") and f.suffix in FIGURE_SUFFIXES)


def clear_boundaries(out_dir: Path) -> list[str]:
    """Remove what ``phasebo boundaries`` (:func:`is_boundary_file`) and ``phasebo plot`` (in
    ``figures/``) made from tables a sweep has just replaced; their names."""
    out_dir = Path(out_dir)
    plots = sorted(f for f in (out_dir / "figures").glob("*") if f.suffix in FIGURE_SUFFIXES)
    gone = [f for f in sorted(out_dir.iterdir()) if is_boundary_file(f)] + plots
    for f in gone:
        f.unlink()
    return [f.relative_to(out_dir).as_posix() for f in gone]


def tables_spec(manifest: dict) -> dict | None:
    """The specification of the runs a directory's tables hold (a subset's, or the directory's)."""
    return manifest.get("tables_spec") or manifest.get("spec")


def holds_runs(out_dir: Path) -> bool:
    """Whether ``out_dir`` has a finished run: a manifest alone (a sweep refused after it wrote
    one, e.g. by its plot spec once its programs were traced) does not bind the directory."""
    return any((Path(out_dir) / "parts").glob("results-*.parquet"))


def is_subset(out_dir: Path, spec: SweepSpec, old: dict) -> bool:
    """Whether ``spec`` only selects among the runs of ``out_dir`` (its manifest ``old``): True
    when every run is there and was made with these settings (the tables and figures will be of
    these runs); False when it grows the directory or the directory holds no run. Raises
    :class:`ConfigError` when it would drop runs there, or take runs made with other settings."""
    why = compatible(old["spec"], spec) if old.get("spec") else None
    if not why:
        return False
    if runs_done(out_dir, spec):
        extra = added(old["spec"], spec)
        if extra and holds_runs(out_dir):  # the runs are there, made with other settings
            raise ConfigError(f"{out_dir} holds these runs made with other settings: {extra}; "
                              "fix: give this sweep another --out (out_dir in Python; the "
                              "directory's runs stay as they are)")
        return True
    if holds_runs(out_dir):
        raise ConfigError(f"{out_dir} holds runs of another sweep: {why}; fix: choose another "
                          "--out, or pass --overwrite to discard them (in Python: out_dir, "
                          "overwrite=True)")
    return False


def prepare_out_dir(out_dir: Path, spec: SweepSpec, overwrite: bool, process_index: int = 0,
                    wait_timeout: float = 600.0, provenance: dict | None = None) -> Path:
    """Create ``out_dir`` with its manifest. A directory holding another sweep's runs is refused
    unless this sweep only grows it (more seeds, more axis values) or ``overwrite`` (which removes
    its parts, tables and figures).

    With several processes, process 0 prepares the directory and the others wait for its
    manifest (a shared file system is assumed, as on a cluster).
    """
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    new = spec.to_dict()
    if process_index > 0:
        deadline, started = time.monotonic() + wait_timeout, time.time()
        while time.monotonic() < deadline:
            # before a manifest of the same sweep run earlier is taken for this one's
            check_peers(out_dir, new, process_index, started)
            m = read_manifest(out_dir)  # a subset sweep's spec is the manifest's tables_spec
            # process 0 seen running this sweep (its lock names it), or, where locks are not
            # seen across hosts, after a grace of 30 s
            seen = '"spec"' in (_held(out_dir / LOCK) or "") or time.time() > started + 30
            if new in (m.get("spec"), m.get("tables_spec")) and (out_dir / "parts").is_dir() \
                    and seen:
                return out_dir
            time.sleep(0.2)
        raise ConfigError(f"process {process_index}: process 0 did not prepare {out_dir} "
                          f"within {wait_timeout:.0f} s; is --out on a shared file system?")
    old = read_manifest(out_dir)
    provenance = {} if provenance is None else provenance
    if old and not overwrite:
        if is_subset(out_dir, spec, old):
            provenance["subset"] = True  # every run of this sweep is there: tables of those
    if overwrite:
        clear_derived(out_dir)
        old = {}
    (out_dir / "parts").mkdir(parents=True, exist_ok=True)
    write_manifest(out_dir, spec, provenance, history=old.get("history", []), previous=old)
    return out_dir


def count_done(out_dir: Path, spec: SweepSpec) -> int:
    """How many runs of ``spec`` are already in ``out_dir``'s parts."""
    import numpy as np

    from .grid import spec_run_ids
    from .results import done_run_ids

    done = done_run_ids(Path(out_dir) / "parts")
    return int(np.isin(spec_run_ids(spec), done).sum()) if len(done) else 0


def runs_done(out_dir: Path, spec: SweepSpec) -> bool:
    """Whether every run of ``spec`` is already in ``out_dir``'s parts (a subset of its runs)."""
    return count_done(out_dir, spec) == spec.n_runs


def write_manifest(out_dir: Path, spec: SweepSpec, provenance: dict, history=None,
                   previous: dict | None = None) -> None:
    """Write the manifest atomically. Its top level holds the provenance of the latest invocation
    that added runs (``previous``'s is kept while this one has added none); ``history`` gains
    this invocation's entry (replacing its own earlier entry, same ``invocation`` id). For a
    sweep that is a subset of the directory's runs (``provenance["subset"]``) the manifest keeps
    the directory's specification and records the tables' as ``tables_spec``."""
    manifest = Path(out_dir) / "manifest.json"
    if history is None:
        history = read_manifest(out_dir).get("history", [])
    entry = {k: provenance[k] for k in HISTORY_KEYS if k in provenance}
    history = [h for h in history if h.get("invocation") != entry.get("invocation")] + [entry]
    prev = previous if previous is not None else read_manifest(out_dir)
    keep = not provenance.get("new_runs") and prev.get("new_runs")
    top = {k: v for k, v in (prev if keep else provenance).items() if k not in NOT_PROVENANCE}
    body = {"name": spec.name, "n_runs": spec.n_runs, "spec": spec.to_dict()}
    if provenance.get("subset") and prev.get("spec"):
        body.update(name=prev.get("name", spec.name), n_runs=prev.get("n_runs"),
                    spec=prev["spec"], tables_spec=spec.to_dict(), tables_n_runs=spec.n_runs)
    body.update(**top, history=history)
    for k in ("figures", "tables"):  # what the last drawing and assembly made: kept
        if prev.get(k) is not None:
            body[k] = prev[k]
    _write_json(manifest, body)


def _write_json(path: Path, body: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(body, indent=1, default=repr))
    os.replace(tmp, path)


def tables_digest(run_ids) -> str:
    """A short digest of a set of run ids (their order aside)."""
    import hashlib

    import numpy as np

    return hashlib.sha1(np.sort(np.asarray(run_ids).astype(np.uint64)).tobytes()).hexdigest()[:16]


def said_cleared(name: str, gone: list[str]) -> str:
    """The note for boundary files removed with the tables they were made from."""
    return (f"{name}: removed {len(gone)} table(s) and figure(s) of phasebo boundaries or phasebo "
            f"plot made from the tables these replace ({', '.join(gone[:2])}"
            f"{', ...' if len(gone) > 2 else ''}); fix: run those commands again")


def record_tables(out_dir: Path, run_ids) -> bool | None:
    """Record in the manifest which runs the tables now hold (a digest of their ids, as
    ``tables``): whether that changed since the last assembly (``None``: no record, a directory
    of an older version). Whatever was computed from the old tables is then stale."""
    digest = tables_digest(run_ids)
    m = read_manifest(out_dir)
    if not m:
        return None
    old = m.get("tables")
    m["tables"] = digest
    _write_json(Path(out_dir) / "manifest.json", m)
    return None if old is None else old != digest


def record_figures(out_dir: Path, paths) -> list[str]:
    """Record the figures a sweep drew (``paths``) in its manifest, and remove those its previous
    drawing made that this one did not: a grown sweep can name its figures differently (another
    axis, another facet), and the old files would read as current. Returns the names removed."""
    out_dir = Path(out_dir)
    m = read_manifest(out_dir)
    if not m:
        return []
    names = {Path(p).resolve().relative_to(out_dir.resolve()).as_posix() for p in paths}
    drawn = {n.rsplit(".", 1)[0] for n in names}  # a figure in another format is still current
    old = m.get("figures", [])
    stale = [n for n in old if n.rsplit(".", 1)[0] not in drawn]
    for n in stale:
        (out_dir / n).unlink(missing_ok=True)
    m["figures"] = sorted(names | {n for n in old if n not in stale and (out_dir / n).exists()})
    _write_json(out_dir / "manifest.json", m)
    return stale


def clear_figures(out_dir: Path) -> list[str]:
    """Remove the figures the manifest records and ``report.html``: drawn from the runs before the
    tables changed, left undrawn (``--no-plots``), they would read as current. Returns their
    names."""
    out_dir = Path(out_dir)
    m = read_manifest(out_dir)
    names = [n for n in (m.get("figures", []) if m else []) if (out_dir / n).exists()]
    names += ["report.html"] if (out_dir / "report.html").exists() else []
    for n in names:
        (out_dir / n).unlink(missing_ok=True)
    if m and m.get("figures"):
        m["figures"] = []
        _write_json(out_dir / "manifest.json", m)
    return names


def command_line(argv=None) -> str:
    """The command as a shell would take it back (quoted), ``python -m phasebo.sweep`` for the
    module entry point."""
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(("phasebo/sweep.py", "phasebo/__main__.py")):
        head = ["python", "-m", "phasebo.sweep" if argv[0].endswith("sweep.py") else "phasebo"]
        argv = head + argv[1:]
    elif argv and Path(argv[0]).name == "phasebo":
        argv = ["phasebo"] + argv[1:]
    return shlex.join(argv)


def provenance() -> dict:
    """Versions, commit, command line and devices: what a results directory was made by."""
    import jax

    from . import __version__

    here = Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=here, timeout=5).stdout.strip() or None
        # changes not committed: the commit alone does not say what made the runs
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                     "--", "."], capture_output=True, text=True, cwd=here,
                                    timeout=5).stdout.strip()) if commit else None
    except (OSError, subprocess.SubprocessError):
        commit = dirty = None
    devs = jax.local_devices()
    return {"invocation": uuid.uuid4().hex[:12], "phasebo_version": __version__,
            "jax_version": jax.__version__, "git_commit": commit, "git_dirty": dirty,
            "command": command_line(), "cwd": str(Path.cwd()), "python": _platform.python_version(),
            "host": _platform.node(), "device_kind": devs[0].device_kind,
            "platform": devs[0].platform, "device_count": len(devs),
            "process_count": jax.process_count()}


def check_peers(out_dir: Path, spec: dict, process_index: int = 0, since: float | None = None):
    """Refuse to go on beside a live process of another sweep (:func:`peer_mismatch`) or after
    one refused to run beside this one: its ``.phasebo-mismatch``, which process 0 removes when it
    starts (:func:`hold_dir`), so process 0 takes any there as this run's, another process one
    written since it started (``since``)."""
    why = peer_mismatch(out_dir, spec, process_index)
    if why:
        refuse_peer(out_dir, why)
    marker = Path(out_dir) / MISMATCH
    try:
        if since is None or marker.stat().st_mtime >= since:
            raise ConfigError(marker.read_text().strip())
    except FileNotFoundError:
        pass


def wait_for_runs(parts: Path, n_runs: int, timeout: float, quiet: bool,
                  spec: dict | None = None) -> None:
    """Process 0: wait until the other processes' parts hold every run; a process of another
    sweep (``spec``: process 0's, :func:`check_peers`) stops the wait at once."""
    from .results import done_run_ids

    deadline = time.monotonic() + timeout
    said = False
    while len(done_run_ids(parts)) < n_runs:
        if spec is not None:
            check_peers(parts.parent, spec)
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for the other processes' parts in {parts}")
        if not quiet and not said:
            print("process 0: waiting for the other processes' parts", file=sys.stderr)
            said = True
        time.sleep(1.0)
