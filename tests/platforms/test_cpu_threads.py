"""OCTAVO_CPU_THREADS_BIND parsing and planning (no pinning of the test process)."""

from __future__ import annotations

import pytest

from octavo.platforms import cpu_threads


def test_parse_cpu_list():
    assert cpu_threads.parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert cpu_threads.parse_cpu_list("2,2,1") == [2, 1]
    for bad in ("a", "3-1", "1-x"):
        with pytest.raises(ValueError, match="OCTAVO_CPU_THREADS_BIND"):
            cpu_threads.parse_cpu_list(bad)


def test_plan_auto_none_and_explicit():
    allowed = cpu_threads.allowed_cpus()
    auto = cpu_threads.plan_cpus("auto")
    assert auto and set(auto) <= set(allowed)
    assert len(auto) == len(cpu_threads.physical_cores(allowed))
    assert cpu_threads.plan_cpus("none") is None
    assert cpu_threads.plan_cpus(str(allowed[0])) == [allowed[0]]
    with pytest.raises(ValueError, match="may not run on"):
        cpu_threads.plan_cpus(str(max(allowed) + 1000))


def test_plan_splits_cores_between_local_ranks():
    cores = cpu_threads.physical_cores(cpu_threads.allowed_cpus())
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    a = cpu_threads.plan_cpus("auto", 0, 2)
    b = cpu_threads.plan_cpus("auto", 1, 2)
    assert a and b and not set(a) & set(b)


def test_setup_none_changes_nothing():
    import torch

    cpu_threads.reset_for_tests()
    try:
        n = torch.get_num_threads()
        summary = cpu_threads.setup_cpu_threads(spec="none")
        assert summary["bind"] == "none" and torch.get_num_threads() == n
    finally:
        cpu_threads.reset_for_tests()
