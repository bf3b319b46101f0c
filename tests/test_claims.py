"""scripts/claims.py: the verdict rule, Eq. 12's inverse, the composed datasets, bad input, and the
registry's data (docs/claims/registry/) with its expressions."""
import argparse
import json
import math
import os
import re
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import claims  # noqa: E402
import topr  # noqa: E402


@pytest.mark.parametrize("d,verdict", [
    ([3.0, 4.0, 5.0], "reproduced"),            # mean 4 > sd 1
    ([-3.0, -4.0, -5.0], "not reproduced"),     # mean -4 < -sd
    ([2.0, -1.0, 1.5], "inconclusive"),         # mean 0.83 < sd 1.6
    ([0.5, 3.0, 0.6], "inconclusive"),          # mean 1.37 < sd 1.41: one seed carries it
])
def test_a_contrast_is_reproduced_only_beyond_one_sd_in_the_papers_direction(d, verdict):
    assert claims.verdict_of(d) == verdict


@pytest.mark.parametrize("contrasts,verdict", [
    (["reproduced", "reproduced"], "reproduced"),
    (["reproduced", "inconclusive"], "partly"),
    (["reproduced", "not reproduced"], "partly"),
    (["inconclusive", "not reproduced"], "not reproduced"),
    (["inconclusive", "inconclusive"], "inconclusive"),
])
def test_a_claims_verdict_from_its_contrasts(contrasts, verdict):
    assert claims.claim_verdict(contrasts) == verdict


def test_c_for_is_eq12_inverted_at_both_shares_of_fig5():
    for p in (0.1, 0.5):
        for pt in claims.PTILDE:
            assert topr.p_tilde_pm1(p, claims.c_for(p, pt)) == pytest.approx(pt, abs=1e-12)
    assert claims.c_for(0.1, 0.1) == 0.0 and claims.c_for(0.5, 1.0) == pytest.approx(-1.0)
    assert claims.c_for(0.1, 0.01) > 0 > claims.c_for(0.1, 0.2)  # a lower p~ needs a larger c


def test_the_composed_datasets_have_the_shares_they_are_named_for(tmp_path, monkeypatch):
    """d10 / d50: N samples, exactly 10% / 50% correct; pos: every correct one; d67: every correct
    one and negatives to a third; d10n3: 3-number puzzles only; the same files for the same seed."""
    pool = tmp_path / "pool-s0"
    pool.mkdir()
    rows = []
    for i in range(800):  # half 3-number puzzles, 25% correct (all of them 3-number ones)
        nums = [1, 2, 3] if i % 2 else [1, 2, 3, 4]
        target = sum(nums)
        right = i % 4 == 1
        expr = "+".join(map(str, nums)) if right else "-".join(map(str, nums))
        rows.append({"problem": {"nums": nums, "target": target},
                     "completion": f"<answer>{expr}</answer>"})
    (pool / "data-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(claims, "run", lambda *a, **k: None)  # the pool is already sampled
    args = argparse.Namespace(out=str(tmp_path), quick=True)  # quick: N = 800 // 8 = 100

    def read(name):
        task = claims.get_task("countdown")
        lines = [json.loads(line) for line in open(files[name])]
        return lines, sum(task.is_correct(r["problem"], r["completion"]) for r in lines)
    files = claims.pool_files(0, args)
    assert files["p"] == 0.25
    for name, n, correct in [("d10", 100, 10), ("d50", 100, 50), ("pos", 200, 200),
                             ("d67", 299, 200), ("d10n3", 100, 10)]:
        lines, k = read(name)
        assert (len(lines), k) == (n, correct), name
    assert all(len(r["problem"]["nums"]) == 3 for r in read("d10n3")[0])
    first = {name: open(files[name]).read() for name in ("d10", "d50", "d67")}
    for name in first:
        os.remove(files[name])
    files = claims.pool_files(0, args)
    assert {name: open(files[name]).read() for name in first} == first


@pytest.mark.parametrize("argv,message", [
    (["nope", "--sft", "."], "unknown claim 'nope'"),
    (["all", "--sft", "/nonexistent"], "no such folder"),
    (["all", "--sft", ".", "--seeds", "0,-1"], "--seeds"),
])
def test_bad_input_gives_one_line_and_status_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        claims.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and message in err[-1]


def test_a_claims_minutes_count_each_run_once_and_its_probes_apart(tmp_path):
    args = argparse.Namespace(out=str(tmp_path))
    runs = {}
    for arm, wall in [("rloo", 600), ("agro-l1", 300), ("rloo-b0.5", 120)]:  # the last: a probe
        d = claims.run_dir("agro-fig2", arm, 0, args)
        os.makedirs(d)
        with open(os.path.join(d, "usage.json"), "w") as f:
            json.dump({"wall_s": wall}, f)
        runs[arm] = d
    eval_cache = os.path.join(runs["rloo-b0.5"], "eval.json")  # a probe's evaluation
    with open(eval_cache, "w") as f:
        json.dump({"seconds": 60}, f)
    r = {"seeds": [0], "jobs": 2, "runs": [*runs.values(), runs["rloo"], eval_cache]}
    assert claims.minutes([r]) == pytest.approx((600 + 300 + 120 + 60) / 60 / 2)
    own = claims.verdict_runs("agro-fig2", r, args)
    assert claims.minutes([own]) == pytest.approx((600 + 300) / 60 / 2)


def test_a_result_names_its_runs_from_the_repository_and_is_read_from_any_folder(
        tmp_path, monkeypatch):
    """run_claim keeps each run as run_name gives it, relative to the repository's root; minutes
    and verdict_runs resolve such a name against the root, wherever the command runs from (an
    older result's absolute names read the same)."""
    monkeypatch.setattr(claims, "ROOT", str(tmp_path))
    args = argparse.Namespace(out=str(tmp_path / "runs" / "claims"))
    names = []
    for arm, wall in [("rloo", 600), ("rloo-b0.5", 120)]:  # the second: a probe
        d = claims.run_dir("agro-fig2", arm, 0, args)
        os.makedirs(d)
        with open(os.path.join(d, "usage.json"), "w") as f:
            json.dump({"wall_s": wall}, f)
        names.append(claims.run_name(d))
    assert names == ["runs/claims/agro-fig2/rloo-s0", "runs/claims/agro-fig2/rloo-b0.5-s0"]
    assert claims.run_name(names[0]) == names[0]  # a name already relative stays as it is
    monkeypatch.chdir(tmp_path / "runs")  # not the root: the names still resolve
    r = {"seeds": [0], "jobs": 1, "runs": names, "minutes": 99.0}
    assert claims.minutes([r]) == pytest.approx((600 + 120) / 60)
    assert claims.minutes([claims.verdict_runs("agro-fig2", r, args)]) == pytest.approx(10)
    old = dict(r, runs=[str(tmp_path / n) for n in names])  # as results named them before
    assert claims.minutes([old]) == pytest.approx(12)
    os.makedirs(tmp_path / "runs" / "claims" / "agro-fig2" / "rloo-s1")  # a run under way
    kept = dict(r, runs=[*names, "runs/claims/agro-fig2/rloo-s1"])  # its record not here
    assert claims.minutes([kept]) == pytest.approx(99.0)  # the kept minutes, not 12


def test_a_run_of_new_seeds_adds_them_to_the_kept_result(tmp_path, monkeypatch, capsys):
    """Sessions add seeds rather than redo them: a run of seeds 3-4 keeps the kept result's seeds
    0-2 as they were, with the commit each ran at, and judges all five; a seed run again replaces
    the kept one; a kept arm run with another command is refused in one line, not mixed in."""
    kept_dir = tmp_path / "kept"
    kept_dir.mkdir()
    monkeypatch.setattr(claims, "ARCHIVE", str(kept_dir))
    monkeypatch.setattr(claims, "run", lambda *a, **k: None)
    bump = {"by": 0.0}

    def fake_figures(path):  # beta 0.02 ahead of beta 0.5 by 1 + the seed's number in area
        arm, seed = os.path.basename(path).rsplit("-s", 1)
        v = 10.0 + bump["by"] + (1 + int(seed)) * (arm == "b0.02")
        return {"acc": v, "area": v, "kl": 1.0, "start": 5.0, "curve": [], "steps": 9,
                "pass": 0.0, "peak": v}
    monkeypatch.setattr(claims, "figures", fake_figures)
    args = argparse.Namespace(out=str(tmp_path / "runs"), skip_probes=True, jobs=1, quick=False,
                              seeds=[0, 1, 2])
    monkeypatch.setattr(claims.lab, "commit", lambda: "old")
    claims.run_claim("agro-fig6", args)
    monkeypatch.setattr(claims.lab, "commit", lambda: "new")
    bump["by"] = 100.0  # a figure the kept seeds must not take
    r = claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "seeds": [3, 4]}))
    kept = json.loads((kept_dir / "agro-fig6.json").read_text())
    assert r["seeds"] == kept["seeds"] == [0, 1, 2, 3, 4]
    assert kept["seed_commits"] == {"0": "old", "1": "old", "2": "old", "3": "new", "4": "new"}
    assert kept["figures"]["0"]["b0.5"]["area"] == 10.0  # as kept
    assert kept["figures"]["3"]["b0.5"]["area"] == 110.0  # this run's
    slower = next(c for c in r["contrasts"] if c["text"].startswith("slower"))
    assert slower["d"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(r["primary"]["d"]) == 5 and r["primary"]["d"][0] != r["primary"]["d"][3]
    assert "results at old (seeds 0, 1, 2), new (seeds 3, 4)" in claims.results_at(kept)
    r = claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "seeds": [4]}))
    assert r["seeds"] == [0, 1, 2, 3, 4] and len(r["contrasts"][0]["d"]) == 5
    kept["commands"]["b0.5"] = ["agro.py", "--beta", "0.7"]
    (kept_dir / "agro-fig6.json").write_text(json.dumps(kept))
    with pytest.raises(SystemExit) as e:
        claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "seeds": [5]}))
    assert e.value.code == 2 and re.search(r"agro-fig6: .* arm b0.5 .*--seeds 0,1,2,3,4,5",
                                           capsys.readouterr().err)
    r = claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args),
                                                            "seeds": [0, 1, 2, 3, 4, 5]}))
    assert r["seeds"] == [0, 1, 2, 3, 4, 5] and set(r["seed_commits"].values()) == {"new"}


