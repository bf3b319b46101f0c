"""The run (common.Run and common.closing_lines): one copy that all five scripts call, tested
once for each of them."""
import argparse
import ast
import inspect
import json
import math
import os
import shutil

import pytest

import agro
import common
import rloo
import sft
import spo
import topr

SCRIPTS = {"sft": sft, "rloo": rloo, "topr": topr, "agro": agro, "spo": spo}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_script_saves_and_loads_its_run_through_common_and_keeps_no_copy_of_its_own(name):
    """The run folder, checkpoint, --resume and the closing lines live once, in common.py: a
    script defines none of them and makes its run with common.Run(..., __file__, ...)."""
    tree = ast.parse(inspect.getsource(SCRIPTS[name]))
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert not defined & {"Run", "closing_lines"}, f"{name}.py keeps its own copy"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and ast.unparse(n.func) == "common.Run"]
    assert len(calls) == 1 and ast.unparse(calls[0].args[2]) == "__file__"


ROWS = [  # a run's metrics.jsonl: a start evaluation, a training row, a greedy-only one, the end
    {"step": 0, "time": 0.1, "eval3/greedy/accuracy": 0.5, "eval3/sampled/accuracy": 0.25,
     "eval4/greedy/accuracy": 0.125, "eval4/sampled/accuracy": 0.0625, "pass@8": 0.9},
    {"step": 1, "time": 0.2, "loss": 1.0, "accuracy": 0.99, "grad_norm": 0.5},
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
    lines = common.closing_lines(args, stopped_early, f"{name}.py")
    assert lines[0] == f"{name}.py done. Held-out accuracy (%), step 0 -> step 3:"
    assert lines[1] == "  size 3: greedy 50.0 -> 60.0 (+10.0), T = 1 25.0 -> 50.0 (+25.0)"
    assert lines[2] == "  size 4: greedy 12.5 -> 25.0 (+12.5), T = 1 6.2 -> 0.0 (-6.2)"
    assert lines[3] == f"run folder: {out} (final model: {out}/final)"
    resume = f"stopped at --time-limit; continue: python {name}.py --resume {out}"
    assert (resume in lines) == stopped_early
    nxt = f"next: python topr.py --task countdown --model {out}/final"
    assert (nxt in lines) == (name == "sft") and not any(
        line.startswith("next:") and line != nxt for line in lines)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("steps, said", [
    ([(0.0, 0.5), (0.0, 0.25)], True),  # every group's rewards equal, or a blanked loss
    ([(0.3, 0.0), (0.2, 0.0)], True),  # no correct sample (TOPR's negatives still give a gradient)
    ([(0.3, 0.5), (0.0, 0.0)], False),
    ([(0.3, 0.0), (0.0, 0.5)], True),  # a gradient and a correct sample, never in the same step
    ([(0.3, None), (0.2, None)], False)])  # sft.py's rows: no accuracy
def test_a_run_without_learning_signal_says_so_in_its_closing_lines(name, steps, said, tmp_path):
    rows = [ROWS[0]] + [{"step": i + 1, "grad_norm": g} | ({} if a is None else {"accuracy": a})
                        for i, (g, a) in enumerate(steps)] + [ROWS[3]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = common.closing_lines(argparse.Namespace(out=str(tmp_path), task="c"), False,
                                  f"{name}.py")
    signal = "no learning signal: no step had a correct sample and a non-zero gradient"
    assert (signal in lines) == said
    assert lines[3].startswith("no learning signal" if said else "run folder:")  # after the sizes


# ---- resume: the same refusals and the same recoveries in every script ------------------------
EVAL = ["--task", "countdown", "--model", "tiny", "--sizes", "3", "--eval-sizes", "3",
        "--eval-size", "4", "--eval-k", "2", "--max-new-tokens", "12", "--threads", "1"]
BUDGETS = {  # a step or two of each
    "sft": ["--steps", "2", "--batch-size", "4", "--train-size", "8", "--eval-every", "2"],
    "rloo": ["--steps", "1", "--prompts", "2", "--group-size", "2", "--train-size", "8"],
    "topr": ["--iterations", "1", "--prompts", "2", "--group-size", "2", "--batch-size", "4",
             "--train-size", "8"],
    "agro": ["--mode", "offpolicy", "--steps", "1", "--prompts", "2", "--group-size", "2",
             "--offline-prompts", "2", "--train-size", "8"],
    "spo": ["--steps", "1", "--train-size", "2", "--batch-size", "4", "--group-size", "2"],
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


def _refused(name, argv, capsys) -> str:
    """main(argv) ends with exit status 2 and one error line, no traceback: that line."""
    with pytest.raises(SystemExit) as e:
        SCRIPTS[name].main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_resume_refuses_a_truncated_checkpoint_in_one_line(name, run_copy, capsys):
    run = run_copy(name)
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[:len(data) // 2])
    assert f"--resume {run}: cannot use {run}/checkpoint.pt: " in _refused(
        name, ["--resume", str(run)], capsys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_resume_refuses_a_run_without_its_checkpoint_in_one_line(name, run_copy, capsys):
    """A run killed before its first checkpoint, or one that lost it: nothing to continue from."""
    run = run_copy(name)
    os.remove(run / "checkpoint.pt")
    last = _refused(name, ["--resume", str(run)], capsys)
    assert f"cannot use {run}/checkpoint.pt: FileNotFoundError" in last


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_resume_refuses_a_checkpoint_without_its_keys_in_one_line(name, run_copy, capsys):
    import torch
    run = run_copy(name)
    state = torch.load(run / "checkpoint.pt", weights_only=False)
    torch.save({k: v for k, v in state.items() if k != "optimizer"}, run / "checkpoint.pt")
    assert f"not a {name}.py checkpoint" in _refused(name, ["--resume", str(run)], capsys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("damage", ["a row without a step", "not JSON"])
def test_resume_refuses_a_damaged_metrics_file_or_config_in_one_line(name, damage, run_copy,
                                                                    capsys):
    run = run_copy(name)
    with open(run / "metrics.jsonl", "a") as f:
        f.write((json.dumps({"loss": 1.0}) if damage == "a row without a step" else "{") + "\n")
    assert f"cannot use {run}/metrics.jsonl: " in _refused(name, ["--resume", str(run)], capsys)
    (run / "config.json").write_text(damage)
    assert f"cannot use {run}/config.json: " in _refused(name, ["--resume", str(run)], capsys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("other", sorted(SCRIPTS))
def test_resume_refuses_another_scripts_run_in_one_line(name, other, run_copy, capsys):
    if name == other:
        pytest.skip("the script's own run")
    run = run_copy(other)
    assert f"not a {name}.py checkpoint" in _refused(name, ["--resume", str(run)], capsys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_new_run_refuses_a_folder_that_holds_a_run_in_one_line(name, run_copy, capsys):
    run = run_copy(name)
    rows = (run / "metrics.jsonl").read_text()
    last = _refused(name, EVAL + BUDGETS[name] + ["--out", str(run)], capsys)
    assert f"--out {run} holds a run already" in last
    assert (run / "metrics.jsonl").read_text() == rows


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_finished_run_resumed_adds_nothing_and_a_torn_last_row_is_dropped(name, run_copy,
                                                                           capsys):
    run = run_copy(name)
    rows = (run / "metrics.jsonl").read_text()
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "lo')  # a row torn by a kill mid-write
    assert SCRIPTS[name].main(["--resume", str(run)]) == str(run)
    assert (run / "metrics.jsonl").read_text() == rows
    out = capsys.readouterr().out
    assert f"{name}.py done. Held-out accuracy" in out
    # the untrained tiny model answers nothing: no RL script had a signal; sft.py's loss always has
    assert ("no learning signal" in out) == (name != "sft")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_shows_every_default_once_and_names_the_built_in_model(name):
    """Every flag has help, each help line ends with its default (e.g. --lr's), no default is
    said twice, and --model's help names `tiny`."""
    parser = SCRIPTS[name].parse_args([])[0]
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if action.option_strings and action.default is not argparse.SUPPRESS:
            assert action.help, f"{name}.py {action.option_strings[-1]} has no help"
            assert "(default" not in action.help and "default:" not in action.help, \
                f"{name}.py {action.option_strings[-1]}: argparse shows its default"
    lr = parser.parse_args([]).lr
    assert f"(default: {lr})" in text
    model = next(a for a in parser._actions if "--model" in a.option_strings)
    assert "tiny" in model.help


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


SAVE_EACH_STEP = {"sft": ["--save-every", "1"], "rloo": ["--save-every", "1"], "topr": [],
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


# Five steps with checkpoints every two or three (topr: also at each iteration's end), so that a
# kill between two of them loses steps that --resume must redo.
BETWEEN = {"sft": ["--steps", "5", "--eval-every", "2", "--save-every", "2"],
           "rloo": ["--steps", "5", "--save-every", "2"],
           "topr": ["--iterations", "2", "--prompts", "4", "--batch-size", "2",
                    "--save-every", "3"],
           "agro": ["--steps", "5", "--save-every", "2"],
           "spo": ["--steps", "5", "--save-every", "2"]}


class Killed(BaseException):
    """A kill: not an Exception, so that no `except Exception` in a script can catch it."""


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow),
                                  pytest.param(2, marks=pytest.mark.slow)])
def test_a_run_killed_at_a_random_moment_then_resumed_ends_as_if_never_stopped(name, seed,
                                                                              tmp_path,
                                                                              monkeypatch):
    """Killed at a seeded random module call after its first checkpoint (mid-step, mid-sampling
    or mid-evaluation), then --resume: the same metrics (but wall-clock times) and bit-identical
    final weights as the run never stopped."""
    import random
    import torch
    from safetensors.torch import load_file
    from conftest import metrics_rows
    argv = EVAL + BUDGETS[name] + BETWEEN[name]
    calls, first_save = [0, math.inf], []  # module calls so far, the call that kills
    real_call, real_save = torch.nn.Module.__call__, common.Run.checkpoint

    def call(module, *a, **k):
        calls[0] += 1
        if calls[0] == calls[1]:
            raise Killed
        return real_call(module, *a, **k)

    def save(run, *a, **k):
        first_save.append(calls[0])
        return real_save(run, *a, **k)
    monkeypatch.setattr(torch.nn.Module, "__call__", call)
    monkeypatch.setattr(common.Run, "checkpoint", save)
    straight = SCRIPTS[name].main(argv + ["--out", str(tmp_path / "straight")])
    total, after_first = calls[0], first_save[0]
    calls[:] = [0, random.Random(f"{name}-{seed}").randint(after_first + 1, total)]
    with pytest.raises(Killed):
        SCRIPTS[name].main(argv + ["--out", str(tmp_path / "run")])
    calls[1] = math.inf
    assert SCRIPTS[name].main(["--resume", str(tmp_path / "run")]) == str(tmp_path / "run")
    assert metrics_rows(tmp_path / "run") == metrics_rows(straight)
    a, b = (load_file(os.path.join(run, "final", "model.safetensors"))
            for run in (straight, tmp_path / "run"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- common.Run's loop helpers: where a resumed run stands, and what a step's end does ---------
def test_done_before_skips_exactly_the_points_of_the_loops_a_resumed_run_had_trained():
    """topr.py's loops resume at the checkpoint's `next` = (iteration, epoch, minibatch): every
    point before it is done, that point and every one after it is not; a new run has done none."""
    run = common.Run.__new__(common.Run)
    run.state = None
    assert not run.done_before(0) and not run.done_before(0, 0, 0)
    run.state = {"next": (1, 0, 2)}
    assert run.done_before(0) and run.done_before(0, 3) and run.done_before(0, 0, 9)
    assert not run.done_before(1) and not run.done_before(1, 0)  # iteration 1 is under way
    assert run.done_before(1, 0, 1) and not run.done_before(1, 0, 2)
    assert not run.done_before(1, 1) and not run.done_before(2) and not run.done_before(1, 1, 0)


@pytest.mark.parametrize("last, late, evaluates, saves, ends", [
    (False, False, False, False, False),  # step 3: neither due
    (True, False, True, True, True),  # the last step: both, then the end
    (False, True, True, True, True)])  # past --time-limit: both, then the end (stopped early)
def test_end_step_evaluates_saves_and_ends_where_due(last, late, evaluates, saves, ends,
                                                     tmp_path):
    args = argparse.Namespace(out=str(tmp_path), eval_every=2, save_every=4, time_limit=None,
                              resume=None, task="t")
    run = common.Run(argparse.ArgumentParser(), args, "x.py", keys=set())
    saved, rows = [], []
    run.log = lambda step, row: rows.append((step, dict(row)))
    run.checkpoint = lambda step, **extra: saved.append((step, extra))
    run.deadline = -math.inf if late else math.inf
    assert run.end_step(3, {"loss": 1.0}, lambda: {"eval": 1}, last=last, next=(0, 1)) == ends
    assert rows == [(3, {"loss": 1.0, **({"eval": 1} if evaluates else {})})]
    assert saved == ([(3, {"next": (0, 1)})] if saves else [])
    assert run.stopped_early == (late and not last)
    assert run.end_step(4, {}, lambda: {"eval": 2}, last=False) == late  # both due at step 4
    assert rows[-1] == (4, {"eval": 2}) and saved[-1] == (4, {})
