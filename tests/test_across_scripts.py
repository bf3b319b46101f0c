"""Tests that compare two scripts; they need both files.

A script's own test file (tests/test_sft.py, test_rloo.py, ...) needs that script alone, so that it
travels with it: the last test here copies each script with RECIPE into an empty folder and runs its
tests there."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import agro
import common
import rloo
import sft
from conftest import write_jsonl
from tasks import countdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
f64 = torch.float64


# -------------------------------------------------------------------------------------------------
# sft.py and rloo.py
# -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def standin_path(tmp_path_factory):
    """The hub-shaped stand-in (ChatML template, BPE tokenizer) when tests/hub_standin.py is
    there."""
    hub_standin = pytest.importorskip("hub_standin")
    return hub_standin.build_standin(str(tmp_path_factory.mktemp("standin") / "model"))


class _ReachedEngine(Exception):
    pass


def _first_call_until_engine(main, argv, module, name, monkeypatch):
    """main(argv) run up to its generation engine: the arguments and result of its first call of
    module.name (the training prompts a script encodes)."""
    real, calls = getattr(module, name), []

    def spy(*a):
        calls.append((a, real(*a)))
        return calls[-1][1]

    def no_engine(*a, **k):
        raise _ReachedEngine
    monkeypatch.setattr(module, name, spy)
    monkeypatch.setattr(common, "make_engine", no_engine)
    with pytest.raises(_ReachedEngine):
        main(argv)
    monkeypatch.setattr(module, name, real)
    return calls[0]


@pytest.mark.parametrize("which", ["tiny", "standin"])
def test_sft_and_rloo_condition_on_the_same_token_ids(which, request, tmp_path, capsys,
                                                       monkeypatch):
    """The same problems through sft.py --data and rloo.py --problems give identical prompt ids: the
    RL scripts' prompt (the chat template, if any), not the data file's own prompt text."""
    path = request.getfixturevalue("tiny_path" if which == "tiny" else "standin_path")
    problems = [{"nums": [44, 19, 35], "target": 98}, {"nums": [3, 5], "target": 8}]
    rows = [{**p, "prompt": countdown.prompt(p, "instruct"), "completion": "<answer>1</answer>"}
            for p in problems]
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    small = ["--model", path, "--eval-size", "1", "--threads", "1"]
    (_, _, _, tok, _, _), train = _first_call_until_engine(  # sft.encode_examples
        sft.main, small + ["--data", data, "--batch-size", "2", "--out", str(tmp_path / "s")],
        sft, "encode_examples", monkeypatch)
    _, rl_prompts = _first_call_until_engine(  # common.encode_prompts of the training problems
        rloo.main, small + ["--problems", data, "--prompts", "2", "--out", str(tmp_path / "r")],
        common, "encode_prompts", monkeypatch)
    assert [ex.prompt for ex in train] == rl_prompts
    # not the file's text
    assert all(ex.prompt != tok(r["prompt"], add_special_tokens=False)["input_ids"]
               for ex, r in zip(train, rows))
    assert "2 of 2 rows" in capsys.readouterr().out


# -------------------------------------------------------------------------------------------------
# agro.py and rloo.py
# -------------------------------------------------------------------------------------------------
def test_on_fresh_samples_offpolicy_agro_is_rloo_with_the_kl_in_the_reward():
    """§8.1: with on-policy samples, off-policy AGRO is the KL-regularised policy gradient. On the
    same multi-token groups, agro.py's Eq. 4 loss and rloo.py's RLOO loss with R = r - beta sg(h)
    give the same gradient to 1e-12, and on-policy AGRO (lambda_LR = 1) does not (the extra
    g_LR term), nor does RLOO without the KL in the reward."""
    g = torch.Generator().manual_seed(3)
    B, n, T, V, beta = 3, 4, 5, 7, 0.2
    logits = torch.randn(B * n, T, V, generator=g, dtype=f64)
    ref_lp = torch.log_softmax(torch.randn(B * n, T, V, generator=g, dtype=f64), -1)
    tokens = torch.randint(0, V, (B * n, T, 1), generator=g)
    mask = (torch.arange(T) < torch.randint(2, T + 1, (B * n, 1), generator=g)).to(f64)
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]], dtype=f64)

    def grad(weights_of):
        theta = logits.clone().requires_grad_(True)
        lp = torch.log_softmax(theta, -1).gather(-1, tokens).squeeze(-1) * mask  # [N, T]
        h = ((lp - ref_lp.gather(-1, tokens).squeeze(-1)) * mask).sum(-1).view(B, n)
        weights_of(lp, h).backward()
        return theta.grad

    agro_off = grad(lambda lp, h: agro.agro_loss(
        lp, mask, agro.agro_offpolicy_weights(agro.regularised_rewards(r, h, beta)).reshape(-1)))
    rloo_kl = grad(lambda lp, h: rloo.rloo_loss(
        lp, mask, rloo.rloo_advantages(common.regularised_rewards(r, h, beta)).reshape(-1)))
    agro_on = grad(lambda lp, h: agro.agro_loss(
        lp, mask, agro.agro_onpolicy_weights(agro.regularised_rewards(r, h, beta), beta, 1.0)
        .reshape(-1)))
    rloo_no_kl = grad(lambda lp, h: rloo.rloo_loss(lp, mask, rloo.rloo_advantages(r).reshape(-1)))
    assert (agro_off - rloo_kl).abs().max().item() < 1e-12
    assert agro_off.abs().max().item() > 1e-2
    assert (agro_off - agro_on).abs().max().item() > 1e-2
    assert (agro_off - rloo_no_kl).abs().max().item() > 1e-3


# -------------------------------------------------------------------------------------------------
# One script with its tests, copied out: the files a teacher copies to hand out {name}.py alone
# -------------------------------------------------------------------------------------------------
RECIPE = ["{name}.py", "common.py", "tasks/", "tests/conftest.py", "tests/test_{name}.py"]
SCRIPTS = ["sft", "rloo", "topr", "agro", "spo"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_and_its_tests_pass_in_an_empty_folder(name, tmp_path):
    """RECIPE copied into an empty folder, without the other scripts: its quick tests pass there."""
    for entry in RECIPE:
        rel = entry.format(name=name)
        src, dst = os.path.join(ROOT, rel), os.path.join(tmp_path, rel)
        os.makedirs(os.path.dirname(dst.rstrip("/")), exist_ok=True)
        if rel.endswith("/"):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dst)
    assert {f for f in os.listdir(tmp_path) if f.endswith(".py")} == {f"{name}.py", "common.py"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing from this checkout
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "tests/"], cwd=tmp_path, env={**env, "TORCH_THREADS": "1"},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout
