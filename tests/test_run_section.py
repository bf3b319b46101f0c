"""The run section at the end of each algorithm script: the same code in all five, tested once."""
import argparse
import inspect
import json
import os
import shutil

import pytest

import agro
import rloo
import sft
import spo
import topr

SCRIPTS = {"sft": sft, "rloo": rloo, "topr": topr, "agro": agro, "spo": spo}


RUN_SECTION = ["Run", "atomic_write", "resumed_args", "load_checkpoint", "keep_metrics_until",
               "closing_lines"]


@pytest.mark.parametrize("function", RUN_SECTION)
def test_the_run_section_is_the_same_code_in_all_five_scripts(function):
    sources = {name: inspect.getsource(getattr(m, function)) for name, m in SCRIPTS.items()}
    assert len(set(sources.values())) == 1, f"{function} differs between scripts"


def test_the_run_section_is_one_block_at_the_end_of_each_script():
    """From its header to `if __name__`, the same text in all five: nothing else sits in it."""
    blocks = {}
    for name, module in SCRIPTS.items():
        text = inspect.getsource(module)
        blocks[name] = text[text.index("# ---- Run section"):text.index('if __name__ ==')]
    assert len(set(blocks.values())) == 1, "the run sections differ"
    assert all(f"\ndef {f}(" in blocks["sft"] or f"\nclass {f}:" in blocks["sft"]
               for f in RUN_SECTION)


