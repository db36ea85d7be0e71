"""Writes every flagfile in flags/: paper presets, the B4 LARS run, the default and smoke jobs.

The recipes are data here (Graphcore's configs for Masters et al. 2021; docs/recipes.md); this
script is the one source of the files, and tests/training/test_training_flagfiles.py checks that
the committed files are exactly what it writes. After changing a recipe: `python flags/generate.py`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # `python flags/generate.py` from a checkout

from keras_efficientnet.models.presets import GRAPHCORE_TOP1, PAPER_TOP1  # noqa: E402

NATIVE = {"b0": 224, "b1": 240, "b2": 260, "b3": 300, "b4": 380, "b5": 456}
# Graphcore's configs (b2: 196, not the 192 of their README's table: 196 mod 32 = 260 mod 32).
HALF = {"b0": 160, "b1": 176, "b2": 196, "b3": 204, "b4": 252, "b5": 328}
MIXUP = {"b0": 0.1, "b1": 0.1, "b2": 0.1, "b3": 0.2, "b4": 0.2, "b5": 0.2}
CUTMIX = {"b0": 0.0, "b1": 0.95, "b2": 0.9, "b3": 0.9, "b4": 0.85, "b5": 0.8}
FAMILIES = {
    "g1-gn": "G1 (depthwise) with GroupNorm",
    "g16-gn": "G16 (16 channels per group, expand 4) with GroupNorm",
    "g16-lnpn": "G16 (16 channels per group, expand 4) with LayerNorm + Proxy Norm",
}
# The paper's series ("baseline": G1-GN at the native resolution, no fine-tune; every other
# row is fine-tuned at the test size). G1-GN at half resolution is ours: the paper has no such
# row and Graphcore published no config for it.
RECIPES = ("baseline", "native", "half")
OURS = ("g1-gn", "half")

EXPONENTIAL_DROPS = 146  # Graphcore's lr_drops over 350 epochs, counted from step 0
FINETUNE_BATCH = 512
FINETUNE_RATE_PER_SAMPLE = 2.0 ** -11  # Graphcore: --base-learning-rate=-11 at batch 512

FINETUNE_RECIPE = f"""\
--finetune_epochs=2
--finetune_batch_size={{finetune_batch}}
--finetune_learning_rate_per_sample={FINETUNE_RATE_PER_SAMPLE!r}
--finetune_warmup_epochs=5
"""

RMSPROP_RECIPE = f"""\
--dataset=tfds:imagenet2012
--train_split=train
--eval_split=validation
--micro_batch_size=32
--gradient_accumulation=24
--epochs=350
--optimizer=rmsprop
--learning_rate_per_sample={2.0 ** -14!r}
--momentum=0.9
--rmsprop_rho=0.953125
--rmsprop_epsilon=0.001
--weight_decay=1e-05
--label_smoothing=0.1
--lr_schedule=exponential
--warmup_epochs=5
--decay_epochs={350 / EXPONENTIAL_DROPS!r}
--decay_rate=0.97
--weight_average_decay=0.97
--crop_area_min=0.05
--mixup_alpha={{mixup}}
--cutmix_lambda={{cutmix}}
--cutmix_version=1
"""


def paper_top1_line(variant: str, family: str, recipe: str) -> str:
    if (family, recipe) == OURS:
        return ("# This recipe is ours: the paper has no G1-GN half-resolution row and Graphcore "
                "published no config for it, so there is no published top-1 to aim at.")
    top1 = PAPER_TOP1[(f"efficientnet-{variant}-{family}", recipe)]
    return (f"# Aims at {top1:.1f}% top-1 on ImageNet validation, read off the paper's Figure 1 "
            "(about +/-0.05 points).")


def rmsprop_preset(variant: str, family: str, recipe: str) -> str:
    native = NATIVE[variant]
    half = recipe == "half"
    train = HALF[variant] if half else native
    finetuned = recipe != "baseline"
    what = (f"EfficientNet-{variant.upper()} {FAMILIES[family]} on ImageNet, "
            + (f"trained at {train}px (about half the pixels)" if half
               else f"trained at the native {native}px"))
    if finetuned:
        what += f", then its head fine-tuned 2 epochs at {native}px"
    lines = [
        f"# {what}.",
        "# Graphcore's RMSProp recipe (Masters et al. 2021): global batch 768 = 32 x 24",
        "# accumulated micro-batches (raise --replicas and lower --gradient_accumulation to",
        "# spread it), 350 epochs, x0.97 every 350/146 epochs counted from step 0, Mixup and",
        "# CutMix v1, the 0.97 average of the epochs' weights. Graphcore trained in 16.32",
        "# (--precision=mixed_float16).",
    ]
    if finetuned:
        lines += [
            "# Fine-tune as for every row of the paper but the G1-GN baseline: head only,",
            f"# from the weight average, batch {FINETUNE_BATCH}, peak 2^-11 x {FINETUNE_BATCH} = "
            f"{FINETUNE_RATE_PER_SAMPLE * FINETUNE_BATCH}, cosine under a 5-epoch",
            "# warm-up (still rising when it ends), eval preprocessing, the run's Mixup/CutMix.",
        ]
    else:
        lines.append("# The paper's baseline: trained and tested at the native resolution, "
                     "no fine-tune.")
    lines += [
        paper_top1_line(variant, family, recipe),
        "# Prepare ImageNet for tfds as data/README.md says, then run:",
        f"#   python -m keras_efficientnet.train --flagfile=flags/{variant}-{family}-"
        f"{recipe}.flags --data_dir=DIR --model_dir=runs/NAME",
        f"--model=efficientnet-{variant}-{family}",
        f"--mode={'train_and_finetune' if finetuned else 'train'}",
        f"--train_resolution={train}",
        f"--test_resolution={native}",
    ]
    body = RMSPROP_RECIPE.format(mixup=MIXUP[variant], cutmix=CUTMIX[variant])
    if finetuned:
        body += FINETUNE_RECIPE.format(finetune_batch=FINETUNE_BATCH)
    return "\n".join(lines) + "\n" + body


LARS_TOP1 = GRAPHCORE_TOP1[("efficientnet-b4-g16-gn", "lars")]
LARS_B4_BODY = f"""\
--model=efficientnet-b4-g16-gn
--mode={{mode}}
--dataset=tfds:imagenet2012
--train_resolution=380
--test_resolution=380
--strategy=ipu
--micro_batch_size=3
--gradient_accumulation=256
--replicas=8
--pipeline_splits=block4a
--device_iterations=16
--precision=float16
--stochastic_rounding=on
--epochs=350
--optimizer=lars
--learning_rate_per_sample={2.0 ** -9.5!r}
--momentum=0.885
--lars_eta=0.001
--lars_epsilon=0.0
--weight_decay=2.5e-06
--label_smoothing=0.1
--lr_schedule=polynomial
--warmup_epochs=70
--poly_power=2
--end_learning_rate_ratio=1e-05
--weight_average_decay=0.97
--crop_area_min=0.05
--mixup_alpha=0.2
--cutmix_lambda=0.85
--cutmix_version=1
"""


def lars_b4_header(name: str, result: str, finetune: str) -> str:
    return f"""\
