// The tabloop dashboard: reads /v1/stats/... with the token the user gives, draws with uPlot.
// Times come as Unix seconds (UTC) and are shown in the browser's time zone.
/* global uPlot */
"use strict";

const TOKEN_KEY = "tabloop.dashboard.token";
const PAGES = ["overview", "policies", "ingestion", "breakdown"];
const COLORS = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
  "#4b5563", "#65a30d", "#7c3aed", "#0d9488"];
const BAND_COLORS = ["rgba(37,99,235,0.07)", "rgba(22,163,74,0.08)", "rgba(234,88,12,0.08)",
  "rgba(147,51,234,0.07)", "rgba(8,145,178,0.08)"];
const MODEL_BAND_COLORS = ["rgba(147,51,234,0.18)", "rgba(13,148,136,0.18)", "rgba(202,138,4,0.18)", "rgba(219,39,119,0.18)"];
const WINDOW_WORDS = { "1h": "hour", "24h": "24 hours", "7d": "7 days", "30d": "30 days" };

const $ = (id) => document.getElementById(id);
const state = { me: null, charts: [] };

// -- formatting -----------------------------------------------------------------------------

const nf = new Intl.NumberFormat();
function num(v) { return v === null || v === undefined ? "–" : nf.format(Math.round(v)); }
function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + " %"; }
function ms(v) { return v === null || v === undefined ? "–" : v.toFixed(0) + " ms"; }
function dec(v, d = 4) { return v === null || v === undefined ? "–" : Number(v).toFixed(d); }
function when(v) {
  if (v === null || v === undefined) return "–";
  const date = typeof v === "number" ? new Date(v * 1000) : new Date(v);
  return date.toLocaleString();
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// -- the API --------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, params = {}, init = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params)) if (v) url.searchParams.set(k, v);
  const response = await fetch(url, {
    ...init,
    headers: { Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY), ...(init.headers || {}) },
  });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return response.json();
}

// -- page state in the URL ------------------------------------------------------------------

function currentPage() {
  const name = location.pathname.split("/").filter(Boolean)[1] || "overview";
  return PAGES.includes(name) ? name : "overview";
}
function query(name) { return new URL(location.href).searchParams.get(name); }
function setQuery(name, value) {
  const url = new URL(location.href);
  url.searchParams.set(name, value);
  history.replaceState(null, "", url);
}

function status(text, kind = "") {
  const node = $("status");
  node.textContent = text;
  node.className = kind;
  node.dataset.kind = kind;
}

// -- charts ---------------------------------------------------------------------------------

// Serving policy versions as shaded bands behind the series, promotions and rollbacks (and any
// other registry action: canary, approval) as labelled vertical lines. Model (adapter) versions:
// a strip of bands along the top, their transitions as dotted lines labelled "model ...".
function policyPlugin(bands, markers, modelBands = [], modelMarkers = []) {
  const colorOf = {};
  bands.forEach((b) => {
    if (!(b.version in colorOf)) colorOf[b.version] = BAND_COLORS[Object.keys(colorOf).length % BAND_COLORS.length];
  });
  const modelColorOf = {};
  modelBands.forEach((b) => {
    if (!(b.version in modelColorOf)) modelColorOf[b.version] = MODEL_BAND_COLORS[Object.keys(modelColorOf).length % MODEL_BAND_COLORS.length];
  });
  const lines = [
    ...markers.map((m) => ({ ...m, label: `${m.action} ${m.version}`, dash: [4, 3] })),
    ...modelMarkers.map((m) => ({ ...m, label: `model ${m.action} ${m.version}`, dash: [1, 2] })),
  ];
  return {
    hooks: {
      drawClear: [(u) => {
        const ctx = u.ctx;
        const { top, height } = u.bbox;
        ctx.save();
        ctx.font = `${Math.round(10 * devicePixelRatio)}px sans-serif`;
        for (const band of bands) {
          const x0 = u.valToPos(band.start, "x", true);
          const x1 = u.valToPos(band.end, "x", true);
          ctx.fillStyle = colorOf[band.version];
          ctx.fillRect(x0, top, x1 - x0, height);
          ctx.fillStyle = "#6b7280";
          if (x1 - x0 > 30 * devicePixelRatio) ctx.fillText(band.version, x0 + 4, top + 12 * devicePixelRatio);
        }
        const strip = 14 * devicePixelRatio;
        for (const band of modelBands) {
          const x0 = u.valToPos(band.start, "x", true);
          const x1 = u.valToPos(band.end, "x", true);
          ctx.fillStyle = modelColorOf[band.version];
          ctx.fillRect(x0, top + height - strip, x1 - x0, strip);
          ctx.fillStyle = "#374151";
          if (x1 - x0 > 40 * devicePixelRatio) ctx.fillText(`model ${band.version}`, x0 + 4, top + height - 3 * devicePixelRatio);
        }
        ctx.restore();
      }],
      draw: [(u) => {
        const ctx = u.ctx;
        const { top, height } = u.bbox;
        ctx.save();
        ctx.font = `${Math.round(10 * devicePixelRatio)}px sans-serif`;
        for (const m of lines) {
          const x = u.valToPos(m.t, "x", true);
          ctx.strokeStyle = m.action.endsWith("rollback") ? "#dc2626" : m.action.endsWith("promote") ? "#16a34a" : "#9333ea";
          ctx.setLineDash(m.dash);
          ctx.lineWidth = devicePixelRatio;
          ctx.beginPath();
          ctx.moveTo(x, top);
          ctx.lineTo(x, top + height);
          ctx.stroke();
          ctx.fillStyle = ctx.strokeStyle;
          ctx.fillText(m.label, x + 3, top + height - (m.dash[0] === 1 ? 18 : 4) * devicePixelRatio);
        }
        ctx.restore();
      }],
    },
  };
}

