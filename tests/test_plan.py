"""The plan: cells grouped by compiled program, and a planner that streams."""

import os
import subprocess
import sys

import jax
import numpy as np

from phasebo import plan as P
from phasebo.config import spec_from_dict
from phasebo.execute import Executor
from phasebo.sweep import run_sweep


def test_dry_run_of_ten_million_runs_streams_in_bounded_memory(tmp_path):
    """The planner never materialises the run list: a 10^7-run grid plans in well under 500 MB
    (measured: 277 MB peak, 4.8 s on 2 busy cores; the time is not asserted)."""
    f = tmp_path / "big.toml"
    f.write_text('name = "big"\nseeds = 100\n[settings]\nmodel = "prompt_attention"\n'
                 'train = ["p"]\n[axes]\nd = { start = 250, stop = 5000, num = 100 }\n'
                 'signal_norm = { start = 5, stop = 100, num = 1000 }\n')
    # a fresh parent whose only child is the dry run: its children's peak is the dry run's
    wrapper = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], "
               "capture_output=True, text=True); sys.stderr.write(p.stdout + p.stderr); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
               "sys.exit(p.returncode)")
    p = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "phasebo.sweep",
                        str(f), "--dry-run", "--out", str(tmp_path / "o")], capture_output=True,
                       text=True, env={**os.environ, "MPLBACKEND": "Agg"})
    assert p.returncode == 0, p.stderr
    assert "10000000 runs in 1 compiled group" in p.stderr
    assert not (tmp_path / "o").exists()  # a dry run writes nothing
    assert int(p.stdout.split()[-1]) < 500 * 1024  # KiB


def test_reduced_engine_traces_one_program_for_every_d_and_signal_norm(tmp_path):
    jax.clear_caches()
    ex = Executor()
    spec = spec_from_dict({"steps": 5, "n_test": 50},
                          {"d": [300, 1000, 5000], "signal_norm": [5.0, 20.0]}, seeds=2)
    pl = P.plan(spec)
    assert len(pl.groups) == 1 and pl.groups[0].engine.name == "reduced"
    assert len(pl.groups[0].cells) == 3
    df = run_sweep(spec, tmp_path / "o", chunk_size=4, quiet=True, plots=False, executor=ex)
    assert list(ex.traces.values()) == [1]
    assert sorted(df["d"].unique()) == [300, 1000, 5000] and (df["engine"] == "reduced").all()


def test_gram_engine_pads_nearby_d_into_one_program(tmp_path, x64):
    """Trained W and p on the gram engine: d 260 and 300 both run zero-padded to 320 in one
    program (d traced), and each run is the direct engine's run of its own d (float64)."""
    from phasebo.sweep import run_one

    jax.clear_caches()
    ex = Executor()
    fixed = {"train": ["p", "W"], "steps": 8, "n_test": 50, "dtype": "float64", "lr": 0.5}
    spec = spec_from_dict(fixed, {"d": [260, 300], "signal_norm": [8.0]}, seeds=2)
    pl = P.plan(spec)
    assert len(pl.groups) == 1 and pl.groups[0].engine.name == "gram"
    assert pl.groups[0].program.d == 320 and "d=260..300 padded to 320" in pl.groups[0].label
    df = run_sweep(spec, tmp_path / "o", quiet=True, plots=False, executor=ex)
    assert list(ex.traces.values()) == [1]
    for d in (260, 300):
        row = df[(df["d"] == d) & (df["seed"] == 1)].iloc[0]
        direct = run_one({**fixed, "d": d, "signal_norm": 8.0}, engine="direct", seed=1)
        for k in ("train_loss", "test_loss", "p_norm", "q_norm"):
            np.testing.assert_allclose(row[k], float(direct.final[k]), rtol=1e-9, err_msg=k)


