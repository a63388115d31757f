"""report.html: its data against the tables (no browser), and the page itself in a real headless
Chromium (Debian's package, driven by playwright): it loads from file:// without a console error,
has one map cell per grid cell, shows a cell's numbers on hover, moves with the step slider and
draws a clicked cell's dynamics."""

import os
import shutil
import warnings

import numpy as np
import pytest

import phasebo as pb
from phasebo import analysis as A
from phasebo.cli import main as cli
from phasebo.report_html import CATS, report_data
from phasebo.sweep import run_sweep

BASE = {"n": 12, "n_test": 64, "T": 6, "d": 48, "steps": 40, "lr": 0.05, "record_log": 8}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "grid"
    spec = pb.spec_from_dict(BASE, {"signal_norm": [1.0, 3.0, 9.0, 27.0],
                                    "noise_ratio": [0.1, 0.25, 0.4]}, seeds=3, name="grid")
    run_sweep(spec, out, quiet=True)
    return out


def test_the_sweep_writes_a_self_contained_report(grid):
    page = (grid / "report.html").read_text()
    assert page.count('<script type="application/json" id="data">') == 1
    assert page.index("Plotly") < page.index('id="data"')  # plotly inlined, before the data


def test_report_data_are_the_tables_numbers(grid):
    D = report_data(grid)
    assert (D["mode"], D["x"], D["y"]) == ("map", "signal_norm", "noise_ratio")
    dyn = pb.load(grid, "dynamics")
    assert [f["step"] for f in D["frames"]] == sorted(dyn["step"].unique().tolist())
    last = D["frames"][-1]
    cells = A.aggregate(pb.load(grid), by=["signal_norm", "noise_ratio"])
    for j, c in enumerate(D["coords"]):
        row = A.select(cells, c).iloc[0]
        assert CATS[last["code"][j]] == str(row["regime"])
        assert np.isclose(last["test_acc_mean"][j], row["test_acc_mean"], rtol=1e-3)
        assert last["n_seeds"][j] == 3
    # every slice with both regimes is in the table or in the line on the slices not placed
    runs = pb.load(grid)
    for a, b in (("benign", "harmful"), ("benign", "not_overfitting")):
        if not {a, b} <= set(runs["regime"].astype(str)):
            continue
        t = pb.boundaries(runs, "signal_norm", "noise_ratio", (a, b))
        st = t["status"].astype(str)
        placed = sum(x["between"] == f"{a} / {b}" for x in D["boundaries"])
        assert placed == (st.isin(("ok", "unresolved", "separated"))
                          & np.isfinite(t["boundary"])).sum()
        both = (t["n_a"] > 0) & (t["n_b"] > 0)
        for status, k in st[both & st.isin(("unbounded", "outside_range", "too_few"))
                            ].value_counts().items():
            head = f"{a} / {b.replace('_', ' ')}: "
            assert any(line.startswith(head) and f"{k} slice" in line and status in line
                       for line in D["boundaries_left"])
    assert len(D["dynamics"]) == len(D["coords"])  # every cell can be clicked
    one = D["dynamics"]["0"]
    assert one["n_runs"] == 3 and len(one["runs"]) == 3 and set(one["mass"]) == {
        f"{g}_{r}" for g in ("clean", "noisy") for r in ("rel", "weak", "weak_opp", "irr")}


def test_report_command(grid, tmp_path, capsys):
    assert cli(["report", str(grid), "--out", str(tmp_path / "r.html")]) == 0
    assert "MiB, written in" in capsys.readouterr().out and (tmp_path / "r.html").exists()
    assert cli(["report", str(tmp_path / "nothing")]) == 2
    assert "holds no results.parquet" in capsys.readouterr().err


def _browser():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("PHASEBO_REQUIRE_BROWSER"):
            pytest.fail("no chromium on PATH but PHASEBO_REQUIRE_BROWSER is set (.ci/run "
                        "installs Debian's chromium)")
        pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run installs it)")
    return exe


