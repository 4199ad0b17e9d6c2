// The owner console. Everything it shows comes from /status (pushed by the
// /events stream), /history, /usage and /settings; every control is an /admin call
// with the same token and Vacancy-Intent header as the API. The token is
// kept in sessionStorage only: never a cookie, never the URL.

import { memoryChart, usageChart } from "./chart.js";

const TOKEN_KEY = "vacancy-token";
const state = { status: null, history: null, usage: null, usageJobs: null, form: null, seen: 0, down: null, page: "overview" };
const PAGES = ["overview", "workloads", "borrowers", "settings"];

// ---- small DOM helpers (text only: nothing from the daemon becomes markup) ----

function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === false || v == null) continue;
    if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) if (c != null && c !== false) e.append(c instanceof Node ? c : String(c));
  return e;
}
const $ = (id) => document.getElementById(id);
const list = (xs) => (xs.length ? xs.join(", ") : "none");
function mib(n) {
  if (n == null) return "—";
  return n >= 1024 ? `${(n / 1024).toFixed(1)} GiB` : `${n} MiB`;
}
function age(s) {
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}
const clock = (t) => new Date(t).toLocaleTimeString();
/** Seconds with a fraction (reserved and waited time). */
function dur(s) {
  if (s == null) return "—";
  return s < 60 ? `${s.toFixed(s < 10 ? 1 : 0)} s` : age(Math.round(s));
}

// ---- the token and the admin calls ----

const token = () => sessionStorage.getItem(TOKEN_KEY);
/** Reads send the token too: beyond loopback they need scope read. */
const reading = () => (token() ? { headers: { authorization: `Bearer ${token()}` } } : {});

function notice(text, kind) {
  const n = $("notice");
  n.className = `banner ${kind ?? ""}`;
  n.textContent = text;
  n.hidden = !text;
}

function askToken(why) {
  $("token-form").hidden = false;
  $("token-note").textContent = why ?? "";
  $("token-input").focus();
}

/** POST an /admin call; show the daemon's answer, its refusal text when refused. */
async function admin(path, intent, body, done) {
  const headers = { "content-type": "application/json", "vacancy-intent": intent };
  const t = token();
  if (t) headers.authorization = `Bearer ${t}`;
  let reply;
  try {
    const r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
    reply = { status: r.status, body: await r.json().catch(() => ({})) };
  } catch (e) {
    notice(`vacancyd did not answer: ${e.message}`, "bad");
    return null;
  }
  if (reply.status >= 200 && reply.status < 300) {
    notice(done(reply.body), "good");
  } else {
    const err = reply.body?.error ?? {};
    notice(`Refused (${reply.status} ${err.code ?? ""}): ${err.message ?? "no reason given"}`, "bad");
    if (reply.status === 401) askToken("Enter a token of scope owner (admin for advanced permissions).");
  }
  return reply;
}

// ---- live status: the event stream, with the time it was last heard from ----

function connect() {
  const es = new EventSource("/events");
  const heard = () => {
    state.streaming = true;
    state.seen = Date.now();
    if (state.down) {
      state.down = null;
      showLink();
    }
  };
  es.addEventListener("status", (e) => {
    heard();
    state.status = JSON.parse(e.data);
    render();
  });
  es.addEventListener("ping", heard);
  es.addEventListener("open", heard);
  es.addEventListener("error", () => {
    state.streaming = false;
    // EventSource cannot send a token: where /events is refused (beyond
    // loopback without one) or the daemon is away, poll /status instead.
    poll();
  });
}

let polling = false;
async function poll() {
  if (polling) return;
  polling = true;
  // Until the stream is back.
  while (!state.streaming) {
    try {
      const r = await fetch("/status", reading());
      if (r.ok) {
        state.seen = Date.now();
        state.down = null;
        state.status = await r.json();
        render();
      } else if (r.status === 401 || r.status === 403) {
        askToken("From this address the console needs a token of scope read to show the status.");
      } else if (!state.down) {
        state.down = Date.now();
      }
    } catch {
      if (!state.down) state.down = Date.now();
    }
    showLink();
    await new Promise((done) => setTimeout(done, 2000));
  }
  polling = false;
}

