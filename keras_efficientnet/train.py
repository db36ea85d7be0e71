"""`python -m keras_efficientnet.train --flagfile=flags/NAME.flags`: the training command."""

from __future__ import annotations

import logging
import sys

from absl import app, flags

from keras_efficientnet.cli.flags import config_from_flags, define_flags

define_flags()


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; every setting is a --flag")
    try:
        config = config_from_flags(flags.FLAGS)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # tf.distribute logs every all-reduce it plans at INFO; keep the run's output readable.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    print(config.plan.describe(), flush=True)  # the plan and its global batch, first
    from keras_efficientnet.distribute import run

    try:
        run(config)
    except (ValueError, ImportError, ConnectionError) as error:
        # Bad input, a missing backend package or an unreachable peer: one clear line.
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def run() -> None:
    """Console-script entry point (`keras-efficientnet-train`)."""
    app.run(main)


if __name__ == "__main__":
    run()
