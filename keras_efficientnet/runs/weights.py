"""One grammar for "these weights", one resolver, one verification.

A weights argument (`--weights`, `--init_checkpoint`, `--mode=evaluate`'s weights, the evaluate
and predict commands' model, `EfficientNet.from_preset(RUN)`) is one of:

- `imagenet`: keras.applications' EfficientNet ImageNet weights (G1-BN presets);
- `FILE.h5`: a keras.applications EfficientNet `.h5` file;
- `FILE.keras`: a saved model (a run's `model.keras` or `best.keras`);
- `FILE.weights.h5`: a weights file (a run's `finetuned.weights.h5`);
- `CHECKPOINT`: a checkpoint folder (`RUN/checkpoints/epoch-0003`, `RUN/checkpoints/best`);
- `RUN[:final|best|average|latest]`: a run directory and which of its weights: `final` its
  `model.keras` (the checkpoints' weight average when the run wrote none), `best` its
  `best.keras`, `average` the weight average of its newest intact checkpoint, `latest` that
  checkpoint's raw weights. Without a choice, the entry point's default.

`resolve` turns the argument into a `Weights` and verifies it as far as its form allows: a
checkpoint folder against its manifest (every file's size and SHA-256, the position it was
written for) and never a temporary folder of an interrupted save; a `.keras` file as a zip whose
every member's CRC holds; an `.h5` file by its HDF5 signature. Anything wrong is one
`WeightsError` line naming the file, the reason and the fix. `check` is the cheap part of it
(the grammar and that the path exists), for flag checks before a framework loads.

Plain Python at import; `load` and `donor_model` import Keras when called.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import warnings
import zipfile
import zlib
from pathlib import Path

from keras_efficientnet.atomic import UnsafePathError, open_file
from keras_efficientnet.runs import manifest, record

log = logging.getLogger("keras_efficientnet")

CHOICES = ("final", "best", "average", "latest")
SUFFIXES = (".keras", ".h5", ".hdf5")
GRAMMAR = ("give 'imagenet', a .keras, .weights.h5 or keras.applications .h5 file, a checkpoint "
           "folder, or a run directory RUN[:final|best|average|latest]")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class WeightsError(ValueError):
    """A weights argument that cannot be used: one line naming the file, the reason, the fix."""


@dataclasses.dataclass(frozen=True)
class Weights:
    """Resolved weights.

    Args:
        kind: "imagenet", "h5" (a keras.applications `.h5` file, or a legacy weights file),
            "keras", "weights_h5" or "checkpoint".
        path: the file or checkpoint folder (None for imagenet).
        averaged: for a checkpoint, whether its weight average is meant (where it has one).
        run: the run directory when the argument named one.
        choice: which of the run's weights (`CHOICES`), when a run was named.
    """

    kind: str
    path: Path | None = None
    averaged: bool = True
    run: Path | None = None
    choice: str | None = None

    def describe(self) -> str:
        """What was loaded, as results and summaries name it."""
        if self.kind == "imagenet":
            return "imagenet"
        if self.kind == "checkpoint" and self.averaged:
            return f"{self.path} (weight average)"
        return str(self.path)


def split_choice(spec: str) -> tuple[str, str | None]:
    """(the path, the run's choice or None) of a weights argument."""
    path, colon, choice = spec.rpartition(":")
    if colon and choice in CHOICES and path:
        return path, choice
    return spec, None


def is_run_dir(path: Path) -> bool:
    """Whether `path` holds a run's files (its checkpoints, config.json or model.keras)."""
    files = record.RunFiles(path)
    return path.is_dir() and (files.checkpoints.is_dir() or files.config.is_file()
                              or files.model.is_file())


def is_checkpoint_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in (
        record.MANIFEST, record.STATE, record.WEIGHTS))


def _temporary(path: Path) -> bool:
    return path.name.startswith(record.TEMPORARY)


