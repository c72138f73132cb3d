"""The library's keywords as the CLI's flags: :func:`as_flags` rewrites every message the CLI prints."""

from __future__ import annotations

import re

#: Python keyword -> the ``cudaload plan`` flag that sets it. The library's messages name keywords
#: (``allow_offload=True``); the CLI prints them as flags (``--allow-offload``). The one place the two
#: spellings meet: a flag added to ``cudaload plan`` (cudaload.commands.cli.plan) gets its keyword here.
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
