// The actions: override a category, remove an override, roll back, refit now. Each asks for
// confirmation in a modal dialog, sends one REST call with the bearer token, and shows the
// outcome: the new version, or the API's error exactly as it answered.

import { api, ApiError, categoryPaths, change } from "./api.js";
import { el, fmtAge, fmtNum, fmtTime } from "./dom.js";

const OVERRIDE_FIELDS = [["ov-p", "p_reuse", "p"], ["ov-rate", "rate", "a"], ["ov-life", "life_s", "Life window"]];
// A decimal number as people type it in a program (a point, an optional exponent). The
// fields are text, not type=number: Chromium drops a typed comma there ("0,5" reads "05").
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

// What the last refresh said: the version in force and the kept ones (by number), for the
// dialogs to say what an action will do.
const known = { current: null, versions: new Map(), categories: null };
// Whether the operator picked the roll-back version: until then it follows the newest kept.
let rollbackPicked = false;
// The action sent and not answered yet (its question), or null: one at a time, so that a
// second click while a refit fits (or a rollback waits on a slow controller) sends nothing.
let waiting = null;

/** Ask in the modal dialog; resolves true only when the operator confirms. */
export function confirmAction(title, body, okLabel) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-body").textContent = body;
  document.getElementById("confirm-ok").textContent = okLabel;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    document.getElementById("confirm-cancel").focus(); // the safe choice has the focus
  });
}

function showResult(ok, ...content) {
  const box = document.getElementById("action-result");
  box.className = `result ${ok ? "ok" : "failed"}`;
  box.replaceChildren(...content);
  box.focus();
}

function showApiError(exc) {
  if (!(exc instanceof ApiError)) {
    showResult(false, String(exc));
    return;
  }
  const head = `${exc.method} ${exc.path} failed: ` + (exc.status ? `HTTP ${exc.status}` : "no answer");
  showResult(false,
    el("strong", {}, head), el("br"),
    el("code", { class: "api-error" }, exc.error), ": ", el("span", { class: "api-reason" }, exc.reason));
}

/**
 * Run one confirmed mutation: `send()` returns the API's answer, `describe(answer)` the
 * success text. `after()` (a refresh) runs whatever the outcome. Asked while another
 * waits for its answer, it says so and sends nothing.
 */
async function run(question, send, describe, after) {
  const [title, body, okLabel] = question;
  if (waiting !== null) {
    showResult(false, `Nothing was sent: “${waiting}” has not answered yet; its outcome shows here.`);
    return;
  }
  if (!(await confirmAction(title, body, okLabel))) {
    showResult(true, `${title}: cancelled, nothing was sent.`);
    return;
  }
  waiting = title.replace(/\?$/, "");
  try {
    const answer = await send();
    showResult(true, describe(answer));
  } catch (exc) {
    showApiError(exc);
  } finally {
    waiting = null;
  }
  await after();
}

function rollbackText(version, hold) {
  const v = known.versions.get(version);
  const which = v ? `version ${version} (published ${fmtTime(v.created_at)}, ${fmtAge(v.created_at)}: ${v.note})` : `version ${version}`;
  return (known.current !== null ? `Version ${known.current} is in force now. ` : "") +
    `A new version is published with the parameters of ${which}, and every override is cleared.` +
    (hold ? " Automatic refits stop publishing until “Refit now”." : "");
}

// A category the document in force does not name is pinned ahead of its first fit (the
// API accepts it: pre-pinning may be meant), but a typo must not pass unnoticed.
function overrideQuestion(category, values) {
  const pinned = Object.entries(values).map(([k, v]) => `${k} = ${fmtNum(v, 6)}`).join(", ") || "no values";
  const unknown = known.categories !== null && !known.categories.has(category);
  const title = unknown ? `Override ${category}, which is not a known category?` : `Override ${category}?`;
  const body = `A new version is published with ${pinned} for ${category}; ` + (unknown
    ? `version ${known.current} in force has no category of that name, so the other values ` +
      "come from its defaults and the pin waits for workers to use the name. Check the spelling."
    : "the other values keep their fit.");
  return [title, body, "Publish override"];
}

