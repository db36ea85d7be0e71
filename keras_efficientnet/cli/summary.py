"""The end-of-run summary the command line prints: a small table of what ran and how it went."""

from __future__ import annotations

import math
from pathlib import Path

from keras_efficientnet.training.modes import MODE_TABLE


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)



def _rate(value) -> str:
    return f"{value:.1f} img/s" if value is not None and math.isfinite(value) else (
        "no steps run (already trained)")



def summary(config, results: dict, path: Path) -> str:
    """The table of one run's `results` (as `train_and_evaluate` returns them), written to
    `path`."""
    train_res, test_res = results.get("train_resolution"), results["test_resolution"]
    rows = [("mode", config.mode), ("model", config.model), ("dataset", config.dataset),
            ("global batch", str(config.global_batch_size))]
    if "epochs" in results:
        rows.append(("trained", f"{config.epochs} epochs at {train_res}px, "
                                f"{_rate(results['images_per_second'])}"))
    mode = MODE_TABLE[config.mode]
    if mode.finetunes:
        rows.append(("before fine-tune", f"top-1 {results['top1_before_finetune']:.4f} at "
                                         f"{test_res}px"))
        if config.finetune_epochs > 0:
            rows.append(("fine-tuned", f"{config.finetune_epochs} epochs, head only, "
                                       f"at {test_res}px, batch "
                                       f"{config.finetune_global_batch_size}"))
    if mode.scores_only:
        rows.append(("weights", str(results.get("weights", ""))))
    rows += [("top-1", f"{results['top1']:.4f}"), ("top-5", f"{results['top5']:.4f}")]
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

