"""The ``cudaload`` command: env, doctor, precompile, plan, tune, profiles, demo (docs/api.md lists them).

Each subcommand is a thin shell over the library: it parses arguments, calls the public function and
prints. Errors from cudaload are printed with their fix and exit 2; anything else is a bug and raises.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .decode_plan import DECODE_MODES
from .errors import ConfigurationError, CudaloadError, CudaloadWarning
from .training_plan import LAYOUTS, LOSSES

if TYPE_CHECKING:
    from .request import Request

#: Python keyword -> the ``cudaload plan`` flag that sets it. The library's messages name keywords
#: (``allow_offload=True``); the CLI prints them as flags (``--allow-offload``). The one place the two
#: spellings meet: a flag added below gets its keyword here.
FLAGS: dict[str, str] = {
    "hardware": "--hardware",
    "intent": "--intent",
    "seq_len": "--seq-len",
    "batch_size": "--batch-size",
    "attn": "--attn",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "allow_offload": "--allow-offload",
    "assume_installed": "--assume-installed",
    "assume_missing": "--assume-missing",
    "kernels": "--kernels",
    "trust_kernels": "--trust-kernels",
    "fast": "--fast",
    "new_tokens": "--new-tokens",
    "generate_calls": "--generate-calls",
    "decode": "--decode",
    "padded": "--padded",
    "optimizer": "--optimizer",
    "gradient_checkpointing": "--gradient-checkpointing",
    "parallelism": "--parallelism",
    "lower_latency": "--lower-latency",
    "batch_layout": "--batch-layout",
    "tokens_per_step": "--tokens-per-step",
    "loss": "--loss",
}
#: keywords whose True/False/None the CLI spells on/off/auto
_TRISTATE = ("kernels", "fast", "gradient_checkpointing")
_KEYWORD = re.compile(
    r"(?<![\w.-])("
    + "|".join(sorted(FLAGS, key=len, reverse=True))
    + r")=(\[[^\]]*\]|'[^']*'|\"[^\"]*\"|\.\.\.|[\w.+-]+)?"
)


#: the names of a Python list in a message: ['bitsandbytes', 'peft'] -> bitsandbytes, peft
_LIST_ITEM = re.compile(r"[^\s,'\"\[\]]+")
_KERNELS_WORD = {"True": "on", "False": "off", "None": "auto"}
#: the CLI's spelling of a keyword that takes True / False / None (auto)
_ON_OFF: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


def as_flags(text: str) -> str:
    """Rewrite Python keyword syntax in a library message into the CLI's flags: ``allow_offload=True`` ->
    ``--allow-offload``, ``seq_len=1`` -> ``--seq-len 1``, ``quantization='nf4'`` -> ``--quantization nf4``.
    Keywords the CLI has no flag for (``device_map=``, ``max_memory=``) stay as they are."""

    def sub(m: re.Match[str]) -> str:
        flag, value = FLAGS[m.group(1)], m.group(2)
        if value is None:
            return flag
        if value.startswith("["):  # a list of names: the flags take them comma-separated
            return flag + " " + ",".join(_LIST_ITEM.findall(value))
        value = value.strip("'\"")
        if m.group(1) in _TRISTATE and value in ("True", "False", "None"):
            return f"{flag} {_KERNELS_WORD[value]}"
        if value == "True":
            return flag
        return f"{flag} {value}"

    return _KEYWORD.sub(sub, text)


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        short = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM])\s*", value)
        if short:
            # "2k" is 2000 to some and 2048 to others (the request reads neither: cudaload.request._positive_int)
            x = float(short.group(1))
            scale = {"k": (1000, 1024), "m": (1000**2, 1024**2)}[short.group(2).lower()]
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a whole number: write it out ({int(x * scale[1])} or {int(x * scale[0])})"
            ) from None
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return n


def _intent(value: str) -> str:
    """``--intent``: a name from cudaload.plans.INTENTS, or the request's refusal, which knows the words users type
    for them (``finetune``, ``serve``: cudaload.errors.SYNONYMS)."""
    from .plans import INTENTS
    from .request import _choice

    try:
        return _choice("intent", value, INTENTS)
    except CudaloadError as e:
        raise argparse.ArgumentTypeError(as_flags(e.message + (f" ({e.fix})" if e.fix else ""))) from None


def _packages(value: str) -> list[str]:
    from .request import package_names

    try:
        return package_names("--assume-installed", _csv(value))
    except CudaloadError as e:
        raise argparse.ArgumentTypeError(e.message + (f" ({e.fix})" if e.fix else "")) from None


def _hardware(spec: str | None):  # type: ignore[no-untyped-def]
    if spec is None:
        from .detection import detect

        return detect()
    from .profiles import hardware

    return hardware(spec)


def _cmd_env(args: argparse.Namespace) -> int:
    caps = _hardware(args.hardware)
    if args.json:
        print(caps.to_json())
    else:
        from .detection import render

        print(render(caps))
    return 0


def _cmd_precompile(args: argparse.Namespace) -> int:
    decode_only = {
        "--seq-len": args.seq_len,
        "--batch-size": args.batch_size,
        "--new-tokens": args.new_tokens,
    }
    if args.decode is not None:
        return _precompile_decode(args)
    given = [flag for flag, value in decode_only.items() if value is not None]
    if given:
        raise ConfigurationError(
            f"{', '.join(given)} size the compiled decode that --decode MODEL warms",
            fix="add --decode MODEL, or leave them out to byte-compile packages",
        )
    from .detection.bytecode import finding_text, probe

    if args.check:
        import os

        # under --prefix: whether processes started with PYTHONPYCACHEPREFIX=DIR would find the caches there
        saved = sys.pycache_prefix
        if args.prefix:
            sys.pycache_prefix = os.path.abspath(args.prefix)
        try:
            state = probe()
        finally:
            sys.pycache_prefix = saved
        for p in state.packages:
            print(
                f"{p.name}: {p.cached} of {p.sampled} sampled modules have cached bytecode"
                + ("" if p.writable or p.cached == p.sampled else "; Python will not write the missing ones")
            )
        text = finding_text(state)
        print(
            f"{text[0]}\nfix: {text[1]}"
            if text
            else "no package a load imports is compiled again by each process"
        )
        return 1 if text else 0
    if args.jobs < 0:
        raise ConfigurationError(
            f"--jobs {args.jobs} is not a number of processes", fix="pass --jobs 0 (one per CPU) or more"
        )
    from .bytecache import precompile

    report = precompile(args.packages, prefix=args.prefix, workers=args.jobs)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.summary())
    return 0 if report.ok else 1


def _precompile_decode(args: argparse.Namespace) -> int:
    """`cudaload precompile --decode MODEL`: load MODEL as load_model(decode="compiled", warmup=True) would, which
    compiles generate()'s decode step for each planned batch size and saves torch's compile artifacts under
    CUDALOAD_CACHE; a later process planning the same model, bucket and batch sizes on this torch and GPU loads them
    (cudaload.execute.decode). The request is checked before torch is imported."""
    clash = [
        f
        for f, on in (("--check", args.check), ("--packages", args.packages), ("--prefix", args.prefix))
        if on
    ]
    if clash:
        raise ConfigurationError(
            f"--decode MODEL warms a model's compiled decode; {', '.join(clash)} byte-compile packages",
            fix="run them as two commands",
        )
    if args.seq_len is None:
        raise ConfigurationError(
            "--decode MODEL compiles for a static cache of --seq-len slots (the longest prompt + new tokens)",
            fix="add --seq-len N (e.g. --seq-len 2048), and --batch-size for batched calls",
        )
    req = _request(
        args.decode,
        "load_model",
        seq_len=args.seq_len,
        batch_size=args.batch_size or 1,  # with --seq-len, the declared work the decode plan is made for
        new_tokens=args.new_tokens,
        decode="compiled",
        warmup=True,
    )
    from .execute import load_request

    try:
        model = load_request(req)
    except CudaloadError as e:
        # the request's decode='compiled' is this command's own: its refusal's fix names what the machine or
        # model lacks, not the dynamic decode (which precompiles nothing)
        e.message = e.message.replace("decode='compiled'", "a compiled decode")
        e.fix = e.fix and e.fix.replace("use decode='dynamic', or ", "")
        raise
    plan = model.cudaload_plan
    got = plan.verified.get("decode") or {}
    warm = got.get("warmup") or {}
    if not warm.get("compiled"):
        why = got.get("why") or warm.get("why") or "the load did not compile the decode step"
        print(f"cudaload: nothing precompiled for {plan.model.name}: {why}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps({"model": plan.model.name, "decode": plan.decode.to_dict(), "verified": got}, indent=1)
        )
        return 0
    saved = warm["artifacts_saved"]
    loaded = warm["artifacts_loaded"]
    print(
        f"{plan.model.name}: decode compiled for a static cache of {plan.decode.max_cache_len:,} slots, batch sizes "
        f"{', '.join(str(b) for b in warm['batch_sizes'])}, in {warm['compile_s']:.1f} s"
        + f" ({warm['graphs_compiled']} graphs compiled, {warm['graphs_from_cache']} from the cache"
        + (f"; {loaded['bytes']:,} bytes of saved artifacts loaded)" if loaded.get("entries") else ")")
    )
    for b in warm["per_batch"]:
        print(f"  batch {b['batch']}: first call {b['first_s']:.2f} s, second {b['second_s']:.3f} s")
    if saved.get("path"):
        print(f"artifacts: {saved['path']} ({saved['bytes']:,} bytes)")
    else:
        print(f"artifacts not saved: {saved.get('why') or saved.get('error')}")
        return 1
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose

    report = diagnose(_hardware(args.hardware))
    print(report.render())
    return 0 if report.ok else 1


def _request(model: str, entry: str, **options: Any) -> Request:
    """The same :class:`~cudaload.request.Request` the Python API builds, before torch or transformers is
    imported: a bad value is refused at once. Its warnings are printed as the CLI's own lines."""
    from .request import Request

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CudaloadWarning)
        req = Request.build(model, entry=entry, **options)
    for w in caught:
        if issubclass(w.category, CudaloadWarning):
            print(f"cudaload: warning: {as_flags(str(w.message))}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return req


def _cmd_plan(args: argparse.Namespace) -> int:
    req = _request(
        args.model,
        "plan",
        hardware=args.hardware,
        intent=args.intent,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        new_tokens=args.new_tokens,
        generate_calls=args.generate_calls,
        decode=args.decode,
        padded=args.padded,
        attn=args.attn,
        dtype=args.dtype,
        quantization=args.quantization,
        allow_offload=args.allow_offload,
        assume_installed=args.assume_installed or (),
        assume_missing=args.assume_missing or (),
        kernels=_ON_OFF[args.kernels],
        trust_kernels=args.trust_kernels or (),
        fast=_ON_OFF[args.fast],
        optimizer=args.optimizer,
        gradient_checkpointing=_ON_OFF[args.gradient_checkpointing],
        parallelism=args.parallelism,
        lower_latency=args.lower_latency,
        batch_layout=args.batch_layout,
        tokens_per_step=args.tokens_per_step,
        loss=args.loss,
    )
    from .planner import plan_request

    p = plan_request(req)  # the request checked above, planned as cudaload.plan() plans it
    print(p.to_json() if args.json else as_flags(p.explain()))
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    """`cudaload tune`: the work checked as plan()'s (a zero length is refused, not stored in the timing cache),
    then cudaload.tuning.run_tune, which imports torch."""
    try:
        _request(
            args.model,
            "tune",
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            new_tokens=args.new_tokens,
            padded=args.padded,
            tune_budget_s=args.budget_s,
        )
    except CudaloadError as e:
        # tune's own spelling of the one keyword plan has no flag for
        e.message = e.message.replace("tune_budget_s=", "--budget-s ")
        e.fix = e.fix and e.fix.replace("tune_budget_s=", "--budget-s ")
        raise
    if args.reps < 1:
        raise ConfigurationError(f"--reps {args.reps} times nothing", fix="pass --reps 1 or more (default 5)")
    from .request import attention_name

    for name in args.backends or ():
        if name == "auto":
            raise ConfigurationError(
                "--backends names the backends to time; auto is not one",
                fix="leave --backends out to time every usable one",
            )
        attention_name(name)  # the names --attn takes, refused the same way
    from .tuning import run_tune

    return run_tune(args)


def _cmd_profiles(args: argparse.Namespace) -> int:
    from .profiles import describe

    print(describe())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run(kind=args.model, prompt=args.prompt, max_new_tokens=args.max_new_tokens, cpu=args.cpu)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .plans import INTENTS
    from .testing.models import TINY_KINDS

    verbose_help = "log cudaload's decisions as they are made"
    p = argparse.ArgumentParser(
        prog="cudaload",
        description="Device-aware Hugging Face model loading: see what this machine can do (env, doctor), "
        "plan a load for it or for a named GPU (plan, profiles), measure attention backends on this GPU (tune), "
        "stop new processes compiling the packages a load imports (precompile), or watch the whole path on a "
        "tiny model (demo).",
    )
    p.add_argument("--version", action="version", version=f"cudaload {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    # -v also after the subcommand (`cudaload plan m -v`); SUPPRESS keeps an absent -v there from
    # resetting one given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    sub = p.add_subparsers(dest="command", required=True)

    def hw_help(verb: str) -> str:
        return (
            f"{verb} this hardware instead of the machine you are on: a profile name (H100, 8xA100-80GB...; "
            "see `cudaload profiles`) or a snapshot file from `cudaload env --json`"
        )

    e = sub.add_parser(
        "env",
        parents=[common],
        help="the machine as cudaload sees it",
        description="Print the machine as cudaload sees it: GPUs (from NVML; CUDA is not initialised), CUDA, "
        "torch and transformers versions, optional packages and whether they load, launch and Hub state, and "
        "what looks wrong. --json prints the snapshot, which --hardware FILE plans against.",
    )
    e.add_argument("--json", action="store_true", help="print the snapshot as JSON (a reusable profile)")
    e.add_argument("--hardware", metavar="PROFILE", help=hw_help("show"))
    e.set_defaults(func=_cmd_env)

    d = sub.add_parser(
        "doctor",
        parents=[common],
        help="verdicts: what works, what is misconfigured, and the fix",
        description="Judge the machine: per GPU, native bf16, the flash-attention packages and bitsandbytes; "
        "then Hub kernels, the GPU selection (CUDA_VISIBLE_DEVICES, device order, LOCAL_RANK) and the "
        "installation's bytecode; each problem with its fix. Exits 1 when something is broken.",
    )
    d.add_argument("--hardware", metavar="PROFILE", help=hw_help("diagnose"))
    d.set_defaults(func=_cmd_doctor)

    pc = sub.add_parser(
        "precompile",
        parents=[common],
        help="byte-compile the packages a load imports, so new processes stop compiling them from source",
        description="Byte-compile torch, transformers and the other packages a load imports (as pip does when it "
        "installs), for environments where they have no cached bytecode and Python may not write it "
        "(PYTHONDONTWRITEBYTECODE=1, uv without --compile-bytecode, a read-only install): there every new "
        "process compiles them from source again. Run once per installation.",
    )
    pc.add_argument(
        "--prefix", metavar="DIR", help="write the caches under DIR (then set PYTHONPYCACHEPREFIX=DIR)"
    )
    pc.add_argument(
        "--packages", type=_csv, metavar="PKG,...", help="top-level packages (default: what a load imports)"
    )
    pc.add_argument(
        "-j", "--jobs", type=int, default=0, metavar="N", help="compile processes (default: one per CPU)"
    )
    pc.add_argument(
        "--check", action="store_true", help="only say whether new processes compile them (exit 1 if so)"
    )
    pc.add_argument("--json", action="store_true", help="print the report as JSON")
    pc.add_argument(
        "--decode",
        metavar="MODEL",
        help="instead: load MODEL with a compiled decode (a static cache) and compile generate()'s decode step "
        "now for each planned batch size, saving torch's compile artifacts under CUDALOAD_CACHE for later processes",
    )
    pc.add_argument(
        "--seq-len",
        type=_positive_int,
        metavar="N",
        help="with --decode: the longest prompt + new tokens a call will have (the static cache's bucket)",
    )
    pc.add_argument("--batch-size", type=_positive_int, metavar="N", help="with --decode: sequences per call")
    pc.add_argument(
        "--new-tokens",
        type=_positive_int,
        metavar="N",
        help="with --decode: of --seq-len, the tokens generated",
    )
    pc.set_defaults(func=_cmd_precompile)

    from .detection.packages import DISTRIBUTIONS

    pl = sub.add_parser(
        "plan",
        parents=[common],
        help="decide dtype, attention, quantization and placement for a model",
        description="Decide dtype, attention, quantization and placement for a model, and say why. Reads the "
        "config (and safetensors headers), never the weights; touches no GPU.",
    )
    pl.add_argument(
        "model", help="a local model directory, a config.json, or a Hub id already in the local cache"
    )
    pl.add_argument("--hardware", metavar="PROFILE", help=hw_help("plan for"))
    pl.add_argument(
        "--intent",
        default="inference",
        type=_intent,
        metavar="{" + ",".join(INTENTS) + "}",
        help="what the model is loaded for: inference (default), full training, LoRA adapters, QLoRA "
        "(LoRA on an nf4-quantized base), or serving (continuous batching)",
    )
    pl.add_argument(
        "--seq-len",
        type=_positive_int,
        metavar="N",
        help="tokens per sequence (default: the model's, at most 4096)",
    )
    pl.add_argument("--batch-size", type=_positive_int, metavar="N", help="sequences per batch (default 1)")
    pl.add_argument(
        "--new-tokens",
        type=_positive_int,
        metavar="N",
        help="of --seq-len, how many tokens generate() adds (picks measured attention timings closer; with "
        "--generate-calls, the decode work --decode weighs)",
    )
    pl.add_argument(
        "--generate-calls",
        type=_positive_int,
        metavar="N",
        help="how many generate() calls of --new-tokens the process makes (default one)",
    )
    pl.add_argument(
        "--decode",
        default="auto",
        choices=["auto", *DECODE_MODES],
        help="how generate() decodes: compiled (a static cache, its decode step compiled) or dynamic; auto "
        "compiles only where the declared work pays for the compile",
    )
    pl.add_argument(
        "--padded", action="store_true", help="the batch's prompts differ in length (left-padded)"
    )
    pl.add_argument(
        "--attn",
        default="auto",
        help="attention backend: auto, sdpa, cudaload_sdpa, eager, flash_attention_2/3/4, or a Hub kernel org/name",
    )
    pl.add_argument("--dtype", default="auto", help="auto, bfloat16 (bf16), float16 (fp16) or float32")
    pl.add_argument(
        "--quantization",
        default="auto",
        choices=["auto", "none", "int8", "nf4"],
        help="bitsandbytes weight quantization; auto quantizes only when the model does not fit otherwise",
    )
    pl.add_argument(
        "--allow-offload", action="store_true", help="allow CPU/disk offload when nothing else fits"
    )
    pkgs = ", ".join(sorted(DISTRIBUTIONS))
    pl.add_argument(
        "--assume-installed",
        type=_packages,
        metavar="PKG,...",
        help=f"treat these packages as installed and usable (one of: {pkgs})",
    )
    pl.add_argument(
        "--assume-missing", type=_packages, metavar="PKG,...", help="treat these packages as absent"
    )
    pl.add_argument(
        "--kernels",
        default="auto",
        choices=["auto", "on", "off"],
        help="Hub kernels: auto uses them only when every one passes preflight; on keeps those that pass",
    )
    pl.add_argument(
        "--trust-kernels",
        type=_csv,
        metavar="REPO,...",
        help="Hub kernel repos (org/name) or publishers (org/*) whose code may run; also CUDALOAD_TRUST_KERNELS",
    )
    pl.add_argument(
        "--fast",
        default="auto",
        choices=["auto", "on", "off"],
        help="cudaload's fast safetensors loader: auto uses it where it is known to beat from_pretrained",
    )
    from .policies.memory import OPTIMIZERS
    from .policies.parallelism import REQUESTS

    pl.add_argument(
        "--optimizer",
        default="auto",
        choices=["auto", *OPTIMIZERS],
        help="training: the TrainingArguments optim; auto tries fp32 AdamW, then 8-bit AdamW (bitsandbytes), "
        "then Adafactor until one fits",
    )
    pl.add_argument(
        "--gradient-checkpointing",
        default="auto",
        choices=["auto", "on", "off"],
        help="training: recompute activations in backward; auto turns it on only when they do not fit without",
    )
    pl.add_argument(
        "--batch-layout",
        default="auto",
        choices=["auto", *LAYOUTS],
        help="training: packed steps (sequences concatenated, no padding computed) where the attention keeps "
        "them apart, else padded; auto picks",
    )
    pl.add_argument(
        "--tokens-per-step",
        type=_positive_int,
        metavar="N",
        help="training, packed: the most real tokens a step may hold (default: the largest that fits without "
        "gradient checkpointing)",
    )
    pl.add_argument(
        "--loss",
        default="auto",
        choices=["auto", *LOSSES],
        help="training: Liger's fused linear cross-entropy or transformers' loss; auto uses Liger only where "
        "it alone avoids checkpointing",
    )
    pl.add_argument(
        "--parallelism",
        default="auto",
        choices=list(REQUESTS),
        help="several GPUs: training ddp, fsdp2 or deepspeed; inference tp, layer_split or single; "
        "auto chooses (see the plan's parallelism section)",
    )
    pl.add_argument(
        "--lower-latency",
        action="store_true",
        help="inference on several GPUs: prefer tensor parallelism (every GPU on every token)",
    )
    pl.add_argument("--json", action="store_true", help="print the plan as JSON (docs/plan-schema.md)")
    pl.set_defaults(func=_cmd_plan)

    from .tuning import add_tune_parser

    add_tune_parser(sub, parents=[common]).set_defaults(func=_cmd_tune)

    pr = sub.add_parser(
        "profiles",
        parents=[common],
        help="list the named hardware profiles",
        description="List the GPUs `--hardware NAME` plans for (NxNAME for N of them): device name, compute "
        "capability, architecture, memory, bf16 / fp8 support.",
    )
    pr.set_defaults(func=_cmd_profiles)

    de = sub.add_parser(
        "demo",
        parents=[common],
        help="detect, plan, load and run a tiny model made on the spot (offline)",
        description="Detect, plan, load and verify a tiny random model made on the spot, then generate "
        "(decoders) or extract features (bert). Offline; the output text is noise (random weights).",
    )
    de.add_argument(
        "--model", default="qwen3", choices=TINY_KINDS, help="tiny model family to make (default qwen3)"
    )
    de.add_argument(
        "--prompt", default="The fastest way to load a model is", help="the text the model runs on"
    )
    de.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        metavar="N",
        default=16,
        help="tokens to generate (default 16)",
    )
    de.add_argument("--cpu", action="store_true", help="use the CPU even when a GPU is present")
    de.set_defaults(func=_cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        return int(args.func(args))
    except CudaloadError as e:
        print(f"cudaload: error: {as_flags(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `cudaload ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
