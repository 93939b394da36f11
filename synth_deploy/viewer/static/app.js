// The synth-deploy trace viewer: plain DOM, no dependencies, no network beyond its own /api.
// Everything from the store is put on the page as text (textContent), never parsed as HTML.
"use strict";

const FILTERS = ["app", "app_digest", "model", "run", "split", "mode", "status", "seed",
  "min_reward", "max_reward", "since", "until", "reward_version"];
const PAGE = 50;
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04",
  "#db2777"];
const $ = (sel) => document.querySelector(sel);

// h("td", {class: "num"}, "text", child) → element; strings become text nodes.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// Replace el's children; null, undefined and false are left out (conditional parts).
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// Numbers as the page shows them: up to 4 decimals, trailing zeros dropped.
function num(x, digits = 4) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return String(Number(Number(x).toFixed(digits)));
}
// Which code of its app made a session: "v1 3f2a9c1d" (null when it did not say).
function code(s) {
  const parts = [s.app_version ? `v${s.app_version}` : null, s.app_digest ? s.app_digest.slice(0, 8) : null];
  return parts.filter(Boolean).join(" ") || null;
}
const pct = (x) => (x === null || x === undefined ? "–" : `${num(100 * x, 2)}%`);
const count = (n) => Number(n).toLocaleString("en-US");

// -- state in the URL: #/sessions?app=math&sort=reward, #/session/<id>, #/compare?by=model ----

