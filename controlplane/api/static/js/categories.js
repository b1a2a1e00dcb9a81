// The categories section: every category in a table, and for the busiest of those the filter
// lets through, the fitted curve p (1 - e^{-a t}) over the empirical life-table CDF of the
// last fit (GET /v1/category?name=NAME: the query names every category, "." and ".." too),
// with the published curve too when an override moves it.

import { api, categoryPaths } from "./api.js";
import { lineChart, PALETTE } from "./charts.js";
import { el, fmtInt, fmtNum, setText, showError, syncRows } from "./dom.js";

export const MAX_CURVES = 12;
const CURVE_MAX_AGE_MS = 15000;
const FETCH_PARALLEL = 4;
/** The curves kept, the latest drawn: enough to go back and forth between a few filters
 * without reading them again, and a bound however many categories the tab goes through. */
export const CURVES_KEPT = 4 * MAX_CURVES;

const curves = new Map(); // name -> {detail, at, version, key}, the least recently drawn first
const reading = new Map(); // "version name" -> the read of that curve in flight, shared
let lastList = [];
let redraws = 0; // redraws begun, the latest the one whose curves are drawn

/** The parameters in force for a category: published when it is, else the last fit's. */
function params(c) {
  return c.published || c.fitted || null;
}

function filtered(list) {
  const needle = document.getElementById("cat-filter").value.trim().toLowerCase();
  const sorted = list.slice().sort((a, b) => (b.samples || 0) - (a.samples || 0) || a.name.localeCompare(b.name));
  return needle ? sorted.filter((c) => c.name.toLowerCase().includes(needle)) : sorted;
}

function renderTable(list) {
  syncRows(
    document.querySelector("#cat-table tbody"),
    list,
    (c) => c.name,
    (row, c) => {
      const p = params(c);
      setText(row.cells[0], c.name);
      setText(row.cells[1], fmtInt(c.samples));
      setText(row.cells[2], c.published ? c.published.source : "fitted, not published");
      setText(row.cells[3], p ? fmtNum(p.p_reuse) : "—");
      setText(row.cells[4], p ? fmtNum(p.rate) : "—");
      setText(row.cells[5], p ? fmtNum(1 / p.rate) : "—");
      setText(row.cells[6], p ? fmtNum(p.life_s) : "—");
      setText(row.cells[7], Number.isFinite(c.fit_quality) ? c.fit_quality.toFixed(3) : "—");
      setText(row.cells[8], c.published_version ?? "—");
    },
  );
}

function curveChart(detail) {
  const cdf = detail.cdf;
  const p = params(detail);
  const series = [];
  let summary = `${detail.name}: ${fmtInt(detail.samples)} samples.`;
  if (cdf && cdf.t_s.length) {
    const t = cdf.t_s;
    series.push({ name: "empirical (life table)", points: t.map((x, i) => [x, cdf.empirical[i]]), markers: true, dash: "2 3", color: PALETTE[1] });
    series.push({ name: "fitted p (1 − e^(−a t))", points: t.map((x, i) => [x, cdf.fitted[i]]), dash: "", color: PALETTE[0] });
    if (detail.published && detail.published.source === "override") {
      const q = detail.published;
      series.push({ name: "published (override)", points: t.map((x) => [x, q.p_reuse * -Math.expm1(-q.rate * x)]), dash: "8 3 2 3", color: PALETTE[2] });
    }
    summary += ` Empirical CDF at ${t.length} points from ${fmtNum(t[0])} s to ${fmtNum(t[t.length - 1])} s`;
    if (Number.isFinite(detail.fit_quality)) summary += `, KS ${detail.fit_quality.toFixed(3)}`;
    summary += ".";
  }
  if (p) summary += ` In force: p ${fmtNum(p.p_reuse)}, a ${fmtNum(p.rate)} per s, life ${fmtNum(p.life_s)} s (${p.source}).`;
  const figure = lineChart({
    title: detail.name,
    summary,
    xLabel: "time since the access (s, log)",
    yLabel: "P(reused by t)",
    xLog: true,
    yDomain: [0, 1],
    width: 340,
    height: 210,
    series,
    vlines: p ? [{ x: p.life_s, label: `life window ${fmtNum(p.life_s)} s` }] : [],
  });
  figure.classList.add("card");
  figure.dataset.category = detail.name;
  const facts = el("p", { class: "chart-facts" },
    `${fmtInt(detail.samples)} samples · KS ${Number.isFinite(detail.fit_quality) ? detail.fit_quality.toFixed(3) : "—"} · life ${p ? fmtNum(p.life_s) : "—"} s · ${p ? p.source : "no parameters"}`);
  if (!series.length) facts.append(el("br"), "No empirical curve yet: the last fit saw no reuse data for it.");
  figure.append(facts);
  return figure;
}

