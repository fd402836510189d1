// Shared by the fleet and node pages. Plain ES modules, no framework, nothing loaded from elsewhere.
// Rule: data from the API only ever reaches the page through textContent / attributes, never as markup.
import { relTime, isoUtc } from "/ui/static/timefmt.js";

export { relTime, isoUtc };

export const STATES = ["OK", "WARN", "FAIL", "UNKNOWN", "fenced", "returning", "drained", "repair"];
export const STATE_LABEL = {
  OK: "OK", WARN: "WARN", FAIL: "FAIL", UNKNOWN: "UNKNOWN",
  fenced: "fenced", returning: "returning", drained: "drained (not podhealth)",
  repair: "repair (remediation gave up)",
};
const TOKEN_KEY = "podhealth.adminToken";
const WHO_KEY = "podhealth.who";

/** Build an element: el("a", {href: "/x", className: "tile", title: "t"}, "text", child, ...). */
export function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "className") e.className = v;
    else if (k === "text") e.textContent = String(v);
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

/** Natural order: dgx2 before dgx10, gpu2 before gpu10. */
export const natural = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" }).compare;

export const session = {
  token() { return sessionStorage.getItem(TOKEN_KEY) || ""; },
  setToken(t) { if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY); },
  who() { return sessionStorage.getItem(WHO_KEY) || ""; },
  setWho(w) { if (w) sessionStorage.setItem(WHO_KEY, w); },
};

export async function getJSON(path, timeoutMs = 10000) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const r = await fetch(path, { signal: ctl.signal, credentials: "omit", cache: "no-store" });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
    return body;
  } finally {
    clearTimeout(timer);
  }
}

/** A mutating call: the admin token travels only in the Authorization header, never in a cookie. */
export async function adminPost(path, body, timeoutMs = 60000) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const r = await fetch(path, {
      method: "POST", credentials: "omit", cache: "no-store", signal: ctl.signal,
      headers: { "Authorization": `Bearer ${session.token()}`, "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const out = await r.json().catch(() => ({}));
    return { ok: r.ok, status: r.status, body: out };
  } finally {
    clearTimeout(timer);
  }
}

/** Text for a time where no element fits (a title, a message): relative, never a raw number. */
export function fmtTime(t) {
  return t ? relTime(t) : "—";
}

export const ago = relTime;

/**
 * A time on the page: <time> reading "3 min ago", the ISO instant in UTC on hover. Every such
 * element is re-read each 15 s (tickTimes), so "just now" does not stay "just now".
 */
export function when(t, empty = "—") {
  if (!t) return document.createTextNode(empty);
  const iso = isoUtc(t);
  const e = el("time", { className: "ts", datetime: iso, title: `${iso} (UTC)` }, relTime(t));
  e.dataset.t = String(t);
  return e;
}

function tickTimes() {
  const now = Date.now() / 1000;
  for (const e of document.querySelectorAll("time.ts[data-t]")) {
    const text = relTime(Number(e.dataset.t), now);
    if (e.textContent !== text) e.textContent = text;
  }
}
setInterval(tickTimes, 15000);

export function showMessage(box, kind, text) {
  box.className = `banner ${kind}`;
  box.textContent = text;
  box.hidden = !text;
}

/** The admin token field in the top bar; `onChange()` runs when it is set or cleared. */
export function tokenWidget(box, onChange) {
  const render = () => {
    clear(box);
    if (session.token()) {
      box.append(
        el("span", { className: "badge admin", title: "admin token kept in this tab only (sessionStorage)" }, "admin"),
        el("button", { type: "button", id: "token-clear", onclick: () => { session.setToken(""); render(); onChange(); } },
          "Forget token"));
    } else {
      const input = el("input", { type: "password", id: "token-input", placeholder: "admin token",
        autocomplete: "off", "aria-label": "admin token" });
      const form = el("form", { className: "token", onsubmit: (ev) => {
        ev.preventDefault();
        const v = input.value.trim();
        if (v) { session.setToken(v); render(); onChange(); }
      } }, input, el("button", { type: "submit", id: "token-set" }, "Use"));
      box.append(form);
    }
  };
  render();
}

/** Ask for a reason (and who) in the page's <dialog>; resolves {reason, who} or null. A `warning`
 * shows above the form (in #dlg-warn, where the page has one): what the operator should know first. */
export function askReason(title, confirmText, needReason = true, warning = "") {
  const dlg = document.getElementById("dlg");
  const reason = document.getElementById("dlg-reason");
  const who = document.getElementById("dlg-who");
  document.getElementById("dlg-title").textContent = title;
  const warn = document.getElementById("dlg-warn");
  if (warn) { warn.textContent = warning; warn.hidden = !warning; }
  document.getElementById("dlg-ok").textContent = confirmText;
  reason.value = "";
  reason.required = needReason;
  who.value = session.who();
  return new Promise((resolve) => {
    const cancel = document.getElementById("dlg-cancel");
    const onCancel = () => dlg.close("cancel");
    cancel.addEventListener("click", onCancel, { once: true });
    dlg.addEventListener("close", () => {
      cancel.removeEventListener("click", onCancel);
      if (dlg.returnValue !== "ok") { resolve(null); return; }
      session.setWho(who.value.trim());
      resolve({ reason: reason.value.trim(), who: who.value.trim() || "ui" });
    }, { once: true });
    dlg.returnValue = "";
    dlg.showModal();
    reason.focus();
  });
}

/**
 * Live fleet data: Server-Sent Events from /ui/events, falling back to polling /ui/api/fleet
 * every 2 s when the stream cannot be opened. `onSnapshot(full)` replaces everything,
 * `onDelta({upsert, remove, summary?})` patches; `onConn(mode, text)` reports the link.
 */
export function openFeed({ node, onSnapshot, onDelta, onConn }) {
  const q = node ? `?node=${encodeURIComponent(node)}` : "";
  let pollTimer = null;
  const poll = async () => {
    try {
      onSnapshot(await getJSON(`/ui/api/fleet${q}`, 5000));
      onConn("polling", `polling · ${new Date().toLocaleTimeString()}`);
    } catch (e) {
      onConn("offline", `offline: ${e.message}`);
    }
  };
  const startPolling = () => {
    if (pollTimer) return;
    poll();
    pollTimer = setInterval(poll, 2000);
  };
  if (typeof EventSource === "undefined") { startPolling(); return; }
  const es = new EventSource(`/ui/events${q}`);
  let opened = false;
  let failures = 0;
  es.addEventListener("open", () => { opened = true; });
  es.addEventListener("snapshot", (ev) => {
    failures = 0;
    onSnapshot(JSON.parse(ev.data));
    onConn("live", `live · ${new Date().toLocaleTimeString()}`);
  });
  es.addEventListener("delta", (ev) => {
    onDelta(JSON.parse(ev.data));
    onConn("live", `live · ${new Date().toLocaleTimeString()}`);
  });
  es.addEventListener("error", () => {
    failures += 1;
    // Never opened, or CLOSED (the server refused it, e.g. 503 too many streams), or failing again
    // and again (a proxy that buffers or drops event streams): polling still works. A stream that
    // was live and broke once is left to EventSource's own reconnect (the aggregator restarting).
    if (!opened || es.readyState === EventSource.CLOSED || failures >= 3) {
      es.close();
      startPolling();
    } else {
      onConn("offline", "reconnecting…");
    }
  });
}
