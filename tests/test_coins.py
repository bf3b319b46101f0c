"""Tests for tasks/coins.py (fewest coins): generator, verifier, graded rewards, solver, and a few
steps of every script on it with the tiny model."""

import itertools
import json
import os
import random
import time

import pytest

from tasks import coins as cn
from tasks import get_task

P = {"coins": [1, 7, 10], "amount": 14}  # fewest: 7+7 (2 coins); largest-first: 10+1+1+1+1 (5)


def brute_force_fewest(coins, amount):
    """Fewest coins by trying every multiset of growing size (the definition, written out)."""
    for n in range(amount + 1):
        if any(sum(c) == amount for c in itertools.combinations_with_replacement(coins, n)):
            return n
    return None


# ---------------------------------------------------------------------------------------------
# Grading and rewards

@pytest.mark.parametrize("completion, outcome, graded", [
    ("<answer>7+7</answer>", "correct", 1.0),
    ("<think>14-7=7</think> <answer> 7 + 7 </answer>", "correct", 1.0),
    ("<answer>10+1+1+1+1</answer>", "wrong", 0.2 + 0.6 * 2 / 5),  # exact, 5 coins where 2 do
    ("<answer>1+10+1+1+1</answer>", "wrong", 0.2 + 0.6 * 2 / 5),  # any order
    ("<answer>7+1+1+1+1+1+1+1</answer>", "wrong", 0.2 + 0.6 * 2 / 8),
    ("<answer>10+1+1+1</answer>", "wrong", 0.2 * (1 - 1 / 14)),  # pays 13
    ("<answer>7+7+7</answer>", "wrong", 0.2 * (1 - 7 / 14)),  # pays 21
    ("<answer>10+10+10</answer>", "wrong", 0.0),  # pays 30: more than twice too much
    ("<answer>10+4</answer>", "invalid", 0.0),  # 4 is not a coin
    ("<answer>14</answer>", "invalid", 0.0),
    ("<answer>2*7</answer>", "invalid", 0.0),
    ("<answer>7+7=14</answer>", "invalid", 0.0),
    ("<answer>07+7</answer>", "invalid", 0.0),  # no leading zeros
    ("<answer>7++7</answer>", "invalid", 0.0),
    ("<answer>+7+7</answer>", "invalid", 0.0),
    ("<answer>7,7</answer>", "invalid", 0.0),
    ("<answer></answer>", "invalid", 0.0),
    ("7+7", "no_answer", 0.0),
    ("<answer>7+7", "no_answer", 0.0),
    ("", "no_answer", 0.0),
])
def test_grade_and_rewards(completion, outcome, graded):
    assert cn.grade(P, completion) == outcome
    assert cn.is_correct(P, completion) == (outcome == "correct")
    assert cn.reward(P, completion, "graded") == pytest.approx(graded, abs=1e-12)
    assert cn.reward(P, completion) == cn.reward(P, completion, "graded")  # the default
    assert cn.reward(P, completion, "binary") == (1.0 if outcome == "correct" else 0.0)


def test_graded_reward_is_a_ladder():
    """Closer sums earn more, any exact payment more than any other sum, fewer coins more, the
    fewest most: the levels a binary reward lacks."""
    p = {"coins": [1, 5, 6], "amount": 20}  # fewest: 5+5+5+5; largest-first: 6+6+6+1+1
    assert cn.fewest_coins(p["coins"], p["amount"]) == 4
    answers = ["5+5+5+5", "6+6+6+1+1", "6+6+5+1+1+1", "5+5+5+1+1+1+1+1", "1+" * 19 + "1",
               "6+6+6+1", "6+6+6", "5+5", "5", "6+6+6+6+6+6+6"]
    values = [cn.reward(p, f"<answer>{a}</answer>", "graded") for a in answers]
    assert values[0] == 1.0 and values[-1] == 0.0
    assert all(a > b for a, b in zip(values, values[1:])), values
    assert min(values[:5]) > 0.2 >= max(values[5:])  # exact beats every other sum
    assert all(cn.reward(p, f"<answer>{a}</answer>", "binary") == 0.0 for a in answers[1:])


def test_unknown_variant_raises():
    with pytest.raises(ValueError, match="graded, binary"):
        cn.reward(P, "<answer>7+7</answer>", "original")


def test_the_last_answer_tag_counts():
    assert cn.grade(P, "<answer>10+4</answer> no: <answer>7+7</answer>") == "correct"
    assert cn.grade(P, "<answer>7+7</answer> no: <answer>10+4</answer>") == "invalid"
    assert cn.grade(P, "</answer>7+7<answer>") == "no_answer"
    assert cn.parse_answer("a <answer>  7 + 7 \n</answer> b") == "7 + 7"


ADVERSARIAL = [
    "__import__('os').system('x')",
    "7**2",
    "14/1",
    "7" * 10_000,
    "7+" * 5_000 + "7",
    "(7+7)",
    "-7+21",
    "٧+٧",  # Arabic-Indic digits
    "７+７",  # full-width digits
    "7.0+7",
    "0x7+7",
    "7_0",
    "lambda: 14",
    "\x00",
    "7\n+7",
]


@pytest.mark.parametrize("answer", ADVERSARIAL)
def test_adversarial_answers_are_invalid_and_fast(answer, monkeypatch):
    monkeypatch.setattr("builtins.eval", lambda *a: pytest.fail("eval() called on model output"))
    completion = f"<think>hmm</think><answer>{answer}</answer>"
    t = time.perf_counter()
    assert cn.grade(P, completion) == "invalid"
    assert all(cn.reward(P, completion, v) == 0.0 for v in cn.REWARD_VARIANTS)
    assert time.perf_counter() - t < 0.05


def test_random_completions_never_raise():
    rng = random.Random(0)
    alphabet = "0171+ <answer></answer>x\n"
    for _ in range(2000):
        completion = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert cn.grade(P, completion) in ("correct", "wrong", "invalid", "no_answer")
        assert all(isinstance(cn.reward(P, completion, v), float) for v in cn.REWARD_VARIANTS)
    t = time.perf_counter()
    assert cn.grade(P, "word " * 200_000) == "no_answer"
    assert cn.grade(P, "<answer>" + "7+" * 500_000 + "7</answer>") == "invalid"
    assert time.perf_counter() - t < 0.5


# ---------------------------------------------------------------------------------------------
# Solver


def test_solver_finds_the_fewest_coins_where_largest_first_does_not():
    assert cn.solve([1, 7, 10], 14) == [7, 7]
    assert cn.greedy([1, 7, 10], 14) == [10, 1, 1, 1, 1]
    assert cn.solve([1, 3, 4], 6) == [3, 3]
    assert cn.solve([1, 5, 10, 25], 30) == [25, 5]
    assert cn.fewest_coins([3, 5], 7) is None and cn.solve([3, 5], 7) is None
    assert cn.demonstration(P) == "<answer>7+7</answer>"
    assert cn.demonstration(P, steps=True) == "14-7=7,7-7=0 <answer>7+7</answer>"
    assert cn.demonstration({"coins": [3, 5], "amount": 7}) is None


def test_solver_against_brute_force():
    rng = random.Random(1)
    for _ in range(150):
        coins = sorted(rng.sample(range(1, 15), rng.randint(1, 4)))
        amount = rng.randint(1, 30)
        best = brute_force_fewest(coins, amount)
        assert cn.fewest_coins(coins, amount) == best, (coins, amount)
        paid = cn.solve(coins, amount)
        if best is None:
            assert paid is None
        else:
            assert sum(paid) == amount and len(paid) == best and set(paid) <= set(coins)
            assert paid == sorted(paid, reverse=True)
            assert cn.is_correct({"coins": coins, "amount": amount}, cn.demonstration(
                {"coins": coins, "amount": amount}))


# ---------------------------------------------------------------------------------------------
# Generator, rows, registry


@pytest.mark.parametrize("size", cn.SIZES)
def test_generator_is_reproducible_disjoint_and_solvable(size):
    train = cn.get_problems("train", 300, size=size, seed=0)
    test = cn.get_problems("test", 300, size=size, seed=0)
    assert cn.get_problems("train", 300, size=size, seed=0) == train
    assert cn.get_problems("train", 100, size=size, seed=0) == train[:100]  # a prefix
    assert cn.get_problems("train", 300, size=size, seed=1) != train
    keys = {cn.problem_key(p) for p in train}
    assert len(keys) == 300 and not keys & {cn.problem_key(p) for p in test}
    for p in train + test:
        assert len(p["coins"]) == size and 1 in p["coins"]
        assert cn.MIN_AMOUNT <= p["amount"] <= cn.MAX_AMOUNT and max(p["coins"]) <= cn.MAX_COIN
        assert 1 <= cn.fewest_coins(p["coins"], p["amount"]) <= cn.MAX_PAID
        assert cn.is_correct(p, cn.demonstration(p))
    # the solver is needed: largest-first is not always fewest on this distribution
    share = sum(len(cn.greedy(p["coins"], p["amount"])) > cn.fewest_coins(p["coins"], p["amount"])
                for p in test) / len(test)
    assert share > 0.1, share


def test_generator_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        cn.get_problems("valid", 3)
    with pytest.raises(ValueError, match="positive"):
        cn.get_problems("train", 0)
    with pytest.raises(ValueError, match="2..6"):
        cn.get_problems("train", 3, size=1)
    with pytest.raises(ValueError, match="jsonl"):
        cn.get_problems("train", 3, source="problems.csv")


