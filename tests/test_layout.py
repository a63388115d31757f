"""The package's layout: one module per job, imports one way, no module-level mutable state."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "phasebo"
MODULES = sorted(PKG.rglob("*.py"))
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update",
            "setdefault", "add", "discard", "__setitem__", "__delitem__"}
CONTAINER_CALLS = {"dict", "list", "set", "defaultdict", "Counter", "OrderedDict", "deque"}


def _module_containers(tree) -> set[str]:
    """Names a module binds at its top level to a mutable container."""
    out = set()
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                                     ast.SetComp)) or (
            isinstance(value, ast.Call) and getattr(value.func, "id", getattr(
                value.func, "attr", None)) in CONTAINER_CALLS)
        if mutable:
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def _mutations(tree, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [f"global {n}" for n in node.names]
        target = None
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for t in getattr(node, "targets", None) or [node.target]:
                if isinstance(t, ast.Subscript):
                    target = t.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in MUTATORS:
            target = node.func.value
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
        if name in names:
            found.append(f"{name} (line {node.lineno})")
    return found


def test_no_module_level_mutable_state():
    """No module keeps state between calls: a container bound at a module's top level is never
    mutated anywhere in the package (caches live in the objects that own them, or in JAX's own
    caches), and no function rebinds a module global."""
    trees = {p: ast.parse(p.read_text()) for p in MODULES}
    containers = set().union(*(_module_containers(t) for t in trees.values()))
    bad = {str(p.relative_to(ROOT)): m for p, t in trees.items() if (m := _mutations(t, containers))}
    assert not bad, bad


def test_the_checker_finds_a_module_level_cache():
    src = "CACHE = {}\n\ndef f(k):\n    CACHE[k] = 1\n\nSEEN = []\n\ndef g():\n    SEEN.append(1)\n"
    tree = ast.parse(src)
    assert _module_containers(tree) == {"CACHE", "SEEN"}
    assert len(_mutations(tree, {"CACHE", "SEEN"})) == 2


NO_PLOTTING = ("phasebo.sweep", "phasebo.plan", "phasebo.execute", "phasebo.refine",
               "phasebo.grid", "phasebo.store", "phasebo.report", "phasebo.plot_spec")


def test_the_pipeline_imports_no_plotting():
    """Planning, running and refining a sweep (and checking its [plot] table) load neither
    matplotlib nor phasebo.plot: the figures are drawn only when a sweep draws them."""
    code = ("import sys\n" + "".join(f"import {m}\n" for m in NO_PLOTTING) +
            "print(sorted(m for m in sys.modules if m.startswith('matplotlib') or "
            "m == 'phasebo.plot'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_command_line_has_one_home():
    """argparse is imported only under phasebo/cli: every command's flags live there."""
    outside = []
    for path in MODULES:
        if path.parent.name == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            if "argparse" in names:
                outside.append(str(path.relative_to(ROOT)))
    assert not outside, outside


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_is_over_600_lines(path):
    limit = 250 if path.name == "sweep.py" and path.parent == PKG else 600
    n = len(path.read_text().splitlines())
    assert n <= limit, f"{path.relative_to(ROOT)}: {n} lines (at most {limit})"


def test_one_version():
    import importlib.metadata

    import phasebo

    assert importlib.metadata.version("phasebo") == phasebo.__version__