function chart(title, key, times, series, opts = {}) {
  const figure = el("figure", { class: "chart", "data-chart": key, "data-series": String(series.length) },
    el("figcaption", {}, title));
  const box = el("div", { class: "plot" });
  figure.append(box);
  const anyData = series.some((s) => s.values.some((v) => v !== null && v !== undefined));
  if (!anyData) {
    figure.append(el("p", { class: "empty" }, "Nothing to draw in this window."));
    figure.dataset.empty = "true";
  }
  const width = Math.max(320, Math.min(1100, (document.body.clientWidth || 1000) - 80));
  const scales = { x: { time: true } };
  if (opts.percent) scales.y = { range: [0, 1] };
  const axes = [{}, { values: (u, ticks) => ticks.map((v) => (opts.percent ? (100 * v).toFixed(0) + "%" : nf.format(v))), size: 60 }];
  const plot = new uPlot({
    width,
    height: 220,
    scales,
    axes,
    series: [{}, ...series.map((s, i) => ({
      label: s.label,
      stroke: COLORS[i % COLORS.length],
      width: 1.5,
      spanGaps: false,
      value: (u, v) => (v === null || v === undefined ? "–" : opts.percent ? pct(v) : nf.format(Math.round(v * 100) / 100)),
    }))],
    plugins: opts.bands ? [policyPlugin(opts.bands, opts.markers || [], opts.modelBands || [], opts.modelMarkers || [])] : [],
  }, [times, ...series.map((s) => s.values)], box);
  state.charts.push(plot);
  return figure;
}

function card(key, label, value, shown) {
  return el("div", { class: "card", "data-key": key, "data-value": value === null || value === undefined ? "" : String(value) },
    el("span", { class: "label" }, label), el("span", { class: "value" }, shown));
}

function table(headers, rows, attrs = {}) {
  // In a scrolling box: a wide table scrolls by itself instead of widening the page.
  return el("div", { class: "scroll" }, el("table", attrs,
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows)));
}

function emptyNote(text) { return el("p", { class: "empty-state" }, text); }

// -- pages ----------------------------------------------------------------------------------

