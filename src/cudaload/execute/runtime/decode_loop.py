"""The decode loop of a compiled plan: transformers' own sampling loop with the stop decision read one step late
(issue 35).

Why: transformers' ``_sample`` decides whether to stop with ``bool(unfinished_sequences.max() == 0)`` after every
token (5.17 generation/utils.py:380-383, ``StopCheck``), so the host waits for the GPU each step and the GPU then
waits while Python prepares the next step (the inputs, dynamo's guards, the CUDA-graph replay). With a compiled
step that gap is a quarter of a token's time on the H200 (~2 ms of host against 5.5 ms of GPU work, measured:
benchmarks/results/2026-12-03-h200/README.md). transformers already has the cure, ``DeferredStopCheck`` (5.17 generation/utils.py:390-479: copy the flag
asynchronously, read it one step later, undo the one extra step where a sequence stopped early), but switches it
on for ``mps`` only (``is_supported``, :435-437: "we should enable it for cuda if we observe perf gains").
The gain holds for cudaload's compiled plans (same README), so their ``generate()`` runs it.

How, without patching transformers: ``generate(custom_generate=callable)`` is transformers' public hook for a
decoding loop ("generate will perform the usual input preparation steps, then call the provided callable";
5.17 generation/utils.py:2472-2481, :2611-2612, :2802-2810). :func:`late_stop_sample` is that callable: the loop
of ``GenerationMixin._sample`` (5.17 generation/utils.py:2917-3131; 5.22 and 5.24 differ only in the cache's
name) for the calls where reading the stop late changes nothing that is returned; every other call goes to
the model class's ``_sample`` itself (:func:`late_stop_refusal` says why). :func:`install` gives one model a
``generate`` that passes it, for greedy and sampling calls only (:func:`_sampling_call`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError

if TYPE_CHECKING:
    import torch


def late_stop_refusal(
    model: Any,
    input_ids: torch.Tensor,
    generation_config: Any,
    synced_gpus: bool,
    model_kwargs: dict[str, Any],
) -> str | None:
    """Why this call keeps transformers' loop (None: the late stop applies).

    The late stop runs one decode step past an EOS before it sees it, and undoes it in the returned ids; it keeps
    transformers' loop wherever that step would leave a trace or the call needs more than ids:
    ``return_dict_in_generate`` (scores, logits, attentions or the cache handed back: transformers undoes those
    with a croppable cache only), a cache the caller passed in (it outlives the call), ``synced_gpus`` (every
    rank must step together), an encoder-decoder or an assistant model (transformers' own exclusions,
    ``DeferredStopCheck.is_supported``), and a prompt on a device without events to wait on (the CPU)."""
    if synced_gpus:
        return "synced_gpus: every rank steps together"
    if getattr(generation_config, "return_dict_in_generate", False):
        return "return_dict_in_generate: the scores, logits or cache handed back would carry the extra step"
    if getattr(generation_config, "is_assistant", False):
        return "an assistant model's calls"
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return "an encoder-decoder model"
    if any(getattr(v, "_is_user_defined", False) for v in model_kwargs.values()):
        return "a cache passed by the caller outlives the call"
    if getattr(input_ids.device, "type", None) != "cuda":
        return f"{input_ids.device.type}: the host waits for nothing there"
    return None


class LateStop:
    """Whether to stop, read one step late: transformers' ``DeferredStopCheck`` (5.17 generation/utils.py:390-479)
    for a cache that is never returned (so nothing to crop) and no streamer, on CUDA or, for tests, on the CPU
    (where copies are synchronous and there is no event: the same decisions, nothing overlapped).

    Each step copies "every sequence has stopped" into one of two pinned host slots, records an event on the
    input device's stream (the copy's: with the model on ``cuda:1`` and ``cuda:0`` current, an event recorded
    on the current device's stream would not order it), and then reads the *other* slot: the previous step's,
    whose copy is done or nearly. ``finish()`` says how many steps to undo (1 where a stop was seen late, 0 where
    the length limit ended the loop: that one is known on the host, never late)."""

    def __init__(self, input_ids: torch.Tensor, max_length: int | None):
        import torch

        self.max_length = max_length
        device = input_ids.device
        cuda = device.type == "cuda"
        self.stream = torch.cuda.current_stream(device) if cuda else None
        self.slots = deque(
            (
                torch.zeros((), dtype=torch.bool, pin_memory=cuda),
                torch.cuda.Event(blocking=True) if cuda else None,
            )
            for _ in range(2)
        )
        self.first = True
        self.stop_seen = False

    def __call__(self, unfinished_sequences: torch.Tensor, length: int) -> bool:
        flag, done = self.slots[0]
        flag.copy_(unfinished_sequences.max() == 0, non_blocking=True)
        if done is not None:
            done.record(self.stream)
        self.slots.rotate()
        flag_before, done_before = self.slots[0]
        if done_before is not None:
            done_before.synchronize()
        if not self.first:
            self.stop_seen = bool(flag_before)
        self.first = False
        return self.stop_seen or (self.max_length is not None and length >= self.max_length)

    def finish(self) -> int:
        for _, done in self.slots:
            if done is not None:
                done.synchronize()
        return 1 if self.stop_seen else 0


def late_stop_sample(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    streamer: Any = None,
    **model_kwargs: Any,
) -> Any:
    """A ``custom_generate`` callable: ``GenerationMixin._sample`` with the stop read one step late
    (:class:`LateStop`) where :func:`late_stop_refusal` allows it and no streamer is given, else the model
    class's ``_sample`` itself.
    Returns the generated ids, as ``_sample`` does without ``return_dict_in_generate``.

    A call that transformers' final generation config makes a beam or assisted search (a mode :func:`install`'s
    pre-check could not see) goes to that mode's own method with the same, already prepared, arguments."""
    return _sample_or_mode(
        None,
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus,
        streamer,
        model_kwargs,
    )