def test_real_cpu_seeds_add_to_a_kept_real_cpu_result_whose_commands_hold_its_flags(
        tmp_path, monkeypatch):
    """--real-cpu --seeds 1 adds to a kept --real-cpu result: each arm's kept command is the one
    that ran, --real-cpu's flags included, in the run's result.json and the kept copy alike, so
    the next run compares like with like (before: the kept copy held them, the new run's
    command did not, and every added seed was refused)."""
    monkeypatch.setattr(claims, "ROOT", str(tmp_path))
    monkeypatch.setattr(claims, "run", lambda *a, **k: None)
    monkeypatch.setattr(claims, "figures", lambda path: {
        "acc": 10.0, "area": 10.0 + ("b0.02" in path), "kl": 1.0, "start": 5.0, "curve": [],
        "steps": 9, "pass": 0.0, "peak": 10.0})
    monkeypatch.setattr(claims.lab, "commit", lambda: "c")
    args = argparse.Namespace(out=str(tmp_path / "runs"), skip_probes=True, jobs=1, quick=False,
                              seeds=[0], real_cpu=True, sft="START")
    first = claims.run_claim("agro-fig6", args)
    kept_path = tmp_path / claims.REAL_CPU["archive"] / "agro-fig6.json"
    kept = json.loads(kept_path.read_text())
    own = json.loads((tmp_path / "runs" / "agro-fig6" / "result.json").read_text())
    assert kept["commands"] == own["commands"] == first["commands"]
    arm = claims.CLAIMS["agro-fig6"]["arms"]["b0.5"]
    assert kept["commands"]["b0.5"] == [arm.script, *arm.flags, *claims.real_cpu_flags(
        arm.script, arm.flags, "agro-fig6", "b0.5")]
    r = claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "seeds": [1]}))
    assert r["seeds"] == [0, 1] and r["real_cpu"] is True


def test_every_kept_result_ran_each_arm_as_the_registry_gives_it_now():
    """Each arm of every kept result (docs/claims/, and --real-cpu's with its flags) holds the
    command its claim's registry gives now: the figures in the docs are the registered arms',
    and --seeds can add to every one of them. An arm's flags changed in the registry without
    its runs fails here, not in a session's run hours later."""
    folders = [(claims.ARCHIVE, False), (os.path.join(claims.ROOT, claims.REAL_CPU["archive"]),
                                         True)]
    checked = 0
    for folder, real in folders:
        for name in sorted(os.listdir(folder)):
            cid = name[:-len(".json")]
            if not name.endswith(".json") or cid not in claims.CLAIMS:  # earlier-*.json
                continue
            kept = json.loads(open(os.path.join(folder, name)).read())
            for a, cmd in kept["commands"].items():
                assert cmd == claims.kept_command(cid, a, real), (cid, a, real)
                checked += 1
    assert checked >= 90  # every kept arm was read: 92 in 20 tiny and 2 SmolLM2 results now


def test_added_seeds_count_the_kept_minutes_of_runs_not_in_this_checkout(tmp_path, monkeypatch):
    """A kept result whose runs are partly here (a shared run made again in this checkout) keeps
    the minutes of the others: the claim's minutes are the kept ones less those of the kept runs
    here, plus every record here, each once. Counting only the records here, or the kept minutes
    as well as the records, fails."""
    monkeypatch.setattr(claims, "ROOT", str(tmp_path))
    monkeypatch.setattr(claims, "ARCHIVE", str(tmp_path / "kept"))
    (tmp_path / "kept").mkdir()
    args = argparse.Namespace(out=str(tmp_path / "runs" / "claims"), skip_probes=True, jobs=1,
                              quick=False, seeds=[0, 1, 2])

    def fake_run(script, flags, out, seed, args, cid="", arm=""):  # 2 minutes a run
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "usage.json"), "w") as f:
            json.dump({"wall_s": 120}, f)
        return out
    monkeypatch.setattr(claims, "run", fake_run)
    monkeypatch.setattr(claims, "figures", lambda path: {
        "acc": 10.0, "area": 10.0 + ("b0.02" in path), "kl": 1.0, "start": 5.0, "curve": [],
        "steps": 9, "pass": 0.0, "peak": 10.0})
    monkeypatch.setattr(claims.lab, "commit", lambda: "c")
    first = claims.run_claim("agro-fig6", args)
    assert first["minutes"] == pytest.approx(2 * len(first["runs"]))
    gone = [x for x in first["runs"] if not x.endswith("-s0")]  # run elsewhere: not here now
    for x in gone:
        shutil.rmtree(tmp_path / x)
    r = claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "seeds": [3]}))
    assert r["minutes_kept"] == pytest.approx(2 * len(gone))
    assert r["minutes"] == pytest.approx(2 * len(r["runs"]))  # the kept, then the new seed's


