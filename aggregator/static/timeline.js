// The node page's timeline: what happened to one node, drawn from GET /api/v1/nodes/{name}/history.
// Rows: the node's worst verdict over time; one row per check/entity that went bad (coloured by
// status, a dot at each change); fences (the fenced span, a mark at each fence and release, a square
// at each remediation step: GPU reset, reboot, repair); XID /
// SXid events (a diamond with the code). Every mark says what and when (ISO, UTC) on hover.
import { svg, tip, timeScale, timeAxis } from "./chart.js";
import { relTime, isoUtc } from "./timefmt.js";

const RANK = { OK: 0, UNKNOWN: 1, WARN: 2, FAIL: 3 };
const LABEL_W = 150; // left column: row names
const ROW_H = 22;
const MAX_CHECK_ROWS = 8; // more bad checks than this: the rest are summed up in the legend line
const MIN_SPAN = 120; // a node seen for seconds gets two minutes, not its few seconds stretched across
const MAX_AUTO_SPAN = 7 * 86400; // "auto" never reaches further back than a week: recent marks stay apart
const RIGHT_PAD = 30; // room for an XID code label at "now"

const worst = (statuses) => statuses.reduce((a, s) => (RANK[s] > RANK[a] ? s : a), "OK");
const when = (t) => `${isoUtc(t)} (${relTime(t)})`;

/** Segments [{t0, t1, status}] of each check/entity, and the node's worst status, from verdict changes. */
export function verdictSpans(verdicts, start, now) {
  const rows = new Map(); // "check entity" -> {key, first, spans, marks}
  const open = new Map(); // key -> {t, status}
  const sorted = [...verdicts].sort((a, b) => a.time - b.time);
  const node = [];
  let nodeOpen = { t: start, status: "OK" };
  for (const v of sorted) {
    const key = `${v.check} ${v.entity}`;
    if (!rows.has(key)) rows.set(key, { key, first: v.time, spans: [], marks: [] });
    const row = rows.get(key);
    row.marks.push(v);
    const prev = open.get(key);
    if (prev && prev.status !== "OK") row.spans.push({ t0: prev.t, t1: v.time, status: prev.status });
    open.set(key, { t: v.time, status: v.status });
    const w = worst([...open.values()].map((o) => o.status));
    if (w !== nodeOpen.status) {
      node.push({ t0: nodeOpen.t, t1: v.time, status: nodeOpen.status });
      nodeOpen = { t: v.time, status: w };
    }
  }
  for (const [key, o] of open) if (o.status !== "OK") rows.get(key).spans.push({ t0: o.t, t1: now, status: o.status });
  node.push({ t0: nodeOpen.t, t1: now, status: nodeOpen.status });
  // Only rows that were ever not OK: an all-OK check adds nothing to read.
  const bad = [...rows.values()].filter((r) => r.marks.some((m) => m.status !== "OK")).sort((a, b) => a.first - b.first);
  return { node, rows: bad };
}

/** Fenced spans from the audit log ("fence done" .. "release done"); `fencedNow` closes the last at now. */
export function fenceSpans(audit, fencedAt, fencedNow, start, now) {
  const spans = [];
  let from = null;
  for (const a of [...audit].sort((x, y) => x.time - y.time)) {
    if (a.what === "fence done" && from === null) from = a.time;
    if (a.what === "release done") {
      spans.push({ t0: from ?? start, t1: a.time });
      from = null;
    }
  }
  if (fencedNow) spans.push({ t0: from ?? Math.max(start, fencedAt || start), t1: now });
  return spans;
}

const LABEL_CHARS = 20; // what fits in LABEL_W at the label's size; a longer name is cut, whole on hover

function row(label, y, width, cls = "") {
  const cut = label.length > LABEL_CHARS;
  const text = svg("text", { x: 4, y: y + ROW_H / 2 + 4, class: "tl-label" }, cut ? `${label.slice(0, LABEL_CHARS - 1)}…` : label);
  return svg("g", { class: `tl-row ${cls}` }, cut ? svg("g", {}, text, tip(label)) : text,
    svg("line", { x1: LABEL_W, x2: width, y1: y + ROW_H / 2, y2: y + ROW_H / 2, class: "tl-track" }));
}

function bar(x, t0, t1, y, cls, text) {
  const x0 = x(t0);
  return svg("rect", { x: x0.toFixed(1), y: y + 5, width: Math.max(2, x(t1) - x0).toFixed(1), height: ROW_H - 10,
    rx: 2, class: cls }, tip(text));
}

/** The span shown: `span` seconds back from now, or (0, "auto") from the node's first record. */
export function timeRange(items, node, now, span = 0) {
  if (span > 0) return [now - span, now];
  const times = items.map((i) => i.time).filter((t) => t > 0);
  if (node.first_seen > 0) times.push(node.first_seen);
  const earliest = Math.min(now, ...times);
  const auto = Math.min(MAX_AUTO_SPAN, Math.max(MIN_SPAN, now - earliest));
  return [now - auto * 1.03, now]; // a little room left of the first mark
}

/** Draw the timeline of `node` (GET /api/v1/nodes/{name}) from its history items into `box`;
 * `span`: seconds back from now, 0 = from the node's first record (at most a week). */
