"""Shared pytest setup: quiet TensorFlow logs (the repository is on sys.path through setup.cfg's
`pythonpath = .`, so tests import `tests.*` and `benchmarks.*` as packages)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


# Files whose tests wait minutes on subprocesses (the benchmark modules' smoke runs, the
# multi-device and multi-worker runs).
SUBPROCESS_FILES = ("tests/benchmarks/test_benchmark_smoke.py",
                    "tests/distribute/test_distribute_multiprocess.py")


def pytest_collection_modifyitems(session, config, items):
    if "PYTEST_XDIST_WORKER" in os.environ:
        # Under pytest-xdist (make test: 2 workers, a file at a time) these files go first: the
        # other worker runs the rest meanwhile, and no worker is left alone with one at the end.
        items.sort(key=lambda item: not item.nodeid.startswith(SUBPROCESS_FILES))
        return
    # In one process the multi-process distribute tests wait on subprocesses started with the
    # first test (tests/distribute/conftest.py): run them last, so that the rest of the suite
    # overlaps their minute of work instead of waiting for it.
    items.sort(key=lambda item: "test_distribute_multiprocess" in item.nodeid)
