"""The cluster console in headless Chromium, driven over the DevTools protocol.

Run by tests/console/run.sh inside a network namespace that has only
loopback, with a cluster of 4 cores (host0, host1 x cores 0, 1) that has
trained an epoch:

  check.py BIN TPU METRICS_PORT WORKDIR [SCREENSHOT_DIR]

It opens the console at http://127.0.0.1:METRICS_PORT/ and checks what a user
sees: a tile per core, grouped by host, READY with its step; a core killed with
`tpuctl chaos kill` shows DEAD within 3 s of the command returning, with an
event naming it; a core preempted with `tpuctl chaos preempt` shows its notice,
then PREEMPTED, with events naming it; after the resolver restarts, the page
goes on by itself. Every wait is bounded. Prints one line per check; exits 1 on
the first that fails.
"""
import base64
import glob
import gzip
import http.client
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # Debian's python3-websocket

BIN, TPU, MPORT, WORK = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
SHOTS = sys.argv[5] if len(sys.argv) > 5 else ""
URL = "http://127.0.0.1:%d/" % MPORT
passed = 0


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def ok(msg):
    global passed
    passed += 1
    print("ok: " + msg)


class Page:
    def __init__(self, port):
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=2) as r:
                    targets = [t for t in json.load(r) if t.get("type") == "page"]
                if targets:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                fail("Chromium's DevTools port %d did not answer within 30 s" % port)
            time.sleep(0.2)
        self.ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.n = 0

    def call(self, method, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            m = json.loads(self.ws.recv())
            if m.get("id") == self.n:
                if "error" in m:
                    fail("%s: %s" % (method, m["error"]))
                return m.get("result", {})

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        if "exceptionDetails" in r:
            fail("the page's script failed on %s: %s" % (expr, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait(self, expr, seconds, what):
        """Polls expr every 100 ms until it is truthy; returns (value, seconds taken)."""
        t0 = time.monotonic()
        while True:
            v = self.js(expr)
            if v:
                return v, time.monotonic() - t0
            if time.monotonic() - t0 > seconds:
                page = self.call("Runtime.evaluate", expression="document.getElementById('status') ? %s : "
                                 "document.body.innerText.slice(0, 1500)" % SNAPSHOT, returnByValue=True)
                fail("%s: not within %.0f s; the page shows: %s" % (what, seconds, page.get("result", {}).get("value")))
            time.sleep(0.1)

    def shot(self, name):
        if SHOTS:
            png = self.call("Page.captureScreenshot", format="png")["data"]
            with open(os.path.join(SHOTS, name), "wb") as f:
                f.write(base64.b64decode(png))


# what the page shows, for the checks and for failure messages
SNAPSHOT = """JSON.stringify({
  status: document.getElementById('status').textContent,
  tiles: [...document.querySelectorAll('.tile')].map(t => [t.dataset.core, t.dataset.state, t.dataset.step,
                                                           t.parentNode.parentNode.dataset.host]),
  summary: document.getElementById('summary').textContent,
  events: [...document.querySelectorAll('#events li')].slice(0, 12).map(l => [l.dataset.kind, l.dataset.core, l.textContent])
})"""


def shown(p):
    return json.loads(p.js(SNAPSHOT))


def tile_state(core):
    return "(document.querySelector('.tile[data-core=\"%s\"]') || {dataset: {}}).dataset.state" % core


def has_event(kind, core):
    return "!!document.querySelector('#events li[data-kind=\"%s\"][data-core=\"%s\"]')" % (kind, core)


def tpuctl(*args):
    r = subprocess.run([BIN + "/tpuctl", "--tpu", TPU] + list(args), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        fail("tpuctl %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
    return r.stdout


dport = int(os.environ["CONSOLE_DEVTOOLS_PORT"])
profile = tempfile.mkdtemp(dir=WORK)
chrome = subprocess.Popen(
    ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
     "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
     "--disable-domain-reliability", "--user-data-dir=" + profile, "--window-size=1280,800",
     "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=%d" % dport,
     "--remote-allow-origins=*", "about:blank"],
    stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "chromium.log"), "w"))
try:
    p = Page(dport)
    p.call("Page.enable")
    p.call("Page.navigate", url=URL)

    # 1. every core, by host, READY, with the step it trained to
    p.wait("document.querySelectorAll('.tile[data-state=\"READY\"]').length === 4", 20, "4 READY tiles")
    s = shown(p)
    cores = sorted(t[0] for t in s["tiles"])
    if cores != ["host0/0", "host0/1", "host1/0", "host1/1"]:
        fail("the grid shows %s, not the 4 cores" % cores)
    if any(t[0].split("/")[0] != t[3] for t in s["tiles"]):
        fail("a tile is not under its host: %s" % s["tiles"])
    # the last step comes with each core's next heartbeat: all at the same one, past 0
    p.wait("new Set([...document.querySelectorAll('.tile')].map(t => t.dataset.step)).size === 1 && "
           "document.querySelector('.tile').dataset.step !== '0'", 5, "every tile at the training's last step")
    want = p.js("document.querySelector('.tile').dataset.step")
    for word in ("epoch", "v3", "mesh 2x1x1 chips x 2 cores", "hosts x devices: 2 x 2"):
        if word not in s["summary"]:
            fail("the summary does not say %r: %s" % (word, s["summary"]))
    links = p.js("(() => { const t = document.querySelector('.tile[data-core=\"host0/0\"]');"
                 " const m = t.querySelector('a.metrics'), l = t.querySelector('a.log');"
                 " return [m ? m.href : '', l ? l.href : '']; })()")
    if not links[0].endswith("/metrics"):
        fail("host0/0's tile does not link to its worker's /metrics: %s" % links)
    if not links[1].endswith("/log"):
        fail("host0/0's tile does not link to its worker's log: %s" % links)
    with urllib.request.urlopen(links[1], timeout=5) as r:
        log = r.read().decode()
    if 'msg="registered" host="host0" core=0' not in log:
        fail("host0/0's log link does not show its worker's log lines: %s" % log[-400:])
    ok("the grid shows the 4 cores under their 2 hosts, READY at step %s, with the system's epoch and topology;"
       " host0/0's tile links to its worker's /metrics and its last %d log lines" % (want, log.count("\n")))
    p.shot("console.png")

    # 2. a fault injected into a core: an event naming the core and the fault
    tpuctl("chaos", "slow", "host0/0", "50", "1000")
    p.wait(has_event("fault", "host0/0"), 5, "an event naming the fault injected into host0/0")
    what = p.js("document.querySelector('#events li[data-kind=\"fault\"]').textContent")
    if "slow 50% for 1000 ms" not in what:
        fail("the fault's event does not say which fault: %s" % what)
    ok("tpuctl chaos slow host0/0: the event log names the core and the fault (%s)" % what)

    # a core killed: DEAD within 3 s, and an event naming it
    tpuctl("chaos", "kill", "host1/1")
    _, took = p.wait(tile_state("host1/1") + " === 'DEAD'", 3, "host1/1's tile DEAD after tpuctl chaos kill")
    p.wait(has_event("dead", "host1/1"), 2, "an event naming host1/1 dead")
    ok("tpuctl chaos kill host1/1: its tile is DEAD %.1f s later, and the event log names it" % took)

    # 3. a preemption: the notice, then PREEMPTED
    tpuctl("chaos", "--notice-ms", "1500", "preempt", "host0/1")
    p.wait(has_event("notice", "host0/1"), 5, "a preemption notice event for host0/1")
    p.wait(tile_state("host0/1") + " === 'PREEMPTED'", 10, "host0/1's tile PREEMPTED")
    p.wait(has_event("preempted", "host0/1"), 2, "an event naming host0/1 preempted")
    ok("tpuctl chaos preempt host0/1: the notice, then PREEMPTED, each in the event log")
    p.shot("console-faults.png")

    # 4. the resolver restarts: the page says so, then goes on by itself
    with open(os.path.join(WORK, "resolver.pid")) as f:
        rpid = int(f.read())
    os.kill(rpid, 9)
    p.wait("document.getElementById('status').dataset.status === 'down'", 5, "the page saying the resolver is down")
    subprocess.run(["bash", "-c", os.environ["CONSOLE_RESTART"]], check=True, timeout=30)
    p.wait("document.getElementById('status').dataset.status === 'live' && "
           "document.querySelectorAll('.tile[data-state=\"IDLE\"], .tile[data-state=\"READY\"]').length === 2", 15,
           "the page live again with the 2 cores still running, after the resolver restarted")
    p.wait("!!document.querySelector('#events li[data-kind=\"registered\"]')", 5, "the new resolver's events")
    ok("after the resolver restarted, the page went on by itself with its cores and its new event log")

    # 5. the board of the training's log directory
    board = "http://127.0.0.1:%s/" % os.environ["CONSOLE_BOARD_PORT"]
    p.call("Page.navigate", url=board)
    p.wait("!!document.body && document.body.dataset.loaded === 'true'", 20, "the board loaded")
    hist = {}
    with open(os.path.join(WORK, "history.txt")) as f:
        for line in f:
            e, loss, acc = line.split()
            hist[int(e)] = {"epoch_loss": float.fromhex(loss), "epoch_accuracy": float.fromhex(acc)}
    as_f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
    for tag in ("epoch_loss", "epoch_accuracy"):
        rows = p.js("JSON.stringify([...document.querySelectorAll('.card[data-tag=\"%s\"] tr[data-step]')].map("
                    "r => [r.dataset.step, r.querySelector('td[data-run=\"train\"]').dataset.value]))" % tag)
        rows = json.loads(rows or "[]")
        got = {int(s): float(v) for s, v in rows if v}
        want = {e: as_f32(h[tag]) for e, h in hist.items()}
        if set(got) != set(want) or any(as_f32(got[e]) != want[e] for e in want):
            fail("the board's %s for run train is %s, fit's history says %s" % (tag, got, want))
    if not p.js("document.querySelectorAll('.card[data-tag] canvas').length >= 2 && !!window.Chart"):
        fail("the board drew no charts (is Chart.js served at /chart.js?)")
    ok("the board lists run train's epoch_loss and epoch_accuracy with fit's history's values (%d epochs), "
       "charted" % len(hist))
    ov = json.load(open(glob.glob(os.path.join(WORK, "logs/train/plugins/profile/*/*.overview.json"))[0]))
    shown_b = p.js("(document.querySelector('.profile dd.bottleneck') || {}).textContent")
    if shown_b != ov["bottleneck"]:
        fail("the board's bottleneck is %r, the profiler's overview says %r" % (shown_b, ov["bottleneck"]))
    red = p.js("getComputedStyle(document.querySelector('.profile dd.bottleneck')).color")
    if red != "rgb(179, 38, 30)":
        fail("the bottleneck is shown in %s, not red" % red)
    p.wait("[...document.querySelectorAll('.profile img.steps')].every(i => i.complete && i.naturalWidth > 0) && "
           "document.querySelectorAll('.profile canvas').length === 1", 5, "the profile's picture and chart")
    ok("the profile names the overview's bottleneck in red (%s), with its stacked bars and steps picture"
       % ov["bottleneck"][:60])
    p.shot("board.png")
    # the trace, opened in the board's own timeline: every timed event, a lane
    # per thread named as the trace names it, drawn
    tr = json.load(gzip.open(glob.glob(os.path.join(WORK, "logs/train/plugins/profile/*/*.trace.json.gz"))[0]))
    evs = tr["traceEvents"]
    want_x = sum(1 for e in evs if e.get("ph") == "X")
    threads = {"%s:%s" % (e["pid"], e.get("tid")): e["args"]["name"]
               for e in evs if e.get("ph") == "M" and e["name"] == "thread_name"}
    with_x = {"%s:%s" % (e["pid"], e.get("tid")) for e in evs if e.get("ph") == "X"}
    p.js("document.querySelector('.profile button.open-trace').click()")
    p.wait("(t => t.dataset.events || t.dataset.error)(document.querySelector('.profile .trace'))", 15,
           "the trace's timeline")
    err = p.js("document.querySelector('.profile .trace').dataset.error || ''")
    if err:
        fail("the board could not read the trace: %s" % err)
    got = p.js("document.querySelector('.profile .trace').dataset.events")
    if got != str(want_x):
        fail("the timeline shows %s events, the trace has %d timed ones" % (got, want_x))
    lanes = json.loads(p.js("document.querySelector('.profile .trace').dataset.lanes"))
    if len(lanes) != len(with_x):
        fail("the timeline has %d lanes, the trace's events are on %d threads" % (len(lanes), len(with_x)))
    for k in with_x:
        if k in threads and not any(lane.endswith(" · " + threads[k]) for lane in lanes):
            fail("no lane is named %r: %s" % (threads[k], lanes))
    inked = p.js("(() => { const c = document.querySelector('.profile canvas.trace-canvas');"
                 " const d = c.getContext('2d').getImageData(Math.floor(c.width / 4), 0, Math.floor(c.width / 2),"
                 " c.height).data; let k = 0; for (let i = 0; i < d.length; i += 4)"
                 " if (d[i] + d[i + 1] + d[i + 2] < 600) k++; return k; })()")
    if inked < 500:
        fail("the trace's timeline is blank (%d coloured pixels)" % inked)
    ok("the board opens the profile's trace: %d events on %d threads, each lane named as the trace names it"
       % (want_x, len(lanes)))
    p.js("document.querySelector('.profile .trace').scrollIntoView()")
    p.shot("board-trace.png")
    # hostile requests to the board: 4xx, and it goes on serving
    bport = int(os.environ["CONSOLE_BOARD_PORT"])
    for path, want in (("/api/file?i=-1", 400), ("/api/file?i=1234567", 400), ("/api/file?i=999999", 404),
                       ("/api/file?path=/etc/passwd", 400), ("/../../etc/passwd", 404), ("/api/logdir/x", 404)):
        c = http.client.HTTPConnection("127.0.0.1", bport, timeout=5)
        c.request("GET", path)
        got = c.getresponse().status
        c.close()
        if got != want:
            fail("the board answered GET %s with %d, not %d" % (path, got, want))
    c = http.client.HTTPConnection("127.0.0.1", bport, timeout=5)
    c.request("POST", "/api/logdir", body=b"x")
    if c.getresponse().status not in (405, 413):
        fail("the board took a POST")
    c.close()
    ok("the board refuses hostile requests (bad numbers, paths, a POST) with 4xx")
    # a corrupt event file beside the good one: named, with what it could read
    good = sorted(glob.glob(os.path.join(WORK, "logs/train/events.out.tfevents.*.v2")))[0]
    data = bytearray(open(good, "rb").read())
    data[len(data) - 10] ^= 0xff
    with open(os.path.join(WORK, "logs/bad/events.out.tfevents.1.bad.v2") if os.makedirs(
            os.path.join(WORK, "logs/bad"), exist_ok=True) is None else "", "wb") as f:
        f.write(data)
    p.js("document.getElementById('reload').click()")
    p.wait("document.body.dataset.loaded === 'true' && "
           "!!document.querySelector('#bad li[data-file=\"bad/events.out.tfevents.1.bad.v2\"]')", 20,
           "the corrupt file named")
    what = p.js("document.querySelector('#bad li').textContent")
    if "CRC" not in what:
        fail("the corrupt file's line does not say what is wrong: %s" % what)
    if not p.js("!!document.querySelector('.card[data-tag=\"epoch_loss\"] td[data-run=\"bad\"][data-value]')"):
        fail("the records of the corrupt file before the bad byte are not shown")
    ok("a corrupt event file is named (%s), and what it held before the bad byte shown" % what)

    # 6. the heat map a big pod collapses into (#heat forces it): a small square per core, by host
    p.call("Page.navigate", url=URL + "#heat")
    p.wait("!!document.getElementById('grid') && document.getElementById('grid').className === 'heat' && "
           "document.querySelectorAll('.tile').length === 2", 10, "the heat map of the 2 cores still running")
    if p.js("Math.max(...[...document.querySelectorAll('.tile')].map(t => t.getBoundingClientRect().width))") > 12:
        fail("the heat map's squares are wider than 12 px")
    ok("the heat map shows a square per core under its host")
finally:
    chrome.terminate()
    try:
        chrome.wait(10)
    except subprocess.TimeoutExpired:
        chrome.kill()
print("%d passed, 0 failed" % passed)
