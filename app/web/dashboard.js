// oddl dashboard: renders the picture the server pushes over /ws (app/dashboard.py).
"use strict";
const token = new URLSearchParams(location.search).get("token");
const q = token ? "?token=" + encodeURIComponent(token) : "";
const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
};
let plot = null, plotNetwork = null, gridBuilt = null;

function buildGrid(tb) {
  const g = $("grid");
  g.innerHTML = "";
  g.style.gridTemplateColumns = `repeat(${tb.cols}, minmax(90px, 1fr))`;
  for (const n of tb.nodes) {
    const box = el("div", {class: "node", id: "node-" + n.id, "data-node": n.id},
                   el("div", {class: "id"}, n.id), el("div", {class: "ports"}));
    box.style.gridRow = n.row + 1;
    box.style.gridColumn = n.col + 1;
    g.append(box);
  }
  gridBuilt = tb.name;
}

function stateClass(s) { return s === "waiting for grant" ? "waiting" : s; }

function renderNodes(s, faulty) {
  const wl = s.testbed.wavelengths_nm;
  const rows = [];
  for (const [id, n] of Object.entries(s.nodes)) {
    const box = $("node-" + id);
    if (!box) continue;
    box.className = "node " + n.health + (faulty.has(id) ? " faulty" : "");
    box.querySelector(".id").textContent = id;  // (render marks the job that holds it)
    const ports = box.querySelector(".ports");
    ports.innerHTML = "";
    for (const [p, v] of Object.entries(n.ports)) {
      const ch = v.channel >= 0 ? `ch${v.channel} ${wl[v.channel] ? wl[v.channel].toFixed(2) + "nm" : ""}` : "-";
      ports.append(el("div", {class: "port", "data-port": p},
        el("span", {}, p), el("span", {class: "st " + stateClass(v.state)}, v.state),
        el("span", {}, ch)));
    }
    rows.push(el("tr", {"data-node": id}, el("td", {}, id), el("td", {}, n.health),
      el("td", {}, n.beat_age_ms === null ? "never" : n.beat_age_ms + " ms ago"),
      el("td", {}, Object.entries(n.crc_errors).map(([p, c]) => `${p} ${c}`).join(", ") || "0"),
      el("td", {}, String(n.error_flags))));
  }
  $("nodes").querySelector("tbody").replaceChildren(...rows);
}

function renderFaults(s) {
  const items = [], faulty = new Set();
  for (const [net, h] of Object.entries(s.health)) {
    for (const d of h.diagnoses) {
      items.push(el("li", {class: "diagnosis"}, `${net}: found ${d.kind} ${d.target} (${d.evidence})`));
      faulty.add(d.target.split("/")[0]);
    }
    for (const x of h.injected)
      items.push(el("li", {class: "injected"}, `${net}: drill injected ${x.kind} ${x.target}${x.evidence ? " (" + x.evidence + ")" : ""}`));
  }
  for (const e of s.errors) items.push(el("li", {class: "error"}, e));
  $("faults").replaceChildren(...(items.length ? items : [el("li", {class: "none"}, "no faults")]));
  return faulty;
}

const COLOURS = ["#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#d62728", "#8c564b", "#17becf"];

function renderPlot(s) {
  // one series a network, or a job of the arbiter's ("oddl/j7"), on one iteration axis
  const names = Object.keys(s.iterations);
  const series = s.run && s.iterations[s.run.network] ? [s.run.network] : names.slice(-8);
  const xs = [...new Set(series.flatMap((n) => s.iterations[n].map((p) => p[0])))].sort((a, b) => a - b);
  const data = [xs, ...series.map((n) => {
    const at = new Map(s.iterations[n].map((p) => [p[0], p[1]]));
    return xs.map((x) => at.has(x) ? at.get(x) : null);
  })];
  const last = series.length ? s.iterations[series[series.length - 1]] : [];
  $("iterations").textContent = String(series.reduce((k, n) => k + s.iterations[n].length, 0));
  $("last-iteration").textContent = last.length ? `${last[last.length - 1][1].toFixed(3)} ms (${series[series.length - 1]})` : "-";
  const key = series.join(",");
  if (!plot || plotNetwork !== key) {
    if (plot) plot.destroy();
    const box = $("plot");
    plot = new uPlot({width: Math.max(box.clientWidth - 10, 300), height: 220,
      scales: {x: {time: false}}, axes: [{label: "iteration"}, {label: "ms"}],
      series: [{}, ...(series.length ? series : ["iteration time"]).map((n, k) => ({
        label: n, stroke: COLOURS[k % COLOURS.length], spanGaps: false,
        points: {show: xs.length < 60}}))]},
      series.length ? data : [[], []], box);
    plotNetwork = key;
  } else {
    plot.setData(data);
  }
}

