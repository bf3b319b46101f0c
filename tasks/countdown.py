"""Countdown: combine a few given numbers with + - * / to hit a target number.

A problem is a plain dict {"nums": [44, 19, 35], "target": 98}. The model answers with an
equation inside <answer> </answer> tags. Everything task-specific lives here: the prompts, a
brute-force solver (for SFT demonstrations), the rule-based verifier and the course report's
three reward tables, and where problems come from (a seeded generator, a .jsonl file, the hub).

Grading follows [CR] §3.3 ([CR]: the course report "Off-Policy Finetuning for LLM Math
Reasoning"), whose verifier comes from TinyZero:

    correct    a valid expression that uses each given number at most once and whose FINAL
               value equals the target exactly
    wrong      a valid expression over the available numbers with another value
    invalid    an answer tag is present but its content does not parse or evaluate, or uses a
               number that is not available (or more often than it is given)
    no_answer  no complete <answer>...</answer> pair

Two rules on which verifiers differ:
* Numbers may be left unused ("each number at most once", the report's wording). TinyZero's
  verifier requires every number exactly once.
* Only the final value must equal the target; intermediate values may be fractions or negative.
  TinyZero also only compares the final (float) value. We use exact Fraction arithmetic and our
  own small parser instead of eval().
"""

import functools
import hashlib
import json
import os
import random
import re
from collections import Counter
from fractions import Fraction

from .files import read_problems

NAME = "countdown"
REWARD_VARIANTS = ("original", "A", "B")
SIZES = (3, 4)  # numbers a puzzle: the sizes trained on and evaluated by default
HUB_DATASET = "Jiayi-Pan/Countdown-Tasks-3to4"
HUB_TEST_SIZE = 1000  # rows of the hub's single split that we hold out as "test"

# ----------------------------------------------------------------------------------------------
# Rewards ([CR] §3.3)

REWARDS = {
    "original": {"correct": 1.0, "wrong": 0.1, "invalid": 0.1, "no_answer": 0.0},
    "A": {"correct": 1.0, "wrong": 0.1, "invalid": 0.1, "no_answer": 0.0},  # minus a length penalty
    "B": {"correct": 1.0, "wrong": 0.0, "invalid": -0.1, "no_answer": -0.2},
}
# Reward A subtracts 0.0003 per whitespace-separated word from completions without an answer.
NO_ANSWER_PENALTY_PER_WORD = {"original": 0.0, "A": 0.0003, "B": 0.0}


def reward(problem, completion, variant="original"):
    """Reward of one completion under table `variant` (REWARDS, plus A's length penalty).

    Never raises on a completion string: every failure to parse is an outcome, not an error.
    """
    if variant not in REWARDS:
        raise ValueError(f"unknown reward variant {variant!r}; choose from: {', '.join(REWARDS)}")
    outcome = grade(problem, completion)
    value = REWARDS[variant][outcome]
    if outcome == "no_answer":
        value -= NO_ANSWER_PENALTY_PER_WORD[variant] * len(completion.split())
    return value


def grade(problem, completion):
    """Outcome of a completion: "correct", "wrong", "invalid" or "no_answer" (module docstring)."""
    answer = parse_answer(completion)
    if answer is None:
        return "no_answer"
    try:
        value, used = parse(answer)
    except InvalidExpression:
        return "invalid"
    if Counter(used) - Counter(problem["nums"]):  # a number used more often than it is given
        return "invalid"
    return "correct" if value == problem["target"] else "wrong"


def is_correct(problem, completion):
    """True iff the completion is fully correct (what "accuracy" means everywhere)."""
    return grade(problem, completion) == "correct"


# ----------------------------------------------------------------------------------------------
# Answers: extraction, and a small exact-arithmetic parser (never eval)

_OPEN, _CLOSE = "<answer>", "</answer>"


def parse_answer(completion):
    """Stripped content of the LAST <answer>...</answer> pair (TinyZero's rule), or None.

    Linear time: reverse scans find the last closing tag and the last opening tag before it.
    An opening tag that is never closed does not count.
    """
    end = completion.rfind(_CLOSE)
    start = completion.rfind(_OPEN, 0, max(end, 0))
    if end < 0 or start < 0:
        return None
    start += len(_OPEN)
    return completion[start:completion.find(_CLOSE, start)].strip()


