"""One frozen value that says what an input pipeline reads and how (plain Python, no TensorFlow).

A trainer builds it once from its config (`training.trainer.input_options`) and varies only the
phase fields (split, resolution, batch, training) between training, fine-tuning and evaluation,
as Model Garden's input readers take one `DataConfig`. The crop constants live here, so that
the training config and `predict` can use them before TensorFlow loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import operator
import os
from dataclasses import dataclass

# Inception-style random crop (Szegedy et al. 2015) with the constants of Graphcore's (and
# TensorFlow's official ResNet) ImageNet pipeline (docs/recipes.md).
AREA_RANGE = (0.05, 1.0)
ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)
# Evaluation resizes the short side to image_size * 256 / 224, then centre-crops image_size
# (the ImageNet convention; the one place this ratio is written).
EVAL_RESIZE_RATIO = 256.0 / 224.0
# Files an image folder (and `predict`'s folder argument) may hold, compared lower-case.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
CUTMIX_VERSIONS = (1, 2)


# The hold-out's hash key: the same held-out images whatever the run's --seed.
HOLD_OUT_SEED = 0


@dataclass(frozen=True)
class HoldOut:
    """The held-out split carved out of the pool split where the folder has none.

    Args:
      fraction: in (0, 1): the share of each class's images held out, rounded half up, at
        least one image of each class left to train on.
      pool: the split folder (or, for a plain folder of class folders, the name of its one
        pool) it comes out of: the training split; reading the pool gives the rest.
      seed: keys the hash that ranks the images (`HOLD_OUT_SEED`).

    Example:
      >>> HoldOut(0.2).count(7)   # of a class with 7 images, 1.4 rounds to 1
      1
    """

    fraction: float
    pool: str = "train"
    seed: int = HOLD_OUT_SEED

    def __post_init__(self):
        if not 0.0 < self.fraction < 1.0:  # NaN fails too
            raise ValueError(f"--validation_split must be in (0, 1) (a fraction of each class "
                             f"held out), received {self.fraction}")

    def count(self, images: int) -> int:
        """Images held out of a class of `images`: fraction x images rounded half up, at most
        `images - 1` (every class keeps one training image)."""
        return max(0, min(images - 1, math.floor(self.fraction * images + 0.5)))

    def held_out(self, relative_paths: list[str]) -> set[str]:
        """The held-out members of one class's `relative_paths` (paths inside the pool
        folder, '/'-separated): the `count` of them whose keyed hash ranks lowest."""
        key = str(self.seed).encode()
        ranked = sorted(relative_paths, key=lambda p: (
            hashlib.blake2b(p.encode("utf-8", "surrogateescape"), key=key,
                            digest_size=8).digest(), p))
        return set(ranked[:self.count(len(relative_paths))])


def _positive_int(name: str, value) -> None:
    try:
        valid = operator.index(value) >= 1  # ints and NumPy integers
    except TypeError:
        valid = False
    if not valid:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class InputOptions:
    """What `make_dataset` reads and how: images uint8 `[b, size, size, 3]`, labels int32 `[b]`
    or float32 one-hot `[b, classes]`.

    Args:
      source: 'synthetic', 'digits', 'fashion_mnist', 'folder:PATH', 'tfds:NAME' or
        'tfrecord:PATTERN' (`datasets.source_table.SOURCE_TABLE`).
      split: split name, e.g. 'train' or 'validation'.
      image_size: output height and width.
      batch_size: global batch size; with an `input_context` each pipeline yields
        `input_context.get_per_replica_batch_size(batch_size)`.
      training: shuffle (and augment) if True; evaluation order and preprocessing otherwise.
      augment: random crop + flip + mixing if True, else resize + centre crop; None = `training`.
        `training=True, augment=False` is the fine-tune input: shuffled training images with
        evaluation preprocessing.
      random_flip: random horizontal flips when augmenting (off for digits and text).
      data_dir: tfds data dir, the root `digits` is written under (default: see
        `sources.default_data_dir`), or the folder of the Fashion-MNIST files.
      num_classes: needed for one-hot labels where the source does not record it (tfrecord
        without dataset_info.json); for 'synthetic' it sets the label range (default 1000).
      mixup_alpha: Beta(alpha, alpha) Mixup per example, 0 = off.
      cutmix_lambda: CutMix nominal kept fraction in (0, 1), None or 0 = off.
      cutmix_version: 1 draws each batch's kept fraction from `cutmix_lambda` (Graphcore's
        presets), 2 keeps it fixed (see `mixing.cutmix`).
      mix: apply the configured Mixup/CutMix to the batches; None = `augment`. Graphcore's
        fine-tune mixes images that had evaluation preprocessing (`augment=False, mix=True`).
      one_hot: one-hot float labels; None = on when mixing is configured, in both training and
        evaluation, so that both feed the same loss.
      shuffle_buffer: records in the shuffle buffer; None = the whole file list for folder
        sources, `pipeline.DEFAULT_SHUFFLE_BUFFER` for tfds/tfrecord.
      cache: cache the encoded images after reading, in memory (True) or in a file (a path).
      repeat: repeat forever (trainers with steps_per_epoch); False gives one epoch per
        iteration, reshuffled and re-cropped each time (`model.fit(dataset, epochs=3)`).
      drop_remainder: drop the last partial batch; None = `training`.
      seed: seed for shuffling, crops, flips and mixing; same seed, same batches.
      deterministic: keep element order fixed; None = True when `seed` is given and for
        evaluation (`training=False`), whose first batches are what `--eval_steps` reads.
      private_threadpool_size, max_intra_op_parallelism: tf.data host thread settings
        (None = TF defaults).
      eval_resize_ratio: evaluation resizes the short side to `image_size * eval_resize_ratio`.
      area_range, aspect_range: training crop bounds (defaults: the paper's, docs/recipes.md).
      label_offset: subtracted from TFRecord labels (1 for TF-slim style 1-based ImageNet).
      allow_empty_classes: keep an image folder's class folders without images as classes
        (with a warning); refused by default, naming them.
      hold_out: a `folder_layout.HoldOut` (image folders without a held-out split: the held-out
        split is that stratified share of the pool split, the pool the rest); None = none.

    Example:
      >>> options = InputOptions("digits", "train", image_size=32, batch_size=64, training=True)
      >>> model.fit(make_dataset(options), epochs=3)
      >>> val = make_dataset(options.replace(split="validation", training=False))
    """

    source: str
    split: str
    image_size: int
    batch_size: int
    training: bool
    augment: bool | None = None
    random_flip: bool = True
    data_dir: str | os.PathLike | None = None
    num_classes: int | None = None
    mixup_alpha: float = 0.0
    cutmix_lambda: float | None = None
    cutmix_version: int = 1
    mix: bool | None = None
    one_hot: bool | None = None
    shuffle_buffer: int | None = None
    cache: bool | str = False
    repeat: bool = False
    drop_remainder: bool | None = None
    seed: int | None = None
    deterministic: bool | None = None
    private_threadpool_size: int | None = None
    max_intra_op_parallelism: int | None = None
    eval_resize_ratio: float = EVAL_RESIZE_RATIO
    area_range: tuple[float, float] = AREA_RANGE
    aspect_range: tuple[float, float] = ASPECT_RANGE
    label_offset: int = 0
    allow_empty_classes: bool = False
    hold_out: HoldOut | None = None

    def __post_init__(self):
        _positive_int("image_size", self.image_size)
        _positive_int("batch_size", self.batch_size)
        if self.mixup_alpha is None or not self.mixup_alpha >= 0:
            raise ValueError(f"mixup_alpha must be >= 0 (0 = off), got {self.mixup_alpha!r}")
        lam = self.cutmix_lambda
        if lam is not None and not (lam == 0 or 0 < lam < 1):
            raise ValueError(f"cutmix_lambda must be in (0, 1), or None/0 for off, got {lam!r}")
        if self.cutmix_version not in CUTMIX_VERSIONS:
            raise ValueError(f"cutmix_version must be one of {list(CUTMIX_VERSIONS)}, got "
                             f"{self.cutmix_version!r}")
        if not self.eval_resize_ratio >= 1:
            raise ValueError(f"eval_resize_ratio must be >= 1 (short side resized to at least "
                             f"image_size before the centre crop), got {self.eval_resize_ratio!r}")
        if self.shuffle_buffer is not None and self.shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1 or None (auto), got "
                             f"{self.shuffle_buffer!r}")
        for name in ("private_threadpool_size", "max_intra_op_parallelism"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None (TF default), got {value!r}")

    def replace(self, **changes) -> InputOptions:
        """A copy with `changes` (checked again)."""
        return dataclasses.replace(self, **changes)

    # The None defaults resolved: what the pipeline actually does.
    @property
    def augments(self) -> bool:
        return self.training if self.augment is None else self.augment

    @property
    def mixing_configured(self) -> bool:
        return self.mixup_alpha > 0 or bool(self.cutmix_lambda)

    @property
    def mixes(self) -> bool:
        return bool((self.augments if self.mix is None else self.mix) and self.mixing_configured)

    @property
    def one_hot_labels(self) -> bool:
        return self.mixing_configured if self.one_hot is None else bool(self.one_hot)

    @property
    def drops_remainder(self) -> bool:
        return self.training if self.drop_remainder is None else self.drop_remainder

    @property
    def keeps_order(self) -> bool:
        # Evaluation keeps its order: a fixed sample of every class under --eval_steps.
        if self.deterministic is not None:
            return self.deterministic
        return self.seed is not None or not self.training
