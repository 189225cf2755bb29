"""examples/python/fashion_mnist.py, the C example's port to the tpuemu
package's C layer, trains bit for bit as the C binary does: same seed,
deterministic mode, same cluster, the same history."""
import os
import subprocess
import sys

import pytest

from conftest import DATA

SRC = os.environ.get("TPUEMU_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ["TPUEMU_BIN"]


def _history(path):
    rows = []
    with open(path) as f:
        for line in f:
            e, loss, acc = line.split()
            rows.append((int(e), float.fromhex(loss), float.fromhex(acc)))
    return rows


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")),
                    reason="needs dataset-fashion-mnist")
def test_python_port_history_is_bitwise_the_c_binarys(cluster, tmp_path):
    args = ["--tpu", cluster.tpu, "--epochs", "2", "--deterministic", "--seed", "7"]
    c = subprocess.run([os.path.join(BIN, "fashion_mnist")] + args + ["--history", str(tmp_path / "c.txt"),
                       "--logdir", str(tmp_path / "clogs")], capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stdout[-2000:] + c.stderr[-2000:]
    p = subprocess.run([sys.executable, os.path.join(SRC, "examples", "python", "fashion_mnist.py")] + args +
                       ["--history", str(tmp_path / "py.txt"), "--logdir", str(tmp_path / "plogs")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    hc, hp = _history(tmp_path / "c.txt"), _history(tmp_path / "py.txt")
    assert len(hc) == 2
    assert hp == hc  # every loss and accuracy, bit for bit
    # and the same evaluation, as printed
    last = lambda out: [l for l in out.splitlines() if l.startswith("test ")]
    assert last(p.stdout) == last(c.stdout) and len(last(c.stdout)) == 2
