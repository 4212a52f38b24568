"""The wire protocol between an `EngineClient` and an engine in another process
(`engine/remote/process.py` serves it, `engine/remote/remote.py` speaks it).

A frame is a fixed prefix, a JSON header and a binary payload:

    b"VRL1" | header length (u32, big-endian) | payload length (u64) | header | payload

The header is one JSON object: the message (`op`, its fields) and, under `tensors`, the name,
dtype and shape of each tensor the payload carries, in payload order, each starting on a
16-byte boundary. Tensors (prefix KV, state dicts) travel as their raw bytes; nothing from
the network is unpickled. JSON and not msgpack: no new dependency, and only token ids and
small records go through it (a chunk of a stream, a stats record); everything large is
payload bytes.

A frame that cannot be read (bad magic, a length past the limits, a header that is not a
JSON object, tensor sizes that do not add up to the payload) raises `WireError`; a message
with a missing or mistyped field raises `WireError` naming the field. The server answers
either with an error message and goes on serving (it closes only a connection whose framing
it lost).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from venusrl.engine.client import EngineHealth, EngineInfo
from venusrl.engine.engine import RequestOutput
from venusrl.engine.stats import EngineLoad, EngineStats
from venusrl.engine.step_log import StepLogSlice, StepSample
from venusrl.types import Priority, SamplingParams

MAGIC = b"VRL1"
PREFIX = struct.Struct(">4sIQ")
MAX_HEADER_BYTES = 64 << 20  # token ids of a long context fit many times over
MAX_PAYLOAD_BYTES = 1 << 40  # a state dict of a large model
ALIGN = 16
DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")}


class WireError(ValueError):
    """A frame or message that does not follow the protocol; says which part."""


@dataclass(slots=True)
class Frame:
    header: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def encode(header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None) -> list[bytes | memoryview]:
    """The frame's buffers, for `writer.writelines` (tensor bytes are not copied again)."""
    specs, chunks, size = [], [], 0
    for name, tensor in (tensors or {}).items():
        flat = tensor.detach().to("cpu").contiguous()
        data = memoryview(flat.reshape(-1).view(torch.uint8).numpy()).cast("B") if flat.numel() else memoryview(b"")
        pad = -size % ALIGN
        if pad:
            chunks.append(bytes(pad))
        specs.append([name, str(flat.dtype).removeprefix("torch."), list(flat.shape)])
        chunks.append(data)
        size += pad + data.nbytes
    head = json.dumps({**header, "tensors": specs} if specs else dict(header), separators=(",", ":")).encode()
    return [PREFIX.pack(MAGIC, len(head), size), head, *chunks]