function showLink() {
  const link = $("link"), down = $("down");
  if (state.down) {
    link.className = "link stale";
    link.textContent = "not answering";
    down.hidden = false;
    down.textContent = `vacancyd is not answering since ${clock(state.down)}; what you see is its last status (${state.seen ? clock(state.seen) : "none received"}). The console reconnects by itself.`;
  } else {
    link.className = "link live";
    link.textContent = state.seen ? `live · ${clock(state.seen)}` : "live";
    down.hidden = true;
  }
}

// A stream that goes quiet without an error (a hung daemon) counts as down too.
setInterval(() => {
  if (!state.down && state.seen && Date.now() - state.seen > 25000) {
    state.down = state.seen;
  }
  showLink();
}, 1000);

async function loadHistory() {
  try {
    const r = await fetch("/history", reading());
    if (r.ok) state.history = await r.json();
  } catch {
    /* shown by the stream's state */
  }
  if (state.page === "overview") render();
}

// ---- pages ----

/**
 * The sign: the daemon's own words (/status "sign"), shown as they are so the
 * console and the Windows tray say the same (SCOPE-16, SCOPE-17).
 */
function vetoLine(s) {
  const sg = s.sign;
  return h("div", { class: "veto", id: "veto", "data-state": sg.state },
    h("span", { id: "veto-headline" }, sg.headline),
    sg.detail ? h("div", { class: "muted", id: "veto-detail" }, sg.detail) : null,
    sg.attention ? h("div", { class: "attention", id: "attention" }, sg.attention) : null);
}

function sign(u) {
  const v = u.vacancy;
  if (v.admitting) return h("span", { class: "sign admitting", "data-sign": u.name }, "admitting");
  // A new request would wait its turn in the route's wait line ([upstream.queue]).
  if (v.queueing != null) return h("span", { class: "sign queueing", "data-sign": u.name }, `queueing (${v.queueing} waiting)`);
  return h("span", { class: "sign refusing", "data-sign": u.name }, v.code ?? "refusing");
}

// ---- the owner's terms beyond presence (issue 35) ----

function termName(t) {
  if (t.term === "lending_hours") return "Lending hours";
  if (t.term === "battery") return "Battery";
  return `Heat and power of ${t.resource}`;
}

/** Every term in force, whether it refuses now and why, what it reads. */
function termsCard(s) {
  const terms = s.terms ?? [];
  if (!terms.length) return null;
  return h("div", { class: "card", id: "terms" },
    h("h3", {}, "The owner's terms"),
    h("ul", { class: "terms" }, terms.map((t) => h("li", { "data-term": t.resource ? `${t.term}:${t.resource}` : t.term, class: t.refusing ? "refusing" : "" },
      h("strong", {}, termName(t)), " ",
      t.refusing ? h("span", { class: "sign refusing" }, t.code) : h("span", { class: "sign admitting" }, "admits"),
      h("div", { class: "muted" }, t.now),
      t.refusing && t.reason ? h("div", { class: "note", "data-term-reason": t.term }, t.reason) : null,
      h("div", { class: "note" }, t.in_force)))));
}

/** When lending opens or closes next, under each vacancy sign. */
function hoursNote(s) {
  const hours = (s.terms ?? []).find((t) => t.term === "lending_hours");
  if (!hours?.next_change) return null;
  const n = hours.next_change;
  return h("div", { class: "note", "data-hours": "" }, `Lending ${n.change} at ${n.at} (in ${age(n.in_s)})`);
}

