"""Training recipes (flagfiles) by name: `--recipe=smoke`, `ke.list_recipes()`.

The flagfiles' editable source is the repository's `flags/` folder (kept in step by
`flags/generate.py`); building a wheel copies them into the package as
`keras_efficientnet/flagfiles/` (setup.py), so that recipes work from any directory after
`pip install`. Plain Python: the training command resolves `--recipe` before TensorFlow loads.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent / "flagfiles"  # in an installed wheel
SOURCE_DIR = Path(__file__).resolve().parent.parent / "flags"  # in a checkout
SUFFIX = ".flags"
LIST = "list"  # --recipe=list: the recipes and what each trains


def recipe_dir() -> Path:
    """The folder the recipes are read from: the installed copy, else the checkout's flags/."""
    for folder in (PACKAGE_DIR, SOURCE_DIR):
        if folder.is_dir() and any(folder.glob(f"*{SUFFIX}")):
            return folder
    raise FileNotFoundError(f"no recipes: neither {PACKAGE_DIR} (an installed wheel) nor "
                            f"{SOURCE_DIR} (a checkout) holds *{SUFFIX} files; reinstall")


def _names(pattern: str = "*") -> list[str]:
    """The recipe names matching a shell-style `pattern`, sorted."""
    names = sorted(path.stem for path in recipe_dir().glob(f"*{SUFFIX}"))
    return [name for name in names if fnmatch.fnmatchcase(name, pattern)]


def list_recipes(pattern: str = "*") -> dict[str, str]:
    """The recipes matching a shell-style `pattern`, sorted by name, each with its one-line
    description (`describe`): "default", "smoke", the paper's ImageNet recipes
    ("b0-g16-lnpn-half", ...). `keras-efficientnet-train --recipe=list` prints the same.

    Example:
        >>> list(list_recipes("b0-g16-*"))[:2]
        ['b0-g16-gn-half', 'b0-g16-gn-native']
        >>> list_recipes("smoke")["smoke"]
        'Smoke run: seconds on a CPU, every phase once (train at 32px, average, ...).'
    """
    return {name: describe(recipe_dir() / f"{name}{SUFFIX}") for name in _names(pattern)}


def opening_comment(path: Path) -> list[str]:
    """The lines of the comment a flagfile opens with, without their `#`."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return lines


def describe(path: Path) -> str:
    """A flagfile's one-line description: the first sentence of its opening comment (every
    flagfile opens with what it trains; `flags/generate.py` writes them), "" without one."""
    text = " ".join(opening_comment(path)).strip()
    # A sentence ends at ". " (not inside "e.g. " or "i.e. "); the whole comment otherwise.
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", text)
    return text[:end.start() + 1] if end else text


def file_flags(path: Path) -> list[str]:
    """The flags a flagfile sets, one `--flag=value` a line as it writes them."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"--flagfile={str(path)!r} cannot be read ({error.strerror})") from None
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def recipe_path(name: str) -> Path:
    """The flagfile of recipe `name`; ValueError naming the valid ones otherwise."""
    names = _names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"--recipe={name!r} is not a recipe{hint}; recipes: "
                         f"{', '.join(names)}")
    return recipe_dir() / f"{name}{SUFFIX}"


def _split_recipes(argv: list[str]) -> tuple[list[str], list[str]]:
    """(`argv[1:]` without its `--recipe` arguments, the recipe names given)."""
    rest, recipes = [], []
    arguments = iter(argv[1:])
    for arg in arguments:
        if arg == "--":
            rest += [arg, *arguments]
            break
        if arg in ("--recipe", "-recipe"):
            value = next(arguments, None)
            if value is None:
                raise ValueError("--recipe needs a name, e.g. --recipe=smoke")
            recipes.append(value)
        elif arg.startswith(("--recipe=", "-recipe=")):
            recipes.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return rest, recipes


def recipe_names(argv: list[str]) -> list[str]:
    """The recipe names `argv` gives with `--recipe`."""
    return _split_recipes(argv)[1]


def expand_recipe(argv: list[str]) -> list[str]:
    """`argv` with `--recipe=NAME` (or `--recipe NAME`) replaced by `--flagfile=PATH` placed
    first after the program name, so that every flag given on the command line overrides the
    recipe's, wherever it stands."""
    rest, recipes = _split_recipes(argv)
    if len(recipes) > 1:
        raise ValueError(f"--recipe given {len(recipes)} times ({', '.join(recipes)}); give one")
    flagfiles = [f"--flagfile={recipe_path(name)}" for name in recipes]
    return [*argv[:1], *flagfiles, *rest]


# Datasets small and built in, which some recipes are tuned for (their resolutions, flips and
# schedule fit 32x32 digits or 28x28 clothes), and the recipe for a folder of photos instead.
BUILT_IN_DATASETS = ("digits", "fashion_mnist", "synthetic")
PHOTOS_RECIPE = "finetune-photos"
PHOTOS_KIND = "folder"  # the source of one's own photos (tfds and TFRecords: ImageNet and kin)
# A recipe's flags a warning names: what makes it wrong for photos.
TUNED_FLAGS = ("--model=", "--train_resolution=", "--test_resolution=", "--norandom_flip")


def recipe_flags(name: str) -> list[str]:
    """The flag lines of recipe `name`'s flagfile (its comments left out)."""
    return [line.strip() for line in recipe_path(name).read_text().splitlines()
            if line.strip().startswith("--")]


def dataset_mismatch(name: str, dataset: str) -> str | None:
    """A one-line warning when recipe `name` is tuned for a built-in dataset and the run reads
    an image folder (photos), naming the recipe's settings that would carry over and the
    recipe to use; None otherwise."""
    lines = recipe_flags(name)
    tuned_for = next((line.split("=", 1)[1] for line in lines
                      if line.startswith("--dataset=")), None)
    if tuned_for not in BUILT_IN_DATASETS or dataset.partition(":")[0] != PHOTOS_KIND:
        return None
    settings = [line for line in lines if line.startswith(TUNED_FLAGS)]
    return (f"--recipe={name} is tuned for --dataset={tuned_for} ({' '.join(settings)}), "
            f"which carry over to --dataset={dataset}; for photos use "
            f"--recipe={PHOTOS_RECIPE}")
