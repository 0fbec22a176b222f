"""Drift metrics against values computed by hand on tiny tensors."""

import math

import pytest
import torch

from edgettt import metrics


def test_perplexity_and_bits_per_byte():
    # uniform over 4 tokens: nll = ln 4 per token, ppl 4, 2 bits per token
    logits = torch.zeros(1, 3, 4)
    targets = torch.tensor([[0, 1, 2]])
    out = metrics.perplexity(logits, targets, n_bytes=3)
    assert out["ppl"] == pytest.approx(4.0) and out["bits_per_byte"] == pytest.approx(2.0)


def test_kld_top1_and_dp_by_hand():
    ref = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    new = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    out = metrics.drift(ref, new, torch.tensor([[0, 0]]), buckets=2)
    kld0 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert out["kld_mean"] == pytest.approx(kld0 / 2)
    assert out["kld_max"] == pytest.approx(kld0)
    assert out["kld_by_position"] == pytest.approx([kld0, 0.0])
    # position 0: ref's top is token 0 (tie, first index); the model prefers token 1
    assert out["top1"] == pytest.approx(0.5)
    assert out["rms_dp"] == pytest.approx(math.sqrt((0.25 ** 2 + 0) / 2))
    assert out["ppl_ratio"] == pytest.approx(math.exp((-math.log(0.25) - math.log(0.9)) / 2)
                                             / math.exp((-math.log(0.5) - math.log(0.9)) / 2))


def test_logit_error():
    ref = torch.tensor([3.0, 4.0])
    out = metrics.logit_error(ref, torch.tensor([3.0, 4.5]))
    assert out["max_abs_error"] == pytest.approx(0.5) and out["rel_error"] == pytest.approx(0.1)


def test_statistics_a_batch_at_a_time_equal_the_whole():
    """`token_stats` of batches of windows and spans of positions, put together, give what the whole logits
    give: the conversion report measures that way in the memory of one batch."""
    torch.manual_seed(0)
    ref, new = torch.randn(5, 12, 40) * 3, torch.randn(5, 12, 40) * 3
    targets = torch.randint(0, 40, (5, 12))
    whole = metrics.drift(ref, new, targets, n_bytes=100)
    parts = []
    for i in range(0, 5, 2):
        pieces = [metrics.token_stats(ref[i:i + 2, j:j + 5], new[i:i + 2, j:j + 5], targets[i:i + 2, j:j + 5])
                  for j in range(0, 12, 5)]
        parts.append(metrics.concat_stats(pieces, dim=1))
    stats = metrics.concat_stats(parts)
    assert metrics.drift_of(stats, n_bytes=100) == whole
    error = metrics.logit_error_of(stats)
    assert error["max_abs_error"] == metrics.logit_error(ref, new)["max_abs_error"]
    assert error["rel_error"] == pytest.approx(metrics.logit_error(ref, new)["rel_error"], rel=1e-12)