function overview(s) {
  const admitting = s.upstreams.filter((u) => u.vacancy.admitting).map((u) => u.name);
  const exempt = s.owner_veto.exempt_upstreams;
  const manual = s.presence_backend === "manual";
  const lendingCard = h("div", { class: "card" },
    h("h3", {}, "Lending"),
    h("div", { class: "row spread" },
      h("span", { id: "lending-state" }, s.lending ? "on" : "paused"),
      h("button", { id: "lending-toggle", type: "button", on: { click: () => admin("/admin/lending", "lending", { enabled: !s.lending }, (b) => (b.lending ? "Lending resumed" : "Lending paused")) } },
        s.lending ? "Pause lending" : "Resume lending")),
    h("div", { class: "section" }, vetoLine(s)),
    exempt.length ? h("div", { class: "muted", id: "exempt-routes" }, `Exempt from owner presence (owner_scope = "resource"): ${exempt.join(", ")}`) : null);
  const presenceCard = h("div", { class: "card" },
    h("h3", {}, "Owner presence"),
    h("div", { class: "kv" }, h("dt", {}, "backend"), h("dd", { id: "presence-backend" }, s.presence_backend), h("dt", {}, "owner"), h("dd", { id: "presence-state" }, s.owner)),
    manual ? h("div", { class: "row section" },
      h("button", { id: "presence-present", type: "button", on: { click: () => admin("/admin/owner", "presence", { present: true }, () => "Owner marked present") } }, "Owner present"),
      h("button", { id: "presence-away", type: "button", on: { click: () => admin("/admin/owner", "presence", { present: false }, () => "Owner marked away") } }, "Owner away"))
      : h("div", { class: "note section" }, "Set by the backend; buttons appear with [owner] presence = \"manual\"."));
  const signs = h("div", { class: "grid" }, s.upstreams.map((u) => h("div", { class: "card", "data-route": u.name },
    h("div", { class: "row spread" }, h("h3", {}, u.name), h("span", { class: "pill" }, u.adapter)),
    h("div", { class: "row" }, sign(u), u.owner_scope === "resource" ? h("span", { class: "pill" }, "exempt") : null),
    u.vacancy.admitting ? null : h("div", { class: "muted", "data-reason": u.name }, u.vacancy.reason ?? ""),
    hoursNote(s),
    lineNote(u))));
  const hist = state.history;
  const resources = h("div", { class: "resources" }, s.resources.map((r) => {
    const pressure = s.gpu_pressure.includes(r.name);
    return h("div", { class: "card resource", "data-resource": r.name }, h("div", {},
      h("div", { class: "row spread" }, h("h3", {}, `${r.name} `, h("span", { class: "pill" }, r.kind)),
        h("button", { type: "button", "data-switch": r.name, on: { click: () => admin(`/admin/resources/${encodeURIComponent(r.name)}`, "resource", { enabled: !r.enabled }, (b) => `${b.resource} switched ${b.enabled ? "on" : "off"}`) } },
          r.enabled ? "Switch off" : "Switch on")),
      h("div", { class: "kv" },
        h("dt", {}, "free"), h("dd", { "data-free": r.name }, mib(r.free_mib)),
        h("dt", {}, "total"), h("dd", {}, mib(r.total_mib)),
        h("dt", {}, "reserve"), h("dd", {}, mib(r.reserve_mib)),
        h("dt", {}, "lending"), h("dd", {}, r.enabled ? "on" : "switched off"),
        r.capacity_unknown ? [h("dt", {}, "capacity"), h("dd", {}, r.capacity_unknown)] : null,
        r.awaiting_fresh_sample ? [h("dt", {}, "sample"), h("dd", {}, "waiting for one taken after the last job")] : null,
        r.reserved_by ? [h("dt", {}, "held by"), h("dd", { class: "mono" }, r.reserved_by)] : null,
        pressure ? [h("dt", {}, "GPU pressure"), h("dd", { "data-pressure": r.name }, r.pressure)] : null)),
      memoryChart(r, hist?.resources.find((x) => x.name === r.name), hist?.jobs ?? []));
  }));
  return [
    h("div", { class: "grid" }, lendingCard, presenceCard, termsCard(s)),
    h("h2", {}, "Vacancy"),
    h("p", { class: "note", id: "sign-caption" },
      `Each sign reports whether the route's default budget was admitted at the last poll (${clock(state.seen)}). It is not a reservation and not proof that a given request will succeed: a requested model may need more memory, and capacity, owner presence, pressure or another route's work may change before the request arrives.`),
    h("p", { id: "admitting-routes" }, admitting.length ? `Admitting now: ${admitting.join(", ")}` : "No route is admitting now",
      h("span", { class: "note" }, " — each sign speaks for its own route only: a free helper route does not mean a voice route has capacity.")),
    signs,
    h("h2", {}, "Resources"),
    resources,
  ];
}

