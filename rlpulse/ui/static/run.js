// rlpulse's run page: charts of one run, its commands, and one step's context on a click.
"use strict";

const params = new URLSearchParams(location.search);
const runId = params.get("id");
const state = { run: null, status: null, commands: [], series: {}, heatmap: null, timing: null, step: null, compare: params.get("compare") || "" };
window.rlpulse = state;
const LIVE_EVERY_MS = 3000, HEAT_EVERY_S = 15;
const CONFIG = { responsive: true, displaylogo: false };

// The data is asked for at once, while the browser still parses plotly.js (about a second
// here): the server's queries and the parse overlap.
const early = runId ? {
  status: getJSON("/api/status"),
  run: getJSON("/api/run", { id: runId }),
  runs: getJSON("/api/runs"),
  commands: getJSON("/api/commands", { id: runId }),
  timing: getJSON("/api/timing", { id: runId }),
} : null;
if (early) {
  for (const p of Object.values(early)) p.catch(() => {});
  early.defaults = early.run.then(run => {
    const names = metricNames(run);
    const keys = { a: pickDefault(names, /reward/i), h: pickDefault(names, /kl/i) };
    keys.b = pickDefault(names, /kl/i, keys.a);
    const [hs, hm] = keys.h.split("|");
    return {
      keys, names,
      series: { [keys.a]: loadSeries(keys.a), [keys.b]: loadSeries(keys.b) },
      heatmap: getJSON("/api/heatmap", { id: runId, stage: hs, metric: hm, max_ranks: 256, max_steps: heatSteps(window.innerWidth - 120) }),
    };
  });
  early.defaults.catch(() => {});
}

function metricNames(run) {
  const names = [];
  for (const [stage, metrics] of Object.entries(run.stages)) for (const m of metrics) names.push(`${stage}|${m}`);
  return names;
}

function heatSteps(width) { return Math.max(100, Math.min(2000, Math.floor(width / 2))); }

function option(select, value, text, selected) {
  const o = el("option", text); o.value = value; if (selected) o.selected = true; select.appendChild(o);
}

function pickDefault(names, pattern, avoid) {
  const found = names.find(n => pattern.test(n.split("|")[1]) && n !== avoid);
  return found || names.find(n => n !== avoid) || names[0];
}

function fail(message) {
  document.getElementById("error").replaceChildren(el("div", message, "error"));
  document.getElementById("content").hidden = true;
  window.rlpulseReady = true;
}

async function loadSeries(key, run) {
  if (!run && state.prefetched && state.prefetched.series[key]) {
    const answer = state.prefetched.series[key];
    delete state.prefetched.series[key];
    return answer;
  }
  const [stage, metric] = key.split("|");
  return getJSON("/api/series", { id: run || runId, stage, metric });
}

function band(series, name, axis, color) {
  const upper = series.mean.map((m, i) => (m === null || series.std[i] === null) ? null : m + series.std[i]);
  const lower = series.mean.map((m, i) => (m === null || series.std[i] === null) ? null : m - series.std[i]);
  return [
    { x: series.steps, y: upper, yaxis: axis, mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false, type: "scatter" },
    { x: series.steps, y: lower, yaxis: axis, mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: color.replace("rgb", "rgba").replace(")", ",0.18)"), name: `${name} ± std`, hoverinfo: "skip", type: "scatter" },
    { x: series.steps, y: series.mean, yaxis: axis, mode: "lines", line: { color, width: 2 }, name: `${name} (mean)`, type: "scatter" },
  ];
}

function explain(c) {
  const actions = (c.actions || []).join(" + ");
  const ack = c.status ? `ack ${c.status} at step ${c.applied_at_step}` : "no ack yet";
  const who = c.rule_id || c.origin;
  return `${who}: ${actions}<br>${c.reason}<br>issued for step ${c.step}; ${ack}${c.dry_run ? " (dry run)" : ""}`;
}

function markStep(c) { return c.applied_at_step !== null && c.applied_at_step !== undefined ? c.applied_at_step : c.step; }

function commandShapes() {
  return state.commands.map(c => ({
    type: "line", xref: "x", yref: "paper", x0: markStep(c), x1: markStep(c), y0: 0, y1: 1,
    line: { color: (c.actions || []).includes("stop") ? "rgb(200,30,30)" : "rgb(230,140,0)", width: 1.5, dash: "dash" },
  }));
}

