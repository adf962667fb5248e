"""The CPU platform passes the same conformance kit a vendor runs against their platform."""

import pytest

from octavo.platforms.cpu import CpuPlatform
from octavo.testing.platform_conformance import PlatformConformance


class TestCpuConformance(PlatformConformance):
    platform = CpuPlatform

    @pytest.fixture
    def conformance_model_dir(self, llama_dir):
        return llama_dir
