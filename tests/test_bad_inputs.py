"""Issue 41's catalogue of bad or doubtful inputs: each gets a typed error whose fix works when followed, or a
warning a caller sees (a :class:`~cudaload.errors.CudaloadWarning`, not only a ``plan.warnings`` entry).

Each test below is one item of the catalogue. A refusal is checked three ways: its class, the words its fix must
say, and the input the fix leads to, which must then pass. A warning is checked with ``pytest.warns``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import _env
from cudaload.capabilities import Capabilities
from cudaload.errors import (
    CheckpointError,
    ConfigurationError,
    CudaloadError,
    CudaloadWarning,
    DeviceSelectionError,
    DoesNotFitError,
    InvalidChoiceError,
)
from cudaload.request import Request

H100 = "H100"


def _folder(root: Path, name: str, kind: str = "qwen3", **changes: Any) -> Path:
    """A model folder holding only the tiny ``kind`` config (context 512), with ``changes`` written into it."""
    from cudaload.testing.models import tiny_config

    folder = root / name
    folder.mkdir()
    config = tiny_config(kind).to_dict()
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(_folder(tmp_path_factory.mktemp("bad"), "qwen3"))


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine without an NVIDIA driver, whatever the test machine has."""
    import cudaload.detection.nvml as nvml

    monkeypatch.setattr(nvml, "driver_absent", lambda: True)
    yield


@pytest.fixture
def a_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine with an NVIDIA driver (the request's cheap check), whatever the test machine has."""
    import cudaload.detection.nvml as nvml

    monkeypatch.setattr(nvml, "driver_absent", lambda: False)
    yield


def _cudaload_warnings(record: Any) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CudaloadWarning)]


def _quiet(call: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CudaloadWarning)
        return call()


# -- CUDA_VISIBLE_DEVICES selecting GPUs on a machine without one ----------------------------------------------


