"""PNG charts of benchmark result files, drawn from the JSON rows alone (so any file re-renders).

Run `python -m benchmarks.charts benchmarks/results/*.jsonl` to redraw charts; each benchmark
script calls `render` after writing its rows. Bars show images/s, each labelled with its ratio to
the same-run reference (the reference's bar is hatched); the footer names the machine.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a results file (JSON lines)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# Rows written before issue 37 name step calls per epoch `steps_per_epoch` (one word for several
# units); rows written since, `step_calls_per_epoch` (beside `updates_per_epoch`). Committed rows
# are not rewritten: readers take either name.
STEP_CALLS_FIELDS = ("step_calls_per_epoch", "steps_per_epoch")


def step_calls_per_epoch(row: dict) -> int | None:
    """A row's step calls per epoch under either of its names (STEP_CALLS_FIELDS), or None."""
    for field in STEP_CALLS_FIELDS:
        if row.get(field) is not None:
            return row[field]
    return None


def _schedule(row: dict) -> str:
    """'N epochs x M step calls' (or just the epochs where the row has no step calls)."""
    epochs = f"{row.get('epochs')} epochs"
    calls = step_calls_per_epoch(row)
    return epochs if calls is None else f"{epochs} x {calls} step calls"


MODEL_BENCHMARKS = ("train", "inference")
LAYER_BENCHMARKS = ("layer_fwd_bwd", "norm_fwd_bwd")
DISTRIBUTE_BENCHMARKS = ("input_sharding", "data_parallel", "pipeline", "stop_vote")
ONEDNN_BENCHMARKS = ("conv_fwd_bwd", "train_onednn", "inference_onednn")
DEPLOY_BENCHMARKS = ("deploy_throughput", "deploy_latency")
COLORS = {"tensorflow": "#ff8f00", "jax": "#3f51b5", "torch": "#e53935",
          "onnxruntime": "#00897b", "openvino": "#8e24aa"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def machine_line(machine: dict) -> str:
    """One line naming where the figures were measured."""
    parts = []
    if machine.get("gpu"):
        parts.append(f"{machine['gpu']} (driver {machine.get('driver', '?')})")
    parts.append(f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores")
    if machine.get("cpu_flags"):
        parts.append(machine["cpu_flags"])
    if "load_average_1m" in machine:
        parts.append(f"load {machine['load_average_1m']}")
    libraries = [f"{name} {machine[name]}" for name in ("keras", "tensorflow", "jax", "torch",
                                                        "timm", "onnxruntime", "openvino")
                 if machine.get(name)]
    return "; ".join(parts + libraries)


def _ratio(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio >= 0.095 else f"{ratio:.2g}x"  # 0.0037x, not 0.00x


def _bars(ax, rows: list[dict], label) -> None:
    labels = [label(row) for row in rows]
    values = [row["images_per_second"] for row in rows]
    log = max(values) > 20 * min(values)  # e.g. Keras' grouped conv on a TensorFlow CPU
    colors = [COLORS.get(row["backend"], "#607d8b") for row in rows]
    y = list(range(len(rows)))[::-1]
    bars = ax.barh(y, values, color=colors)
    for bar, row in zip(bars, rows):
        if row["variant"] == row["reference"]:
            bar.set_hatch("//")
            bar.set_edgecolor("white")
    ax.set_yticks(y, labels, fontsize=8)
    if log:
        from matplotlib.ticker import NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    top = max(values)
    ax.set_xlim(min(values) / 3 if log else 0, top * (8 if log else 1.45))
    for bar, row in zip(bars, rows):
        ax.text(bar.get_width() * (1.08 if log else 1.0) + (0 if log else top * 0.01),
                bar.get_y() + bar.get_height() / 2,
                f" {row['images_per_second']:.4g}  ({_ratio(row['ratio_to_reference'])})",
                va="center", fontsize=7)
    ax.grid(axis="x", alpha=0.3)


def _panels(path: Path, groups: dict, title: str, label, xlabel: str, machine: dict) -> Path:
    plt = _pyplot()
    heights = [0.6 + 0.28 * len(rows) for rows in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, sum(heights) + 1.1),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (name, rows) in zip(axes[:, 0], groups.items()):
        _bars(ax, rows, label)
        reference = rows[0]["reference"]
        ax.set_title(f"{name}   (ratios to {reference})", fontsize=9, loc="left")
        ax.set_xlabel(xlabel, fontsize=8)
    fig.suptitle(title, fontsize=11)
    return _save(plt, fig, path, machine)


def _save(plt, fig, path: Path, machine: dict) -> Path:
    """Writes `fig` beside the rows as <path>.png, with the machine line at the bottom."""
    fig.text(0.01, 0.005, machine_line(machine), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _group(rows: list[dict], key) -> dict:
    groups: dict = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return groups


def model_chart(path: Path, rows: list[dict]) -> Path:
    """Training and inference images/s, one panel per (mode, resolution)."""
    groups = _group(rows, lambda r: f"{r['benchmark']} at {r['resolution']}px, batch "
                                    f"{r['batch']}, {r['precision']}")
    backends = sorted({r["backend"] for r in rows})
    size = rows[-1].get("model_size", "b0").upper()
    return _panels(path, groups, f"EfficientNet-{size} variants, images/s ({', '.join(backends)})",
                   lambda r: r["variant"], "images/s (higher is better)", rows[0]["machine"])


def deploy_chart(path: Path, rows: list[dict]) -> Path:
    """Deployment: batch-N images/s and batch-1 latency (as images/s) of each model on each
    runtime, one panel per mode, its runtime-setting rows in panels of their own; each bar
    labelled with its ratio to timm on the same runtime (to PyTorch eager for TensorFlow)."""
    def key(row):
        mode = ("batch-1 latency (1 / latency)" if row["benchmark"] == "deploy_latency" else
                f"batch {row['batch']}")
        settings = "" if row.get("setting", "default") == "default" else (
            ", runtime settings (ratios to the default setting)")
        return f"{mode}, {row['precision']}{settings}"

    def label(row):
        setting = "" if row.get("setting", "default") == "default" else f" [{row['setting']}]"
        return (f"{row['variant']} {row['resolution']}px, {row['runtime']}{setting} "
                f"({row['gmacs_per_second']:.0f} GMAC/s)")

    plt = _pyplot()
    groups = _group(rows, key)
    heights = [0.6 + 0.28 * len(group) for group in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, sum(heights) + 1.1),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (name, group) in zip(axes[:, 0], groups.items()):
        _bars(ax, group, label)
        ax.set_title(name if "settings" in name else
                     f"{name}   (ratios to timm on the same runtime; TensorFlow's to PyTorch's)",
                     fontsize=9, loc="left")
        ax.set_xlabel("images/s (higher is better)", fontsize=8)
    fig.suptitle("Deployed inference on CPU runtimes, images/s", fontsize=11)
    return _save(plt, fig, path, rows[0]["machine"])


def layer_chart(path: Path, rows: list[dict]) -> Path:
    """Forward+backward images/s of the grouped convs and of the norm + activation pairs."""
    groups = _group(rows, lambda r: f"{r['benchmark']}: batch {r['batch']}, "
                                    f"{r['resolution']}x{r['resolution']}x{r['channels']}")
    return _panels(path, groups, "Layers, forward+backward", lambda r: r["variant"],
                   "images/s through the layer (higher is better)", rows[0]["machine"])


def pipeline_chart(path: Path, rows: list[dict]) -> Path:
    """Host pipeline images/s per core, per output size, against the decode ceiling."""
    ceiling = [r for r in rows if r["resolution"] is None]
    groups = {f"{size}px": ceiling + [r for r in rows if r["resolution"] == size]
              for size in sorted({r["resolution"] for r in rows if r["resolution"]},
                                 reverse=True)}
    return _panels(path, groups, "Host pipeline (tf.data, JPEG photographs), images/s",
                   lambda r: r["variant"] + (f" ({r['bytes_per_image']} B/img)"
                                             if r.get("bytes_per_image") else ""),
                   "images/s on all pipeline threads (higher is better)", rows[0]["machine"])


def _distribute_label(row: dict) -> str:
    if "decoded_images" not in row:
        return row["variant"]
    # Input sharding: what each worker decodes in an epoch matters more than its images/s.
    return (f"{row['variant']}: decodes {row['decoded_images']} "
            f"({row['decoded_share']:.2f}x) in {row['seconds_per_epoch']:.2f} s")


def distribute_chart(path: Path, rows: list[dict]) -> Path:
    """Host decode per worker with sharded input; data-parallel and pipeline-parallel images/s
    against one replica / the unsplit model."""
    groups = _group(rows, lambda r: r["benchmark"])
    return _panels(path, groups, "Execution plans on logical CPU devices, images/s",
                   _distribute_label, "images/s (higher is better)", rows[0]["machine"])


def onednn_chart(path: Path, rows: list[dict]) -> Path:
    """Achieved GMAC/s of the dense, G16 and depthwise convs per shape, one panel per oneDNN
    setting (the G16 bar labelled with its path and ratio to the dense conv); then the models'
    images/s under both settings, labelled with the ratio to oneDNN on."""
    plt = _pyplot()
    convs = [r for r in rows if r["benchmark"] == "conv_fwd_bwd"]
    models = [r for r in rows if r["benchmark"] != "conv_fwd_bwd"]
    settings = list(dict.fromkeys(r["onednn"] for r in convs))
    fig, axes = plt.subplots(len(settings) + 1, 1, figsize=(9, 3.2 * len(settings) + 3),
                             squeeze=False)
    kinds = list(dict.fromkeys(r["variant"].split(" [")[0] for r in convs))
    colors = ["#90a4ae", "#ff8f00", "#3f51b5"]
    top = max(r["gmacs_per_second"] for r in convs)
    for ax, setting in zip(axes[:, 0], settings):
        shown = [r for r in convs if r["onednn"] == setting]
        shapes = list(dict.fromkeys((r["resolution"], r["channels"], r["kernel"])
                                    for r in shown))
        width = 0.8 / len(kinds)
        for k, kind in enumerate(kinds):
            for i, shape in enumerate(shapes):
                row = next(r for r in shown if r["variant"].split(" [")[0] == kind
                           and (r["resolution"], r["channels"], r["kernel"]) == shape)
                x = i + (k - (len(kinds) - 1) / 2) * width
                ax.bar(x, row["gmacs_per_second"], width, color=colors[k % len(colors)],
                       label=kind if i == 0 else None)
                if row["path"] in ("per_group", "grouped"):
                    ax.text(x, row["gmacs_per_second"], f"{row['ratio_gmacs_to_dense']:.2f}x\n"
                            f"{row['path']}", ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(shapes)),
                      [f"{h}x{h}x{c} k{k}" for h, c, k in shapes], fontsize=8)
        ax.set_ylim(0, top * 1.3)
        ax.set_ylabel("GMAC/s, fwd+bwd", fontsize=8)
        ax.set_title(f"oneDNN {setting}, batch {shown[0]['batch']}: GMAC/s achieved "
                     "(G16: ratio to dense, path)", fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(axis="y", alpha=0.3)
    ax = axes[-1, 0]
    labels = [f"{r['benchmark'].split('_')[0]}: {r['variant']}" for r in models]
    y = list(range(len(models)))[::-1]
    bars = ax.barh(y, [r["images_per_second"] for r in models],
                   color=["#ff8f00" if r["onednn"] == "off" else "#90a4ae" for r in models])
    for bar, row in zip(bars, models):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" {row['images_per_second']:.4g}  ({_ratio(row['ratio_to_reference'])} of "
                "oneDNN on)", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlim(0, max(r["images_per_second"] for r in models) * 1.45)
    ax.set_xlabel("images/s (higher is better)", fontsize=8)
    if models:
        ax.set_title(f"B0 models at {models[0]['resolution']}px, batch {models[0]['batch']}",
                     fontsize=9, loc="left")
    fig.suptitle("GroupConv2D and B0 with oneDNN off and on (TensorFlow CPU)", fontsize=11)
    return _save(plt, fig, path, rows[0]["machine"])


def pareto_chart(path: Path, rows: list[dict]) -> Path:
    """Held-out top-1 against cumulative training seconds (the paper's Figure 1, in small)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = ["o-", "s-", "^-", "d-"]
    for index, (style, row) in enumerate(zip(styles, rows)):
        curve = row["curve"]
        trained = [p for p in curve if p["phase"] == "train"]
        line, = ax.plot([p["seconds"] for p in trained], [p["top1"] for p in trained], style,
                        markersize=4, label=f"{row['variant']} ({row['images_per_second']:.0f} "
                                            f"img/s, {row['ratio_to_reference']:.2f}x)")
        tuned = [p for p in curve if p["phase"] != "train"]
        if tuned and trained:
            ax.plot([trained[-1]["seconds"]] + [p["seconds"] for p in tuned],
                    [trained[-1]["top1"]] + [p["top1"] for p in tuned], "--",
                    color=line.get_color())
            ax.plot([p["seconds"] for p in tuned], [p["top1"] for p in tuned], "*",
                    markersize=12, color=line.get_color())
            ax.annotate(f"{tuned[-1]['phase']} {tuned[-1]['top1']:.3f}",
                        (tuned[-1]["seconds"], tuned[-1]["top1"]), textcoords="offset points",
                        xytext=(-12, -20 - 14 * index), fontsize=8, ha="right",
                        color=line.get_color())
        if row.get("seconds_to_target") is not None:
            ax.axvline(row["seconds_to_target"], color=line.get_color(), alpha=0.35, lw=1)
    target = rows[0].get("target_top1")
    if target is not None:
        ax.axhline(target, color="grey", ls=":", lw=1)
        ax.text(ax.get_xlim()[0], target, f" target top-1 {target}", va="bottom", fontsize=8,
                color="grey")
    lowest = min(p["top1"] for row in rows for p in row["curve"])
    ax.set_ylim(max(0.0, min(lowest, target or 1.0) - 0.05), 1.0)
    ax.set_xlabel(f"cumulative training seconds (evaluation excluded; {_schedule(rows[0])})")
    ax.set_ylabel("held-out top-1")
    dataset = rows[0].get("dataset", "")
    ax.set_title(f"Accuracy against training time on {dataset} "
                 f"(test resolution {rows[0].get('test_resolution')}px)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(plt, fig, path, rows[0]["machine"])


def microbatch_chart(path: Path, rows: list[dict]) -> Path:
    """Held-out top-1 against the micro-batch size, one line per norm, seeds as dots."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ["o-", "s-", "^-", "d-", "v-"]
    norms = list(dict.fromkeys(row["variant"] for row in rows))
    for style, norm in zip(styles, norms):
        own = sorted((row for row in rows if row["variant"] == norm), key=lambda r: r["batch"])
        line, = ax.plot([r["batch"] for r in own], [r["top1"] for r in own], style, label=norm)
        for row in own:
            ax.plot([row["batch"]] * len(row["top1_per_seed"]), row["top1_per_seed"], ".",
                    color=line.get_color(), alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({row["batch"] for row in rows}))
    ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel(f"micro-batch (gradients accumulated to {rows[0].get('global_batch')})")
    ax.set_ylabel("held-out top-1 (line: mean over seeds)")
    ax.set_title(f"Normalization against micro-batch size on {rows[0].get('dataset', '')} "
                 f"({_schedule(rows[0])}, {rows[0].get('resolution')}px)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(plt, fig, path, rows[0]["machine"])


def render(path: str | os.PathLike) -> Path | None:
    """Draws <path>.png from the rows of <path> (a .jsonl); None, saying why, without
    matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"no chart for {path}: matplotlib is not installed here; draw it later with "
              f"`python -m benchmarks.charts {path}`", file=sys.stderr)
        return None
    path = Path(path)
    rows = read_rows(path)
    if not rows:
        raise ValueError(f"{path} holds no rows to draw")
    kinds = {row["benchmark"] for row in rows}
    if kinds <= set(MODEL_BENCHMARKS):
        return model_chart(path, rows)
    if kinds <= set(LAYER_BENCHMARKS):
        return layer_chart(path, rows)
    if kinds <= set(DEPLOY_BENCHMARKS):
        return deploy_chart(path, rows)
    if kinds == {"host_pipeline"}:
        return pipeline_chart(path, rows)
    if kinds <= set(DISTRIBUTE_BENCHMARKS):
        return distribute_chart(path, rows)
    if kinds <= set(ONEDNN_BENCHMARKS):
        return onednn_chart(path, rows)
    if kinds == {"pareto"}:
        return pareto_chart(path, rows)
    if kinds == {"microbatch"}:
        return microbatch_chart(path, rows)
    raise ValueError(f"{path}: no chart for the benchmarks {sorted(kinds)}")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(render(name))
