"""The papers' headline claims in miniature: each run like for like from one start model, 3 seeds
(more added later with --seeds), a verdict by one rule; writes docs/CLAIMS.md and its plots
(docs/CLAIMS-<claim>.png).

    python scripts/claims.py all --sft runs/sft-countdown/final        # every claim, 2 cores
    python scripts/claims.py topr-fig5 --sft runs/sft-countdown/final  # one claim
    python scripts/claims.py topr-fig5 --sft runs/sft-countdown/final --seeds 3,4  # 2 more seeds
    python scripts/claims.py all --quick --sft runs/sft-countdown/final   # smoke run, ~8 min
    python scripts/claims.py all --sft runs/real-model/sft/final --real-cpu --dry-run  # SmolLM2

Every arm is one command of an algorithm script from the --sft model with --seed s; --jobs runs
side by side, one torch thread each (fixed steps, so the figures do not depend on the clock), run
by scripts/lab.py's runner (a finished run is kept: an interrupted claim goes on where it
stopped). Within a seed every arm of a claim shares the held-out problems, the evaluation draws
and, where a claim trains off-policy, the same samples of the start model (the registry's POOL).
Each claim writes OUT/<claim>/result.json and keeps a copy in docs/claims/ (in git); the doc is
rebuilt from them, so one claim run alone updates its own rows, and --render-only works on a clean
checkout. The hand-written investigations (docs/CLAIMS-notes.md) follow.

The claims themselves (their arms, contrasts, primaries, departures from the papers and settings)
are data in docs/claims/registry/ (one TOML file a claim), read by scripts/claims_registry.py;
this file runs them (run_claim) and renders the doc (write_doc).

[TOPR] Le Roux, Bellemare et al., "Tapered Off-Policy REINFORCE: Stable and efficient
reinforcement learning for LLMs", 2025, arXiv:2503.14286. [AGRO] Tang et al., "RL-finetuning LLMs
from on- and off-policy data with a single algorithm", 2025, arXiv:2503.19612. [SPO] Cohen et al.,
"Soft Policy Optimization: Online Off-Policy RL for Sequence Models", 2025, arXiv:2503.05453.
[CR] the course report "Off-Policy Finetuning for LLM Math Reasoning".
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (its final evaluation's decoding for [CR], REPORT_DECODING)
import lab  # noqa: E402  (the runner: one command to completion, a finished run kept)
from compare import common  # noqa: E402
from lab import ROOT, side_by_side  # noqa: E402
from tasks import get_task, scoring  # noqa: E402
import claims_registry  # noqa: E402  (the claims as data: docs/claims/registry/)
from claims_registry import (  # noqa: E402
    CLAIMS, CONCLUDE, CONCLUDE_REAL_CPU, DOC, EARLIER, EARLIER_CLAIMS, HEADLINE, N_MIX,
    PAPER_SETTINGS, POOL, QUICK, REAL_CPU, REGISTERED, SCALE, SIZES, SPO_EVAL, UNTESTABLE,
    DELTA_WHY, CO_CONDITIONS, REGISTRATION, ADDED, departures, label)
import topr  # noqa: E402  (the report's lr, for --real-cpu's scaling: real_lr)
PTILDE, c_for = claims_registry.PTILDE, claims_registry.c_for  # read as claims.c_for (tests)

README_START, README_END = "<!-- claims:start -->", "<!-- claims:end -->"
ARCHIVE = os.path.join(ROOT, "docs", "claims")  # every claim's last result.json, kept in git
# The rule: a claim's verdict is its primary contrast's alone (primary_verdict); the other
# contrasts are shown under the rule of 1987642 (EARLIER_RULE), as they were registered.
LEVEL, TOST_LEVEL = 0.95, 0.90  # the interval of a difference; of no difference (TOST at 5%)
SIM_SEED, SIM_DRAWS = 0, 10_000  # the simulation of the rule's error rates (simulate)
MAX_SEEDS = 100  # seeds_needed looks no further
RULE, EARLIER_RULE = DOC["rule"], DOC["earlier_rule"]  # the doc's prose (common.toml's [doc])
# The primary rule's verdicts (RULE), and a claim that its runs cannot test (UNTESTABLE)
PAPERS, OPPOSITE = "paper's direction", "opposite direction"
NOT_DETECTED, EQUIVALENT = "not detected at this power", "equivalent within delta"
NOT_RUN = "not run yet"  # an added primary whose arms the result lacks
UNTESTED, COLLAPSED = "not testable here", "the comparator collapsed"  # CO_CONDITIONS
VERDICTS = (PAPERS, OPPOSITE, NOT_DETECTED, EQUIVALENT, COLLAPSED, UNTESTED)


# ---- Running the arms ----------------------------------------------------------------------------
def run(script: str, flags: list[str], out: str, seed: int, args, cid: str = "",
        arm: str = "") -> str:
    """One script from the start model with this seed, to its end (or the finished run in out)."""
    cmd = command(script, flags, seed, args, cid, arm) + ["--threads", str(args.threads), "--out",
                                                         out]
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    name = os.path.relpath(out, args.out).replace(os.sep, "-")
    lab.run_script(name, cmd, out, os.path.join(args.out, "logs"))
    return out


def command(script: str, flags: list[str], seed: int, args, cid: str = "",
            arm: str = "") -> list[str]:
    """An arm's command from the start model with this seed (its --quick, --paper-settings or
    --real-cpu flags last: they win)."""
    extra = list(QUICK.get(script, [])) if args.quick else []  # a copy: += below
    if getattr(args, "paper_settings", False):
        extra += PAPER_SETTINGS.get(cid, {}).get(script, [])
    if getattr(args, "real_cpu", False):
        extra += real_cpu_flags(script, flags, cid, arm)
    return [sys.executable, script, "--model", args.sft, "--seed", str(seed), *flags, *extra]


def show_lr(lr: float) -> str:
    """An lr as the commands write it: 3 significant digits, "1e-5" (not "1e-05")."""
    return f"{lr:.3g}".replace("e-0", "e-")


def real_lr(script: str, flags: list[str], role: str) -> str | None:
    """--real-cpu's lr of an arm (REAL_CPU["lr"]): the lr it runs at on tiny (its last --lr, else
    [CR]'s 1e-4 for topr.py's --report-variant, else the script's tiny default: the main lr) times
    its script's factor; None for a paper-setting arm, which keeps the paper's own lr."""
    if role == "paper-setting" or script not in REAL_CPU["lr"]:
        return None
    tiny, real = REAL_CPU["lr"][script]
    given = [flags[i + 1] for i, x in enumerate(flags[:-1]) if x == "--lr"]
    lr = float(given[-1]) if given else topr.DEFAULTS["lr"][2] if (
        script == "topr.py" and "--report-variant" in flags) else tiny
    return show_lr(lr * real / tiny)


def real_cpu_flags(script: str, flags: list[str], cid: str, arm: str = "") -> list[str]:
    """--real-cpu's flags after an arm's own (common.toml's [real_cpu]): every arm's, its
    script's, its claim's and its own ("claim/arm"; an arm sharing another claim's runs takes
    that arm's, so the command stays one), then its lr (real_lr); POOL's run its own last."""
    out = REAL_CPU["flags"] + REAL_CPU["scripts"].get(script, [])
    if cid == "pool":
        return out + REAL_CPU["pool"]["flags"] + ["--lr", real_lr(script, flags, "paper")]
    where = CLAIMS[cid].get("shared", {}).get(arm, f"{cid}/{arm}")
    out = out + REAL_CPU["claims"].get(where.split("/")[0], []) + REAL_CPU["claims"].get(where, [])
    lr = real_lr(script, flags, CLAIMS[cid]["arms"][arm].role)
    return out + (["--lr", lr] if lr else [])


def kept_command(cid: str, name: str, real_cpu: bool) -> list[str]:
    """An arm's command as its result keeps it: its script and flags, --real-cpu's flags after
    them under --real-cpu (without --model and --seed, which every run adds)."""
    arm = CLAIMS[cid]["arms"][name]
    return [arm.script, *arm.flags, *(real_cpu_flags(arm.script, arm.flags, cid, name)
                                      if real_cpu else [])]


def each_flag_once(cmd: list[str]) -> list[str]:
    """A command as its script's parser reads it, each flag once: a flag given again (an arm's
    override, the --real-cpu flags last) keeps its first place and takes its last value."""
    out, place, i = [], {}, 0  # out: [flag, value] or [flag] or [word]; place: flag -> index
    while i < len(cmd):
        flag = cmd[i].startswith("--")
        has_value = flag and i + 1 < len(cmd) and not cmd[i + 1].startswith("--")
        item = cmd[i:i + 1 + has_value]
        if flag and cmd[i] in place:
            out[place[cmd[i]]] = item
        else:
            if flag:
                place[cmd[i]] = len(out)
            out.append(item)
        i += len(item)
    return [x for item in out for x in item]


def dry_run(ids: list[str], args) -> list[str]:
    """Every arm's command of these claims for every seed, run from the repository, nothing run;
    {pool} and the like name the files a run composes first (pool_files, spo_offline)."""
    lines = real_cpu_header(ids, args) if getattr(args, "real_cpu", False) else []
    if any(x.startswith(("{pool", "{pos", "{d")) for cid in ids
           for arm in CLAIMS[cid]["arms"].values() for x in arm.flags):
        lines += ["# POOL, first: the start model's samples, one file a seed (pool_files)"]
        lines += [" ".join(["python", *each_flag_once(command("topr.py", POOL, s, args,
                                                              "pool"))[1:]])
                  for s in args.seeds]
    for cid in ids:
        for name, arm in CLAIMS[cid]["arms"].items():
            if getattr(args, "arms", None) and name not in args.arms:  # --arms: these alone
                continue
            shared = CLAIMS[cid].get("shared", {}).get(name)
            lines += [f"# {cid} / {name} ({label(arm)})"
                      + (f": the runs of {shared}" if shared else "")]
            lines += [" ".join(["python", *each_flag_once(command(
                arm.script, arm.flags, s, args, cid, name))[1:]]) for s in args.seeds]
    return lines


def real_cpu_header(ids: list[str], args) -> list[str]:
    """--real-cpu's dry run opens with real_cpu_text, as comments within 100 columns."""
    return ["# " + line for t in real_cpu_text(ids, args)
            for line in textwrap.wrap(t, 98, break_on_hyphens=False)]


def flag_of(flags: list[str], name: str, default=None):
    """The last value of --name in a command's flags (later flags win), else default."""
    given = [flags[i + 1] for i, x in enumerate(flags[:-1]) if x == f"--{name}"]
    return given[-1] if given else default


def real_cpu_minutes(cid: str, args) -> float:
    """A claim's estimated minutes under --real-cpu for args.seeds, one run at a time on 2 cores:
    each arm's start, its optimizer steps x its script's seconds a step, its evaluations (and KL
    measured at each where beta > 0), its sampling; POOL once a seed; the final evaluations
    (REAL_CPU["cost"], from docs/REAL-MODEL.md and the claims' runs). A rough figure, from the
    flags alone."""
    c, total = REAL_CPU["cost"], 0.0
    p = c["positives"]  # the start model's share of correct samples
    pool_n = 8 * int(flag_of(REAL_CPU["pool"]["flags"], "prompts"))
    mix = min(REAL_CPU["pool"]["mix"], 2 * p * pool_n)
    data = {"{pool}": pool_n, "{pos}": p * pool_n, "{d10}": mix, "{d50}": mix, "{d10n3}": mix,
            "{d67}": p * pool_n / 0.67}
    arms = CLAIMS[cid]["arms"]
    for name, arm in arms.items():
        f = command(arm.script, arm.flags, 0, args, cid, name)[6:]
        steps, sampled, beta = 0, 0, float(flag_of(f, "beta", 0) or 0)
        if arm.script == "topr.py":
            report = flag_of(f, "report-variant")
            iterations = int(flag_of(f, "iterations", 2 if report == "A+B" else 1 if report
                                     else topr.DEFAULTS["iterations"][1]))
            group = int(flag_of(f, "group-size", 1 if report else 8))
            epochs = int(flag_of(f, "epochs", 2 if report else 1))
            keep = int(flag_of(f, "keep", 0 if report else 1000))
            batch = int(flag_of(f, "batch-size", 64))
            for it in range(iterations):
                if it == 0 and flag_of(f, "data") in data:
                    n = data[flag_of(f, "data")]
                else:
                    n = int(flag_of(f, "prompts", 1000 if report else 500)) * group
                    sampled += n
                n = min(n, keep) if keep else n
                steps += epochs * math.ceil(n / batch)
        else:
            steps = int(flag_of(f, "steps"))
            if arm.script == "agro.py" and flag_of(f, "mode") == "offpolicy":
                sampled += int(flag_of(f, "offline-prompts")) * int(flag_of(f, "group-size"))
                beta = float(flag_of(f, "beta", 0.3))
            elif arm.script == "agro.py":
                beta = float(flag_of(f, "beta", 0.05))
            if arm.script == "spo.py":
                sampled += int(flag_of(f, "train-size")) * int(flag_of(f, "q0-samples"))
                if "{offline}" in arm.flags:  # spo_offline: 8 samples a problem, 3 models
                    sampled += 3 * 8 * int(flag_of(f, "train-size"))
        every = int(flag_of(f, "eval-every", 0))
        evals = 1 + (math.ceil(steps / every) if every else 1)
        kl = c["kl_eval_min"] if arm.script in ("rloo.py", "agro.py") and beta > 0 else 0
        total += c["run_min"] + steps * c["step_s"][arm.script] / 60 \
            + evals * (c["eval_min"] + kl) + sampled * c["sample_s"] / 60
    if any(x.startswith(("{pool", "{pos", "{d")) for arm in arms.values() for x in arm.flags):
        total += pool_n * c["sample_s"] / 60
    kind = CLAIMS[cid].get("evaluate")
    if kind:  # the start model's and every arm's model
        k = REAL_CPU["spo_eval_k"] if kind == "spo" else 8
        total += (1 + len(arms)) * REAL_CPU["final_eval_size"] * k * c["sample_s"] / 60
    return total * len(args.seeds)


def real(args) -> bool:
    """Whether these are --real-cpu's runs (an older args without the flag: not)."""
    return getattr(args, "real_cpu", False)


def sizes_of(args) -> tuple[int, ...]:
    """The puzzle sizes the arms train and evaluate on: --real-cpu's, else SIZES."""
    return tuple(REAL_CPU["sizes"]) if real(args) else SIZES


def run_dir(cid: str, arm: str, seed: int, args) -> str:
    """An arm's run folder; an arm identical to another claim's shares that claim's runs."""
    return os.path.join(args.out, CLAIMS[cid].get("shared", {}).get(arm, f"{cid}/{arm}")
                        + f"-s{seed}")


def pool_files(seed: int, args) -> dict:
    """POOL (the start model's samples, one topr.py run) and the data composed from it: POS (its
    correct samples), d10 / d50 (N_MIX samples at 10% / 50% positives, drawn within each class
    with this seed), and for probes d67 (every positive, negatives to 33%: [TOPR] §4.3's base
    share) and d10n3 (d10 from 3-number puzzles alone)."""
    out = os.path.join(args.out, f"pool-s{seed}")
    quick = ["--prompts", "64", "--eval-size", "1"] if args.quick else []
    run("topr.py", POOL + quick, out, seed, args, "pool")
    files = {"pool": os.path.join(out, "data-0.jsonl")}
    with open(files["pool"]) as f:
        rows = f.readlines()
    task = get_task("countdown")
    ok = [task.is_correct((row := json.loads(r))["problem"], row["completion"]) for r in rows]
    good = [r for r, c in zip(rows, ok) if c]
    bad = [r for r, c in zip(rows, ok) if not c]
    n = min(N_MIX, len(rows) // 8) if args.quick else N_MIX
    if real(args):  # a small pool: the 50% mix can hold no more than twice its positives
        n = min(REAL_CPU["pool"]["mix"], 2 * len(good))
    rng = random.Random(seed)
    parts = {"pos": good}
    for p in (10, 50):
        k = round(n * p / 100)
        parts[f"d{p}"] = rng.sample(good, k) + rng.sample(bad, n - k)
    probe = random.Random(1000 + seed)  # a probe's draw leaves the others' as they were
    parts["d67"] = good + probe.sample(bad, round(len(good) * 33 / 67))  # [TOPR] §4.3's share
    three = [len(json.loads(r)["problem"]["nums"]) == 3 for r in rows]
    k = round(n / 10)  # d10n3: 10% positives, 3-number puzzles only
    parts["d10n3"] = probe.sample([r for r, c, t in zip(rows, ok, three) if c and t], k) + \
        probe.sample([r for r, c, t in zip(rows, ok, three) if not c and t], n - k)
    for name, chosen in parts.items():
        files[name] = os.path.join(out, f"{name}.jsonl")
        (probe if name in ("d67", "d10n3") else rng).shuffle(chosen)  # the same draws always
        if not os.path.exists(files[name]):
            with open(files[name] + ".tmp", "w") as f:
                f.writelines(chosen)
            os.replace(files[name] + ".tmp", files[name])
    files["p"] = len(good) / len(rows)
    return files


def spo_offline(seed: int, claim_dir: str, args) -> dict:
    """[SPO] §5's offline set in miniature: correct samples (T ~ U(0.1, 1), top-p 0.95) of the
    start model, the online SPO run and the PPO stand-in, one file, duplicates dropped."""
    path = os.path.join(claim_dir, f"offline-s{seed}.jsonl")
    if not os.path.exists(path):
        seen, rows = set(), []
        for name, model in [("start", args.sft), ("spo", f"{claim_dir}/spo-s{seed}/final"),
                            ("ppo", f"{claim_dir}/ppo-s{seed}/final")]:
            part = os.path.join(claim_dir, f"offline-{name}-s{seed}.jsonl")
            if not os.path.exists(part):
                quick = ["--train-size", "16"] if args.quick else [
                    x for flag in ("train-size", "sizes", "max-new-tokens") for x in (
                        f"--{flag}", flag_of(REAL_CPU["flags"] + REAL_CPU["scripts"]["spo.py"],
                                             flag))] if real(args) else []
                subprocess.run(
                    [sys.executable, "scripts/spo_offline_data.py", "--model", model, "--out",
                     part, "--correct-only", "--seed", str(seed), "--threads",
                     str(args.threads * args.jobs), *quick], cwd=ROOT, check=True)
            for line in open(part):
                r = json.loads(line)
                key = (json.dumps(r["nums"]), r["target"], r["completion"])
                if key not in seen:
                    seen.add(key)
                    rows.append(line)
        with open(path + ".tmp", "w") as f:
            f.writelines(rows)
        os.replace(path + ".tmp", path)
    return {"offline": path, "q0": os.path.join(claim_dir, f"spo-s{seed}", "q0.jsonl")}


def final_eval(cache: str, model: str, seed: int, k: int, decoding: dict, size: int,
               threads: int, sizes: tuple = SIZES, tokens: int | None = None) -> None:
    """Correct answers out of k a held-out problem (the runs' problems of this seed) and the mean
    reward of every variant (one a size, in `sizes`' order), under one decoding, at most `tokens`
    new tokens (None: lab.eval_tokens); in a fresh process (torch state), kept in `cache`."""
    started = time.time()
    common.setup(seed, threads)
    task = get_task("countdown")
    m, tok = common.load_model(model)
    engine = common.make_engine("auto", m, tok, model, seed=seed)
    out = {"correct": [], "rewards": {}}
    for n in sizes:
        problems = task.get_problems("test", size, size=n, seed=seed)
        prompts = common.encode_prompts(task, problems, tok, common.prompt_style(m, tok))
        groups = engine.generate(prompts, common.SamplingConfig(k, tokens or lab.eval_tokens(m),
                                                                seed=seed, **decoding))
        out["correct"] += [sum(task.is_correct(p, s.text) for s in g)
                           for p, g in zip(problems, groups)]
        scores = scoring.score(task, problems, groups, "sampled", all_rewards=True)
        for v in task.REWARD_VARIANTS:
            out["rewards"].setdefault(v, []).append(scores[f"sampled/reward_{v}"])
    out["seconds"] = time.time() - started
    lab.write_json(cache, out)


def final_evals(todo: list[tuple[str, str, int]], k: int, decoding: dict, args) -> list[dict]:
    """final_eval of (model, cache file, seed) each, kept in its cache file."""
    size = 20 if args.quick else REAL_CPU["final_eval_size"] if real(args) else 200
    sizes, tokens = sizes_of(args), (int(flag_of(REAL_CPU["flags"], "max-new-tokens"))
                                     if real(args) else None)
    lab.in_processes(final_eval, [(c, m, s, k, decoding, size, args.threads, sizes, tokens)
                                  for m, c, s in todo if not os.path.exists(c)], args.jobs)
    return [lab.read_json(c) for _, c, _ in todo]


# ---- What each run is worth ----------------------------------------------------------------------
def eval_sizes(row: dict) -> tuple[int, ...]:
    """The puzzle sizes an evaluation row of metrics.jsonl holds ("eval3/sampled/accuracy"...),
    smallest first: (3, 4) for the tiny runs, (3,) for --real-cpu's."""
    return tuple(sorted(int(m.group(1)) for key in row
                        if (m := re.fullmatch(r"eval(\d+)/sampled/accuracy", key))))


def acc(row: dict) -> float:
    """Held-out accuracy at T = 1 over the sizes the run evaluated (its own evaluation), in %."""
    return 100 * statistics.mean(row[f"eval{n}/sampled/accuracy"] for n in eval_sizes(row))


def figures(out: str) -> dict:
    """A run's curve (step, acc, format rate, pass@k) and its summary figures, over the sizes it
    evaluated (read from its metrics, not assumed)."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    evals = [r for r in rows if eval_sizes(r)]
    sizes = eval_sizes(evals[-1])
    train = [r for r in rows if "loss" in r]
    pk = next(key for key in evals[-1] if key.startswith(f"eval{sizes[0]}/pass@"))[6:]
    curve = [{"step": e["step"], "acc": acc(e),
              **{f"acc{n}": 100 * e[f"eval{n}/sampled/accuracy"] for n in sizes},
              "format": 100 * statistics.mean(e[f"eval{n}/sampled/format_rate"] for n in sizes),
              "pass": 100 * statistics.mean(e[f"eval{n}/{pk}"] for n in sizes)} for e in evals]
    kls = [(r["step"], r["kl_to_ref"]) for r in train if "kl_to_ref" in r]
    kl = [k for _, k in kls[-10:]]
    for last, point in zip([-1] + [c["step"] for c in curve], curve):  # batches since the last
        since = [k for step, k in kls if last < step <= point["step"]]
        point["kl"] = statistics.mean(since) if since else 0.0  # step 0: the start model itself
    return {"curve": curve, "start": curve[0]["acc"], "acc": curve[-1]["acc"],
            **{f"acc{n}": curve[-1][f"acc{n}"] for n in sizes},
            **{f"start{n}": curve[0][f"acc{n}"] for n in sizes},
            "pass": curve[-1]["pass"], "format": curve[-1]["format"],
            "peak": max(c["acc"] for c in curve), "steps": rows[-1]["step"],
            "area": statistics.mean(c["acc"] for c in curve[1:]) if len(curve) > 1 else math.nan,
            "kl": statistics.mean(kl) if kl else math.nan,
            "reward": [(r["step"], r["reward"]) for r in train if "reward" in r]}


def pass_k(counts: list[int], n: int, k: int) -> float:
    return 100 * statistics.mean(scoring.pass_at_k(n, c, k) for c in counts)


def run_claim(cid: str, args) -> dict:
    """Every arm of one claim for every seed, then its figures, contrasts and verdict."""
    claim, claim_dir = dict(CLAIMS[cid]), os.path.join(args.out, cid)
    here = lab.commit()  # the code the runs start from, before any checkout during them
    if args.skip_probes:  # the claim's own arms and contrasts alone (and an added primary's)
        needed = {a for x in ADDED.get(cid, []) for a in x.fn.used}
        claim["arms"] = {a: v for a, v in claim["arms"].items()
                         if v.role != "probe" or a in needed}
        claim["contrasts"] = [c for c in claim["contrasts"] if c[2:] != ("probe",)]
    os.makedirs(claim_dir, exist_ok=True)
    # --real-cpu's flags included, so that added seeds compare like with like (kept_result)
    commands = {a: kept_command(cid, a, real(args)) for a in claim["arms"]}
    kept = kept_result(cid, commands, args)  # sessions add seeds and arms rather than redo them
    if getattr(args, "arms", None):  # these arms alone, beside the kept result's others
        claim["arms"] = {a: claim["arms"][a] for a in args.arms}
    files = {s: {} for s in args.seeds}
    flags = [" ".join(arm.flags) for arm in claim["arms"].values()]
    if any("{pool}" in f or "{d" in f or "{pos}" in f for f in flags):
        for s, fl in zip(args.seeds, side_by_side(pool_files, [(s, args) for s in args.seeds],
                                                  args.jobs)):
            files[s].update(fl)
    later = [a for a, arm in claim["arms"].items() if "{offline}" in arm.flags]
    jobs = []
    for stage in ([a for a in claim["arms"] if a not in later], later):
        if stage is later and later:  # spo-fig1's half-online arm needs the others' models
            for s in args.seeds:
                files[s].update(spo_offline(s, claim_dir, args))
        jobs = [(claim["arms"][a].script, [x.format(**files[s]) for x in claim["arms"][a].flags],
                 run_dir(cid, a, s, args), s, args, cid, a)
                for a in stage for s in args.seeds]
        side_by_side(run, jobs, args.jobs)
    m = {s: {a: figures(run_dir(cid, a, s, args)) for a in claim["arms"]}
         for s in args.seeds}
    runs = [run_dir(cid, a, s, args) for a in claim["arms"] for s in args.seeds]
    runs += [os.path.dirname(f["pool"]) for f in files.values() if "pool" in f]
    kind = claim.get("evaluate")  # a final evaluation of every arm's model, in its run folder
    if kind:  # spo: pass@1 and pass@10 from 20 samples at T = 0.4, top-p 0.95; cr: the mean
        # reward_original of 8 samples at T = 0.15, top-p 0.9, top-k 30
        k, decoding = ((4 if args.quick else REAL_CPU["spo_eval_k"] if real(args) else 20),
                       SPO_EVAL) if kind == "spo" else (8, compare.REPORT_DECODING)
        n = (2 if args.quick else 10)
        start = {s: os.path.join(claim_dir, f"start-eval-s{s}.json") for s in args.seeds}
        end = {(a, s): os.path.join(run_dir(cid, a, s, args), f"eval-{kind}.json")
               for a in claim["arms"] for s in args.seeds}
        todo = [(args.sft, start[s], s) for s in args.seeds] + [
            (os.path.join(os.path.dirname(c), "final"), c, s) for (_, s), c in end.items()]
        ev = dict(zip([c for _, c, _ in todo], final_evals(todo, k, decoding, args)))
        runs += [c for _, c, _ in todo]
        for (a, s), c in end.items():
            before, after = ev[start[s]], ev[c]
            if kind == "spo":
                m[s][a].update(p1=pass_k(after["correct"], k, 1),
                               p10=pass_k(after["correct"], k, n),
                               p1_0=pass_k(before["correct"], k, 1),
                               p10_0=pass_k(before["correct"], k, n))
            else:  # rewards["original"]: one mean a size, in sizes_of(args)' order
                m[s][a].update(score=statistics.mean(after["rewards"]["original"]),
                               score0=statistics.mean(before["rewards"]["original"]))
                if 4 in sizes_of(args):  # none with --real-cpu: 3-number puzzles only
                    i = sizes_of(args).index(4)
                    m[s][a].update(score4=after["rewards"]["original"][i],
                                   score4_0=before["rewards"]["original"][i])
    p = {s: files[s].get("p") for s in args.seeds}
    commits = {s: here for s in args.seeds}
    if kept:  # the kept figures, as the kept result holds them, beside this run's; a kept
        # arm this run skips (a probe, under --skip-probes) keeps its seeds and its contrasts
        held = {int(s): f for s, f in kept["figures"].items()}
        m = {s: {**held.get(s, {}), **m.get(s, {})} for s in {*held, *m}}
        commands = {**kept["commands"], **commands}
        p = {**{int(s): v for s, v in kept["p"].items()}, **{s: v for s, v in p.items() if v}}
        commits = {**{int(s): c for s, c in kept_commits(kept).items()},
                   **({} if getattr(args, "arms", None) else commits)}
        runs += kept["runs"]
    seeds = sorted(m)
    contrasts = []
    for text, fn, *role in claim["contrasts"]:  # with a role: shown, not in the earlier verdict
        d = [fn(m[s]) for s in seeds]
        contrasts.append(secondary(text, d, role[0] if role else "", args.quick))
    if kept:  # a kept contrast of arms this run skips, over the seeds it was made on
        contrasts += [c for c in kept["contrasts"]
                      if c["text"] not in {x["text"] for x in contrasts}]
    result = {"claim": cid, "seeds": seeds, "quick": args.quick,
              "runs": sorted({run_name(x) for x in runs}), "jobs": args.jobs, "figures": m,
              "p": p, "contrasts": contrasts, "commands": commands,
              "seed_commits": {s: commits[s] for s in seeds}}
    if getattr(args, "arms", None) or (kept and "arm_commits" in kept):  # arms added later
        result["arm_commits"] = {**(kept or {}).get("arm_commits", {}),
                                 **{a: here for a in getattr(args, "arms", None) or []}}
    if kept:  # the minutes of the kept runs that are not in this checkout (run elsewhere)
        local = dict(kept, runs=[x for x in kept["runs"] if os.path.exists(os.path.join(ROOT, x))],
                     minutes_kept=0.0, verdict_minutes_kept=0.0)
        result["minutes_kept"] = max(0.0, kept.get("minutes", 0.0) - minutes([local]))
        result["verdict_minutes_kept"] = max(0.0, kept.get("verdict_minutes", 0.0)
                                             - minutes([verdict_runs(cid, local, args)]))
    result["primary"], result["commit"] = primary_of(cid, result), here
    result["verdict"] = result["primary"]["verdict"]
    if cid in EARLIER_CLAIMS:  # and under the rule these contrasts were registered with
        result["earlier_verdict"] = claim_verdict(
            [c["verdict"] for c in contrasts if not c["probe"]])
    result["minutes"] = minutes([result])  # the claim alone, its shared runs included
    result["verdict_minutes"] = minutes([verdict_runs(cid, result, args)])
    if real(args):  # --real-cpu's runs: what was scaled, kept apart from the tiny results
        result.update(real_cpu=True, sizes=list(sizes_of(args)))
    lab.write_json(os.path.join(claim_dir, "result.json"), result)
    if not args.quick:  # kept in git: --render-only rebuilds the doc on a clean checkout
        lab.write_json(os.path.join(archive(args), f"{cid}.json"), result)
    print(f"[claims] {cid}: {result['verdict']} ({result['minutes']:.0f} min)", flush=True)
    return result


def kept_result(cid: str, commands: dict, args) -> dict | None:
    """The kept result (archive) this run adds seeds or arms (--arms) to, or None where this run
    holds every seed and arm (or there is none). Figures of other settings never mix: each kept
    arm must have run the command it has now, and every arm must have figures for every seed
    when this run is done (else one line, exit status 2). A seed or arm run again replaces the
    kept one."""
    path, arms = os.path.join(archive(args), f"{cid}.json"), getattr(args, "arms", None) or []
    kept = lab.read_json(path) if os.path.exists(path) and not args.quick else None
    if unknown := [a for a in arms if a not in commands]:
        refuse(f"{cid} has no arm {unknown[0]!r} here; its arms: " + ", ".join(commands))
    if kept is not None and (kept["quick"] or not arms and {int(s) for s in kept["seeds"]}
                             <= set(args.seeds)):
        kept = None
    if kept is None and not arms:
        return None
    seeds = sorted({*map(int, kept["seeds"] if kept else []), *args.seeds})
    listed = ",".join(map(str, seeds))
    for a, cmd in commands.items():
        if kept and a in kept["commands"] and kept["commands"][a] != cmd:
            refuse(f"{cid}: its kept result ({lab.repo_relative(path)}) ran arm {a} as "
                   f"{kept['commands'][a]}, now {cmd}: run every seed again (--seeds {listed})")
        if a in arms and any(a not in kept["figures"][str(s)] for s in seeds
                             if s not in args.seeds):
            refuse(f"{cid}: an added arm runs for every kept seed: --arms {a} --seeds {listed}")
        if a not in arms and any(a not in (kept or {}).get("figures", {}).get(str(s), {})
                                 for s in seeds if s not in args.seeds or arms):
            refuse(f"{cid}: arm {a} has no kept figures for every seed ({listed}): run it "
                   f"for them first (--arms {a} --seeds {listed})")
    return kept


def added_runs(results: dict) -> str:
    """The seeds and arms added to kept results after their first runs, for the doc's command."""
    more, arms = {}, [cid for cid, r in results.items() if r.get("arm_commits")]
    for cid, r in results.items():
        if extra := [str(s) for s in r["seeds"] if int(s) not in (0, 1, 2)]:
            more.setdefault(",".join(extra), []).append(cid)
    parts = [f"`{' '.join(v)} --seeds {k}` added those seeds" for k, v in more.items()]
    parts += [f"`--arms` added the arms of an added primary to {', '.join(arms)}"] if arms else []
    return ("; then, one claim at a time, " + "; ".join(parts) + ", each to the claim's kept "
            "result in docs/claims/ (each section names its seeds and their commits)"
            if parts else "")


def seed_counts(results: dict) -> str:
    """How many seeds the results' verdicts read: "3", or "3 to 5" where sessions added some."""
    n = sorted({len(r["seeds"]) for r in results.values() if r["seeds"]})
    return f"{n[0]}" if len(n) == 1 else f"{n[0]} to {n[-1]}" if n else "no"


def refuse(why: str):
    """One line naming the problem and exit status 2, as argparse's own errors."""
    print(f"claims.py: {why}", file=sys.stderr)
    raise SystemExit(2)


def results_at(r: dict) -> str:
    """Where a claim's figures were made: its commit, or each seed's where they differ, and the
    commit of each arm added later (--arms)."""
    if "commit" not in r:
        return ""
    at, added = kept_commits(r), r.get("arm_commits", {})
    where = ", ".join(f"{c} (seed{'s' * (len(g) > 1)} {', '.join(map(str, g))})" for c, g in
                      {c: [s for s in at if at[s] == c] for c in at.values()}.items())
    if len(set(at.values())) == 1:
        where = next(iter(at.values()))
    return f"; results at {where}" + "".join(
        f"; arm{'s' * (len(g) > 1)} {', '.join(g)} added at {c}"
        for c, g in {c: [a for a in added if added[a] == c] for c in added.values()}.items())


def kept_commits(r: dict) -> dict:
    """The commit each seed of a result ran at (results before seed_commits: one commit)."""
    return r.get("seed_commits") or {str(s): r.get("commit", "?") for s in r["seeds"]}


def archive(args) -> str:
    """Where a claim's result is kept in git: ARCHIVE, or --real-cpu's own folder."""
    if not real(args):
        return ARCHIVE
    os.makedirs(os.path.join(ROOT, REAL_CPU["archive"]), exist_ok=True)
    return os.path.join(ROOT, REAL_CPU["archive"])


def secondary(text: str, d: list[float], role, quick: bool = False) -> dict:
    """A secondary contrast's result: the rule of 1987642, or, where the paper claims no
    difference (role: delta), the primary rule's "equal" (the earlier rule has no such outcome)."""
    if not isinstance(role, str):  # a number: delta
        return {"text": text, "d": d, "verdict": primary_verdict(d, role, "equal")[0],
                "probe": False, "role": "", "delta": role}
    return {"text": text, "d": d, "verdict": verdict_of(d, quick), "probe": bool(role),
            "role": role}


def primary_of(cid: str, r: dict) -> dict:
    """The primary contrast of a claim's result, d from its figures seed by seed, and RULE's
    verdict with its figures (primary_verdict; a result.json made before the rule gets them here
    too)."""
    text, fn, delta, kind = CLAIMS[cid]["primary"]
    return judged(r, text, fn, delta, kind, UNTESTABLE.get(cid), CO_CONDITIONS.get(cid))


def judged(r: dict, text: str, fn, delta: float, kind: str, untestable: str | None = None,
           co: tuple | None = None) -> dict:
    """A primary contrast (text, fn, delta, kind) judged on a result (RULE): d seed by seed, the
    verdict with its figures; "not testable here" (untestable: why) whatever d says; "the
    comparator collapsed" where co, (text, fn), is negative in the mean; "not run yet" where the
    result lacks an arm that fn reads."""
    if any(a not in seed_figures(r, s) for s in r["seeds"] for a in getattr(fn, "used", ())):
        return {"text": text, "d": [], "delta": delta, "kind": kind, "verdict": NOT_RUN}
    d = []
    for s in r["seeds"]:
        try:
            d.append(fn(seed_figures(r, s)))
        except ZeroDivisionError:
            d.append(math.nan)
    verdict, stats = ("smoke", {}) if r["quick"] else primary_verdict(d, delta, kind)
    out = {"text": text, "d": d, "delta": delta, "kind": kind, "verdict": verdict, **stats}
    if untestable and not r["quick"]:  # whatever d says: the rule's outcome kept beside it
        out.update(verdict=UNTESTED, why=untestable, rule=verdict)
    if co and not r["quick"]:  # the paper's method must hold its ground too
        co_text, co_fn = co
        c = [co_fn(seed_figures(r, s)) for s in r["seeds"]]
        out["co"] = {"text": co_text, "c": c, "mean": statistics.mean(c)}
        if verdict == PAPERS and out["co"]["mean"] < 0:
            out.update(verdict=COLLAPSED, rule=verdict)
    return out


def added_of(cid: str, r: dict) -> list[dict]:
    """A claim's added primaries (ADDED) judged on its result, each with its registration."""
    return [dict(judged(r, a.text, a.fn, a.delta, a.kind, co=a.co_condition),
                 registered=a.registered, seen=a.seen, delta_why=a.delta_why)
            for a in ADDED.get(cid, [])]


def composed(cid: str, results: dict) -> dict | None:
    """A claim with no result of its own whose arms all share runs of other claims (runs_of),
    where those claims' results hold the figures: its result composed from theirs, no run of its
    own (its registration must say the figures were there to see)."""
    claim, seeds = CLAIMS[cid], None
    shared = claim.get("shared", {})
    if not claim.get("runs", True) or set(shared) != set(claim["arms"]):
        return None
    figures, sources, commands = {}, {}, {}
    for arm, where in shared.items():
        other, name = where.split("/", 1)
        r = results.get(other)
        if r is None or r["quick"] or name not in r["commands"]:
            return None
        commands[arm] = r["commands"][name]  # the runs' command, --real-cpu's flags included
        seeds = r["seeds"] if seeds is None else [s for s in seeds if s in r["seeds"]]
        sources[other] = r.get("commit", "?")
        for s in r["seeds"]:
            figures.setdefault(str(s), {})[arm] = seed_figures(r, s)[name]
    figures = {str(s): figures[str(s)] for s in seeds}
    contrasts = [secondary(text, [fn(figures[str(s)]) for s in seeds], role[0] if role else "")
                 for text, fn, *role in claim["contrasts"]]
    return {"claim": cid, "seeds": seeds, "quick": False, "runs": [], "jobs": 1,
            "figures": figures, "p": {}, "contrasts": contrasts, "minutes": 0.0,
            "verdict_minutes": 0.0, "composed_from": sources,
            "commands": {a: commands[a] for a in claim["arms"]}}


def seed_figures(r: dict, seed) -> dict:
    """One seed's figures of a result (result.json keys seeds as text)."""
    return r["figures"][str(seed)] if str(seed) in r["figures"] else r["figures"][seed]


def run_name(path: str) -> str:
    """A run folder or evaluation file as a result names it: relative to the repository's root,
    never a machine's path (an older result's absolute path is read the same way)."""
    return os.path.relpath(os.path.join(ROOT, path), ROOT)


def minutes(results: list[dict]) -> float:
    """Wall clock of the runs and final evaluations behind these results, each counted once, run
    --jobs side by side; a run's name is resolved against the repository's root (run_name). A
    run counts from its record (usage.json, an evaluation's file) where that is in this
    checkout; a result whose runs are not all here counts its kept minutes (a run under way,
    or one another claim shares, is not its record)."""
    seen, total = set(), 0.0
    for r in results:
        records = {os.path.join(ROOT, x): os.path.join(ROOT, x) if x.endswith(".json")
                   else os.path.join(ROOT, x, "usage.json") for x in r["runs"]}
        here = {path for path, record in records.items() if os.path.exists(record)}
        if "minutes_kept" not in r and here != set(records):  # an archived result
            total += 60 * r.get("minutes", 0.0) * r["jobs"]
            continue
        total += 60 * r.get("minutes_kept", 0.0) * r["jobs"]  # kept seeds run elsewhere
        for path in here - seen:
            seen.add(path)
            record = lab.read_json(records[path])
            total += record.get("seconds", 0) if path.endswith(".json") else record["wall_s"]
    return total / 60 / max(r["jobs"] for r in results) if results else 0.0


def verdict_runs(cid: str, r: dict, args) -> dict:
    """A claim's result with only the runs and evaluations behind its verdict (no probe's)."""
    probes = {run_name(run_dir(cid, a, s, args)) for a, arm in CLAIMS[cid]["arms"].items()
              if arm.role == "probe" for s in r["seeds"]}
    return dict(r, runs=[x for x in r["runs"] if run_name(x) not in probes
                         and os.path.dirname(run_name(x)) not in probes],
                minutes=r.get("verdict_minutes", r.get("minutes", 0.0)),
                **({"minutes_kept": r.get("verdict_minutes_kept", r["minutes_kept"])}
                   if "minutes_kept" in r else {}))


def t_quantile(level: float, df: int) -> float:
    """The two-sided t quantile: P(|T| <= t) = level for Student's t with df degrees of freedom
    (Abramowitz & Stegun 26.7.3-4, a finite sum for an integer df, inverted by bisection)."""
    def inside(t: float) -> float:  # P(|T| <= t)
        theta = math.atan(t / math.sqrt(df))
        c2, term = math.cos(theta) ** 2, 1.0
        if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2.4/3.5 cos^4 + ...))
            total = 1.0 if df > 1 else 0.0
            for k in range(1, (df - 1) // 2):
                term *= c2 * 2 * k / (2 * k + 1)
                total += term
            return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
        total = 1.0  # even: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if inside(mid) < level else (lo, mid)
    return (lo + hi) / 2


def decide(mean: float, half: float, half_tost: float, delta: float, kind: str = "more") -> str:
    """RULE's verdict from the mean of d, the half-widths of its 95% and 90% intervals and
    delta; kind "more" (the paper claims d > 0) or "equal" (it claims |d| < delta)."""
    if kind not in ("more", "equal"):
        raise ValueError(f"unknown kind of claim {kind!r}")
    equivalent = abs(mean) + half_tost < delta  # TOST: the 90% interval inside +-delta
    if kind == "equal":
        if equivalent:
            return EQUIVALENT
        return OPPOSITE if abs(mean) - half > 0 and abs(mean) >= delta else NOT_DETECTED
    if mean - half > 0 and mean >= delta:
        return PAPERS
    if mean + half < 0 and mean <= -delta:
        return OPPOSITE
    return EQUIVALENT if equivalent else NOT_DETECTED


def seeds_needed(mean: float, sd: float, delta: float, kind: str, n: int) -> int | None:
    """The fewest seeds (more than n) at which this mean and sd would decide (RULE): a rough
    figure, since a new seed moves the mean too; None past MAX_SEEDS."""
    for k in range(n + 1, MAX_SEEDS + 1):
        se = sd / math.sqrt(k)
        if decide(mean, t_quantile(LEVEL, k - 1) * se, t_quantile(TOST_LEVEL, k - 1) * se,
                  delta, kind) != NOT_DETECTED:
            return k
    return None


def primary_verdict(d: list[float], delta: float, kind: str = "more") -> tuple[str, dict]:
    """(verdict, its figures) of a primary contrast, d seed by seed (RULE): the figures are n,
    the mean and sd of d, its 95% and 90% intervals and, where nothing is detected, the seeds
    that would decide (seeds_needed)."""
    nans = sum(math.isnan(x) for x in d)  # e.g. a gain per nat where nothing was gained
    if nans and len(d) - nans < 3:
        return "not testable here (d is not a number in too many seeds)", {}
    d = [x for x in d if not math.isnan(x)]
    if len(d) < 3:
        return "too few seeds", {}
    n, mean, sd = len(d), statistics.mean(d), statistics.stdev(d)
    half, half_tost = (t_quantile(level, n - 1) * sd / math.sqrt(n)
                       for level in (LEVEL, TOST_LEVEL))
    verdict = decide(mean, half, half_tost, delta, kind)
    stats = {"n": n, "mean": mean, "sd": sd, "ci": [mean - half, mean + half],
             "ci90": [mean - half_tost, mean + half_tost]}
    if verdict == NOT_DETECTED:
        stats["needed"] = seeds_needed(mean, sd, delta, kind, n)
    return verdict, stats


def simulate(n: int, sd: float, delta: float, kind: str, effect: float,
             draws: int = SIM_DRAWS, seed: int = SIM_SEED) -> dict[str, float]:
    """How often RULE gives each verdict when d is normal with this mean (effect) and sd, over
    `draws` sets of n seeds; a fixed seed, so the doc is reproducible."""
    import numpy as np
    d = np.random.default_rng(seed).normal(effect, sd, size=(draws, n))
    t95, t90 = (t_quantile(level, n - 1) / math.sqrt(n) for level in (LEVEL, TOST_LEVEL))
    verdicts = [decide(float(m), t95 * s, t90 * s, delta, kind)
                for m, s in zip(d.mean(axis=1), d.std(axis=1, ddof=1))]
    return {v: verdicts.count(v) / draws for v in set(verdicts)}


def error_rates(n: int, sd: float, delta: float, kind: str) -> dict[str, float]:
    """The rule's error rates at this sd and n seeds (simulate): for a claim of a difference,
    P(paper's direction | no effect), P(not | an effect of delta), P(not | 2 delta) and
    P(equivalent | no effect); for one of no difference, P(equivalent | an effect of delta) and
    P(not equivalent | no effect)."""
    if kind == "equal":
        return {"fp": simulate(n, sd, delta, kind, delta).get(EQUIVALENT, 0.0),
                "fn1": 1 - simulate(n, sd, delta, kind, 0.0).get(EQUIVALENT, 0.0)}
    none = simulate(n, sd, delta, kind, 0.0)
    return {"fp": none.get(PAPERS, 0.0),
            "fn1": 1 - simulate(n, sd, delta, kind, delta).get(PAPERS, 0.0),
            "fn2": 1 - simulate(n, sd, delta, kind, 2 * delta).get(PAPERS, 0.0),
            "eq": none.get(EQUIVALENT, 0.0)}


def verdict_of(d: list[float], quick: bool = False) -> str:
    """The rule of 1987642 (EARLIER_RULE) for one contrast, d seed by seed."""
    if quick or len(d) < 2:
        return "smoke" if quick else "one seed"
    if not all(map(math.isfinite, d)):  # e.g. a gain per nat where nothing was gained
        return "undefined (d is not a number in some seed)"
    m, sd = statistics.mean(d), statistics.stdev(d)
    return "reproduced" if m > sd else "not reproduced" if m < -sd else "inconclusive"


def claim_verdict(verdicts: list[str]) -> str:
    """The rule of 1987642 (EARLIER_RULE) for a claim from its contrasts' verdicts."""
    if set(verdicts) <= {"smoke", "one seed"}:
        return verdicts[0]
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    if "reproduced" not in verdicts and "not reproduced" in verdicts:
        return "not reproduced"
    return "inconclusive" if all(v == "inconclusive" for v in verdicts) else "partly"


# ---- docs/CLAIMS.md and its plots ----------------------------------------------------------------
def ms(values: list[float], digits: int = 1) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    sd = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.{digits}f}{sd}"