def graphed_sample(step: Callable[..., Any]) -> Callable[..., Any]:
    """A ``custom_generate`` callable like :func:`late_stop_sample` whose decode steps run ``step(**inputs)``
    (:meth:`cudaload.execute.runtime.graphed_step.DecodeGraphs.step`: the step as a CUDA graph) instead of the
    model's call; the prefill stays eager."""

    def sample(
        model: Any,
        input_ids: torch.Tensor,
        logits_processor: Any,
        stopping_criteria: Any,
        generation_config: Any,
        synced_gpus: bool = False,
        streamer: Any = None,
        **model_kwargs: Any,
    ) -> Any:
        return _sample_or_mode(
            step,
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus,
            streamer,
            model_kwargs,
        )

    return sample


def _sample_or_mode(
    step: Callable[..., Any] | None,
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool,
    streamer: Any,
    model_kwargs: dict[str, Any],
) -> Any:
    from transformers.generation.utils import GENERATION_MODES_MAPPING

    name = GENERATION_MODES_MAPPING[
        generation_config.get_generation_mode(model_kwargs.get("assistant_model"))
    ]
    if name == "_sample":
        refused = late_stop_refusal(model, input_ids, generation_config, synced_gpus, model_kwargs)
        if refused is None and streamer is None:  # a streamer needs each token on the host: that same wait
            return _loop(
                model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs, step
            )
    # transformers' own loop for this mode: the class's method, as generate() takes it (5.17
    # generation/utils.py:2615)
    method = getattr(type(model), name, None)
    if method is None:  # a mode transformers moved to a Hub repo: generate() loads it only without ours
        raise ConfigurationError(
            f"cudaload's decode loop serves greedy and sampling calls; this call's mode lives in {name}",
            fix="pass custom_generate=" + repr(name) + " with trust_remote_code=True to generate()",
        )
    return method(
        model,
        input_ids,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        generation_config=generation_config,
        synced_gpus=synced_gpus,
        **({"streamer": streamer} if streamer is not None else {}),
        **model_kwargs,
    )


