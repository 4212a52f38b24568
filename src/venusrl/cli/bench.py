"""`venusrl bench ...`: one command per benchmark module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from venusrl.cli.support import load_config_or_exit
from venusrl.engine.vllm.connector import CONNECTORS

bench_app = typer.Typer(help="Benchmarks; each writes its figures as JSON.", no_args_is_help=True)


@bench_app.command("fidelity")
def fidelity(
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG.yaml", help="a demo configuration")] = Path("examples/demo.yaml"),
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted key=value overrides")] = None,
    seeds: Annotated[str, typer.Option(help="comma-separated run.seed values (0 and 4: the seeds of "
                                            "examples/demo.yaml whose warm start learns the task)")] = "0,4",
    policies: Annotated[str, typer.Option(help="comma-separated scheduler.policy values")] = (
        "venus,action_level,trajectory_level"),
    workdir: Annotated[Path, typer.Option(help="models, runs and PNGs go here")] = Path("runs/fidelity"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
    progress: Annotated[bool, typer.Option(help="show the SFT and training progress bars")] = True,
) -> None:
    """Reward per step (and per 10 steps), held-out accuracy, version spans by trajectory
    length, and the difficulty and length percentiles of the prompts each step trained, of each
    scheduler on the demo's task, same seeds and SFT model for all."""
    from venusrl.bench.fidelity import run_fidelity, table

    seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    policy_list = [p.strip() for p in policies.split(",") if p.strip()]
    configs = {seed: load_config_or_exit(config_path, [*(overrides or []), f"run.seed={seed}",
                                                       f"demo.workdir={workdir / f'seed-{seed}'}"])
               for seed in seed_list}
    for policy in policy_list:  # a bad policy name fails here, before any training
        load_config_or_exit(config_path, [*(overrides or []), f"scheduler.policy={policy}"])
    report = run_fidelity(configs, policy_list, workdir, progress)
    report["command"] = (f"venusrl bench fidelity {config_path} {' '.join(overrides or [])} --seeds {seeds} "
                         f"--policies {policies} --workdir {workdir}")
    text = json.dumps(report, indent=2)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text + "\n")
    typer.echo(table(report))



