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
