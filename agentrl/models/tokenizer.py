"""Tokenizers trained on the environments' own text, saved as Hugging Face tokenizer directories.

Byte-level BPE: lossless for any text (a search query with an unseen word still round-trips), and
frequent environment words become single tokens at a vocabulary of a few thousand.

Special tokens get the first ids, in :data:`SPECIAL_TOKENS` order, and are reserved before
training so a learned word can never take an id that a special token also uses. The action and
thinking tags are added as whole tokens (not special: they decode as text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, IM_START, IM_END, UNK_TOKEN)
TAG_TOKENS = ("<think>", "</think>", "<action>", "</action>")

# ChatML, the format of the Qwen2.5 chat models, so prompts look alike for tiny and real models.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

def _build_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it with the chat template and special tokens."""
    raw = _build_bpe(texts, vocab_size)
    for i, token in enumerate(SPECIAL_TOKENS):
        if raw.token_to_id(token) != i:
            raise RuntimeError(f"special token {token} got id {raw.token_to_id(token)}, expected {i}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START, IM_END], padding_side="left", clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(TAG_TOKENS))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def stop_token_ids(tokenizer) -> list[int]:
    """Ids that end a generated turn: ``<|im_end|>`` (chat models) and the EOS token."""
    ids = []
    for token in (IM_END, tokenizer.eos_token):
        tid = tokenizer.convert_tokens_to_ids(token) if token else None
        if tid is not None and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(int(tid))
    return ids
