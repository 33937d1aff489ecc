// The browser half of tinax's run timeline (widgets/_timeline.py): a run at a glance
// as one SVG that fits the width it is given. Python sends the run's figures (steps,
// metrics (and which of their values are NaN or infinite), save times and sizes, the
// rel_update of each layer between consecutive checkpoints (and which layers held
// NaN/Inf or could not be read), the non-finite steps and the roll-back step); this
// draws them in panels sharing one step axis, and sends back clicks: a step (any
// panel; a shift-click asks to open it alone) or a cell of the heatmap (a layer
// between two checkpoints).

const SVG = "http://www.w3.org/2000/svg";
const LEFT_MIN = 64; // px for the y labels of the line panels
const RIGHT = 12;
const LINE_H = 120; // px of a line panel
const SAVE_H = 90;
const ROW_MIN = 9; // px of a heatmap row, at least
const ROW_MAX = 16;
const FONT = 11;
const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948"];
// Non-finite values: red marks on the metric (as the scan's lines), and in the heatmap
// a pattern of their own, never a colour of the value scale (blue … red).
const NAN_RED = "#d62728";
const CELL_PATTERNS = {
  nonfinite: { id: "tinax-nonfinite", back: "#1a1a1a", line: "#e040fb", word: "NaN/Inf" },
  unread: { id: "tinax-unread", back: "#f0f0f0", line: "#9e9e9e", word: "not read" },
};
let patternCount = 0;
// A checkpoint's health (the library's word): the colours every view gives it.
const HEALTH_FILLS = { healthy: "#1b7f3b", diverged: "#6a1b9a", "not yet known": "#d0d0d0" };

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

