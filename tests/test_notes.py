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


def test_many_rounded_flip_counts_at_one_n_share_one_note():
    """A fine noise_ratio axis (0.01 apart at n = 20) would print a note per value; more than
    three at one n share one line that says which values draw the same runs."""
    spec = phasebo.spec_from_dict({"n": 20, "label_noise": "fixed_count"},
                                  {"noise_ratio": [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]})
    (note,) = label_noise_notes(spec)
    assert note == ("note: 5 noise_ratio values at n = 20 flip a rounded number of labels "
                    "(fixed_count: ceil(n r)), so their effective ratio is that number / 20 "
                    "(e.g. 0.01 flips 1); values that round to the same number draw runs of the "
                    "same distribution (0.01 to 0.05 all flip 1)")
    few = phasebo.spec_from_dict({"n": 20, "label_noise": "fixed_count"},
                                 {"noise_ratio": [0.01, 0.06, 0.2]})
    assert len(label_noise_notes(few)) == 2  # one by one: 0.01 and 0.06 (0.2 flips 4 exactly)


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


def test_a_plot_where_value_that_set_leaves_out_is_noted_before_the_runs(tmp_path, capsys):
    """The file's own values are checked when it is read; a value ``--set`` then leaves out of
    the sweep is not refused (the override is meant), but the figure it selects will be
    skipped: the dry run and the run say so before anything runs."""
    from phasebo.cli.args import parse_set
    from phasebo.cli.sweep import main
    from phasebo.config import load_sweep
    from phasebo.notes import plot_where_notes

    f = tmp_path / "p.toml"
    f.write_text('name = "p"\n[settings]\nsteps = 5\n[axes]\nd = [250, 1000]\nn = [20, 40]\n'
                 '[plot]\nheatmaps = [{ x = "n", y = "d", value = "regime", where = { n = 20 } }]\n'
                 'lines = [{ x = "d", value = "test_acc", where = { n = 40 } }]\n')
    assert plot_where_notes(load_sweep(f)) == []
    assert plot_where_notes(load_sweep(f, parse_set(["n=[20, 30]"]))) == [
        "note: [plot] lines #1: where n = 40 selects no run now that the overrides (--set, "
        "--unset) leave n = 20, 30: that figure will be skipped (fix: override n to include it, or draw "
        "no figures)"]
    assert main([str(f), "--set", "n=30", "--dry-run", "--out", str(tmp_path / "o")]) == 0
    said = capsys.readouterr().out
    assert "[plot] heatmaps #1: where n = 20 selects no run" in said
    assert "[plot] lines #1: where n = 40 selects no run" in said
    # --unset drops the axis: its default applies, and the figures at other values are noted
    default = phasebo.spec_from_dict({}).cells().__next__().settings["n"]
    assert main([str(f), "--unset", "n", "--dry-run", "--out", str(tmp_path / "u")]) == 0
    said = capsys.readouterr().out
    for i, n in (("heatmaps", 20), ("lines", 40)):
        assert (f"[plot] {i} #1: where n = {n} selects no run" in said) == (n != default)


def test_common_noise_along_a_setting_with_one_value_is_a_note_and_swept_it_is_none():
    from phasebo.notes import common_noise_notes

    base = {"model": "prompt_attention", "train": ["p"], "common_noise": "signal_norm",
            "steps": 10}
    spec_from_dict = phasebo.spec_from_dict
    one = spec_from_dict({**base, "signal_norm": 30.0}, {"d": [300, 600]}, seeds=2)
    (line,) = common_noise_notes(one)
    assert "shares nothing here: signal_norm takes one value" in line and "fix:" in line
    assert len(common_noise_notes(spec_from_dict(base, {"d": [300]}, seeds=2))) == 1  # default
    swept = spec_from_dict(base, {"d": [300], "signal_norm": [5.0, 10.0]}, seeds=2)
    assert common_noise_notes(swept) == []
    assert common_noise_notes(spec_from_dict({**base, "common_noise": "none"}, {}, seeds=2)) == []


def test_a_limit_without_a_warm_up_is_noted_and_one_with_it_is_not():
    from phasebo.notes import rule_notes

    base = {"model": "single_head", "d": 900, "n": 25, "weight_decay": 0.01, "dynamics": "limit",
            "dtype": "float64"}
    (note,) = rule_notes(phasebo.spec_from_dict(base))
    assert "without a warm-up" in note and "fix: limit_warmup = 400 with lr = 0.025" in note
    assert rule_notes(phasebo.spec_from_dict({**base, "limit_warmup": 400, "lr": 0.025})) == []
    # measured on single_head; on prompt_attention the warm-up is no better (it can end worse)
    other = {**base, "model": "prompt_attention", "train": ["p"], "d": 1000}
    assert rule_notes(phasebo.spec_from_dict(other)) == []
