"""Every scripts/*.py answers --help at once: usage on stdout, exit status 0, no work done."""
import glob
import os
import runpy
import sys

import pytest

SCRIPTS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "scripts", "*.py")))


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_every_script_answers_help_without_doing_its_work(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [path, "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put the repository first
    with pytest.raises(SystemExit) as e:
        runpy.run_path(path, run_name="__main__")
    assert e.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("usage: ") and "--help" in out
    assert os.listdir(tmp_path) == []  # nothing written


def test_every_script_is_listed_in_scripts_readme_with_the_doc_it_feeds():
    """scripts/README.md's tables: one row a script (name, what it does, what it feeds)."""
    readme = open(os.path.join(os.path.dirname(SCRIPTS[0]), "README.md")).read()
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[3].strip()
            for line in readme.splitlines() if line.startswith("| `")}
    assert sorted(rows) == sorted(os.path.basename(p) for p in SCRIPTS)
    assert all(rows.values()), rows
