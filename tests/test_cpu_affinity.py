"""AI1NET_CPU: a daphne process keeps every thread on the CPUs it is given (ai1net.cpu_affinity)."""

import os
import urllib.request
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from ai1net.cpu_affinity import cpus_from_env, parse_cpus
from tests.e2e_support import Daphne


@pytest.mark.parametrize(("spec", "cpus"), [
    ("1", {1}), ("0,2", {0, 2}), ("0-3", {0, 1, 2, 3}), (" 1 , 3-4", {1, 3, 4}), ("2-2", {2}),
])
def test_cpus_are_written_as_taskset_takes_them(spec, cpus):
    assert parse_cpus(spec) == cpus


@pytest.mark.parametrize("spec", ["x", "3-1", "1-", "-1", "1,,2", "1.5", "0-x", "0-99999999999", "8192"])
def test_anything_else_is_refused(spec):
    with pytest.raises(ValueError, match="CPU number or range|runs upwards|numbered above"):
        parse_cpus(spec)


def test_the_setting_is_checked_against_the_cpus_the_process_may_use():
    allowed = sorted(os.sched_getaffinity(0))
    assert cpus_from_env({}) is None
    assert cpus_from_env({"AI1NET_CPU": "  "}) is None
    assert cpus_from_env({"AI1NET_CPU": str(allowed[-1])}) == {allowed[-1]}
    with pytest.raises(ImproperlyConfigured, match=r"may use CPUs .* only"):
        cpus_from_env({"AI1NET_CPU": str(max(allowed) + 1)})
    with pytest.raises(ImproperlyConfigured, match="write CPUs as taskset -c does"):
        cpus_from_env({"AI1NET_CPU": "first"})


def _threads_cpus(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()]


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_daphne_given_a_cpu_keeps_every_thread_there_and_one_without_is_left_alone(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: a pinned daphne and a free one look the same")
    cpu = allowed[-1]
    pinned, free = Daphne(tmp_path, name="pinned", AI1NET_CPU=str(cpu)), Daphne(tmp_path, name="free")
    try:
        for server in (pinned, free):  # a request starts a request thread: started later, it inherits
            with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as response:
                assert response.status == 200
        threads = _threads_cpus(pinned.popen.pid)
        assert len(threads) > 1
        assert all(cpus == {cpu} for cpus in threads), threads
        assert all(cpus == set(allowed) for cpus in _threads_cpus(free.popen.pid))
    finally:
        pinned.stop()
        free.stop()
