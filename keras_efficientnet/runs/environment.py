"""Where a run or a benchmark figure was computed: the CPU, Keras and its backend and, under
TensorFlow, whether oneDNN was on.

TensorFlow turns oneDNN on by itself on some x86 CPUs (AVX-512 with VNNI) and leaves it off on
others (AVX2-only), unless `TF_ENABLE_ONEDNN_OPTS` says otherwise; the same recipe then trains at
a different speed and through other kernels. A run's `results.json` and every benchmark row say
which it was, measured in the process that trained, never guessed from the CPU.

Plain Python: only frameworks this process has already imported are asked for their versions,
so reading the environment never loads TensorFlow.
"""

from __future__ import annotations

import os
import platform
import sys

from keras_efficientnet.atomic import UnsafePathError, open_file


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` says, else 'unknown'."""
    try:
        with open_file("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except (OSError, UnsafePathError):  # not Linux, or not a plain file there
        pass
    return platform.processor() or "unknown"


def onednn_enabled() -> bool | None:
    """Whether TensorFlow runs its oneDNN kernels in this process: TensorFlow's own answer, from
    the environment variable and the CPU. None where TensorFlow is not loaded or cannot say."""
    if "tensorflow" not in sys.modules:
        return None
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    probe = getattr(_pywrap_util_port, "IsMklEnabled", None)
    return bool(probe()) if probe is not None else None


def environment(libraries: tuple[str, ...] = ()) -> dict:
    """CPU, cores, Python, Keras, its backend, the versions of the frameworks this process has
    imported and of `libraries` where imported (a benchmark names its peers, e.g. timm) and,
    under TensorFlow, `onednn` (True or False)."""
    info: dict = {"cpu": cpu_model(), "cores": os.cpu_count(),
                  "python": platform.python_version()}
    keras = sys.modules.get("keras")
    if keras is not None:
        info["keras"] = keras.__version__
        info["backend"] = keras.backend.backend()
    for name in ("tensorflow", "jax", "torch", *libraries):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            info[name] = module.__version__
    onednn = onednn_enabled()
    if onednn is not None:
        info["onednn"] = onednn
    return info