def test_an_arm_added_to_a_claim_runs_alone_beside_the_kept_arms(tmp_path, monkeypatch,
                                                                capsys):
    """--arms: an arm a claim gained after its runs (an added primary's) runs for the kept seeds
    alone; the kept arms' figures stay as they were, the added arm's commit is named; an added
    arm must cover every kept seed, and an arm with no figures is refused in one line."""
    kept_dir = tmp_path / "kept"
    kept_dir.mkdir()
    monkeypatch.setattr(claims, "ARCHIVE", str(kept_dir))
    ran = []
    monkeypatch.setattr(claims, "run", lambda script, flags, out, *a: ran.append(out))
    monkeypatch.setattr(claims, "figures", lambda path: {
        "acc": 20.0, "area": 20.0, "kl": 1.0, "start": 5.0, "curve": [], "steps": 9,
        "pass": 0.0, "peak": 20.0})
    args = argparse.Namespace(out=str(tmp_path / "runs"), skip_probes=True, jobs=1, quick=False,
                              seeds=[0, 1, 2], arms=None)
    monkeypatch.setattr(claims.lab, "commit", lambda: "old")
    claims.run_claim("agro-fig6", args)
    kept = json.loads((kept_dir / "agro-fig6.json").read_text())
    for s in kept["figures"].values():  # as if b0.5 had been added to the claim later
        del s["b0.5"]
    del kept["commands"]["b0.5"]
    (kept_dir / "agro-fig6.json").write_text(json.dumps(kept))
    with pytest.raises(SystemExit) as e:
        claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "seeds": [3]}))
    assert e.value.code == 2 and re.search(r"arm b0.5 has no kept figures .*--arms b0.5",
                                           capsys.readouterr().err)
    with pytest.raises(SystemExit) as e:
        claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "seeds": [0],
                                                            "arms": ["b0.5"]}))
    assert e.value.code == 2 and re.search(r"every kept seed: --arms b0.5 --seeds 0,1,2",
                                           capsys.readouterr().err)
    with pytest.raises(SystemExit) as e:
        claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "arms": ["b9"]}))
    assert e.value.code == 2 and re.search(r"no arm 'b9'", capsys.readouterr().err)
    monkeypatch.setattr(claims.lab, "commit", lambda: "new")
    ran.clear()
    r = claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "arms": ["b0.5"]}))
    assert sorted(os.path.basename(x) for x in ran) == ["b0.5-s0", "b0.5-s1", "b0.5-s2"]
    assert r["seeds"] == [0, 1, 2] and set(r["figures"][0]) == set(r["commands"])
    assert r["seed_commits"] == {0: "old", 1: "old", 2: "old"}
    assert r["arm_commits"] == {"b0.5": "new"}
    assert claims.results_at(r) == "; results at old; arm b0.5 added at new"
    kept = json.loads((kept_dir / "agro-fig6.json").read_text())
    kept["figures"]["0"]["probe"] = dict(kept["figures"]["0"]["b0"], acc=-1.0)  # seed 0 alone
    kept["commands"]["probe"] = ["agro.py", "--probe"]
    kept["contrasts"].append({"text": "probe - b0", "d": [-21.0], "verdict": "-", "probe": True,
                              "role": "probe"})
    (kept_dir / "agro-fig6.json").write_text(json.dumps(kept))
    monkeypatch.setitem(claims.CLAIMS["agro-fig6"]["arms"], "probe", claims.CLAIMS[
        "agro-fig6"]["arms"]["b0"]._replace(flags=["--probe"], role="probe", added="abc"))
    r = claims.run_claim("agro-fig6", argparse.Namespace(**{**vars(args), "seeds": [3]}))
    assert r["figures"][0]["probe"]["acc"] == -1.0 and "probe" not in r["figures"][3]
    assert r["contrasts"][-1]["d"] == [-21.0]  # a kept probe's contrast, as it was
    row = next(x for x in claims.arm_table("agro-fig6", json.loads(json.dumps(r)))
               if x.startswith("| probe "))
    assert "; seed 0) | -1.0 |" in row  # its one seed, named


def test_each_evaluations_kl_is_the_mean_of_the_batches_since_the_last_one(tmp_path):
    ev = {f"eval{n}/{k}": 0.5 for n in claims.SIZES
          for k in ("sampled/accuracy", "sampled/format_rate", "pass@8")}
    rows = [{"step": 0, **ev}, {"step": 1, "loss": 0, "kl_to_ref": 1.0},
            {"step": 2, "loss": 0, "kl_to_ref": 3.0}, {"step": 2, **ev},
            {"step": 3, "loss": 0, "kl_to_ref": 8.0}, {"step": 3, **ev}]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    f = claims.figures(str(tmp_path))
    assert [c["kl"] for c in f["curve"]] == [0.0, 2.0, 8.0]  # not 4.0: step 3's batch alone
    assert f["kl"] == 4.0  # the summary: the last 10 batches


# ---- The rule of one primary contrast a claim (RULE) ---------------------------------------------
@pytest.mark.parametrize("df,level,t", [(1, 0.95, 12.706), (2, 0.95, 4.303), (2, 0.90, 2.920),
                                        (3, 0.90, 2.353), (4, 0.95, 2.776), (9, 0.95, 2.262),
                                        (29, 0.95, 2.045), (99, 0.95, 1.984)])
def test_the_t_quantile_is_the_tables(df, level, t):
    assert claims.t_quantile(level, df) == pytest.approx(t, abs=5e-4)


@pytest.mark.parametrize("d,kind,verdict", [
    ([3.0, 4.0, 5.0], "more", "paper's direction"),        # 95% interval [1.5, 6.5]
    ([1.0, 1.5, 2.0], "more", "paper's direction"),        # [0.26, 2.74], mean 1.5 >= delta
    ([-3.0, -4.0, -5.0], "more", "opposite direction"),
    ([1.2, 1.1, -30.0], "more", "not detected at this power"),  # the median rule: paper's
    ([-10.9, -7.5, -61.6], "more", "not detected at this power"),  # the median rule: opposite
    ([0.88, 0.97, 0.94], "more", "not detected at this power"),  # clear of 0, short of delta
    ([0.4, -0.3, 0.2], "more", "equivalent within delta"),  # 90% interval [-0.51, 0.71]
    ([-5.0, 0.5, 6.0], "more", "not detected at this power"),  # the seeds split: run more
    ([0.4, -0.3, 0.2], "equal", "equivalent within delta"),
    ([2.0, 2.5, 3.0], "equal", "opposite direction"),     # a difference where none is claimed
    ([2.0, 3.0, 0.1], "equal", "not detected at this power"),  # the median rule: opposite
    ([-5.0, 0.5, 6.0], "equal", "not detected at this power"),
])
def test_a_claims_verdict_reads_the_mean_and_its_interval_over_the_seeds(d, kind, verdict):
    assert claims.primary_verdict(d, 1.0, kind)[0] == verdict


def test_the_verdicts_figures_are_the_mean_its_intervals_and_the_seeds_that_would_decide():
    verdict, p = claims.primary_verdict([3.0, 4.0, 5.0], 1.0)
    half, half90 = 4.3027 / math.sqrt(3), 2.9200 / math.sqrt(3)  # sd 1, t at 2 df
    assert (p["n"], p["mean"], p["sd"]) == (3, 4.0, 1.0) and "needed" not in p
    assert p["ci"] == pytest.approx([4 - half, 4 + half], abs=1e-3)
    assert p["ci90"] == pytest.approx([4 - half90, 4 + half90], abs=1e-3)
    verdict, p = claims.primary_verdict([1.0, 1.5, 3.5], 1.0)  # mean 2, sd 1.32: [-1.3, 5.3]
    assert verdict == "not detected at this power"
    # t(k - 1) sd / sqrt(k) < 2 from k = 5 (3.18 x 1.32 / 2 = 2.1 no; 2.78 x 1.32 / 2.24 yes)
    assert p["needed"] == 5 == claims.seeds_needed(2.0, p["sd"], 1.0, "more", 3)
    assert "about 5 seeds would decide" in claims.verdict_text(dict(p, verdict=verdict))
    assert claims.primary_verdict([0.99, 0.89, 1.09], 1.0)[1]["needed"] is None  # near delta
    assert claims.primary_verdict([1.0, 2.0], 1.0)[0] == "too few seeds"
    assert claims.primary_verdict([math.nan, 1.0, 2.0], 1.0)[0].startswith("not testable here")
    with pytest.raises(ValueError):
        claims.decide(1.0, 0.1, 0.1, 1.0, "less")


