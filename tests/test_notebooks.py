"""Every notebook executes at its small size, and is committed without outputs.

The notebooks run concurrently, each in its own process and kernel (nbclient), so that on a
2-core machine they finish in about the time of the two slowest (real_data, which pretrains a
ViT, with -m slow); each writes its sweeps under
a temporary ``PHASEBO_NOTEBOOK_OUT``.
"""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

RUNNER = r"""
import sys
from pathlib import Path
import nbformat
from nbclient import NotebookClient
src, dst = Path(sys.argv[1]), sys.argv[2]
nb = nbformat.read(src, as_version=4)
client = NotebookClient(nb, timeout=300, kernel_name="python3",
                        resources={"metadata": {"path": str(src.parent)}})
try:
    client.execute()
finally:
    nbformat.write(nb, dst)
"""


def test_every_notebook_exists_and_is_stripped():
    assert {p.stem for p in NOTEBOOKS} >= {"heatmaps", "dynamics", "token_selection", "real_data"}
    for p in NOTEBOOKS:
        nb = nbformat.read(p, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, p.name
        size = [c.source for c in nb.cells if c.cell_type == "code" and "SIZE =" in c.source]
        assert size and 'SIZE = "small"' in size[0], f"{p.name}: the size knob must be small"


# real_data.ipynb pretrains its ViT in the kernel (~3 min here with the others beside it): -m slow
SLOW = {"real_data"}


def _execute(paths, tmp_path_factory):
    procs = {}
    for p in paths:
        d = tmp_path_factory.mktemp(p.stem)
        env = dict(os.environ)
        env.update(PHASEBO_NOTEBOOK_OUT=str(d / "runs"), MPLBACKEND="Agg",
                   PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
        env.pop("XLA_FLAGS", None)  # one CPU device per kernel
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(p), str(d / "executed.ipynb")],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs[p.stem] = (proc, d)
    out = {}
    for name, (proc, d) in procs.items():
        try:
            _, err = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        out[name] = (proc.returncode, err, d)
    return out


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    return _execute([p for p in NOTEBOOKS if p.stem not in SLOW], tmp_path_factory)


@pytest.mark.parametrize("name", [p.stem if p.stem not in SLOW else
                                  pytest.param(p.stem, marks=pytest.mark.slow)
                                  for p in NOTEBOOKS])
def test_notebook_executes(request, tmp_path_factory, name):
    if name in SLOW:
        done = _execute([ROOT / "notebooks" / f"{name}.ipynb"], tmp_path_factory)
    else:
        done = request.getfixturevalue("executed")
    rc, err, d = done[name]
    assert rc == 0, f"{name}.ipynb failed:\n{err[-4000:]}"
    nb = nbformat.read(d / "executed.ipynb", as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.get("output_type") == "error"]
    assert not errors
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
    assert any((d / "runs").iterdir()), "the notebook wrote no sweep"
