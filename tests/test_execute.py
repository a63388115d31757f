"""The executor: one trace and one compile per program over many chunks, reused by the next
sweep whatever its size, chunks sized by measurement, chunking that does not change a row, and a
Ctrl-C that keeps every computed block."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pandas as pd
import pytest
from test_sweep import assert_same_tables, read, small_spec

from phasebo import grid as G
from phasebo import plan as P
from phasebo.config import load_sweep, spec_from_dict
from phasebo.execute import Executor, count_compiles
from phasebo.results import done_run_ids
from phasebo.sweep import run_sweep


def test_each_program_is_traced_once_over_many_chunks(tmp_path):
    jax.clear_caches()
    spec = small_spec(seeds=5)  # 10 runs per d group: chunks of 2 -> 5 chunks per group
    ex = Executor()
    run_sweep(spec, tmp_path / "o", chunk_size=2, block_size=1, quiet=True, plots=False,
              executor=ex)
    assert len(ex.traces) == 2  # d = 40 and d = 64: two programs on the direct engine
    assert set(ex.traces.values()) == {1} and set(ex.compiles.values()) == {1}
    # the second program compiled in a thread of its own while the first one's chunks ran
    entry = json.loads((tmp_path / "o" / "manifest.json").read_text())["history"][-1]
    assert entry["compile_beside_s"] > 0, entry
    # the same sweep again (a new directory, a new executor) reuses both programs: JAX traces
    # and compiles nothing at all
    again = Executor()
    with count_compiles() as seen:
        run_sweep(spec, tmp_path / "p", chunk_size=2, block_size=1, quiet=True, plots=False,
                  executor=again)
    assert sum(again.traces.values()) == 0 and sum(again.compiles.values()) == 0
    assert seen == {"compiles": 0}


@pytest.mark.parametrize("precision", ["highest", "tensorfloat32"])
def test_programs_are_traced_at_their_matmul_precision(precision, monkeypatch):
    """A sweep's program and run_one's carry the run's ``matmul_precision`` (default: full
    float32 products, whatever JAX's own default), and the setting is a results column."""
    import jax.numpy as jnp

    import phasebo.execute as E
    from phasebo.grid import chunk_arrays

    settings = {"model": "prompt_attention", "steps": 3, "n_test": 20, "d": 300}
    if precision != "highest":
        settings["matmul_precision"] = precision
    spec = spec_from_dict(settings, seeds=2)
    pl = P.plan(spec)
    g = pl.groups[0]
    arrays = chunk_arrays(spec, g, [(g.cells[0], np.arange(2))], g.block * pl.n_dev)[0]
    with jax.default_matmul_precision("bfloat16"):  # JAX's own default does not decide
        text = Executor().lower(g, {k: jnp.asarray(v) for k, v in arrays.items()},
                                pl.n_dev).as_text()
    assert ("HIGHEST" in text) == (precision == "highest")
    seen = []
    real = E._run

    def spy(*a, **kw):
        seen.append(jax.config.jax_default_matmul_precision)
        return real(*a, **kw)

    monkeypatch.setattr(E, "_run", spy)
    E.run_one(settings)
    assert seen == [precision]


def test_a_jax_default_precision_gets_a_note_that_the_setting_decides():
    from phasebo.notes import precision_notes

    spec = spec_from_dict({"model": "prompt_attention", "d": 300}, seeds=1)
    assert precision_notes(spec) == []
    with jax.default_matmul_precision("bfloat16"):
        (note,) = precision_notes(spec)
    assert "'bfloat16'" in note and "matmul_precision setting (highest)" in note


def test_a_resume_at_another_matmul_precision_is_refused(tmp_path):
    from phasebo.settings import ConfigError

    spec = spec_from_dict({"model": "prompt_attention", "steps": 3, "n_test": 20, "d": 300},
                          seeds=2)
    df = run_sweep(spec, tmp_path / "o", quiet=True, plots=False)
    assert (df["matmul_precision"] == "highest").all()
    # one more seed: the directory's runs at full float32 would be pooled with new TF32 ones
    other = spec_from_dict({**spec.fixed, "matmul_precision": "tensorfloat32"}, seeds=3)
    with pytest.raises(ConfigError, match="matmul_precision had"):
        run_sweep(other, tmp_path / "o", quiet=True, plots=False)


