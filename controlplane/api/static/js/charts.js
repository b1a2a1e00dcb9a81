// Line charts in SVG, drawn from data: round ticks, linear or log x, optional confidence
// bands and vertical markers, a legend in HTML (readable by screen readers, never colour
// alone: every series also has its own dash or markers). No library.

const NS = "http://www.w3.org/2000/svg";

// Five Okabe–Ito colours (their orange, sky blue and yellow are under 3:1 against white),
// then a violet and a dark brown: every two stay apart in normal vision and with protanopia,
// deuteranopia or tritanopia (tests/e2e/test_dashboard_scripted_states.py), each at least
// 3:1 against white.
export const PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#8800FF", "#663311", "#000000"];
const DASHES = ["", "6 3", "2 3", "8 3 2 3", "1 2", "10 4", "4 4"];

let chartCount = 0;

/** The colour and dash of the `i`-th series: a caller that draws one name in several charts
 * passes the same `i` for it in each (a series' own color and dash win). */
export function seriesStyle(i) {
  return { color: PALETTE[i % PALETTE.length], dash: DASHES[i % DASHES.length] };
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

/** Round tick values covering [lo, hi], about `count` of them (1, 2 or 5 x 10^k apart). */
export function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const f = raw / mag;
  const step = mag * (f >= 7.5 ? 10 : f >= 3.5 ? 5 : f >= 1.5 ? 2 : 1);
  const ticks = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

/** Powers of ten within [lo, hi]; with 1, 2 and 5 times them when that gives too few. */
export function logTicks(lo, hi) {
  for (const steps of [[1], [1, 2, 5]]) {
    const ticks = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
      for (const k of steps) {
        const v = k * 10 ** e;
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) ticks.push(v);
      }
    }
    if (ticks.length >= 3) return ticks;
  }
  return [lo, hi];
}

export function tickLabel(v) {
  if (v === 0) return "0";
  const abs = Math.abs(v);
  if (abs >= 1e4 || abs < 1e-2) {
    const e = Math.round(Math.log10(abs));
    if (Math.abs(abs - 10 ** e) < 1e-9 * abs) return `1e${e}`;
    return v.toExponential(1);
  }
  return Number(v.toPrecision(3)).toString();
}

function drawable([x, y], positiveX) {
  return Number.isFinite(x) && Number.isFinite(y) && (!positiveX || x > 0);
}

function finitePairs(points, positiveX) {
  return points.filter((p) => drawable(p, positiveX));
}

/** The runs of entries that `ok` accepts, split where one is not (a point without a value:
 * a step missing), so that a line or band stops there instead of bridging the gap. */
function runs(entries, ok) {
  const out = [[]];
  for (const e of entries) {
    if (ok(e)) out[out.length - 1].push(e);
    else if (out[out.length - 1].length) out.push([]);
  }
  return out.filter((r) => r.length);
}

