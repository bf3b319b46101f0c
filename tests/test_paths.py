"""Every path of the repository that a .py or .md file names exists: a renamed or deleted file
leaves no reference behind."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a file under docs, scripts, tests or tasks, or a requirements file, as text or code names it
PATH = re.compile(r"(?<![\w./-])((?:docs|scripts|tests|tasks)/[\w./-]*\w"
                  r"\.(?:py|md|png|txt|jsonl|json)|requirements[\w-]*\.txt)\b")
PLACEHOLDERS = {"TASK", "TIME", "NAME", "RUN", "DIR"}  # docs/RESULTS-TASK.md: a file per task


def named_paths() -> dict[str, set[str]]:
    """path -> the files naming it, over the tracked .py and .md files."""
    listed = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True,
                            text=True)
    if listed.returncode:
        pytest.skip("not a git checkout: the tracked files are unknown")
    named = {}
    for name in listed.stdout.split():
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            for match in PATH.finditer(f.read()):
                named.setdefault(match.group(1), set()).add(name)
    return named


def test_every_path_a_file_names_exists():
    named = named_paths()
    assert "docs/PAPERS.md" in named  # the pattern finds what it is for
    missing = {path: sorted(files) for path, files in named.items()
               if not os.path.exists(os.path.join(ROOT, path))
               and not PLACEHOLDERS & set(re.split(r"[-./]", path))}
    assert not missing, f"named but missing: {missing}"