async function overview(root, tenant, window) {
  const data = await api("/v1/stats/overview", { tenant, window });
  const s = data.summary;
  root.append(el("h2", {}, `Overview of ${data.tenant}, last ${WINDOW_WORDS[window]}`),
    el("p", { class: "sub", id: "serving" }, `Serving policy ${data.serving}, model ${data.model_serving}. Shaded: the serving policy version; strip along the bottom: the serving model version; lines: promotions, canaries and rollbacks (dotted: the model's).`));
  root.append(el("div", { class: "cards", id: "summary" },
    card("requests", "Requests", s.requests, num(s.requests)),
    card("shown_share", "Shown", s.shown_share, pct(s.shown_share)),
    card("accept_rate", "Accepted (full)", s.accept_rate, pct(s.accept_rate)),
    card("partial_rate", "Accepted (partial)", s.partial_rate, pct(s.partial_rate)),
    card("accepted_chars", "Accepted characters", s.accepted_chars, num(s.accepted_chars)),
    card("retained_600", "Retained after 600 s", s.retained_chars["600"], num(s.retained_chars["600"])),
    card("latency_p50", "Latency p50", s.latency_ms.p50, ms(s.latency_ms.p50)),
    card("latency_p95", "Latency p95", s.latency_ms.p95, ms(s.latency_ms.p95)),
  ));
  if (data.empty) {
    root.append(emptyNote(`No events from ${data.tenant} in the last ${WINDOW_WORDS[window]}. Editors send them once telemetry is on with this backend's URL and a token of the tenant.`));
    return;
  }
  const t = data.series.t;
  const opts = { bands: data.bands, markers: data.markers, modelBands: data.model_bands, modelMarkers: data.model_markers };
  if (data.model_markers.length) {
    root.append(el("section", { id: "model-transitions" }, el("h3", {}, "Model versions"),
      table(["when", "action", "version", "who", "why"], data.model_markers.map((m) => el("tr", { "data-action": m.action },
        el("td", {}, when(m.t)), el("td", {}, m.action), el("td", {}, m.version),
        el("td", {}, m.actor || ""), el("td", {}, m.reason || ""))))));
  }
  root.append(
    chart("Requests", "requests", t, [{ label: "requests", values: data.series.requests }], opts),
    chart("Shown share and accept rates", "rates", t, [
      { label: "shown", values: data.series.shown_share },
      { label: "accepted (full)", values: data.series.accept_rate },
      { label: "accepted (partial)", values: data.series.partial_rate },
    ], { ...opts, percent: true }),
    chart("Accepted and retained characters", "chars", t, [
      { label: "accepted", values: data.series.accepted_chars },
      { label: "retained 30 s", values: data.series.retained_30 },
      { label: "retained 120 s", values: data.series.retained_120 },
      { label: "retained 600 s", values: data.series.retained_600 },
    ], opts),
    chart("Silences by reason", "silences", t, [
      { label: "policy", values: data.series.silence_policy },
      { label: "empty", values: data.series.silence_empty },
      { label: "latency", values: data.series.silence_latency },
      { label: "not given", values: data.series.silence_unknown },
    ], opts),
    chart("Latency as the editors reported it", "latency", t, [
      { label: "p50", values: data.series.latency_p50 },
      { label: "p95", values: data.series.latency_p95 },
    ], opts),
  );
}

async function act(action, tenant, version) {
  const what = action === "rollback" ? `Roll back ${version}` : `${action[0].toUpperCase() + action.slice(1)} ${version}`;
  if (!confirm(`${what} for ${tenant}?`)) return;
  try {
    const answer = await api(`/v1/policy/${action}`, {}, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ tenant, version }),
    });
    status(`${action}: serving ${answer.serving} (recorded as ${answer.actor})`, "ok");
  } catch (exc) {
    status(`${action} failed: ${exc.message}`, "error");
  }
  await render(false);
}

