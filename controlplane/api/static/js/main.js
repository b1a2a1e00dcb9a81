// The dashboard's entry: reads the REST API on a timer (never two refreshes at once), hands
// each section what it needs, and keeps the header's health line. One section failing never
// stops the others: each shows its own error and keeps its last good data, redrawn at each
// refresh so that its ages ("published 40 s ago") keep counting while it is stale.

import { ApiError, api, token } from "./api.js";
import { makeActions, renderActions } from "./actions.js";
import { redrawCategories, renderCategoriesSection } from "./categories.js";
import { fmtTime, setText } from "./dom.js";
import { renderPolicySection } from "./policy.js";
import { SHADOW_PATH, markShadowStale, renderShadowSection } from "./shadow.js";
import { renderWorkersSection } from "./workers.js";

const READS = {
  health: "/healthz",
  policy: "/v1/policy",
  versions: "/v1/policy/versions",
  overrides: "/v1/policy/overrides",
  refit: "/v1/policy/refit",
  categories: "/v1/categories",
  agents: "/v1/agents",
};

let timer = null;
let running = null; // the refresh in progress
let queued = null; // the one asked for while it runs
let lastPolicyVersion = null;
let lastLoadedAt = null; // unix s of the last refresh whose every read answered
const lastGood = {}; // read name -> its last answer
const TITLE = document.title;

/** A read's result: {value}; a failed one {error}, with the last good value too. */
function settle(name, outcome) {
  if (outcome.status === "fulfilled") {
    lastGood[name] = outcome.value;
    return { value: outcome.value };
  }
  return name in lastGood ? { error: outcome.reason, value: lastGood[name] } : { error: outcome.reason };
}

/** Whether a failed health probe means the controller is down: no answer (stopped, hung),
 * or a server error (a proxy in front of it answering 502), where every other read would
 * fail the same way. */
function probeSaysDown(probe) {
  const exc = probe.reason;
  return probe.status === "rejected" && exc instanceof ApiError && (exc.status === 0 || exc.status >= 500);
}

/**
 * Every read, the health probe first: a controller that does not answer it (down, or hung),
 * or answers it with a server error, gets no other request until it answers it well, so a
 * stopped controller costs one failed request (one console error) per refresh, not one per
 * read. Resolves to [results, down, the reason it is not ready ("" when ready or down)].
 */
async function readAll() {
  const [probe] = await Promise.allSettled([api.get(READS.health)]);
  const results = { health: settle("health", probe) };
  const names = Object.keys(READS).filter((n) => n !== "health");
  const down = probeSaysDown(probe);
  const notReady = down ? Promise.resolve("") : readiness();
  const settled = down
    ? names.map((n) => ({ status: "rejected", reason: notSent(READS[n], probe.reason) }))
    : await Promise.allSettled(names.map((n) => api.get(READS[n])));
  names.forEach((n, i) => {
    results[n] = settle(n, settled[i]);
  });
  return [results, down, await notReady];
}

/** The error of a read not sent because the controller is down: it names the read, as the
 * section showing it reads it, and the probe's failure (or what it answered) as the reason. */
function notSent(path, probeError) {
  const probe = `GET ${READS.health} ${probeError.status ? `answered HTTP ${probeError.status}` : "failed"}`;
  const reason = `not sent, since ${probe}: ${probeError.reason}`;
  return new ApiError("GET", path, 0, probeError.error, reason, null);
}

/** This refresh's answer of a read, or undefined when it failed (stale values left out). */
function fresh(result) {
  return result.error ? undefined : result.value;
}

async function readiness() {
  try {
    await api.get("/readyz");
    return "";
  } catch (exc) {
    return exc instanceof ApiError && exc.status === 503 ? exc.reason : exc.message;
  }
}

/** A failed health probe in words: no answer (down, hung), or the answer that came (a proxy
 * in front of the controller answering 502, say) with its status and text. */
function healthFailure(exc) {
  if (!(exc instanceof ApiError) || exc.status === 0) return `Controller unreachable: ${exc.message}`;
  return `Controller answered GET ${exc.path} with HTTP ${exc.status}: ${exc.error}: ${exc.reason}`;
}

