"""The built-in torch engine: equals HF greedy decoding, logprobs, seeds, stops, shared prefill, weights."""

from __future__ import annotations

import pytest
import torch

from agentrl.generation import SamplingParams, TorchBackend
from agentrl.generation.sampling import draw_from, filter_logits
from agentrl.generation.torch_engine import length_chunks, shared_prefixes
from agentrl.models import build_tiny_model, load_model, stop_token_ids
from agentrl.models.decode_cache import PreallocatedLayer
from rollout_helpers import TINY

TEXTS = ["Crafting commands:\ncraft 4 oak planks using 1 oak logs\n\nGoal: craft stick.",
         "Got 1 oak logs", "<think>I need planks</think><action>craft 4 oak planks using 1 oak logs</action>"]


def _prompts(tokenizer):
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    return [ids[0], ids[1], ids[0], ids[2], ids[0]]  # three identical prompts, different lengths


def _reference_logprobs(model, prompt, response, temperature=1.0):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_greedy_matches_hf_generate_and_reports_model_logprobs(tiny_model_dir, tiny_tokenizer):
    backend = TorchBackend.from_pretrained(tiny_model_dir)
    stops = tuple(stop_token_ids(tiny_tokenizer))
    prompts = _prompts(tiny_tokenizer)
    out = backend.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=stops))
    model = load_model(tiny_model_dir)
    for prompt, gen in zip(prompts, out):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=list(stops),
                             pad_token_id=tiny_tokenizer.pad_token_id)[0, len(prompt):].tolist()
        assert gen.token_ids == ref
        assert torch.allclose(_reference_logprobs(model, prompt, gen.token_ids), torch.tensor(gen.logprobs), atol=1e-5)
    stats = backend.stats()
    # the repeated prompt was prefilled once (each copy still runs its last token)
    assert stats["prefill_tokens_saved"] == 2 * (len(prompts[0]) - 1)


def test_sampling_is_seeded_and_logprobs_are_temperature_scaled(tiny_model_dir, tiny_tokenizer):
    backend = TorchBackend.from_pretrained(tiny_model_dir)
    prompts = _prompts(tiny_tokenizer)
    params = SamplingParams(max_tokens=8, temperature=0.7, top_p=1.0, seed=11)
    first, again = backend.generate(prompts, params), backend.generate(prompts, params)
    other = backend.generate(prompts, params.with_seed(12))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.logprobs for g in first] == [g.logprobs for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    assert len({tuple(g.token_ids) for i, g in enumerate(first) if prompts[i] == prompts[0]}) > 1  # rows differ
    model = load_model(tiny_model_dir)
    for prompt, gen in zip(prompts, first):
        assert torch.allclose(_reference_logprobs(model, prompt, gen.token_ids, 0.7), torch.tensor(gen.logprobs),
                              atol=1e-5)
    # the shared prefill does not change what is sampled
    plain = TorchBackend.from_pretrained(tiny_model_dir, share_prefixes=False).generate(prompts, params)
    assert [g.token_ids for g in plain] == [g.token_ids for g in first]
    # top_k = 1 is greedy
    top1 = backend.generate(prompts, SamplingParams(max_tokens=8, temperature=0.9, top_k=1, seed=3))
    greedy = backend.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0))
    assert [g.token_ids for g in top1] == [g.token_ids for g in greedy]


def test_stop_tokens_and_stop_strings_end_rows_early(tiny_model_dir, tiny_tokenizer):
    backend = TorchBackend.from_pretrained(tiny_model_dir)
    prompts = _prompts(tiny_tokenizer)
    greedy = backend.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    second = greedy[0].token_ids[1]
    stopped = backend.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=(second,)))
    assert stopped[0].token_ids == greedy[0].token_ids[:greedy[0].token_ids.index(second) + 1]
    assert stopped[0].finish_reason == "stop" and greedy[1].finish_reason == "length"
    text = tiny_tokenizer.decode(greedy[1].token_ids[:3])
    by_string = backend.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0, stop_strings=(text[-2:],)))
    assert tiny_tokenizer.decode(by_string[1].token_ids).endswith(text[-2:]) and len(by_string[1].token_ids) <= 3


