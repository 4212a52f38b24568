import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.trainer.losses import (
    PolicyLossConfig,
    group_advantages,
    policy_loss,
    token_logprobs_and_entropy,
)

PLAIN = PolicyLossConfig(tis_cap=None, icepop_low=None, icepop_high=None)  # PPO clip only
LN2 = math.log(2.0)


def loss(logprobs, advantages, config=PLAIN, proximal=None, behaviour=None, mask=None, **kwargs):
    logprobs = torch.tensor(logprobs, requires_grad=True)
    proximal = torch.zeros_like(logprobs) if proximal is None else torch.tensor(proximal)
    behaviour = proximal.clone() if behaviour is None else torch.tensor(behaviour)
    mask = torch.ones_like(logprobs, dtype=torch.bool) if mask is None else torch.tensor(mask)
    terms = policy_loss(logprobs, proximal, behaviour, torch.tensor(advantages), mask, config, **kwargs)
    terms.loss_sum.backward()
    return terms, logprobs.grad


def test_advantages_of_one_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # mean 0.5, population std 0.5
    assert group_advantages(rewards).tolist() == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert group_advantages(rewards, "dr_grpo").tolist() == [0.5, -0.5, -0.5, 0.5]
    # RLOO: 1 − (0+0+1)/3 = 2/3; 0 − (1+0+1)/3 = −2/3
    assert group_advantages(rewards, "rloo").tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_advantages_of_several_groups_and_degenerate_groups_are_zero():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.1]])
    for estimator in ("grpo", "dr_grpo", "rloo"):
        advantages = group_advantages(rewards, estimator)
        assert advantages.shape == (2, 4) and advantages[1].tolist() == [0.0] * 4
        assert torch.equal(advantages[0], group_advantages(rewards[0], estimator))
    assert group_advantages(torch.tensor([1, 0])).dtype == torch.float32  # integer rewards


def test_advantage_errors():
    with pytest.raises(ValueError, match="rloo needs at least 2"):
        group_advantages(torch.tensor([1.0]), "rloo")
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        group_advantages(torch.tensor([1.0, 0.0]), "ppo")
    with pytest.raises(ValueError, match=r"shape \(1, 2, 3\)"):
        group_advantages(torch.zeros(1, 2, 3))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=16), st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_advantages_sum_to_zero(rewards, estimator):
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), estimator)
    assert abs(advantages.sum().item()) < 1e-6 * max(1.0, advantages.abs().max().item())


def test_clipping_on_both_sides_for_both_advantage_signs():
    r = [1.5, 1.5, 0.5, 0.5]
    A = [1.0, -1.0, 1.0, -1.0]
    terms, grad = loss([math.log(x) for x in r], A)
    # r=1.5, A=+1: min(1.5, 1.28) = 1.28, clipped → loss −1.28, no gradient
    # r=1.5, A=−1: min(−1.5, −1.28) = −1.5 → loss 1.5, d/dlogp (−r·A) = 1.5
    # r=0.5, A=+1: min(0.5, 0.8) = 0.5 → loss −0.5, gradient −0.5
    # r=0.5, A=−1: min(−0.5, −0.8) = −0.8, clipped → loss 0.8, no gradient
    assert terms.loss_sum.item() == pytest.approx(-1.28 + 1.5 - 0.5 + 0.8)
    assert grad.tolist() == pytest.approx([0.0, 1.5, -0.5, 0.0])
    assert terms.tokens == 4 and terms.stats.clip_fraction == 0.5
    assert terms.stats.ratio_mean == pytest.approx(1.0)


def test_truncated_importance_sampling_caps_the_weight():
    config = PolicyLossConfig(tis_cap=2.0, icepop_low=None, icepop_high=None)
    # ρ = exp(logp_old − logp_μ) = 3 → w = min(3, 2) = 2; ρ = 0.5 → w = 0.5; ratio 1, A = 1
    terms, grad = loss([0.0, 0.0], [1.0, 1.0], config, behaviour=[-math.log(3.0), LN2])
    assert terms.loss_sum.item() == pytest.approx(-2.0 - 0.5)
    assert grad.tolist() == pytest.approx([-2.0, -0.5])
    assert terms.stats.tis_weight_mean == pytest.approx(1.25)


