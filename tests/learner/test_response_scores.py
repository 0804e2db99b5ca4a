"""Response log-probs and entropy in chunks of tokens (learner.logprob_chunk_tokens) and on padding-free rows
(learner.padding_free): the same numbers as the full padded path, with no [positions x vocabulary] float32
tensor over the chunk's size, forward or backward."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from agentrl.learner.engine import Learner
from agentrl.learner.response_scores import (FinalHiddenCapture, chunked_scores, output_head, response_token_index,
                                             scatter_rows)
from agentrl.learner.sequences import pack_batch
from agentrl.learner.setup import padding_free_works
from tiny_setup import learner_config, step_batch, write_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def hf_model(model_dir, attention="sdpa"):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attention).eval()


def full_path(model, packed, response_ids, temperature=1.0):
    """Today's padded path: the logits of every kept position, their float32 log-softmax."""
    logits = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=packed.position_ids,
                   logits_to_keep=packed.logits_to_keep, use_cache=False).logits.float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    n, width = response_ids.shape
    pos = (packed.prompt_lengths.unsqueeze(1) - 1 + torch.arange(width) - packed.keep_from).clamp(0, logits.shape[1] - 1)
    valid = torch.arange(width).unsqueeze(0) < packed.response_lengths.unsqueeze(1)
    rows = torch.arange(n).unsqueeze(1)
    entropy = -(logp.exp() * logp).sum(-1)[rows, pos]
    return torch.where(valid, logp[rows, pos, response_ids], 0.0), torch.where(valid, entropy, 0.0)


def chunked_path(model, packed, response_ids, chunk, temperature=1.0):
    attention = None if packed.padding_free else packed.attention_mask
    with FinalHiddenCapture(model, model.config.num_hidden_layers) as capture:
        model(input_ids=packed.input_ids, attention_mask=attention, position_ids=packed.position_ids,
              logits_to_keep=torch.zeros(0, dtype=torch.int64), use_cache=False)
    index, valid = response_token_index(packed)
    hidden = capture.states.reshape(-1, capture.states.shape[-1])[index]
    lp, ent = chunked_scores(output_head(model), hidden, response_ids[valid], temperature, chunk, entropy=True,
                             entropy_grad=True)
    return scatter_rows(lp, valid), scatter_rows(ent, valid)


def grads(model, scores):
    logprobs, entropy = scores
    weight = torch.linspace(-1, 1, logprobs.numel()).view_as(logprobs)
    loss = (logprobs * weight).sum() + 0.1 * entropy.sum()
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("chunk", [1, 4, 0])
def test_chunked_logprobs_entropy_and_gradients_equal_the_full_path(model_dir, chunk):
    model = hf_model(model_dir)
    batch = step_batch(5, seed=11)
    packed = pack_batch(batch)
    full = full_path(model, packed, batch.response_ids, temperature=0.7)
    chunked = chunked_path(model, packed, batch.response_ids, chunk, temperature=0.7)
    for a, b in zip(full, chunked):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(grads(model, full), grads(model, chunked)):
        assert torch.allclose(a, b, atol=1e-5)


class LargestVocabTensor(TorchDispatchMode):
    """The most elements of any float32 [..., positions, vocabulary] tensor made by an op (the output head's
    weight gradient, [hidden, vocabulary], is no such tensor)."""

    def __init__(self, vocab, hidden):
        super().__init__()
        self.vocab, self.hidden, self.largest = vocab, hidden, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.vocab and t.dtype == torch.float32
                    and tuple(t.shape) != (self.hidden, self.vocab)):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_vocabulary_tensor_over_the_chunk_forward_or_backward(model_dir):
    model = hf_model(model_dir)
    batch = step_batch(6, seed=12)
    packed = pack_batch(batch)
    trained, vocab = int(packed.response_lengths.sum()), model.config.vocab_size
    sizes = {}
    for name, run in (("full", lambda: full_path(model, packed, batch.response_ids)),
                      ("chunked", lambda: chunked_path(model, packed, batch.response_ids, 4))):
        with LargestVocabTensor(vocab, model.config.hidden_size) as probe:
            grads(model, run())
        sizes[name] = probe.largest
    assert 0 < sizes["chunked"] <= 4 * vocab < trained * vocab <= sizes["full"]


def learner(model_dir, **settings):
    return Learner(learner_config(**settings), model_dir)


def test_the_learner_scores_and_updates_the_same_in_chunks_and_at_once(model_dir):
    batch = step_batch(6, seed=13)
    at_once, chunked = learner(model_dir, logprob_chunk_tokens=0), learner(model_dir, logprob_chunk_tokens=3)
    scored = at_once.compute_logprobs(batch)
    scored_chunked = chunked.compute_logprobs(batch)
    trained = batch.response_mask > 0
    for column in ("old_logprobs", "ref_logprobs"):
        assert torch.allclose(getattr(scored, column)[trained], getattr(scored_chunked, column)[trained], atol=1e-5)
    first, second = at_once.update(scored), chunked.update(scored)
    for key in ("loss", "pg_loss", "entropy", "kl_ref", "grad_norm"):
        assert first[key] == pytest.approx(second[key], rel=1e-5, abs=1e-6), key


# ------------------------------------------------------------------------------------------ padding-free
def test_pack_puts_padding_free_rows_one_after_another():
    batch = step_batch(3, seed=14)
    padded, flat = pack_batch(batch), pack_batch(batch, padding_free=True)
    real = padded.attention_mask.bool()
    assert flat.padding_free and flat.input_ids.shape == (1, int(real.sum()))
    assert flat.input_ids[0].tolist() == padded.input_ids[real].tolist()
    assert flat.position_ids[0].tolist() == padded.position_ids[real].tolist()      # restarting at 0 per row
    assert flat.num_tokens() == padded.num_tokens()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_padding_free_logprobs_equal_the_padded_path(model_dir, attention):
    model = hf_model(model_dir, attention)
    batch = step_batch(5, seed=15)
    padded = full_path(model, pack_batch(batch), batch.response_ids)
    flat = chunked_path(model, pack_batch(batch, padding_free=True), batch.response_ids, 0)
    for a, b in zip(padded, flat):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(grads(model, padded), grads(model, flat)):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_learner_runs_padding_free_with_the_padded_numbers(model_dir):
    batch = step_batch(6, seed=16)
    padded, flat = learner(model_dir), learner(model_dir, padding_free=True, max_tokens_per_micro_batch=40)
    assert flat.padding_free and not padded.padding_free
    scored, scored_flat = padded.compute_logprobs(batch), flat.compute_logprobs(batch)
    trained = batch.response_mask > 0
    assert torch.allclose(scored.old_logprobs[trained], scored_flat.old_logprobs[trained], atol=1e-5)
    first, second = padded.update(scored), flat.update(scored)
    for key in ("loss", "pg_loss", "entropy", "grad_norm"):
        assert first[key] == pytest.approx(second[key], rel=1e-5, abs=1e-6), key


def test_padding_free_falls_back_to_padded_rows_with_one_line_where_unsupported(model_dir):
    class OutsideModel(torch.nn.Module):        # e.g. remote code: its attention may mix the rows
        config = hf_model(model_dir).config

    assert padding_free_works(hf_model(model_dir), True) and not padding_free_works(hf_model(model_dir), False)
    with pytest.warns(RuntimeWarning, match=r"padding_free=true needs .* padded rows instead") as caught:
        assert not padding_free_works(OutsideModel(), True)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
