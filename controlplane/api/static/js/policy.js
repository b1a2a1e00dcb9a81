// The policy section: the version in force (its reason and source), the kept versions with
// a roll-back button each, and the overrides in force with a remove button each.

import { el, fmtAge, fmtInt, fmtNum, fmtTime, setText, showError, syncRows } from "./dom.js";

/** What published a version, read from its reason: the store writes one wording per kind. */
export function versionSource(note) {
  const text = String(note || "");
  if (text.startsWith("refit")) return "fit";
  if (text.startsWith("override")) return "override";
  if (text.startsWith("rollback")) return "rollback";
  if (text.startsWith("initial")) return "initial";
  return "other";
}

function badge(source) {
  return el("span", { class: `badge badge-${source}` }, source);
}

function fact(term, ...value) {
  return el("div", {}, el("dt", {}, term), el("dd", {}, ...value));
}

// Why the workers have this version: the last refit here, and a rollback's hold.
function refitFacts(status) {
  if (!status) return [];
  const facts = [];
  if (status.held) facts.push(fact("Refits", el("strong", { id: "refit-held" }, "held by a rollback (refit now to release)")));
  const last = status.last;
  const said = last ? `${last.reason} (${fmtAge(status.last_at)})` : "none on this replica yet";
  facts.push(fact("Last refit", el("span", { id: "refit-last" }, said)));
  return facts;
}

function renderCurrent(doc, agents, refit) {
  const box = document.getElementById("policy-current");
  if (!doc) {
    box.replaceChildren(fact("Version", "none published yet"));
    return;
  }
  const live = agents || [];
  const onIt = live.filter((a) => a.applied_version === doc.version).length;
  const d = doc.default || {};
  box.replaceChildren(
    fact("Version in force", el("strong", { id: "policy-version" }, String(doc.version))),
    fact("Published", `${fmtTime(doc.created_at)} (${fmtAge(doc.created_at)})`),
    fact("Source", badge(versionSource(doc.note))),
    fact("Reason", doc.note || "—"),
    fact("Categories", fmtInt(Object.keys(doc.categories || {}).length)),
    fact("Default (unseen categories)", `p ${fmtNum(d.p_reuse)}, a ${fmtNum(d.rate)}/s, life ${fmtNum(d.life_s)} s`),
    fact("Workers applying it", live.length ? `${onIt} of ${live.length}` : "no live worker"),
    ...refitFacts(refit),
  );
}

function renderVersions(versions, current, actions) {
  const tbody = document.querySelector("#versions tbody");
  syncRows(
    tbody,
    versions,
    (v) => v.version,
    (row, v) => {
      setText(row.cells[0], v.version);
      setText(row.cells[1], fmtTime(v.created_at));
      row.cells[1].title = fmtAge(v.created_at);
      row.cells[2].replaceChildren(badge(versionSource(v.note)));
      setText(row.cells[3], v.note);
      setText(row.cells[4], fmtInt(v.categories));
      const button = row.cells[5].firstChild;
      const inForce = current !== null && v.version === current;
      button.disabled = inForce;
      button.title = inForce ? "This version is in force" : "";
      row.classList.toggle("current", inForce);
    },
    (row, v) => {
      row.cells[5].append(el("button", {
        type: "button", class: "small", "aria-label": `Roll back to version ${v.version}`,
        onclick: () => actions.rollback(v.version),
      }, "Roll back…"));
    },
  );
}

function renderOverrides(overrides, actions) {
  const names = Object.keys(overrides || {}).sort();
  document.getElementById("overrides-empty").hidden = names.length > 0;
  syncRows(
    document.querySelector("#overrides tbody"),
    names,
    (name) => name,
    (row, name) => {
      setText(row.cells[0], name);
      const values = Object.entries(overrides[name]).map(([k, v]) => `${k} = ${fmtNum(v, 4)}`);
      setText(row.cells[1], values.join(", "));
    },
    (row, name) => {
      row.cells[2].append(el("button", {
        type: "button", class: "small", "aria-label": `Remove the override of ${name}`,
        onclick: () => actions.removeOverride(name),
      }, "Remove…"));
    },
  );
}

/**
 * Update the section from one refresh's results ({value}, {error}, or both: an error with
 * the last good value, drawn again so that its ages keep counting).
 */
export function renderPolicySection(results, actions) {
  const { policy, versions, overrides, agents, refit } = results;
  const failed = [policy, versions, overrides].find((r) => r.error);
  showError(document.getElementById("policy-error"), failed ? failed.error.message : "");
  if ("value" in policy) renderCurrent(policy.value, agents.value, refit.value);
  const current = policy.value ? policy.value.version : null;
  if ("value" in versions) renderVersions(versions.value || [], current, actions);
  if ("value" in overrides) renderOverrides(overrides.value, actions);
}
