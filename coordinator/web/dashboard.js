// The Kiln dashboard (index.html): polls the coordinator's JSON API (coordinator/src/dashboard.h)
// every 2 s and draws with the DOM alone. The token comes from the URL's fragment (#token=...)
// or the form, and goes out in an Authorization header (Note [Dashboard auth] in dashboard.cpp).
// Every string from the API goes in as text (textContent), never as markup.
"use strict";

const REFRESH_MS = 2000;
const LOG_TAIL = 200;
const MAX_POINTS = 2000;  // per line of a chart; longer curves are thinned evenly
const COLOURS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#e16f24",
                 "#6e7781"];
const SVG_NS = "http://www.w3.org/2000/svg";

let token = "";
let selected = new URLSearchParams(location.search).get("job") || "";
let steps = new Map();  // "step:rank" -> the selected job's step records
let stepsOf = "";       // the job whose records `steps` holds
let timer = 0;

class Unauthorized extends Error {}

function readToken() {
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.has("token")) {
    token = hash.get("token");
    sessionStorage.setItem("kiln-token", token);
    history.replaceState(null, "", location.pathname + location.search);  // out of sight
  } else {
    token = sessionStorage.getItem("kiln-token") || "";
  }
}

async function api(path) {
  const headers = token ? {Authorization: "Bearer " + token} : {};
  const r = await fetch(path, {headers, cache: "no-store"});
  const body = await r.json().catch(() => ({error: `${r.status} ${r.statusText}`}));
  if (r.status === 401) throw new Unauthorized(body.error);
  if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
  return body;
}

// A profile link: the API needs the token, which a plain link cannot send.
async function downloadWithToken(event, href, name) {
  if (!token) return;  // no auth: the link itself works
  event.preventDefault();
  const r = await fetch(href, {headers: {Authorization: "Bearer " + token}, cache: "no-store"});
  if (!r.ok) return;
  const url = URL.createObjectURL(await r.blob());
  const a = el("a", {href: url, download: name});
  a.click();
  URL.revokeObjectURL(url);
}

// An HTML element with attributes and children (strings become text nodes).
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  e.append(...children);
  return e;
}

function svgEl(tag, attrs = {}, text = "") {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

const num = (v, digits) => el("td", {class: "num"}, v == null ? "-" : Number(v).toFixed(digits));

function when(ms) {
  return ms ? new Date(Number(ms)).toLocaleString() : "-";
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  for (n = Number(n); n >= 1024 && i < units.length - 1; ++i) n /= 1024;
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function setStatus(text, error = false) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = error ? "error" : "";
}

function renderJobs(jobs) {
  const rows = jobs.slice().reverse().map(j => {  // newest first
    const command = j.command.join(" ");
    const tr = el("tr", {"data-job": j.job_id},
                  el("td", {}, j.job_id),
                  el("td", {class: `state state-${j.state}`}, j.state),
                  num(j.workers, 0), num(j.priority, 0),
                  el("td", {}, when(j.submitted_unix_ms)),
                  el("td", {class: "command", title: command},
                     command.length > 80 ? command.slice(0, 77) + "..." : command));
    if (j.job_id === selected) tr.classList.add("selected");
    tr.addEventListener("click", () => select(j.job_id));
    return tr;
  });
  document.querySelector("#jobs tbody").replaceChildren(...rows);
}

function renderWorkers(workers) {
  const now = Date.now();
  const rows = workers.map(w => el("tr", {"data-worker": w.worker_id},
      el("td", {}, w.worker_id), el("td", {}, w.address), el("td", {}, w.device),
      el("td", {class: `state state-${w.state}`}, w.state),
      el("td", {class: "num"}, bytes(w.memory_in_use_bytes)),
      el("td", {class: "num"},
         w.last_heartbeat_unix_ms ? `${((now - w.last_heartbeat_unix_ms) / 1000).toFixed(1)} s ago`
                                  : "-")));
  document.querySelector("#workers tbody").replaceChildren(...rows);
}

function thin(points) {
  if (points.length <= MAX_POINTS) return points;
  const every = Math.ceil(points.length / MAX_POINTS);
  return points.filter((p, i) => i % every === 0 || i === points.length - 1);
}

// Draws one polyline per rank ({rank: [[x, y], ...]}) into `svg`, with the axes' ranges.
function plot(svg, byRank) {
  const W = 640, H = 260, L = 60, R = 12, T = 12, B = 30;
  const all = Object.values(byRank).flat();
  if (!all.length) {
    svg.replaceChildren(svgEl("text", {x: L, y: H / 2}, "no steps yet"));
    return;
  }
  let [x0, x1, y0, y1] = [Infinity, -Infinity, Infinity, -Infinity];
  for (const [x, y] of all) {  // no Math.min(...all): a long run would overflow the stack
    [x0, x1, y0, y1] = [Math.min(x0, x), Math.max(x1, x), Math.min(y0, y), Math.max(y1, y)];
  }
  if (y0 === y1) [y0, y1] = [y0 - 0.5 * Math.abs(y0 || 1), y1 + 0.5 * Math.abs(y1 || 1)];
  const px = x => L + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - L - R);
  const py = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const parts = [
    svgEl("line", {class: "axis", x1: L, y1: T, x2: L, y2: H - B}),
    svgEl("line", {class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B}),
    svgEl("text", {x: L - 4, y: T + 10, "text-anchor": "end"}, y1.toPrecision(3)),
    svgEl("text", {x: L - 4, y: H - B, "text-anchor": "end"}, y0.toPrecision(3)),
    svgEl("text", {x: L, y: H - 10}, `step ${x0}`),
    svgEl("text", {x: W - R, y: H - 10, "text-anchor": "end"}, `step ${x1}`),
  ];
  for (const [i, [rank, points]] of Object.entries(byRank).entries()) {
    const colour = COLOURS[rank % COLOURS.length];
    parts.push(svgEl("text", {class: "legend", x: W - R, y: T + 10 + 12 * i,
                              "text-anchor": "end", fill: colour}, `rank ${rank}`));
    const line = svgEl("polyline", {
      class: `rank-${rank}${rank === "0" ? "" : " other-rank"}`,
      "data-rank": rank,
      stroke: colour,
      points: thin(points).map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" "),
    });
    line.append(svgEl("title", {}, `rank ${rank}`));
    parts.push(line);
  }
  svg.replaceChildren(...parts);
}

