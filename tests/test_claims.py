"""scripts/claims.py: the verdict rule, Eq. 12's inverse, the composed datasets and bad input."""
import argparse
import json
import os
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
