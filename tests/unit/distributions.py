"""What an image must install: the crescent-* distributions a set of repository packages
require, following `[extra]` requirements (crescent-engine[kv]) into that extra's list."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def project(package: str) -> dict:
    return tomllib.loads((ROOT / package / "pyproject.toml").read_text())["project"]


def missing_crescent_requirements(packages: list[str]) -> list[tuple[str, str]]:
    """(package, requirement) for each crescent-* requirement of `packages`, or of an extra they
    ask for, that none of `packages` provides."""
    by_name = {project(package)["name"]: package for package in packages}
    missing = []
    for package in packages:
        for text in project(package).get("dependencies", []):
            requirement = Requirement(text)
            if not requirement.name.startswith("crescent-"):
                continue
            if requirement.name not in by_name:
                missing.append((package, text))
                continue
            extras = project(by_name[requirement.name]).get("optional-dependencies", {})
            for extra in requirement.extras:
                missing += [
                    (package, f"{text}: {needed}")
                    for needed in extras[extra]
                    if Requirement(needed).name not in by_name
                ]
    return missing
