// The fleet page: every node as a tile, grouped by partition / node pool, updated live.
import {
  STATES, STATE_LABEL, el, clear, natural, session, adminPost, when, showMessage, tokenWidget, askReason, openFeed,
} from "/ui/static/common.js";
import { fleetChart } from "/ui/static/fleetchart.js";

const COMPACT_ABOVE = 256; // past this many nodes, tiles drop their names (hover shows them)

const $ = (id) => document.getElementById(id);
const nodes = new Map(); // name -> tile JSON from the feed
const tiles = new Map(); // name -> <a class="tile">
let summary = {};
let chartChanged = () => {};
let namesTouched = false;

// ---- filters (kept in the URL so a NOC screen or a link can carry them) ------------------------

const filterInputs = { state: $("f-state"), check: $("f-check"), node: $("f-node"), partition: $("f-partition") };

function readUrlFilters() {
  const q = new URLSearchParams(location.search);
  for (const [k, input] of Object.entries(filterInputs)) {
    const v = q.get(k);
    if (v === null) continue;
    if (input.tagName === "SELECT" && ![...input.options].some((o) => o.value === v)) {
      input.append(el("option", { value: v }, v)); // a partition not seen yet
    }
    input.value = v;
  }
  if (q.has("names")) { $("f-names").checked = q.get("names") === "1"; namesTouched = true; }
}

function writeUrlFilters() {
  const q = new URLSearchParams();
  for (const [k, input] of Object.entries(filterInputs)) if (input.value) q.set(k, input.value);
  if (namesTouched) q.set("names", $("f-names").checked ? "1" : "0");
  const s = q.toString();
  history.replaceState(null, "", s ? `?${s}` : location.pathname);
}

function matches(t) {
  const f = { state: filterInputs.state.value, check: filterInputs.check.value.trim().toLowerCase(),
    node: filterInputs.node.value.trim().toLowerCase(), partition: filterInputs.partition.value };
  if (f.state === "!OK" ? t.state === "OK" : f.state && t.state !== f.state) return false;
  if (f.partition && t.partition !== f.partition) return false;
  if (f.node && !t.name.toLowerCase().includes(f.node)) return false;
  if (f.check) {
    const words = f.check.split(/\s+/);
    // every word must match the same problem: "xid gpu3" finds XIDs on GPU 3, not any XID + any gpu3 problem
    const hit = t.problems.some(([check, entity]) => {
      const hay = `${check} ${entity}`.toLowerCase();
      return words.every((w) => hay.includes(w));
    });
    if (!hit) return false;
  }
  return true;
}

// ---- tiles -------------------------------------------------------------------------------------

function tooltip(t) {
  const lines = [`${t.name} — ${STATE_LABEL[t.state] || t.state}`];
  if (t.state !== t.status) lines[0] += ` (verdict ${t.status})`;
  if (t.partition) lines.push(`partition ${t.partition}`);
  if (t.fence_reason) lines.push(`fence: ${t.fence_reason}`);
  const bad = t.problems.filter((p) => p[2] !== "OK");
  if (bad.length) {
    lines.push("failing checks:");
    for (const [check, entity, status] of bad.slice(0, 20)) lines.push(`  ${status} ${check} ${entity}`);
    if (bad.length > 20) lines.push(`  … ${bad.length - 20} more`);
  }
  return lines.join("\n");
}

function paintTile(a, t) {
  a.className = `tile st-${t.state}`;
  a.title = tooltip(t);
  a.dataset.state = t.state;
  a.dataset.status = t.status;
  a.setAttribute("aria-label", `${t.name}: ${t.state}`);
}

function makeTile(t) {
  const a = el("a", { href: `/ui/node/${encodeURIComponent(t.name)}`, dataset: { node: t.name } }, t.name);
  paintTile(a, t);
  tiles.set(t.name, a);
  return a;
}