async function policies(root, tenant) {
  const data = await api("/v1/stats/policies", { tenant });
  root.append(el("h2", {}, `Policies of ${data.tenant}`),
    el("p", { class: "sub" }, `Serving ${data.serving}. Evaluation on held-out events (doubly robust and self-normalised estimates of reward per decision); live figures since the version first served.`));
  if (!data.versions.length) {
    root.append(emptyNote("No policy versions yet: the built-in policy serves until the trainer promotes one."));
  } else {
    const canaryRuns = data.versions.some((v) => v.state === "canary");
    const rows = data.versions.slice().reverse().map((v) => {
      const e = v.evaluation;
      const live = v.live || {};
      const buttons = [];
      if (!v.serving) buttons.push(el("button", { type: "button", "data-action": "promote", "data-version": v.version, onclick: () => act("promote", data.tenant, v.version) }, "Promote"));
      // A rollback names what it takes away: the running canary, else the serving version.
      if (canaryRuns ? v.state === "canary" : v.serving) buttons.push(el("button", { type: "button", "data-action": "rollback", "data-version": v.version, onclick: () => act("rollback", data.tenant, v.version) }, "Roll back"));
      if (data.can_approve && !v.serving) buttons.push(el("button", { type: "button", "data-action": "approve", "data-version": v.version, onclick: () => act("approve", data.tenant, v.version) }, "Approve"));
      return el("tr", { "data-version": v.version, class: v.serving ? "serving" : v.rolled_back ? "rolled-back" : "" },
        el("td", {}, v.version), el("td", {}, new Date(v.created_at).toLocaleDateString()),
        el("td", {}, v.serving ? "serving" : v.rolled_back ? "rolled back" : v.promote ? "passed" : "not promoted"),
        el("td", {}, dec(e.dr)), el("td", {}, dec(e.snips)),
        el("td", {}, e.gain === null || e.gain === undefined ? "–" : `${dec(e.gain)} (≥ ${dec(e.gain_lower_bound)})`),
        el("td", {}, dec(e.ess, 1)), el("td", {}, pct(e.shown_rate)),
        el("td", {}, num(live.requests)), el("td", {}, pct(live.shown_share)), el("td", {}, pct(live.accept_rate)),
        el("td", {}, num(live.accepted_chars)),
        el("td", { class: "actions" }, buttons));
    });
    root.append(table(["version", "created", "state", "DR", "SNIPS", "gain (lower bound)", "ESS", "shown rate",
      "live requests", "live shown", "live accepted", "live accepted chars", ""], rows, { id: "versions" }));
    if (!data.can_approve) root.append(el("p", { class: "sub" }, "Approvals: this registry has none to give."));
  }
  root.append(el("h3", {}, "History"));
  if (!data.history.length) root.append(emptyNote("No promotions or rollbacks yet."));
  else {
    root.append(table(["when", "action", "version", "who", "why"], data.history.slice().reverse().map((h) =>
      el("tr", {}, el("td", {}, when(h.at)), el("td", {}, h.action), el("td", {}, h.version), el("td", {}, h.actor), el("td", {}, h.reason))),
    { id: "history" }));
  }
}

async function ingestion(root, tenant, window) {
  const data = await api("/v1/stats/ingestion", { tenant, window });
  const s = data.totals;
  root.append(el("h2", {}, `Ingestion and sync of ${data.tenant}, last ${WINDOW_WORDS[window]}`));
  root.append(el("div", { class: "cards", id: "summary" },
    card("batches", "Batches", s.batches, num(s.batches)),
    card("accepted", "Events stored", s.accepted, num(s.accepted)),
    card("events_per_s", "Events/s (mean)", s.events_per_s, s.events_per_s.toFixed(3)),
    card("refused_batches", "Refused batches", s.refused_batches, num(s.refused_batches)),
    card("duplicate_batches", "Duplicate batches", s.duplicate_batches, num(s.duplicate_batches)),
    card("rejected_events", "Rejected events", s.rejected_events, num(s.rejected_events)),
    card("rate_limited", "Rate-limited requests", s.rate_limited, num(s.rate_limited)),
  ));
  if (!s.batches) root.append(emptyNote(`No batches from ${data.tenant} in the last ${WINDOW_WORDS[window]}.`));
  else {
    root.append(chart("Events stored per second", "events", data.series.t, [{ label: "events/s", values: data.series.events_per_s }]),
      chart("Refusals", "refusals", data.series.t, [
        { label: "refused batches", values: data.series.refused_batches },
        { label: "duplicate batches", values: data.series.duplicate_batches },
        { label: "rate-limited", values: data.series.rate_limited },
        { label: "rejected events", values: data.series.rejected_events },
      ]));
  }
  root.append(el("h3", {}, "Editors' spools"));
  if (!data.spools.length) root.append(emptyNote("No editor has reported its spool yet."));
  else root.append(table(["installation", "waiting events", "dropped (total)", "reported"], data.spools.map((r) =>
    el("tr", {}, el("td", {}, r.install_id), el("td", {}, num(r.backlog)), el("td", {}, num(r.dropped)), el("td", {}, when(r.reported_at)))), { id: "spools" }));
  root.append(el("h3", {}, "Index sync"));
  if (!data.workspaces.length) root.append(emptyNote("No workspace has synced its index."));
  else root.append(table(["workspace", "model", "chunks", "last sync"], data.workspaces.map((r) =>
    el("tr", {}, el("td", {}, r.workspace), el("td", {}, r.model), el("td", {}, num(r.chunks)), el("td", {}, when(r.last_sync)))), { id: "workspaces" }));
}

