"""The memory model's figures.

Every constant here is named and says where it comes from. Measured figures are from the H200 machine
(torch 2.11 + cu130, transformers 5.17, bitsandbytes 0.50.2; /work/shared/device/README.md):
Qwen3-8B shape bf16 15.26 GiB allocated = peak; nf4 (double quant, bf16 compute) 5.70 allocated / 5.91
peak; int8 12.18 allocated / 12.61 peak.
"""

from __future__ import annotations

MiB = 1 << 20
GiB = 1 << 30

#: Device memory outside the tensors a model allocates: the CUDA context, cuBLAS/cuDNN handles and
#: workspaces loaded at the first matmul, and the caching allocator's reserved-but-free slack. Measured on the
#: H200 (torch 2.11 + cu130) as device memory used at a forward's peak minus the allocator's allocated peak:
#: 0.63-0.76 GiB across Qwen3 0.6B/8B in bf16 and nf4 (benchmarks/results/2026-11-29-h200/results.md).
CUDA_CONTEXT_BYTES = 700 * MiB

#: nf4: 4 bits per weight, one absmax per 64-weight block. With double quantisation the absmax is itself
#: an 8-bit value (1 byte / 64 weights) plus an fp32 scale per 256 blocks; without, an fp32 absmax per block.
NF4_BYTES_PER_PARAM = 0.5
NF4_ABSMAX_DOUBLE_QUANT = 1 / 64 + 4 / (64 * 256)
NF4_ABSMAX_PLAIN = 4 / 64

#: int8 (LLM.int8, bitsandbytes 0.50.2) as measured on the H200 with cudaload's BitsAndBytesConfig: the
#: Qwen3-8B shape allocated 8.79 GiB after loading = 6.95 G quantised parameters at ~1.0 byte (int8 weight;
#: the fp32 row scales are ~0.1%) + 1.24 G bf16 embedding/head parameters; the 0.6B shape 744 MiB (1.07).
#: (shared/device/README.md quotes 12.18 GiB for an int8 8B load made outside cudaload; we plan with what
#: cudaload's own loads allocated, measured in the same run as the other terms.)
INT8_BYTES_PER_PARAM = 1.02

#: 8-bit optimizer states (bitsandbytes 0.50.2 Optimizer2State, optim_bits=8): exp_avg and exp_avg_sq as uint8
#: plus one fp32 absmax per 256-value block for each (blockwise quantization; bitsandbytes/optim/optimizer.py).
#: Parameters under 4096 elements keep 32-bit states (min_8bit_size): norms, negligible.
ADAM8BIT_BYTES_PER_PARAM = 2 + 2 * 4 / 256

#: The loss over the full vocabulary, per logit, as transformers 5.17 computes it (loss/loss_utils.py:59
#: ``logits = logits.float()``, then cross_entropy): the logits in the head's dtype, their fp32 copy, the
#: fp32 log-softmax that cross_entropy saves, and in backward its fp32 gradient; the forward and the backward
#: phases each hold about three of these (bf16 head: 2 + 4 + 4 forward, 4 + 4 + 4 backward): 12 bytes.
LOSS_BYTES_PER_LOGIT = 12

#: cudaload's chunked loss (:mod:`cudaload.execute.chunked_loss`): rows of the step's hidden states taken through
#: the output head a chunk at a time. Liger sizes a chunk so its logits are about the size of the hidden states
#: (liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py:38-43: ``inc_factor = cdiv(V, H)``,
#: ``chunk_size = next_power_of_2(cdiv(BT, inc_factor))``); cudaload keeps that rule with a floor, so that a short
#: step's chunks stay GEMMs that read the head's weight once per CHUNK_MIN_ROWS rows, not per few rows
CHUNK_MIN_ROWS = 256


