"""The tpuemu layer (the C library one to one) for cluster tooling: spec and
health, topology, collectives over numpy arrays, chaos, profile capture, and
the capture_tpu_profile console script."""
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tpuemu
import tpuemu.tf as tf

SRC = os.environ.get("TPUEMU_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def cluster_h(cluster):
    c = tpuemu.Cluster(cluster.tpu)
    c.initialize_system(expect=4)
    return c


def test_spec_health_and_topology(cluster, cluster_h):
    spec = cluster_h.spec()
    assert [core.name for core in spec.cores] == ["host0/0", "host0/1", "host1/0", "host1/1"]
    assert all(core.state_name == "READY" for core in spec.cores)
    assert spec.health() == "HEALTHY"
    assert spec.core_health(0)[0] == "HEALTHY"
    assert spec.as_dict()["worker"] and len(spec.tasks) == 2
    t = cluster_h.topology
    assert t.num_replicas == 4 and t.num_tasks == 2 and t.num_tpus_per_task == 2
    assert t.device_coordinates.shape == (2, 2, 4)
    t2 = tf.tpu.experimental.Topology(serialized=t.serialized())
    assert list(t2.mesh_shape) == list(t.mesh_shape) and t2.num_tasks == 2
    assert cluster_h.num_accelerators() == 2


def test_collectives_over_numpy(cluster_h):
    n = cluster_h.num_replicas
    bufs = [np.full(1000, r + 1, dtype=np.float32) for r in range(n)]
    cluster_h.all_reduce(bufs, op="sum")
    for b in bufs:
        np.testing.assert_array_equal(b, np.full(1000, n * (n + 1) / 2, dtype=np.float32))
    bufs = [np.arange(8, dtype=np.float32) * (r + 1) for r in range(n)]
    got = cluster_h.all_gather(bufs)
    for g in got:
        np.testing.assert_array_equal(g, np.concatenate(bufs))
    bufs = [np.full(8, 3.0, np.float32) if r == 2 else np.zeros(8, np.float32) for r in range(n)]
    cluster_h.broadcast(bufs, root=2)
    assert all((b == 3.0).all() for b in bufs)
    st = cluster_h.last_collective()
    assert st["num_replicas"] == n and st["num_failed"] == 0
    with pytest.raises(tf.errors.InvalidArgumentError):
        cluster_h.all_reduce([np.zeros(4, np.float32)] * (n - 1))


def test_chaos_and_its_errors(cluster, cluster_h):
    with pytest.raises(tf.errors.InvalidArgumentError) as ei:
        cluster_h.inject_fault("host0", 0, "no-such-fault")
    assert isinstance(ei.value, ValueError)
    with pytest.raises(tf.errors.NotFoundError):
        cluster_h.inject_fault("host9", 0, "slow", percent=50, duration_ms=1000)
    cluster_h.inject_fault("host0", 1, "slow", percent=50, duration_ms=1000)


def test_profile_capture_and_console_script(cluster, cluster_h, tmp_path):
    p = cluster_h.profile(200)
    assert p.num_cores == 4
    path = p.write(str(tmp_path / "a"))
    assert path.endswith(".trace.json.gz") and os.path.exists(path)
    json.loads(gzip.open(path).read())
    script = os.path.join(os.environ["TPUEMU_BIN"], "capture_tpu_profile")
    r = subprocess.run([sys.executable, script, "--tpu", cluster.tpu, "--logdir", str(tmp_path / "b"),
                        "--duration_ms", "200"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Profile written to " in r.stdout
    assert os.listdir(tmp_path / "b" / "plugins" / "profile")
    bad = subprocess.run([sys.executable, script, "--tpu", "127.0.0.1:1", "--logdir", str(tmp_path / "c")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "UnavailableError" in bad.stderr