function renderWss(s) {
  const p = s.plan;
  if (!p) return;
  $("plan-info").textContent = `${p.network}, strategy ${p.strategy}, ${p.wss.length} shown`;
  const boxes = p.wss.slice(0, 16).map((t) => {
    const head = el("tr", {}, el("th", {}, "in"), ...t.labels.map((l, c) =>
      el("th", {title: `${p.wavelengths_nm[c]} nm`}, `ch${c} ${l}`)));
    const body = t.table.map((row, i) => el("tr", {}, el("td", {}, String(i)),
      ...row.map((o) => el("td", {class: o === null ? "off" : ""}, o === null ? "-" : String(o)))));
    return el("div", {class: "wss", "data-wss": t.wss}, el("div", {}, `${t.wss} (${t.axis} ${t.index})`),
      el("table", {}, head, ...body));
  });
  $("wss").replaceChildren(...boxes);
}

function render(s) {
  if (gridBuilt !== s.testbed.name) buildGrid(s.testbed);
  $("testbed").textContent = s.testbed.name;
  const r = s.run, jobs = s.queue ? s.queue.jobs : [];
  const running = jobs.filter((j) => j.state === "running"), queued = jobs.filter((j) => j.state === "queued");
  $("run").textContent = r ? `${r.experiment} / ${r.network} (${r.backend}): ${r.state}`
    : s.queue ? `arbiter: ${running.length} running, ${queued.length} queued` : "no run yet";
  // a run a loaded host disturbed: its figures are skewed, and the page says by what
  const lag = r && r.host_lag_ms ? r.host_lag_ms : 0;
  $("disturbed").textContent = lag ? `disturbed: the node programs' host ran ${lag} ms late; `
    + "its figures are skewed (free the CPU and run it again)" : "";
  const faulty = renderFaults(s);
  renderNodes(s, faulty);
  renderPlot(s);
  renderWss(s);
  $("in-flight").textContent = String(s.totals.in_flight);
  $("msgs").textContent = String(s.totals.msgs_per_s);
  $("job").textContent = s.job ? `${s.job.job} (${s.job.collective}, ${s.job.ranks} ranks)` : "-";
  $("rejected").textContent = String(s.rejected);
  for (const j of running) {  // each node marked with the job that holds it
    for (const n of j.nodes || []) {
      const box = $("node-" + n);
      if (box) box.querySelector(".id").textContent = `${n} · ${j.job}`;
    }
  }
  if (s.queue) {
    $("queue").replaceChildren(el("tr", {}, ...["job", "user", "state", "priority", "held", "progress", "where, or why it waits"]
      .map((h) => el("th", {}, h))), ...jobs.map((j) => el("tr", {class: j.state},
      el("td", {}, j.job), el("td", {}, j.user), el("td", {}, j.state),
      el("td", {}, j.state === "queued" ? j.priority.toFixed(0) : ""), el("td", {}, j.held ? "held" : ""),
      el("td", {}, `${j.done}/${j.iterations}`), el("td", {}, j.state === "queued" ? j.reason : j.partition))));
  }
  const a = s.accept;
  if (a) {
    const failed = a.checks.filter((c) => c.outcome === "failed" || c.outcome === "error");
    $("accept").replaceChildren(el("span", {class: a.passed ? "pass" : "fail"}, a.passed ? "PASSED" : "FAILED"),
      ` ${a.testbed}, ${a.checks.length} checks ${a.when}`,
      ...failed.map((c) => el("div", {class: "fail"}, c.name)));
  }
}

function connect() {
  const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws" + q);
  ws.onopen = () => { $("conn").textContent = "live"; $("conn").className = "ok"; };
  ws.onmessage = (m) => render(JSON.parse(m.data));
  ws.onclose = () => {
    $("conn").textContent = "disconnected: retrying"; $("conn").className = "bad";
    setTimeout(connect, 1000);
  };
}
connect();
