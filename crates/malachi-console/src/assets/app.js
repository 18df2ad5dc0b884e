// Malachi console: a small single-page app over the broker's JSON API (/api/...), polled every
// two seconds. No framework, no build step; every value from the server enters the page as text.
"use strict";

const POLL_MS = 2000;
const HISTORY_POINTS = 150; // five minutes at one point per poll

const state = {
  overview: null,
  groups: [],
  topic: null,
  selectedRange: null,
  history: { total: [], topics: new Map(), lag: new Map() },
  timer: null,
};

// ---------------------------------------------------------------- helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    // Through the CSSOM: the page's CSP refuses style attributes.
    else if (key === "style") node.style.cssText = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const fmt = new Intl.NumberFormat("en-US");
function num(value) { return value === null || value === undefined ? "–" : fmt.format(value); }
function rate(value) {
  if (value === null || value === undefined) return "–";
  if (value >= 100) return fmt.format(Math.round(value));
  return value.toFixed(1);
}
function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let at = 0;
  while (value >= 1024 && at < units.length - 1) { value /= 1024; at += 1; }
  return `${at === 0 ? value : value.toFixed(1)} ${units[at]}`;
}
function ago(ms, now) {
  if (!ms) return "never";
  const seconds = Math.max(0, Math.round((now - ms) / 1000));
  if (seconds < 60) return `${seconds}s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m ago`;
  return `${Math.round(seconds / 3600)}h ago`;
}

async function api(path, options) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  if (response.status === 401) {
    window.location.assign("/login");
    throw new Error("login required");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

async function act(path, body) {
  const csrf = state.overview && state.overview.viewer ? state.overview.viewer.csrf : "";
  return api(path, {
    method: "POST",
    headers: { "content-type": "application/json", "x-malachi-csrf": csrf },
    body: JSON.stringify(body || {}),
  });
}

function push(series, value) {
  series.push(value);
  while (series.length > HISTORY_POINTS) series.shift();
}

// Records per second between successive samples of a growing count.
function rates(samples) {
  const out = [];
  for (let i = 1; i < samples.length; i += 1) {
    const seconds = (samples[i].t - samples[i - 1].t) / 1000;
    const delta = samples[i].v - samples[i - 1].v;
    out.push(seconds > 0 && delta >= 0 ? delta / seconds : 0);
  }
  return out;
}

function drawLine(canvas, values, color, fill) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const max = Math.max(1, ...values);
  const pad = 4;
  const step = (width - 2 * pad) / Math.max(1, HISTORY_POINTS - 1);
  const x0 = width - pad - step * (values.length - 1);
  const y = (v) => height - pad - (v / max) * (height - 2 * pad);
  if (values.length < 2) {
    // A line needs two points: say why the chart is still empty rather than show nothing.
    ctx.fillStyle = "#8a93a6";
    ctx.font = "12px system-ui, sans-serif";
    if (height > 40) ctx.fillText("Collecting samples…", pad + 4, height / 2);
    return;
  }
  ctx.beginPath();
  values.forEach((v, i) => (i === 0 ? ctx.moveTo(x0, y(v)) : ctx.lineTo(x0 + i * step, y(v))));
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.6;
  ctx.stroke();
  if (fill) {
    ctx.lineTo(x0 + (values.length - 1) * step, height - pad);
    ctx.lineTo(x0, height - pad);
    ctx.closePath();
    ctx.fillStyle = fill;
    ctx.fill();
  }
}

function chart(values, color, fill, className) {
  const canvas = el("canvas", { class: className || "chart" });
  requestAnimationFrame(() => drawLine(canvas, values, color, fill));
  return canvas;
}

function badge(text, kind) { return el("span", { class: `badge ${kind || text}` }, text); }

// ---------------------------------------------------------------- data

async function refreshOverview() {
  const overview = await api("/api/overview");
  state.overview = overview;
  const t = overview.now_ms;
  let total = 0;
  for (const topic of overview.topics) {
    if (typeof topic.records !== "number") continue;
    total += topic.records;
    if (!state.history.topics.has(topic.name)) state.history.topics.set(topic.name, []);
    push(state.history.topics.get(topic.name), { t, v: topic.records });
  }
  push(state.history.total, { t, v: total });
  renderChrome();
}

