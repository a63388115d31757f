"""The real-data model: scikit-learn digits, a cached pretrained ViT, phase 2 on query/key only.

Small sizes: a backbone of width 8 pretrained for 60 steps (its accuracy is not the point here;
``phasebo pretrain`` builds the real one)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import phasebo
from phasebo.models import vit_backbone as B
from phasebo.models import vit_digits as V
from phasebo.registry import get_model
from phasebo.settings import ConfigError
from phasebo.sweep import run_one

SMALL = {"model": "vit_digits", "vit_width": 8, "vit_heads": 2, "vit_depth": 2,
         "pretrain_steps": 60, "n": 20, "n_test": 100, "steps": 30, "lr": 0.5}


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    """This module's cache of pretrained backbones: a fresh directory, so the first load of a
    backbone in the module trains it."""
    return tmp_path_factory.mktemp("vit-cache")


@pytest.fixture(autouse=True)
def cache(cache_root, monkeypatch):
    monkeypatch.setenv("PHASEBO_CACHE", str(cache_root))
    yield cache_root


@pytest.fixture(scope="module")
def first_load(cache_root):
    """The first load of SMALL's backbone in this module, done here (the tests that use the
    backbone ask for this fixture) so that it trains and stores it whichever test runs first;
    ``trained``: the pretrainings it ran, ``existed``: whether the weights were on disk before."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PHASEBO_CACHE", str(cache_root))
        st = get_model("vit_digits").static_of(SMALL)
        path = B.backbone_path(B.backbone_settings(st))
        existed = path.with_suffix(".eqx").exists()
        calls = []
        mp.setattr(B, "pretrain", lambda *a, _f=B.pretrain, **k: calls.append(1) or _f(*a, **k))
        model = B.load_backbone(st, quiet=True)
        return {"model": model, "trained": len(calls), "existed": existed}


def test_digits_ship_with_scikit_learn_and_split_disjointly():
    data = B.digits()
    sizes = {k: len(v[1]) for k, v in data.items()}
    assert sizes == B.SPLITS and sum(sizes.values()) == 1797
    flat = {k: {x.tobytes() for x in v[0]} for k, v in data.items()}
    # disjoint by image (the digits have a few exact duplicate images; allow those)
    assert len(flat["pool"] & flat["test"]) <= 2 and len(flat["pretrain"] & flat["test"]) <= 4
    x, y = B.split("pool", (3, 8))
    assert set(np.unique(y)) == {0, 1} and x.shape[1:] == (16, 4)


