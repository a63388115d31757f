"""The optimiser settings (phasebo.rules): adam and adamw, clipping and a linear step-size decay
against a NumPy reference of the same updates, and refused where they cannot run."""

import jax
import numpy as np
import pytest

import phasebo
from phasebo.settings import ConfigError
from phasebo.sweep import run_one

KEY = jax.random.PRNGKey(3)
BASE = dict(d=60, n=8, T=4, n_test=50, signal_norm=6.0, dtype="float64", engine="direct", lr=0.05)


def test_adam_with_clipping_and_a_linear_decay_against_a_numpy_reference(x64):
    """Three steps of p (prompt attention, float64): the run's final p against the NumPy
    reference's clipped Adam updates with lr decaying linearly to 0 over the steps, applied to
    the gradients of the same loss (jax.grad of the model's own forward pass, the same data)."""
    from phasebo.sweep import prepare_one

    s = dict(BASE, steps=3, optimizer="adam", clip_norm=0.05, lr_schedule="linear")
    model, _, static, sw, key = prepare_one(s, key=KEY)
    k_data, _, k_init = model.keys(key)
    batch = model.sample(static, sw, k_data, test=False)
    params, fixed = model.init(static, sw, k_init, batch)
    import equinox as eqx

    aux = model.precompute(eqx.combine(params, fixed), batch, static)

    def loss(p):
        f, _, _ = model.forward(eqx.combine(eqx.tree_at(lambda m: m.p, params, p), fixed),
                                batch, aux)
        return model.margin_loss(f, batch.y)[1]

    p = np.asarray(params.p)
    m = v = np.zeros_like(p)
    for t in range(3):
        g = np.asarray(jax.grad(loss)(p))
        g = g * min(1.0, 0.05 / np.linalg.norm(g))
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        u = (m / (1 - 0.9 ** (t + 1))) / (np.sqrt(v / (1 - 0.999 ** (t + 1))) + 1e-8)
        p = p - 0.05 * (1 - t / 3) * u
    out = run_one(s, key=KEY)
    # 1e-7: optax forms its bias corrections 1 - b**t from the int32 step count
    assert float(out.final["p_norm"]) == pytest.approx(np.linalg.norm(p), rel=1e-7)
    assert float(out.final["p_align_e1"]) == pytest.approx(p[0] / np.linalg.norm(p), rel=1e-6)
    plain = run_one(dict(BASE, steps=3), key=KEY)
    assert not np.isclose(float(out.final["p_norm"]), float(plain.final["p_norm"]))


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_adaptive_optimizers_change_the_run_and_fit_faster(optimizer):
    s = dict(BASE, dtype="float32", steps=30, weight_decay=0.01)
    sgd = run_one(s, key=KEY)
    ada = run_one(dict(s, optimizer=optimizer), key=KEY)
    assert float(ada.final["train_loss"]) < float(sgd.final["train_loss"])


@pytest.mark.parametrize("settings, words", [
    (dict(optimizer="adam", engine="reduced"), "optimizer = \"adam\" is not a linear map"),
    (dict(clip_norm=1.0, engine="gram"), "gradient clipping and step-size schedules"),
    (dict(dynamics="flow", optimizer="adam"), "optimizer = 'adam' has no gradient flow"),
    (dict(dynamics="flow", lr_schedule="linear"), "lr_schedule = 'linear' has no gradient flow"),
    (dict(dynamics="limit", weight_decay=0.1, dtype="float64", optimizer="adam"),
     "optimizer = 'adam' has no converged limit.*leave optimizer at its default"),
])
def test_optimizer_settings_are_refused_where_they_cannot_run(settings, words):
    with pytest.raises(ConfigError, match=words):
        phasebo.spec_from_dict(settings)


def test_auto_runs_adam_on_the_direct_engine():
    assert run_one(dict(BASE, dtype="float32", engine="auto", steps=2,
                        optimizer="adam")).final["status"] == 0


