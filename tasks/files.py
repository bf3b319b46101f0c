"""Problems from a JSONL file, for any task: one reader, so every task reports bad files alike."""
import json


def read_problems(path, problem_from_row):
    """The problems of a file of JSON lines, each made by the task's `problem_from_row`.

    Blank lines are skipped. Any problem raises a one-line ValueError naming the file and line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise ValueError(f"no such data file: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    problems = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            problems.append(problem_from_row(json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: bad JSON ({e.msg})") from None
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
    if not problems:
        raise ValueError(f"{path} holds no problems")
    return problems
