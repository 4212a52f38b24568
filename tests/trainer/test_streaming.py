"""The streaming trainer: per-group accumulation is an exact token mean over the batch, a
step lowers the batch's loss, degenerate groups cost nothing, and weight sync makes the
engine sample what the trainer's model would."""

from __future__ import annotations

import pytest
import torch
import transformers

from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.trainer.config import TrainerConfig
from venusrl.trainer.losses import (
    group_advantages,
    policy_loss,
    token_logprobs_and_entropy,
)
from venusrl.trainer.rows import packs_rows
from venusrl.trainer.shared_prefix import common_prefix_length
from venusrl.trainer.streaming import StreamingTrainer
from venusrl.types import Group, Prompt, SamplingParams, Trajectory, TrajectoryStatus


def _model(model_dir) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


@torch.no_grad()
def _logprobs(model, ids: list[int]) -> list[float]:
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    return [0.0] + torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def _group(model, group_id: int, rewards: list[float], seed: int) -> Group:
    """K trajectories of random tokens: the group's shared prompt (long enough for the
    trainer to compute it once), then generated tokens whose behaviour log-probs are the
    model's own (an on-policy rollout)."""
    generator = torch.Generator().manual_seed(seed)
    prompt = Prompt(id=f"p{group_id}", messages=({"role": "user", "content": "q"},))
    shared = torch.randint(0, 200, (20,), generator=generator).tolist()
    trajectories = []
    for index, reward in enumerate(rewards):
        generated = 4 + 2 * index
        ids = shared + torch.randint(0, 200, (generated,), generator=generator).tolist()
        mask = [False] * len(shared) + [True] * generated
        logprobs = [lp if m else 0.0 for lp, m in zip(_logprobs(model, ids), mask, strict=True)]
        t = Trajectory(id=group_id * 10 + index, group_id=group_id, index=index, attempt=0, prompt=prompt,
                       start_version=0, status=TrajectoryStatus.DONE, token_ids=ids, generated_mask=mask,
                       logprobs=logprobs, reward=reward)
        trajectories.append(t)
    return Group(id=group_id, seq=group_id, prompt=prompt, trajectories=trajectories, admitted_at=0.0)


def _batch_loss(model, groups: list[Group], config: TrainerConfig) -> torch.Tensor:
    """The token-mean loss of the whole batch in one computation (what streaming must equal)."""
    loss_config = config  # the trainer section is the loss config
    total, tokens = 0.0, 0
    for group in groups:
        advantages = group_advantages(torch.tensor([t.reward for t in group.trajectories]), config.advantage)
        for t, advantage in zip(group.trajectories, advantages, strict=True):
            ids = torch.tensor([t.token_ids])
            logprobs, _ = token_logprobs_and_entropy(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
            mask = torch.tensor([t.generated_mask[1:]])
            terms = policy_loss(logprobs, logprobs.detach(), torch.tensor([t.logprobs[1:]]), advantage, mask, loss_config)
            total = total + terms.loss_sum
            tokens += terms.tokens
    return total / tokens


@pytest.mark.parametrize("options", [
    {},  # rows sharing the prompt compute it once
    {"logprob_chunk_tokens": 3},  # log-probs from the hidden states three tokens at a time
    {"pack_rows": "on", "shared_prefix_min_tokens": 1000},  # two rows a micro-batch, packed without padding
    {"activation_checkpointing": True},  # every decoder layer recomputed in backward
], ids=["shared-prefix", "chunks-of-3", "packed", "checkpointed"])
def test_accumulated_gradient_is_the_token_mean_over_the_batch(tiny_model_dir, options):
    config = TrainerConfig(learning_rate=1e-3, max_grad_norm=1e9, micro_batch_tokens=64, **options)
    streaming, reference = _model(tiny_model_dir), _model(tiny_model_dir)
    groups = [_group(reference, 0, [1.0, 0.0, 0.0, 1.0], seed=0), _group(reference, 1, [0.0, 0.5, 1.0], seed=1)]
    trainer = StreamingTrainer(streaming, config)
    for group in groups:
        trainer.accumulate(group)
    tokens = sum(sum(t.generated_mask) for g in groups for t in g.trajectories)
    _batch_loss(reference, groups, config).backward()
    for (name, p), q in zip(streaming.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad / tokens, q.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_one_step_lowers_the_batch_loss(tiny_model_dir):
    config = TrainerConfig(learning_rate=1e-3)
    model = _model(tiny_model_dir)
    groups = [_group(model, 0, [1.0, 0.0, 1.0, 0.0], seed=2), _group(model, 1, [0.0, 0.0, 1.0, 1.0], seed=3)]
    with torch.no_grad():
        before = float(_batch_loss(model, groups, config))
    trainer = StreamingTrainer(model, config)
    for group in groups:
        trainer.accumulate(group)
    result = trainer.step()
    with torch.no_grad():
        after = float(_batch_loss(model, groups, config))
    assert result.version == 1 and result.groups == 2 and result.trajectories == 8
    assert result.loss == pytest.approx(before, abs=1e-5)
    assert after < before


def test_a_group_with_equal_rewards_is_counted_but_not_backpropagated(tiny_model_dir):
    model = _model(tiny_model_dir)
    trainer = StreamingTrainer(model, TrainerConfig())
    result = trainer.accumulate(_group(model, 0, [1.0, 1.0, 1.0], seed=4))
    assert result.skipped and result.tokens == 4 + 6 + 8
    assert all(p.grad is None for p in model.parameters())
    step = trainer.step()
    assert step.skipped_groups == 1 and step.version == 1


def test_step_without_groups_is_an_error(tiny_model_dir):
    with pytest.raises(RuntimeError, match="no accumulated group"):
        StreamingTrainer(_model(tiny_model_dir), TrainerConfig()).step()


def test_weight_sync_makes_the_engine_sample_what_the_trainer_model_would(tiny_model_dir):
    model = _model(tiny_model_dir)
    trainer = StreamingTrainer(model, TrainerConfig(learning_rate=5e-2))
    trainer.accumulate(_group(model, 0, [1.0, 0.0, 0.0, 1.0], seed=5))
    trainer.step()
    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    prompt = list(range(10, 30))
    stale = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.0))[0].output_ids
    engine.update_weights(trainer.engine_weights(), trainer.version)
    synced = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.0))[0]
    model.eval()
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    # the engine stops at an end-of-turn token; transformers was told not to
    assert synced.output_ids == expected[: len(synced.output_ids)]
    assert synced.finish_reason == "length" or synced.output_ids[-1] in engine.eos_token_ids
    assert set(synced.weight_versions) == {1}
    assert stale != synced.output_ids  # the step changed what the model samples


