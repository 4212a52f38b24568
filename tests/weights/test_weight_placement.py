"""The transport per engine: auto follows where the engine is; a named transport that cannot
reach an engine is an error naming the field."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.engine.config import EngineConfig
from venusrl.weights.placement import EngineLocation, choose_transport, joins_group

IN_PROCESS = EngineLocation(in_process=True, same_host=True, in_group=False)
SAME_HOST = EngineLocation(in_process=False, same_host=True, in_group=False)
OTHER_HOST = EngineLocation(in_process=False, same_host=False, in_group=True)
UNGROUPED = EngineLocation(in_process=False, same_host=False, in_group=False)


@pytest.mark.parametrize(("location", "on_gpu", "want"), [
    (IN_PROCESS, False, "device_copy"), (IN_PROCESS, True, "device_copy"),
    (SAME_HOST, False, "shared_memory"), (SAME_HOST, True, "cuda_ipc"),
    (OTHER_HOST, True, "broadcast"), (UNGROUPED, False, "socket"),
])
def test_auto_follows_where_the_engine_is(location, on_gpu, want):
    assert choose_transport("auto", location, on_gpu) == want


@given(st.sampled_from(["device_copy", "shared_memory", "cuda_ipc", "broadcast", "socket"]),
       st.builds(EngineLocation, st.booleans(), st.booleans(), st.booleans()), st.booleans())
def test_a_named_transport_is_used_as_named_or_refused_naming_the_field(transport, location, on_gpu):
    try:
        chosen = choose_transport(transport, location, on_gpu)
    except ValueError as err:
        assert str(err).startswith(f"engine.weight_sync.transport: {transport} cannot reach")
        auto = choose_transport("auto", location, on_gpu)
        assert auto != transport or transport == "broadcast", "what auto picks is always reachable"
    else:
        assert chosen == transport


@given(st.builds(EngineLocation, st.just(False), st.booleans(), st.just(False), st.booleans()), st.booleans())
def test_an_engine_process_joins_the_group_exactly_where_its_pushes_would_then_be_broadcast(location, on_gpu):
    """A Ray engine actor, not yet in a group: with auto it joins when it is on another host
    than the pusher (same host: shared memory or CUDA IPC); with broadcast always; with socket
    never. Joined, the pusher then indeed broadcasts to it."""
    assert joins_group("auto", location, on_gpu) == (location.wire and not location.same_host)
    assert joins_group("broadcast", location, on_gpu) == location.wire
    assert not joins_group("socket", location, on_gpu)
    if joins_group("auto", location, on_gpu):
        joined = EngineLocation(location.in_process, location.same_host, True, location.wire)
        assert choose_transport("auto", joined, on_gpu) == "broadcast"


def test_the_config_refuses_a_transport_that_cannot_reach_its_placement():
    with pytest.raises(ValueError, match="engine.weight_sync.transport: shared_memory cannot reach engines in this"):
        EngineConfig(weight_sync={"transport": "shared_memory"})
    with pytest.raises(ValueError, match="device_copy cannot reach engines in processes of their own"):
        EngineConfig(placement="process", weight_sync={"transport": "device_copy"})
    assert EngineConfig(placement="process", weight_sync={"transport": "broadcast"}).weight_sync.transport == "broadcast"
