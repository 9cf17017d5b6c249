"""The fidelity judge (swarmkv.pipeline.fidelity.compare, measuring.md) on synthetic logits:
a real bug must be rejected even where the old max-|diff| rule accepted it, a true near-tie
accepted."""

from __future__ import annotations

import numpy as np
import pytest

from swarmkv.pipeline.fidelity import NEAR_TIE_SIGMAS, compare

VOCAB = 262_144  # Gemma 3's vocabulary
RNG = np.random.default_rng(0)


def _steps(top: int, runner_up: int, margin: float) -> list[np.ndarray]:
    base = RNG.normal(0.0, 2.0, VOCAB).astype(np.float32)
    base[top], base[runner_up] = 20.0, 20.0 - margin
    return [base]


def _noisy(base: list[np.ndarray], sd: float) -> list[np.ndarray]:
    return [(b + RNG.normal(0.0, sd, VOCAB)).astype(np.float32) for b in base]


def test_a_uniform_shift_of_one_token_is_a_bug() -> None:
    base = _steps(10, 11, margin=0.5)
    mine = _noisy(base, 1e-3)
    mine[0][11] += 1.0  # a bug: one token's logit shifted, so it wins
    fid = compare([11], [10], mine, base, replay_tokens=[10])
    assert not fid.near_tie and not fid.ok
    assert "NOT a near-tie: bug" in fid.describe()
    # the old rule (margin < max |diff|) would have accepted it: that is what changed
    assert fid.margin is not None and fid.margin < float(np.abs(mine[0] - base[0]).max())


def test_a_true_near_tie_is_accepted_and_named() -> None:
    base = _steps(10, 11, margin=1e-3)
    mine = _noisy(base, 1e-3)
    mine[0][11] = mine[0][10] + 1e-4  # batching noise flipped a 0.001 gap
    fid = compare([11, 5], [10, 6], mine, base, replay_tokens=[10, 6])
    assert fid.diff_std is not None and fid.margin < NEAR_TIE_SIGMAS * fid.diff_std
    assert fid.near_tie and fid.ok
    assert "near-tie" in fid.describe() and "replay matches" in fid.describe()


@pytest.mark.parametrize(("replay", "exact"), [(None, False), ([11, 5], False), ([10, 6], True)])
def test_a_near_tie_needs_a_matching_replay_and_a_mode_that_is_not_exact(
    replay: list[int] | None, exact: bool
) -> None:
    base = _steps(10, 11, margin=1e-3)
    mine = _noisy(base, 1e-3)
    mine[0][11] = mine[0][10] + 1e-4
    fid = compare([11, 5], [10, 6], mine, base, replay_tokens=replay, exact=exact)
    assert not fid.near_tie and not fid.ok


def test_exact_mode_fails_on_any_logit_difference_even_with_equal_tokens() -> None:
    base = _steps(10, 11, margin=5.0) * 2
    mine = [b.copy() for b in base]
    assert compare([10, 10], [10, 10], mine, base, exact=True).ok
    mine[1][3] = np.nextafter(mine[1][3], np.float32(np.inf))  # one ulp, at step 1
    fid = compare([10, 10], [10, 10], mine, base, exact=True)
    assert fid.tokens_equal and fid.logits_equal is False and not fid.ok
    assert fid.first_nmse == 0.0  # step 0 is equal: the check looks at every kept step
    assert "logits differ (exact: failure)" in fid.describe()
    relaxed = compare([10, 10], [10, 10], mine, base)  # not exact: equal tokens pass
    assert relaxed.ok and "failure" not in relaxed.describe()