def _engine_group(model_dir, temperature: float) -> Group:
    """Four trajectories the engine sampled at `temperature`, each with the behaviour log-probs
    it recorded (under softmax(logits / temperature)); mixed rewards so the group trains."""
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=4))
    prompt_ids = list(range(10, 40))
    outputs = engine.generate([prompt_ids] * 4, SamplingParams(max_new_tokens=16, temperature=temperature))
    prompt = Prompt(id="p", messages=({"role": "user", "content": "q"},))
    trajectories = [
        Trajectory(id=index, group_id=0, index=index, attempt=0, prompt=prompt, start_version=0,
                   status=TrajectoryStatus.DONE, token_ids=prompt_ids + out.output_ids,
                   generated_mask=[False] * len(prompt_ids) + [True] * len(out.output_ids),
                   logprobs=[0.0] * len(prompt_ids) + out.logprobs, reward=float(index % 2))
        for index, out in enumerate(outputs)]
    return Group(id=0, seq=0, prompt=prompt, trajectories=trajectories, admitted_at=0.0)


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_rollouts_sampled_at_a_temperature_are_on_policy_for_the_trainer(tiny_model_dir, temperature):
    # The engine records log-probs under softmax(logits / T); a trainer told T computes the
    # same policy, so a fresh rollout is on-policy: ρ = 1 on every token, IcePop keeps them all.
    group = _engine_group(tiny_model_dir, temperature)
    result = StreamingTrainer(_model(tiny_model_dir), TrainerConfig(), temperature=temperature).accumulate(group)
    assert result.stats.tokens > 0 and result.stats.icepop_masked_fraction == 0.0
    assert result.stats.behaviour_kl == pytest.approx(0.0, abs=1e-6)
    assert result.stats.tis_weight_mean == pytest.approx(1.0, abs=1e-4)


