"""The runner's samplers (numpy only): greedy, repetition penalty, the run cap, top-k, top-p."""

import numpy as np

from edgettt.runner import Sampling

RNG = np.random.default_rng(0)


def test_greedy_without_penalties_is_argmax():
    logits = np.array([0.1, 2.0, 1.9, -1.0])
    assert Sampling(repetition_penalty=1.0, max_run=0).pick(logits, [1, 1, 1], RNG) == 1


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_recent_tokens():
    logits = np.array([2.0, 2.1, -1.0, -1.05])
    assert Sampling(repetition_penalty=1.1).pick(logits, [1], RNG) == 0  # 2.1 / 1.1 < 2.0
    assert Sampling(repetition_penalty=1.1, repeat_last_n=1).pick(logits, [1, 0], RNG) == 1  # only the last counts
    greedy = Sampling(repetition_penalty=1.2, max_run=0)
    assert greedy.pick(np.array([-5.0, -1.0, -1.1]), [1], RNG) == 2  # -1 * 1.2 < -1.1


def test_a_run_is_capped():
    logits = np.array([5.0, 1.0])
    s = Sampling(repetition_penalty=1.0, max_run=3)
    assert s.pick(logits, [0, 0], RNG) == 0 and s.pick(logits, [0, 0, 0], RNG) == 1
    assert s.pick(logits, [1, 0, 0], RNG) == 0


def test_top_k_and_top_p_keep_only_the_likeliest():
    logits = np.array([3.0, 2.9, 0.0, -1.0])
    rng = np.random.default_rng(1)
    picks = {Sampling(temperature=1.0, top_k=2, repetition_penalty=1.0).pick(logits, [], rng) for _ in range(200)}
    assert picks == {0, 1}
    picks = {Sampling(temperature=1.0, top_p=0.3, repetition_penalty=1.0).pick(logits, [], rng) for _ in range(200)}
    assert picks == {0}
    picks = {Sampling(temperature=1.0, repetition_penalty=1.0).pick(logits, [], rng) for _ in range(2000)}
    assert picks == {0, 1, 2, 3}