@pytest.mark.parametrize("cvd", ["0", "0,,1", "GPU-8f6e1c2a-1234-5678-9abc-def012345678"])
def test_cuda_visible_devices_on_a_machine_without_a_gpu_warns_once(
    cvd: str, qwen: str, no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    with pytest.warns(CudaloadWarning) as record:
        cudaload.plan(qwen)
    said = [t for t in _cudaload_warnings(record) if "CUDA_VISIBLE_DEVICES" in t]
    assert len(said) == 1, said
    assert "no NVIDIA GPU" in said[0] and "unset CUDA_VISIBLE_DEVICES" in said[0]


@pytest.mark.parametrize("cvd", ["", "-1"])
def test_cuda_visible_devices_hiding_every_gpu_says_nothing(
    cvd: str, qwen: str, no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaloadWarning)
        cudaload.plan(qwen)


def test_cuda_visible_devices_warns_at_load_model_too(
    tiny_model: Callable[[str], Path], no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.warns(CudaloadWarning) as record:
        model = cudaload.load_model(str(tiny_model("qwen3")), prefetch=False)
    assert str(next(model.parameters()).device) == "cpu"
    assert len([t for t in _cudaload_warnings(record) if "CUDA_VISIBLE_DEVICES" in t]) == 1


# -- fixes that named the wrong remedy -------------------------------------------------------------------------


@pytest.mark.parametrize("hardware,extra", [(H100, {}), (None, {"allow_offload": True})])
def test_an_absurd_seq_len_names_the_models_context(
    hardware: str | None, extra: dict[str, Any], qwen: str
) -> None:
    with pytest.raises(DoesNotFitError) as e:
        _quiet(lambda: cudaload.plan(qwen, hardware=hardware, seq_len=10**9, batch_size=1, **extra))
    assert "seq_len=512" in (e.value.fix or "") and "allow_offload" not in (e.value.fix or "")
    assert [(s.kind, s.value) for s in e.value.suggestions] == [("seq_len", 512)]  # type: ignore[attr-defined]
    p = cudaload.plan(qwen, hardware=hardware, seq_len=512, batch_size=1, **extra)
    assert p.seq_len == 512


def test_a_seq_len_past_the_context_that_fits_still_plans_with_a_warning(qwen: str) -> None:
    with pytest.warns(CudaloadWarning, match="max_position_embeddings 512"):
        p = cudaload.plan(qwen, hardware=H100, seq_len=4096, batch_size=1)
    assert p.seq_len == 4096


@pytest.mark.parametrize(
    "hardware,option",
    [
        (H100, {"device_map": "cuda:3"}),
        (H100, {"device_map": {"": 3}}),
        ("2xH100", {"max_memory": {3: "10GiB"}}),
    ],
    ids=["device_map cuda:3", "device_map dict", "max_memory 3"],
)
def test_a_gpu_index_the_profile_lacks_names_its_indices_and_the_profile_that_has_it(
    hardware: str, option: dict[str, Any], qwen: str
) -> None:
    with pytest.raises(DeviceSelectionError) as e:
        cudaload.plan(qwen, hardware=hardware, **option)
    fix = e.value.fix or ""
    assert "use cuda:0" in fix and "hardware='4xH100-SXM'" in fix, fix
    assert "CUDA_VISIBLE_DEVICES" not in fix and "cudaload env" not in fix
    cudaload.plan(qwen, hardware="4xH100-SXM", **option)


def test_a_gpu_index_this_machine_lacks_names_its_indices_and_the_variable_hiding_others(qwen: str) -> None:
    from dataclasses import replace

    from cudaload.capabilities import GPU
    from cudaload.request import check_devices

    gpu = GPU(0, "NVIDIA H100 80GB HBM3", (9, 0), 80 << 30, free_memory=79 << 30)
    here = replace(Capabilities(source="detected"), gpus=(gpu,))
    req = Request.build(qwen, device_map="cuda:1", env={"CUDA_VISIBLE_DEVICES": "2"})
    with pytest.raises(DeviceSelectionError) as e:
        check_devices(req, here)
    assert "use cuda:0" in (e.value.fix or "") and "CUDA_VISIBLE_DEVICES='2'" in (e.value.fix or "")
    check_devices(replace(req, device_map="cuda:0"), here)


@pytest.mark.parametrize(
    "option,need",
    [
        ({"intent": "qlora"}, ["bitsandbytes", "peft"]),
        ({"quantization": "nf4"}, ["bitsandbytes"]),
        ({"quantization": "int8"}, ["bitsandbytes"]),
    ],
    ids=["qlora", "nf4", "int8"],
)
def test_a_quantized_plan_on_a_profile_names_assume_installed(
    option: dict[str, Any], need: list[str], qwen: str
) -> None:
    with pytest.raises(InvalidChoiceError) as e:
        cudaload.plan(qwen, hardware=H100, **option)
    assert f"assume_installed={need!r}" in (e.value.fix or ""), e.value.fix
    p = cudaload.plan(qwen, hardware=H100, assume_installed=need, **option)
    assert p.quantization.choice == option.get("quantization", "nf4")


def test_a_quantized_plan_with_bitsandbytes_assumed_missing_keeps_its_own_refusal(qwen: str) -> None:
    with pytest.raises(InvalidChoiceError, match="bitsandbytes is not installed"):
        cudaload.plan(qwen, hardware=H100, quantization="int8", assume_missing=["bitsandbytes"])


@pytest.mark.parametrize(
    "max_memory,followed",
    [
        ({0: "10GiB", "cpu": "8GiB"}, {"cpu": "8GiB"}),
        ({"cuda:0": "1MiB"}, None),
    ],
    ids=["with a cpu entry", "gpu only"],
)
def test_max_memory_for_a_gpu_on_a_machine_without_one_has_a_fix_that_ends(
    max_memory: dict[Any, str], followed: dict[str, str] | None, qwen: str, no_gpu: None
) -> None:
    # placement's fix was "use the indices torch sees (cuda:0..)": followed, the same error again
    for hardware in (None, Capabilities(source="cpu")):
        with pytest.raises(DeviceSelectionError) as e, warnings.catch_warnings():
            warnings.simplefilter("ignore", CudaloadWarning)
            cudaload.plan(qwen, hardware=hardware, max_memory=max_memory)
        fix = e.value.fix or ""
        assert "cuda:0.." not in fix
        assert (f"max_memory={followed!r}" if followed else "leave max_memory out") in fix, fix
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CudaloadWarning)
            p = cudaload.plan(qwen, hardware=hardware, max_memory=followed)
        assert p.placement.device_map == "cpu"


@pytest.mark.parametrize("key", [0, "cuda:0"])
def test_a_max_memory_too_small_names_a_cap_that_fits(key: Any, qwen: str) -> None:
    # "raise max_memory" without an amount: raised a little, the same error again
    with pytest.raises(DoesNotFitError) as e:
        cudaload.plan(qwen, hardware=H100, max_memory={key: "1MiB"})
    fix = e.value.fix or ""
    assert fix.startswith("raise max_memory") and f"max_memory={{{key!r}: '" in fix, fix
    followed = eval(fix.split("max_memory=", 2)[-1])  # the dict the fix writes
    assert cudaload.plan(qwen, hardware=H100, max_memory=followed).placement.devices == ("cuda:0",)


def test_a_max_memory_no_cap_can_satisfy_says_so() -> None:
    from cudaload.testing.shapes import full_config

    with pytest.raises(DoesNotFitError) as e:
        cudaload.plan(full_config("Llama-3.1-70B"), hardware=H100, max_memory={0: "4GiB"})
    assert "the whole GPU has" in (e.value.fix or "") and "to at least" not in (e.value.fix or "")


# -- values with no effect, accepted in silence ---------------------------------------------------------------


def test_serving_an_encoder_is_refused(tmp_path: Path) -> None:
    bert = str(_folder(tmp_path, "bert", "bert", architectures=["BertModel"]))
    with pytest.raises(InvalidChoiceError) as e:
        cudaload.plan(bert, hardware=H100, intent="serving")
    assert "no generate()" in str(e.value) and "intent='inference'" in (e.value.fix or "")
    cudaload.plan(bert, hardware=H100, intent="inference")


def test_revision_with_a_local_folder_warns(qwen: str) -> None:
    with pytest.warns(CudaloadWarning, match="revision='main' has no effect"):
        cudaload.plan(qwen, hardware=H100, revision="main")
    with pytest.warns(CudaloadWarning, match="has no effect"):
        Request.build(qwen, entry="load_model", revision="v1.0", env={})
    # a Hub id: the revision is what it reads
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaloadWarning)
        Request.build("org/model", revision="main", env={})


