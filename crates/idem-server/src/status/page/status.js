// The idem status page: polls /status.json and draws it. Everything from
// the server is set as text (never as HTML): keys and error strings are
// untrusted.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const CHART = { width: 860, height: 260, left: 56, right: 12, top: 12, bottom: 28 };

const FAMILIES = {
  begins: {
    tab: "Begin answers",
    caption: "Begin answers per second, last 5 minutes: acquired runs the work, completed answers a duplicate from the store, in_progress tells a duplicate to retry later, mismatch refuses a reused key.",
  },
  messages: {
    tab: "Messages",
    caption: "Messages settled per second, last 5 minutes: handled ran the handler, duplicate was answered from the store, retried_* come back later, dead_lettered were parked.",
  },
};

const COLOURS = {
  acquired: "#2b6fd6",
  completed: "#1f8a4c",
  in_progress: "#e08600",
  mismatch: "#c92a2a",
  handled: "#2b6fd6",
  duplicate: "#1f8a4c",
  retried_busy: "#e08600",
  retried_failed: "#d9480f",
  retried_unavailable: "#f2b705",
  dead_lettered: "#c92a2a",
  requeued: "#7048e8",
};
const SPARE_COLOURS = ["#0c8599", "#862e9c", "#5c940d", "#495057"];

const state = { family: null, namespace: "", last: null };

function $(id) {
  return document.getElementById(id);
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function colour(outcome, index) {
  return COLOURS[outcome] || SPARE_COLOURS[index % SPARE_COLOURS.length];
}

function number(n) {
  if (n === null || n === undefined) return "–";
  if (Math.abs(n) >= 100 || Number.isInteger(n)) return Math.round(n).toLocaleString("en");
  return n.toFixed(n >= 10 ? 1 : 2);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return s + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

// The smallest of 1, 2, 5 × 10^n at or above `max`.
function niceCeiling(max) {
  if (max <= 0) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(max)));
  for (const step of [1, 2, 5, 10]) {
    if (step * power >= max) return step * power;
  }
  return 10 * power;
}

function replaceRows(tbody, rows, emptyText, columns) {
  tbody.replaceChildren();
  if (rows.length === 0) {
    const tr = el("tr", null, "none");
    const td = el("td", emptyText);
    td.colSpan = columns;
    tr.append(td);
    tbody.append(tr);
    return;
  }
  for (const cells of rows) {
    const tr = el("tr");
    for (const cell of cells) tr.append(cell);
    tbody.append(tr);
  }
}