function domain(values, fallback) {
  const finite = values.filter(Number.isFinite);
  if (!finite.length) return fallback;
  let lo = Math.min(...finite);
  let hi = Math.max(...finite);
  if (lo === hi) {
    const pad = lo === 0 ? 1 : Math.abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  return [lo, hi];
}

/**
 * A chart in a <figure>. spec: {title, summary (the text alternative), xLabel, yLabel,
 * xLog, xDomain, yDomain, xFormat, width, height, series: [{name, points: [[x, y]], band: [[x, lo, hi]],
 * markers, color, dash}], vlines: [{x, label}]}. A point or band entry with a value that is
 * not a number (null) is a gap: the line and band are broken there.
 */
export function lineChart(spec) {
  const id = `chart-${++chartCount}`;
  const W = spec.width || 480;
  const H = spec.height || 260;
  const m = { left: 52, right: 14, top: 12, bottom: 40 };
  const all = spec.series.map((s) => finitePairs(s.points, spec.xLog));
  const xs = all.flat().map((p) => p[0]).concat((spec.vlines || []).map((v) => v.x));
  const bandYs = spec.series.flatMap((s) => (s.band || []).flatMap(([, lo, hi]) => [lo, hi]));
  const ys = all.flat().map((p) => p[1]).concat(bandYs); // a band stays inside the frame
  const positiveXs = xs.filter((x) => !spec.xLog || x > 0);
  let [x0, x1] = spec.xDomain || domain(positiveXs, spec.xLog ? [0.1, 10] : [0, 1]);
  if (spec.xLog && x0 <= 0) x0 = x1 / 1000;
  const [y0, y1] = spec.yDomain || domain(ys.concat([0]), [0, 1]);
  const px = (x) => {
    const f = spec.xLog
      ? (Math.log10(x) - Math.log10(x0)) / (Math.log10(x1) - Math.log10(x0) || 1)
      : (x - x0) / (x1 - x0 || 1);
    return m.left + f * (W - m.left - m.right);
  };
  const py = (y) => H - m.bottom - ((y - y0) / (y1 - y0 || 1)) * (H - m.top - m.bottom);

  const root = svg("svg", {
    viewBox: `0 0 ${W} ${H}`,
    role: "img",
    "aria-labelledby": `${id}-title ${id}-desc`,
    class: "chart-svg",
  });
  root.append(svg("title", { id: `${id}-title` }, spec.title), svg("desc", { id: `${id}-desc` }, spec.summary || ""));
  root.append(axes(spec, { W, H, m, x0, x1, y0, y1, px, py }));
  for (const v of spec.vlines || []) {
    if (!Number.isFinite(v.x) || v.x < x0 || v.x > x1) continue;
    const line = svg("line", { x1: px(v.x), x2: px(v.x), y1: m.top, y2: H - m.bottom, class: "vline" });
    line.append(svg("title", {}, v.label));
    root.append(line);
  }
  spec.series.forEach((s, i) => root.append(seriesPath(s, runs(s.points, (p) => drawable(p, spec.xLog)), i, px, py)));

  const legend = document.createElement("ul");
  legend.className = "legend";
  spec.series.forEach((s, i) => {
    const item = document.createElement("li");
    const key = svg("svg", { width: 26, height: 10, "aria-hidden": "true", focusable: "false" });
    key.append(svg("line", {
      x1: 1, x2: 25, y1: 5, y2: 5,
      stroke: s.color || seriesStyle(i).color,
      "stroke-width": 2.5,
      "stroke-dasharray": s.dash ?? seriesStyle(i).dash,
    }));
    item.append(key, document.createTextNode(` ${s.name}`));
    legend.append(item);
  });
  const figure = document.createElement("figure");
  figure.className = "chart";
  const caption = document.createElement("figcaption");
  caption.textContent = spec.title;
  figure.append(caption, root, legend);
  return figure;
}

function axes(spec, g) {
  const { W, H, m, x0, x1, y0, y1, px, py } = g;
  const group = svg("g", { class: "axes", "aria-hidden": "true" });
  const fmt = spec.xFormat || tickLabel;
  const xt = spec.xLog ? logTicks(x0, x1) : niceTicks(x0, x1, Math.max(2, Math.round(W / 90)));
  for (const t of xt) {
    group.append(svg("line", { x1: px(t), x2: px(t), y1: m.top, y2: H - m.bottom, class: "grid" }));
    // A label centred on a tick near the right edge would run out of the drawing ("13:35:3"):
    // it ends at the tick instead (about 3.5 px a character at 11 px on each side of centre).
    const label = fmt(t);
    const anchor = px(t) + label.length * 3.5 > W ? "end" : "middle";
    group.append(svg("text", { x: px(t), y: H - m.bottom + 14, "text-anchor": anchor }, label));
  }
  for (const t of niceTicks(y0, y1, 4)) {
    group.append(svg("line", { x1: m.left, x2: W - m.right, y1: py(t), y2: py(t), class: "grid" }));
    group.append(svg("text", { x: m.left - 6, y: py(t) + 4, "text-anchor": "end" }, tickLabel(t)));
  }
  group.append(svg("rect", {
    x: m.left, y: m.top, width: W - m.left - m.right, height: H - m.top - m.bottom, class: "frame",
  }));
  group.append(svg("text", { x: (m.left + W - m.right) / 2, y: H - 6, "text-anchor": "middle", class: "label" }, spec.xLabel || ""));
  group.append(svg("text", {
    x: 12, y: (m.top + H - m.bottom) / 2, "text-anchor": "middle", class: "label",
    transform: `rotate(-90 12 ${(m.top + H - m.bottom) / 2})`,
  }, spec.yLabel || ""));
  return group;
}

/** One series: its band, its line (one path, a move at each run's start) and its dots
 * (every point when it has markers, else those of runs of one point, which no line shows). */
function seriesPath(s, lineRuns, i, px, py) {
  const color = s.color || seriesStyle(i).color;
  const group = svg("g", { class: "series" });
  for (const band of runs(s.band || [], (b) => b.every(Number.isFinite)).filter((r) => r.length > 1)) {
    const upper = band.map(([x, , hi]) => `${px(x)},${py(hi)}`);
    const lower = band.slice().reverse().map(([x, lo]) => `${px(x)},${py(lo)}`);
    group.append(svg("polygon", { points: upper.concat(lower).join(" "), fill: color, "fill-opacity": 0.15 }));
  }
  const lines = lineRuns.filter((r) => r.length > 1);
  if (lines.length) {
    const d = lines.map((r) => r.map(([x, y], k) => `${k ? "L" : "M"}${px(x).toFixed(1)},${py(y).toFixed(1)}`).join("")).join("");
    group.append(svg("path", {
      d, fill: "none", stroke: color, "stroke-width": 2,
      "stroke-dasharray": s.dash ?? seriesStyle(i).dash, "stroke-linejoin": "round",
    }));
  }
  for (const [x, y] of lineRuns.filter((r) => s.markers || r.length === 1).flat()) {
    const dot = svg("circle", { cx: px(x), cy: py(y), r: 2.6, fill: color });
    dot.append(svg("title", {}, `${s.name}: ${tickLabel(x)}, ${Number(y.toPrecision(4))}`));
    group.append(dot);
  }
  return group;
}
