"""Local clusters for the Python tests: a resolver and workers on loopback.

Ports are claimed as the shell and C tests claim theirs: a port below the
ephemeral range, locked with flock on /tmp/tpuemu-test-ports-UID/PORT for as
long as this process lives, so parallel runs in other trees never collide.
"""
import fcntl
import os
import random
import socket
import subprocess
import time

BIN = os.environ.get("TPUEMU_BIN")


def claim_port():
    d = "/tmp/tpuemu-test-ports-%d" % os.getuid()
    os.makedirs(d, exist_ok=True)
    for _ in range(1000):
        port = random.randint(20000, 31999)
        fd = os.open(os.path.join(d, str(port)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            os.close(fd)
            continue
        finally:
            s.close()
        _claims.append(fd)  # held until the process exits
        return port
    raise RuntimeError("no free loopback port in 20000-31999")


_claims = []


class LocalCluster:
    """tpu-resolver and hosts x cores tpu-workers (v3), like local_cluster.sh; heartbeats every
    second (no test here times a death, and a loaded machine must not make a core look dead)."""

    def __init__(self, workdir, hosts=2, cores=2, heartbeat_ms=1000, name=None, init=True):
        self.workdir = str(workdir)
        self.procs = []
        self.hosts, self.cores = hosts, cores
        for _ in range(5):
            self.port = claim_port()
            self.tpu = "127.0.0.1:%d" % self.port
            args = [os.path.join(BIN, "tpu-resolver"), "--listen", self.tpu, "--heartbeat-ms", str(heartbeat_ms)]
            if name:
                args += ["--name", name]
            log = open(os.path.join(self.workdir, "resolver.log"), "ab")
            p = subprocess.Popen(args, stderr=log, stdout=log)
            if self._wait_listening(p):
                self.procs.append(p)
                break
            p.terminate()
            p.wait()
        else:
            raise RuntimeError("tpu-resolver did not start")
        self.workers = {}
        for h in range(hosts):
            for c in range(cores):
                self.start_worker(h, c)
        if init:
            self.tpuctl("init", "--expect", str(hosts * cores), "--timeout-ms", "20000")

    def start_worker(self, h, c):
        log = open(os.path.join(self.workdir, "worker-%d-%d.log" % (h, c)), "ab")
        p = subprocess.Popen([os.path.join(BIN, "tpu-worker"), "--resolver", self.tpu, "--host-id", "host%d" % h,
                              "--core", str(c), "--tpu-type", "v3"], stderr=log, stdout=log)
        self.procs.append(p)
        self.workers[(h, c)] = p
        return p

    def _wait_listening(self, p):
        for _ in range(100):
            if p.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def tpuctl(self, *args, timeout=60):
        return subprocess.run([os.path.join(BIN, "tpuctl"), "--tpu", self.tpu] + list(args), check=True,
                              capture_output=True, text=True, timeout=timeout).stdout

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
