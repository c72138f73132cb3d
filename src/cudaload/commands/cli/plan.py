"""``cudaload plan``: the plan for a model on this machine or a named one, as ``explain()`` text or JSON.

Its flags are ``cudaload.plan()``'s keywords (cudaload.commands.cli.flags.FLAGS maps one to the other), added in four
groups: the work, the choices, training's step and the GPUs. The order of the calls is the order of ``--help``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ...plans.decode import DECODE_MODES
from ...plans.training import LAYOUTS, LOSSES
from .flags import as_flags
from .inputs import ON_OFF, checked_request, comma_list, hardware_help, intent, packages, positive_int


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> None:
    pl = sub.add_parser(
        "plan",
        parents=list(parents),
        help="decide dtype, attention, quantization and placement for a model",
        description="Decide dtype, attention, quantization and placement for a model, and say why. Reads the "
        "config (and safetensors headers), never the weights; touches no GPU.",
    )
    pl.add_argument(
        "model", help="a local model directory, a config.json, or a Hub id already in the local cache"
    )
    pl.add_argument("--hardware", metavar="PROFILE", help=hardware_help("plan for"))
    _add_work(pl)
    _add_choices(pl)
    _add_training(pl)
    _add_gpus(pl)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON (docs/plan-schema.md)")
    pl.set_defaults(func=run)


def _add_work(pl: argparse.ArgumentParser) -> None:
    """What the model is loaded for, and how much of it: the declared work."""
    from ...plans.plan import INTENTS

    pl.add_argument(
        "--intent",
        default="inference",
        type=intent,
        metavar="{" + ",".join(INTENTS) + "}",
        help="what the model is loaded for: inference (default), full training, LoRA adapters, QLoRA "
        "(LoRA on an nf4-quantized base), or serving (continuous batching)",
    )
    pl.add_argument(
        "--seq-len",
        type=positive_int,
        metavar="N",
        help="tokens per sequence (default: the model's, at most 4096)",
    )
    pl.add_argument("--batch-size", type=positive_int, metavar="N", help="sequences per batch (default 1)")
    pl.add_argument(
        "--new-tokens",
        type=positive_int,
        metavar="N",
        help="of --seq-len, how many tokens generate() adds (picks measured attention timings closer; with "
        "--generate-calls, the decode work --decode weighs)",
    )
    pl.add_argument(
        "--generate-calls",
        type=positive_int,
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


def _add_choices(pl: argparse.ArgumentParser) -> None:
    """The choices the plan makes unless told: attention, dtype, quantization, offload, packages, kernels, loader."""
    from ...detection.packages import DISTRIBUTIONS

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
        type=packages,
        metavar="PKG,...",
        help=f"treat these packages as installed and usable (one of: {pkgs})",
    )
    pl.add_argument(
        "--assume-missing", type=packages, metavar="PKG,...", help="treat these packages as absent"
    )
    pl.add_argument(
        "--kernels",
        default="auto",
        choices=["auto", "on", "off"],
        help="Hub kernels: auto uses them only when every one passes preflight; on keeps those that pass",
    )
    pl.add_argument(
        "--trust-kernels",
        type=comma_list,
        metavar="REPO,...",
        help="Hub kernel repos (org/name) or publishers (org/*) whose code may run; also CUDALOAD_TRUST_KERNELS",
    )
    pl.add_argument(
        "--fast",
        default="auto",
        choices=["auto", "on", "off"],
        help="cudaload's fast safetensors loader: auto uses it where it is known to beat from_pretrained",
    )


def _add_training(pl: argparse.ArgumentParser) -> None:
    """Training's step: optimizer, checkpointing, packed or padded batches, tokens a step, loss."""
    from ...policies.memory import OPTIMIZERS

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
        type=positive_int,
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


def _add_gpus(pl: argparse.ArgumentParser) -> None:
    """Several GPUs: the parallelism, and whether inference trades throughput for latency."""
    from ...policies.parallelism import REQUESTS

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


def run(args: argparse.Namespace) -> int:
    req = checked_request(
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
        kernels=ON_OFF[args.kernels],
        trust_kernels=args.trust_kernels or (),
        fast=ON_OFF[args.fast],
        optimizer=args.optimizer,
        gradient_checkpointing=ON_OFF[args.gradient_checkpointing],
        parallelism=args.parallelism,
        lower_latency=args.lower_latency,
        batch_layout=args.batch_layout,
        tokens_per_step=args.tokens_per_step,
        loss=args.loss,
    )
    from ...planner import plan_request

    p = plan_request(req)  # the request checked above, planned as cudaload.plan() plans it
    print(p.to_json() if args.json else as_flags(p.explain()))
    return 0
