// The dashboard's page: the list of queries, and one query's charts, read from /api
// every refresh interval and drawn with plotly.js. Data is set as text, never as HTML.
"use strict";

const PHASES = ["latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets"];
let refreshMs = 1000;
let current = null;          // {key, progress: [...], after: "<ts>,<batch>"}
let timer = null;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fmt(n) {
  if (n === null || n === undefined) return "";
  return typeof n === "number" ? n.toLocaleString("en-US", {maximumFractionDigits: 1}) : String(n);
}

async function getJson(url) {
  const response = await fetch(url, {cache: "no-store"});
  if (!response.ok) throw new Error(url + ": " + response.status);
  return response.json();
}

function showList(data) {
  document.getElementById("list-view").hidden = false;
  document.getElementById("query-view").hidden = true;
  const body = document.querySelector("#queries tbody");
  body.replaceChildren();
  for (const q of data.queries) {
    const row = el("tr");
    row.dataset.key = q.key;
    const name = el("td");
    const link = el("a", q.name || "<no name>");
    link.href = "#/query/" + encodeURIComponent(q.key);
    name.appendChild(link);
    row.appendChild(name);
    const status = el("td");
    status.appendChild(el("span", q.status, "status " + q.status));
    row.appendChild(status);
    row.appendChild(el("td", q.id));
    row.appendChild(el("td", q.runId));
    row.appendChild(el("td", q.startedAt));
    row.appendChild(el("td", q.batchId, "number"));
    row.appendChild(el("td", fmt(q.inputRowsPerSecond), "number"));
    row.appendChild(el("td", fmt(q.processedRowsPerSecond), "number"));
    row.appendChild(el("td", q.watermark));
    row.appendChild(el("td", fmt(q.stateRows), "number"));
    const error = el("td", q.exception ? q.exception.split("\n")[0] : "", "error");
    error.title = q.exception || "";
    row.appendChild(error);
    body.appendChild(row);
  }
  document.getElementById("no-queries").hidden = data.queries.length > 0;
}

const layout = (title, extra) => Object.assign({
  title: {text: title, font: {size: 14}}, margin: {l: 60, r: 90, t: 40, b: 80},
  legend: {orientation: "h", y: -0.25}, xaxis: {title: {text: "batch", standoff: 4}},
}, extra || {});
const config = {displayModeBar: false, responsive: true};

function drawCharts(progress) {
  const batches = progress.map(p => p.batchId);
  Plotly.react("chart-rates", [
    {x: batches, y: progress.map(p => p.inputRowsPerSecond), name: "Input rate", mode: "lines+markers"},
    {x: batches, y: progress.map(p => p.processedRowsPerSecond), name: "Process rate", mode: "lines+markers"},
  ], layout("Input rate vs process rate (rows/s)"), config);
  Plotly.react("chart-durations", PHASES.map(phase => ({
    x: batches, y: progress.map(p => (p.durationMs || {})[phase] || 0), name: phase, type: "bar",
  })), layout("Batch duration by phase (ms)", {barmode: "stack"}), config);
  Plotly.react("chart-input-rows", [
    {x: batches, y: progress.map(p => p.numInputRows), name: "Input rows", type: "bar"},
  ], layout("Input rows"), config);
  const operators = new Map();
  progress.forEach(p => (p.stateOperators || []).forEach((op, i) => {
    const name = "op " + i + " " + op.operatorName;
    if (!operators.has(name)) operators.set(name, {index: i});
  }));
  const stateTrace = (field) => [...operators.entries()].map(([name, {index}]) => ({
    x: batches, y: progress.map(p => ((p.stateOperators || [])[index] || {})[field]),
    name: name, mode: "lines+markers",
  }));
  Plotly.react("chart-state-rows", stateTrace("numRowsTotal"), layout("State rows per operator"), config);
  Plotly.react("chart-state-memory", stateTrace("memoryUsedBytes"),
               layout("State memory per operator (bytes)"), config);
  // a watermark of 0 (the epoch) means none yet: Spark UI leaves those batches out too
  const watermarked = progress.filter(p => p.eventTime && p.eventTime.watermark &&
                                          Date.parse(p.eventTime.watermark) > 0);
  Plotly.react("chart-watermark", [
    {x: watermarked.map(p => p.batchId), y: watermarked.map(p => p.eventTime.watermark),
     name: "Watermark", mode: "lines+markers"},
    {x: watermarked.map(p => p.batchId),
     y: watermarked.map(p => (Date.parse(p.timestamp) - Date.parse(p.eventTime.watermark)) / 1000),
     name: "Event-time lag (s)", mode: "lines+markers", yaxis: "y2"},
  ], layout("Watermark and event-time lag", {
    yaxis: {type: "date"}, yaxis2: {overlaying: "y", side: "right", title: {text: "lag (s)"}},
  }), config);
  // a source's lag beyond each batch's end: receivers (socket, http) report the records
  // logged, not yet in a batch; Kafka the offsets behind the latest (max over partitions)
  const LAG_METRICS = ["unconsumedRecords", "maxOffsetsBehindLatest"];
  const lagging = new Map();
  progress.forEach(p => (p.sources || []).forEach((source, i) => {
    const metric = LAG_METRICS.find(m => source.metrics && source.metrics[m] !== undefined);
    if (metric && !lagging.has(i)) {
      lagging.set(i, {name: source.description, metric: metric});
    }
  }));
  const lag = document.getElementById("chart-source-lag");
  lag.hidden = lagging.size === 0;
  if (lagging.size) {
    Plotly.react(lag, [...lagging.entries()].map(([i, {name, metric}]) => ({
      x: batches, name: name + " " + metric, mode: "lines+markers",
      y: progress.map(p => Number((((p.sources || [])[i] || {}).metrics || {})[metric])),
    })), layout("Source lag: records beyond each batch's end"), config);
  }
  // a real-time batch's record latencies (its sink metrics: e2eLatencyMs.P50, ...)
  const LATENCIES = ["e2eLatencyMs.P50", "e2eLatencyMs.P99", "processingLatencyMs.P99"];
  const realTime = progress.filter(p => p.sink && p.sink.metrics && p.sink.metrics["e2eLatencyMs.P99"] !== undefined);
  const latency = document.getElementById("chart-real-time-latency");
  latency.hidden = realTime.length === 0;
  if (realTime.length) {
    Plotly.react(latency, LATENCIES.map(key => ({
      x: realTime.map(p => p.batchId), y: realTime.map(p => Number(p.sink.metrics[key])),
      name: key, mode: "lines+markers",
    })), layout("Real-time mode: record latency (ms)"), config);
  }
}

