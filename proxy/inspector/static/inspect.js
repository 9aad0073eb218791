// The inspector: reads the proxy's own API with the key typed in, and draws what it says.
// Every piece of conversation text goes into the page as text (textContent), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const state = { key: sessionStorage.getItem("pcp-key") || "", session: null, request: null };

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

const $ = (id) => document.getElementById(id);
const n = (x) => Number(x).toLocaleString("en");
const when = (stamp) => (stamp || "").replace("T", " ").slice(0, 16);

function notice(text) {
  $("notice").textContent = text;
  $("notice").hidden = !text;
}

async function api(path) {
  const headers = state.key ? { Authorization: `Bearer ${state.key}` } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (response.status === 401) {
    const error = new Error(state.key ? "This key is not one of the proxy's keys." : "This proxy asks for a key: type it above.");
    error.status = 401;
    throw error;
  }
  if (!response.ok) throw new Error((body.error && body.error.message) || `${path}: ${response.status}`);
  return body;
}

// -- sessions ---------------------------------------------------------------------------
async function loadSessions() {
  const tbody = $("session-table").querySelector("tbody");
  tbody.replaceChildren();
  $("key-state").textContent = state.key ? "key set for this tab" : "no key";
  try {
    const listed = await api("/v1/pcp/sessions");
    notice("");
    if (!listed.data.length) tbody.append(el("tr", {}, el("td", { colspan: 6, text: "No sessions for this key yet: they appear once a conversation passes the threshold." })));
    for (const s of listed.data) {
      const row = el("tr", { "data-session": s.id, onclick: () => openSession(s.id) },
        el("td", {}, el("code", { text: s.id })), el("td", { text: n(s.messages) }),
        el("td", { text: `${n(s.originals)} + ${n(s.consolidated)}` }), el("td", { text: when(s.first) }),
        el("td", { text: when(s.last) }), el("td", { text: n(s.requests) }));
      tbody.append(row);
    }
    if (state.session) await openSession(state.session);
    await loadMemory();
  } catch (error) {
    notice(error.message);
    if (error.status === 401) $("key").focus();
  }
}

async function openSession(id) {
  const data = await api(`/v1/pcp/sessions/${encodeURIComponent(id)}`);
  state.session = id;
  state.data = data;
  state.pages = Object.fromEntries(data.pages.map((p) => [p.id, p]));
  for (const row of $("session-table").querySelectorAll("tbody tr")) row.classList.toggle("selected", row.dataset.session === id);
  $("session").hidden = false;
  $("session-id").textContent = data.id;
  $("session-line").textContent = `${n(data.messages)} messages, ${n(data.originals)} Original and ${n(data.consolidated)} Consolidated pages` +
    (data.blocks ? `, ${n(data.blocks)} File blocks` : "") + (data.first ? `; from ${when(data.first)} to ${when(data.last)}` : "");
  drawTokens(data.requests);
  drawBill(data.bill);
  drawRequests(data.requests);
  drawPageList(data);
  selectRequest(data.requests.length ? data.requests[data.requests.length - 1].id : null);
}

// -- the bill: through the proxy, and the same requests sent untouched ----------------------
const NOT_COMPARABLE = "larger than the model's window: it could not have been sent untouched";
const billed = (x) => n(Math.round(x));
const share = (part, whole) => (whole ? `${Math.round((100 * part) / whole)}%` : "–");

// A bill's cell: what was billed, and beneath it its input tokens cached / uncached.
function billCell(kind, total, cachedTokens, uncachedTokens) {
  return el("td", { class: `bill ${kind}` }, el("span", { class: "total", text: billed(total) }),
    el("span", { class: "split", text: `${n(cachedTokens)} / ${n(uncachedTokens)}`, title: "input tokens cached / uncached" }));
}

