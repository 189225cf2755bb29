"""Fixtures of the Python suite: a local cluster per module (4 cores: 2 hosts x 2)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cluster import LocalCluster  # noqa: E402

DATA = os.environ.get("TPUEMU_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture
def tpu_env(cluster, monkeypatch):
    """TPU_NAME pointing at the module's cluster, as a user's shell would."""
    monkeypatch.setenv("TPU_NAME", "grpc://" + cluster.tpu)
    return cluster