function short(v, digits = 3) {
  if (!finite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(Math.max(1, digits - 2));
  return String(Number(v.toPrecision(digits)));
}

function bytes(n, digits = 3) {
  if (!finite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${Number(n.toPrecision(digits))} ${units[i]}`;
}

// The labels of an axis's two ends: as many digits as it takes to tell them apart
// (never "133 MiB" at both ends of a drawn difference).
function endLabels(format, lo, hi) {
  for (let digits = 3; digits <= 15; digits++) {
    const a = format(lo, digits);
    const b = format(hi, digits);
    if (a !== b) return [a, b];
  }
  return [format(lo), format(hi)];
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

// One metric's scale: its extent, and a log scale when its values, all positive, lie
// over two decades apart (a loss spike, a learning rate that doubles every step).
function scaleOf(values) {
  const ends = extent(values);
  return { ends, log: ends[0] > 0 && ends[1] / ends[0] > 100 };
}

// Hatched fills for the heatmap cells that hold no value, defined once per drawing
// (ids made unique: several timelines may share a page).
function patterns(svg) {
  const defs = el("defs", {}, svg);
  const ids = {};
  patternCount += 1;
  for (const [state, p] of Object.entries(CELL_PATTERNS)) {
    const id = `${p.id}-${patternCount}`;
    const pattern = el("pattern", { id, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" }, defs);
    el("rect", { width: 6, height: 6, fill: p.back }, pattern);
    el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: p.line, "stroke-width": 3 }, pattern);
    ids[state] = `url(#${id})`;
  }
  return ids;
}

// The checkpoints' own steps to label on the axis: spread out, at least `gap` px
// apart, the first and last always; a label never names a step without a checkpoint.
function tickSteps(steps, x, gap) {
  if (!steps.length) return [];
  const out = [steps[0]];
  const last = steps[steps.length - 1];
  for (const s of steps) {
    if (x(s) - x(out[out.length - 1]) >= gap && x(last) - x(s) >= gap) out.push(s);
  }
  if (last !== out[out.length - 1]) {
    if (out.length > 1 && x(last) - x(out[out.length - 1]) < gap) out.pop();
    out.push(last);
  }
  return out;
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
  // The metrics picked: the first on the left axis, the second on a right one, which
  // takes room of its own.
  const metrics = data.metrics || {};
  const picked = (model.get("metrics") || []).filter((m) => metrics[m]);
  const rightLabels = picked.length > 1 ? endLabels(short, ...scaleOf(metrics[picked[1]]).ends) : [];
  const right = Math.max(RIGHT, ...rightLabels.map((t) => 7 * t.length + 10));
  const plotW = width - left - right;
  const lo = Math.min(...steps);
  const hi = Math.max(...steps);
  const span = hi - lo || 1;
  const x = (s) => left + ((s - lo) / span) * plotW;
  const svg = el("svg", { width, class: "tinax-timeline-svg", role: "img" });
  // In the page from the start, so that text can be measured as it is laid out.
  root.append(svg);
  let y = 8;
  const panels = [];
  const nonfinite = new Set(data.nonfinite_steps || []);

  // -- a line panel (save times, sizes) ------------------------------------------------
  // `minSpan`: the least share of the largest value the axis spans, so that a
  // difference small beside the values themselves (a few bytes of 133 MiB) is drawn
  // as the small difference it is, not as a full-height spike; the title then says
  // how far apart the values are.
  function linePanel(title, series, height, format, minSpan = 0) {
    const top = y + 16;
    const all = series.flatMap((s) => s.values);
    let [vlo, vhi] = extent(all);
    const values = all.filter(finite);
    const [dlo, dhi] = values.length ? [Math.min(...values), Math.max(...values)] : [vlo, vhi];
    const least = minSpan * Math.max(Math.abs(dlo), Math.abs(dhi));
    let heading = title;
    if (least && dhi - dlo < least) {
      const middle = (dlo + dhi) / 2;
      [vlo, vhi] = [middle - least / 2, middle + least / 2];
      heading += dhi > dlo ? ` · all within ${format(dhi - dlo)} of ${format(dhi)}` : ` · ${format(dhi)} each`;
    }
    text(svg, left, y + 11, heading, { "font-weight": "bold", class: "tinax-timeline-panel-title" });
    // Values over two decades apart, all positive: a log scale, so that the rest of
    // the curve stays readable.
    const log = vlo > 0 && vhi / vlo > 100;
    const f = log ? Math.log10 : (v) => v;
    const yy = (v) => top + height - ((f(v) - f(vlo)) / (f(vhi) - f(vlo))) * height;
    if (log) text(svg, left + plotW, y + 11, "log scale", { "text-anchor": "end", "font-size": 10 });
    el("rect", { x: left, y: top, width: plotW, height, fill: "none", stroke: "#bbb" }, svg);
    endLabels(format, vlo, vhi).forEach((label, i) => {
      text(svg, left - 4, yy(i ? vhi : vlo) + 4, label, { "text-anchor": "end", class: "tinax-timeline-y" });
    });
    series.forEach((s, k) => {
      let d = "";
      s.values.forEach((v, i) => {
        if (!finite(v)) return;
        d += `${d && finite(s.values[i - 1]) ? "L" : "M"}${x(steps[i]).toFixed(1)},${yy(v).toFixed(1)}`;
      });
      el("path", { d, fill: "none", stroke: s.color || COLORS[k % COLORS.length], "stroke-width": 1.5 }, svg);
      if (series.length > 1 || s.label !== title) {
        text(svg, left + 8 + k * 120, top + 12, s.label, { fill: s.color || COLORS[k % COLORS.length] });
      }
    });
    panels.push([top, top + height]);
    y = top + height + 14;
  }

  if (picked.length) metricPanel(picked);
  // -- the metrics picked, overlaid on the one step axis, each on its own scale ------
  function metricPanel(names) {
    const top = y + 16;
    const height = LINE_H;
    const title = el("text", { x: left, y: y + 11, "font-size": FONT, "font-weight": "bold", class: "tinax-timeline-metrics-title" }, svg);
    const nonfiniteMarks = data.metric_nonfinite || {};
    const firsts = new Map();
    el("rect", { x: left, y: top, width: plotW, height, fill: "none", stroke: "#bbb" }, svg);
    names.forEach((name, k) => {
      const color = COLORS[k % COLORS.length];
      const values = metrics[name];
      const { ends, log } = scaleOf(values);
      const [vlo, vhi] = ends;
      const f = log ? Math.log10 : (v) => v;
      const yy = (v) => top + height - ((f(v) - f(vlo)) / (f(vhi) - f(vlo) || 1)) * height;
      const where = names.length < 2 ? "" : k === 0 ? "left" : k === 1 ? "right" : `${endLabels(short, vlo, vhi).join(" … ")}`;
      const said = [where, log ? "log scale" : ""].filter(Boolean).join(", ");
      const span = el("tspan", { fill: color, class: "tinax-timeline-metric-name", "data-metric": name, "data-log": String(log) }, title);
      span.textContent = `${k ? " · " : ""}${name}${said ? ` (${said})` : ""}`;
      if (k < 2) {
        endLabels(short, vlo, vhi).forEach((label, i) => {
          const at = k === 0 ? { x: left - 4, anchor: "end" } : { x: left + plotW + 4, anchor: "start" };
          text(svg, at.x, yy(i ? vhi : vlo) + 4, label, { "text-anchor": at.anchor, fill: names.length > 1 ? color : "currentColor", class: "tinax-timeline-y" });
        });
      }
      let d = "";
      values.forEach((v, i) => {
        if (!finite(v)) return;
        d += `${d && finite(values[i - 1]) ? "L" : "M"}${x(steps[i]).toFixed(1)},${yy(v).toFixed(1)}`;
      });
      el("path", { d, fill: "none", stroke: color, "stroke-width": 1.5, class: "tinax-timeline-metric-line", "data-metric": name }, svg);
      // Values the run itself recorded as NaN or ±Inf (run_table): a mark in the
      // metric's row at the top of the panel, where its line would leave it.
      (nonfiniteMarks[name] || []).forEach(([step, word], j) => {
        const m = el("text", { x: x(step), y: top + 11 + 11 * k, "font-size": 11, fill: NAN_RED, "text-anchor": "middle", class: "tinax-timeline-metric-nonfinite" }, svg);
        m.textContent = "✕";
        el("title", {}, m).textContent = `${name} ${word} at step ${step}`;
        if (j === 0) {
          const key = `${word} from ${step}`;
          firsts.set(key, [...(firsts.get(key) || []), name]);
        }
      });
    });
    // Where each metric went non-finite, named once for the metrics that did together.
    [...firsts.entries()].forEach(([key, which], i) => {
      const step = Number(key.split(" from ")[1]);
      const onRight = x(step) > left + plotW * 0.6;
      text(svg, x(step) + (onRight ? -7 : 7), top + 13 + 11 * names.length + 13 * i, `${names.length > 1 ? `${which.join(", ")} ` : ""}${key}`, {
        fill: NAN_RED,
        "text-anchor": onRight ? "end" : "start",
        class: "tinax-timeline-metric-nonfinite-label",
      });
    });
    // A gap where a checkpoint's weights were found non-finite by the scan.
    if (!Object.keys(nonfiniteMarks).some((n) => names.includes(n))) {
      steps.forEach((s, i) => {
        if (nonfinite.has(s) && !names.some((n) => finite(metrics[n][i]))) {
          const m = el("text", { x: x(s), y: top + height - 3, "font-size": 10, fill: NAN_RED, "text-anchor": "middle" }, svg);
          m.textContent = "✕";
        }
      });
    }
    panels.push([top, top + height]);
    y = top + height + 14;
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
    linePanel("size on disk", [{ label: "size on disk", values: data.nbytes, color: "#59a14f" }], SAVE_H, bytes, 0.02);
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
    const states = data.heat_state || [];
    const counts = data.heat_counts || [];
    const fills = patterns(svg);
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
        const state = (states[r] || [])[c] || null;
        const fill = state ? fills[state] : heat(v, hlo, hhi) || fills.unread;
        const rect = el(
          "rect",
          {
            x: x0.toFixed(1),
            y: ry,
            width: Math.max(1, x1 - x0).toFixed(1),
            height: rowH - 1,
            fill,
            class: `tinax-timeline-cell${state ? ` tinax-timeline-${state}` : ""}`,
            "data-layer": r,
            "data-column": c,
          },
          svg,
        );
        const title = el("title", {}, rect);
        let says = `rel_update ${short(v)}`;
        const [nanA, infA, nanB, infB, unreadable] = (counts[r] || [])[c] || [0, 0, 0, 0, 0];
        if (state === "nonfinite") {
          const side = (step, nan, inf) => `${nan.toLocaleString()} NaN, ${inf.toLocaleString()} Inf in step ${step}`;
          says = `NaN/Inf: ${side(s, nanB, infB)}; ${side(previous[c], nanA, infA)}`;
        } else if (state && unreadable) {
          says = `${unreadable.toLocaleString()} ${unreadable === 1 ? "leaf" : "leaves"} not compared (damaged, or not on both sides)`;
          if (finite(v)) says += `; rel_update of the rest ${short(v)}`;
        } else if (state) {
          says = "not known: part of it was not read";
        }
        title.textContent = `${label}, ${previous[c]} → ${s}: ${says}`;
      });
    });
    const bottom = top + layers.length * rowH;
    panels.push([top, bottom]);
    // The colour scale, in words: where the ends are; then a swatch of each pattern
    // the heatmap holds.
    const scale = text(svg, left, bottom + 13, `log scale ${short(10 ** hlo)} (blue) … ${short(10 ** hhi)} (red)`, { "font-size": 10 });
    let kx = left + scale.getComputedTextLength() + 14;
    const shown = new Set(states.flat().filter(Boolean));
    for (const [state, p] of Object.entries(CELL_PATTERNS)) {
      if (!shown.has(state)) continue;
      el("rect", { x: kx, y: bottom + 4, width: 14, height: 10, fill: fills[state], stroke: "#888", "stroke-width": 0.5, class: `tinax-timeline-key-${state}` }, svg);
      const t = text(svg, kx + 18, bottom + 13, p.word, { "font-size": 10 });
      kx += 18 + t.getComputedTextLength() + 12;
    }
    y = bottom + 20;
  }

  // -- each checkpoint's health, in the library's words: a mark a step ------------------
  const health = data.health || [];
  if (health.length === steps.length && health.some(Boolean)) {
    const top = y + 2;
    text(svg, left - 4, top + 9, "health", { "text-anchor": "end", "font-size": 10 });
    const gap = steps.length > 1 ? Math.min(...steps.slice(1).map((s, i) => x(s) - x(steps[i]))) : plotW;
    const side = Math.max(3, Math.min(12, gap - 2));
    steps.forEach((s, i) => {
      const word = health[i];
      const fill = HEALTH_FILLS[word] || HEALTH_FILLS["not yet known"];
      const mark = el("rect", { x: (x(s) - side / 2).toFixed(1), y: top, width: side, height: 10, fill, class: "tinax-timeline-health", "data-health": word || "", "data-step": s }, svg);
      el("title", {}, mark).textContent = `step ${s}: ${word}${(data.health_reason || [])[i] ? ` (${data.health_reason[i]})` : ""}`;
    });
    y = top + 16;
  }

  // -- the step axis, markers and the picks ------------------------------------------
  // Only steps that have a checkpoint are labelled, a label's width apart.
  const widest = Math.max(...steps.map((s) => String(s).length));
  const ticks = tickSteps(steps, x, Math.max(36, 7 * widest + 14));
  for (const s of ticks) {
    text(svg, x(s), y + 10, String(s), { "text-anchor": "middle", class: "tinax-timeline-tick" });
    el("line", { x1: x(s), x2: x(s), y1: y, y2: y - 3, stroke: "#999" }, svg);
  }
  // The axis is named in the left margin, so that the row under it is free for the
  // roll-back step.
  const first = String(steps[0]).length * 3.5;
  text(svg, left - first - 8, y + 10, "step", { "text-anchor": "end" });
  const top0 = panels.length ? panels[0][0] : 0;
  const bottom0 = panels.length ? panels[panels.length - 1][1] : y;
  for (const s of data.nonfinite_steps || []) {
    el("line", { x1: x(s), x2: x(s), y1: top0, y2: bottom0, stroke: "#d62728", "stroke-width": 1, "stroke-opacity": 0.5 }, svg);
  }
  const rollback = data.rollback_step;
  if (finite(rollback)) {
    el("line", { x1: x(rollback), x2: x(rollback), y1: top0, y2: bottom0, stroke: "#2ca02c", "stroke-width": 2, "stroke-dasharray": "4 3" }, svg);
    // Named under the step axis, clear of the marks drawn at the top of the panels.
    const right = x(rollback) > left + plotW * 0.75;
    text(svg, x(rollback) + (right ? -3 : 3), y + 24, `roll back to ${rollback}`, {
      fill: "#2ca02c",
      "text-anchor": right ? "end" : "start",
      class: "tinax-timeline-rollback",
    });
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
    model.send({ kind: "step", step: best, open_only: event.shiftKey });
  });
}

function render({ model, el: root }) {
  root.classList.add("tinax-timeline");
  const redraw = () => draw(model, root);
  model.on("change:data", redraw);
  model.on("change:metrics", redraw);
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
