"""timm's `efficientnet_b0` for the deployment benchmark: its ONNX export, and PyTorch eager.

Run by `benchmarks/bench_deploy.py` in a child process (PyTorch and TensorFlow never share a
process there; the child imports neither Keras nor TensorFlow). `--export PATH` writes the
model as a timm user deploys it, `torch.onnx.export(..., opset_version=17)` with a dynamic
batch (a freshly initialised model: the runtimes' speed does not depend on the weights);
`--eager` times PyTorch's own inference after `--sgd-steps` SGD steps (a freshly initialised
timm model runs at about half speed in eval mode on these CPUs, as issue 33 measured), in
channels-last memory with `--threads` intra-op threads: batch-`--batch` images/s (best of
`--repeats` runs of `--batches` calls) and batch-1 latency (median of `--latency-calls`). It
prints one `TIMM_DEPLOY {json}` line; where torch or timm cannot be imported, one
`TIMM_UNAVAILABLE reason` line and exit status 3.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.timing import best_seconds, median_seconds

# The same training step and unavailable answer for both timm children.
from benchmarks.timm_peer import (
    UNAVAILABLE_PREFIX,  # noqa: F401 - bench_deploy reads it from this module
    UNAVAILABLE_STATUS,
    import_or_report,
    sgd_step,
)

ROW_PREFIX = "TIMM_DEPLOY "
MODEL = "efficientnet_b0"


def import_timm():
    """(torch, timm). timm imports torchvision; where torchvision's compiled ops do not load
    beside this torch (on this machine the only torchvision for the CPU build of torch 2.13 is
    a CUDA build), torchvision 0.28 still registers fake kernels for `torchvision::nms` and
    `qnms` at import and fails. Declaring those two schemas first lets it import; nothing here
    calls them (EfficientNet uses none of torchvision's detection ops)."""
    import torch

    try:
        import timm
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        for name in [name for name in sys.modules if name.split(".")[0] in ("torchvision",
                                                                           "timm")]:
            del sys.modules[name]
        for op in ("nms", "qnms"):
            torch.library.define(f"torchvision::{op}",
                                 "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import timm
    return torch, timm


def export(torch, model, path: str, resolution: int) -> None:
    import warnings

    model.eval()
    x = torch.zeros(1, 3, resolution, resolution)
    # The TorchScript exporter: the torch.export-based one needs onnxscript, which a timm user
    # exporting with opset 17 does not; both give the same ops for this model.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False,
                      input_names=["images"], output_names=["logits"],
                      dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})


def eager(torch, model, args) -> dict:
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 3, args.resolution, args.resolution,
                    generator=generator).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, args.classes, (args.batch,), generator=generator)
    model.train()
    for _ in range(args.sgd_steps):
        sgd_step(torch, model, optimizer, x, y, f"in timm {MODEL}'s SGD steps")
    model.eval()
    one = x[:1].contiguous(memory_format=torch.channels_last)

    def infer(batch):
        with torch.inference_mode():
            model(batch).sum().item()

    seconds = best_seconds(lambda: infer(x), warmup=args.warmup, batches=args.batches,
                           repeats=args.repeats)
    latency = median_seconds(lambda: infer(one), warmup=args.warmup,
                             repeats=args.latency_calls)
    return {"seconds_per_batch": seconds, "latency_seconds": latency}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", default=None, help="write the ONNX file here")
    parser.add_argument("--eager", action="store_true", help="time PyTorch eager inference")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--sgd-steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-calls", type=int, default=20)
    args = parser.parse_args(argv)
    imported = import_or_report(import_timm)
    if imported is None:
        return UNAVAILABLE_STATUS
    torch, timm = imported
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = timm.create_model(MODEL, pretrained=False, num_classes=args.classes)
    result = {"model": MODEL, "torch": torch.__version__, "timm": timm.__version__,
              "threads": args.threads, "resolution": args.resolution, "batch": args.batch}
    if args.export:
        export(torch, model, args.export, args.resolution)
        result["export"] = args.export
    if args.eager:
        result.update(eager(torch, model, args))
    print(ROW_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
