// The cluster console: polls /api/cluster twice a second and redraws the
// tiles; the events are fetched from the last number seen (?since=N). A
// resolver that does not answer is retried at the same pace, and a restarted
// one (a new "run") starts the event log over. With a cluster token, the
// console key comes in the URL's fragment (#key=...), never sent to the
// server as part of a URL: it is kept in this tab's sessionStorage and sent
// as "Authorization: Bearer KEY".
"use strict";
(function () {
  const POLL_MS = 500, MAX_EVENTS = 300, HEAT_FROM = 128;
  const STATES = ["READY", "IDLE", "DEAD", "PREEMPTED", "MAINTENANCE"];
  let key = sessionStorage.getItem("tpuemu-console-key") || "";
  let run = null, since = 0, downSince = null, timer = null;
  const $ = (id) => document.getElementById(id);

  // #heat: the heat map whatever the pod's size
  const forceHeat = /(?:^#|&)heat(?:&|$)/.test(location.hash);
  const m = /(?:^#|&)key=([0-9a-fA-F]{64})(?:&|$)/.exec(location.hash);
  if (m) {
    key = m[1].toLowerCase();
    sessionStorage.setItem("tpuemu-console-key", key);
    history.replaceState(null, "", location.pathname + (forceHeat ? "#heat" : ""));
  }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const mib = (b) => b >= 1073741824 ? (b / 1073741824).toFixed(1) + " GiB" : (b / 1048576).toFixed(1) + " MiB";
  const ms = (us) => (us / 1000).toFixed(us < 10000 ? 2 : 1) + " ms";

  function status(kind, text) {
    $("status").dataset.status = kind;
    $("status").textContent = text;
  }

  function summary(d) {
    const s = $("summary");
    s.textContent = "";
    const count = {};
    for (const c of d.cores) count[c.state] = (count[c.state] || 0) + 1;
    const mesh = d.mesh[0] ? d.mesh.slice(0, 3).join("x") + " chips x " + d.mesh[3] + " cores" : "-";
    const items = [
      ["epoch", d.epoch + (d.initialized ? " (initialized" + (d.owner ? " by " + d.owner : "") + ")" : " (not initialized)")],
      ["topology", (d.tpu_type || "-") + (d.slice ? ", slice " + d.slice : "") + ", mesh " + mesh],
      ["hosts x devices", d.hosts + " x " + (d.hosts ? Math.round(d.cores.length / d.hosts) : 0)],
      ["cores", d.cores.length + ": " + STATES.filter((x) => count[x]).map((x) => count[x] + " " + x).join(", ")],
    ];
    for (const [k, v] of items) {
      const sp = el("span", { "data-item": k });
      sp.append(el("b", {}, k + ": "), document.createTextNode(v));
      s.append(sp);
    }
    $("title").textContent = "tpuemu cluster" + (d.name ? " " + d.name : "") + " (" + d.version + ")";
  }

  function tile(c, heat) {
    const id = c.host + "/" + c.core;
    // a square of the heat map links to its worker's /metrics; a tile has a
    // link to its /metrics and one to its last log lines
    const a = el(heat && c.metrics ? "a" : "div", {
      class: "tile s-" + c.state + " h-" + c.health + (c.notice ? " notice" : ""),
      "data-core": id, "data-state": c.state, "data-health": c.health, "data-step": String(c.step),
    });
    if (heat && c.metrics) a.href = c.metrics;
    const share = c.step_us ? Math.round((100 * c.allreduce_us) / c.step_us) : 0;
    const hbm = c.hbm_capacity ? (100 * c.hbm_used) / c.hbm_capacity : 0;
    a.title = id + ": " + c.state + ", " + c.health + (c.notice ? ", " + c.notice : "") +
      "\nreplica " + c.replica + ", pid " + c.pid + ", last heartbeat " + (c.heartbeat_age_ms / 1000).toFixed(1) + " s ago" +
      "\nHBM " + mib(c.hbm_used) + " of " + mib(c.hbm_capacity) + " (peak " + mib(c.hbm_peak) + ")" +
      "\nstep " + c.step + (c.step_us ? ", " + ms(c.step_us) + ", all-reduce " + share + "%" : "") +
      (heat && c.metrics ? "\nclick: its worker's /metrics" : "");
    if (heat) return a;
    a.append(el("b", {}, id + " " + c.state));
    a.append(el("span", { class: "health" }, c.health));
    const bar = el("div", { class: "bar" });
    const used = el("i");
    used.style.width = Math.min(100, hbm).toFixed(1) + "%"; // (the page's CSP allows no style attribute)
    bar.append(used);
    a.append(bar);
    a.append(el("span", { class: "hbm" }, "HBM " + mib(c.hbm_used) + " / " + mib(c.hbm_capacity)));
    a.append(el("br"));
    a.append(el("span", { class: "step" }, "step " + c.step + (c.step_us ? " · " + ms(c.step_us) + " · AR " + share + "%" : "")));
    if (c.notice) {
      a.append(el("br"));
      a.append(el("span", { class: "notice-text" }, c.notice));
    }
    if (c.metrics) {
      const links = el("span", { class: "links" });
      const m = el("a", { class: "metrics" }, "metrics");
      m.href = c.metrics;
      const lg = el("a", { class: "log" }, "log");
      lg.href = c.log;
      links.append(m, document.createTextNode(" · "), lg);
      a.append(el("br"), links);
    }
    return a;
  }

  function grid(d) {
    const g = $("grid");
    const heat = forceHeat || d.cores.length > HEAT_FROM;
    g.className = heat ? "heat" : "";
    g.textContent = "";
    let box = null, tiles = null, host = null;
    for (const c of d.cores) {
      if (c.host !== host) {
        host = c.host;
        box = el("div", { class: "host", "data-host": host });
        box.append(el("h3", {}, host));
        tiles = el("div", { class: "tiles" });
        box.append(tiles);
        g.append(box);
      }
      tiles.append(tile(c, heat));
    }
    if (!d.cores.length) g.append(el("p", {}, "No core has registered yet."));
  }

  function events(d) {
    const ol = $("events");
    if (d.run !== run) {
      ol.textContent = "";
      run = d.run;
    }
    for (const e of d.events) {
      const li = el("li", { "data-kind": e.kind, "data-core": e.core, "data-seq": String(e.seq) });
      li.append(el("span", { class: "t" }, new Date(e.unix_ms).toLocaleTimeString()));
      li.append(document.createTextNode((e.core ? e.core + ": " : "") + e.text));
      ol.prepend(li);
    }
    while (ol.children.length > MAX_EVENTS) ol.lastChild.remove();
    since = d.next - 1;
  }

  function legend() {
    const l = $("legend");
    for (const s of STATES) l.append(el("span", { class: "s-" + s }, s));
    l.append(document.createTextNode("Hover a core for its details; its links open its worker's /metrics and last log lines (a square of the heat map: its /metrics)."));
  }

  async function poll() {
    timer = null;
    try {
      const asked = run === null ? 0 : since;
      const r = await fetch("/api/cluster?since=" + asked, {
        cache: "no-store",
        headers: key ? { Authorization: "Bearer " + key } : {},
      });
      if (r.status === 401) {
        $("keyform").hidden = false;
        status("down", "this cluster has a token: give the console key");
        return; // the form starts polling again
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      const d = await r.json();
      if (d.run !== run && asked !== 0) {
        // a restarted resolver: ask again for its whole log
        run = null;
        timer = setTimeout(poll, 0);
        return;
      }
      downSince = null;
      $("keyform").hidden = true;
      summary(d);
      grid(d);
      events(d);
      status("live", "live, updated " + new Date().toLocaleTimeString());
    } catch (err) {
      if (downSince === null) downSince = new Date();
      status("down", "the resolver does not answer (since " + downSince.toLocaleTimeString() + "); retrying");
    }
    timer = setTimeout(poll, POLL_MS);
  }

  $("keyform").addEventListener("submit", (ev) => {
    ev.preventDefault();
    key = $("key").value.trim().toLowerCase();
    sessionStorage.setItem("tpuemu-console-key", key);
    if (!timer) poll();
  });
  legend();
  poll();
})();