/** What can still stop an exempt route (SCOPE-16). */
function exemptNote(s, u) {
  const pressured = u.resources.filter((r) => s.gpu_pressure.includes(r));
  return h("div", { class: "section note", "data-exempt": u.name },
    `Exempt from owner presence: this route keeps lending while the owner is at the machine. It still stops for the lending switch, its resources' switches (${u.resources.join(", ")}), their free memory and reserves` +
    (pressured.length ? `, GPU pressure on ${pressured.join(", ")}` : ", and GPU pressure where it is measured (nowhere on this machine)") +
    `, and while another route's owner-return reclaim holds a shared resource. Memory and CPU are checked only when a request is admitted: nothing reclaims a running request when the owner later needs them.`);
}

// The upstream's wait line ([upstream.queue]), when anyone waits in it.
function lineNote(u) {
  if (!u.line || !u.line.waiting) return null;
  const oldest = (u.line.oldest_wait_s ?? 0).toFixed(1);
  return h("div", { class: "note", "data-line": u.name }, `${u.line.waiting} waiting in line, the oldest for ${oldest} s`);
}

function workloads(s) {
  const cards = h("div", { class: "grid routes" }, s.upstreams.map((u) => h("div", { class: "card", "data-route": u.name },
    h("div", { class: "row spread" }, h("h3", {}, u.name), h("span", { class: "pill" }, `${u.adapter} · ${u.owner_scope}`)),
    h("div", { class: "note mono" }, `${u.listen} → ${u.target}`),
    h("div", { class: "section", "data-admission": u.name }, h("strong", {}, "Admission: "), sign(u), u.vacancy.admitting ? "" : h("div", { class: "muted" }, u.vacancy.reason ?? "")),
    h("div", { class: "section", "data-health": u.name }, h("strong", {}, "Target health: "),
      u.reachable == null ? h("span", { class: "pill" }, "not checked yet")
        : u.reachable ? h("span", { class: "pill ok" }, "reachable") : h("span", { class: "pill bad" }, "unreachable"),
      u.error ? h("div", { class: "muted" }, u.error) : null,
      u.models.length ? h("div", { class: "muted" }, `loaded: ${u.models.join(", ")}`) : null,
      h("div", { class: "note" }, "Checked apart from admission: an unreachable target can fail a request even while admission has capacity.")),
    u.residency.length ? h("div", { class: "section note" }, u.residency.join("; ")) : null,
    lineNote(u),
    u.owner_scope === "resource" ? exemptNote(s, u) : null)));
  const held = s.work.filter((w) => w.phase === "held");
  const rows = s.work.map((w) => {
    const isHeld = w.phase === "held";
    const cmd = `vacancyd admin-request release_work ${w.id}`;
    return h("tr", { class: isHeld ? "held" : "", "data-entry": w.id },
      h("td", { class: "mono" }, w.id, w.upstream_ref ? h("div", { class: "note" }, `upstream: ${w.upstream_ref}`) : null,
        w.borrower ? h("div", { class: "note", "data-borrower": w.id }, `borrower: ${w.borrower}`) : null),
      h("td", {}, w.upstream), h("td", {}, w.model ?? "—"), h("td", {}, w.resources.join(", ")),
      h("td", { "data-age": w.id }, age(w.age_s)), h("td", {}, w.completion),
      h("td", {}, h("span", { class: isHeld ? "pill held" : "pill", "data-phase": w.id }, w.phase),
        w.phase === "verifying" ? h("div", { class: "note" }, "The response was cut; vacancyd is checking that the upstream stopped the job (within stop_proof_timeout_s). It is released on proof, held if none comes.") : null,
        isHeld ? h("div", { class: "attention-note" },
          h("strong", {}, "Needs attention: "), w.held_reason ?? "completion is uncertain",
          h("div", { class: "note" }, "Stop or verify the job at the upstream first, then as an administrator run:"),
          h("code", { class: "cmd", "data-command": w.id }, cmd), " ",
          h("button", { type: "button", class: "copy", on: { click: () => copy(cmd) } }, "Copy")) : null));
  });
  const reclaims = s.reclaim_log.map((r) => h("tr", { "data-reclaim": r.id },
    h("td", {}, `${age(r.started_age_s)} ago`), h("td", {}, r.upstream), h("td", {}, r.trigger), h("td", {}, r.mode),
    h("td", {}, r.outcome ? r.outcome.replace("_", " ") : "under way", r.elapsed_s != null ? h("div", { class: "note" }, `after ${age(r.elapsed_s)}`) : null),
    h("td", {},
      r.closed.length ? h("div", {}, `closed: ${r.closed.join(", ")}`) : null,
      r.cancelled.length ? h("div", {}, `cancelled: ${r.cancelled.join(", ")}`) : null,
      r.cancel_failed.length ? h("div", {}, `cancellation failed: ${r.cancel_failed.join(", ")}`) : null,
      r.unload ? h("div", {}, r.unload) : null,
      !r.closed.length && !r.cancelled.length && !r.cancel_failed.length && !r.unload ? h("span", { class: "muted" }, "nothing") : null)));
  return [
    h("h2", {}, `Work (${s.work.length})`),
    held.length ? h("div", { class: "banner bad", id: "held-banner" }, `${held.length} held ${held.length === 1 ? "entry needs" : "entries need"} attention: completion is uncertain, so the resources stay reserved. Restarting never releases them.`) : null,
    s.work.length ? h("table", { id: "work" }, h("thead", {}, h("tr", {}, ["ID", "Upstream", "Model", "Resources", "Age", "Completion", "Phase"].map((c) => h("th", {}, c)))), h("tbody", {}, rows))
      : h("p", { class: "empty" }, "No work entries."),
    h("h2", {}, "Routes"), cards,
    s.reclaims.length ? [h("h2", {}, "Reclaims under way"), h("ul", {}, s.reclaims.map((r) => h("li", {}, `${r.id} on ${r.upstream}: ${r.trigger} (${r.mode}, ${r.stage}${r.deadline_in_ms != null ? `, deadline in ${Math.ceil(r.deadline_in_ms / 1000)} s` : ""})`)))] : null,
    h("h2", {}, "Recent reclaims"),
    reclaims.length ? h("table", { id: "reclaims" }, h("thead", {}, h("tr", {}, ["Started", "Upstream", "Trigger", "Mode", "Outcome", "What it did"].map((c) => h("th", {}, c)))), h("tbody", {}, reclaims))
      : h("p", { class: "empty" }, "No reclaims since vacancyd started."),
  ];
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
    notice(`Copied: ${text}`, "good");
  } catch {
    notice(`Copy this command: ${text}`);
  }
}

