"""The `engine` section of the config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from venusrl.schema import Section
from venusrl.weights.config import WeightSyncConfig

EnginePlacement = Literal["in_process", "process"]


class EngineConfig(Section):
    backend: Literal["ours", "vllm"] = Field(
        "ours", description="ours: venusrl's engine; vllm: vLLM's AsyncLLM under venus's scheduler "
        "(engine/vllm/backend.py; needs the vllm extra, `make vllm-venv`)")
    vllm_kv_connector: Literal["auto", "nixl", "none"] = Field(
        "auto", description="engine.backend: vllm: how a turn moved between vLLM engines gets its prefix KV. "
        "nixl: vLLM's NixlConnector (nixl-cu12, `make vllm-venv`): the target pulls the prefix's whole blocks "
        "from the source (engine/vllm/nixl.py); none: the target recomputes the prefix; auto: nixl where NIXL "
        "is installed and the forward pass is not on the CPU (on vLLM's CPU build NIXL's progress thread takes "
        "a core from it: results/vllm/nixl-migration), else none")
    placement: EnginePlacement = Field(
        "in_process", description="where each rollout engine runs: in_process: a thread of the rollout process; "
        "process: its own OS process, reached over a socket (engine/remote/process.py), and with run.runtime: ray its "
        "own Ray actor (one GPU each where there are GPUs, spread over the nodes); prefix KV then moves engine "
        "to engine over the KV transport")
    page_size: int = Field(16, ge=1, description="tokens per KV page")
    kv_capacity_tokens: int = Field(32768, ge=1, description="KV slots on the device pool")
    host_kv_capacity_tokens: int = Field(
        0, ge=0, description="host-memory KV tier: what the device pool evicts is saved there and loaded back "
        "on a hit instead of recomputed (0: off)")
    max_running_requests: int = Field(64, ge=1, description="decode batch size bound")
    max_prefill_tokens: int = Field(4096, ge=1, description="token budget of one prefill batch")
    chunked_prefill_size: int = Field(2048, ge=1, description="longest prefill chunk of one request")
    cache_policy: Literal["tiers", "lru"] = Field("tiers", description="radix eviction: trajectory-aware tiers or plain LRU")
    demotion: bool = Field(True, description="residency-aware demotion of HIGH trajectories under KV pressure")
    work_conservation: bool = Field(
        True, description="a request that is the iteration's only work may evict every KV tier, so the engine "
        "never idles to keep HIGH KV for trajectories that are not running (safe with any caller). false: the "
        "paper's rule alone (a LOW request never evicts HIGH KV), for a caller that hands a stalled LOW holder's "
        "slot to the urgent turns waiting behind it, as venus's rollout worker does; a training config derives "
        "it: false under scheduler.policy venus ranking groups, true otherwise")
    demotion_order: Literal["shortest", "idle_first"] = Field(
        "shortest", description="whom demotion pauses first: shortest: the shortest contexts (paper §4.3); "
        "idle_first: trajectories with no request in the engine (waiting on a tool), then generating ones, "
        "each shortest first (ThunderAgent)")
    trajectory_idle_ttl_s: float = Field(
        600.0, ge=0, description="a caller trajectory with no request in the engine for this long is released "
        "(its KV becomes plain cache): a client that never releases cannot leak (0: never)")
    max_restarts: int = Field(
        3, ge=0, description="engine crashes in a row (no step completed between them) the engine thread "
        "recovers from by rebuilding the engine and re-issuing in-flight requests from their partial outputs; "
        "past it the engine is dead and /health answers 503")
    attention_backend: Literal["auto", "sdpa", "triton"] = Field(
        "auto", description="paged attention kernels (engine/attention/): triton: Triton kernels reading K/V "
        "from the pool through a slot table (the GPU backend; needs the triton package); sdpa: PyTorch's "
        "scaled_dot_product_attention with decode rows (the CPU backend); auto: triton on a CUDA device, "
        "sdpa elsewhere")
    cuda_graphs: bool = Field(
        True, description="replay decode-only steps from CUDA graphs captured at start-up, one per batch-size "
        "bucket (1, 2, 4, 8, then steps of 16 up to max_running_requests; engine/cuda_graphs.py): on a CUDA "
        "device with the triton backend; ignored elsewhere")
    kv_after_weight_update: Literal["recompute", "keep"] = Field(
        "recompute",
        description="recompute: cached KV is dropped with the old weights, so every token is computed "
        "by the weights it is sampled under; keep: reuse it (faster, an off-policy approximation "
        "that the recorded log-probs and TIS/IcePop correct for)",
    )
    weight_sync: WeightSyncConfig = Field(
        default_factory=WeightSyncConfig, description="how the trainer's weights reach the engines after each step "
        "(weights/): the transport per engine placement, and the broadcast group's rendezvous")

    @model_validator(mode="after")
    def _weight_transport_reaches_the_engines(self) -> EngineConfig:
        transport = self.weight_sync.transport
        in_process = self.placement == "in_process" and self.backend == "ours"
        if (in_process and transport not in ("auto", "device_copy")) or (not in_process and transport == "device_copy"):
            where = "in this process" if in_process else "in processes of their own"
            raise ValueError(f"engine.weight_sync.transport: {transport} cannot reach engines {where} "
                             f"(engine.placement: {self.placement}, engine.backend: {self.backend})")
        return self