# EfficientNet-B4 G16 with GroupNorm at its native 380px on ImageNet with LARS at global batch
# 6144 = micro-batch 3 x accumulation 256 x 8 replicas, each replica split in 2 pipeline stages
# at block4a, 16 updates per host call, float16 weights and compute ("16.16") with stochastic
# rounding: Graphcore's "B4 in under 2 hours" run on 16 IPUs.
{result}
# --strategy=ipu cannot run today (it needs Graphcore's SDK, whose Keras 2.6 fork Keras 3 code
# cannot use; the run says so first and does nothing). On 8 GPUs, the same global batch:
#   python -m keras_efficientnet.train --flagfile=flags/{name} --data_dir=DIR \\
#       --strategy=mirrored --pipeline_splits= --device_iterations=1 --precision=mixed_float16
{finetune}
"""


LARS_B4 = lars_b4_header(
    "b4-g16-gn-lars.flags",
    f"# Graphcore's top-1 for this run: ~{LARS_TOP1}% (their application README), trained and\n"
    "# validated at 380px after 350 epochs, no fine-tune (a result beside the paper's Figure 1).",
    "# As in Graphcore's run, the 0.97 weight average is evaluated and nothing is fine-tuned;\n"
    "# flags/b4-g16-gn-lars-finetuned-ours.flags adds a head fine-tune (ours).",
) + LARS_B4_BODY.format(mode="train")

# The fine-tune keeps the run's micro-batch (3) and replicas (8), so its batch is a multiple of
# 24 (see TrainConfig.finetune_accumulation): 504 is the nearest to Graphcore's 512.
LARS_FINETUNE_BATCH = 504

LARS_B4_FINETUNED_OURS = lars_b4_header(
    "b4-g16-gn-lars-finetuned-ours.flags",
    "# Ours, not Graphcore's: their run (flags/b4-g16-gn-lars.flags, ~"
    f"{LARS_TOP1}% top-1) had no fine-tune;\n"
    "# this variant has no published accuracy to aim at.",
    "# Then the head is fine-tuned 2 epochs (Graphcore's fine-tune, written for its RMSProp runs,\n"
    f"# with this run's LARS) at batch {LARS_FINETUNE_BATCH} = 3 x 21 x 8.",
) + LARS_B4_BODY.format(mode="train_and_finetune") + FINETUNE_RECIPE.format(
    finetune_batch=LARS_FINETUNE_BATCH)

DEFAULT = """\
# The embedded default job (`make train`): a tiny G16 EfficientNet with LayerNorm + Proxy Norm
# trained on scikit-learn's 1797 real handwritten digits (written once as PNGs under ~/.cache
# and read through the same file pipeline as any image folder). The paper's recipe in
# miniature: train at reduced resolution (64px) with scale-augmenting crops, average the
# per-epoch weights, fine-tune the head block (head conv, its norm, classifier) for 3 epochs at
# the test resolution (96px, same residue mod 32) on training images with evaluation
# preprocessing, with Graphcore's fine-tune schedule (a cosine under a 5-epoch warm-up, so the
# rate peaks near 0.0016), and evaluate before and after. Expect about 98% held-out top-1
# (about 93% before the fine-tune) in about 4 minutes on a 2-core CPU.
# Run: make train   (or: python -m keras_efficientnet.train --flagfile=flags/default.flags)
--mode=train_and_finetune
--model=efficientnet-tiny-g16-lnpn
--model_dir=runs/default
--dataset=digits
--train_resolution=64
--test_resolution=96
--micro_batch_size=32
--epochs=25
--finetune_epochs=3
--finetune_learning_rate=0.01
--optimizer=rmsprop
--learning_rate=0.001
--lr_schedule=cosine
--warmup_epochs=2
--weight_decay=1e-5
--label_smoothing=0.1
--weight_average_decay=0.5
--crop_area_min=0.25
--norandom_flip
--dropout_rate=0.1
--drop_connect_rate=0.1
--seed=0
"""

SMOKE = """\
# Smoke run: seconds on a CPU, every phase once (train at 32px, average, fine-tune at 64px,
# evaluate). Checks that the pipeline, model, optimizer and checkpoints fit together; the
# accuracy it reaches is not meaningful (expect roughly chance to 50% top-1).
# Run: python -m keras_efficientnet.train --flagfile=flags/smoke.flags
--mode=train_and_finetune
--model=efficientnet-tiny-g16-lnpn
--model_dir=runs/smoke
--noresume
--dataset=digits
--train_resolution=32
--test_resolution=64
--micro_batch_size=16
--epochs=1
--updates_per_epoch=4
--eval_steps=2
--finetune_epochs=1
--optimizer=lars
--learning_rate=0.5
--lr_schedule=polynomial
--warmup_epochs=0.5
--weight_decay=2.5e-6
--crop_area_min=0.5
--norandom_flip
--verbose=2
"""

FINETUNE_PHOTOS = """\
# Fine-tunes a whole EfficientNet on your photos, from ImageNet's B0 or from a run of your own.
# The photos: an image folder photos/train/<class>/*.jpg with its held-out photos/val/<class>/
# (or validation/, valid/); with no held-out folder, or a plain folder photos/<class>/*.jpg,
# add --validation_split=0.1. Starts from keras.applications' ImageNet weights for
# EfficientNet-B0 (G1-BN; downloaded once into Keras' cache, or put there by hand offline, as
# the error says) and trains at the model's own resolution (224px for B0), with random crops
# (down to a quarter of the area) and flips: 10 epochs of momentum SGD under a cosine schedule,
# validated after every epoch, the best model kept as best.keras beside the final model.keras.
# From a model of your own instead: --weights=RUN --model=<that run's preset> (e.g.
# --weights=runs/pretrained --model=efficientnet-tiny-g16-lnpn, at its own 64px). Accuracy
# depends on the photos; the README's fine-tune section shows a run.
# Run: keras-efficientnet-train --recipe=finetune-photos --dataset=folder:photos
--mode=train
--model=efficientnet-b0-g1-bn
--weights=imagenet
--model_dir=runs/photos
--dataset=folder:photos
--train_resolution=0
--test_resolution=0
--micro_batch_size=32
--epochs=10
--optimizer=sgd
--learning_rate=0.01
--momentum=0.9
--lr_schedule=cosine
--warmup_epochs=1
--weight_decay=1e-5
--label_smoothing=0.1
--weight_average_decay=0
--crop_area_min=0.25
--random_flip
--eval_every=1
--seed=0
"""

# Fashion-MNIST: the tiny EfficientNet (half width, one block per stage) in recipes that share
# every other flag (FASHION_SHARED). Images are 28x28, resized by the pipeline to the resolution
# asked for, the same way for every recipe. Two tables:
# - at 40 px, every family trained and tested at that one resolution (is the paper's model on a
#   par with EfficientNet at native resolution?); G1-BN here is the recipe chosen by the probes
#   in docs/results.md (flips only over-fits, crops down to 0.64 under-fits);
# - at 96 px, where a reduced training resolution exists that keeps the paper's rule train_res
#   = test_res (mod 32) and about half the pixels: 64 px (0.44 of the pixels; 32 -> 40 broke
#   the rule: the last feature map is 1x1 in training and 2x2 at test). The reduced recipes
#   zoom their crops down to (64/96)^2 of the area so that garments meet the fine-tune at sizes
#   they trained on, and fine-tune the head at 96 px as Graphcore does. The probes that chose
#   this (FASHION_PROBES) open the reduced recipes' headers; docs/results.md has the table.
FASHION_EPOCHS = 22
FASHION_NATIVE_CROP_AREA_MIN = 0.85
FASHION96_EPOCHS = 12
FASHION96_REDUCED = 64
# Graphcore fine-tunes the head for 2 epochs. Measured on the reduced G16-LN+PN recipe's seed 0
# (validation top-1 at 96px from the same weight average, which scores 0.742 before): 1 epoch
# 0.875, 2 epochs 0.894.
FASHION_FINETUNE_EPOCHS = 2
# name -> (model, what it trains, train px, test px, epochs, head fine-tune at test px).
FASHION_RECIPES = {
    "g1-bn-native": ("efficientnet-tiny-g1-bn", "G1 (depthwise) with BatchNorm, trained and "
                     "tested at 40px (the reference)", 40, 40, FASHION_EPOCHS, False),
    "g1-gn-native": ("efficientnet-tiny-g1-gn", "G1 (depthwise) with GroupNorm, trained and "
                     "tested at 40px", 40, 40, FASHION_EPOCHS, False),
    "g16-gn-native": ("efficientnet-tiny-g16-gn", "G16 with GroupNorm, trained and tested at "
                      "40px", 40, 40, FASHION_EPOCHS, False),
    "g16-lnpn-native": ("efficientnet-tiny-g16-lnpn", "G16 with LayerNorm + Proxy Norm, trained "
                        "and tested at 40px", 40, 40, FASHION_EPOCHS, False),
    "96-g1-bn-native": ("efficientnet-tiny-g1-bn", "G1 (depthwise) with BatchNorm, trained and "
                        "tested at 96px (the reference)", 96, 96, FASHION96_EPOCHS, False),
    "96-g1-gn-native": ("efficientnet-tiny-g1-gn", "G1 (depthwise) with GroupNorm, trained at "
                        "96px and its head fine-tuned at 96px", 96, 96, FASHION96_EPOCHS, True),
    "96-g16-gn-native": ("efficientnet-tiny-g16-gn", "G16 with GroupNorm, trained at 96px and "
                         "its head fine-tuned at 96px", 96, 96, FASHION96_EPOCHS, True),
    "96-g16-lnpn-native": ("efficientnet-tiny-g16-lnpn", "G16 with LayerNorm + Proxy Norm, "
                           "trained at 96px and its head fine-tuned at 96px", 96, 96,
                           FASHION96_EPOCHS, True),
    "96-g16-gn-reduced": ("efficientnet-tiny-g16-gn", "G16 with GroupNorm, trained at 64px "
                          "and its head fine-tuned at 96px", FASHION96_REDUCED, 96,
                          FASHION96_EPOCHS, True),
    "96-g16-lnpn-reduced": ("efficientnet-tiny-g16-lnpn", "G16 with LayerNorm + Proxy Norm, "
                            "trained at 64px and its head fine-tuned at 96px (the paper's "
                            "recipe)", FASHION96_REDUCED, 96, FASHION96_EPOCHS, True),
}
# Results measured on this project's 2-core machine, from bench_fashion_protocol's rows
# (benchmarks/results/fashion_protocol.jsonl; docs/results.md holds the tables and the commands,
# tests hold these equal to the rows): seeds, then (mean, 95% t half-width) of test top-1 in one
# pass, with flips, and the final validation top-1. Recipes without an entry say they have not
# run at full length.
FASHION_SEEDS = {
    "g1-bn-native": (3, (0.9278, 0.0047), (0.9310, 0.0039), (0.9309, 0.0050)),
    "g1-gn-native": (3, (0.9220, 0.0079), (0.9262, 0.0093), (0.9223, 0.0033)),
    "g16-gn-native": (3, (0.9254, 0.0019), (0.9280, 0.0035), (0.9289, 0.0067)),
    "g16-lnpn-native": (3, (0.9247, 0.0126), (0.9284, 0.0104), (0.9290, 0.0088)),
    "96-g1-bn-native": (3, (0.9307, 0.0066), (0.9338, 0.0083), (0.9353, 0.0067)),
    "96-g1-gn-native": (3, (0.9270, 0.0032), (0.9300, 0.0058), (0.9309, 0.0015)),
    "96-g16-gn-native": (3, (0.9331, 0.0012), (0.9349, 0.0031), (0.9365, 0.0020)),
    "96-g16-lnpn-native": (3, (0.9275, 0.0075), (0.9298, 0.0073), (0.9308, 0.0076)),
    "96-g16-gn-reduced": (3, (0.8934, 0.0056), (0.8939, 0.0048), (0.8963, 0.0032)),
    "96-g16-lnpn-reduced": (3, (0.8976, 0.0157), (0.8987, 0.0141), (0.8998, 0.0116)),
}
# What else a recipe's header says of its runs.
FASHION_MEASURED = {
    "96-g16-lnpn-reduced": ("seed 0's validation top-1 was 0.899 at 64px, 0.742 at 96px before "
                            "the head fine-tune, 0.894 after it (0.875 after a 1-epoch "
                            "fine-tune)"),
    "g1-bn-native": ("seed 0 on a quiet 2-core AMD EPYC: 1136 s wall for the 22 epochs at 1137 "
                     "img/s"),
}


def fashion_measured(recipe: str) -> str:
    """The header's account of a recipe's full-length runs (FASHION_SEEDS, FASHION_MEASURED)."""
    if recipe not in FASHION_SEEDS:
        return ("not yet at this length; `make benchmark-fashion-protocol` runs it (3 seeds) and "
                "writes its rows to benchmarks/results/fashion_protocol.jsonl")
    seeds, top1, flip, val = FASHION_SEEDS[recipe]
    text = (f"{seeds} seeds, test top-1 {top1[0]:.4f} +/- {top1[1]:.4f} (95% t) in one pass, "
            f"{flip[0]:.4f} +/- {flip[1]:.4f} with flip test-time augmentation, final validation "
            f"top-1 {val[0]:.4f} +/- {val[1]:.4f} (docs/results.md)")
    return f"{text}; {FASHION_MEASURED[recipe]}" if recipe in FASHION_MEASURED else text


# Each recipe's training and head fine-tune images/s on a quiet 2-core AMD EPYC (oneDNN off, as
# the protocol's runs trained): the best of 2 interleaved rounds of bench_fashion_protocol's
# speed pass (benchmarks/results/fashion_protocol_speed.jsonl; tests hold the two equal).
FASHION_RATES = {
    "g1-bn-native": (783, None), "g1-gn-native": (826, None), "g16-gn-native": (715, None),
    "g16-lnpn-native": (608, None), "96-g1-bn-native": (215, None),
    "96-g1-gn-native": (188, 538), "96-g16-gn-native": (175, 522),
    "96-g16-lnpn-native": (216, 637), "96-g16-gn-reduced": (383, 563),
    "96-g16-lnpn-reduced": (402, 596),
}
FASHION_EPOCH_IMAGES = 55_000 // 64 * 64  # whole micro-batches of 64 from one pass of `train`
# The probes that chose the 96 px protocol (seed 0, 3 epochs, G16-LN+PN, validation top-1,
# 2 shared cores under load: seconds compare within this list only).
FASHION_PROBES = (
    "Chosen by probes (seed 0, 3 epochs, G16-LN+PN, validation top-1, loaded 2 cores): trained "
    "at 64px with crops down to 0.44 of the area, 275 img/s: 0.836 at 64px, 0.644 at 96px "
    "before the head fine-tune, 0.858 after it; crops down to 0.25, 250 img/s: 0.835, 0.721, "
    "0.854 (kept 0.44: it matches the garments' size at 96px and ends no lower); trained "
    "natively at 96px, 104 img/s under a heavier load: 0.853 after epoch 1, 0.888 after 3")
FASHION_SHARED = """\
--dataset=fashion_mnist
--train_split=train
--eval_split=validation
--micro_batch_size=64
--optimizer=rmsprop
--learning_rate=0.002
--lr_schedule=cosine
--warmup_epochs=1
--weight_decay=1e-5
--label_smoothing=0.1
--weight_average_decay=0.5
--eval_resize_ratio=1.0
--eval_flip
--dropout_rate=0
--drop_connect_rate=0
--seed=0
"""


def fashion_mnist(recipe: str) -> str:
    """One Fashion-MNIST recipe: the shared schedule, its model, resolutions and length."""
    model, what, train, test, epochs, finetuned = FASHION_RECIPES[recipe]
    name = f"fashion-mnist-{recipe}"
    mode = "train_and_finetune" if finetuned else "train"
    finetune = (f"--finetune_epochs={FASHION_FINETUNE_EPOCHS}\n--finetune_learning_rate=0.01\n"
                if finetuned else "")
    # A reduced recipe's crops zoom by up to the test/train ratio (area down to its inverse
    # square), so the fine-tune at the test resolution meets objects at sizes they trained on.
    crop = (train / test) ** 2 if train < test else FASHION_NATIVE_CROP_AREA_MIN
    measured = fashion_measured(recipe)
    rate, tune = FASHION_RATES.get(recipe, (None, None))
    if rate is None:
        cost = "Cost: not measured yet (bench_fashion_protocol --speed-only --speed-rounds 2)"
    else:
        cost = (f"Cost on a quiet 2-core AMD EPYC (oneDNN off): {rate} training img/s, "
                f"{FASHION_EPOCH_IMAGES / rate:.0f} s an epoch at {train}px")
        if finetuned:
            cost += (f"; the head fine-tune {tune} img/s, {FASHION_EPOCH_IMAGES / tune:.0f} s "
                     "an epoch")
    measured = textwrap.fill(f"Measured: {measured}. {cost}.", width=98, initial_indent="# ",
                             subsequent_indent="# ", break_on_hyphens=False)
    if train < test:
        measured += "\n" + textwrap.fill(f"{FASHION_PROBES}.", width=98, initial_indent="# ",
                                         subsequent_indent="# ", break_on_hyphens=False)
    opening = textwrap.fill(
        f"Fashion-MNIST (--dataset=fashion_mnist; install it with `make data-fashion`) on the "
        f"tiny EfficientNet: {what}.", width=98, initial_indent="# ", subsequent_indent="# ",
        break_on_hyphens=False)
    return (f"""\
{opening}
# Every recipe: RMSProp, cosine decay, {epochs} epochs of the 55,000 `train` images, random
# flips and scale crops, label smoothing 0.1, no dropout or stochastic depth, per-epoch weight
# averaging, the whole 28x28 frame at evaluation (scored one pass, and with flip test-time
# augmentation as flip_top1), chosen on `validation` (the last 5,000 training images).
{measured}
# The test split is for one final evaluation only: the same command with --mode=evaluate
# --eval_split=test scores the model the run shipped, runs/{name}/model.keras.
# Run: python -m keras_efficientnet.train --flagfile=flags/{name}.flags
--mode={mode}
--model={model}
--model_dir=runs/{name}
--train_resolution={train}
--test_resolution={test}
--crop_area_min={crop:g}
--epochs={epochs}
""" + finetune + FASHION_SHARED)


def check_resolution_rule(name: str, text: str) -> None:
    """Refuses (SystemExit, one line naming the file) a flagfile whose reduced-resolution
    recipe breaks train_res = test_res (mod 32)."""
    from keras_efficientnet.training.config import TrainConfig, resolution_rule_problem

    names = ("mode", "model", "train_resolution", "test_resolution")
    values = {}
    for line in text.splitlines():
        key, _, value = line[2:].partition("=")
        if line.startswith("--") and key in names:
            values[key] = int(value) if key.endswith("resolution") else value
    problem = resolution_rule_problem(TrainConfig(**values))
    if problem:
        raise SystemExit(f"flags/generate.py: refusing to write {name}: {problem}")


def flagfiles() -> dict[str, str]:
    """Every flagfile's name and text."""
    files = {}
    for variant in NATIVE:
        for family in FAMILIES:
            for recipe in RECIPES:
                if recipe == "baseline" and family != "g1-gn":
                    continue
                files[f"{variant}-{family}-{recipe}.flags"] = rmsprop_preset(variant, family,
                                                                             recipe)
    files["b4-g16-gn-lars.flags"] = LARS_B4
    files["b4-g16-gn-lars-finetuned-ours.flags"] = LARS_B4_FINETUNED_OURS
    files["default.flags"] = DEFAULT
    files["smoke.flags"] = SMOKE
    files["finetune-photos.flags"] = FINETUNE_PHOTOS
    for recipe in FASHION_RECIPES:
        files[f"fashion-mnist-{recipe}.flags"] = fashion_mnist(recipe)
    return files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default=str(HERE), help="default: flags/")
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = flagfiles()
    for name, text in files.items():  # every file checked before any is written
        check_resolution_rule(name, text)
    for name, text in files.items():
        (out / name).write_text(text)


if __name__ == "__main__":
    main()
