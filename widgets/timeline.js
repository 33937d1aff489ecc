// The browser half of tinax's run timeline (widgets/_timeline.py): a run at a glance
// as one SVG that fits the width it is given. Python sends the run's figures (steps,
// metrics, save times and sizes, the rel_update of each layer between consecutive
// checkpoints, the non-finite steps and the roll-back step); this draws them in
// panels sharing one step axis, and sends back clicks: a step (any panel) or a cell
// of the heatmap (a layer between two checkpoints).

const SVG = "http://www.w3.org/2000/svg";
const LEFT_MIN = 64; // px for the y labels of the line panels
const RIGHT = 12;
const LINE_H = 120; // px of a line panel
const SAVE_H = 90;
const ROW_MIN = 9; // px of a heatmap row, at least
const ROW_MAX = 16;
const FONT = 11;
const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948"];

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (parent) parent.append(node);
  return node;
}

function text(parent, x, y, content, attrs) {
  const t = el("text", { x, y, "font-size": FONT, fill: "currentColor", ...attrs }, parent);
  t.textContent = content;
  return t;
}

function finite(v) {
  return typeof v === "number" && Number.isFinite(v);
}

function short(v) {
  if (!finite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(1);
  return String(Number(v.toPrecision(3)));
}

function bytes(n) {
  if (!finite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${Number(n.toPrecision(3))} ${units[i]}`;
}

// Blue (small) to yellow (large), over log10 of the value between lo and hi.
function heat(v, lo, hi) {
  if (!finite(v)) return null;
  const x = v <= 0 ? 0 : Math.min(1, Math.max(0, (Math.log10(v) - lo) / (hi - lo || 1)));
  const stops = [
    [0, [49, 54, 149]],
    [0.35, [69, 117, 180]],
    [0.6, [171, 217, 233]],
    [0.8, [254, 224, 144]],
    [1, [215, 48, 39]],
  ];
  for (let i = 1; i < stops.length; i++) {
    if (x <= stops[i][0]) {
      const [a, ca] = stops[i - 1];
      const [b, cb] = stops[i];
      const t = (x - a) / (b - a);
      const c = ca.map((q, k) => Math.round(q + (cb[k] - q) * t));
      return `rgb(${c[0]},${c[1]},${c[2]})`;
    }
  }
  return "rgb(215,48,39)";
}

function extent(values) {
  const v = values.filter(finite);
  if (!v.length) return [0, 1];
  let lo = Math.min(...v);
  let hi = Math.max(...v);
  if (lo === hi) {
    lo -= Math.abs(lo) * 0.1 || 1;
    hi += Math.abs(hi) * 0.1 || 1;
  }
  return [lo, hi];
}

function draw(model, root) {
  const data = model.get("data") || {};
  const steps = data.steps || [];
  root.replaceChildren();
  const width = Math.max(320, root.clientWidth || 800);
  if (!steps.length) {
    const p = document.createElement("div");
    p.className = "tinax-timeline-empty";
    p.textContent = data.empty || "No complete checkpoint with a step in this run yet.";
    root.append(p);
    return;
  }
  const layers = data.layers || [];
  // The heatmap's labels decide the left margin: as wide as the longest, within reason.
  const longest = Math.max(0, ...layers.map((s) => s.length));
  const left = Math.max(LEFT_MIN, Math.min(Math.round(width * 0.22), 7 * longest + 10));
  const plotW = width - left - RIGHT;
  const lo = Math.min(...steps);
  const hi = Math.max(...steps);
  const span = hi - lo || 1;
  const x = (s) => left + ((s - lo) / span) * plotW;
  const svg = el("svg", { width, class: "tinax-timeline-svg", role: "img" });
  let y = 8;
  const marks = [];
  const nonfinite = new Set(data.nonfinite_steps || []);

  // -- a line panel ----------------------------------------------------------------
  function linePanel(title, series, height, format) {
    const top = y + 16;
    text(svg, left, y + 11, title, { "font-weight": "bold" });
    const all = series.flatMap((s) => s.values);
    const [vlo, vhi] = extent(all);
    // Values over two decades apart, all positive (a loss spike): a log scale, so
    // the rest of the curve stays readable.
    const log = vlo > 0 && vhi / vlo > 100;
    const f = log ? Math.log10 : (v) => v;
    const yy = (v) => top + height - ((f(v) - f(vlo)) / (f(vhi) - f(vlo))) * height;
    if (log) text(svg, left + plotW, y + 11, "log scale", { "text-anchor": "end", "font-size": 10 });
    el("rect", { x: left, y: top, width: plotW, height, fill: "none", stroke: "#bbb" }, svg);
    for (const v of [vlo, vhi]) text(svg, left - 4, yy(v) + 4, format(v), { "text-anchor": "end" });
    series.forEach((s, k) => {
      let d = "";
      s.values.forEach((v, i) => {
        if (!finite(v)) return;
        d += `${d && finite(s.values[i - 1]) ? "L" : "M"}${x(steps[i]).toFixed(1)},${yy(v).toFixed(1)}`;
      });
      el("path", { d, fill: "none", stroke: s.color || COLORS[k % COLORS.length], "stroke-width": 1.5 }, svg);
      s.values.forEach((v, i) => {
        if (!finite(v)) {
          if (v === null && !nonfinite.has(steps[i])) return;
          const m = el("text", { x: x(steps[i]), y: top + height - 3, "font-size": 10, fill: "#d62728", "text-anchor": "middle" }, svg);
          m.textContent = "✕";
        }
      });
      if (series.length > 1 || s.label !== title) {
        text(svg, left + 8 + k * 120, top + 12, s.label, { fill: s.color || COLORS[k % COLORS.length] });
      }
    });
    marks.push([top, top + height]);
    y = top + height + 14;
  }

  const metric = model.get("metric");
  const metrics = data.metrics || {};
  if (metric && metrics[metric]) {
    linePanel(metric, [{ label: metric, values: metrics[metric] }], LINE_H, short);
  }
  const blocked = data.save_blocked_s || [];
  const total = data.save_total_s || [];
  if (total.some(finite)) {
    linePanel(
      "save time (s)",
      [
        { label: "in all", values: total, color: "#4e79a7" },
        { label: "blocking", values: blocked, color: "#e15759" },
      ],
      SAVE_H,
      short,
    );
  }
  if ((data.nbytes || []).some(finite)) {
    linePanel("size on disk", [{ label: "size on disk", values: data.nbytes, color: "#59a14f" }], SAVE_H, bytes);
  }

  // -- the heatmap: rel_update by layer (rows) and step (columns) ---------------------
  const cells = data.heat || [];
  if (layers.length && cells.length) {
    const top = y + 16;
    text(svg, left, y + 11, data.heat_title || "rel_update ‖b−a‖/‖a‖ by layer", { "font-weight": "bold" });
    const rowH = Math.max(ROW_MIN, Math.min(ROW_MAX, Math.floor(400 / layers.length)));
    const values = cells.flat().filter((v) => finite(v) && v > 0);
    const hlo = values.length ? Math.log10(Math.min(...values)) : -3;
    const hhi = values.length ? Math.log10(Math.max(...values)) : 0;
    const pairSteps = data.heat_steps || [];
    const previous = data.heat_previous || [];
    layers.forEach((label, r) => {
      const ry = top + r * rowH;
      const t = text(svg, left - 4, ry + rowH - 2, label, {
        "text-anchor": "end",
        "font-size": Math.min(FONT, rowH),
        class: "tinax-timeline-layer",
      });
      const tip = el("title", {}, t);
      tip.textContent = (data.layer_keys || [])[r] || label;
      pairSteps.forEach((s, c) => {
        const x0 = x(previous[c]);
        const x1 = x(s);
        const v = cells[r][c];
        const fill = heat(v, hlo, hhi);
        const rect = el(
          "rect",
          {
            x: x0.toFixed(1),
            y: ry,
            width: Math.max(1, x1 - x0).toFixed(1),
            height: rowH - 1,
            fill: fill || "#d62728",
            "fill-opacity": fill ? 1 : 0.55,
            class: "tinax-timeline-cell",
            "data-layer": r,
            "data-column": c,
          },
          svg,
        );
        const title = el("title", {}, rect);
        title.textContent = `${label}, ${previous[c]} → ${s}: rel_update ${fill ? short(v) : "NaN/Inf"}`;
      });
    });
    const bottom = top + layers.length * rowH;
    marks.push([top, bottom]);
    // The colour scale, in words: where the ends are.
    text(svg, left, bottom + 12, `colour: log scale ${short(10 ** hlo)} (blue) … ${short(10 ** hhi)} (red); red haze: NaN/Inf`, { "font-size": 10 });
    y = bottom + 18;
  }

  // -- the step axis, markers and the picks ------------------------------------------
  // The checkpoints' own steps where they fit; else evenly spaced ones.
  const room = Math.max(2, Math.floor(plotW / 50));
  const ticks =
    steps.length <= room
      ? steps
      : Array.from({ length: room }, (_, i) => Math.round(lo + (span * i) / (room - 1)));
  for (const s of ticks) text(svg, x(s), y + 10, String(s), { "text-anchor": "middle" });
  text(svg, left + plotW, y + 24, "step", { "text-anchor": "end" });
  const top0 = marks.length ? marks[0][0] : 0;
  const bottom0 = marks.length ? marks[marks.length - 1][1] : y;
  for (const s of data.nonfinite_steps || []) {
    el("line", { x1: x(s), x2: x(s), y1: top0, y2: bottom0, stroke: "#d62728", "stroke-width": 1, "stroke-opacity": 0.5 }, svg);
  }
  const rollback = data.rollback_step;
  if (finite(rollback)) {
    el("line", { x1: x(rollback), x2: x(rollback), y1: top0, y2: bottom0, stroke: "#2ca02c", "stroke-width": 2, "stroke-dasharray": "4 3" }, svg);
    text(svg, x(rollback) + 3, top0 + 10, "roll back", { fill: "#2ca02c" });
  }
  for (const s of model.get("picked_steps") || []) {
    el("line", { x1: x(s), x2: x(s), y1: top0, y2: bottom0, stroke: "currentColor", "stroke-width": 1.5 }, svg);
  }
  svg.setAttribute("height", String(y + 30));
  svg.setAttribute("viewBox", `0 0 ${width} ${y + 30}`);

  svg.addEventListener("click", (event) => {
    const box = svg.getBoundingClientRect();
    const px = event.clientX - box.left;
    if (px < left - 2) return;
    const target = event.target;
    if (target && target.classList && target.classList.contains("tinax-timeline-cell")) {
      const r = Number(target.getAttribute("data-layer"));
      const c = Number(target.getAttribute("data-column"));
      model.send({ kind: "cell", layer: r, column: c });
      return;
    }
    const at = lo + ((px - left) / plotW) * span;
    let best = steps[0];
    for (const s of steps) if (Math.abs(s - at) < Math.abs(best - at)) best = s;
    model.send({ kind: "step", step: best });
  });
  root.append(svg);
}

function render({ model, el: root }) {
  root.classList.add("tinax-timeline");
  const redraw = () => draw(model, root);
  model.on("change:data", redraw);
  model.on("change:metric", redraw);
  model.on("change:picked_steps", redraw);
  let last = 0;
  const observer = new ResizeObserver(() => {
    const w = root.clientWidth;
    if (Math.abs(w - last) > 4) {
      last = w;
      redraw();
    }
  });
  observer.observe(root);
  redraw();
  return () => observer.disconnect();
}

export default { render };