function commandMarkers() {
  return {
    x: state.commands.map(markStep), y: state.commands.map(() => 1.02), yaxis: "y3", mode: "markers+text",
    text: state.commands.map(c => c.rule_id || c.origin), textposition: "top center", textfont: { size: 10 },
    marker: { symbol: "triangle-down", size: 12, color: state.commands.map(c => (c.actions || []).includes("stop") ? "rgb(200,30,30)" : "rgb(230,140,0)") },
    hovertext: state.commands.map(explain), hoverinfo: "text", name: "commands", type: "scatter",
  };
}

async function drawMain() {
  const a = document.getElementById("metric-a").value, b = document.getElementById("metric-b").value;
  const [sa, sb] = await Promise.all([loadSeries(a), b ? loadSeries(b) : null]);
  state.series = { a: sa, b: sb };
  const traces = band(sa, a.split("|")[1], "y", "rgb(31,119,180)");
  if (sb) traces.push(...band(sb, b.split("|")[1], "y2", "rgb(214,39,40)"));
  if (state.compare) {
    try {
      const other = await loadSeries(a, state.compare);
      state.series.compare = other;
      traces.push({ x: other.steps, y: other.mean, mode: "lines", line: { dash: "dot", color: "rgb(44,160,44)" }, name: `${state.compare}: ${a.split("|")[1]}`, type: "scatter" });
    } catch (e) {
      document.getElementById("notices").appendChild(el("div", `Cannot overlay ${state.compare}: ${e.message}`, "notice"));
    }
  }
  traces.push(commandMarkers());
  const layout = {
    margin: { t: 30, r: 60, l: 60, b: 40 }, hovermode: "x", legend: { orientation: "h", y: -0.25 },
    xaxis: { title: { text: "step" } },
    yaxis: { title: { text: a.replace("|", ": ") } },
    yaxis2: { title: { text: b ? b.replace("|", ": ") : "" }, overlaying: "y", side: "right" },
    yaxis3: { overlaying: "y", range: [0, 1.1], visible: false, fixedrange: true },
    shapes: commandShapes(),
  };
  await Plotly.react("main-chart", traces, layout, CONFIG);
}

async function drawHeatmap() {
  const key = document.getElementById("heat-metric").value;
  const [stage, metric] = key.split("|");
  const width = document.getElementById("heatmap").clientWidth || 1000;
  let h;
  if (state.prefetched && state.prefetched.heatmap && key === state.prefetched.keys.h) {
    h = await state.prefetched.heatmap;
    state.prefetched.heatmap = null;
  } else {
    h = await getJSON("/api/heatmap", { id: runId, stage, metric, max_ranks: 256, max_steps: heatSteps(width) });
  }
  state.heatmap = h;
  const cells = `${h.rank_bin} rank${h.rank_bin > 1 ? "s" : ""} × ${h.step_bin} step${h.step_bin > 1 ? "s" : ""}`;
  document.getElementById("heat-resolution").textContent =
    `${h.z.length} × ${h.steps.length} cells; each cell: ${cells} (mean). Grey: no value (a missing rank or step).`;
  await Plotly.react("heatmap", [{
    type: "heatmap", x: h.steps, y: h.ranks, z: h.z, colorscale: "Viridis", hoverongaps: false,
    colorbar: { title: { text: metric } },
    hovertemplate: `step %{x}, rank %{y}<br>${metric} %{z}<extra></extra>`,
  }], {
    margin: { t: 20, r: 20, l: 60, b: 40 }, plot_bgcolor: "rgb(200,200,200)",
    xaxis: { title: { text: "step" } }, yaxis: { title: { text: "rank" }, ...wholeTicks(Math.max(0, ...h.ranks)) },
    shapes: commandShapes(),
  }, CONFIG);
}

// Ranks and counts are whole numbers: ticks at 0, d, 2d, ... with about ten of them.
function wholeTicks(largest) {
  return { tick0: 0, dtick: Math.max(1, Math.ceil(largest / 10)), tickformat: "d" };
}

async function drawTiming(prefetched) {
  const t = prefetched ? await prefetched : await getJSON("/api/timing", { id: runId });
  state.timing = t;
  const traces = [
    { x: t.steps, y: t.step_s, name: "step time (s)", mode: "lines", type: "scatter" },
    { x: t.steps, y: t.last_rank_lag_s, name: "last rank's lag (s)", mode: "lines", type: "scatter" },
    { x: t.steps, y: t.ranks, name: "ranks reported", yaxis: "y2", mode: "lines", line: { dash: "dot" }, type: "scatter" },
  ];
  const throughput = state.names.find(n => /throughput|tokens?_?per_?s|tokens\/s|tps/i.test(n.split("|")[1]));
  if (throughput) {
    const s = await loadSeries(throughput);
    traces.push({ x: s.steps, y: s.mean, name: `${throughput.split("|")[1]} (mean)`, yaxis: "y2", mode: "lines", type: "scatter" });
  }
  await Plotly.react("timing", traces, {
    margin: { t: 20, r: 60, l: 60, b: 40 }, hovermode: "x", legend: { orientation: "h", y: -0.3 },
    xaxis: { title: { text: "step" } }, yaxis: { title: { text: "seconds" } },
    yaxis2: {
      overlaying: "y", side: "right", title: { text: throughput ? "ranks / throughput" : "ranks" },
      ...(throughput ? {} : { rangemode: "tozero", ...wholeTicks(Math.max(1, ...t.ranks)) }),
    },
    shapes: commandShapes(),
  }, CONFIG);
}

