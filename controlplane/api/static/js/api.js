// The dashboard's only way out: the controller's public REST API, on the origin that served
// the page. Errors keep the API's own shape ({"error", "reason"}) and the HTTP status.

const TOKEN_KEY = "kvwise.apiToken";
/** How long a read may take before the page gives up on it and says so: a controller whose
 * Redis stalls holds reads for 10 s and more, and the page must not wait with it. */
export const READ_TIMEOUT_MS = 4000;
/** An action waits longer: a refit fits every category before it answers. */
export const ACTION_TIMEOUT_MS = 30000;

export class ApiError extends Error {
  constructor(method, path, status, error, reason, body) {
    super(`${method} ${path}: ${status ? `HTTP ${status} ` : ""}${error}: ${reason}`);
    Object.assign(this, { method, path, status, error, reason, body });
  }
}

/** The bearer token (the API token, or a read token to view only): typed by the operator,
 * kept for this tab only. */
export const token = {
  get() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  },
  set(value) {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  },
};

/** An answer that is not the API's own (a proxy's error page) as its reader would see it:
 * an HTML page's text, not its markup (parsed inert: nothing in it runs or loads). */
function plainText(response, text) {
  const html = /html/i.test(response.headers.get("Content-Type") || "");
  const shown = html ? new DOMParser().parseFromString(text, "text/html").body.textContent : text;
  return shown.replace(/\s+/g, " ").trim().slice(0, 300);
}

async function call(method, path, body) {
  return (await exchange(method, path, body)).body;
}

/**
 * A change of policy (PUT, POST, DELETE) answered with the document in force: the document,
 * and whether the change published it (Kvwise-Published: false when nothing changed, as
 * releasing an override or a pin already gone).
 */
export async function change(method, path, body) {
  const answer = await exchange(method, path, body);
  return { doc: answer.body, published: answer.response.headers.get("Kvwise-Published") !== "false" };
}

async function exchange(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  // Reads need a token too when the controller has a read token (KVWISE_API_READ_TOKEN).
  if (token.get()) headers.Authorization = `Bearer ${token.get()}`;
  const limitMs = method === "GET" ? READ_TIMEOUT_MS : ACTION_TIMEOUT_MS;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), limitMs);
  let response;
  let text;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      signal: abort.signal,
    });
    text = await response.text();
  } catch (exc) {
    if (abort.signal.aborted) {
      const maybe = method === "GET" ? "" : " (it may still take effect: the next refresh shows)";
      throw new ApiError(method, path, 0, "timeout", `no answer within ${limitMs / 1000} s${maybe}`, null);
    }
    throw new ApiError(method, path, 0, "unreachable", `the controller did not answer (${exc.message})`, null);
  } finally {
    clearTimeout(timer);
  }
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = null;
  }
  if (!response.ok) {
    const error = parsed && typeof parsed.error === "string" ? parsed.error : "http_error";
    const reason = parsed && typeof parsed.reason === "string" ? parsed.reason : plainText(response, text);
    throw new ApiError(method, path, response.status, error, reason, text);
  }
  return { body: parsed, response };
}

export const api = {
  get: (path) => call("GET", path),
  put: (path, body) => call("PUT", path, body),
  post: (path, body) => call("POST", path, body),
  delete: (path) => call("DELETE", path),
};

/**
 * Where one category is read or pinned: each route's query form, the name in the query. A
 * browser resolves a path segment "." or ".." (even encoded as %2E) as a step, so the path
 * form (/v1/categories/{name}) cannot reach a category of either name; the query reaches
 * every one.
 */
export const categoryPaths = {
  detail: (name) => inQuery("/v1/category", "name", name),
  override: (name) => inQuery("/v1/policy/overrides", "category", name),
};

function inQuery(path, parameter, name) {
  return `${path}?${parameter}=${encodeURIComponent(name)}`;
}

/**
 * The paths the controller serves, from its OpenAPI document (read once a minute at most):
 * optional routes are looked up here instead of probed, so a controller without one shows
 * no failed request.
 */
let openapi = { paths: null, at: 0 };

export async function servedPaths(maxAgeMs = 60000) {
  if (openapi.paths === null || Date.now() - openapi.at > maxAgeMs) {
    const doc = await api.get("/openapi.json");
    openapi = { paths: new Set(Object.keys((doc && doc.paths) || {})), at: Date.now() };
  }
  return openapi.paths;
}
