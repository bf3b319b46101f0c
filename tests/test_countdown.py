"""Tests for tasks/countdown.py and the task registry (pure Python, a few seconds)."""

import itertools
import random
import re
import sys
import time
import types
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from tasks import countdown as cd
from tasks import get_task

DATA = Path(__file__).parent / "data" / "countdown_small.jsonl"
P = {"nums": [3, 5, 7], "target": 22}


# ---------------------------------------------------------------------------------------------
# Grading and rewards

EXPECTED = {  # outcome -> (original, A, B); A's no_answer value depends on the word count
    "correct": (1.0, 1.0, 1.0),
    "wrong": (0.1, 0.1, 0.0),
    "invalid": (0.1, 0.1, -0.1),
}


@pytest.mark.parametrize("completion, outcome", [
    ("<answer>3*5+7</answer>", "correct"),
    ("<think>3*5=15, 15+7=22</think> <answer> (3 * 5) + 7 </answer>", "correct"),
    ("<answer>7+3*5</answer>", "correct"),
    ("<answer>3+5+7</answer>", "wrong"),
    ("<answer>5*3</answer>", "wrong"),  # not every number has to be used
    ("<answer>3*5+8</answer>", "invalid"),  # 8 is not available
    ("<answer>5*5</answer>", "invalid"),  # 5 used twice
    ("<answer>22</answer>", "invalid"),
    ("<answer></answer>", "invalid"),
    ("<answer>3*5+7=22</answer>", "invalid"),
    ("<answer>-3+5*5</answer>", "invalid"),  # no unary minus
])
def test_grade_and_every_reward_variant(completion, outcome):
    assert cd.grade(P, completion) == outcome
    assert cd.is_correct(P, completion) == (outcome == "correct")
    for variant, expected in zip(cd.REWARD_VARIANTS, EXPECTED[outcome]):
        assert cd.reward(P, completion, variant) == expected
    assert cd.reward(P, completion) == EXPECTED[outcome][0]  # "original" is the default


@pytest.mark.parametrize("completion", ["no tags here at all", "four words, no answer", ""])
def test_no_answer_rewards(completion):
    words = len(completion.split())
    assert cd.grade(P, completion) == "no_answer"
    assert cd.reward(P, completion, "original") == 0.0
    assert cd.reward(P, completion, "A") == pytest.approx(-0.0003 * words, abs=1e-15)
    assert cd.reward(P, completion, "B") == -0.2


def test_no_answer_penalty_values():
    assert cd.reward(P, "four words, no answer", "A") == pytest.approx(-0.0012)
    assert cd.reward(P, "no tags here at all", "A") == pytest.approx(-0.0015)
    assert cd.reward(P, "x " * 1000, "A") == pytest.approx(-0.3)


def test_unknown_variant_raises():
    with pytest.raises(ValueError, match="original, A, B"):
        cd.reward(P, "<answer>3*5+7</answer>", "C")


def test_fractional_intermediate_values_are_allowed():
    p = {"nums": [1, 3, 4, 6], "target": 24}
    assert cd.grade(p, "<answer>6/(1-3/4)</answer>") == "correct"
    assert cd.grade({"nums": [2, 9, 3, 8], "target": 84}, "<answer>8*(3/2+9)</answer>") == "correct"
    assert cd.grade({"nums": [1, 3, 4, 6], "target": 23}, "<answer>6/(1-3/4)</answer>") == "wrong"
    assert cd.grade(p, "<answer>6/(1-3/4)+1</answer>") == "invalid"  # 1 used twice
    assert cd.grade(p, "<answer>6/(3-3)</answer>") == "invalid"  # division by zero (and 3 twice)
    assert cd.grade(p, "<answer>6/(4-4)</answer>") == "invalid"