// ---- settings ----

async function loadForm() {
  try {
    const r = await fetch("/settings", reading());
    state.form = r.ok ? await r.json() : null;
  } catch {
    state.form = null;
  }
  renderSettings();
}

/** The running value where the saved one differs (SCOPE-03: it stays in force until a restart). */
function running(key, saved) {
  const [kind, name, field] = key.split(".");
  const v = state.form?.running[kind].find((x) => x.name === name)?.[field];
  return v !== undefined && v !== saved ? h("span", { class: "note", "data-running": key }, `running: ${v}`) : null;
}
function numberField(label, key, value) {
  return h("label", { class: "field" }, label, h("input", { type: "number", min: 0, step: 1, "data-key": key, value }), running(key, value));
}
function selectField(label, key, value, options) {
  return h("label", { class: "field" }, label,
    h("select", { "data-key": key }, options.map((o) => h("option", { value: o, selected: o === value }, o))), running(key, value));
}

function renderSettings() {
  const page = $("page-settings");
  const f = state.form;
  if (!f) {
    page.replaceChildren(h("p", { class: "empty" }, "The settings could not be read."));
    return;
  }
  const base = f.saved ?? f.running;
  const pending = pendingBanner();
  const resources = h("fieldset", {}, h("legend", {}, "Reserves"),
    base.resources.map((r) => numberField(`${r.name}: reserve_mib`, `resources.${r.name}.reserve_mib`, r.reserve_mib)));
  const upstreams = base.upstreams.map((u) => h("fieldset", { "data-upstream": u.name }, h("legend", {}, `Route ${u.name}`),
    numberField("default_min_free_mib", `upstreams.${u.name}.default_min_free_mib`, u.default_min_free_mib),
    numberField("resident_min_free_mib", `upstreams.${u.name}.resident_min_free_mib`, u.resident_min_free_mib),
    selectField("on_owner_return", `upstreams.${u.name}.on_owner_return`, u.on_owner_return, ["drain", "cancel", "finish"]),
    numberField("drain_timeout_s", `upstreams.${u.name}.drain_timeout_s`, u.drain_timeout_s),
    h("label", { class: "field" }, "yield_on_veto", h("input", { type: "checkbox", "data-key": `upstreams.${u.name}.yield_on_veto`, checked: u.yield_on_veto })),
    h("div", {}, h("strong", {}, "[upstream.models]"), " ", h("span", { class: "note" }, "memory needs by exact request model name; leave a value empty to use the route's")),
    h("table", { class: "models" }, h("thead", {}, h("tr", {}, h("th", {}, "model"), h("th", {}, "min_free_mib"), h("th", {}, "resident_min_free_mib"), h("th", {}, ""))),
      h("tbody", { "data-models": u.name },
        Object.entries(u.models).map(([m, req]) => modelRow(u.name, m, req)),
        modelRow(u.name, "", {})))));
  const advanced = h("fieldset", { id: "advanced" }, h("legend", {}, "Advanced workload permissions (scope admin)"),
    h("p", { class: "note" }, "owner_scope = \"resource\" exempts a route from owner presence (it keeps lending while you are at the machine); management = \"allow\" forwards routes that manage the upstream or read your data on it. A restart applies them."),
    base.upstreams.map((u) => h("div", {}, h("strong", {}, `${u.name}: `),
      selectField("owner_scope", `upstreams.${u.name}.owner_scope`, u.owner_scope, ["host", "resource"]),
      selectField("management", `upstreams.${u.name}.management`, u.management, ["deny", "allow"]))));
  const save = h("button", { type: "submit", class: "primary", id: "settings-save", disabled: !f.config_path }, "Save settings");
  const form = h("form", { id: "settings-form", on: { submit: (e) => { e.preventDefault(); saveSettings(form, base); } } },
    resources, upstreams, advanced, save,
    h("span", { class: "note" }, f.config_path ? ` Saved to ${f.config_path} (the previous file is kept beside it); a restart applies it.` : " vacancyd runs on its embedded default configuration: start it with --config FILE to save settings."),
    h("div", { id: "settings-result" }));
  page.replaceChildren(pending, f.saved_invalid ? h("div", { class: "banner bad" }, `The saved file does not pass check-config: ${f.saved_invalid}`) : "", form);
}

