"""The generation backend interface: token ids in, sampled token ids and their log-probs out.

Every backend implements two calls::

    generate(prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Generation]
    load_weights(state_dict: dict[str, Tensor]) -> None

``Generation.token_ids`` are the sampled response tokens, including the stop token when the
response ended on one; ``Generation.logprobs`` holds one log-probability per sampled token.
Log-probs are those of the distribution the token was sampled from *before* top-k/top-p
filtering: ``log_softmax(logits / temperature)`` (``temperature = 0`` and ``1`` both mean the raw
logits). This is what verl records and what the learner recomputes (it divides its logits by the
same temperature), so the importance ratio starts at exactly 1 up to numerics.

Hidden states (optional): after ``record_hidden(index)`` returns True, every ``Generation`` also
carries ``hidden``, the model's ``hidden_states[index]`` at the prompt's last token (the state an
estimator asks for with ``RowInputs.hidden_layer``), taken from the prefill the backend runs
anyway, and ``prompt_hidden(prompts)``
gives the same state for prompts it does not answer (expert-guided steps). A backend that cannot
(vLLM) returns False and the learner's log-prob pass computes the states instead.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of responses."""

    max_tokens: int = 64
    temperature: float = 1.0          # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1                   # -1 = off
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def with_seed(self, seed: int) -> "SamplingParams":
        return replace(self, seed=int(seed))


@dataclass
class Generation:
    """One sampled response."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "length"     # "stop" (stop token or stop string) or "length"
    text: str | None = field(default=None, repr=False)
    hidden: torch.Tensor | None = field(default=None, repr=False)   # float32 [d], see record_hidden
    # the policy version that sampled each token, from a backend that loads weights between tokens
    # (GenerationBackend.weights_between_tokens); None when it did not ask
    versions: list[int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.logprobs)} log-probs")
        if self.versions is not None and len(self.versions) != len(self.token_ids):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.versions)} versions")


class GenerationBackend(abc.ABC):
    """A model that generates for a batch of token-id prompts."""

    name: str = "backend"
    #: whether :meth:`generate_each` samples each prompt of one call with settings of its own (vLLM);
    #: the gateway then batches requests that sample differently into one call
    per_request_sampling: bool = False
    #: whether :attr:`weights_between_tokens` is called (a backend that decodes token by token here)
    loads_weights_between_tokens: bool = False
    #: set by the rollout worker: called between two decode steps of a generate call, it loads weights
    #: that arrived meanwhile and returns the policy version the model now runs (``Generation.versions``)
    weights_between_tokens: Callable[[], int] | None = None

    @abc.abstractmethod
    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        """One response per prompt, in prompt order; deterministic for ``sampling.seed``."""

    def generate_each(self, prompt_ids: Sequence[Sequence[int]], samplings: Sequence[SamplingParams]
                      ) -> list[Generation]:
        """One call in which prompt ``i`` samples with ``samplings[i]`` (its seed as given, so a request
        that names a seed gets the same tokens whatever else is in the call); only where
        :attr:`per_request_sampling`."""
        raise NotImplementedError(f"the {self.name} backend samples one setting per call: use generate()")

    @abc.abstractmethod
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace the model's weights in place (names as in the Hugging Face ``state_dict``)."""

    def load_weights_ipc(self, handle_sets: Sequence) -> None:
        """Load weights that stay on the learner's GPUs (:class:`~agentrl.weights.ipc.IpcWeights`, one
        set per learner GPU): the set on this process's GPU, copied device to device; the copies are done
        when this returns (the learner may reuse the memory behind the handles after)."""
        from agentrl.weights import device_uuid, open_ipc_handles, pick_handle_set

        visible = [device_uuid(i) for i in range(torch.cuda.device_count())]
        state = open_ipc_handles(pick_handle_set(handle_sets, device_uuid(), visible))
        self.load_weights(state)
        torch.cuda.synchronize()
        del state

    def record_hidden(self, index: int | None) -> bool:
        """Record ``hidden_states[index]`` at each prompt's last token in ``Generation.hidden``
        (``None`` stops recording). False when this backend cannot; then nothing is recorded."""
        return False

    def prompt_hidden(self, prompt_ids: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """float32 ``[len(prompt_ids), d]``: the recorded hidden state of prompts that are not
        answered (None when :meth:`record_hidden` is off or unsupported)."""
        return None

    def sleep(self) -> float:
        """Free accelerator memory until the next :meth:`load_weights` (the learner's passes run
        meanwhile); the seconds it took. Nothing by default."""
        return 0.0

    def wake_up(self) -> None:
        """Take back what :meth:`sleep` freed without loading new weights (nothing by default)."""

    def stats(self) -> dict[str, float]:
        """Counters since construction (tokens prefilled/generated, calls); backends may add more."""
        return {}

    def close(self) -> None:
        """Release the engine's resources (processes, memory)."""


__all__ = ["Generation", "GenerationBackend", "SamplingParams"]
