import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

#: multiply iteration counts of the concurrency tests (RELAXED_TEST_SCALE=10 for a soak)
SCALE = float(os.environ.get("RELAXED_TEST_SCALE", "1"))


def scaled(n: int) -> int:
    return max(1, int(n * SCALE))


def shm_names():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("rlx_")}
    except FileNotFoundError:  # pragma: no cover
        return set()


@pytest.fixture
def no_shm_leak():
    """Fails the test if it leaves a new relaxed segment in /dev/shm."""
    before = shm_names()
    yield
    import gc
    gc.collect()
    leaked = shm_names() - before
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"
