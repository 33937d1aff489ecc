// The browser half of tinax's table (widgets/_grid.py): one page of rows as a plain
// HTML table that fits the width it is given. Python sends the page's rows as text;
// this draws them, fits the columns to the output's width (hiding the secondary ones
// into a detail line when they do not fit, shortening long keys in the middle), and
// sends back clicks: a row picked, a header clicked, a page asked for, a box ticked.

const PAD = 14; // px of horizontal padding in a cell (CSS: 7 px each side)
const COPY = 22; // px kept in a key cell for its copy button
const INDENT = 14; // px per depth of a tree row
const KEY_MIN_CHARS = 14;

function measurer(el) {
  const canvas = document.createElement("canvas");
  const ctx = canvas.getContext("2d");
  const style = getComputedStyle(el);
  const plain = `${style.fontSize} ${style.fontFamily}`;
  const bold = `bold ${plain}`;
  const mono = `${style.fontSize} var(--jp-code-font-family, monospace)`;
  const cache = new Map();
  return (text, font) => {
    const f = font === "bold" ? bold : font === "mono" ? mono : plain;
    const k = f + "\u0000" + text;
    let v = cache.get(k);
    if (v === undefined) {
      ctx.font = f.replace("var(--jp-code-font-family, monospace)",
        getComputedStyle(el).getPropertyValue("--jp-code-font-family") || "monospace");
      v = ctx.measureText(text).width;
      if (cache.size > 5000) cache.clear();
      cache.set(k, v);
    }
    return v;
  };
}

