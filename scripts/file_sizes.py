"""Lines of each algorithm script, by part: what a student reads, counted with `ast`.

    python scripts/file_sizes.py                  # this checkout
    python scripts/file_sizes.py --root OTHER     # another checkout (e.g. a git worktree)

Columns: whole file; main(); the longest function; the settings (parse_args); the run section (from
its "# ---- Run section" header to `if __name__`, in checkouts before common.Run); the paper and
its loop (the teaching assistant's measure of issue 69: the lines of the functions that the
docstring's equation map names, plus main()'s loops) and its share of the file. The last line:
what a student copies for topr (topr.py, common.py, tasks/).
"""
import argparse
import ast
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["sft.py", "rloo.py", "topr.py", "agro.py", "spo.py"]


def sizes(path: str) -> dict:
    src = open(path).read()
    tree = ast.parse(src)
    top = {n.name: n.end_lineno - n.lineno + 1 for n in tree.body
           if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    functions = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef)]
    lines = len(src.splitlines())
    header = src.find("# ---- Run section")
    end = src.find('if __name__ == "__main__"')
    run = src[header:end].count("\n") if header >= 0 else 0
    return {"lines": lines, "main": top.get("main", 0), "settings": top.get("parse_args", 0),
            "longest": max(functions, key=lambda f: f[1]), "run": run,
            "paper": paper_and_loop(tree)}


def paper_and_loop(tree: ast.Module) -> int:
    """Lines of the top-level functions the module docstring names (its equation map), plus
    the loops at the top level of main()'s body."""
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", ast.get_docstring(tree) or ""))
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    paper = sum(n.end_lineno - n.lineno + 1 for n in functions
                if n.name in named and n.name != "main")
    main = next((n for n in functions if n.name == "main"), None)
    loops = sum(n.end_lineno - n.lineno + 1 for n in (main.body if main else [])
                if isinstance(n, (ast.For, ast.While)))
    return paper + loops


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=ROOT, help="the checkout to count")
    root = p.parse_args().root
    print(f"{'file':9}{'lines':>6}{'main':>6}  {'longest function':20}{'settings':>9}"
          f"{'run section':>12}{'paper+loop':>11}{'share':>7}")
    for name in SCRIPTS:
        s = sizes(os.path.join(root, name))
        longest = f"{s['longest'][0]} {s['longest'][1]}"
        print(f"{name:9}{s['lines']:6}{s['main']:6}  {longest:20}{s['settings']:9}{s['run']:12}"
              f"{s['paper']:11}{100 * s['paper'] / s['lines']:6.0f}%")
    copied = [os.path.join(root, "topr.py"), os.path.join(root, "common.py"),
              *sorted(glob.glob(os.path.join(root, "tasks", "*.py")))]
    print(f"topr.py + common.py + tasks/: {sum(len(open(f).read().splitlines()) for f in copied)} "
          "lines")


if __name__ == "__main__":
    main()