def test_filter_logits_keeps_the_top_k_and_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, -1, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, -1, 0.1)).tolist() == [[False, True, True, True]]


def test_load_weights_makes_logprobs_match_the_new_model(tiny_model_dir, tiny_tokenizer):
    backend = TorchBackend.from_pretrained(tiny_model_dir)
    prompts = _prompts(tiny_tokenizer)[:2]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    before = backend.generate(prompts, params)
    other = build_tiny_model(TINY, tiny_tokenizer, seed=99).eval()
    backend.load_weights({f"module.{k}": v for k, v in other.state_dict().items()})  # a DDP-style prefix is fine
    after = backend.generate(prompts, params)
    assert [g.logprobs for g in before] != [g.logprobs for g in after]
    for prompt, gen in zip(prompts, after):
        assert torch.allclose(_reference_logprobs(other, prompt, gen.token_ids), torch.tensor(gen.logprobs), atol=1e-5)


def test_shared_prefixes_cluster_common_beginnings_and_leave_one_token_each():
    a, b, c = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9], [7, 8, 9]
    prefixes, source = shared_prefixes([a, c, b, a], min_shared=3)
    assert source[0] == source[2] == source[3] != source[1]
    assert prefixes[source[0]] == [1, 2, 3, 4] and prefixes[source[1]] == [7, 8]
    prefixes, source = shared_prefixes([a, b], min_shared=5)  # 4 shared tokens: not worth it
    assert len(prefixes) == 2 and prefixes[source[0]] == a[:-1] and prefixes[source[1]] == b[:-1]


def test_chunked_right_padded_prefill_equals_one_prompt_at_a_time(tiny_model_dir, tiny_tokenizer):
    """Prompts of different lengths prefilled together (right-padded, no mask) give the tokens and
    log-probs of HF generate on each prompt alone, whatever the chunk size; equal lengths decode
    without a mask."""
    model = load_model(tiny_model_dir)
    stops = tuple(stop_token_ids(tiny_tokenizer))
    texts = TEXTS + ["Inventory: [oak planks] (4)", "Goal: craft stick.", "craft 1 crafting table using 4 oak planks"]
    prompts = [tiny_tokenizer(t)["input_ids"] for t in texts]
    assert len({len(p) for p in prompts}) > 3
    greedy = SamplingParams(max_tokens=7, temperature=0.0, stop_token_ids=stops)
    reference = [model.generate(torch.tensor([p]), max_new_tokens=7, do_sample=False, eos_token_id=list(stops),
                                pad_token_id=tiny_tokenizer.pad_token_id)[0, len(p):].tolist() for p in prompts]
    for chunk in (1, 40, 10_000):
        backend = TorchBackend(model, tiny_tokenizer, share_prefixes=False, prefill_chunk_tokens=chunk)
        out = backend.generate(prompts, greedy)
        assert [g.token_ids for g in out] == reference, chunk
        for prompt, gen in zip(prompts, out):
            assert torch.allclose(_reference_logprobs(model, prompt, gen.token_ids), torch.tensor(gen.logprobs),
                                  atol=1e-5)
        passes = backend.stats()["forward_passes"] - (max(len(r) for r in reference) - 1)
        assert passes == {1: len(prompts), 10_000: 1}.get(chunk, passes)  # one prefill pass per chunk
    same = [prompts[0][:6], prompts[1][:6], prompts[3][:6]]  # one length: no padding, no mask
    out = TorchBackend(model, tiny_tokenizer, share_prefixes=False).generate(same, greedy)
    for prompt, gen in zip(same, out):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=7, do_sample=False, eos_token_id=list(stops),
                             pad_token_id=tiny_tokenizer.pad_token_id)[0, len(prompt):].tolist()
        assert gen.token_ids == ref


