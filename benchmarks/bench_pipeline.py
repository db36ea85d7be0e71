"""Host pipeline throughput on real photographs: uint8 vs float32 output vs the decode ceiling.

Run with `python -m benchmarks.bench_pipeline` (add `--help` for sizes and repeats). It builds a
folder of JPEG photographs from the sample photos inside the scikit-learn and (if installed)
scikit-image wheels, resized to ImageNet-like sizes, then times with the same thread pool:

- `decode_and_crop_ceiling`: `tf.io.decode_and_crop_jpeg` alone on the in-memory bytes, with
  crop windows sampled beforehand: the host's ceiling for a fused-crop pipeline;
- `uint8_pipeline`: `make_dataset(..., training=True)` as trainers use it (random crop, flip,
  resize, batch, uint8 out), bytes cached in memory so that disk speed does not count;
- `float32_pipeline`: the same, normalized to float32 on the host (what uint8 transfer avoids);
- `uint8_unguarded`, `float32_unguarded`: the same per-example ops in a plain parallel map
  without the bad-file guard or labels, to show what the guard costs and the dtype's own cost.

Per configuration it writes one JSON row (the shared schema of benchmarks/common.py) to
benchmarks/results/pipeline.jsonl, and a chart to pipeline.png: images/s, images/s per core
(cores = the tf.data thread pool size), images per CPU-second of the process (robust to other
load on a shared machine), bytes per image sent to the device, and both ratios to the ceiling
measured in the same run (medians over interleaved repeats). `--smoke` takes a few batches of
every configuration at tiny sizes (rows to a temporary folder); `--quick` fewer and shorter
repeats (pipeline_quick.jsonl).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from benchmarks.common import add_mode_arguments, machine, make_row, parse_args, write_results
from keras_efficientnet.datasets import make_dataset, preprocessing

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32) * 255
SKIMAGE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
                  "hubble_deep_field", "retina", "camera", "coins", "moon", "grass", "gravel",
                  "brick", "clock")
# Preset options of --smoke and --quick (options on the command line still win).
SMOKE = ["--images=4", "--image_sizes=32", "--batch=2", "--seconds=0.01", "--warmup_batches=1",
         "--repeats=1", "--threads=1"]
QUICK = ["--images=100", "--seconds=1.5", "--warmup_batches=5", "--repeats=2"]


def sample_photos() -> dict[str, np.ndarray]:
    """Named RGB uint8 photographs shipped inside installed wheels (no download)."""
    from sklearn.datasets import load_sample_images

    bunch = load_sample_images()
    photos = {os.path.splitext(os.path.basename(name))[0]: image
              for name, image in zip(bunch.filenames, bunch.images)}
    try:
        import skimage.data
    except ImportError:
        print("scikit-image not installed: using scikit-learn's 2 photos only", file=sys.stderr)
        return photos
    for name in SKIMAGE_PHOTOS:
        try:
            image = getattr(skimage.data, name)()
        except (AttributeError, ImportError, OSError, ValueError) as error:  # needs a download
            print(f"skipping skimage.data.{name}: {error}", file=sys.stderr)
            continue
        if image.ndim == 2:
            image = np.stack([image] * 3, axis=-1)
        photos[name] = np.ascontiguousarray(image[..., :3]).astype(np.uint8)
    return photos


def write_photo_folder(root: str, count: int, quality: int, seed: int = 0) -> dict:
    """Writes `count` JPEGs to root/train/<photo>/: random crops of the sample photos, flipped
    half the time, resized to a short side of 375-500 px and aspect 1-1.5 (ImageNet-like)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    photos = sample_photos()
    names = sorted(photos)
    sizes, pixels = [], []
    for i in range(count):
        name = names[i % len(names)]
        image = Image.fromarray(photos[name])
        width, height = image.size
        keep = rng.uniform(0.7, 1.0)
        crop_w, crop_h = int(width * keep), int(height * keep)
        left = int(rng.integers(0, width - crop_w + 1))
        top = int(rng.integers(0, height - crop_h + 1))
        image = image.crop((left, top, left + crop_w, top + crop_h))
        short, aspect = int(rng.integers(375, 501)), rng.uniform(1.0, 1.5)
        landscape = rng.random() < 0.75
        size = (int(short * aspect), short) if landscape else (short, int(short * aspect))
        image = image.resize(size, Image.BICUBIC)
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        folder = os.path.join(root, "train", name)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{i:05d}.jpg")
        image.save(path, quality=quality)
        sizes.append(os.path.getsize(path))
        pixels.append(size[0] * size[1])
    return {"photos": len(names), "images": count, "jpeg_quality": quality,
            "mean_bytes": int(np.mean(sizes)), "mean_pixels": int(np.mean(pixels)),
            "bytes_per_pixel": round(float(np.sum(sizes) / np.sum(pixels)), 3)}


