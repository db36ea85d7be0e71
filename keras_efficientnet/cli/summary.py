"""The end-of-run summary the command line prints: a small table of what ran and how it went."""

from __future__ import annotations

import math
from pathlib import Path

from keras_efficientnet.training.modes import MODE_TABLE


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, in the plural unless `count` is 1: "1 epoch", "3 epochs"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def images_phrase(scored: int, total: int, split: str, why: str = "") -> str:
    """Which images a score covers, and why not all: "on 32 of 355 validation images
    (--eval_steps=2)", "on all 355 validation images"."""
    if scored >= total:
        return f"on all {plural(total, f'{split} image')}"
    return f"on {scored} of {plural(total, f'{split} image')}" + (f" ({why})" if why else "")


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def _rate(value) -> str:
    return f"{value:.1f} img/s" if value is not None and math.isfinite(value) else (
        "no steps run (already trained)")



def _scored(config, results: dict) -> str:
    """" on 32 of 355 validation images (--eval_steps=2)" for the run's scores ("" where the
    results do not say)."""
    if "eval_images_scored" not in results or "eval_examples" not in results:
        return ""
    return " " + images_phrase(results["eval_images_scored"], results["eval_examples"],
                               config.eval_split, f"--eval_steps={config.eval_steps}")


def summary(config, results: dict, path: Path) -> str:
    """The table of one run's `results` (as `train_and_evaluate` returns them), written to
    `path`."""
    train_res, test_res = results.get("train_resolution"), results["test_resolution"]
    rows = [("mode", config.mode), ("model", config.model), ("dataset", config.dataset),
            ("global batch", str(config.global_batch_size))]
    if "epochs" in results:
        rows.append(("trained", f"{plural(config.epochs, 'epoch')} at {train_res}px, "
                                f"{_rate(results['images_per_second'])}"))
    mode = MODE_TABLE[config.mode]
    scored = _scored(config, results)
    if mode.finetunes:
        rows.append(("before fine-tune", f"top-1 {results['top1_before_finetune']:.4f} at "
                                         f"{test_res}px{scored}"))
        if config.finetune_epochs > 0:
            rows.append(("fine-tuned", f"{plural(config.finetune_epochs, 'epoch')}, head only, "
                                       f"at {test_res}px, batch "
                                       f"{config.finetune_global_batch_size}"))
    if mode.scores_only:
        rows.append(("weights", str(results.get("weights", ""))))
    rows += [("top-1", f"{results['top1']:.4f}{scored}"), ("top-5", f"{results['top5']:.4f}")]
    if "flip_top1" in results:
        rows.append(("flip TTA", f"top-1 {results['flip_top1']:.4f}, "
                                 f"top-5 {results['flip_top5']:.4f} (image and mirror)"))
    if results.get("skipped_images"):
        rows.append(("skipped images", f"{results['skipped_images']} unreadable"))
    rows += [("wall time", f"{results['wall_seconds']:.0f} s"), ("results", str(path))]
    rows += [(label, results[key]) for label, key in (("model file", "model_file"),
                                                      ("SavedModel", "export_dir"))
             if key in results]
    return "\n" + _table(rows)

