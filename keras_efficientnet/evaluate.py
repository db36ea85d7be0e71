"""`python -m keras_efficientnet.evaluate`: the evaluate command at its first path, kept so that
scripts, flagfile headers and notebooks that name it keep working. The command lives in
`keras_efficientnet.cli.evaluate` with the others (console script `keras-efficientnet-evaluate`)."""

from keras_efficientnet.cli.evaluate import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    run()