function partitions() {
  const groups = new Map();
  for (const t of nodes.values()) {
    if (!groups.has(t.partition)) groups.set(t.partition, []);
    groups.get(t.partition).push(t);
  }
  return [...groups.entries()].sort((a, b) => natural(a[0] || "\uffff", b[0] || "\uffff"));
}

function rebuild() {
  const grid = $("grid");
  clear(grid);
  tiles.clear();
  const compact = isCompact();
  const groups = partitions();
  for (const [part, members] of groups) {
    members.sort((a, b) => natural(a.name, b.name));
    const box = el("div", { className: compact ? "grid compact" : "grid" });
    for (const t of members) box.append(makeTile(t));
    grid.append(el("section", { className: "group", dataset: { partition: part } },
      el("h2", {}, part || "(no partition)", el("span", { className: "meta" })), box));
  }
  if (!groups.length) grid.append(el("p", { className: "empty" }, "No nodes yet: the aggregator has neither configured nor reporting nodes."));
  const sel = filterInputs.partition;
  const keep = sel.value;
  clear(sel);
  sel.append(el("option", { value: "" }, "all"));
  for (const [part] of groups) sel.append(el("option", { value: part }, part || "(no partition)"));
  if (keep && !groups.some(([p]) => p === keep)) sel.append(el("option", { value: keep }, keep));
  sel.value = keep;
  refresh();
}

function isCompact() {
  if (!namesTouched) $("f-names").checked = nodes.size <= COMPACT_ABOVE;
  return !$("f-names").checked;
}

/** Visibility, group headers, counts, the check list: everything cheap that follows a change. */
function refresh() {
  let shown = 0;
  for (const section of $("grid").querySelectorAll("section.group")) {
    const part = section.dataset.partition;
    let visible = 0, total = 0, bad = 0;
    for (const a of section.querySelectorAll("a.tile")) {
      const t = nodes.get(a.dataset.node);
      const ok = matches(t);
      a.hidden = !ok;
      total += 1;
      if (ok) visible += 1;
      if (t.state !== "OK") bad += 1;
    }
    shown += visible;
    section.hidden = visible === 0;
    const p = (summary.partitions || {})[part];
    const meta = [`${total} nodes`, `${bad} not OK`];
    if (p) meta.push(`fenced ${p.fenced} of ${p.limit} allowed`);
    if (visible !== total) meta.push(`${visible} shown`);
    section.querySelector("h2 .meta").textContent = meta.join(" · ");
  }
  $("shown").textContent = shown === nodes.size ? "" : `showing ${shown} of ${nodes.size}`;
  renderSummary();
  renderCheckList();
}

function renderCheckList() {
  const names = new Set();
  for (const t of nodes.values()) for (const [check] of t.problems) names.add(check);
  const list = $("checks");
  const want = [...names].sort();
  if (list.dataset.key === want.join(",")) return;
  list.dataset.key = want.join(",");
  clear(list);
  for (const n of want) list.append(el("option", { value: n }));
}

// ---- the header: counts, breaker, budget -------------------------------------------------------

const SWATCH = Object.fromEntries(STATES.map((s) => [s, `sw st-${s}`]));

