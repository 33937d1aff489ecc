// The browser half of tinax's table (widgets/_table.py): one page of rows as a plain
// HTML table that fits the width it is given. Python sends the page's rows as text;
// this draws them, fits the columns to the output's width (hiding the secondary ones
// into a detail line when they do not fit, shortening long keys in the middle), and
// sends back clicks: a row picked, a header clicked, a page asked for, a box ticked.
//
// Widths are measured, not guessed: the page is first laid out at its natural width
// (one column as wide as its widest text), then fitted.

const KEY_MIN = 150; // px below which a key column does not shrink
const KEY_SHARE = 0.45; // of the width, that a key may claim before secondary columns
const INDENT = 14; // px per depth of a tree row

// ``text`` shortened in the middle to at most ``width`` px: "['a']['b']…['z']".
function shorten(text, width, measure) {
  if (measure(text) <= width) return text;
  let lo = 1, hi = text.length - 1, best = "…";
  while (lo <= hi) {
    const keep = (lo + hi) >> 1;
    const head = Math.ceil(keep / 2), tail = keep - head;
    const cand = text.slice(0, head) + "…" + (tail ? text.slice(text.length - tail) : "");
    if (measure(cand) <= width) { best = cand; lo = keep + 1; } else { hi = keep - 1; }
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
  const button = (text, label) => {
    const b = document.createElement("button");
    b.textContent = text;
    b.title = label;
    b.setAttribute("aria-label", label);
    return b;
  };
  const prev = button("‹", "previous page");
  const next = button("›", "next page");
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

  const canvas = document.createElement("canvas").getContext("2d");
  let focusSlot = null;

  function header(columns, shown) {
    const sortField = model.get("sort_field");
    const ascending = model.get("ascending");
    const tr = document.createElement("tr");
    columns.forEach((c, i) => {
      if (!shown[i]) return;
      const th = document.createElement("th");
      th.dataset.field = c.field;
      if (c.align === "right") th.className = "tinax-right";
      const sorted = sortField === c.field;
      const arrow = sorted ? (ascending ? " ▲" : " ▼") : "";
      if (model.get("sortable")) {
        const b = document.createElement("button");
        b.className = "tinax-grid-sort";
        b.textContent = c.title + arrow;
        b.title = sorted
          ? `sorted by ${c.title}, ${ascending ? "ascending" : "descending"}: click to reverse`
          : `sort by ${c.title}`;
        b.addEventListener("click", () => send({ kind: "sort", field: c.field }));
        th.append(b);
        th.setAttribute("aria-sort", sorted ? (ascending ? "ascending" : "descending") : "none");
      } else {
        th.textContent = c.title;
      }
      tr.append(th);
    });
    return tr;
  }

  function keyCell(td, r, text, slot) {
    td.classList.add("tinax-key");
    const wrap = document.createElement("span");
    wrap.className = "tinax-key-wrap";
    wrap.style.paddingLeft = `${INDENT * (r.depth || 0)}px`;
    if (r.mark) {
      const m = document.createElement("span");
      m.className = "tinax-mark";
      m.textContent = r.mark;
      m.setAttribute("aria-hidden", "true");
      wrap.append(m);
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
    }
    const label = document.createElement("span");
    label.className = "tinax-key-text";
    label.textContent = text;
    label.title = text;
    wrap.append(label);
    td.append(wrap);
    if (text) {
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
  }

  function body(columns, rows, shown) {
    const hidden = columns.map((c, i) => i).filter((i) => !shown[i]);
    return rows.map((r, slot) => {
      const tr = document.createElement("tr");
      tr.dataset.slot = String(slot);
      if (r.selected) tr.classList.add("tinax-selected");
      if (!r.pickable) tr.classList.add("tinax-unpickable");
      else tr.tabIndex = 0;
      if (r.color) tr.style.color = r.color;
      if (r.background) tr.style.background = r.background;
      const extra = hidden.map((i) => `${columns[i].title}: ${r.cells[i] || "—"}`).join("\n");
      const tips = [r.tip, extra].filter(Boolean).join("\n");
      if (tips) tr.title = tips;
      columns.forEach((c, i) => {
        if (!shown[i]) return;
        const td = document.createElement("td");
        td.dataset.field = c.field;
        const text = r.cells[i] || "";
        if (c.align === "right") td.className = "tinax-right";
        if (c.key) keyCell(td, r, text, slot);
        else td.textContent = text;
        tr.append(td);
      });
      if (r.pickable) {
        const pick = () => send({ kind: "pick", slot });
        tr.addEventListener("click", pick);
        tr.addEventListener("keydown", (e) => {
          if (e.target !== tr) return;
          if (e.key === "Enter" || e.key === " ") { e.preventDefault(); focusSlot = slot; pick(); }
          const to = e.key === "ArrowDown" ? tr.nextElementSibling
            : e.key === "ArrowUp" ? tr.previousElementSibling : null;
          if (to) { e.preventDefault(); to.focus(); }
        });
      }
      return tr;
    });
  }

  function draw() {
    const columns = model.get("spec");
    const rows = model.get("rows");
    const all = columns.map(() => true);
    // 1. Every column at its natural width, to measure it.
    // Measured out of the flow, so that its natural width never widens the output.
    table.style.position = "absolute";
    table.style.visibility = "hidden";
    table.style.tableLayout = "auto";
    table.style.width = "max-content";
    colgroup.replaceChildren();
    thead.replaceChildren(header(columns, all));
    tbody.replaceChildren(...body(columns, rows, all));
    const ths = [...thead.querySelectorAll("th")];
    const natural = ths.map((th) => Math.ceil(th.getBoundingClientRect().width) + 1);
    table.style.position = "";
    table.style.visibility = "";
    const avail = Math.floor(root.clientWidth || el.clientWidth || 0);
    if (!avail) return; // not on the page yet: drawn again when it gets a width
    const keyIndex = columns.findIndex((c) => c.key);
    // A key keeps its whole text before secondary columns keep theirs, up to a share
    // of the width; below that it shrinks (shortened in the middle) to KEY_MIN.
    const wantKey = keyIndex < 0 ? 0
      : Math.min(natural[keyIndex], Math.max(KEY_MIN, Math.floor(avail * KEY_SHARE)));
    const minKey = keyIndex < 0 ? 0 : Math.min(natural[keyIndex], KEY_MIN);
    // 2. Secondary columns give way, highest priority number first, until it fits.
    const shown = columns.map(() => true);
    const need = () => natural.reduce((s, w, i) => s + (shown[i] ? (i === keyIndex ? keyNeed : w) : 0), 0);
    let keyNeed = wantKey;
    const order = columns.map((c, i) => i).filter((i) => !columns[i].essential)
      .sort((a, b) => columns[b].priority - columns[a].priority || b - a);
    for (const i of order) {
      if (need() <= avail) break;
      shown[i] = false;
    }
    if (need() > avail) keyNeed = minKey;
    const widths = natural.slice();
    const fixed = natural.reduce((s, w, i) => s + (shown[i] && i !== keyIndex ? w : 0), 0);
    if (keyIndex >= 0) widths[keyIndex] = Math.max(minKey, Math.min(natural[keyIndex], avail - fixed));
    // 3. Drawn at those widths; keys that are still too long shortened in the middle.
    let keyFont = null;
    const keyText = tbody.querySelector(".tinax-key-text");
    if (keyText) {
      const cs = getComputedStyle(keyText);
      keyFont = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    }
    table.style.tableLayout = "fixed";
    table.style.width = `${widths.reduce((s, w, i) => s + (shown[i] ? w : 0), 0)}px`;
    colgroup.replaceChildren(...columns.filter((c, i) => shown[i]).map((c) => {
      const col = document.createElement("col");
      col.style.width = `${widths[columns.indexOf(c)]}px`;
      return col;
    }));
    thead.replaceChildren(header(columns, shown));
    const trs = body(columns, rows, shown);
    tbody.replaceChildren(...trs);
    if (keyIndex >= 0 && keyFont) {
      canvas.font = keyFont;
      for (const td of tbody.querySelectorAll("td.tinax-key")) {
        let over = td.scrollWidth - td.clientWidth;
        if (over <= 0) continue;
        const label = td.querySelector(".tinax-key-text");
        const text = label.title;
        // The canvas measures in the label's font; its scale is checked against the
        // width the label really has, whatever the font stack resolved to.
        const actual = label.getBoundingClientRect().width;
        const scale = actual / Math.max(1, canvas.measureText(text).width);
        const measure = (t) => canvas.measureText(t).width * scale;
        let room = actual - over - 1;
        for (let tries = 0; over > 0 && tries < 8; tries++) {
          label.textContent = shorten(text, Math.max(16, room), measure);
          label.classList.add("tinax-shortened");
          over = td.scrollWidth - td.clientWidth;
          room -= Math.max(3, over);
        }
      }
    }
    if (focusSlot !== null && trs[focusSlot]) trs[focusSlot].focus();
    focusSlot = null;
    // The columns that did not fit, for the row picked: on a line of their own.
    const hidden = columns.map((c, i) => i).filter((i) => !shown[i]);
    const picked = rows.find((r) => r.selected);
    if (hidden.length && picked) {
      detail.textContent = hidden.map((i) => `${columns[i].title}: ${picked.cells[i] || "—"}`).join(" · ");
      detail.style.display = "";
    } else if (hidden.length && rows.length) {
      detail.textContent = `more (${hidden.map((i) => columns[i].title).join(", ")}): hover a row or pick it`;
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

  let width = -1;
  const observer = new ResizeObserver(() => {
    const w = root.clientWidth;
    if (Math.abs(w - width) > 1) { width = w; draw(); }
  });
  observer.observe(root);
  for (const name of ["rows", "spec", "position", "sort_field", "ascending", "page_count"]) {
    model.on(`change:${name}`, draw);
  }
  // Fonts that arrive late change every width.
  if (document.fonts && document.fonts.ready) document.fonts.ready.then(draw);
  draw();
  return () => observer.disconnect();
}

export default { render };