def test_gram_engine_keeps_d_unpadded_where_padded_draws_would_differ():
    """A sampled test set of n_test x T x width >= 2^31 numbers would wrap padded_draw's int32
    index: that program keeps its own d; a projected test set draws no d-dimensional test noise.
    Nor does it pad where threefry is not partitionable."""
    fixed = {"train": ["p", "W"], "d": 3000, "signal_norm": 8.0, "n_test": 300_000}
    for mode, width in (("sampled", 3000), ("projected", 3072)):
        spec = spec_from_dict({**fixed, "test_mode": mode}, {}, seeds=1)
        g = P.plan(spec, memory_budget=2**40).groups[0]  # planned, never run
        assert g.engine.name == "gram" and g.program.d == width, mode
    # without partitionable threefry a wider draw is not the narrower one: no padding
    with jax.threefry_partitionable(False):
        g = P.plan(spec, memory_budget=2**40).groups[0]
    assert g.program.d == 3000


def test_cells_differing_only_outside_a_runs_identity_are_refused_before_anything_runs():
    import pytest

    from phasebo.settings import ConfigError

    # a regime threshold is swept inside a cell (no program of its own): the same check
    for axis, values in (("engine", ["direct", "reduced"]), ("record_every", [5, 10]),
                         ("test_eps", [0.05, 0.1]), ("train_acc_fit", [0.9, 1.0])):
        spec = spec_from_dict({"d": 40, "steps": 4}, {axis: values, "signal_norm": [1.0, 3.0]})
        with pytest.raises(ConfigError, match=f"(two cells differ only in {axis}|{axis} = .* as "
                                              "an axis changes no run).*own --out"):
            P.plan(spec, n_devices=1)
    P.plan(spec_from_dict({"d": 40, "steps": 4, "engine": "reduced"}, {"signal_norm": [1.0, 3.0]}),
           n_devices=1)  # one value of each: one run per id


def test_the_dry_run_says_a_flows_time_estimate_can_be_low_and_a_gd_sweeps_does_not(tmp_path):
    flow = spec_from_dict({"dynamics": "flow", "flow_time": 5.0, "d": 300}, seeds=2, name="f")
    gd = spec_from_dict({"d": 300}, seeds=2, name="g")
    assert "a flow's time is its solver's steps" in P.describe(P.plan(flow), tmp_path)
    assert "solver" not in P.describe(P.plan(gd), tmp_path)


def test_a_memory_refusal_suggests_the_projected_test_set_only_when_it_is_not_in_use():
    from phasebo.settings import ConfigError

    for mode, says in (("projected", False), ("sampled", True)):
        spec = spec_from_dict({"d": 20000, "n_test": 1000, "test_mode": mode, "engine": "direct"},
                              seeds=1, name="m")
        try:
            P.plan(spec, memory_budget=2**20)
        except ConfigError as e:
            assert ("test_mode = \"projected\"" in str(e)) is says, e
        else:
            raise AssertionError("a 1 MiB budget should refuse")


def test_an_lr_axis_of_a_flow_is_refused_before_anything_runs():
    """A flow does not depend on lr (only its GD-equivalent step labels do): an lr axis would
    draw maps of runs that differ by their labels and data alone."""
    import pytest

    from phasebo.settings import ConfigError

    flow = spec_from_dict({"dynamics": "flow", "flow_time": 5.0, "n": 8, "d": 40},
                          {"lr": [0.01, 0.02]})
    with pytest.raises(ConfigError, match=r"lr = \[0.01, 0.02\] as an axis of a gradient flow"):
        P.plan(flow)
    P.plan(spec_from_dict({"n": 8, "d": 40, "steps": 5}, {"lr": [0.01, 0.02]}))  # GD: an axis
    # GD against a flow over lr: the GD cells need the axis
    P.plan(spec_from_dict({"n": 8, "d": 40}, {"lr": [0.01, 0.02]}, cases=[
        {"dynamics": "gd", "steps": 5}, {"dynamics": "flow", "flow_time": 5.0}]))


def test_the_dry_run_gives_the_memory_budget_per_device_as_its_refusals_do(tmp_path):
    """A block too large for one device is refused against the budget per device; the dry run
    gives that figure beside the whole budget, so the two never seem to disagree."""
    pl = P.plan(spec_from_dict({"d": 300}, name="m"), n_devices=2, memory_budget=8 * 2**30)
    assert "memory budget 8.0 GiB (4 GiB per device)" in P.describe(pl, tmp_path)