def test_icepop_masks_tokens_outside_the_band_but_keeps_them_in_the_token_count():
    config = PolicyLossConfig(tis_cap=None, icepop_low=0.5, icepop_high=2.0)
    rho = [0.4, 0.5, 1.0, 2.0, 2.5, 1.0]
    mask = [True, True, True, True, True, False]  # the last token is not generated
    terms, grad = loss([0.0] * 6, [1.0] * 6, config, behaviour=[-math.log(x) for x in rho], mask=mask)
    assert terms.loss_sum.item() == pytest.approx(-3.0)  # tokens with ρ = 0.5, 1, 2
    assert grad.tolist() == pytest.approx([0.0, -1.0, -1.0, -1.0, 0.0, 0.0])
    assert terms.tokens == 5 and terms.stats.active_tokens == 3
    assert terms.stats.icepop_masked_fraction == pytest.approx(2 / 5)


def test_behaviour_kl_is_k3_over_generated_tokens():
    # ρ = 2: 2 − 1 − ln 2 = 0.306853; ρ = 1: 0
    terms, _ = loss([0.0, 0.0], [0.0, 0.0], behaviour=[-LN2, 0.0])
    assert terms.stats.behaviour_kl == pytest.approx((1 - LN2) / 2)


def test_k3_kl_to_the_reference():
    config = PolicyLossConfig(tis_cap=None, icepop_low=None, icepop_high=None, kl_coef=0.1)
    # ref − logp = ln 2: 2 − ln 2 − 1 = 0.306853; ref − logp = −ln 2: 0.5 + ln 2 − 1 = 0.193147
    terms, grad = loss([0.0, 0.0], [0.0, 0.0], config, ref_logprobs=torch.tensor([LN2, -LN2]))
    assert terms.stats.kl_mean == pytest.approx(0.25)
    assert terms.loss_sum.item() == pytest.approx(0.1 * 0.5)
    # d k3 / d logp = 1 − exp(ref − logp): −1 and 0.5
    assert grad.tolist() == pytest.approx([-0.1, 0.05])


def test_entropy_bonus_and_stats_without_optional_terms():
    config = PolicyLossConfig(entropy_coef=0.01)
    logits = torch.zeros(1, 2, 8, requires_grad=True)
    _, entropy = token_logprobs_and_entropy(logits, torch.zeros(1, 2, dtype=torch.long))
    zeros = torch.zeros(1, 2)
    terms = policy_loss(zeros.clone().requires_grad_(), zeros, zeros, zeros, torch.ones(1, 2, dtype=torch.bool),
                        config, entropy=entropy)
    assert terms.loss_sum.item() == pytest.approx(-0.01 * 2 * math.log(8))
    assert terms.stats.entropy_mean == pytest.approx(math.log(8))
    assert "kl_mean" not in terms.stats.as_dict() and math.isnan(terms.stats.kl_mean)


def test_gradient_at_ratio_one_is_minus_advantage_times_tis_weight():
    generator = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(64, generator=generator) * 3
    rho = 0.6 + 1.3 * torch.rand(64, generator=generator)  # inside the IcePop band
    advantages = torch.randn(64, generator=generator)
    config = PolicyLossConfig(tis_cap=1.5)
    logprobs = logp_old.clone().requires_grad_()
    terms = policy_loss(logprobs, logp_old, logp_old - rho.log(), advantages, torch.ones(64, dtype=torch.bool), config)
    terms.loss_sum.backward()
    assert torch.allclose(logprobs.grad, -advantages * rho.clamp(max=1.5), atol=1e-5)
    assert terms.stats.clip_fraction == 0.0 and terms.stats.icepop_masked_fraction == 0.0


