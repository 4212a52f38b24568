"""The `sandbox` section of the config."""

from __future__ import annotations

from typing import Literal

from pydantic import ByteSize, Field

from venusrl.sandbox.image.store import DEFAULT_STORE
from venusrl.schema import Section


class SandboxConfig(Section):
    backend: Literal["process"] = Field("process", description="how node agents run sandboxes")
    nodes: int = Field(1, ge=1, description="node agents started by the embedded runtime")
    node_memory: ByteSize = Field(ByteSize(2 << 30), description="sandbox memory budget of each node, e.g. 2GiB")
    memory_limit: ByteSize = Field(ByteSize(512 << 20), description="declared size of a sandbox unless create() says")
    admission: Literal["dynamic", "declared"] = Field("dynamic", description="Algorithm 1, or declared sizes (baseline)")
    share_pages: bool = Field(True, description="fork sandboxes from a per-template zygote (template page pool)")
    alpha: float = Field(1.5, gt=0, description="safety factor on predicted growth")
    min_headroom: float = Field(0.05, ge=0, lt=1, description="headroom floor as a fraction of the node budget (0: Algorithm 1 exactly)")
    reaction_time_s: float = Field(1.0, gt=0, description="t_react: how far ahead growth is reserved")
    growth_window_s: float = Field(2.0, gt=0, description="window of the running-growth estimate")
    control_interval_s: float = Field(0.25, gt=0, description="memory sampling period of a node agent")
    cold_start_s: float = Field(1.0, ge=0, description="how long after creation a sandbox counts as cold")
    cold_start_default: ByteSize | None = Field(None, description="G_candidate of a template not yet profiled; default: its declared size")
    pids_limit: int = Field(256, ge=8, description="processes per sandbox")
    oom_grace_s: float = Field(30.0, gt=0, description="how long a node waits for migration before the kernel OOM killer")
    workdir: str | None = Field(None, description="node state (layers, profiles); default: a fresh temp dir")
    exactly_once: bool = Field(True, description="snapshot a sandbox's files at each command's start, so a "
                               "command interrupted by migration re-runs from them and applies its effects once")
    image_store: str = Field(DEFAULT_STORE, description="image layer store shared by this host's node agents")
    transport: Literal["unix", "tcp"] = Field("unix", description="node agent socket: Unix or loopback TCP")