def test_the_simulated_error_rates_are_reproducible_and_within_what_the_rule_allows():
    """No effect: the 95% interval alone calls the paper's direction at most 2.5% of the time
    (the mean past delta, less); TOST calls an effect of delta equivalent at most 5%."""
    e = claims.error_rates(3, 1.0, 1.0, "more")  # sd = delta, 3 seeds
    assert e == claims.error_rates(3, 1.0, 1.0, "more")  # a fixed seed: the same figures
    assert e["fp"] <= 0.025 and 0.5 <= e["fn1"] <= 1 and e["fn2"] < e["fn1"]
    assert e == claims.error_rates(3, 2.0, 2.0, "more")  # sd / delta alone matters
    assert claims.error_rates(3, 0.01, 1.0, "equal")["fp"] == pytest.approx(0.05, abs=0.01)
    more = claims.error_rates(10, 1.0, 1.0, "more")
    assert more["fn2"] < e["fn2"]  # more seeds, more power


def test_every_runnable_claims_delta_says_why():
    """A share of the paper's stated effect where it gives a number, the measured noise else."""
    runnable = {c for c, v in claims.CLAIMS.items() if v.get("runs", True)}
    assert set(claims.DELTA_WHY) == runnable
    for cid, why in claims.DELTA_WHY.items():
        assert why.startswith("a share of the paper's effect") or " sd " in why \
            or "spread" in why, cid


def test_a_claim_registered_as_not_testable_is_never_in_the_papers_direction(monkeypatch):
    """topr-fig3 (at the ceiling), agro-fig2 and agro-fig4 (an arm known to collapse: agro-fig4's
    comparator) and agro-s81 (a code check): even where every seed's d lies far in the paper's
    direction the verdict is "not testable here", with its reason, the rule's outcome beside it;
    a claim not registered so keeps the rule's outcome."""
    assert set(claims.UNTESTABLE) == {"topr-fig3", "agro-fig2", "agro-fig4", "agro-s81"}
    assert all(why.startswith(("at the ceiling", "an arm known to collapse", "a code check"))
               for why in claims.UNTESTABLE.values())
    r = {"seeds": [0, 1, 2], "quick": False, "figures": {str(s): {} for s in range(3)}}
    for cid in [*claims.UNTESTABLE, "topr-fig8"]:
        text, _, delta, kind = claims.CLAIMS[cid]["primary"]
        far = (lambda m: 0.0) if kind == "equal" else (lambda m, x=5 * delta: x)
        monkeypatch.setitem(claims.CLAIMS, cid, dict(claims.CLAIMS[cid],
                                                     primary=(text, far, delta, kind)))
        p = claims.primary_of(cid, r)
        if cid == "topr-fig8":
            assert p["verdict"] == "paper's direction" and "why" not in p
            continue
        assert p["verdict"] == "not testable here" and p["why"] == claims.UNTESTABLE[cid], cid
        assert p["rule"] in ("paper's direction", "equivalent within delta"), p
        assert claims.verdict_text(p).startswith(f"**not testable here** ({p['why']}; ")
    assert claims.summary(["paper's direction", "not testable here", "opposite direction",
                           "not testable here (d is not a number in too many seeds)"], 5) == (
        "1 of 5 in the paper's direction, 1 opposite direction, 2 not testable here, "
        "1 not run yet")


def test_every_run_claim_ends_its_section_with_one_sentence_on_what_to_conclude():
    runnable = {c for c, v in claims.CLAIMS.items() if v.get("runs", True)}
    assert set(claims.CONCLUDE) == runnable
    for cid, text in claims.CONCLUDE.items():
        assert text.startswith("You may conclude") and text.endswith("."), cid
        assert "not" in text and not re.search(r"[.;:] [A-Z]", text[:-1]), cid  # one sentence


def test_every_runnable_claim_has_a_primary_contrast_and_the_others_say_why_not():
    for cid, claim in claims.CLAIMS.items():
        if claim.get("runs", True):
            text, fn, delta, kind = claim["primary"]
            assert callable(fn) and delta > 0 and kind in ("more", "equal"), cid
            assert set(claim.get("shared", {})) <= set(claim["arms"]), cid
        else:
            assert claim["why"], cid
    assert claims.EARLIER_CLAIMS == tuple(claims.CLAIMS)[:9]


def test_the_dry_run_prints_every_arms_command_for_a_real_model_and_each_parses(capsys):
    """`claims.py all --sft smollm2 --dry-run --paper-settings`: every arm of every runnable claim
    for every seed, from SmolLM2, at the papers' settings where known; each command is one the
    script's own parser takes."""
    import importlib
    claims.main(["all", "--sft", "smollm2", "--dry-run", "--paper-settings", "--seeds", "0,1"])
    commands, cid = [], None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("# "):  # "# CLAIM / ARM (role)" heads its commands
            cid = line[2:].split(" / ")[0] if " / " in line else "pool"
        else:
            commands.append((cid, *line.split()[1:]))
    runnable = [c for c, v in claims.CLAIMS.items() if v.get("runs", True)]
    assert len(commands) == 2 * (1 + sum(len(claims.CLAIMS[c]["arms"]) for c in runnable))
    for cid, script, *flags in commands:
        assert flags[:4] == ["--model", "smollm2", "--seed", flags[3]], flags
        named = [x for x in flags if x.startswith("--")]
        assert len(named) == len(set(named)), flags  # each flag once (each_flag_once)
        module = importlib.import_module(script[:-3])
        parser, args = module.parse_args(flags)
        if cid.startswith(("topr", "pool")):  # [TOPR] §4.2's lr and length win over tiny's
            assert (args.lr, args.max_new_tokens) == (5e-7, 512)
        if script == "spo.py":
            assert (args.lr, args.q0_samples) == (6e-8, 800)


def test_a_command_with_each_flag_once_parses_as_the_command_it_was():
    """each_flag_once keeps a repeated flag at its first place with its last value, a negative
    value and a flag without one as they are: the script's parser reads the same settings."""
    cmd = ["topr.py", "--lr", "5e-5", "--c", "-0.8", "--bf16", "--batch-size", "64",
           "--lr", "1e-5", "--c", "-1", "--bf16", "--eval-every", "16"]
    short = claims.each_flag_once(cmd)
    assert short == ["topr.py", "--lr", "1e-5", "--c", "-1", "--bf16", "--batch-size", "64",
                     "--eval-every", "16"]
    assert vars(topr.parse_args(short[1:])[1]) == vars(topr.parse_args(cmd[1:])[1])


def test_the_doc_shows_the_primary_verdict_its_margin_the_departures_and_the_earlier_rule(
        tmp_path, monkeypatch):
    """A result of topr-fig1 as claims.py keeps it in docs/claims (seeds keyed as text, made before
    the rule), its runs gone: the main table's row gives the primary's mean, interval, delta and
    verdict, what differs from the paper, and the verdict of the rule it was registered under."""
    curve = [{"step": 0, "acc": 20.0, "acc3": 30.0, "acc4": 10.0, "format": 90.0, "pass": 50.0,
              "kl": 0.0}]
    def fig(start, end):
        return {"curve": curve, "start": start, "acc": end, "acc3": end, "acc4": end,
                "start3": start, "start4": start, "pass": 50.0, "format": 90.0, "peak": end,
                "steps": 500, "area": end, "kl": 0.1}
    figures = {str(s): {"topr": fig(20.0, 20.0 + up), "naive": fig(20.0, 0.0),
                        "topr-p67": fig(20.0, 28.0)} for s, up in [(0, -1.2), (1, -1.8), (2, -2.2)]}
    result = {"claim": "topr-fig1", "seeds": [0, 1, 2], "quick": False, "jobs": 2,
              "runs": [str(tmp_path / "gone")],
              "figures": figures, "p": {}, "contrasts": [], "verdict": "partly", "minutes": 1.0,
              "commands": {a: ["topr.py"] for a in ("topr", "naive", "topr-p67")}}
    archive = tmp_path / "archive"  # the copy kept in git: all a clean checkout has
    archive.mkdir()
    (archive / "topr-fig1.json").write_text(json.dumps(result))
    monkeypatch.setattr(claims, "ARCHIVE", str(archive))
    args = argparse.Namespace(out=str(tmp_path / "runs"), doc=str(tmp_path / "CLAIMS.md"),
                              readme="", sft=str(tmp_path), seeds=[0, 1, 2])
    text = claims.write_doc(args)
    row = next(line for line in text.splitlines() if line.startswith("| [[TOPR] Fig. 1"))
    assert f"mean -1.7 [-3.0, -0.5] (-1.2, -1.8, -2.2); delta 1: {claims.DELTA_WHY['topr-fig1']}" \
        in row
    assert "| topr-fig1 | 3 | 0.50 (0.5 delta) | " in text  # the simulated error rates
    assert "| **opposite direction**<br>added: **the comparator collapsed** (" in row
    assert row.endswith("| partly (these runs) |")
    assert "<br>added after results were seen (registered in " in row  # TOPR end - naive end
    table = text.index("| claim | the paper says |")
    assert text.rindex("a 1M-parameter character model on Countdown, lr 100x", 0, table) > 0
    section = text[text.index("## topr-fig1"):]
    section = section[:section.index("\n## ", 3)] if "\n## " in section[3:] else section
    assert section.rstrip().endswith(f"**What to conclude.** {claims.CONCLUDE['topr-fig1']}")
    assert "lr: 5e-7 constant, Adafactor (§4.2) -> 5e-5 constant, AdamW" in row
    assert "not run here: a tabular bandit" in text  # agro-fig1


