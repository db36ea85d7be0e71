"""A checkpoint folder's names and manifest: `epoch-0003[-batch-000017]` names a position, and
`manifest.json`, written last inside a checkpoint's atomic rename, lists every other file's
size and SHA-256 and the position and health it was written in. `verify` is the one check of a
checkpoint, for every way one enters a run (resume, `runs.weights`, the best copy).

Plain Python (standard library only), so that a weights flag is checked before a framework
loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

from keras_efficientnet.atomic import open_file
from keras_efficientnet.runs.record import CHECKPOINT_PREFIX as PREFIX
from keras_efficientnet.runs.record import MANIFEST

_NAME = re.compile(rf"^{PREFIX}(\d+)(?:-batch-(\d+))?$")


def checkpoint_name(epoch: int, batch: int = 0) -> str:
    """`epoch-0003` after 3 epochs; `epoch-0003-batch-000017` after 3 epochs and 17 batches of
    the fourth (a mid-epoch save)."""
    return f"{PREFIX}{epoch:04d}" + (f"-batch-{batch:06d}" if batch else "")


def position_of(path: str | os.PathLike) -> tuple[int, int] | None:
    """(epochs, batches) done at a checkpoint folder, from its name; None for other names."""
    match = _NAME.match(Path(path).name)
    return (int(match[1]), int(match[2] or 0)) if match else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_file(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, epoch: int, batch: int, healthy: bool) -> None:
    """Writes `folder/manifest.json` (flushed) describing every other file in `folder`."""
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(folder.iterdir()) if p.name != MANIFEST}
    with open_file(folder / MANIFEST, "w") as f:
        json.dump({"epoch": epoch, "batch": batch, "healthy": healthy, "files": files}, f,
                  indent=1, sort_keys=True, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(folder: str | os.PathLike) -> dict:
    """The manifest of a checkpoint folder (OSError or ValueError when unreadable)."""
    with open_file(Path(folder) / MANIFEST) as f:
        manifest = json.load(f)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError("not a manifest (no 'files' table)")
    return manifest


def _file_problem(folder: Path, name: str, expected, digest: str | None = None) -> str | None:
    path = folder / name
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return f"{name} is missing"
    if not stat.S_ISREG(mode):
        return f"{name} is not a regular file (a link or folder)"
    if not isinstance(expected, dict):
        return f"the manifest's entry of {name} is unreadable"
    size = os.stat(path).st_size
    if size != expected.get("size"):
        return f"{name} has {size} bytes, the manifest says {expected.get('size')}"
    if (digest or _sha256(path)) != expected.get("sha256"):
        return f"{name} does not match its SHA-256 in the manifest (changed after writing)"
    return None


def verify(folder: str | os.PathLike, position: tuple[int, int] | None = None,
           digests: dict[str, str] | None = None) -> str | None:
    """Why a checkpoint folder cannot be trusted (a file missing, resized, changed or
    unlisted, or the manifest unreadable or written for another position), or None when it is
    intact. Reads every file once, or not at all where `digests` (name: SHA-256) gives its
    hash. `position`: (epochs, batches) the manifest must state; default the folder's name's."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except FileNotFoundError:
        return f"{MANIFEST} is missing (not written by this version, or tampered with)"
    except (OSError, ValueError) as error:
        return f"{MANIFEST} is unreadable ({str(error).splitlines()[0][:120]})"
    if (manifest.get("epoch"), manifest.get("batch")) != (position or position_of(folder)):
        return (f"{MANIFEST} was written for epoch {manifest.get('epoch')} batch "
                f"{manifest.get('batch')}, not for this folder's position")
    listed = manifest["files"]
    for name in sorted(listed):
        problem = _file_problem(folder, name, listed[name], (digests or {}).get(name))
        if problem:
            return problem
    extra = sorted(p.name for p in folder.iterdir() if p.name not in listed
                   and p.name != MANIFEST)
    return f"{', '.join(extra)} not in its manifest" if extra else None


def is_healthy(folder: str | os.PathLike) -> bool:
    """Whether the loss looked healthy when `folder` was written: from its manifest (a folder
    without a readable one counts as not healthy: it is never resumed from)."""
    try:
        return bool(read_manifest(folder).get("healthy", False))
    except (OSError, ValueError):
        return False


def checkpoint_folders(directory: str | os.PathLike) -> list[Path]:
    """The checkpoint folders of `directory`, oldest first: real folders named by a position,
    no links."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if position_of(p) is not None
             and not p.is_symlink() and p.is_dir()]
    return sorted(found, key=position_of)
