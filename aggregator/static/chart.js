// Small SVG helpers for the node timeline and the fleet history chart. Built with createElementNS
// and setAttribute only (the CSP forbids inline style and markup); colours come from CSS classes.
import { clockUtc, isoUtc } from "./timefmt.js";

const NS = "http://www.w3.org/2000/svg";

/** svg("rect", {x: 1, class: "a"}, child, ...): an SVG element; strings become text nodes. */
export function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/** A hover text for an SVG shape (its <title> child). */
export function tip(text) {
  return svg("title", {}, text);
}

/**
 * Samples split where the sampler was away (the aggregator stopped): a gap longer than `maxGap`
 * seconds starts a new run, so a chart draws nothing there instead of stretching the last value.
 */
export function runs(samples, maxGap) {
  const out = [];
  let run = [];
  for (const s of samples) {
    if (run.length && s.time - run[run.length - 1].time > maxGap) { out.push(run); run = []; }
    run.push(s);
  }
  if (run.length) out.push(run);
  return out;
}

/** Linear time scale [t0, t1] -> [x0, x1]. */
export function timeScale(t0, t1, x0, x1) {
  const span = Math.max(1e-9, t1 - t0);
  return (t) => x0 + ((t - t0) / span) * (x1 - x0);
}

const STEPS = [60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];

/** About `want` round UTC tick times between t0 and t1 (on minute/hour/day boundaries). */
export function timeTicks(t0, t1, want = 6) {
  const step = STEPS.find((s) => (t1 - t0) / s <= want) || STEPS[STEPS.length - 1];
  const out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) out.push(t);
  return out;
}

/** The time axis: tick lines over `height` and "HH:MM UTC" labels below; hover shows the ISO instant. */
export function timeAxis(t0, t1, x, top, height, now) {
  const g = svg("g", { class: "axis" });
  for (const t of timeTicks(t0, t1)) {
    const px = x(t).toFixed(1);
    g.append(svg("line", { x1: px, x2: px, y1: top, y2: top + height, class: "grid" }),
      svg("text", { x: px, y: top + height + 14, "text-anchor": "middle" }, clockUtc(t, now), tip(isoUtc(t))));
  }
  return g;
}
