import pytest
from builders import build_tiny_vit


@pytest.fixture
def tiny_vit():
    return build_tiny_vit()
