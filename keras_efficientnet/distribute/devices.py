"""Local devices for replicas and pipeline stages: GPUs, or logical CPU devices without them."""

from __future__ import annotations

import logging

import tensorflow as tf

log = logging.getLogger(__name__)


def configure_logical_cpus(count: int) -> list[str]:
    """Splits the host CPU into `count` logical devices (tests and CPU benchmarks).

    Must run before TensorFlow initialises its devices (before any op or `list_logical_devices`),
    which is why multi-device tests start a fresh process. Returns all logical CPU devices (at
    least `count`: an earlier split into more devices is kept).
    """
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, received {count!r}")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    # Already split into at least `count` devices (e.g. by a test process): use those.
    if not current or len(current) < count:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
        except RuntimeError as error:
            raise RuntimeError(
                f"cannot split the CPU into {count} logical devices: TensorFlow has already "
                f"initialised its devices ({error}); call configure_logical_cpus() first thing "
                "in a fresh process") from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def local_devices(count: int, what: str) -> list[str]:
    """`count` local device names: the GPUs when there are enough, else logical CPU devices
    (split off here when TensorFlow has not started yet; they share the cores, so a CPU run is
    functional, not a speed-up). `what` names the need in the error ("pipeline stages")."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        names = [d.name for d in tf.config.list_logical_devices("GPU")]
    else:
        names = []
        if count > 1:
            try:
                names = configure_logical_cpus(count)
                log.info("no GPU: %d logical CPU devices share this host's cores", len(names))
            except RuntimeError:
                pass  # TensorFlow started with fewer devices: reported below
        names = names or [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(names) < count:
        kind = "GPUs" if gpus else "CPU devices"
        raise ValueError(
            f"{count} {what} need {count} devices but this process has {len(names)} {kind}; "
            f"use fewer {what}, or (CPU tests) call keras_efficientnet.distribute."
            f"configure_logical_cpus({count}) first thing in the process")
    return names[:count]