function route() {
  const hash = location.hash.replace(/^#/, "") || "/sessions";
  const [path, query] = hash.split("?");
  return { path, params: new URLSearchParams(query || "") };
}

function go(path, params) {
  const query = params ? params.toString() : "";
  location.hash = `#${path}${query ? `?${query}` : ""}`;
}

function filterParams(params) {
  const out = new URLSearchParams();
  for (const name of FILTERS) if (params.get(name)) out.set(name, params.get(name));
  return out;
}

async function api(path, params) {
  const query = params && params.toString() ? `?${params}` : "";
  const resp = await fetch(`/api/${path}${query}`, { headers: { Accept: "application/json" } });
  const data = await resp.json();
  if (!resp.ok) {
    const err = data.error || {};
    throw new Error(err.hint ? `${err.message} (${err.hint})` : err.message || resp.statusText);
  }
  return data;
}

function showError(err) {
  const box = $("#error");
  box.hidden = !err;
  box.textContent = err ? String(err.message || err) : "";
}

// -- filters -----------------------------------------------------------------------------

let choices = null;
let lastList = "#/sessions"; // where "back" goes from a replay: the list as it was

function fillSelect(select, values, keep) {
  const current = keep ?? select.value;
  fill(select, ...(select.name === "a" || select.name === "b"
    ? [] : [h("option", { value: "" }, "any")]), ...values.map((v) => h("option", { value: v }, v)));
  if ([...select.options].some((o) => o.value === current)) select.value = current;
}

function fillChoices() {
  const form = $("#filters");
  fillSelect(form.elements.app, choices.app);
  fillSelect(form.elements.model, choices.model);
  // The recorded reward is "original", the select's empty default: not offered twice.
  fillSelect(form.elements.reward_version, (choices.reward_version || []).filter((v) => v !== "original"));
  form.elements.reward_version.options[0].textContent = "original";
  for (const name of ["run", "split", "mode"]) {
    $(`#choices-${name}`).replaceChildren(...choices[name].map((v) => h("option", { value: v })));
  }
  $("#store").textContent = `${choices.store} · ${count(choices.sessions)} sessions`;
}

function formToParams() {
  const form = $("#filters");
  const params = new URLSearchParams();
  for (const name of FILTERS) {
    const value = form.elements[name].value.trim();
    if (value) params.set(name, value);
  }
  return params;
}

function paramsToForm(params) {
  const form = $("#filters");
  for (const name of FILTERS) {
    const el = form.elements[name];
    const value = params.get(name) || "";
    if (el.tagName === "SELECT" && value && ![...el.options].some((o) => o.value === value)) {
      el.append(h("option", { value }, value));
    }
    el.value = value;
  }
  $("#export").href = `/api/export.jsonl?${filterParams(params)}`;
}

// -- sessions: table and glance -------------------------------------------------------------

// Each render has a number; answers to an older one (the user moved on) are dropped.
let renders = 0;
const current = (token) => token === renders;

async function showSessions(params, token) {
  const sort = params.get("sort") || "created";
  const order = params.get("order") || "desc";
  const offset = Number(params.get("offset") || 0);
  const query = filterParams(params);
  const pageQuery = new URLSearchParams(query);
  pageQuery.set("sort", sort);
  pageQuery.set("order", order);
  pageQuery.set("offset", offset);
  pageQuery.set("limit", pageSize(params));
  // The table first: the store answers one query at a time, and the glance takes longer.
  try {
    const page = await api("sessions", pageQuery);
    if (current(token)) drawTable(page, params, sort, order);
  } catch (err) {
    if (current(token)) showError(err);
  }
  if (!current(token)) return;
  try {
    const summary = await api("summary", query);
    if (current(token)) drawGlance(summary);
  } catch (err) {
    if (current(token)) showError(err);
  }
}

const pageSize = (params) => Number(params.get("limit") || PAGE);

function drawTable(page, params, sort, order) {
  const tbody = $("#sessions tbody");
  fill(tbody, ...page.rows.map((r) => {
    const link = `#/session/${encodeURIComponent(r.session_id)}`;
    return h("tr", { "data-session-id": r.session_id, class: r.status === "error" ? "failed" : null,
      onclick: () => { location.hash = link; } },
      h("td", {}, h("a", { href: link }, r.created_at.slice(0, 19).replace("T", " "))),
      h("td", {}, r.app_id ?? "–", code(r) ? h("span", { class: "muted code" }, ` ${code(r)}`) : null),
      h("td", {}, r.model ?? "–"), h("td", {}, r.run_id ?? "–"),
      h("td", { class: "num" }, r.seed ?? "–"), h("td", {}, r.mode ?? "–"),
      h("td", {}, r.split ?? "–"),
      h("td", { title: r.error || null }, r.status ?? "–"),
      h("td", { class: "num", "data-field": "reward" }, num(r.total_reward)),
      h("td", { class: "num" }, r.num_timesteps),
      h("td", { class: "num" }, r.duration_s === null ? "–" : `${num(r.duration_s, 2)} s`));
  }));
  const first = page.rows.length ? page.offset + 1 : 0;
  const last = page.offset + page.rows.length;
  $("#sessions-total").textContent = `${count(first)}–${count(last)} of ` +
    `${count(page.total)}${page.total_is_lower_bound ? "+" : ""} sessions`;
  $("#sessions-total").dataset.total = page.total;
  $("#prev").disabled = page.offset === 0;
  $("#next").disabled = !page.total_is_lower_bound && last >= page.total;
  for (const th of document.querySelectorAll("#sessions th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === sort);
    th.dataset.order = th.dataset.sort === sort ? order : "";
  }
}

function drawGlance(s) {
  $("#glance-sessions").textContent = count(s.sessions);
  $("#glance-mean").textContent = num(s.mean_reward);
  $("#glance-errors").textContent = pct(s.error_rate);
  $("#glance-errors").title = `${count(s.errors)} failed rollouts`;
  fill($("#glance-events"),
    ...(s.event_scores.length ? s.event_scores.map((e) => h("tr", {},
      h("td", {}, e.reward_type || "(untyped)"), h("td", { class: "num" }, num(e.mean)),
      h("td", { class: "muted" }, `${count(e.events)} events`)))
      : [h("tr", {}, h("td", { class: "muted" }, "no event rewards recorded"))]));
  fill($("#glance-identities"),
    ...((s.identities || []).length ? s.identities.map((g) => h("tr", {},
      h("td", {}, g.app_id ?? "–"), h("td", {}, code(g) ?? "(not recorded)"),
      h("td", { class: "num" }, num(g.mean_reward)),
      h("td", { class: "muted" }, `${count(g.sessions)} sessions`)))
      : [h("tr", {}, h("td", { class: "muted" }, "no sessions"))]));
  const sampled = (every) => (every > 1 ? `(1 in ${count(every)} sessions)` : "");
  $("#curve-sampled").textContent = sampled(s.sampled_every);
  $("#events-sampled").textContent = sampled(s.events_sampled_every);
  drawHistogram(s.histogram);
  drawCurve(s.series, s.series_total);
}

function drawHistogram(bars) {
  const box = $("#chart-histogram");
  if (!bars.length) { fill(box, h("p", { class: "muted" }, "no rewards")); return; }
  const W = 400, H = 150, pad = 22;
  const max = Math.max(...bars.map((b) => b.count));
  const w = (W - pad) / bars.length;
  const label = (b) => (b.lo === b.hi ? num(b.lo, 3) : `${num(b.lo, 2)}–${num(b.hi, 2)}`);
  fill(box, svg("svg", { viewBox: `0 0 ${W} ${H + 20}`, role: "img" },
    bars.map((b, i) => {
      const bh = max ? (H - pad) * (b.count / max) : 0;
      return svg("g", {},
        svg("rect", { x: pad + i * w + 1, y: H - bh, width: Math.max(w - 2, 1), height: bh,
          class: "bar", "data-count": b.count },
          svg("title", {}, `${label(b)}: ${count(b.count)} sessions`)),
        bars.length <= 12 || i % Math.ceil(bars.length / 8) === 0
          ? svg("text", { x: pad + i * w + w / 2, y: H + 14, "text-anchor": "middle" }, label(b))
          : null);
    }),
    svg("text", { x: 2, y: 12 }, count(max))));
}

function drawCurve(series, total) {
  const box = $("#chart-curve");
  const legend = $("#chart-legend");
  const points = series.flatMap((s) => s.points.filter((p) => p.mean_reward !== null));
  if (!points.length) {
    fill(box, h("p", { class: "muted" }, "no rewards over time"));
    fill(legend);
    return;
  }
  const W = 400, H = 150, pad = 26;
  const times = points.map((p) => Date.parse(`${p.at.replace(" ", "T")}Z`));
  const t0 = Math.min(...times), t1 = Math.max(...times);
  const ys = points.map((p) => p.mean_reward);
  const y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const x = (at) => pad + (t1 > t0 ? (Date.parse(`${at.replace(" ", "T")}Z`) - t0) / (t1 - t0) : 0.5) * (W - pad - 4);
  const y = (v) => H - 4 - ((v - y0) / (y1 - y0)) * (H - 14);
  fill(box, svg("svg", { viewBox: `0 0 ${W} ${H + 16}`, role: "img" },
    svg("line", { x1: pad, y1: y(y0), x2: W, y2: y(y0), class: "axis" }),
    svg("text", { x: 0, y: y(y1) + 4 }, num(y1, 2)), svg("text", { x: 0, y: y(y0) }, num(y0, 2)),
    ...axisLabels(t0, t1).map((label, i) => svg("text", i
      ? { x: W, y: H + 14, "text-anchor": "end", class: "axis-label" }
      : { x: pad, y: H + 14, class: "axis-label" }, label)),
    series.map((s, i) => {
      const pts = s.points.filter((p) => p.mean_reward !== null);
      return svg("g", { class: "series" },
        svg("polyline", { points: pts.map((p) => `${x(p.at)},${y(p.mean_reward)}`).join(" "),
          stroke: COLORS[i % COLORS.length], fill: "none", "stroke-width": 1.5 }),
        pts.map((p) => svg("circle", { cx: x(p.at), cy: y(p.mean_reward), r: 2,
          fill: COLORS[i % COLORS.length] },
          svg("title", {}, `${s.app ?? "–"} · ${s.model ?? "–"} around ${p.at}: ` +
            `${num(p.mean_reward)} over ${count(p.sessions)} sessions`))));
    })));
  fill(legend, ...series.map((s, i) => h("span", {},
    h("i", { class: `swatch c${i % COLORS.length}` }),
    `${s.app ?? "–"} · ${s.model ?? "–"} (${count(s.sessions)})`)),
  total > series.length ? h("span", { class: "muted" }, `${total - series.length} more not shown`) : null);
}

// The time axis's two ends (UTC), as precise as the span needs: days apart, the dates; within
// a day, the date once and the times; within minutes, to the second; one instant, one label.
function axisLabels(t0, t1) {
  const [a, b] = [new Date(t0).toISOString(), new Date(t1).toISOString()];
  if (t1 <= t0) return [`${a.slice(0, 10)} ${a.slice(11, 19)}`];
  if (a.slice(0, 10) !== b.slice(0, 10)) return [a.slice(0, 10), b.slice(0, 10)];
  const end = t1 - t0 < 120000 ? 19 : 16;
  return [`${a.slice(0, 10)} ${a.slice(11, end)}`, b.slice(11, end)];
}

// -- one session, turn by turn ---------------------------------------------------------------

async function showReplay(sessionId, token) {
  const view = $("#view-replay");
  fill(view, h("p", { class: "muted" }, "loading…"));
  let s;
  try {
    s = await api(`sessions/${encodeURIComponent(sessionId)}`);
  } catch (err) {
    if (current(token)) fill(view, h("p", { class: "error", id: "replay-missing" }, err.message));
    return;
  }
  if (!current(token)) return;
  const outcome = s.outcome_rewards.length ? s.outcome_rewards[s.outcome_rewards.length - 1] : null;
  const fact = (name, value, label) => h("div", { class: "fact", "data-field": name },
    h("span", { class: "label" }, label || name), h("span", { class: "value" }, value ?? "–"));
  fill(view,
    h("p", {}, h("a", { href: lastList, id: "back" }, "‹ back to the list")),
    h("h2", {}, "session ", h("code", { id: "replay-id" }, s.session_id)),
    s.error ? h("p", { class: "error", id: "replay-error" }, s.error) : null,
    h("div", { class: "facts" },
      fact("app", s.app_id), fact("code", code(s), "app code"), fact("model", s.model), fact("seed", s.seed), fact("run", s.run_id),
      fact("mode", s.mode), fact("split", s.split), fact("status", s.status),
      fact("created", s.created_at),
      fact("duration", s.duration_s === null || s.duration_s === undefined ? null : `${num(s.duration_s, 3)} s`),
      fact("reward", outcome ? num(outcome.total_reward) : "–", "outcome reward"),
      (s.reward_versions || []).map((v) => fact(`reward_version_${v.version}`, num(v.reward),
        `reward ${v.version} (${v.scorer.function})`)),
      s.has_achievements ? fact("achievements", outcome ? outcome.achievements_count : null) : null,
      fact("event_reward", num(s.totals.event_reward), "event rewards Σ"),
      fact("turns", s.totals.turns), fact("lm_calls", s.totals.lm_calls, "LM calls"),
      fact("tokens", `${count(s.totals.input_tokens)} in / ${count(s.totals.output_tokens)} out`),
      fact("latency", `${num(s.totals.latency_ms, 1)} ms`, "LM latency Σ"),
      s.token_summary ? fact("token_ids", s.token_summary.continuous
        ? `${count(s.token_summary.sampled)} sampled · continuous`
        : `continuity broke at turn ${s.token_summary.breaks[0].turn}`, "token ids") : null),
    outcome && Object.keys(outcome.reward_metadata || {}).length
      ? h("details", {}, h("summary", {}, "outcome details"), h("pre", {}, JSON.stringify(outcome.reward_metadata, null, 2)))
      : null,
    h("div", { id: "turns" }, s.turns.map(drawTurn)));
}

// An LM call's token data: counts, where continuity broke, the sampled ids and logprobs.
function drawTokens(k) {
  if (!k.observed) {
    return h("div", { class: "tokens-absent muted", "data-field": "token-ids" }, `no token data: ${k.absent_reason ?? "?"}`);
  }
  const pairs = k.completion_ids.map((id, i) => `${id}\t${k.completion_logprobs[i] ?? "–"}`);
  return h("div", { class: "token-ids", "data-field": "token-ids" },
    `ids ${count(k.prompt_count)} prompt + ${count(k.completion_count)} sampled · ${count(k.completion_logprobs.length)} logprobs`,
    k.break ? h("div", { class: "error", "data-field": "token-break" },
      `continuity broke: this prompt leaves the previous turn's ids at id ${k.break.position} (${k.break.ids} ids not reproduced); its ids from ${k.prompt_from}: ${k.prompt_ids.slice(0, 64).join(" ")}`) : null,
    h("details", {}, h("summary", {}, "sampled ids and logprobs"),
      h("pre", {}, "id\tlogprob\n" + pairs.join("\n"))));
}

function drawTurn(t) {
  // A reply's tool calls show with the reply; the LM call lists only calls no message has.
  const inMessages = new Set(t.messages.flatMap((m) => m.tool_calls.map((c) => c.id)));
  const title = `turn ${t.turn ?? t.index}` + (t.step_id ? ` · ${t.step_id}` : "");
  return h("article", { class: "turn", "data-turn": t.index },
    h("h3", {}, title,
      h("span", { class: "muted" }, t.duration_ms === null ? "" : ` · ${num(t.duration_ms, 1)} ms`),
      // The environment's reward and the event rewards recorded for the turn: two numbers.
      t.env_reward === null ? null
        : h("span", { class: "turn-env-reward", "data-field": "turn-env-reward" }, ` · env reward ${num(t.env_reward)}`),
      t.event_rewards ? h("span", { class: "turn-reward", "data-field": "turn-reward" },
        ` · event rewards ${num(t.reward)}`) : null),
    t.repeated_messages ? h("p", { class: "muted repeated" },
      `${t.repeated_messages} earlier message(s) shown to the policy again, not repeated here`) : null,
    t.messages.map(drawMessage),
    t.lm_calls.map((c) => h("div", { class: "event lm" },
      h("b", {}, "LM call "), `${c.model ?? "?"}`,
      h("span", { class: "tokens", "data-field": "tokens" },
        ` · ${c.input_tokens ?? "?"} in / ${c.output_tokens ?? "?"} out tokens`),
      c.latency_ms === null ? "" : ` · ${num(c.latency_ms, 1)} ms`,
      c.cost_usd ? ` · $${num(c.cost_usd, 5)}` : "",
      c.tokens ? drawTokens(c.tokens) : null,
      h("div", {}, c.tool_calls.filter((x) => !inMessages.has(x.id)).map(drawToolCall)))),
    t.env_events.map((e) => e.sandbox ? drawSandbox(e) : h("div", { class: "event env" },
      h("b", {}, `${e.kind} `), e.system,
      e.reward === null ? "" : h("span", { "data-field": "env-reward" }, ` · reward ${num(e.reward)}`),
      e.terminated ? " · terminated" : "", e.truncated ? " · truncated" : "",
      e.achievements && e.achievements.length ? h("div", { class: "achievements" }, "achievements: ",
        e.achievements.map((a) => h("span", { class: "tag" }, a))) : null,
      e.rewards.map(drawReward),
      e.state_after ? h("details", {}, h("summary", {}, "state after"),
        h("pre", {}, JSON.stringify(e.state_after, null, 2))) : null)),
    t.rewards.map(drawReward));
}

function drawSandbox(e) {
  // A command the model's code ran in a sandbox: how it ended, then what it printed.
  const c = e.sandbox;
  return h("div", { class: "event env sandbox", "data-field": "sandbox" },
    h("b", {}, "sandbox "), h("code", {}, c.command),
    ` · exit ${c.exit_code ?? "none"}`,
    c.limit ? h("span", { class: "error", "data-field": "sandbox-limit" }, ` · stopped by ${c.limit}`) : "",
    c.duration_s === undefined ? "" : ` · ${num(c.duration_s * 1000, 1)} ms`,
    ["stdout", "stderr"].filter((s) => c[s]).map((s) => h("details", {},
      h("summary", {}, s + (c.truncated ? " (cut)" : "")), h("pre", {}, c[s]))));
}

function drawMessage(m) {
  return h("div", { class: `msg ${m.role}` },
    h("span", { class: "role" }, m.role, m.tool_call_id ? h("br") : null,
      m.tool_call_id ? h("code", {}, m.tool_call_id) : null),
    h("div", { class: "content" }, m.parts.map((p) => {
      if (p.type === "text") return h("pre", {}, p.text);
      if (p.type === "image") return h("img", { src: p.src, alt: "image in the trace", class: "frame" });
      if (p.type === "image_ref") return h("p", { class: "muted" }, `[image not stored inline: ${p.url}]`);
      return h("pre", { class: "json" }, JSON.stringify(p.value, null, 2));
    }), m.tool_calls.map(drawToolCall)));
}

function drawToolCall(c) {
  const args = typeof c.arguments === "string" ? c.arguments : JSON.stringify(c.arguments);
  return h("div", { class: "tool-call" }, h("b", {}, "tool call "), h("code", {}, `${c.name ?? "?"}(${args ?? ""})`));
}

function drawReward(r) {
  return h("div", { class: "reward", "data-field": "event-reward" },
    h("span", { class: "tag" }, r.type || "reward"), ` ${num(r.value)}`,
    r.source ? h("span", { class: "muted" }, ` (${r.source})`) : null);
}

// -- compare ---------------------------------------------------------------------------------

async function showCompare(params, token) {
  const form = $("#compare-form");
  const by = params.get("by") || "model";
  form.elements.by.value = by;
  const sides = by === "model" ? choices.model : choices.run;
  fillSelect(form.elements.a, sides, params.get("a") || sides[0] || "");
  fillSelect(form.elements.b, sides, params.get("b") || sides[1] || sides[0] || "");
  const tbody = $("#compare tbody");
  if (!params.get("a") || !params.get("b")) {
    fill(tbody);
    fill($("#compare-summary"), h("p", { class: "muted" }, "choose two sides and compare"));
    return;
  }
  const query = filterParams(params);
  for (const name of ["by", "a", "b"]) query.set(name, params.get(name));
  try {
    const c = await api("compare", query);
    if (!current(token)) return;
    const card = (label, value, id) => h("div", { class: "card" }, h("div", { class: "label" }, label),
      h("div", { class: "big", id }, value));
    fill($("#compare-summary"),
      card("seeds both played", count(c.shared_seeds), "compare-shared"),
      card(`A: ${c.a}`, num(c.mean_a), "compare-mean-a"),
      card(`B: ${c.b}`, num(c.mean_b), "compare-mean-b"),
      card("mean B − A", num(c.mean_difference), "compare-diff"),
      card("B better / A better / ties", `${c.b_better} / ${c.a_better} / ${c.ties}`, "compare-wins"));
    fill(tbody, ...c.seeds.map((r) => {
      const seedLink = new URLSearchParams(filterParams(params));
      seedLink.set("seed", r.seed);
      return h("tr", { "data-seed": r.seed },
        h("td", { class: "num" }, h("a", { href: `#/sessions?${seedLink}` }, r.seed)),
        h("td", { class: "num" }, num(r.a)), h("td", { class: "num" }, r.a_sessions),
        h("td", { class: "num" }, num(r.b)), h("td", { class: "num" }, r.b_sessions),
        h("td", { class: `num ${r.difference > 0 ? "up" : r.difference < 0 ? "down" : ""}`,
          "data-field": "difference" }, num(r.difference)));
    }));
  } catch (err) {
    if (current(token)) showError(err);
  }
}

// -- wiring ----------------------------------------------------------------------------------

async function render() {
  const token = ++renders;
  delete document.body.dataset.ready;
  showError(null);
  const { path, params } = route();
  paramsToForm(params);
  for (const view of ["sessions", "replay", "compare"]) $(`#view-${view}`).hidden = true;
  $("#filters").hidden = path.startsWith("/session/");
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active",
    a.getAttribute("href") === `#${path}`));
  if (path.startsWith("/session/")) {
    $("#view-replay").hidden = false;
    await showReplay(decodeURIComponent(path.slice("/session/".length)), token);
  } else if (path === "/compare") {
    lastList = location.hash;
    $("#view-compare").hidden = false;
    await showCompare(params, token);
  } else {
    lastList = location.hash || "#/sessions";
    $("#view-sessions").hidden = false;
    await showSessions(params, token);
  }
  // What the tests wait for: this render is drawn (and no newer one has started).
  if (current(token)) document.body.dataset.ready = location.hash || "#/sessions";
}

