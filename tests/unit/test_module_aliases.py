"""txn_library's rooms: modules moved, and what named them before still works.

A cluster.json, an ``ordo up --module`` or a genesis spec written before the move names
``txn_library.builtin`` and its siblings; they must load the same code, and the
client's public names stay importable from ``txn_library.client``.
"""

from __future__ import annotations

import importlib

import pytest

from executor.core.genesis import genesis_rows
from txn_library.procedure import MODULE_ALIASES, load_modules, module_name, procedures

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("old", sorted(MODULE_ALIASES))
def test_an_old_module_name_loads_the_module_it_moved_to(old: str) -> None:
    new = module_name(old)
    assert new != old and new.startswith("txn_library.workloads.")
    load_modules([old])
    assert importlib.import_module(new).__name__ == new


def test_a_name_that_never_moved_is_itself() -> None:
    assert module_name("tpcc.transactions") == "tpcc.transactions"
    with pytest.raises(ModuleNotFoundError):
        load_modules(["txn_library.no_such_module"])


def test_old_names_register_the_same_procedures_as_new_ones() -> None:
    load_modules(["txn_library.builtin"])
    assert {"bank.transfer", "kv.put"} <= set(procedures())


def test_a_genesis_spec_with_an_old_module_name_still_runs() -> None:
    old = list(genesis_rows("txn_library.bench_procedures:genesis", {"records": 4}, 0, 2))
    new = list(genesis_rows("txn_library.workloads.bench_procedures:genesis", {"records": 4}, 0, 2))
    assert old == new and old


def test_the_clients_public_names_import_from_the_package() -> None:
    from txn_library.client import Client, ClientProtocol, QueryAnswer, Result, to_outcome

    assert all((Client, ClientProtocol, QueryAnswer, Result, to_outcome))