def test_compiles_are_counted_per_thread_when_asked():
    def compile_elsewhere():
        jax.jit(lambda x: x * 3.0 + 1.0).lower(np.ones(7, np.float32)).compile()

    with count_compiles(this_thread=True) as mine, count_compiles() as every:
        t = threading.Thread(target=compile_elsewhere)
        t.start()
        t.join()
    assert mine == {"compiles": 0} and every["compiles"] >= 1


def test_chunk_size_does_not_change_rows(tmp_path):
    spec = small_spec()
    tables = []
    for cs in (3, spec.n_runs):
        out = tmp_path / f"c{cs}"
        run_sweep(spec, out, chunk_size=cs, quiet=True, plots=False)
        tables.append(read(out))
    assert len(tables[0]["results"]) == spec.n_runs
    assert tables[0]["results"]["run_id"].tolist() == G.spec_run_ids(spec).tolist()
    assert len(tables[0]["dynamics"]) == spec.n_runs * 4  # steps 0, 20, 40, 60
    assert_same_tables(tables[0], tables[1])


def test_a_small_study_reuses_the_program_of_a_large_one(tmp_path):
    """The compiled shape is one block per device, not the sweep's size: a 2-run study after a
    96-run one of the same program traces and compiles nothing (in one process; across
    processes the persistent compilation cache holds the same executable)."""
    big = spec_from_dict({"model": "prompt_attention", "steps": 30, "n_test": 50},
                         {"d": [400, 1000], "signal_norm": [5.0, 20.0, 40.0]}, seeds=16)
    ex = Executor()
    run_sweep(big, tmp_path / "big", quiet=True, plots=False, executor=ex)
    assert sum(ex.compiles.values()) == 1  # the reduced engine: one program for every cell
    small = spec_from_dict({"model": "prompt_attention", "steps": 30, "n_test": 50, "d": 700,
                            "signal_norm": 12.0}, seeds=2)
    again = Executor()
    with count_compiles() as seen:
        df = run_sweep(small, tmp_path / "small", quiet=True, plots=False, executor=again)
    assert len(df) == 2
    assert sum(again.traces.values()) == 0 and seen == {"compiles": 0}


def test_chunks_are_sized_by_the_time_they_take():
    g = P.Group(None, None, None, [], n_runs=10_000, block=4, width=8)
    # 40 runs in 0.5 s -> about CHUNK_SECONDS of work, in whole blocks of 4 x 2 devices
    w = P.next_width(g, 2, 40, 0.5)
    assert w % 8 == 0 and abs(w - P.CHUNK_SECONDS * 80) <= 8
    assert P.next_width(g, 2, 40, 1e6) == 8  # never below one block per device
    assert P.next_width(g, 2, 40, 1e-9) <= P.MAX_CHUNK
    g.fixed = True  # --chunk-size: kept as given
    assert P.next_width(g, 2, 40, 0.5) == 8


def started(argv, env) -> tuple:
    """``(process, its stderr so far (a growing bytearray), the thread reading it)``."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = bytearray()

    def drain():
        while chunk := proc.stderr.read1(4096):
            err.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    return proc, err, reader


def interrupt(proc, timeout: float = 30, sig=signal.SIGINT) -> tuple:
    """SIGINT (or ``sig``) to ``proc``: ``(exit code or None if still running timeout s later,
    seconds to it)``."""
    proc.send_signal(sig)
    sent = time.monotonic()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None  # the interrupt was lost: the sweep runs on
    return code, time.monotonic() - sent


def wait_until(proc, err, found, deadline: float, poll: float = 0.05) -> None:
    """Poll ``proc``'s stderr ``err`` until ``found(err)``; fail if it exits or ``deadline``
    (a ``time.monotonic()`` value) passes first."""
    while not found(err):
        assert proc.poll() is None and time.monotonic() < deadline, err.decode()
        time.sleep(poll)


def reap(proc, reader) -> None:
    """Kill ``proc`` if it still runs; close its stderr reader."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    reader.join(timeout=10)
    proc.stderr.close()


