// The fleet page's "Versions" section: which nodes run which driver, VBIOS, HCA firmware, OFED and
// kernel (GET /api/v1/fleet/versions, from each node's drift check). Read-only; refreshed every
// minute while the section is open: versions change with upgrades, not by the second.
import { el, clear, getJSON, natural } from "/ui/static/common.js";

const LABEL = { driver: "Driver", vbios: "VBIOS", hca_fw: "HCA firmware", ofed: "OFED", kernel: "Kernel" };
const SHOW_NODES = 8; // a version this few nodes run lists them (the odd ones out are what an operator looks for)
const REFRESH_MS = 60000;

function plural(n, one, many) { return `${n} ${n === 1 ? one : many}`; }

function row(field, view) {
  const counts = view.counts[field] || {};
  const versions = Object.keys(counts);
  const cells = versions.map((v, i) => {
    const nodes = (view[field][v] || []).slice().sort(natural);
    const few = i > 0 && nodes.length <= SHOW_NODES; // the majority's list is the fleet itself
    return el("li", { className: i === 0 ? "majority" : "minority", title: nodes.join(" ") },
      el("span", { className: "count", text: plural(counts[v], "node runs", "nodes run") }), " ",
      el("code", { text: v }),
      few ? el("span", { className: "nodes" }, " (", ...nodes.flatMap((n, j) => [
        j ? ", " : "", el("a", { href: `/ui/node/${encodeURIComponent(n)}`, text: n })]), ")") : null);
  });
  return el("tr", { dataset: { field } },
    el("th", { scope: "row", text: LABEL[field] || field }),
    el("td", {}, versions.length ? el("ul", { className: "versions" }, ...cells) : el("span", { className: "muted", text: "not reported" })),
    el("td", { className: versions.length > 1 ? "drift" : "", text: versions.length > 1 ? plural(versions.length, "version", "versions") : "" }));
}

export async function renderVersions(box) {
  const status = box.querySelector(".versions-status");
  let view;
  try {
    view = await getJSON("/api/v1/fleet/versions");
  } catch (e) {
    status.textContent = `versions unavailable: ${e.message}`;
    return;
  }
  const table = box.querySelector("table");
  clear(table);
  const fields = Object.keys(view.counts);
  table.append(...fields.map((f) => row(f, view)));
  const spread = fields.filter((f) => Object.keys(view.counts[f]).length > 1).map((f) => LABEL[f] || f);
  status.textContent = `${plural(view.reporting, "node reports", "nodes report")} versions` +
    (view.not_reported.length ? `; ${view.not_reported.length} not (older agents or no report yet)` : "") +
    (spread.length ? ` — more than one version of: ${spread.join(", ")}` : " — one version of everything");
}

export function setupVersions(box) {
  if (!box) return;
  let timer = null;
  box.addEventListener("toggle", () => {
    clearInterval(timer);
    if (box.open) {
      renderVersions(box);
      timer = setInterval(() => renderVersions(box), REFRESH_MS);
    }
  });
}

setupVersions(document.getElementById("versions"));
