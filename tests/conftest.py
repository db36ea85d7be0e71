"""Shared pytest setup: quiet TensorFlow logs and make the repository importable."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_collection_modifyitems(session, config, items):
    # The multi-process distribute tests wait on subprocesses started with the first test
    # (tests/distribute/conftest.py): run them last, so that the rest of the suite overlaps
    # their minute of work instead of waiting for it.
    items.sort(key=lambda item: "test_distribute_multiprocess" in item.nodeid)
