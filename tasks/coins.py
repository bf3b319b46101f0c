"""Coins: pay an amount with the fewest coins from a given set of denominations.

A problem is a plain dict {"coins": [1, 7, 10], "amount": 14}; every denomination may be used any
number of times, and 1 is always among them, so every amount can be paid. The model answers with
the coins it pays, added up, inside <answer> </answer> tags: "<answer>7+7</answer>". The fewest
coins is what a dynamic programme finds (the solver, for SFT demonstrations); always taking the
largest coin that fits is often enough, but not always (14 = 10+1+1+1+1 with 5 coins, or 7+7).

What it adds to Countdown: a graded reward. An answer can miss the amount by a little or a lot,
or pay it exactly and still not be best, so between "right" and "wrong" lies a ladder of partial
credit, and the algorithms' handling of rewards that are not 0/1 shows (beside the binary
variant). The ladder's top step is a length term: more coins than needed is a longer answer.

Grading (exact integer arithmetic, our own parser; model output is never eval()'d):

    correct    coins from the set, added up with "+", that pay the amount with the fewest coins
    wrong      coins from the set that pay another amount, or the amount with more coins than needed
    invalid    an answer tag whose content is not "c+c+...+c" over the given denominations
    no_answer  no complete <answer>...</answer> pair

Rewards (REWARD_VARIANTS; the first is the default), with c* the fewest coins, c the coins paid
and s their sum, for an answer over the given denominations (invalid or no answer: 0):

    graded   1 if correct (s = amount, c = c*); 0.2 + 0.6 c*/c if s = amount but c > c*;
             0.2 max(0, 1 - |s - amount| / amount) if s != amount
             (closer pays more, an exact payment more still, the fewest coins most)
    binary   1 if correct, 0 otherwise
"""

import functools
import hashlib
import itertools
import json
import os

from .files import read_problems

NAME = "coins"
REWARD_VARIANTS = ("graded", "binary")
SIZES = (3, 4)  # denominations a problem: the sizes trained on and evaluated by default
FIELDS = ("coins", "amount")  # the fields of a JSON row that make a problem
MIN_AMOUNT, MAX_AMOUNT = 10, 40  # small, so that the tiny model can learn to pay exactly
MAX_COIN = 15  # largest denomination the generator uses
MAX_PAID = 6  # the generator keeps problems paid with at most 6 coins (answers stay short)

# ----------------------------------------------------------------------------------------------
# Rewards

CLOSE_CREDIT = 0.2  # the most a payment of another sum earns; an exact one earns more


def reward(problem, completion, variant="graded"):
    """Reward of one completion under `variant` (module docstring). Never raises on a completion."""
    if variant not in REWARD_VARIANTS:
        raise ValueError(f"unknown reward variant {variant!r}; "
                         f"choose from: {', '.join(REWARD_VARIANTS)}")
    coins, amount = payment(problem, completion), problem["amount"]
    if coins is None:
        return 0.0
    best = fewest_coins(problem["coins"], amount)
    if sum(coins) == amount and len(coins) == best:
        return 1.0
    if variant == "binary":
        return 0.0
    if sum(coins) == amount:
        return CLOSE_CREDIT + (1 - 2 * CLOSE_CREDIT) * best / len(coins)
    return CLOSE_CREDIT * max(0.0, 1 - abs(sum(coins) - amount) / amount)


def payment(problem, completion):
    """The coins of the answer (a list), or None if there is no answer or it is invalid."""
    answer = parse_answer(completion)
    try:
        return parse_coins(answer, problem["coins"]) if answer is not None else None
    except InvalidPayment:
        return None


def grade(problem, completion):
    """Outcome of a completion: "correct", "wrong", "invalid" or "no_answer" (module docstring)."""
    answer = parse_answer(completion)
    if answer is None:
        return "no_answer"
    try:
        coins = parse_coins(answer, problem["coins"])
    except InvalidPayment:
        return "invalid"
    if sum(coins) == problem["amount"] and len(coins) == fewest_coins(problem["coins"],
                                                                      problem["amount"]):
        return "correct"
    return "wrong"


def is_correct(problem, completion):
    """True iff the completion pays the amount with the fewest coins (what "accuracy" means)."""
    return grade(problem, completion) == "correct"


