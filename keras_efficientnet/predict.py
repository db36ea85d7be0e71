"""`python -m keras_efficientnet.predict`: the predict command at its first path, kept so that
scripts, flagfile headers and notebooks that name it keep working. The command lives in
`keras_efficientnet.cli.predict` with the others (console script `keras-efficientnet-predict`)."""

from keras_efficientnet.cli.predict import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    run()
