"""Plugin functions and platforms that simulated entry points point at."""

from __future__ import annotations

from octavo.platforms.cpu import CpuPlatform

HERE = __name__


class FakePlatformA(CpuPlatform):
    name = "fake_a"


class FakePlatformB(CpuPlatform):
    name = "fake_b"


class OldApiPlatform(CpuPlatform):
    name = "old_api"
    api_version = "0.9"


class NewerMinorPlatform(CpuPlatform):
    name = "newer_minor"
    api_version = "1.7"


class NotAPlatform:
    name = "not_a_platform"


def active_a() -> str:
    return f"{HERE}.FakePlatformA"


def active_b() -> str:
    return f"{HERE}.FakePlatformB"


def inactive() -> None:
    return None


def broken() -> str:
    raise RuntimeError("driver exploded")


def old_api() -> str:
    return f"{HERE}.OldApiPlatform"


def newer_minor() -> str:
    return f"{HERE}.NewerMinorPlatform"


def not_a_platform() -> str:
    return f"{HERE}.NotAPlatform"


GENERAL_CALLS: list[str] = []


def register_models() -> None:
    from octavo.models.registry import register_model

    GENERAL_CALLS.append("register_models")
    register_model("FakeArchForCausalLM", "octavo.models.llama.LlamaForCausalLM")


def broken_general() -> None:
    GENERAL_CALLS.append("broken_general")
    raise RuntimeError("general plugin exploded")