def check(spec: str, flag: str = "--weights", named: str | None = None) -> None:
    """The grammar and that the path exists (no file is read: cheap, for flag checks).
    WeightsError naming `flag` (or `named`) otherwise."""
    if spec in ("", "imagenet"):
        return
    named = named or f"{flag}={spec!r}"
    path, choice = split_choice(spec)
    path = Path(path)
    suffix_known = path.name.endswith(SUFFIXES) or not path.suffix
    if not os.path.lexists(path):
        if not suffix_known:
            raise WeightsError(f"{named}: {GRAMMAR}")
        raise WeightsError(f"{named}: no such file or folder; {GRAMMAR}")
    if choice is not None and not is_run_dir(path):
        raise WeightsError(f"{named}: {path} is not a run directory (no checkpoints/, "
                           f"config.json or model.keras), so :{choice} names nothing; {GRAMMAR}")
    if not path.is_dir() and not path.name.endswith(SUFFIXES):
        raise WeightsError(f"{named}: not a weights file; {GRAMMAR}")


def resolve(spec: str, *, flag: str = "--weights", default: str = "final",
            named: str | None = None) -> Weights:
    """The verified `Weights` named by `spec` (the module's grammar); `default`: the choice for
    a run directory given without one; `named`: how messages name the argument (default
    `flag=spec`). WeightsError (one line) when it cannot be used."""
    if default not in CHOICES:
        raise ValueError(f"default must be one of {CHOICES}, received {default!r}")
    named = named or f"{flag}={spec!r}"
    check(spec, flag, named)
    if spec == "imagenet":
        return Weights("imagenet")
    if not spec:
        raise WeightsError(f"{flag} is empty; {GRAMMAR}")
    text, choice = split_choice(spec)
    path = Path(text)
    if path.is_dir():
        if _temporary(path):
            raise WeightsError(
                f"{named}: {path} is a temporary folder left by an interrupted save, not a "
                "checkpoint; give a complete checkpoint folder or the run directory")
        if path.parent.name == record.DAMAGED:
            raise WeightsError(f"{named}: {path} was moved to {record.DAMAGED}/ because it failed "
                               "verification; give an intact checkpoint or the run directory")
        if is_checkpoint_dir(path) and not is_run_dir(path):
            return _checkpoint(path, named, averaged=(choice or default) != "latest")
        if is_run_dir(path):
            return _from_run(path, choice or default, named)
        raise WeightsError(f"{named}: {path} is a folder that is neither a run directory nor a "
                           f"checkpoint folder; {GRAMMAR}")
    if not path.is_file():
        raise WeightsError(f"{named}: {path} is not a regular file; {GRAMMAR}")
    return _file(path, named)


def _file(path: Path, named: str) -> Weights:
    name = path.name
    if name.endswith(".keras"):
        _verify_keras(path, named)
        return Weights("keras", path)
    try:
        with open_file(path, "rb", links=True) as f:  # a user's file may be a link
            head = f.read(len(HDF5_SIGNATURE))
    except UnsafePathError as error:  # a pipe would block the read for good
        raise WeightsError(f"{named}: {error}") from None
    except OSError as error:
        raise WeightsError(f"{named}: {path} cannot be read ({error.strerror})") from None
    if head != HDF5_SIGNATURE:
        raise WeightsError(f"{named}: {path} is not an HDF5 file (its first bytes are not "
                           "HDF5's); give a .weights.h5 or keras.applications .h5 file")
    return Weights("weights_h5" if name.endswith(".weights.h5") else "h5", path)


def _verify_keras(path: Path, named: str) -> None:
    """A `.keras` file is a zip with `config.json` and the weights, every member intact."""
    try:
        # Through open_file: a named pipe there would block the read for good.
        with open_file(path, "rb", links=True) as f, zipfile.ZipFile(f) as archive:
            names = set(archive.namelist())
            bad = archive.testzip()  # reads every member: a CRC that does not hold
    except UnsafePathError as error:
        raise WeightsError(f"{named}: {error}") from None
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as error:
        raise WeightsError(f"{named}: {path} is not a readable Keras model file (a .keras "
                           f"file is a zip archive: {str(error).splitlines()[0][:120]}); "
                           "give an intact .keras file, e.g. a run's model.keras") from None
    if bad is not None:
        raise WeightsError(f"{named}: {path} is damaged ({bad} does not match its CRC); give an "
                           "intact .keras file, e.g. a run's model.keras")
    if record.KERAS_ARCHIVE_CONFIG not in names or not any(n.endswith(".h5") for n in names):
        raise WeightsError(f"{named}: {path} is a zip archive but not a Keras model file (no "
                           "config.json and weights); give a .keras file that Keras saved")


