"""Loss functions against hand-computed numbers, plus property tests for NaN safety."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from agentrl.learner.losses import (LossSettings, action_level_ratio, aggregate, entropy_from_logits, importance_log_ratio,
                                    inputs_finite, kl_penalty, loss_denominator, policy_loss, ppo_clip_token_losses,
                                    rollout_is_weights, token_logprobs)


def log(x):
    return math.log(x)


# ------------------------------------------------------------------------------------------ PPO clip
def test_clip_low_high_positive_advantage():
    log_ratio = torch.tensor([[log(0.5), 0.0, log(1.5)]])
    loss, clipped, dual = ppo_clip_token_losses(log_ratio, torch.tensor([1.0]), 0.2, 0.3, dual_clip_c=3.0)
    # r=0.5: max(-0.5, -0.8) = -0.5 (not clipped); r=1: -1; r=1.5: max(-1.5, -1.3) = -1.3 (clipped at 1+0.3)
    assert torch.allclose(loss, torch.tensor([[-0.5, -1.0, -1.3]]), atol=1e-6)
    assert clipped.tolist() == [[0.0, 0.0, 1.0]]
    assert dual.tolist() == [[0.0, 0.0, 0.0]]


def test_clip_low_high_negative_advantage_and_dual_clip():
    log_ratio = torch.tensor([[log(0.5), log(1.5), log(4.0)]])
    loss, clipped, dual = ppo_clip_token_losses(log_ratio, torch.tensor([-2.0]), 0.2, 0.3, dual_clip_c=3.0)
    # A=-2: r=0.5: max(1.0, 1.6) = 1.6 (clipped at 1-0.2); r=1.5: max(3.0, 2.6) = 3.0;
    # r=4: max(8.0, 2.6) = 8.0, dual clip caps at -A*c = 6.0
    assert torch.allclose(loss, torch.tensor([[1.6, 3.0, 6.0]]), atol=1e-6)
    assert clipped.tolist() == [[1.0, 0.0, 0.0]]
    assert dual.tolist() == [[0.0, 0.0, 1.0]]
    loss_no_dual, _, dual_off = ppo_clip_token_losses(log_ratio, torch.tensor([-2.0]), 0.2, 0.3, dual_clip_c=0.0)
    assert torch.allclose(loss_no_dual, torch.tensor([[1.6, 3.0, 8.0]]), atol=1e-6)
    assert dual_off.sum() == 0


def test_dual_clip_bound_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip_c"):
        LossSettings(dual_clip_c=0.5)


def test_clipped_token_has_no_gradient():
    log_ratio = torch.tensor([[log(1.5), log(1.1)]], requires_grad=True)
    loss, _, _ = ppo_clip_token_losses(log_ratio, torch.tensor([1.0]), 0.2, 0.2)
    loss.sum().backward()
    assert log_ratio.grad[0, 0] == 0.0
    assert log_ratio.grad[0, 1] == pytest.approx(-1.1, abs=1e-6)  # d(-r)/d(log r) = -r


# --------------------------------------------------------------------------------------- aggregation
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (1 + 2 + 3 + 4) / 4),          # 2.5
    ("seq-mean-token-mean", (2.0 + 4.0) / 2),     # row means 2 and 4; the empty row is left out
    ("seq-mean-token-sum", (6.0 + 4.0) / 2),      # row sums 6 and 4
])
def test_aggregation_modes(mode, expected):
    assert float(aggregate(VALUES, MASK, mode)) == pytest.approx(expected)


def test_aggregation_with_global_denominator_adds_up_over_micro_batches():
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        whole = aggregate(VALUES, MASK, mode)
        denom = loss_denominator(MASK, mode)
        parts = sum(aggregate(VALUES[i:i + 1], MASK[i:i + 1], mode, denom) for i in range(3))
        assert float(parts) == pytest.approx(float(whole)), mode


def test_aggregation_ignores_non_finite_padding_and_empty_mask():
    values = torch.tensor([[1.0, float("nan")]])
    assert float(aggregate(values, torch.tensor([[1.0, 0.0]]), "token-mean")) == 1.0
    assert float(aggregate(values, torch.zeros(1, 2), "seq-mean-token-sum")) == 0.0


# ----------------------------------------------------------------------------------------------- KL
def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([log(0.5)]), torch.tensor([log(0.25)])
    assert float(kl_penalty(logp, ref, "k1")) == pytest.approx(log(2.0))
    assert float(kl_penalty(logp, ref, "k2")) == pytest.approx(0.5 * log(2.0) ** 2)
    # d = log(ref/p) = log 0.5: exp(d) - d - 1 = 0.5 + log 2 - 1
    assert float(kl_penalty(logp, ref, "low_var_kl")) == pytest.approx(0.5 + log(2.0) - 1.0)
    assert float(kl_penalty(logp, logp, "low_var_kl")) == 0.0


def test_low_var_kl_is_clamped():
    # d = 30 is clamped to 20, exp(20) - 21 is clamped to 10
    assert float(kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl")) == 10.0
    # d = -50 -> -20: exp(-20) + 19 ~ 19, clamped to 10
    assert float(kl_penalty(torch.tensor([0.0]), torch.tensor([-50.0]), "low_var_kl")) == 10.0


def test_unknown_kl_type():
    with pytest.raises(ValueError, match="kl_type"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k9")


# ------------------------------------------------------------------------------------------ entropy
def test_entropy_from_logits():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0], [log(3.0), 0.0, -1e9, -1e9]]])
    ent = entropy_from_logits(logits)
    # uniform over 4: log 4; nearly one-hot: 0; probs (3/4, 1/4): -(0.75 log 0.75 + 0.25 log 0.25)
    expected = [log(4.0), 0.0, -(0.75 * log(0.75) + 0.25 * log(0.25))]
    assert torch.allclose(ent[0], torch.tensor(expected), atol=1e-5)


def test_token_logprobs_matches_log_softmax():
    logits = torch.tensor([[[1.0, 2.0, 3.0]]])
    expected = 2.0 - math.log(math.exp(1) + math.exp(2) + math.exp(3))
    assert float(token_logprobs(logits, torch.tensor([[1]]))) == pytest.approx(expected, abs=1e-6)


# ----------------------------------------------------------------------------- action-level ratio
def test_action_level_ratio_broadcasts_one_ratio_per_action():
    logp = torch.tensor([[-1.0, -2.0, -5.0], [-1.0, -1.0, -1.0]])
    old = torch.tensor([[-1.5, -1.5, 0.0], [-1.2, -1.4, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    per_token = importance_log_ratio(logp, old, mask, action_level=True)
    # row 0: mean(0.5, -0.5) = 0 over its two trained tokens; row 1: mean(0.2, 0.4, 0) = 0.2
    assert torch.allclose(per_token, torch.tensor([[0.0] * 3, [0.2] * 3]), atol=1e-6)
    assert torch.allclose(per_token[:, 0].exp(), action_level_ratio(logp, old, mask), atol=1e-6)
    token_level = importance_log_ratio(logp, old, mask, action_level=False)
    assert torch.allclose(token_level[0, :2], torch.tensor([0.5, -0.5]))


def test_action_level_ratio_changes_the_policy_loss():
    logp = torch.tensor([[log(1.5), log(0.5)]])
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    adv = torch.tensor([1.0])
    token = policy_loss(logp, old, adv, mask, LossSettings(dual_clip_c=0.0))
    action = policy_loss(logp, old, adv, mask, LossSettings(dual_clip_c=0.0, action_level_ratio=True))
    # token level: mean(max(-1.5, -1.2), max(-0.5, -0.8)) = mean(-1.2, -0.5)
    assert token.metrics["pg_loss"] == pytest.approx((-1.2 - 0.5) / 2)
    # action level: r = sqrt(1.5 * 0.5) = 0.866 on both tokens, inside the clip range
    assert action.metrics["pg_loss"] == pytest.approx(-math.sqrt(0.75))


# -------------------------------------------------------------------------------------- full loss
def test_policy_loss_hand_computed_with_kl_and_entropy():
    logp = torch.tensor([[log(0.5), log(0.25)], [log(0.5), 0.0]], requires_grad=True)
    old = torch.tensor([[log(0.5), log(0.5)], [log(0.25), 0.0]])
    ref = torch.tensor([[log(0.25), log(0.25)], [log(0.5), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    entropy = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    s = LossSettings(clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip_c=3.0, loss_agg_mode="token-mean",
                     kl_coef=0.1, kl_type="k1", entropy_coef=0.01)
    out = policy_loss(logp, old, adv, mask, s, ref_logprobs=ref, entropy=entropy)
    # ratios 1, 0.5 (A=+1) and 2 (A=-1): token losses -1, max(-0.5, -0.8) = -0.5, max(2, 1.2) = 2
    pg = (-1.0 - 0.5 + 2.0) / 3
    kl = (log(2.0) + 0.0 + 0.0) / 3
    ent = (1.0 + 2.0 + 3.0) / 3
    assert out.finite
    assert out.metrics["pg_loss"] == pytest.approx(pg)
    assert out.metrics["kl_ref"] == pytest.approx(kl)
    assert out.metrics["entropy"] == pytest.approx(ent)
    assert float(out.loss) == pytest.approx(pg + 0.1 * kl - 0.01 * ent)
    # no token is clipped: the pessimistic (unclipped) term wins at r=0.5 with A>0 and r=2 with A<0
    assert out.metrics["pg_clipfrac"] == 0.0
    assert out.metrics["ratio_mean"] == pytest.approx((1.0 + 0.5 + 2.0) / 3)
    assert out.metrics["ratio_max"] == pytest.approx(2.0)
    assert out.metrics["ratio_min"] == pytest.approx(0.5)
    assert out.metrics["approx_kl"] == pytest.approx((0.0 + log(2.0) - log(2.0)) / 3, abs=1e-6)
    assert out.num_tokens == 3.0
    out.loss.backward()
    assert torch.isfinite(logp.grad).all()


# ------------------------------------------------------------------ truncated importance sampling
def test_rollout_is_weights_hand_computed():
    old = torch.tensor([[0.0, log(0.3), log(0.6), log(0.1)]])
    rollout = torch.tensor([[0.0, log(0.2), log(0.2), log(0.5)]])
    weights, capped = rollout_is_weights(old, rollout, cap=2.0)
    # pi_old / pi_rollout = 1, 1.5, 3 (capped at 2), 0.2
    assert torch.allclose(weights, torch.tensor([[1.0, 1.5, 2.0, 0.2]]), atol=1e-6)
    assert capped.tolist() == [[False, False, True, False]]


def test_rollout_is_weights_scale_each_tokens_policy_gradient():
    old = torch.log(torch.tensor([[0.3, 0.6, 0.5]]))
    rollout = torch.log(torch.tensor([[0.2, 0.2, 0.5]]))          # weights 1.5, 2 (3 capped), 1
    mask = torch.ones(1, 3)
    advantages = torch.tensor([2.0])
    settings = LossSettings(entropy_coef=0.0, kl_coef=0.0, rollout_is_cap=2.0)
    logprobs = old.clone().requires_grad_(True)                   # ratio 1: loss -A per token
    out = policy_loss(logprobs, old, advantages, mask, settings, rollout_logprobs=rollout)
    assert float(out.loss) == pytest.approx(-2.0 * (1.5 + 2.0 + 1.0) / 3)
    out.loss.backward()
    # d/dlogp of -A w r / 3 at r = 1: -A w / 3, the weight a constant
    assert torch.allclose(logprobs.grad, torch.tensor([[-1.0, -4.0 / 3, -2.0 / 3]]), atol=1e-6)
    assert out.metrics["rollout_is_weight"] == pytest.approx(1.5) and out.metrics["rollout_is_capped"] == pytest.approx(1 / 3)
    # off: the rollout's log-probs are not used, the weight reported is 1
    plain = policy_loss(old, old, advantages, mask, LossSettings(entropy_coef=0.0, kl_coef=0.0), rollout_logprobs=rollout)
    assert float(plain.loss) == pytest.approx(-2.0)
    assert plain.metrics["rollout_is_weight"] == 1.0 and plain.metrics["rollout_is_capped"] == 0.0


def test_rollout_is_cap_settings_are_checked():
    with pytest.raises(ValueError, match="rollout_is_cap"):
        LossSettings(rollout_is_cap=0.5)
    mask, old = torch.ones(1, 2), torch.zeros(1, 2)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        policy_loss(old, old, torch.tensor([1.0]), mask, LossSettings(kl_coef=0.0, rollout_is_cap=2.0))


def test_policy_loss_requires_ref_when_kl_is_on():
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), LossSettings(kl_coef=0.1))


@pytest.mark.parametrize("where", ["advantages", "logprobs", "old_logprobs", "ref_logprobs"])
def test_non_finite_inputs_are_flagged(where):
    tensors = dict(logprobs=torch.full((2, 3), -1.0), old_logprobs=torch.full((2, 3), -1.0),
                   advantages=torch.ones(2), ref_logprobs=torch.full((2, 3), -1.0))
    tensors[where][1] = float("nan") if where != "logprobs" else float("-inf")
    out = policy_loss(tensors["logprobs"], tensors["old_logprobs"], tensors["advantages"], torch.ones(2, 3),
                      LossSettings(kl_coef=0.1), ref_logprobs=tensors["ref_logprobs"])
    assert not out.finite
    assert out.loss.grad_fn is None and float(out.loss) == 0.0


def test_non_finite_padding_is_not_flagged():
    logp = torch.tensor([[-1.0, float("nan")]])
    assert inputs_finite(torch.tensor([[1.0, 0.0]]), torch.ones(1), logp)
    assert not inputs_finite(torch.tensor([[1.0, 1.0]]), torch.ones(1), logp)


finite = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.data(),
       st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]),
       st.sampled_from(["k1", "k2", "low_var_kl"]), st.booleans())
def test_random_finite_inputs_give_finite_loss_and_gradients(n, r, data, mode, kl_type, action_level):
    def tensor(shape, strategy):
        return torch.tensor(data.draw(st.lists(strategy, min_size=math.prod(shape), max_size=math.prod(shape)))
                            ).reshape(shape)

    logp = tensor((n, r), finite).requires_grad_(True)
    old, ref = tensor((n, r), finite), tensor((n, r), finite)
    adv = tensor((n,), st.floats(-1e3, 1e3, allow_nan=False))
    mask = tensor((n, r), st.sampled_from([0.0, 1.0]))
    entropy = tensor((n, r), st.floats(0.0, 10.0))
    s = LossSettings(loss_agg_mode=mode, kl_type=kl_type, kl_coef=0.05, entropy_coef=0.01,
                     action_level_ratio=action_level)
    out = policy_loss(logp, old, adv, mask, s, ref_logprobs=ref, entropy=entropy)
    assert out.finite
    assert torch.isfinite(out.loss)
    assert all(math.isfinite(v) for v in out.metrics.values())
    out.loss.backward()
    assert torch.isfinite(logp.grad).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 100),
       st.sampled_from([float("nan"), float("inf"), float("-inf")]))
def test_any_non_finite_trained_value_is_flagged(n, r, pos, bad):
    logp = torch.full((n, r), -1.0)
    logp.view(-1)[pos % (n * r)] = bad
    out = policy_loss(logp, torch.full((n, r), -1.0), torch.ones(n), torch.ones(n, r), LossSettings())
    assert not out.finite
