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


def tracked_texts() -> dict[str, str]:
    """name -> text of every tracked .py and .md file (skips outside a git checkout)."""
    listed = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True,
                            text=True)
    if listed.returncode:
        pytest.skip("not a git checkout: the tracked files are unknown")
    texts = {}
    for name in listed.stdout.split():
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            texts[name] = f.read()
    return texts


def test_every_path_a_file_names_exists():
    named = {}  # path -> the files naming it
    for name, text in tracked_texts().items():
        for match in PATH.finditer(text):
            named.setdefault(match.group(1), set()).add(name)
    assert "docs/PAPERS.md" in named  # the pattern finds what it is for
    missing = {path: sorted(files) for path, files in named.items()
               if not os.path.exists(os.path.join(ROOT, path))
               and not PLACEHOLDERS & set(re.split(r"[-./]", path))}
    assert not missing, f"named but missing: {missing}"


def test_every_test_a_file_names_exists():
    """A test named in a doc or a docstring (`test_...` beyond a module's name) is defined: a
    renamed test leaves no reference behind."""
    texts = tracked_texts()
    defined = set()
    for name, text in texts.items():
        if name.startswith("tests/test_") and name.endswith(".py"):
            defined.add(name[len("tests/"):-3])  # the module itself
            defined |= set(re.findall(r"^def (test_\w+)", text, re.M))
    assert "test_every_test_a_file_names_exists" in defined  # the pattern finds what it is for
    missing = {}
    for name, text in texts.items():
        # in code, only a name in backticks or after `::` (else a variable such as test_rows);
        # a name cut at a line's end (`..._positive_` then `elsewhere`) is left out
        where = r"\b" if name.endswith(".md") else r"(?:::|`)"
        for test in re.findall(where + r"(test_\w*[a-z0-9])\b(?!_)", text):
            if test not in defined:
                missing.setdefault(test, []).append(name)
    assert not missing, f"named but not defined: {missing}"


def test_every_function_a_doc_names_in_a_file_is_defined_there():
    """`topr.py:topr_loss`, `claims.py:pool_files`: the name is a function, class or constant of
    that file, so that a renamed or removed function leaves no reference behind."""
    texts = tracked_texts()
    sources = {os.path.basename(name): text for name, text in texts.items()
               if name.endswith(".py")}
    missing, found = {}, 0
    for name, text in texts.items():
        for module, symbol in re.findall(r"`(?:[\w/]+/)?(\w+\.py):(\w+)", text):
            if module not in sources:
                continue
            found += 1
            if not re.search(rf"^\s*(?:def|class) {symbol}\b|^{symbol}\b.*=", sources[module],
                             re.M):
                missing.setdefault(f"{module}:{symbol}", []).append(name)
    assert found > 20  # the pattern finds what it is for
    assert not missing, f"named but not defined: {missing}"


def test_every_python_line_is_within_100_columns():
    """The project's one layout rule that a reader sees first (nanoGPT's, CleanRL's width)."""
    long = [f"{name}:{i}" for name, text in tracked_texts().items() if name.endswith(".py")
            for i, line in enumerate(text.splitlines(), 1) if len(line) > 100]
    assert not long, long


# a machine's folder as a path begins: a checkout, a home, a temporary folder
MACHINE_PATH = re.compile(r"(?<![\w.-])/(?:work|root|tmp|home|Users|private|var/folders)/")


def test_no_doc_names_a_run_by_a_machines_path():
    """The results in docs/ (claims' result.json files and registry, generated and hand-written
    docs) name runs relative to the repository, never a checkout's or a temporary folder's
    absolute path: a clone follows them, and `claims.py --render-only` works from any of them."""
    found, read = {}, 0
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        for name in files:
            if not name.endswith((".json", ".md", ".jsonl", ".toml")):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            read += 1
            hits = MACHINE_PATH.findall(text) + re.findall(r'"runs": \[\s*"/', text)
            if hits:
                found[os.path.relpath(path, ROOT)] = hits[:3]
    assert read > 20 and MACHINE_PATH.search('"/work/main/runs/claims/x-s0"')  # it can fail
    assert not MACHINE_PATH.search("docs/claims/NAME.json, runs/claims/x-s0, 1/tmp/2")
    assert not found, f"machine paths in: {found}"
