"""docs/plan-schema.md states the memory model's numbers; they must be the code's constants (issue 15: the
doc said int8 1.52 bytes/param and a 500 MiB context while the code used 1.02 and 700 MiB)."""

from __future__ import annotations

import re
from pathlib import Path

from cudaload.plans.plan import Plan
from cudaload.policies import memory as M

DOC = Path(__file__).resolve().parent.parent / "docs" / "plan-schema.md"


def _section() -> str:
    text = DOC.read_text()
    return text[text.index("## How the numbers are estimated") :]


def _num(pattern: str) -> float:
    m = re.search(pattern, _section())
    assert m, f"docs/plan-schema.md no longer states {pattern!r}"
    return float(m.group(1))


def test_doc_numbers_are_the_code_constants() -> None:
    assert _num(r"int8: ([0-9.]+) bytes per linear parameter") == M.INT8_BYTES_PER_PARAM
    assert _num(r"nf4: ([0-9.]+) \+") == M.NF4_BYTES_PER_PARAM
    m = re.search(r"absmax \(1/(\d+) \+ 4/(\d+) with double quantisation\)", _section())
    assert m and 1 / int(m.group(1)) + 4 / int(m.group(2)) == M.NF4_ABSMAX_DOUBLE_QUANT
    assert _num(r"`cuda_context`: (\d+) MiB per GPU") * M.MiB == M.CUDA_CONTEXT_BYTES
    assert _num(r"\(([0-9]+) bytes per logit") == M.LOSS_BYTES_PER_LOGIT
    assert _num(r"`adamw_8bit`: ([0-9.]+) bytes/param") == M.ADAM8BIT_BYTES_PER_PARAM
    assert _num(r"Adafactor makes (\d+) fp32 copies") == M.ADAFACTOR_STEP_FP32_COPIES
    assert _num(r"Eager keeps (\d+) \+ dtype bytes") == M.EAGER_SAVED_FP32
    assert _num(r"needs (\d+) in backward") == M.EAGER_BACKWARD_BYTES
    assert _num(r"kept and (\d+) more in backward") == M.FP32_SCORES_BACKWARD_BYTES
    assert _num(r"([0-9.]+) bytes per logit \(a little over half") == M.ALLOCATOR_SLACK_PER_LOGIT
    assert _num(r"([0-9.]+) bytes per logit with cudaload's chunked loss") == M.CHUNKED_SLACK_PER_LOGIT
    assert (
        _num(r"tied embedding and every parameter\s+trained, (\d+) bytes per vocab")
        == M.TIED_GRAD_EXTRA_BYTES
    )
    # inference eager: 3 x dtype + 4 bytes per score, 10 for bf16
    assert _num(r"eager adds\s+(\d+) bytes per attention score") == 3 * 2 + 4


def test_doc_names_every_memory_term_and_optimizer() -> None:
    from cudaload.model_info import model_info
    from cudaload.testing import full_config

    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `memory` |"))
    terms = M.estimate(
        model_info(full_config("Qwen3-0.6B")),
        dtype="bfloat16",
        quantization=None,
        intent="training",
        seq_len=512,
        batch_size=1,
    )
    terms.pop("total")
    for t in terms:
        assert f"`{t}`" in row, t
    opt_row = next(line for line in text.splitlines() if line.startswith("| `optimizer` |"))
    for o in M.OPTIMIZERS:
        assert f"`{o}`" in opt_row, o
    # every top-level key of a plan is documented
    keys = set(Plan.__dataclass_fields__) - {"quantization_config"}
    for k in keys:
        assert f"`{k}`" in text, k