def arm_table(cid: str, r: dict) -> list[str]:
    cols = HEADLINE.get(cid, [("acc", "acc")]) + [(f"acc {n}", f"acc{n}") for n in SIZES]
    digits = CLAIMS[cid].get("digits", 1)
    seeds = [str(s) for s in r["seeds"]]
    start = {"p10": "p10_0", "p1": "p1_0", "score": "score0", "acc": "start", "area": "start",
             "peak": "start", "none": "none0", **{f"acc{n}": f"start{n}" for n in SIZES}}
    lines = ["| arm | " + " | ".join(c for c, _ in cols) + " | steps | command (+ --model START "
             "--seed S) |", "|---" * (len(cols) + 3) + "|"]
    first = next(a for a in r["commands"] if all(a in r["figures"][s] for s in seeds))
    lines.append("| start model | " + " | ".join(
        ms([get(r["figures"][s][first], start.get(k, "")) for s in seeds],
           digits * (k == "score") or 1) for _, k in cols)
        + " | 0 | |")
    for arm, cmd in r["commands"].items():
        role = label(CLAIMS[cid]["arms"][arm])
        if CLAIMS[cid]["arms"][arm].role == "probe":
            role += "; post hoc, added in " + (CLAIMS[cid]["arms"][arm].added or "?")
        ran = [s for s in seeds if arm in r["figures"][s]]  # a kept probe: its seeds alone
        if ran != seeds:
            role += f"; seed{'s' * (len(ran) > 1)} {', '.join(ran)}"
        lines.append(f"| {arm} ({role}) | " + " | ".join(
            ms([get(r["figures"][s][arm], k) for s in ran], digits * (k == "score") or 1)
            for _, k in cols)
            + f" | {r['figures'][ran[0]][arm]['steps']} | `{' '.join(each_flag_once(cmd))}` |")
    return lines


