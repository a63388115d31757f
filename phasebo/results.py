"""Tidy results tables: regimes, the schema, atomic Parquet parts and their assembly.

Three long-format tables, one row per:

- ``results``: run (its model's settings, derived SNR columns, final metrics, ``status``,
  ``regime``);
- ``dynamics``: (run, recorded step), when the sweep records dynamics;
- ``samples``: (run, training sample): clean label, flipped, first-fit step, final margin.

Every column belongs to one group (:func:`column_groups`): ``settings`` (the model's settings,
``model``, ``engine``: what a cell is), ``run`` (identity and provenance: ``run_id``, ``seed``,
...), ``derived`` (``snr``, ``n_snr2``), ``keys`` (``step`` of a dynamics row, ``sample`` of a
samples row), ``labels`` (``status``, ``regime``) and ``metrics`` (everything measured). Each
Parquet table records its groups in its metadata (:data:`GROUPS_KEY`), written from the model
that made the rows, so a reader (:func:`read_table`) tells settings from metrics without the
model registry: a file of a model or setting this version does not know is read as it was
written.

Parts are written atomically (temporary file + rename) as a sweep goes; :func:`assemble` joins the
parts of the runs a sweep specification names (each exactly once, in the specification's order),
applies the schema (ordered categoricals, integer counts) and writes ``results.parquet`` /
``results.csv`` (and ``dynamics.parquet``, ``samples.parquet``).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .regimes import (  # noqa: F401 (REGIMES, classify_regime: re-exported)
    REGIME_ORDER,
    REGIMES,
    cell_keys,
    classify_regime,
    classify_runs,
    clean_reference,
    regimes_over_time,
    timeline,
)
from .settings import ConfigError

RUN_STATUSES = ("ok", "diverged", "unsolved")  # a run's status (phasebo.train.Status)
# The column groups (see the module docstring); the settings come from the model of the rows.
RUN_COLUMNS = ("run_id", "seed", "root_seed", "source", "engine_setting", "sweep")
DERIVED = ("snr", "n_snr2", "time")
STEP = "step"  # the time axis of a dynamics table: a cell key, never a metric
KEY_COLUMNS = (STEP, "sample")
LABEL_COLUMNS = ("status", "regime")
GROUPS = ("settings", "run", "derived", "keys", "labels", "metrics")
GROUPS_KEY = b"phasebo.column_groups"  # Parquet metadata: {group: [column, ...]} as JSON
INT_COLUMNS = ("run_id", "seed", "n_noisy", "noisy_fit_step", "all_fit_step", "diverge_step",
               "first_benign_step", "dip_step", "recovery_step", "held_recovery_step",
               "converged_step",
               "solver_steps")


def derived_columns(df: pd.DataFrame) -> pd.DataFrame:
    """SNR columns: ``snr = ||mu|| / (sigma_eps sqrt d)`` and ``n_snr2 = n snr^2``."""
    if {"signal_norm", "d"} <= set(df.columns):
        sigma = df["sigma_eps"] if "sigma_eps" in df.columns else 1.0
        df["snr"] = df["signal_norm"] / (sigma * np.sqrt(df["d"].astype(float)))
        if "n" in df.columns:
            df["n_snr2"] = df["n"] * df["snr"] ** 2
    return df


def apply_schema(df: pd.DataFrame, models=None, engines=None) -> pd.DataFrame:
    """Ordered categoricals for ``regime`` (benign < harmful < not_overfitting < diverged),
    categoricals for ``status``, ``model``, ``engine``; integer types for counts and steps."""
    if "regime" in df.columns:
        df["regime"] = pd.Categorical(df["regime"].astype(str), categories=REGIME_ORDER,
                                      ordered=True)
    if "status" in df.columns:
        df["status"] = pd.Categorical(df["status"].astype(str), categories=RUN_STATUSES)
    for col, cats in (("model", models), ("engine", engines)):
        if col in df.columns:
            c = sorted(set(df[col].astype(str))) if cats is None else list(cats)
            df[col] = pd.Categorical(df[col].astype(str), categories=c)
    for c in INT_COLUMNS:
        if c in df.columns and df[c].notna().all():
            df[c] = df[c].astype(np.int64)
    return df


TIMELINE = ("first_benign_step", "dip_step", "dip_test_acc", "recovery_step",
            "held_recovery_step")


def column_groups(columns, settings) -> dict[str, list[str]]:
    """``columns`` by group (:data:`GROUPS`, each in column order); ``settings``: the setting
    names of the model(s) that made the rows (``model`` and ``engine`` are settings too)."""
    settings = set(settings) | {"model", "engine"}
    out: dict[str, list[str]] = {k: [] for k in GROUPS}
    for c in columns:
        g = ("run" if c in RUN_COLUMNS else "derived" if c in DERIVED else
             "keys" if c in KEY_COLUMNS else "labels" if c in LABEL_COLUMNS else
             "settings" if c in settings else "metrics")
        out[g].append(c)
    return out


def merge_groups(groups: list) -> dict[str, list[str]] | None:
    """One grouping of several tables' (``None`` where none records one); a column that is a
    setting in one table is a setting of the union."""
    groups = [g for g in groups if g]
    if not groups:
        return None
    out = {k: list(dict.fromkeys(c for g in groups for c in g.get(k, []))) for k in GROUPS}
    taken: set = set()
    for k in GROUPS:  # first group wins: settings before metrics
        out[k] = [c for c in out[k] if c not in taken]
        taken |= set(out[k])
    return out


def groups_of(path: Path) -> dict[str, list[str]] | None:
    """The column groups a Parquet file records: phasebo's own record, or the ``df.attrs`` pandas
    wrote with a table ``pb.load`` read and the user saved again (``None`` for a file written
    without either)."""
    meta = pq.read_schema(path).metadata or {}
    if GROUPS_KEY in meta:
        return json.loads(meta[GROUPS_KEY])
    try:  # pandas >= 2.1 keeps df.attrs in the file
        return json.loads(meta.get(b"PANDAS_ATTRS", b"{}")).get("column_groups")
    except (ValueError, AttributeError):
        return None


def read_table(path: Path) -> pd.DataFrame:
    """A Parquet table with its recorded column groups in ``df.attrs["column_groups"]``."""
    df = pd.read_parquet(path)
    g = groups_of(path)
    if g is not None:
        df.attrs["column_groups"] = g
    return df


def output_columns(model, out) -> set[str]:
    """The columns a group's results rows will have: its model's settings, the derived columns,
    the final metrics of the traced program (``out``: its abstract ``RunOutput``), the regime's
    reference accuracy (:func:`judge`) and, when it records a margin, each run's timeline
    (:func:`phasebo.regimes.timeline`)."""
    cols = set(model.settings) | set(out.final) | (set(RUN_COLUMNS) - {"source"}) | \
        set(DERIVED) | set(LABEL_COLUMNS)
    cols |= {"reference_acc", "reference_runs"} if "test_reference" in model.settings else set()
    return cols | (set(TIMELINE) if out.dynamics and "margin" in out.dynamics else set())


def _column(v, B):
    if isinstance(v, tuple):
        v = "+".join(map(str, v))
    return np.full(B, v, dtype=object if isinstance(v, str) else None)


def rows(spec, g, cols: list, out) -> tuple:
    """Host outputs of a chunk of group ``g`` (:class:`phasebo.plan.Group`) -> (results,
    dynamics, samples) DataFrames; ``cols``: the settings columns of its pieces
    (:func:`phasebo.grid.chunk_arrays`)."""
    from .train import Status  # jax: only where a sweep runs

    model = g.model
    frames = []
    for own, var, seeds, ids in cols:
        B = len(ids)
        d = {"sweep": np.full(B, spec.name, object), "run_id": ids, "model": np.full(B, model.name,
                                                                                    object),
             "seed": seeds.astype(np.int64)}
        for k in spec.axes:
            if k in model.settings:
                d[k] = var[k] if k in var else _column(own[k], B)
        for k in model.settings:
            if k not in d:
                d[k] = var[k] if k in var else _column(own[k], B)
        frames.append(pd.DataFrame(d))
    res = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    n = len(res)
    res["engine_setting"] = res["engine"]
    res["engine"] = g.engine.name
    kind = getattr(g.program, "dynamics", "gd")
    flow = kind == "flow"
    if flow:  # a flow's horizon in GD-equivalent steps of its lr (phasebo.flow)
        res["steps"] = np.round(res["flow_time"].to_numpy(float)
                                / res["lr"].to_numpy(float)).astype(np.int64)
    elif kind == "limit":  # no time axis: no step; its time is infinite (phasebo.limit)
        res["steps"] = np.zeros(len(res), np.int64)
        # no step size either (refused as a setting), unless a GD warm-up took steps of it
        warm = res["limit_warmup"].to_numpy() > 0 if "limit_warmup" in res.columns else False
        res["lr"] = np.where(warm, res["lr"].to_numpy(float), np.nan)
    for k, st in model.settings.items():  # a run has no other dynamics' settings: empty
        if st.requires in (("dynamics", "flow"), ("dynamics", "limit")) \
                and st.requires[1] != kind:
            res[k] = np.nan
    final = {k: np.asarray(v)[:n] for k, v in out.final.items()}
    metrics = pd.DataFrame(final)
    labels = {int(s): s.label for s in Status}
    status = np.array([labels.get(int(s), "error") for s in final["status"]], object)
    metrics["status"] = status
    metrics["regime"] = "fitting"  # placeholder: judged below, with the whole chunk at hand
    front = ["train_acc", "train_acc_clean", "train_acc_noisy", "test_acc", "train_loss",
             "test_loss", "status", "regime"]
    metrics = metrics[[c for c in front if c in metrics] + [c for c in metrics if c not in front]]
    res = pd.concat([res, metrics], axis=1)
    res = derived_columns(res)
    if "lr" in res.columns and "steps" in res.columns:  # the horizon in flow time
        res["time"] = res["flow_time"].astype(float) if flow else np.inf \
            if kind == "limit" else res["lr"].astype(float) * res["steps"].astype(float)
    dyn = None
    rec = model.recorded_steps(g.program)
    if (rec or flow) and out.dynamics:
        cols_d = {k: np.asarray(v)[:n].reshape(-1) for k, v in out.dynamics.items()}
        R = len(next(iter(cols_d.values()))) // max(n, 1)
        if flow and "time" in cols_d:
            # the recorded times as the host set them (float64, tidy), not their float32 copies
            # from the device (0.10000000149 for 0.1)
            from .flow import record_times

            host = np.asarray(record_times(g.program.flow_time, g.program.record_log), float)
            if len(host) == R:
                cols_d["time"] = np.tile(host, n)
        step = cols_d.pop("step").astype(np.int64) if flow else np.tile(np.asarray(rec, np.int64), n)
        dyn = pd.DataFrame({"run_id": np.repeat(res["run_id"].to_numpy(), R), "step": step,
                            **cols_d})
        if flow:  # recorded times closer than one step of lr share a step: keep the first
            dyn = dyn.drop_duplicates(["run_id", "step"], keep="first")
        else:
            dyn["time"] = dyn["step"] * np.repeat(res["lr"].to_numpy(float), R) \
                if "lr" in res.columns else np.nan
        dyn = dyn.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    res, dyn = judge(res, dyn, list(model.settings))
    if dyn is not None:
        dyn.attrs["column_groups"] = column_groups(dyn.columns, model.settings)
    smp = None
    if out.samples:
        cols_s = {k: np.asarray(v)[:n] for k, v in out.samples.items()}
        m = next(iter(cols_s.values())).shape[1]
        smp = pd.DataFrame({"run_id": np.repeat(res["run_id"].to_numpy(), m),
                            "sample": np.tile(np.arange(m), n),
                            **{k: v.reshape(-1) for k, v in cols_s.items()}})
        smp.attrs["column_groups"] = column_groups(smp.columns, model.settings)
    res.attrs["column_groups"] = column_groups(res.columns, model.settings)
    return res, dyn, smp


def judge(res: pd.DataFrame, dyn: pd.DataFrame | None, settings) -> tuple:
    """The regime columns of a results table and its dynamics (rows sorted by run and step):
    ``regime`` at the horizon, with its ``reference_acc`` (and ``reference_runs``, the noise-free
    runs it averages, under ``test_reference = "clean"``: :func:`phasebo.regimes.clean_reference`,
    cells made by ``settings`` but :data:`phasebo.settings.NOT_CELL`); in ``dyn`` (when it has
    margins), the regime at every recorded step and each run's timeline columns in ``res``.

    A sweep's chunks are judged as they are written; the assembled table is judged again as a
    whole, since a clean reference reads runs of other chunks."""
    by = cell_keys(settings, res.columns)
    timed = dyn is not None and "margin" in dyn.columns
    ref, runs, ref_dyn = clean_reference(res, by, dyn if timed else None)
    gone = (*TIMELINE, "reference_acc", "reference_runs") if timed else \
        ("reference_acc", "reference_runs")
    res = res.drop(columns=[c for c in gone if c in res.columns])
    res["regime"] = classify_runs(res, ref)
    if "test_reference" in res.columns:
        res["reference_acc"] = ref
        res["reference_runs"] = runs
    if timed:
        reg = regimes_over_time(dyn, res, ref_dyn)
        at = pd.MultiIndex.from_arrays([dyn["run_id"].to_numpy(), dyn["step"].to_numpy()])
        dyn = dyn.copy()
        dyn["regime"] = pd.Series(reg["regime"].to_numpy(), index=pd.MultiIndex.from_arrays(
            [reg["run_id"].to_numpy(), reg["step"].to_numpy()])).reindex(at).to_numpy()
        res = res.merge(timeline(reg, res), on="run_id", how="left", validate="one_to_one")
    return res, dyn


def _known_settings() -> list[str]:
    """Every setting this version's models know: the cell key of a table whose parts recorded
    no column groups."""
    from .registry import all_settings  # the models (jax): only for such a table

    return list(all_settings())


def write_table_atomic(df: pd.DataFrame, path: Path, groups: dict | None = None) -> None:
    """Write Parquet through a temporary file and an atomic rename (never a half-written file);
    ``groups`` (default: ``df.attrs["column_groups"]``), restricted to the table's columns, go
    into its metadata."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")  # unique across hosts
    groups = groups if groups is not None else df.attrs.get("column_groups")
    if not groups:
        table = pa.Table.from_pandas(df, preserve_index=False)
    else:
        have = set(df.columns)
        kept = {k: [c for c in v if c in have] for k, v in groups.items()}
        attrs = df.attrs  # pyarrow stores the attrs as well: one grouping in the file
        df.attrs = {**attrs, "column_groups": kept}
        try:
            table = pa.Table.from_pandas(df, preserve_index=False)
        finally:
            df.attrs = attrs
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               GROUPS_KEY: json.dumps(kept).encode()})
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_csv_atomic(df: pd.DataFrame, path: Path) -> None:
    """``df`` as CSV, atomically. pyarrow's writer (C++, threaded; categories as their labels,
    strings quoted only where needed) wrote the 152,100-run map's table in 0.5 s where pandas
    took 5 s; the values read back are the same. A table arrow cannot hold (mixed Python
    objects) falls back to pandas."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        table = pa.Table.from_pandas(df, preserve_index=False)
        table = table.cast(pa.schema([pa.field(f.name, pa.string()) if
                                      pa.types.is_dictionary(f.type) else f
                                      for f in table.schema]))
        pcsv.write_csv(table, tmp, pcsv.WriteOptions(quoting_style="needed"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
        df.to_csv(tmp, index=False)
    os.replace(tmp, path)


def part_files(parts_dir: Path, kind: str, tags: set[str] | None = None) -> list[Path]:
    files = sorted(Path(parts_dir).glob(f"{kind}-*.parquet"))
    if tags is not None:
        files = [f for f in files if f.name[len(kind) + 1:] in tags]
    return files


def read_parts(parts_dir: Path, kind: str, tags: set[str] | None = None) -> pd.DataFrame | None:
    """Concatenate the ``kind`` parts; with ``tags``, only the chunks whose tag is in it."""
    files = part_files(parts_dir, kind, tags)
    if not files:
        return None
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    groups = merge_groups([groups_of(f) for f in files])
    if groups is not None:
        df.attrs["column_groups"] = groups
    return df


def done_run_ids(parts_dir: Path) -> np.ndarray:
    """Sorted run ids already written as results parts (each part is complete: renamed into
    place); 8 bytes per run."""
    ids = [pq.read_table(f, columns=["run_id"]).column(0).to_numpy()
           for f in part_files(parts_dir, "results")]
    return np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)


def assemble(out_dir: Path, expected: np.ndarray, models=None, engines=None,
             write: bool = True, partial: bool = False) -> pd.DataFrame:
    """Join the parts of the runs ``expected`` (run ids in specification order) into the tables.

    Every expected run must be there exactly once (``partial``: the ones that are), rows keep the
    specification's order, and runs of the directory that the specification does not name are
    left out (they stay in the parts).
    """
    out_dir = Path(out_dir)
    parts = out_dir / "parts"
    df = read_parts(parts, "results")
    if df is None:
        raise ConfigError(f"{out_dir} has no finished runs yet (no result parts under {parts}); "
                          "fix: run the sweep first")
    groups = df.attrs.get("column_groups")
    df = df.drop_duplicates("run_id", keep="first")
    pos = pd.Index(np.asarray(expected, np.int64)).get_indexer(df["run_id"].to_numpy())
    df = df[pos >= 0].assign(_pos=pos[pos >= 0]).sort_values("_pos", kind="stable")
    missing = len(expected) - len(df)
    if missing and not partial:
        raise RuntimeError(f"{missing} runs of the sweep are missing from {parts}")
    df = df.drop(columns="_pos").reset_index(drop=True)
    # A chunk killed after its dynamics/samples parts but before its results part was rerun
    # (maybe in other chunks): read only the parts of chunks whose results part exists.
    tags = {f.name[len("results-"):] for f in part_files(parts, "results")}
    order = pd.Index(df["run_id"].to_numpy())
    tables = {}
    for kind, inner in (("dynamics", "step"), ("samples", "sample")):
        t = read_parts(parts, kind, tags)
        if t is None:
            continue
        g = t.attrs.get("column_groups")
        t = t.drop_duplicates(["run_id", inner], keep="first")
        p = order.get_indexer(t["run_id"].to_numpy())
        t = t[p >= 0].assign(_pos=p[p >= 0]).sort_values(["_pos", inner], kind="stable")
        t = t.drop(columns="_pos").reset_index(drop=True)
        tables[kind] = (t, g)
    if "test_reference" in df.columns and (df["test_reference"].astype(str) == "clean").any():
        # judged against noise-free runs, which other chunks may hold: judge the whole table
        dyn, g = tables.get("dynamics", (None, None))
        settings = (groups or {}).get("settings") or _known_settings()
        df, dyn = judge(df.assign(regime=df["regime"].astype(str)), dyn, settings)
        if dyn is not None:
            tables["dynamics"] = (dyn.assign(regime=pd.Categorical(
                dyn["regime"].astype(str), categories=REGIME_ORDER, ordered=True)), g)
    df = apply_schema(df, models, engines)
    if groups is not None:
        df.attrs["column_groups"] = groups
    if write:  # results.parquet last: while it is the old one, readers are told (check_current)
        for kind, (t, g) in tables.items():
            write_table_atomic(t, out_dir / f"{kind}.parquet", g)
        write_csv_atomic(df, out_dir / "results.csv")
        write_table_atomic(df, out_dir / "results.parquet")
    return df


def check_current(out_dir: Path, df: pd.DataFrame, notes: bool = True) -> None:
    """Refuse a ``results.parquet`` older than the runs of its directory: the manifest names the
    runs the tables hold (``tables_n_runs`` after a subset's command, else ``n_runs``), and when
    the table's count differs while the parts hold finished runs the table lacks, a command that
    grew the sweep did not finish (interrupted, failed or still running). A table holding every
    finished run (a grow refused before it ran anything) is current; so is a refinement's
    (``refine.json``: its table joins the rounds' directories)."""
    out_dir = Path(out_dir)
    try:  # the manifest is the store's (which imports this module): read here as plain JSON
        m = json.loads((out_dir / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return
    want = m.get("tables_n_runs", m.get("n_runs"))
    if notes and "tables_n_runs" in m and len(df) == want and m.get("n_runs") not in (None, want):
        # current, but of a subset: the last command selected some of the directory's runs
        print(f"phasebo: {out_dir}: its tables hold {want} of its {m['n_runs']} runs (the last "
              "command selected a subset of them); the command that made them all assembles "
              "every run again", file=sys.stderr)
    if want is None or len(df) == want or (out_dir / "refine.json").exists() \
            or "run_id" not in df.columns:
        return
    lacking = np.setdiff1d(done_run_ids(out_dir / "parts"), df["run_id"].to_numpy(np.int64))
    if not len(lacking):
        return
    last = (m.get("history") or [{}])[-1]
    how = "was interrupted" if last.get("interrupted") else \
        "has not finished (still running, or stopped)" if not last.get("finished") else \
        "finished after another command wrote these tables"
    cmd = f" (`{last['command']}`)" if last.get("command") else ""
    raise ConfigError(f"{out_dir}: results.parquet holds {len(df)} runs, not the {want} of its "
                      f"sweep ({len(lacking)} finished runs are not in it): the command that "
                      f"changed it{cmd} {how}; fix: run that command again to write the tables, "
                      "or (in Python) pb.load(DIR, partial=True) for every finished run")


def unfinished(path: Path) -> ConfigError:
    """The error for a directory whose sweep has not finished, naming the command that finishes
    it (its manifest's latest)."""
    try:
        cmd = json.loads((Path(path) / "manifest.json").read_text()).get("command")
    except (OSError, ValueError):
        cmd = None
    run = f"its command again ({cmd})" if cmd else "its sweep again"
    return ConfigError(f"{path} holds an unfinished sweep (no results.parquet); fix: run {run} "
                       "to finish it, or (in Python) pb.load(DIR, partial=True) to read its "
                       "finished parts")


def not_results(path: Path) -> ConfigError:
    """The error for a sweep file given where its results were expected."""
    import tomllib

    try:
        name = tomllib.loads(Path(path).read_text()).get("name") or Path(path).stem
    except (OSError, ValueError):
        name = Path(path).stem
    return ConfigError(f"{path} is a sweep file, not its results; fix: run it first (phasebo "
                       f"sweep {path}), then give its output directory (results/{name})")


def load_results(path: str | Path, partial: bool = False, notes: bool = True) -> pd.DataFrame:
    """Read a sweep's results: a results directory or a ``results.parquet`` file. ``partial``:
    read the finished parts of an interrupted sweep (no ``results.parquet`` yet)."""
    path = Path(path)
    if path.is_dir():
        f = path / "results.parquet"
        if f.exists() and not partial:
            df = read_table(f)
            check_current(path, df, notes)
            return df
        if (path / "parts").is_dir():
            if not partial:
                raise unfinished(path)
            df = read_parts(path / "parts", "results")
            if df is None:
                raise ConfigError(f"{path} has no finished runs yet")
            print(f"phasebo: {path}: read {len(df)} finished runs of an unfinished sweep",
                  file=sys.stderr)
            attrs = dict(df.attrs)
            df = df.drop_duplicates("run_id").reset_index(drop=True)
            if "test_reference" in df.columns and (df["test_reference"].astype(str)
                                                   == "clean").any():
                # judged against the noise-free runs finished so far (the final table judges
                # again); the timelines stay as their chunks wrote them
                settings = (attrs.get("column_groups") or {}).get("settings") or \
                    _known_settings()
                df, _ = judge(df.assign(regime=df["regime"].astype(str)), None, settings)
            df = apply_schema(df)
            df.attrs.update(attrs)
            return df
        raise ConfigError(f"{path} is not a sweep directory (no results.parquet); fix: give the "
                          "--out directory of a sweep")
    if not path.exists():
        raise ConfigError(f"{path} does not exist; fix: give a sweep directory or a "
                          "results.parquet file")
    if path.suffix == ".toml":
        raise not_results(path)
    import pyarrow as pa

    try:
        df = read_table(path)
    except (pa.ArrowInvalid, OSError):  # a file, but not a Parquet table pyarrow can read
        raise ConfigError(f"{path} is not a Parquet table that can be read; fix: give a sweep "
                          "directory or its results.parquet") from None
    if path.name == "results.parquet":  # a sweep directory's table, named by its file
        check_current(path.parent, df, notes)
    return df
