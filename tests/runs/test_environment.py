"""runs/environment names only the libraries this process has imported: the frameworks always,
a benchmark's peers (timm) only where the caller asks."""

from __future__ import annotations

import sys
import types

from keras_efficientnet.runs.environment import environment


def test_a_named_library_is_recorded_only_where_asked_and_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "peerlib", types.SimpleNamespace(__version__="1.2.3"))
    assert environment(libraries=("peerlib",))["peerlib"] == "1.2.3"
    assert "peerlib" not in environment()  # a run's results.json names no peer library
    monkeypatch.delitem(sys.modules, "peerlib")
    assert "peerlib" not in environment(libraries=("peerlib",))  # not imported: not named