def test_every_primary_names_the_commit_that_registered_it_and_that_commit_has_it():
    """The registration precedes the results: the commit named holds the primary. Where that
    commit has the registry as data, the claim's TOML file there gives the same text, expression,
    delta and kind (an added primary: among its added_primaries). Before it (37c3416, when the
    registry was Python), scripts/claims.py there holds the full text, and the registry's first
    TOML commit (REGISTRY_AS_DATA) already held the primary as it is now."""
    import subprocess
    import tomllib

    def show(commit, path):
        out = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=claims.ROOT,
                             capture_output=True, text=True)
        return None if out.returncode else out.stdout

    def entry(p):  # what pins a primary in a TOML file, its expression's spacing aside
        return (p["text"], " ".join(p["expr"].split()), p["delta"], p["kind"])
    if show(REGISTRY_AS_DATA, "scripts/claims.py") is None:
        pytest.skip("not a git checkout with its history")
    runnable = [c for c, v in claims.CLAIMS.items() if v.get("runs", True)]
    assert set(claims.REGISTERED) == set(runnable)
    folder = "docs/claims/registry"
    for cid in runnable:
        with open(os.path.join(claims.ROOT, folder, f"{cid}.toml"), "rb") as f:
            now = tomllib.load(f)
        todo = [(now["primary"]["registered"], entry(now["primary"]), "primary")] + [
            (a["registered"], entry(a), "added_primaries") for a in now.get("added_primaries", [])]
        for commit, want, key in todo:
            assert re.fullmatch(r"[0-9a-f]{7}", commit), (cid, commit)
            then = show(commit, f"{folder}/{cid}.toml")
            if then is None:  # the registry was Python then: its text, and the first TOML's
                python = show(commit, "scripts/claims.py")
                assert key == "primary" and python is not None, (cid, commit)
                flat = " ".join(python.split()).replace('" "', "")  # strings joined over lines
                assert f'primary=("{want[0]}"' in flat, (cid, commit)
                then = show(REGISTRY_AS_DATA, f"{folder}/{cid}.toml")
            t = tomllib.loads(then)
            got = [entry(t["primary"])] if key == "primary" else [
                entry(a) for a in t.get("added_primaries", [])]
            assert want in got, (cid, commit, key)


# The commit that moved the registry from Python to docs/claims/registry/*.toml
REGISTRY_AS_DATA = "48d0e95"


# A claim's arms as they were when its primary was pinned: an arm added since comes after them
# (agro-fig4's beta 0.5 pair, issue 70), so it does not move the others' sample figures.
PINNED_ARMS = {"agro-fig4": ["off", "on", "on-lb2"]}


def sample_figures(cid: str, k: int) -> dict:
    """Fixed figures for every arm of a claim (sample k): a primary's value on them pins it."""
    out, first = {}, PINNED_ARMS.get(cid, [])
    arms = first + [a for a in sorted(claims.CLAIMS[cid]["arms"]) if a not in first]
    for i, a in enumerate(arms):
        def v(j):
            return 10 + ((i * 7 + j * j * 3 + k * 5 + j * k * 11) % 23) + 0.25 * j
        out[a] = {"start": v(0), "acc": v(0) + 1 + v(1) / 10, "peak": v(2) + 20, "area": v(3),
                  "kl": 0.5 + v(4) / 100, "format": v(5), "curve": [{"step": 0, "format": v(6)}],
                  "p10": v(7), "p10_0": v(8), "p1": v(9), "p1_0": v(10), "score": v(11) / 100,
                  "score0": v(12) / 100, "score4": v(13) / 100}
    return out


# Each primary as registered in 37c3416 (issue 70 pinned them here): its value on sample_figures
# 0 and 1, delta and kind. A change to any of them is a new registration, not an edit.
PINNED = {
    "topr-fig1": (3.025, 2.325, 1.0, "more"), "topr-fig4": (-20.8, 2.2, 1.0, "more"),
    "topr-fig5": (-9.9, -8.75, 1.0, "more"), "topr-fig6": (4.033333, -2.866667, 1.0, "more"),
    "agro-fig2": (2.0, 2.0, 1.0, "more"), "agro-fig5": (9.0, 9.0, 1.0, "more"),
    "agro-fig6": (-0.193876, 0.827453, 0.25, "more"), "spo-fig1": (-22.25, 12.75, 1.0, "more"),
    "cr-table1": (-0.0025, 0.1175, 0.01, "more"), "topr-fig3": (12.75, 1.75, 1.0, "more"),
    "topr-s43": (0.2, 0.2, 1.0, "more"), "topr-fig7": (13.1, -7.6, 1.0, "more"),
    "topr-fig8": (-7.7, -5.4, 1.0, "more"), "agro-s81": (-7.0, 16.0, 1.0, "equal"),
    "agro-fig4": (-0.146006, 0.867221, 0.25, "equal"), "spo-both": (0.75, 0.75, 1.0, "more"),
    "cr-s51": (0.0025, 0.1125, 0.01, "more"), "cr-table2": (-0.14, 0.09, 0.01, "more"),
    # registered after 37c3416 (issue 70): claims the papers' headlines still lacked
    "topr-fig6-high": (14.25, 2.75, 1.0, "equal"), "agro-fig4-pg": (7.0, -16.0, 1.0, "equal"),
    "spo-fig2a": (7.0, -9.0, 1.0, "more"),
}
# The primaries added after results were seen (issue 70), beside the registered ones, as above
PINNED_ADDED = {
    "topr-fig1": [(7.7, 5.4, 1.0, "more")], "agro-fig2": [(2.0, 2.0, 1.0, "more")],
    "agro-fig4": [(-0.161468, 0.944669, 0.25, "equal")],
}


def test_every_primarys_function_delta_and_kind_are_as_registered():
    runnable = {c for c, v in claims.CLAIMS.items() if v.get("runs", True)}
    assert set(PINNED) == runnable
    for cid, (v0, v1, delta, kind) in PINNED.items():
        _, fn, d, k = claims.CLAIMS[cid]["primary"]
        assert (d, k) == (delta, kind), cid
        assert [fn(sample_figures(cid, 0)), fn(sample_figures(cid, 1))] == pytest.approx(
            [v0, v1], abs=1e-5), cid


