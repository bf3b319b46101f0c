"""JSON-lines files of problems and samples, for any task: one reader, so every script and task
reports a bad file alike (one line naming the file and line, a ValueError), one atomic writer."""
import json
import os


def numbered_rows(path: str, what: str = "data file"):
    """(line number, JSON object) of each non-blank line of a JSONL file; a bad file is a one-line
    ValueError naming it and the line, and a truncated last line (what a killed writer leaves) is
    reported as such, never skipped silently."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise ValueError(f"no such {what}: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {what} {path}: {e}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            truncated = lineno == len(lines) and not line.endswith("\n")
            cut = " (truncated: a killed writer?)" if truncated else ""
            raise ValueError(f"{path}:{lineno}: bad JSON{cut} ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected an object, got {type(row).__name__}")
        yield lineno, row


def read_jsonl(path: str, what: str = "data file") -> list[dict]:
    """The JSON objects of a JSONL file (numbered_rows)."""
    return [row for _, row in numbered_rows(path, what)]


def write_jsonl(path: str, rows: list[dict]) -> None:
    """One JSON object a line, written into a temporary sibling and renamed: a reader (or a resumed
    run) never sees half a file."""
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    os.replace(path + ".tmp", path)


def read_problems(path, problem_from_row):
    """The problems of a file of JSON lines, each made by the task's `problem_from_row`; any problem
    is a one-line ValueError naming the file and line."""
    problems = []
    for lineno, row in numbered_rows(path):
        try:
            problems.append(problem_from_row(row))
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
    if not problems:
        raise ValueError(f"{path} holds no problems")
    return problems
