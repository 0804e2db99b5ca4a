"""The BiPACE hidden state from a forward hook equals Hugging Face's hidden_states entry."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl.models.hidden_states import LastPromptCapture, hidden_state_module

LAYERS = 3


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=64)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("index", list(range(-(LAYERS + 1), LAYERS + 1)))
def test_every_hidden_state_index_matches_output_hidden_states(model, index):
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    positions = torch.tensor([2, 6, 4])
    with torch.no_grad():
        expected = model(input_ids=ids, output_hidden_states=True).hidden_states[index][torch.arange(3), positions]
        with LastPromptCapture(model, index, LAYERS, positions) as capture:
            model(input_ids=ids)
    assert capture.states.shape == (3, 32)
    assert torch.equal(capture.states, expected)


def test_the_hook_is_removed_and_peft_models_are_unwrapped(model):
    peft = pytest.importorskip("peft")
    before = dict(model.model.layers[1]._forward_hooks)      # Hugging Face installs its own recorders
    with LastPromptCapture(model, -2, LAYERS, torch.tensor([0])):
        assert len(model.model.layers[1]._forward_hooks) == len(before) + 1
    assert dict(model.model.layers[1]._forward_hooks) == before
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert hidden_state_module(wrapped, -2, LAYERS) is wrapped.get_base_model().model.layers[1]
    assert hidden_state_module(wrapped, 0, LAYERS) is wrapped.get_base_model().model.embed_tokens
    assert hidden_state_module(wrapped, -1, LAYERS) is wrapped.get_base_model().model.norm
