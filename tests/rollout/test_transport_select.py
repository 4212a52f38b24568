"""Selecting a KV transport by name: unknown names and a missing Mooncake package fail
clearly, before anything is sent."""

import sys

import pytest

from venusrl.rollout.transport_select import open_transport


def _never_called(ids, kv):
    raise AssertionError("nothing is delivered")


def test_an_unknown_transport_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown KV transport 'rdma'.*in_process, tcp, mooncake"), \
            open_transport("rdma", _never_called):
        pass


def test_mooncake_without_its_package_says_what_to_install(monkeypatch):
    # None in sys.modules makes `import mooncake.engine` fail as if the package were absent
    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)
    with pytest.raises(ImportError, match=r"mooncake-transfer-engine.*pip install 'venusrl\[mooncake\]'"), \
            open_transport("mooncake", _never_called):
        pass
