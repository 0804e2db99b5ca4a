"""The generation back end interface: token ids in, sampled token ids and their log-probs out; and
what each back end declares about itself before an engine exists.

Every back end implements two calls::

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
estimator asks for with ``RowInputs.hidden_layer``), taken from the prefill the back end runs
anyway, and ``prompt_hidden(prompts)``
gives the same state for prompts it does not answer (expert-guided steps). A back end that cannot
(vLLM) returns False and the learner's log-prob pass computes the states instead.

**Declarations.** The placement plan, the trainer, the training-mode checks and the rollout workers
never name a back end: they ask the class that ``rollout.backend`` selects
(:mod:`agentrl.generation.registry`) through these class attributes and classmethods, each of which
has a default that fits a back end on one device that never sleeps:

==============================  ==================================================================
``name``, ``title``             ``rollout.backend=<name>``; how ``agentrl plan`` names its engines
``Settings``                    a dataclass of its settings (fields made with :func:`setting`): a
                                built-in back end's are the config section ``rollout.<name>``, one
                                loaded by import path reads ``rollout.backend_params``
``build(...)``                  an engine over a model directory, with those settings
``auto_preference(device)``     how much ``rollout.backend=auto`` wants it on ``device`` (0: never;
                                the installed back end with the highest number wins)
``installed()``                 whether it can be built here (its packages import)
``engine_gpus(settings)``       GPUs one engine takes (``engine_gpus_setting`` names the field that
                                sets it, for messages)
``can_sleep``,                  whether ``sleep()`` frees its accelerator memory, and whether these
``sleeps(settings)``            settings make it (``sleep_setting`` names the field; its default is off)
``memory(settings, inputs)``    its :class:`EngineMemory` on each of its GPUs for the placement plan
``memory_problem(...)``         why that estimate cannot start, with the fix (None: it can)
``memory_fixes(settings)``      how it can take less of a GPU it shares with a learner rank
``weight_paths``                the weight paths it receives (names of ``rollout.weight_sync``; None: all)
==============================  ==================================================================
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

from agentrl.models.shapes import ModelShape
from agentrl.weights import device_uuid, open_ipc_handles, pick_handle_set

GB = 1e9


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


def setting(default: Any = None, help: str = "", *, factory: Any = None, **checks: Any) -> Any:
    """A field of a back end's ``Settings``: default (or ``factory``), one line of help, checks (``choices``,
    ``min``/``max`` inclusive, ``gt`` exclusive): the config's field metadata, so the section is
    generated, checked and documented like every other (``agentrl config --keys``)."""
    meta = {"help": help, **checks}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class MemoryInputs:
    """What the placement plan knows when it asks a back end for its memory: the model's shape, the
    bytes of one weight on a GPU (2 in bf16, 4 in fp32), one GPU's memory (GB of 10^9 bytes) and the
    longest sequence a rollout runs (prompt + response bounds)."""

    shape: ModelShape
    bytes_per_weight: int
    gpu_memory_gb: float
    max_model_len: int

    @property
    def weight_bytes(self) -> int:
        """The whole model's weights on a GPU, bytes."""
        return self.bytes_per_weight * self.shape.parameters()


@dataclass(frozen=True)
class EngineMemory:
    """What one engine takes of each of its GPUs, GB (10^9 bytes): the placement plan's estimate."""

    budget: float               # what it takes while awake
    weights: float              # its share of the weights (part of the budget)
    asleep: float               # what it keeps while asleep (the budget when it never sleeps)
    backend: str                # the back end's name
    engine: str = ""            # how a GPU's estimate names it ("vLLM", "torch engine")
    text: str = ""              # how the budget adds up, one line of `agentrl plan`

    @property
    def kv_cache(self) -> float:
        """The budget beyond the weights (KV cache, activations, graphs)."""
        return self.budget - self.weights