// {rank: [[step, field], ...]} of the selected job's steps, by step.
function series(field) {
  const byRank = {};
  const sorted = [...steps.values()].sort((a, b) => a.step - b.step || a.rank - b.rank);
  for (const r of sorted) {
    if (r[field] == null || !Number.isFinite(r[field])) continue;
    (byRank[r.rank] ??= []).push([r.step, r[field]]);
  }
  return byRank;
}

function renderJob(job, lines) {
  document.getElementById("job").hidden = false;
  document.getElementById("job-id").textContent = job.job_id;
  const state = document.getElementById("job-state");
  state.textContent = job.state;
  state.className = `state state-${job.state}`;
  document.getElementById("job-message").textContent =
      [job.command.join(" "), job.message].filter(Boolean).join(": ");
  plot(document.getElementById("loss-curve"), series("loss"));
  plot(document.getElementById("step-chart"), series("busy_seconds"));
  const last = job.last_steps.slice().sort((a, b) => a.rank - b.rank);
  document.querySelector("#step-times tbody").replaceChildren(...last.map(r => el(
      "tr", {"data-rank": r.rank}, el("td", {}, String(r.rank)), num(r.step, 0),
      el("td", {class: "num"}, r.loss == null ? "-" : Number(r.loss).toPrecision(4)),
      num(r.seconds, 3), num(r.busy_seconds, 3),
      num(r.seconds > 0 && r.tokens > 0 ? r.tokens / r.seconds : null, 0))));
  document.getElementById("findings").replaceChildren(...job.findings.map(f => el(
      "li", {class: `finding kind-${f.kind}`}, el("span", {class: "kind"}, f.kind), ": ", f.text,
      el("span", {class: "when"}, ` (${when(f.unix_ms)})`))));
  document.getElementById("profiles").replaceChildren(...(job.profiles || []).map(p => {
    const href = `api/jobs/${encodeURIComponent(job.job_id)}/profiles/${p.profile_id}`;
    const a = el("a", {href, download: `${job.job_id}-profile-${p.profile_id}.json`},
                 `profile ${p.profile_id}`);
    a.addEventListener("click", e => downloadWithToken(e, href, a.getAttribute("download")));
    const missing = p.missing.length ? `; missing: ${p.missing.join("; ")}` : "";
    return el("li", {class: "profile"}, a,
              ` (${p.steps} steps, ranks ${p.ranks.join(", ")}, ${p.bytes} bytes, ` +
              `${when(p.unix_ms)}${missing})`);
  }));
  const log = document.getElementById("log");
  const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.textContent = lines.join("\n");
  if (atBottom) log.scrollTop = log.scrollHeight;
}

async function refreshJob() {
  if (stepsOf !== selected) {
    steps = new Map();
    stepsOf = selected;
  }
  let from = 0;  // again from the newest step: its other ranks may have reported since
  for (const r of steps.values()) from = Math.max(from, r.step);
  const id = encodeURIComponent(selected);
  try {
    const [job, more, logs] = await Promise.all([
      api(`api/jobs/${id}`), api(`api/jobs/${id}/steps?from=${from}`),
      api(`api/jobs/${id}/logs?tail=${LOG_TAIL}`)]);
    for (const r of more.steps) steps.set(`${r.step}:${r.rank}`, r);
    renderJob(job, logs.lines);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    document.getElementById("job").hidden = false;
    document.getElementById("job-id").textContent = selected;
    document.getElementById("job-state").textContent = "";
    document.getElementById("job-message").textContent = e.message;
    for (const id of ["loss-curve", "step-chart", "findings", "profiles", "log"])
      document.getElementById(id).replaceChildren();
    document.querySelector("#step-times tbody").replaceChildren();
  }
}

async function refresh() {
  clearTimeout(timer);
  try {
    const [jobs, workers] = await Promise.all([api("api/jobs"), api("api/workers")]);
    renderJobs(jobs.jobs);
    renderWorkers(workers.workers);
    if (selected) await refreshJob();
    document.getElementById("token-form").hidden = true;
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    setStatus(e.message, true);
    if (e instanceof Unauthorized) {  // no polling until a token is given
      document.getElementById("token-form").hidden = false;
      return;
    }
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function select(id) {
  selected = id;
  const url = new URL(location.href);
  url.searchParams.set("job", id);
  history.replaceState(null, "", url.pathname + url.search);
  refresh();
}

document.getElementById("token-form").addEventListener("submit", e => {
  e.preventDefault();
  token = document.getElementById("token-input").value.trim();
  sessionStorage.setItem("kiln-token", token);
  refresh();
});

readToken();
refresh();