function renderSummary() {
  const counts = Object.fromEntries(STATES.map((s) => [s, 0]));
  for (const t of nodes.values()) counts[t.state] = (counts[t.state] || 0) + 1;
  const box = $("counts");
  clear(box);
  for (const s of STATES) {
    const pressed = filterInputs.state.value === s;
    box.append(el("button", {
      type: "button", className: counts[s] ? "chip" : "chip zero", "aria-pressed": String(pressed),
      title: `${STATE_LABEL[s]}: click to ${pressed ? "show all" : "show only these"}`, dataset: { state: s },
      onclick: () => { filterInputs.state.value = pressed ? "" : s; onFilter(); },
    }, el("span", { className: SWATCH[s] }), s, el("span", { className: "n" }, counts[s])));
  }
  const b = summary.breaker || {};
  $("breaker").hidden = !b.tripped;
  const bt = $("breaker-text");
  clear(bt);
  if (b.tripped) {
    bt.append("Circuit breaker TRIPPED ", when(b.tripped_at), ` — automatic fencing stopped: ${b.reason || "fleet-wide failure"}`);
  }
  $("breaker-reset").hidden = !b.tripped || !session.token();
  const fb = summary.fence_budget || { used: 0, limit: 0 };
  const budget = $("budget");
  clear(budget);
  budget.append("fence budget ", el("b", { id: "budget-used" }, `${fb.used} of ${fb.limit}`), " ",
    el("meter", { min: 0, max: Math.max(1, fb.limit), value: fb.used, low: Math.max(1, fb.limit) * 0.5,
      high: Math.max(1, fb.limit) * 0.8, optimum: 0 }));
  if (fb.limit && fb.used >= fb.limit) budget.append(el("span", { className: "badge" }, "cap reached"));
  const rl = summary.rate_limit || { used: 0, limit: 0 };
  $("rate").textContent = "";
  $("rate").append("fences/min ", el("b", {}, `${rl.used} of ${rl.limit}`));
  $("pending").textContent = "";
  if (summary.pending_actions) $("pending").append("pending actions ", el("b", {}, summary.pending_actions));
  $("total").textContent = "";
  $("total").append(el("b", {}, nodes.size), " nodes");
  $("dryrun").hidden = !summary.dry_run;
  const fencers = summary.fencers || [];
  $("fencers").textContent = fencers.length ? `fencers: ${fencers.join(", ")}${summary.manual_release ? " · manual release" : ""}` : "";
}

function renderLegend() {
  const box = $("legend");
  for (const s of STATES) box.append(el("span", {}, el("span", { className: SWATCH[s] }), STATE_LABEL[s]));
  box.append(el("span", {}, "hover a tile for its failing checks; click for the node"));
}

// ---- feed ---------------------------------------------------------------------------------------

function onSnapshot(data) {
  nodes.clear();
  for (const t of data.nodes) nodes.set(t.name, t);
  summary = data.summary || {};
  rebuild();
}

function onDelta(d) {
  let structural = false;
  for (const t of d.upsert || []) {
    const prev = nodes.get(t.name);
    nodes.set(t.name, t);
    const a = tiles.get(t.name);
    if (!prev || !a || prev.partition !== t.partition) structural = true;
    else paintTile(a, t);
  }
  for (const name of d.remove || []) { nodes.delete(name); structural = true; }
  if (d.summary) {
    if (JSON.stringify(d.summary.counts) !== JSON.stringify(summary.counts)) chartChanged();
    summary = d.summary;
  }
  if (structural) rebuild(); else refresh();
}

function onConn(mode, text) {
  const c = $("conn");
  c.className = `conn ${mode}`;
  c.textContent = text;
}

function onFilter() {
  writeUrlFilters();
  refresh();
}

async function resetBreaker() {
  const got = await askReason("Reset the circuit breaker? Conditions held back are not replayed; only what is seen again can fence.",
    "Reset breaker", true);
  if (!got) return;
  const r = await adminPost("/api/v1/breaker/reset", got);
  if (r.status === 401) session.setToken("");
  showMessage($("message"), r.ok ? "okmsg" : "error", r.ok ? "Breaker reset." : `Reset refused (${r.status}): ${r.body.error || ""}`);
}

function main() {
  readUrlFilters();
  renderLegend();
  tokenWidget($("token"), () => renderSummary());
  for (const input of Object.values(filterInputs)) input.addEventListener("input", onFilter);
  $("f-names").addEventListener("change", () => { namesTouched = true; writeUrlFilters(); rebuild(); });
  $("filters").addEventListener("submit", (e) => e.preventDefault());
  $("breaker-reset").addEventListener("click", resetBreaker);
  chartChanged = fleetChart($("fleet-history"));
  openFeed({ onSnapshot, onDelta, onConn });
}

main();
