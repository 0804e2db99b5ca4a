"""Where a policy comes from: a tiny model built here, a local directory, or a hub name.

Everything ends as an ordinary Hugging Face model directory (``config.json``, weights, tokenizer
files, chat template) that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load, so the rollout backends (torch, vLLM) and the learner all
read the same thing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from agentrl.errors import UsageError
from agentrl.models.architectures import QWEN25_ARCHITECTURES, build_tiny_model, qwen25_config
from agentrl.models.tokenizer import save_tokenizer, train_tokenizer

TINY = "tiny"


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def is_model_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "config.json").is_file()


# the files a Hugging Face tokenizer is read from (fast, byte-level BPE, WordPiece, SentencePiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model")


def has_tokenizer_files(path: str | os.PathLike) -> bool:
    return any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(name_or_path: str | os.PathLike):
    """A tokenizer from a directory or hub name, with a clear error when it cannot be found.

    A local folder without tokenizer files has no tokenizer, whatever ``transformers`` makes of it:
    since transformers 5, ``AutoTokenizer`` builds an empty tokenizer of the config's model type (one
    token, every text encoded as nothing) instead of raising, so such a folder is refused here."""
    fix = "Pass a directory that holds tokenizer files (tokenizer.name_or_path=...) or a model you have downloaded."
    if Path(str(name_or_path)).is_dir() and not has_tokenizer_files(name_or_path):
        raise UsageError(f"cannot load a tokenizer from {str(name_or_path)!r}: the folder has no tokenizer files "
                         f"({', '.join(TOKENIZER_FILES)}). {fix}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load a tokenizer from {str(name_or_path)!r}: {err}. {fix}") from None
    if len(tokenizer) < 2:
        raise UsageError(f"cannot load a tokenizer from {str(name_or_path)!r}: what it holds has {len(tokenizer)} "
                         f"token(s). {fix}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(name_or_path: str | os.PathLike, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa",
               trust_remote_code: bool = False) -> PreTrainedModel:
    """A causal LM from a directory or hub name, with a clear error when it cannot be found."""
    try:
        return AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype,
                                                    attn_implementation=attn_implementation,
                                                    trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        local = Path(str(name_or_path)).exists()
        fix = ("the directory has no loadable model (config.json + weights)" if local else
               "it is not a local directory and is not in the Hugging Face cache; download it "
               f"(`huggingface-cli download {name_or_path}`), point model.name_or_path at a local copy, "
               "or set model.random_init=true to build the architecture with random weights")
        raise UsageError(f"cannot load model {str(name_or_path)!r}: {fix} ({type(err).__name__})") from None


def stored_dtype(config) -> torch.dtype:
    """The dtype a model config says its weights are stored in; bf16 when it says none."""
    saved = config.to_dict()
    dtype = saved.get("dtype") or saved.get("torch_dtype")   # the key's name before / since transformers 4.56
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.bfloat16


def _write_model_dir(model: PreTrainedModel, tokenizer, out_dir: Path) -> Path:
    """Save model + tokenizer into ``out_dir`` atomically (a crash leaves no half directory)."""
    tmp = out_dir.with_name(out_dir.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    save_tokenizer(tokenizer, tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def prepare_initial_model(model_cfg, tokenizer_cfg, out_dir: str | os.PathLike,
                          corpus: Callable[[], Iterable[str]] | None = None, seed: int = 0) -> str:
    """Make sure the starting policy exists as a Hugging Face directory; return what to load.

    * ``tiny``: train a tokenizer on ``corpus()`` (the environment's text) and build the tiny
      model from ``model_cfg.tiny`` with random weights (deterministic for ``seed``);
    * ``random_init`` with a known architecture name (or a directory's config): that architecture
      with random weights in its stored dtype (:func:`stored_dtype`) and the named tokenizer (or,
      when unavailable, one trained on ``corpus()``);
    * otherwise nothing is written: the directory or hub name is returned as it is.
    """
    out_dir = Path(out_dir)
    if is_model_dir(out_dir):
        return str(out_dir)
    name = model_cfg.name_or_path
    if name == TINY:
        if corpus is None:
            raise ValueError("a tiny model needs a text corpus to train its tokenizer")
        tokenizer = (load_tokenizer(tokenizer_cfg.name_or_path) if tokenizer_cfg.name_or_path else
                     train_tokenizer(corpus(), tokenizer_cfg.vocab_size))
        model = build_tiny_model(model_cfg.tiny, tokenizer, seed=seed)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        return str(_write_model_dir(model, tokenizer, out_dir))
    if model_cfg.random_init:
        if name not in QWEN25_ARCHITECTURES and not is_model_dir(name):
            raise UsageError(f"model.random_init=true needs a known architecture ({', '.join(QWEN25_ARCHITECTURES)}) "
                             f"or a directory with a config.json; got {name!r}")
        try:
            tokenizer = load_tokenizer(tokenizer_cfg.name_or_path or name)
        except UsageError:
            if corpus is None:
                raise
            tokenizer = train_tokenizer(corpus(), tokenizer_cfg.vocab_size)
        model = build_random_model(name, len(tokenizer), seed=seed)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        written = _write_model_dir(model, tokenizer, out_dir)
        on_gpu = model.device.type == "cuda"
        del model
        if on_gpu:
            torch.cuda.empty_cache()
        return str(written)
    return str(name)


def build_random_model(name: str, min_vocab_size: int, seed: int = 0, device: str | None = None) -> PreTrainedModel:
    """The architecture ``name`` (a known Qwen2.5 hub name, or a model directory whose config is used)
    with random weights, a vocabulary of at least ``min_vocab_size`` for a known name.

    In the dtype the checkpoint is stored in (bf16 for the Qwen2.5 ones), built on ``device``, by
    default the GPU when there is one: a random 7B model is then 15 GB in seconds, not 30 GB after
    minutes of CPU initialisation (the same seed gives other weights on a GPU than on a CPU)."""
    if is_model_dir(name):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(name)
    else:
        config = qwen25_config(name, vocab_size=max(min_vocab_size, QWEN25_ARCHITECTURES[name]["vocab_size"]))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=stored_dtype(config))


__all__ = ["TINY", "build_random_model", "has_tokenizer_files", "is_model_dir", "load_model", "load_tokenizer", "prepare_initial_model", "resolve_dtype",
           "stored_dtype"]