def get(f: dict, key: str) -> float:
    if key == "none":  # no correct answer among the final evaluation's k samples, %
        return 100 - f["pass"]
    if key == "none0":
        return 100 - f["curve"][0]["pass"]
    return f.get(key, math.nan)


def plot(cid: str, r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kind, seeds, arms = CLAIMS[cid]["plot"], [str(s) for s in r["seeds"]], r["commands"]

    def style(arm, text=None):  # probes dashed
        probe = arm in CLAIMS[cid]["arms"] and CLAIMS[cid]["arms"][arm].role == "probe"
        return {"linestyle": "--" if probe else "-", "label": (text or arm) + " (probe)" * probe}
    fig, axes = plt.subplots(1, 2 if kind == "kl" else 1, squeeze=False,
                             figsize=(11 if kind == "kl" else 6.4, 4))
    axes = list(axes[0])
    ax = axes[0]
    if kind == "ptilde":  # [TOPR] Figs. 5-6: final acc against p~ on a log axis
        groups = {}
        for arm in arms:
            name, pt = arm.rsplit("-pt", 1)
            groups.setdefault(name, []).append((float(pt), [r["figures"][s][arm]["acc"]
                                                            for s in seeds
                                                            if arm in r["figures"][s]]))
        for name, pts in groups.items():
            xs, ys = zip(*pts)
            ax.errorbar(xs, [statistics.mean(y) for y in ys], capsize=3, marker="o",
                        yerr=[statistics.stdev(y) if len(y) > 1 else 0 for y in ys],
                        **style(f"{name}-pt10", name))
        ax.set_xscale("log")
        ax.set_xlabel("effective positive share p~ (%)")
    else:  # accuracy (pass@k for [SPO]) along training, or against KL; mean over seeds
        key = "pass" if cid == "spo-fig1" else "acc"
        for arm in arms:
            curves = [r["figures"][s][arm]["curve"] for s in seeds if arm in r["figures"][s]]
            n = min(len(c) for c in curves)
            ys = [statistics.mean(c[i][key] for c in curves) for i in range(n)]
            xs = [curves[0][i]["step"] for i in range(n)]
            ax.plot(xs, ys, marker="o", **style(arm))
            if kind == "kl":  # [AGRO] Fig. 6's right panel: the same evaluations against KL
                kls = [statistics.mean(c[i]["kl"] for c in curves) for i in range(n)]
                axes[1].plot(kls, ys, marker="o", **style(arm))
        ax.set_xlabel("step (16 an epoch)" if cid == "agro-fig5" else "step")
    for a in axes:
        a.set_ylabel("held-out pass@20 at T = 1 (%), 50 a size" if cid == "spo-fig1" else
                     "held-out accuracy at T = 1 (%), sizes 3 and 4")
        a.legend(fontsize=8)
    if kind == "kl":
        axes[1].set_xlabel("KL to the start model (nats, batches since the last evaluation)")
    ax.set_title(f"{CLAIMS[cid]['paper']}, mean of {len(seeds)} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_doc(args) -> str:
    """docs/CLAIMS.md from every OUT/<claim>/result.json, with docs/CLAIMS-notes.md appended
    (--real-cpu: its own doc, results and notes, DOC-notes.md; "not run yet" where none)."""
    results, gone_here = {}, REAL_CPU["not_run"] if real(args) else {}
    for cid in [c for c in CLAIMS if c not in gone_here]:  # this --out's, else the one kept
        for path in (os.path.join(args.out, cid, "result.json"),
                     os.path.join(archive(args), f"{cid}.json")):
            if os.path.exists(path):
                results[cid] = lab.read_json(path)
                break
    for cid in [c for c in CLAIMS if c not in results and c not in gone_here]:  # composed
        if (r := composed(cid, results)) is not None:
            results[cid] = r
    for cid, r in results.items():  # the rule applied to every result, older ones included
        r["primary"], r["added"] = primary_of(cid, r), added_of(cid, r)
        if "earlier_verdict" not in r and cid in EARLIER_CLAIMS:  # made under the earlier rule
            r["earlier_verdict"] = r["verdict"]
    earlier_path = os.path.join(ARCHIVE, f"earlier-{EARLIER}.json")
    earlier = lab.read_json(earlier_path) if os.path.exists(earlier_path) and not real(args) \
        else {"claims": {}}  # the earlier runs are tiny's
    done = [r["primary"]["verdict"] for r in results.values()]
    runnable = [cid for cid, c in CLAIMS.items() if c.get("runs", True) and cid not in gone_here]
    total = minutes(list(results.values()))
    own = minutes([verdict_runs(cid, r, args) for cid, r in results.items()])
    unprobed = [cid for cid, r in results.items() if not r["quick"] and any(  # --skip-probes
        arm.role == "probe" and name not in r["commands"]
        for name, arm in CLAIMS[cid]["arms"].items())]
    skipped = " --skip-probes" if unprobed else ""
    gone = [run_name(x) for r in results.values()  # kept results whose runs are elsewhere
            if not any(os.path.exists(os.path.join(ROOT, x)) for x in r["runs"]) for x in r["runs"]]
    once = "each run counted once" if len(gone) == len(set(gone)) else (
        "at most: the runs are not in this checkout, so a run two claims share is counted in each")
    took = (f"{own:.0f} minutes for their verdicts and {total:.0f} with the probes ({once})"
            if not unprobed else f"{own:.0f} minutes ({once}; "
            f"the probes of {', '.join(unprobed)} not run again: --skip-probes)")
    lines = real_cpu_head(args, took, summary(done, len(runnable))) if real(args) else [
        "# The papers' claims in miniature", "",
        "<!-- generated by scripts/claims.py: edit docs/CLAIMS-notes.md or the script -->", "",
        f"Command: `python scripts/claims.py all --sft {lab.repo_relative(args.sft)}{skipped}"
        + (f" --seeds {','.join(map(str, args.seeds))}" if args.seeds != [0, 1, 2] else "")
        + "` (each claim alone: its id instead of `all`; `--render-only` rebuilds this file from "
        f"the runs' result.json{added_runs(results)}). Commit " + lab.commit()
        + f", {lab.machine()}, "
        f"{time.strftime('%Y-%m-%d')}; start model `{lab.repo_relative(args.sft)}` "
        f"(sft.py's defaults, seed 0); the claims below took {took}, two runs side by side on "
        "one thread each.", "",
        DOC["figures"].replace("$pool", " ".join(POOL)), "", RULE, "", EARLIER_RULE, "",
        f"**The scale of every verdict below: {SCALE}**, not the papers' models (8B; [CR]'s "
        "0.5B) or their data. Primary contrasts: "
        f"{summary(done, len(runnable))}; registered as not run here "
        f"{len(CLAIMS) - len(runnable)}.", ""]
    lines += [
        "| claim | the paper says | what differs: the paper's -> ours "
        + ("(tiny's; --real-cpu changes the model, budgets and lr: above) " if real(args) else "")
        + "| primary contrast: "
        "mean d [95% interval] (per seed); delta, why | verdict | the rule of 1987642 |",
        "|---|---|---|---|---|---|"]
    for cid, claim in CLAIMS.items():
        r, digits = results.get(cid), claim.get("digits", 1)
        differs = "<br>".join(  # the seeds as run: sessions add seeds to a kept result
            f"{knob}: {paper} -> {len(r['seeds']) if knob == 'seeds' and r else ours}"
            for knob, paper, ours in departures(cid))
        if cid in gone_here:  # --real-cpu: no counterpart at this scale
            lines.append(f"| {claim['paper']} | {claim['says']} | {differs} | | not run at this "
                         f"scale: {gone_here[cid]} | |")
            continue
        if not claim.get("runs", True):
            lines.append(f"| {claim['paper']} | {claim['says']} | | | not run here: "
                         f"{claim['why']} | |")
            continue
        p = r["primary"] if r else None
        registered = f" (registered in {REGISTERED[cid]})" if cid in REGISTERED else ""
        cell = (f"{claim['primary'][0]}{registered}: "
                + (estimate(p, digits) if p else "not run yet")
                + f"; delta {claim['primary'][2]:g}: {DELTA_WHY[cid]}")
        added = r["added"] if r else [dict(text=a.text, d=[], delta=a.delta, verdict=NOT_RUN,
                                           registered=a.registered, delta_why=a.delta_why)
                                      for a in ADDED.get(cid, [])]
        cell += "".join(f"<br>added after results were seen (registered in {a['registered']}): "
                        f"{a['text']}: " + (estimate(a, digits) if a["d"] else NOT_RUN)
                        + f"; delta {a['delta']:g}: {a['delta_why']}" for a in added)
        then = [f"{r['earlier_verdict']} (these runs)"] if r and "earlier_verdict" in r else []
        if cid in earlier["claims"]:
            then.append(f"{earlier['claims'][cid]['verdict']} (the earlier runs)")
        lines.append(f"| [{claim['paper']}](#{cid}) | {claim['says']} | {differs} | {cell} | "
                     f"{verdict_text(p) if p else '**not run yet**'}"
                     + "".join(f"<br>added: {verdict_text(a)}" for a in added)
                     + f" | {'; '.join(then)} |")
    lines += [""] + rates_table(results) + [""] + (
        registration_paragraph() + real_cpu_beside(results) if not real(args)
        else [DOC["real_cpu_registration"], ""])
    for cid in [c for c in CLAIMS if c in results or c in earlier["claims"]]:
        claim, r = CLAIMS[cid], results.get(cid)
        if r is None:  # registered at 1987642, not yet run again
            lines += ["", f"## {cid}", "", f"**{claim['paper']}**: {claim['says']}.", "",
                      "Not yet run under the primary-contrast rule.", ""]
            lines += earlier_section(cid, earlier)
            continue
        mins = minutes([verdict_runs(cid, r, args)])
        took = (f"{mins:.0f} minutes for the verdict, {r['minutes']:.0f} with the probes"
                if round(mins) != round(r["minutes"]) else f"{mins:.0f} minutes")
        if "composed_from" in r:  # no run of its own (composed)
            took = "no runs of its own: the figures are those of " + ", ".join(
                f"{c}'s result (at {k})" for c, k in r["composed_from"].items())
        ours = claim["ours"] if not real(args) else (
            f"the tiny registry's, at --real-cpu's budgets and lr (the commands below): "
            f"{claim['ours']}")
        lines += ["", f"## {cid}", "", f"**{claim['paper']}**: {claim['says']}.", "",
                  f"The paper's setting: {claim['setting']}. Ours: {ours}; seeds "
                  f"{', '.join(map(str, r['seeds']))}; {took}.", ""]
        if any(r["p"].values()):
            lines += ["Positives in POOL: " + ", ".join(f"{100 * p:.1f}% (seed {s})" for s, p
                                                          in r["p"].items() if p) + ".", ""]
        digits, p = claim.get("digits", 1), r["primary"]
        lines += arm_table(cid, r) + [
            "", f"Primary contrast ({p['kind']}, delta {p['delta']:g}"
            + (f", registered in {REGISTERED[cid]}" if cid in REGISTERED else "")
            + f"): {p['text']}: {estimate(p, digits)}; {verdict_text(p)}"
            + results_at(r)
            + f". Delta {p['delta']:g}: {DELTA_WHY[cid]}." + registration(cid)]
        for a in r["added"]:  # beside the registered primary, never in its place
            lines += ["", f"Added primary ({a['kind']}, delta {a['delta']:g}, registered in "
                      f"{a['registered']}, after results were seen: {a['seen']}): {a['text']}: "
                      + (estimate(a, digits) if a["d"] else "its arms have not run yet")
                      + f"; {verdict_text(a)}. Delta {a['delta']:g}: {a['delta_why']}."]
        if "co" in p:
            lines += ["", f"Co-condition (added after the results were seen, issue 70): "
                      f"{p['co']['text']}: {ms(p['co']['c'], digits)} "
                      f"({', '.join(f'{x:.{digits}f}' for x in p['co']['c'])}); "
                      + ("met." if p["co"]["mean"] >= 0 else "not met: TOPR ended below its "
                         "start, so a lead over the comparator is a lead over a collapse.")]
        lines += (["", "| secondary contrast (paper's direction positive) | mean ± sd | per seed "
                   "| verdict (the rule of 1987642) |", "|---|---|---|---|"]
                  if r["contrasts"] else [])
        lines += [f"| {c['text']} | {ms(c['d'], digits)} | "
                  f"{', '.join(f'{x:.{digits}f}' for x in c['d'])} | {verdict_cell(c)} |"
                  for c in r["contrasts"]]
        lines += ["", f"Claim: {verdict_text(p)}"
                  + (f" (the rule of 1987642: {r['earlier_verdict']})" if "earlier_verdict" in r
                     else "") + "."]
        if claim["plot"]:
            png = f"{args.doc[:-3]}-{cid}.png"  # docs/CLAIMS-<claim>.png beside docs/CLAIMS.md
            plot(cid, r, png)
            lines += ["", f"![{cid}]({os.path.basename(png)})"]
        if cid in earlier["claims"]:
            lines += [""] + earlier_section(cid, earlier)
        conclude = (CONCLUDE_REAL_CPU if real(args) else CONCLUDE).get(cid)  # each scale's
        if conclude:  # the section's last sentence: what the runs let a reader conclude
            lines += ["", f"**What to conclude.** {conclude}"]
    text = lab.write_doc(args.doc, "\n".join(lines))  # docs/CLAIMS-notes.md after it
    if args.readme:  # its one line between the markers: the count and the command
        line = (f"At the scale of {SCALE}, the papers' headline claims run like for like "
                f"in miniature "
                f"([docs/CLAIMS.md]({os.path.relpath(args.doc, os.path.dirname(args.readme))}"
                f"), `python scripts/claims.py all --sft runs/sft-countdown/final{skipped}`"
                f"; {'' if len(gone) == len(set(gone)) else 'at most '}"
                f"{own / 60:.1f} h on 2 cores for the verdicts"
                + (f", {total / 60:.1f} h with the investigations" if not unprobed else "")
                + "); one primary contrast per claim, judged by the mean over "
                f"{seed_counts(results)} seeds and its "
                f"95% interval: {summary(done, len(runnable))}, and "
                f"{len(CLAIMS) - len(runnable)} registered as not run here."
                + real_cpu_line(args))
        line = "\n".join(textwrap.wrap(line, 100, break_on_hyphens=False))
        lab.replace_block(args.readme, README_START, README_END,
                          f"{README_START}\n{line}\n{README_END}")
    return text


def real_cpu_text(ids: list[str], args) -> list[str]:
    """--real-cpu's sizing, its lr scaling, the claims it leaves out and each claim's estimated
    minutes (real_cpu_minutes), cheapest first: the dry run's header and the doc's."""
    lrs = ", ".join(f"{script} {show_lr(a)} -> {show_lr(b)} (x {b / a:.3g})"
                    for script, (a, b) in REAL_CPU["lr"].items())
    cost = sorted((real_cpu_minutes(cid, args), cid) for cid in ids)
    pool = REAL_CPU["pool"]["flags"]
    return [f"--real-cpu: sized for {REAL_CPU['scale']}. Every arm: "
            f"`{' '.join(REAL_CPU['flags'])}`; POOL {flag_of(pool, 'prompts')} prompts x 8, its "
            f"mixes {REAL_CPU['pool']['mix']} samples at most; 24 steps of 32 samples for "
            "rloo.py, agro.py and spo.py; 32 samples a step for topr.py (common.toml's "
            "[real_cpu]).",
            f"lr scaled per script, tiny's main lr -> SmolLM2's measured one, the same factor for "
            f"every arm of a script: {lrs}. Paper-setting arms keep the paper's lr, unscaled.",
            "Not run at this scale: " + "; ".join(f"{c} ({why})" for c, why in
                                                  REAL_CPU["not_run"].items()) + ".",
            f"Estimated minutes a claim, {len(args.seeds)} seed(s), one run at a time on 2 cores "
            "(its arms' steps, evaluations and sampling, shared runs and POOL included; "
            "common.toml's [real_cpu.cost]), cheapest first: "
            + ", ".join(f"{cid} {m:.0f}" for m, cid in cost) + "."]


def real_cpu_head(args, took: str, verdicts: str) -> list[str]:
    """The opening of --real-cpu's doc: its command, what was sized and scaled, the rule."""
    ids = [c for c, v in CLAIMS.items() if v.get("runs", True) and c not in REAL_CPU["not_run"]]
    sft = lab.repo_relative(args.sft)
    return [
        "# The papers' claims at the real model's scale (SmolLM2-135M-Instruct, 2 CPU cores)", "",
        "<!-- generated by scripts/claims.py --real-cpu: edit docs/CLAIMS-real-cpu-notes.md or "
        "the script -->", "",
        f"Command: `python scripts/claims.py all --sft {sft} --real-cpu"
        + (f" --seeds {','.join(map(str, args.seeds))}" if args.seeds != [0, 1, 2] else "")
        + "` (each claim alone: its id instead of `all`; `--dry-run` prints every command; "
        "`--render-only` rebuilds this file from the runs' result.json, kept in "
        f"{REAL_CPU['archive']}/). Commit {lab.commit()}, {lab.machine()}, "
        f"{time.strftime('%Y-%m-%d')}; start model `{sft}` (sft.py's 40 steps on SmolLM2, "
        f"docs/REAL-MODEL.md); the claims below took {took}.", "",
        DOC["real_cpu_figures"], ""] + [
        t.replace("--real-cpu: sized", "**What --real-cpu changes.** Sized") for t in
        real_cpu_text(ids, args)[:3]] + ["", RULE, "", EARLIER_RULE, "",
        f"**The scale of every verdict below: {REAL_CPU['scale']}.** Primary contrasts: "
        f"{verdicts}.", ""]


def registration(cid: str) -> str:
    """How a claim's primary was chosen (REGISTRATION), as its section says it."""
    if cid not in REGISTRATION:
        return ""
    how, what = REGISTRATION[cid]
    return f" Registration: {'ran blind' if how == 'blind' else 'not blind'}: {what}."


def registration_paragraph() -> list[str]:
    """Which primaries ran blind and which were chosen with results seen (REGISTRATION); the
    claims and added primaries (ADDED) registered after 37c3416."""
    first = {c: v for c, v in REGISTRATION.items() if REGISTERED[c] == "37c3416"}
    blind = [c for c, (how, _) in first.items() if how == "blind"]
    seen = [c for c in EARLIER_CLAIMS if first.get(c, ("",))[0] == "seen"]
    reuse = [c for c, (how, what) in first.items()  # then those partly blind
             if how == "seen" and c not in EARLIER_CLAIMS] + [
        c for c, (how, _) in first.items() if how == "partly"]
    later = [c for c in REGISTRATION if c not in first]
    commits = sorted({REGISTERED[c] for c in later} | {a.registered for x in ADDED.values()
                                                       for a in x})
    after = ([f" Registered later ({', '.join(commits)}): "
              + (f"the claims {', '.join(later)} (ran blind: "
                 f"{', '.join(c for c in later if REGISTRATION[c][0] == 'blind') or 'none'}); "
                 if later else "")
              + f"the added primaries of {', '.join(ADDED)}, chosen after their claims' results "
              "had been seen, each shown beside its claim's registered primary, never in its "
              "place."] if later or ADDED else [])
    return [f"**What was registered blind.** No primary, delta or verdict arm changed after "
            f"37c3416, but that is true of the code, not of the choices. Ran blind: "
            f"{', '.join(blind)} and agro-fig4's off-policy arm (registered before any of their "
            f"runs). Chosen after results had been seen: {', '.join(seen)} (37c3416 came after "
            f"{EARLIER} had rendered these nine with the same code and seeds; topr-fig1's "
            "primary, TOPR end - start, which had failed there, was chosen over TOPR end - naive "
            f"end, which had passed); and {', '.join(reuse)} reuse runs already seen "
            "(agro-fig4 its on-policy arm). Each claim's section says which. The co-conditions "
            "of topr-fig6 and topr-fig7 (the paper's method must end at or above its start, or "
            f"the verdict is **{COLLAPSED}**) were added after their results were seen."
            + "".join(after), ""]


def real_cpu_line(args) -> str:
    """The README's words on the claims --real-cpu has run on SmolLM2, if any."""
    folder = os.path.join(ROOT, REAL_CPU["archive"])
    done = {c: primary_of(c, lab.read_json(os.path.join(folder, f"{c}.json")))["verdict"]
            for c in CLAIMS if os.path.exists(os.path.join(folder, f"{c}.json"))}
    if not done:
        return ""
    doc = os.path.relpath(os.path.join(ROOT, REAL_CPU["doc"]), os.path.dirname(args.readme))
    return (f" On SmolLM2-135M-Instruct, {len(done)} claim{'s' * (len(done) > 1)} run so far "
            f"([{REAL_CPU['doc']}]({doc}), `--real-cpu`): "
            + ", ".join(f"{c} {v.split(' (')[0]}" for c, v in done.items()) + ".")


def real_cpu_beside(results: dict) -> list[str]:
    """The claims --real-cpu has run on SmolLM2 (their kept results), each beside the tiny
    model's primary: a table for the tiny doc, nothing where none has run."""
    folder, rows = os.path.join(ROOT, REAL_CPU["archive"]), []
    for cid in CLAIMS:
        path = os.path.join(folder, f"{cid}.json")
        if not os.path.exists(path):
            continue
        real_r, digits = lab.read_json(path), CLAIMS[cid].get("digits", 1)
        p, tiny = primary_of(cid, real_r), results.get(cid, {}).get("primary")
        rows.append([f"[{cid}](#{cid})", CLAIMS[cid]["primary"][0],
                     (f"{estimate(tiny, digits)}; {verdict_text(tiny, bold=False)}" if tiny
                      else NOT_RUN), f"{estimate(p, digits)}; {verdict_text(p, bold=False)}"])
    if not rows:
        return []
    return ["**Beside the real model.** The claims `--real-cpu` has run on SmolLM2-135M-Instruct "
            "([docs/CLAIMS-real-cpu.md](CLAIMS-real-cpu.md): 3-number puzzles, about 20-30 "
            "steps of 32 samples, lr scaled per script), each primary beside the tiny model's; "
            "the rule is the same.",
            ""] + lab.md_table(["claim", "primary contrast", "tiny: mean d [95% interval] "
                                "(per seed); verdict", "SmolLM2: mean d [95% interval] "
                                "(per seed); verdict"], rows) + [""]


def rates_table(results: dict) -> list[str]:
    """The rule's simulated error rates at each claim's observed per-seed sd of d and its seeds
    (error_rates), for the doc's paragraph after the main table."""
    pct = lambda x: f"{100 * x:.0f}%" if x >= 0.005 or x == 0 else "<1%"  # noqa: E731
    rows, equal, cache = [], [], {}
    for cid, r in results.items():
        p, digits = r["primary"], CLAIMS[cid].get("digits", 1)
        if "sd" not in p:
            continue
        key = (p["n"], round(p["sd"] / p["delta"], 6), p["kind"])
        if key not in cache:
            cache[key] = error_rates(p["n"], p["sd"] / p["delta"], 1.0, p["kind"])
        e, sd = cache[key], f"{p['sd']:.{digits + 1}f} ({p['sd'] / p['delta']:.2g} delta)"
        if p["kind"] == "equal":
            equal.append(f"{cid} ({p['n']} seeds, sd {sd}): P(equivalent | an effect of delta) "
                         f"{pct(e['fp'])}, P(not equivalent | no effect) {pct(e['fn1'])}")
            continue
        rows.append([cid, str(p["n"]), sd, pct(e["fp"]), pct(e["fn1"]), pct(e["fn2"]),
                     pct(e["eq"])])
    if not rows:
        return []
    return [DOC["rates"].format(draws=SIM_DRAWS, seed=SIM_SEED), ""] + lab.md_table(
        ["claim", "seeds", "sd of d", "P(paper's direction \\| no effect)",
         "P(not paper's direction \\| effect = delta)",
         "P(not paper's direction \\| effect = 2 delta)", "P(equivalent \\| no effect)"], rows) + (
        ["", "Claims of no difference: " + "; ".join(equal) + "."] if equal else [])


def verdict_cell(c: dict) -> str:
    """A secondary contrast's verdict as the doc shows it: a probe's apart, a claim of no
    difference with its delta."""
    if c.get("probe"):
        return f"({c['verdict']}: {c.get('role', 'probe')}, not in the verdict)"
    if "delta" in c:
        return f"{c['verdict']} (no difference claimed: the primary rule, delta {c['delta']:g})"
    return c["verdict"]


def earlier_section(cid: str, earlier: dict) -> list[str]:
    """A claim as 1987642 registered it, on the runs of its results commit (kept in ARCHIVE since
    their result.json files are gone): the arms, every contrast and the verdict of EARLIER_RULE,
    then the primary contrast computed on them post hoc, where it is one of those contrasts."""
    e, commit = earlier["claims"][cid], earlier["results"]
    lines = [f"**The earlier runs** (docs/CLAIMS.md as of {earlier['registered']}, rendered at "
             f"{commit} from runs on 2 cores, AMD EPYC, 2026-11-27, with its own start model; "
             f"figures as that doc gave them). {e['setting']}", ""]
    lines += lab.md_table(e["arm_header"], e["arms"]) + [""]
    lines += lab.md_table(["contrast (paper's direction positive)", "mean ± sd", "per seed",
                           "verdict"],
                          [[c["text"], c["mean_sd"], ", ".join(map(str, c["d"])), c["verdict"]]
                           for c in e["contrasts"]])
    lines += ["", f"Claim on the earlier runs, the rule of {earlier['registered']}: "
              f"**{e['verdict']}**."]
    (text, _, delta, kind), digits = CLAIMS[cid]["primary"], CLAIMS[cid].get("digits", 1)
    same = [c["d"] for c in e["contrasts"] if c["text"] == text]
    if same:  # registered after these runs were seen: post hoc, not a verdict of the claim
        verdict, stats = primary_verdict(same[0], delta, kind)
        p = {"d": same[0], "delta": delta, "verdict": verdict, **stats}
        lines += ["", f"The primary contrast on these runs, post hoc (registered after them, in "
                  f"{REGISTERED[cid]}): {estimate(p, digits)}; {verdict_text(p, bold=False)}."]
    return lines


def summary(verdicts: list[str], runnable: int) -> str:
    """The primaries' verdicts in a few words: "2 of 18 in the paper's direction, ..."."""
    short = [v.split(" (")[0] for v in verdicts]  # "not testable here (why)" counts as one
    counts = [f"{short.count(v)} {v}" for v in VERDICTS[1:] if short.count(v)]
    rest = [f"{runnable - len(verdicts)} not run yet"] if len(verdicts) < runnable else []
    return ", ".join([f"{short.count(PAPERS)} of {runnable} in the {PAPERS}"] + counts + rest)


def estimate(p: dict, digits: int = 1) -> str:
    """A primary's d as the doc shows it: "mean -1.5 [-2.6, -0.5] (-1.1, -1.7, -1.8)", the 95%
    interval in brackets, every seed in parentheses."""
    seeds = ", ".join(f"{x:.{digits}f}" for x in p["d"])
    if "mean" not in p:
        return f"- ({seeds})"
    lo, hi = p["ci"]
    return f"mean {p['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] ({seeds})"


def detail(p: dict) -> str:
    """What decided a primary's verdict beyond its label: for one not detected, why, and about
    how many seeds would decide (seeds_needed)."""
    if p.get("verdict") != NOT_DETECTED and p.get("rule") != NOT_DETECTED or "mean" not in p:
        return ""
    lo, hi = p["ci"]
    why = ("the interval is clear of 0 but the mean is short of delta: a difference too small "
           "to count" if lo > 0 or hi < 0 else "the interval holds 0 and reaches past +-delta")
    n = p.get("needed")
    more = (f"about {n} seeds would decide at the observed mean and sd" if n else
            f"over {MAX_SEEDS} seeds would be needed at the observed mean and sd")
    return f"{why}; {more}"


def verdict_text(p: dict, bold: bool = True) -> str:
    """A primary's verdict (in bold), with why a claim is not testable here and what the rule
    alone gives it, and why nothing was detected (detail)."""
    b = "**" if bold else ""
    extra = detail(p)
    if "why" in p:  # the rule's own "not testable here (why)" shows its why alone
        rule = p["rule"].removeprefix(f"{UNTESTED} (").removesuffix(")") \
            if p["rule"].startswith(f"{UNTESTED} (") else p["rule"]
        return f"{b}{p['verdict']}{b} ({p['why']}; the rule alone: {rule}" \
            + (f": {extra}" if extra else "") + ")"
    if p["verdict"] == COLLAPSED:
        co = p["co"]
        return (f"{b}{p['verdict']}{b} (the rule alone: {p['rule']}, but "
                f"{co['text'].split(': ', 1)[-1]} is {co['mean']:.1f} in the mean "
                f"({', '.join(f'{x:.1f}' for x in co['c'])}): TOPR ended below its start, "
                "ahead of a comparator that fell further, not a win)")
    return f"{b}{p['verdict']}{b}" + (f" ({extra})" if extra else "")


def seed_list(text: str) -> list[int]:
    """argparse type: comma-separated seeds (integers from 0)."""
    return [common.nonnegative_int(n) for n in text.split(",")]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("claims", nargs="+", help="claim ids, or all: " + ", ".join(CLAIMS))
    p.add_argument("--sft", required=True, help="the start model of every arm (an sft.py run)")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2], help="seeds of every arm")
    p.add_argument("--arms", type=lambda v: v.split(","), default=None,
                   help="run only these arms (comma-separated) for --seeds, beside the kept "
                   "result's other arms (docs/claims/): an arm added to a claim after its runs")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny budgets, no verdicts")
    p.add_argument("--skip-probes", action="store_true",
                   help="run a claim's own arms only, not the investigations beside it")
    p.add_argument("--dry-run", action="store_true",
                   help="print every arm's command for every seed, run nothing")
    p.add_argument("--paper-settings", action="store_true", help="the papers' lr, lengths and "
                   "Q0 samples where known (PAPER_SETTINGS): for a GPU and a real --sft model")
    p.add_argument("--real-cpu", action="store_true", help="sized for SmolLM2-135M-Instruct on 2 "
                   "CPU cores (common.toml's [real_cpu]): 3-number puzzles, short budgets, lr "
                   "scaled per script; its own --out, --doc and results, no README line")
    p.add_argument("--render-only", action="store_true",
                   help="run nothing: rebuild --doc from the result.json files under --out")
    p.add_argument("--jobs", type=common.positive_int, default=2, help="runs side by side")
    p.add_argument("--threads", type=common.positive_int, default=1, help="torch threads a run")
    p.add_argument("--out", default=None, help="folder of the runs and result.json files "
                   "(default: runs/claims, runs/claims-quick with --quick, runs/claims-real-cpu "
                   "with --real-cpu)")
    p.add_argument("--doc", default=None, help="the generated table, its plots beside it "
                   "(default: docs/CLAIMS.md, OUT/CLAIMS.md with --quick, "
                   "docs/CLAIMS-real-cpu.md with --real-cpu)")
    p.add_argument("--readme", default=None, help="README whose claims line is replaced ('' to "
                   "leave it alone; default: README.md, none with --quick or --real-cpu)")
    args = p.parse_args(argv)
    if args.real_cpu and (args.quick or args.paper_settings):  # one line, as argparse exits: 2
        other = "--quick" if args.quick else "--paper-settings"
        print(f"claims.py: --real-cpu cannot go with {other}: it has its own budgets and keeps "
              "the papers' lr in its paper-setting arms", file=sys.stderr)
        raise SystemExit(2)
    if args.real_cpu:  # its own runs, doc and results: the tiny ones are never touched
        args.out = args.out or os.path.join(ROOT, REAL_CPU["out"])
        args.doc = args.doc or os.path.join(ROOT, REAL_CPU["doc"])
        args.readme = "" if args.readme is None else args.readme
    if args.out is None:  # a smoke run writes nothing of the project's; from any folder
        args.out = os.path.join(ROOT, "runs", "claims-quick" if args.quick else "claims")
    if args.doc is None:
        args.doc = os.path.join(args.out, "CLAIMS.md") if args.quick else \
            os.path.join(ROOT, "docs", "CLAIMS.md")
    if args.readme is None:
        args.readme = "" if args.quick else os.path.join(ROOT, "README.md")
    ids = [c for c in CLAIMS if CLAIMS[c].get("runs", True) and not (
        args.real_cpu and c in REAL_CPU["not_run"])] if args.claims == ["all"] else args.claims
    if unknown := [c for c in ids if c not in CLAIMS]:
        p.error(f"unknown claim {unknown[0]!r}; choose from: all, {', '.join(CLAIMS)}")
    if unrun := [c for c in ids if not CLAIMS[c].get("runs", True)]:
        p.error(f"{unrun[0]} is not run here: {CLAIMS[unrun[0]]['why']}")
    if args.real_cpu and (unrun := [c for c in ids if c in REAL_CPU["not_run"]]):
        p.error(f"{unrun[0]} is not run with --real-cpu: {REAL_CPU['not_run'][unrun[0]]}")
    if args.dry_run:  # any start model the scripts take: `smollm2`, a hub id, a folder
        print("\n".join(dry_run(ids, args)))
        return
    if not args.render_only:  # rendering runs nothing: --sft only names the start model
        if not os.path.isdir(args.sft):
            p.error(f"--sft {args.sft}: no such folder (make one with sft.py)")
        args.sft = os.path.abspath(args.sft)
    args.out = os.path.abspath(args.out)
    for cid in [] if args.render_only else ids:
        run_claim(cid, args)
    print(write_doc(args))


if __name__ == "__main__":
    main()
