"""The cluster tier's machine: a GlusterFS volume served from a tmpfs brick, a small one to fill, and
two emulated nodes mounting both (tests/support/systems/cluster.py). Made once per client caching setting
(``CACHING_S``), the whole tier run under each; each test clears the volumes' contents when it is
done."""

from __future__ import annotations

import pytest

from support.systems import cluster as emulated


@pytest.fixture(scope="session", params=list(emulated.CACHING_S))
def volumes(request):
    """The volumes, mounted with each client caching setting in turn (every test runs under each)."""
    reason = emulated.unavailable()
    if reason:
        pytest.skip(reason)
    made = []
    try:
        made.append(emulated.Volume("shared", size_mb=1024, caching=request.param))
        made.append(emulated.Volume("small", size_mb=24, caching=request.param))
        yield made
    finally:
        for volume in reversed(made):
            volume.close()


@pytest.fixture(scope="session")
def nodes(volumes):
    names = ["node1", "node2"]
    made = []
    try:
        for name in names:
            made.append(emulated.Node(name, volumes, names))
        yield made
    finally:
        for node in made:
            node.close()


@pytest.fixture
def cluster(volumes, nodes):
    """Two nodes sharing the ``shared`` volume, which is empty when the test starts and ends."""
    shared = volumes[0]
    shared.clear()
    yield emulated.Cluster(shared, nodes)
    shared.clear()


@pytest.fixture
def small_volume(volumes):
    """The 24 MB volume, for filling (empty when the test starts and ends)."""
    volumes[1].clear()
    yield volumes[1]
    volumes[1].clear()