def test_the_last_answer_tag_counts():
    assert cd.grade(P, "<answer>3+5+7</answer> no, <answer>3*5+7</answer>") == "correct"
    assert cd.grade(P, "<answer>3*5+7</answer> no, <answer>3+5+7</answer>") == "wrong"
    assert cd.grade(P, "<answer>3*5+7</answer> <answer>oops</answer>") == "invalid"
    assert cd.grade(P, "<answer>3*5+7") == "no_answer"  # unclosed
    assert cd.grade(P, "<answer>3+5+7</answer> then <answer>3*5+7") == "wrong"
    assert cd.grade(P, "</answer>3*5+7<answer>") == "no_answer"


def test_parse_answer():
    assert cd.parse_answer("a <answer>  1 + 2 \n</answer> b") == "1 + 2"
    assert cd.parse_answer("<answer>x</answer><answer>y</answer>") == "y"
    assert cd.parse_answer("<answer>x</answer> stray </answer>") == "x"
    assert cd.parse_answer("<answer>") is None
    assert cd.parse_answer("") is None
    t = time.perf_counter()
    assert cd.parse_answer("<answer>" * 200_000 + "</answer" * 200_000) is None
    assert time.perf_counter() - t < 0.05


ADVERSARIAL = [
    "__import__('os').system('x')",
    "9**9**9",
    "1/0",
    "3" * 10_000,
    "(3+" * 3_000 + "5" + ")" * 3_000,
    "(" * 500 + "22" + ")" * 500,
    "١٢+٣",  # Arabic-Indic digits
    "１２",  # full-width digits
    "3²",
    "99999999999*9999999",
    "3.0*5+7",
    "0x16",
    "3_5",
    "(3*5)+7)",
    "((3*5)+7",
    "3 5 7",
    "lambda: 22",
    "\x00",
]


@pytest.mark.parametrize("answer", ADVERSARIAL)
def test_adversarial_answers_are_invalid_and_fast(answer):
    completion = f"<think>hmm</think><answer>{answer}</answer>"
    for variant in cd.REWARD_VARIANTS:
        t = time.perf_counter()
        r = cd.reward(P, completion, variant)
        assert time.perf_counter() - t < 0.05
        assert r == EXPECTED["invalid"][cd.REWARD_VARIANTS.index(variant)]
    with pytest.raises(cd.InvalidExpression):
        cd.evaluate_expression(answer)


def test_adversarial_completions_never_raise():
    rng = random.Random(0)
    alphabet = "0123456789+-*/() <answer></answer>x\n"
    for _ in range(2000):
        completion = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert cd.grade(P, completion) in ("correct", "wrong", "invalid", "no_answer")
        for variant in cd.REWARD_VARIANTS:
            assert isinstance(cd.reward(P, completion, variant), float)
    t = time.perf_counter()
    assert cd.grade(P, "word " * 200_000) == "no_answer"
    assert cd.reward(P, "<answer>" + "1+" * 500_000 + "1</answer>", "B") == -0.1
    assert time.perf_counter() - t < 0.5


# ---------------------------------------------------------------------------------------------
# The expression parser


@pytest.mark.parametrize("expr, value, numbers", [
    ("2+3*4", 14, [2, 3, 4]),
    ("(2+3)*4", 20, [2, 3, 4]),
    ("8-3-2", 3, [8, 3, 2]),
    ("8/4/2", 1, [8, 4, 2]),
    ("1/3+1/3", Fraction(2, 3), [1, 3, 1, 3]),
    (" ( ( 7 ) ) ", 7, [7]),
    ("007", 7, [7]),
    ("999999*999999", 999999 ** 2, [999999, 999999]),
])
def test_parse_values_and_numbers(expr, value, numbers):
    got, used = cd.parse(expr)
    assert got == value and isinstance(got, Fraction)
    assert used == numbers
    assert cd.evaluate_expression(expr) == value


@pytest.mark.parametrize("expr", [
    "", " ", "1+", "*1", "1 2", "()", "(1", "1)", "-1", "+1", "1--1", "1/0", "1/(2-2)",
    "1234567", "1" * 201, "(" * 33 + "1" + ")" * 33, "1.5", "1e3", "1\t+2", None,
])
def test_parse_rejects(expr):
    with pytest.raises(cd.InvalidExpression):
        cd.parse(expr)
    assert issubclass(cd.InvalidExpression, ValueError)