@pytest.mark.parametrize("hardware", [None, Capabilities(source="cpu")], ids=["this machine", "a snapshot"])
def test_kernels_on_without_a_gpu_warns(hardware: Any, qwen: str, no_gpu: None) -> None:
    with pytest.warns(CudaloadWarning, match="kernels=True: Hub layer kernels run on CUDA GPUs"):
        cudaload.plan(qwen, hardware=hardware, kernels=True)


def test_kernels_on_with_a_gpu_says_nothing(qwen: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaloadWarning)
        cudaload.plan(qwen, hardware=H100, kernels=True)


def test_a_serving_batch_of_a_million_warns(qwen: str) -> None:
    from cudaload.policies.serving.kv_cache import TF_MAX_REQUESTS

    with pytest.warns(CudaloadWarning, match=f"at most {TF_MAX_REQUESTS} at once"):
        cudaload.plan(qwen, hardware=H100, intent="serving", batch_size=10**6, seq_len=512)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaloadWarning)
        cudaload.plan(qwen, hardware=H100, intent="serving", batch_size=TF_MAX_REQUESTS, seq_len=512)


BAD_VARIABLES: list[tuple[str, str, str]] = [
    # (variable, junk, the value the fix sets)
    ("HF_HUB_OFFLINE", "maybe", "HF_HUB_OFFLINE=1"),
    ("HF_HUB_OFFLINE", "offline", "HF_HUB_OFFLINE=1"),
    ("TRANSFORMERS_OFFLINE", "ture", "TRANSFORMERS_OFFLINE=1"),
    ("TORCH_CUDNN_SDPA_PREFERRED", "true", "TORCH_CUDNN_SDPA_PREFERRED=1"),
    ("TORCH_CUDNN_SDPA_PREFERRED", "off", "TORCH_CUDNN_SDPA_PREFERRED=0"),
    ("TORCH_CUDNN_SDPA_DEPRIORITIZED", "yes", "TORCH_CUDNN_SDPA_DEPRIORITIZED=1"),
    ("BNB_CUDA_VERSION", "12.4", "BNB_CUDA_VERSION=124"),
    ("BNB_CUDA_VERSION", "cuda124", "BNB_CUDA_VERSION=124"),
    ("BNB_CUDA_VERSION", "", "BNB_CUDA_VERSION=124"),
]