function drawBill(bill) {
  const tbody = $("session-bill").querySelector("tbody");
  tbody.replaceChildren();
  const row = (id, label, b) => el("tr", { id }, el("th", { text: label }), el("td", { class: "requests", text: n(b.requests) }),
    el("td", { class: "rounds", text: n(b.rounds) }), el("td", { class: "cached", text: n(b.cached) }),
    el("td", { class: "uncached", text: n(b.uncached) }), el("td", { class: "billed", text: billed(b.billed) }));
  tbody.append(row("bill-paged", "through the proxy", bill.paged));
  if (bill.not_comparable) tbody.append(row("bill-compared", "through the proxy, the comparable requests", bill.compared));
  tbody.append(row("bill-untouched", "sent untouched", bill.untouched));
  const line = $("session-saving");
  line.replaceChildren();
  if (!bill.compared.requests) {
    line.textContent = bill.paged.requests ? `No request is comparable: each was ${NOT_COMPARABLE}.` : "No request traced yet.";
    return;
  }
  const ratio = bill.untouched.billed ? (bill.compared.billed / bill.untouched.billed).toFixed(2) : "–";
  line.append("Saving: ", el("strong", { id: "saved-total", class: bill.saved < 0 ? "negative" : "", text: n(bill.saved) }),
    ` input tokens, ${share(bill.saved, bill.untouched.billed)} of the untouched bill${bill.saved < 0 ? " (negative: paging cost more)" : ""}; through the proxy, `,
    el("strong", { id: "bill-ratio", text: `${ratio}×` }), ` the bill of the ${n(bill.compared.requests)} comparable request(s) sent untouched` +
    (bill.not_comparable ? `; ${n(bill.not_comparable)} request(s) ${NOT_COMPARABLE}, not compared.` : "."));
}

// -- requests and their rounds ----------------------------------------------------------
function drawRequests(requests) {
  const tbody = $("request-table").querySelector("tbody");
  tbody.replaceChildren();
  if (!requests.length) tbody.append(el("tr", {}, el("td", { colspan: 11, text: "No request traced since the proxy started." })));
  for (const r of requests) {
    const p = r.pages;
    const untouched = r.untouched_fits
      ? billCell("untouched", r.untouched, r.untouched_cached, r.untouched_uncached)
      : el("td", { class: "bill untouched not-comparable", text: "not comparable", title: NOT_COMPARABLE });
    const saved = r.untouched_fits
      ? el("td", { class: `saved${r.tokens_saved < 0 ? " negative" : ""}`, text: `${n(r.tokens_saved)} (${share(r.tokens_saved, r.untouched)})` })
      : el("td", { class: "saved not-comparable", text: "not comparable", title: NOT_COMPARABLE });
    tbody.append(el("tr", { "data-trace": r.id, onclick: () => selectRequest(r.id) },
      el("td", {}, el("code", { text: r.id })), el("td", { text: new Date(r.at * 1000).toLocaleString() }), el("td", { text: r.model || "" }),
      el("td", { text: n(r.prompt_tokens) }), el("td", { class: "rounds", text: r.rounds.length }), el("td", { text: n(r.tokens_sent) }),
      billCell("billed", r.billed, r.cached, r.uncached), untouched, saved,
      el("td", { text: `${p.detail}/${p.summary}/${p.folded}/${p.total}` }),
      el("td", {}, el("code", { text: r.consulted.join(", ") }))));
  }
}

function selectRequest(traceId) {
  state.request = (state.data.requests || []).find((r) => r.id === traceId) || null;
  for (const row of $("request-table").querySelectorAll("tbody tr")) row.classList.toggle("selected", row.dataset.trace === traceId);
  drawRounds(state.request);
  drawTree(state.data, state.request);
}

function drawRounds(request) {
  const box = $("rounds");
  box.replaceChildren();
  if (!request) return;
  const rows = request.rounds.map((r) => {
    const views = Object.values(r.views);
    const detail = views.filter((v) => v === "Detail").length;
    const directives = el("td", {}, ...(r.directives.length ? r.directives.map((d) => el("span", { class: "directive", text: `${d.action}(${d.target}) — ${d.reason}${d.result ? ` → ${d.result}` : ""}` })) : [r.final ? "final round: answers" : "answered"]));
    return el("tr", {}, el("td", { text: r.round }), el("td", { text: n(r.tokens) }), el("td", { text: detail }), el("td", { text: views.length - detail }),
      el("td", { text: r.folded.length }), el("td", { text: r.dehydrated.length }), el("td", { text: r.seconds.toFixed(3) }), directives);
  });
  box.append(el("p", { class: "hint", text: `Request ${request.id}: ${n(request.prompt_tokens)} history tokens, threshold ${n(request.threshold)}, budget ${n(request.budget)}, mode ${request.mode}; Hot pages (${request.hot.length}): ${request.hot.slice(0, 8).join(", ") || "none"}${request.hot.length > 8 ? ", …" : ""}.` }),
    el("table", {}, el("thead", {}, el("tr", {}, ...["round", "tokens sent", "in detail", "by summary", "roots folded", "dehydrated", "seconds", "directives after it"].map((h) => el("th", { text: h })))), el("tbody", {}, ...rows)));
}

