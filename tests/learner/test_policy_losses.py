"""The policy losses (agentrl/policy_losses) against verl and against their papers' formulas.

Each built-in loss, run through the learner's shared ``policy_loss`` (ratio, behaviour weight,
aggregation), is compared in float64 with

* verl's function, transcribed in tests/helpers/verl_policy_losses.py from volcengine/verl commit
  b178a3cd56f58b2d502255daba591e92833930a7, verl/trainer/ppo/core_algos.py: value and gradient to 1e-6,
  with and without the behaviour weights (verl's ``rollout_is_weights``);
* the published objective, written here independently (per step, as the paper states it).

The inputs have a row without trained tokens, a row whose advantage is 0 and ratios up to e^±15.
"""

import dataclasses
import math
import sys
import textwrap

import pytest
import torch

import verl_policy_losses as verl
from agentrl.errors import UsageError
from agentrl.learner.losses import LossSettings, aggregate, kl_penalty, loss_denominator, policy_loss
from agentrl.plugins import PluginError
from agentrl.policy_losses import LossTerms, PolicyLoss, build_policy_loss, builtin_policy_losses

F64 = torch.float64
LOW, HIGH = 0.2, 0.28
PARAMS = {"clip_cov": {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05, "clip_cov_ub": 5.0},
          "kl_cov": {"kl_cov_ratio": 0.1, "ppo_kl_coef": 0.3}, "sapo": {"tau_pos": 1.0, "tau_neg": 1.05}}


def inputs(seed=0, n=8, r=10):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, r, generator=g, dtype=F64) * 3 - 0.05
    delta = torch.randn(n, r, generator=g, dtype=F64) * 0.3
    mask = (torch.rand(n, r, generator=g) > 0.25).to(F64)
    mask[0] = 0.0                                   # a row without trained tokens
    delta[1, 0], delta[1, 1], delta[2, 3], delta[3, 2] = 15.0, -15.0, 6.0, -9.0     # extreme ratios
    mask[1, :2] = mask[2, 3] = mask[3, 2] = 1.0
    advantages = torch.randn(n, generator=g, dtype=F64)
    advantages[min(5, n - 1)] = 0.0                # a step whose advantage is 0
    rollout = old + torch.randn(n, r, generator=g, dtype=F64) * 0.5
    logprobs = (old + delta).requires_grad_()
    return logprobs, old, advantages, mask, rollout


def ours(name, logprobs, old, advantages, mask, rollout=None, cap=0.0, seed=11, **settings):
    s = LossSettings(policy_loss=name, loss_params=PARAMS.get(name), clip_ratio_low=LOW, clip_ratio_high=HIGH,
                     kl_coef=0.0, entropy_coef=0.0, rollout_is_cap=cap, **settings)
    torch.manual_seed(seed)
    out = policy_loss(logprobs, old, advantages, mask, s, rollout_logprobs=rollout)
    grad, = torch.autograd.grad(out.loss, logprobs)
    return out, grad


def verls(name, logprobs, old, advantages, mask, weights=None, mode="token-mean", seed=11):
    config = {"clip_ratio_low": LOW, "clip_ratio_high": HIGH, **PARAMS.get(name, {})}
    torch.manual_seed(seed)
    loss = verl.LOSSES[name](old, logprobs, advantages.unsqueeze(1).expand_as(mask), mask, mode, config, weights)
    if name == "gmpo":
        # verl averages over every row, the empty ones included (their loss is 0); agentrl over the rows
        # with a trained token, as its seq-mean modes do
        loss = loss * len(mask) / float((mask.sum(1) > 0).sum())
    grad, = torch.autograd.grad(loss, logprobs)
    return loss, grad


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------------------------------ verl
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "behaviour-weight"])
@pytest.mark.parametrize("name", list(verl.LOSSES))
def test_loss_equals_verl_value_and_gradient(name, weighted):
    logprobs, old, advantages, mask, rollout = inputs()
    cap = 2.0 if weighted else 0.0
    out, grad = ours(name, logprobs, old, advantages, mask, rollout if weighted else None, cap)
    weights = torch.exp(old - rollout).clamp(max=cap) if weighted else None
    loss, verl_grad = verls(name, logprobs, old, advantages, mask, weights)
    assert out.finite
    close(out.loss, loss)
    close(grad, verl_grad)
    assert grad[0].abs().sum() == 0                   # the row without trained tokens gets no gradient


