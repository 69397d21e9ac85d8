"""The README's commands run as printed: every ```bash block marked `<!-- runnable -->` is run, one
test per command, in a fresh folder per block (a later command may read what an earlier one wrote),
and a block marked `<!-- output -->` right after it must appear in what the block printed, line for
line (trailing spaces aside; a `...` line stands for lines left out). `pip install` and `pytest`
segments are skipped: the suite runs inside an install already. Also: the README stays at most 300
lines and its quick start keeps the two commands .ci/run and a new user rely on."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
RUNNABLE, OUTPUT = "<!-- runnable -->", "<!-- output -->"


def _blocks() -> list[tuple[int, list[str], list[str] | None]]:
    """(block index, kvsim argument strings, expected output lines or None) per runnable block."""
    lines = README.read_text(encoding="utf-8").splitlines()
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != RUNNABLE:
            i += 1
            continue
        assert lines[i + 1].startswith("```"), f"README line {i + 2}: a runnable marker must precede a code block"
        end = lines.index("```", i + 2)
        body = "\n".join(lines[i + 2:end]).replace("\\\n", " ")
        commands = []
        for line in body.splitlines():
            line = line.split(" # ")[0].strip()
            if not line or line.startswith("#"):
                continue
            for segment in line.split("&&"):
                words = shlex.split(segment)
                if words and words[0] == "kvsim":
                    commands.append(words[1:])
                else:
                    assert words[:2] in (["pip", "install"], ["python", "-m"]), f"README: cannot run {segment!r}"
        expected = None
        j = end + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and lines[j].strip() == OUTPUT:
            close = lines.index("```", j + 2)
            expected = lines[j + 2:close]
        out.append((len(out), commands, expected))
        i = end + 1
    return out


BLOCKS = _blocks()
CASES = [(index, k, args, expected if k == len(commands) - 1 else None)
         for index, commands, expected in BLOCKS for k, args in enumerate(commands)]
_printed: dict[int, list[str]] = {}  # block -> lines printed so far by its commands


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {index: tmp_path_factory.mktemp(f"readme-block{index}") for index, _, _ in BLOCKS}


def test_readme_has_runnable_blocks_and_stays_short():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    quick = text.split("\n## ")[1]
    assert quick.startswith("Quick start")
    assert "pip install . && kvsim run --policy continuous --block-size 16" in quick
    assert "pip install '.[test]' && python -m pytest" in quick
    assert len(CASES) >= 10


@pytest.mark.parametrize("index, k, args, expected", CASES,
                         ids=[f"block{i}-{k}-{' '.join(a)[:60]}" for i, k, a, _ in CASES])
def test_readme_command_runs(index, k, args, expected, folders):
    proc = subprocess.run([sys.executable, "-m", "kvsim.cli.main", *args], cwd=folders[index],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"kvsim {shlex.join(args)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    printed = _printed.setdefault(index, [])
    printed += [line.rstrip() for line in proc.stdout.splitlines()]
    if expected is None:
        return
    have = set(printed)
    missing = [line for line in expected if line.strip() != "..." and line.rstrip() not in have]
    assert not missing, f"README output of block {index} no longer printed:\n" + "\n".join(missing)