async function refreshGroups() {
  const body = await api("/api/groups");
  state.groups = body.groups;
  const t = state.overview ? state.overview.now_ms : Date.now();
  for (const group of body.groups) {
    const key = `${group.topic}\u0000${group.group}`;
    if (!state.history.lag.has(key)) state.history.lag.set(key, []);
    push(state.history.lag.get(key), { t, v: group.total });
  }
}

function renderChrome() {
  const overview = state.overview;
  document.getElementById("cluster-name").textContent =
    overview.cluster_id ? `cluster ${overview.cluster_id.slice(0, 8)} · node ${overview.node_id}` : `node ${overview.node_id}`;
  const viewer = overview.viewer;
  document.getElementById("viewer-name").textContent = viewer ? viewer.username : "";
  document.getElementById("logout-form").hidden = !viewer;
  const banner = document.getElementById("status-banner");
  banner.hidden = !overview.ready;
  banner.textContent = overview.ready ? `This broker is not ready: ${overview.ready}` : "";
  document.getElementById("updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
}

// ---------------------------------------------------------------- views

function topicRate(name) {
  const values = rates(state.history.topics.get(name) || []);
  return { values, now: values.length ? values[values.length - 1] : null };
}

function topicsTable(topics) {
  if (topics.length === 0) {
    return el("div", { class: "empty" }, "No topics yet. ", el("code", {}, "malachi topic create orders"), " creates one.");
  }
  const rows = topics.map((topic) => {
    const { values, now } = topicRate(topic.name);
    return el("tr", {
      class: "clickable",
      dataset: { topic: topic.name },
      onclick: () => { window.location.hash = `#/topics/${encodeURIComponent(topic.name)}`; },
    },
      el("td", {}, el("a", { href: `#/topics/${encodeURIComponent(topic.name)}` }, topic.name)),
      el("td", { class: "num" }, topic.error ? badge(topic.error, "bad") : `${topic.ranges_active} / ${topic.ranges}`),
      el("td", { class: "num" }, num(topic.segments)),
      el("td", { class: "num records" }, num(topic.records)),
      el("td", { class: "num" }, rate(now)),
      el("td", {}, chart(values, "#3d5afe", "rgba(61,90,254,.12)", "spark")));
  });
  return el("table", { id: "topics-table" },
    el("thead", {}, el("tr", {},
      el("th", {}, "Topic"), el("th", { class: "num" }, "Active / all ranges"), el("th", { class: "num" }, "Segments"),
      el("th", { class: "num" }, "Records"), el("th", { class: "num" }, "Records/s"), el("th", {}, "Last 5 min"))),
    el("tbody", {}, rows));
}

function brokersTable(brokers) {
  return el("table", { id: "brokers-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "Broker"), el("th", {}, "Status"), el("th", {}, "Client address"), el("th", {}, "Attributes"))),
    el("tbody", {}, brokers.map((b) => el("tr", { dataset: { broker: b.node_id } },
      el("td", {}, `#${b.node_id}`), el("td", {}, badge(b.status)), el("td", { class: "mono" }, b.client_address),
      el("td", { class: "small" }, Object.entries(b.attributes || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "–")))));
}

function renderOverview(view) {
  const overview = state.overview;
  const alive = overview.brokers.filter((b) => b.status === "alive").length;
  const totalRates = rates(state.history.total);
  const nowRate = totalRates.length ? totalRates[totalRates.length - 1] : null;
  const records = overview.topics.reduce((sum, t) => sum + (t.records || 0), 0);
  const lag = state.groups.reduce((sum, g) => sum + g.total, 0);
  view.replaceChildren(
    el("h1", {}, "Overview"),
    el("div", { class: "grid cards" },
      card("Brokers alive", `${alive} / ${overview.brokers.length}`, alive === overview.brokers.length ? "all members alive" : "some members are down"),
      card("Topics", num(overview.topics_total), `${overview.topics.reduce((s, t) => s + (t.ranges_active || 0), 0)} active ranges`),
      card("Records", num(records), "retained, all topics"),
      card("Throughput", `${rate(nowRate)}/s`, "records appended"),
      card("Consumer lag", num(lag), `${state.groups.length} groups`)),
    el("div", { class: "grid two" },
      el("section", { class: "panel" }, el("h2", {}, "Records appended per second"), chart(totalRates, "#3d5afe", "rgba(61,90,254,.12)")),
      el("section", { class: "panel" }, el("h2", {}, "Brokers"), brokersTable(overview.brokers))),
    el("section", { class: "panel", style: "margin-top:16px" }, el("h2", {}, "Topics"), topicsTable(overview.topics)));
}

function card(label, value, sub) {
  return el("div", { class: "panel card" }, el("div", { class: "label" }, label), el("div", { class: "value" }, value), el("div", { class: "sub" }, sub));
}

function renderTopics(view) {
  view.replaceChildren(el("h1", {}, "Topics"), el("section", { class: "panel" }, topicsTable(state.overview.topics)),
    state.overview.topics_total > state.overview.topics.length
      ? el("p", { class: "muted small" }, `Showing the first ${state.overview.topics.length} of ${state.overview.topics_total} topics.`) : null);
}

function renderGroups(view) {
  const now = state.overview ? state.overview.now_ms : Date.now();
  const rows = state.groups.map((g) => {
    const history = (state.history.lag.get(`${g.topic}\u0000${g.group}`) || []).map((s) => s.v);
    return el("tr", { dataset: { topic: g.topic, group: g.group } },
      el("td", {}, el("a", { href: `#/topics/${encodeURIComponent(g.topic)}` }, g.topic)),
      el("td", {}, g.group),
      el("td", { class: "num lag-total" }, num(g.total)),
      el("td", {}, chart(history, "#d98a00", "rgba(217,138,0,.12)", "spark")),
      el("td", { class: "muted" }, ago(g.updated_ms, now)));
  });
  view.replaceChildren(el("h1", {}, "Consumer groups"), el("section", { class: "panel" },
    state.groups.length === 0 ? el("div", { class: "empty" }, "No group has committed a position yet.")
      : el("table", { id: "groups-table" },
        el("thead", {}, el("tr", {}, el("th", {}, "Topic"), el("th", {}, "Group"), el("th", { class: "num" }, "Lag (records)"), el("th", {}, "Lag, last 5 min"), el("th", {}, "Last commit"))),
        el("tbody", {}, rows))));
}

function renderBrokers(view) {
  const overview = state.overview;
  const groups = overview.groups.map((g) => el("tr", {},
    el("td", {}, groupName(g.group_id)), el("td", {}, g.leader ? `#${g.leader}` : badge("no leader", "bad")),
    el("td", { class: "num" }, num(g.term)), el("td", {}, g.voters.map((v) => `#${v}`).join(" "))));
  view.replaceChildren(el("h1", {}, "Brokers"),
    el("section", { class: "panel" }, brokersTable(overview.brokers)),
    el("section", { class: "panel", style: "margin-top:16px" }, el("h2", {}, "Raft groups"),
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Group"), el("th", {}, "Leader"), el("th", { class: "num" }, "Term"), el("th", {}, "Voters"))),
        el("tbody", {}, groups))));
}

function groupName(id) {
  if (id === "0") return "administrative";
  if (id === "4294967296") return "root (the ring)";
  return `vnode ${id}`;
}

// The range tree: the keyspace across, one row per generation (a range sits below its parents).
function rangeTree(topic) {
  const byId = new Map(topic.ranges.map((r) => [r.range_id, r]));
  const depth = new Map();
  const depthOf = (range) => {
    if (depth.has(range.range_id)) return depth.get(range.range_id);
    const parents = range.parents.map((p) => byId.get(p)).filter(Boolean);
    const d = parents.length ? 1 + Math.max(...parents.map(depthOf)) : 0;
    depth.set(range.range_id, d);
    return d;
  };
  topic.ranges.forEach(depthOf);
  const rows = 1 + Math.max(0, ...depth.values());
  const width = 1000;
  const rowHeight = 34;
  const top = 6;
  const height = top + rows * rowHeight + 18;
  const root = svg("svg", { class: "tree", viewBox: `0 0 ${width} ${height}`, id: "range-tree", role: "img" });
  for (const range of topic.ranges) {
    const x = range.start_fraction * width;
    const w = Math.max(2, (range.end_fraction - range.start_fraction) * width);
    const y = top + depth.get(range.range_id) * rowHeight;
    const kind = range.active ? "active" : "sealed";
    const selected = state.selectedRange === range.range_id ? " selected" : "";
    const rect = svg("rect", {
      class: `range ${kind}${selected}`, x, y, width: w, height: rowHeight - 6, rx: 4,
      "data-range-id": range.range_id, "data-active": range.active,
      onclick: () => { state.selectedRange = range.range_id; render(); },
    }, svg("title", {}, `range ${range.range_id} · ${kind} · ${num(range.records)} records · ${range.start}–${range.end_inclusive}`));
    root.append(rect);
    if (w > 46) {
      root.append(svg("text", { x: x + 6, y: y + 18, class: kind }, `r${range.range_id} · ${num(range.records)}`));
    }
  }
  const axisY = top + rows * rowHeight + 10;
  root.append(svg("text", { x: 0, y: axisY, class: "axis" }, "0"));
  root.append(svg("text", { x: width / 2 - 10, y: axisY, class: "axis" }, "2⁶³"));
  root.append(svg("text", { x: width - 22, y: axisY, class: "axis" }, "2⁶⁴"));
  return root;
}

function buddyOf(topic, range) {
  const start = BigInt(`0x${range.start}`);
  const size = BigInt(`0x${range.end_inclusive}`) - start + 1n;
  const low = start % (2n * size) === 0n;
  const buddyStart = low ? start + size : start - size;
  const buddy = topic.ranges.find((r) => r.active && BigInt(`0x${r.start}`) === buddyStart
    && BigInt(`0x${r.end_inclusive}`) - buddyStart + 1n === size);
  return buddy ? { left: low ? range.range_id : buddy.range_id, right: low ? buddy.range_id : range.range_id } : null;
}

function copies(segment) {
  return segment.copies.map((copy, at) => el("span", {
    class: `copy${at === 0 ? " primary" : ""}${copy.settled ? " settled" : ""}${copy.answered ? "" : " unanswered"}`,
    title: `${at === 0 ? "primary, " : ""}${copy.settled ? "settled" : "not settled"}${copy.answered ? `, ${copy.end} records${copy.sealed ? ", sealed" : ""}` : ", did not answer"}`,
  }, el("span", { class: "dot" }), `#${copy.node_id}`));
}

function segmentsTable(topic) {
  const ranges = state.selectedRange === null ? topic.ranges : topic.ranges.filter((r) => r.range_id === state.selectedRange);
  const rows = ranges.flatMap((range) => range.segments.map((s) => el("tr", { dataset: { segment: s.segment_id } },
    el("td", { class: "mono" }, s.segment_id), el("td", {}, `r${range.range_id}`),
    el("td", {}, s.sealed ? badge("sealed") : badge("active")),
    el("td", { class: "num" }, num(s.base)),
    el("td", { class: "num" }, num(s.sealed ? s.end_offset : Math.max(0, ...s.copies.map((c) => c.end || 0)))),
    el("td", { class: "num" }, s.sealed ? bytes(s.data_bytes) : "–"),
    el("td", {}, copies(s)))));
  return el("table", { id: "segments-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "Segment"), el("th", {}, "Range"), el("th", {}, "State"), el("th", { class: "num" }, "Base"),
      el("th", { class: "num" }, "Records"), el("th", { class: "num" }, "Bytes"), el("th", {}, "Replicas (primary first)"))),
    el("tbody", {}, rows));
}

function rangeDetail(topic) {
  const range = topic.ranges.find((r) => r.range_id === state.selectedRange);
  if (!range) return el("p", { class: "muted" }, "Select a range in the tree to see its keyspace, its segments and what you can do with it.");
  const admin = state.overview.viewer && state.overview.viewer.admin;
  const buddy = range.active ? buddyOf(topic, range) : null;
  const name = topic.name;
  const actions = admin ? el("div", { class: "actions" },
    range.active ? el("button", { id: "split-range", onclick: () => confirmAct(`Split range ${range.range_id} of ${name} into two halves?`,
      `/api/topics/${encodeURIComponent(name)}/split`, { range_id: range.range_id }) }, "Split") : null,
    buddy ? el("button", { id: "merge-range", onclick: () => confirmAct(`Merge ranges ${buddy.left} and ${buddy.right} of ${name}?`,
      `/api/topics/${encodeURIComponent(name)}/merge`, buddy) }, "Merge with its buddy") : null,
    el("button", { class: "", onclick: () => { state.selectedRange = null; render(); } }, "Show all ranges")) : null;
  return el("div", {},
    el("table", {}, el("tbody", {},
      el("tr", {}, el("th", {}, "Range"), el("td", {}, `r${range.range_id} `, range.active ? badge("active") : badge("sealed"))),
      el("tr", {}, el("th", {}, "Keyspace"), el("td", { class: "mono" }, `${range.start} – ${range.end_inclusive}`)),
      el("tr", {}, el("th", {}, "Records"), el("td", {}, `${num(range.records)} retained, ${num(range.expired_records)} expired`)),
      el("tr", {}, el("th", {}, "Parents"), el("td", {}, range.parents.length ? range.parents.map((p) => `r${p}`).join(", ") : "–")),
      el("tr", {}, el("th", {}, "Children"), el("td", {}, range.children.length ? range.children.map((c) => `r${c}`).join(", ") : "–")))),
    actions);
}

async function confirmAct(question, path, body) {
  if (!window.confirm(question)) return;
  try {
    await act(path, body);
    await refresh();
  } catch (error) {
    window.alert(`Refused: ${error.message}`);
  }
}

function groupsOfTopic(topic) {
  if (topic.groups.length === 0) return el("p", { class: "muted" }, "No consumer group has committed on this topic.");
  return el("table", { id: "topic-groups" },
    el("thead", {}, el("tr", {}, el("th", {}, "Group"), el("th", { class: "num" }, "Lag"), el("th", {}, "Per range"), el("th", {}, "Last commit"))),
    el("tbody", {}, topic.groups.map((g) => {
      const max = Math.max(1, ...g.ranges.map((r) => r.lag));
      return el("tr", { dataset: { group: g.group } },
        el("td", {}, g.group),
        el("td", { class: "num lag-total" }, num(g.total)),
        el("td", {}, el("div", { style: "display:flex; gap:6px; flex-wrap:wrap" }, g.ranges.filter((r) => r.lag > 0 || r.standing === "at").map((r) =>
          el("div", { title: `r${r.range_id}: ${num(r.lag)} behind (${r.standing}${r.position !== null ? ` ${r.position}` : ""} of ${r.end})` },
            el("div", { class: "small muted" }, `r${r.range_id} ${num(r.lag)}`),
            el("div", { class: "lagbar" }, el("span", { style: `width:${Math.round(100 * r.lag / max)}%` })))))),
        el("td", { class: "muted" }, ago(g.updated_ms, state.overview.now_ms)));
    })));
}

function renderTopic(view, name) {
  const topic = state.topic;
  if (!topic || topic.name !== name) { view.replaceChildren(el("p", { class: "muted" }, "Loading…")); return; }
  const admin = state.overview.viewer && state.overview.viewer.admin;
  const { values, now } = topicRate(name);
  view.replaceChildren(
    el("h1", {}, el("a", { href: "#/topics" }, "Topics"), " / ", el("span", { id: "topic-name" }, topic.name)),
    el("div", { class: "grid cards" },
      card("Active ranges", num(topic.summary.ranges_active), `${num(topic.summary.ranges)} in the tree`),
      card("Records", num(topic.summary.records), `${num(topic.summary.expired_records)} expired`),
      card("Segments", num(topic.summary.segments), "retained"),
      card("Throughput", `${rate(now)}/s`, "records appended"),
      card("Consumer lag", num(topic.groups.reduce((s, g) => s + g.total, 0)), `${topic.groups.length} groups`)),
    el("section", { class: "panel" }, el("h2", {}, "Range tree"), rangeTree(topic),
      el("div", { class: "legend" }, el("span", {}, el("i", { style: "background:#6f86ff" }), "active"), el("span", {}, el("i", { style: "background:#c9ced8" }), "sealed"),
        el("span", {}, "Across: the keyspace, 0 to 2⁶⁴. Down: generations, each range under its parents."))),
    el("div", { class: "grid two", style: "margin-top:16px" },
      el("section", { class: "panel" }, el("h2", {}, "Segments and their replicas"), segmentsTable(topic)),
      el("div", { class: "grid" },
        el("section", { class: "panel" }, el("h2", {}, "Selected range"), rangeDetail(topic)),
        el("section", { class: "panel" }, el("h2", {}, "Records appended per second"), chart(values, "#3d5afe", "rgba(61,90,254,.12)")),
        el("section", { class: "panel" }, el("h2", {}, "Consumer groups"), groupsOfTopic(topic)),
        admin ? el("section", { class: "panel" }, el("h2", {}, "Danger zone"),
          el("button", { class: "danger", id: "delete-topic", onclick: () => deleteTopic(name) }, "Delete this topic")) : null)));
}

async function deleteTopic(name) {
  const typed = window.prompt(`Deleting ${name} removes its ranges and every record. Type the topic's name to confirm.`);
  if (typed !== name) return;
  try {
    await act(`/api/topics/${encodeURIComponent(name)}/delete`);
    window.location.hash = "#/topics";
  } catch (error) {
    window.alert(`Refused: ${error.message}`);
  }
}

// ---------------------------------------------------------------- routing

function route() {
  const hash = window.location.hash || "#/";
  const topic = hash.match(/^#\/topics\/(.+)$/);
  if (topic) return { tab: "topics", topic: decodeURIComponent(topic[1]) };
  if (hash.startsWith("#/topics")) return { tab: "topics" };
  if (hash.startsWith("#/groups")) return { tab: "groups" };
  if (hash.startsWith("#/brokers")) return { tab: "brokers" };
  return { tab: "overview" };
}

function render() {
  if (!state.overview) return;
  const view = document.getElementById("view");
  const where = route();
  for (const link of document.querySelectorAll(".tabs a")) link.classList.toggle("active", link.dataset.tab === where.tab);
  if (where.topic) renderTopic(view, where.topic);
  else if (where.tab === "topics") renderTopics(view);
  else if (where.tab === "groups") renderGroups(view);
  else if (where.tab === "brokers") renderBrokers(view);
  else renderOverview(view);
}

async function refresh() {
  try {
    await refreshOverview();
    await refreshGroups();
    const where = route();
    if (where.topic) {
      try {
        state.topic = await api(`/api/topics/${encodeURIComponent(where.topic)}`);
      } catch (error) {
        state.topic = null;
        document.getElementById("view").replaceChildren(el("div", { class: "empty" }, `Topic ${where.topic}: ${error.message}`));
        return;
      }
    }
    render();
  } catch (error) {
    const banner = document.getElementById("status-banner");
    banner.hidden = false;
    banner.textContent = `The broker did not answer: ${error.message}`;
  }
}

function startConsole() {
  window.addEventListener("hashchange", () => { state.selectedRange = null; state.topic = null; refresh(); });
  refresh();
  state.timer = window.setInterval(refresh, POLL_MS);
}

function startLogin() {
  const error = new URLSearchParams(window.location.search).get("error");
  if (!error) return;
  const messages = {
    invalid_credentials: "That user and password do not match.",
    account_locked: "Too many failed logins: this account is locked for a while.",
    rate_limited: "Too many login attempts from this address; wait a minute.",
    admin_required: "The console is for administrators (MALACHI_DASHBOARD_REQUIRE_ADMIN).",
  };
  const box = document.getElementById("login-error");
  box.textContent = messages[error] || `Login refused: ${error}`;
  box.hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.body.dataset.page === "login") startLogin();
  else startConsole();
});
