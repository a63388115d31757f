// phasebo's report.html: draws the sweep's data (the JSON block "data") with plotly.
// Every number shown comes from that block; nothing is fetched.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const MAX_PANELS = D.max_panels;
  const ROLE_COLORS = {rel: "#009E73", weak: "#56B4E9", weak_opp: "#D55E00", irr: "#9a9a9a"};
  const RUN_COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
                      "#F0E442", "#000000", "#999999", "#882255"];
  const state = {frame: D.frames.length - 1, slice: 0, panels: [], selected: null};

  const label = (c) => (D.labels[c] || c.replace(/_/g, " "));
  const fmt = (v) => (v === null || v === undefined) ? "–" :
    (typeof v === "number" ? (Number.isInteger(v) && Math.abs(v) < 1e7 ? String(v)
                              : String(Number(v.toPrecision(4)))) : String(v));
  const words = (r) => r.replace(/_/g, " ");

  // where each cell sits: slice index, row, column
  const place = D.coords.map((c) => {
    let k = 0;
    if (D.facets.length) {
      k = D.slices.findIndex((w) => D.facets.every((f) => w[f] === c[f] ||
                                                   Math.abs(w[f] - c[f]) < 1e-9));
    }
    const ix = D.x ? D.xs.indexOf(c[D.x]) : 0;
    const iy = D.y ? D.ys.indexOf(c[D.y]) : 0;
    return {k, ix, iy};
  });

  function hoverText(f, j) {
    const c = D.coords[j];
    const lines = D.keys.map((k) => `${label(k)} = ${fmt(c[k])}`);
    const code = f.code[j];
    const regime = code === null ? "no regime" : D.cats[code];
    lines.push(`<b>${words(regime)}</b>${regime === "mixed" ? " (no majority)" : ""} — ` +
               `${f.n_seeds[j]} seed${f.n_seeds[j] === 1 ? "" : "s"}` +
               (f.n_failed[j] ? `, ${f.n_failed[j]} failed` : ""));
    // a cell whose runs have no flipped label has nothing to overfit: no share of the overfitting
    // regimes is shown for it (a 0 with an interval would read as a measured share)
    const clean = f.frac_no_noise && f.frac_no_noise[j] === 1;
    for (const r of D.regimes) {
      const p = f[`frac_${r}`][j];
      if (p === null || (clean && r !== "no_noise") ||
          (p === 0 && (r === "no_noise" || r === "fitting" || r === "no_baseline"))) continue;
      lines.push(`${words(r)}: ${fmt(p)} [${fmt(f[`frac_${r}_lo`][j])}, ` +
                 `${fmt(f[`frac_${r}_hi`][j])}]`);
    }
    for (const m of D.metrics) {
      const mean = f[`${m}_mean`];
      if (!mean || mean[j] === null) continue;
      const se = f[`${m}_se`][j];  // the standard error over seeds: two digits say it
      lines.push(`${label(m)}: ${fmt(mean[j])} ± ` +
                 `${se === null ? "–" : String(Number(Number(se).toPrecision(2)))} (SE)`);
    }
    lines.push(`<i>${D.frames[state.frame].label}; ${D.settings}</i>`);
    return lines.join("<br>");
  }

  function grid(k) {
    const f = D.frames[state.frame];
    const ny = Math.max(D.ys.length, 1), nx = Math.max(D.xs.length, 1);
    const z = Array.from({length: ny}, () => Array(nx).fill(null));
    const text = Array.from({length: ny}, () => Array(nx).fill(""));
    place.forEach((p, j) => {
      if (p.k !== k) return;
      z[p.iy][p.ix] = f.code[j];
      text[p.iy][p.ix] = f.code[j] === null ? "" : hoverText(f, j);
    });
    return {z, text};
  }

  function colorscale() {
    const n = D.cats.length, cs = [];
    D.colors.forEach((c, i) => { cs.push([i / n, c]); cs.push([(i + 1) / n, c]); });
    return cs;
  }

  function ticks(vals) {
    const every = Math.ceil(vals.length / 10);
    const idx = vals.map((_, i) => i).filter((i) => i % every === 0 || i === vals.length - 1);
    return {tickvals: idx, ticktext: idx.map((i) => fmt(vals[i]))};
  }

  function toIndex(v, vals, log) {  // a value between grid values, placed between their cells
    log = log && vals.every((a) => typeof a === "number" && a > 0);
    const t = (a) => (log ? Math.log(a) : a);
    for (let i = 0; i < vals.length - 1; i++) {
      if (v >= vals[i] && v <= vals[i + 1]) {
        return i + (t(v) - t(vals[i])) / (t(vals[i + 1]) - t(vals[i]));
      }
    }
    return v < vals[0] ? -0.5 : vals.length - 0.5;
  }

  function boundaryTraces(k) {
    const w = D.slices[k] || {};
    const out = [];
    const symbols = {"benign / harmful": "diamond", "benign / not_overfitting": "circle"};
    const log = !!D.log[D.x];
    for (const between of Object.keys(symbols)) {
      const bs = D.boundaries.filter((b) => b.between === between &&
        D.facets.every((f) => Math.abs(b.slice[f] - w[f]) < 1e-9 || b.slice[f] === w[f]));
      if (!bs.length) continue;
      const xs = bs.map((b) => toIndex(b.boundary, D.xs, log));
      out.push({type: "scatter", mode: "markers", name: `boundary ${words(between)} (95% CI)`,
        x: xs, y: bs.map((b) => (D.y ? D.ys.indexOf(b.y) : 0)),  // one axis: the one row
        error_x: {type: "data", symmetric: false, color: "#000", thickness: 1,
                  array: bs.map((b, i) => (b.hi === null ? D.xs.length - 0.5
                                           : toIndex(b.hi, D.xs, log)) - xs[i]),
                  arrayminus: bs.map((b, i) => xs[i] - (b.lo === null ? -0.5
                                                          : toIndex(b.lo, D.xs, log)))},
        marker: {symbol: symbols[between], color: "#000", size: 6},
        text: bs.map((b) => `boundary ${words(between)}` +
                      `${D.y ? ` at ${label(D.y)} = ${fmt(b.y)}` : ""}: ` +
                      `${fmt(b.boundary)} [${fmt(b.lo)}, ${fmt(b.hi)}] (${b.status}, ` +
                      `${b.n_seeds} seeds)`),
        hovertemplate: "%{text}<extra></extra>", showlegend: false,
        visible: state.frame === D.frames.length - 1});
    }
    return out;
  }

  function visibleSlices() {
    const all = D.slices.map((_, k) => k);
    return all.length <= MAX_PANELS ? all : [state.slice];
  }

  function regimeKey() {  // the colour key once, above the panels (the regimes that occur)
    const seen = new Set();
    D.frames.forEach((f) => f.code.forEach((c) => { if (c !== null) seen.add(c); }));
    document.getElementById("key").innerHTML = D.cats.map((c, i) => (seen.has(i) ||
      ["benign", "harmful", "not_overfitting"].includes(c)) ? `<span class="swatch" ` +
      `style="background:${D.colors[i]}"></span>${words(c)}${c === "mixed" ?
      " (no majority)" : c === "fitting" ? " (still)" : ""}` : "").join(" ") +
      (D.boundaries.length ? "&nbsp;&nbsp; ◆ boundary benign / harmful, ● benign / not " +
       "overfitting (95% CI, at the horizon)" : "");
  }

  function drawMaps() {
    const box = document.getElementById("panels");
    box.innerHTML = "";
    state.panels = [];
    visibleSlices().forEach((k, n) => {
      const div = document.createElement("div");
      div.className = "panel";
      div.id = `map${k}`;
      if (visibleSlices().length === 1) { div.style.width = "640px"; div.style.height = "540px"; }
      box.appendChild(div);
      const g = grid(k);
      const heat = {type: "heatmap", z: g.z, text: g.text, hovertemplate: "%{text}<extra></extra>",
        colorscale: colorscale(), zmin: -0.5, zmax: D.cats.length - 0.5, xgap: 1, ygap: 1,
        showscale: false, hoverongaps: false};
      const layout = {title: {text: D.slice_text[k] || "regime", font: {size: 13}},
        margin: {l: 60, r: 30, t: 36, b: 50}, showlegend: false,
        modebar: {orientation: "v"},  // beside the plot: across the top it hid a small panel's title
        // cells sit at index positions: plotly's zero line would run along the first row
        xaxis: {title: {text: label(D.x)}, ...ticks(D.xs), range: [-0.5, D.xs.length - 0.5],
                zeroline: false},
        yaxis: D.y ? {title: {text: label(D.y)}, ...ticks(D.ys),
                      range: [-0.5, D.ys.length - 0.5], zeroline: false}
                   : {showticklabels: false, ticks: "", showgrid: false, range: [-0.5, 0.5],
                      zeroline: false}};
      Plotly.newPlot(div, [heat, ...boundaryTraces(k)], layout,
                     {displaylogo: false, responsive: false});
      div.on("plotly_click", (ev) => {
        const p = ev.points[0];
        const j = place.findIndex((q) => q.k === k && q.ix === p.x && q.iy === (D.y ? p.y : 0));
        if (j >= 0) showDynamics(j);
      });
      state.panels.push(div);
    });
  }

  function setFrame(i) {
    state.frame = i;
    document.getElementById("steplabel").textContent = D.frames[i].label;
    visibleSlices().forEach((k, n) => {
      const div = state.panels[n];
      const g = grid(k);
      Plotly.restyle(div, {z: [g.z], text: [g.text]}, [0]);
      const nb = div.data.length - 1;
      if (nb > 0) {
        Plotly.restyle(div, {visible: i === D.frames.length - 1},
                       Array.from({length: nb}, (_, t) => t + 1));
      }
    });
  }

  function showDynamics(j) {
    state.selected = j;
    const box = document.getElementById("dyn");
    box.innerHTML = "";
    const dyn = D.dynamics[String(j)];
    const c = D.coords[j];
    const where = D.keys.map((k) => `${label(k)} = ${fmt(c[k])}`).join(", ");
    if (!dyn) {
      box.textContent = `${where}: this sweep recorded no dynamics (record_every / record_log)`;
      return;
    }
    const acc = document.createElement("div"), mass = document.createElement("div");
    acc.className = mass.className = "dynplot";
    acc.id = "dyn_acc"; mass.id = "dyn_mass";
    box.appendChild(acc); box.appendChild(mass);
    const tr = [];
    dyn.runs.forEach((r, i) => {
      const col = RUN_COLORS[i % RUN_COLORS.length];
      const keep = r.step.map((s, t) => t).filter((t) => r.step[t] > 0);
      const xs = keep.map((t) => r.step[t]);
      if (r.train_acc) tr.push({x: xs, y: keep.map((t) => r.train_acc[t]), mode: "lines",
        line: {color: col}, name: `seed ${r.seed} train`, legendgroup: `s${i}`});
      if (r.test_acc) tr.push({x: xs, y: keep.map((t) => r.test_acc[t]), mode: "lines",
        line: {color: col, dash: "dash"}, name: `seed ${r.seed} test`, legendgroup: `s${i}`});
    });
    const shown = dyn.runs.length < dyn.n_runs ? ` (${dyn.runs.length} of ${dyn.n_runs} runs)`
                                               : ` (${dyn.n_runs} runs)`;
    Plotly.newPlot(acc, tr, {title: {text: `accuracy, solid train / dashed test${shown}<br>` +
                                     `<sub>${where}</sub>`, font: {size: 12}},
      xaxis: {type: "log", title: {text: "step (log; step 0 not drawn)"}},
      yaxis: {title: {text: "accuracy"}}, margin: {l: 50, r: 10, t: 50, b: 45},
      legend: {font: {size: 9}}}, {displaylogo: false});
    if (!Object.keys(dyn.mass).length) {
      mass.textContent = "attention mass per token role: not recorded by this model";
      return;
    }
    const mt = [];
    const steps = dyn.mass_step.map((s, t) => t).filter((t) => dyn.mass_step[t] > 0);
    for (const [col, ys] of Object.entries(dyn.mass)) {
      const [group, ...rest] = col.split("_");
      const role = rest.join("_");
      mt.push({x: steps.map((t) => dyn.mass_step[t]), y: steps.map((t) => ys[t]), mode: "lines",
        line: {color: ROLE_COLORS[role] || "#444", dash: group === "noisy" ? "dash" : "solid"},
        name: `${group === "noisy" ? "flipped" : "clean"}: ${D.role_labels[role] || role}`});
    }
    Plotly.newPlot(mass, mt, {title: {text: "attention mass per token role (mean over runs)" +
                                      "<br><sub>solid clean / dashed flipped samples</sub>",
                                      font: {size: 12}},
      xaxis: {type: "log", title: {text: "step (log; step 0 not drawn)"}},
      yaxis: {title: {text: "softmax mass"}}, margin: {l: 50, r: 10, t: 50, b: 45},
      legend: {font: {size: 9}}}, {displaylogo: false});
  }

  function casesTable() {
    const f = D.frames[D.frames.length - 1];
    const tbl = document.createElement("table");
    const head = [...D.keys.map(label), "regime", "seeds",
                  ...D.metrics.map((m) => `${label(m)} (mean ± SE)`)];
    document.getElementById("steplabel").textContent = `at ${f.label}`;
    tbl.innerHTML = "<tr>" + head.map((h) => `<th>${h}</th>`).join("") + "</tr>";
    D.coords.forEach((c, j) => {
      const tr = document.createElement("tr");
      tr.className = "case";
      tr.id = `case${j}`;
      const cells = [...D.keys.map((k) => fmt(c[k])),
        f.code[j] === null ? "–" : words(D.cats[f.code[j]]), fmt(f.n_seeds[j]),
        ...D.metrics.map((m) => (f[`${m}_mean`] ? `${fmt(f[`${m}_mean`][j])} ± ` +
                                  `${fmt(f[`${m}_se`][j])}` : "not recorded"))];
      tr.innerHTML = cells.map((v) => `<td>${v}</td>`).join("");
      tr.title = hoverText(f, j).replace(/<br>/g, "\n").replace(/<[^>]+>/g, "");
      tr.addEventListener("click", () => showDynamics(j));
      tbl.appendChild(tr);
    });
    document.getElementById("panels").appendChild(tbl);
  }

  function controls() {
    const box = document.getElementById("controls");
    if (D.frames.length > 1 && D.mode === "map") {
      box.innerHTML += `<label>recorded step <input type="range" id="step" min="0" ` +
        `max="${D.frames.length - 1}" value="${state.frame}" style="width:320px"></label>` +
        `<span id="steplabel"></span>`;
    } else {
      box.innerHTML += `<span id="steplabel"></span>`;
    }
    if (D.mode === "map" && D.slices.length > MAX_PANELS) {
      box.innerHTML += `<label>slice <select id="slice">` + D.slice_text.map((t, k) =>
        `<option value="${k}">${t}</option>`).join("") + `</select></label>`;
    }
  }

  function boundsText() {
    const el = document.getElementById("bounds");
    const left = (D.boundaries_left || []).length ? `<p>Not placed (not in the table): ` +
      `${D.boundaries_left.join("; ")}.</p>` : "";
    if (!D.boundaries.length) {
      el.innerHTML = (D.mode === "map" ? "no boundary found between benign and harmful or " +
        "not-overfitting runs along " + label(D.x || "x") : "a cases sweep has no map") + left;
      return;
    }
    const sliceCell = (b) => (D.facets.length ? `<td>${Object.entries(b.slice).map(([k, v]) =>
      `${label(k)} = ${fmt(v)}`).join(", ")}</td>` : "");
    const yCell = (b) => (D.y ? `<td>${fmt(b.y)}</td>` : "");  // one axis: one slice
    const rows = D.boundaries.map((b) => `<tr><td>${words(b.between)}</td>${sliceCell(b)}` +
      `${yCell(b)}<td>${fmt(b.boundary)}</td><td>[${b.lo === null ? "unbounded" :
        fmt(b.lo)}, ${b.hi === null ? "unbounded" : fmt(b.hi)}]</td>` +
      `<td>${b.status}</td><td>${b.n_seeds}</td><td>${b.n_other}</td></tr>`).join("");
    el.innerHTML = `<p>Along ${label(D.x)}${D.y ? `, one per ${label(D.y)}` : ""}: the ` +
      `${label(D.x)} where a logistic fit over the runs of the two regimes crosses ½, its 95% ` +
      `interval a bootstrap over seeds; runs still fitting their labels at the horizon are left ` +
      `apart, not counted as either regime, and "seeds" counts the seeds with runs of either ` +
      `(computed in ${D.boundaries_s} s).</p><table><tr><th>between</th>` +
      `${D.facets.length ? "<th>slice</th>" : ""}${D.y ? `<th>${label(D.y)}</th>` : ""}` +
      `<th>boundary</th><th>95% CI</th><th>status</th><th>seeds</th>` +
      `<th>runs of neither (left apart)</th></tr>${rows}</table>${left}`;
  }

  document.getElementById("title").textContent = `phasebo report: ${D.name}`;
  document.getElementById("subtitle").textContent = `${D.n_runs} runs, ${D.seeds} ` +
    `seed${D.seeds === "1" ? "" : "s"} per ` +
    `cell; ${D.settings}` + (D.mode === "map" ? `. Hover a cell for its numbers, click it ` +
    `for its runs' dynamics.` : ". A [[cases]] sweep: its cases (click a row for its dynamics).");
  controls();
  if (D.mode === "map") { regimeKey(); drawMaps(); } else casesTable();
  document.getElementById("steplabel").textContent = D.frames[state.frame].label;
  const slider = document.getElementById("step");
  if (slider) slider.addEventListener("input", (e) => setFrame(Number(e.target.value)));
  const sel = document.getElementById("slice");
  if (sel) sel.addEventListener("change", (e) => { state.slice = Number(e.target.value);
                                                   drawMaps(); });
  boundsText();
  document.getElementById("spec").textContent = "sweep (the file with its --set overrides):\n" +
    JSON.stringify(D.spec, null, 1);
  document.getElementById("prov").textContent = "provenance and timings:\n" +
    JSON.stringify(D.provenance, null, 1) + (D.history.length > 1 ? "\nhistory:\n" +
    JSON.stringify(D.history, null, 1) : "");
  window.phasebo = {data: D, state, place, setFrame, showDynamics};
})();
