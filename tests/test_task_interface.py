"""The task interface documented in tasks/__init__.py is the whole interface: a task written from
its names alone (here a parity task) runs with every script, and `--model tiny` writes nothing
outside the run folder."""
import os
import random
import re
import types

import pytest

import agro
import rloo
import sft
import spo
import tasks
import topr

OPEN, CLOSE = "<answer>", "</answer>"


def parity_task() -> types.ModuleType:
    """A task with exactly the documented names: the parity (0 or 1) of a string of bits."""
    t = types.ModuleType("parity")
    t.NAME, t.REWARD_VARIANTS, t.SIZES, t.FIELDS = "parity", ("binary",), (4,), ("bits",)

    def get_problems(split, n, *, size, seed=0, source=None):
        rng = random.Random(f"{seed}-{size}")
        every = sorted({format(i, f"0{size}b") for i in range(2 ** size)})
        rng.shuffle(every)
        half = every[:len(every) // 2] if split == "train" else every[len(every) // 2:]
        return [{"bits": b} for b in (half * n)[:n]]

    def problem_from_row(row):
        if not isinstance(row, dict) or not isinstance(row.get("bits"), str):
            raise ValueError("expected an object with a string field 'bits'")
        return {"bits": row["bits"]}

    def parse_answer(completion):
        m = re.search(f"{OPEN}(.*?){CLOSE}", completion)
        return m.group(1) if m else None

    def grade(problem, completion):
        answer = parse_answer(completion)
        if answer is None:
            return "no_answer"
        if answer.strip() not in ("0", "1"):
            return "invalid"
        return "correct" if int(answer) == problem["bits"].count("1") % 2 else "wrong"

    t.get_problems, t.problem_from_row, t.parse_answer, t.grade = (get_problems, problem_from_row,
                                                                  parse_answer, grade)
    t.problem_key = lambda problem: problem["bits"]
    t.prompt = lambda problem, style="instruct": (
        f"{problem['bits']}:" if style == "compact" else
        f"Is the number of ones in {problem['bits']} odd (1) or even (0)? Answer in {OPEN}{CLOSE}.")
    t.demonstration = lambda problem: f"{OPEN}{problem['bits'].count('1') % 2}{CLOSE}"
    t.is_correct = lambda problem, completion: grade(problem, completion) == "correct"
    t.reward = lambda problem, completion, variant: float(t.is_correct(problem, completion))
    return t


EVAL = ["--task", "parity", "--model", "tiny", "--eval-size", "4", "--eval-k", "2",
        "--max-new-tokens", "12", "--threads", "1"]
SCRIPTS = {  # a step or two of each
    "sft": (sft, ["--steps", "2", "--batch-size", "4", "--train-size", "8", "--eval-every", "2"]),
    "rloo": (rloo, ["--steps", "1", "--prompts", "2", "--group-size", "2", "--train-size", "8"]),
    "topr": (topr, ["--iterations", "1", "--prompts", "2", "--group-size", "2", "--batch-size", "4",
                    "--train-size", "8"]),
    "agro": (agro, ["--mode", "offpolicy", "--steps", "1", "--prompts", "2", "--group-size", "2",
                    "--offline-prompts", "2", "--train-size", "8"]),
    "spo": (spo, ["--steps", "1", "--train-size", "2", "--batch-size", "4",
                  "--group-size", "2"]),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_task_written_to_the_documented_interface_runs_with_every_script(name, tmp_path,
                                                                          monkeypatch, capsys):
    monkeypatch.setitem(tasks.TASKS, "parity", parity_task())
    monkeypatch.chdir(tmp_path)
    module, budget = SCRIPTS[name]
    out = module.main(EVAL + budget + ["--out", "run"])
    assert out == "run"
    assert os.path.isdir(os.path.join("run", "final"))
    assert os.listdir(tmp_path) == ["run"]  # `tiny` was built inside the run folder
    said = capsys.readouterr().out.splitlines()  # the closing lines (tests/test_run_section.py)
    done = [i for i, line in enumerate(said) if line.startswith(f"{name}.py done.")][-1]
    assert said[done].startswith(f"{name}.py done. Held-out accuracy (%), step 0 -> step ")
    assert said[done + 1].startswith("  size 4: greedy 0.0 -> ") and ", T = 1 " in said[done + 1]
    rest = said[done + 2:]
    if rest[0].startswith("no learning signal: "):  # a step or two of an untrained model
        rest = rest[1:]
    if rest[0].startswith("most held-out samples were cut at --max-new-tokens"):  # it rarely stops
        rest = rest[1:]
    assert rest[0] == "run folder: run (final model: run/final)"
    assert rest[1:] == (["next: python topr.py --task parity --model run/final"]
                        if name == "sft" else [])


def test_demo_steps_with_a_task_that_has_no_steps_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(tasks.TASKS, "parity", parity_task())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        sft.main(EVAL + ["--demo-steps", "--out", "run"])
    assert e.value.code == 2
    assert "--demo-steps" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not os.path.exists("run")