def _loop(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    model_kwargs: dict[str, Any],
    step: Callable[..., Any] | None = None,
) -> Any:
    """The body of ``GenerationMixin._sample`` (5.17 generation/utils.py:2961-3105) without the outputs that
    ``return_dict_in_generate`` collects and without a streamer, with :class:`LateStop` as its stop check.

    The step after a stop runs and is undone: its ids are dropped, and when sampling the random state is put back
    to before its draw, so that the next seeded call samples what it would have after transformers' loop. What
    it cannot undo: the logits processors and stopping criteria see that step (one call more than in
    transformers' loop; :func:`install` keeps transformers' loop for calls that pass their own)."""
    import torch

    pad_token_id = generation_config._pad_token_tensor
    has_eos_stopping_criteria = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    do_sample = generation_config.do_sample
    unfinished_sequences = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    if pad_token_id is not None:
        pad_token_id = pad_token_id.to(input_ids.device)
    if (
        step is not None
    ):  # the graphed decode: the eager step captured (cudaload.execute.runtime.graphed_step)
        model_forward = step
    elif model._valid_auto_compile_criteria(model_kwargs, generation_config):
        model_forward = model.get_compiled_call(generation_config.compile_config)
    else:
        model_forward = model.__call__
    outputs = model._prefill(input_ids, generation_config, model_kwargs, is_first_iteration=True)
    stop_check = LateStop(input_ids, stopping_criteria.max_length)
    device = input_ids.device
    before_draw = None  # the random state before the last step's draw (sampling only)
    prefill_consumed = False
    stop = False
    with model._optimize_model_for_decode():
        while not stop:
            if prefill_consumed:
                model_inputs = model.prepare_inputs_for_generation(
                    input_ids,
                    next_sequence_length=1 if model_kwargs["use_cache"] else None,
                    **model_kwargs,
                )
                outputs = model_forward(**model_inputs, return_dict=True)
            prefill_consumed = True
            model_kwargs = model._update_model_kwargs_for_generation(
                outputs, model_kwargs, is_encoder_decoder=False
            )
            # a copy, so that the graph's (or the prefill's large) logits are not kept alive (as _sample does)
            logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=input_ids.device)
            scores = logits_processor(input_ids, logits)
            if do_sample:
                before_draw = _random_state(device)
                probs = torch.nn.functional.softmax(scores, dim=-1)
                next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
            else:
                next_tokens = torch.argmax(scores, dim=-1)
            if has_eos_stopping_criteria:
                next_tokens = next_tokens * unfinished_sequences + pad_token_id * (1 - unfinished_sequences)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            unfinished_sequences = unfinished_sequences & ~stopping_criteria(input_ids, None)
            stop = stop_check(unfinished_sequences, input_ids.shape[1])
            del outputs
    if stop_check.finish():
        input_ids = input_ids[..., :-1]
        if do_sample:
            _random_state(device, before_draw)
    return input_ids


def _random_state(device: Any, state: Any = None) -> Any:
    """Read (``state`` None) or put back the random state ``torch.multinomial`` draws from on ``device``: the
    device's default generator (generate() takes no generator). CUDA's is a seed and an offset kept on the host:
    no wait for the device."""
    import torch

    cuda = device.type == "cuda"
    if state is None:
        return torch.cuda.get_rng_state(device) if cuda else torch.get_rng_state()
    if cuda:
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)
    return state


#: generate() keywords whose call keeps transformers' loop: a tokenizer (transformers does not hand it to a
#: ``custom_generate`` callable, 5.17 generation/utils.py:2373-2391, so ``stop_strings`` and token healing would
#: fail), and the caller's own processors or criteria (they would see the late stop's extra step)
_KEEP_TRANSFORMERS_LOOP = (
    "tokenizer",
    "assistant_tokenizer",
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "streamer",
    "synced_gpus",
    "assistant_model",
    "custom_generate",
)


