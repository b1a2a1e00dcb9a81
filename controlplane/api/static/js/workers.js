// The workers section: each live agent's applied and staged version, hit ratio, events sent
// and dropped, last heartbeat; and the hit ratio over time, which this page builds from the
// heartbeats it sees (hits and accesses between two heartbeats), for as long as it is open.
// Beyond as many workers as the chart has styles, it draws the busiest and all pooled.

import { lineChart, PALETTE } from "./charts.js";
import { el, fmtAge, fmtInt, fmtRatio, fmtTime, setText, showError, syncRows } from "./dom.js";

const HISTORY_POINTS = 720; // an hour of 5 s heartbeats
const MIN_SPAN_S = 60; // the time axis spans at least this much, so its ticks stay round
/** Workers charted one by one when there are more than styles: with the pooled line, each
 * drawn line has a colour and dash of its own. */
const CHARTED_ALONE = PALETTE.length - 1;
const history = new Map(); // worker id -> {last: heartbeat, points: [[unix s, ratio]]}
const pooled = []; // [[unix s, ratio]]: every worker's hits over its accesses, per refresh
let pooledIds = ""; // the live workers that `pooled` pools, their ids sorted

function pushCapped(points, point) {
  points.push(point);
  if (points.length > HISTORY_POINTS) points.splice(0, points.length - HISTORY_POINTS);
}

/** Record the hit ratio between this heartbeat and the previous one of the same worker;
 * return the hits and accesses between the two ({at, hits, accesses}), or null. */
function record(agent) {
  let h = history.get(agent.id);
  if (!h) {
    h = { last: null, points: [] };
    history.set(agent.id, h);
  }
  const last = h.last;
  let delta = null;
  if (last && agent.updated_at > last.updated_at) {
    const accesses = agent.accesses - last.accesses;
    if (accesses > 0 && agent.hits >= last.hits) {
      delta = { at: agent.updated_at, hits: agent.hits - last.hits, accesses };
      pushCapped(h.points, [agent.updated_at, delta.hits / accesses]);
    }
  }
  if (!last || agent.updated_at > last.updated_at || agent.started_at !== last.started_at) h.last = agent;
  return delta;
}

/** The pooled line starts again when the live workers change, so that its label's count
 * ("all N workers") is that of the workers every point of it pools. Whether this refresh
 * may add a point: only once each of them has an earlier heartbeat, since one that just
 * joined has no hits and accesses between two yet. Asked before `record`. */
function poolOver(agents) {
  const ids = agents.map((a) => a.id).sort().join("\n");
  if (ids !== pooledIds) pooled.length = 0;
  pooledIds = ids;
  return agents.every((a) => history.get(a.id)?.last);
}

/** The hit ratio of all workers together between the heartbeats one refresh saw. */
function recordPooled(deltas) {
  const accesses = deltas.reduce((n, d) => n + d.accesses, 0);
  if (!(accesses > 0)) return;
  const hits = deltas.reduce((n, d) => n + d.hits, 0);
  pushCapped(pooled, [Math.max(...deltas.map((d) => d.at)), hits / accesses]);
}

function versionCell(cell, version, current) {
  setText(cell, version ?? "—");
  const behind = current !== null && Number.isFinite(version) && version < current;
  cell.classList.toggle("behind", behind);
  cell.title = behind ? `behind: version ${current} is in force` : "";
}

/** The documents a worker refused, and its last reason in words below the count. */
function rejectedCell(cell, agent) {
  const why = agent.rejected > 0 && agent.last_rejection ? agent.last_rejection : "";
  const shown = `${fmtInt(agent.rejected)}\n${why}`;
  if (cell.dataset.shown === shown) return;
  cell.dataset.shown = shown;
  cell.replaceChildren(fmtInt(agent.rejected), ...(why ? [el("span", { class: "reason" }, why)] : []));
}