function drawCommands() {
  const box = document.getElementById("commands");
  if (!state.commands.length) { box.replaceChildren(el("div", "No commands for this run.", "hint")); return; }
  const t = table(["applied at", "rule", "actions", "status", "verdict", "issued for", "reason", "detail"], state.commands, null, (c, r) => ({
    "applied at": r.applied_at_step, "rule": r.rule_id || r.origin, "actions": (r.actions || []).join(", "),
    "status": r.status || "no ack yet", "verdict": verdictText(r), "issued for": r.step, "reason": r.reason, "detail": r.detail ? Object.entries(r.detail).map(([k, v]) => `${k}=${v}`).join(", ") : "",
  })[c]);
  t.querySelectorAll("tbody tr").forEach((tr, i) => { const why = state.commands[i].verdict_reason; if (why) tr.title = why; });
  t.querySelectorAll("tbody tr").forEach((tr, i) => { tr.style.cursor = "pointer"; tr.onclick = () => openStep(markStep(state.commands[i])); });
  box.replaceChildren(t);
}

// "ineffective at 32", "effective at 26", "unknown"; nothing when the rule expects nothing.
function verdictText(r) {
  if (!r.verdict) return "";
  return r.decided_at_step == null ? r.verdict : `${r.verdict} at ${r.decided_at_step}`;
}

function logRows(logs) {
  const level = document.getElementById("log-level").value;
  const rank = document.getElementById("log-rank").value.trim();
  const text = document.getElementById("log-text").value.trim().toLowerCase();
  return logs.filter(r => (!level || r.level === level) && (!rank || String(r.rank) === rank)
    && (!text || `${r.message} ${r.logger} ${r.exception || ""}`.toLowerCase().includes(text)));
}

async function openStep(step) {
  const panel = document.getElementById("step-panel"), body = document.getElementById("step-body");
  panel.hidden = false;
  document.getElementById("step-title").textContent = `Step ${step}`;
  body.replaceChildren(el("div", "Loading…", "hint"));
  let s;
  try { s = await getJSON("/api/step", { id: runId, step }); }
  catch (e) { body.replaceChildren(el("div", e.message, "error")); state.step = { step, error: e.message }; return; }
  state.step = s;
  const parts = [];
  parts.push(el("h3", "Commands and acks"));
  if (s.commands.length) {
    parts.push(table(["rule_id", "origin", "actions", "reason"], s.commands, null, (c, r) => c === "actions" ? (r.actions || []).map(a => a.type).join(", ") : r[c]));
    parts.push(table(["command_id", "status", "applied_at_step", "detail"], s.acks, null, (c, r) => fmt(r[c])));
  } else parts.push(el("div", "No command was issued for or applied at this step.", "hint"));
  if (s.verdicts.length) {
    parts.push(el("h3", "Verdicts"));
    parts.push(table(["rule_id", "verdict", "applied_at_step", "decided_at_step", "reason"], s.verdicts, null, (c, r) => fmt(r[c])));
  }
  if ((s.samples || []).length) {
    const box = el("div"); box.id = "step-samples";
    for (const part of s.samples) box.append(...sampleParts(part, step));
    parts.push(box);
  }
  parts.push(el("h3", `Log records (${s.logs.length}; most severe first)`));
  const filters = el("div", null, "controls");
  filters.innerHTML = '<label>level <select id="log-level"><option value="">all</option><option>CRITICAL</option><option>ERROR</option><option>WARNING</option><option>INFO</option><option>DEBUG</option></select></label> <label>rank <input id="log-rank" size="5"></label> <label>text <input id="log-text" size="24"></label>';
  parts.push(filters);
  const logBox = el("div", null, "scroll"); logBox.id = "step-logs";
  parts.push(logBox);
  parts.push(el("h3", "Across ranks"));
  const stats = [];
  for (const summary of s.summaries) for (const [name, m] of Object.entries(summary.metrics || {})) stats.push({ stage: summary.stage, revision: summary.revision, metric: name, ...m, closed_by: summary.closed_by, missing: (summary.missing_ranks || []).join(" ") });
  parts.push(table(["stage", "revision", "metric", "mean", "std", "min", "min_rank", "max", "max_rank", "count", "missing", "closed_by"], stats, null, (c, r) => fmt(r[c])));
  parts.push(el("h3", `Every rank's metrics (${s.metrics.length} events)`));
  const ranks = el("div", null, "scroll");
  ranks.appendChild(table(["stage", "rank", "hostname", "metrics"], s.metrics, null, (c, r) => c === "metrics" ? Object.entries(r.metrics || {}).map(([k, v]) => `${k}=${fmt(v, 4)}`).join(", ") : r[c]));
  parts.push(ranks);
  body.replaceChildren(...parts);
  const redraw = () => {
    const rows = logRows(s.logs);
    if (!s.logs.length) { logBox.replaceChildren(el("div", `No log records within 2 s of step ${step}'s events.`, "hint")); return; }
    logBox.replaceChildren(table(["time", "level", "step", "rank", "hostname", "logger", "message"], rows, r => `level-${r.level}`,
      (c, r) => c === "message" && r.exception ? `${r.message}\n${r.exception}` : r[c]));
  };
  for (const id of ["log-level", "log-rank", "log-text"]) document.getElementById(id).oninput = redraw;
  redraw();
  panel.scrollIntoView({ behavior: "instant", block: "start" });
}