def _sampling_call(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``generate(*args, **kwargs)`` should get :func:`late_stop_sample` (:func:`call_refusal` finds no
    reason against it)."""
    return call_refusal(model, args, kwargs)[0] is None


def call_refusal(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str | None, Any]:
    """Why ``generate(*args, **kwargs)`` keeps transformers' ``generate()`` untouched (None: it is a greedy or
    sampling call, the modes ``_sample`` serves), and the call's generation config merged as transformers merges
    it (the one passed, its unset fields from the model's, then the call's keywords: 5.17
    generation/utils.py:1927-1940; None where it was not built). :func:`late_stop_sample` checks transformers'
    result again.

    Kept on transformers' ``generate()`` untouched: a positional argument past ``inputs``; any keyword of
    :data:`_KEEP_TRANSFORMERS_LOOP` given (a ``streamer`` or ``synced_gpus`` too: transformers hands neither to a
    ``custom_generate`` callable, 5.17 generation/utils.py:2387-2391 replaces those keywords with the callable's
    own); ``stop_strings`` or ``token_healing`` in the config (they need the tokenizer); a process of a
    multi-rank job (``synced_gpus`` is then decided inside generate()); beams, assisted and the other modes."""
    if len(args) > 1:
        return "a positional argument past inputs", None
    given = [k for k in _KEEP_TRANSFORMERS_LOOP if kwargs.get(k) is not None]
    if given:
        return f"{given[0]}= given", None
    if "custom_generate" in kwargs:  # custom_generate=None: the caller asks for transformers' own loop
        return "custom_generate= given", None
    import torch

    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return "a process of a multi-rank job", None
    import copy

    from transformers.generation.configuration_utils import GenerationMode

    own = getattr(model, "generation_config", None)
    passed = kwargs.get("generation_config")
    base = passed if passed is not None else own
    if base is None:
        return "no generation config", None
    gc = copy.deepcopy(base)
    if passed is not None and own is not None:
        gc.update(**own.to_dict(), defaults_only=True)
    gc.update(**{k: v for k, v in kwargs.items() if k != "generation_config"})
    if getattr(gc, "stop_strings", None) or getattr(gc, "token_healing", False):
        return "stop strings or token healing (they need the tokenizer)", gc
    try:
        mode = gc.get_generation_mode(None)
    except Exception:  # an invalid combination: transformers' generate() raises its own error for it
        return "an invalid generation config (transformers says why)", gc
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        return f"{getattr(mode, 'value', mode)}: not a greedy or sampling call", gc
    return None, gc


def _generate(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``generate()`` of a model :func:`install` gave the late stop to (bound to it with ``functools.partial``:
    ``copy.deepcopy`` of the model binds the copy's, and pickle stores a reference to this function)."""
    if _sampling_call(self, args, kwargs):
        kwargs["custom_generate"] = late_stop_sample
    return type(self).generate(self, *args, **kwargs)


def install_refusal(model: Any) -> str | None:
    """Why ``model`` keeps transformers' ``generate()`` as it is (None: :func:`install` may give it the late stop):
    not on CUDA (the host waits for nothing elsewhere), an encoder-decoder model (transformers' own exclusion),
    a model class with its own ``generate`` or ``_sample`` (audio and omni models: ours would bypass theirs), or a
    ``generate`` already set on the instance (a checkpoint's ``custom_generate``, 5.17
    generation/utils.py:568-573)."""
    from transformers.generation.utils import GenerationMixin

    device = getattr(model, "device", None)
    if getattr(device, "type", None) != "cuda":
        return (
            f"the model is on {getattr(device, 'type', device)}, not CUDA: the host waits for nothing there"
        )
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return "an encoder-decoder model"
    cls = type(model)
    if getattr(cls, "generate", None) is not GenerationMixin.generate:
        return f"{cls.__name__} has its own generate()"
    if getattr(cls, "_sample", None) is not GenerationMixin._sample:
        return f"{cls.__name__} has its own _sample()"
    if "generate" in vars(model) and not installed(model):
        return "the model already has its own generate (a checkpoint's custom_generate)"
    return None


def install(model: Any) -> str | None:
    """Give ``model`` a ``generate`` that passes :func:`late_stop_sample` as ``custom_generate`` to its class's
    ``generate()`` for greedy and sampling calls (the instance-attribute route transformers takes for a
    checkpoint's own ``custom_generate``, 5.17 generation/utils.py:568-573). Every keyword still reaches
    transformers; :func:`uninstall` removes it. Returns None, or why not (:func:`install_refusal`)."""
    import functools

    why = install_refusal(model)
    if why is None and not installed(model):
        model.generate = functools.partial(_generate, model)
    return why


def installed(model: Any) -> bool:
    """Whether :func:`install` gave ``model`` its ``generate``."""
    own = vars(model).get("generate") if hasattr(model, "__dict__") else None
    return getattr(own, "func", None) is _generate


def uninstall(model: Any) -> None:
    if installed(model):
        del model.generate