def chunk_rows(tokens: int, hidden: int, vocab: int) -> int:
    """Rows of hidden states a chunk of cudaload's chunked loss takes through the head: Liger's rule (the chunk's
    logits about the size of the step's hidden states), a power of two, at least :data:`CHUNK_MIN_ROWS` and at
    most ``tokens`` (at least 1)."""
    if tokens <= 0 or hidden <= 0 or vocab <= 0:
        raise ValueError(
            f"chunk_rows needs positive sizes, got tokens={tokens}, hidden={hidden}, vocab={vocab}"
        )
    per = -(-tokens * hidden // vocab)
    rows = 1 << max(0, (per - 1).bit_length())
    return max(1, min(tokens, max(CHUNK_MIN_ROWS, rows)))


#: The caching allocator's reserved-but-unusable bytes at a training step's peak, per logit of the step (batch
#: x seq_len x vocab). The loss's fp32 logit tensors are the step's largest allocations; once freed, their
#: segments are split for the backward's smaller tensors and cannot be returned while any part is in use.
#: Fitted to the longest seq_len that trained on six emulated cards, never planning past one (benchmarks/
#: compare_memory_train.py; benchmarks/results/2026-12-01-h200/README.md, "Full fine-tuning memory").
ALLOCATOR_SLACK_PER_LOGIT = 2.25
#: The same slack with cudaload's chunked loss and every layer checkpointed: its largest allocation is one chunk's
#: logits, not the step's, and the five capped-card boundaries it trained at on an H100 (benchmarks/results/
#: 2026-12-07-h100/gpu9 and 2026-12-07-s19/gpu1: Llama-3.1-8B QLoRA at 7,680 and 23,296 tokens, LoRA at 11,008,
#: Qwen3-0.6B full at 13,056 and 23,296) reserved 0.37-0.94 bytes per logit above their allocated peak, where
#: 2.25 was planned: 1.0, above all five. Without checkpointing no chunked run was measured on a capped card (an
#: uncapped allocator caches freely, so its reserved peak says nothing of the slack a boundary needs), and
#: Liger's fused loss left 3.8 bytes per logit unusable at its out-of-memory point without checkpointing
#: (2026-12-03-h200 run39): both keep ALLOCATOR_SLACK_PER_LOGIT.
CHUNKED_SLACK_PER_LOGIT = 1.0

#: Eager attention materialises per layer and head a seq_len x seq_len score matrix. Inference: the scores,
#: the masked scores, the fp32 softmax and its copy in the dtype (the H200 measured 28.4 vs 19.2 GiB for
#: eager vs sdpa at batch 8 x 2048 on the Qwen3-8B shape: 9.2 bytes per element; 3 x 2 + 4 = 10 planned).
#: Training keeps the fp32 softmax and the dtype copy of every layer for backward (6 bytes per element
#: with bf16), and the layer being differentiated needs its gradients (2 + 4 + 4 + 2 bytes).
EAGER_SAVED_FP32 = 4
EAGER_BACKWARD_BYTES = 12

#: torch's sdpa has no fused kernel for fp32 q/k/v with grouped kv heads (enable_gqa, which transformers'
#: sdpa_attention passes when there is no mask, use_gqa_in_sdpa): flash and cuDNN attention take only fp16/bf16
#: (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_dtypes_low_precision), and the memory-efficient
#: kernel is listed there with check_batch_size_and_num_heads_dense<false /*supports_grouped_query_attention*/>
#: (the torch 2.x source; a later release may admit GQA there: the measurement below, not that source, is what
#: this term rests on), so sdpa falls back to its math path, which materialises the scores like eager
#: attention. QLoRA runs exactly that: prepare_model_for_kbit_training's fp32 norms make the residual stream fp32
#: and bitsandbytes' Linear4bit returns its input's dtype (bitsandbytes 0.50.2 nn/modules.py:626,637). Measured
#: on the H200 (benchmarks/results/2026-12-01-h200/run1-memtrain/results.json), Qwen3-8B QLoRA, checkpointing on,
#: sdpa: the peak grows by 16.08 bytes per head and score of the one layer recomputed (least squares over ten
#: points of 3328-11264 tokens, see ATTENTION_BACKWARD_ACTS): the fp32 softmax kept (4) and in backward three
#: fp32 score-sized tensors at once (the probabilities' gradient, the scores' gradient and the math path's
#: own temporary: 12); without checkpointing the fit over batch 1 x 512 / 2048 and 4 x 512 gives 4.0 bytes per
#: score and layer kept (the softmax), as EAGER_SAVED_FP32 says.
#: bf16 LoRA at 8192 x 1 and 2048 x 4 peaked the same (32.10 / 32.09 GiB): flash attention, no such term.
FP32_SCORES_BACKWARD_BYTES = 12
#: The attention's backward with materialised scores: q/k/v, the rotated q/k and the output (3q + 3kv in the
#: activations' dtype) and as many gradients; the MLP's saved tensors are already freed then. The same run's
#: ten QLoRA points of 3328-11264 tokens (checkpointing on, batch 1; 76.8 GiB at 11264) fit, above the
#: checkpointed inputs, 107 KiB per token and 16.08 bytes per head and score (residuals under 0.03 GiB):
#: 120 KiB and 4 + 12 bytes here.
ATTENTION_BACKWARD_ACTS = 2

#: Adafactor (transformers 5.17 optimization.py:1221-1276) steps each parameter with fp32 temporaries: the
#: gradient in fp32 (1220-1221), the parameter in fp32 for bf16 weights (1252-1254), and ``update = (grad**2)
#: + eps`` (1261), where ``grad**2`` and the sum are alive together (the later ``update`` reassignments hold
#: two at once too): four fp32 copies of the largest parameter (the embedding or output head) at the step's
#: peak. Measured on the H200 (benchmarks/results/2026-12-01-h200/run7-memtrain2): the step added 9.29 GiB
#: above weights + gradients for the Qwen3-8B shape (4.0 x its 2.32 GiB fp32 embedding) and 2.44 GiB for the
#: 0.6B shape (4.2 x 0.58 GiB).
ADAFACTOR_STEP_FP32_COPIES = 4

#: Tied input embedding and output head, every parameter trained: the head's gradient is the tied weight's
#: ``.grad`` from the start of backward, and the embedding's dense gradient (vocab x hidden) arrives at its
#: end, when every other gradient exists, and is accumulated into it. Measured on the H200 (benchmarks/results/2026-12-01-h200/run7-memtrain2,
#: Qwen3-0.6B shape, tied, 512 tokens, where this phase is the peak): with bf16 weights sgd, paged 8-bit AdamW
#: and 8-bit AdamW peaked 0.66-0.70 GiB above weights + gradients + optimizer states + one layer, with fp32
#: master weights (fused AdamW) 0.58 GiB: about one fp32 vocab x hidden matrix (0.58 GiB) whatever the
#: weights' dtype, plus transients already counted. The untied Qwen3-8B shape peaked at exactly weights +
#: gradients (sgd: 30.58 = 15.32 + 15.26 GiB): no such term. Bytes per vocab x hidden element.
TIED_GRAD_EXTRA_BYTES = 4

#: Optimizers cudaload plans with, in transformers' TrainingArguments(optim=...) vocabulary.
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd")
#: Those that need bitsandbytes.
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")

#: LoRA defaults cudaload plans with (LoraConfig kwargs in the plan). Dropout is PEFT's own default (peft 0.21
#: tuners/lora/config.py ``lora_dropout: float = 0.0``): no copy of each adapted layer's input
LORA_R = 16
LORA_ALPHA = 32
LORA_DROPOUT = 0.0