@pytest.mark.parametrize("name,junk,fixed", BAD_VARIABLES, ids=[f"{n}={j!r}" for n, j, _ in BAD_VARIABLES])
def test_junk_in_a_variable_is_refused_with_a_value_that_works(
    name: str, junk: str, fixed: str, qwen: str
) -> None:
    with pytest.raises(ConfigurationError) as e:
        Request.build(qwen, env={name: junk})
    assert name in str(e.value) and fixed in (e.value.fix or ""), e.value.fix
    key, value = fixed.split("=", 1)
    Request.build(qwen, env={key: value})
    assert _env.check_all({key: value}).notes == ()


@pytest.mark.parametrize("good", ["1", "0", "true", "OFF", "yes"])
def test_the_offline_switch_takes_what_huggingface_hub_reads(good: str) -> None:
    _env.check_all({"HF_HUB_OFFLINE": good})


def test_an_unwritable_cache_warns_and_tune_refuses(qwen: str, tmp_path: Path) -> None:
    # a folder under a regular file: never creatable, whoever runs the test (root writes read-only folders)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"CUDALOAD_CACHE": str(blocker / "cache")}
    with pytest.warns(CudaloadWarning, match="CUDALOAD_CACHE=.* cannot be written"):
        Request.build(qwen, env=env)
    with pytest.raises(ConfigurationError) as e:
        Request.build(qwen, entry="tune", batch_size=1, seq_len=64, new_tokens=16, env=env)
    assert "CUDALOAD_CACHE" in (e.value.fix or "")
    writable = {"CUDALOAD_CACHE": str(tmp_path / "cache")}  # created when needed
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaloadWarning)
        Request.build(qwen, entry="tune", batch_size=1, seq_len=64, new_tokens=16, env=writable)


def test_world_size_without_a_launcher_is_refused(qwen: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        Request.build(qwen, env={"WORLD_SIZE": "2", "RANK": "0"})
    assert "torchrun --nproc_per_node 2" in (e.value.fix or "") and "unset WORLD_SIZE" in (e.value.fix or "")
    launched = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaloadWarning)
        Request.build(qwen, hardware=H100, env=launched)
    Request.build(qwen, env={"RANK": "0"})  # the fix's other half: unset WORLD_SIZE


def test_local_rank_without_a_launcher_warns(qwen: str, a_gpu: None) -> None:
    with pytest.warns(CudaloadWarning, match="LOCAL_RANK=1 is set and no launcher"):
        Request.build(qwen, env={"LOCAL_RANK": "1"})