async function fetchCurves(names, version) {
  const now = Date.now();
  const due = names.filter((n) => {
    const c = curves.get(n);
    return !c || c.version !== version || now - c.at > CURVE_MAX_AGE_MS;
  });
  const queue = due.slice();
  const errors = [];
  async function worker() {
    while (queue.length) {
      const name = queue.shift();
      try {
        await readCurve(name, version);
      } catch (exc) {
        errors.push(exc.message);
      }
    }
  }
  await Promise.all(Array.from({ length: FETCH_PARALLEL }, worker));
  keepLatest(names);
  return errors;
}

/** Read one curve into the cache. A redraw that wants a curve another is reading (the
 * filter typed during a refresh) waits for that read instead of sending its own. */
function readCurve(name, version) {
  const readKey = `${version} ${name}`;
  if (!reading.has(readKey)) {
    const read = api.get(categoryPaths.detail(name)).then((detail) => {
      curves.set(name, { detail, at: Date.now(), version, key: JSON.stringify(detail) });
    });
    reading.set(readKey, read.finally(() => reading.delete(readKey)));
  }
  return reading.get(readKey);
}

/** `names` made the latest drawn, then the least recently drawn let go beyond CURVES_KEPT. */
function keepLatest(names) {
  for (const name of names) {
    const c = curves.get(name);
    if (!c) continue;
    curves.delete(name);
    curves.set(name, c);
  }
  for (const name of curves.keys()) {
    if (curves.size <= CURVES_KEPT) break;
    curves.delete(name);
  }
}

function renderCharts(names) {
  const grid = document.getElementById("cat-charts");
  const keep = new Map([...grid.children].map((fig) => [fig.dataset.category, fig]));
  const figures = [];
  for (const name of names) {
    const c = curves.get(name);
    if (!c) continue;
    const old = keep.get(name);
    if (old && old.dataset.key === c.key) {
      figures.push(old);
      continue;
    }
    const fig = curveChart(c.detail);
    fig.dataset.key = c.key;
    figures.push(fig);
  }
  grid.replaceChildren(...figures);
}

function renderCount(shown, total) {
  const listed = `${fmtInt(shown)} of ${fmtInt(total)} categories listed`;
  const curves = `curves of the ${fmtInt(Math.min(shown, MAX_CURVES))} with most samples` +
    (shown > MAX_CURVES ? " (filter to see others)" : "");
  setText(document.getElementById("cat-count"),
    total === 0 ? "No category yet: the first fit lists them."
      : shown === 0 ? `${listed}: none matches the filter.` : `${listed}; ${curves}`);
}

/**
 * Redraw from the last list (after the filter changed). The curves are drawn only if no
 * redraw began while they were fetched: a later one (the filter typed meanwhile) draws
 * its own, which an earlier one ending after it must not draw over.
 */
export async function redrawCategories(version) {
  const drawing = ++redraws;
  const list = filtered(lastList);
  renderTable(list);
  renderCount(list.length, lastList.length);
  const names = list.slice(0, MAX_CURVES).map((c) => c.name);
  const errors = await fetchCurves(names, version);
  if (drawing === redraws) renderCharts(names);
  return errors;
}

export async function renderCategoriesSection(results) {
  const box = document.getElementById("categories-error");
  if (results.categories.error) {
    showError(box, results.categories.error.message);
    return;
  }
  lastList = results.categories.value || [];
  const names = document.getElementById("category-names");
  const options = lastList.map((c) => c.name).sort();
  if (names.children.length !== options.length || [...names.children].some((o, i) => o.value !== options[i])) {
    names.replaceChildren(...options.map((n) => el("option", { value: n })));
  }
  const version = results.policy.value ? results.policy.value.version : null;
  const errors = await redrawCategories(version);
  showError(box, errors.length ? errors[0] : "");
}