@pytest.fixture(scope="module")
def page_of():
    exe = _browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])

        def open_page(path):
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.errors, page.requests = [], []
            page.on("request", lambda r: page.requests.append(r.url))
            page.on("console", lambda m: page.errors.append(m.text) if m.type == "error"
                    else None)
            page.on("pageerror", lambda e: page.errors.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_function("window.phasebo !== undefined", timeout=30000)
            return page

        yield open_page
        browser.close()


def _cell_xy(page, ix, iy):
    return page.evaluate(f"""(() => {{ const gd = window.phasebo.state.panels[0];
        const L = gd._fullLayout, r = gd.getBoundingClientRect();
        return [r.left + L._size.l + L.xaxis.l2p({ix}), r.top + L._size.t + L.yaxis.l2p({iy})];
        }})()""")


def test_the_report_in_a_real_browser(grid, page_of):
    page = page_of(grid / "report.html")
    assert page.errors == []
    assert all(u.startswith(("file:", "data:", "blob:")) for u in page.requests)  # offline
    cells = A.aggregate(pb.load(grid), by=["signal_norm", "noise_ratio"])
    z = page.evaluate("window.phasebo.state.panels[0].data[0].z")
    assert np.array(z, dtype=float).shape == (3, 4)
    assert sum(v is not None for row in z for v in row) == len(cells)  # one per grid cell
    # hover: the cell's numbers
    page.mouse.move(*_cell_xy(page, 2, 1))
    page.wait_for_selector(".hovertext", timeout=5000)
    text = page.evaluate("document.querySelector('.hovertext').textContent")
    row = A.select(cells, {"signal_norm": 9.0, "noise_ratio": 0.25}).iloc[0]
    assert "‖μ‖ (signal norm) = 9" in text and "noise ratio = 0.25" in text
    assert f"{str(row['regime']).replace('_', ' ')} — 3 seeds" in text
    assert f"test accuracy: {float(f'{row.test_acc_mean:.4g}'):g}" in text
    # the slider: the map at the first recorded step
    before = page.evaluate("window.phasebo.state.panels[0].data[0].z")
    page.locator("#step").fill("0")
    assert page.inner_text("#steplabel") == "step 0"
    at0 = page.evaluate("window.phasebo.state.panels[0].data[0].z")
    dyn0 = A.aggregate(pb.at_step(pb.load(grid, "dynamics"), 0), by=["signal_norm",
                                                                         "noise_ratio"])
    got = {CATS[at0[iy][ix]] for iy in range(3) for ix in range(4)}
    assert got == set(dyn0["regime"].astype(str)) and at0 != before
    # a click: the cell's runs' dynamics
    page.mouse.click(*_cell_xy(page, 2, 1))
    page.wait_for_selector("#dyn_acc .main-svg", timeout=5000)
    assert page.evaluate("document.getElementById('dyn_acc').data.length") == 6  # 3 runs x 2
    assert page.evaluate("document.getElementById('dyn_mass').data.length") == 8
    assert page.errors == []


def test_a_noise_free_cell_shows_no_share_of_the_overfitting_regimes(tmp_path, page_of):
    """Runs with no flipped label have nothing to overfit: their hover says no noise, with no
    "benign: 0 [0, 0.66]" beside it; a noisy cell still lists its shares."""
    run_sweep(pb.spec_from_dict(BASE, {"signal_norm": [1.0, 9.0], "noise_ratio": [0.0, 0.25]},
                                seeds=2, name="clean"), tmp_path / "c", quiet=True)
    page = page_of(tmp_path / "c" / "report.html")

    def hover(ix, iy):
        page.mouse.move(0, 0)
        page.mouse.move(*_cell_xy(page, ix, iy))
        page.wait_for_selector(".hovertext", timeout=5000)
        return page.evaluate("document.querySelector('.hovertext').textContent")

    text = hover(1, 0)
    assert "noise ratio = 0" in text and "no noise: 1 [" in text
    assert not any(f"{r}: " in text for r in ("benign", "harmful", "not overfitting"))
    assert "benign: " in hover(1, 1) or "not overfitting: " in hover(1, 1)
    assert page.errors == []


def test_a_noise_free_row_is_not_counted_as_a_boundary_left_unplaced(tmp_path):
    """The noise ratio 0 row holds no benign or harmful run: it has no boundary to place, so it
    is not listed under the table as "too few runs"."""
    run_sweep(pb.spec_from_dict(BASE, {"signal_norm": [1.0, 3.0, 9.0, 27.0],
                                       "noise_ratio": [0.0, 0.25]}, seeds=2, name="z"),
              tmp_path / "z", quiet=True, plots=False)
    assert not any("too_few" in line for line in report_data(tmp_path / "z")["boundaries_left"])


def test_a_cases_report_in_a_real_browser(tmp_path, page_of):
    cases = [{"d": 48, "signal_norm": 1.0}, {"d": 64, "signal_norm": 9.0}]
    run_sweep(pb.spec_from_dict(BASE, {}, seeds=2, name="cases", cases=cases), tmp_path / "c",
              quiet=True)
    page = page_of(tmp_path / "c" / "report.html")
    assert page.evaluate("window.phasebo.state.panels.length") == 0  # no map of unrun cells
    assert page.locator("tr.case").count() == 2
    page.locator("#case1").click()
    page.wait_for_selector("#dyn_acc .main-svg", timeout=5000)
    assert page.errors == []


def test_reports_of_every_sweep_shape(tmp_path):
    """Several models (settings the other lacks are missing), a boolean axis, one axis, no axis:
    the sweep writes its report, every cell is placed, nothing is NaN in the page's data."""
    base = {k: v for k, v in BASE.items() if k not in ("d", "n")}
    shapes = {
        "models": pb.spec_from_dict({"steps": 20, "n_test": 64, "d": 48}, {}, seeds=2,
                                    name="models", cases=[
                                        {"model": "prompt_attention", "rho": 0.2, "n": 12},
                                        {"model": "single_head", "n": 10}]),
        "bool": pb.spec_from_dict({**base, "d": 48, "n": 12}, {"project": [True, False],
                                                               "signal_norm": [1.0, 9.0]},
                                  seeds=2, name="bool"),
        "one": pb.spec_from_dict({**base, "d": 48, "n": 12}, {"signal_norm": [1.0, 9.0]},
                                 seeds=2, name="one"),
        "none": pb.spec_from_dict({**base, "d": 48, "n": 12}, {}, seeds=2, name="none"),
    }
    for name, spec in shapes.items():
        run_sweep(spec, tmp_path / name, quiet=True)
        assert (tmp_path / name / "report.html").exists(), name
        D = report_data(tmp_path / name)
        assert all(c is not None for c in D["frames"][-1]["code"]), name  # every cell placed
        if D["mode"] == "map":
            assert all(c[D["x"]] in D["xs"] for c in D["coords"])
    assert report_data(tmp_path / "models")["mode"] == "cases"
    assert report_data(tmp_path / "bool")["xs"] in (["false", "true"], [1.0, 9.0])
    assert set(report_data(tmp_path / "none")["dynamics"]) == {"0"}  # clickable: its one cell


def test_a_sweep_of_one_axis_shows_its_boundary(tmp_path, page_of):
    """One axis: the whole sweep is the boundary's one slice. The page said "no boundary found"
    (its boundaries needed a second axis) where `phasebo boundaries` placed one; it now lists
    and draws it, and the browser shows no error."""
    spec = pb.spec_from_dict({"n": 20, "T": 8, "d": 1000, "n_test": 200, "steps": 1000,
                              "record_log": 8}, {"signal_norm": [2.0, 3.0, 5.0, 7.5, 10.0]},
                             seeds=3, name="one")  # harmful to 5, benign from 7.5
    run_sweep(spec, tmp_path / "o", quiet=True)
    data = report_data(tmp_path / "o")
    runs = pb.load(tmp_path / "o")
    with warnings.catch_warnings():  # a pair whose regime no run has: no boundary, as the page
        warnings.filterwarnings("ignore", "boundaries: no run is")
        want = {f"{a} / {b}" for a, b in (("benign", "harmful"), ("benign", "not_overfitting"))
                if len(pb.boundaries(runs.assign(one=0), "signal_norm", "one", (a, b))
                       .query("status in ['ok', 'unresolved', 'separated']"))}
    assert want and {b["between"] for b in data["boundaries"]} == want
    assert all(b["y"] is None for b in data["boundaries"])
    # each row says how many runs of the slice were of neither regime (left out of the fit)
    apart = pb.boundaries(runs.assign(one=0), "signal_norm", "one", ("benign", "harmful"))
    assert [b["n_other"] for b in data["boundaries"] if b["between"] == "benign / harmful"] == \
        apart["n_other"].tolist()
    page = page_of(tmp_path / "o" / "report.html")
    assert "no boundary found" not in page.inner_text("#bounds")
    assert page.errors == []


def test_a_flows_slider_gives_each_steps_flow_time(tmp_path):
    """A flow's recorded steps count GD-equivalent steps of lr: the slider's labels give the
    flow time too, the horizon's included."""
    base = {k: v for k, v in BASE.items() if k != "steps"}
    spec = pb.spec_from_dict({**base, "dynamics": "flow", "flow_time": 2.0, "record_log": 4},
                             {"signal_norm": [1.0, 9.0]}, seeds=1, name="fl")
    run_sweep(spec, tmp_path / "f", quiet=True, plots=False)
    labels = [f["label"] for f in report_data(tmp_path / "f")["frames"]]
    assert labels[-1] == "step 40 (τ 2, horizon)" and labels[0] == "step 0 (τ 0)", labels