class GenerationBackend(abc.ABC):
    """A model that generates for a batch of token-id prompts, and the declarations of its kind (module
    docstring)."""

    name: str = "backend"
    title: str = ""
    #: the back end's settings (a dataclass whose fields have defaults); None: it has none
    Settings: ClassVar[type | None] = None
    #: the field of Settings that sets :meth:`engine_gpus` (named in the placement plan's messages)
    engine_gpus_setting: ClassVar[str | None] = None
    #: whether :meth:`sleep` can free its accelerator memory; ``sleep_setting`` is the field of Settings
    #: that turns it on (its default leaves it off)
    can_sleep: ClassVar[bool] = False
    sleep_setting: ClassVar[str | None] = None
    #: the weight paths it can receive (``rollout.weight_sync`` names: packed, ipc, broadcast, or a path's
    #: import path); None: all. ``auto`` chooses among them (agentrl.weights.choose_path)
    weight_paths: ClassVar[tuple[str, ...] | None] = None
    #: whether :meth:`generate_each` samples each prompt of one call with settings of its own (vLLM);
    #: the gateway then batches requests that sample differently into one call
    per_request_sampling: bool = False
    #: whether :attr:`weights_between_tokens` is called (a backend that decodes token by token here)
    loads_weights_between_tokens: bool = False
    #: set by the rollout worker: called between two decode steps of a generate call, it loads weights
    #: that arrived meanwhile and returns the policy version the model now runs (``Generation.versions``)
    weights_between_tokens: Callable[[], int] | None = None

    # ----- declarations (read before an engine exists) -------------------------------------------
    @classmethod
    def build(cls, model_dir: str, settings: Any, *, device: str, dtype: torch.dtype, max_model_len: int,
              seed: int) -> "GenerationBackend":
        """An engine over the Hugging Face model directory ``model_dir`` with ``settings`` (an instance of
        :attr:`Settings`, or None), on ``device``, in ``dtype``, for sequences up to ``max_model_len``
        tokens, seeded with ``seed``."""
        raise NotImplementedError(f"the {cls.name} back end declares no build(): it cannot be named in "
                                  "rollout.backend")

    @classmethod
    def auto_preference(cls, device: str) -> int:
        """How much ``rollout.backend=auto`` wants this back end on ``device`` (``cpu``, ``cuda``, ``cuda:1``):
        0 never; among the installed built-in back ends the highest number wins."""
        return 0

    @classmethod
    def installed(cls) -> bool:
        """Whether this back end can be built in this interpreter (its optional packages import)."""
        return True

    @classmethod
    def engine_gpus(cls, settings: Any) -> int:
        """GPUs one engine takes on a GPU machine (all on one node): the rollout worker's Ray request
        and the placement plan's bundle."""
        return int(getattr(settings, cls.engine_gpus_setting)) if cls.engine_gpus_setting else 1

    @classmethod
    def sleeps(cls, settings: Any) -> bool:
        """Whether an engine with ``settings`` frees its GPU memory between a rollout and the next weight
        load (the colocated layout's learner phase); never without :attr:`can_sleep`."""
        if not (cls.can_sleep and cls.sleep_setting):
            return False
        return bool(getattr(settings, cls.sleep_setting))

    @classmethod
    def memory(cls, settings: Any, inputs: MemoryInputs) -> EngineMemory:
        """One engine GPU's memory for the placement plan. By default: the whole model, nothing more
        (a back end that keeps a KV cache or activations on the GPU declares its own estimate)."""
        weights = inputs.weight_bytes / cls.engine_gpus(settings) / GB
        return EngineMemory(budget=weights, weights=weights, asleep=weights, backend=cls.name,
                            engine=f"{cls.title or cls.name} engine",
                            text=f"{cls.title or cls.name}: weights {weights:.1f} (no estimate beyond them)")

    @classmethod
    def memory_problem(cls, memory: EngineMemory, settings: Any, inputs: MemoryInputs) -> tuple[str, str] | None:
        """Why an engine of this estimate cannot start, and the fix (the placement plan refuses with
        both in one line); None when it can."""
        return None

    @classmethod
    def memory_fixes(cls, settings: Any) -> tuple[str, ...]:
        """Settings that make the engine take less of a GPU it shares with a learner rank (the colocated
        layout's refusal lists them before the learner's own)."""
        return ()

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