def test_batched_with_per_sequence_advantages_equals_flattened():
    generator = torch.Generator().manual_seed(1)
    shape = (3, 5)
    logprobs, old, mu = (-torch.rand(shape, generator=generator) for _ in range(3))
    mask = torch.rand(shape, generator=generator) > 0.3
    advantages = torch.randn(3, 1, generator=generator)
    config = PolicyLossConfig()
    batched = policy_loss(logprobs, old, mu, advantages, mask, config)
    flat = policy_loss(logprobs.flatten(), old.flatten(), mu.flatten(), advantages.expand(shape).flatten(),
                       mask.flatten(), config)
    assert torch.allclose(batched.loss_sum, flat.loss_sum) and batched.stats == flat.stats


def test_token_logprobs_and_entropy():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, -1.0, 0.5]]])
    logprobs, entropy = token_logprobs_and_entropy(logits.to(torch.bfloat16), torch.tensor([[3, -100]]))
    assert logprobs.dtype == entropy.dtype == torch.float32
    assert logprobs[0].tolist() == pytest.approx([-math.log(4), 0.0])  # uniform; ignored label
    expected = torch.distributions.Categorical(logits=logits[0, 1]).entropy().item()
    assert entropy[0].tolist() == pytest.approx([math.log(4), expected], abs=1e-2)  # bf16 logits


def test_config_validation():
    with pytest.raises(ValueError, match=r"icepop_low \(2.0\) must be below icepop_high \(1.0\)"):
        PolicyLossConfig(icepop_low=2.0, icepop_high=1.0)
    with pytest.raises(ValueError, match="tis_cap"):
        PolicyLossConfig(tis_cap=0.0)
    with pytest.raises(ValueError, match="clip_low"):
        PolicyLossConfig(clip_low=1.0)


def test_the_trainer_section_is_the_loss_config():
    from venusrl.config import ConfigError, load_config

    trainer = load_config(overrides=["trainer.clip_high=0.3", "trainer.tis_cap=null"]).trainer
    assert isinstance(trainer, PolicyLossConfig) and (trainer.clip_high, trainer.tis_cap) == (0.3, None)
    with pytest.raises(ConfigError, match=r"trainer: icepop_low \(3.0\) must be below icepop_high \(2.0\)"):
        load_config(overrides=["trainer.icepop_low=3.0"])


token_values = st.lists(
    st.tuples(st.floats(-3, 0), st.floats(-3, 0), st.floats(-3, 0), st.floats(-2, 2), st.booleans()),
    min_size=2, max_size=40,
)


def columns(rows):
    logprobs, old, mu, advantages, mask = zip(*rows, strict=True)
    return (torch.tensor(logprobs, dtype=torch.float64), torch.tensor(old, dtype=torch.float64),
            torch.tensor(mu, dtype=torch.float64), torch.tensor(advantages, dtype=torch.float64),
            torch.tensor(mask))


@settings(max_examples=60, deadline=None)
@given(token_values, st.data())
def test_merged_stats_of_two_halves_equal_the_whole(rows, data):
    split = data.draw(st.integers(1, len(rows) - 1))
    config = PolicyLossConfig(kl_coef=0.05)
    whole, *halves = (policy_loss(*columns(part), config, ref_logprobs=columns(part)[1])
                      for part in (rows, rows[:split], rows[split:]))
    merged = halves[0].stats.merge(halves[1].stats)
    assert whole.tokens == halves[0].tokens + halves[1].tokens
    assert whole.loss_sum.item() == pytest.approx((halves[0].loss_sum + halves[1].loss_sum).item(), abs=1e-9)
    for name, value in whole.stats.as_dict().items():
        assert merged.as_dict()[name] == pytest.approx(value, abs=1e-9), name
    assert 0.0 <= whole.stats.clip_fraction <= 1.0 or whole.stats.active_tokens == 0
