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

// The borrowers' use per UTC day: the seconds reserved on each resource kind,
// stacked, one bar a day from the report's start to today.

const KINDS = ["gpu", "memory", "cpu"];
const UW = 900, UH = 190, UB = 32;

function seconds(s) {
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

/** An SVG bar chart of `/usage?by=day` (`report`): reserved seconds per day. */
export function usageChart(report) {
  const svg = el("svg", { viewBox: `0 0 ${UW} ${UH}`, class: "chart usage", role: "img", id: "usage-chart" });
  const day = (ms) => new Date(ms).toISOString().slice(0, 10);
  const today = Date.now();
  const from = Math.max(report?.since_unix_ms ?? today - 30 * 86400000, today - 400 * 86400000);
  const days = [];
  for (let t = Date.parse(`${day(from)}T00:00:00Z`); day(t) <= day(today); t += 86400000) days.push(day(t));
  const rows = new Map((report?.rows ?? []).map((r) => [r.day, r]));
  const total = (r) => KINDS.reduce((n, k) => n + (r?.reserved_s?.[k] ?? 0), 0);
  const top = Math.max(...days.map((d) => total(rows.get(d)))) || 1;
  const slot = (UW - L - R) / Math.max(days.length, 1);
  const y = (v) => T + (UH - T - UB) * (1 - v / top);
  svg.append(el("title", {}, "Seconds reserved by borrowers per UTC day, by resource kind"));
  svg.append(el("line", { class: "axis", x1: L, x2: UW - R, y1: y(0), y2: y(0) }));
  svg.append(el("text", { x: L - 4, y: y(top) + 4, "text-anchor": "end" }, seconds(top)));
  svg.append(el("text", { x: L - 4, y: y(0), "text-anchor": "end" }, "0"));
  days.forEach((d, i) => {
    const r = rows.get(d);
    const x = L + i * slot;
    if (i === 0 || i === days.length - 1 || i % 7 === 0) {
      svg.append(el("text", { x: x + slot / 2, y: UH - UB + 14, "text-anchor": "middle" }, d.slice(5)));
    }
    if (!r || (r.jobs === 0 && total(r) === 0)) return;
    const g = el("g", { class: "day", "data-day": d, "data-jobs": r.jobs });
    g.append(el("title", {}, `${d}: ${r.jobs} ${r.jobs === 1 ? "job" : "jobs"}; reserved ${KINDS.map((k) => `${k} ${seconds(r.reserved_s?.[k] ?? 0)}`).join(", ")}`));
    let base = 0;
    for (const k of KINDS) {
      const v = r.reserved_s?.[k] ?? 0;
      if (v <= 0) continue;
      // A sliver stays visible beside a long day.
      const h = Math.max(y(base) - y(base + v), 2);
      g.append(el("rect", { class: `bar ${k}`, "data-kind": k, x: x + slot * 0.15, y: y(base) - h, width: slot * 0.7, height: h }));
      base += v;
    }
    if (base === 0) g.append(el("rect", { class: "bar none", x: x + slot * 0.15, y: y(0) - 2, width: slot * 0.7, height: 2 }));
    svg.append(g);
  });
  KINDS.forEach((k, i) => {
    svg.append(el("rect", { class: `key ${k}`, x: L + i * 130, y: UH - 12, width: 10, height: 10 }));
    svg.append(el("text", { x: L + i * 130 + 14, y: UH - 3 }, `${k} seconds`));
  });
  if (!rows.size) svg.append(el("text", { x: (L + UW) / 2, y: UH / 2, "text-anchor": "middle" }, "nothing recorded in these days yet"));
  return svg;
}
