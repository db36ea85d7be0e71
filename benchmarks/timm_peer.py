"""The PyTorch peer of the CPU model benchmark: timm's EfficientNet-B0s, one JSON line each.

Run by `benchmarks/bench_model.py` in a child process with the interpreter of `make venv-timm`
(`.venv-timm/bin/python`): PyTorch and timm never enter the project's own environment, and the
child imports neither Keras nor TensorFlow. It measures, for each `--models` entry and
`--resolutions`, training (SGD with momentum, cross-entropy) and inference (`inference_mode`)
images/s on the CPU at float32 in channels-last memory, with `--threads` intra-op threads, and
prints one `TIMM_ROW {json}` line per measurement. Where `import timm` fails it prints one
`TIMM_UNAVAILABLE reason` line and exits with status 3, so the parent can say why in its rows.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.timing import median_seconds

ROW_PREFIX = "TIMM_ROW "
UNAVAILABLE_PREFIX = "TIMM_UNAVAILABLE "
UNAVAILABLE_STATUS = 3
CLASSES = 1000


def _import_timm():
    import timm
    import torch

    return torch, timm


def import_or_report(importer):
    """`importer()`'s (torch, timm), or None after printing the one `TIMM_UNAVAILABLE` line
    the parent reads: an install that cannot load says so, and the run goes on. Both timm
    children (this one and timm_deploy) answer this way."""
    try:
        return importer()
    except Exception as error:
        first_line = (str(error).strip().splitlines() or [""])[0]
        print(f"{UNAVAILABLE_PREFIX}import timm failed in {sys.executable}: "
              f"{type(error).__name__}: {first_line}", flush=True)
        return None


def sgd_step(torch, model, optimizer, x, y, where: str) -> None:
    """One cross-entropy SGD step; a non-finite loss ends the child with `where` named."""
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    if not torch.isfinite(loss):
        raise SystemExit(f"non-finite loss {float(loss)} {where}")


def measure(torch, timm, name: str, resolution: int, args) -> dict[str, float]:
    """{"train"|"inference": median seconds a step} of timm's `name` at one resolution."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=CLASSES)
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, resolution, resolution).contiguous(
        memory_format=torch.channels_last)
    y = torch.randint(0, CLASSES, (args.batch,))

    def train_step():
        sgd_step(torch, model, optimizer, x, y, f"while benchmarking timm {name}")

    def infer():
        with torch.inference_mode():
            model(x).sum().item()

    model.train()
    train = median_seconds(train_step, warmup=args.warmup, repeats=args.steps)
    model.eval()
    inference = median_seconds(infer, warmup=args.warmup, repeats=args.infer_steps)
    return {"train": train, "inference": inference}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="efficientnet_b0,tf_efficientnet_b0")
    parser.add_argument("--resolutions", default="224")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--infer-steps", type=int, default=5)
    args = parser.parse_args(argv)
    imported = import_or_report(_import_timm)
    if imported is None:
        return UNAVAILABLE_STATUS
    torch, timm = imported
    torch.set_num_threads(args.threads)
    for resolution in (int(r) for r in args.resolutions.split(",")):
        for name in args.models.split(","):
            for mode, seconds in measure(torch, timm, name, resolution, args).items():
                print(ROW_PREFIX + json.dumps({
                    "model": name, "mode": mode, "resolution": resolution,
                    "batch": args.batch, "seconds_per_step": seconds,
                    "images_per_second": args.batch / seconds, "threads": args.threads,
                    "torch": torch.__version__, "timm": timm.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