def test_every_builtin_loss_is_compared_with_verl():
    assert set(builtin_policy_losses()) == set(verl.LOSSES)


# ---------------------------------------------------------------------------- published formulas
def steps(mask):
    return [i for i in range(len(mask)) if mask[i].sum() > 0]


def paper_value(name, logprobs, old, advantages, mask):
    """The objective as its paper writes it (negated: a loss), step by step."""
    lp, ol, A, m = logprobs, old, advantages, mask
    if name == "vanilla":                       # PPO-clip with the dual clip, token mean
        terms = []
        for i in steps(m):
            for t in range(m.shape[1]):
                if m[i, t] > 0:
                    r = torch.exp(lp[i, t] - ol[i, t])
                    surrogate = torch.min(r * A[i], r.clamp(1 - LOW, 1 + HIGH) * A[i])
                    terms.append(-torch.max(surrogate, 3.0 * A[i]) if A[i] < 0 else -surrogate)
        return torch.stack(terms).mean()
    if name == "gspo":                          # sequence ratio s_i = (pi/pi_old)^(1/|y|), clipped, mean over steps
        per_step = []
        for i in steps(m):
            t = m[i] > 0
            s = torch.exp((lp[i][t] - ol[i][t]).mean())
            per_step.append(-torch.min(s * A[i], s.clamp(1 - LOW, 1 + HIGH) * A[i]))
        return torch.stack(per_step).mean()
    if name == "sapo":                          # soft gate f(r) = 4/tau sigmoid(tau (r - 1)), seq mean of token mean
        per_step = []
        for i in steps(m):
            t = m[i] > 0
            tau = 1.0 if A[i] > 0 else 1.05
            r = torch.exp(lp[i][t] - ol[i][t])
            per_step.append(-(4 / tau * torch.sigmoid(tau * (r - 1)) * A[i]).mean())
        return torch.stack(per_step).mean()
    if name == "gpg":                           # REINFORCE, token mean
        return -(lp * A[:, None])[m > 0].mean()
    if name == "cispo":                         # sg(clip(r)) A log pi, token mean
        r = torch.exp(lp - ol)
        return -(r.clamp(1 - LOW, 1 + HIGH).detach() * A[:, None] * lp)[m > 0].mean()
    if name == "gmpo":                          # sgn(A) prod_t |min(r_t A, clip(r_t, e^-low, e^high) A)|^(1/|o|)
        per_step = []
        for i in steps(m):
            t = m[i] > 0
            r = torch.exp(lp[i][t] - ol[i][t])
            if A[i] == 0:
                per_step.append(lp[i][t].sum() * 0.0)
                continue
            terms = torch.min(r * A[i], r.clamp(math.exp(-LOW), math.exp(HIGH)) * A[i]).abs()
            per_step.append(-torch.sign(A[i]) * torch.exp(torch.log(terms).mean()))
        return torch.stack(per_step).mean()
    if name == "kl_cov":                        # -A r, plus coef |log r| on the top-k covariance tokens
        t = m > 0
        a, l, r = A[:, None].expand_as(m)[t], lp[t], torch.exp(lp - ol)[t]
        cov = ((a - a.mean()) * (l.detach() - l.detach().mean())).tolist()
        k = max(1, int(len(cov) * PARAMS["kl_cov"]["kl_cov_ratio"]))
        top = sorted(range(len(cov)), key=lambda j: -cov[j])[:k]
        penalty = torch.zeros(len(cov), dtype=F64)
        penalty[top] = PARAMS["kl_cov"]["ppo_kl_coef"]
        return (-a * r + penalty * (lp - ol)[t].abs()).mean()
    raise KeyError(name)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "sapo", "gpg", "cispo", "gmpo", "kl_cov"])
def test_loss_equals_its_published_formula(name):
    logprobs, old, advantages, mask, _ = inputs(seed=3)
    out, grad = ours(name, logprobs, old, advantages, mask, dual_clip_c=3.0)
    expected = paper_value(name, logprobs, old, advantages, mask)
    expected_grad, = torch.autograd.grad(expected, logprobs)
    close(out.loss, expected)
    close(grad, expected_grad)