def sigint_when_counted(argv, env, total: int, timeout: float = 240, sig=signal.SIGINT) -> tuple:
    """Start ``argv``, send SIGINT once its progress bar (of ``total`` runs) counts a finished
    run: ``(exit code or None if still running 30 s later, seconds from the signal to the exit,
    stderr, the count the bar showed)``."""
    proc, err, reader = started(argv, env)
    bar = re.compile(rb"\b([1-9]\d*)/%d \[" % total)
    try:
        deadline = time.monotonic() + timeout
        while not bar.search(err):
            assert proc.poll() is None, f"exit {proc.returncode} before any run:\n{err.decode()}"
            assert time.monotonic() < deadline, "the sweep did not start\n" + err.decode()
            time.sleep(0.05)
        counted = int(bar.findall(err)[-1])
        code, took = interrupt(proc, sig=sig)
    finally:
        reap(proc, reader)
    return code, took, err.decode(), counted


@pytest.mark.parametrize("common_noise", [  # noise groups: 19 s more, with -m slow
    "none", pytest.param("signal_norm", marks=pytest.mark.slow)])
def test_ctrl_c_keeps_every_computed_block_and_the_rerun_is_identical(tmp_path, common_noise):
    """SIGINT to a sweep with chunks sized by measurement (no --chunk-size): exit 130 within
    5 s, every run the progress bar had counted saved, and the resumed sweep equal to one that
    was never interrupted; run by run, and in noise groups (a chunk of whole groups, unfolded
    into runs when it is saved)."""
    f = tmp_path / "ci.toml"
    f.write_text('name = "ci"\nseeds = 250\n[settings]\nmodel = "prompt_attention"\n'
                 f'steps = 200\nn_test = 2000\nrecord_every = 4\ncommon_noise = "{common_noise}"\n'
                 '[axes]\nd = [250, 4000]\nsignal_norm = [5, 40]\n')
    out = tmp_path / "out"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
    code, took, text, counted = sigint_when_counted(
        [sys.executable, "-m", "phasebo", "sweep", str(f), "--out", str(out), "--no-plots"], env,
        1000)
    assert code == 130 and took <= 5.0, (code, took, text)
    assert "Traceback" not in text and "interrupted: finished chunks are saved under" in text
    done = done_run_ids(out / "parts")
    assert counted <= len(done) < 1000 and len(np.unique(done)) == len(done)
    entry = json.loads((out / "manifest.json").read_text())["history"][-1]
    assert entry["interrupted"] is True and entry["new_runs"] == len(done), entry
    spec = load_sweep(f)
    resumed = run_sweep(spec, out, quiet=True, plots=False)
    run_sweep(spec, tmp_path / "fresh", chunk_size=1000, quiet=True, plots=False)
    assert len(resumed) == 1000 and resumed["run_id"].is_unique
    a, b = read(out), read(tmp_path / "fresh")
    assert_same_tables(a, b)
    assert pd.Index(a["results"]["run_id"]).equals(pd.Index(b["results"]["run_id"]))


