"""Task registry and the task interface.

A task is a module in tasks/ that defines the names below (a problem is a plain dict whose fields
the task chooses), registered in TASKS. The scripts touch problems only through these names, so a
new task runs with every script (`--task NAME`) without changing them. tasks/countdown.py is the
reference implementation; tasks/coins.py (pay an amount with the fewest coins) shows a graded
(non-binary) reward.

    NAME: str
    REWARD_VARIANTS: tuple[str, ...]    # the first is the default reward
    SIZES: tuple[int, ...]              # difficulty levels trained on and evaluated by default
    FIELDS: tuple[str, ...]             # the JSON fields that make a problem (data files, caches)

    get_problems(split, n, *, size, seed=0, source=None) -> list[dict]
        n problems of split "train" or "test" (disjoint), reproducible from the arguments;
        source: a .jsonl file (or a hub dataset) instead of the generator.
    problem_from_row(row: dict) -> dict      # the problem in a JSON row, or ValueError naming the
                                               field
    problem_key(problem) -> str              # a stable name of the problem (caches, de-duplication)
    prompt(problem, style="instruct") -> str # or style="compact" (the tiny model's short prompt)
    demonstration(problem) -> str | None     # an SFT target completion, from the task's solver
                                             # (optional keyword steps=True: with the working
                                             # first, for sft.py --demo-steps)
    parse_answer(completion) -> str | None   # the text inside <answer>...</answer>, if any
    grade(problem, completion) -> "correct" | "wrong" | "invalid" | "no_answer"
    is_correct(problem, completion) -> bool  # grade(...) == "correct"
    reward(problem, completion, variant) -> float

Model output is untrusted input: parse it, never eval() it.
"""
import argparse
import os
import re

from . import coins, countdown

TASKS = {"countdown": countdown, "coins": coins}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name: a dataset on the hub


def get_task(name):
    """The task module registered under `name`."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from: {', '.join(TASKS)}")
    return TASKS[name]


def problem_sets(task, *, sizes, train_size, eval_sizes, eval_size, seed, source=None):
    """(training pool, held-out problems by size): `source` (a JSONL file, `hub` or a hub id), else
    `train_size` generated problems of each of `sizes`; `eval_size` held-out problems of each of
    `eval_sizes` (None: the task's SIZES for either)."""
    if source:
        pool = task.get_problems("train", train_size, source=source, seed=seed)
    else:
        pool = [p for n in sizes or task.SIZES
                for p in task.get_problems("train", train_size, size=n, seed=seed)]
    held_out = {n: task.get_problems("test", eval_size, size=n, seed=seed)
                for n in eval_sizes or task.SIZES}
    return pool, held_out


def problems_source(text: str) -> str:
    """argparse type of --problems: a JSONL file of problems, `hub` (the task's hub set) or a hub
    dataset id."""
    if text == "hub" or os.path.isfile(text) or (HUB_ID.match(text) and not os.path.exists(text)):
        return text
    raise argparse.ArgumentTypeError(f"no such file (nor `hub`, nor a hub id): {text!r}")


problems_source.__name__ = "problems source"  # argparse: "invalid problems source value: ..."