// ``text`` shortened in the middle to at most ``width`` px: "['a']['b']…['z']".
function shorten(text, width, measure) {
  if (measure(text, "mono") <= width) return text;
  let lo = 1, hi = text.length - 1, best = "…";
  while (lo <= hi) {
    const keep = (lo + hi) >> 1;
    const head = Math.ceil(keep / 2), tail = keep - head;
    const cand = text.slice(0, head) + "…" + (tail ? text.slice(text.length - tail) : "");
    if (measure(cand, "mono") <= width) { best = cand; lo = keep + 1; } else { hi = keep - 1; }
  }
  return best;
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "tinax-grid";
  const scroller = document.createElement("div");
  scroller.className = "tinax-grid-body";
  const table = document.createElement("table");
  const colgroup = document.createElement("colgroup");
  const thead = document.createElement("thead");
  const tbody = document.createElement("tbody");
  table.append(colgroup, thead, tbody);
  scroller.append(table);
  const detail = document.createElement("div");
  detail.className = "tinax-grid-detail";
  const nav = document.createElement("div");
  nav.className = "tinax-grid-nav";
  const prev = document.createElement("button");
  prev.textContent = "‹";
  prev.title = "previous page";
  prev.setAttribute("aria-label", "previous page");
  const next = document.createElement("button");
  next.textContent = "›";
  next.title = "next page";
  next.setAttribute("aria-label", "next page");
  const position = document.createElement("span");
  position.className = "tinax-grid-position";
  const pageBox = document.createElement("input");
  pageBox.type = "number";
  pageBox.min = "1";
  pageBox.title = "go to page";
  pageBox.setAttribute("aria-label", "page");
  nav.append(prev, position, next, pageBox);
  root.append(scroller, detail, nav);
  el.append(root);

  const send = (msg) => model.send(msg);
  prev.addEventListener("click", () => send({ kind: "page", page: model.get("page") - 1 }));
  next.addEventListener("click", () => send({ kind: "page", page: model.get("page") + 1 }));
  pageBox.addEventListener("change", () => {
    const n = parseInt(pageBox.value, 10);
    if (!Number.isNaN(n)) send({ kind: "page", page: n - 1 });
  });

  let measure = null;
  let focusSlot = null;

  function layout() {
    const columns = model.get("spec");
    const rows = model.get("rows");
    if (!measure) measure = measurer(root);
    const avail = Math.max(200, root.clientWidth || el.clientWidth || 600);
    const natural = columns.map((c, i) => {
      let w = measure(c.title, "bold") + PAD + 12; // room for the sort arrow
      for (const r of rows) {
        const t = r.cells[i] || "";
        let x = measure(t, c.key ? "mono" : "plain") + PAD;
        if (c.key) x += COPY + INDENT * (r.depth || 0) + (r.mark ? 16 : 0) + (r.check !== null && r.check !== undefined ? 20 : 0);
        w = Math.max(w, x);
      }
      return Math.ceil(w + 2);
    });
    const keyIndex = columns.findIndex((c) => c.key);
    const minKey = keyIndex < 0 ? 0
      : Math.min(natural[keyIndex], Math.ceil(measure("m".repeat(KEY_MIN_CHARS), "mono") + PAD + COPY));
    // Secondary columns go, lowest priority first, until the essential ones fit.
    const shown = columns.map(() => true);
    const total = () => natural.reduce((s, w, i) => s + (shown[i] ? (i === keyIndex ? minKey : w) : 0), 0);
    const order = columns.map((c, i) => i).filter((i) => !columns[i].essential)
      .sort((a, b) => columns[b].priority - columns[a].priority);
    for (const i of order) {
      if (total() <= avail) break;
      shown[i] = false;
    }
    const fixed = natural.reduce((s, w, i) => s + (shown[i] && i !== keyIndex ? w : 0), 0);
    const widths = natural.slice();
    if (keyIndex >= 0) widths[keyIndex] = Math.max(minKey, Math.min(natural[keyIndex], avail - fixed));
    const tableWidth = widths.reduce((s, w, i) => s + (shown[i] ? w : 0), 0);
    return { columns, rows, shown, widths, keyIndex, tableWidth };
  }

  function draw() {
    const L = layout();
    const { columns, rows, shown, widths, keyIndex } = L;
    const sortField = model.get("sort_field");
    const ascending = model.get("ascending");
    colgroup.replaceChildren(...columns.map((c, i) => {
      const col = document.createElement("col");
      if (!shown[i]) col.style.display = "none";
      col.style.width = `${widths[i]}px`;
      return col;
    }));
    table.style.width = `${L.tableWidth}px`;
    const hr = document.createElement("tr");
    columns.forEach((c, i) => {
      if (!shown[i]) return;
      const th = document.createElement("th");
      th.dataset.field = c.field;
      th.className = c.align === "right" ? "tinax-right" : "";
      const sorted = sortField === c.field;
      const arrow = sorted ? (ascending ? " ▲" : " ▼") : "";
      if (model.get("sortable")) {
        const b = document.createElement("button");
        b.className = "tinax-grid-sort";
        b.textContent = c.title + arrow;
        b.title = sorted ? `sorted by ${c.title}, ${ascending ? "ascending" : "descending"}; click to reverse`
          : `sort by ${c.title}`;
        b.addEventListener("click", () => send({ kind: "sort", field: c.field }));
        th.append(b);
        th.setAttribute("aria-sort", sorted ? (ascending ? "ascending" : "descending") : "none");
      } else {
        th.textContent = c.title;
      }
      hr.append(th);
    });
    thead.replaceChildren(hr);
    const hidden = columns.map((c, i) => i).filter((i) => !shown[i]);
    const trs = rows.map((r, slot) => {
      const tr = document.createElement("tr");
      tr.dataset.slot = String(slot);
      if (r.selected) tr.classList.add("tinax-selected");
      if (!r.pickable) tr.classList.add("tinax-unpickable");
      else tr.tabIndex = 0;
      if (r.color) tr.style.color = r.color;
      if (r.background) tr.style.background = r.background;
      const extra = hidden.map((i) => `${columns[i].title}: ${r.cells[i] || "—"}`).join(" · ");
      const tips = [r.tip, extra].filter(Boolean).join("\n");
      if (tips) tr.title = tips;
      columns.forEach((c, i) => {
        if (!shown[i]) return;
        const td = document.createElement("td");
        td.dataset.field = c.field;
        const text = r.cells[i] || "";
        if (c.align === "right") td.className = "tinax-right";
        if (i === keyIndex) {
          td.classList.add("tinax-key");
          const depth = r.depth || 0;
          let room = widths[i] - PAD - COPY - INDENT * depth;
          const wrap = document.createElement("span");
          wrap.className = "tinax-key-wrap";
          wrap.style.paddingLeft = `${INDENT * depth}px`;
          if (r.mark) {
            const m = document.createElement("span");
            m.className = "tinax-mark";
            m.textContent = r.mark;
            wrap.append(m);
            room -= 16;
          }
          if (r.check !== null && r.check !== undefined) {
            const box = document.createElement("input");
            box.type = "checkbox";
            box.checked = r.check === 1;
            box.indeterminate = r.check === 2;
            box.setAttribute("aria-label", text);
            box.addEventListener("click", (e) => e.stopPropagation());
            box.addEventListener("change", () => send({ kind: "check", slot, value: box.checked }));
            wrap.append(box);
            room -= 20;
          }
          const label = document.createElement("span");
          label.className = "tinax-key-text";
          const short = shorten(text, Math.max(24, room), measure);
          label.textContent = short;
          if (short !== text) {
            label.classList.add("tinax-shortened");
          }
          label.title = text;
          wrap.append(label);
          td.append(wrap);
          if (text && r.copyable !== false) {
            const copy = document.createElement("button");
            copy.className = "tinax-copy";
            copy.textContent = "⧉";
            copy.title = `copy ${text}`;
            copy.setAttribute("aria-label", `copy ${text}`);
            copy.tabIndex = -1;
            copy.addEventListener("click", (e) => {
              e.stopPropagation();
              if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
              copy.textContent = "✓";
              setTimeout(() => { copy.textContent = "⧉"; }, 900);
            });
            td.append(copy);
          }
        } else {
          td.textContent = text;
        }
        tr.append(td);
      });
      if (r.pickable) {
        const pick = () => send({ kind: "pick", slot });
        tr.addEventListener("click", pick);
        tr.addEventListener("keydown", (e) => {
          if (e.key === "Enter" || e.key === " ") { e.preventDefault(); focusSlot = slot; pick(); }
          if (e.key === "ArrowDown" && tr.nextElementSibling) { e.preventDefault(); tr.nextElementSibling.focus(); }
          if (e.key === "ArrowUp" && tr.previousElementSibling) { e.preventDefault(); tr.previousElementSibling.focus(); }
        });
      }
      return tr;
    });
    tbody.replaceChildren(...trs);
    if (focusSlot !== null && trs[focusSlot]) trs[focusSlot].focus();
    focusSlot = null;
    // The columns that did not fit, for the row picked: on a line of their own.
    const picked = rows.find((r) => r.selected);
    if (hidden.length && picked) {
      detail.textContent = hidden.map((i) => `${columns[i].title}: ${picked.cells[i] || "—"}`).join(" · ");
      detail.style.display = "";
    } else if (hidden.length) {
      detail.textContent = `+ ${hidden.map((i) => columns[i].title).join(", ")} (hover a row or pick it)`;
      detail.style.display = "";
    } else {
      detail.style.display = "none";
    }
    position.textContent = model.get("position");
    const page = model.get("page"), pages = model.get("page_count");
    prev.disabled = page <= 0;
    next.disabled = page >= pages - 1;
    pageBox.max = String(pages);
    pageBox.value = String(page + 1);
    const paged = pages > 1;
    prev.style.display = next.style.display = pageBox.style.display = paged ? "" : "none";
  }

  let width = 0;
  const observer = new ResizeObserver(() => {
    const w = root.clientWidth;
    if (w && Math.abs(w - width) > 1) { width = w; draw(); }
  });
  observer.observe(root);
  model.on("change:rows", draw);
  model.on("change:spec", draw);
  model.on("change:position", draw);
  model.on("change:sort_field", draw);
  model.on("change:ascending", draw);
  draw();
  return () => observer.disconnect();
}

export default { render };
