// tpuctl board: reads the log directory's list (/api/logdir), then each file
// by its number (/api/file?i=N). Event files are parsed here: TFRecord
// framing (length, masked CRC-32C of the length, data, masked CRC-32C of the
// data) around Event protobufs whose Summary values are scalars (a float
// tensor of plugin "scalars", or a simple_value). A file that goes wrong is
// kept up to its last good record and named with what is wrong. Charts are
// Chart.js (Debian's libjs-chart.js, served by tpuctl from where Debian
// installs it).
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const PARTS = ["input", "compute", "all_reduce", "optimizer", "idle"];
  const COLORS = ["#8e6c00", "#1f77b4", "#d62728", "#2ca02c", "#9aa0a6"];
  const charts = [];

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const pct = (x) => (100 * x).toFixed(1) + "%";

  // ---- TFRecord and protobuf ----
  const CRC_TABLE = (() => {
    const t = new Uint32Array(256);
    for (let i = 0; i < 256; i++) {
      let c = i;
      for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
      t[i] = c >>> 0;
    }
    return t;
  })();
  function maskedCrc(bytes) {
    let c = 0xffffffff;
    for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
    c = (c ^ 0xffffffff) >>> 0;
    return ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0;
  }

  // fields of one protobuf message: [{no, wire, value (number | Uint8Array | [lo, hi] for fixed64)}]
  function fields(b) {
    const out = [];
    let p = 0;
    const varint = () => {
      let v = 0, mul = 1, n = 0;
      for (;;) {
        if (p >= b.length || n > 9) throw new Error("a varint runs past its message");
        const x = b[p++];
        v += (x & 0x7f) * mul;
        mul *= 128;
        n++;
        if (!(x & 0x80)) return v;
      }
    };
    while (p < b.length) {
      const key = varint(), no = Math.floor(key / 8), wire = key & 7;
      if (wire === 0) out.push({ no, wire, value: varint() });
      else if (wire === 1) {
        if (p + 8 > b.length) throw new Error("a 64-bit field runs past its message");
        out.push({ no, wire, value: b.subarray(p, p + 8) });
        p += 8;
      } else if (wire === 2) {
        const n = varint();
        if (p + n > b.length) throw new Error("a field of " + n + " bytes runs past its message");
        out.push({ no, wire, value: b.subarray(p, p + n) });
        p += n;
      } else if (wire === 5) {
        if (p + 4 > b.length) throw new Error("a 32-bit field runs past its message");
        out.push({ no, wire, value: b.subarray(p, p + 4) });
        p += 4;
      } else throw new Error("wire type " + wire + " is not protobuf's");
    }
    return out;
  }
  const f32 = (b) => new DataView(b.buffer, b.byteOffset, 4).getFloat32(0, true);
  const utf8 = (b) => new TextDecoder().decode(b);

  // scalars of one Event: [{tag, step, value}]
  function eventScalars(data) {
    let step = 0, summary = null;
    for (const f of fields(data)) {
      if (f.no === 2 && f.wire === 0) step = f.value;
      if (f.no === 5 && f.wire === 2) summary = f.value;
    }
    const out = [];
    if (!summary) return out;
    for (const v of fields(summary)) {
      if (v.no !== 1 || v.wire !== 2) continue;
      let tag = null, value = null;
      for (const g of fields(v.value)) {
        if (g.no === 1 && g.wire === 2) tag = utf8(g.value);
        else if (g.no === 2 && g.wire === 5) value = f32(g.value);
        else if (g.no === 8 && g.wire === 2) {
          let dtype = 0, content = null, fv = null;
          for (const t of fields(g.value)) {
            if (t.no === 1 && t.wire === 0) dtype = t.value;
            if (t.no === 4 && t.wire === 2) content = t.value;
            if (t.no === 5 && t.wire === 5) fv = f32(t.value);
            if (t.no === 5 && t.wire === 2 && t.value.length >= 4) fv = f32(t.value);
          }
          if (dtype === 1 && content && content.length === 4) value = f32(content);
          else if (dtype === 1 && fv !== null) value = fv;
        }
      }
      if (tag !== null && value !== null) out.push({ tag, step, value });
    }
    return out;
  }

  // {scalars: [...], error: "" or what went wrong, records}
  function readEvents(buf) {
    const b = new Uint8Array(buf), dv = new DataView(buf);
    const scalars = [];
    let p = 0, records = 0;
    try {
      while (p < b.length) {
        if (p + 12 > b.length) throw new Error("the file ends inside a record's header (a write cut short?)");
        const lo = dv.getUint32(p, true), hi = dv.getUint32(p + 4, true);
        if (dv.getUint32(p + 8, true) !== maskedCrc(b.subarray(p, p + 8)))
          throw new Error("the length's CRC is wrong");
        if (hi !== 0 || lo > b.length - p - 16) throw new Error("a record claims " + lo + " bytes past the file's end");
        const data = b.subarray(p + 12, p + 12 + lo);
        if (dv.getUint32(p + 12 + lo, true) !== maskedCrc(data)) throw new Error("the data's CRC is wrong");
        for (const s of eventScalars(data)) scalars.push(s);
        p += 16 + lo;
        records++;
      }
      return { scalars, error: "", records };
    } catch (e) {
      return { scalars, error: "record " + (records + 1) + " (byte " + p + "): " + e.message, records };
    }
  }

  // ---- scalars ----
  function drawScalars(byTag) {
    const box = $("scalars");
    const tags = Object.keys(byTag).sort();
    $("noscalars").hidden = tags.length > 0;
    for (const tag of tags) {
      const card = el("div", { class: "card", "data-tag": tag });
      card.append(el("h3", {}, tag));
      const wrap = el("div", { class: "chart" });
      const canvas = el("canvas");
      wrap.append(canvas);
      card.append(wrap);
      const runs = Object.keys(byTag[tag]).sort();
      const steps = [...new Set(runs.flatMap((r) => byTag[tag][r].map((s) => s.step)))].sort((a, b) => a - b);
      const table = el("table");
      const head = el("tr");
      head.append(el("th", {}, "step"));
      for (const r of runs) head.append(el("th", {}, r));
      table.append(head);
      for (const st of steps) {
        const tr = el("tr", { "data-step": String(st) });
        tr.append(el("td", {}, String(st)));
        for (const r of runs) {
          const s = byTag[tag][r].find((x) => x.step === st);
          tr.append(el("td", { "data-run": r, "data-value": s ? String(s.value) : "" }, s ? s.value.toPrecision(9) : ""));
        }
        table.append(tr);
      }
      card.append(table);
      box.append(card);
      if (window.Chart) {
        charts.push(new Chart(canvas, {
          type: "line",
          data: {
            labels: steps,
            datasets: runs.map((r, i) => ({
              label: r, data: steps.map((st) => { const s = byTag[tag][r].find((x) => x.step === st); return s ? s.value : null; }),
              borderColor: ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"][i % 4], tension: 0.2, spanGaps: true,
            })),
          },
          options: { animation: false, maintainAspectRatio: false, scales: { x: { title: { display: true, text: "epoch" } } } },
        }));
      }
    }
  }

  // ---- profiles ----
  function drawProfile(name, o, svg, trace) {
    const card = el("div", { class: "card profile", "data-run": name });
    card.append(el("h3", {}, "profile " + name));
    const dl = el("dl");
    const row = (k, v, cls) => { dl.append(el("dt", {}, k)); dl.append(el("dd", cls ? { class: cls } : {}, v)); };
    row("bottleneck", o.bottleneck, "bottleneck");
    row("advice", o.advice);
    row("step", o.steps + " steps of " + o.step_ms.toFixed(2) + " ms on " + o.cores + " cores: " +
        PARTS.map((p) => p + " " + pct(o.split[p])).join(", "));
    row("input", o.input_bound + " (" + o.input_classification + "): " + o.input_statement,
        o.input_classification === "HIGHLY_INPUT_BOUND" || o.input_classification === "MODERATELY_INPUT_BOUND" ? "bad" : "");
    row("MXU use", pct(o.mxu_utilization) + (o.mxu_advice ? ": " + o.mxu_advice : ""), o.mxu_utilization < 0.5 ? "bad" : "good");
    row("HBM peak", pct(o.hbm.peak_fraction) + " of a core's HBM, on " + o.hbm.core, o.hbm.peak_fraction > 0.9 ? "bad" : "");
    row("straggler", o.straggler || "none", o.straggler ? "bad" : "");
    if (o.last_at_allreduce)
      row("last at the all-reduce", o.last_at_allreduce.core + " in " + pct(o.last_at_allreduce.share) + " of the steps, by " +
          o.last_at_allreduce.by_ms.toFixed(2) + " ms");
    row("roofline estimate (" + o.estimate.tpu_type + ")", o.estimate.step_ms.toFixed(3) + " ms a step: matmuls " +
        o.estimate.matmul_ms.toFixed(3) + " ms, optimizer " + o.estimate.optimizer_ms.toFixed(3) + " ms, all-reduce " +
        o.estimate.all_reduce_ms.toFixed(3) + " ms (" + o.estimate.what + ")");
    for (const m of o.missing || []) row("missing " + m.core, m.why, "bad");
    card.append(dl);
    if ((o.layers || []).length) {
      const t = el("table", { class: "layers" });
      const h = el("tr");
      for (const k of ["layer", "MXU use", "padding"]) h.append(el("th", {}, k));
      t.append(h);
      for (const l of o.layers) {
        const tr = el("tr");
        tr.append(el("td", {}, l.name));
        tr.append(el("td", { class: l.mxu_utilization < 0.5 ? "bad" : "good" }, pct(l.mxu_utilization)));
        tr.append(el("td", {}, l.padding));
        t.append(tr);
      }
      card.append(t);
    }
    const wrap = el("div", { class: "chart" });
    const canvas = el("canvas");
    wrap.append(canvas);
    card.append(el("h3", {}, "time per core (stacked), the straggler in red"));
    card.append(wrap);
    const cores = o.per_core.map((c) => c.host + "/" + c.core);
    if (window.Chart) {
      charts.push(new Chart(canvas, {
        type: "bar",
        data: {
          labels: cores,
          datasets: PARTS.map((p, i) => ({ label: p, backgroundColor: COLORS[i], data: o.per_core.map((c) => c.step_ms * c.split[p]) })),
        },
        options: {
          animation: false, maintainAspectRatio: false, indexAxis: "y",
          scales: { x: { stacked: true, title: { display: true, text: "ms per step" } },
                    y: { stacked: true, ticks: { color: (ctx) => (cores[ctx.index] === o.straggler ? "#b3261e" : "#333") } } },
        },
      }));
    }
    if (svg !== null) {
      card.append(el("h3", {}, "steps"));
      card.append(el("img", { class: "steps", src: "/api/file?i=" + svg, alt: "each step's parts on each core" }));
    }
    if (trace !== null) {
      const a = el("a", { href: "/api/file?i=" + trace, download: name + ".trace.json.gz" }, "the trace (Chrome trace-event JSON, gzip)");
      const open = el("button", { class: "open-trace" }, "open the trace here");
      const para = el("p");
      para.append(open, document.createTextNode(" or download "), a);
      card.append(para);
      const view = el("div", { class: "trace" });
      card.append(view);
      open.addEventListener("click", () => { open.disabled = true; showTrace(view, trace); });
    }
    $("profiles").append(card);
  }

  // ---- the trace: a timeline of its complete ("X") events, a lane per
  // thread (a core's steps, its collectives, the client), named by the
  // trace's metadata; the wheel zooms around the pointer, a drag pans,
  // hovering an event names it with its duration and arguments ----
  async function showTrace(view, i) {
    view.textContent = "reading the trace ...";
    let doc;
    try {
      const r = await fetch("/api/file?i=" + i, { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const text = await new Response(r.body.pipeThrough(new DecompressionStream("gzip"))).text();
      doc = JSON.parse(text);
    } catch (err) {
      view.textContent = "the trace could not be read: " + err.message;
      view.dataset.error = err.message;
      return;
    }
    const evs = Array.isArray(doc) ? doc : doc.traceEvents || [];
    const pname = {}, tname = {}, tsort = {}, lanes = new Map();
    for (const e of evs) {
      if (e.ph !== "M") continue;
      const key = e.pid + ":" + e.tid;
      if (e.name === "process_name") pname[e.pid] = e.args.name;
      else if (e.name === "thread_name") tname[key] = e.args.name;
      else if (e.name === "thread_sort_index") tsort[key] = e.args.sort_index;
    }
    let t0 = Infinity, t1 = -Infinity, n = 0;
    for (const e of evs) {
      if (e.ph !== "X" || typeof e.ts !== "number") continue;
      const key = e.pid + ":" + e.tid;
      if (!lanes.has(key)) lanes.set(key, []);
      lanes.get(key).push(e);
      t0 = Math.min(t0, e.ts);
      t1 = Math.max(t1, e.ts + (e.dur || 0));
      n++;
    }
    if (!n) {
      view.textContent = "the trace has no timed events";
      view.dataset.events = "0";
      return;
    }
    const keys = [...lanes.keys()].sort((a, b) => {
      const [pa, ta] = a.split(":").map(Number), [pb, tb] = b.split(":").map(Number);
      return pa - pb || (tsort[a] ?? ta) - (tsort[b] ?? tb);
    });
    const label = (k) => (pname[k.split(":")[0]] || "pid " + k.split(":")[0]) + " · " + (tname[k] || "tid " + k.split(":")[1]);
    view.textContent = "";
    const info = el("div", { class: "trace-info" }, n + " events on " + keys.length + " threads over " +
      ((t1 - t0) / 1000).toFixed(1) + " ms; the wheel zooms, a drag pans, hover names an event");
    const tip = el("div", { class: "trace-tip" });
    const canvas = el("canvas", { class: "trace-canvas" });
    view.append(info, canvas, tip);
    view.dataset.events = String(n);
    view.dataset.lanes = JSON.stringify(keys.map(label));
    const LANE = 18, LEFT = 220, dpr = window.devicePixelRatio || 1;
    let from = t0, span = Math.max(1, t1 - t0), drag = null;
    const colour = (name) => {
      let h = 0;
      for (let k = 0; k < name.length; k++) h = (h * 31 + name.charCodeAt(k)) >>> 0;
      return "hsl(" + (h % 360) + ",55%,55%)";
    };
    function draw() {
      const w = view.clientWidth || 900, h = keys.length * LANE + 20;
      canvas.width = w * dpr;
      canvas.height = h * dpr;
      canvas.style.height = h + "px"; // (CSSOM, which the page's CSP allows)
      const g = canvas.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, w, h);
      g.font = "11px sans-serif";
      const x = (t) => LEFT + ((t - from) / span) * (w - LEFT);
      keys.forEach((k, li) => {
        const y = li * LANE;
        g.fillStyle = li % 2 ? "#f6f6f6" : "#fff";
        g.fillRect(0, y, w, LANE);
        g.fillStyle = "#333";
        g.fillText(label(k).slice(0, 34), 4, y + 13);
        for (const e of lanes.get(k)) {
          const a = x(e.ts), b = x(e.ts + (e.dur || 0));
          if (b < LEFT || a > w) continue;
          const l = Math.max(a, LEFT), r = Math.max(l + 1, Math.min(b, w));
          g.fillStyle = colour(e.name || "");
          g.fillRect(l, y + 2, r - l, LANE - 4);
          if (r - l > 40) {
            g.fillStyle = "#000";
            g.fillText((e.name || "").slice(0, Math.floor((r - l) / 6)), l + 2, y + 13);
          }
        }
      });
      g.fillStyle = "#333";
      g.fillText(((from - t0) / 1000).toFixed(2) + " ms", LEFT, keys.length * LANE + 14);
      const end = ((from + span - t0) / 1000).toFixed(2) + " ms";
      g.fillText(end, w - g.measureText(end).width - 4, keys.length * LANE + 14);
    }
    function at(ev) {
      const rect = canvas.getBoundingClientRect(), w = rect.width;
      return { px: ev.clientX - rect.left, lane: Math.floor((ev.clientY - rect.top) / LANE), w };
    }
    canvas.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const p = at(ev);
      if (p.px < LEFT) return;
      const t = from + ((p.px - LEFT) / (p.w - LEFT)) * span, f = ev.deltaY > 0 ? 1.25 : 0.8;
      span = Math.min(Math.max(span * f, 1), (t1 - t0) * 2);
      from = t - ((p.px - LEFT) / (p.w - LEFT)) * span;
      draw();
    }, { passive: false });
    canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, from }; });
    window.addEventListener("mouseup", () => { drag = null; });
    canvas.addEventListener("mousemove", (ev) => {
      const p = at(ev);
      if (drag) {
        from = drag.from - ((ev.clientX - drag.x) / (p.w - LEFT)) * span;
        draw();
        return;
      }
      const k = keys[p.lane], t = from + ((p.px - LEFT) / (p.w - LEFT)) * span;
      const e = k && p.px >= LEFT ? lanes.get(k).find((q) => q.ts <= t && t <= q.ts + (q.dur || 0)) : null;
      tip.textContent = e ? label(k) + ": " + e.name + ", " + ((e.dur || 0) / 1000).toFixed(3) + " ms" +
        (e.args ? " " + JSON.stringify(e.args) : "") : "";
    });
    window.addEventListener("resize", draw);
    draw();
  }

  const dirOf = (p) => (p.includes("/") ? p.slice(0, p.lastIndexOf("/")) : ".");

  async function load() {
    for (const c of charts.splice(0)) c.destroy();
    for (const id of ["scalars", "profiles", "bad"]) $(id).textContent = "";
    $("problems").hidden = true;
    const r = await fetch("/api/logdir", { cache: "no-store" });
    const list = await r.json();
    $("logdir").textContent = list.logdir + (list.truncated ? " (only its first 4096 files)" : "");
    const byTag = {};
    const bad = (path, what) => {
      $("problems").hidden = false;
      $("bad").append(el("li", { "data-file": path }, path + ": " + what));
    };
    for (const f of list.files.filter((x) => x.kind === "events")) {
      const resp = await fetch("/api/file?i=" + f.i, { cache: "no-store" });
      if (!resp.ok) { bad(f.path, "cannot read it: " + (await resp.text())); continue; }
      const got = readEvents(await resp.arrayBuffer());
      if (got.error) bad(f.path, got.error + "; " + got.records + " records read before it are shown");
      const run = dirOf(f.path);
      for (const s of got.scalars) {
        ((byTag[s.tag] = byTag[s.tag] || {})[run] = byTag[s.tag][run] || []).push(s);
      }
    }
    drawScalars(byTag);
    const overviews = list.files.filter((x) => x.kind === "overview");
    $("noprofiles").hidden = overviews.length > 0;
    for (const f of overviews) {
      const resp = await fetch("/api/file?i=" + f.i, { cache: "no-store" });
      let o;
      try {
        if (!resp.ok) throw new Error(await resp.text());
        o = await resp.json();
        if (!o.per_core || !o.split) throw new Error("not a profile overview");
      } catch (e) { bad(f.path, "cannot read it: " + e.message); continue; }
      const dir = dirOf(f.path);
      const svg = list.files.find((x) => x.kind === "svg" && dirOf(x.path) === dir);
      const trace = list.files.find((x) => x.kind === "trace" && dirOf(x.path) === dir);
      drawProfile(f.path.replace(/\.overview\.json$/, ""), o, svg ? svg.i : null, trace ? trace.i : null);
    }
    document.body.dataset.loaded = "true";
  }

  $("reload").addEventListener("click", () => { document.body.dataset.loaded = "false"; load(); });
  load().catch((e) => {
    $("problems").hidden = false;
    $("bad").append(el("li", {}, "the board could not read the log directory: " + e.message));
    document.body.dataset.loaded = "error";
  });
})();
