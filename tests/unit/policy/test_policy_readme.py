"""The policy package README's example runs (STYLE 10: examples that no test runs rot)."""

from __future__ import annotations

import re
from pathlib import Path

from crescent.conductor import policy


def test_readme_example_runs():
    readme = Path(policy.__file__).with_name("README.md").read_text()
    [example] = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    exec(compile(example, "policy/README.md", "exec"), {})