// -- plots ------------------------------------------------------------------------------
function drawTokens(requests) {
  const box = $("tokens-plot");
  box.replaceChildren();
  if (!requests.length) { box.append(el("p", { class: "hint", text: "No request traced yet." })); return; }
  const W = 380, H = 240, L = 56, B = 34, T = 10, R = 12;
  const xs = requests.map((r) => r.prompt_tokens);
  const calls = requests.flatMap((r) => r.rounds.map((round) => ({ x: r.prompt_tokens, y: round.tokens, later: round.round > 0 })));
  const budget = Math.max(...requests.map((r) => r.budget));
  const xmax = Math.max(...xs) * 1.05, ymax = Math.max(xmax, budget, ...calls.map((c) => c.y)) * 1.05;
  const sx = (x) => L + (x / xmax) * (W - L - R), sy = (y) => H - B - (y / ymax) * (H - B - T);
  const svg = el("svg:svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "tokens sent against history size" });
  svg.append(el("svg:line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }), el("svg:line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (const f of [0, 0.5, 1]) {
    svg.append(el("svg:text", { x: L - 6, y: sy(ymax * f / 1.05) + 4, "text-anchor": "end", text: n(Math.round(ymax * f / 1.05)) }));
    svg.append(el("svg:text", { x: sx(xmax * f / 1.05), y: H - B + 16, "text-anchor": "middle", text: n(Math.round(xmax * f / 1.05)) }));
  }
  svg.append(el("svg:text", { x: (L + W) / 2, y: H - 4, "text-anchor": "middle", text: "history size (the client's prompt tokens)" }));
  svg.append(el("svg:line", { class: "diagonal", x1: sx(0), y1: sy(0), x2: sx(xmax), y2: sy(xmax) }, el("svg:title", { text: "what each call would carry without paging" })));
  svg.append(el("svg:line", { class: "budget", x1: L, y1: sy(budget), x2: W - R, y2: sy(budget) }, el("svg:title", { text: `budget: ${n(budget)} tokens` })));
  for (const c of calls) svg.append(el("svg:circle", { class: c.later ? "sent later" : "sent", cx: sx(c.x), cy: sy(c.y), r: 4 }, el("svg:title", { text: `${n(c.y)} tokens sent for ${n(c.x)}` })));
  box.append(svg, el("p", { class: "legend", text: "● round 0  ○ later rounds  – – without paging  ··· budget" }));
}

function drawTree(data, request) {
  const box = $("tree-plot");
  box.replaceChildren();
  $("tree-request").textContent = request ? `(views of request ${request.id})` : "";
  const pages = state.pages, leaves = [], depth = {};
  const walk = (id, d) => {  // leaves left to right, in the tree's order
    depth[id] = d;
    const kids = pages[id].children;
    if (!kids.length) leaves.push(id);
    for (const kid of kids) walk(kid, d + 1);
  };
  data.roots.forEach((root) => walk(root, 0));
  // As wide as the figure allows, within readable bounds; a long history scrolls sideways.
  const dx = Math.max(7, Math.min(28, (box.clientWidth - 40) / Math.max(leaves.length, 1))), dy = 56, pad = 16, x = {};
  const r = Math.min(5, dx / 2 - 0.5);
  leaves.forEach((id, i) => { x[id] = pad + i * dx; });
  const place = (id) => {
    const kids = pages[id].children;
    if (kids.length) { kids.forEach(place); x[id] = kids.reduce((s, k) => s + x[k], 0) / kids.length; }
  };
  data.roots.forEach(place);
  const levels = Math.max(0, ...Object.values(depth)) + 1;
  const W = Math.max(300, pad * 2 + leaves.length * dx), H = pad * 2 + (levels - 1) * dy + 10;
  const svg = el("svg:svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "the session's page tree" });
  const y = (id) => pad + depth[id] * dy;
  for (const p of data.pages) for (const kid of p.children) svg.append(el("svg:line", { class: "edge", x1: x[p.id], y1: y(p.id), x2: x[kid], y2: y(kid) }));
  const views = request ? request.rounds[request.rounds.length - 1].views : {};
  const folded = new Set(request ? request.rounds[request.rounds.length - 1].folded : []);
  const consulted = new Set(request ? request.consulted : []);
  // The tree is the session as it is now; a page an older request saw may since have been merged or rebuilt.
  const gone = [...new Set([...Object.keys(views), ...folded, ...consulted])].filter((id) => !pages[id]).length;
  if (gone) $("tree-request").textContent += ` — ${gone} of the pages it saw have since been rebuilt`;
  for (const p of data.pages) {
    const view = views[p.id];
    const kind = view === "Detail" ? "detail" : view ? "summary" : folded.has(p.id) ? "folded" : "hidden";
    const shape = p.type === "Consolidated"
      ? el("svg:rect", { x: x[p.id] - 6, y: y(p.id) - 6, width: 12, height: 12, rx: 3 })
      : el("svg:circle", { cx: x[p.id], cy: y(p.id), r });
    shape.setAttribute("class", `node ${kind}${consulted.has(p.id) ? " consulted" : ""}`);
    shape.setAttribute("data-page", p.id);
    shape.append(el("svg:title", { text: `${p.type} ${p.id} · ${when(p.timestamp)} · ${n(p.tokens)} tokens${view ? ` · shown: ${view}` : ""}\n${p.summary}` }));
    shape.addEventListener("click", () => showPage(p.id));
    svg.append(shape);
  }
  box.append(svg);
}

// -- the pages, as a list -----------------------------------------------------------------
function drawPageList(data) {
  const list = $("page-list");
  list.replaceChildren();
  const item = (id) => {
    const p = state.pages[id];
    const meta = [p.type === "Consolidated" ? `${p.children.length} pages` : `messages ${p.turns[0]}–${p.turns[1]}`, when(p.timestamp), `${n(p.tokens)} tokens`];
    if (p.topic) meta.push(`topic ${p.topic}`);
    if (p.draft) meta.push("File block draft");
    const head = el("summary", {}, el("span", { class: "badge", text: p.type }), " ", el("code", { text: p.id }), " ", el("span", { class: "page-meta", text: meta.join(" · ") }));
    const body = [el("div", { class: "page-summary", text: p.summary })];
    if (p.keywords.length) body.push(el("div", { class: "page-meta", text: `keywords: ${p.keywords.join(", ")}` }));
    const li = el("li", { id: `page-${p.id}` }, el("details", {}, head, ...body));
    if (p.children.length) li.append(el("ul", {}, ...p.children.map(item)));
    return li;
  };
  list.append(...data.roots.map(item));
}

function showPage(id) {
  const li = document.getElementById(`page-${id}`);
  if (!li) return;
  for (let up = li; up && up !== $("page-list"); up = up.parentElement) if (up.tagName === "LI") up.firstChild.open = true;
  document.querySelectorAll("li.flash").forEach((x) => x.classList.remove("flash"));
  li.classList.add("flash");
  li.scrollIntoView({ block: "center" });
}

// -- memory scopes ------------------------------------------------------------------------
async function loadMemory() {
  const tbody = $("memory-table").querySelector("tbody");
  tbody.replaceChildren();
  let listed;
  try {
    listed = await api("/v1/pcp/memory");
  } catch (error) {
    if (error.status === 401) throw error;
    tbody.append(el("tr", {}, el("td", { colspan: 10, text: `No memory to show: ${error.message}.` })));
    return;
  }
  if (!listed.data.length) tbody.append(el("tr", {}, el("td", { colspan: 10, text: "No memory scope for this key yet: a request that names one (x-pcp-memory) writes its conversation there." })));
  for (const m of listed.data) {
    tbody.append(el("tr", { "data-scope": m.scope },
      el("td", {}, el("code", { text: m.scope })), el("td", { class: "pages", text: n(m.pages) }), el("td", { class: "originals", text: n(m.originals) }),
      el("td", { class: "consolidated", text: n(m.consolidated) }), el("td", { class: "conversations", text: n(m.conversations) }),
      el("td", { class: "requests", text: n(m.requests) }), el("td", { class: "consulted", text: n(m.consulted) }), el("td", { class: "faded", text: n(m.faded) }),
      el("td", { class: "forgotten", text: n(m.forgotten_turns) }), el("td", { class: "pending", text: n(m.pending) })));
  }
  if (listed.truncated) tbody.append(el("tr", {}, el("td", { colspan: 10, text: `The first ${n(listed.data.length)} scopes, by name.` })));
}

// -- start --------------------------------------------------------------------------------
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("key").value.trim();
  state.session = null;
  sessionStorage.setItem("pcp-key", state.key);
  $("session").hidden = true;
  loadSessions();
});
loadSessions();