def test_every_added_primarys_function_delta_and_kind_are_as_registered():
    """Each added primary pinned as the registered ones are; topr-fig1's, TOPR - naive, carries
    the co-condition that TOPR ends at or above its start (naive REINFORCE collapses)."""
    assert set(claims.ADDED) == set(PINNED_ADDED)
    for cid, pins in PINNED_ADDED.items():
        added = claims.ADDED[cid]
        assert [(a.delta, a.kind) for a in added] == [(d, k) for _, _, d, k in pins], cid
        for a, (v0, v1, _, _) in zip(added, pins):
            assert [a.fn(sample_figures(cid, 0)), a.fn(sample_figures(cid, 1))] == pytest.approx(
                [v0, v1], abs=1e-5), cid
    co_text, co_fn = claims.ADDED["topr-fig1"][0].co_condition
    assert co_fn(sample_figures("topr-fig1", 0)) == pytest.approx(PINNED["topr-fig1"][0])


def test_an_added_primary_is_judged_beside_the_registered_one_and_waits_for_its_arms():
    """agro-fig2: the registered primary stays "not testable here" (lambda_LR 1 at beta 0.05
    collapses); the added one at beta 0.5 is "not run yet" until a result has its arms, then
    the rule judges it; topr-fig1's TOPR - naive is "the comparator collapsed" where TOPR ends
    below its start."""
    figs = {a: {"area": 20.0, "acc": 20.0, "start": 18.0} for a in ("rloo", "agro-l0",
                                                                   "agro-l1", "agro-lb2")}
    r = {"seeds": [0, 1, 2], "quick": False, "figures": {str(s): figs for s in range(3)}}
    assert claims.primary_of("agro-fig2", r)["verdict"] == "not testable here"
    assert [a["verdict"] for a in claims.added_of("agro-fig2", r)] == ["not run yet"]
    for s, up in zip(range(3), (2.0, 2.5, 3.0)):
        r["figures"][str(s)] = dict(figs, **{"rloo-b0.5": {"area": 20.0},
                                             "agro-l1-b0.5": {"area": 20.0 + up}})
    (a,) = claims.added_of("agro-fig2", r)
    assert a["verdict"] == "paper's direction" and a["d"] == [2.0, 2.5, 3.0]
    assert a["registered"] == claims.ADDED["agro-fig2"][0].registered
    down = {"topr": {"acc": 17.0, "start": 18.0}, "naive": {"acc": 0.0, "start": 18.0}}
    r = {"seeds": [0, 1, 2], "quick": False, "figures": {str(s): down for s in range(3)}}
    (a,) = claims.added_of("topr-fig1", r)
    assert a["verdict"] == "the comparator collapsed" and a["rule"] == "paper's direction"


def test_a_claim_over_other_claims_runs_is_composed_from_their_results():
    """topr-fig6-high shares all its runs (runs_of): with topr-fig5's and topr-fig6's results it
    gets a result of its own, no runs or minutes of its own, its contrasts judged; without
    them, none."""
    def result(arms, commit):
        return {"seeds": [0, 1, 2], "quick": False, "commit": commit, "commands": {
            a: ["topr.py"] for a in arms}, "figures": {str(s): {a: {"acc": 20.0 + s + (
                "tis" in a) * 3} for a in arms} for s in range(3)}}
    results = {"topr-fig5": result(["p10-pt50", "p10-pt100"], "aaa"),
               "topr-fig6": result(["tis-pt50", "tis-pt100"], "bbb")}
    r = claims.composed("topr-fig6-high", results)
    assert r["composed_from"] == {"topr-fig5": "aaa", "topr-fig6": "bbb"}
    assert (r["runs"], r["minutes"], r["seeds"]) == ([], 0.0, [0, 1, 2])
    assert r["figures"]["1"]["tis-pt100"] == {"acc": 24.0}
    assert claims.primary_of("topr-fig6-high", r)["d"] == [-3.0, -3.0, -3.0]
    assert [c["verdict"] for c in r["contrasts"]] == ["opposite direction"] * 2
    assert claims.composed("topr-fig6-high", {"topr-fig5": results["topr-fig5"]}) is None
    assert claims.composed("topr-fig1", results) is None  # arms of its own


def test_a_win_over_a_comparator_that_collapsed_is_labelled_so(monkeypatch):
    """topr-fig6 and topr-fig7: in the paper's direction by the rule, but TOPR below its start
    in the mean: "the comparator collapsed"; TOPR at or above its start keeps the verdict."""
    assert set(claims.CO_CONDITIONS) == {"topr-fig6", "topr-fig7"}
    for cid in claims.CO_CONDITIONS:
        for drop, verdict in [(-2.0, "the comparator collapsed"), (0.0, "paper's direction")]:
            text, _, delta, kind = claims.CLAIMS[cid]["primary"]
            monkeypatch.setitem(claims.CLAIMS, cid, dict(claims.CLAIMS[cid], primary=(
                text, lambda m: 5.0, delta, kind)))
            figs = {a: {"acc": 10.0 + drop, "start": 10.0} for a in claims.CLAIMS[cid]["arms"]}
            r = {"seeds": [0, 1, 2], "quick": False, "figures": {str(s): figs for s in range(3)}}
            p = claims.primary_of(cid, r)
            assert p["verdict"] == verdict and p["co"]["mean"] == drop, (cid, p)
            if drop < 0:
                assert p["rule"] == "paper's direction"
                assert claims.verdict_text(p).startswith("**the comparator collapsed** (the rule")


def test_the_registration_says_which_primaries_ran_blind():
    runnable = {c for c, v in claims.CLAIMS.items() if v.get("runs", True)}
    assert set(claims.REGISTRATION) == runnable
    blind = {c for c, (how, _) in claims.REGISTRATION.items() if how == "blind"}
    assert blind == {"topr-fig7", "topr-fig8", "cr-s51"}  # and agro-fig4's off-policy arm
    assert "off-policy arm ran blind" in claims.REGISTRATION["agro-fig4"][1]
    assert "naive" in claims.REGISTRATION["topr-fig1"][1]
    text = " ".join(claims.registration_paragraph())
    assert "Ran blind: topr-fig7, topr-fig8, cr-s51 and agro-fig4's off-policy arm" in text


def test_every_probe_arm_names_the_commit_that_added_it():
    import claims_registry
    for cid, claim in claims.CLAIMS.items():
        for name, arm in claim.get("arms", {}).items():
            assert arm.role in claims_registry.ROLES, (cid, name)
            if arm.role == "probe":
                assert any(name.startswith(start) for start in claims_registry.PROBES_ADDED), (
                    cid, name)
                assert re.fullmatch(r"[0-9a-f]{7}", arm.added), (cid, name)


def test_a_claim_registered_at_1987642_keeps_its_earlier_results_and_its_primary_is_post_hoc(
        tmp_path, monkeypatch):
    """Not run again yet: the doc still shows the earlier runs' contrasts and verdict (the rule of
    1987642) from ARCHIVE, and computes the primary on them, labelled post hoc."""
    archive = tmp_path / "archive"
    archive.mkdir()
    text = claims.CLAIMS["topr-fig4"]["primary"][0]
    earlier = {"registered": "1987642", "results": "1d2807b", "claims": {"topr-fig4": {
        "setting": "The paper's setting: ...", "arm_header": ["arm", "acc"],
        "arms": [["start model", "18.9 ± 0.8"]], "verdict": "not reproduced",
        "contrasts": [{"text": text, "mean_sd": "-8.0 ± 1.5", "d": [-6.9, -7.5, -9.7],
                       "verdict": "not reproduced"}]}}}
    (archive / f"earlier-{claims.EARLIER}.json").write_text(json.dumps(earlier))
    monkeypatch.setattr(claims, "ARCHIVE", str(archive))
    args = argparse.Namespace(out=str(tmp_path / "runs"), doc=str(tmp_path / "CLAIMS.md"),
                              readme="", sft=str(tmp_path), seeds=[0, 1, 2])
    doc = claims.write_doc(args)
    row = next(line for line in doc.splitlines() if line.startswith("| [[TOPR] Fig. 4"))
    assert row.endswith("| **not run yet** | not reproduced (the earlier runs) |")
    section = doc[doc.index("## topr-fig4"):]
    assert "Not yet run under the primary-contrast rule." in section
    assert f"| {text} | -8.0 ± 1.5 | -6.9, -7.5, -9.7 | not reproduced |" in section
    assert ("post hoc (registered after them, in 37c3416): mean -8.0 [-11.7, -4.4] (-6.9, -7.5, "
            "-9.7); opposite direction.") in section
    assert "## topr-fig1" not in doc  # neither run again nor in the earlier archive


