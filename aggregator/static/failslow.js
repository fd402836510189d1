// The fail-slow page: per metric, each cohort's distribution of robust z-scores with its outliers
// marked and linked to their history (?node=NAME shows that node's parts over time), and the
// stragglers named in running jobs. Read-only; GET /api/v1/failslow/* only.
import { el, clear, getJSON, showMessage, when, isoUtc } from "/ui/static/common.js";

const SVG = "http://www.w3.org/2000/svg";
const METRICS = [["gemm", "GEMM TFLOPS"], ["clock", "SM clock under load"], ["hbm", "HBM copy"],
  ["nvlink", "NVLink pairs"], ["pcie_h2d", "PCIe host→device"], ["pcie_d2h", "PCIe device→host"],
  ["rdma", "RDMA per HCA"]];
const BIN = 0.5; // z per bar
const LO = -12, HI = 6; // z beyond these lands in the end bars

function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  for (const c of children) if (c) e.append(c);
  return e;
}

/** Bars of the cohort's z-scores; bins holding a finding's z are drawn as outliers. */
export function histogram(zs, flagged) {
  const n = Math.round((HI - LO) / BIN);
  const counts = new Array(n).fill(0);
  const bad = new Array(n).fill(false);
  const bin = (z) => Math.min(n - 1, Math.max(0, Math.floor((z - LO) / BIN)));
  for (const z of zs) counts[bin(z)] += 1;
  for (const z of flagged) bad[bin(z)] = true;
  const max = Math.max(1, ...counts);
  const w = 14, h = 80, axis = 14;
  // An outlier is one part among hundreds: its bar is drawn tall enough to be seen.
  const tall = (c, i) => Math.max(bad[i] ? 12 : 2, (c / max) * h);
  const bars = counts.map((c, i) => c ? svg("rect", {
    x: i * w, y: h - tall(c, i), width: w - 2, height: tall(c, i), class: bad[i] ? "fs-bar outlier" : "fs-bar",
  }, svg("title", {}, document.createTextNode(`z ${(LO + i * BIN).toFixed(1)}…${(LO + (i + 1) * BIN).toFixed(1)}: ${c}`))) : null);
  const zero = svg("line", { x1: (0 - LO) / BIN * w, x2: (0 - LO) / BIN * w, y1: 0, y2: h, class: "fs-median" });
  const ticks = [];
  for (let z = LO; z <= HI; z += 2) {
    ticks.push(svg("text", { x: (z - LO) / BIN * w, y: h + axis - 2, class: "fs-tick" },
      document.createTextNode(z === LO ? `≤${z}` : z === HI ? `≥${z}` : `${z}`)));
  }
  return svg("svg", { viewBox: `-14 0 ${n * w + 28} ${h + axis}`, width: n * w + 28, height: h + axis, class: "fs-hist",
    role: "img", "aria-label": `robust z of ${zs.length} parts, ${flagged.length} outliers` }, ...bars, zero, ...ticks);
}

function cohortBox(c, findings) {
  const mine = findings.filter((f) => f.profile === c.profile && f.driver === c.driver && f.firmware === c.firmware);
  const rows = mine.map((f) => el("tr", { className: f.status === "FAIL" ? "fail" : "warn", dataset: { node: f.node, entity: f.entity } },
    el("td", {}, el("a", { href: `/ui/failslow?node=${encodeURIComponent(f.node)}&metric=${encodeURIComponent(f.check.replace("failslow_", ""))}`, text: f.node })),
    el("td", { className: "mono", text: f.entity }),
    el("td", { text: f.z.toFixed(1) }),
    el("td", { text: `${f.below_pct.toFixed(1)}%` }),
    el("td", { text: `${f.status}${f.action !== "NONE" ? " " + f.action : ""}` }),
    el("td", { text: f.summary })));
  return el("div", { className: "fs-cohort", dataset: { metric: c.metric, driver: c.driver } },
    el("h3", {}, `${c.profile} on ${c.driver}`, c.firmware ? ` / ${c.firmware}` : "",
      el("span", { className: "muted", text: ` · ${c.size} parts · median ${c.median.toFixed(1)}${c.judged ? "" : " · too few to judge"}` })),
    histogram(c.z, mine.map((f) => f.z)),
    rows.length ? el("table", { className: "fs-findings" },
      el("thead", {}, el("tr", {}, ...["node", "part", "z", "below median", "status", "finding"].map((t) => el("th", { text: t })))),
      el("tbody", {}, ...rows)) : el("p", { className: "muted", text: "no outliers" }));
}

