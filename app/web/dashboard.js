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

function renderPlot(s) {
  const net = s.run ? s.run.network : Object.keys(s.iterations)[0];
  const pts = (net && s.iterations[net]) || [];
  $("iterations").textContent = String(pts.length);
  $("last-iteration").textContent = pts.length ? `${pts[pts.length - 1][1].toFixed(3)} ms (${net})` : "-";
  const data = [pts.map((p) => p[0]), pts.map((p) => p[1])];
  if (!plot || plotNetwork !== net) {
    if (plot) plot.destroy();
    const box = $("plot");
    plot = new uPlot({width: Math.max(box.clientWidth - 10, 300), height: 220,
      scales: {x: {time: false}}, axes: [{label: "iteration"}, {label: "ms"}],
      series: [{}, {label: net || "iteration time", stroke: "#3182bd", points: {show: pts.length < 60}}]},
      data, box);
    plotNetwork = net;
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
  const r = s.run;
  $("run").textContent = r ? `${r.experiment} / ${r.network} (${r.backend}): ${r.state}` : "no run yet";
  const faulty = renderFaults(s);
  renderNodes(s, faulty);
  renderPlot(s);
  renderWss(s);
  $("in-flight").textContent = String(s.totals.in_flight);
  $("msgs").textContent = String(s.totals.msgs_per_s);
  $("job").textContent = s.job ? `${s.job.job} (${s.job.collective}, ${s.job.ranks} ranks)` : "-";
  $("rejected").textContent = String(s.rejected);
  if (s.queue) {
    $("queue").replaceChildren(el("tr", {}, ...["job", "user", "state", "progress", "partition"]
      .map((h) => el("th", {}, h))), ...s.queue.jobs.map((j) => el("tr", {class: j.state},
      el("td", {}, j.job), el("td", {}, j.user), el("td", {}, j.state),
      el("td", {}, `${j.done}/${j.iterations}`), el("td", {}, j.partition))));
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
