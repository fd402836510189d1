// The node page: what the agent reports per GPU / NVLink / HCA / mount, events, the audit log,
// and (with the admin token) fence, release and handover.
import {
  STATE_LABEL, el, clear, natural, session, getJSON, adminPost, when, showMessage, tokenWidget, askReason,
  openFeed,
} from "/ui/static/common.js";
import { renderTimeline } from "/ui/static/timeline.js";

const $ = (id) => document.getElementById(id);
const NAME = decodeURIComponent(location.pathname.split("/").pop());
const API = `/api/v1/nodes/${encodeURIComponent(NAME)}`;
const GROUPS = ["GPUs", "NVLink", "NVSwitches", "HCAs", "Mounts", "Node"];
let node = null;
let busy = false;
let historyItems = [];

function groupOf(r) {
  const e = r.entity || "node";
  if (e.startsWith("nvswitch") || r.check === "sxid") return "NVSwitches";
  if (r.check.startsWith("nvlink")) return "NVLink";
  if (/^gpu\d+$/.test(e) || e.startsWith("pci:")) return "GPUs";
  if (e.startsWith("mlx") || /^[A-Za-z0-9_]+\/\d+$/.test(e)) return "HCAs";
  if (e.startsWith("/")) return "Mounts";
  return "Node";
}

const pill = (status) => el("span", { className: `cellchip st-${status}` }, status);

// An evidence value that is a Unix time (a 10-digit number of seconds, 2001..2286) under a key
// that names a time: shown as a time, never as the raw number.
const EPOCH = /^\d{10}(\.\d+)?$/;
const TIME_KEY = /(time|_at|since|last|first|when|seen)$/i;

function evidenceValue(k, v) {
  const s = String(v);
  return EPOCH.test(s) && TIME_KEY.test(k) ? when(Number(s)) : s;
}

function evidenceList(ev) {
  const entries = Object.entries(ev || {});
  if (!entries.length) return null;
  const dl = el("dl", { className: "evidence" });
  for (const [k, v] of entries) dl.append(el("dt", {}, k), el("dd", {}, evidenceValue(k, v)));
  return dl;
}

