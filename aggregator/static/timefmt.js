// Times as people read them: "3 min ago" on the page, the exact instant in UTC on hover.
// Pure functions (no DOM), so tests run them in Node as well as in the browser.

const MINUTE = 60;
const HOUR = 3600;
const DAY = 86400;

/** "just now", "42 s ago", "3 min ago", "2 h 5 min ago", "3 d 4 h ago"; "in 3 min" for a future time. */
export function relTime(t, now = Date.now() / 1000) {
  if (!t) return "never";
  const d = Math.round(now - t);
  const s = Math.abs(d);
  let span;
  if (s < 5) return "just now";
  if (s < MINUTE) span = `${s} s`;
  else if (s < HOUR) span = `${Math.floor(s / MINUTE)} min`;
  else if (s < DAY) {
    const m = Math.floor((s % HOUR) / MINUTE);
    span = `${Math.floor(s / HOUR)} h${m ? ` ${m} min` : ""}`;
  } else {
    const h = Math.floor((s % DAY) / HOUR);
    span = `${Math.floor(s / DAY)} d${h ? ` ${h} h` : ""}`;
  }
  return d >= 0 ? `${span} ago` : `in ${span}`;
}

/** ISO 8601 in UTC to the second: "2026-12-01T15:06:12Z". */
export function isoUtc(t) {
  if (!t) return "";
  return new Date(t * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** "15:06 UTC" (with the date when not today, UTC): axis labels, where a relative time would drift. */
export function clockUtc(t, now = Date.now() / 1000) {
  const iso = isoUtc(t);
  const day = iso.slice(0, 10);
  const hm = iso.slice(11, 16);
  return day === isoUtc(now).slice(0, 10) ? `${hm} UTC` : `${day.slice(5)} ${hm} UTC`;
}
