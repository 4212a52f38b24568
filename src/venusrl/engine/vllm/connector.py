"""Which KV connector vLLM engines start with (`engine.vllm_kv_connector`), and what each NIXL
engine is spawned with: its engine id, side-channel address and vLLM's `kv_transfer_config`.
Imports no vLLM (the choice is checked where vLLM is not installed too); the moves themselves
are vllm/nixl.py's.

Each engine gets NixlConnector (`kv_both`, CPU buffer, its own engine id and side-channel port,
set in the environment its engine core and worker are spawned with). The side channel and UCX
stay on loopback unless `VLLM_NIXL_SIDE_CHANNEL_HOST` names another address.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

FIELD = "engine.vllm_kv_connector"
CONNECTORS = ("auto", "nixl", "none")
LEASE_S = 30  # the source keeps exported blocks this long for a reader (vLLM's kv_lease_duration)
HOST_VAR, PORT_VAR = "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"
# UCX over loopback only, as measured (results/vllm/nixl-connector)
_LOOPBACK_UCX = {"UCX_NET_DEVICES": "lo", "UCX_TLS": "self,sm,tcp"}
_INSTALL = "`make vllm-venv` installs nixl-cu12==1.5.1 --no-deps"


def nixl_installed() -> bool:
    """Whether vLLM's NIXL import (`nixl._api`, `vllm/distributed/nixl_utils.py`) loads here."""
    try:
        import nixl._api  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def resolve_connector(choice: str, cpu: bool) -> tuple[str, str]:
    """(`nixl` or `none`, why) for the config's `engine.vllm_kv_connector` on vLLM's CPU build
    (`cpu`) or another: `auto` is `nixl` where NIXL is installed and the forward pass is not on
    the CPU, else `none`; `nixl` where NIXL is not installed is an error. On the CPU build each
    engine's NIXL agent runs a progress thread that polls a core its forward pass needs: moves
    with it made venus's rollout slower, not faster (results/vllm/nixl-migration)."""
    if choice not in CONNECTORS:
        raise ValueError(f"{FIELD}: {choice!r} is not one of {', '.join(CONNECTORS)}")
    if choice == "none":
        return "none", f"{FIELD} is none"
    installed = nixl_installed()
    if choice == "nixl" and not installed:
        raise ValueError(f"{FIELD}: nixl, but NIXL does not import in this venv ({_INSTALL})")
    if choice == "nixl" or (installed and not cpu):
        return "nixl", f"{FIELD} is {choice}"
    if installed:
        return "none", (f"{FIELD} is auto on vLLM's CPU build, where NIXL's progress thread takes a core from the "
                        "forward pass (set nixl to move KV anyway)")
    return "none", f"{FIELD} is auto and NIXL is not installed ({_INSTALL})"


def moved_tokens(prompt_len: int, block_size: int) -> int:
    """The tokens a move of a `prompt_len`-token context leaves in the target's prefix cache
    for that context: the whole blocks of all but its last token (vLLM's lookup stops one
    token short of the prompt)."""
    return max(0, prompt_len - 1) // block_size * block_size


@dataclass(frozen=True, slots=True)
class NixlEndpoint:
    engine_id: str
    host: str
    port: int


def new_endpoint() -> NixlEndpoint:
    """A unique engine id and a free side-channel port on the side-channel host."""
    host = os.environ.get(HOST_VAR, "127.0.0.1")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    return NixlEndpoint(f"venusrl-{uuid.uuid4().hex[:12]}", host, port)


def spawn_environ(endpoint: NixlEndpoint) -> dict[str, str]:
    """What an engine's processes are spawned with (`scoped_environ`): its side channel, and UCX
    on loopback when the side channel is (unless set already)."""
    values = {HOST_VAR: endpoint.host, PORT_VAR: str(endpoint.port)}
    if ipaddress.ip_address(socket.gethostbyname(endpoint.host)).is_loopback:
        values.update({k: v for k, v in _LOOPBACK_UCX.items() if k not in os.environ})
    return values


@contextlib.contextmanager
def scoped_environ(values: dict[str, str]) -> Iterator[None]:
    """`values` in this process's environment while inside (vLLM's processes spawned there read
    them), the previous values back after."""
    saved = {k: os.environ[k] for k in values if k in os.environ}
    os.environ.update(values)
    try:
        yield
    finally:
        for k in values:
            os.environ.pop(k, None)
        os.environ.update(saved)


def transfer_config(endpoint: NixlEndpoint) -> Any:
    """vLLM's `kv_transfer_config` for an engine that sends and receives prefix KV."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both", kv_buffer_device="cpu",
                            engine_id=endpoint.engine_id,
                            kv_connector_extra_config={"backends": ["UCX"], "kv_lease_duration": LEASE_S})
