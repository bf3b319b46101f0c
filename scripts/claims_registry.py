"""The claims registry's loader: reads docs/claims/registry/ (common.toml and one <claim>.toml a
claim, the data a researcher reads) into what scripts/claims.py runs and renders.

A claim is one headline result of a paper: its words (says), the paper's setting and ours, what
differs (departures), its arms (commands run from the start model once a seed), its contrasts
and its primary contrast, the one that gives the verdict, registered at a commit before its
runs. common.toml says what each key of a claim's file means. A contrast is written as a small
expression over one seed's figures of the claim's arms ("topr.acc - naive.acc"); Expression
checks it when the registry is loaded and computes it by walking its syntax tree, allowing only
numbers, arms, figures, + - * / //, unary minus and the helpers in HELPERS (never Python's eval).
A registry that cannot be read so stops the load with one line naming the claim and what is wrong.
The files are TOML, read by Python's own tomllib (Python 3.11 and later; no package to install).

[TOPR] Le Roux, Bellemare et al., "Tapered Off-Policy REINFORCE: Stable and efficient
reinforcement learning for LLMs", 2025, arXiv:2503.14286. [AGRO] Tang et al., "RL-finetuning LLMs
from on- and off-policy data with a single algorithm", 2025, arXiv:2503.19612. [SPO] Cohen et al.,
"Soft Policy Optimization: Online Off-Policy RL for Sequence Models", 2025, arXiv:2503.05453.
[CR] the course report "Off-Policy Finetuning for LLM Math Reasoning".
"""
from __future__ import annotations

import ast
import math
import operator
import os
import statistics
import sys
import tomllib
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import topr  # noqa: E402  (Eq. 12's p~, for c_for)

REGISTRY = os.path.join(ROOT, "docs", "claims", "registry")
PTILDE = (0.01, 0.05, 0.10, 0.20, 0.50, 1.00)  # [TOPR] Fig. 5's x axis: 1% ... 100%
# The keys a claim's file may have (common.toml says what each means).
KEYS = {"paper", "says", "setting", "ours", "runs", "why", "plot", "digits", "evaluate",
        "headline", "paper_settings", "earlier", "departures_as", "departures_common",
        "departures", "arms", "contrasts", "primary", "registration", "co_condition", "verdict",
        "added_primaries"}
# The keys of an added primary (common.toml: [[added_primaries]])
ADDED_KEYS = {"text", "expr", "delta", "kind", "delta_why", "registered", "seen", "co_condition"}


class RegistryError(ValueError):
    """A registry file that cannot be read as claims: one line naming the claim and what."""


class Arm(NamedTuple):
    """One command of a claim: script and flags (they may name a seed's files: {pool} {pos}
    {d10} {d50} {d67} {d10n3} {offline} {q0}), its role (ROLES), a note on what it is and, for a
    probe, the commit that added it."""
    script: str
    flags: list[str]
    role: str
    note: str = ""
    added: str = ""


class Added(NamedTuple):
    """A primary added after a claim's results were seen (issue 70): shown beside the registered
    primary, never in its place; registered at its own commit, with what had been seen then."""
    text: str
    fn: "Expression"
    delta: float
    kind: str
    delta_why: str
    registered: str
    seen: str
    co_condition: tuple | None = None  # (text, Expression): as a claim's co_condition


def label(arm: Arm) -> str:
    """An arm as the doc and the dry run name it: "paper", "paper: KL in the reward", "ours: ...",
    "probe: ...", "the paper's lr, 5e-7 ([TOPR] §4.2)"."""
    if arm.role == "paper-setting":
        return f"the paper's {arm.note}" if arm.note else "the paper's setting"
    head = {"paper": "paper", "stand-in": "ours", "probe": "probe"}[arm.role]
    return f"{head}: {arm.note}" if arm.note else head


def c_for(p: float, pt: float) -> float:
    """[TOPR] Eq. 12 solved for c: the baseline giving effective positive share pt at share p
    (the --c of topr-fig5's, topr-fig6's and topr-s43's arms, checked by tests/test_claims.py)."""
    c = (p - pt) / (p + pt * (1 - 2 * p))
    assert abs(topr.p_tilde_pm1(p, c) - pt) < 1e-9
    return c


# ---- Expressions: a contrast's arithmetic over one seed's figures ------------------------------
def at(run: dict, step: int) -> dict:
    """A run's evaluation at `step` (the last one at or before it)."""
    return [e for e in run["curve"] if e["step"] <= step][-1]


def kl_efficiency(run: dict) -> float:
    """Accuracy gained per nat of KL to the start model at the end ([AGRO] Fig. 6's axes); nan
    where either is not positive."""
    gain = run["acc"] - run["start"]
    return gain / run["kl"] if gain > 0 and run["kl"] > 0 else math.nan


