// The shadow section: hit ratio against cache capacity per policy, per worker group, from
// GET /v1/shadow (ShadowView in the OpenAPI document), and the refit guard's last verdict.
// A controller that does not serve the route (its OpenAPI document does not list it) gets a
// note instead; an answer in a shape this page does not know is shown raw.

import { servedPaths, api } from "./api.js";
import { lineChart, seriesStyle } from "./charts.js";
import { el, fmtInt, fmtNum, fmtRatio, fmtTime, showError } from "./dom.js";

export const SHADOW_PATH = "/v1/shadow";
let lastKey = null;
let readAt = null; // unix s of the answer the section shows

/** A failed read's error, and when what the section still shows was read. */
function staleError(message) {
  return readAt === null ? message : `${message}; showing the curves read at ${fmtTime(readAt)}`;
}

/** The read not made (the controller is down): its error says so, over the last view. */
export function markShadowStale(error) {
  showError(document.getElementById("shadow-error"), staleError(error.message));
}

function note(...text) {
  return el("p", { class: "muted", id: "shadow-note" }, ...text);
}

/** Groups in the documented shape (docs/dashboard.md), or null when the answer is not. */
export function shadowGroups(body) {
  const groups = body && Array.isArray(body.groups) ? body.groups : null;
  if (!groups) return null;
  const ok = groups.every((g) => g && Number.isFinite(g.capacity) && Array.isArray(g.curves) &&
    g.curves.every((p) => p && typeof p.policy === "string" && Array.isArray(p.points) &&
      p.points.every((q) => q && Number.isFinite(q.capacity) && Number.isFinite(q.hit_ratio))));
  return ok ? groups : null;
}

// The guard's outcome is null until a refit is judged; its reason then says so.
function guardLine(guard) {
  if (!guard || (typeof guard.outcome !== "string" && typeof guard.reason !== "string")) return null;
  return el("p", { id: "shadow-guard", class: guard.outcome === "refused" ? "error" : "muted" },
    `Refit guard: ${guard.reason || guard.outcome}`);
}

/** The capacities the group's curves were measured at (its ladder), smallest first. */
function ladder(group) {
  return [...new Set(group.curves.flatMap((p) => p.points.map((q) => q.capacity)))].sort((a, b) => a - b);
}

function groupTable(group) {
  const capacities = ladder(group);
  const head = el("tr", {}, el("th", { scope: "col" }, "Policy"),
    ...capacities.map((c) => el("th", { scope: "col", class: "num" }, `${fmtInt(c)} blocks`)));
  const rows = group.curves.map((p) => {
    const at = new Map(p.points.map((q) => [q.capacity, q]));
    return el("tr", {}, el("th", { scope: "row" }, p.policy), ...capacities.map((c) => {
      const q = at.get(c);
      // The interval goes on a line of its own, so the table fits a chart's card.
      const ci = q && Number.isFinite(q.ci_low) && Number.isFinite(q.ci_high)
        ? el("span", { class: "ci" }, ` (${fmtRatio(q.ci_low)}–${fmtRatio(q.ci_high)})`) : null;
      return el("td", { class: "num" }, q ? fmtRatio(q.hit_ratio) : "—", ci);
    }));
  });
  return el("details", { "data-group": group.capacity }, el("summary", {}, "Table of these values"),
    el("div", { class: "table-wrap" }, el("table", { class: "shadow-table" }, el("caption", {}, `Shadow hit ratio, workers of capacity ${fmtInt(group.capacity)}`),
      el("thead", {}, head), el("tbody", {}, ...rows))));
}

/** Every policy drawn, in the answer's order (`policies`), then any other a group names:
 * a policy's place here is its colour and dash in every group, one without it included. */
function policyOrder(body, groups) {
  const listed = Array.isArray(body.policies) ? body.policies.filter((p) => typeof p === "string") : [];
  return [...new Set([...listed, ...groups.flatMap((g) => g.curves.map((p) => p.policy))])];
}

/** A hit ratio's axis: from 0 to the highest value or interval drawn, rounded up to 0.05
 * (all of [0, 1] when nothing is above 0), so no band runs out of the chart. */
function hitRatioDomain(group) {
  const highs = group.curves.flatMap((p) => p.points.flatMap((q) => [q.hit_ratio, q.ci_high]));
  const top = Math.max(0, ...highs.filter(Number.isFinite));
  return [0, Math.min(1, Math.ceil(top * 20) / 20) || 1];
}

