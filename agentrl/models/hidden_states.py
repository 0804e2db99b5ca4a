"""The hidden state an estimator asks for (``RowInputs.hidden_layer``), taken from inside the
actor's forward pass.

The layer index counts like Hugging Face's ``hidden_states`` tuple: 0 is the
embedding output, ``k`` (1..L-1) the output of decoder layer ``k``, ``L`` the last layer's output
after the final norm, negative values count from the end. Asking the model for
``output_hidden_states=True`` keeps all L+1 full ``[rows, tokens, hidden]`` tensors alive until
the forward ends (for a 7B model and a micro-batch of 8 x 2,048 tokens, about 3.4 GB in bf16).
:class:`LastPromptCapture` instead hooks the one module whose output is that entry and keeps only
the rows' last prompt positions, ``[rows, hidden]``, as the forward passes through it.

Both the learner's log-prob pass and the torch rollout backend's prefill use it: the rollout
records the state of every prompt it answers, so the estimator needs no learner pass over rows
the update does not train (:mod:`agentrl.training.trainer`).
"""

from __future__ import annotations

import torch


def check_hidden_index(index: int, num_layers: int) -> int:
    """``index`` if it names an entry of a ``num_layers``-layer model's ``hidden_states``, else a
    ValueError naming the valid range."""
    if not -(num_layers + 1) <= index <= num_layers:
        raise ValueError(f"hidden-state layer {index} (the estimator's hidden_layer) is outside the model's hidden states "
                         f"(-{num_layers + 1}..{num_layers}; 0 = embeddings, {num_layers} = last decoder layer)")
    return index


def hidden_state_module(model: torch.nn.Module, index: int, num_layers: int) -> torch.nn.Module:
    """The module whose forward output is ``hidden_states[index]`` of a Hugging Face decoder model."""
    if hasattr(model, "get_base_model"):        # a peft model
        model = model.get_base_model()
    decoder = model.get_decoder()
    k = index % (num_layers + 1)
    if k == 0:
        return decoder.embed_tokens
    if k == num_layers:
        return decoder.norm
    return decoder.layers[k - 1]


class LastPromptCapture:
    """Context manager: during the forward passes inside it, record ``hidden_states[index]`` at
    ``positions`` (one per row) of the model's input; read it from :attr:`states` afterwards."""

    def __init__(self, model: torch.nn.Module, index: int, num_layers: int, positions: torch.Tensor):
        self.module = hidden_state_module(model, index, num_layers)
        self.positions = positions
        self.states: torch.Tensor | None = None
        self._handle = None

    def _hook(self, module, inputs, output) -> None:
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        self.states = hidden[rows, self.positions.to(hidden.device)].detach()

    def __enter__(self) -> "LastPromptCapture":
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


__all__ = ["LastPromptCapture", "check_hidden_index", "hidden_state_module"]
