"""Shared fixtures. Tests run on one torch thread: two threads on a busy 2-core machine were 10-50x
slower."""
import functools
import json
import os
import sys

import pytest
import torch

os.environ.setdefault("TORCH_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(int(os.environ["TORCH_THREADS"]))  # before any test, -m paper too
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402
from tasks import scoring  # noqa: E402

SLOW = "slow: learning runs, kill and resume, end-to-end runs, TRL and vLLM (run with --slow)"
PAPER = "paper: a paper's equation checked on pure functions, no model, seconds (pytest -m paper)"


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run the tests marked slow (about 20 minutes more on 2 cores)")


def pytest_configure(config):
    config.addinivalue_line("markers", SLOW)
    config.addinivalue_line("markers", PAPER)


def pytest_collection_modifyitems(config, items):
    """Without --slow, the tests marked slow are skipped (and counted as skipped)."""
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# ---- Grading: a blank function fails with a message naming its equation ------------------------
# Each tests/test_<algo>.py names, in GRADED, the functions a student writes and the equation each
# one is. During its -m paper tests, the `graded` fixture below puts `checked(...)` around each of
# them, so that a stub (raise NotImplementedError, `pass`, or a constant such as torch.zeros(())
# where a loss needs a gradient) fails with
#     topr_loss: [TOPR] Eq. 7 (Eq. 8 with TOPR's limits) not implemented: it returned a tensor ...
# instead of an error deep inside torch. A function that is written gives its result unchanged.
# tests/grading_check.py lists which tests catch which likely mistake.
def _tensors(value):
    """The tensors in a result: the tensor itself, or those in a tuple or list."""
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return [value] if isinstance(value, torch.Tensor) else []


def checked(fn, name: str, equation: str, grad: bool = False):
    """fn, which fails the test with a message naming `equation` when fn is still blank: it raises
    NotImplementedError, returns None, returns no tensor though it was given tensors, or (grad=True,
    for a loss or anything the gradient flows through) returns tensors with no gradient though its
    inputs have one."""
    def missing(what):
        pytest.fail(f"{name}: {equation} not implemented: {what}", pytrace=False)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            out = fn(*args, **kwargs)
        except NotImplementedError:
            missing("it raises NotImplementedError")
        inputs = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        if out is None:
            missing("it returned None (a `pass` or a missing `return`?)")
        if inputs and not _tensors(out):
            missing(f"it returned {type(out).__name__} {out!r:.60}, not a tensor")
        if (grad and torch.is_grad_enabled() and any(a.requires_grad for a in inputs)
                and not any(t.requires_grad for t in _tensors(out))):
            missing("it returned a tensor with no gradient, though its input has one (a constant "
                    "such as torch.zeros? or a .detach() too many)")
        return out
    return call


@pytest.fixture(autouse=True)
def graded(request, monkeypatch):
    """In a -m paper test, each function its file names in GRADED (module, {name: (equation,
    grad)}) is wrapped by checked: a blank one fails with a message naming its equation."""
    if "paper" not in request.keywords or not hasattr(request.module, "GRADED"):
        return
    module, functions = request.module.GRADED
    for name, (equation, grad) in functions.items():
        monkeypatch.setattr(module, name, checked(getattr(module, name), name, equation, grad))


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """The built-in tiny model with random weights, built once per test session."""
    return common.build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"), seed=0)


@pytest.fixture
def no_sft_run(tmp_path, monkeypatch):
    """A working folder with no runs/ (a fresh clone): resolving the default --model there, which
    would train sft.py first (minutes), fails the test instead."""
    monkeypatch.chdir(tmp_path)
    def fail(*args, **kwargs):
        pytest.fail("a model was resolved before the data was read")
    monkeypatch.setattr(common, "latest_sft_model", fail)
    return tmp_path


@pytest.fixture
def tiny(tiny_path):
    common.setup(0)
    return common.load_model(tiny_path)


def fit(model, tok, prompts, completions, steps, lr, stop_below=None):
    """Full-batch SFT steps with sft.py's loss on token ids; returns the last loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        lp, mask = common.completion_logprobs(model, prompts, completions, tok.pad_token_id)
        # sft.py's loss, sft.sft_loss(lp, mask) (norm="token"), written out with the same operations
        # in the same order, so that a folder with one RL script and no sft.py can run its tests
        nll = -(lp * mask).sum(-1)
        loss = nll.sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if stop_below is not None and loss.item() < stop_below:
            break
    return loss.item()


# Easy Countdown sets for the RL scripts' short runs: all 2-number sums, and four of them.
SUMS = [{"nums": [a, b], "target": a + b} for a in range(1, 10) for b in range(1, 10)]
FOUR = [{"nums": [3, 5], "target": 8}, {"nums": [7, 2], "target": 9}, {"nums": [4, 4], "target": 8},
        {"nums": [6, 1], "target": 7}]


@pytest.fixture(scope="session")
def weak_sft(tiny_path, tmp_path_factory):
    """The tiny model after a deliberately short SFT on 2-number sums: mostly formatted, rarely
    right."""
    from tasks import countdown
    common.setup(0, 1)
    model, tok = common.load_model(tiny_path)
    prompts = common.encode_prompts(countdown, SUMS, tok, "compact")
    completions = [tok(countdown.demonstration(p), add_special_tokens=False)["input_ids"]
                   + [tok.eos_token_id]
                   for p in SUMS]
    fit(model, tok, prompts, completions, steps=80, lr=2e-3)
    path = str(tmp_path_factory.mktemp("weak") / "final")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def sampled(path, problems, samples=64) -> dict:
    """The sampled metrics (T=1, tasks/scoring.py) of the model in `path` on `problems`, with a
    fixed seed."""
    from tasks import countdown
    common.setup(1, 1)
    model, tok = common.load_model(path)
    prompts = common.encode_prompts(countdown, problems, tok, "compact")
    sampled = {"sampled": common.SamplingConfig(samples, 32, seed=0)}
    return scoring.evaluate(common.HFEngine(model, tok), countdown, problems, prompts, sampled)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_until_killed(main, argv, monkeypatch, step):
    """Run a script's main(argv) and interrupt it (KeyboardInterrupt) as it writes the metrics row
    of `step` (json.dumps of a row with "step" and "time"): a run killed mid-way."""
    real_dumps = json.dumps

    def dies(obj, *a, **k):
        if isinstance(obj, dict) and obj.get("step") == step and "time" in obj:
            raise KeyboardInterrupt
        return real_dumps(obj, *a, **k)
    monkeypatch.setattr(json, "dumps", dies)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    monkeypatch.setattr(json, "dumps", real_dumps)


# Kill-and-resume tests: run a script in a real subprocess and SIGKILL it at a chosen moment.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def metrics_rows(run_dir):
    """A run's metrics.jsonl without the wall-clock fields ("time", "time_*")."""
    return [{k: v for k, v in json.loads(line).items() if k != "time" and not k.startswith("time_")}
            for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def logged_lines(run_dir):
    """How many rows the run has logged so far (0 before its metrics file exists)."""
    try:
        return len(open(os.path.join(run_dir, "metrics.jsonl")).readlines())
    except OSError:
        return 0


def saved_step(run_dir):
    """The step of the run's last complete checkpoint, or None."""
    try:
        return torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=False)["step"]
    except Exception:
        return None


def kill_when(argv, ready, timeout=600):
    """Run `python argv...` in the repository and SIGKILL it as soon as ready() holds."""
    import subprocess
    import time
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while proc.poll() is None and not ready() and time.time() < deadline:
        time.sleep(0.005)
    proc.kill()
    return proc.wait()


# CLI fuzz: a flag given a wrong type, a negative, zero, nan, inf, an empty string or a missing
# path: exit status 2 with one error line and no traceback, or accepted (a normal start).
BAD_VALUES = ["abc", "-1", "0", "nan", "inf", "", "/no/such/path.jsonl"]


class _ReachedModelLoad(Exception):
    pass


def fuzz_flag(main, base_argv, flag, tmp_path, monkeypatch, capsys):
    """main(base_argv + --out + [flag, value]) for each of BAD_VALUES, up to the model load only."""
    monkeypatch.chdir(tmp_path)

    def no_model(*a, **k):
        raise _ReachedModelLoad
    monkeypatch.setattr(common, "load_model", no_model)
    for i, value in enumerate(BAD_VALUES):
        try:
            main(base_argv + ["--out", str(tmp_path / f"run{i}"), flag, value])
        except _ReachedModelLoad:
            continue  # accepted: a normal run would start here
        except SystemExit as e:
            err = capsys.readouterr().err.strip().splitlines()
            assert e.code == 2, (flag, value, e.code)
            assert err and "error: " in err[-1], (flag, value)
            assert "Traceback" not in "\n".join(err), (flag, value)