def test_parse_limits_are_inclusive():
    assert cd.evaluate_expression("(" * 32 + "1" + ")" * 32) == 1
    assert cd.evaluate_expression("123456") == 123456
    assert cd.evaluate_expression("1+" * 99 + "1") == 100  # 199 characters


# ---------------------------------------------------------------------------------------------
# Solver and demonstrations


def _uses_at_most_once(expr, nums):
    return not Counter(cd.parse(expr)[1]) - Counter(nums)


def test_solver_on_random_puzzles():
    rng = random.Random(1)
    solved = 0
    for _ in range(300):
        k = rng.choice((3, 4))
        p = {"nums": [rng.randint(1, 30) for _ in range(k)], "target": rng.randint(1, 100)}
        expr = cd.solve(p["nums"], p["target"])
        if expr is not None:
            solved += 1
            assert cd.grade(p, f"<answer>{expr}</answer>") == "correct"
            assert _uses_at_most_once(expr, p["nums"])
        strict = cd.solve(p["nums"], p["target"], integer_only=True)
        if strict is not None:
            assert cd.evaluate_expression(strict) == p["target"]
            assert expr is not None
    assert solved > 60


def _naive_solvable(values, target):
    """Independent check: combine any ordered pair of remaining values, recursively."""
    if target in values:
        return True
    for i, j in itertools.permutations(range(len(values)), 2):
        a, b = values[i], values[j]
        rest = [v for k, v in enumerate(values) if k not in (i, j)]
        for c in [a + b, a - b, a * b] + ([a / b] if b else []):
            if _naive_solvable(rest + [c], target):
                return True
    return False


def test_solver_agrees_with_naive_search():
    rng = random.Random(4)
    for k, count in ((3, 200), (4, 25)):
        for _ in range(count):
            nums, target = [rng.randint(1, 30) for _ in range(k)], rng.randint(1, 100)
            found = cd.solve(nums, target) is not None
            assert found == _naive_solvable([Fraction(x) for x in nums], target), (nums, target)


def test_solver_known_cases():
    assert cd.solve([1, 1, 1], 100) is None
    assert cd.solve([1, 1, 1], 100, integer_only=True) is None
    assert cd.reference({"nums": [1, 1, 1], "target": 100}) is None
    assert cd.demonstration({"nums": [1, 1, 1], "target": 100}, steps=True) is None
    assert cd.solve([5, 36, 2], 36) == "36"
    # 84 from [2, 9, 3, 8] needs a fraction: 8 * (3/2 + 9)
    assert cd.solve([2, 9, 3, 8], 84, integer_only=True) is None
    expr = cd.solve([2, 9, 3, 8], 84)
    assert expr is not None and cd.evaluate_expression(expr) == 84
    assert cd.solve([3, 3, 8, 8], 24) is not None
    with pytest.raises(ValueError):
        cd.solve([1] * 7, 3)


def test_solver_prefers_integer_intermediates():
    # 6/(1-3/4) also reaches 24, but 4*6 keeps every value a non-negative integer
    assert cd.demonstration({"nums": [1, 3, 4, 6], "target": 24}, steps=True) == (
        "4*6=24 <answer>4*6</answer>")
    # 10+(8-12) and 6*(7/3) are found first without the preference
    assert cd.demonstration({"nums": [12, 8, 10], "target": 6}, steps=True) == (
        "12-8=4,10-4=6 <answer>10-(12-8)</answer>")
    assert cd.reference({"nums": [7, 3, 6], "target": 14}) == "7*(6/3)"
    rng = random.Random(2)
    for _ in range(100):
        p = {"nums": [rng.randint(1, 20) for _ in range(4)], "target": rng.randint(1, 100)}
        if cd.solve(p["nums"], p["target"], integer_only=True) is not None:
            steps = cd.demonstration(p, steps=True).split("<answer>")[0].strip()
            assert all(re.fullmatch(r"\d+[-+*/]\d+=\d+", s) for s in steps.split(",") if s)


