"""The `engine.weight_sync` section: how the trainer's weights reach the engines."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from venusrl.schema import Section

WeightTransport = Literal["device_copy", "shared_memory", "cuda_ipc", "broadcast", "socket"]


class WeightSyncConfig(Section):
    transport: Literal["auto", "device_copy", "shared_memory", "cuda_ipc", "broadcast", "socket"] = Field(
        "auto", description="how each push reaches the engines. auto: chosen per engine from where it is "
        "(weights/placement.py): device_copy for an engine in the pushing process (a copy from the trainer's "
        "tensors into the engine's parameters, cast on the device); for an engine process on the same host "
        "cuda_ipc when the weights are on a GPU, else shared_memory (written once, only a handle goes over the "
        "socket); broadcast for one on another host that joined the weight group, else socket (the bytes over "
        "the engine's socket, the path before weights/ existed). A named transport applies to every engine it "
        "can reach and is an error at start-up for one it cannot")
    group_host: str = Field(
        "127.0.0.1", description="broadcast: the address the weight group's rendezvous (a TCPStore on the "
        "pushing process, rank 0) binds and the engines dial; an address the engines' hosts can reach. "
        "Under run.runtime: ray the rollout actor's node IP, as Ray reports it, is used instead")
    group_port: int = Field(
        0, ge=0, le=65535, description="broadcast: the rendezvous port (0: any free one, for engines this "
        "process starts or, as Ray engine actors, is told of; engines started elsewhere need a fixed one)")
    group_timeout_s: float = Field(
        600.0, gt=0, description="broadcast: how long the rendezvous and each broadcast may take before the "
        "group fails (every engine of the group must take part in every push)")