def _checkpoint(path: Path, named: str, averaged: bool) -> Weights:
    position = manifest.position_of(path)
    if position is None:  # `best` or a renamed copy: the position its manifest states
        try:
            stated = manifest.read_manifest(path)
            position = (stated.get("epoch"), stated.get("batch"))
        except (OSError, ValueError):
            position = None  # verify names the manifest's problem
    reason = manifest.verify(path, position=position)
    if reason:
        raise WeightsError(f"{named}: checkpoint {path} is damaged: {reason}; give an intact "
                           "checkpoint (or the run directory, whose newest intact one is "
                           "used), or restore it from a backup")
    return Weights("checkpoint", path, averaged=averaged)


def _from_run(run: Path, choice: str, named: str) -> Weights:
    files = record.RunFiles(run)
    if choice == "best":
        if not files.best_model.is_file():
            raise WeightsError(f"{named}: no {files.best_model} (the run validated nothing: "
                               "--eval_every=0, or it stopped before its first validation)")
        record.BestRecord.read(files.best_record)  # an unreadable record stops here
        _verify_keras(files.best_model, named)
        return Weights("keras", files.best_model, run=run, choice=choice)
    if choice == "final":
        if files.model.is_file():
            _verify_keras(files.model, named)
            return Weights("keras", files.model, run=run, choice=choice)
        log.info("no %s (the run did not finish): its latest checkpoint's weight average",
                 files.model)
    latest = _newest_intact(files.checkpoints, named)
    return Weights("checkpoint", latest, averaged=choice != "latest", run=run, choice=choice)


def _newest_intact(directory: Path, named: str) -> Path:
    """The newest checkpoint in `directory` that is intact and was written while the loss
    looked healthy (as a resume picks it; nothing is moved). A damaged newer one is skipped
    with a warning; WeightsError naming it when none is intact."""
    damaged = []
    for path in reversed(manifest.checkpoint_folders(directory)):
        reason = manifest.verify(path)
        if reason:
            damaged.append(f"checkpoint {path} is damaged: {reason}")
        elif manifest.is_healthy(path):
            for line in damaged:
                log.warning("%s: %s; using the newest intact one, %s", named, line, path)
            return path
    if damaged:
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise WeightsError(f"{named}: {damaged[0]}{more}, and the run has no intact one; "
                           "restore it from a backup, or give another run or checkpoint")
    raise WeightsError(f"{named}: no intact checkpoint in {directory}; give the run's "
                       "model.keras or a checkpoint folder")


def run_preset(run: str | os.PathLike, choice: str = "final") -> tuple[Weights, str, dict]:
    """(the verified weights `RUN:choice` names, the run's preset, the constructor arguments
    of its model: classes, test resolution, dropout and stochastic depth) from its config.json;
    a softmax classifier, as the run's model.keras. WeightsError when the run has none."""
    spec = f"{run}:{choice}"
    weights = resolve(spec, flag="preset", default=choice, named=f"preset {spec!r}")
    config = record.RunConfig.read(record.RunFiles(run).config)
    if config is None:
        raise WeightsError(f"preset {spec!r}: the run has no {record.CONFIG} (runs of this "
                           "version write one), so its architecture is unknown; load its "
                           f"{record.MODEL} with keras.models.load_model")
    trained = config.config
    arguments = {"classes": config.num_classes,
                 "input_shape": (config.test_resolution, config.test_resolution, 3),
                 "drop_connect_rate": trained.get("drop_connect_rate", 0.2)}
    if trained.get("dropout_rate", -1) >= 0:
        arguments["dropout_rate"] = trained["dropout_rate"]
    return weights, trained["model"], arguments


