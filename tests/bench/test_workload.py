"""The rollout bench's workload does not state its lengths: difficulty is latent, the prompt
shows a noisy hint of it, and the environment follows each episode's drawn plan."""

import asyncio
import random
from collections import Counter, defaultdict

import numpy as np
from scipy.stats import spearmanr

from venusrl.bench.workload import AgentTaskEnv, failing_tests, make_tasks, plan_episode
from venusrl.coordinator.predictors.features import featurize
from venusrl.coordinator.predictors.query import query_from_messages
from venusrl.coordinator.predictors.synthetic import _AREAS

TASKS = make_tasks(600, seed=3, max_turns=8, latency_mean_s=0.05)


def turns_of(task, episodes=4):
    return [plan_episode(task.row(), e).turns for e in range(episodes)]


def test_two_prompts_with_equal_text_features_get_different_lengths():
    by_features = defaultdict(list)
    for task in TASKS:
        features = featurize([query_from_messages(list(task.messages))], buckets=128)[0]
        by_features[features.tobytes()].append(task)
    alike = [tasks for tasks in by_features.values() if len(tasks) > 1]
    assert alike, "no two prompts read alike: the hint carries more than the level"
    differing = [(a, b) for tasks in alike for a in tasks for b in tasks
                 if a.messages == b.messages and sum(turns_of(a)) != sum(turns_of(b))]
    assert differing, "prompts that read alike always take the same turns: the text gives the length away"
    a, b = differing[0]
    assert a.metadata["difficulty"] != b.metadata["difficulty"]


def test_the_hint_is_informative_but_noisy_and_mates_share_the_difficulty():
    difficulty = [t.metadata["difficulty"] for t in TASKS]
    mean_turns = [np.mean(turns_of(t)) for t in TASKS]
    assert spearmanr(difficulty, mean_turns).statistic > 0.8  # the group's length follows d
    # within a group the K trajectories differ (temperature), but far less than across groups
    spread_within = np.mean([np.std(turns_of(t)) for t in TASKS])
    assert 0.3 < spread_within < np.std(mean_turns)
    # the hint's vocabulary level ranks difficulty only partly
    level = [next(i for i, area in enumerate(_AREAS) if set(area) & set(t.messages[0]["content"].split()))
             for t in TASKS]
    assert 0.6 < spearmanr(level, difficulty).statistic < 0.97


def test_the_environment_follows_the_episode_plan_and_counts_down_failing_tests():
    task = next(t for t in TASKS if plan_episode(t.row(), 0).turns >= 4)
    plan = plan_episode(task.row(), 0)
    env = AgentTaskEnv(Counter())

    async def episode():
        messages, tools = await env.reset(task.row())
        assert [m["role"] for m in messages] == ["system", "user"] and tools[0]["function"]["name"] == "run_tests"
        answers = []
        while True:
            result = await env.respond()
            answers.append(result.observations[0]["content"])
            if result.done:
                return answers

    answers = asyncio.run(episode())
    assert len(answers) == plan.turns and answers[-1] == "all tests passed"
    failing = [int(a.split(": ")[1].split()[0]) for a in answers[:-1]]
    assert all(f"ran {plan.tests} tests" in a for a in answers[:-1])
    assert failing[0] >= failing[-1]
    again = AgentTaskEnv(Counter({task.id: 0}))
    asyncio.run(again.reset(task.row()))
    assert again.plan == plan  # the same episode number meets the same plan in every mode


def test_failing_tests_fall_to_zero_at_the_end_on_average():
    plan = plan_episode(TASKS[0].row(), 0)
    rng = random.Random(0)
    assert np.mean([failing_tests(plan, plan.turns, rng) for _ in range(200)]) < 1.0
    assert np.mean([failing_tests(plan, 0, rng) for _ in range(200)]) > plan.tests - 1.5


def test_the_test_log_lists_up_to_log_lines_failing_tests_and_leaves_the_plan_alone():
    logged = make_tasks(600, seed=3, max_turns=8, latency_mean_s=0.05, log_lines=3)
    task, plain = next((a, b) for a, b in zip(logged, TASKS, strict=True) if plan_episode(a.row(), 0).turns >= 4)
    env = AgentTaskEnv(Counter())

    async def episode():
        await env.reset(task.row())
        answers = []
        while not (result := await env.respond()).done:
            answers.append(result.observations[0]["content"])
        return answers

    answers = asyncio.run(episode())
    assert plan_episode(task.row(), 0) == plan_episode(plain.row(), 0)  # the log changes no draw
    for answer in answers:
        head, *lines = answer.split("\n")
        failing = int(head.split(": ")[1].split()[0])
        assert len(lines) == min(failing, 3) and all(line.startswith("FAILED tests/") for line in lines)
    assert any(len(a) > 150 for a in answers)  # a context grows by its observations