// One split of a step's rollout samples: the reward histogram over all of them, then the
// chosen samples' texts, best reward first, each with its numbers and why it was chosen.
function sampleParts(part, step) {
  const shares = Object.entries(part.shares || {}).map(([k, v]) => `${k} ${(100 * v).toFixed(1)} %`).join(", ");
  const out = [el("h3", `Rollout samples (${part.split}): ${part.count}${shares ? ` — ${shares}` : ""}`)];
  if (part.counts.length) {
    const chart = el("div", null, "chart short"); chart.id = `samples-${part.split}`;
    out.push(chart);
    const centers = part.counts.map((_, i) => (part.edges[i] + part.edges[i + 1]) / 2);
    const widths = part.counts.map((_, i) => part.edges[i + 1] - part.edges[i]);
    requestAnimationFrame(() => Plotly.newPlot(chart, [{ x: centers, y: part.counts, width: widths, type: "bar", name: "samples", hovertemplate: "reward %{x:.4g}: %{y} samples<extra></extra>" }],
      { margin: { t: 10, r: 10, b: 40, l: 50 }, xaxis: { title: { text: "reward" } }, yaxis: { title: { text: "samples" } }, bargap: 0.02 }, CONFIG));
  }
  out.push(el("div", `${part.texts.length} chosen samples' texts, best reward first (head and tail of each response; a cut is marked).`, "hint"));
  const box = el("div", null, "samples");
  for (const t of part.texts) box.appendChild(sampleCard(t));
  out.push(box);
  return out;
}

function sampleCard(t) {
  const card = el("div", null, "sample");
  const scores = Object.entries(t.scores || {}).map(([k, v]) => `${k}=${fmt(v, 4)}`).join(", ");
  const facts = [`reward ${fmt(t.reward, 4)}`, `rank ${t.rank} #${t.sample_index}`,
    t.response_length != null ? `${t.response_length} long` : "", t.truncated ? "truncated" : "",
    t.repetition != null ? `repetition ${fmt(t.repetition, 3)}` : "", t.group ? `group ${t.group}` : "",
    t.data_source ? `source ${t.data_source}` : "", scores].filter(Boolean).join(" · ");
  const head = el("div", null, "sample-head");
  head.appendChild(el("span", t.chosen.join(", "), "chosen"));
  head.appendChild(el("span", ` ${facts}`));
  card.appendChild(head);
  if (t.prompt) card.appendChild(el("pre", `prompt: ${t.prompt}`, "prompt"));
  const response = el("pre", null, "response");
  response.appendChild(document.createTextNode(t.response_head));
  if (t.response_tail) {
    response.appendChild(el("span", ` [… ${t.response_chars - t.response_head.length - t.response_tail.length} characters cut …] `, "cut"));
    response.appendChild(document.createTextNode(t.response_tail));
  }
  card.appendChild(response);
  if (t.ground_truth) card.appendChild(el("div", `ground truth: ${t.ground_truth}`, "hint"));
  return card;
}

