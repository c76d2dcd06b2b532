"""Fixtures for tests on several hosts (cluster.netns network namespaces).

A test that needs namespaces asks for ``require_netns`` or ``make_hosts``; where this
machine cannot make them (not root, no ``ip``, no kernel support) the test FAILS with
the reason, never skips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from cluster.netns import Hosts, check_available


def fail_without_netns() -> None:
    """pytest.fail with the reason when network namespaces cannot be made here."""
    reason = check_available()
    if reason is not None:
        pytest.fail(f"this test builds hosts from Linux network namespaces: {reason}")


@pytest.fixture
def require_netns() -> None:
    fail_without_netns()


@pytest.fixture
def make_hosts(require_netns: None) -> Iterator[Callable[[Sequence[str]], Hosts]]:
    """``make_hosts(["h1", "h2", "client"])``: started Hosts, closed after the test
    (every process killed, every namespace deleted) whether it passed or not."""
    made: list[Hosts] = []

    def make(names: Sequence[str]) -> Hosts:
        hosts = Hosts(names)
        made.append(hosts)
        return hosts.start()

    yield make
    for hosts in reversed(made):
        hosts.close()
