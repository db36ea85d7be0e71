"""Shared pytest setup: quiet TensorFlow logs (the repository is on sys.path through setup.cfg's
`pythonpath = .`, so tests import `tests.*` and `benchmarks.*` as packages)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def pytest_collection_modifyitems(session, config, items):
    # The multi-process distribute tests wait on subprocesses started with the first test
    # (tests/distribute/conftest.py): run them last, so that the rest of the suite overlaps
    # their minute of work instead of waiting for it.
    items.sort(key=lambda item: "test_distribute_multiprocess" in item.nodeid)
