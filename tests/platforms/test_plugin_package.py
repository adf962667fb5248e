"""The example out-of-tree plugin, really installed: pip builds and installs
``tests/plugins/octavo_dummy_platform`` into a private ``--target`` folder (so the shared venv, and
the CPU platform every other test relies on, are untouched). A fresh interpreter with that folder
on its path resolves the plugin with no environment variable, serves a fixture model on it, shows
it in ``octavo info`` and yields to ``OCTAVO_PLATFORM=cpu``; a second installed plugin makes
resolution refuse to choose; and the installed package passes the conformance kit."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from octavo.platforms import reset_current_platform
from octavo.testing.platform_conformance import PlatformConformance

REPO = Path(__file__).resolve().parents[2]
PLUGIN_SRC = REPO / "tests" / "plugins" / "octavo_dummy_platform"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """A folder the dummy plugin is pip-installed into (built from a copy of its source)."""
    root = tmp_path_factory.mktemp("dummy_plugin")
    src = root / "src"
    shutil.copytree(PLUGIN_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = root / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(site), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "octavo_dummy_platform" / "platform.py").exists()
    return site


def run(code: str, *paths: Path, env: dict[str, str] | None = None, args: list[str] | None = None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OCTAVO_")}
    full_env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(REPO)])
    full_env["OCTAVO_CPU_KVCACHE_SPACE"] = "0.1"
    full_env.update(env or {})
    cmd = [sys.executable, *(args or ["-c", textwrap.dedent(code)])]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env, cwd=str(REPO))


END_TO_END = """
import os, sys
from octavo import LLM, SamplingParams
from octavo.entrypoints.info import collect_info
from octavo.models.registry import supported_architectures
from octavo.platforms import get_resolution, reset_current_platform

r = get_resolution()
print("PLATFORM", r.platform.name, "|", r.how)
llm = LLM(sys.argv[1], dtype="float32", max_model_len=128, max_num_seqs=2)
print("BACKEND", llm.llm_engine.core.runner.attn_backend.name)
params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
out = llm.generate(["the paged attention"], params, use_tqdm=False)
print("TOKENS", list(out[0].outputs[0].token_ids))
print("ARCH", "DummyLlamaForCausalLM" in supported_architectures())
info = collect_info(sys.argv[1])
print("INFO_PLATFORM", info["platform"])
print("INFO_NOT_CPU", info["  not cpu"])
print("INFO_ATTENTION", info["attention"])
for forced in ("cpu", "dummy"):
    os.environ["OCTAVO_PLATFORM"] = forced
    reset_current_platform()
    r = get_resolution()
    print("FORCED_" + forced, r.platform.name, "|", r.how)
"""

TWO_PLUGINS = """
import os
from octavo.platforms import PlatformResolutionError, get_current_platform, reset_current_platform
try:
    get_current_platform()
    print("ERROR none")
except PlatformResolutionError as e:
    print("ERROR", e)
for forced in ("cpu", "second"):
    os.environ["OCTAVO_PLATFORM"] = forced
    reset_current_platform()
    print("FORCED_" + forced, get_current_platform().name)
"""


def _lines(stdout: str) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in stdout.splitlines() if " " in line}


def test_installed_plugin_is_resolved_without_env_and_serves_a_model(plugin_site, llama_dir, tmp_path):
    script = tmp_path / "e2e.py"
    script.write_text(END_TO_END)
    r = run("", plugin_site, args=[str(script), llama_dir])
    assert r.returncode == 0, r.stderr[-3000:]
    out = _lines(r.stdout)
    how = "the only active plugin 'dummy' (octavo_dummy_platform:register)"
    assert out["PLATFORM"] == f"dummy | {how}"
    assert out["BACKEND"] == "dummy_attn"
    assert out["ARCH"] == "True"  # its general plugin registered an architecture
    # octavo info names the plugin, why the built-ins were not chosen, and the backend
    assert out["INFO_PLATFORM"] == f"dummy ({how})"
    assert out["INFO_NOT_CPU"] == "plugin 'dummy' is active (plugins take precedence)"
    assert out["INFO_ATTENTION"].startswith("dummy_attn (")
    # OCTAVO_PLATFORM overrides the plugin, or names it
    assert out["FORCED_cpu"] == "cpu | OCTAVO_PLATFORM=cpu"
    assert out["FORCED_dummy"] == "dummy | OCTAVO_PLATFORM=dummy"

    from octavo import LLM, SamplingParams

    cpu = LLM(llama_dir, dtype="float32", max_model_len=128, max_num_seqs=2)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    ref = cpu.generate(["the paged attention"], params, use_tqdm=False)
    assert out["TOKENS"] == str(list(ref[0].outputs[0].token_ids))


def test_two_installed_plugins_are_an_error_naming_both(plugin_site, tmp_path):
    # A second distribution registering an active platform plugin, installed by hand.
    second = tmp_path / "second_site"
    dist = second / "octavo_second_plugin-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: octavo-second-plugin\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[octavo.platform_plugins]\nsecond = octavo_second_plugin:register\n")
    (second / "octavo_second_plugin.py").write_text(
        "def register():\n    return 'octavo_dummy_platform.platform.DummyPlatform'\n"
    )
    r = run(TWO_PLUGINS, plugin_site, second)
    assert r.returncode == 0, r.stderr[-3000:]
    out = _lines(r.stdout)
    assert "2 platform plugins are active at once" in out["ERROR"]
    assert "plugin 'dummy' (octavo_dummy_platform:register)" in out["ERROR"]
    assert "plugin 'second' (octavo_second_plugin:register)" in out["ERROR"]
    assert out["FORCED_cpu"] == "cpu" and out["FORCED_second"] == "dummy"


@pytest.fixture(scope="class")
def plugin_importable(plugin_site):
    """The installed plugin on ``sys.path`` for one test class, then gone again."""
    sys.path.insert(0, str(plugin_site))
    importlib.invalidate_caches()
    try:
        yield plugin_site
    finally:
        sys.path.remove(str(plugin_site))
        for name in [m for m in sys.modules if m.split(".")[0] == "octavo_dummy_platform"]:
            del sys.modules[name]
        importlib.invalidate_caches()
        reset_current_platform()


@pytest.mark.usefixtures("plugin_importable")
class TestInstalledDummyPluginConformance(PlatformConformance):
    """The conformance kit against the installed package's platform class."""

    platform = "octavo_dummy_platform.platform.DummyPlatform"

    @pytest.fixture
    def conformance_model_dir(self, llama_dir):
        return llama_dir
