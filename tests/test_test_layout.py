"""The test tree's own rules. Test directories are not packages (pytest's default rootdir
import mode), so two test modules with one basename collide at collection and stop the whole
run: found when tests/training/test_resume.py joined tests/reliability/test_resume.py."""

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def test_test_module_basenames_are_unique():
    by_name = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each: {clashes}"


def test_every_test_directory_mirrors_a_package_or_is_known():
    # tests/<dir>/ mirrors keras_efficientnet/<dir>/ (issue 19, point 8). The two others:
    # reliability/ holds end-to-end fault cases, benchmarks/ tests the benchmarks/ scripts.
    package = TESTS.parent / "keras_efficientnet"
    known = {"reliability", "benchmarks", "__pycache__"}
    strays = sorted(
        d.name for d in TESTS.iterdir()
        if d.is_dir() and d.name not in known and not (package / d.name).is_dir()
    )
    assert strays == []