def test_a_rank_without_a_gpu_warns(qwen: str, no_gpu: None) -> None:
    env = {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    with pytest.warns(CudaloadWarning, match="this machine has no GPU: every rank loads its own whole copy"):
        Request.build(qwen, env=env)


def test_tune_on_a_machine_without_a_gpu_warns(qwen: str, no_gpu: None) -> None:
    with pytest.warns(CudaloadWarning, match="tune=True .* nothing is measured"):
        Request.build(qwen, entry="load_model", tune=True, batch_size=1, seq_len=512, env={})


# -- a raw TypeError for a non-string hardware ----------------------------------------------------------------

HARDWARE: list[tuple[Any, str, str]] = [
    (8, "hardware='8xH100'", "8xH100"),
    (["H100"], "hardware='H100'", "H100"),
    (["H100", "H100"], "hardware='2xH100'", "2xH100"),
    (2.5, "hardware='H100'", "H100"),
    (b"H100", "hardware='H100'", "H100"),
]


@pytest.mark.parametrize("value,fix_says,followed", HARDWARE, ids=[repr(h[0]) for h in HARDWARE])
def test_a_hardware_that_is_no_name_is_refused_with_the_form_meant(
    value: Any, fix_says: str, followed: str, qwen: str
) -> None:
    for call in (lambda: cudaload.hardware(value), lambda: cudaload.plan(qwen, hardware=value)):
        with pytest.raises(ConfigurationError) as e:
            call()
        assert fix_says in (e.value.fix or ""), e.value.fix
    cudaload.plan(qwen, hardware=followed)


@pytest.mark.parametrize("spelling", ["H100x8", "h100 x 8", "H100*8", "H100-SXMx8"])
def test_the_count_after_the_name_is_the_same_machine(spelling: str) -> None:
    assert cudaload.hardware(spelling) == cudaload.hardware("8xH100")


def test_an_unknown_profile_points_to_the_count_form() -> None:
    with pytest.raises(ConfigurationError) as e:
        cudaload.hardware("H1000x8")
    assert "NxNAME" in (e.value.fix or "") and "8xH100" in (e.value.fix or "")


# -- raw third-party errors from a config's values ------------------------------------------------------------

CONFIGS: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
    # (id, config values, the fix's words, the values it sets)
    ("dtype misspelt", {"dtype": "bfloat61"}, '"dtype": "bfloat16"', {"dtype": "bfloat16"}),
    (
        "torch_dtype misspelt",
        {"torch_dtype": "flot16"},
        '"torch_dtype": "float16"',
        {"torch_dtype": "float16"},
    ),
    (
        "dtype with torch.",
        {"torch_dtype": "torch.bfloat16"},
        '"torch_dtype": "bfloat16"',
        {"torch_dtype": "bfloat16"},
    ),
    ("vocab_size a string", {"vocab_size": "320"}, '"vocab_size": 320', {"vocab_size": 320}),
    ("hidden_size a float", {"hidden_size": 64.0}, '"hidden_size": 64', {"hidden_size": 64}),
    ("layers a bool", {"num_hidden_layers": True}, '"num_hidden_layers"', {"num_hidden_layers": 2}),
    (
        "context 0",
        {"max_position_embeddings": 0},
        '"max_position_embeddings"',
        {"max_position_embeddings": 512},
    ),
]