export function renderTimeline(box, items, node, now = Date.now() / 1000, span = 0) {
  const [start] = timeRange(items, node, now, span);
  const inRange = items.filter((i) => i.time >= start);
  const audit = inRange.filter((i) => i.type === "audit");
  const events = inRange.filter((i) => i.type === "event" && i.event && i.event.event);
  const width = Math.max(600, box.clientWidth || 1000);
  const x = timeScale(start, now, LABEL_W + 6, width - RIGHT_PAD);
  // Before the node was first seen (or its first record, if older) there is nothing to say about it:
  // its verdict row starts there. Every verdict counts (one that opened before the span still
  // colours it); spans are clipped to the span.
  const known = Math.min(now, node.first_seen || now, ...items.map((i) => i.time).filter((t) => t > 0));
  const all = verdictSpans(items.filter((i) => i.type === "verdict"), known, now);
  const clip = (spans) => spans.filter((s) => s.t1 > start).map((s) => ({ ...s, t0: Math.max(s.t0, start) }));
  const nodeSpans = clip(all.node);
  const rows = all.rows.map((r) => ({ ...r, spans: clip(r.spans), marks: r.marks.filter((m) => m.time >= start) }))
    .filter((r) => r.spans.length || r.marks.some((m) => m.status !== "OK"));
  const shown = rows.slice(0, MAX_CHECK_ROWS);
  const fenced = clip(fenceSpans(items.filter((i) => i.type === "audit"), node.fenced_at,
    node.fence === "fenced" || node.fence === "releasing", start, now));
  const nRows = 3 + shown.length; // verdict, checks..., fence, events
  const height = nRows * ROW_H + 26;
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "timeline", role: "img",
    "aria-label": `timeline of ${node.name}: verdicts, fences and events` });
  chart.append(timeAxis(start, now, x, 0, nRows * ROW_H, now));
  let y = 0;

  chart.append(row("verdict", y, width, "tl-node"));
  for (const s of nodeSpans) chart.append(bar(x, s.t0, s.t1, y, `st-${s.status}`, `${s.status} from ${when(s.t0)}`));
  y += ROW_H;

  for (const r of shown) {
    const g = row(r.key, y, width);
    for (const s of r.spans) g.append(bar(x, s.t0, s.t1, y, `st-${s.status}`, `${r.key}: ${s.status} from ${when(s.t0)}`));
    for (const m of r.marks) {
      g.append(svg("circle", { cx: x(m.time).toFixed(1), cy: y + ROW_H / 2, r: 4, class: `tl-mark st-${m.status}`,
        "data-kind": "verdict" }, tip(`${r.key} → ${m.status}${m.action && m.action !== "NONE" ? ` (${m.action})` : ""}`
        + ` at ${when(m.time)}${m.summary ? `\n${m.summary}` : ""}`)));
    }
    chart.append(g);
    y += ROW_H;
  }

  const fg = row("fenced", y, width, "tl-fence");
  for (const s of fenced) fg.append(bar(x, s.t0, s.t1, y, "st-fenced", `fenced from ${when(s.t0)}`));
  for (const a of audit) {
    // fences and releases, and the remediation ladder's steps (aggregator: reset_gpu, reboot, repair)
    const m = /^(fence|release|reset_gpu|reboot|repair) (done|failed)$/.exec(a.what);
    if (!m) continue;
    const cx = x(a.time);
    const cy = y + ROW_H / 2;
    if (m[1] !== "fence" && m[1] !== "release") {
      fg.append(svg("rect", { x: (cx - 5).toFixed(1), y: cy - 5, width: 10, height: 10, rx: 2,
        class: `tl-mark tl-step ${m[2] === "failed" ? "tl-failed" : ""}`, "data-kind": m[1] },
      tip(`${a.what} by ${a.who} at ${when(a.time)}\n${a.why || ""}`)));
      continue;
    }
    const up = m[1] === "release";
    const pts = up ? `${cx - 6},${cy + 6} ${cx + 6},${cy + 6} ${cx},${cy - 7}` : `${cx - 6},${cy - 6} ${cx + 6},${cy - 6} ${cx},${cy + 7}`;
    fg.append(svg("polygon", { points: pts, class: `tl-mark tl-${m[1]} ${m[2] === "failed" ? "tl-failed" : ""}`,
      "data-kind": m[1] }, tip(`${a.what} by ${a.who} at ${when(a.time)}\n${a.why || ""}`)));
  }
  chart.append(fg);
  y += ROW_H;

  const eg = row("XID / SXid", y, width, "tl-events");
  for (const item of events) {
    const e = item.event.event;
    const cx = x(item.time);
    const cy = y + ROW_H / 2;
    const where = e.gpu !== null && e.gpu !== undefined ? `gpu${e.gpu}` : (e.device || e.pci_bus_id || "");
    const kind = String(e.kind || "event");
    eg.append(svg("g", { class: "tl-event", "data-kind": kind },
      svg("polygon", { points: `${cx},${cy - 7} ${cx + 6},${cy} ${cx},${cy + 7} ${cx - 6},${cy}`, class: "tl-mark tl-xid" }),
      svg("text", { x: (cx + 8).toFixed(1), y: cy + 4, class: "tl-code" }, String(e.code ?? "")),
      tip(`${kind.toUpperCase()} ${e.code ?? ""} on ${where} at ${when(item.time)}\n${e.text || ""}`)));
  }
  chart.append(eg);

  while (box.firstChild) box.removeChild(box.firstChild);
  box.append(chart);
  if (rows.length > shown.length) {
    const note = document.createElement("p");
    note.className = "muted";
    note.textContent = `${rows.length - shown.length} more checks went bad in this span (see Verdict changes below).`;
    box.append(note);
  }
}
