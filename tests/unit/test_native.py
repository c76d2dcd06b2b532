"""The compiled hot modules (txn_library.native): used only while they match their
sources, and computing exactly what the pure modules compute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from txn_library import native

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("pkg.hot",)


def _fake_build(root: Path) -> Path:
    """A tree with one 'compiled' module and a stamp that matches it."""
    (root / "pkg").mkdir()
    (root / "pkg" / "hot.py").write_text("X = 1\n")
    (root / "pkg" / "dep.py").write_text("Y = 2\n")
    native.extension_path(root, "pkg.hot").write_bytes(b"")
    build = root / "build" / "native"
    build.mkdir(parents=True)
    native.group_lib_path(build).write_bytes(b"")
    record = native.stamp_record(root, MODULES, ["pkg/hot.py", "pkg/dep.py"])
    (build / "stamp.json").write_text(json.dumps(record))
    return build


def test_compiled_modules_are_used_only_while_every_stamped_source_is_unchanged(
    tmp_path: Path,
) -> None:
    build = _fake_build(tmp_path)
    assert native.choose(tmp_path, build, MODULES, {}) == (True, "compiled (mypyc, 1 modules)")
    ok, why = native.choose(tmp_path, build, MODULES, {native.PURE_ENV: "1"})
    assert not ok and native.PURE_ENV in why
    assert native.choose(tmp_path, build, MODULES, {native.PURE_ENV: "0"})[0]
    (tmp_path / "pkg" / "dep.py").write_text("Y = 3\n")  # a module the compiled one imports
    ok, why = native.choose(tmp_path, build, MODULES, {})
    assert not ok and "stale: pkg/dep.py changed" in why


def test_a_missing_or_foreign_build_runs_pure(tmp_path: Path) -> None:
    build = _fake_build(tmp_path)
    native.extension_path(tmp_path, "pkg.hot").unlink()
    ok, why = native.choose(tmp_path, build, MODULES, {})
    assert not ok and "missing: pkg.hot" in why
    native.extension_path(tmp_path, "pkg.hot").write_bytes(b"")
    record = json.loads((build / "stamp.json").read_text())
    (build / "stamp.json").write_text(json.dumps({**record, "interpreter": "cpython-27 .so"}))
    ok, why = native.choose(tmp_path, build, MODULES, {})
    assert not ok and "compiled for cpython-27" in why
    (build / "stamp.json").write_text(json.dumps(record))
    ok, why = native.choose(tmp_path, build, ("pkg.hot", "pkg.dep"), {})
    assert not ok and "another module list" in why
    (build / "stamp.json").unlink()
    ok, why = native.choose(tmp_path, build, MODULES, {})
    assert not ok and "not compiled" in why


def test_this_checkout_compiled_its_hot_modules() -> None:
    """scripts/setup.sh built them (this machine has a C compiler): the engine the
    other tests exercise is the one users run, unless the run asked for pure Python."""
    ok, why = native.choose(native.ROOT, native.BUILD_DIR, native.MODULES, {})
    assert ok, why
    if os.environ.get(native.PURE_ENV, "") in ("", "0"):
        assert native.compiled(), native.describe()
    else:
        assert not native.compiled() and native.PURE_ENV in native.describe()


_OUTCOMES = """
import json
from txn_library import native
from executor.deterministic.simulator import run_seed
out = {"engine": native.describe()}
for workload, seed in (("bank", 11), ("bank", 12), ("tpcc-w1", 5)):
    r = run_seed(seed, workload)
    out[f"{workload}/{seed}"] = [r.ok, r.trace_digest, sorted(r.counters.items())]
print(json.dumps(out))
"""


def _start_outcomes(pure: bool) -> subprocess.Popen[str]:
    env = dict(os.environ, **{native.PURE_ENV: "1" if pure else "0"})
    return subprocess.Popen(
        [sys.executable, "-c", _OUTCOMES],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _outcomes(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_compiled_and_pure_engines_compute_the_same_histories() -> None:
    """Whole-cluster simulations (faults included) of bank transfers and of TPC-C at
    W=1 (the five transactions; W=2's pure genesis alone took ~100 s of CPU, W=1's ~10 s),
    run compiled and pure (at once, in two processes): the trace digest covers every
    event, every partition's final state hash and every answer a client got."""
    runs = _start_outcomes(pure=False), _start_outcomes(pure=True)
    try:
        compiled, pure = _outcomes(runs[0]), _outcomes(runs[1])
    finally:
        for proc in runs:
            proc.kill()  # after a failure or a timeout: leave nothing running
    assert compiled.pop("engine").startswith("compiled"), "the compiled engine did not run"
    assert pure.pop("engine").startswith("pure")
    assert compiled == pure
    assert all(ok for ok, _digest, _counters in compiled.values())
