// shoal dashboard: draws GET /v1/overview every second.
// The token comes from #token=... (a fragment never reaches a server, a
// log or a Referer), ?token=... (older links), or the form; it is kept in
// localStorage, and taken out of the address at once, so that the browser's
// history does not keep it.
"use strict";

function tokenFromAddress() {
  const t = new URLSearchParams(location.hash.slice(1)).get("token") ||
            new URLSearchParams(location.search).get("token");
  if (!t) return "";
  localStorage.setItem("shoal-token", t);
  history.replaceState(null, "", location.pathname);
  return t;
}
let token = tokenFromAddress() || localStorage.getItem("shoal-token") || "";

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function dur(s) {
  if (s < 60) return s.toFixed(0) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows);
}

function drawFleet(nodes) {
  // zone -> "fabric / GPU type" pool -> nodes
  const zones = new Map();
  for (const n of nodes) {
    if (!zones.has(n.zone)) zones.set(n.zone, new Map());
    const pools = zones.get(n.zone), key = n.fabric + " / " + n.gpu_type;
    if (!pools.has(key)) pools.set(key, []);
    pools.get(key).push(n);
  }
  const out = [];
  for (const zone of [...zones.keys()].sort()) {
    const z = el("div", {class: "zone", "data-zone": zone}, el("h3", {}, "zone " + zone));
    const pools = zones.get(zone);
    for (const key of [...pools.keys()].sort()) {
      const p = el("div", {class: "pool", "data-pool": key}, el("h4", {}, key));
      for (const n of pools.get(key).sort((a, b) => a.name.localeCompare(b.name))) {
        const gpus = el("div", {class: "gpus"});
        for (let g = 0; g < n.gpus; g++) gpus.append(el("span", {class: "gpu" + (g < n.gpus_used ? " busy" : "")}));
        const jobs = n.jobs.map(j => j.job ? `#${j.job}/${j.rank} ${j.name}` : "(other tenant)").join(", ");
        // Heartbeat age: the time since the node's last poll (stale past 2 s).
        const hb = n.heartbeat_age_s < 0 ? "no heartbeat" : "heartbeat " + n.heartbeat_age_s.toFixed(1) + "s ago";
        p.append(el("div", {class: "node " + n.state, "data-name": n.name, "data-used": n.gpus_used,
                            title: `${n.name}: ${n.gpus_used}/${n.gpus} ${n.gpu_type}, $${n.price_per_gpu_hour}/GPU-h, ${n.sandbox}`},
          el("span", {class: "name"}, n.name), el("span", {class: "state"}, n.state), gpus,
          el("div", {class: "hb" + (n.heartbeat_age_s < 0 || n.heartbeat_age_s > 2 ? " stale" : ""),
                     "data-age": n.heartbeat_age_s}, hb),
          el("div", {class: "jobs"}, jobs)));
      }
      z.append(p);
    }
    out.push(z);
  }
  document.getElementById("fleet").replaceChildren(...out);
}

function draw(o) {
  drawFleet(o.nodes);
  const active = o.jobs.filter(j => ["pending", "starting", "running"].includes(j.state));
  const ended = o.jobs.filter(j => !active.includes(j));
  fill("gangs", active.filter(j => j.state !== "pending").map(j => el("tr", {"data-job": j.id},
    el("td", {}, j.id), el("td", {}, j.name), el("td", {}, j.tenant),
    el("td", {class: "st-" + j.state}, j.state), el("td", {}, j.attempt),
    // Only the replicas that hold GPUs now: a shrunk or preempted replica's
    // node may already run another job.
    el("td", {}, j.members.filter(m => ["assigned", "ready", "running"].includes(m.state))
      .map(m => `${m.rank}@${m.node}`).join(" ")),
    // When the scheduler plans it to end (moved on while it runs past its
    // estimate): what the queue's start estimates follow from.
    el("td", {class: "ends", title: "planned end: its estimate at its GPUs' speed"},
      j.expected_end == null ? "" : j.expected_end <= o.now ? "due now" : "in " + dur(j.expected_end - o.now)),
    el("td", {}, "$" + j.cost.toFixed(4)))));
  fill("queue", active.filter(j => j.state === "pending").map(j => el("tr", {"data-job": j.id},
    el("td", {}, j.id), el("td", {}, j.name), el("td", {}, j.tenant), el("td", {}, j.kind),
    el("td", {}, `${j.nodes}x${j.gpus_per_node}`), el("td", {}, dur(o.now - j.submitted_at)),
    el("td", {class: "start"}, j.start_estimate == null ? "unknown"
      : j.start_estimate <= o.now ? "next cycle" : "in " + dur(j.start_estimate - o.now)),
    el("td", {class: "reason", "data-wait": j.wait || ""}, j.pending_reason || j.reason))));
  fill("ended", ended.map(j => el("tr", {"data-job": j.id},
    el("td", {}, j.id), el("td", {}, j.name), el("td", {}, j.tenant),
    el("td", {class: "st-" + j.state}, j.state), el("td", {}, dur(j.run_s)),
    el("td", {}, "$" + j.cost.toFixed(4)), el("td", {class: "reason"}, j.reason))));
  const costRows = [];
  for (const [tenant, by] of Object.entries(o.costs.by_tenant).sort())
    for (const [type, c] of Object.entries(by).sort())
      costRows.push(el("tr", {"data-tenant": tenant, "data-type": type}, el("td", {}, tenant), el("td", {}, type),
        el("td", {}, (c.gpu_seconds / 3600).toFixed(3)), el("td", {}, "$" + c.dollars.toFixed(4))));
  costRows.push(el("tr", {class: "total"}, el("td", {}, "total"), el("td", {}, ""), el("td", {}, ""),
    el("td", {}, "$" + o.costs.total_dollars.toFixed(4))));
  fill("costs", costRows);
  const alive = o.nodes.filter(n => n.state === "alive");
  const gpus = alive.reduce((a, n) => a + n.gpus, 0), used = alive.reduce((a, n) => a + n.gpus_used, 0);
  document.getElementById("summary").replaceChildren(
    el("span", {}, el("b", {id: "n-alive"}, alive.length), " nodes alive"),
    el("span", {}, el("b", {id: "n-gpus"}, `${used}/${gpus}`), " GPUs busy"),
    el("span", {}, el("b", {id: "n-running"}, active.filter(j => j.state === "running").length), " running"),
    el("span", {}, el("b", {id: "n-queued"}, active.filter(j => j.state === "pending").length), " queued"),
    el("span", {}, "viewing as ", el("b", {id: "viewer"}, o.viewer)));
  document.getElementById("updated").textContent = "updated " + new Date(o.now * 1000).toLocaleTimeString();
}

