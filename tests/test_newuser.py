"""What a new user hit (issue 16): the demo, the CLI's words and flags, environment variables, package names,
extras, profiles' kernels section, and the module layout. Each test fails on the code before the fix."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cudaload import _env
from cudaload.capabilities import Capabilities, PackageInfo
from cudaload.commands.cli import as_flags, build_parser, main
from cudaload.errors import CheckpointError, ConfigurationError, close_names, unknown_model_type

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"


# -- demo -----------------------------------------------------------------------------------------------


def _demo(kind: str) -> str:
    from cudaload.commands.demo import run

    out = io.StringIO()
    assert run(kind=kind, max_new_tokens=4, cpu=True, out=out) == 0
    return out.getvalue()


def test_demo_bert_extracts_features_instead_of_generating() -> None:
    text = _demo("bert")  # BertModel has no generate(): this raised AttributeError
    assert "feature extraction" in text and "hidden states (1, " in text


def test_demo_gpt2_prints_no_replacement_characters() -> None:
    last = _demo("gpt2").strip().splitlines()[-1]
    assert "\ufffd" not in last and last.isprintable()


def test_readable_shows_bytes_that_are_not_utf8_as_escapes() -> None:
    from cudaload.commands.demo import _byte_of_symbol, readable

    sym = {b: s for s, b in _byte_of_symbol().items()}
    assert len(sym) == 256
    euro = "€".encode()  # three bytes, one character
    assert readable([sym[b] for b in b"hi "] + [sym[b] for b in euro]) == "hi €"
    assert (
        readable([sym[0xFA], sym[0x1B], "<extra_300>", "</s>"], specials=["</s>"]) == "\\xfa\\x1b<extra_300>"
    )


def test_demo_leaves_the_callers_progress_bar_setting_alone() -> None:
    from transformers.utils import logging as tf_logging

    from cudaload.commands.demo import quiet_progress_bars

    assert tf_logging.is_progress_bar_enabled()
    with quiet_progress_bars():
        assert not tf_logging.is_progress_bar_enabled()
    assert tf_logging.is_progress_bar_enabled()
    tf_logging.disable_progress_bar()
    try:
        with quiet_progress_bars():
            pass
        assert not tf_logging.is_progress_bar_enabled()  # a caller who turned them off keeps them off
    finally:
        tf_logging.enable_progress_bar()


def test_demo_lists_only_kinds_it_can_run() -> None:
    from cudaload.testing import TINY_KINDS

    demo = build_parser()._subparsers._group_actions[0].choices["demo"]  # type: ignore[union-attr]
    (model,) = [a for a in demo._actions if a.dest == "model"]
    assert tuple(model.choices) == TINY_KINDS  # every one runs: bert above, the decoders generate


def test_unknown_demo_model_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["demo", "--model", "nope"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and "Traceback" not in err


# -- the CLI speaks CLI ------------------------------------------------------------------------------------


def test_verbose_flag_after_the_subcommand() -> None:
    p = build_parser()
    assert p.parse_args(["plan", "m", "-v"]).verbose is True
    assert p.parse_args(["-v", "plan", "m"]).verbose is True  # not reset by the subcommand's default
    assert p.parse_args(["plan", "m"]).verbose is False
    assert p.parse_args(["doctor", "--verbose"]).verbose is True


@pytest.mark.parametrize(
    ("text", "cli"),
    [
        ("pass allow_offload=True to accept offloading", "pass --allow-offload to accept offloading"),
        ("pass seq_len=1 or more", "pass --seq-len 1 or more"),
        ("use quantization='nf4', or intent='qlora'", "use --quantization nf4, or --intent qlora"),
        ("pass kernels=True to use the ones that pass", "pass --kernels on to use the ones that pass"),
        ("choose another backend with attn=...", "choose another backend with --attn ..."),
        (
            "device_map='cpu' requested; fast=True forces it",
            "device_map='cpu' requested; --fast on forces it",
        ),
    ],
)
def test_library_keywords_become_flags(text: str, cli: str) -> None:
    assert as_flags(text) == cli


def test_every_plan_flag_has_its_keyword_and_back() -> None:
    from cudaload.commands.cli import FLAGS

    plan = build_parser()._subparsers._group_actions[0].choices["plan"]  # type: ignore[union-attr]
    flags = {s for a in plan._actions for s in a.option_strings if s.startswith("--")}
    assert set(FLAGS.values()) <= flags
    assert flags - set(FLAGS.values()) == {"--help", "--json", "--verbose"}


def test_cli_error_names_flags_not_keywords(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cudaload.testing import full_config

    model = tmp_path / "m"
    full_config("Llama-3.1-70B").save_pretrained(model)
    # offload is suggested only where the host's memory is known (a named profile states none), so plan for
    # a snapshot: the H200 machine with 78 GiB free
    caps = json.loads((Path(__file__).parent / "fixtures" / "h200.json").read_text())
    for g in caps["gpus"]:
        g["free_memory"] = 78 << 30
    snap = tmp_path / "h.json"
    snap.write_text(json.dumps(caps))
    # 70B in bf16 does not fit 78 GiB (and without bitsandbytes nothing quantizes it)
    assert main(["plan", str(model), "--hardware", str(snap), "--assume-missing", "bitsandbytes"]) == 2
    err = capsys.readouterr().err
    assert "--allow-offload" in err and "allow_offload=True" not in err


def test_positive_ints_are_checked_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "m", "--seq-len", "0"])
    assert "--seq-len: 0 must be 1 or more" in capsys.readouterr().err


# -- package names ---------------------------------------------------------------------------------------


def test_assume_installed_typo_is_rejected_with_the_close_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", "m", "--assume-installed", "flash-atn"])
    assert e.value.code == 2
    assert "unknown package 'flash-atn'; did you mean flash-attn" in capsys.readouterr().err


def test_package_spellings_map_to_cudaloads_names() -> None:
    from cudaload.detection.packages import check_names

    assert check_names(["flash_attn_3", "FA4", "bitsandbytes", "flash-attn-3"]) == [
        "flash-attn-3",
        "flash-attn-4",
        "bitsandbytes",
    ]
    with pytest.raises(ConfigurationError, match="did you mean kernels"):
        check_names(["kernel"])


# -- environment variables -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_bad_hub_timeout_raises(value: str) -> None:
    with pytest.raises(ConfigurationError, match="CUDALOAD_HUB_TIMEOUT"):
        _env.hub_probe_timeout({"CUDALOAD_HUB_TIMEOUT": value})
    with pytest.raises(ConfigurationError):
        _env.hub_probe_enabled({"CUDALOAD_HUB_TIMEOUT": value})


def test_good_hub_timeouts() -> None:
    assert _env.hub_probe_timeout({}) == 2.0
    assert _env.hub_probe_timeout({"CUDALOAD_HUB_TIMEOUT": "0"}) == 0.0
    assert _env.hub_probe_timeout({"CUDALOAD_HUB_TIMEOUT": " 3.5 "}) == 3.5


def test_trust_entries_that_trust_nothing_raise() -> None:
    ok = {"CUDALOAD_TRUST_KERNELS": "kernels-community/*, me/my-kernel ,*"}
    assert _env.trusted_kernel_repos(ok) == ("kernels-community/*", "me/my-kernel", "*")
    for bad in ("kernels-community", "a/b c", "a/b/c"):
        with pytest.raises(ConfigurationError, match="CUDALOAD_TRUST_KERNELS"):
            _env.trusted_kernel_repos({"CUDALOAD_TRUST_KERNELS": bad})


def test_bad_variable_is_a_cli_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDALOAD_HUB_TIMEOUT", "abc")
    assert main(["env"]) == 2
    assert "CUDALOAD_HUB_TIMEOUT='abc'" in capsys.readouterr().err


# -- error messages --------------------------------------------------------------------------------------


def test_unknown_model_type_is_short_and_names_close_ones() -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    e = unknown_model_type("lama", CONFIG_MAPPING_NAMES, "5.17.0")
    assert isinstance(e, CheckpointError) and len(str(e)) < 300
    assert "llama" in close_names("lama", CONFIG_MAPPING_NAMES)
    assert {"qwen2", "qwen3"} <= set(close_names("qwen", CONFIG_MAPPING_NAMES))
    assert close_names("zzzz", CONFIG_MAPPING_NAMES) == []


# -- a profile's kernels section describes the profile --------------------------------------------------


def _profile_plan(*installed: str) -> Any:
    from cudaload import plan
    from cudaload.testing import full_config

    return plan(full_config("Qwen3-0.6B"), hardware="H100", assume_installed=installed, kernels=True)


def test_profile_kernels_are_planned_for_its_gpus_not_this_cpu() -> None:
    kp = _profile_plan("kernels").kernels
    assert kp["device"] == "cuda"
    assert not any("cpu" in r for r in kp["reasons"]), kp["reasons"]
    assert {e["layer"] for e in kp["entries"]} == {"RMSNorm", "rotary_pos_emb"}


def test_profile_without_kernels_assumed_says_so() -> None:
    p = _profile_plan()
    reasons = [r for e in p.kernels["entries"] for r in e["reasons"]]
    assert any("kernels is not assumed on a profile" in r for r in reasons)
    assert not any("kernels is not installed" in r for r in reasons)
    assert "RMSNorm <- kernels-community/liger-kernels" in p.explain()  # each entry shown, with why


def test_kernels_device_follows_the_recorded_torch() -> None:
    from cudaload.hub_kernels import kernels_device

    caps = Capabilities.from_json((FIX / "h200.json").read_text())
    assert kernels_device(caps) == "cuda"
    assert kernels_device(Capabilities(source="t", gpus=caps.gpus, torch_version="2.11.0")) == "cpu"
    assert kernels_device(Capabilities(source="t")) == "cpu"


# -- extras and doctor -----------------------------------------------------------------------------------


def _extra(name: str) -> list[str]:
    import tomllib  # Python 3.11+ (the tests using it skip on 3.10)

    return list(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]
    )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_kernels_extra_is_transformers_own_and_keeps_any_supported_transformers() -> None:
    """The extra is transformers' own ``kernels`` extra over the whole supported range: pip keeps the installed
    transformers (no downgrade of a 5.25 install, issue 41) and brings the kernels that release pairs with."""
    import tomllib
    from packaging.requirements import Requirement

    (req,) = map(Requirement, _extra("kernels"))
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (main,) = [Requirement(d) for d in deps if Requirement(d).name == "transformers"]
    assert req.name == "transformers" and req.extras == {"kernels"}
    assert req.specifier == main.specifier
    assert "cudaload[kernels,quant,peft]" in _extra("all")


def test_installed_transformers_kernels_extra_is_its_accepted_window() -> None:
    """What ``transformers[kernels]`` installs is the window this transformers accepts (checked on every set)."""
    import importlib.metadata as md

    import transformers
    from packaging.requirements import Requirement

    from cudaload.detection.versions import in_range, kernels_range_for

    rng = kernels_range_for(transformers.__version__)
    assert rng is not None
    reqs = [Requirement(r) for r in md.requires("transformers") or []]
    kernels = [
        r for r in reqs if r.name == "kernels" and r.marker and r.marker.evaluate({"extra": "kernels"})
    ]
    assert kernels, "transformers has no kernels extra"
    for r in kernels:
        newest_allowed = [v for v in ("0.16.2", "0.17.2", "0.18.3", "0.19.1") if v in r.specifier]
        assert newest_allowed and all(in_range(v, rng) for v in newest_allowed), (r, rng)


def test_doctor_fix_for_out_of_range_kernels_is_an_upgrade() -> None:
    from cudaload.commands.doctor import diagnose

    caps = Capabilities.from_json((FIX / "kernels_out_of_range.json").read_text())
    k = caps.package("kernels")
    assert k.accepted == ">=0.18.2,<0.19.0" and k.version == "0.17.2"  # transformers 5.24 with an old kernels
    for c in (caps, Capabilities(source="cpu", packages=caps.packages, findings=caps.findings)):
        fixes = [v.fix or "" for v in diagnose(c).verdicts if "kernels" in (v.code or "")]
        assert fixes and all(f == "pip install -U 'kernels>=0.18.2,<0.19.0'" for f in fixes), fixes


def test_doctor_fix_in_a_published_range_names_the_range() -> None:
    from cudaload.commands.doctor import kernels_fix

    assert kernels_fix(">=0.16.0,<0.17.0") == "pip install 'kernels>=0.16.0,<0.17.0'"


# -- layout ----------------------------------------------------------------------------------------------


def _fresh(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()


def test_explain_does_not_import_plans() -> None:
    assert (
        _fresh("import sys, cudaload.plans.explain; print('cudaload.plans.plan' in sys.modules)") == "False"
    )


def test_hub_kernels_names_stay_importable_and_cheap() -> None:
    out = _fresh(
        "import sys, cudaload.hub_kernels as hk; missing = [n for n in hk.__all__ if not hasattr(hk, n)]; "
        "print(missing, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    assert out == "[] False False"


def test_assumed_package_keeps_pure_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    # with_packages records the canonical name the policies read
    caps = Capabilities(source="profile:x", packages=(PackageInfo("accelerate", True, usable=True),))
    from cudaload.detection.packages import check_names

    assert caps.with_packages(check_names(["FA4"])).package("flash-attn-4").usable


def test_detected_out_of_range_finding_names_an_installable_fix() -> None:
    from cudaload.detection import detect

    caps = detect(probe_hub=False)
    if caps.package("kernels").in_range is not False:
        pytest.skip("kernels is in the range this transformers accepts here (only .venvs/unpaired is not)")
    (f,) = [f for f in caps.findings if f.code == "kernels-out-of-range"]
    # the unpaired set: transformers 5.24 with kernels 0.17.2, older than its window -> upgrade kernels
    assert f.fix and f.fix.startswith("pip install -U 'kernels>="), f.fix


def test_doctor_on_a_profile_does_not_call_packages_uninstalled() -> None:
    from cudaload.commands.doctor import diagnose
    from cudaload.profiles import hardware

    text = diagnose(hardware("H100")).render()
    assert "not installed" not in text
    assert "flash-attn-4 is not assumed on a profile" in text and "bitsandbytes is not assumed" in text
    assumed = diagnose(hardware("H100").with_packages(["bitsandbytes"], ["kernels"])).render()
    assert "kernels is not installed" in assumed  # assumed missing: said plainly


def test_training_and_parallel_flags_reach_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cudaload.testing import full_config

    full_config("Qwen3-0.6B").save_pretrained(tmp_path)
    argv = ["plan", str(tmp_path), "--hardware", "2xH100-80GB", "--intent", "training", "--seq-len", "512"]
    extra = ["--optimizer", "adafactor", "--gradient-checkpointing", "on", "--parallelism", "fsdp2", "--json"]
    assert main([*argv, *extra]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["optimizer"]["choice"] == "adafactor" and p["gradient_checkpointing"]["choice"] == "on"
    assert p["parallelism"]["choice"] == "fsdp2"
    assert as_flags("gradient_checkpointing=True") == "--gradient-checkpointing on"
    assert as_flags("parallelism='auto'") == "--parallelism auto"
