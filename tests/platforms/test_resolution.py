"""Platform resolution with simulated plugin entry points: one wins, two is an error, the
environment overrides, broken plugins are logged, incompatible API versions are refused, and
``current_platform`` resolves lazily once. Also the ``octavo.general_plugins`` group."""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint

import pytest

import octavo.platforms as platforms
from octavo.platforms import (
    GENERAL_PLUGINS_GROUP,
    PLATFORM_PLUGINS_GROUP,
    PlatformResolutionError,
    current_platform,
    get_current_platform,
    get_resolution,
    load_general_plugins,
    reset_current_platform,
    reset_general_plugins,
)
from octavo.platforms.interface import PLATFORM_API_VERSION, PlatformAPIVersionError
from tests.platforms import fake_plugins
from tests.platforms.sim import Machine, simulate

FAKE = "tests.platforms.fake_plugins"


def ep(name: str, func: str, group: str = PLATFORM_PLUGINS_GROUP) -> EntryPoint:
    return EntryPoint(name=name, value=f"{FAKE}:{func}", group=group)


@pytest.fixture
def plugins(monkeypatch):
    """Install simulated entry points: ``plugins(platform=[...], general=[...])``."""
    simulate(monkeypatch, Machine())
    calls: list[str] = []

    def install(platform=(), general=()):
        groups = {PLATFORM_PLUGINS_GROUP: list(platform), GENERAL_PLUGINS_GROUP: list(general)}

        def entry_points(group):
            calls.append(group)
            return groups[group]

        monkeypatch.setattr("octavo.utils.plugins.entry_points", entry_points)
        reset_current_platform()
        return calls

    yield install
    reset_current_platform()


@pytest.fixture
def plugin_log(caplog):
    """Capture octavo.platforms warnings even when the octavo logger does not propagate."""
    log = logging.getLogger("octavo.platforms")
    log.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="octavo.platforms")
    yield caplog
    log.removeHandler(caplog.handler)


def test_no_plugins_gives_the_cpu(plugins):
    plugins()
    r = get_resolution()
    assert r.platform.name == "cpu"
    assert r.how == "first available built-in; no platform plugin active"
    assert set(r.alternatives) == {"cuda", "rocm", "xpu", "tpu"}


def test_one_active_plugin_wins_and_broken_ones_are_logged(plugins, plugin_log):
    plugins(platform=[ep("off", "inactive"), ep("boom", "broken"), ep("a", "active_a")])
    r = get_resolution()
    assert r.platform is fake_plugins.FakePlatformA
    assert r.how == f"the only active plugin 'a' ({FAKE}:active_a)"
    assert r.alternatives["plugin off"] == "reports its hardware is not present"
    assert r.alternatives["plugin boom"] == "raised RuntimeError: driver exploded"
    assert r.alternatives["cpu"] == "plugin 'a' is active (plugins take precedence)"
    assert "no CUDA support" in r.alternatives["cuda"]
    records = [r for r in plugin_log.records if "boom" in r.getMessage()]
    assert records and all(r.levelno == logging.WARNING and r.exc_info for r in records)  # traceback kept


def test_two_active_plugins_is_an_error_naming_both(plugins):
    plugins(platform=[ep("a", "active_a"), ep("off", "inactive"), ep("b", "active_b")])
    with pytest.raises(PlatformResolutionError) as e:
        get_current_platform()
    msg = str(e.value)
    assert "2 platform plugins are active at once" in msg
    assert f"plugin 'a' ({FAKE}:active_a)" in msg and f"plugin 'b' ({FAKE}:active_b)" in msg
    assert "OCTAVO_PLATFORM" in msg


def test_octavo_platform_cpu_overrides_plugins(plugins, monkeypatch):
    calls = plugins(platform=[ep("a", "active_a"), ep("b", "active_b")])
    monkeypatch.setenv("OCTAVO_PLATFORM", "cpu")
    r = get_resolution()
    assert r.platform.name == "cpu" and r.how == "OCTAVO_PLATFORM=cpu"
    assert PLATFORM_PLUGINS_GROUP not in calls  # forcing a built-in probes no plugin


