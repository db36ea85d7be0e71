"""A run directory as a preset: its files and records (`record`), its checkpoints' names and
manifests (`manifest`), the one grammar and resolver of "these weights" (`weights`), and
`open_run(path)`, a run's config, history, best record and models (loaded on first use).

Plain Python at import: `record`, `manifest` and the resolver's checks load no framework.
"""

from keras_efficientnet.lazy import lazy_face

_EXPORTS = {
    "open_run": (".run", "open_run"),
    "Run": (".run", "Run"),
    "RunFiles": (".record", "RunFiles"),
    "WeightsError": (".weights", "WeightsError"),
    "resolve": (".weights", "resolve"),
    "record": (".record", None),
    "manifest": (".manifest", None),
    "weights": (".weights", None),
}

__all__ = [*_EXPORTS]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
