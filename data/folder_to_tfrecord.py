"""Kept so that `python -m data.folder_to_tfrecord` and scripts that load this file still work:
the converter is `keras_efficientnet.cli.folder_to_tfrecord`, installed as the console script
`keras-efficientnet-folder-to-tfrecord`."""

from keras_efficientnet.cli.folder_to_tfrecord import convert, main, run  # noqa: F401

if __name__ == "__main__":
    run()
