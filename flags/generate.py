"""Writes the paper's preset flagfiles (flags/b{0..5}-{family}-{native,half}.flags, b4 LARS).

The recipes are data (docs/recipes.md); this script keeps the 36 files consistent. Run it after
changing a recipe: `python flags/generate.py`.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

NATIVE = {"b0": 224, "b1": 240, "b2": 260, "b3": 300, "b4": 380, "b5": 456}
HALF = {"b0": 160, "b1": 176, "b2": 196, "b3": 204, "b4": 252, "b5": 328}
MIXUP = {"b0": 0.1, "b1": 0.1, "b2": 0.1, "b3": 0.2, "b4": 0.2, "b5": 0.2}
CUTMIX = {"b0": 0.0, "b1": 0.95, "b2": 0.9, "b3": 0.9, "b4": 0.85, "b5": 0.8}
FAMILIES = {
    "g1-gn": "G1 (depthwise) with GroupNorm",
    "g16-gn": "G16 (16 channels per group, expand 4) with GroupNorm",
    "g16-lnpn": "G16 (16 channels per group, expand 4) with LayerNorm + Proxy Norm",
}

RMSPROP_RECIPE = """\
--dataset=tfds:imagenet2012
--train_split=train
--eval_split=validation
--micro_batch_size=32
--gradient_accumulation=24
--epochs=350
--optimizer=rmsprop
--learning_rate_per_sample={lr_per_sample!r}
--momentum=0.9
--rmsprop_rho=0.953125
--rmsprop_epsilon=0.001
--weight_decay=1e-05
--label_smoothing=0.1
--lr_schedule=exponential
--warmup_epochs=5
--decay_epochs=2.4
--decay_rate=0.97
--weight_average_decay=0.97
--crop_area_min=0.05
--mixup_alpha={mixup}
--cutmix_lambda={cutmix}
"""


def rmsprop_preset(variant: str, family: str, half: bool) -> str:
    native = NATIVE[variant]
    train = HALF[variant] if half else native
    what = (f"EfficientNet-{variant.upper()} {FAMILIES[family]} on ImageNet, "
            + (f"trained at {train}px (about half the pixels) then fine-tuned 2 epochs at "
               f"{native}px" if half else f"trained at the native {native}px"))
    lines = [
        f"# {what}.",
        "# The RMSProp recipe of Masters et al. 2021: global batch 768 = 32 x 24 accumulated",
        "# micro-batches (raise --replicas and lower --gradient_accumulation to spread it), 350",
        "# epochs. Expect the paper's reported top-1 for this configuration.",
        "# Prepare ImageNet for tfds as data/README.md says, then run:",
        f"#   python -m keras_efficientnet.train --flagfile=flags/{variant}-{family}-"
        f"{'half' if half else 'native'}.flags --data_dir=DIR --model_dir=runs/NAME",
        f"--model=efficientnet-{variant}-{family}",
        f"--mode={'train_and_finetune' if half else 'train'}",
        f"--train_resolution={train}",
        f"--test_resolution={native}",
    ]
    if half:
        lines.append("--finetune_epochs=2")
    body = RMSPROP_RECIPE.format(lr_per_sample=2.0 ** -14, mixup=MIXUP[variant],
                                 cutmix=CUTMIX[variant])
    return "\n".join(lines) + "\n" + body


LARS_B4 = f"""\
# EfficientNet-B4 G16 with GroupNorm at its native 380px on ImageNet with LARS at global batch
# 6144 = micro-batch 3 x accumulation 256 x 8 replicas, each replica split in 2 pipeline stages
# at block4a, 16 updates per host call: Graphcore's "B4 in under 2 hours" layout on 16 IPUs
# (about 82.6% top-1 after 350 epochs). --strategy=ipu cannot run today (it needs Graphcore's
# SDK, whose Keras 2.6 fork Keras 3 code cannot use; the run says so first and does nothing).
# On 8 GPUs, the same global batch:
#   python -m keras_efficientnet.train --flagfile=flags/b4-g16-gn-lars.flags --data_dir=DIR \\
#       --strategy=mirrored --pipeline_splits= --device_iterations=1
--model=efficientnet-b4-g16-gn
--mode=train
--dataset=tfds:imagenet2012
--train_resolution=380
--test_resolution=380
--strategy=ipu
--micro_batch_size=3
--gradient_accumulation=256
--replicas=8
--pipeline_splits=block4a
--device_iterations=16
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
"""


def main() -> None:
    for variant in NATIVE:
        for family in FAMILIES:
            for half in (False, True):
                name = f"{variant}-{family}-{'half' if half else 'native'}.flags"
                (HERE / name).write_text(rmsprop_preset(variant, family, half))
    (HERE / "b4-g16-gn-lars.flags").write_text(LARS_B4)


if __name__ == "__main__":
    main()