@pytest.mark.parametrize("values,fix_says,followed", [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_a_config_value_torch_or_transformers_would_fail_on_names_the_field_and_the_file(
    values: dict[str, Any], fix_says: str, followed: dict[str, Any], tmp_path: Path
) -> None:
    folder = _folder(tmp_path, "model", **values)
    config = folder / "config.json"
    field = next(iter(values))
    with pytest.raises(CheckpointError) as e:
        cudaload.plan(str(folder), hardware=H100)
    assert field in str(e.value) and str(config) in str(e.value)
    assert fix_says in (e.value.fix or "") and str(config) in (e.value.fix or ""), e.value.fix
    # the planner's own reading (a Hub id's cached config.json takes this path): the same error
    from cudaload.model_info import model_info

    with pytest.raises(CheckpointError, match=field):
        model_info(str(folder))
    data = json.loads(config.read_text())
    data.update(followed)
    config.write_text(json.dumps(data))
    cudaload.plan(str(folder), hardware=H100)


def test_a_config_dict_and_its_text_config_are_checked_too() -> None:
    from cudaload.testing.models import tiny_config

    config = tiny_config("qwen3").to_dict()
    with pytest.raises(CheckpointError, match="the config dict: vocab_size='320'"):
        cudaload.plan({**config, "vocab_size": "320"}, hardware=H100)
    vlm = {"model_type": "llava", "text_config": {"model_type": "qwen3", "hidden_size": "64"}}
    with pytest.raises(CheckpointError, match=r"text_config\.hidden_size"):
        cudaload.plan(vlm, hardware=H100)


def test_a_strict_config_refusal_is_translated_with_the_field(tmp_path: Path) -> None:
    # a field the table does not check: transformers 5.25 refuses it through huggingface_hub's strict dataclass
    from cudaload.model_info.config import _config_for

    try:
        _config_for("qwen3", {"rms_norm_eps": "small"}, "config.json")
    except CheckpointError as e:
        assert "rms_norm_eps" in str(e) and "config.json" in (e.fix or "")
    # older releases take the string (the config is not a strict dataclass there): nothing to translate
    # through the planner: qwen3's head_dim is an int field in 5.25 (null refused), optional before
    folder = str(_folder(tmp_path, "odd", head_dim=None))
    try:
        cudaload.plan(folder, hardware=H100)
    except CudaloadError as e:
        assert isinstance(e, CheckpointError) and "'head_dim'" in str(e) and folder in (e.fix or ""), str(e)


# -- misleading fixes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,fix_says", [("2k", "seq_len=2048"), ("4K", "seq_len=4096"), ("abc", "seq_len=2048")]
)
def test_seq_len_as_text_gets_an_integer_number_of_tokens(value: str, fix_says: str, qwen: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        Request.build(qwen, seq_len=value, env={})
    fix = e.value.fix or ""
    assert "integer number of tokens" in fix and fix_says in fix and "seq_len=1 " not in fix, fix
    if value.lower().endswith("k"):
        assert "2000 or 2048" in str(e.value) or "4000 or 4096" in str(e.value)
    Request.build(qwen, seq_len=int(fix_says.split("=")[1]), env={})


INTENT_WORDS = [
    ("finetune", "intent='training' or intent='lora'"),
    ("fine-tune", "intent='training' or intent='lora'"),
    ("SFT", "intent='training' or intent='lora'"),
    ("train", "intent='training'"),
    ("serve", "intent='serving'"),
    ("infer", "intent='inference'"),
]


@pytest.mark.parametrize("word,fix_says", INTENT_WORDS, ids=[w for w, _ in INTENT_WORDS])
def test_intent_synonyms_point_to_the_intent_meant(word: str, fix_says: str, qwen: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        Request.build(qwen, intent=word, env={})
    assert (e.value.fix or "").startswith(f"use {fix_says}"), e.value.fix
    meant = fix_says.split("'")[1]
    Request.build(qwen, intent=meant, env={})


LORA_WORDS = [
    ("rank", 8, "r"),
    ("alpha", 16, "lora_alpha"),
    ("dropout", 0.05, "lora_dropout"),
    ("targets", ["q_proj"], "target_modules"),
    ("modules", ["q_proj"], "target_modules"),
]


@pytest.mark.parametrize("word,value,meant", LORA_WORDS, ids=[w for w, _, _ in LORA_WORDS])
def test_lora_synonyms_point_to_loraconfigs_names(word: str, value: Any, meant: str, qwen: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        Request.build(qwen, intent="lora", lora={word: value}, env={})
    assert f"did you mean {meant!r}" in str(e.value)
    assert f"lora={{{meant!r}: {value!r}}}" in (e.value.fix or ""), e.value.fix
    Request.build(qwen, intent="lora", lora={meant: value}, env={})


# -- silent ----------------------------------------------------------------------------------------------------


def test_plan_reads_from_pretrained_kwargs_as_load_model_does(qwen: str) -> None:
    # torch_dtype: read as dtype= by both
    planned = cudaload.plan(qwen, hardware=H100, from_pretrained_kwargs={"torch_dtype": "float16"})
    loading = Request.build(qwen, entry="load_model", torch_dtype="float16", env={})
    assert planned.dtype.choice == "float16" and loading.dtype == "float16"
    # what cudaload decides, handed to from_pretrained: refused by both, the fix naming the option to pass instead
    with pytest.raises(ConfigurationError, match="use_kernels"):
        Request.build(qwen, entry="load_model", use_kernels=True, env={})
    with pytest.raises(ConfigurationError, match="as keywords"):
        Request.build(qwen, entry="load_model", from_pretrained_kwargs={"dtype": "float16"}, env={})
    cases = (
        ("dtype", "float16", "dtype='float16'", {"dtype": "float16"}),
        ("device_map", "auto", "device_map='auto'", {"device_map": "auto"}),
        ("use_kernels", True, "kernels=True", {"kernels": True}),
    )
    for key, value, own, followed in cases:
        with pytest.raises(ConfigurationError) as e:
            cudaload.plan(qwen, hardware=H100, from_pretrained_kwargs={key: value})
        assert own in (e.value.fix or ""), e.value.fix
        cudaload.plan(qwen, hardware=H100, **followed)


@pytest.mark.parametrize(
    "option",
    [{"parallelism": "tp"}, {"parallelism": "layer_split"}, {"parallelism": "ddp", "intent": "training"}],
)
def test_parallelism_over_several_gpus_on_one_is_refused(option: dict[str, Any], qwen: str) -> None:
    with pytest.raises(InvalidChoiceError) as e:
        cudaload.plan(qwen, hardware=H100, **option)
    assert "drop parallelism=" in (e.value.fix or "") and "hardware='2xH100-SXM'" in (e.value.fix or "")
    p = cudaload.plan(qwen, hardware="2xH100-SXM", **option)
    assert p.parallelism is not None and p.parallelism.choice == option["parallelism"]
    cudaload.plan(qwen, hardware=H100, **{k: v for k, v in option.items() if k != "parallelism"})


def test_single_on_one_gpu_stays_accepted(qwen: str) -> None:
    cudaload.plan(qwen, hardware=H100, parallelism="single")


# -- the command line speaks flags ------------------------------------------------------------------------------


def test_the_cli_writes_a_list_as_comma_separated_names() -> None:
    from cudaload.commands.cli import as_flags

    assert (
        as_flags("plan as if they were installed: assume_installed=['bitsandbytes', 'peft']")
        == "plan as if they were installed: --assume-installed bitsandbytes,peft"
    )


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--intent", "finetune"], "--intent training or --intent lora"),
        (["--seq-len", "2k"], "2048 or 2000"),
        (["--hardware", "H100", "--intent", "qlora"], "--assume-installed bitsandbytes,peft"),
    ],
    ids=["intent", "seq-len", "qlora"],
)
def test_the_cli_says_the_same_in_flags(
    argv: list[str], says: str, qwen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cudaload.commands.cli import main

    try:
        code = main(["plan", qwen, *argv])
    except SystemExit as exit_:  # argparse's refusal of a flag's value
        code = int(exit_.code or 0)
    assert code == 2
    assert says in capsys.readouterr().err


def test_every_item_raises_a_cudaload_error_never_a_bare_one() -> None:
    """The classes used above stay in the tree a caller catches (and the builtins code around from_pretrained
    already catches)."""
    for cls in (
        CheckpointError,
        ConfigurationError,
        DeviceSelectionError,
        DoesNotFitError,
        InvalidChoiceError,
    ):
        assert issubclass(cls, CudaloadError)
    assert issubclass(CheckpointError, ValueError) and issubclass(DoesNotFitError, MemoryError)
