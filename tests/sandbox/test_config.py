"""The `sandbox` config section: defaults, units, errors that name the key."""

from __future__ import annotations

import pytest


def test_sandbox_config_errors_name_the_key():
    from venusrl.config import ConfigError, load_config

    assert load_config(None, ["sandbox.node_memory=4GiB"]).sandbox.node_memory == 4 << 30
    with pytest.raises(ConfigError, match="sandbox.alpha"):
        load_config(None, ["sandbox.alpha=0"])
    with pytest.raises(ConfigError, match="sandbox.admission"):
        load_config(None, ["sandbox.admission=greedy"])
    with pytest.raises(ConfigError, match="sandbox.nodez"):
        load_config(None, ["sandbox.nodez=2"])
