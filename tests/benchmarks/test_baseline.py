"""The baseline loads the model as sentence-transformers does and keeps rotary frequencies in float32
through dtype changes: a Qwen3 cast in place to bf16 rounds them, which moved the "fp32 reference" of a
4096-token text by a cosine of 0.006 and failed posy's parity gate for the baseline's own error."""

import torch

from benchmarks.baseline import Baseline
from benchmarks.checkpoints import save_qwen3


def test_rotary_frequencies_stay_float32_and_the_shared_reference_is_untouched(tmp_path):
    checkpoint = save_qwen3(tmp_path, "smoke")
    exact = checkpoint.reference.rotary_emb.inv_freq.clone()
    baseline = Baseline(checkpoint, "cpu", torch.bfloat16)
    assert next(baseline.model.parameters()).dtype == torch.bfloat16
    for dtype in (torch.bfloat16, torch.float32, torch.bfloat16):
        baseline.to(dtype)
        assert next(baseline.model.parameters()).dtype == dtype
        torch.testing.assert_close(baseline.model.rotary_emb.inv_freq, exact, rtol=0, atol=0)
    assert next(checkpoint.reference.parameters()).dtype == torch.float32