def test_clip_cov_is_ppo_clip_on_the_tokens_it_does_not_cut():
    logprobs, old, advantages, mask, _ = inputs(seed=4)
    ppo, ppo_grad = ours("vanilla", logprobs, old, advantages, mask, dual_clip_c=0.0)
    s = LossSettings(policy_loss="clip_cov", loss_params={"clip_cov_lb": 1e9, "clip_cov_ub": 2e9},
                     clip_ratio_low=LOW, clip_ratio_high=HIGH, kl_coef=0.0, entropy_coef=0.0)
    none_cut = policy_loss(logprobs, old, advantages, mask, s)       # no covariance in range: PPO-clip
    close(none_cut.loss, ppo.loss)
    assert none_cut.metrics["clip_cov_frac"] == 0
    s = LossSettings(policy_loss="clip_cov", loss_params={"clip_cov_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
                     clip_ratio_low=LOW, clip_ratio_high=HIGH, kl_coef=0.0, entropy_coef=0.0)
    all_cut = policy_loss(logprobs, old, advantages, mask, s)        # every unclipped token cut: only clipped remain
    grad, = torch.autograd.grad(all_cut.loss, logprobs)
    assert grad.abs().sum() == 0                                     # clipped tokens carry no gradient either
    assert all_cut.metrics["clip_cov_frac"] + all_cut.metrics["pg_clipfrac"] == pytest.approx(1.0)


# --------------------------------------------------------------------------------- aggregation, KL
def test_dr_grpo_aggregation_is_verls_sum_over_steps_divided_by_the_constant():
    values = torch.randn(5, 7, dtype=F64)
    _, _, _, mask, _ = inputs(n=5, r=7)
    rows = float((mask.sum(1) > 0).sum())
    # verl's agg_loss sums the steps (its actor then averages micro-batches); agentrl takes their mean
    close(aggregate(values, mask, "seq-mean-token-sum-norm", scale=64) * rows,
          verl.agg_loss(values, mask, "seq-mean-token-sum-norm", loss_scale_factor=64))
    close(aggregate(values, mask, "seq-mean-token-sum-norm") * rows, verl.agg_loss(values, mask, "seq-mean-token-sum-norm"))
    # the learner's global denominator: two micro-batches add up to the whole
    whole = aggregate(values, mask, "seq-mean-token-sum-norm", scale=64)
    denominator = loss_denominator(mask, "seq-mean-token-sum-norm")
    halves = sum(aggregate(values[s], mask[s], "seq-mean-token-sum-norm", denominator, scale=64)
                 for s in (slice(0, 2), slice(2, 5)))
    close(halves, whole)


@pytest.mark.parametrize("kl_type", ["k1", "k2", "low_var_kl", "k3+", "abs"])
def test_kl_estimators_equal_verl_value_and_gradient(kl_type):
    logprobs, old, _, _, _ = inputs(seed=5)
    ref = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    ours_value = kl_penalty(logprobs, ref, kl_type)
    theirs = verl.kl_penalty(logprobs, ref, {"k2": "mse"}.get(kl_type, kl_type))
    close(ours_value, theirs)
    close(torch.autograd.grad(ours_value.sum(), logprobs)[0], torch.autograd.grad(theirs.sum(), logprobs)[0])


def test_k3_plus_has_the_value_of_k3_and_the_gradient_of_k2():
    logprobs, old, _, _, _ = inputs(seed=6)
    ref = old.clone()
    k3, k2, k3p = (kl_penalty(logprobs, ref, t) for t in ("low_var_kl", "k2", "k3+"))
    close(k3p, k3)
    d = (logprobs - ref).detach()
    close(torch.autograd.grad(k3p.sum(), logprobs)[0], d)                          # d/dlogp of d^2 / 2
    close(torch.autograd.grad(k2.sum(), logprobs)[0], d)
    close(kl_penalty(logprobs, ref, "abs"), d.abs())


# --------------------------------------------------------------------------------- composition
def test_sequence_losses_already_use_one_ratio_per_step():
    logprobs, old, advantages, mask, _ = inputs(seed=7)
    for name in ("gspo", "gmpo"):
        token, token_grad = ours(name, logprobs, old, advantages, mask)
        action, action_grad = ours(name, logprobs, old, advantages, mask, action_level_ratio=True)
        close(action.loss, token.loss)
        close(action_grad, token_grad)


@pytest.mark.parametrize("name", ["vanilla", "sapo", "clip_cov", "kl_cov", "cispo"])
def test_token_ratio_losses_take_the_action_level_ratio(name):
    logprobs, old, advantages, mask, _ = inputs(seed=8)
    token, _ = ours(name, logprobs, old, advantages, mask)
    action, grad = ours(name, logprobs, old, advantages, mask, action_level_ratio=True)
    assert action.loss != token.loss and torch.isfinite(grad).all()
    # every token of a step sees the step's ratio
    steps_ratio = torch.exp((((logprobs - old) * mask).sum(1) / mask.sum(1).clamp_min(1)))[mask.sum(1) > 0]
    assert action.metrics["ratio_max"] == pytest.approx(float(steps_ratio.max()))


def test_a_loss_without_a_ratio_refuses_the_action_level_ratio():
    with pytest.raises(UsageError, match="gpg uses no importance ratio") as err:
        LossSettings(policy_loss="gpg", action_level_ratio=True)
    assert "\n" not in str(err.value)


def test_a_loss_that_cannot_take_the_behaviour_weight_is_refused(tmp_path, monkeypatch):
    module = user_loss_module(tmp_path, monkeypatch, "agentrl_test_unweighted_loss", "takes_behaviour_weight = False")
    LossSettings(policy_loss=f"{module}:UserLoss")
    with pytest.raises(UsageError, match="cannot take the behaviour weight"):
        LossSettings(policy_loss=f"{module}:UserLoss", rollout_is_cap=2.0)


def test_aggregation_null_is_the_losses_own_and_gmpo_takes_only_its_own():
    assert LossSettings().loss_agg_mode == "token-mean"
    assert LossSettings(policy_loss="gspo").loss_agg_mode == "seq-mean-token-mean"
    assert LossSettings(policy_loss="gspo", loss_agg_mode="token-mean").loss_agg_mode == "token-mean"
    with pytest.raises(UsageError, match="gmpo takes learner.loss_agg_mode seq-mean-token-mean only"):
        LossSettings(policy_loss="gmpo", loss_agg_mode="token-mean")


# ------------------------------------------------------------------------------ registry, plug-ins
def test_bad_names_and_parameters_are_one_line_errors():
    with pytest.raises(PluginError, match=r"unknown policy loss learner.policy_loss='gsop'; did you mean gspo.*"
                                          r"available: vanilla, gspo, sapo, gpg, clip_cov, kl_cov, gmpo, cispo"):
        build_policy_loss("gsop")
    with pytest.raises(UsageError, match="policy loss 'sapo' has no parameter 'tau'.*tau_pos, tau_neg"):
        build_policy_loss("sapo", {"tau": 1.0})
    with pytest.raises(UsageError, match=r"learner.sapo.tau_pos must be float > 0, got -1"):
        build_policy_loss("sapo", {"tau_pos": -1.0})
    with pytest.raises(UsageError, match=r"learner.sapo.tau_pos must be float > 0"):     # when the settings are built
        LossSettings(policy_loss="sapo", loss_params={"tau_pos": -1.0})


def user_loss_module(tmp_path, monkeypatch, module, extra=""):
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(f"""
        import dataclasses
        from agentrl.policy_losses import LossTerms, PolicyLoss, param

        class UserLoss(PolicyLoss):
            name = "user_scaled_pg"
            metrics = {{"user_positive_share": "share of trained tokens with a positive advantage"}}
            {extra}

            @dataclasses.dataclass(frozen=True)
            class Params:
                scale: float = param(1.0, "multiplies the loss", gt=0)

            def token_losses(self, x):
                adv = x.token_advantages()
                return LossTerms(-self.params.scale * adv * x.logprobs, metrics={{"user_positive_share": adv > 0}})
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(module, None)
    return module


def test_an_outside_loss_trains_one_learner_iteration(tmp_path, monkeypatch):
    from agentrl.learner.engine import Learner
    from tiny_setup import learner_config, step_batch, write_tiny_model

    module = user_loss_module(tmp_path, monkeypatch, "agentrl_test_user_loss")
    cfg = learner_config(policy_loss=f"{module}:UserLoss", policy_loss_params={"scale": 2.0}, kl_coef=0.0,
                         entropy_coef=0.0, mini_batch_size=6, micro_batch_size=2)
    learner = Learner(cfg, write_tiny_model(tmp_path / "model"))
    batch = learner.compute_logprobs(step_batch(6, seed=5))
    before = {k: v.clone() for k, v in learner.state_dict_for_rollout().items()}
    metrics = learner.update(batch)
    after = learner.state_dict_for_rollout()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    trained = batch.response_mask > 0
    adv = batch.advantages.unsqueeze(1).expand_as(batch.response_mask)
    # one mini-batch, the policy still the old one: -2 A log pi over the trained tokens, token mean
    assert metrics["pg_loss"] == pytest.approx(float(-2.0 * (adv * batch.old_logprobs)[trained].mean()), rel=1e-4)
    assert metrics["user_positive_share"] == pytest.approx(float((adv > 0)[trained].double().mean()))


def test_the_config_checks_an_outside_losss_parameters(tmp_path, monkeypatch):
    from agentrl.config import load_config

    module = user_loss_module(tmp_path, monkeypatch, "agentrl_test_config_loss")
    cfg = load_config(None, [f"learner.policy_loss={module}:UserLoss", "learner.policy_loss_params.scale=3"])
    assert cfg.learner.policy_loss_params == {"scale": 3.0}
    with pytest.raises(UsageError, match="unknown config key `learner.policy_loss_params.scal`.*did you mean"):
        load_config(None, [f"learner.policy_loss={module}:UserLoss", "learner.policy_loss_params.scal=3"])
    with pytest.raises(UsageError, match="learner.policy_loss=gpg uses no importance ratio"):
        load_config(None, ["learner.policy_loss=gpg", "algorithm.estimator=gagpo"])
    with pytest.raises(UsageError, match="gmpo takes learner.loss_agg_mode"):
        load_config(None, ["learner.policy_loss=gmpo", "learner.loss_agg_mode=token-mean"])
    cfg = load_config(None, ["learner.policy_loss=kl_cov", "learner.kl_cov.ppo_kl_coef=0.5"])
    assert cfg.learner.kl_cov.ppo_kl_coef == 0.5


def test_a_class_that_is_not_a_loss_is_refused(tmp_path, monkeypatch):
    (tmp_path / "agentrl_test_not_a_loss.py").write_text("class NotALoss:\n    name = 'x'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="is not a policy loss: subclass agentrl.policy_losses.PolicyLoss"):
        build_policy_loss("agentrl_test_not_a_loss:NotALoss")


def test_every_builtin_loss_declares_its_docs_and_metrics():
    for name, cls in builtin_policy_losses().items():
        assert cls.title and cls.source and cls.__doc__, name
        assert dataclasses.is_dataclass(cls.Params)
        logprobs, old, advantages, mask, rollout = inputs(seed=9)
        out, grad = ours(name, logprobs, old, advantages, mask, rollout, cap=2.0,
                         action_level_ratio=cls.ratio != "none")
        assert set(cls.metrics) <= set(out.metrics) and torch.isfinite(grad).all(), name
        assert issubclass(cls, PolicyLoss) and isinstance(cls().token_losses, object)
    assert LossTerms(torch.zeros(1)).clipped is None


def test_every_builtin_loss_updates_the_learner(tmp_path):
    from agentrl.estimators import LossOptions
    from agentrl.learner.engine import Learner
    from tiny_setup import learner_config, step_batch, write_tiny_model

    learner = Learner(learner_config(rollout_is_cap=2.0), write_tiny_model(tmp_path / "model"))
    batch = learner.compute_logprobs(step_batch(6, seed=5))
    batch = batch.with_columns(rollout_logprobs=batch.old_logprobs - 0.1)
    for name, cls in builtin_policy_losses().items():
        learner.cfg.learner.policy_loss = name
        options = LossOptions(action_level_ratio=cls.ratio != "none")
        metrics = learner.update(batch, options)
        assert metrics["optimizer_steps"] == 1 and metrics["skipped_steps"] == 0, name
        for key in ("loss", "pg_loss", "kl_ref", "entropy", "pg_clipfrac", "ratio_mean", "grad_norm", *cls.metrics):
            assert math.isfinite(metrics[key]), (name, key)
        assert metrics["rollout_is_weight"] == pytest.approx(math.exp(0.1), rel=1e-5), name
