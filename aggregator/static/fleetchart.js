// The fleet page's history: nodes by state over the last 24 h as a stacked area chart, from
// GET /ui/api/fleet-history (samples the aggregator takes every ui.history_interval, plus now).
import { getJSON, STATES, STATE_LABEL } from "/ui/static/common.js";
import { svg, tip, timeScale, timeAxis, runs } from "./chart.js";
import { relTime, isoUtc, clockUtc } from "./timefmt.js";

const HOURS = 24;
const MIN_SPAN = 600; // a young history is drawn over at least 10 min, not stretched over a whole day of nothing
const HEIGHT = 150;
const PAD_L = 40;
const PAD_B = 20;
const RELOAD_MS = 60000;
const THROTTLE_MS = 3000; // a burst of changes (a storm) redraws the chart once, not per node

/** Stacked layers: for each state, [[t, low, high], ...] over the samples (a step per sample). */
export function stack(samples, states = STATES) {
  const layers = states.map((s) => ({ state: s, points: [] }));
  for (const smp of samples) {
    let low = 0;
    for (const layer of layers) {
      const n = smp.counts[layer.state] || 0;
      layer.points.push([smp.time, low, low + n]);
      low += n;
    }
  }
  return layers;
}

function areaPath(points, x, y, step) {
  if (!points.length) return "";
  // Each sample holds until the next one: a step, not a slope (a node is fenced or it is not).
  // The last of a run holds for one sampling interval.
  const top = [];
  const bottom = [];
  points.forEach(([t, lo, hi], i) => {
    const x0 = x(t);
    const x1 = i + 1 < points.length ? x(points[i + 1][0]) : Math.max(x0 + 2, x(t + step));
    top.push(`${x0.toFixed(1)},${y(hi).toFixed(1)}`, `${x1.toFixed(1)},${y(hi).toFixed(1)}`);
    bottom.push(`${x0.toFixed(1)},${y(lo).toFixed(1)}`, `${x1.toFixed(1)},${y(lo).toFixed(1)}`); // walked back below
  });
  return `M${top.join("L")}L${bottom.reverse().join("L")}Z`;
}

function render(box, data) {
  const width = Math.max(500, box.clientWidth || 900);
  const now = data.now;
  const full = now - data.hours * 3600;
  const samples = data.samples.filter((s) => s.time >= full);
  // History younger than the window (a new aggregator): start at the first sample.
  const first = samples.length ? samples[0].time : now;
  const t0 = Math.max(full, Math.min(now - MIN_SPAN, first - (now - first) * 0.03));
  const label = document.getElementById("history-span");
  if (label) {
    label.textContent = t0 > full ? `nodes by state, since ${clockUtc(first, now)} (history starts there)`
      : `nodes by state, last ${data.hours} h`;
  }
  const total = Math.max(1, ...samples.map((s) => Object.values(s.counts).reduce((a, b) => a + b, 0)));
  const x = timeScale(t0, now, PAD_L, width - 8);
  const plotH = HEIGHT - PAD_B - 6;
  const y = (v) => 6 + plotH - (v / total) * plotH;
  const chart = svg("svg", { width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, class: "fleetchart", role: "img",
    "aria-label": `nodes by state over the last ${data.hours} hours` });
  chart.append(timeAxis(t0, now, x, 6, plotH, now));
  const yAxis = svg("g", { class: "axis" });
  for (const v of [0, Math.round(total / 2), total]) {
    yAxis.append(svg("text", { x: PAD_L - 6, y: y(v) + 4, "text-anchor": "end" }, String(v)));
  }
  chart.append(yAxis);
  // Where the aggregator was not running there are no samples: the chart leaves that span empty.
  const step = Math.max(data.interval, 5);
  const maxGap = 3 * step + 30;
  const parts = runs(samples, maxGap).map((r) => stack(r));
  STATES.forEach((state, i) => {
    const layers = parts.map((p) => p[i]).filter((l) => l.points.some(([, lo, hi]) => hi > lo));
    if (!layers.length) return;
    const d = layers.map((l) => areaPath(l.points, x, y, Math.min(step, now - l.points[l.points.length - 1][0]))).join("");
    chart.append(svg("path", { d, class: `area st-${state}`, "data-state": state }, tip(STATE_LABEL[state] || state)));
  });
  // A hover strip per sample: the counts at that time.
  samples.forEach((s, i) => {
    const x0 = x(s.time);
    const next = i + 1 < samples.length ? samples[i + 1].time : now;
    const x1 = x(next - s.time > maxGap ? s.time + step : next);
    const counts = STATES.filter((st) => s.counts[st]).map((st) => `${st} ${s.counts[st]}`);
    chart.append(svg("rect", { x: x0.toFixed(1), y: 6, width: Math.max(2, x1 - x0).toFixed(1), height: plotH,
      class: "hover-strip" }, tip(`${isoUtc(s.time)} (${relTime(s.time, now)})\n${counts.join(" · ") || "no nodes"}`)));
  });
  while (box.firstChild) box.removeChild(box.firstChild);
  box.append(chart);
  if (samples.length <= 1) {
    const p = document.createElement("p");
    p.className = "muted";
    const every = data.interval >= 60 ? `${Math.round(data.interval / 60)} min` : `${data.interval} s`;
    p.textContent = `No history yet: the aggregator samples the fleet every ${every}.`;
    box.append(p);
  }
}

/** Load and draw the chart into `box`, then keep it fresh. Returns `changed()`: call it when the
 * counts changed (a fence, a new FAIL) and the chart's right edge follows within THROTTLE_MS. */
export function fleetChart(box) {
  let last = 0;
  let timer = null;
  const load = async () => {
    last = Date.now();
    try {
      render(box, await getJSON(`/ui/api/fleet-history?hours=${HOURS}`));
    } catch (e) {
      box.textContent = `Fleet history unavailable: ${e.message}`;
    }
  };
  load();
  setInterval(load, RELOAD_MS);
  return () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; load(); }, Math.max(0, last + THROTTLE_MS - Date.now()));
  };
}