function renderTable(agents, current) {
  syncRows(
    document.querySelector("#worker-table tbody"),
    agents,
    (a) => a.id,
    (row, a) => {
      setText(row.cells[0], a.id);
      setText(row.cells[1], a.engine);
      setText(row.cells[2], fmtInt(a.capacity));
      versionCell(row.cells[3], a.applied_version, current);
      // Controllers before staged_version existed do not report it.
      versionCell(row.cells[4], "staged_version" in a ? a.staged_version : null, current);
      setText(row.cells[5], fmtRatio(a.hit_ratio));
      setText(row.cells[6], fmtInt(a.events_sent));
      setText(row.cells[7], fmtInt(a.events_dropped));
      row.cells[7].classList.toggle("warn", a.events_dropped > 0);
      rejectedCell(row.cells[8], a);
      setText(row.cells[9], fmtAge(a.updated_at));
      row.cells[9].title = fmtTime(a.updated_at);
    },
  );
}

function clock(unixS) {
  const d = new Date(unixS * 1000);
  const pad = (v) => String(v).padStart(2, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

let lastAgents = [];

/** Every worker's line while there are no more than styles; beyond, the CHARTED_ALONE
 * with the most accesses and a line of all pooled, and a note that says so. */
function chartedSeries(agents) {
  const drawn = agents.filter((a) => history.has(a.id));
  const line = (a) => ({ name: a.id, points: history.get(a.id).points });
  if (drawn.length <= PALETTE.length) return { series: drawn.map(line), note: "" };
  const busiest = drawn.slice().sort((a, b) => b.accesses - a.accesses || a.id.localeCompare(b.id));
  return {
    series: [...busiest.slice(0, CHARTED_ALONE).map(line), { name: `all ${agents.length} workers, pooled`, points: pooled }],
    note: `The ${CHARTED_ALONE} workers with the most accesses, and all ${agents.length} pooled (their hits over their accesses); the table above lists every worker.`,
  };
}

function renderChart(agents) {
  lastAgents = agents;
  const box = document.getElementById("hit-chart");
  const { series, note } = chartedSeries(agents);
  const points = series.reduce((n, s) => n + s.points.length, 0);
  if (points === 0) {
    box.replaceChildren(el("p", { class: "muted" },
      "Hit ratio over time: collecting. This page plots the hit ratio between consecutive heartbeats of each worker while it is open."));
    return;
  }
  const last = series.map((s) => s.points.length ? `${s.name} ${fmtRatio(s.points[s.points.length - 1][1])}` : `${s.name} —`);
  const times = series.flatMap((s) => s.points.map((p) => p[0]));
  const end = Math.max(...times);
  const start = Math.min(Math.min(...times), end - MIN_SPAN_S);
  const figure = lineChart({
    title: "Hit ratio over time (between consecutive heartbeats)",
    summary: `${note ? `${note} ` : ""}Latest: ${last.join(", ")}.`,
    xLabel: "time (local)",
    yLabel: "hit ratio",
    xDomain: [start, end],
    yDomain: [0, 1],
    xFormat: clock,
    // Drawn at the box's width, so its text keeps its size on a phone as on a desktop.
    width: Math.max(300, Math.round(box.clientWidth || 900)),
    height: 260,
    series,
  });
  if (note) figure.append(el("p", { class: "chart-facts" }, note));
  box.replaceChildren(figure);
}

export function renderWorkersSection(results) {
  const { agents, policy } = results;
  showError(document.getElementById("workers-error"), agents.error ? agents.error.message : "");
  if (!("value" in agents)) return; // a stale list is drawn again: its heartbeat ages grow
  const list = agents.value || [];
  const live = new Set(list.map((a) => a.id));
  for (const id of history.keys()) if (!live.has(id)) history.delete(id);
  const pooling = poolOver(list);
  const deltas = list.map(record).filter(Boolean);
  if (pooling) recordPooled(deltas);
  document.getElementById("workers-empty").hidden = list.length > 0;
  renderTable(list, policy.value ? policy.value.version : null);
  renderChart(list);
}

let resizing = null;
window.addEventListener("resize", () => {
  clearTimeout(resizing);
  resizing = setTimeout(() => renderChart(lastAgents), 200); // redrawn at the new width
});