function published({ doc, published: isNew }) {
  if (!isNew) return `Nothing to change: version ${doc.version} stays in force (${doc.note}).`;
  return `Published version ${doc.version}: ${doc.note}. Workers apply it at their next poll.`;
}

export function makeActions(afterChange) {
  const actions = {
    rollback: (version, hold = false) => run(
      [`Roll back to version ${version}?`, rollbackText(version, hold), "Roll back"],
      () => change("POST", "/v1/policy/rollback", { version, hold }),
      published, afterChange),
    removeOverride: (category) => run(
      [`Remove the override of ${category}?`,
        `A new version is published with ${category}'s fitted values.`, "Remove override"],
      () => change("DELETE", categoryPaths.override(category)),
      published, afterChange),
    override: (category, values) => run(overrideQuestion(category, values),
      () => change("PUT", categoryPaths.override(category), values),
      published, afterChange),
    refit: () => run(
      ["Refit now?", "Every category is fitted now; a new version is published if the guard passes. A rollback hold is released.", "Refit"],
      () => api.post("/v1/policy/refit"),
      (r) => (r.published ? `Refit published version ${r.version}` : `Refit did not publish: ${r.reason}`) +
        ` (${fmtNum(r.seconds)} s).`,
      afterChange),
  };
  wireForms(actions);
  return actions;
}

function wireForms(actions) {
  document.getElementById("override-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("ov-category");
    // A known name goes as it is named, spaces around it included (engines pass their
    // users' labels); only around an unknown one are they a typing slip, taken off.
    const category = known.categories?.has(input.value) ? input.value : input.value.trim();
    if (!category) {
      showResult(false, "Name the category to override.");
      input.focus();
      return;
    }
    // Only what was typed is sent, as typed: the API judges the values and says what is
    // wrong. What is not a number at all is refused here, never sent as another number.
    const values = {};
    for (const [id, field, name] of OVERRIDE_FIELDS) {
      const box = document.getElementById(id);
      const raw = box.value.trim();
      if (raw === "") continue;
      if (!DECIMAL.test(raw)) {
        showResult(false, `${name}: “${raw}” is not a number; write decimals with a point (0.5). Nothing was sent.`);
        box.focus();
        return;
      }
      values[field] = Number(raw);
    }
    actions.override(category, values);
  });
  document.getElementById("rb-version").addEventListener("change", () => {
    rollbackPicked = true;
  });
  document.getElementById("rollback-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const raw = document.getElementById("rb-version").value; // "" with no kept version
    const version = Number(raw);
    if (raw === "" || !Number.isInteger(version)) {
      showResult(false, "No kept version to roll back to.");
      return;
    }
    actions.rollback(version, document.getElementById("rb-hold").checked);
  });
  document.getElementById("refit-form").addEventListener("submit", (event) => {
    event.preventDefault();
    actions.refit();
  });
}

/**
 * Keep the roll-back choices equal to the kept versions (the one in force excluded), the
 * newest chosen: a choice made at page load must not point at an old version minutes later.
 * A version the operator picked stays chosen while it is kept.
 */
export function renderActions(results) {
  const select = document.getElementById("rb-version");
  if (!("value" in results.versions)) return;
  const current = results.policy.value ? results.policy.value.version : null;
  const all = results.versions.value || [];
  known.current = current;
  known.categories = results.policy.value ? new Set(Object.keys(results.policy.value.categories || {})) : null;
  known.versions = new Map(all.map((v) => [v.version, v]));
  const kept = all.filter((v) => v.version !== current).sort((a, b) => b.version - a.version);
  const wanted = kept.map((v) => String(v.version));
  const chosen = select.value;
  if ([...select.options].map((o) => o.value).join() !== wanted.join()) {
    select.replaceChildren(...kept.map((v) => el("option", { value: v.version }, `${v.version}: ${v.note}`)));
  }
  if (!(rollbackPicked && wanted.includes(chosen))) {
    rollbackPicked = false;
    if (wanted.length) select.value = wanted[0];
  } else {
    select.value = chosen;
  }
}