async function breakdown(root, tenant, window) {
  root.append(el("h2", {}, `By language, editor and model version, last ${WINDOW_WORDS[window]}`));
  for (const [by, title] of [["language", "Language"], ["editor", "Editor"], ["model", "Model version"]]) {
    const data = await api(`/v1/stats/by/${by}`, { tenant, window });
    const section = el("section", { "data-split": by }, el("h3", {}, title));
    root.append(section);
    if (data.empty) { section.append(emptyNote(`No events in the last ${WINDOW_WORDS[window]}.`)); continue; }
    section.append(table([title.toLowerCase(), "requests", "shown", "accepted (full)", "accepted (partial)", "accepted chars", "retained 600 s", "latency p50"],
      data.rows.map((r) => el("tr", { "data-value": r.value },
        el("td", {}, r.value), el("td", { "data-key": "requests" }, num(r.requests)), el("td", {}, pct(r.shown_share)),
        el("td", { "data-key": "accept_rate" }, pct(r.accept_rate)), el("td", {}, pct(r.partial_rate)),
        el("td", {}, num(r.accepted_chars)), el("td", {}, pct(r.retained_share["600"])), el("td", {}, ms(r.latency_ms.p50)))),
      { class: "split" }));
    section.append(chart(`Accept rate by ${title.toLowerCase()}`, `accept-${by}`, data.series.t,
      data.series.values.map((v, i) => ({ label: v, values: data.series.accept_rate[i] })), { percent: true }));
  }
}

const RENDER = { overview, policies, ingestion, breakdown };

// -- shell ----------------------------------------------------------------------------------

async function render(clearStatus = true) {
  const root = $("page");
  for (const plot of state.charts) plot.destroy();
  state.charts = [];
  root.replaceChildren();
  if (clearStatus) status("");
  const page = currentPage();
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === page));
  const tenant = $("tenant").value;
  const window = $("window").value;
  document.body.dataset.page = page;
  document.body.dataset.ready = "false";
  try {
    await RENDER[page](root, tenant, window);
  } catch (exc) {
    if (exc instanceof ApiError && exc.status === 401) return signOut("The token was not accepted.");
    const text = exc instanceof ApiError && (exc.status === 403 || exc.status === 404)
      ? `Not allowed: ${exc.message} (HTTP ${exc.status})` : `Could not load: ${exc.message}`;
    status(text, "error");
    root.dataset.error = String(exc.status || "");
  }
  document.body.dataset.ready = "true";
}

function signOut(message = "") {
  sessionStorage.removeItem(TOKEN_KEY);
  state.me = null;
  $("page").replaceChildren();
  $("controls").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message;
  document.body.dataset.ready = "true";
}

async function start() {
  if (!sessionStorage.getItem(TOKEN_KEY)) return signOut();
  try {
    state.me = await api("/v1/stats/tenants");
  } catch (exc) {
    return signOut(exc instanceof ApiError && exc.status === 401 ? "The token was not accepted." : exc.message);
  }
  $("login").hidden = true;
  $("controls").hidden = false;
  $("who").textContent = `${state.me.label || "token"} of ${state.me.tenant}${state.me.admin ? " (admin)" : ""}`;
  const wanted = query("tenant") || state.me.tenant;
  const names = state.me.tenants.includes(wanted) ? state.me.tenants : [...state.me.tenants, wanted];
  $("tenant").replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  $("tenant").value = wanted;
  const window = query("window");
  if (window && WINDOW_WORDS[window]) $("window").value = window;
  await render();
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
  $("token").value = "";
  start();
});
$("signout").addEventListener("click", () => signOut());
$("tenant").addEventListener("change", () => { setQuery("tenant", $("tenant").value); render(); });
$("window").addEventListener("change", () => { setQuery("window", $("window").value); render(); });
document.querySelectorAll("#nav a").forEach((a) => a.addEventListener("click", (event) => {
  event.preventDefault();
  const url = new URL(a.href);
  url.search = location.search;
  history.pushState(null, "", url);
  render();
}));
window.addEventListener("popstate", () => render());
start();