// ---- Job detail (#job=ID): facts, ranks, events and the tail of a rank's log.
let detailJob = 0, detailAt = 0;

function shownJob() {
  const m = /^#job=(\d+)$/.exec(location.hash);
  return m ? Number(m[1]) : 0;
}

async function api(path) {
  const r = await fetch(path, {headers: {Authorization: "Bearer " + token}});
  const o = await r.json();
  if (!r.ok) throw new Error(o.error || r.statusText);
  return o;
}

async function logTail(id, rank, lines) {
  let off = 0, text = "";
  for (let page = 0; page < 8; page++) { // up to 8 MiB; the tail is what is shown
    const o = await api(`/v1/jobs/${id}/logs?rank=${rank}&offset=${off}`);
    text = (text + o.data).slice(-65536);
    if (!o.data.length || o.offset === off) break;
    off = o.offset;
  }
  return text.split("\n").slice(-lines).join("\n");
}

async function drawDetail(force) {
  const id = shownJob(), box = document.getElementById("detail");
  if (!id) { box.hidden = true; detailJob = 0; return; }
  if (!force && id === detailJob && Date.now() - detailAt < 2000) return;
  const first = id !== detailJob;
  detailJob = id; detailAt = Date.now();
  try {
    const [j, ev] = await Promise.all([api(`/v1/jobs/${id}`), api(`/v1/jobs/${id}/events`)]);
    document.getElementById("d-title").textContent = `${j.id} ${j.name}`;
    document.getElementById("d-facts").replaceChildren(
      el("span", {class: "st-" + j.state, id: "d-state"}, j.state),
      el("span", {}, `${j.kind}, tenant ${j.tenant}`), el("span", {}, `attempt ${j.attempt}/${j.max_attempts}`),
      el("span", {}, `${j.nodes}x${j.gpus_per_node} GPUs`), el("span", {}, "$" + (j.running_cost || 0).toFixed(4) + " running"),
      el("span", {class: "reason"}, j.reason || ""));
    fill("d-ranks", j.members.map(m => el("tr", {}, el("td", {}, m.rank), el("td", {}, m.node),
      el("td", {}, m.state), el("td", {}, m.exit_code))));
    fill("d-events", ev.events.map(e => el("tr", {"data-kind": e.kind},
      el("td", {}, new Date(e.t * 1000).toLocaleTimeString()), el("td", {}, e.kind), el("td", {}, e.node || ""),
      el("td", {class: "reason"}, e.msg))));
    const sel = document.getElementById("d-rank");
    if (first) {
      sel.replaceChildren(...j.members.map(m => el("option", {value: m.rank}, m.rank)));
      if (!j.members.length) sel.append(el("option", {value: 0}, 0));
    }
    document.getElementById("d-log").textContent = await logTail(id, sel.value || 0, 40);
    box.hidden = false;
    box.dataset.job = id;
  } catch (e) {
    document.getElementById("d-log").textContent = "cannot load job " + id + ": " + e.message;
    box.hidden = false;
  }
}

// Any job row opens its detail view.
document.querySelector("main").addEventListener("click", ev => {
  const row = ev.target.closest("tr[data-job]");
  if (row) location.hash = "job=" + row.dataset.job;
});
document.getElementById("d-close").addEventListener("click", ev => { ev.preventDefault(); location.hash = ""; });
document.getElementById("d-rank").addEventListener("change", () => drawDetail(true));
window.addEventListener("hashchange", () => drawDetail(true));

async function refresh() {
  const err = document.getElementById("error");
  if (!token) { err.textContent = "enter a bearer token to view the fleet"; err.hidden = false; return; }
  try {
    const r = await fetch("/v1/overview", {headers: {Authorization: "Bearer " + token}});
    const o = await r.json();
    if (!r.ok) throw new Error(o.error || r.statusText);
    err.hidden = true;
    draw(o);
    document.body.dataset.loaded = "1";
    drawDetail(false);
  } catch (e) {
    err.textContent = "cannot load the fleet: " + e.message;
    err.hidden = false;
  }
}

document.getElementById("login").addEventListener("submit", ev => {
  ev.preventDefault();
  token = document.getElementById("token").value.trim();
  localStorage.setItem("shoal-token", token);
  refresh();
});
refresh();
setInterval(refresh, 1000);
