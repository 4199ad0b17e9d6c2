// The free-memory chart of one resource over the last hour: free memory as a
// line (the lowest sample of each point shaded below it), the reserve drawn
// as a floor no job touches, and each job marked as a band along the top.

const NS = "http://www.w3.org/2000/svg";
const W = 900, H = 170, L = 48, R = 8, T = 16, B = 18;

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function mib(n) {
  return n >= 10240 ? `${(n / 1024).toFixed(0)} GiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} GiB` : `${n} MiB`;
}

/** An SVG chart for `resource` (from /status) with `points` and `jobs` (from /history). */
export function memoryChart(resource, history, jobs) {
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "data-chart": resource.name });
  const window = history?.window_s ?? 3600;
  const points = history?.points ?? [];
  const total = Math.max(resource.total_mib ?? 0, ...points.map((p) => p.total_mib), resource.reserve_mib, 1);
  const x = (age) => L + (W - L - R) * (1 - Math.min(age, window) / window);
  const y = (v) => T + (H - T - B) * (1 - v / total);
  svg.append(el("title", {}, `${resource.name}: free memory over the last hour, reserve ${mib(resource.reserve_mib)}`));
  // The reserve: a floor the job never touches (MEM-01).
  svg.append(el("rect", { class: "floor", x: L, y: y(resource.reserve_mib), width: W - L - R, height: y(0) - y(resource.reserve_mib) }));
  svg.append(el("line", { class: "reserve", x1: L, x2: W - R, y1: y(resource.reserve_mib), y2: y(resource.reserve_mib), "data-reserve": resource.reserve_mib }));
  svg.append(el("text", { x: W - R - 2, y: y(resource.reserve_mib) - 3, "text-anchor": "end" }, `reserve ${mib(resource.reserve_mib)}`));
  svg.append(el("line", { class: "axis", x1: L, x2: W - R, y1: y(0), y2: y(0) }));
  svg.append(el("text", { x: L - 4, y: y(total) + 4, "text-anchor": "end" }, mib(total)));
  svg.append(el("text", { x: L - 4, y: y(0), "text-anchor": "end" }, "0"));
  for (const [age, label] of [[window, "−60 min"], [window / 2, "−30 min"], [0, "now"]]) {
    svg.append(el("text", { x: x(age), y: H - 4, "text-anchor": age === window ? "start" : age === 0 ? "end" : "middle" }, label));
  }
  // Jobs on this resource: a band from admission to release (open: still held).
  for (const job of jobs.filter((j) => j.resources.includes(resource.name))) {
    const x1 = x(job.started_age_s), x2 = x(job.ended_age_s ?? 0);
    const band = el("rect", { class: job.ended_age_s == null ? "job open" : "job", x: x1, y: T - 10, width: Math.max(2, x2 - x1), height: 8, "data-entry": job.entry });
    band.append(el("title", {}, `${job.entry} on ${job.upstream}${job.ended_age_s == null ? " (still holding)" : ""}`));
    svg.append(band);
  }
  if (points.length > 0) {
    const line = points.map((p) => `${x(p.age_s).toFixed(1)},${y(p.free_mib).toFixed(1)}`).join(" ");
    const dips = points.map((p) => `${x(p.age_s).toFixed(1)},${y(p.min_free_mib).toFixed(1)}`);
    const area = [...points.map((p) => `${x(p.age_s).toFixed(1)},${y(p.free_mib).toFixed(1)}`), ...dips.reverse()].join(" ");
    svg.append(el("polygon", { class: "dip", points: area }));
    svg.append(el("polyline", { class: "free", points: line, "data-points": points.length }));
  } else {
    svg.append(el("text", { x: (L + W) / 2, y: H / 2, "text-anchor": "middle" }, "no samples yet"));
  }
  return svg;
}
