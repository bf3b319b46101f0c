"""The papers' headline claims in miniature: each run like for like from one start model, 3 seeds,
a verdict by one rule; writes docs/CLAIMS.md and its plots (docs/CLAIMS-<claim>.png).

    python scripts/claims.py all --sft runs/sft-countdown/final        # every claim, 2 cores
    python scripts/claims.py topr-fig5 --sft runs/sft-countdown/final  # one claim
    python scripts/claims.py all --quick --sft runs/sft-countdown/final   # smoke run, ~8 min

Every arm is one command of an algorithm script from the --sft model with --seed s; --jobs runs
side by side, one torch thread each (fixed steps, so the figures do not depend on the clock), run
by scripts/lab.py's runner (a finished run is kept: an interrupted claim goes on where it
stopped). Within a seed every arm of a claim shares the held-out problems, the evaluation draws
and, where a claim trains off-policy, the same samples of the start model (the registry's POOL).
Each claim writes OUT/<claim>/result.json and keeps a copy in docs/claims/ (in git); the doc is
rebuilt from them, so one claim run alone updates its own rows, and --render-only works on a clean
checkout. The hand-written investigations (docs/CLAIMS-notes.md) follow.

The claims themselves (their arms, contrasts, primaries, departures from the papers and settings)
are data in scripts/claims_registry.py; this file runs them (run_claim) and renders the doc
(write_doc).

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
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (its final evaluation's decoding for [CR], REPORT_DECODING)
import lab  # noqa: E402  (the runner: one command to completion, a finished run kept)
from compare import common  # noqa: E402
from lab import ROOT, side_by_side  # noqa: E402
from tasks import get_task, scoring  # noqa: E402
import claims_registry  # noqa: E402  (the claims, their arms and settings, as data)
from claims_registry import (  # noqa: E402
    CLAIMS, CONCLUDE, EARLIER, EARLIER_CLAIMS, HEADLINE, N_MIX, PAPER_SETTINGS, POOL, PROBES_ADDED,
    QUICK, REGISTERED, SCALE, SIZES, SPO_EVAL, UNTESTABLE, departures, label)
PTILDE, c_for = claims_registry.PTILDE, claims_registry.c_for  # read as claims.c_for (tests)

README_START, README_END = "<!-- claims:start -->", "<!-- claims:end -->"
ARCHIVE = os.path.join(ROOT, "docs", "claims")  # every claim's last result.json, kept in git
# The rule: a claim's verdict is its primary contrast's alone (primary_verdict); the other
# contrasts are shown under the rule of 1987642 (EARLIER_RULE), as they were registered.
RULE = ("Each claim has one **primary contrast**, about the paper's own method, registered before "
        "the runs that give its verdict (the commit is named with it): d = arm - comparator, seed "
        "by seed, signed so that the paper's direction is positive, and delta, registered with it, "
        "the smallest difference that counts (1 point of accuracy, 0.01 of mean reward, or a "
        "relative 25% for a ratio). The verdict reads the **median seed**, so that one outlier "
        "seed neither makes nor breaks it: a claim of a difference goes the **paper's "
        "direction** if the median d >= delta, the **opposite direction** if it is <= -delta, "
        "and is **not detected at this power** otherwise (whether or not the seeds lie within "
        "+-delta: three seeds cannot show that there is no difference). A claim of no difference "
        "is **equivalent within delta** if all but one seed lie within +-delta and the median "
        "too, the **opposite direction** (a difference, against the paper) if the median lies "
        "beyond +-delta, not detected at this power otherwise. A claim whose runs cannot show "
        "the paper's claim whatever d is (the start model already at the ceiling, an arm known "
        "to collapse before the claim was registered, a check of the code) is **not testable "
        "here**, with the reason and what the rule alone gives. The margin is how far the median "
        "sits past the threshold that decided (negative: short of the nearest one). With "
        "per-seed noise of sd delta and no true effect, the median of 3 seeds passes delta 7% of "
        "the time: a screen, not a test.")
# The primary rule's verdicts (RULE), and a claim that its runs cannot test (UNTESTABLE)
PAPERS, OPPOSITE = "paper's direction", "opposite direction"
NOT_DETECTED, EQUIVALENT = "not detected at this power", "equivalent within delta"
UNTESTED = "not testable here"
VERDICTS = (PAPERS, OPPOSITE, NOT_DETECTED, EQUIVALENT, UNTESTED)
EARLIER_RULE = (
    "The rule of 1987642, for the secondary contrasts: **reproduced** if the mean of d over the "
    "seeds exceeds one sample sd, **not reproduced** if it is below minus one sd, "
    "**inconclusive** otherwise; a claim was reproduced when every contrast was, not reproduced "
    "when none was and one was opposite, inconclusive when all were within the noise, **partly** "
    "otherwise. That rule has no outcome for no difference: a secondary contrast where the paper "
    "claims none is judged as a primary of no difference is.")


# ---- Running the arms ----------------------------------------------------------------------------
def run(script: str, flags: list[str], out: str, seed: int, args, cid: str = "") -> str:
    """One script from the start model with this seed, to its end (or the finished run in out)."""
    cmd = command(script, flags, seed, args, cid) + ["--threads", str(args.threads), "--out", out]
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    name = os.path.relpath(out, args.out).replace(os.sep, "-")
    lab.run_script(name, cmd, out, os.path.join(args.out, "logs"))
    return out


def command(script: str, flags: list[str], seed: int, args, cid: str = "") -> list[str]:
    """An arm's command from the start model with this seed (its --quick or --paper-settings
    flags last: they win)."""
    extra = QUICK.get(script, []) if args.quick else []
    if getattr(args, "paper_settings", False):
        extra += PAPER_SETTINGS.get(cid, {}).get(script, [])
    return [sys.executable, script, "--model", args.sft, "--seed", str(seed), *flags, *extra]


def dry_run(ids: list[str], args) -> list[str]:
    """Every arm's command of these claims for every seed, run from the repository, nothing run;
    {pool} and the like name the files a run composes first (pool_files, spo_offline)."""
    lines = []
    if any(x.startswith(("{pool", "{pos", "{d")) for cid in ids
           for arm in CLAIMS[cid]["arms"].values() for x in arm.flags):
        lines += ["# POOL, first: the start model's samples, one file a seed (pool_files)"]
        lines += [" ".join(["python", *command("topr.py", POOL, s, args, "pool")[1:]])
                  for s in args.seeds]
    for cid in ids:
        for name, arm in CLAIMS[cid]["arms"].items():
            shared = CLAIMS[cid].get("shared", {}).get(name)
            lines += [f"# {cid} / {name} ({label(arm)})"
                      + (f": the runs of {shared}" if shared else "")]
            lines += [" ".join(["python", *command(arm.script, arm.flags, s, args, cid)[1:]])
                      for s in args.seeds]
    return lines


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
                quick = ["--train-size", "16"] if args.quick else []
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


def final_eval(model: str, seed: int, k: int, decoding: dict, size: int, threads: int) -> dict:
    """Correct answers out of k a held-out problem (the runs' problems of this seed) and the mean
    reward of every variant, under one decoding; in a fresh process (torch state)."""
    started = time.time()
    common.setup(seed, threads)
    task = get_task("countdown")
    m, tok = common.load_model(model)
    engine = common.make_engine("auto", m, tok, model, seed=seed)
    out = {"correct": [], "rewards": {}}
    for n in SIZES:
        problems = task.get_problems("test", size, size=n, seed=seed)
        prompts = common.encode_prompts(task, problems, tok, common.prompt_style(m, tok))
        groups = engine.generate(prompts, common.SamplingConfig(k, lab.eval_tokens(m), seed=seed,
                                                                **decoding))
        out["correct"] += [sum(task.is_correct(p, s.text) for s in g)
                           for p, g in zip(problems, groups)]
        scores = scoring.score(task, problems, groups, "sampled", all_rewards=True)
        for v in task.REWARD_VARIANTS:
            out["rewards"].setdefault(v, []).append(scores[f"sampled/reward_{v}"])
    out["seconds"] = time.time() - started
    return out


def final_evals(todo: list[tuple[str, str, int]], k: int, decoding: dict, args) -> list[dict]:
    """final_eval of (model, cache file, seed) each, kept in its cache file."""
    size = 20 if args.quick else 200
    missing = [(m, c, s) for m, c, s in todo if not os.path.exists(c)]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=spawn) as pool:
        for (_, cache, _), r in zip(missing, pool.map(
                final_eval, *zip(*[(m, s, k, decoding, size, args.threads)
                                   for m, _, s in missing]))):
            lab.write_json(cache, r)
    return [lab.read_json(c) for _, c, _ in todo]


# ---- What each run is worth ----------------------------------------------------------------------
def acc(row: dict) -> float:
    """Held-out accuracy at T = 1 over both sizes (the runs' own evaluation), in %."""
    return 100 * statistics.mean(row[f"eval{n}/sampled/accuracy"] for n in SIZES)


def figures(out: str) -> dict:
    """A run's curve (step, acc, format rate, pass@k) and its summary figures."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    evals = [r for r in rows if f"eval{SIZES[0]}/sampled/accuracy" in r]
    train = [r for r in rows if "loss" in r]
    pk = next(key for key in evals[-1] if key.startswith(f"eval{SIZES[0]}/pass@"))[6:]
    curve = [{"step": e["step"], "acc": acc(e),
              **{f"acc{n}": 100 * e[f"eval{n}/sampled/accuracy"] for n in SIZES},
              "format": 100 * statistics.mean(e[f"eval{n}/sampled/format_rate"] for n in SIZES),
              "pass": 100 * statistics.mean(e[f"eval{n}/{pk}"] for n in SIZES)} for e in evals]
    kls = [(r["step"], r["kl_to_ref"]) for r in train if "kl_to_ref" in r]
    kl = [k for _, k in kls[-10:]]
    for last, point in zip([-1] + [c["step"] for c in curve], curve):  # batches since the last
        since = [k for step, k in kls if last < step <= point["step"]]
        point["kl"] = statistics.mean(since) if since else 0.0  # step 0: the start model itself
    return {"curve": curve, "start": curve[0]["acc"], "acc": curve[-1]["acc"],
            **{f"acc{n}": curve[-1][f"acc{n}"] for n in SIZES},
            **{f"start{n}": curve[0][f"acc{n}"] for n in SIZES},
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
    if args.skip_probes:  # the claim's own arms and contrasts alone
        claim["arms"] = {a: v for a, v in claim["arms"].items() if v.role != "probe"}
        claim["contrasts"] = [c for c in claim["contrasts"] if c[2:] != ("probe",)]
    os.makedirs(claim_dir, exist_ok=True)
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
                 run_dir(cid, a, s, args), s, args, cid)
                for a in stage for s in args.seeds]
        side_by_side(run, jobs, args.jobs)
    m = {s: {a: figures(run_dir(cid, a, s, args)) for a in claim["arms"]}
         for s in args.seeds}
    runs = [run_dir(cid, a, s, args) for a in claim["arms"] for s in args.seeds]
    runs += [os.path.dirname(f["pool"]) for f in files.values() if "pool" in f]
    kind = claim.get("evaluate")  # a final evaluation of every arm's model, in its run folder
    if kind:  # spo: pass@1 and pass@10 from 20 samples at T = 0.4, top-p 0.95; cr: the mean
        # reward_original of 8 samples at T = 0.15, top-p 0.9, top-k 30
        k, decoding = ((4 if args.quick else 20), SPO_EVAL) if kind == "spo" else \
            (8, compare.REPORT_DECODING)
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
            else:  # rewards["original"]: one mean a size, in SIZES' order
                m[s][a].update(score=statistics.mean(after["rewards"]["original"]),
                               score0=statistics.mean(before["rewards"]["original"]),
                               score4=after["rewards"]["original"][SIZES.index(4)],
                               score4_0=before["rewards"]["original"][SIZES.index(4)])
    contrasts = []
    for text, fn, *role in claim["contrasts"]:  # with a role: shown, not in the earlier verdict
        d = [fn(m[s]) for s in args.seeds]
        contrasts.append(secondary(text, d, role[0] if role else "", args.quick))
    result = {"claim": cid, "seeds": args.seeds, "quick": args.quick,
              "runs": sorted({run_name(x) for x in runs}), "jobs": args.jobs, "figures": m,
              "p": {s: files[s].get("p") for s in args.seeds}, "contrasts": contrasts,
              "commands": {a: [arm.script, *arm.flags] for a, arm in claim["arms"].items()}}
    result["primary"], result["commit"] = primary_of(cid, result), lab.commit()
    result["verdict"] = result["primary"]["verdict"]
    if cid in EARLIER_CLAIMS:  # and under the rule these contrasts were registered with
        result["earlier_verdict"] = claim_verdict(
            [c["verdict"] for c in contrasts if not c["probe"]])
    result["minutes"] = minutes([result])  # the claim alone, its shared runs included
    result["verdict_minutes"] = minutes([verdict_runs(cid, result, args)])
    lab.write_json(os.path.join(claim_dir, "result.json"), result)
    if not args.quick:  # kept in git: --render-only rebuilds the doc on a clean checkout
        lab.write_json(os.path.join(ARCHIVE, f"{cid}.json"), result)
    print(f"[claims] {cid}: {result['verdict']} ({result['minutes']:.0f} min)", flush=True)
    return result


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
    verdict and margin (a result.json made before the rule gets them here too)."""
    text, fn, delta, kind = CLAIMS[cid]["primary"]
    d = []
    for s in r["seeds"]:  # result.json keys seeds as text
        try:
            d.append(fn(r["figures"][str(s)] if str(s) in r["figures"] else r["figures"][s]))
        except ZeroDivisionError:
            d.append(math.nan)
    verdict, margin = ("smoke", math.nan) if r["quick"] else primary_verdict(d, delta, kind)
    out = {"text": text, "d": d, "delta": delta, "kind": kind, "verdict": verdict,
           "margin": margin}
    if cid in UNTESTABLE and not r["quick"]:  # whatever d says: the rule's outcome kept beside it
        out.update(verdict=UNTESTED, why=UNTESTABLE[cid], rule=verdict)
    return out


def run_name(path: str) -> str:
    """A run folder or evaluation file as a result names it: relative to the repository's root,
    never a machine's path (an older result's absolute path is read the same way)."""
    return os.path.relpath(os.path.join(ROOT, path), ROOT)


def minutes(results: list[dict]) -> float:
    """Wall clock of the runs and final evaluations behind these results, each counted once, run
    --jobs side by side; a run's name is resolved against the repository's root (run_name)."""
    seen, total = set(), 0.0
    for r in results:
        paths = {os.path.join(ROOT, path) for path in r["runs"]}
        if not any(os.path.exists(path) for path in paths):  # an archived result alone
            total += 60 * r.get("minutes", 0.0) * r["jobs"]
            continue
        for path in paths - seen:
            seen.add(path)
            total += lab.read_json(path).get("seconds", 0) if path.endswith(".json") else \
                lab.read_json(os.path.join(path, "usage.json"))["wall_s"]
    return total / 60 / max(r["jobs"] for r in results) if results else 0.0


def verdict_runs(cid: str, r: dict, args) -> dict:
    """A claim's result with only the runs and evaluations behind its verdict (no probe's)."""
    probes = {run_name(run_dir(cid, a, s, args)) for a, arm in CLAIMS[cid]["arms"].items()
              if arm.role == "probe" for s in r["seeds"]}
    return dict(r, runs=[x for x in r["runs"] if run_name(x) not in probes
                         and os.path.dirname(run_name(x)) not in probes],
                minutes=r.get("verdict_minutes", r.get("minutes", 0.0)))


def primary_verdict(d: list[float], delta: float, kind: str = "more") -> tuple[str, float]:
    """(verdict, margin) of a primary contrast, d seed by seed (RULE). kind: "more" (the paper
    claims d > 0) or "equal" (the paper claims no difference, |d| < delta)."""
    nans = sum(math.isnan(x) for x in d)  # e.g. a gain per nat where nothing was gained
    if nans and len(d) - nans < 3:
        return "not testable here (d is not a number in too many seeds)", math.nan
    d = [x for x in d if not math.isnan(x)]
    if len(d) < 3:
        return "too few seeds", math.nan
    med = statistics.median(d)
    near = sum(abs(x) < delta for x in d) >= len(d) - 1 and abs(med) < delta  # no difference
    if kind == "equal":
        if near:
            return EQUIVALENT, delta - abs(med)
        if abs(med) >= delta:
            return OPPOSITE, abs(med) - delta  # a difference where the paper claims none
        return NOT_DETECTED, -(delta - abs(med))
    if kind != "more":
        raise ValueError(f"unknown kind of claim {kind!r}")
    if med >= delta:
        return PAPERS, med - delta
    if med <= -delta:
        return OPPOSITE, -delta - med
    return NOT_DETECTED, -min(delta - med, med + delta)  # seeds within +-delta included


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
    first = next(iter(r["commands"]))
    lines.append("| start model | " + " | ".join(
        ms([get(r["figures"][s][first], start.get(k, "")) for s in seeds],
           digits * (k == "score") or 1) for _, k in cols)
        + " | 0 | |")
    for arm, cmd in r["commands"].items():
        role = label(CLAIMS[cid]["arms"][arm])
        if CLAIMS[cid]["arms"][arm].role == "probe":
            role += "; post hoc, added in " + next(
                (c for start, c in PROBES_ADDED.items() if arm.startswith(start)), "?")
        lines.append(f"| {arm} ({role}) | " + " | ".join(
            ms([get(r["figures"][s][arm], k) for s in seeds], digits * (k == "score") or 1)
            for _, k in cols)
            + f" | {r['figures'][seeds[0]][arm]['steps']} | `{' '.join(cmd)}` |")
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
                                                            for s in seeds]))
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
            curves = [r["figures"][s][arm]["curve"] for s in seeds]
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
    """docs/CLAIMS.md from every OUT/<claim>/result.json, with docs/CLAIMS-notes.md appended."""
    results = {}
    for cid in CLAIMS:  # this --out's result, else the one kept in ARCHIVE
        for path in (os.path.join(args.out, cid, "result.json"),
                     os.path.join(ARCHIVE, f"{cid}.json")):
            if os.path.exists(path):
                results[cid] = lab.read_json(path)
                break
    for cid, r in results.items():  # the rule applied to every result, older ones included
        r["primary"] = primary_of(cid, r)
        if "earlier_verdict" not in r and cid in EARLIER_CLAIMS:  # made under the earlier rule
            r["earlier_verdict"] = r["verdict"]
    earlier_path = os.path.join(ARCHIVE, f"earlier-{EARLIER}.json")
    earlier = lab.read_json(earlier_path) if os.path.exists(earlier_path) else {"claims": {}}
    done = [r["primary"]["verdict"] for r in results.values()]
    runnable = [cid for cid, c in CLAIMS.items() if c.get("runs", True)]
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
    lines = [
        "# The papers' claims in miniature", "",
        "<!-- generated by scripts/claims.py: edit docs/CLAIMS-notes.md or the script -->", "",
        f"Command: `python scripts/claims.py all --sft {lab.repo_relative(args.sft)}{skipped}"
        + (f" --seeds {','.join(map(str, args.seeds))}" if args.seeds != [0, 1, 2] else "")
        + "` (each claim alone: its id instead of `all`; `--render-only` rebuilds this file from "
        "the runs' result.json). Commit " + lab.commit() + f", {lab.machine()}, "
        f"{time.strftime('%Y-%m-%d')}; start model `{lab.repo_relative(args.sft)}` "
        f"(sft.py's defaults, seed 0); the claims below took {took}, two runs side by side on "
        "one thread each.", "",
        "Every figure is the mean ± sd over seeds of held-out accuracy (%) at T = 1 over 200 "
        "problems of 3 and of 4 numbers (the runs' own evaluation, 8 samples a problem), unless "
        "the claim names another metric. \"ours\" marks a stand-in for a baseline the project "
        "does not have. In the commands {pool} is a seed's POOL, the start model's samples "
        f"(`topr.py {' '.join(POOL)}` with --seed S: 4,000 prompts x 8 at T = 1); {{pos}}, "
        "{d10}, {d50}, {d67} and {d10n3} are composed from it (`claims.py:pool_files`); "
        "{offline} and {q0} are spo-fig1's offline set (`claims.py:spo_offline`) and its online "
        "run's Q0 estimate.", "", RULE, "", EARLIER_RULE, "",
        f"**The scale of every verdict below: {SCALE}**, not the papers' models (8B; [CR]'s "
        "0.5B) or their data. Primary contrasts: "
        f"{summary(done, len(runnable))}; registered as not run here "
        f"{len(CLAIMS) - len(runnable)}.", "",
        "| claim | the paper says | what differs: the paper's -> ours | primary contrast: "
        "median d (per seed), margin | verdict | the rule of 1987642 |",
        "|---|---|---|---|---|---|"]
    for cid, claim in CLAIMS.items():
        r, digits = results.get(cid), claim.get("digits", 1)
        differs = "<br>".join(f"{knob}: {paper} -> {ours}"
                              for knob, paper, ours in departures(cid))
        if not claim.get("runs", True):
            lines.append(f"| {claim['paper']} | {claim['says']} | | | not run here: "
                         f"{claim['why']} | |")
            continue
        p = r["primary"] if r else None
        registered = f" (registered in {REGISTERED[cid]})" if cid in REGISTERED else ""
        cell = (f"{claim['primary'][0]}{registered}: "
                + (f"{median(p['d'], digits)} ({', '.join(f'{x:.{digits}f}' for x in p['d'])})"
                   f", margin {p['margin']:.{digits}f}" if p else "not run yet"))
        then = [f"{r['earlier_verdict']} (these runs)"] if r and "earlier_verdict" in r else []
        if cid in earlier["claims"]:
            then.append(f"{earlier['claims'][cid]['verdict']} (the earlier runs)")
        lines.append(f"| [{claim['paper']}](#{cid}) | {claim['says']} | {differs} | {cell} | "
                     f"{verdict_text(p) if p else '**not run yet**'} | {'; '.join(then)} |")
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
        lines += ["", f"## {cid}", "", f"**{claim['paper']}**: {claim['says']}.", "",
                  f"The paper's setting: {claim['setting']}. Ours: {claim['ours']}; seeds "
                  f"{', '.join(map(str, r['seeds']))}; {took}.", ""]
        if any(r["p"].values()):
            lines += ["Positives in POOL: " + ", ".join(f"{100 * p:.1f}% (seed {s})" for s, p
                                                          in r["p"].items() if p) + ".", ""]
        digits, p = claim.get("digits", 1), r["primary"]
        lines += arm_table(cid, r) + [
            "", f"Primary contrast ({p['kind']}, delta {p['delta']:g}"
            + (f", registered in {REGISTERED[cid]}" if cid in REGISTERED else "")
            + f"): {p['text']}: median {median(p['d'], digits)}, per seed "
            f"{', '.join(f'{x:.{digits}f}' for x in p['d'])}; {verdict_text(p)}, margin "
            f"{p['margin']:.{digits}f}" + (f"; results at {r['commit']}" if "commit" in r else "")
            + "."] + (["", "| secondary contrast (paper's direction positive) | mean ± sd | "
                       "per seed | verdict (the rule of 1987642) |", "|---|---|---|---|"]
                      if r["contrasts"] else [])
        lines += [f"| {c['text']} | {ms(c['d'], digits)} | "
                  f"{', '.join(f'{x:.{digits}f}' for x in c['d'])} | {verdict_cell(c)} |"
                  for c in r["contrasts"]]
        lines += ["", f"Claim: {verdict_text(p)}"
                  + (f" (the rule of 1987642: {r['earlier_verdict']})" if "earlier_verdict" in r
                     else "") + "."]
        if claim["plot"]:
            png = os.path.join(os.path.dirname(args.doc), f"CLAIMS-{cid}.png")
            plot(cid, r, png)
            lines += ["", f"![{cid}]({os.path.basename(png)})"]
        if cid in earlier["claims"]:
            lines += [""] + earlier_section(cid, earlier)
        if cid in CONCLUDE:  # the section's last sentence: what the runs let a reader conclude
            lines += ["", f"**What to conclude.** {CONCLUDE[cid]}"]
    notes = os.path.join(os.path.dirname(args.doc), "CLAIMS-notes.md")
    if os.path.exists(notes):
        lines += ["", open(notes).read().rstrip()]
    text = "\n".join(lines) + "\n"
    with open(args.doc + ".tmp", "w") as f:
        f.write(text)
    os.replace(args.doc + ".tmp", args.doc)
    if args.readme:  # its one line between the markers: the count and the command
        old = open(args.readme).read()
        if README_START in old and README_END in old:
            line = (f"At the scale of {SCALE}, the papers' headline claims run like for like "
                    f"in miniature "
                    f"([docs/CLAIMS.md]({os.path.relpath(args.doc, os.path.dirname(args.readme))}"
                    f"), `python scripts/claims.py all --sft runs/sft-countdown/final{skipped}`"
                    f"; {'' if len(gone) == len(set(gone)) else 'at most '}"
                    f"{own / 60:.1f} h on 2 cores for the verdicts"
                    + (f", {total / 60:.1f} h with the investigations" if not unprobed else "")
                    + "); one primary contrast a "
                    f"claim: {summary(done, len(runnable))}, and "
                    f"{len(CLAIMS) - len(runnable)} registered as not run here.")
            new = old[:old.index(README_START) + len(README_START)] + "\n" + line + "\n" + \
                old[old.index(README_END):]
            with open(args.readme + ".tmp", "w") as f:
                f.write(new)
            os.replace(args.readme + ".tmp", args.readme)
    return text


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
        verdict, margin = primary_verdict(same[0], delta, kind)
        lines += ["", f"The primary contrast on these runs, post hoc (registered after them, in "
                  f"{REGISTERED[cid]}): median {median(same[0], digits)}, per seed "
                  f"{', '.join(map(str, same[0]))}; {verdict}, margin {margin:.{digits}f}."]
    return lines