def _options(threads: int) -> tf.data.Options:
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return options


def ceiling_dataset(root: str, batch: int, threads: int) -> tf.data.Dataset:
    """decode_and_crop_jpeg alone: bytes and windows prepared up front, output only a shape."""
    paths = sorted(tf.io.gfile.glob(os.path.join(root, "train", "*", "*.jpg")))
    blobs = [tf.io.read_file(p) for p in paths]
    windows = [preprocessing.random_crop_window(tf.io.extract_jpeg_shape(b),
                                                tf.constant([0, i], tf.int64))
               for i, b in enumerate(blobs)]
    dataset = tf.data.Dataset.from_tensor_slices((tf.stack(blobs), tf.stack(windows)))
    dataset = dataset.cache().repeat().map(
        lambda data, window: tf.shape(tf.io.decode_and_crop_jpeg(data, window, channels=3)),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return dataset.batch(batch).with_options(_options(threads)).prefetch(tf.data.AUTOTUNE)


def normalize_to_float32(image: tf.Tensor) -> tf.Tensor:
    """What a float32 host pipeline ends with instead of rounding to uint8."""
    return (image - IMAGENET_MEAN) / IMAGENET_STD


def unguarded_dataset(root: str, image_size: int, batch: int, threads: int,
                      float32: bool = False) -> tf.data.Dataset:
    """The training per-example ops in a plain parallel map: no bad-file guard, no labels."""
    paths = sorted(tf.io.gfile.glob(os.path.join(root, "train", "*", "*.jpg")))
    blobs = tf.stack([tf.io.read_file(p) for p in paths])
    dataset = tf.data.Dataset.from_tensor_slices(blobs).cache().repeat()
    dataset = tf.data.Dataset.zip(dataset, tf.data.Dataset.random(0).batch(2))

    def process(data, seed):
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        image = preprocessing.decode_and_random_crop(data, image_size, crop_seed)
        return preprocessing.flip(image, flip_seed)

    with mock.patch.object(preprocessing, "to_uint8",
                           normalize_to_float32 if float32 else preprocessing.to_uint8):
        dataset = dataset.map(process, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return dataset.batch(batch).with_options(_options(threads)).prefetch(tf.data.AUTOTUNE)


def pipeline_dataset(root: str, image_size: int, batch: int, threads: int,
                     float32: bool = False) -> tf.data.Dataset:
    """make_dataset as trainers call it; with `float32` the per-example chain ends in ImageNet
    mean/std normalization instead of rounding to uint8 (everything else identical)."""
    kwargs = {"image_size": image_size, "batch_size": batch, "training": True, "cache": True,
              "repeat": True, "private_threadpool_size": threads, "max_intra_op_parallelism": 1}
    if not float32:
        return make_dataset(f"folder:{root}", "train", **kwargs)
    # make_dataset traces its functions while it builds, so patching the final conversion for
    # the duration of the call swaps uint8 rounding for float normalization in the real graph.
    with mock.patch.object(preprocessing, "to_uint8", normalize_to_float32):
        return make_dataset(f"folder:{root}", "train", **kwargs)


def bytes_per_image(dataset: tf.data.Dataset) -> int:
    """Bytes per example of what the dataset hands over (images, and labels if any)."""
    total = 0
    for part in tf.nest.flatten(dataset.element_spec):
        total += int(np.prod(part.shape[1:])) * part.dtype.size
    return total


def measure(dataset: tf.data.Dataset, batch: int, warmup_batches: int,
            seconds: float) -> tuple[float, float]:
    """(images per wall second, images per CPU second of this process) after a warm-up."""
    iterator = iter(dataset)
    for _ in range(warmup_batches):  # also lets tf.data's autotuner settle
        next(iterator)
    images, wall, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        next(iterator)
        images += batch
    return (images / (time.perf_counter() - wall), images / (time.process_time() - cpu))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="JPEGs in the photo folder")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality of the folder")
    parser.add_argument("--image_sizes", default="224,160",
                        help="training resolutions (B0 native and its reduced resolution)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="tf.data private thread pool size, the same for every config")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per repeat")
    parser.add_argument("--warmup_batches", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median)")
    parser.add_argument("--output", default="pipeline", help="results/<output>.jsonl")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    add_mode_arguments(parser)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    sizes = [int(s) for s in args.image_sizes.split(",")]

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-photos-") as root:
        photos = write_photo_folder(root, args.images, args.quality)
        print(f"photo folder: {photos}")
        # The ceiling does not depend on the output size: measured once per repeat.
        configs = {("decode_and_crop_ceiling", None): lambda size: ceiling_dataset(
            root, args.batch, args.threads)}
        for size in sizes:
            configs[("uint8_pipeline", size)] = lambda size: pipeline_dataset(
                root, size, args.batch, args.threads)
            configs[("float32_pipeline", size)] = lambda size: pipeline_dataset(
                root, size, args.batch, args.threads, float32=True)
            configs[("uint8_unguarded", size)] = lambda size: unguarded_dataset(
                root, size, args.batch, args.threads)
            configs[("float32_unguarded", size)] = lambda size: unguarded_dataset(
                root, size, args.batch, args.threads, float32=True)
        runs = {key: [] for key in configs}
        sent = {}
        for repeat in range(args.repeats):
            for key, build in configs.items():  # interleaved: drift hits every config alike
                dataset = build(key[1])
                sent[key] = None if key[1] is None else bytes_per_image(dataset)
                runs[key].append(measure(dataset, args.batch, args.warmup_batches,
                                         args.seconds))
                del dataset
                print(f"  repeat {repeat}: {key[0]:24s} {key[1] or '':>4} "
                      f"{runs[key][-1][0]:8.1f} img/s {runs[key][-1][1]:8.1f} img/cpu-s",
                      flush=True)

    medians = {key: (statistics.median(r[0] for r in runs[key]),
                     statistics.median(r[1] for r in runs[key])) for key in runs}
    ceiling = medians[("decode_and_crop_ceiling", None)]
    info = machine()
    # Other processes on the machine lower images/s but hardly images per CPU-second.
    info["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    rows = []
    for (name, size), (per_second, per_cpu_second) in medians.items():
        rows.append(make_row(
            "host_pipeline", machine=info, backend="tensorflow", variant=name,
            resolution=size, batch=args.batch,
            # What the pipeline hands to the device (the ceiling decodes to uint8).
            precision="float32" if name.startswith("float32") else "uint8",
            images_per_second=per_second, reference="decode_and_crop_ceiling",
            reference_images_per_second=ceiling[0], photos=photos, threads=args.threads,
            repeats=args.repeats, seconds=args.seconds,
            images_per_second_per_core=round(per_second / args.threads, 1),
            images_per_cpu_second=round(per_cpu_second, 1),
            bytes_per_image=sent[(name, size)],
            ratio_to_reference_cpu=round(per_cpu_second / ceiling[1], 3)))
    write_results(args.output, rows, args.output_dir, args.mode)
    print(f"\n{'config':24s} {'size':>4s} {'img/s':>8s} {'img/s/core':>10s} {'img/cpu-s':>9s} "
          f"{'bytes/img':>9s} {'vs ceiling':>10s} {'(cpu)':>6s}")
    for row in rows:
        print(f"{row['variant']:24s} {row['resolution'] or '-':>4} "
              f"{row['images_per_second']:8.1f} {row['images_per_second_per_core']:10.1f} "
              f"{row['images_per_cpu_second']:9.1f} {row['bytes_per_image'] or '-':>9} "
              f"{row['ratio_to_reference']:10.3f} {row['ratio_to_reference_cpu']:6.3f}")
    return rows


if __name__ == "__main__":
    main()