function showRuns(runs) {
  const body = document.querySelector("#runs tbody");
  body.replaceChildren();
  for (const run of runs || []) {
    const row = el("tr");
    for (const value of [run.runId, run.host, run.pid, run.startedAt, run.endedAt,
                         run.live ? "running: " + run.live : (run.failure ? "failed" :
                                                              (run.released ? "stopped" : "ended without stopping"))]) {
      row.appendChild(el("td", value));
    }
    body.appendChild(row);
  }
  document.getElementById("runs").hidden = !(runs && runs.length);
  document.getElementById("runs-title").hidden = !(runs && runs.length);
}

function showQuery(data) {
  document.getElementById("list-view").hidden = true;
  document.getElementById("query-view").hidden = false;
  const q = data.summary;
  document.getElementById("query-name").textContent = q.name || "<no name>";
  const status = document.getElementById("query-status");
  status.textContent = q.status;
  status.className = "status " + q.status;
  document.getElementById("query-ids").textContent =
    "id " + q.id + " · run " + (q.runId || "") + (q.checkpoint ? " · checkpoint " + q.checkpoint : "");
  const exception = document.getElementById("exception");
  exception.hidden = !q.exception;
  exception.textContent = q.exception || "";
  current.progress.push(...data.progress);
  if (current.progress.length > 1000) current.progress.splice(0, current.progress.length - 1000);
  const last = current.progress[current.progress.length - 1];
  if (last) current.after = last.timestamp + "," + last.batchId;
  if (data.progress.length || !current.drawn) {
    drawCharts(current.progress);
    current.drawn = true;
  }
  document.getElementById("last-progress").textContent = last ? JSON.stringify(last, null, 2) : "";
  document.getElementById("plan").textContent = data.plan || "";
  showRuns(data.runs);
}

async function refresh() {
  clearTimeout(timer);
  try {
    const match = location.hash.match(/^#\/query\/(.+)$/);
    if (match) {
      const key = decodeURIComponent(match[1]);
      if (!current || current.key !== key) current = {key: key, progress: [], after: ",-1", drawn: false};
      showQuery(await getJson("/api/queries/" + encodeURIComponent(key) + "?after=" +
                              encodeURIComponent(current.after)));
    } else {
      current = null;
      const data = await getJson("/api/queries");
      refreshMs = data.refreshMs || refreshMs;
      document.getElementById("title").textContent = data.title;
      showList(data);
    }
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach the engine: " + e.message;
  }
  timer = setTimeout(refresh, refreshMs);
}

window.addEventListener("hashchange", refresh);
refresh();
