"""The ``cudaload`` command: env, doctor, plan, demo.

Each subcommand is a thin shell over the library: it parses arguments, calls the public function and
prints. Errors from cudaload are printed with their fix and exit 2; anything else is a bug and raises.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .errors import CudaloadError


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


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


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose

    report = diagnose(_hardware(args.hardware))
    print(report.render())
    return 0 if report.ok else 1


def _cmd_plan(args: argparse.Namespace) -> int:
    from .planner import plan

    p = plan(
        args.model,
        hardware=args.hardware,
        intent=args.intent,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        attn=args.attn,
        dtype=args.dtype,
        quantization=args.quantization,
        allow_offload=args.allow_offload,
        assume_installed=_csv(args.assume_installed) if args.assume_installed else (),
        assume_missing=_csv(args.assume_missing) if args.assume_missing else (),
    )
    print(p.to_json() if args.json else p.explain())
    return 0


def _cmd_profiles(args: argparse.Namespace) -> int:
    from .profiles import describe

    print(describe())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run(kind=args.model, prompt=args.prompt, max_new_tokens=args.max_new_tokens, cpu=args.cpu)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="cudaload", description="Device-aware Hugging Face model loading.")
    p.add_argument("--version", action="version", version=f"cudaload {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log cudaload's decisions as they are made")
    sub = p.add_subparsers(dest="command", required=True)

    hw_help = "plan for this hardware instead of the real machine: a profile name (H100-SXM, 8xA100-80GB...) or a snapshot file"

    e = sub.add_parser("env", help="the machine as cudaload sees it")
    e.add_argument("--json", action="store_true", help="print the snapshot as JSON (a reusable profile)")
    e.add_argument("--hardware", help=hw_help)
    e.set_defaults(func=_cmd_env)

    d = sub.add_parser("doctor", help="verdicts: what works, what is misconfigured, and the fix")
    d.add_argument("--hardware", help=hw_help)
    d.set_defaults(func=_cmd_doctor)

    pl = sub.add_parser("plan", help="decide dtype, attention, quantization and placement for a model")
    pl.add_argument("model", help="a local model directory, a config.json, or a Hub id available offline")
    pl.add_argument("--hardware", help=hw_help)
    pl.add_argument("--intent", default="inference", choices=["inference", "training", "lora", "qlora"])
    pl.add_argument("--seq-len", type=int)
    pl.add_argument("--batch-size", type=int)
    pl.add_argument("--attn", default="auto")
    pl.add_argument("--dtype", default="auto")
    pl.add_argument("--quantization", default="auto", choices=["auto", "none", "int8", "nf4"])
    pl.add_argument(
        "--allow-offload", action="store_true", help="allow CPU/disk offload when nothing else fits"
    )
    pl.add_argument(
        "--assume-installed", metavar="PKG,...", help="treat these distributions as installed and usable"
    )
    pl.add_argument("--assume-missing", metavar="PKG,...", help="treat these distributions as absent")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(func=_cmd_plan)

    pr = sub.add_parser("profiles", help="list the named hardware profiles")
    pr.set_defaults(func=_cmd_profiles)

    de = sub.add_parser(
        "demo", help="detect, plan, load and generate with a tiny model made on the spot (offline)"
    )
    de.add_argument(
        "--model", default="qwen3", help="tiny model family to make (qwen3, llama, mistral, gemma2, ...)"
    )
    de.add_argument("--prompt", default="The fastest way to load a model is")
    de.add_argument("--max-new-tokens", type=int, default=16)
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
        print(f"cudaload: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `cudaload ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
