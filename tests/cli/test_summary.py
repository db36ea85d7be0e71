"""The end-of-run summary: counts in the singular and plural, and every score with the images
it covers and why (issue 35: two evaluations of one model disagreed without saying why)."""

import re

from keras_efficientnet.cli.summary import images_phrase, plural, summary
from keras_efficientnet.training.config import TrainConfig


def test_plural():
    assert [plural(n, "epoch") for n in (0, 1, 2)] == ["0 epochs", "1 epoch", "2 epochs"]


def test_images_phrase_says_how_many_of_how_many_and_why():
    assert images_phrase(32, 355, "validation", "--eval_steps=2") == (
        "on 32 of 355 validation images (--eval_steps=2)")
    assert images_phrase(355, 355, "validation", "--eval_steps=0") == (
        "on all 355 validation images")
    assert images_phrase(1, 1, "test") == "on all 1 test image"


def _results(**fields):
    results = {"train_resolution": 32, "test_resolution": 64, "epochs": 1,
               "images_per_second": 265.9, "top1_before_finetune": 0.0625, "top1": 0.09375,
               "top5": 0.4375, "wall_seconds": 84.0, "eval_examples": 355}
    results.update(fields)
    return results


def _row(text: str, label: str) -> str:
    found = re.search(rf"^  {re.escape(label)} +(.*)$", text, re.M)
    assert found, text
    return found[1]


def test_a_runs_summary_counts_epochs_and_the_images_each_score_covers(tmp_path):
    config = TrainConfig(mode="train_and_finetune", model="efficientnet-tiny-g16-lnpn",
                         dataset="digits", epochs=1, finetune_epochs=1, micro_batch_size=16,
                         eval_steps=2, train_resolution=32, test_resolution=64)
    # --eval_steps=2 batches of 16: the first 32 of the 355 validation images.
    text = summary(config, _results(eval_images_scored=32), tmp_path / "results.json")
    assert _row(text, "trained") == "1 epoch at 32px, 265.9 img/s"
    assert _row(text, "fine-tuned").startswith("1 epoch, head only, at 64px")
    scored = "on 32 of 355 validation images (--eval_steps=2)"
    assert _row(text, "top-1") == f"0.0938 {scored}"
    assert _row(text, "before fine-tune") == f"top-1 0.0625 at 64px {scored}"

    config = config.replace(epochs=3, finetune_epochs=2, eval_steps=0)
    text = summary(config, _results(eval_images_scored=355), tmp_path / "results.json")
    assert _row(text, "trained").startswith("3 epochs at 32px")
    assert _row(text, "fine-tuned").startswith("2 epochs, head only")
    assert _row(text, "top-1") == "0.0938 on all 355 validation images"


def test_results_from_before_the_count_still_summarize(tmp_path):
    config = TrainConfig(mode="train", model="efficientnet-tiny-g16-lnpn", dataset="digits")
    results = _results()
    del results["eval_examples"]
    assert _row(summary(config, results, tmp_path / "r.json"), "top-1") == "0.0938"
