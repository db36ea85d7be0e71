"""`python -m keras_efficientnet.folder_to_tfrecord`: the converter's command at its first path,
kept so that scripts and notes that name it keep working. The command lives in
`keras_efficientnet.cli.folder_to_tfrecord` with the others (console script
`keras-efficientnet-folder-to-tfrecord`)."""

from keras_efficientnet.cli.folder_to_tfrecord import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    run()
