"""The engine wire format: any header and tensors round-trip byte for byte; frames that break
the format are refused with an error that says what is wrong."""

import asyncio
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.engine.remote.wire import DTYPES, WireError, encode_bytes, read_frame, sampling_of

json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                      max_size=3), max_leaves=10)
tensors = st.dictionaries(
    st.text(min_size=1, max_size=6),
    st.tuples(st.sampled_from(sorted(DTYPES)), st.lists(st.integers(0, 4), max_size=3)),
    max_size=4)


def _read(data: bytes):
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_frame(reader)

    return asyncio.run(go())


@settings(max_examples=60, deadline=None)
@given(header=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "tensors"), json_values, max_size=4),
       specs=tensors, seed=st.integers(0, 2**16))
def test_frames_round_trip(header, specs, seed):
    g = torch.Generator().manual_seed(seed)
    sent = {name: (torch.randint(0, 2, shape, generator=g).bool() if dtype == "bool" else
                   torch.randint(-100, 100, shape, generator=g).to(DTYPES[dtype]))
            for name, (dtype, shape) in specs.items()}
    frame = _read(encode_bytes(header, sent))
    assert frame.header == header
    assert frame.tensors.keys() == sent.keys()
    for name, tensor in sent.items():
        got = frame.tensors[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape and torch.equal(got, tensor)


def test_a_clean_end_between_frames_is_none_and_inside_one_is_an_error():
    assert _read(b"") is None
    with pytest.raises(WireError, match="inside a frame prefix"):
        _read(b"VRL1\x00")
    with pytest.raises(WireError, match="inside a frame"):
        _read(encode_bytes({"op": "stats"})[:-2])


@pytest.mark.parametrize(("data", "message"), [
    (b"POST /v1 HTTP/1.1\r\n\r\n", "not a venusrl engine frame"),
    (struct.pack(">4sIQ", b"VRL1", 1 << 30, 0), "over the"),
    (struct.pack(">4sIQ", b"VRL1", 2, 0) + b"[]", "not an object"),
    (struct.pack(">4sIQ", b"VRL1", 2, 4) + b"{}" + b"abcd", "its tensors take 0"),
    (encode_bytes({"tensors": [["k", "float32", [-1]]]}), "not a list of sizes"),
    (encode_bytes({"tensors": "k"}), "must be a list"),
])
def test_broken_frames_say_what_is_wrong(data, message):
    with pytest.raises(WireError, match=message):
        _read(data)


def test_sampling_fields_are_checked_by_name():
    with pytest.raises(WireError, match=r"unknown keys \['beam'\]"):
        sampling_of({"op": "generate", "sampling": {"beam": 4}})
    with pytest.raises(WireError, match="temperature must be >= 0"):
        sampling_of({"op": "generate", "sampling": {"temperature": -1}})
    assert sampling_of({"sampling": {"stop_token_ids": [1, 2], "max_new_tokens": 3}}).stop_token_ids == (1, 2)
