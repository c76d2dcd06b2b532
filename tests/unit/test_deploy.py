"""Procedures deployed through the log (txn_library.deployed, sequencer.deploys): what
a module may be, versions by epoch, the sequencer's path from the call to the batch,
and replicas that run each epoch with the version in force then."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import txn_library.workloads.builtin  # noqa: F401
from executor.deterministic.replica import LocalReplica
from sequencer.deploys import InlineChecker
from sequencer.log import CommandLog
from sequencer.sequencer import Sequencer
from tests.deploy_modules import bump_module
from txn_library import deployed, limits
from txn_library.deployed import DEPLOY, CodeStore, Deploy, DeployRefused
from txn_library.errors import ERROR, OK, BadRequest
from txn_library.procedure import lookup, lookup_at
from txn_library.wire import sequencer as wire
from txn_library.wire.partition import PartitionStatus

CLIENT = b"client-1"
STATUS = PartitionStatus(1, 1, 0, 0, 1, 0, 0, 0, False, 1, 0, 0, 0, 0, -1)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    deployed.reset()
    yield
    deployed.reset()


def test_a_module_is_refused_for_what_it_does_at_import() -> None:
    cases = {
        b"raise RuntimeError('no')": "raised RuntimeError: no",
        b"def (": "raised SyntaxError",
        b"x = 1": "registers no procedure",
        bump_module(1, "kv.put"): "owned by a module named at start-up",
        bump_module(1, "ordo.mine"): "reserved",
        b"from txn_library.catalog import Table, register_table\n"
        b"register_table(Table('t_new', key_len=1))": "registers tables",
        b"\xff\xfe": "not UTF-8",
    }
    for source, why in cases.items():
        with pytest.raises(DeployRefused, match=why):
            deployed.check("m", source, ())
    with pytest.raises(DeployRefused, match="bytes of source"):
        deployed.check("m", b"#" * (limits.deploy_source_bytes_max + 1), ())
    with pytest.raises(DeployRefused, match="cannot retire"):
        deployed.check("m", b"", ("kv.put",))
    with pytest.raises(DeployRefused, match="identifier"):
        deployed.check("a.b", bump_module(1), ())
    assert lookup("kv.put").name == "kv.put"  # nothing changed


def test_versions_are_by_epoch_and_installing_is_idempotent() -> None:
    assert deployed.install(Deploy("m", bump_module(1), (), 5))
    assert not deployed.install(Deploy("m", bump_module(1), (), 5))
    deployed.install(Deploy("m", bump_module(2), (), 9))
    with pytest.raises(BadRequest, match="at epoch 4"):
        lookup_at("demo.bump", 4)
    v1, v2 = lookup_at("demo.bump", 5), lookup_at("demo.bump", 9)
    assert v1 is lookup_at("demo.bump", 8) and v1 is not v2
    assert lookup("demo.bump") is v2  # what new calls are validated against
    deployed.install(Deploy("m", b"", ("demo.bump",), 12))
    assert lookup_at("demo.bump", 11) is v2
    with pytest.raises(BadRequest):
        lookup("demo.bump")
    rows = [r for r in deployed.versions() if r["name"] == "demo.bump"]
    assert [(r["version"], r["since_epoch"]) for r in rows] == [(1, 5), (2, 9), (None, 12)]


def test_a_code_store_keeps_records_whole(tmp_path: Path) -> None:
    store = CodeStore(tmp_path / "deploys")
    r = Deploy("m", bump_module(1), (), 7)
    store.save([r])
    store.save([r])
    assert store.load() == [r]
    deployed.reset()
    assert store.install_all() == 1
    assert lookup_at("demo.bump", 7).name == "demo.bump"


def _seq(d: Path) -> Sequencer:
    return Sequencer(CommandLog(d), replicas=1, partitions=2, deploy_checker=InlineChecker())


def _call(s: Sequencer, req: int, proc: str, *args: object) -> None:
    s.on_calls(b"id", CLIENT, ((req, proc, tuple(args)),))
    s.run_intake()


def _answers(s: Sequencer) -> dict[int, tuple]:
    out = {}
    for entries in s.take_client_out().values():
        for e in entries:
            out[e[0]] = (e[1], e[2])
    return out


def test_calls_before_the_deploy_batch_run_v1_and_after_it_v2(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    replica = LocalReplica(2)
    _call(s, 1, DEPLOY, "bump", bump_module(1), [])
    batches = [s.tick(1)]  # the deploy: epoch 1
    _call(s, 2, "demo.bump", "a")
    batches.append(s.tick(2))  # v1 from epoch 2
    _call(s, 3, DEPLOY, "bump", bump_module(2), [])
    _call(s, 4, "demo.bump", "a")  # queued with the deploy: runs with v1 at epoch 3
    batches.append(s.tick(3))
    _call(s, 5, "demo.bump", "a")
    batches.append(s.tick(4))
    decoded = [wire.decode_batch(b) for b in batches if b is not None]
    assert [bool(b.flags & wire.FLAG_DEPLOY) for b in decoded] == [True, False, True, False]
    deployed.reset()  # the replica installs from the batches, as another process would
    for b in decoded:
        replica.apply(b)
    values = sorted(v for _s, v in replica.results.values() if isinstance(v, list))
    assert values == [["v1", 1], ["v1", 2], ["v2", 4]]
    # A restarted sequencer installs what its log holds.
    s.log.close()
    deployed.reset()
    s = _seq(tmp_path)
    assert lookup("demo.bump") is lookup_at("demo.bump", 4)
    assert lookup_at("demo.bump", 3) is not lookup_at("demo.bump", 4)


def test_a_refused_module_is_answered_and_changes_nothing(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    _call(s, 1, DEPLOY, "bad", b"raise ValueError('at import')", [])
    assert s.tick(1) is None  # nothing sequenced
    status, value = _answers(s)[1]
    assert status == ERROR and value[0] == deployed.ERR_DEPLOY_REFUSED
    assert "ValueError: at import" in value[1]
    with pytest.raises(BadRequest):
        lookup("demo.bump")


def test_a_waiting_call_is_checked_again_against_the_new_version(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    _call(s, 1, DEPLOY, "bump", bump_module(1), [])
    s.tick(1)
    # v2 takes an int where v1 took a str: a v1 call still waiting is refused once v2
    # is logged, since it would run with v2.
    v2 = bump_module(2).replace(b'[("key", "str")]', b'[("key", "int")]')
    _call(s, 2, DEPLOY, "bump", v2, [])
    s.deploys.poll()
    s.on_calls(b"id", CLIENT, ((3, "demo.bump", ("a",)),))
    s.run_intake()
    import sequencer.epochs as epochs_mod

    saved = limits.batch_txns_max
    try:  # the batch takes the deploy only; the call waits for the next one
        epochs_mod.limits.batch_txns_max = 1  # type: ignore[misc]
        s.tick(2)
    finally:
        epochs_mod.limits.batch_txns_max = saved  # type: ignore[misc]
    answers = _answers(s)
    assert answers[3][0] == ERROR and "redeployed" in answers[3][1][1]
    assert OK not in [a[0] for a in answers.values()]


def test_a_retired_procedure_is_unknown_from_the_next_epoch_and_its_old_calls_stay_history(
    tmp_path: Path,
) -> None:
    s = _seq(tmp_path)
    _call(s, 1, DEPLOY, "bump", bump_module(1), [])
    s.tick(1)
    _call(s, 2, "demo.bump", "a")
    s.tick(2)
    _call(s, 3, DEPLOY, "retire", b"", ["demo.bump"])
    s.tick(3)  # logged at 3: unknown from 4
    _call(s, 4, "demo.bump", "a")
    answers = _answers(s)
    assert answers[4][0] == ERROR and answers[4][1][0] == "unknown_procedure"
    assert lookup_at("demo.bump", 3).name == "demo.bump"  # epoch 2's call: still history
    with pytest.raises(DeployRefused, match="cannot retire"):  # nothing left to retire
        deployed.check("retire", b"", ("demo.bump",))
    s.log.close()
    deployed.reset()
    s = _seq(tmp_path)  # a restart rebuilds the exactly-once table over the retired call
    s.on_calls(b"id", CLIENT, ((2, "demo.bump", ("a",)),))
    s.run_intake()
    assert _answers(s) == {}  # a retry of a logged call: its outcome is looked up, not refused
    assert s.query_out  # (from a replica's result cache: a query to the reporter)
    s.on_calls(b"id", CLIENT, ((9, "demo.bump", ("a",)),))
    s.run_intake()
    assert _answers(s)[9][1][0] == "unknown_procedure"  # a new call of it is refused


def test_a_log_knows_its_deploy_batches_from_its_appenders_and_from_recovery(
    tmp_path: Path,
) -> None:
    from sequencer.replication import append_committed

    s = _seq(tmp_path / "leader")
    _call(s, 1, DEPLOY, "bump", bump_module(1), [])
    _call(s, 2, "kv.put", "k", 1)
    first = s.tick(1)  # the deploy and a call
    _call(s, 3, "kv.put", "k", 2)
    second = s.tick(2)
    assert first is not None and second is not None
    assert s.log.marked == [1]  # the leader marks what it built
    follower = CommandLog(tmp_path / "follower")
    append_committed(follower, 1, first)
    append_committed(follower, 2, second)
    assert follower.marked == [1]  # a copy is marked from the batch's flags
    follower.close()
    assert CommandLog(tmp_path / "follower").marked == [1]  # and recovery finds it