ROWS = [  # a run's metrics.jsonl: a start evaluation, a training row, a greedy-only one, the end
    {"step": 0, "time": 0.1, "eval3/greedy/accuracy": 0.5, "eval3/sampled/accuracy": 0.25,
     "eval4/greedy/accuracy": 0.125, "eval4/sampled/accuracy": 0.0625, "pass@8": 0.9},
    {"step": 1, "time": 0.2, "loss": 1.0, "accuracy": 0.99},
    {"step": 2, "time": 0.3, "eval3/greedy/accuracy": 0.75, "eval4/greedy/accuracy": 0.0},
    {"step": 3, "time": 0.4, "eval3/greedy/accuracy": 0.6, "eval3/sampled/accuracy": 0.5,
     "eval4/greedy/accuracy": 0.25, "eval4/sampled/accuracy": 0.0},
]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("stopped_early", [False, True])
def test_the_closing_lines_say_what_the_run_did_and_what_comes_next(name, stopped_early,
                                                                   tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    args = argparse.Namespace(out=str(out), task="countdown")
    lines = SCRIPTS[name].closing_lines(args, stopped_early)
    assert lines[0] == f"{name}.py done. Held-out accuracy (%), step 0 -> step 3:"
    assert lines[1] == "  size 3: greedy 50.0 -> 60.0 (+10.0), T = 1 25.0 -> 50.0 (+25.0)"
    assert lines[2] == "  size 4: greedy 12.5 -> 25.0 (+12.5), T = 1 6.2 -> 0.0 (-6.2)"
    assert lines[3] == f"run folder: {out} (final model: {out}/final)"
    resume = f"stopped at --time-limit; continue: python {name}.py --resume {out}"
    assert (resume in lines) == stopped_early
    nxt = "topr" if name == "sft" else name
    assert lines[-1] == f"next: python {nxt}.py --task countdown --model {out}/final"


# ---- resume: the same refusals and the same recoveries in every script ------------------------
EVAL = ["--task", "countdown", "--model", "tiny", "--sizes", "3", "--eval-sizes", "3",
        "--eval-size", "4", "--eval-k", "2", "--max-new-tokens", "12", "--threads", "1"]
BUDGETS = {  # a step or two of each
    "sft": ["--steps", "2", "--batch-size", "4", "--train-size", "8", "--eval-every", "2"],
    "rloo": ["--steps", "1", "--prompts", "2", "--k", "2", "--train-size", "8"],
    "topr": ["--iterations", "1", "--prompts", "2", "--n", "2", "--batch-size", "4",
             "--train-size", "8"],
    "agro": ["--steps", "1", "--prompts", "2", "--n", "2", "--offline-prompts", "2",
             "--train-size", "8"],
    "spo": ["--steps", "1", "--train-size", "2", "--batch-size", "4",
            "--samples-per-prompt", "2"],
}


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
    """A finished run of a step or two of each script, made once; each test works on a copy."""
    root = tmp_path_factory.mktemp("finished")
    here = os.getcwd()
    os.chdir(root)  # whatever a run writes outside its folder stays here
    try:
        for name, module in SCRIPTS.items():
            module.main(EVAL + BUDGETS[name] + ["--out", str(root / name)])
    finally:
        os.chdir(here)
    return root


@pytest.fixture
def run_copy(finished_runs, tmp_path):
    def copy(name):
        shutil.copytree(finished_runs / name, tmp_path / name)
        return tmp_path / name
    return copy


def _refused(name, run, capsys) -> str:
    """main(--resume run) ends with exit status 2 and one error line, no traceback: that line."""
    with pytest.raises(SystemExit) as e:
        SCRIPTS[name].main(["--resume", str(run)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_resume_refuses_a_truncated_checkpoint_in_one_line(name, run_copy, capsys):
    run = run_copy(name)
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[:len(data) // 2])
    assert "cannot load checkpoint" in _refused(name, run, capsys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_resume_refuses_a_finished_run_without_its_checkpoint_in_one_line(name, run_copy,
                                                                        capsys):
    run = run_copy(name)
    os.remove(run / "checkpoint.pt")
    assert f"--resume {run}: no checkpoint.pt" in _refused(name, run, capsys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_resume_refuses_a_checkpoint_without_its_keys_in_one_line(name, run_copy, capsys):
    import torch
    run = run_copy(name)
    torch.save({"step": 1}, run / "checkpoint.pt")
    assert "cannot load checkpoint" in _refused(name, run, capsys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_resume_refuses_a_metrics_row_without_a_step_in_one_line(name, run_copy, capsys):
    run = run_copy(name)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"loss": 1.0}) + "\n")
    last = _refused(name, run, capsys)
    assert "metrics.jsonl:" in last and "not a run's metrics file" in last


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("other", sorted(SCRIPTS))
def test_resume_refuses_another_scripts_run_in_one_line(name, other, run_copy, capsys):
    if name == other:
        pytest.skip("the script's own run")
    assert "another script's run" in _refused(name, run_copy(other), capsys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_finished_run_resumed_adds_nothing_and_a_torn_last_row_is_dropped(name, run_copy,
                                                                           capsys):
    run = run_copy(name)
    rows = (run / "metrics.jsonl").read_text()
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "lo')  # a row torn by a kill mid-write
    assert SCRIPTS[name].main(["--resume", str(run)]) == str(run)
    assert (run / "metrics.jsonl").read_text() == rows
    assert f"{name}.py done. Held-out accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_run_stopped_before_its_first_checkpoint_starts_again_from_step_0(name, run_copy,
                                                                           finished_runs,
                                                                           capsys):
    """A kill before the first checkpoint leaves config.json and maybe some rows: --resume runs it
    again from the start, to the metrics of the run never interrupted."""
    from conftest import metrics_rows
    run = run_copy(name)
    os.remove(run / "checkpoint.pt")
    shutil.rmtree(run / "final")
    assert SCRIPTS[name].main(["--resume", str(run)]) == str(run)
    assert "stopped before its first checkpoint; starting it again" in capsys.readouterr().out
    assert metrics_rows(run) == metrics_rows(finished_runs / name)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_shows_every_default(name):
    """Every flag has help, and each help line ends with its default, e.g. --lr's."""
    parser = SCRIPTS[name].parse_args([])[0]
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if action.option_strings and action.default is not argparse.SUPPRESS:
            assert action.help, f"{name}.py {action.option_strings[-1]} has no help"
    lr = parser.parse_args([]).lr
    assert f"(default: {lr})" in text


LONGER = {"sft": ["--steps", "3"], "rloo": ["--steps", "3"], "topr": ["--iterations", "3"],
          "agro": ["--steps", "3"], "spo": ["--steps", "3"]}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_time_limit_stops_after_a_step_saves_and_says_how_to_continue(name, tmp_path, capsys):
    run = tmp_path / "run"
    SCRIPTS[name].main(EVAL + BUDGETS[name] + LONGER[name]
                       + ["--time-limit", "1e-9", "--out", str(run)])
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert rows[-1]["step"] == 1 and any(k.endswith("sampled/accuracy") for k in rows[-1])
    assert os.path.isdir(run / "final") and os.path.exists(run / "checkpoint.pt")
    said = capsys.readouterr().out.splitlines()
    assert f"stopped at --time-limit; continue: python {name}.py --resume {run}" in said


SAVE_EACH_STEP = {"sft": ["--eval-every", "1"], "rloo": ["--save-every", "1"], "topr": [],
                  "agro": ["--save-every", "1"], "spo": ["--save-every", "1"]}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_run_killed_then_resumed_ends_with_the_uninterrupted_runs_metrics(name, tmp_path,
                                                                          monkeypatch):
    """Three steps, a checkpoint after each (topr: one step an iteration); killed as it logs step
    3, then --resume: from step 2's checkpoint to the same rows and weights as a run never
    stopped."""
    from conftest import metrics_rows, run_until_killed
    argv = EVAL + BUDGETS[name] + LONGER[name] + SAVE_EACH_STEP[name]
    straight = SCRIPTS[name].main(argv + ["--out", str(tmp_path / "straight")])
    run_until_killed(SCRIPTS[name].main, argv + ["--out", str(tmp_path / "run")], monkeypatch, 3)
    assert [r["step"] for r in metrics_rows(tmp_path / "run")][-1] == 2
    assert SCRIPTS[name].main(["--resume", str(tmp_path / "run")]) == str(tmp_path / "run")
    assert metrics_rows(tmp_path / "run") == metrics_rows(straight)
    assert [r["step"] for r in metrics_rows(straight)] == [0, 1, 2, 3]
    import torch
    a, b = (torch.load(os.path.join(run, "checkpoint.pt"), weights_only=False)["model"]
            for run in (straight, tmp_path / "run"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_from_before_a_flag_was_renamed_still_resumes(run_copy, capsys):
    """spo.py's --train-prompts is --train-size now: a config.json holding the old name resumes,
    with its value, instead of being refused as another script's run."""
    run = run_copy("spo")
    config = json.loads((run / "config.json").read_text())
    config["train_prompts"] = config.pop("train_size")
    (run / "config.json").write_text(json.dumps(config))
    rows = (run / "metrics.jsonl").read_text()
    assert spo.main(["--resume", str(run)]) == str(run)
    assert (run / "metrics.jsonl").read_text() == rows
    assert json.loads((run / "config.json").read_text())["train_size"] == config["train_prompts"]
