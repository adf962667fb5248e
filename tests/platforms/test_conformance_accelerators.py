"""The conformance kit on real accelerators: each class runs only where its hardware is present
(``nox -s test-cuda`` and friends select them by marker) and is skipped cleanly elsewhere."""

import pytest

from octavo.platforms.cuda import CudaPlatform
from octavo.platforms.rocm import RocmPlatform
from octavo.platforms.tpu import TpuPlatform
from octavo.platforms.xpu import XpuPlatform
from octavo.testing.platform_conformance import PlatformConformance


def _needs(platform):
    reason = platform.unavailable_reason()
    return pytest.mark.skipif(reason is not None, reason=f"{platform.name}: {reason}")


class _WithFixtureModel(PlatformConformance):
    @pytest.fixture
    def conformance_model_dir(self, llama_dir):
        return llama_dir


@pytest.mark.cuda
@_needs(CudaPlatform)
class TestCudaConformance(_WithFixtureModel):
    platform = CudaPlatform


@pytest.mark.rocm
@_needs(RocmPlatform)
class TestRocmConformance(_WithFixtureModel):
    platform = RocmPlatform


@pytest.mark.xpu
@_needs(XpuPlatform)
class TestXpuConformance(_WithFixtureModel):
    platform = XpuPlatform


@pytest.mark.tpu
@_needs(TpuPlatform)
class TestTpuConformance(_WithFixtureModel):
    platform = TpuPlatform


@pytest.mark.cuda
@_needs(CudaPlatform)
def test_cuda_detection_creates_no_context():
    """Detection, capability and name come from NVML / the driver: no CUDA context is made."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from octavo.platforms import get_resolution\n"
        "from octavo.platforms.cuda import CudaPlatform as P\n"
        "r = get_resolution()\n"
        "print(r.platform.name, P.get_device_capability(), P.get_device_name(), P.supported_dtypes()[0])\n"
        "print('initialized', torch.cuda.is_initialized())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("cuda (")
    assert r.stdout.splitlines()[-1] == "initialized False", r.stdout