@bench_app.command("engine")
def bench_engine(
    quick: Annotated[bool, typer.Option("--quick", help="smaller workload, minutes not tens of minutes")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
    backends: Annotated[str | None, typer.Option(
        help="comma-separated among ours,vllm,hf: their tokens/s side by side instead (vllm: run in .venv-vllm)")] = None,
    device: Annotated[str | None, typer.Option(
        help="cuda or cpu: instead, the engine on an official model shape with random weights on this device "
             "(bench/engine_shapes.py): tokens/s at batch 1, 64, 256 against transformers, ms per decode step "
             "against the HBM roofline, kernel launches per step, CUDA-graph capture, triton vs sdpa logits")] = None,
    model_shape: Annotated[str, typer.Option(help="with --device: qwen3-0.6b, qwen3-4b, qwen3-8b or tiny")] = "qwen3-4b",
    cases: Annotated[str | None, typer.Option(
        help="with --device: batch:prompt_tokens:new_tokens,... (default 1:256:128,64:512:256,256:512:128 on "
             "cuda, 1:32:16,8:64:32 on cpu)")] = None,
    hbm_tb_s: Annotated[float, typer.Option(min=0.01, help="with --device: HBM bandwidth of the roofline (H200: 4.8)")] = 4.8,
) -> None:
    """Engine vs transformers tokens/s and greedy agreement; KV hit rate of an agentic
    workload under a tight KV budget for lru, tiers and tiers_demotion. With --device: the
    engine on an official model shape instead."""
    from venusrl.bench.engine import main
    from venusrl.bench.engine_backends import parse_backends

    if device is not None:
        from venusrl.bench import engine_shapes
        from venusrl.bench.report import emit

        try:
            if device not in ("cuda", "cpu"):
                raise ValueError(f"--device: {device!r} is not cuda or cpu")
            if model_shape not in engine_shapes.SHAPES:
                raise ValueError(f"--model-shape: {model_shape!r} is not one of {', '.join(engine_shapes.SHAPES)}")
            parsed = engine_shapes.parse_cases(cases) if cases else None
            result = engine_shapes.run(device, model_shape, parsed, hbm_tb_s)
        except ValueError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
        result["command"] = (f"venusrl bench engine --device {device} --model-shape {model_shape}"
                             + (f" --cases {cases}" if cases else "") + f" --hbm-tb-s {hbm_tb_s}")
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
        emit(result, json_out)
        return
    try:
        names = parse_backends(backends) if backends is not None else None
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    main(quick, json_out, names)


@bench_app.command("predictor")
def bench_predictor(
    quick: Annotated[bool, typer.Option("--quick", help="smaller workload")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
    data: Annotated[Path | None, typer.Option(help="JSONL of (messages, remaining_tokens) rows instead of the synthetic workload")] = None,
    predictors: Annotated[str, typer.Option(help="comma-separated: group_history,learned,lm")] = "group_history,learned,lm",
    lm_model: Annotated[Path | None, typer.Option(help="Hugging Face model for `lm` (default: the tiny model)")] = None,
) -> None:
    """Spearman, MAE, MAPE and latency of the length predictors."""
    from venusrl.bench.predictor import main

    main(quick, json_out, data, predictors, lm_model)


@bench_app.command("scheduler")
def bench_scheduler(
    quick: Annotated[bool, typer.Option("--quick", help="fewer events")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
    groups: Annotated[int, typer.Option(min=1, help="groups in flight")] = 1250,
    group_size: Annotated[int, typer.Option(min=1, help="K")] = 8,
    events: Annotated[int | None, typer.Option(min=1, help="timed events per policy (default 200000, quick 20000)")] = None,
    policies: Annotated[str, typer.Option(help="comma-separated priority policies")] = "fcfs,action_level,length_prediction,oracle",
    seed: int = 0,
) -> None:
    """Events per second and p99 latency of one DataCoordinator event at 10,000 in-flight trajectories."""
    from venusrl.bench.scheduler import main

    main(quick, json_out, groups, group_size, events, policies, seed)


@bench_app.command("rollout")
def bench_rollout(
    quick: Annotated[bool, typer.Option("--quick", help="B=4, N=4 steps, one repeat, trainer 0.5x (minutes)")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="the quick case over 3 slot counts x 2 KV budgets instead")] = False,
    engine_placement: Annotated[str, typer.Option(
        help="process: each engine in its own OS process (as on its own accelerator); in_process: threads of "
        "the bench's process, sharing its GIL")] = "process",
    greedy_check: Annotated[bool, typer.Option(
        "--greedy-check", help="instead, venus's round at temperature 0 with the engines placed as "
        "--engine-placement against the same in process: every prompt both sent must get the same reply")] = False,
    slots_per_engine: Annotated[int | None, typer.Option(min=1, help="replace the case's generation slots per engine")] = None,
    kv_tokens_per_engine: Annotated[int | None, typer.Option(min=64, help="replace the case's KV pool per engine")] = None,
    repeats: Annotated[int | None, typer.Option(min=1, help="replace the case's paired repeats at the headline trainer factor")] = None,
    test_log_lines: Annotated[int | None, typer.Option(
        min=0, help="failing tests each tool answer lists, one line each (contexts grow by their observations: "
        "KV binds, not slots)")] = None,
    tool_latency_s: Annotated[float | None, typer.Option(
        min=0.0, help="replace the case's mean tool latency (exponential): against a turn's engine time it "
        "decides how often every resident trajectory is in its tool at once")] = None,
    max_turns: Annotated[int | None, typer.Option(
        min=1, help="replace the case's turn cap (the long-tail cell: 20; a task's turns grow with its "
        "difficulty up to it)")] = None,
    engine_backend: Annotated[str | None, typer.Option(
        help="ours, or vllm: vLLM's AsyncLLM under venus's scheduler (run from the vLLM venv, `make vllm-venv`; "
        "no engine-time breakdown: vLLM reports no step durations)")] = None,
    head_dim: Annotated[int | None, typer.Option(
        min=1, help="the tiny model's head_dim (default hidden/heads = 16; 64 with --engine-backend vllm, whose "
        "CPU attention needs >= 32)")] = None,
    vllm_kv_connector: Annotated[str | None, typer.Option(
        help="with --engine-backend vllm: auto, nixl or none, how a moved turn's prefix KV reaches the target "
        "engine (engine.vllm_kv_connector; none: it recomputes)")] = None,
) -> None:
    """Time to N training steps with the trainer in the loop: trajectory-level vs
    action-level vs venus scheduling, the engine-time breakdown and predictor accuracy."""
    from venusrl.bench.rollout import main

    if engine_placement not in ("in_process", "process"):
        raise typer.BadParameter(f"{engine_placement!r}: choose in_process or process", param_hint="--engine-placement")
    if greedy_check and engine_placement == "in_process":
        raise typer.BadParameter("--greedy-check compares a placement with in_process: choose process",
                                 param_hint="--engine-placement")
    if engine_backend not in (None, "ours", "vllm"):
        raise typer.BadParameter(f"{engine_backend!r}: choose ours or vllm", param_hint="--engine-backend")
    if vllm_kv_connector not in (None, *CONNECTORS):
        raise typer.BadParameter(f"{vllm_kv_connector!r}: choose auto, nixl or none", param_hint="--vllm-kv-connector")
    if engine_backend == "vllm" and head_dim is None:
        head_dim = 64
    overrides = {name: value for name, value in (("slots_per_engine", slots_per_engine),
                 ("kv_tokens_per_engine", kv_tokens_per_engine), ("repeats", repeats),
                 ("test_log_lines", test_log_lines), ("tool_latency_mean_s", tool_latency_s),
                 ("max_turns", max_turns), ("engine_backend", engine_backend), ("head_dim", head_dim),
                 ("vllm_kv_connector", vllm_kv_connector)) if value is not None}
    if overrides and (sweep or greedy_check):
        raise typer.BadParameter("case overrides apply to the timed table, not to --sweep or --greedy-check",
                                 param_hint="--slots-per-engine/--kv-tokens-per-engine/--repeats/--test-log-lines/"
                                 "--tool-latency-s/--max-turns/--engine-backend/--head-dim/--vllm-kv-connector")
    main(quick, json_out, sweep, engine_placement, greedy_check, overrides)


@bench_app.command("weight-push")
def bench_weight_push(
    model_shape: Annotated[str, typer.Option(help="qwen3-0.6b, qwen3-4b (official shapes, random weights) or tiny")] = (
        "qwen3-0.6b"),
    device: Annotated[str, typer.Option(help="cpu or cuda: where the trainer's weights and the engines are")] = "cpu",
    dtype: Annotated[str, typer.Option(help="the engines' dtype")] = "bfloat16",
    trainer_dtype: Annotated[str | None, typer.Option(help="the trainer's (default: --dtype; float32 for fp32 "
                                                           "master weights, cast on the push)")] = None,
    placements: Annotated[str | None, typer.Option(help="comma-separated among device_copy,host_copy,shared_memory,"
                                                        "cuda_ipc,socket,broadcast (default: all for the device)")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="interleaved repeats of every placement")] = 5,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
) -> None:
    """Seconds to push the trainer's weights into an engine per placement (weights/), today's
    host and socket paths against device copy, shared memory or CUDA IPC, and broadcast."""
    from venusrl.bench.report import emit
    from venusrl.bench.weight_push import measure_weight_push

    chosen = [p.strip() for p in placements.split(",") if p.strip()] if placements else None
    try:
        result = measure_weight_push(model_shape, device, dtype, trainer_dtype, chosen, repeats,
                                     progress=lambda line: typer.echo(line, err=True))
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    result["command"] = (f"venusrl bench weight-push --model-shape {model_shape} --device {device} --dtype {dtype}"
                         + (f" --trainer-dtype {trainer_dtype}" if trainer_dtype else "")
                         + (f" --placements {placements}" if placements else "") + f" --repeats {repeats}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
    emit(result, json_out)


@bench_app.command("trainer")
def bench_trainer(
    device: Annotated[str, typer.Option(help="torch device: cpu, or cuda (one GPU)")] = "cpu",
    model_shape: Annotated[str, typer.Option(help="tiny, qwen3-0.6b or qwen3-4b (random weights of the official "
                                                 "shape, built here)")] = "tiny",
    cases: Annotated[str, typer.Option(help="comma-separated ROWSxTOKENS: one group of ROWS trajectories of TOKENS "
                                            "each a step")] = "8x256",
    prompt_tokens: Annotated[int, typer.Option(min=1, help="the group's shared prompt, in TOKENS")] = 64,
    dtype: Annotated[str, typer.Option(help="model.dtype: the compute dtype (the master weights are float32)")] = (
        "bfloat16"),
    chunk_tokens: Annotated[int, typer.Option(min=1, help="trainer.logprob_chunk_tokens")] = 1024,
    activation_checkpointing: Annotated[bool, typer.Option(help="trainer.activation_checkpointing")] = True,
    micro_batch_tokens: Annotated[int, typer.Option(min=16, help="trainer.micro_batch_tokens")] = 8192,
    steps: Annotated[int, typer.Option(min=1, help="timed steps a case, after one warm-up step")] = 2,
    loss_tokens: Annotated[int, typer.Option(min=1, help="the loss path's sampled tokens")] = 8192,
    loss_vocab: Annotated[int, typer.Option(min=2, help="the loss path's vocabulary (Qwen3: 151,936)")] = 151_936,
    loss_hidden: Annotated[int, typer.Option(min=1, help="the loss path's hidden size")] = 1024,
    push_repeats: Annotated[int, typer.Option(min=0, help="interleaved repeats of each weight-push placement "
                                                          "(0: none)")] = 1,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
) -> None:
    """Step time, tokens/s, peak memory and MFU (GPU) of GRPO steps with float32 master weights
    under model.dtype compute; peak memory of the chunked loss path against the full one."""
    from venusrl.bench.trainer import SHAPES, BenchOptions, StepCase, main
    from venusrl.model.checkpoint import resolve_dtype

    if model_shape not in SHAPES:
        raise typer.BadParameter(f"{model_shape!r}: choose {', '.join(SHAPES)}", param_hint="--model-shape")
    try:
        resolve_dtype(dtype)
        parsed = tuple(StepCase.parse(case) for case in cases.split(",") if case.strip())
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--cases/--dtype") from None
    if not parsed:
        raise typer.BadParameter("no case given", param_hint="--cases")
    if device.startswith("cuda") and not __import__("torch").cuda.is_available():
        raise typer.BadParameter("no CUDA device here", param_hint="--device")
    main(BenchOptions(device, model_shape, parsed, prompt_tokens, dtype, chunk_tokens, activation_checkpointing,
                      micro_batch_tokens, steps, loss_tokens, loss_vocab, loss_hidden, push_repeats), json_out)