def test_pretraining_is_deterministic_and_cached(first_load):
    model = get_model("vit_digits")
    st = model.static_of(SMALL)
    cfg = B.backbone_settings(st)
    # the module's first load trained once and stored the weights (it ran before any other
    # test could load the backbone: this test does not depend on which tests ran before it)
    assert not first_load["existed"] and first_load["trained"] == 1
    first = first_load["model"]
    assert B.backbone_path(cfg).with_suffix(".eqx").exists()
    def no_training(*a, **k):
        raise AssertionError("the stored backbone was trained again")

    with pytest.MonkeyPatch.context() as mp:  # read from disk, no training
        mp.setattr(B, "pretrain", no_training)
        again = B.load_backbone(st, quiet=True)
    fresh, rec = B.pretrain(cfg, quiet=True)  # deterministic: the same weights again
    for x, y, z in zip(jax.tree.leaves(first), jax.tree.leaves(again), jax.tree.leaves(fresh)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        np.testing.assert_array_equal(np.asarray(x), np.asarray(z))
    assert 0.0 <= B.backbone_record(st)["test_acc"] <= 1.0 and rec["steps"] == 60


def test_label_noise_exact_count_and_never_the_true_class():
    y = jnp.asarray(np.tile(np.arange(10), 20), jnp.int32)  # n = 200
    for r, k in ((0.2, 40), (0.05, 10), (0.0, 0)):
        sw = {"noise_ratio": jnp.float32(r), **{k_: jnp.asarray(v) for k_, v in
                                                 V.label_values(200, r).items()}}
        yn, flipped = V.noisy_labels(jr.PRNGKey(3), y, 10, "fixed_count", sw)
        assert int(flipped.sum()) == k
        assert bool(jnp.all((yn != y) == flipped))
    sw = {"noise_ratio": jnp.float32(0.3)}
    yn, flipped = V.noisy_labels(jr.PRNGKey(4), jnp.zeros(20000, jnp.int32), 10, "bernoulli", sw)
    assert abs(float(flipped.mean()) - 0.3) < 0.01 and bool(jnp.all(yn[flipped] != 0))
    # the replacement class is uniform over the other nine
    counts = np.bincount(np.asarray(yn[flipped]), minlength=10)[1:]
    assert counts.min() > 0.85 * counts.mean()


@pytest.mark.usefixtures("first_load")  # the backbone trained by the fixture, not here
def test_only_query_and_key_change_in_phase_two():
    model = get_model("vit_digits")
    settings = {**model_defaults(), **SMALL}
    st = model.static_of(settings)
    sw = {k: jnp.asarray(settings[k], jnp.float32) for k in ("lr", "noise_ratio")}
    sw.update({k: jnp.asarray(v) for k, v in V.label_values(st.n, 0.2).items()})
    batch = model.sample(st, sw, jr.PRNGKey(0), test=False)
    params, fixed = model.init(st, sw, jr.PRNGKey(1), batch)
    trained = [x for x in jax.tree.leaves(params)]
    assert len(trained) == 4  # Wq, bq, Wk, bk of the last block
    import equinox as eqx
    import optax

    m0 = eqx.combine(params, fixed)
    aux = model.precompute(m0, batch, st)
    opt = model.optimizer(st, sw)

    def loss(p):
        f, _, _ = model.forward(eqx.combine(p, fixed), batch, aux)
        return model.margin_loss(f, batch.y)[1]

    p, s = params, opt.init(params)
    for _ in range(5):
        u, s = opt.update(jax.grad(loss)(p), s, p)
        p = optax.apply_updates(p, u)
    m1 = eqx.combine(p, fixed)
    backbone = model._backbone(st)
    last0, last1 = V._qk(m0), V._qk(m1)
    # Wq, bq, Wk move; the key bias shifts every logit of a query row equally, so the softmax
    # ignores it and its gradient is exactly zero (it is trained, and stays at its init)
    assert all(not np.array_equal(a, b) for a, b in zip(last0[:3], last1[:3]))
    np.testing.assert_array_equal(last0[3], last1[3])
    # every other array is bitwise the pretrained backbone's
    spec = eqx.tree_at(V._qk, jax.tree.map(lambda _: True, m1), (False,) * 4)
    other1 = jax.tree.leaves(eqx.filter(m1, spec))
    other_pre = jax.tree.leaves(eqx.filter(eqx.tree_at(V._qk, backbone, V._qk(m1)), spec))
    assert len(other1) == len(other_pre) > 20
    for a, b in zip(other1, other_pre):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.usefixtures("first_load")
@pytest.mark.parametrize("mixing", ["all", "cls"])
def test_the_cls_row_forward_equals_the_full_vit(x64, mixing):
    """Phase 2's forward computes only the CLS token of the last block (what the head reads):
    its logits and CLS attention row equal the full ViT's (every token through every block)."""
    model = get_model("vit_digits")
    settings = {**model_defaults(), **SMALL, "dtype": "float64", "vit_mixing": mixing}
    st = model.static_of(settings)
    sw = {"noise_ratio": jnp.float64(0.2), **{k: jnp.asarray(v) for k, v in
                                                V.label_values(st.n, 0.2).items()}}
    batch = model.sample(st, sw, jr.PRNGKey(0), test=False)
    params, fixed = model.init(st, sw, jr.PRNGKey(1), batch)
    import equinox as eqx

    m = eqx.combine(params, fixed)
    # as trained and as read back from the cache: local blocks where the setting asks for them
    for vit in (m, B.load_backbone(st, quiet=True)):
        assert [b.local for b in vit.blocks] == [mixing == "cls", False]
    f, s, (a, smax) = model.forward(m, batch, model.precompute(m, batch, st))
    np.testing.assert_allclose(f, m(batch.X), rtol=1e-12, atol=1e-12)
    h = m.embed(batch.X)
    for b in m.blocks[:-1]:
        h = b(h)
    last = m.blocks[-1]
    full_s, full_a = last.attention(B.layer_norm(h, last.ln1_g, last.ln1_b))
    np.testing.assert_allclose(s, full_s[:, :, 0].mean(axis=1), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(a, full_a[:, :, 0].mean(axis=1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(smax, full_s[:, :, 0].max(axis=-1), rtol=1e-12)


def test_cls_mixing_keeps_patch_tokens_local_until_the_last_block():
    """vit_mixing = "cls": in every block but the last a patch token attends only to itself, so
    the last block's input at a patch depends on that patch alone, while the CLS input depends on
    the whole image; a standard ViT (the control) mixes every token."""
    x = jnp.asarray(B.digits()["pool"][0][:3])
    y = x.at[:, 5].add(0.5)  # one patch changed
    for mixing in ("all", "cls"):
        vit = B.init_vit(jr.PRNGKey(0), 8, 3, 2, mixing=mixing)
        assert [b.local for b in vit.blocks] == ([True, True, False] if mixing == "cls"
                                                 else [False] * 3)

        def hidden(z, vit=vit):
            h = vit.embed(z)
            for b in vit.blocks[:-1]:
                h = b(h)
            return h

        moved = np.abs(np.asarray(hidden(y) - hidden(x))).max(axis=(0, 2))  # per token
        assert moved[0] > 1e-4 and moved[6] > 1e-4  # the CLS token and the changed patch
        others = np.delete(moved, [0, 6])
        if mixing == "cls":
            assert others.max() == 0.0
        else:
            assert others.min() > 1e-6
    st = get_model("vit_digits").static_of({**model_defaults(), **SMALL})
    assert "mixing" not in B.backbone_settings(st)  # stored backbones keep their key
    st = get_model("vit_digits").static_of({**model_defaults(), **SMALL, "vit_mixing": "cls"})
    assert B.backbone_settings(st)["mixing"] == "cls"


def model_defaults():
    return {k: s.default for k, s in get_model("vit_digits").settings.items()}


@pytest.mark.usefixtures("first_load")
def test_vmapped_sweep_equals_runs_one_at_a_time(tmp_path):
    spec = phasebo.spec_from_dict({**SMALL, "record_every": 10}, {"noise_ratio": [0.0, 0.2]},
                                  seeds=2, name="vit_small")
    # chunks of 2: the noise-free runs and the noisy ones are written apart, and the regimes
    # are judged against the clean reference once the table is whole
    df = phasebo.run_sweep(spec, tmp_path / "v", quiet=True, plots=False, chunk_size=2)
    assert len(df) == 4 and (df["status"] == "ok").all()
    clean, noisy = df[df["noise_ratio"] == 0], df[df["noise_ratio"] > 0]
    assert (clean["regime"] == "no_noise").all()  # a clean run is never harmful
    assert (noisy["reference_runs"] == 2).all()
    np.testing.assert_allclose(noisy["reference_acc"], clean["test_acc"].mean())
    fits = noisy["train_acc"] == 1
    assert (noisy.loc[~fits, "regime"].astype(str).isin(["not_overfitting", "fitting"])).all()
    good = noisy["test_acc"] >= clean["test_acc"].mean() - noisy["test_eps"] - 1e-6
    assert (noisy.loc[fits, "regime"].astype(str) == np.where(good[fits], "benign",
                                                              "harmful")).all()
    # the parts read as an unfinished sweep's are judged against the whole table too
    parts = phasebo.load_results(tmp_path / "v", partial=True).set_index("run_id")
    assert (parts.loc[df["run_id"], "regime"].astype(str).to_numpy()
            == df["regime"].astype(str).to_numpy()).all()
    assert {"cls_max_attn", "train_acc_noisy", "test_acc", "train_loss"} <= set(df.columns)
    for _, row in df.iterrows():
        one = run_one({**SMALL, "record_every": 10, "noise_ratio": float(row["noise_ratio"])},
                      seed=int(row["seed"]))
        for k in ("train_loss", "test_acc", "train_acc", "cls_max_attn"):
            np.testing.assert_allclose(float(one.final[k]), row[k], rtol=2e-5, atol=1e-6)
    dyn = phasebo.load_dynamics(tmp_path / "v")
    assert set(dyn["step"]) == {0, 10, 20, 30} and "cls_max_attn" in dyn.columns
    # over time too: the horizon's record carries the horizon's regime, clean runs no_noise
    last = dyn[dyn["step"] == 30].set_index("run_id")["regime"].astype(str)
    assert (last.reindex(df["run_id"]).to_numpy() == df["regime"].astype(str).to_numpy()).all()


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="n = 600 is more than the 500"):
        phasebo.spec_from_dict({**SMALL, "n": 600})
    with pytest.raises(ConfigError, match="fraction"):
        phasebo.spec_from_dict({**SMALL, "label_noise": "fraction"})
    with pytest.raises(ConfigError, match="classes"):
        phasebo.spec_from_dict({**SMALL, "classes": [3]})
    with pytest.raises(ConfigError, match="vit_mixing = \"cls\" .* vit_depth = 1 has none"):
        phasebo.spec_from_dict({**SMALL, "vit_depth": 1, "vit_mixing": "cls"})
    with pytest.raises(ConfigError, match="d = 100 is not a setting of model 'vit_digits'"):
        phasebo.spec_from_dict({**SMALL, "d": 100})


@pytest.mark.usefixtures("first_load")
def test_linear_probe_replaces_only_the_head_of_the_cached_backbone():
    """phase1 = linear_probe: the jointly pretrained backbone (cached, not trained again) with a
    fresh head trained alone on its frozen features; its record says what it reached."""
    model = get_model("vit_digits")
    joint = model.static_of(SMALL)
    probe = model.static_of({**SMALL, "phase1": "linear_probe", "probe_steps": 40})
    assert B.backbone_path(B.backbone_settings(joint)) != B.backbone_path(B.backbone_settings(probe))
    a, b = B.load_backbone(joint, quiet=True), B.load_backbone(probe, quiet=True)
    head = lambda v: (v.W_head, v.b_head)  # noqa: E731
    assert not np.array_equal(a.W_head, b.W_head)
    import equinox as eqx

    for x, y in zip(jax.tree.leaves(eqx.tree_at(head, a, (0, 0))),
                    jax.tree.leaves(eqx.tree_at(head, b, (0, 0)))):
        np.testing.assert_array_equal(x, y)
    rec = B.backbone_record(probe)
    assert rec["probe_steps"] == 40 and rec["probe_seconds"] > 0
    assert rec["joint_test_acc"] == B.backbone_record(joint)["test_acc"]
    with pytest.raises(ConfigError, match="probe_steps = 40 has no effect unless phase1"):
        phasebo.spec_from_dict({**SMALL, "probe_steps": 40})


def test_a_sweep_without_noise_free_runs_is_told_its_runs_have_no_baseline():
    from phasebo.notes import baseline_notes

    assert "no_baseline" in baseline_notes(phasebo.spec_from_dict(SMALL))[0]
    assert baseline_notes(phasebo.spec_from_dict(SMALL, {"noise_ratio": [0.0, 0.2]})) == []
    assert baseline_notes(phasebo.spec_from_dict({**SMALL, "test_reference": "absolute"})) == []


def test_a_dry_run_pretrains_nothing_and_writes_no_cache(tmp_path, monkeypatch, capsys):
    """``--dry-run`` traces each program for its columns; a backbone not yet cached is stood in
    for by one of its shapes there, so the dry run neither pretrains (minutes) nor writes it."""
    from phasebo.cli.sweep import main

    monkeypatch.setenv("PHASEBO_CACHE", str(tmp_path / "cache"))
    called = []
    monkeypatch.setattr(B, "pretrain", lambda *a, **k: called.append(1))
    f = tmp_path / "vit.toml"
    f.write_text('[settings]\nmodel = "vit_digits"\nvit_width = 16\nvit_heads = 2\nn = 20\n'
                 'steps = 5\n[axes]\nnoise_ratio = [0.0, 0.2]\n'
                 '[plot]\nlines = [{ x = "noise_ratio", value = "backbone_test_acc" }]\n')
    assert main([str(f), "--dry-run", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "2 runs" in out
    assert not called and not list((tmp_path / "cache").rglob("*.eqx"))
    # the estimate leaves the pretraining out, and says so
    assert "backbone (500 pretraining steps, width 16, depth 2) is not cached yet" in out


def test_the_setup_note_goes_once_the_backbone_is_cached(first_load):
    model = get_model("vit_digits")
    assert model.setup_note(model.static_of(SMALL)) is None
    assert "not cached yet" in model.setup_note(model.static_of({**SMALL, "pretrain_seed": 7}))


def test_the_pretraining_a_sweep_does_first_is_timed_apart_from_its_compile(tmp_path):
    """A backbone not yet cached is pretrained before the program is traced (Model.setup): the
    manifest counts it as setup_s, not as compile time (which it used to hold: 75 s "compile" of
    which 53 s pretraining)."""
    import json

    from phasebo.sweep import run_sweep

    small = {**SMALL, "pretrain_seed": 5}
    spec = phasebo.spec_from_dict(small, {"noise_ratio": [0.0, 0.2]}, seeds=1, name="setup")
    run_sweep(spec, tmp_path / "s", quiet=True, plots=False)
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    st = get_model("vit_digits").static_of(small)
    took = json.loads(B.backbone_path(B.backbone_settings(st)).with_suffix(".json").read_text())
    assert man["setup_s"] >= took["seconds"] > 0
    assert man["compile_s"] + man["setup_s"] <= man["wall_s"]
    again = tmp_path / "again"  # cached now: read back in milliseconds
    run_sweep(spec, again, quiet=True, plots=False)
    assert json.loads((again / "manifest.json").read_text())["setup_s"] < 0.5
