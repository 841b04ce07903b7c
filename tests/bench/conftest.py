"""The bench tests reuse the integration tests' real-cluster fixture."""

from tests.integration.conftest import make_cluster  # noqa: F401 - a fixture
