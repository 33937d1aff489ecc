// The browser half of tinax's table (widgets/_table.py): one page of rows as a plain
// HTML table that fits the width it is given. Python sends the page's rows as text;
// this draws them, fits the columns to the output's width (hiding first the columns
// that say nothing about the rows in view, then the secondary ones, into a detail
// line), picks for a key column the longest of the label sets Python offers whose
// every label fits (each set keeps the rows in view distinct), and sends back clicks:
// a row picked, a header clicked, a page asked for, a box ticked. Hover and copy give
// a key's exact text.
//
// Widths are measured, not guessed: the page is first laid out at its natural width
// (one column as wide as its widest text), then fitted.

const KEY_MIN = 150; // px below which a key column does not shrink
const KEY_SHARE = 0.45; // of the width, that a key may claim before secondary columns
const INDENT = 14; // px per depth of a tree row
const SVG = "http://www.w3.org/2000/svg";
const SILENT = 2; // a column that says nothing about the rows in view (widgets/_table.py)
const UNIFORM = 1; // one value in every row in view

// Two overlapping sheets, drawn rather than a glyph that not every font has.
function copyIcon() {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("width", "12");
  svg.setAttribute("height", "12");
  svg.setAttribute("aria-hidden", "true");
  for (const [x, y] of [[5, 1], [1, 5]]) {
    const r = document.createElementNS(SVG, "rect");
    r.setAttribute("x", String(x));
    r.setAttribute("y", String(y));
    r.setAttribute("width", "10");
    r.setAttribute("height", "10");
    r.setAttribute("rx", "1.5");
    r.setAttribute("fill", x === 1 ? "var(--jp-layout-color0, #fff)" : "none");
    r.setAttribute("stroke", "currentColor");
    r.setAttribute("stroke-width", "1.5");
    svg.append(r);
  }
  return svg;
}

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
  const goTo = () => {
    const n = parseInt(pageBox.value, 10);
    if (!Number.isNaN(n) && n - 1 !== model.get("page")) send({ kind: "page", page: n - 1 });
  };
  pageBox.addEventListener("change", goTo);
  pageBox.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); goTo(); } });

  const canvas = document.createElement("canvas").getContext("2d");
  let focusSlot = null;
  let revealed = 0;
  // A column that says nothing is not offered on hover or in the detail line either.
  const silent = (i) => (model.get("quiet") || [])[i] === SILENT;

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
      const prefix = c.key ? model.get("key_prefix") : "";
      const withPrefix = (node) => {
        if (!prefix) return;
        const p = document.createElement("span");
        p.className = "tinax-key-prefix";
        p.textContent = ` in ${prefix}`;
        p.title = `every key shown is in ${prefix}`;
        node.append(p);
      };
      if (model.get("sortable")) {
        const b = document.createElement("button");
        b.className = "tinax-grid-sort";
        b.textContent = c.title + arrow;
        b.title = sorted
          ? `sorted by ${c.title}, ${ascending ? "ascending" : "descending"}: click to reverse`
          : `sort by ${c.title}`;
        b.addEventListener("click", () => send({ kind: "sort", field: c.field }));
        th.append(b);
        withPrefix(th);
        th.setAttribute("aria-sort", sorted ? (ascending ? "ascending" : "descending") : "none");
      } else {
        th.textContent = c.title;
        withPrefix(th);
      }
      tr.append(th);
    });
    return tr;
  }

  function keyCell(td, r, text, slot) {
    const exact = r.exact || text;
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
    label.title = exact;
    label.dataset.exact = exact;
    wrap.append(label);
    td.append(wrap);
    if (exact) {
      const copy = document.createElement("button");
      copy.className = "tinax-copy";
      // A zero-width space keeps the row's text "blocks 384…" apart, as a glyph did.
      copy.append(copyIcon(), "\u200b");
      copy.title = `copy ${exact}`;
      copy.setAttribute("aria-label", `copy ${exact}`);
      copy.tabIndex = -1;
      copy.addEventListener("click", (e) => {
        e.stopPropagation();
        if (navigator.clipboard) navigator.clipboard.writeText(exact).catch(() => {});
        copy.replaceChildren("✓");
        setTimeout(() => { copy.replaceChildren(copyIcon(), "\u200b"); }, 900);
      });
      td.append(copy);
    }
  }

  function body(columns, rows, shown) {
    const hidden = columns.map((c, i) => i).filter((i) => !shown[i] && !silent(i));
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
    // A table that scrolls within itself keeps room for its scroll bar.
    scroller.classList.toggle("tinax-grid-scrollable", model.get("scroll_rows") > 0);
    const avail = Math.floor(scroller.clientWidth || root.clientWidth || el.clientWidth || 0);
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
    // Columns that say nothing about the rows in view (2) are not shown; those with
    // one value in every row (1) give way first, then the secondary ones, highest
    // priority number first.
    const quiet = model.get("quiet") || [];
    columns.forEach((c, i) => {
      // A secondary column with one value in every row says it once, under the table.
      if (!c.key && (quiet[i] === SILENT || (quiet[i] === UNIFORM && !c.essential))) shown[i] = false;
    });
    const byPriority = (a, b) => columns[b].priority - columns[a].priority || b - a;
    const order = [
      ...columns.map((c, i) => i).filter((i) => quiet[i] === UNIFORM && !columns[i].key).sort(byPriority),
      ...columns.map((c, i) => i).filter((i) => !quiet[i] && !columns[i].essential).sort(byPriority),
    ];
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
    if (keyIndex >= 0) {
      const tds = [...tbody.querySelectorAll("td.tinax-key")];
      const over = () => tds.some((td) => td.scrollWidth > td.clientWidth);
      const levels = Math.max(0, ...rows.map((r) => (r.labels || []).length));
      // The longest set of labels whose every label fits: one set for all rows, so
      // that the rows in view never read alike.
      for (let level = 1; level < levels && over(); level++) {
        tds.forEach((td, slot) => {
          const label = td.querySelector(".tinax-key-text");
          const text = (rows[slot].labels || [])[level];
          if (text !== undefined && label.textContent !== text) {
            label.textContent = text;
            label.classList.add("tinax-shortened");
          }
        });
      }
      if (keyFont && over()) {
        // Narrower than the shortest set: cut in the middle, as a last resort.
        canvas.font = keyFont;
        for (const td of tds) {
          let overBy = td.scrollWidth - td.clientWidth;
          if (overBy <= 0) continue;
          const label = td.querySelector(".tinax-key-text");
          const text = label.textContent;
          const actual = label.getBoundingClientRect().width;
          const scale = actual / Math.max(1, canvas.measureText(text).width);
          const measure = (t) => canvas.measureText(t).width * scale;
          let room = actual - overBy - 1;
          for (let tries = 0; overBy > 0 && tries < 8; tries++) {
            label.textContent = shorten(text, Math.max(16, room), measure);
            label.classList.add("tinax-shortened");
            overBy = td.scrollWidth - td.clientWidth;
            room -= Math.max(3, overBy);
          }
        }
      }
    }
    const limit = model.get("scroll_rows");
    if (limit > 0 && trs.length > limit) {
      const rowHeight = trs[0].getBoundingClientRect().height || 22;
      const headHeight = thead.getBoundingClientRect().height || rowHeight;
      scroller.style.maxHeight = `${Math.ceil(headHeight + rowHeight * limit)}px`;
      scroller.classList.add("tinax-grid-scrolling");
    } else {
      scroller.style.maxHeight = "";
      scroller.classList.remove("tinax-grid-scrolling");
    }
    const [revealSlot, asked] = model.get("reveal") || [-1, 0];
    if (asked !== revealed && trs[revealSlot]) {
      revealed = asked;
      const row = trs[revealSlot];
      const top = row.offsetTop - thead.getBoundingClientRect().height;
      if (top < scroller.scrollTop || row.offsetTop + row.offsetHeight > scroller.scrollTop + scroller.clientHeight) {
        scroller.scrollTop = Math.max(0, top);
      }
    }
    if (focusSlot !== null && trs[focusSlot]) trs[focusSlot].focus();
    focusSlot = null;
    // The columns that did not fit, for the row picked, on a line of their own; those
    // with one value in every row say it there.
    const hidden = columns.map((c, i) => i).filter((i) => !shown[i] && !silent(i));
    const same = hidden.filter((i) => quiet[i] === UNIFORM && rows.length);
    const varied = hidden.filter((i) => !same.includes(i));
    const picked = rows.find((r) => r.selected);
    const parts = [];
    if (same.length) {
      parts.push(`every row: ${same.map((i) => `${columns[i].title} ${rows[0].cells[i]}`).join(", ")}`);
    }
    if (varied.length && picked) {
      parts.push(varied.map((i) => `${columns[i].title}: ${picked.cells[i] || "—"}`).join(" · "));
    } else if (varied.length && rows.length) {
      parts.push(`more (${varied.map((i) => columns[i].title).join(", ")}): hover a row or pick it`);
    }
    detail.textContent = parts.join(" · ");
    detail.style.display = parts.length ? "" : "none";
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
  for (const name of ["rows", "spec", "position", "sort_field", "ascending", "page_count", "quiet", "key_prefix", "scroll_rows", "reveal"]) {
    model.on(`change:${name}`, draw);
  }
  // Fonts that arrive late change every width.
  if (document.fonts && document.fonts.ready) document.fonts.ready.then(draw);
  draw();
  return () => observer.disconnect();
}

export default { render };