def test_length_chunks_respect_the_padded_budget():
    lengths = [5, 9, 3, 9, 20, 4]
    order = sorted(range(6), key=lambda i: lengths[i])
    chunks = length_chunks(order, lengths, 20)
    assert [i for c in chunks for i in c] == order
    assert all(len(c) == 1 or len(c) * max(lengths[i] for i in c) <= 20 for c in chunks)
    assert chunks == [[2, 5, 0], [1, 3], [4]]


def test_draw_from_samples_the_distribution_and_never_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0]]).repeat(20_000, 1)
    generator = torch.Generator().manual_seed(0)
    drawn = draw_from(probs, generator)
    counts = torch.bincount(drawn, minlength=6).float() / len(drawn)
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts, probs[0], atol=0.015)
    again = draw_from(probs, torch.Generator().manual_seed(0))
    assert torch.equal(drawn, again)
    # the largest uniform number still lands on a token with mass (not past the last one)
    edge = torch.tensor([[0.25, 0.75, 0.0, 0.0]])
    assert draw_from(edge * 1e-30, torch.Generator().manual_seed(1)).item() in (0, 1)


def test_preallocated_cache_layer_writes_in_place_grows_and_reorders():
    keys = torch.zeros(2, 1, 4, 3)
    layer = PreallocatedLayer(keys.clone(), keys.clone(), length=2)
    assert layer.get_seq_length() == 2 and layer.keys.shape == (2, 1, 2, 3)
    new = torch.ones(2, 1, 1, 3)
    k, v = layer.update(new, 2 * new)
    assert k.shape == (2, 1, 3, 3) and torch.equal(k[:, :, 2], new[:, :, 0]) and torch.equal(v[:, :, 2], 2 * new[:, :, 0])
    k, _ = layer.update(3 * torch.ones(2, 1, 3, 3), torch.ones(2, 1, 3, 3))  # past the buffer: grows
    assert k.shape == (2, 1, 6, 3) and torch.equal(k[:, :, 3:], 3 * torch.ones(2, 1, 3, 3))
    assert torch.equal(k[:, :, 2], new[:, :, 0])
    marked = layer.keys.clone()
    marked[1] += 5
    layer._k[:, :, :6] = marked
    layer.reorder_cache(torch.tensor([1]))
    assert layer.keys.shape == (1, 1, 6, 3) and torch.equal(layer.keys[0], marked[1])


def test_shared_prefix_with_remainders_of_different_lengths_equals_hf(tiny_model_dir, tiny_tokenizer):
    """Later steps of a group: a shared beginning, then remainders of several tokens and different
    lengths, right-padded on top of the prefix's cache."""
    model = load_model(tiny_model_dir)
    common = tiny_tokenizer(TEXTS[0])["input_ids"]
    tails = [tiny_tokenizer(t)["input_ids"] for t in (" Inventory: [oak planks] (4)", " Got 1 oak logs and more")]
    prompts = [common + tails[0], common + tails[1], common + tails[1][:3]]
    assert len({len(p) for p in prompts}) == 3 and min(len(t) for t in tails) > 3
    backend = TorchBackend(model, tiny_tokenizer, min_shared_tokens=4)
    out = backend.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    assert backend.stats()["prefill_tokens_saved"] >= 2 * len(common)  # the beginning ran once
    for prompt, gen in zip(prompts, out):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                             pad_token_id=tiny_tokenizer.pad_token_id)[0, len(prompt):].tolist()
        assert gen.token_ids == ref
        assert torch.allclose(_reference_logprobs(model, prompt, gen.token_ids), torch.tensor(gen.logprobs), atol=1e-5)


def _reference_hidden(model, prompt, index):
    with torch.no_grad():
        return model(torch.tensor([prompt]), output_hidden_states=True).hidden_states[index][0, -1].float()


