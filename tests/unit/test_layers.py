"""The layer rules of pyproject.toml [tool.importlinter] hold for the repository, and each
kind of rule does fail on an import that breaks it (so the check cannot pass vacuously)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def source_dirs() -> list[Path]:
    return sorted([*ROOT.glob("libs/*/src"), *ROOT.glob("services/*/src"), ROOT / "bench/src"])


def lint_imports(paths: list[Path]) -> subprocess.CompletedProcess:
    """lint-imports on the repository's contracts, importing the packages from `paths`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(path) for path in paths)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_repository_keeps_every_layer_rule():
    result = lint_imports(source_dirs())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("service", "module", "source", "contract"),
    [
        ("conductor", "crescent/conductor/policy/bad.py", "import asyncio\n", "policy is pure"),
        (
            "conductor",
            "crescent/conductor/bad.py",
            "import crescent.store.pool\n",
            "services never import each other",
        ),
        (
            "conductor",
            "crescent/conductor/bad.py",
            "import crescent.engine.kv_store\n",
            "the conductor needs neither the store client nor the data plane",
        ),
    ],
)
def test_a_violating_import_breaks_its_contract(tmp_path, service, module, source, contract):
    """A copy of one service's sources with one bad module, in place of the original."""
    copy = tmp_path / service
    shutil.copytree(ROOT / "services" / service / "src", copy)
    (copy / module).write_text(source)
    original = ROOT / "services" / service / "src"
    result = lint_imports([copy if path == original else path for path in source_dirs()])
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts", 1)[1]
    assert contract in broken, result.stdout


def test_libs_importing_a_service_breaks_the_rule(tmp_path):
    copy = tmp_path / "common"
    shutil.copytree(ROOT / "libs/common/src", copy)
    (copy / "crescent/common/bad.py").write_text("import crescent.conductor.app\n")
    original = ROOT / "libs/common/src"
    result = lint_imports([copy if path == original else path for path in source_dirs()])
    assert result.returncode != 0
    assert "libs never import services" in result.stdout.split("Broken contracts", 1)[1]
