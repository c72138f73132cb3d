"""Runtime helpers that only :mod:`cudaload.execute` runs: the checkpoint read ahead (``prefetch``) and the CUDA
context made (``gpu_start``) while transformers imports, cudaload_sdpa's attention (``sdpa_decode``), the
generate() loop with its late stop (``decode_loop``), the one-step attention probe's cache (``probes``) and FA4's
JIT cache directory (``fa4_cache``). The policies only name what these run; none imports them."""