def test_sigterm_stops_as_ctrl_c_does(tmp_path):
    """SIGTERM, a scheduler's time limit: the sweep stops as for Ctrl-C (the computed blocks
    saved, the invocation marked interrupted, no traceback), not killed with its blocks lost; it
    exits 143, as a terminated process does (a Ctrl-C exits 130)."""
    f = tmp_path / "t.toml"
    f.write_text('name = "t"\nseeds = 250\n[settings]\nmodel = "prompt_attention"\n'
                 'steps = 200\nn_test = 100\n[axes]\nd = [250, 4000]\nsignal_norm = [5, 40]\n')
    out = tmp_path / "out"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
    code, took, text, counted = sigint_when_counted(
        [sys.executable, "-m", "phasebo", "sweep", str(f), "--out", str(out), "--no-plots",
         "--chunk-size", "50"], env, 1000, sig=signal.SIGTERM)  # chunks left to stop
    assert code == 143 and took <= 5.0, (code, took, text)
    assert "terminated (SIGTERM)" in text and "Traceback" not in text
    done = done_run_ids(out / "parts")
    assert counted <= len(done) < 1000
    entry = json.loads((out / "manifest.json").read_text())["history"][-1]
    assert entry["interrupted"] is True and entry["new_runs"] == len(done), entry


