"""The README's Python example runs as written (the command-line block is run in test_cli)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_example_runs():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README has a Python example"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for code in blocks:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "zCDP" in proc.stdout  # it printed the guarantee
