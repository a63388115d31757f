"""The [plot] table checked before anything runs (phasebo.plot_spec): what a line plot would pool,
checked on the sweep's own cells, and what it would not."""

import pytest

import phasebo as pb
from phasebo.config import build_spec
from phasebo.plot_spec import check_plot_spec
from phasebo.settings import ConfigError

AXES = {"d": [40, 80], "signal_norm": [3.0, 30.0], "noise_ratio": [0.1, 0.2]}


def spec(lines=(), heatmaps=()):
    return pb.spec_from_dict({"steps": 4}, AXES, seeds=2, name="p",
                             plot={"lines": list(lines), "heatmaps": list(heatmaps)})


@pytest.mark.parametrize("line", [
    {"x": "signal_norm"},  # one line per cell of the other axes
    {"x": "signal_norm", "hue": ["d", "noise_ratio"]},
    {"x": "signal_norm", "hue": "noise_ratio", "where": {"d": 40}},  # one column as a string
    {"x": "signal_norm", "value": "regime", "where": {"d": 80, "noise_ratio": 0.2}},
    {"x": "snr", "hue": ["noise_ratio"]},  # each snr is one (d, signal_norm): nothing pooled
    {"x": "signal_norm", "hue": ["d", "noise_ratio"], "where": {"seed": 0}},
])
def test_lines_that_pool_nothing_pass(line):
    check_plot_spec(spec([line]))


@pytest.mark.parametrize("line, message", [
    ({"x": "signal_norm", "value": "regime"}, "d (40, 80) and noise_ratio (0.1, 0.2) also vary"),
    ({"x": "signal_norm", "hue": ["d"]}, "noise_ratio (0.1, 0.2) also varies"),
    ({"x": "signal_norm", "value": "regime", "hue": ["d"]}, "takes no hue"),
    ({"x": "signal_norm", "where": {"snr": 0.5}}, "where snr = 0.5 is in no row"),
    ({"x": "signal_norm", "hue": 5}, "hue = 5 must be a list of settings"),
    ({"x": "signal_norm", "hue": [["d"]]}, "must be a list of settings"),
])
def test_lines_that_would_pool_are_refused(line, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_plot_spec(spec([line]))


def test_a_slice_that_set_left_out_stays_a_drawing_time_skip():
    """--set noise_ratio=0.2 on a file whose line fixes noise_ratio = 0.1: the file is valid; its
    figure is skipped, and said, when drawn (a map of the rest still runs)."""
    raw = {"settings": {"steps": 4}, "axes": AXES,
           "plot": {"lines": [{"x": "signal_norm", "hue": ["d"], "where": {"noise_ratio": 0.1}}]}}
    check_plot_spec(build_spec(raw, "p", overrides={"noise_ratio": 0.2}))


def test_a_where_key_no_column_has_is_refused_once_the_columns_are_known():
    s = spec(heatmaps=[{"x": "signal_norm", "y": "d", "where": {"dd": 1}}])
    check_plot_spec(s)  # before tracing: it could be a recorded column
    with pytest.raises(ConfigError, match="where dd is not a setting or column"):
        check_plot_spec(s, columns={"test_acc", "train_acc"})
    check_plot_spec(spec(heatmaps=[{"x": "signal_norm", "y": "d", "where": {"status": "ok"}}]),
                    columns={"test_acc"})  # a label column is the tables' own


def test_formats_as_a_list_or_a_string():
    from phasebo.plot_spec import plot_formats

    assert plot_formats({"formats": "pdf"}) == ("pdf",)  # not ("p", "d", "f")
    assert plot_formats({"formats": "png, PDF"}) == ("png", "pdf")
    assert plot_formats({"formats": ["svg"]}) == ("svg",) and plot_formats({}) == ("png",)
    s = pb.spec_from_dict({"steps": 4}, AXES, seeds=1, name="p", plot={"formats": "pdf",
                                                                        "dpi": 300})
    check_plot_spec(s)


def test_an_axis_added_by_set_is_not_refused():
    """The file's lines are checked as the file has them: --set turning a setting into an axis
    (which the line's hue leaves out) draws it as lines or files of its own, not a refusal."""
    raw = {"settings": {"steps": 4}, "axes": {"signal_norm": [3.0, 30.0], "d": [40, 80]},
           "plot": {"lines": [{"x": "signal_norm", "hue": ["d"]},
                              {"x": "signal_norm", "value": "regime", "where": {"d": 40}}]}}
    check_plot_spec(build_spec(raw, "p", overrides={"noise_ratio": [0.1, 0.2]}))
    with pytest.raises(ConfigError, match="noise_ratio"):  # in the file itself: refused
        check_plot_spec(build_spec({**raw, "axes": {**raw["axes"], "noise_ratio": [0.1, 0.2]}},
                                   "p"))


def test_equal_values_of_a_derived_x_are_refused_with_a_fix_that_works():
    """snr = signal_norm / sqrt(d) repeats across (d, signal_norm) cells: fixing d and
    signal_norm would fix snr itself, so the fix names one of them as x."""
    s = pb.spec_from_dict({"steps": 4}, {"d": [100, 400], "signal_norm": [1.0, 2.0, 4.0]},
                          name="p", plot={"lines": [{"x": "snr", "hue": ["n"]}]})
    with pytest.raises(ConfigError, match="snr takes the same value at several cells of d"):
        check_plot_spec(s)


@pytest.mark.parametrize("key, value", [("cmap", "viridis"), ("stat", "max"), ("vmin", 0.9)])
def test_colour_settings_on_a_regime_map_are_refused(key, value):
    """A regime map's colours are the regimes' and its cells the seeds' majority: a colour
    scale or seed statistic given to it would be silently ignored, so it is refused."""
    with pytest.raises(ConfigError, match=f"{key} = {value!r} has no effect on a regime map"):
        check_plot_spec(spec(heatmaps=[{"x": "signal_norm", "y": "d", "value": "regime",
                                        key: value}]))
    check_plot_spec(spec(heatmaps=[{"x": "signal_norm", "y": "d", "value": "test_acc",
                                    key: value}]))
    # a heatmap's value is the regime unless given
    with pytest.raises(ConfigError, match=f"{key} = {value!r} has no effect on a regime map"):
        check_plot_spec(spec(heatmaps=[{"x": "signal_norm", "y": "d", key: value}]))