function groupFigure(group, body, width, order) {
  const steps = ladder(group);
  // A step of the ladder this policy lacks is a gap (null): its line is broken there.
  const series = group.curves.map((p) => {
    const at = new Map(p.points.map((q) => [q.capacity, q]));
    const pts = steps.map((c) => at.get(c) || { capacity: c, hit_ratio: null });
    return {
      ...seriesStyle(order.indexOf(p.policy)),
      name: p.policy,
      points: pts.map((q) => [q.capacity, q.hit_ratio]),
      band: pts.map((q) => [q.capacity, q.ci_low ?? null, q.ci_high ?? null]),
      markers: true,
    };
  });
  const best = group.curves.map((p) => {
    const q = p.points.find((x) => x.capacity === group.capacity);
    return q ? `${p.policy} ${fmtRatio(q.hit_ratio)}` : null;
  }).filter(Boolean);
  const title = `Workers of capacity ${fmtInt(group.capacity)}: hit ratio against capacity`;
  const facts = [
    Array.isArray(group.workers) ? `workers ${group.workers.join(", ")}` : null,
    Number.isFinite(body.window_s) ? `window ${fmtNum(body.window_s)} s` : null,
    Number.isFinite(body.rate) ? `sampling rate ${fmtNum(body.rate)}` : null,
    Number.isFinite(group.accesses_seen) ? `${fmtInt(group.accesses_seen)} accesses seen` : null,
    Number.isFinite(group.sampled_accesses) ? `${fmtInt(group.sampled_accesses)} sampled in the window` : null,
    Number.isInteger(body.policy_version) ? `wa is policy v${body.policy_version}` : null,
    Number.isFinite(group.observed_hit_ratio) && Number.isFinite(group.sampled_observed_hit_ratio)
      ? `the workers' own hit ratio ${fmtRatio(group.observed_hit_ratio)} (sample ${fmtRatio(group.sampled_observed_hit_ratio)})`
      : null,
  ].filter(Boolean).join(" · ");
  const figure = lineChart({
    title,
    summary: `${facts}.${best.length ? ` At the workers' capacity: ${best.join(", ")}.` : ""}`,
    xLabel: "cache capacity (blocks, log)",
    yLabel: "hit ratio",
    xLog: true,
    yDomain: hitRatioDomain(group),
    width,
    height: 260,
    series,
    vlines: Number.isFinite(group.capacity) ? [{ x: group.capacity, label: `the workers' capacity, ${fmtInt(group.capacity)} blocks` }] : [],
  });
  figure.classList.add("card");
  figure.append(el("p", { class: "chart-facts" }, facts));
  if (group.whole_requests === false) {
    figure.append(el("p", { class: "chart-facts", id: "shadow-inexact" },
      "These workers' events do not rebuild into whole requests (an agent that does not report requests whole, as SGLang's, or events lost): the curves are not their traffic's, and the refit guard leaves them out."));
  }
  figure.append(groupTable(group));
  return figure;
}

// The grid's cells: at least 460 px (style.css, .chart-grid.wide), 0.8 rem (12 px) apart,
// as many as there are groups when they fit (auto-fit: one group takes the whole width).
const CELL_MIN = 460;
const GAP = 12;
const CARD_INSET = 18; // a card's padding and border

/** Charts are drawn at most 560 wide, at their cell's width when that is less (a phone),
 * so that their text keeps its size. */
function chartWidth(boxWidth, groups) {
  const columns = Math.max(1, Math.min(groups, Math.floor((boxWidth + GAP) / (CELL_MIN + GAP))));
  const cell = (boxWidth - (columns - 1) * GAP) / columns;
  return Math.round(Math.max(300, Math.min(560, cell - CARD_INSET)));
}

function groupCount(body) {
  return body && Array.isArray(body.groups) ? body.groups.length : 1;
}

/** {served, body} of GET /v1/shadow, or null when a read failed: that says so above the
 * last view, which stays (as every section keeps its last data). */
async function readShadow() {
  const failed = document.getElementById("shadow-error");
  try {
    const served = (await servedPaths()).has(SHADOW_PATH);
    const body = served ? await api.get(SHADOW_PATH) : null;
    showError(failed, "");
    readAt = Date.now() / 1000;
    return { served, body };
  } catch (exc) {
    showError(failed, staleError(exc.message));
    return null;
  }
}

export async function renderShadowSection() {
  const box = document.getElementById("shadow-body");
  const read = await readShadow();
  if (read === null) return;
  const { served, body } = read;
  if (!served) {
    if (lastKey !== "absent") {
      box.replaceChildren(note(`This controller does not serve GET ${SHADOW_PATH}: shadow capacity curves per policy appear here once it does.`));
      lastKey = "absent";
    }
    return;
  }
  const width = chartWidth(box.clientWidth, groupCount(body));
  const key = JSON.stringify(body);
  if (`${width} ${key}` === lastKey) return;
  lastKey = `${width} ${key}`;
  const restore = keepOpenTables(box);
  const groups = shadowGroups(body);
  const guard = guardLine(body && body.guard);
  if (groups === null) {
    box.replaceChildren(note(`GET ${SHADOW_PATH} answered in a shape this dashboard does not know; here it is as sent.`),
      el("pre", { class: "raw" }, key.slice(0, 4000)));
  } else if (body.enabled === false) {
    box.replaceChildren(note("The shadow evaluation is switched off on this controller (KVWISE_SHADOW_ENABLED)."));
  } else if (!groups.length) {
    box.replaceChildren(note("No shadow results yet: no worker with a known capacity has sent traffic."),
      ...(guard ? [guard] : []));
  } else {
    const order = policyOrder(body, groups);
    box.replaceChildren(...(guard ? [guard] : []),
      el("div", { class: "chart-grid wide" }, ...groups.map((g) => groupFigure(g, body, width, order))));
  }
  restore();
}

/** Which groups' tables are open, and which has the focus, before a redraw; what it returns
 * opens and focuses them again after it (the figures are new at every change of figures). */
function keepOpenTables(box) {
  const open = new Set([...box.querySelectorAll("details[open]")].map((d) => d.dataset.group));
  const focused = box.contains(document.activeElement) ? document.activeElement.closest("details") : null;
  const focusedGroup = focused ? focused.dataset.group : null;
  return () => {
    for (const d of box.querySelectorAll("details")) {
      d.open = open.has(d.dataset.group);
      if (d.dataset.group === focusedGroup) d.querySelector("summary").focus();
    }
  };
}