# ----------------------------------------------------------------------------------------------
# Answers: extraction and a strict parser (never eval)

_OPEN, _CLOSE = "<answer>", "</answer>"
_DIGITS = "0123456789"  # ASCII only: str.isdigit() and int() also accept "١٢" or "１２"
MAX_ANSWER_CHARS = 200
MAX_COIN_DIGITS = 4


def parse_answer(completion):
    """Stripped content of the LAST <answer>...</answer> pair, or None (Countdown's rule).

    Linear time; an opening tag that is never closed does not count.
    """
    end = completion.rfind(_CLOSE)
    start = completion.rfind(_OPEN, 0, max(end, 0))
    if end < 0 or start < 0:
        return None
    start += len(_OPEN)
    return completion[start:completion.find(_CLOSE, start)].strip()


class InvalidPayment(ValueError):
    """Any reason why an answer is not a sum of the given denominations."""


def parse_coins(answer, denominations):
    """The coins of an answer "c+c+...+c" (spaces allowed), each one of `denominations`.

    At most 200 characters and 4 digits a coin, no leading zeros; raises InvalidPayment.
    """
    if not isinstance(answer, str) or len(answer) > MAX_ANSWER_CHARS:
        raise InvalidPayment(f"not a string of at most {MAX_ANSWER_CHARS} characters")
    coins = []
    for term in answer.replace(" ", "").split("+"):
        if not term or any(ch not in _DIGITS for ch in term):
            raise InvalidPayment(f"{term!r} is not a coin")
        if len(term) > MAX_COIN_DIGITS or term[0] == "0":
            raise InvalidPayment(f"{term!r} is not a coin")
        if int(term) not in denominations:
            raise InvalidPayment(f"{term} is not one of the denominations")
        coins.append(int(term))
    return coins


# ----------------------------------------------------------------------------------------------
# Solver: dynamic programming over amounts


@functools.lru_cache(maxsize=1 << 16)
def _table(coins, amount):
    """best[a] = fewest coins that pay a, for a = 0..amount (None: cannot be paid)."""
    best = [0] + [None] * amount
    for a in range(1, amount + 1):
        options = [best[a - c] for c in coins if c <= a and best[a - c] is not None]
        best[a] = min(options) + 1 if options else None
    return best


def fewest_coins(coins, amount):
    """The fewest coins from `coins` (any number of each) that pay `amount`, or None."""
    return _table(tuple(sorted(set(coins))), amount)[amount]


def solve(coins, amount):
    """A payment with the fewest coins, largest coins first ([10, 1, 1] rather than [1, 10, 1]),
    or None. Of several fewest payments, the one that takes the largest coin soonest."""
    denominations = tuple(sorted(set(coins), reverse=True))
    best = _table(tuple(sorted(denominations)), amount)
    if best[amount] is None:
        return None
    paid, left = [], amount
    while left:
        coin = next(c for c in denominations if c <= left and best[left - c] == best[left] - 1)
        paid.append(coin)
        left -= coin
    return paid


