"""Tiny models and trained tokenizers round-trip through from_pretrained and generate."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.models import count_parameters, prepare_initial_model, qwen25_config, stop_token_ids, train_tokenizer
from agentrl.models.tokenizer import SPECIAL_TOKENS

CORPUS = [
    "Crafting commands:\ncraft 4 oak planks using 1 oak logs\ncraft 4 stick using 2 planks\n\nGoal: craft stick.",
    "<think>I need planks first.</think><action>get 1 oak logs</action>",
    "Got 1 oak logs", "Crafted 4 minecraft:oak_planks", "Inventory: [oak planks] (4) ",
] * 40


def test_tokenizers_round_trip_seen_text_and_reserve_special_ids():
    text = "Got 1 oak logs\n<action>craft 4 stick using 2 planks</action>"
    bpe = train_tokenizer(CORPUS, vocab_size=300)
    assert bpe.decode(bpe(text)["input_ids"]) == text
    assert [bpe.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert len(bpe("<action>")["input_ids"]) == 1  # the tags are whole tokens
    unseen = "search[zebra-print hiking boots]"
    assert bpe.decode(bpe(unseen)["input_ids"]) == unseen  # byte-level: lossless for unseen words


def test_tiny_model_directory_loads_with_auto_classes_and_generates(tmp_path):
    cfg = load_config("textcraft_grpo_tiny", ["model.tiny.hidden_size=64", "model.tiny.num_layers=2",
                                              "model.tiny.intermediate_size=128", "tokenizer.vocab_size=300"])
    path = prepare_initial_model(cfg.model, cfg.tokenizer, tmp_path / "init", corpus=lambda: CORPUS, seed=3)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    assert 50_000 < count_parameters(model) < 1_000_000
    prompt = tok.apply_chat_template([{"role": "user", "content": "Goal: craft stick."}], add_generation_prompt=True,
                                     tokenize=False)
    assert prompt.startswith("<|im_start|>user\n") and prompt.endswith("<|im_start|>assistant\n")
    enc = tok(prompt, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=6, do_sample=True, eos_token_id=stop_token_ids(tok),
                         pad_token_id=tok.pad_token_id)
    assert out.shape[1] > enc["input_ids"].shape[1]
    # same seed, same weights: building again gives identical parameters
    again = prepare_initial_model(cfg.model, cfg.tokenizer, tmp_path / "again", corpus=lambda: CORPUS, seed=3)
    other = AutoModelForCausalLM.from_pretrained(again)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    # an existing directory is reused, not rebuilt
    assert prepare_initial_model(cfg.model, cfg.tokenizer, tmp_path / "init", corpus=None) == path


def test_tiny_sizes_span_1m_to_20m_parameters():
    from agentrl.models.architectures import tiny_config
    from transformers import Qwen2ForCausalLM

    tok = train_tokenizer(CORPUS, vocab_size=300)
    small = load_config(None, ["model.tiny.hidden_size=128", "model.tiny.num_layers=4",
                               "model.tiny.intermediate_size=512"]).model.tiny
    big = load_config(None, ["model.tiny.hidden_size=512", "model.tiny.num_layers=6", "model.tiny.num_heads=8",
                             "model.tiny.intermediate_size=1536"]).model.tiny
    with torch.device("meta"):
        n_small = count_parameters(Qwen2ForCausalLM(tiny_config(small, tok)))
        n_big = count_parameters(Qwen2ForCausalLM(tiny_config(big, tok)))
    assert 0.5e6 < n_small < 2e6 and 10e6 < n_big < 25e6


def test_qwen25_architectures_have_the_published_sizes():
    with torch.device("meta"):
        small = AutoModelForCausalLM.from_config(qwen25_config("Qwen/Qwen2.5-1.5B-Instruct"))
        big = AutoModelForCausalLM.from_config(qwen25_config("Qwen/Qwen2.5-7B-Instruct"))
    assert 1.4e9 < count_parameters(small) < 1.7e9
    assert 7.0e9 < count_parameters(big) < 7.8e9
    assert small.config.num_hidden_layers == 28 and big.config.hidden_size == 3584


def test_random_init_keeps_the_architecture_and_its_stored_dtype(tmp_path):
    from agentrl.models import stored_dtype

    assert stored_dtype(qwen25_config("Qwen/Qwen2.5-7B-Instruct")) == torch.bfloat16   # as the hub checkpoints
    cfg = load_config("textcraft_grpo_tiny", ["model.tiny.hidden_size=64", "model.tiny.num_layers=2",
                                              "model.tiny.intermediate_size=128", "tokenizer.vocab_size=300"])
    tiny = prepare_initial_model(cfg.model, cfg.tokenizer, tmp_path / "tiny", corpus=lambda: CORPUS, seed=3)
    source = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16)
    source.save_pretrained(tmp_path / "bf16")             # a bf16 checkpoint's config, as a hub model's
    AutoTokenizer.from_pretrained(tiny).save_pretrained(tmp_path / "bf16")
    cfg.model.name_or_path, cfg.model.random_init = str(tmp_path / "bf16"), True
    path = prepare_initial_model(cfg.model, cfg.tokenizer, tmp_path / "random", corpus=lambda: CORPUS, seed=5)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    assert model.dtype == torch.bfloat16 and model.config.hidden_size == 64
    weight = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(model.state_dict()[weight], source.state_dict()[weight])   # new random weights