def _value(text):
    return Fraction(text.strip("()"))


def _check_demonstration(p, demo):
    """The documented format, every step's arithmetic, and the grade of the whole thing."""
    assert cd.grade(p, demo) == "correct", (p, demo)
    m = re.fullmatch(r"(?:(.+) )?<answer>([^<]+)</answer>", demo)
    assert m, demo
    assert cd.reference(p) == m.group(2)
    if m.group(1) is None:
        assert p["target"] in p["nums"]
        return
    for step in m.group(1).split(","):
        s = re.fullmatch(r"(\(?-?[\d/]+\)?)([-+*/])(\(?-?[\d/]+\)?)=(-?[\d/]+)", step)
        assert s, step
        x, op, y, result = _value(s[1]), s[2], _value(s[3]), _value(s[4])
        assert {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else None}[op] == result
    assert result == p["target"]


def test_default_demonstration_is_the_answer_alone():
    for p in cd.load_jsonl(DATA):
        demo = cd.demonstration(p)
        assert demo == f"<answer>{cd.reference(p)}</answer>"
        assert cd.grade(p, demo) == "correct"


def test_demonstration_format():
    assert cd.demonstration({"nums": [45, 12, 3], "target": 45}, steps=True) == (
        "<answer>45</answer>")
    demo = cd.demonstration({"nums": [45, 12, 3], "target": 30}, steps=True)
    assert demo == "45-3=42,42-12=30 <answer>(45-3)-12</answer>"
    frac = cd.demonstration({"nums": [2, 9, 3, 8], "target": 84}, steps=True)
    assert "3/2=3/2" in frac and "<answer>" in frac
    for p in cd.load_jsonl(DATA):
        _check_demonstration(p, cd.demonstration(p, steps=True))


@pytest.mark.parametrize("k", [3, 4, 5, 6])
def test_generated_puzzles_are_solvable_and_demonstrations_correct(k):
    problems = cd.get_problems("train", 150 if k <= 4 else 40, size=k, seed=3)
    for p in problems:
        assert len(p["nums"]) == k and all(1 <= x <= 99 for x in p["nums"])
        assert 1 <= p["target"] <= 100
        assert cd.solve(p["nums"], p["target"]) is not None
        _check_demonstration(p, cd.demonstration(p, steps=True))


# ---------------------------------------------------------------------------------------------
# Problems: generator


def _keys(problems):
    return {(tuple(sorted(p["nums"])), p["target"]) for p in problems}


def test_generator_reproducible_and_seeded():
    a = cd.get_problems("train", 200, seed=0)
    assert a == cd.get_problems("train", 200, seed=0)
    assert a[:50] == cd.get_problems("train", 50, seed=0)
    assert a != cd.get_problems("train", 200, seed=1)
    assert len(_keys(a)) == 200  # distinct
    assert all(type(x) is int for p in a for x in p["nums"] + [p["target"]])
    state = random.getstate()
    cd.get_problems("test", 10, seed=5)
    assert random.getstate() == state  # the global RNG is not touched


def test_generator_train_test_disjoint():
    for k in (3, 4):
        train = cd.get_problems("train", 500, size=k)
        test = cd.get_problems("test", 500, size=k)
        assert len(_keys(train)) == len(_keys(test)) == 500
        assert not _keys(train) & _keys(test)
        # a different seed still never puts a test puzzle into train
        assert not _keys(cd.get_problems("train", 500, size=k, seed=9)) & _keys(test)
    # in a tiny puzzle space the two splits would collide at once if they were not kept apart
    small = dict(min_number=1, max_number=6, max_target=20)
    train, test = cd.get_problems("train", 60, **small), cd.get_problems("test", 15, **small)
    assert not _keys(train) & _keys(test)