def test_recorded_hidden_states_equal_hf_hidden_states_at_each_prompts_last_token(tiny_model_dir, tiny_tokenizer):
    """Shared-prefix clusters, right-padded chunks of different lengths, the embedding layer and
    the final norm: every prompt's recorded state is HF's hidden_states[index] at its last token."""
    model = load_model(tiny_model_dir)
    common = tiny_tokenizer(TEXTS[0])["input_ids"]
    alone = [tiny_tokenizer(t)["input_ids"] for t in TEXTS[1:] + ["Inventory: [oak planks] (4)"]]
    prompts = [common + alone[0], alone[1], common + alone[2][:3], alone[0], common]
    layers = model.config.num_hidden_layers
    for share, chunk in ((True, 1024), (False, 1), (False, 10_000)):
        backend = TorchBackend(model, tiny_tokenizer, share_prefixes=share, min_shared_tokens=4,
                               prefill_chunk_tokens=chunk)
        assert backend.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0))[0].hidden is None
        for index in (0, 1, -1, layers):
            assert backend.record_hidden(index)
            out = backend.generate(prompts, SamplingParams(max_tokens=3, temperature=0.7, seed=3))
            direct = backend.prompt_hidden(prompts)
            for row, (prompt, gen) in enumerate(zip(prompts, out)):
                expected = _reference_hidden(model, prompt, index)
                assert gen.hidden.shape == (model.config.hidden_size,) and gen.hidden.dtype == torch.float32
                assert torch.allclose(gen.hidden, expected, atol=1e-5), (share, chunk, index, row)
                assert torch.allclose(direct[row], expected, atol=1e-5)
        backend.record_hidden(None)
        assert backend.generate(prompts[:1], SamplingParams(max_tokens=2))[0].hidden is None
        assert backend.prompt_hidden(prompts) is None


def test_record_hidden_rejects_a_layer_the_model_does_not_have(tiny_model_dir):
    backend = TorchBackend.from_pretrained(tiny_model_dir)
    layers = backend.model.config.num_hidden_layers
    with pytest.raises(ValueError, match=rf"hidden-state layer {layers + 1} .*-{layers + 1}\.\.{layers}"):
        backend.record_hidden(layers + 1)
    assert backend.hidden_index is None


def test_weights_arriving_between_two_tokens_finish_the_response_on_the_new_model(tiny_model_dir, tiny_tokenizer):
    """The worker's hook loads new weights after the third token: the tokens before it are the old
    model's (version 0), the ones after are sampled from the new model over the whole prefix (the
    cache is rebuilt), each token's version recorded."""
    backend = TorchBackend.from_pretrained(tiny_model_dir)
    old, new = load_model(tiny_model_dir), build_tiny_model(TINY, tiny_tokenizer, seed=99).eval()
    calls = []

    def weights_between_tokens() -> int:
        calls.append(len(calls))
        if len(calls) == 3:        # the first call is at the start; the third after the second token
            backend.load_weights(new.state_dict())
        return 7 if len(calls) >= 3 else 0

    backend.weights_between_tokens = weights_between_tokens
    prompts = _prompts(tiny_tokenizer)
    out = backend.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0))
    assert backend.stats()["weight_switches"] == 1
    for prompt, gen in zip(prompts, out):
        assert gen.versions == [0, 0] + [7] * (len(gen.token_ids) - 2)
        assert torch.allclose(_reference_logprobs(old, prompt, gen.token_ids)[:2], torch.tensor(gen.logprobs[:2]),
                              atol=1e-5)
        reference = _reference_logprobs(new, prompt, gen.token_ids)[2:]
        assert torch.allclose(reference, torch.tensor(gen.logprobs[2:]), atol=1e-5)
        # greedy on the new model from the switch on
        continued = new.generate(torch.tensor([prompt + gen.token_ids[:2]]), max_new_tokens=6, do_sample=False,
                                 pad_token_id=tiny_tokenizer.pad_token_id)[0, len(prompt) + 2:].tolist()
        assert gen.token_ids[2:] == continued[:len(gen.token_ids) - 2]
    backend.weights_between_tokens = None
    assert all(g.versions is None for g in backend.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0)))
