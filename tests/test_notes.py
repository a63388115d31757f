"""The sweep file's notes: what a sweep is told before it runs."""

import phasebo
from phasebo.notes import label_noise_notes, record_notes


def test_a_record_interval_longer_than_the_run_is_noted():
    spec = phasebo.spec_from_dict({"d": 100, "record_every": 50}, {"steps": [30, 100]})
    notes = record_notes(spec)
    assert len(notes) == 1 and "record_every = 50 is more than steps = 30" in notes[0]
    assert record_notes(phasebo.spec_from_dict({"d": 100, "steps": 30, "record_every": 30})) == []
    assert record_notes(phasebo.spec_from_dict({"d": 100, "steps": 30})) == []  # no records


def test_a_flip_count_that_changes_the_ratio_is_noted():
    (note,) = label_noise_notes(phasebo.spec_from_dict({"n": 20, "noise_ratio": 0.15}))
    assert "flips 2 labels" in note and "effective ratio of 0.1" in note
    assert label_noise_notes(phasebo.spec_from_dict({"n": 20, "noise_ratio": 0.2})) == []


def test_a_full_batch_minibatch_and_a_decay_free_adamw_are_noted(capsys, tmp_path):
    from phasebo.cli.sweep import main
    from phasebo.notes import rule_notes

    (note,) = rule_notes(phasebo.spec_from_dict({"d": 100, "n": 20, "batch_size": 50}))
    assert "batch_size = 50 is at least n = 20" in note and "full batch" in note
    assert rule_notes(phasebo.spec_from_dict({"d": 100, "n": 20, "batch_size": 5})) == []
    assert rule_notes(phasebo.spec_from_dict({"d": 100, "n": 20})) == []
    # the dry run prints the notes the run will print
    f = tmp_path / "s.toml"
    f.write_text('name = "s"\n[settings]\nd = 100\nn = 20\nnoise_ratio = 0.15\nsteps = 5\n')
    assert main([str(f), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    assert "note: noise_ratio = 0.15 at n = 20 flips 2 labels" in capsys.readouterr().out


def test_a_lower_matmul_precision_on_cpu_is_noted_as_changing_nothing():
    """On CPU the products are full precision whatever the setting: a sweep asking for
    tensorfloat32 there is told so instead of believing its numbers lower-precision."""
    import jax

    from phasebo.notes import precision_notes

    spec = phasebo.spec_from_dict({"d": 100, "matmul_precision": "tensorfloat32"})
    notes = precision_notes(spec)
    if jax.default_backend() == "cpu":
        assert any("tensorfloat32 changes nothing on CPU" in n for n in notes)
    assert precision_notes(phasebo.spec_from_dict({"d": 100})) == []