function modelRow(upstream, name, req) {
  const key = `upstreams.${upstream}.models`;
  const row = h("tr", { "data-model-row": key },
    h("td", {}, h("input", { type: "text", "data-model": "name", value: name, placeholder: name ? null : "add a model", "data-was": name })),
    h("td", {}, h("input", { type: "number", min: 0, "data-model": "min_free_mib", value: req.min_free_mib ?? "" })),
    h("td", {}, h("input", { type: "number", min: 0, "data-model": "resident_min_free_mib", value: req.resident_min_free_mib ?? "" })),
    h("td", {}, name ? h("label", { class: "note" }, h("input", { type: "checkbox", "data-model": "remove" }), " remove") : ""));
  return row;
}

function pendingBanner() {
  const s = state.status;
  const p = s?.settings?.pending ?? state.form?.pending ?? [];
  return p.length
    ? h("div", { class: "banner", id: "settings-pending" }, `Saved settings differ from the running ones: ${p.join(", ")}. A restart applies them; until then the running settings (what /status shows) stay in force.`)
    : h("div", { id: "settings-pending", hidden: true });
}

/** Collect what changed against the saved values and POST it. */
async function saveSettings(form, base) {
  const edit = { resources: {}, upstreams: {} };
  const put = (path, v) => {
    const [kind, name, key] = path.split(".");
    ((edit[kind][name] ??= {}))[key] = v;
  };
  for (const input of form.querySelectorAll("[data-key]")) {
    const [kind, name, key] = input.dataset.key.split(".");
    const item = base[kind].find((x) => x.name === name);
    const was = item[key];
    const v = input.type === "checkbox" ? input.checked : input.type === "number" ? (input.value === "" ? null : Number(input.value)) : input.value;
    if (v !== null && v !== was) put(input.dataset.key, v);
  }
  for (const body of form.querySelectorAll("[data-models]")) {
    const upstream = body.dataset.models;
    const was = base.upstreams.find((u) => u.name === upstream).models;
    const models = {};
    for (const row of body.querySelectorAll("tr")) {
      const get = (k) => row.querySelector(`[data-model="${k}"]`);
      const name = get("name").value.trim(), old = get("name").dataset.was;
      const num = (k) => (get(k).value === "" ? undefined : Number(get(k).value));
      if (old && (get("remove")?.checked || name !== old)) models[old] = null;
      if (name && !get("remove")?.checked) {
        const req = { min_free_mib: num("min_free_mib"), resident_min_free_mib: num("resident_min_free_mib") };
        const before = was[name] ?? {};
        if (name !== old || req.min_free_mib !== (before.min_free_mib ?? undefined) || req.resident_min_free_mib !== (before.resident_min_free_mib ?? undefined)) models[name] = req;
      }
    }
    if (Object.keys(models).length) ((edit.upstreams[upstream] ??= {})).models = models;
  }
  const result = $("settings-result");
  const reply = await admin("/admin/settings", "settings", edit, (b) => b.message);
  if (!reply) return;
  if (reply.status === 200) {
    result.replaceChildren(h("p", { class: "banner good" }, reply.body.message, reply.body.pending.length ? ` Pending: ${reply.body.pending.join(", ")}.` : ""));
    await loadForm();
    $("settings-result")?.replaceChildren(h("p", { class: "banner good", id: "settings-saved" }, reply.body.message));
  } else {
    const problems = reply.body?.error?.problems ?? [];
    result.replaceChildren(problems.length
      ? h("div", { class: "banner bad", id: "settings-problems" }, reply.body.error.message,
        h("ul", { class: "problems" }, problems.map((p) => h("li", {}, h("code", {}, p.key || "(file)"), p.line ? ` (line ${p.line})` : "", `: ${p.message}`))))
      : "");
  }
}