def test_the_gradient_is_that_of_the_tempered_policy(tiny_model_dir):
    temperature = 0.5
    group = _engine_group(tiny_model_dir, temperature)
    model, reference = _model(tiny_model_dir), _model(tiny_model_dir)
    StreamingTrainer(model, TrainerConfig(), temperature=temperature).accumulate(group)
    advantages = group_advantages(torch.tensor([t.reward for t in group.trajectories]))
    total = 0.0
    for t, advantage in zip(group.trajectories, advantages, strict=True):
        ids = torch.tensor([t.token_ids])
        logprobs, _ = token_logprobs_and_entropy(reference(input_ids=ids).logits[:, :-1] / temperature, ids[:, 1:])
        total = total - (advantage * logprobs[0][torch.tensor(t.generated_mask[1:])]).sum()
    total.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        # gradients reach tens here (logits / 0.5, unnormalised sum): float32 noise scales with them
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6 * float(q.grad.abs().max()), rtol=1e-4, msg=name)


def test_the_reference_and_entropy_terms_see_the_policy_the_full_computation_sees(tiny_model_dir):
    # At the start the reference is the policy (KL 0) and the entropy bonus reads the entropy of
    # the policy's next-token distribution at every generated token, as the full logits give it.
    model, reference = _model(tiny_model_dir), _model(tiny_model_dir).requires_grad_(False)
    group = _group(model, 0, [1.0, 0.0, 0.0, 1.0], seed=6)
    config = TrainerConfig(kl_coef=0.1, entropy_coef=0.01, logprob_chunk_tokens=5)
    result = StreamingTrainer(model, config, reference=reference).accumulate(group)
    entropies = []
    with torch.no_grad():
        for t in group.trajectories:
            ids = torch.tensor([t.token_ids])
            _, entropy = token_logprobs_and_entropy(reference(input_ids=ids).logits[:, :-1], ids[:, 1:])
            entropies.append(entropy[0][torch.tensor(t.generated_mask[1:])])
    assert result.stats.kl_tokens == result.stats.tokens > 0
    assert result.stats.kl_mean == pytest.approx(0.0, abs=1e-6)
    assert result.stats.entropy_mean == pytest.approx(float(torch.cat(entropies).mean()), rel=1e-5)


def test_a_policy_whose_parameters_are_not_float32_is_refused(tiny_model_dir):
    # bf16 parameters updated in place round an RL step away (issue 36): the master must be float32
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="parameters must be float32.*bfloat16"):
        StreamingTrainer(model, TrainerConfig(), compute_dtype=torch.bfloat16)


@pytest.mark.parametrize(("setting", "attention", "packs"), [
    ("auto", "sdpa", False), ("auto", "eager", False), ("auto", "flash_attention_2", True),
    ("auto", "flex_attention", True), ("on", "sdpa", True), ("off", "flash_attention_2", False),
])
def test_rows_are_packed_where_the_attention_splits_them(setting, attention, packs):
    assert packs_rows(setting, attention) == packs


@pytest.mark.parametrize("setting", ["auto", "on"])
def test_the_trainer_lays_a_micro_batch_out_as_the_setting_says(tiny_model_dir, setting):
    model = _model(tiny_model_dir)  # sdpa: auto pads
    trainer = StreamingTrainer(model, TrainerConfig(pack_rows=setting, shared_prefix_min_tokens=1000))
    group = _group(model, 0, [1.0, 0.0], seed=7)
    rows = trainer._layout(group.trajectories, torch.tensor([1.0, -1.0]), prefix=0)
    assert rows.ids.shape[0] == (1 if setting == "on" else 2) and (rows.position_ids is not None) == (setting == "on")


def test_packed_micro_batches_hold_at_most_micro_batch_tokens_when_rows_share_a_prompt(tiny_model_dir):
    """`_plan` sizes a packed micro-batch by its real tokens; laying it out padded for a shared
    prompt would make it rows x longest."""
    model = _model(tiny_model_dir)
    group = _group(model, 0, [1.0, 0.0, 0.0, 1.0], seed=8)
    assert common_prefix_length([t.token_ids for t in group.trajectories]) >= 1
    shortest, second = sorted(len(t.token_ids) for t in group.trajectories)[:2]
    assert shortest < second
    budget = shortest + second  # the two shortest fit packed, not padded to the longer one
    trainer = StreamingTrainer(model, TrainerConfig(pack_rows="on", shared_prefix_min_tokens=1, micro_batch_tokens=budget))
    laid_out = []
    layout = trainer._layout
    trainer._layout = lambda rows, advantages, prefix: laid_out.append(out := layout(rows, advantages, prefix)) or out
    trainer.accumulate(group)
    assert laid_out and all(r.ids.numel() <= budget or r.ids.shape == (1, r.ids.shape[1]) for r in laid_out)
    assert any(r.position_ids is not None for r in laid_out)  # packed, not padded
