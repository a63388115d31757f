"""The executor: one trace and one compile per program over many chunks, reused by the next
sweep, and chunking that does not change a row."""

import jax
from test_sweep import assert_same_tables, read, small_spec

from phasebo import grid as G
from phasebo.execute import Executor, count_compiles
from phasebo.sweep import run_sweep


def test_each_program_is_traced_once_over_many_chunks(tmp_path):
    jax.clear_caches()
    spec = small_spec(seeds=5)  # 10 runs per d group: chunks of 2 -> 5 chunks per group
    ex = Executor()
    run_sweep(spec, tmp_path / "o", chunk_size=2, block_size=1, quiet=True, plots=False,
              executor=ex)
    assert len(ex.traces) == 2  # d = 40 and d = 64: two programs on the direct engine
    assert set(ex.traces.values()) == {1} and set(ex.compiles.values()) == {1}
    # the same sweep again (a new directory, a new executor) reuses both programs: JAX traces
    # and compiles nothing at all
    again = Executor()
    with count_compiles() as seen:
        run_sweep(spec, tmp_path / "p", chunk_size=2, block_size=1, quiet=True, plots=False,
                  executor=again)
    assert sum(again.traces.values()) == 0 and sum(again.compiles.values()) == 0
    assert seen == {"compiles": 0}


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