def test_an_arms_label_is_its_role_and_note_as_the_doc_always_named_it():
    arms = {cid: claims.CLAIMS[cid]["arms"] for cid in ("topr-fig1", "agro-fig2", "spo-fig1")}
    assert [claims.label(arms[cid][a]) for cid, a in [
        ("topr-fig1", "topr"), ("agro-fig2", "rloo"), ("agro-fig2", "agro-lb2"),
        ("agro-fig2", "rloo-b0.5"), ("topr-fig1", "topr-lr5e-7"), ("spo-fig1", "ppo")]] == [
        "paper", "paper: KL in the reward", "ours: lambda_LR = beta / 2",
        "probe: beta 0.5, above the collapse threshold", "the paper's lr, 5e-7 ([TOPR] §4.2)",
        "ours: PPO stand-in, RLOO with the KL in R"]


def test_a_secondary_contrast_with_a_seed_that_is_not_a_number_is_undefined_not_a_crash():
    assert claims.verdict_of([float("nan"), 0.5, 0.7]).startswith("undefined")
    assert claims.verdict_of([0.4, 0.5, 0.7]) == "reproduced"


def test_a_secondary_claim_of_no_difference_is_judged_as_one_not_by_its_direction():
    """topr-fig7 at clip 1: the paper finds IS as good as TOPR. TOPR 16 points ahead in every seed
    is a difference the paper did not claim, where the earlier rule's direction reads it as
    reproduced; level seeds are equivalent."""
    ahead = claims.secondary("TOPR - IS", [16.9, 16.5, 15.8], 1.0)
    assert ahead["verdict"] == "opposite direction" and not ahead["probe"], ahead
    assert claims.verdict_of([16.9, 16.5, 15.8]) == "reproduced"  # the direction alone
    assert claims.secondary("TOPR - IS", [0.3, -0.2, 0.4], 1.0)["verdict"] == \
        "equivalent within delta"
    assert claims.secondary("x", [0.4, 0.5, 0.7], "probe")["probe"]
    registry = claims.CLAIMS["topr-fig7"]["contrasts"]
    assert [c[2:] for c in registry] == [(1.0,)], registry


# ---- The registry as data (docs/claims/registry/) and its expressions --------------------------
def test_an_expression_computes_a_contrast_from_one_seeds_figures():
    """A contrast as the registry writes it, on figures whose value is known by hand."""
    from claims_registry import Expression
    curve = [{"step": 0, "acc": 20.0}, {"step": 100, "acc": 24.0}, {"step": 200, "acc": 22.0}]
    m = {"topr": {"acc": 25.5, "start": 20.0, "steps": 250, "curve": curve, "pass": 60.0},
         "topr-p67": {"acc": 21.0, "start": 20.0}, "naive": {"acc": 1.5}}
    arms = list(m)

    def value(text):
        return Expression("topr-fig1", text, arms)(m)
    assert value("topr.acc - naive.acc") == 24.0
    assert value("topr.acc - at(topr, topr.steps // 2).acc") == 25.5 - 24.0  # step 125: 100's
    assert value('arm["topr-p67"].acc - -arm["topr-p67"].start * 2 / 4') == 31.0
    assert value('topr["pass"] - topr.curve[0].acc') == 40.0
    assert value('mean(topr.acc, naive.acc) - min(topr.start, 3) + max(1, 2)') == 12.5
    registered = claims.CLAIMS["topr-fig1"]["primary"][1]  # from topr-fig1.toml
    assert registered(m) == 5.5 and "topr.acc - topr.start" in repr(registered)


@pytest.mark.parametrize("text", [
    '__import__("os").system("true")',  # a call to something not whitelisted
    "import os",                        # not an expression at all
    "topr.__class__",                   # an attribute of Python's, not a figure
    'topr["__class__"]',
    "open('x').read()",
    "topr.acc ** 2",                    # an operator not in the list
    "lambda: 1",
    "[x for x in topr]",
    "nope.acc - topr.acc",              # no such arm
    'arm["nope"].acc',
    "topr.acc if 1 else 0",
    "min(topr.acc, key=1)",
    "'text'",
])
def test_a_forbidden_expression_is_refused_with_one_line_naming_the_claim(text):
    import claims_registry
    with pytest.raises(claims_registry.RegistryError) as e:
        claims_registry.Expression("topr-fig1", text, ["topr", "naive"])
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"topr-fig1: expression {text!r}: ")
    source = open(claims_registry.__file__).read()  # checked by walking the tree: no eval
    assert not re.search(r"\b(eval|exec|getattr|compile)\(", source)


def test_a_claim_file_with_a_bad_expression_or_key_stops_the_load_naming_it(tmp_path):
    import claims_registry
    folder = tmp_path / "registry"
    shutil.copytree(claims_registry.REGISTRY, folder)
    assert list(claims_registry.load(str(folder))) == list(claims.CLAIMS)  # as copied: loads
    path = folder / "topr-fig8.toml"
    good = path.read_text()
    path.write_text(good.replace('expr = "ak.acc - uniform.acc"',
                                 'expr = "ak.acc - uniform.acc.__class__"'))
    with pytest.raises(claims_registry.RegistryError, match=r"^topr-fig8: expression "):
        claims_registry.load(str(folder))
    path.write_text(good.replace("[verdict]", "[verdicts]"))
    with pytest.raises(claims_registry.RegistryError, match="topr-fig8: unknown key 'verdicts'"):
        claims_registry.load(str(folder))
    path.unlink()
    with pytest.raises(claims_registry.RegistryError, match="topr-fig8"):
        claims_registry.load(str(folder))


def test_every_eq12_arms_c_is_its_p_tilde_at_its_datas_share():
    """topr-fig5, topr-fig6 and topr-s43 write each arm's --c out: Eq. 12 inverted (c_for)."""
    seen = 0
    for cid in ("topr-fig5", "topr-fig6", "topr-s43"):
        for name, arm in claims.CLAIMS[cid]["arms"].items():
            flags = dict(zip(arm.flags[::2], arm.flags[1::2]))
            p = {"{d10}": 0.1, "{d10n3}": 0.1, "{d50}": 0.5}[flags["--data"]]
            pt = int(name.rsplit("-pt", 1)[1]) / 100
            assert flags["--c"] == f"{claims.c_for(p, pt):.4f}", (cid, name)
            seen += 1
    assert seen == 18 + 12 + 12


def test_cr_s51_runs_topr_at_the_reports_setting():
    """cr-s51's arm writes out topr.py's REPORT_SETTING (--report-variant's) with reward B."""
    flags = claims.CLAIMS["cr-s51"]["arms"]["B"].flags
    assert flags == ["--reward", "B", "--iterations", "1"] + [
        x for k, v in topr.REPORT_SETTING.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def test_quick_with_the_papers_settings_adds_each_flag_once_a_command(capsys):
    """--quick's flags then --paper-settings', once in every command (the two lists were once
    joined in place, so each command of a script carried the paper's flags once more)."""
    claims.main(["topr-fig8", "--sft", "S", "--dry-run", "--quick", "--paper-settings",
                 "--seeds", "0,1,2"])
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("python")]
    assert len(commands) == 6 and all(c.count("--max-new-tokens 512") == 1 for c in commands)