HELPERS = {"at": at, "kl_efficiency": kl_efficiency, "min": min, "max": max,
           "mean": lambda *values: statistics.mean(values)}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv}


class Expression:
    """A contrast as the registry writes it, e.g. 'topr.acc - at(topr, topr.steps // 2).acc';
    called with one seed's figures m (m[arm][figure]) it gives the number. An arm is its name
    where that is a Python name, else arm["its-name"]; a figure is .name or ["name"] (a key of a
    dict, never a Python attribute); an index into a list is a number. Checked when made: any
    other name, call, operator or syntax is refused with one line naming the claim."""

    def __init__(self, cid: str, text: str, arms):
        self.text, self.arms, self.used = text, set(arms), set()  # used: the arms it reads
        self.where = f"{cid}: expression {' '.join(text.split())!r}"
        try:
            self.tree = ast.parse(text.strip(), mode="eval").body
        except SyntaxError as e:
            raise self.error(f"not an expression ({e.msg})") from None
        self.check(self.tree)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"

    def error(self, why: str) -> RegistryError:
        return RegistryError(f"{self.where}: {why}")

    def check(self, node: ast.AST) -> None:
        """Refuse all but numbers, the claim's arms, figures, + - * / //, unary minus, HELPERS."""
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return
        if isinstance(node, ast.Name):
            if node.id not in self.arms:
                raise self.error(f"{node.id!r} is not an arm of this claim")
            self.used.add(node.id)
            return
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise self.error(f"no figure is named {node.attr!r}")
            return self.check(node.value)
        if isinstance(node, ast.Subscript):
            key = node.slice
            if not (isinstance(key, ast.Constant) and type(key.value) in (int, str)):
                raise self.error("an index is a number or a name in quotes")
            if str(key.value).startswith("_"):
                raise self.error(f"no figure is named {key.value!r}")
            if isinstance(node.value, ast.Name) and node.value.id == "arm":
                if key.value not in self.arms:
                    raise self.error(f"{key.value!r} is not an arm of this claim")
                self.used.add(key.value)
                return
            return self.check(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            self.check(node.left)
            return self.check(node.right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return self.check(node.operand)
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in HELPERS):
                raise self.error(f"a call may only be to {', '.join(HELPERS)}")
            if node.keywords:
                raise self.error("a helper takes its arguments by position")
            for arg in node.args:
                self.check(arg)
            return
        raise self.error(f"{type(node).__name__} is not allowed (see common.toml)")

    def __call__(self, m: dict) -> float:
        return self.value(self.tree, m)

    def value(self, node: ast.AST, m: dict):
        """The value of a checked node on the figures m."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return m[node.id]
        if isinstance(node, ast.Attribute):
            return self.value(node.value, m)[node.attr]
        if isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Name) and node.value.id == "arm":
                return m[node.slice.value]
            return self.value(node.value, m)[node.slice.value]
        if isinstance(node, ast.BinOp):
            return OPERATORS[type(node.op)](self.value(node.left, m), self.value(node.right, m))
        if isinstance(node, ast.UnaryOp):
            return -self.value(node.operand, m)
        return HELPERS[node.func.id](*(self.value(arg, m) for arg in node.args))


# ---- The registry's files ------------------------------------------------------------------------
def read(path: str) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def load(folder: str = REGISTRY) -> dict:
    """Every claim of the registry, by id in common.toml's order, as claims.py reads it: its
    texts as written; arms as Arm with "$name" flags spelled out; contrasts as (text, Expression)
    with a role or a delta after them where the file gives one; primary as (text, Expression,
    delta, kind); departures with the rows they refer to; shared (arm: "claim/arm") from the
    arms' runs_of; co_condition as (text, Expression)."""
    common = read(os.path.join(folder, "common.toml"))
    order = common["order"]
    files = {name[:-5] for name in os.listdir(folder) if name.endswith(".toml")} - {"common"}
    if files != set(order):
        raise RegistryError(f"{folder}: the claim files and common.toml's order differ: "
                            f"{', '.join(sorted(files ^ set(order)))}")
    raw = {cid: read(os.path.join(folder, f"{cid}.toml")) for cid in order}
    return {cid: claim(cid, raw, common) for cid in order}


def claim(cid: str, raw: dict, common: dict) -> dict:
    """One claim of the registry (raw: every claim's file as read) as load gives it."""
    c = dict(raw[cid])
    if unknown := sorted(set(c) - KEYS):
        raise RegistryError(f"{cid}: unknown key {unknown[0]!r} (common.toml lists the keys)")

    def rows(of: dict) -> list:  # a claim's own departures after its paper's common ones
        return common["departures"].get(of.get("departures_common"), []) + of.get("departures",
                                                                                   [])
    c["departures"] = rows(raw.get(c.get("departures_as"), {})) + rows(c)
    if not c.get("runs", True):
        return c
    arms = {}
    for name, a in c["arms"].items():
        if name == "arm" or name in HELPERS or a["role"] not in common["roles"]:
            raise RegistryError(f"{cid}: arm {name!r}: a name or role the registry cannot use")
        flags = []
        for x in a["flags"]:
            flags += common["flags"][x[1:]] if x.startswith("$") else [x]
        arms[name] = Arm(a["script"], flags, a["role"], a.get("note", ""), a.get("added", ""))
    c["shared"] = {name: a["runs_of"] for name, a in c["arms"].items() if "runs_of" in a}
    c["arms"], c["plot"] = arms, c.get("plot")
    c["contrasts"] = [(x["text"], Expression(cid, x["expr"], arms))
                      + ((x["role"],) if "role" in x else (x["delta"],) if "delta" in x else ())
                      for x in c.get("contrasts", [])]
    p = c["primary"]
    c["primary"] = (p["text"], Expression(cid, p["expr"], arms), p["delta"], p["kind"])
    c["registered"], c["delta_why"] = p["registered"], p["delta_why"]
    if "co_condition" in c:
        co = c["co_condition"]
        c["co_condition"] = (co["text"], Expression(cid, co["expr"], arms))
    added = []
    for a in c.get("added_primaries", []):
        if unknown := sorted(set(a) - ADDED_KEYS) or sorted(ADDED_KEYS - {"co_condition"} - set(a)):
            raise RegistryError(f"{cid}: added primary: a key missing or unknown: {unknown[0]!r}")
        co = a.get("co_condition")
        added.append(Added(a["text"], Expression(cid, a["expr"], arms), a["delta"], a["kind"],
                           a["delta_why"], a["registered"], a["seen"],
                           (co["text"], Expression(cid, co["expr"], arms)) if co else None))
    c["added_primaries"] = added
    return c


# ---- What claims.py reads ------------------------------------------------------------------------
COMMON = read(os.path.join(REGISTRY, "common.toml"))
CLAIMS = load()
RUN = {cid: c for cid, c in CLAIMS.items() if c.get("runs", True)}  # the claims run here
ROLES, SCALE, SIZES = COMMON["roles"], COMMON["scale"], tuple(COMMON["sizes"])
POOL, N_MIX, SPO_EVAL = COMMON["pool"]["flags"], COMMON["pool"]["mix"], COMMON["evaluate"]["spo"]
QUICK, EARLIER, DOC = COMMON["quick"], COMMON["earlier"], COMMON["doc"]  # DOC: prose
REAL_CPU = COMMON["real_cpu"]  # --real-cpu: SmolLM2 on 2 cores (common.toml says what each is)
EARLIER_CLAIMS = tuple(cid for cid, c in CLAIMS.items() if c.get("earlier"))
# --paper-settings: by claim ("pool": POOL's run) and script, the paper's flags (later flags win)
PAPER_SETTINGS = {cid: COMMON["paper_settings"][c["paper_settings"]]
                  for cid, c in {**CLAIMS, "pool": COMMON["pool"]}.items()
                  if "paper_settings" in c}
REGISTERED = {cid: c["registered"] for cid, c in RUN.items()}
DELTA_WHY = {cid: c["delta_why"] for cid, c in RUN.items()}
REGISTRATION = {cid: (c["registration"]["how"], c["registration"]["what"])
                for cid, c in RUN.items()}
UNTESTABLE = {cid: c["verdict"]["untestable"] for cid, c in RUN.items()
              if "untestable" in c["verdict"]}
CONCLUDE = {cid: c["verdict"]["conclude"] for cid, c in RUN.items()}
CONCLUDE_REAL_CPU = {cid: c["verdict"]["conclude_real_cpu"] for cid, c in RUN.items()
                     if "conclude_real_cpu" in c["verdict"]}  # SmolLM2's runs (--real-cpu)
CO_CONDITIONS = {cid: c["co_condition"] for cid, c in RUN.items() if "co_condition" in c}
# Primaries added after results were seen, beside the registered ones (Added), by claim
ADDED = {cid: c["added_primaries"] for cid, c in RUN.items() if c["added_primaries"]}
HEADLINE = {cid: [tuple(x) for x in c["headline"]] for cid, c in RUN.items() if "headline" in c}
# Probes were added after a claim's results were seen (post hoc): the commit of each, by name.
PROBES_ADDED = {name: arm.added for c in RUN.values() for name, arm in c["arms"].items()
                if arm.role == "probe"}


def departures(cid: str) -> list[tuple[str, str, str]]:
    """The knobs where a claim's miniature differs from the paper: (knob, the paper's, ours)."""
    return [tuple(row) for row in CLAIMS[cid]["departures"]]


if __name__ == "__main__":  # a loader, not a command; like every file here it answers --help
    import argparse
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
