"""scripts/real_model_gains.py: the commands it runs and the doc it renders from kept results."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import real_model_gains as gains  # noqa: E402


def _result(arm, seed, start, end, minutes=10.0, lr=None, step_s=None, steps=24):
    fig = lambda greedy, sampled: {"greedy/accuracy": greedy, "sampled/accuracy": sampled,  # noqa
                                   "greedy/length": 30.0, "sampled/format_rate": 1.0}
    return {"arm": arm, "seed": seed, "cmd": f"python {arm}.py --seed {seed}",
            "wall_s": 60 * minutes, "peak_rss_mb": 1000.0, "steps": steps,
            "start": fig(*start), "end": fig(*end), "machine": "2 cores (test CPU)",
            "commit": "abc1234", "date": "2026-11-28 00:00 UTC",
            **({} if lr is None else {"lr": lr}),
            **({} if step_s is None else {"median_step_s": step_s})}


def test_every_arm_evaluates_at_its_start_and_end_only_on_100_problems(tmp_path):
    for arm in gains.ORDER:
        cmd = gains.command(arm, 3)
        flags = dict(zip(cmd[2::2], cmd[3::2]))  # after the interpreter and the script
        assert cmd[1] == gains.ARMS[arm][0] and flags["--seed"] == "3"
        assert flags["--eval-size"] == "100" and flags["--eval-sizes"] == "3"
        assert not os.path.isabs(flags["--model"]) and not os.path.isabs(flags["--out"])
        # step 0 and the last step only (topr.py's 0 means just that)
        assert flags["--eval-every"] == ("0" if arm == "topr" else flags["--steps"])
    # another length: the steps (topr.py's rounds of 8) and the run's name say it
    cmd = gains.command("rloo", 0, 3e-6, 72)
    longer = dict(zip(cmd[2::2], cmd[3::2]))
    assert longer["--steps"] == longer["--eval-every"] == "72" and longer["--lr"] == "3e-06"
    assert longer["--out"].endswith("rloo-lr3e-06-steps72-s0")
    topr = gains.command("topr", 0, steps=72)
    assert topr[topr.index("--iterations") + 1] == "9" and topr[-1].endswith("topr-steps72-s0")
    assert gains.name("rloo", 1) == "rloo-s1"  # the kept results' names stay as they were


def test_the_doc_is_rendered_from_the_kept_results_with_each_gain(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(gains, "RESULTS", str(results))
    monkeypatch.setattr(gains, "DOC", str(tmp_path / "DOC.md"))
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- real-model:start -->\nold\n<!-- real-model:end -->\nafter\n")
    monkeypatch.setattr(gains, "README", str(readme))
    # each script's rows at its chosen settings; rloo.py's chosen apart from the first runs'
    monkeypatch.setattr(gains, "CHOSEN", {**{a: (1e-5, 24) for a in gains.ORDER},
                                          "rloo": (3e-6, 72)})
    kept = [_result("sft", 0, (0.0, 0.0), (0.2, 0.11)),
            _result("topr", 0, (0.2, 0.11), (0.26, 0.215)),
            _result("topr", 1, (0.21, 0.12), (0.2, 0.10)),
            _result("rloo", 0, (0.2, 0.11), (0.3, 0.25), step_s=12.4),  # the first runs' setting
            _result("rloo", 0, (0.2, 0.11), (0.1, 0.05), lr=3e-5),  # another lr
            _result("rloo", 0, (0.2, 0.11), (0.4, 0.31), lr=3e-6, steps=72)]  # rloo.py's chosen
    for r in kept:
        name = gains.name(r["arm"], r["seed"], r.get("lr", gains.LR), r["steps"])
        (results / f"{name}.json").write_text(json.dumps(r))
    gains.render()
    doc = (tmp_path / "DOC.md").read_text()
    chosen, other = doc.split("## Other learning rates and lengths")
    assert "| topr.py | 1e-05 | 24 | 0 | 20.0 -> 26.0 | 11.0 -> 21.5 | +10.5 | 10.0 | - |" in chosen
    assert "| rloo.py | 3e-06 | 72 | 0 | 20.0 -> 40.0 | 11.0 -> 31.0 | +20.0 | 10.0 |" in chosen
    assert "| topr.py | 1e-05 | 24 | 1 | 21.0 -> 20.0 | 12.0 -> 10.0 | -2.0 |" in chosen  # a loss
    # the settings not chosen: in their own table, not in the first one nor in the README's means
    assert "| rloo.py | 1e-05 | 24 | 0 | 20.0 -> 30.0 | 11.0 -> 25.0 | +14.0 | 10.0 | 12 |" in other
    assert "| rloo.py | 3e-05 | 24 | 0 | 20.0 -> 10.0 | 11.0 -> 5.0 | -6.0 |" in other
    assert "| rloo.py | 1e-05" not in chosen and "| rloo.py | 3e-06" not in other
    assert chosen.index("| rloo.py | 3e-06") < chosen.index("| topr.py | 1e-05")  # scripts' order
    assert "Not run yet: agro-on, agro-off, spo." in doc
    assert "greedy 0.0 -> 20.0%, T = 1 0.0 -> 11.0%" in doc  # the start model's own line
    block = readme.read_text()
    assert block.startswith("before\n<!-- real-model:start -->") and block.endswith("after\n")
    assert "old" not in block
    assert "| topr.py | 1e-05, 24 | 2 | 11.5 -> 15.8 | 20.5 -> 23.0 | 10 |" in block  # 2 seeds
    start = "| sft.py (the start, from SmolLM2) | 2e-05, 40 | 1 | 0.0 -> 11.0 | 0.0 -> 20.0 | 10 |"
    assert start in block
    # the start's command run again alone: both times, the README's short
    sft = dict(kept[0], alone={"wall_s": 360, "commit": "def5678", "same_weights": True})
    (results / "sft-s0.json").write_text(json.dumps(sft))
    gains.render()
    assert "| 0.0 -> 11.0 | 0.0 -> 20.0 | 6 (10 sharing the cores) |" in readme.read_text()
    assert ("(6.0 min alone on the cores at def5678, the same weights; 10.0 min the first time, "
            "sharing them)") in (tmp_path / "DOC.md").read_text()
    assert "| rloo.py | 3e-06, 72 | 1 | 11.0 -> 31.0 | 20.0 -> 40.0 | 10 |" in block  # chosen alone


def test_the_start_models_lr_is_sft_pys_own_for_a_pretrained_model():
    import sft
    assert gains.START_LR == sft.DEFAULTS["lr"][1]
    assert "--lr" not in gains.START_CMD  # so the start model ran at that default


def test_an_rl_arm_without_the_start_model_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(gains, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(gains, "RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(gains, "START", str(tmp_path / "runs" / "sft" / "final"))
    with pytest.raises(SystemExit, match="no start model .* make it first with --start"):
        gains.main(["--arm", "topr"])