def test_generator_ranges():
    ps = cd.get_problems("test", 100, size=4, min_number=10, max_number=20, max_target=50)
    assert all(len(p["nums"]) == 4 and all(10 <= x <= 20 for x in p["nums"]) for p in ps)
    assert all(1 <= p["target"] <= 50 for p in ps)
    assert len({p["target"] for p in ps}) > 10


@pytest.mark.parametrize("kwargs", [
    dict(split="valid", n=5),
    dict(split="train", n=0),
    dict(split="train", n=-3),
    dict(split="train", n=2.5),
    dict(split="train", n=True),
    dict(split="train", n=5, size=2),
    dict(split="train", n=5, size=7),
    dict(split="train", n=5, min_number=0),
    dict(split="train", n=5, min_number=50, max_number=10),
    dict(split="train", n=5, max_target=0),
    dict(split="train", n=5, source="not_a_source"),
])
def test_get_problems_bad_args(kwargs):
    split, n = kwargs.pop("split"), kwargs.pop("n")
    with pytest.raises(ValueError):
        cd.get_problems(split, n, **kwargs)


def test_generator_reports_exhausted_settings():
    with pytest.raises(ValueError, match="distinct"):
        cd.get_problems("train", 50, min_number=1, max_number=1)


# ---------------------------------------------------------------------------------------------
# Problems: files and the hub


def test_load_jsonl_and_source():
    problems = cd.load_jsonl(DATA)
    assert len(problems) == 8
    assert problems[0] == {"nums": [44, 19, 35], "target": 98}
    assert all(set(p) == {"nums", "target"} for p in problems)  # extra fields dropped
    assert cd.get_problems("test", 3, source=str(DATA)) == problems[:3]
    assert cd.get_problems("train", 100, source=str(DATA), size=6) == problems


@pytest.mark.parametrize("content, message", [
    ("", "holds no problems"),
    ("\n  \n", "holds no problems"),
    ('{"nums": [1, 2], "target": 3}\n{"nums": [1, 2], "target": \n', ":2: bad JSON"),
    ('{"nums": [1, 2]}\n', ":1: expected an object"),
    ('[1, 2, 3]\n', ":1: expected an object"),
    ('\n{"nums": [1, 2], "target": "3"}\n', ":2: 'target' must be an integer"),
    ('{"nums": [1, 2], "target": 3.0}\n', "'target' must be an integer"),
    ('{"nums": [1, 2], "target": true}\n', "'target' must be an integer"),
    ('{"nums": [1, true], "target": 3}\n', "'nums' must be"),
    ('{"nums": [1], "target": 3}\n', "'nums' must be"),
    ('{"nums": [1, 2, 3, 4, 5, 6, 7], "target": 3}\n', "'nums' must be"),
    ('{"nums": "1 2", "target": 3}\n', "'nums' must be"),
])
def test_load_jsonl_malformed(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        cd.load_jsonl(str(path))
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError):
        cd.get_problems("train", 5, source=str(path))