def test_sigterm_stays_ours_after_joining_a_cluster(tmp_path):
    """jax.distributed.initialize installs JAX's preemption notifier on SIGTERM; the sweep takes
    it back, so a time limit on a multi-host job stops it as Ctrl-C does (a cluster of one
    process on this host)."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    code = (
        "import argparse, os, signal, time\n"
        "from phasebo.cli.sweep import SigtermAsSigint, interrupted_code, start_jax\n"
        "signal.signal(signal.SIGTERM, SigtermAsSigint())\n"
        "start_jax(argparse.Namespace(cpu_devices=1, distributed=True, dry_run=False,\n"
        f"    coordinator='localhost:{port}', num_processes=1, process_id=0))\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped as by Ctrl-C', interrupted_code())\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120, cwd=tmp_path)
    assert p.returncode == 0 and "stopped as by Ctrl-C 143" in p.stdout, p.stderr[-2000:]
    assert "terminated (SIGTERM)" in p.stderr


def test_a_second_ctrl_c_gives_up_the_blocks_in_flight_at_once(tmp_path):
    """The first SIGINT while a chunk computes lets its blocks in flight finish (and says so);
    a second one stops at once (exit 130 within a second or two, not after the ~7 s blocks),
    saying the blocks in flight were given up; what was saved before stays, each run once."""
    f = tmp_path / "slow.toml"
    f.write_text('name = "slow"\nseeds = 256\n[settings]\nmodel = "prompt_attention"\n'
                 'engine = "reduced"\nsteps = 60000\nn_test = 100\nd = 2000\n')
    out = tmp_path / "out"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
    # blocks of 64 runs, ~7 s each, whatever the machine's L2 (a core with a large L2 would get
    # blocks of ~1 s, which a second Ctrl-C that waited for them could pass within 2 s)
    proc, err, reader = started([sys.executable, "-m", "phasebo", "sweep", str(f), "--out",
                                 str(out), "--no-plots", "--block-size", "64"], env)
    try:
        deadline = time.monotonic() + 240
        # a block done: the next computes
        wait_until(proc, err, lambda e: re.search(rb"\b[1-9]\d*/256 \[", e), deadline)
        time.sleep(1.0)  # past the chunk's writes (milliseconds): the next chunk computes
        proc.send_signal(signal.SIGINT)
        wait_until(proc, err, lambda e: b"again: at once" in e, deadline)
        time.sleep(0.1)  # a person's second Ctrl-C (one within ECHO_S is the first again)
        code, took = interrupt(proc)
    finally:
        reap(proc, reader)
    text = err.decode()
    assert code == 130 and took <= 2.0, (code, took, text)
    assert "Traceback" not in text and "blocks in flight were given up" in text, text
    done = done_run_ids(out / "parts")
    assert len(done) < 256 and len(np.unique(done)) == len(done)


def cold_sweep(tmp_path, text: str) -> tuple:
    """``(argv, env, out)`` of ``phasebo sweep`` on a file of ``text`` with an empty compilation
    cache of its own."""
    f = tmp_path / "sweep.toml"
    f.write_text(text)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(JAX_PLATFORMS="cpu", MPLBACKEND="Agg", PHASEBO_CACHE=str(tmp_path / "cache"))
    return [sys.executable, "-m", "phasebo", "sweep", str(f), "--out", str(out), "--no-plots"], \
        env, out


def test_ctrl_c_beside_the_next_programs_compile_exits_at_once(tmp_path):
    """SIGINT while the first group's runs compute and the second group's program compiles
    beside them (an empty compilation cache): the chunk is saved and the command exits 130
    within 5 s without waiting for that compile and without a crash."""
    argv, env, out = cold_sweep(tmp_path, 'name = "two"\nseeds = 150\n[settings]\nmodel = '
                                '"prompt_attention"\ntrain = ["p", "W"]\nsteps = 2000\nn_test = '
                                '100\n[axes]\nd = [100, 2600]\n')
    code, took, text, counted = sigint_when_counted(argv, env, 300)
    assert code == 130 and took <= 5.0, (code, took, text)
    assert "Traceback" not in text and "Fatal Python error" not in text, text
    assert "compiling group 2/2" not in text and "group 2/2" not in text, text  # still group 1
    done = done_run_ids(out / "parts")
    assert counted <= len(done) <= 150 and len(np.unique(done)) == len(done)
    entry = json.loads((out / "manifest.json").read_text())["history"][-1]
    assert entry["interrupted"] is True and entry["new_runs"] == len(done), entry


def test_ctrl_c_while_a_program_compiles_stops_when_it_is_ready(tmp_path):
    """SIGINT while the first program compiles (an empty compilation cache): the compile is not
    cut half way (that made the process crash at exit, code 139); the sweep says it stops once
    the program is ready, then exits 130 with nothing run."""
    argv, env, out = cold_sweep(tmp_path, 'name = "c"\nseeds = 4\n[settings]\nmodel = '
                                '"prompt_attention"\nsteps = 1234\nn_test = 100\n[axes]\n'
                                'd = [250, 4000]\n')
    proc, err, reader = started(argv, env)
    try:
        wait_until(proc, err, lambda e: b"compiling group 1/1" in e, time.monotonic() + 240,
                   poll=0.02)
        # it stops once the compile is done: seconds on a quiet machine, over 30 s on a loaded one
        code, took = interrupt(proc, timeout=120)
    finally:
        reap(proc, reader)
    text = err.decode()
    assert code == 130, (code, text)
    assert "stopping once the program being compiled is ready" in text, text
    assert "Traceback" not in text and "Fatal Python error" not in text, text
    assert len(done_run_ids(out / "parts")) == 0


def test_enable_compilation_cache_keeps_programs_under_phasebo_cache_unless_one_is_chosen(
        tmp_path, monkeypatch):
    """The command line's on-disk cache, for Python users too (pb.enable_compilation_cache); a
    cache the user chose (JAX's setting or its environment variable) is left alone."""
    import jax

    import phasebo as pb

    old = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    monkeypatch.setenv("PHASEBO_CACHE", str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        pb.enable_compilation_cache()
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax")
        assert (tmp_path / "jax").is_dir()
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
        pb.enable_compilation_cache()
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
    finally:
        jax.config.update("jax_compilation_cache_dir", old[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])


def test_the_stop_message_names_sigterm_only_where_the_command_line_stops_on_it(capsys):
    """The command line turns SIGTERM into the Ctrl-C stop (cli.sweep.SigtermAsSigint), and its
    message says a second one stops at once; from Python SIGTERM is not caught, and the message
    names Ctrl-C alone."""
    import signal

    from phasebo.cli.sweep import SigtermAsSigint
    from phasebo.interrupt import interruptible

    old = signal.getsignal(signal.SIGTERM)
    try:
        for term, words in ((signal.SIG_DFL, "(Ctrl-C again: at once;"),
                            (SigtermAsSigint(), "(Ctrl-C or SIGTERM again: at once;")):
            signal.signal(signal.SIGTERM, term)
            with interruptible() as state:
                state.computing = state.saving = True
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # the first Ctrl-C
            assert state.stop and words in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGTERM, old)