def test_problem_rows_and_files(tmp_path):
    row = {"coins": [10, 1, 7], "amount": 14, "extra": "ignored"}
    assert cn.problem_from_row(row) == {"coins": [10, 1, 7], "amount": 14}
    assert cn.problem_key({"coins": [10, 1, 7], "amount": 14}) == cn.problem_key(P)
    for bad, match in [({"coins": [1, 7]}, "amount"), ({"coins": "17", "amount": 3}, "coins"),
                       ({"coins": [1, 1], "amount": 3}, "distinct"),
                       ({"coins": [1, True], "amount": 3}, "coins"),
                       ({"coins": [1, 7], "amount": 0}, "amount"),
                       ({"coins": [3, 5], "amount": 7}, "cannot")]:
        with pytest.raises(ValueError, match=match):
            cn.problem_from_row(bad)
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(P) + "\n\n" + json.dumps({"coins": [1, 4], "amount": 9}) + "\n")
    assert cn.get_problems("test", 5, source=str(path)) == [P, {"coins": [1, 4], "amount": 9}]
    path.write_text(json.dumps(P) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"p.jsonl:2: bad JSON"):
        cn.get_problems("test", 5, source=str(path))


def test_prompts():
    assert cn.prompt(P, "compact") == "1 7 10>14:"
    text = cn.prompt(P, "instruct")
    assert "14" in text and "[1, 7, 10]" in text and "<answer>" in text
    with pytest.raises(ValueError, match="instruct, compact"):
        cn.prompt(P, "chat")


def test_registered_with_the_whole_interface():
    task = get_task("coins")
    assert task is cn and task.NAME == "coins" and task.REWARD_VARIANTS[0] == "graded"
    for name in ("SIZES", "FIELDS", "get_problems", "problem_from_row", "problem_key", "prompt",
                 "demonstration", "parse_answer", "grade", "is_correct", "reward"):
        assert hasattr(task, name), name
    assert set(task.FIELDS) == set(task.problem_from_row(P))


# ---------------------------------------------------------------------------------------------
# Every script runs a few steps on the task from its default command (tiny model, small budgets)

SMALL = ["--task", "coins", "--threads", "1", "--seed", "0", "--max-new-tokens", "12",
         "--eval-size", "3", "--eval-k", "1", "--sizes", "3", "--eval-sizes", "3"]
SCRIPTS = {  # script -> its flags for a run of a few steps
    "rloo": ["--engine", "kv", "--steps", "2", "--prompts", "2", "--group-size", "2",
             "--train-size", "20", "--eval-every", "1000"],
    "topr": ["--engine", "hf", "--iterations", "1", "--epochs", "1", "--prompts", "4",
             "--group-size", "2", "--batch-size", "4", "--train-size", "20", "--reward", "graded"],
    "agro": ["--engine", "hf", "--mode", "onpolicy", "--steps", "2", "--prompts", "2",
             "--group-size", "3", "--train-size", "20", "--eval-every", "1000"],
    "spo": ["--engine", "kv", "--steps", "2", "--train-size", "4", "--q0-samples", "2",
            "--batch-size", "4", "--group-size", "2", "--warmup", "1",
            "--eval-every", "1000"],
}


def _metrics(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def test_sft_runs_on_coins(tmp_path):
    import sft
    out = sft.main(SMALL[:-2] + ["--steps", "4", "--eval-every", "2", "--train-size", "40",
                                 "--batch-size", "8", "--warmup", "1", "--eval-sizes", "3",
                                 "--out", str(tmp_path / "run")])
    start, *rows = _metrics(out)  # step 0: the start model's evaluation
    assert start["step"] == 0 and "eval3/greedy/accuracy" in start
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["loss"] < rows[0]["loss"]  # learning the solver's demonstrations
    assert 0.0 <= rows[-1]["eval3/greedy/accuracy"] <= 1.0
    assert "eval4/greedy/accuracy" not in rows[-1]  # --eval-sizes 3 only
    assert os.path.exists(os.path.join(out, "final", "config.json"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_rl_script_runs_on_coins(script, tiny_path, tmp_path):
    main = __import__(script).main
    out = main(SMALL + SCRIPTS[script] + ["--model", tiny_path, "--out", str(tmp_path / "run")])
    rows = _metrics(out)
    assert rows[-1]["step"] > 0
    assert rows and all("eval3/sampled/accuracy" in r for r in rows if "eval3/greedy/accuracy" in r)
    assert any("eval3/greedy/accuracy" in r for r in rows)
    assert os.path.exists(os.path.join(out, "final", "config.json"))
    if script == "topr":  # its data file: coins problems, graded rewards recomputable from the text
        data = [json.loads(line) for line in open(os.path.join(out, "data-0.jsonl"))]
        assert len(data) == 4 * 2
        for row in data:
            problem = cn.problem_from_row(row["problem"])
            assert row["reward"] == cn.reward(problem, row["completion"], "graded")
            assert row["grade"] == cn.grade(problem, row["completion"])


def test_topr_default_reward_runs_on_coins(tiny_path, tmp_path):
    """topr.py's default reward (pm1) with --task coins: its evaluation reports the task's first
    reward variant (graded), not Countdown's 'original'."""
    import topr
    flags = [f for f in SCRIPTS["topr"] if f not in ("--reward", "graded")]
    out = topr.main(SMALL + flags + ["--model", tiny_path, "--out", str(tmp_path / "run")])
    rows = _metrics(out)
    assert "eval3/sampled/reward" in rows[-1]
    data = [json.loads(line) for line in open(os.path.join(out, "data-0.jsonl"))]
    assert {row["reward"] for row in data} <= {1.0, -1.0}