def test_octavo_platform_picks_a_plugin_by_name(plugins, monkeypatch):
    plugins(platform=[ep("a", "active_a"), ep("b", "active_b")])
    monkeypatch.setenv("OCTAVO_PLATFORM", "b")
    assert get_current_platform() is fake_plugins.FakePlatformB


def test_octavo_platform_naming_an_inactive_plugin(plugins, monkeypatch):
    plugins(platform=[ep("off", "inactive")])
    monkeypatch.setenv("OCTAVO_PLATFORM", "off")
    with pytest.raises(PlatformResolutionError, match="OCTAVO_PLATFORM=off: the plugin reports its hardware is not present"):
        get_current_platform()


def test_octavo_platform_class_path(plugins, monkeypatch):
    plugins()
    monkeypatch.setenv("OCTAVO_PLATFORM", f"{FAKE}.FakePlatformB")
    assert get_current_platform() is fake_plugins.FakePlatformB


def test_octavo_platform_unknown_name(plugins, monkeypatch):
    plugins(platform=[ep("a", "active_a")])
    monkeypatch.setenv("OCTAVO_PLATFORM", "quantum")
    with pytest.raises(PlatformResolutionError) as e:
        get_current_platform()
    msg = str(e.value)
    assert "'quantum' is not a known platform" in msg and "'cuda'" in msg and "['a']" in msg


def test_plugin_with_another_major_api_version_is_refused(plugins):
    plugins(platform=[ep("old", "old_api")])
    with pytest.raises(PlatformAPIVersionError) as e:
        get_current_platform()
    msg = str(e.value)
    assert "'old_api'" in msg and "plugin 'old'" in msg
    assert "'0.9'" in msg and f"implements {PLATFORM_API_VERSION}" in msg and "major versions must match" in msg


def test_plugin_with_a_newer_minor_version_is_accepted_with_a_warning(plugins, plugin_log):
    plugins(platform=[ep("new", "newer_minor")])
    assert get_current_platform() is fake_plugins.NewerMinorPlatform
    assert any("newer than this octavo" in r.getMessage() for r in plugin_log.records)


def test_plugin_returning_a_non_platform_is_refused(plugins):
    plugins(platform=[ep("bad", "not_a_platform")])
    with pytest.raises(PlatformResolutionError, match="is not a subclass of octavo.platforms.Platform"):
        get_current_platform()


def test_current_platform_is_lazy_and_resolved_once(plugins):
    calls = plugins(platform=[ep("a", "active_a")])
    assert platforms._current is None and calls == []
    assert current_platform.name == "fake_a"
    assert current_platform.device_type == "cpu"
    assert get_current_platform() is fake_plugins.FakePlatformA
    assert calls.count(PLATFORM_PLUGINS_GROUP) == 1


def test_use_platform_restores_the_previous_one(plugins):
    from octavo.platforms import use_platform

    plugins()
    assert get_current_platform().name == "cpu"
    with use_platform(fake_plugins.FakePlatformB):
        assert current_platform.name == "fake_b"
        assert get_resolution().how == "set by octavo.platforms.use_platform"
    assert current_platform.name == "cpu"


def test_general_plugins_register_models_once(plugins, plugin_log, monkeypatch):
    from octavo.models import registry

    monkeypatch.setattr(registry, "_MODELS", dict(registry._MODELS))
    monkeypatch.setattr(fake_plugins, "GENERAL_CALLS", [])
    calls = plugins(general=[
        ep("boom", "broken_general", GENERAL_PLUGINS_GROUP),
        ep("models", "register_models", GENERAL_PLUGINS_GROUP),
    ])
    reset_general_plugins()
    try:
        arch, cls = registry.resolve_architecture(["FakeArchForCausalLM"])
        assert arch == "FakeArchForCausalLM" and cls.__name__ == "LlamaForCausalLM"
        assert "FakeArchForCausalLM" in registry.supported_architectures()
        load_general_plugins()
        assert fake_plugins.GENERAL_CALLS == ["broken_general", "register_models"]  # once each
        assert calls.count(GENERAL_PLUGINS_GROUP) == 1
        assert any("general plugin 'boom'" in r.getMessage() for r in plugin_log.records)
    finally:
        reset_general_plugins()
