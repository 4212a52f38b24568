"""Session fixtures of the image tests: the test images are built once per run."""

from __future__ import annotations

import pytest
from tests.sandbox.image_builder import ImageSet, build_test_images


@pytest.fixture(scope="session")
def test_images(tmp_path_factory) -> ImageSet:
    return build_test_images(tmp_path_factory.mktemp("images"))