function drawChart(data) {
  const chart = $("chart");
  chart.replaceChildren();
  const family = data.activity.families.find((f) => f.family === state.family);
  const times = data.activity.times_ms;
  const { width, height, left, right, top, bottom } = CHART;
  const plotW = width - left - right;
  const plotH = height - top - bottom;
  const outcomes = family ? Object.entries(family.outcomes) : [];
  let max = 0;
  for (const [, values] of outcomes) for (const v of values) max = Math.max(max, v);
  const ceiling = niceCeiling(max);
  chart.dataset.max = String(max);
  chart.dataset.series = String(outcomes.length);

  for (let i = 0; i <= 4; i += 1) {
    const y = top + plotH - (plotH * i) / 4;
    chart.append(svg("line", { class: "grid", x1: left, x2: width - right, y1: y, y2: y }));
    chart.append(svg("text", { class: "axis-label", x: left - 8, y: y + 4, "text-anchor": "end" }, number((ceiling * i) / 4)));
  }
  // The window is five minutes whatever has been sampled yet; "now" is
  // the newest sample.
  const span = 300000;
  const end = times.length ? times[times.length - 1] : data.now_ms;
  const x = (t) => left + plotW * (1 - (end - t) / span);
  for (let m = 5; m >= 0; m -= 1) {
    const label = m === 0 ? "now" : "−" + m + " min";
    chart.append(svg("text", { class: "axis-label", x: x(end - m * 60000), y: height - 8, "text-anchor": "middle" }, label));
  }
  if (outcomes.length === 0 || times.length < 2) {
    chart.append(svg("text", { class: "empty", x: left + plotW / 2, y: top + plotH / 2, "text-anchor": "middle" }, "No activity in the last 5 minutes"));
  }
  const y = (v) => top + plotH - (plotH * v) / ceiling;
  outcomes.forEach(([outcome, values], index) => {
    const points = values.map((v, i) => x(times[i]).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
    chart.append(svg("polyline", { class: "series", points, stroke: colour(outcome, index), "data-outcome": outcome }));
  });

  const legend = $("legend");
  legend.replaceChildren();
  outcomes.forEach(([outcome, values], index) => {
    const item = el("li");
    const swatch = el("span", null, "swatch");
    swatch.style.background = colour(outcome, index);
    const now = values.length ? values[values.length - 1] : 0;
    item.append(swatch, el("span", outcome + " " + number(now) + "/s"));
    legend.append(item);
  });

  const cursor = svg("line", { class: "cursor", x1: 0, x2: 0, y1: top, y2: top + plotH, visibility: "hidden" });
  chart.append(cursor);
  chart.onmousemove = (event) => {
    if (times.length === 0 || outcomes.length === 0) return;
    const box = chart.getBoundingClientRect();
    const at = ((event.clientX - box.left) / box.width) * width;
    let nearest = 0;
    for (let i = 1; i < times.length; i += 1) {
      if (Math.abs(x(times[i]) - at) < Math.abs(x(times[nearest]) - at)) nearest = i;
    }
    cursor.setAttribute("x1", x(times[nearest]));
    cursor.setAttribute("x2", x(times[nearest]));
    cursor.setAttribute("visibility", "visible");
    const tip = $("tooltip");
    tip.replaceChildren(el("div", new Date(times[nearest]).toLocaleTimeString()));
    for (const [outcome, values] of outcomes) tip.append(el("div", outcome + ": " + number(values[nearest]) + "/s"));
    tip.style.left = Math.min(box.width - 180, Math.max(0, (x(times[nearest]) / width) * box.width + 12)) + "px";
    tip.hidden = false;
  };
  chart.onmouseleave = () => {
    cursor.setAttribute("visibility", "hidden");
    $("tooltip").hidden = true;
  };
}

function drawFamilies(data) {
  const families = data.activity.families.map((f) => f.family);
  if (families.length === 0) families.push(data.service === "idem consume" ? "messages" : "begins");
  if (!families.includes(state.family)) state.family = families[0];
  const tabs = $("families");
  tabs.replaceChildren();
  if (families.length > 1) {
    for (const family of families) {
      const tab = el("button", (FAMILIES[family] || { tab: family }).tab);
      tab.setAttribute("role", "tab");
      tab.setAttribute("aria-selected", String(family === state.family));
      tab.onclick = () => {
        state.family = family;
        render(state.last);
      };
      tabs.append(tab);
    }
  }
  $("chart-title").textContent = (FAMILIES[state.family] || { tab: state.family }).tab;
  $("chart-caption").textContent = (FAMILIES[state.family] || { caption: "" }).caption;
}

function drawNamespaceChoice(data) {
  const select = $("namespace");
  const names = new Set();
  for (const f of data.activity.families) for (const n of f.namespaces) names.add(n.namespace);
  for (const n of data.store.namespaces || []) names.add(n.namespace);
  if (state.namespace) names.add(state.namespace);
  const wanted = ["", ...[...names].sort()];
  const have = [...select.options].map((o) => o.value);
  if (wanted.join("\u0000") !== have.join("\u0000")) {
    select.replaceChildren(el("option", "All namespaces"));
    select.options[0].value = "";
    for (const name of wanted.slice(1)) {
      const option = el("option", name);
      option.value = name;
      select.append(option);
    }
  }
  select.value = state.namespace;
}

function drawNamespaces(data) {
  const activity = new Map();
  const family = data.activity.families.find((f) => f.family === state.family);
  for (const n of family ? family.namespaces : []) activity.set(n.namespace, n);
  const counted = new Map();
  for (const n of data.store.namespaces || []) counted.set(n.namespace, n);
  const names = [...new Set([...activity.keys(), ...counted.keys()])];
  const rows = names.map((name) => {
    const a = activity.get(name);
    const c = counted.get(name) || {};
    const total = a ? Object.values(a.in_window).reduce((s, n) => s + n, 0) : 0;
    const cells = [
      el("td", name),
      el("td", number(a ? a.per_second_now : 0), "num"),
      el("td", number(total), "num"),
      el("td", number(c.in_progress), "num"),
      el("td", number(c.abandoned), "num"),
      el("td", number(c.completed), "num"),
      el("td", number(c.expired), "num"),
      el("td", c.error ? "error: " + c.error : age(c.oldest_in_progress_seconds), "num"),
    ];
    if (a) cells[2].title = Object.entries(a.in_window).map(([k, v]) => k + ": " + v).join(", ");
    return cells;
  });
  replaceRows($("namespaces").tBodies[0], rows, "No namespace has records or activity yet.", 8);
  const note = [];
  if (data.store.counted === false) note.push("This store does not count its records: the table shows activity only.");
  if (data.store.namespaces_total > (data.store.namespaces || []).length) {
    note.push("Counting the first " + data.store.namespaces.length + " of " + data.store.namespaces_total + " namespaces (idem stats counts them all).");
  }
  if (data.store.namespaces_error) note.push("Listing namespaces failed: " + data.store.namespaces_error);
  $("namespaces-note").textContent = note.join(" ");
}

function drawStuck(data) {
  const rows = [];
  let more = false;
  let errors = [];
  for (const n of data.store.namespaces || []) {
    if (n.stuck_more) more = true;
    if (n.stuck_error) errors.push(n.namespace + ": " + n.stuck_error);
    for (const entry of n.stuck || []) {
      const running = (data.store.checked_at_ms - entry.started_at_ms) / 1000;
      const expired = entry.lease_left_ms === 0;
      const lease = expired
        ? "ended " + age((data.store.checked_at_ms - entry.lease_expires_at_ms) / 1000) + " ago: the next delivery takes it over"
        : age(entry.lease_left_ms / 1000) + " left";
      rows.push([
        el("td", n.namespace),
        el("td", entry.key === null ? "(hidden: auth is on)" : entry.key, "key"),
        el("td", age(running), "num"),
        el("td", lease, expired ? "expired" : ""),
        el("td", number(entry.attempts), "num"),
        el("td", String(entry.token), "num"),
      ]);
    }
  }
  const after = age(data.store.stuck_after_seconds);
  replaceRows($("stuck").tBodies[0], rows, "No claim has been in progress for over " + after + ".", 6);
  const flag = Math.max(1, Math.round(data.store.stuck_after_seconds || 0)) + "s";
  const note = ["Claims in progress for over " + after + ". idem ls NS --state in-progress --older-than " + flag + " lists them all; idem release NS KEY --force frees one whose holder is gone."];
  if (more) note.push("Only the first few per namespace are shown.");
  if (errors.length) note.push("Listing failed: " + errors.join("; "));
  $("stuck-note").textContent = note.join(" ");
}

function drawStore(data) {
  const store = data.store;
  const health = $("health");
  if (store.looking) {
    health.className = "pill";
    health.textContent = "looking at the store…";
  } else {
    health.className = "pill " + (store.healthy ? "ok" : "fail");
    health.textContent = store.healthy ? "store answers in " + number(store.answered_ms) + " ms" : "store unreachable";
  }
  $("store-description").textContent = store.description || "";
  const facts = $("store-facts");
  facts.replaceChildren();
  const fact = (name, value) => facts.append(el("dt", name), el("dd", value));
  fact("Store", store.description || "–");
  if (store.looking) {
    fact("Health", "the first look at the store is under way");
    return;
  }
  fact("Health", store.healthy ? "answers (" + number(store.answered_ms) + " ms)" : "no answer: " + (store.error || "unknown"));
  if (store.size) fact("Size", bytes(store.size.bytes) + ": " + store.size.what);
  fact("Looked at", age((data.now_ms - store.checked_at_ms) / 1000) + " ago (at least " + store.refresh_seconds + " s apart, longer where counting is slow)");
  const findings = $("findings");
  findings.replaceChildren();
  for (const f of store.findings || []) {
    const item = el("li");
    item.append(el("span", f.severity, "pill " + f.severity), el("strong", f.check + ": "), el("span", f.detail));
    if (f.fix) item.append(el("span", "Fix: " + f.fix, "fix"));
    findings.append(item);
  }
}

function drawConsumer(data) {
  const section = $("consumer");
  const c = data.consumer;
  section.hidden = !c;
  if (!c) return;
  const facts = $("consumer-facts");
  facts.replaceChildren();
  const fact = (name, value) => facts.append(el("dt", name), el("dd", value));
  fact("From", c.source || "(starting)");
  fact("To", c.to);
  fact("State", !c.running ? "starting" : c.ready ? "taking messages" : "paused: the handler refuses messages (see the log)");
  for (const l of c.lag) fact("Lag of " + l.namespace, number(l.lag) + " messages waiting");
  if (c.lag.length === 0) fact("Lag", "not known yet (asked every 5 s)");
  fact("Dead-lettered", number(c.dead_lettered_total) + " since start (idem dlq ls lists them)");
  fact("Settled", number(c.settled_total) + " since start");
}

function render(data) {
  if (!data) return;
  state.last = data;
  document.title = data.service + " status";
  $("service").textContent = data.service;
  $("version").textContent = "v" + data.version + " · up " + age((data.now_ms - data.started_at_ms) / 1000);
  $("updated").textContent = "Updated " + new Date(data.now_ms).toLocaleTimeString() + "; refreshes every " + POLL_MS / 1000 + " s.";
  drawFamilies(data);
  drawNamespaceChoice(data);
  drawChart(data);
  drawNamespaces(data);
  drawStuck(data);
  drawStore(data);
  drawConsumer(data);
}

// Asks for the status and draws it, unless the namespace was changed
// while the answer was on its way.
// With auth on, the server asks for a bearer token: it is kept for this
// tab only (sessionStorage), and sent with each request for the status.
const TOKEN_KEY = "idem-status-token";

async function refresh() {
  const namespace = state.namespace;
  const query = namespace ? "?namespace=" + encodeURIComponent(namespace) : "";
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const response = await fetch("/status.json" + query, { cache: "no-store", headers });
  // Asked with a token since given up: a newer request answers.
  if (sessionStorage.getItem(TOKEN_KEY) !== token) return;
  const form = $("token-form");
  if (response.status === 401 || response.status === 403) {
    form.hidden = false;
    $("token-refused").textContent = token ? "That token was refused (HTTP " + response.status + ")." : "";
    return;
  }
  if (!response.ok) throw new Error("HTTP " + response.status);
  form.hidden = true;
  const data = await response.json();
  if (namespace === state.namespace) render(data);
}

async function poll() {
  const banner = $("unreachable");
  try {
    await refresh();
    banner.hidden = true;
  } catch (e) {
    banner.textContent = "Cannot reach idem (" + e.message + "); retrying every " + POLL_MS / 1000 + " s. The figures below are from the last answer.";
    banner.hidden = false;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    refresh().catch(() => {});
  });
  $("namespace").addEventListener("change", (event) => {
    state.namespace = event.target.value;
    // Asked at once rather than at the next tick; the loop reports failures.
    refresh().catch(() => {});
  });
  poll();
});