def summary(verdicts: list[str], runnable: int) -> str:
    """The primaries' verdicts in a few words: "2 of 18 in the paper's direction, ..."."""
    short = [v.split(" (")[0] for v in verdicts]  # "not testable here (why)" counts as one
    counts = [f"{short.count(v)} {v}" for v in VERDICTS[1:] if short.count(v)]
    rest = [f"{runnable - len(verdicts)} not run yet"] if len(verdicts) < runnable else []
    return ", ".join([f"{short.count(PAPERS)} of {runnable} in the {PAPERS}"] + counts + rest)


def verdict_text(p: dict) -> str:
    """A primary's verdict in bold, with why a claim is not testable here and what the rule alone
    gives it."""
    if "why" in p:  # the rule's own "not testable here (why)" shows its why alone
        rule = p["rule"].removeprefix(f"{UNTESTED} (").removesuffix(")") \
            if p["rule"].startswith(f"{UNTESTED} (") else p["rule"]
        return f"**{p['verdict']}** ({p['why']}; the rule alone: {rule})"
    return f"**{p['verdict']}**"


def median(values: list[float], digits: int = 1) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def seed_list(text: str) -> list[int]:
    """argparse type: comma-separated seeds (integers from 0)."""
    return [common.nonnegative_int(n) for n in text.split(",")]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("claims", nargs="+", help="claim ids, or all: " + ", ".join(CLAIMS))
    p.add_argument("--sft", required=True, help="the start model of every arm (an sft.py run)")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2], help="seeds of every arm")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny budgets, no verdicts")
    p.add_argument("--skip-probes", action="store_true",
                   help="run a claim's own arms only, not the investigations beside it")
    p.add_argument("--dry-run", action="store_true",
                   help="print every arm's command for every seed, run nothing")
    p.add_argument("--paper-settings", action="store_true", help="the papers' lr, lengths and "
                   "Q0 samples where known (PAPER_SETTINGS): for a GPU and a real --sft model")
    p.add_argument("--render-only", action="store_true",
                   help="run nothing: rebuild --doc from the result.json files under --out")
    p.add_argument("--jobs", type=common.positive_int, default=2, help="runs side by side")
    p.add_argument("--threads", type=common.positive_int, default=1, help="torch threads a run")
    p.add_argument("--out", default=None, help="folder of the runs and result.json files "
                   "(default: runs/claims, runs/claims-quick with --quick)")
    p.add_argument("--doc", default=None, help="the generated table, its plots beside it "
                   "(default: docs/CLAIMS.md, OUT/CLAIMS.md with --quick)")
    p.add_argument("--readme", default=None, help="README whose claims line is replaced ('' to "
                   "leave it alone; default: README.md, none with --quick)")
    args = p.parse_args(argv)
    if args.out is None:  # a smoke run writes nothing of the project's; from any folder
        args.out = os.path.join(ROOT, "runs", "claims-quick" if args.quick else "claims")
    if args.doc is None:
        args.doc = os.path.join(args.out, "CLAIMS.md") if args.quick else \
            os.path.join(ROOT, "docs", "CLAIMS.md")
    if args.readme is None:
        args.readme = "" if args.quick else os.path.join(ROOT, "README.md")
    ids = [c for c in CLAIMS if CLAIMS[c].get("runs", True)] if args.claims == ["all"] else \
        args.claims
    if unknown := [c for c in ids if c not in CLAIMS]:
        p.error(f"unknown claim {unknown[0]!r}; choose from: all, {', '.join(CLAIMS)}")
    if unrun := [c for c in ids if not CLAIMS[c].get("runs", True)]:
        p.error(f"{unrun[0]} is not run here: {CLAIMS[unrun[0]]['why']}")
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