function sparkline(points) {
  const w = 240, h = 40;
  if (!points.length) return el("span", { className: "muted", text: "no history" });
  const rs = points.map((p) => p.ratio);
  const lo = Math.min(0.85, ...rs), hi = Math.max(1.05, ...rs);
  const x = (i) => points.length === 1 ? w / 2 : (i / (points.length - 1)) * w;
  const y = (r) => h - ((r - lo) / (hi - lo)) * h;
  const line = svg("polyline", { points: points.map((p, i) => `${x(i)},${y(p.ratio)}`).join(" "), class: "fs-line" });
  const dots = points.map((p, i) => svg("circle", { cx: x(i), cy: y(p.ratio), r: 2.5, class: p.flagged ? "fs-dot outlier" : "fs-dot" },
    svg("title", {}, document.createTextNode(`${isoUtc(p.at)}: ${(p.ratio * 100).toFixed(1)}% of the median, z ${p.z}`))));
  const median = svg("line", { x1: 0, x2: w, y1: y(1), y2: y(1), class: "fs-median" });
  return svg("svg", { viewBox: `0 0 ${w} ${h}`, width: w, height: h, class: "fs-spark" }, median, line, ...dots);
}

async function renderHistory(node, metric) {
  const box = document.getElementById("history");
  box.hidden = false;
  document.getElementById("history-title").textContent = `${node}: each part against its cohort's median over time`;
  const body = document.getElementById("history-body");
  clear(body);
  const view = await getJSON(`/api/v1/failslow/nodes/${encodeURIComponent(node)}`);
  const want = metric ? view.entities.filter((e) => e.metric.startsWith(metric)) : view.entities;
  if (!want.length) { body.append(el("p", { className: "muted", text: "no probe results from this node" })); return; }
  body.append(el("table", { className: "fs-history" }, el("tbody", {}, ...want.map((e) => el("tr", { dataset: { entity: e.entity, metric: e.metric } },
    el("td", { className: "mono", text: e.entity }), el("td", { text: e.metric }),
    el("td", { text: e.value === null ? "—" : e.value.toFixed(1) }),
    el("td", { text: e.z === null || e.z === undefined ? "—" : `z ${e.z.toFixed(1)}` }),
    el("td", {}, sparkline(e.points)))))));
  if (view.passive && view.passive.length) {
    body.append(el("h3", {}, "What the collectors saw between its last two probe rounds ", when(view.passive_at)),
      el("table", { className: "fs-passive" }, el("tbody", {}, ...view.passive.map((p) => el("tr", { dataset: { entity: p.entity, signal: p.signal } },
        el("td", { className: "mono", text: p.entity }), el("td", { text: p.signal }), el("td", { text: String(p.value) }))))));
  }
  body.append(el("p", {}, el("a", { href: `/ui/node/${encodeURIComponent(node)}`, text: `${node}'s node page` })));
}

async function render() {
  const params = new URLSearchParams(location.search);
  const select = document.getElementById("metric");
  const metric = params.get("metric") || "gemm";
  clear(select);
  for (const [k, label] of METRICS) select.append(el("option", { value: k, text: label, selected: k === metric }));
  select.onchange = () => { params.set("metric", select.value); location.search = params.toString(); };
  const msg = document.getElementById("message");
  try {
    if (params.get("node")) await renderHistory(params.get("node"), metric);
    const out = await getJSON(`/api/v1/failslow/outliers?metric=${encodeURIComponent(metric)}`);
    const judged = document.getElementById("judged");
    clear(judged);
    judged.append(...(out.scored_at ? ["judged ", when(out.scored_at)] : ["not judged yet"]));
    const box = document.getElementById("cohorts");
    clear(box);
    document.getElementById("cohort-count").textContent = `(${out.cohorts.length})`;
    if (!out.cohorts.length) box.append(el("p", { className: "muted", text: "no probe results yet (agents probe idle nodes at failslow.interval)" }));
    for (const c of out.cohorts) box.append(cohortBox(c, out.findings));
    const st = await getJSON("/api/v1/failslow/stragglers");
    const sbox = document.getElementById("stragglers");
    clear(sbox);
    document.getElementById("straggler-count").textContent = `(${st.stragglers.length})`;
    sbox.append(st.stragglers.length ? el("table", { className: "fs-stragglers" },
      el("thead", {}, el("tr", {}, ...["job", "owner", "node", "GPU", "reason", "why"].map((t) => el("th", { text: t })))),
      el("tbody", {}, ...st.stragglers.map((s) => el("tr", { dataset: { job: s.job, node: s.node } },
        el("td", { className: "mono", text: s.job }), el("td", { text: s.owner || "—" }),
        el("td", {}, el("a", { href: `/ui/node/${encodeURIComponent(s.node)}`, text: s.node })),
        el("td", { text: s.gpu === null ? "node" : `gpu${s.gpu}` }), el("td", { text: s.reason }),
        el("td", { text: s.detail }))))) : el("p", { className: "muted", text: "no stragglers in running jobs" }));
  } catch (e) {
    showMessage(msg, "error", `fail-slow data unavailable: ${e.message}`);
  }
}

render();