class InvalidExpression(ValueError):
    """Any reason why an answer is not a well-formed arithmetic expression with a value."""


MAX_EXPRESSION_CHARS = 200
MAX_LITERAL_DIGITS = 6
MAX_DEPTH = 32  # of nested parentheses
_DIGITS = "0123456789"  # ASCII only: str.isdigit() and int() also accept "١٢" or "１２"


def _tokenize(expr):
    """List of int literals and single characters from "+-*/()"; spaces are skipped."""
    if not isinstance(expr, str) or len(expr) > MAX_EXPRESSION_CHARS:
        raise InvalidExpression(f"not a string of at most {MAX_EXPRESSION_CHARS} characters")
    tokens, i = [], 0
    while i < len(expr):
        j = i
        while j < len(expr) and expr[j] in _DIGITS:
            j += 1
        if j > i:
            if j - i > MAX_LITERAL_DIGITS:
                raise InvalidExpression(f"a number with more than {MAX_LITERAL_DIGITS} digits")
            tokens.append(int(expr[i:j]))
            i = j
            continue
        if expr[i] in "+-*/()":
            tokens.append(expr[i])
        elif expr[i] != " ":
            raise InvalidExpression(f"character {expr[i]!r} is not allowed")
        i += 1
    return tokens


class _Parser:
    """Recursive descent, evaluating as it goes. No unary minus, integer literals only:

        expr   := term (("+" | "-") term)*
        term   := factor (("*" | "/") factor)*
        factor := INTEGER | "(" expr ")"
    """

    def __init__(self, tokens):
        self.tokens, self.pos, self.depth, self.numbers = tokens, 0, 0, []

    def next(self):
        tok = self.tokens[self.pos] if self.pos < len(self.tokens) else None
        self.pos += 1
        return tok

    def expr(self):
        value = self.term()
        while self.pos < len(self.tokens) and self.tokens[self.pos] in ("+", "-"):
            op, rhs = self.next(), self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self):
        value = self.factor()
        while self.pos < len(self.tokens) and self.tokens[self.pos] in ("*", "/"):
            op, rhs = self.next(), self.factor()
            if op == "/" and rhs == 0:
                raise InvalidExpression("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def factor(self):
        tok = self.next()
        if isinstance(tok, int):
            self.numbers.append(tok)
            return Fraction(tok)
        if tok != "(":
            raise InvalidExpression("unexpected end" if tok is None else f"unexpected {tok!r}")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise InvalidExpression(f"parentheses nested deeper than {MAX_DEPTH}")
        value = self.expr()
        if self.next() != ")":
            raise InvalidExpression("unbalanced parentheses")
        self.depth -= 1
        return value


def parse(expr):
    """(exact value as a Fraction, the integer literals in order of use) of an expression.

    Allowed: ASCII digits, + - * / ( ) and spaces; at most 200 characters, 6 digits per
    literal and 32 levels of parentheses. Every failure raises InvalidExpression.
    """
    tokens = _tokenize(expr)
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.pos != len(tokens):
        raise InvalidExpression(f"unexpected {tokens[parser.pos]!r}")
    return value, parser.numbers


def evaluate_expression(expr):
    """Exact value (a Fraction) of an arithmetic expression; raises InvalidExpression."""
    return parse(expr)[0]


# ----------------------------------------------------------------------------------------------
# Brute-force solver
#
# A solution is a tree: a leaf is one of the given numbers (an int), an inner node is the tuple
# (value, op, left, right). Values are ints when whole and Fractions otherwise (int arithmetic
# is much faster). For every proper subset of the numbers, smallest first, we tabulate
# {value: tree} over all expressions using exactly that subset, and stop once the target shows
# up. The full set is never tabulated: for each split into two parts we go through the values
# a of the smaller part and look up the partner b with a op b == target in the other.


def _norm(x):
    return int(x) if type(x) is Fraction and x.denominator == 1 else x


def _div(a, b):
    if type(a) is int and type(b) is int and a % b == 0:
        return a // b
    return _norm(Fraction(a) / b)


def _joins(a, b, integer_only):
    """[(op, swapped, a op b)] for every operation (b op a when swapped)."""
    if integer_only:  # keep every intermediate value a non-negative integer
        out = [("+", False, a + b), ("*", False, a * b), ("-", a < b, abs(a - b))]
        if b and a % b == 0:
            out.append(("/", False, a // b))
        if a and b % a == 0:
            out.append(("/", True, b // a))
        return out
    out = [("+", False, a + b), ("*", False, a * b), ("-", False, a - b), ("-", True, b - a)]
    if b:
        out.append(("/", False, _div(a, b)))
    if a:
        out.append(("/", True, _div(b, a)))
    return [(op, swapped, _norm(v)) for op, swapped, v in out]


def _partners(a, t):
    """[(op, swapped, b)] such that a op b == t (b op a == t when swapped)."""
    out = [("+", False, _norm(t - a)), ("-", False, _norm(a - t)), ("-", True, _norm(t + a))]
    if a:
        out += [("*", False, _div(t, a)), ("/", True, _norm(t * a))]
        if t:
            out.append(("/", False, _div(a, t)))
    return out


def _splits(mask):
    """Every split of a bit mask into two non-empty parts, once each."""
    low, sub = mask & -mask, (mask - 1) & mask
    while sub:
        if sub & low:  # the lowest bit always goes left, so (A, B) and (B, A) are not both made
            yield sub, mask ^ sub
        sub = (sub - 1) & mask


def _node(value, op, swapped, x, y):
    return (value, op, y, x) if swapped else (value, op, x, y)


@functools.lru_cache(maxsize=1 << 16)
def _search(nums, target, integer_only):
    """Solution tree for a sorted tuple of numbers, or None (memoised on the multiset)."""
    if target in nums:
        return target
    full = (1 << len(nums)) - 1
    tables = {1 << i: {v: v} for i, v in enumerate(nums)}
    for mask in sorted(range(1, full), key=lambda m: bin(m).count("1")):
        if mask in tables:
            continue
        table = tables[mask] = {}
        for left, right in _splits(mask):
            for a, tree_a in tables[left].items():
                for b, tree_b in tables[right].items():
                    for op, swapped, value in _joins(a, b, integer_only):
                        if value not in table:
                            table[value] = _node(value, op, swapped, tree_a, tree_b)
        if target in table:
            return table[target]
    for left, right in _splits(full):
        small, big = sorted((tables[left], tables[right]), key=len)
        for a, tree_a in small.items():
            for op, swapped, b in _partners(a, target):
                if b in big:
                    return _node(target, op, swapped, tree_a, big[b])
    return None


def _solution(nums, target, integer_only=False):
    """Solver tree; solutions with only non-negative integer intermediate values come first."""
    if len(nums) > 6:
        raise ValueError("the brute-force solver handles at most 6 numbers")
    nums = tuple(sorted(nums))
    tree = _search(nums, target, True)
    return _search(nums, target, False) if tree is None and not integer_only else tree


def _render(tree, top=True):
    """Expression string with every compound sub-expression parenthesised: "(45-12)+3"."""
    if isinstance(tree, int):
        return str(tree)
    _, op, left, right = tree
    text = f"{_render(left, False)}{op}{_render(right, False)}"
    return text if top else f"({text})"


def solve(nums, target, *, integer_only=False):
    """An expression over `nums` (each used at most once) equal to `target`, or None.

    Searches solutions whose intermediate values are all non-negative integers first, then
    (unless integer_only) any; smaller subsets of the numbers first. Exact arithmetic.
    """
    tree = _solution(nums, target, integer_only)
    return None if tree is None else _render(tree)


def reference(problem):
    """The solver's expression for `problem` (the one demonstration() uses), or None."""
    return solve(problem["nums"], problem["target"])


def demonstration(problem, steps=False):
    """SFT target completion (the format the tiny model learns), or None if unsolvable.

    Default: the answer tag alone, "<answer>(45-12)+3</answer>".
    steps=True: first the solution as binary steps "left<op>right=result", joined by commas
    (operands that are fractions or negative are parenthesised), then a space and the answer tag:

        "45-12=33,33+3=36 <answer>(45-12)+3</answer>"

    (A target that is one of the numbers has no steps: "<answer>36</answer>".) With the tiny model
    both formats reached the same accuracy after the same number of SFT steps, and the answer-only
    one costs about 1.7x less per step (shorter sequences), so it is the default.
    """
    tree = _solution(problem["nums"], problem["target"])
    if tree is None:
        return None
    answer = f"{_OPEN}{_render(tree)}{_CLOSE}"
    if not steps:
        return answer
    lines = []

    def walk(node):  # post-order, returns the node's value
        if isinstance(node, int):
            return node
        value, op, left, right = node
        x, y = (v if type(v) is int and v >= 0 else f"({v})" for v in (walk(left), walk(right)))
        lines.append(f"{x}{op}{y}={value}")
        return value

    walk(tree)
    return f"{','.join(lines)} {answer}" if lines else answer


# ----------------------------------------------------------------------------------------------
# Prompts

_INSTRUCT = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>."
)


def prompt(problem, style="instruct"):
    """Prompt text. "instruct": the TinyZero / [CR] instruction (the caller applies the chat
    template if the model has one); "compact": "45 12 3=36:" for the tiny character model."""
    nums, target = list(problem["nums"]), problem["target"]
    if style == "instruct":
        return _INSTRUCT.format(nums=nums, target=target)
    if style == "compact":
        return f"{' '.join(map(str, nums))}={target}:"
    raise ValueError(f"unknown prompt style {style!r}; choose from: instruct, compact")


# ----------------------------------------------------------------------------------------------
# Problems: the generator, .jsonl files, the Hugging Face hub


def _key(nums, target):
    return tuple(sorted(nums)), target


def _split_of(key):
    """Stable train/test assignment: a puzzle is a test puzzle iff sha256(key) % 5 == 0."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % 5 == 0 else "train"


def _random_puzzle(rng, num_numbers, min_number, max_number):
    """Random numbers, and the value of a random expression tree that uses all of them.

    Every intermediate value stays a positive integer: subtraction takes the smaller number
    from the larger one, and division must be exact.
    """
    nums = [rng.randint(min_number, max_number) for _ in range(num_numbers)]
    pool = list(nums)
    while len(pool) > 1:
        a, b = sorted((pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))))
        results = [b + a, b * a] + ([b - a] if b > a else []) + ([b // a] if b % a == 0 else [])
        pool.append(rng.choice(results))
    return nums, pool[0]


def _generate(split, n, num_numbers, seed, min_number, max_number, max_target):
    """n distinct puzzles of `split`, solvable by construction, reproducible from the arguments."""
    if not (isinstance(num_numbers, int) and 3 <= num_numbers <= 6):
        raise ValueError(f"size (numbers a puzzle) must be in 3..6, got {num_numbers!r}")
    if not 1 <= min_number <= max_number or max_target < 1:
        raise ValueError("need 1 <= min_number <= max_number and max_target >= 1")
    rng = random.Random(f"countdown/{seed}/{split}/{num_numbers}")  # a str seed is stable
    problems, seen, misses = [], set(), 0
    while len(problems) < n:
        nums, target = _random_puzzle(rng, num_numbers, min_number, max_number)
        key = _key(nums, target)
        if 1 <= target <= max_target and key not in seen and _split_of(key) == split:
            seen.add(key)
            problems.append({"nums": nums, "target": target})
            misses = 0
        elif (misses := misses + 1) > 200_000:
            raise ValueError(f"found only {len(problems)} distinct {split} puzzles with these "
                             "settings; widen the number range or ask for fewer")
    return problems


def get_problems(split, n, *, size=3, seed=0, source=None,
                 min_number=1, max_number=99, max_target=100):
    """At most n problems of `split` ("train" or "test").

    size: how many numbers a puzzle has (3 to 6).
    source None: the seeded generator. Train and test are disjoint (by a hash of the puzzle),
    the same arguments give the same list, and a longer list starts with the shorter one.
    source "*.jsonl": the file's first n problems (size and the ranges are ignored; which
    split a file serves is the caller's business). source "hub" (HUB_DATASET) or a hub dataset
    name "user/name": load_hub().
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if source is None:
        return _generate(split, n, size, seed, min_number, max_number, max_target)
    source = os.fspath(source)  # a str or a pathlib.Path
    if source.endswith(".jsonl"):
        return load_jsonl(source)[:n]
    if source == "hub" or ("/" in source and not os.path.exists(source)):
        return load_hub(source if "/" in source else HUB_DATASET, split, n, seed)
    raise ValueError(f"unknown problem source {source!r}: give a .jsonl file, 'hub' or 'user/name'")


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


FIELDS = ("nums", "target")  # the fields of a JSON row that make a problem


# "Using the numbers [50, 8, 1, 7], create an equation that equals 165": the instruction's words,
# as in [CR]'s SFT data (Asap7772/cog_behav_all_strategies), whose rows hold query and completion.
_QUERY = re.compile(r"numbers\s*\[([0-9,\s]{1,80})\],?\s*"
                    r"create an equation that equals\s*([0-9]{1,9})")


def problem_from_row(row):
    """The problem in a JSON object: its fields "nums" and "target", or else the numbers and target
    named in its "query" or "prompt" text (the instruction's wording); ValueError otherwise."""
    if not isinstance(row, dict):
        raise ValueError("expected an object with fields 'nums' and 'target'")
    if "nums" not in row and "target" not in row:
        text = row.get("query", row.get("prompt"))
        found = _QUERY.search(text) if isinstance(text, str) else None
        if found is None:
            raise ValueError("expected an object with fields 'nums' and 'target' (or a query "
                             "naming 'the numbers [..], create an equation that equals N')")
        row = {"nums": [int(x) for x in found[1].replace(",", " ").split()],
               "target": int(found[2])}
    if "nums" not in row or "target" not in row:
        raise ValueError("expected an object with fields 'nums' and 'target'")
    nums, target = row["nums"], row["target"]
    if not (isinstance(nums, list) and 2 <= len(nums) <= 6 and all(map(_is_int, nums))):
        raise ValueError("'nums' must be a list of 2 to 6 integers")
    if not _is_int(target):
        raise ValueError("'target' must be an integer")
    return {"nums": nums, "target": target}


def problem_key(problem):
    """A string naming the puzzle, the same for the same puzzle whatever the numbers' order."""
    return json.dumps([sorted(problem["nums"]), problem["target"]])


def load_jsonl(path):
    """Problems from a file of JSON lines {"nums": [2 to 6 ints], "target": int} (blank lines
    skipped, other fields dropped); a one-line ValueError names the file and line of any problem."""
    return read_problems(path, problem_from_row)


def load_hub(name, split, n, seed):
    """At most n problems of `split` from a hub dataset with columns "nums" and "target".

    TinyZero's set has a single "train" split, so we make our own: the row indices are shuffled
    with a FIXED seed (0) and the last HUB_TEST_SIZE = 1000 rows are "test"; train rows whose
    puzzle also occurs in test are dropped. So the test set does not depend on `seed`, which
    only shuffles the requested split before its first n distinct puzzles are taken.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    try:
        import datasets

        data = datasets.load_dataset(name, split="train")
        all_nums, all_targets = list(data["nums"]), list(data["target"])
    except Exception as e:  # no package, no network, no such dataset or columns, ...
        raise ValueError(f"loading {name} needs the `datasets` package and access to the "
                           f"Hugging Face hub: {type(e).__name__}: {e}") from e
    rows = list(range(len(all_targets)))
    random.Random(0).shuffle(rows)
    test_rows, train_rows = rows[-HUB_TEST_SIZE:], rows[:-HUB_TEST_SIZE]

    def problem(i):
        return {"nums": [int(x) for x in all_nums[i]], "target": int(all_targets[i])}

    seen = set() if split == "test" else {_key(**problem(i)) for i in test_rows}
    rows = test_rows if split == "test" else train_rows
    random.Random(f"countdown-hub/{seed}").shuffle(rows)
    problems = []
    for i in rows:
        if len(problems) == n:
            break
        p = problem(i)
        if _key(**p) not in seen:
            seen.add(_key(**p))
            problems.append(p)
    return problems
