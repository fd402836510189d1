// The federated view: one tile per aggregator set (SuperPOD, cluster), read by this aggregator
// from each set's API (GET /ui/api/federation). Read-only: nothing here changes any set; a set's
// own page (its link) is where its operators act. Data reaches the page only as text.
import { el, clear, getJSON, natural, STATES, STATE_LABEL } from "/ui/static/common.js";

const POLL_MS = 5000;
const conn = document.getElementById("conn");
const sets = document.getElementById("sets");
const message = document.getElementById("message");

function setLink(url, path) {
  // Only http(s) links (the aggregator checked the set URL; this keeps it so).
  try {
    const u = new URL(path, url);
    return u.protocol === "http:" || u.protocol === "https:" ? u.href : undefined;
  } catch {
    return undefined;
  }
}

function tile(s) {
  const head = el("h2", {}, el("a", { href: setLink(s.url, "/ui"), rel: "noopener noreferrer" }, s.name),
    el("span", { className: "meta mono" }, s.url));
  const box = el("section", { className: "set " + (s.ok ? "set-ok" : "set-down"), dataset: { set: s.name } }, head);
  if (!s.ok) {
    box.append(el("div", { className: "banner error" }, "unreachable: ", s.error));
    return box;
  }
  if (s.breaker) box.append(el("div", { className: "banner tripped" }, "breaker tripped: ", s.breaker));
  const chips = el("div", { className: "counts" });
  for (const st of STATES) {
    const n = s.counts[st] || 0;
    chips.append(el("span", { className: "chip" + (n ? "" : " zero"), title: STATE_LABEL[st] },
      el("span", { className: "sw st-" + st }), st, " ", el("b", { className: "n" }, n)));
  }
  box.append(el("div", { className: "summary" }, chips,
    el("span", { className: "stat" }, "nodes ", el("b", {}, s.nodes)),
    el("span", { className: "stat" }, "fenced ", el("b", {}, `${s.fence_budget.used}/${s.fence_budget.limit}`)),
    s.leader ? el("span", { className: "stat" }, "leader ", el("b", {}, s.leader)) : null,
    s.dry_run ? el("span", { className: "badge dry" }, "DRY RUN") : null,
    el("span", { className: "stat" }, `read in ${(s.seconds * 1000).toFixed(0)} ms`)));
  if (s.problems.length) {
    const list = el("ul", { className: "problems" });
    for (const p of [...s.problems].sort((a, b) => natural(a.node, b.node))) {
      list.append(el("li", {},
        el("a", { href: setLink(s.url, "/ui/node/" + encodeURIComponent(p.node)), rel: "noopener noreferrer" }, p.node),
        " ", el("span", { className: "badge st-" + p.state }, p.state), " ", p.checks.join(", ")));
    }
    if (s.more) list.append(el("li", { className: "muted" }, `… and ${s.more} more`));
    box.append(list);
  } else {
    box.append(el("p", { className: "muted" }, "every node OK"));
  }
  return box;
}

async function refresh() {
  try {
    const view = await getJSON("/ui/api/federation", 60000);
    clear(sets);
    if (!view.sets.length) {
      message.hidden = false;
      message.className = "banner info";
      message.textContent = "No aggregator sets are configured (aggregator.federation.sets).";
    }
    for (const s of view.sets) sets.append(tile(s));
    conn.className = "conn live";
    conn.textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    conn.className = "conn offline";
    conn.textContent = "cannot reach this aggregator: " + e.message;
  }
}

refresh();
setInterval(refresh, POLL_MS);
