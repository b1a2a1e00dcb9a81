// DOM helpers of the dashboard: element building, number and time formats, and tables
// updated in place (rows keyed, so a focused button survives a refresh). Text from the API
// only ever goes in as text, never as markup.

/** An element with attributes (or properties: on* handlers, hidden, disabled) and children. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

/** Show an error box with the message, or hide it. */
export function showError(box, message) {
  box.hidden = !message;
  setText(box, message || "");
}

const NO_VALUE = "—";

export function fmtInt(n) {
  return Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : NO_VALUE;
}

/** A number with `digits` significant digits, plain for mid-sized values. */
export function fmtNum(n, digits = 3) {
  if (!Number.isFinite(n)) return NO_VALUE;
  const abs = Math.abs(n);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return n.toExponential(digits - 1);
  return Number(n.toPrecision(digits)).toString();
}

export function fmtRatio(n) {
  return Number.isFinite(n) ? n.toFixed(4) : NO_VALUE;
}

/** Unix seconds as local date and time, to the second. */
export function fmtTime(unixS) {
  if (!Number.isFinite(unixS) || unixS <= 0) return NO_VALUE;
  const d = new Date(unixS * 1000);
  const pad = (v) => String(v).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** How long ago `unixS` was, in the largest whole unit. */
export function fmtAge(unixS, nowS = Date.now() / 1000) {
  if (!Number.isFinite(unixS) || unixS <= 0) return NO_VALUE;
  const s = Math.max(0, nowS - unixS);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

/**
 * Make `tbody` hold one row per item, in order. `key(item)` names a row; a new row has a
 * cell per column of the table's head (`emptyRowFor`), and `furnish(row, item)` adds what
 * it keeps (buttons); `fill(row, item)` updates it. Rows of keys no longer listed go away;
 * the others are kept, so whatever has focus in them keeps it.
 */
export function syncRows(tbody, items, key, fill, furnish = () => {}) {
  const existing = new Map();
  for (const row of tbody.rows) existing.set(row.dataset.key, row);
  const wanted = new Set();
  let previous = null;
  for (const item of items) {
    const k = String(key(item));
    wanted.add(k);
    let row = existing.get(k);
    if (!row) {
      row = emptyRowFor(tbody);
      furnish(row, item);
      row.dataset.key = k;
    }
    fill(row, item);
    const next = previous ? previous.nextSibling : tbody.firstChild;
    if (row !== next) tbody.insertBefore(row, next);
    previous = row;
  }
  for (const [k, row] of existing) if (!wanted.has(k)) row.remove();
}

/**
 * A row of empty cells shaped by the head of `tbody`'s table: one per column, a row header
 * first, right-aligned where the column's header is (`num`).
 */
export function emptyRowFor(tbody) {
  const columns = Array.from(tbody.closest("table").tHead.rows[0].cells);
  return el("tr", {}, ...columns.map((column, i) => el(i === 0 ? "th" : "td", {
    class: column.classList.contains("num") ? "num" : undefined,
    scope: i === 0 ? "row" : undefined,
  })));
}