def test_load_jsonl_blank_lines_and_missing_file(tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_text('\n{"nums": [1, 2], "target": 3}\n\n{"nums": [4, 5, 6], "target": 7}')
    assert cd.load_jsonl(path) == [{"nums": [1, 2], "target": 3}, {"nums": [4, 5, 6], "target": 7}]
    missing = tmp_path / "nope" / "missing.jsonl"
    with pytest.raises(ValueError, match="no such data file: .*missing.jsonl"):
        cd.load_jsonl(str(missing))
    with pytest.raises(ValueError, match="no such data file"):
        cd.get_problems("train", 5, source=str(missing))


def _fake_datasets(monkeypatch, rows=1500, fail=None):
    """Install a fake `datasets` module; returns the list of names it was asked for."""
    calls = []
    rng = random.Random(0)
    puzzles = [([rng.randint(1, 99) for _ in range(rng.choice((3, 4)))], i) for i in range(rows)]
    puzzles += puzzles[:200]  # duplicated rows, some of which will land in test and train

    def load_dataset(name, split):
        calls.append((name, split))
        if fail:
            raise fail
        return {"nums": [p[0] for p in puzzles], "target": [p[1] for p in puzzles]}

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_hub_loader_with_fake_datasets(monkeypatch):
    calls = _fake_datasets(monkeypatch)
    test = cd.get_problems("test", 5000, source="hub")
    assert calls[-1] == (cd.HUB_DATASET, "train")
    assert 900 < len(test) <= 1000 and len(_keys(test)) == len(test)
    train = cd.get_problems("train", 5000, source="hub", seed=0)
    assert not _keys(train) & _keys(test)
    assert len(_keys(test)) + len(_keys(train)) == 1500
    assert cd.get_problems("train", 50, source="hub", seed=0) == train[:50]
    other = cd.get_problems("train", 50, source="hub", seed=1)
    assert other != train[:50]
    assert _keys(cd.get_problems("test", 5000, source="hub", seed=7)) == _keys(test)
    assert all(type(x) is int for p in train for x in p["nums"] + [p["target"]])
    cd.get_problems("train", 3, source="someone/other-countdown")
    assert calls[-1] == ("someone/other-countdown", "train")


def test_hub_loader_errors(monkeypatch):
    _fake_datasets(monkeypatch, fail=ConnectionError("offline"))
    with pytest.raises(ValueError, match="needs the `datasets` package.*offline"):
        cd.get_problems("train", 5, source="hub")
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ValueError, match="Jiayi-Pan/Countdown-Tasks-3to4 needs the `datasets`"):
        cd.load_hub(cd.HUB_DATASET, "train", 5, 0)
    with pytest.raises(ValueError):
        cd.load_hub(cd.HUB_DATASET, "dev", 5, 0)


# ---------------------------------------------------------------------------------------------
# Prompts and the registry


def test_prompts():
    p = {"nums": [44, 19, 35], "target": 98}
    assert cd.prompt(p) == cd.prompt(p, "instruct") == (
        "Using the numbers [44, 19, 35], create an equation that equals 98. You can use basic "
        "arithmetic operations (+, -, *, /) and each number can only be used once. Show your "
        "work in <think> </think> tags. And return the final answer in <answer> </answer> "
        "tags, for example <answer> (1 + 2) / 3 </answer>.")
    assert cd.prompt({"nums": (45, 12, 3), "target": 36}, "compact") == "45 12 3=36:"
    with pytest.raises(ValueError):
        cd.prompt(p, "chat")


def test_registry():
    assert get_task("countdown") is cd
    assert cd.NAME == "countdown" and cd.REWARD_VARIANTS == ("original", "A", "B")
    with pytest.raises(ValueError, match="unknown task 'nope'; choose from: countdown"):
        get_task("nope")


def test_problem_from_row_reads_fields_or_the_instructions_own_words():
    """[CR]'s SFT data carries only query/completion: the problem is read from the query's words."""
    assert cd.problem_from_row({"nums": [3, 5], "target": 8}) == {"nums": [3, 5], "target": 8}
    query = ("User: Using the numbers [50, 8, 1, 7], create an equation that equals 165. You can "
             "use basic arithmetic operations\nAssistant: Let me solve this step by step.")
    assert cd.problem_from_row({"query": query, "completion": "x"}) == {"nums": [50, 8, 1, 7],
                                                                        "target": 165}
    assert cd.problem_from_row({"prompt": cd.prompt({"nums": [4, 9, 2], "target": 11})}) == {
        "nums": [4, 9, 2], "target": 11}
    for bad in [{"query": "Using the numbers 3 and 5, make 8"}, {"prompt": 7}, {"nums": [1, 2]},
                {"nums": [1, "2"], "target": 3}, [1, 2]]:
        with pytest.raises(ValueError):
            cd.problem_from_row(bad)
