"""A faithful transcription of verl's policy losses, the reference the tests compare agentrl's with.

Read from volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29),
``verl/trainer/ppo/core_algos.py``: ``agg_loss``, ``compute_policy_loss_vanilla``, ``_gspo``, ``_sapo``,
``_gpg``, ``_clip_cov``, ``_kl_cov``, ``_geo_mean``, ``_cispo``, ``kl_penalty``/``kl_penalty_forward``;
``verl/utils/torch_functional.py``: ``masked_sum``, ``masked_mean``. The operations and their order
are verl's; only the config object is a dict and the metrics are left out. verl is not installed
here (it needs a GPU stack), so this is the reference.

One deviation, marked below: at that commit ``kl_penalty(..., "k3+")`` passes the name with its
``+`` to ``kl_penalty_forward``, which knows only ``k3``/``low_var_kl`` and raises
NotImplementedError; the documented intent (verl docs/algo/grpo.md: "appending + ... straight
through to employ k2") is the forward value of the name without ``+``, which is what this does.
"""

import torch


def masked_sum(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def masked_mean(values, mask, axis=None):
    s = masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor=None):
    if loss_agg_mode == "token-mean":
        batch_num_tokens = loss_mask.sum()
        loss = masked_sum(loss_mat, loss_mask) / batch_num_tokens
    elif loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        loss = masked_sum(seq_losses, seq_mask) / seq_mask.sum()
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        loss = masked_sum(seq_losses, seq_mask) / seq_mask.sum()
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        if loss_scale_factor is None:
            loss_scale_factor = loss_mask.shape[-1]
        loss = torch.sum(seq_losses) / loss_scale_factor
    else:
        raise ValueError(loss_agg_mode)
    return loss


def vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
    cliprange_low, cliprange_high, clip_ratio_c = config["clip_ratio_low"], config["clip_ratio_high"], 3.0
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode)


def gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
    clip_ratio_low, clip_ratio_high = config["clip_ratio_low"], config["clip_ratio_high"]
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, "seq-mean-token-mean")


def sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
    tau_pos = torch.as_tensor(config["tau_pos"], dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(config["tau_neg"], dtype=advantages.dtype, device=advantages.device)

    def gate_function(x, tau):
        return torch.sigmoid(tau * (x - 1.0)) * (4.0 / tau)

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    taus = torch.where(condition=advantages > 0, input=tau_pos, other=tau_neg)
    gates = gate_function(ratio, taus)
    pg_losses = -gates * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, "seq-mean-token-mean")


def gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
    pg_losses = -log_prob * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode)


def clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
    clip_cov_ratio, clip_cov_ub, clip_cov_lb = config["clip_cov_ratio"], config["clip_cov_ub"], config["clip_cov_lb"]
    cliprange_low, cliprange_high = config["clip_ratio_low"], config["clip_ratio_high"]
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    corr = torch.ones_like(advantages)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob.detach(), response_mask))
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = (cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0)
    top_k_idx = torch.nonzero(top_k_idx)
    if len(top_k_idx) > 0:
        perm = torch.randperm(len(top_k_idx))
        top_k_idx = top_k_idx[perm[: min(clip_num, len(top_k_idx))]]
    else:
        top_k_idx = torch.empty((0, 2), device=cov_all.device, dtype=torch.long)
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode)


def kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
    kl_cov_ratio, ppo_kl_coef = config["kl_cov_ratio"], config["ppo_kl_coef"]
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
    k = min(kl_cov_ratio, len(all_valid_adv))
    if k != 0:
        cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
        k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
        large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
        if len(large_cov_idxs) != 0:
            large_cov_idxs = all_valid_idx[large_cov_idxs]
            pg_losses[large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]] = pg_losses_kl[
                large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]]
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode)


def geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
    cliprange_low, cliprange_high = config["clip_ratio_low"], config["clip_ratio_high"]
    negative_approx_kl = log_prob - old_log_prob
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -cliprange_low, cliprange_high)
    negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    pg_losses = -advantage * ratio
    if rollout_is_weights is not None:
        seq_is_weights = torch.exp(
            (torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
        pg_losses = pg_losses * seq_is_weights
    return torch.mean(pg_losses)


def cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
    clip_ratio_low, clip_ratio_high = config["clip_ratio_low"], config["clip_ratio_high"]
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped_ratio_sg = clipped_ratio.detach()
    pg_losses = -clipped_ratio_sg * advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode)


def kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


def kl_penalty(logprob, ref_logprob, kl_penalty):
    # deviation (see the module docstring): the forward value of the name without its "+"
    forward_score = kl_penalty_forward(logprob, ref_logprob, kl_penalty.rstrip("+"))
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


LOSSES = {"vanilla": vanilla, "gspo": gspo, "sapo": sapo, "gpg": gpg, "clip_cov": clip_cov, "kl_cov": kl_cov,
          "gmpo": geo_mean, "cispo": cispo}
