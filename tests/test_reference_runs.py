"""The refactored models and engines reproduce the numbers stored before the refactor.

``tests/data/reference_runs.npz`` holds the final metrics, per-sample arrays and dynamics of small
runs of every model x every engine that ran it, 3 keys, float32 and float64, made by the code as it
was before the model protocol (``tests/data/make_reference_runs.py``). Each is rerun here with the
same key: float64 must agree to 1e-12 (relative, 1e-13 absolute), float32 to 1e-5 relative or
5e-6 absolute. float32 results move by a few 1e-6 with the order XLA's fusions round in
(measured, the suite's unoptimised compiles against the stored optimised ones: a W norm 5e-6
relative, a cumulative attention 1.1e-6 relative, an attention mass of 0.0375 1.4e-6 absolute);
float64 is the strict check.

One deliberate change: a run with no flipped label has nothing to overfit, so its
``noisy_fit_step`` is -1 (no step), where the old code said 0.
"""

import json
from pathlib import Path

import jax.random as jr
import numpy as np
import pytest

from phasebo.sweep import run_one

DATA = Path(__file__).parent / "data"
META = json.loads((DATA / "reference_runs.json").read_text())
# Settings that no longer exist because they had a single possible value for the model
# (models whose test set is always sampled), and metrics that were renamed.
DROPPED = {"multi_layer": {"test_mode"}, "encoder": {"test_mode"},
           "constructed_query": {"test_mode"}}
RENAMED = {"noisy_fit_step_mean": "mean_noisy_fit_step"}
TOL = {"float32": (1e-5, 5e-6), "float64": (1e-12, 1e-13)}


@pytest.fixture(scope="module")
def stored():
    return dict(np.load(DATA / "reference_runs.npz"))


@pytest.fixture(autouse=True, scope="module")
def _x64(x64_module):  # every run here is float64
    yield


# By default, with the first key (one compile each): in float64 (the strictest check) a case per
# model and per engine, and in float32 a case per engine; the other keys and cases with -m slow.
DEFAULT = {
    "float64": {"pa_gram", "pa_reduced", "pa_W_direct", "sh_direct", "sh_wd_reduced", "sa_direct",
                "ml_direct", "enc_direct", "cq_direct"},  # every model, every engine
    "float32": {"pa_W_direct", "pa_gram", "pa_reduced"},  # direct, gram, reduced
}
CASES = [pytest.param(c, dt, seeds, marks=() if seeds == "first" and c in DEFAULT[dt] else
                      pytest.mark.slow, id=f"{c}-{dt}-{seeds}")
         for c in META["cases"] for dt in META["dtypes"] for seeds in ("first", "rest")]


def test_the_default_cases_cover_every_model_and_engine():
    """The default set keeps a float64 case of every model and of every engine, and a float32
    case of every engine, as the stored cases grow."""
    models = {dt: {META["cases"][c]["model"] for c in cs} for dt, cs in DEFAULT.items()}
    engines = {dt: {META["cases"][c]["engine"] for c in cs} for dt, cs in DEFAULT.items()}
    assert models["float64"] == {v["model"] for v in META["cases"].values()}
    assert engines["float64"] == engines["float32"] == {v["engine"] for v in META["cases"].values()}


@pytest.mark.parametrize("case,dtype,seeds", CASES)
def test_refactored_code_reproduces_the_stored_numbers(stored, case, dtype, seeds):
    settings = dict(META["cases"][case], dtype=dtype)
    for k in DROPPED.get(settings["model"], ()):
        settings.pop(k, None)
    rtol, atol = TOL[dtype]
    n_checked = 0
    keys = META["seeds"][:1] if seeds == "first" else META["seeds"][1:]
    for i in keys:
        out = run_one(settings, key=jr.fold_in(jr.PRNGKey(0), i))
        prefix = f"{case}/{dtype}/{i}/"
        for name, want in stored.items():
            if not name.startswith(prefix):
                continue
            part, metric = name[len(prefix):].split("/", 1)
            got = getattr(out, part)[RENAMED.get(metric, metric)]
            if metric == "noisy_fit_step" and stored[f"{prefix}final/n_noisy"] == 0:
                want = np.asarray(-1)  # nothing to overfit: no step (module docstring)
            np.testing.assert_allclose(np.asarray(got, np.float64), want.astype(np.float64),
                                       rtol=rtol, atol=atol, err_msg=name)
            n_checked += 1
    assert n_checked > len(keys) * 40  # every stored array was looked up
