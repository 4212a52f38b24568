import pytest
from tests.engine.tool_model import teach_tool_call


@pytest.fixture(scope="session")
def tool_calling_model_dir(tmp_path_factory):
    return teach_tool_call(tmp_path_factory.mktemp("tool-model"))