function onClick(gd) {
  gd.on("plotly_click", ev => { if (ev.points && ev.points.length) openStep(Math.round(ev.points[0].x)); });
}

async function refresh(tick) {
  try {
    const runs = await getJSON("/api/runs");
    const me = runs.find(r => r.run_id === runId);
    if (me) showRunStatus(me);
    state.commands = await getJSON("/api/commands", { id: runId });
    await drawMain();
    await drawTiming();
    await drawQuiet();
    if (tick % (HEAT_EVERY_S * 1000 / LIVE_EVERY_MS) === 0) await drawHeatmap();
    drawCommands();
    document.getElementById("live").textContent = `live: updated ${new Date().toLocaleTimeString()}`;
    if (me && me.status === "running") setTimeout(() => refresh(tick + 1), LIVE_EVERY_MS);
    else document.getElementById("live").textContent = "";
  } catch (e) {
    document.getElementById("live").textContent = `live update failed: ${e.message} (retrying)`;
    setTimeout(() => refresh(tick + 1), LIVE_EVERY_MS * 3);
  }
}

// A silent run (a silence rule fired for its newest step) and its ranks' stacks, grouped.
async function drawQuiet() {
  const q = await getJSON("/api/quiet", { id: runId });
  const box = document.getElementById("quiet");
  box.hidden = !q.silence && !q.stacks;
  if (box.hidden) return;
  const s = q.silence;
  let title = "Stacks of the ranks";
  if (s) {
    const since = new Date(s.since).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const pace = s.every_s ? `; one every ${s.every_s.toPrecision(3)} s before` : "";
    title = `Silent: no step since ${since} (step ${s.step}${pace})`;
  }
  document.getElementById("quiet-title").textContent = title;
  document.getElementById("quiet-reason").textContent = s ? s.reason : "";
  const groups = q.stacks
    ? [el("li", `stacks of ${q.stacks.ranks} rank(s), command ${q.stacks.command_id}:`), ...q.stacks.groups.map(g => el("li", g))]
    : [el("li", "no stacks captured yet (rlpulse control stacks RUN, or a rule's capture_stacks)")];
  document.getElementById("quiet-groups").replaceChildren(...groups);
}

function showRunStatus(me) {
  state.status = me;
  const text = me.status === "stopped" ? `stopped by ${me.stopped_by} at step ${me.stopped_at}` : me.status;
  document.getElementById("status").replaceChildren(el("span", text, `badge ${me.status}`));
}

async function main() {
  if (!runId) { fail("No run given: open a run from the list (/run?id=RUN)."); return; }
  document.getElementById("title").textContent = runId;
  document.title = `rlpulse: ${runId}`;
  await showStatus(document.getElementById("notices"), early.status);
  let run, runs, defaults;
  try { [run, runs, defaults] = await Promise.all([early.run, early.runs, early.defaults]); }
  catch (e) { fail(e.message); return; }
  state.run = run;
  const names = defaults.names;
  state.names = names;
  if (!names.length) { fail(`Run ${runId} has step summaries but no metrics in them.`); return; }
  state.prefetched = { keys: defaults.keys, series: defaults.series, heatmap: defaults.heatmap };
  const { a, b, h } = defaults.keys;
  for (const [id, chosen] of [["metric-a", a], ["metric-b", b], ["heat-metric", h]]) {
    const select = document.getElementById(id);
    for (const n of names) option(select, n, n.replace("|", ": "), n === chosen);
  }
  const compare = document.getElementById("compare");
  for (const r of runs) if (r.run_id !== runId) option(compare, r.run_id, r.run_id, r.run_id === state.compare);
  compare.onchange = () => { state.compare = compare.value; drawMain(); };
  document.getElementById("metric-a").onchange = drawMain;
  document.getElementById("metric-b").onchange = drawMain;
  document.getElementById("heat-metric").onchange = drawHeatmap;
  document.getElementById("step-close").onclick = () => { document.getElementById("step-panel").hidden = true; };
  document.getElementById("content").hidden = false;
  const me = runs.find(r => r.run_id === runId);
  if (me) showRunStatus(me);
  try {
    state.commands = await early.commands;
    await Promise.all([drawMain(), drawHeatmap(), drawTiming(early.timing), drawQuiet()]);
    drawCommands();
  } catch (e) { fail(`Cannot draw run ${runId}: ${e.message}`); return; }
  for (const id of ["main-chart", "heatmap", "timing"]) onClick(document.getElementById(id));
  window.rlpulseReady = true;
  if (me && me.status === "running") setTimeout(() => refresh(1), LIVE_EVERY_MS);
}
document.addEventListener("DOMContentLoaded", main);