def checkpoint_state(weights: Weights) -> record.CheckpointState:
    """The state record of a checkpoint `weights` (its config and classes)."""
    return record.CheckpointState.read(weights.path / record.STATE, missing_ok=False)


def load(weights: Weights, model, *, named: str | None = None, target: str | None = None,
         slots: list | None = None) -> str:
    """Loads `weights` into `model` exactly (the same architecture and classes); returns what
    was loaded (`Weights.describe`). `slots`, a list, receives the optimizer slots averaged with
    a checkpoint's weights. ValueError naming the source (`named`, default its path) and the
    model (`target`, e.g. "--model=NAME"; default its preset) when they do not fit."""
    if weights.kind in ("imagenet", "h5") and is_keras_applications(weights):
        from keras_efficientnet.models import pretrained

        pretrained.load_weights(model, "imagenet" if weights.path is None else str(weights.path))
        return weights.describe()
    if weights.kind == "checkpoint":
        return _load_checkpoint(weights, model, slots)
    # Keras warns of the layers it skips before it raises for them: the one-line error says it,
    # so the warnings are kept back and shown only when the load succeeds.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.load_weights(weights.path)
        except ValueError as error:
            target = target or f"--model={_preset_of(model)}"
            raise ValueError(f"{named or weights.path} does not fit {target} with "
                             f"{model.output_shape[-1]} classes: "
                             f"{_load_error_line(str(error))}") from None
    for warning in caught:
        warnings.warn(warning.message, warning.category, stacklevel=2)
    return weights.describe()


def _load_error_line(text: str) -> str:
    """Keras's load error in one line: its count of objects, the first one's layer and the two
    shapes where it says them (it prints the variable's values too)."""
    first = text.strip().splitlines()[0] if text.strip() else "the weights do not fit"
    layer = re.search(r"for object <(\w+) name=([^,>]+)", first)
    if layer is None or " Example error message" not in first:
        return first
    line = (f"{first.split(' Example error message')[0].rstrip('.')}: layer "
            f"{layer.group(2)!r} ({layer.group(1)})")
    shapes = re.search(r"variable\.shape=(\([^)]*\)), Received: value\.shape=(\([^)]*\))", text)
    if shapes is not None:
        line += f" holds {shapes.group(1)}, the file {shapes.group(2)}"
    return line


def _preset_of(model) -> str:
    from keras_efficientnet.models.presets import preset_name

    config = model.get_config()
    return (preset_name(config) if "variant" in config else None) or model.name


def _load_checkpoint(weights: Weights, model, slots: list | None) -> str:
    """The checkpoint's weights (the model's variables: no optimizer or generator state), or
    its weight average where asked and saved."""
    model.load_weights(weights.path / record.WEIGHTS)
    average = weights.path / record.AVERAGE
    if not (weights.averaged and average.is_file()):
        return str(weights.path)
    import numpy as np

    with np.load(average) as data:
        arrays = [data[f"arr_{i}"] for i in range(len(data.files))]
    # The average's arrays: the model's weights, then the optimizer's slots (SlotAverage).
    model.set_weights([a.astype(w.dtype) for a, w in zip(arrays, model.get_weights())])
    if slots is not None:
        slots.extend(arrays[len(model.weights):])
    return weights.describe()


def is_keras_applications(weights: Weights) -> bool:
    """Whether `weights` are keras.applications' (imagenet, or its legacy HDF5 layout)."""
    # keras.applications' (legacy HDF5) files list their layers in a `layer_names` attribute;
    # Keras 3's .weights.h5 files do not.
    if weights.kind == "imagenet":
        return True
    import h5py

    with h5py.File(weights.path, "r") as f:
        return "layer_names" in f.attrs or "layer_names" in f.get("model_weights", {}).attrs


def donor_model(weights: Weights, like):
    """A model holding `weights`, for a copy by variable path into another (a warm start):
    the saved model itself for a `.keras` file, else a clone of `like` loaded with them."""
    import keras

    from keras_efficientnet.registration import load_model

    if weights.kind == "keras":
        return load_model(weights.path, compile=False)
    donor = keras.models.clone_model(like)
    load(weights, donor)
    return donor