function table(headers, rows, empty) {
  if (!rows.length) return el("p", { className: "muted" }, empty);
  const t = el("table", {}, el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(r);
  t.append(body);
  return t;
}

// ---- header facts and actions -----------------------------------------------------------------

function renderHead(n) {
  document.title = `podhealth · ${n.name}`;
  $("name").textContent = n.name;
  const st = $("state");
  st.className = `state-pill st-${n.state}`;
  st.textContent = STATE_LABEL[n.state] || n.state;
  const updated = $("updated");
  clear(updated);
  updated.append("report ", when(n.report_time, "never"), " · seen ", when(n.last_seen, "never"));
  const facts = $("facts");
  clear(facts);
  const add = (k, v) => { if (v !== "" && v !== null && v !== undefined) facts.append(el("dt", {}, k), el("dd", {}, v)); };
  const r = n.report || {};
  add("verdict", n.status);
  add("partition", n.partition || "—");
  add("agent", n.agent_url || "push only");
  if (r.agent_version) add("agent version / profile", `${r.agent_version} / ${r.profile || "?"}`);
  add("names", `slurm ${n.slurm_name} · kubernetes ${n.k8s_name}`);
  const fence = { none: "not fenced", fencing: "fencing (in flight)", fenced: "fenced by podhealth",
    releasing: "releasing (in flight)", external: "drained by someone else (podhealth will not touch it)" }[n.fence] || n.fence;
  add("fence", n.fence_reason ? `${fence} — reason "${n.fence_reason}"` : fence);
  if (n.fenced_at) add("fenced", when(n.fenced_at));
  if (n.hold) add("hold", `${n.hold_reason || "operator fence"}: no automatic return to service`);
  // The remediation ladder (README "Remediation ladder"): its step and the failed attempts counted.
  const ladder = n.ladder || {};
  if (ladder.step || (ladder.failures || []).length) {
    const step = { acting: "reset/reboot in flight", verifying: "waiting for the handover suite",
      repair: "REPAIR: no more automatic attempts (podhealth fleet repairs)" }[ladder.step] || "idle";
    add("remediation", el("span", {}, `${step} `, ladder.since ? when(ladder.since) : null,
      ` · ${(ladder.failures || []).length} failed attempt(s)`));
  }
  // The agent's clock is a claim: records are ordered by its (boot, seq); a wrong clock is shown, not trusted.
  const clock = n.clock || {};
  if (clock.ahead) add("agent clock", `${clock.ahead} record(s) claimed a time beyond the allowed skew ahead `
    + `(last offset ${clock.offset >= 0 ? "+" : ""}${Number(clock.offset).toFixed(1)} s): fix NTP on the node`);
  else if (Math.abs(clock.offset || 0) >= 5) add("agent clock", `offset ${Number(clock.offset).toFixed(1)} s`);
  const order = n.order || {};
  if (order.boot_id) add("order", `boot ${order.boot_id.slice(0, 13)} · seq ${order.seq}`);
  if (n.opted_out) add("opted out", "podhealth.io/managed=false: never fenced");
  if (n.handover) add("handover", el("span", {}, `${n.handover} `, n.handover_at ? when(n.handover_at) : null));
  if (n.ok_since) add("all OK since", when(n.ok_since));
  if (n.unreachable_since) add("unreachable since", when(n.unreachable_since));
  for (const p of n.pending_actions || []) add(`pending ${p.kind}`, `#${p.id} by ${p.who}: ${p.why} (attempts ${p.attempts})`);
  // Which jobs a fence touches (jobs.enabled): Slurm jobs with their GPUs, or GPU pods.
  for (const j of n.jobs || []) {
    add(`job ${j.id}`, `${j.owner}${j.name ? ` · ${j.name}` : ""}${j.state ? ` · ${j.state}` : ""}`
      + (j.gpus && j.gpus.length ? ` · GPU ${j.gpus.join(",")}` : ""));
  }
  if (n.evacuated && n.evacuated !== "failed" && n.evacuated_jobs === 0) add("jobs", "none were running to move off");
  else if (n.evacuated) add("jobs moved off", { polite: "evicted / left to finish", forced: "requeued / evicted",
    failed: "the backend refused: see the history" }[n.evacuated] || n.evacuated);
  for (const note of n.notes || []) add("policy", `${note.kind}${note.detail ? `: ${note.detail}` : ""}`);
  // Operators' silences (podhealth fleet silence): the check does not count toward a fence until then.
  for (const s of n.silences || []) {
    add(`silenced ${s.check}`, el("span", { className: "silence" }, "until ", when(s.until), ` by ${s.who}: ${s.reason}`));
  }
  renderActions(n);
}

function renderActions(n) {
  const admin = !!session.token();
  const btn = { fence: $("btn-fence"), release: $("btn-release"), handover: $("btn-handover"),
    healthy: $("btn-mark-healthy") };
  for (const b of Object.values(btn)) b.hidden = !admin;
  $("actions-hint").textContent = admin ? ""
    : "Read-only. Enter the admin token (top right) to fence, release, mark healthy or re-run the handover suite.";
  if (!admin) return;
  btn.fence.disabled = busy || n.fence !== "none" || n.opted_out;
  btn.release.disabled = busy || n.fence !== "fenced";
  btn.handover.disabled = busy || !n.agent_url || n.handover === "running";
  btn.healthy.disabled = busy || n.fence === "external" || n.fence === "fencing" || n.fence === "releasing";
  btn.healthy.title = "vouch for the node: skip the remediation ladder, release podhealth's fence (audited)";
  btn.fence.title = n.fence !== "none" ? "already fenced" : "drain in Slurm / cordon in Kubernetes now";
  btn.release.title = n.fence === "fenced" ? "resume in Slurm / uncordon" : "only nodes podhealth fenced can be released";
  btn.handover.title = n.agent_url ? "ask the agent to run the handover suite; a pass returns the node" : "no agent URL configured";
}

/** What a release would put back into service: the node's verdict when it is still FAIL, with the checks. */
function releaseWarning(n) {
  if (!n || n.status !== "FAIL") return "";
  const failing = (n.conditions || []).filter((c) => c.status === "FAIL").map((c) => `${c.check} ${c.entity}`);
  const list = failing.length ? `: ${failing.slice(0, 8).join(", ")}${failing.length > 8 ? ` and ${failing.length - 8} more` : ""}` : "";
  return `Warning: ${n.name} still reports FAIL${list}. Released now, it goes back into service failing, and the `
    + "policy may fence it again.";
}

async function act(action) {
  const titles = {
    fence: [`Fence ${NAME}? It is drained in Slurm / cordoned in Kubernetes and stays out until released.`, "Fence"],
    release: [`Release ${NAME}? It returns to service (Slurm resume / uncordon).`, "Release"],
    handover: [`Re-run the handover suite on ${NAME}? A pass returns it to service.`, "Run handover"],
    "mark-healthy": [`Mark ${NAME} healthy? The remediation ladder is skipped, podhealth's fence is released, and `
      + "the failures open now no longer fence it.", "Mark healthy"],
  };
  const got = await askReason(titles[action][0], titles[action][1], true, action === "release" ? releaseWarning(node) : "");
  if (!got) return;
  busy = true;
  if (node) renderActions(node);
  showMessage($("message"), "info", `${action}: working…`);
  try {
    const r = await adminPost(`${API}/${action}`, got);
    if (r.status === 401) {
      session.setToken("");
      tokenWidget($("token"), onToken);
      showMessage($("message"), "error", `${action} refused: the admin token was not accepted (${r.body.error || 401}).`);
    } else if (!r.ok) {
      showMessage($("message"), "error", `${action} refused (${r.status}): ${r.body.error || "no reason given"}`);
    } else {
      const b = r.body;
      showMessage($("message"), b.state === "failed" ? "error" : "okmsg",
        `${action}: ${b.state || "done"}${b.result ? ` — ${b.result}` : ""}`);
    }
  } catch (e) {
    showMessage($("message"), "error", `${action} failed: ${e.message}`);
  } finally {
    busy = false;
    await load();
  }
}

// ---- results, conditions, events, history -------------------------------------------------------

function renderConditions(conds) {
  $("cond-count").textContent = conds.length ? `(${conds.length})` : "";
  const rows = conds.map((c) => el("tr", { className: c.status === "FAIL" ? "bad" : "" },
    el("td", {}, pill(c.status)), el("td", { className: "mono" }, c.check), el("td", { className: "mono" }, c.entity),
    el("td", {}, c.action), el("td", {}, c.source), el("td", { className: "when" }, when(c.since)), el("td", {}, c.summary)));
  const box = $("conditions");
  clear(box);
  box.append(table(["status", "check", "entity", "action", "source", "since", "summary"], rows, "None: every check is OK."));
}

function matrix(g, results) {
  const entities = [...new Set(results.map((r) => r.entity))].sort(natural);
  const checks = [...new Set(results.map((r) => r.check))].sort();
  const at = new Map(results.map((r) => [`${r.entity}\u0000${r.check}`, r]));
  // The job on each GPU, as the agent put it in the GPU's evidence (agent/jobmap.py): shown under
  // the GPU's name so an operator sees whose work a failing GPU hurts.
  const jobOf = new Map(results.filter((r) => r.evidence && r.evidence.job).map((r) => [r.entity, r.evidence.job]));
  const head = el("tr", {}, el("th", {}, "entity"), ...checks.map((c) => el("th", { className: "check", title: c }, c)));
  const body = el("tbody");
  for (const e of entities) {
    const job = jobOf.get(e);
    const tr = el("tr", {}, el("th", { className: "mono", scope: "row" }, e,
      job ? el("div", { className: "gpujob", dataset: { entity: e } }, job) : null));
    for (const c of checks) {
      const r = at.get(`${e}\u0000${c}`);
      if (!r) { tr.append(el("td", { className: "cell" }, el("span", { className: "cellchip none" }, "·"))); continue; }
      const ev = Object.entries(r.evidence || {}).map(([k, v]) => `${k}=${v}`).join("\n");
      const chip = pill(r.status);
      chip.title = `${c} ${e}: ${r.status}${r.action !== "NONE" ? ` → ${r.action}` : ""}\n${r.summary || ""}${ev ? `\n${ev}` : ""}`;
      tr.append(el("td", { className: "cell", dataset: { check: c, entity: e, status: r.status } }, chip));
    }
    body.append(tr);
  }
  const bad = results.filter((r) => r.status !== "OK").length;
  return el("section", { className: "results", dataset: { group: g } },
    el("h3", {}, `${g} · ${entities.length} · ${bad ? `${bad} not OK` : "all OK"}`),
    el("table", { className: "matrix" }, el("thead", {}, head), body));
}

function renderResults(report) {
  const box = $("results");
  clear(box);
  if (!report || !Array.isArray(report.results)) {
    $("report-meta").textContent = "";
    box.append(el("p", { className: "muted" }, "No report from the agent yet."));
    return;
  }
  const meta = $("report-meta");
  clear(meta);
  meta.append(`(${report.results.length} results, agent time `, when(report.time), ")");
  const groups = new Map(GROUPS.map((g) => [g, []]));
  for (const r of report.results) groups.get(groupOf(r)).push(r);
  const rank = { FAIL: 0, UNKNOWN: 1, WARN: 2 };
  const bad = report.results.filter((r) => r.status !== "OK")
    .sort((a, b) => (rank[a.status] - rank[b.status]) || natural(a.entity, b.entity) || natural(a.check, b.check));
  const rows = bad.map((r) => el("tr", { className: r.status === "FAIL" ? "bad finding" : "finding",
    dataset: { check: r.check, entity: r.entity } },
  el("td", {}, pill(r.status)), el("td", {}, groupOf(r)), el("td", { className: "mono" }, r.entity),
  el("td", { className: "mono" }, r.check), el("td", {}, r.action), el("td", { className: "when" }, when(r.since)),
  el("td", {}, r.summary || "", evidenceList(r.evidence))));
  box.append(el("h3", {}, "Findings"),
    table(["status", "kind", "entity", "check", "action", "since", "summary / evidence"], rows, "Every check passes."));
  const grid = el("div", { className: "matrices" });
  for (const [g, results] of groups) if (results.length) grid.append(matrix(g, results));
  box.append(grid);
}

function eventRow(item) {
  const body = item.event || {};
  if (item.kind === "summary") {
    const counts = Object.entries(body.counts || {}).map(([k, v]) => `${k} ×${v}`).join(", ");
    return el("tr", {}, el("td", { className: "when" }, when(item.time)), el("td", {}, "summary"), el("td", {}, ""),
      el("td", {}, ""), el("td", {}, `${body.count || 0} events held while the aggregator was away, `, when(body.first),
        " – ", when(body.last), `: ${counts}`));
  }
  const e = body.event || {};
  const where = e.gpu !== null && e.gpu !== undefined ? `gpu${e.gpu}` : (e.device || e.pci_bus_id || "");
  return el("tr", { className: "bad" }, el("td", { className: "when" }, when(item.time)),
    el("td", {}, String(e.kind || "").toUpperCase()), el("td", { className: "num" }, e.code ?? ""),
    el("td", { className: "mono" }, where, e.job ? el("div", { className: "gpujob" }, e.job) : null),
    el("td", { className: "mono" }, e.text || ""));
}

function renderHistory(items) {
  const events = items.filter((i) => i.type === "event" && (i.kind === "summary" || (i.event && i.event.event)));
  const audit = items.filter((i) => i.type === "audit");
  const verdicts = items.filter((i) => i.type === "verdict");
  clear($("events"));
  $("events").append(table(["time", "kind", "code", "where", "text"], events.map(eventRow), "No XID or SXid events."));
  clear($("audit"));
  $("audit").append(table(["time", "who", "what", "why / result"], audit.map((a) => el("tr", { className: a.ok ? "" : "bad" },
    el("td", { className: "when" }, when(a.time)), el("td", {}, a.who), el("td", {}, a.what),
    el("td", {}, a.why, a.command && a.command.length ? el("div", { className: "mono" }, a.command.join(" ")) : null,
      a.output ? el("pre", { className: "out" }, a.output) : null))), "No actions recorded."));
  clear($("verdicts"));
  $("verdicts").append(table(["time", "status", "check", "entity", "action", "source", "summary"], verdicts.map((v) =>
    el("tr", { className: v.status === "FAIL" ? "bad" : "" }, el("td", { className: "when" }, when(v.time)),
      el("td", {}, pill(v.status)), el("td", { className: "mono" }, v.check), el("td", { className: "mono" }, v.entity),
      el("td", {}, v.action), el("td", {}, v.source), el("td", {}, v.summary))), "No verdict changes recorded."));
}

// ---- loading ------------------------------------------------------------------------------------

let loading = null;
let again = false;

async function load() {
  if (loading) { again = true; return loading; } // one request at a time; coalesce bursts of updates
  loading = (async () => {
    try {
      const [n, h] = await Promise.all([getJSON(API), getJSON(`${API}/history?limit=300`)]);
      node = n;
      renderHead(n);
      renderConditions(n.conditions || []);
      renderResults(n.report);
      renderHistory(h.items || []);
      historyItems = h.items || [];
      drawTimeline();
    } catch (e) {
      showMessage($("message"), "error", `Cannot load ${NAME}: ${e.message}`);
    }
  })();
  await loading;
  loading = null;
  if (again) { again = false; await load(); }
}

function drawTimeline() {
  if (node) renderTimeline($("timeline"), historyItems, node, Date.now() / 1000, Number($("timeline-span").value));
}

async function loadLinks() {
  try {
    const got = await getJSON(`/ui/api/links?node=${encodeURIComponent(NAME)}`);
    const box = $("links");
    clear(box);
    for (const l of got.grafana || []) {
      box.append(el("a", { href: l.url, target: "_blank", rel: "noopener noreferrer", className: "badge link",
        title: `${l.title} in Grafana, node ${NAME}`, dataset: { uid: l.uid } }, l.title.replace(/^podhealth \/ /, "")));
    }
    if (box.firstChild) box.prepend(el("span", { className: "muted" }, "Grafana:"));
  } catch (e) {
    // no links is no loss: the page works without them
  }
}

// The node's part in running jobs' straggler comparisons and its fail-slow probes (GET
// /api/v1/failslow/*): a straggler is named here, with the job and its owner; WARN only.
async function loadFailslow() {
  const box = $("failslow");
  try {
    const [st, hist] = await Promise.all([getJSON("/api/v1/failslow/stragglers"),
      getJSON(`/api/v1/failslow/nodes/${encodeURIComponent(NAME)}`)]);
    clear(box);
    for (const s of st.stragglers.filter((x) => x.node === NAME)) {
      box.append(el("p", { className: "straggler", dataset: { job: s.job } },
        `Likely straggler of job ${s.job} (${s.owner || "unknown owner"}): `,
        `${s.gpu === null ? "the node" : `gpu${s.gpu}`}, ${s.reason} — ${s.detail}`));
    }
    if (hist.entities.length) {
      box.append(el("p", {}, el("a", { href: `/ui/failslow?node=${encodeURIComponent(NAME)}`, text: "fail-slow probes" }),
        ` (${hist.entities.length} figures against their cohorts)`));
    }
    box.hidden = !box.firstChild;
  } catch (e) {
    box.hidden = true; // fail-slow is extra: the page works without it
  }
}

// ---- evidence bundles (admin token: they hold host names, serial numbers and kernel logs) ----------

async function loadBundles() {
  const box = $("bundles");
  const token = session.token();
  if (!token) {
    clear(box);
    box.append(el("p", { className: "muted" }, "Enter the admin token (top right) to list and download the bundles, "
      + `or: podhealth fleet bundle ${NAME}`));
    return;
  }
  try {
    const r = await fetch(`${API}/bundles`, { credentials: "omit", cache: "no-store",
      headers: { "Authorization": `Bearer ${token}` } });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
    clear(box);
    // A refused bundle (not whole, or not the agent's) is a row with its reason and nothing to download.
    box.append(table(["fetched", "fence", "size", "sha256", ""], (body.bundles || []).map((b) => b.error
      ? el("tr", { className: "bad bundle-refused" },
        el("td", { className: "when" }, when(b.time)), el("td", {}, `#${b.fence_id}`), el("td", {}, "-"),
        el("td", {}, `not stored: ${b.error}`), el("td", {}, ""))
      : el("tr", {},
        el("td", { className: "when" }, when(b.time)), el("td", {}, `#${b.fence_id}`),
        el("td", { className: "num" }, `${(b.size / 1024).toFixed(1)} KiB`), el("td", { className: "mono" }, b.sha256),
        el("td", {}, el("button", { type: "button", className: "bundle-get", onclick: () => download(b) }, "Download")))),
    "None yet: a bundle is fetched from the agent each time podhealth fences the node."));
  } catch (e) {
    clear(box);
    box.append(el("p", { className: "muted" }, `Bundles unavailable: ${e.message}`));
  }
}

async function download(b) {
  try {
    const r = await fetch(`${API}/bundles/${b.id}`, { credentials: "omit", cache: "no-store",
      headers: { "Authorization": `Bearer ${session.token()}` } });
    if (!r.ok) throw new Error((await r.json().catch(() => ({}))).error || `HTTP ${r.status}`);
    const url = URL.createObjectURL(await r.blob());
    const a = el("a", { href: url, download: `${NAME}-fence${b.fence_id}.tar.gz` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (e) {
    showMessage($("message"), "error", `bundle ${b.id}: ${e.message}`);
  }
}

function onToken() {
  if (node) renderActions(node);
  loadBundles();
}

function main() {
  $("name").textContent = NAME;
  tokenWidget($("token"), onToken);
  for (const b of document.querySelectorAll("#actions button[data-action]")) {
    b.addEventListener("click", () => act(b.dataset.action));
  }
  $("timeline-span").addEventListener("change", drawTimeline);
  load();
  loadLinks();
  loadFailslow();
  loadBundles();
  openFeed({
    node: NAME,
    onSnapshot: () => load(),
    onDelta: () => load(),
    onConn: (mode, text) => { const c = $("conn"); c.className = `conn ${mode}`; c.textContent = text; },
  });
  setInterval(load, 15000); // events and audit lines arrive without a state change
}

main();