def test_minibatch_steps_against_a_loop_over_the_batches(x64):
    """Two epochs of batches of 3 out of n = 8 (3, 3, 2 samples): the run's final p against
    plain GD on each batch's mean loss, in the epochs' orders, written as a Python loop."""
    import equinox as eqx
    import jax.random as jr

    from phasebo.sweep import prepare_one

    s = dict(BASE, batch_size=3, epochs=2)
    model, _, static, sw, key = prepare_one(s, key=KEY)
    assert static.steps == 6  # 2 epochs x ceil(8 / 3) batches
    k_data, _, k_init = model.keys(key)
    batch = model.sample(static, sw, k_data, test=False)
    params, fixed = model.init(static, sw, k_init, batch)
    aux = model.precompute(eqx.combine(params, fixed), batch, static)

    def loss(p, idx):
        sub = jax.tree.map(lambda x: x[idx], batch._replace(z=None))
        f, _, _ = model.forward(eqx.combine(eqx.tree_at(lambda m: m.p, params, p), fixed), sub,
                                None if aux is None else aux[idx])
        return model.margin_loss(f, sub.y)[1]

    def margins(p):  # the whole training set's
        f, _, _ = model.forward(eqx.combine(eqx.tree_at(lambda m: m.p, params, p), fixed), batch,
                                aux)
        return np.asarray(model.margin_loss(f, batch.y)[0])

    p, sizes, mid = np.asarray(params.p), [], None
    for epoch in range(2):
        order = np.asarray(jr.permutation(jr.fold_in(jr.fold_in(key, 3), epoch), 8))
        for b in range(3):
            if len(sizes) == 3:  # step 3 = steps // 2: the regime trend's earlier point
                mid = margins(p).min()
            idx = order[3 * b:3 * b + 3]
            sizes.append(len(idx))
            p = p - 0.05 * np.asarray(jax.grad(loss)(p, idx))
    assert sizes == [3, 3, 2, 3, 3, 2]
    out = run_one(s, key=KEY)
    assert float(out.final["p_norm"]) == pytest.approx(np.linalg.norm(p), rel=1e-12)
    # the middle step's smallest margin is a full pass, not the batches' last-seen margins
    assert float(out.final["margin_mid"]) == pytest.approx(mid, rel=1e-12)
    np.testing.assert_allclose(out.samples["final_margin"], margins(p), rtol=1e-12)
    # a batch as large as the training set is full-batch GD, step for step
    full = run_one(dict(BASE, steps=2), key=KEY)
    same = run_one(dict(BASE, batch_size=8, epochs=2), key=KEY)
    assert float(same.final["p_norm"]) == float(full.final["p_norm"])
    assert not np.isclose(float(out.final["p_norm"]), float(full.final["p_norm"]))
    # the attention sums need every sample at every step: not kept, so not a zero
    assert np.isnan(float(out.final["cumS_clean_pos"]))


def test_epochs_set_the_step_count_and_conflict_with_steps():
    base = {k: v for k, v in BASE.items() if k != "n"}
    spec = phasebo.spec_from_dict(dict(base, batch_size=16, epochs=5), {"n": [20, 40]})
    assert sorted(c.settings["steps"] for c in spec.cells()) == [10, 15]
    assert [c.settings["steps"] for c in phasebo.spec_from_dict(dict(BASE, epochs=7)).cells()] \
        == [7]
    with pytest.raises(ConfigError, match="steps and epochs = 5 both set"):
        phasebo.spec_from_dict(dict(BASE, steps=30, epochs=5))
    with pytest.raises(ConfigError, match="minibatch training runs on engine = \"direct\""):
        phasebo.spec_from_dict(dict(BASE, batch_size=4, engine="reduced"))
    with pytest.raises(ConfigError, match="batch_size = 4 has no effect unless dynamics = \"gd\""):
        phasebo.spec_from_dict(dict(BASE, batch_size=4, dynamics="flow"))
