"""`python -m keras_efficientnet.train`: the train command at its first path, kept so that
scripts, flagfile headers and notebooks that name it keep working. The command lives in
`keras_efficientnet.cli.train` with the others (console script `keras-efficientnet-train`)."""

from keras_efficientnet.cli.train import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    run()
