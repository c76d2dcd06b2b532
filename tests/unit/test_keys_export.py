"""Keys per host (cluster/security/export.py, ``ordo keys export``): a host's export
holds its own roles' secrets (0600, in 0700 directories), every role's public key and
the allowlist, no other secret and no client secret unless named; an unknown host and
a directory that is not this host's export are refused, writing nothing; a role
started from the export loads its keys from it. Files only: no cluster, no socket."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster.cli import main
from cluster.commands.common import role_config
from cluster.config import CONFIG_FILE, DEFAULT_DATA_DIR, ClusterConfig
from cluster.ordering_zk import SECRET_FILE, ensure_secret
from cluster.security.export import MARKER, export_host_keys, host_roles
from cluster.security.keys import ADMIN_CLIENT, SecurityError, create_keys, role_names
from cluster.security.sockets import SocketSecurity, client_curves

HOSTS = {"h1": "10.0.0.1", "h2": "10.0.0.2", "h3": "10.0.0.3", "zk4": "10.0.0.4"}


def three_host_cluster(data_dir: Path) -> ClusterConfig:
    """``--ha``'s shape, a reader on h1, and ZooKeeper server 3 on a fourth host, zk4,
    which runs nothing else."""
    cfg = ClusterConfig(
        replicas=2,
        partitions=2,
        data_dir=str(data_dir),
        sequencers=3,
        zookeeper_servers=3,
        hosts=HOSTS,
        sequencer_hosts=("h1", "h2", "h3"),
        zookeeper_hosts=("h1", "h2", "zk4"),
        partition_hosts=(("h2", "h2"), ("h3", "h3")),
        readers=1,
        reader_hosts=("h1",),
        curve=True,
    )
    cfg.save()
    create_keys(data_dir, role_names(cfg), [ADMIN_CLIENT, "alice"])
    ensure_secret(cfg)
    return cfg


@pytest.fixture
def cluster(tmp_path: Path) -> ClusterConfig:
    return three_host_cluster(tmp_path / "data")


def files_under(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_each_host_gets_its_own_roles_secrets_every_public_key_and_the_allowlist(
    cluster: ClusterConfig, tmp_path: Path
) -> None:
    assert host_roles(cluster) == {
        "h1": ["sequencer-0", "reader-0"],
        "h2": ["sequencer-1", "r0p0", "r0p1"],
        "h3": ["sequencer-2", "r1p0", "r1p1"],
        "zk4": [],
    }
    out = tmp_path / "h2"
    done = export_host_keys(cluster.data_dir, cluster, "h2", out)
    assert done.roles == ["sequencer-1", "r0p0", "r0p1"]
    publics = {f"keys/{r}.key" for r in role_names(cluster)}
    assert files_under(out) == publics | {
        "keys/sequencer-1.key_secret",
        "keys/r0p0.key_secret",
        "keys/r0p1.key_secret",
        "keys/clients/admin.key",
        "keys/clients/alice.key",
        f"keys/{SECRET_FILE}",  # h2 runs a sequencer
        CONFIG_FILE,
        MARKER,
    }
    for secret in [*out.glob("keys/*.key_secret"), out / "keys" / SECRET_FILE]:
        assert mode(secret) == 0o600, secret
    for d in (out, out / "keys", out / "keys" / "clients"):
        assert mode(d) == 0o700, d
    assert (out / CONFIG_FILE).read_bytes() == (Path(cluster.data_dir) / CONFIG_FILE).read_bytes()


def test_a_zookeeper_only_host_gets_public_keys_alone_and_clients_only_when_named(
    cluster: ClusterConfig, tmp_path: Path
) -> None:
    zk = tmp_path / "zk4"
    assert export_host_keys(cluster.data_dir, cluster, "zk4", zk).roles == []
    assert not [p for p in zk.rglob("*") if "secret" in p.name]
    h3 = tmp_path / "h3"
    export_host_keys(cluster.data_dir, cluster, "h3", h3, with_clients=[ADMIN_CLIENT])
    assert {p.name for p in h3.rglob("*_secret")} == {
        "sequencer-2.key_secret",
        "r1p0.key_secret",
        "r1p1.key_secret",
        "admin.key_secret",  # asked for; alice's was not
    }
    assert mode(h3 / "keys" / "client-secrets" / "admin.key_secret") == 0o600


def test_a_role_and_the_named_client_load_their_keys_from_the_export(
    cluster: ClusterConfig, tmp_path: Path
) -> None:
    out = tmp_path / "h3"
    export_host_keys(cluster.data_dir, cluster, "h3", out, with_clients=[ADMIN_CLIENT])
    # as `ordo sequencer --cluster DIR/cluster.json` on h3 builds its config
    cfg = role_config(str(out / CONFIG_FILE), DEFAULT_DATA_DIR)
    assert cfg.data_dir == str(out)
    for role in ("sequencer-2", "r1p1"):
        sec = SocketSecurity.for_role(cfg, role)
        assert sec.enabled and sec.identity is not None
        assert sec.identity.public == SocketSecurity.for_role(cluster, role).servers[role]
        assert sec.allowlist is not None and set(sec.allowlist.clients.values()) == {
            "admin",
            "alice",
        }
    with pytest.raises(SecurityError, match="no such key file"):
        SocketSecurity.for_role(cfg, "r0p0")  # h2's role: its secret is not here
    assert len(client_curves(cfg, ADMIN_CLIENT)) == 3


def test_an_unknown_host_is_refused_naming_the_known_ones(
    cluster: ClusterConfig, tmp_path: Path
) -> None:
    with pytest.raises(SecurityError, match="no host 'h9'.*h1, h2, h3, zk4"):
        export_host_keys(cluster.data_dir, cluster, "h9", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    local = ClusterConfig(data_dir=str(tmp_path / "one"))
    local.save()
    create_keys(local.data_dir, role_names(local), [ADMIN_CLIENT])
    with pytest.raises(SecurityError, match="its hosts are local"):
        export_host_keys(local.data_dir, local, "h1", tmp_path / "y")
    assert export_host_keys(local.data_dir, local, "local", tmp_path / "y").roles == [
        "sequencer-0",
        "r0p0",
        "r0p1",
        "r1p0",
        "r1p1",
    ]


def test_a_directory_not_this_hosts_export_is_refused_and_left_untouched(
    cluster: ClusterConfig, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(SecurityError, match="not empty and holds no key export"):
        export_host_keys(cluster.data_dir, cluster, "h1", other)
    assert files_under(other) == {"notes.txt"}
    h1 = tmp_path / "h1"
    export_host_keys(cluster.data_dir, cluster, "h1", h1)
    before = files_under(h1)
    with pytest.raises(SecurityError, match="exported for host 'h1', not 'h2'"):
        export_host_keys(cluster.data_dir, cluster, "h2", h1)
    assert files_under(h1) == before
    # another cluster's keys under the same names: refused, nothing replaced
    elsewhere = three_host_cluster(tmp_path / "data2")
    with pytest.raises(SecurityError, match="another cluster's export"):
        export_host_keys(elsewhere.data_dir, elsewhere, "h1", h1)
    assert files_under(h1) == before


def test_exporting_again_completes_an_earlier_export_and_refuses_stale_files(
    cluster: ClusterConfig, tmp_path: Path
) -> None:
    out = tmp_path / "h2"
    export_host_keys(cluster.data_dir, cluster, "h2", out)
    (out / "keys" / "r0p1.key_secret").unlink()  # an export cut short
    again = export_host_keys(cluster.data_dir, cluster, "h2", out)
    assert [p.name for p in again.written] == ["r0p1.key_secret"]
    assert mode(out / "keys" / "r0p1.key_secret") == 0o600
    create_keys(cluster.data_dir, [], ["bob"])  # a client admitted since
    export_host_keys(cluster.data_dir, cluster, "h2", out, with_clients=["bob"])
    assert (out / "keys" / "clients" / "bob.key").exists()
    with pytest.raises(SecurityError, match=r"bob\.key_secret, which an export for 'h2'"):
        export_host_keys(cluster.data_dir, cluster, "h2", out)  # without --with-client bob


def test_an_unsafe_source_secret_or_a_missing_client_is_refused(
    cluster: ClusterConfig, tmp_path: Path
) -> None:
    with pytest.raises(SecurityError, match="no secret key of client 'carol'"):
        export_host_keys(cluster.data_dir, cluster, "h1", tmp_path / "a", ["carol"])
    os.chmod(Path(cluster.data_dir) / "keys" / "reader-0.key_secret", 0o644)
    with pytest.raises(SecurityError, match="open to group or others"):
        export_host_keys(cluster.data_dir, cluster, "h1", tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_ordo_keys_export_writes_a_hosts_keys_and_reports_refusals(
    cluster: ClusterConfig, tmp_path: Path
) -> None:
    runner = CliRunner()
    out = tmp_path / "h1"
    argv = ["keys", "export", "--data-dir", cluster.data_dir, "--host", "h1", str(out)]
    ok = runner.invoke(main, [*argv, "--with-client", "admin"])
    assert ok.exit_code == 0, ok.output
    assert "secrets of sequencer-0, reader-0; clients admin" in ok.output
    assert (out / "keys" / "client-secrets" / "admin.key_secret").exists()
    bad = runner.invoke(main, [*argv[:-2], "nowhere", str(tmp_path / "n")])
    assert bad.exit_code != 0 and "no host 'nowhere'" in bad.output
    before_export = ["keys", "--data-dir", cluster.data_dir, "export", "--host", "h2"]
    h2 = runner.invoke(main, [*before_export, str(tmp_path / "h2")])
    assert h2.exit_code == 0 and "sequencer-1, r0p0, r0p1" in h2.output, h2.output
    # `ordo keys` without a subcommand still creates keys
    made = runner.invoke(main, ["keys", "--data-dir", cluster.data_dir, "--client", "dave"])
    assert made.exit_code == 0 and "2 file(s) created" in made.output, made.output
