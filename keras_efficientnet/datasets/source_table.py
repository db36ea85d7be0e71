"""The table of dataset source kinds (`kind` or `kind:argument`), in plain Python.

`--dataset` is parsed and checked against it before TensorFlow loads (the training config, the
evaluate command), so that a misspelt kind is refused in one line before a run directory is
touched. Each row names its reader class by module path; `sources.create_reader` imports it
(with TensorFlow) only when data is read. A new source is one reader module and one row here.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os

SOURCES_PACKAGE = "keras_efficientnet.datasets.sources"


@dataclasses.dataclass(frozen=True)
class SourceKind:
    """One kind of dataset source.

    Args:
      reader: its `sources.base.Reader` subclass as `module:Class`; a module name with a
        leading dot is relative to `keras_efficientnet.datasets.sources`.
      usage: how the source is written, e.g. "'folder:PATH'".
      example: for kinds that take an argument, an example source; None: it takes none.
      local_folder: the argument is a local folder of `<split>/<class>/` images (checked to
        exist before TensorFlow loads).
    """

    reader: str
    usage: str
    example: str | None = None
    local_folder: bool = False

    def reader_class(self) -> type:
        """The reader class (imports its module, and TensorFlow with it)."""
        module, _, name = self.reader.partition(":")
        return getattr(importlib.import_module(module, SOURCES_PACKAGE), name)


SOURCE_TABLE: dict[str, SourceKind] = {
    "synthetic": SourceKind(".synthetic:SyntheticReader", "'synthetic'"),
    "digits": SourceKind(".digits:DigitsReader", "'digits'"),
    "fashion_mnist": SourceKind(".fashion_mnist:FashionMnistReader", "'fashion_mnist'"),
    "folder": SourceKind(".folder:FolderReader", "'folder:PATH'", "folder:/data/photos",
                         local_folder=True),
    "tfds": SourceKind(".tfds:TfdsReader", "'tfds:NAME'", "tfds:imagenet2012"),
    "tfrecord": SourceKind(".tfrecord:TFRecordReader", "'tfrecord:PATTERN'",
                           "tfrecord:/data/imagenet-tfrecords"),
}


def valid_sources() -> str:
    """The table's kinds as the error messages list them."""
    return ", ".join(kind.usage for kind in SOURCE_TABLE.values())


def parse_source(source: str) -> tuple[str, str]:
    """Splits `'kind:argument'` into `(kind, argument)`; checks the kind and its argument
    against `SOURCE_TABLE` (ValueError naming the valid sources)."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"dataset source must be a non-empty string, got {source!r}; "
                         f"valid: {valid_sources()}")
    kind, _, argument = source.partition(":")
    if kind not in SOURCE_TABLE:
        close = difflib.get_close_matches(kind, SOURCE_TABLE, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown dataset source {source!r}; {hint}valid: {valid_sources()}")
    example = SOURCE_TABLE[kind].example
    if example is None and argument:
        raise ValueError(f"source {kind!r} takes no argument, got {source!r}")
    if example is not None and not argument:
        raise ValueError(f"source {source!r} needs an argument after the colon, "
                         f"e.g. {example!r}; valid: {valid_sources()}")
    return kind, argument


def local_folder_problem(source: str, splits: tuple[str, ...] = (), hold_out=None
                         ) -> str | None:
    """Why `splits` of `source` cannot be read, where that is cheap to tell before TensorFlow
    loads (a local image folder that is not there, or lacks a split: `folder_layout`), else
    None; ValueError for a source `parse_source` refuses. `hold_out`: a
    `datasets.options.HoldOut` (--validation_split)."""
    missing = missing_local_folder(source, splits[0] if splits else "<split>")
    kind, argument = parse_source(source)
    if missing or not SOURCE_TABLE[kind].local_folder or "://" in argument:
        return missing
    from keras_efficientnet.datasets.folder_layout import check_splits

    try:
        check_splits(argument, splits, hold_out)
    except (ValueError, OSError) as error:
        return str(error)
    return None


def missing_local_folder(source: str, split: str = "<split>") -> str | None:
    """Why `source` cannot be read, where that is cheap to tell before TensorFlow loads (a local
    image folder that is not there), else None; ValueError for a source `parse_source`
    refuses."""
    kind, argument = parse_source(source)
    if SOURCE_TABLE[kind].local_folder and "://" not in argument and not os.path.isdir(
            argument):
        return (f"image folder {argument!r} does not exist; expected the layout "
                f"{argument}/{split}/<class>/*.jpg (or .png)")
    return None