def encode_bytes(header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None) -> bytes:
    return b"".join(encode(header, tensors))


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame, or None at a clean end of stream (between frames)."""
    try:
        prefix = await reader.readexactly(PREFIX.size)
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise WireError(f"stream ended inside a frame prefix ({len(err.partial)} of {PREFIX.size} bytes)") from err
    magic, header_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise WireError(f"not a venusrl engine frame: magic {magic!r}, expected {MAGIC!r}")
    if header_len > MAX_HEADER_BYTES:
        raise WireError(f"header of {header_len} bytes is over the {MAX_HEADER_BYTES}-byte limit")
    if payload_len > MAX_PAYLOAD_BYTES:
        raise WireError(f"payload of {payload_len} bytes is over the {MAX_PAYLOAD_BYTES}-byte limit")
    try:
        head = await reader.readexactly(header_len)
        payload = bytearray(await reader.readexactly(payload_len)) if payload_len else bytearray()
    except asyncio.IncompleteReadError as err:
        raise WireError(f"stream ended inside a frame ({len(err.partial)} bytes of a part)") from err
    return decode(head, payload)


def decode(head: bytes, payload: bytearray) -> Frame:
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WireError(f"header is not JSON: {err}") from err
    if not isinstance(header, dict):
        raise WireError(f"header is a JSON {type(header).__name__}, not an object")
    specs = header.pop("tensors", [])
    if not isinstance(specs, list):
        raise WireError("header field 'tensors' must be a list of [name, dtype, shape]")
    tensors, offset = {}, 0
    for spec in specs:
        name, dtype, shape = _tensor_spec(spec)
        offset += -offset % ALIGN
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if offset + nbytes > len(payload):
            raise WireError(f"tensor {name!r} ({nbytes} bytes at {offset}) runs past the {len(payload)}-byte payload")
        tensors[name] = (torch.frombuffer(payload, dtype=dtype, count=count, offset=offset).view(shape) if count
                         else torch.empty(shape, dtype=dtype))
        offset += nbytes
    if offset != len(payload):
        raise WireError(f"payload has {len(payload)} bytes, its tensors take {offset}")
    return Frame(header, tensors)


def _tensor_spec(spec: Any) -> tuple[str, torch.dtype, list[int]]:
    if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str)):
        raise WireError(f"tensor spec {str(spec)[:80]} is not [name, dtype, shape]")
    name, dtype, shape = spec
    if dtype not in DTYPES:
        raise WireError(f"tensor {name!r}: dtype {str(dtype)[:40]!r} is not one of {', '.join(DTYPES)}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise WireError(f"tensor {name!r}: shape {str(shape)[:80]} is not a list of sizes")
    return name, DTYPES[dtype], shape


# ---- message fields ------------------------------------------------------------------------

def field_of(message: Mapping[str, Any], name: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
    """`message[name]`, checked to be of `kind` (None allowed when optional)."""
    if name not in message:
        if optional:
            return None
        raise WireError(f"message {message.get('op')!r} lacks field {name!r}")
    value = message[name]
    if value is None and optional:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # JSON true is no int
        want = " or ".join(k.__name__ for k in kinds)
        raise WireError(f"field {name!r} of {message.get('op')!r} must be {want}, got {type(value).__name__}")
    return value


def token_ids_of(message: Mapping[str, Any], name: str = "token_ids") -> list[int]:
    ids = field_of(message, name, list)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise WireError(f"field {name!r} of {message.get('op')!r} must be a list of integer token ids")
    return ids


def priority_of(message: Mapping[str, Any], optional: bool = False) -> Priority | None:
    value = field_of(message, "priority", int, optional)
    if value is None:
        return None
    try:
        return Priority(value)
    except ValueError as err:
        raise WireError(f"field 'priority' must be one of {[int(p) for p in Priority]}, got {value}") from err


def sampling_to_wire(sampling: SamplingParams) -> dict[str, Any]:
    return asdict(sampling)


def sampling_of(message: Mapping[str, Any]) -> SamplingParams:
    fields = field_of(message, "sampling", dict)
    known = set(SamplingParams.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise WireError(f"field 'sampling' has unknown keys {unknown}")
    values = {k: tuple(v) if k in ("stop_token_ids", "stop") and isinstance(v, list) else v for k, v in fields.items()}
    try:
        return SamplingParams(**values)
    except (TypeError, ValueError) as err:
        raise WireError(f"field 'sampling': {err}") from err


# ---- records -------------------------------------------------------------------------------

def output_to_wire(stream_id: int, output: RequestOutput, sent: int) -> dict[str, Any]:
    """One stream chunk: the tokens past the `sent` the client already has, and the total, so
    the client can check it rebuilt the whole output."""
    return {"id": stream_id, "rid": output.request_id, "trajectory_id": output.trajectory_id,
            "prompt_len": output.prompt_len, "new": output.output_ids[sent:], "logprobs": output.logprobs[sent:],
            "versions": output.weight_versions[sent:], "total": len(output.output_ids),
            "finished": output.finished, "reason": output.finish_reason, "error": output.error}


def stats_of(fields: Mapping[str, Any]) -> EngineStats:
    return EngineStats(**fields)


def steps_to_wire(steps: StepLogSlice) -> dict[str, Any]:
    return {"start": steps.start, "samples": [[s.prefill_tokens, s.decode_seqs, s.kv_tokens, s.seconds, s.ended_s]
                                              for s in steps.samples]}


def steps_of(fields: Mapping[str, Any]) -> StepLogSlice:
    return StepLogSlice(fields["start"], tuple(StepSample(*row) for row in fields["samples"]))


def load_to_wire(load: EngineLoad) -> dict[str, Any]:
    return {"high_pressure": load.high_pressure, "kv_capacity_tokens": load.kv_capacity_tokens,
            "demoted": sorted(load.demoted), "memory_stalls": load.memory_stalls}


def load_of(fields: Mapping[str, Any]) -> EngineLoad:
    return EngineLoad(fields["high_pressure"], fields["kv_capacity_tokens"], frozenset(fields["demoted"]),
                      fields.get("memory_stalls"))  # an engine of an older release does not say


def health_of(fields: Mapping[str, Any]) -> EngineHealth:
    return EngineHealth(**fields)


def info_to_wire(info: EngineInfo) -> dict[str, Any]:
    return asdict(info)


def info_of(fields: Mapping[str, Any]) -> EngineInfo:
    return EngineInfo(**{**fields, "eos_token_ids": tuple(fields["eos_token_ids"])})


def address_of(value: Sequence[Any]) -> tuple[str, int]:
    host, port = value
    return str(host), int(port)