def greedy(coins, amount):
    """The largest coin that fits, again and again (a baseline: not always fewest), or None."""
    paid, left = [], amount
    for c in sorted(set(coins), reverse=True):
        paid += [c] * (left // c)
        left %= c
    return paid if left == 0 else None


def demonstration(problem, steps=False):
    """SFT target completion, "<answer>10+2+2</answer>", or None if the amount cannot be paid.

    steps=True: first the amount left after each coin, then the answer:
    "14-10=4,4-2=2,2-2=0 <answer>10+2+2</answer>".
    """
    paid = solve(problem["coins"], problem["amount"])
    if paid is None:
        return None
    answer = f"{_OPEN}{'+'.join(map(str, paid))}{_CLOSE}"
    if not steps:
        return answer
    lines, left = [], problem["amount"]
    for c in paid:
        lines.append(f"{left}-{c}={left - c}")
        left -= c
    return f"{','.join(lines)} {answer}"


# ----------------------------------------------------------------------------------------------
# Prompts

_INSTRUCT = (
    "Pay the amount {amount} with the fewest coins, using only the denominations {coins} (each "
    "any number of times). Show your work in <think> </think> tags. And return the final answer "
    "in <answer> </answer> tags as the coins added up, for example <answer> 5 + 5 + 1 </answer>."
)


def prompt(problem, style="instruct"):
    """Prompt text. "instruct": an instruction like Countdown's (the caller applies the chat
    template if the model has one); "compact": "1 7 10>14:" for the tiny character model."""
    coins, amount = list(problem["coins"]), problem["amount"]
    if style == "instruct":
        return _INSTRUCT.format(amount=amount, coins=coins)
    if style == "compact":
        return f"{' '.join(map(str, coins))}>{amount}:"
    raise ValueError(f"unknown prompt style {style!r}; choose from: instruct, compact")


# ----------------------------------------------------------------------------------------------
# Problems: the generator and .jsonl files


def _split_of(key):
    """Stable train/test assignment: a problem is a test problem iff sha256(key) % 5 == 0."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % 5 == 0 else "train"


@functools.lru_cache(maxsize=8)
def _all_problems(size):
    """Every problem with `size` denominations that the generator gives, as (coins, amount)."""
    return [((1,) + others, amount)
            for others in itertools.combinations(range(2, MAX_COIN + 1), size - 1)
            for amount in range(MIN_AMOUNT, MAX_AMOUNT + 1)
            if fewest_coins((1,) + others, amount) <= MAX_PAID]


def _generate(split, n, size, seed):
    """The first n problems of `split` in an order fixed by `seed` (all of them if fewer)."""
    if not (isinstance(size, int) and not isinstance(size, bool) and 2 <= size <= 6):
        raise ValueError(f"size (denominations a problem) must be in 2..6, got {size!r}")
    keys = [key for key in _all_problems(size) if _split_of(key) == split]
    keys.sort(key=lambda key: hashlib.sha256(f"coins/{seed}/{key}".encode()).digest())
    return [{"coins": list(coins), "amount": amount} for coins, amount in keys[:n]]


def get_problems(split, n, *, size=3, seed=0, source=None):
    """At most n problems of `split` ("train" or "test").

    size: how many denominations a problem has (2 to 6): 1 and size-1 others from 2..MAX_COIN,
    an amount in MIN_AMOUNT..MAX_AMOUNT that takes at most MAX_PAID coins. The space is small
    (size 3: about 1,800 train problems), so it is listed whole and shuffled by `seed`.
    source None: the seeded generator. Train and test are disjoint (by a hash of the problem),
    the same arguments give the same list, and a longer list starts with the shorter one.
    source "*.jsonl": the file's first n problems (size is ignored).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if source is None:
        return _generate(split, n, size, seed)
    source = os.fspath(source)
    if source.endswith(".jsonl"):
        return load_jsonl(source)[:n]
    raise ValueError(f"unknown problem source {source!r}: give a .jsonl file")


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def problem_from_row(row):
    """The problem in a JSON object's fields "coins" and "amount" (others ignored), or
    ValueError."""
    if not isinstance(row, dict) or "coins" not in row or "amount" not in row:
        raise ValueError("expected an object with fields 'coins' and 'amount'")
    coins, amount = row["coins"], row["amount"]
    largest = 10 ** MAX_COIN_DIGITS - 1
    if not (isinstance(coins, list) and 1 <= len(coins) <= 6 and all(map(_is_int, coins))
            and all(1 <= c <= largest for c in coins) and len(set(coins)) == len(coins)):
        raise ValueError(f"'coins' must be a list of 1 to 6 distinct integers in 1..{largest}")
    if not (_is_int(amount) and 1 <= amount <= 10_000):
        raise ValueError("'amount' must be an integer in 1..10000")
    if fewest_coins(coins, amount) is None:
        raise ValueError(f"the amount {amount} cannot be paid with coins {coins}")
    return {"coins": coins, "amount": amount}


def problem_key(problem):
    """A string naming the problem, the same whatever the order of the coins."""
    return json.dumps([sorted(problem["coins"]), problem["amount"]])


def load_jsonl(path):
    """Problems from a file of JSON lines {"coins": [...], "amount": int} (blank lines skipped);
    a one-line ValueError names the file and line of any problem."""
    return read_problems(path, problem_from_row)