// ---- borrowers (issue 34): who borrows now, and their use per day ----

async function loadUsage() {
  if (!state.status?.borrowers) return;
  try {
    const r = await fetch("/usage?since=30d&by=day", reading());
    state.usage = r.ok ? await r.json() : null;
  } catch {
    /* shown by the stream's state */
  }
  if (state.page === "borrowers") render();
}

/** Jobs admitted so far, all borrowers: when it moves, the record has news. */
const jobsSoFar = (s) => (s.borrowers ?? []).reduce((n, b) => n + b.totals.jobs + b.running, 0);

function budgetLine(b) {
  const inS = Math.max(0, Math.round(b.resets_unix_s - Date.now() / 1000));
  return h("li", { class: b.left_s <= 0 ? "spent" : "", "data-budget": `${b.kind}:${b.period}` },
    `${b.kind} per ${b.period}: ${dur(b.used_s)} used of ${dur(b.allowed_s)}, ${dur(b.left_s)} left; resets ${b.resets} (in ${age(inS)})`);
}

/** Names, classes and counts only: keys and their hashes never reach /status. */
function borrowersPage(s) {
  const all = s.borrowers;
  if (!all) {
    return [h("p", { class: "empty", id: "borrowers" }, "No named borrowers: [borrowers] in the configuration turns them on, and vacancyd borrower add NAME adds one (docs/borrowers.md).")];
  }
  const busy = all.filter((b) => b.running > 0).map((b) => `${b.name} (${b.running} running)`);
  const waiting = all.filter((b) => b.waiting > 0).map((b) => `${b.name} (${b.waiting} waiting)`);
  const limit = (n) => (n == null ? "" : ` of ${n}`);
  const rows = all.map((b) => h("tr", { "data-borrower": b.name, class: b.running || b.waiting || b.held ? "" : "idle" },
    h("td", {}, h("strong", {}, b.name)),
    h("td", {}, b.priority),
    h("td", { class: "num" }, b.share),
    h("td", { class: "num", "data-running": b.name }, `${b.running}${limit(b.max_running)}`),
    h("td", { class: "num", "data-waiting": b.name }, `${b.waiting}${limit(b.max_waiting)}`),
    h("td", { class: "num" }, b.held ? h("span", { class: "pill held" }, b.held) : "0"),
    h("td", { class: "num", "data-jobs": b.name }, b.totals.jobs),
    h("td", { class: "num", "data-gpu-s": b.name }, dur(b.totals.reserved_s.gpu)),
    h("td", { class: "num" }, dur(b.totals.reserved_s.memory)),
    h("td", { class: "num" }, dur(b.totals.waited_s)),
    h("td", { class: "num", title: Object.entries(b.totals.refusals).map(([c, n]) => `${c}: ${n}`).join(", ") },
      Object.values(b.totals.refusals).reduce((n, x) => n + x, 0)),
    h("td", {}, b.budgets.length ? h("ul", { class: "budgets" }, b.budgets.map(budgetLine)) : h("span", { class: "muted" }, "none"))));
  const heads = [["Borrower"], ["Class"], ["Share", "num"], ["Running", "num"], ["Waiting", "num"], ["Held", "num"], ["Jobs", "num"],
    ["GPU reserved", "num"], ["Memory reserved", "num"], ["Waited", "num"], ["Refused", "num"], ["Budgets"]];
  return [h("div", { id: "borrowers" },
    h("h2", {}, `Borrowers (${all.length})`),
    h("p", { id: "borrowers-now" },
      busy.length ? `Borrowing now: ${busy.join(", ")}` : "Nobody is borrowing now",
      waiting.length ? `; in line: ${waiting.join(", ")}` : ""),
    all.length ? h("table", { id: "borrowers-table", class: "borrowers" },
      h("thead", {}, h("tr", {}, heads.map(([c, cls]) => h("th", { class: cls ?? null }, c)))), h("tbody", {}, rows))
      : h("p", { class: "empty" }, "No borrowers yet: vacancyd borrower add NAME --config FILE adds one."),
    h("p", { class: "note" }, "Jobs, reserved and waited time and refusals count since vacancyd started; budgets count their own day or week (UTC). Keys are never shown: vacancyd borrower add prints a key once."),
    h("h2", {}, "Use per day"),
    h("p", { class: "note" }, "Seconds reserved by all borrowers per UTC day over the last 30 days, from the owner's record (vacancyd usage --by day says the same). A job counts on the day it ended."),
    usageChart(state.usage))];
}

