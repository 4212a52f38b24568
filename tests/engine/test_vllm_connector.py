"""`engine.vllm_kv_connector`: which KV connector vLLM engines start with, checked where vLLM
and NIXL are not installed too (engine/vllm/connector.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from venusrl.engine.config import EngineConfig
from venusrl.engine.vllm.connector import moved_tokens, nixl_installed, resolve_connector

without_nixl = pytest.mark.skipif(nixl_installed(), reason="NIXL is installed in this venv")


def test_an_unknown_connector_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="vllm_kv_connector"):
        EngineConfig(vllm_kv_connector="lmcache")
    with pytest.raises(ValueError, match="engine.vllm_kv_connector: 'lmcache'"):
        resolve_connector("lmcache", cpu=True)


def test_none_is_none():
    assert resolve_connector("none", cpu=False) == ("none", "engine.vllm_kv_connector is none")


@without_nixl
def test_nixl_without_nixl_installed_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match="engine.vllm_kv_connector: nixl, but NIXL does not import"):
        resolve_connector("nixl", cpu=False)


@without_nixl
def test_auto_without_nixl_installed_recomputes_and_says_why():
    connector, why = resolve_connector("auto", cpu=False)
    assert connector == "none"
    assert "NIXL is not installed" in why


@pytest.mark.skipif(not nixl_installed(), reason="NIXL is not installed in this venv")
def test_auto_with_nixl_installed_is_nixl_unless_the_forward_pass_is_on_the_cpu():
    assert resolve_connector("auto", cpu=False)[0] == "nixl"
    connector, why = resolve_connector("auto", cpu=True)
    assert connector == "none"
    assert "progress thread" in why
    assert resolve_connector("nixl", cpu=True)[0] == "nixl"


@pytest.mark.parametrize(("context", "moved"), [(120, 96), (97, 96), (96, 64), (33, 32), (32, 0), (1, 0), (0, 0)])
def test_a_move_covers_the_whole_blocks_before_the_last_token(context, moved):
    assert moved_tokens(context, 32) == moved