# ---- --real-cpu: the same claims sized for SmolLM2 on 2 cores (issue 70, goal 6) ---------------
def real_cpu_commands(capsys, seeds="0"):
    """(claim, script, flags) of every command `claims.py all --real-cpu --dry-run` prints."""
    claims.main(["all", "--sft", "smollm2", "--real-cpu", "--dry-run", "--seeds", seeds])
    commands, cid = [], None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("# ") and " / " in line.split("(")[0]:  # "# CLAIM / ARM (role)"
            cid = line[2:].split(" / ")[0]
        elif line.startswith("# POOL"):
            cid = "pool"
        elif line.startswith("python"):
            commands.append((cid, *line.split()[1:]))
    return commands


def test_every_real_cpu_command_evaluates_100_three_number_problems_and_parses(capsys):
    """Every arm's command under --real-cpu trains and evaluates 3-number puzzles only, 100
    held-out problems with 4 samples each, at most 96 new tokens (POOL's run: 1 problem, 1
    sample: it only draws), and is one its script's own parser takes; cr-table2 is left out."""
    import importlib
    commands = real_cpu_commands(capsys)
    ids = [c for c, v in claims.CLAIMS.items() if v.get("runs", True)
           and c not in claims.REAL_CPU["not_run"]]
    assert {c for c, *_ in commands} == set(ids) | {"pool"} and "cr-table2" not in ids
    assert len(commands) == 1 + sum(len(claims.CLAIMS[c]["arms"]) for c in ids)
    for cid, script, *flags in commands:
        parser, args = importlib.import_module(script[:-3]).parse_args(flags)
        assert (args.task, args.sizes, args.eval_sizes, args.max_new_tokens) == (
            "countdown", [3], [3], 96), (cid, flags)
        assert (args.eval_size, args.eval_k) == ((1, 1) if cid == "pool" else (100, 4)), cid
        assert args.lr is not None and args.lr <= 2e-5, (cid, args.lr)  # never tiny's


def real_cpu_lr(cid: str, arm: str) -> float:
    a = claims.CLAIMS[cid]["arms"][arm]
    args = argparse.Namespace(quick=False, paper_settings=False, real_cpu=True, sft="S")
    flags = claims.command(a.script, a.flags, 0, args, cid, arm)
    return float([flags[i + 1] for i, x in enumerate(flags) if x == "--lr"][-1])


def test_a_paper_setting_arm_keeps_the_papers_lr_under_real_cpu():
    """[TOPR] §4.2's 5e-7 and [SPO] §5's 6e-8 are already a real model's lr: not scaled."""
    assert real_cpu_lr("topr-fig1", "topr-lr5e-7") == 5e-7
    assert real_cpu_lr("spo-fig1", "spo-lr6e-8") == 6e-8
    assert real_cpu_lr("topr-fig1", "topr") == 1e-5  # the main arm: tiny's 5e-5 scaled


def test_real_cpu_keeps_the_lr_ratio_between_a_claims_arms_and_maps_each_main_lr():
    """One factor a script: topr-fig5's 5e-5 and 1e-5 arms stay 5x apart (1e-5, 2e-6), an arm
    with no --lr (topr-fig8: tiny's default) gets the main lr's image, and each script's tiny lr
    in common.toml is its DEFAULTS' tiny value."""
    import importlib
    main, fifth = real_cpu_lr("topr-fig5", "p10-pt10"), real_cpu_lr("topr-fig5", "lr1e-5-p10-pt10")
    assert main / fifth == pytest.approx(5.0) and (main, fifth) == (1e-5, 2e-6)
    assert real_cpu_lr("topr-fig8", "ak") == 1e-5
    assert real_cpu_lr("agro-fig2", "rloo") == real_cpu_lr("agro-fig2", "agro-l0") == 3e-6
    for script, (tiny, real) in claims.REAL_CPU["lr"].items():
        assert importlib.import_module(script[:-3]).DEFAULTS["lr"][0] == tiny > real


@pytest.mark.parametrize("other", ["--quick", "--paper-settings"])
def test_real_cpu_with_quick_or_the_papers_settings_is_one_line_and_exit_2(other, capsys):
    with pytest.raises(SystemExit) as e:
        claims.main(["all", "--sft", "S", "--real-cpu", other, "--dry-run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and other in err


def test_figures_read_a_run_that_evaluated_only_3_number_puzzles(tmp_path):
    """A --real-cpu run logs eval3/... alone: figures() and acc() take the sizes from its metrics
    (mean over size 3 only, no acc4) instead of assuming 3 and 4."""
    def ev(step, acc):
        return {"step": step, "eval3/sampled/accuracy": acc, "eval3/sampled/format_rate": 0.9,
                "eval3/pass@4": 2 * acc}
    rows = [ev(0, 0.11), {"step": 1, "loss": 0.5, "reward": -0.8, "kl_to_ref": 0.01},
            {"step": 2, "loss": 0.4, "reward": -0.6, "kl_to_ref": 0.02}, ev(2, 0.2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = claims.figures(str(tmp_path))
    assert (f["start"], f["acc"], f["acc3"], f["start3"]) == pytest.approx((11.0, 20.0, 20.0, 11.0))
    assert "acc4" not in f and f["pass"] == pytest.approx(40.0) and f["steps"] == 2
    assert [c["step"] for c in f["curve"]] == [0, 2] and f["kl"] == pytest.approx(0.015)
    assert claims.acc(ev(0, 0.3)) == pytest.approx(30.0)


def test_the_real_cpu_doc_renders_not_run_for_every_claim_with_no_results(tmp_path, monkeypatch):
    """No result anywhere: every runnable claim's row says "not run yet", cr-table2 "not run at
    this scale", and nothing of the tiny results (docs/claims/*.json) is read."""
    monkeypatch.setitem(claims.REAL_CPU, "archive", str(tmp_path / "archive"))
    doc = tmp_path / "CLAIMS-real-cpu.md"
    claims.main(["all", "--sft", "S", "--real-cpu", "--render-only", "--out",
                 str(tmp_path / "runs"), "--doc", str(doc)])
    text = doc.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| [[")]  # a claim run here
    ids = [c for c, v in claims.CLAIMS.items() if v.get("runs", True)]
    assert len(rows) == len(ids) - 1 and all("**not run yet**" in r for r in rows)
    assert [line for line in text.splitlines() if line.startswith("| [CR] Table 2 |")][0].count(
        "not run at this scale: its primary compares mean reward on 4-number puzzles") == 1
    assert "The earlier runs" not in doc.read_text()


def test_the_real_models_runs_sit_beside_the_tiny_verdicts(tmp_path, monkeypatch):
    """A claim --real-cpu has run (its kept result in docs/claims/real-cpu/) gets a row beside
    the tiny model's primary in docs/CLAIMS.md, judged by the same rule; none, no table."""
    monkeypatch.setattr(claims, "ROOT", str(tmp_path))
    assert claims.real_cpu_beside({}) == [] and claims.real_cpu_line(None) == ""
    kept = json.load(open(os.path.join(claims.ARCHIVE, "cr-s51.json")))
    for s, f in kept["figures"].items():  # SmolLM2's: B ends 0.1 below its start every seed
        f["B"].update(score0=0.3, score=0.2 - 0.01 * int(s))
    os.makedirs(tmp_path / claims.REAL_CPU["archive"])
    (tmp_path / claims.REAL_CPU["archive"] / "cr-s51.json").write_text(json.dumps(kept))
    tiny = {"cr-s51": {"primary": claims.primary_of("cr-s51", json.load(
        open(os.path.join(claims.ARCHIVE, "cr-s51.json"))))}}
    lines = claims.real_cpu_beside(tiny)
    row = next(x for x in lines if x.startswith("| [cr-s51]"))
    assert "SFT - B, mean reward" in row
    assert row.count("not detected at this power") == 1  # the tiny model's
    assert "(0.100, 0.110, 0.120" in row and "paper's direction" in row  # SmolLM2's: B fell
    readme = argparse.Namespace(readme=str(tmp_path / "README.md"))
    assert claims.real_cpu_line(readme) == (
        " On SmolLM2-135M-Instruct, 1 claim run so far ([docs/CLAIMS-real-cpu.md]"
        "(docs/CLAIMS-real-cpu.md), `--real-cpu`): cr-s51 paper's direction.")