def _cache_dir(root, entries, shared=None):
    for i, (level, kind, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
        if shared is not None:
            (d / "shared_cpu_list").write_text(f"{shared}\n")
    return str(root)


def test_a_cores_l2_is_read_from_sysfs_and_unknown_where_it_cannot_be(tmp_path):
    linux = [(1, "Data", "48K"), (1, "Instruction", "64K"), (2, "Unified", "2048K"),
             (3, "Unified", "491520K")]
    assert P.core_cache_bytes(_cache_dir(tmp_path / "a", linux)) == 2 << 20
    assert P.core_cache_bytes(_cache_dir(tmp_path / "b", [(2, "Unified", "1M")])) == 1 << 20
    assert P.core_cache_bytes(_cache_dir(tmp_path / "c", linux[:2])) is None  # no L2 listed
    assert P.core_cache_bytes(_cache_dir(tmp_path / "d", [(2, "Unified", "big")])) is None
    assert P.core_cache_bytes(str(tmp_path / "none")) is None
    # an L2 shared by two hyperthreads (each a JAX CPU device) or a cluster of four cores
    assert P.core_cache_bytes(_cache_dir(tmp_path / "e", linux, "0-1")) == 1 << 20
    assert P.core_cache_bytes(_cache_dir(tmp_path / "f", linux, "0,2-4")) == 512 << 10
    assert P.core_cache_bytes(_cache_dir(tmp_path / "g", linux, "0")) == 2 << 20
    assert P.core_cache_bytes(_cache_dir(tmp_path / "h", linux, "?")) == 2 << 20


def test_the_plan_sizes_reduced_blocks_by_the_l2_it_reads(monkeypatch):
    """The plan passes the core's L2 to the engine: 10 runs a block with a 2 MiB L2, the L3-sized
    64 where the L2 is unknown (the reading stands in for the machine's own)."""
    spec = spec_from_dict({"steps": 5, "n_test": 50}, {"d": [1000, 2000]}, seeds=200)
    for l2, block in ((2 << 20, 10), (None, 64), (256 << 10, 64)):
        monkeypatch.setattr(P, "core_cache_bytes", lambda l2=l2: l2)
        assert P.plan(spec).groups[0].block == block


def test_reduced_cpu_blocks_hold_the_grams_an_l2_keeps_and_else_the_l3_sized_block():
    """Half of a 2 MiB L2 holds 10 float32 Grams of N = 160 (the block measured fastest on such
    a core); where it holds fewer than 8 (a 512 KiB L2, or float64 Grams) or the L2 is unknown,
    the block is the one measured on an L3-bound core: 64, or 32 with records."""
    from phasebo.registry import ENGINES, get_model

    model, eng = get_model("prompt_attention"), ENGINES["reduced"]

    def static(**kw):
        return model.static_of({"train": ("p",), **kw})

    plain, recorded = static(), static(record_every=10)
    assert eng.block_size(model, plain, "cpu", 2 << 20) == 10
    assert eng.block_size(model, recorded, "cpu", 2 << 20) == 10
    for l2 in (None, 512 << 10):
        assert eng.block_size(model, plain, "cpu", l2) == 64
        assert eng.block_size(model, recorded, "cpu", l2) == 32
    assert eng.block_size(model, plain, "cpu", 64 << 20) == 64  # capped
    assert eng.block_size(model, static(dtype="float64"), "cpu", 2 << 20) == 40
    assert eng.block_size(model, plain, "gpu", 2 << 20) == 8192
    assert eng.block_size(model, static(dynamics="flow"), "cpu", 2 << 20) == 16


def test_a_direct_run_over_two_mib_goes_alone_and_smaller_runs_share_a_block():
    from phasebo.registry import ENGINES, get_model

    model, eng = get_model("prompt_attention"), ENGINES["direct"]
    block = {d: eng.block_size(model, model.static_of({"train": ("p",), "d": d}), "cpu")
             for d in (250, 1000, 2000, 5000)}
    assert block == {250: 6, 1000: 2, 2000: 1, 5000: 1}  # 4 MiB a block at most
