import pytest

import terra


@pytest.fixture
def fresh_graphs():
    """No Terra graphs before the test and none after it; the policy (terra.config) as it was."""
    terra.reset()
    settings = terra.config()
    yield
    terra.config(**settings)
    terra.reset()