// ---- page switching and rendering ----

function render() {
  const s = state.status;
  showLink();
  if (!s) return;
  if (state.page === "overview") $("page-overview").replaceChildren(...overview(s).flat());
  if (state.page === "workloads") $("page-workloads").replaceChildren(...workloads(s).flat().filter((x) => x != null));
  $("nav-borrowers").hidden = !s.borrowers;
  const jobs = jobsSoFar(s);
  if (s.borrowers && jobs !== state.usageJobs) {
    state.usageJobs = jobs;
    loadUsage();
  }
  if (state.page === "borrowers") $("page-borrowers").replaceChildren(...borrowersPage(s));
  if (state.page === "settings") {
    const old = $("settings-pending");
    if (old) old.replaceWith(pendingBanner());
  }
}

function show() {
  const page = (location.hash || "#overview").slice(1);
  state.page = PAGES.includes(page) ? page : "overview";
  for (const p of PAGES) {
    $(`page-${p}`).hidden = p !== state.page;
    document.querySelector(`nav a[data-page="${p}"]`).classList.toggle("current", p === state.page);
  }
  if (state.page === "settings") loadForm();
  if (state.page === "overview") loadHistory();
  if (state.page === "borrowers") loadUsage();
  render();
}

$("token-button").addEventListener("click", () => {
  const f = $("token-form");
  f.hidden = !f.hidden;
  $("token-note").textContent = token() ? "A token is set for this tab." : "";
});
$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const t = $("token-input").value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  $("token-input").value = "";
  $("token-form").hidden = true;
  notice(t ? "Token kept for this tab (sessionStorage); it is sent only to this daemon's /admin calls." : "", "good");
});
$("token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  $("token-note").textContent = "Token forgotten.";
});
window.addEventListener("hashchange", show);
setInterval(loadHistory, 10000);
// A job's record is written when it ends, a moment after /status shows it.
setInterval(() => state.page === "borrowers" && loadUsage(), 10000);
show();
connect();
