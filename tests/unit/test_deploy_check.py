"""The separate process that checks a module before the sequencer runs it
(cluster.deploy_check), and ``ordo deploy``'s own refusals before it sends anything."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster.commands.deploy import deploy
from cluster.deploy_check import SubprocessChecker
from txn_library import limits
from txn_library.deployed import reset

MODULES = ("txn_library.workloads.builtin",)

GOOD = b'''
from txn_library.procedure import Footprint, procedure


@procedure("demo.checked", [("key", "str")], lambda key: Footprint(reads=(("kv", (key,)),)))
def checked(ctx, key):
    return ctx.get("kv", (key,))
'''


def _verdicts(checker: SubprocessChecker, n: int, wait_s: float) -> dict[int, str | None]:
    done: dict[int, str | None] = {}
    deadline = time.monotonic() + wait_s
    while len(done) < n and time.monotonic() < deadline:
        done.update(checker.take_done())
        time.sleep(0.05)
    return done


def test_the_child_process_refuses_what_a_module_does_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reset()
    monkeypatch.setattr(limits, "deploy_check_timeout_s", 2.0)
    checker = SubprocessChecker(MODULES)
    cases = {
        1: (b"raise RuntimeError('boom')", "raised RuntimeError: boom"),
        2: (b"while True:\n    pass\n", "still importing after 2 s"),
        3: (GOOD.replace(b"demo.checked", b"kv.put"), "owned by a module named at start-up"),
        4: (b"x = bytearray(4 << 30)", "MemoryError"),
        5: (
            b"from txn_library.streams import stream\nstream('s_new', ['x'])\n"
            + GOOD.replace(b"demo.checked", b"demo.s"),
            "registers tables ['s_new']",  # a stream's table: refused before its stream
        ),
        6: (GOOD, None),
    }
    t0 = time.monotonic()
    for token, (source, _) in cases.items():
        checker.submit(token, f"m{token}", source, ())
    assert time.monotonic() - t0 < 1.0  # the sequencer's loop never waits for a check
    done = _verdicts(checker, len(cases), 90.0)
    for token, (_, why) in cases.items():
        if why is None:
            assert done[token] is None
        else:
            assert done[token] is not None and why in done[token], (token, done[token])


def test_ordo_deploy_refuses_a_large_or_unnamed_module_before_sending(tmp_path: Path) -> None:
    huge = tmp_path / "huge.py"
    huge.write_bytes(b"#" * (50 << 20))
    bad_name = tmp_path / "not-a-name.py"
    bad_name.write_bytes(GOOD)
    runner = CliRunner()
    for path, why in ((huge, "bytes >"), (bad_name, "identifier")):
        r = runner.invoke(deploy, [str(path), "--data-dir", str(tmp_path / "none")])
        assert r.exit_code == 2 and why in r.output, r.output