function wire() {
  $("#filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const { path, params } = route();
    const next = formToParams();
    const kept = path === "/compare" ? ["by", "a", "b"] : ["sort", "order", "limit"];
    for (const name of kept) {
      if (params.get(name)) next.set(name, params.get(name));
    }
    go(path === "/compare" ? "/compare" : "/sessions", next);
  });
  $("#reset").addEventListener("click", () => go(route().path === "/compare" ? "/compare" : "/sessions"));
  for (const el of $("#filters").querySelectorAll("select")) {
    el.addEventListener("change", () => $("#filters").requestSubmit());
  }
  $("#compare-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const form = ev.target;
    const next = formToParams();
    for (const n of ["by", "a", "b"]) next.set(n, form.elements[n].value);
    go("/compare", next);
  });
  $("#compare-form").elements.by.addEventListener("change", (ev) => {
    const next = formToParams();
    next.set("by", ev.target.value);
    go("/compare", next);
  });
  for (const th of document.querySelectorAll("#sessions th[data-sort]")) {
    th.addEventListener("click", () => {
      const { params } = route();
      const same = (params.get("sort") || "created") === th.dataset.sort;
      params.set("sort", th.dataset.sort);
      params.set("order", same && (params.get("order") || "desc") === "desc" ? "asc" : "desc");
      params.delete("offset");
      go("/sessions", params);
    });
  }
  const step = (delta) => {
    const { params } = route();
    params.set("offset", Math.max(0, Number(params.get("offset") || 0) + delta));
    go("/sessions", params);
  };
  $("#prev").addEventListener("click", () => step(-pageSize(route().params)));
  $("#next").addEventListener("click", () => step(pageSize(route().params)));
  window.addEventListener("hashchange", render);
}

async function main() {
  wire();
  try {
    choices = await api("choices");
    fillChoices();
  } catch (err) {
    showError(err);
    choices = { app: [], model: [], run: [], split: [], mode: [], reward_version: [], sessions: 0, store: "" };
  }
  await render();
}

main();
