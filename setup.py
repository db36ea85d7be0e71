"""Copies the recipes (flags/*.flags, their editable source) into the wheel as
keras_efficientnet/flagfiles/, where `--recipe=NAME` finds them after `pip install`. The rest of
the metadata is in setup.cfg."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithRecipes(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "keras_efficientnet" / "flagfiles"
        target.mkdir(parents=True, exist_ok=True)
        flagfiles = sorted((ROOT / "flags").glob("*.flags"))
        if not flagfiles:
            raise SystemExit(f"no recipes in {ROOT / 'flags'}: build from a full checkout")
        for path in flagfiles:
            shutil.copyfile(path, target / path.name)


setup(cmdclass={"build_py": BuildWithRecipes})