function renderHealth(results, notReady) {
  const line = document.getElementById("health");
  const h = results.health;
  line.className = "health";
  // The title says it too: a tab in the background shows its title, not the page.
  const state = h.error ? "(down) " : notReady ? "(not ready) " : "";
  document.title = `${state}${TITLE}`;
  if (h.error) {
    line.classList.add("down");
    setText(line, healthFailure(h.error));
    return;
  }
  const parts = [notReady ? `Not ready: ${notReady}` : "Ready", h.value.leader ? "leader replica" : "standby replica"];
  const policy = fresh(results.policy);
  const agents = fresh(results.agents);
  if (policy) parts.push(`policy version ${policy.version}`);
  if (agents) parts.push(`${agents.length} live worker${agents.length === 1 ? "" : "s"}`);
  line.classList.add(notReady ? "down" : "up");
  setText(line, parts.join(" · "));
}

/** When the data was last loaded whole; and that it is stale when this refresh failed. */
function renderUpdated(loaded) {
  const now = Date.now() / 1000;
  if (loaded) lastLoadedAt = now;
  const line = document.getElementById("updated");
  line.classList.toggle("stale", !loaded);
  const failed = `the refresh at ${fmtTime(now).slice(11)} failed`;
  if (loaded) setText(line, `Updated ${fmtTime(lastLoadedAt)}`);
  else if (lastLoadedAt === null) setText(line, `Not loaded: ${failed}`);
  else setText(line, `Updated ${fmtTime(lastLoadedAt)}; stale: ${failed}`);
}

async function refreshOnce() {
  const [results, down, notReady] = await readAll();
  renderHealth(results, notReady);
  if (results.policy.value) lastPolicyVersion = results.policy.value.version;
  const sections = [
    () => renderPolicySection(results, actions),
    () => renderActions(results),
    () => renderWorkersSection(results),
    () => renderCategoriesSection(results),
    // Down, it would ask in vain: its last view stays, said to be stale.
    () => (down ? markShadowStale(notSent(SHADOW_PATH, results.health.error)) : renderShadowSection()),
  ];
  for (const render of sections) {
    try {
      await render();
    } catch (exc) {
      console.warn("dashboard section failed", exc); // a bug here must not stop the rest
    }
  }
  renderUpdated(Object.values(results).every((r) => !r.error));
  document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
}

/**
 * Refresh now, then re-arm the timer. Asked while one runs, it runs once more after that
 * one: however many ask meanwhile (clicks, the timer, an action's outcome), they share
 * that one refresh, and two never overlap.
 */
export function refresh() {
  clearTimeout(timer);
  if (running) {
    const again = () => {
      queued = null;
      return refresh();
    };
    queued ??= running.then(again, again);
    return queued;
  }
  running = refreshOnce().finally(() => {
    running = null;
    schedule();
  });
  return running;
}

function intervalS() {
  return Number(document.getElementById("refresh").value);
}

function schedule() {
  clearTimeout(timer);
  const s = intervalS();
  if (s > 0) timer = setTimeout(refresh, s * 1000);
}

/** The period ?refresh=N asks for: a menu value, or whole seconds from 1 to 3600, added to
 * the menu in its place (a period the menu lacked was ignored without a word). */
function chooseWantedRefresh(select) {
  const wanted = new URLSearchParams(location.search).get("refresh");
  if (wanted === null || !/^[0-9]{1,4}$/.test(wanted)) return;
  const seconds = Number(wanted);
  if (seconds > 3600) return;
  const options = [...select.options];
  const listed = options.find((o) => Number(o.value) === seconds);
  if (!listed) {
    const later = options.find((o) => Number(o.value) > seconds || o.value === "0");
    select.add(new Option(`every ${seconds} s`, String(seconds)), later ?? null);
  }
  select.value = listed?.value ?? String(seconds);
}

function initControls() {
  document.getElementById("controls").addEventListener("submit", (event) => event.preventDefault());
  const select = document.getElementById("refresh");
  chooseWantedRefresh(select);
  select.addEventListener("change", schedule);
  document.getElementById("refresh-now").addEventListener("click", refresh);
  const input = document.getElementById("token");
  input.value = token.get();
  input.addEventListener("input", () => token.set(input.value.trim()));
  let typing = null;
  document.getElementById("cat-filter").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => redrawCategories(lastPolicyVersion), 200);
  });
}

/** Keep --header-h equal to the sticky header's height: sections scroll below it. */
function trackHeaderHeight() {
  const header = document.querySelector("header.top");
  const set = () => document.documentElement.style.setProperty("--header-h", `${header.offsetHeight}px`);
  new ResizeObserver(set).observe(header);
  set();
}

const actions = makeActions(refresh);
initControls();
trackHeaderHeight();
refresh();
