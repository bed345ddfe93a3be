from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_cluster import RedisCluster, redis_cluster

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The ledger spills records Redis could not take to $XDG_STATE_HOME/switchyard/ and replays them at the
# next start with the same key prefix (gateway/ledger/spill.py): give the test session, and every gateway
# it starts, a state folder of its own, so no run replays another's records or leaves any behind.
_STATE = tempfile.mkdtemp(prefix="switchyard-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE
# Removed when the process ends: pytest-xdist's controller imports this file too but runs no session
# fixture, so the fixture below alone left the controller's folder behind at every run.
atexit.register(shutil.rmtree, _STATE, True)


# A gateway built with the default settings makes its batch file store, `switchyard-files/` in the current
# folder, when it starts (so a folder it cannot write fails at once); the tests that only build one leave it
# empty behind them in the checkout, and the session takes it away again.
_DEFAULT_FILES = Path.cwd() / "switchyard-files"
_FILES_WERE_THERE = _DEFAULT_FILES.exists()


@pytest.fixture(scope="session", autouse=True)
def _private_state_home() -> Iterator[None]:
    yield
    shutil.rmtree(_STATE, ignore_errors=True)
    if not _FILES_WERE_THERE:
        with contextlib.suppress(OSError):  # only when empty: files a test stored there should be seen
            _DEFAULT_FILES.rmdir()


@pytest.fixture(scope="session")
def cluster_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real three-node Redis Cluster (tests/redis_cluster.py), started once, when a test first asks."""
    with redis_cluster(under=tmp_path_factory.getbasetemp()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def cluster_redis_replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A Redis Cluster of three primaries, each with a replica, that fails a silent primary over after
    1 s (`cluster-node-timeout`): for the failover tests, which kill nodes, so it is not `cluster_redis`."""
    under = tmp_path_factory.getbasetemp()
    with redis_cluster(under=under, replicas=1, node_timeout_ms=1000) as cluster:
        yield cluster
