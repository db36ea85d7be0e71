"""Writes the README's preset table: every preset's parameters, MACs, resolution, purpose and
the ImageNet top-1 its recipes are meant to reach.

Builds each preset at its native resolution with the 1000-class head and counts its parameters
(`model.count_params()`) and multiply-accumulates per image (`ke.count_macs`); the accuracies
are `PAPER_TOP1` (read off the paper's Figure 1) and `GRAPHCORE_TOP1`. Takes a few
minutes (the B7s are large). Run after changing a preset:

    python scripts/preset_table.py            # rewrite the table in README.md
    python scripts/preset_table.py --print    # print it only
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEGIN, END = "<!-- preset-table:begin -->", "<!-- preset-table:end -->"

PURPOSE = {
    "g1-bn": "EfficientNet as published (= `keras.applications`); `weights=\"imagenet\"`",
    "g1-gn": "depthwise with GroupNorm: the batch-independent baseline",
    "g16-gn": "G16 with GroupNorm (B4: the large-batch LARS recipe)",
    "g16-gnpn": "G16 with GroupNorm + Proxy Norm",
    "g16-lnpn": "G16 with LayerNorm + Proxy Norm: the paper's main model",
    "g16-bn": "G16 with BatchNorm (the micro-batch benchmark's ablation)",
    "g16-ln": "G16 with LayerNorm alone (the micro-batch benchmark's ablation)",
}
TINY_PURPOSE = "tests, smoke runs and the digits job (half width, one block per stage)"


def aims_at(name: str) -> str:
    """The published top-1 of the preset's recipes (flags/), e.g. "79.1 native, 77.9 half"."""
    from keras_efficientnet.models.presets import GRAPHCORE_TOP1, PAPER_TOP1

    # Every row but the G1-GN baseline is fine-tuned; "fine-tuned" tells G1-GN's two apart.
    words = {"baseline": "baseline", "half": "half",
             "native": "fine-tuned native" if name.endswith("-g1-gn") else "native"}
    found = [f"{top1:.1f} {words[recipe]}" for (preset, recipe), top1 in PAPER_TOP1.items()
             if preset == name]
    found += [f"~{top1:.1f} LARS (Graphcore, no fine-tune)"
              for (preset, recipe), top1 in GRAPHCORE_TOP1.items() if preset == name]
    return ", ".join(found) or "-"


def rows() -> list[str]:
    import keras

    import keras_efficientnet as ke
    from keras_efficientnet.models import SCALING, preset_config

    lines = []
    for name in ke.list_presets():
        config = preset_config(name)
        family = name.split("-", 2)[2]
        resolution = SCALING[config["variant"]].resolution
        keras.utils.clear_session()
        model = ke.EfficientNet.from_preset(name)
        purpose = TINY_PURPOSE if config["variant"] == "tiny" else PURPOSE[family]
        lines.append(f"| `{name}` | {model.count_params() / 1e6:.2f} M | "
                     f"{ke.count_macs(model) / 1e9:.3f} G | {resolution} | {purpose} | "
                     f"{aims_at(name)} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def table() -> str:
    header = ["| preset | parameters | MACs per image | resolution | for | ImageNet top-1 (%) "
              "its recipes aim at |", "|---|---|---|---|---|---|"]
    return "\n".join(header + rows())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the table, leave README")
    args = parser.parse_args()
    text = table()
    if args.print:
        print(text)
        return
    readme = README.read_text()
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"{README} has no {BEGIN} ... {END} block to fill")
    start = readme.index(BEGIN) + len(BEGIN)
    README.write_text(readme[:start] + "\n" + text + "\n" + readme[readme.index(END):])
    print(f"wrote the table of {text.count(chr(10)) - 1} presets into {README}")


if __name__ == "__main__":
    main()
