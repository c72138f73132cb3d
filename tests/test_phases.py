"""plan.verified["phases"]: the fast paths' own split of the load is kept, quantized or not."""

from __future__ import annotations

from cudaload.execute.phases import Phases


def test_phases_keep_each_fast_paths_split() -> None:
    ph = Phases()
    ph.mark("detect")
    plain = ph.as_dict({"build_s": 0.1, "alloc_s": 0.2, "fill_s": 0.3, "finish_s": 0.4, "threads": 8})
    assert [k for k in plain if k.startswith("load.")] == [
        "load.build",
        "load.alloc",
        "load.fill",
        "load.finish",
    ]
    quant = ph.as_dict({"build_s": 0.1, "plain_s": 0.2, "quantize_s": 0.5, "finish_s": 0.4, "layers": 28})
    assert [k for k in quant if k.startswith("load.")] == [
        "load.build",
        "load.plain",
        "load.quantize",
        "load.finish",
    ]
    assert quant["load.quantize"] == 0.5 and "detect" in quant and quant["total"] >= quant["detect"]
    assert "load.build" not in ph.as_dict(None)
