"""CURVE and ZAP (cluster/security/): admitted keys get service; unknown keys, clients
without CURVE and a wrong server key get none, and the server receives nothing from
them; a CURVE server without an authenticator admits nobody; key files are created
0600 in 0700 directories, never overwritten, and refused when open to others."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.auth
from click.testing import CliRunner
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from cluster.cli import main
from cluster.config import ClusterConfig
from cluster.security.keys import (
    ADMIN_CLIENT,
    AllowList,
    CurveIdentity,
    SecurityError,
    client_public_path,
    client_secret_path,
    create_keys,
    keys_dir,
    load_allowlist,
    load_client_identity,
    load_identity,
    load_role_public,
    role_names,
    role_public_path,
    role_secret_path,
)
from cluster.security.sockets import (
    SocketSecurity,
    client_curve,
    client_curves,
    secure_client,
    secure_server,
)
from cluster.security.zap import Authenticator, start_authenticator
from txn_library import limits
from txn_library.wire.curve import ClientCurve

ROLES = ["sequencer-0", "r0p0", "r0p1"]
NOTHING_WAIT_MS = 500  # how long a refused peer's message is waited for (not a speed bound)
ANSWER_WAIT_MS = 60_000  # generous: an admitted peer answers well within it (not a speed bound)
MONITORED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    try:
        yield c
    finally:
        c.destroy(linger=0)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    create_keys(d, ROLES, [ADMIN_CLIENT, "alice"])
    return d


class Server:
    """A ROUTER bound with CURVE as sequencer-0, an authenticator in its context, and a
    monitor that says how each handshake ended."""

    def __init__(self, ctx: zmq.Context, data_dir: Path, admit_clients: bool = True) -> None:
        self.auth = start_authenticator(ctx, data_dir, ROLES)
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        secure_server(
            self.sock, load_identity(data_dir, "sequencer-0"), admit_clients=admit_clients
        )
        self.monitor = self.sock.get_monitor_socket(MONITORED)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.addr = f"tcp://127.0.0.1:{port}"

    def next_handshake(self) -> int:
        """The event that ended the next handshake on the server's side."""
        assert self.monitor.poll(ANSWER_WAIT_MS), "no handshake reached the server"
        return int(recv_monitor_message(self.monitor)["event"])

    def receives_nothing(self) -> bool:
        return self.sock.poll(NOTHING_WAIT_MS) == 0


def wait_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + ANSWER_WAIT_MS / 1000
    while not cond():
        assert time.monotonic() < deadline, f"not seen: {what}"
        time.sleep(0.01)


def dealer(ctx: zmq.Context) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    return s


def echo_round_trip(server: Server, client: zmq.Socket, payload: bytes) -> bytes:
    client.send(payload)
    assert server.sock.poll(ANSWER_WAIT_MS), "an admitted client's message did not arrive"
    ident, body = server.sock.recv_multipart()
    server.sock.send_multipart([ident, body])
    assert client.poll(ANSWER_WAIT_MS), "no answer reached the admitted client"
    return client.recv()


def test_an_allowlisted_client_gets_service_and_is_named_by_zap(
    ctx: zmq.Context, data_dir: Path
) -> None:
    server = Server(ctx, data_dir)
    try:
        c = dealer(ctx)
        secure_client(
            c, load_client_identity(data_dir, "alice"), load_role_public(data_dir, "sequencer-0")
        )
        c.connect(server.addr)
        payload = msgpack.packb([1, "kv.put", ["k", b"\x00" * 200]])
        c.send(payload)
        assert server.sock.poll(ANSWER_WAIT_MS)
        frames = server.sock.recv_multipart(copy=False)
        assert frames[1].bytes == payload
        assert frames[1].get("User-Id") == "client:alice"
        server.sock.send_multipart([frames[0].bytes, b"ok"])
        assert c.poll(ANSWER_WAIT_MS) and c.recv() == b"ok"
        assert server.auth.admitted == 1 and server.auth.refused == 0
    finally:
        server.auth.stop()


def test_a_role_key_is_admitted_on_an_internal_socket_and_a_client_key_is_not(
    ctx: zmq.Context, data_dir: Path
) -> None:
    server = Server(ctx, data_dir, admit_clients=False)
    try:
        role = dealer(ctx)
        secure_client(
            role, load_identity(data_dir, "r0p1"), load_role_public(data_dir, "sequencer-0")
        )
        role.connect(server.addr)
        assert echo_round_trip(server, role, b"peer read") == b"peer read"
        assert server.next_handshake() == zmq.EVENT_HANDSHAKE_SUCCEEDED

        client = dealer(ctx)
        secure_client(
            client,
            load_client_identity(data_dir, "alice"),
            load_role_public(data_dir, "sequencer-0"),
        )
        client.connect(server.addr)
        client.send(b"forged peer read")
        assert server.next_handshake() == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        assert server.receives_nothing()
        assert server.auth.refused >= 1  # the client may retry its handshake
    finally:
        server.auth.stop()


def test_a_client_with_an_unknown_key_gets_nothing_and_the_server_receives_nothing(
    ctx: zmq.Context, data_dir: Path
) -> None:
    server = Server(ctx, data_dir)
    try:
        c = dealer(ctx)
        secure_client(
            c, CurveIdentity.generate("mallory"), load_role_public(data_dir, "sequencer-0")
        )
        c.connect(server.addr)
        c.send(b"transfer everything to mallory")
        assert server.next_handshake() == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        assert server.receives_nothing()
        assert c.poll(NOTHING_WAIT_MS) == 0
        assert (server.auth.admitted, server.auth.refused) == (0, 1)
    finally:
        server.auth.stop()


def test_a_client_without_curve_gets_nothing(ctx: zmq.Context, data_dir: Path) -> None:
    server = Server(ctx, data_dir)
    try:
        c = dealer(ctx)
        c.connect(server.addr)  # NULL mechanism: plain text
        c.send(b"plain text call")
        assert server.next_handshake() == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        assert server.receives_nothing()
        assert c.poll(NOTHING_WAIT_MS) == 0
    finally:
        server.auth.stop()


def test_a_client_holding_the_wrong_server_key_never_talks_to_that_server(
    ctx: zmq.Context, data_dir: Path
) -> None:
    server = Server(ctx, data_dir)
    try:
        c = dealer(ctx)
        secure_client(
            c, load_client_identity(data_dir, "alice"), load_role_public(data_dir, "r0p0")
        )
        c.connect(server.addr)
        c.send(b"meant for another server")
        assert server.next_handshake() != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert server.receives_nothing()
        assert server.auth.admitted == 0
    finally:
        server.auth.stop()


def test_a_curve_server_without_an_authenticator_admits_nobody(
    ctx: zmq.Context, data_dir: Path
) -> None:
    srv = ctx.socket(zmq.ROUTER)
    srv.setsockopt(zmq.LINGER, 0)
    with pytest.raises(SecurityError, match="start_authenticator"):
        secure_server(srv, load_identity(data_dir, "sequencer-0"))
    # Set by hand as secure_server would, without a ZAP handler: enforcement fails closed.
    ident = load_identity(data_dir, "sequencer-0")
    srv.setsockopt(zmq.CURVE_SERVER, 1)
    srv.setsockopt(zmq.CURVE_SECRETKEY, ident.secret)
    srv.setsockopt(zmq.ZAP_DOMAIN, b"ordo-clients")
    srv.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    port = srv.bind_to_random_port("tcp://127.0.0.1")
    c = dealer(ctx)
    secure_client(c, load_client_identity(data_dir, "alice"), ident.public)
    c.connect(f"tcp://127.0.0.1:{port}")
    c.send(b"anyone there?")
    assert srv.poll(NOTHING_WAIT_MS) == 0


def test_socket_options_are_refused_after_bind(ctx: zmq.Context, data_dir: Path) -> None:
    with start_authenticator(ctx, data_dir, ROLES):
        s = ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.LINGER, 0)
        s.bind_to_random_port("tcp://127.0.0.1")
        with pytest.raises(SecurityError, match="before the socket binds"):
            secure_server(s, load_identity(data_dir, "sequencer-0"))


def test_one_authenticator_per_context(ctx: zmq.Context, data_dir: Path) -> None:
    with start_authenticator(ctx, data_dir, ROLES):
        with pytest.raises(SecurityError, match="already runs"):
            start_authenticator(ctx, data_dir, ROLES)
    start_authenticator(ctx, data_dir, ROLES).stop()  # the endpoint is free again


def test_zap_refuses_other_mechanisms_domains_and_malformed_requests(data_dir: Path) -> None:
    allow = load_allowlist(data_dir, ROLES)
    auth = Authenticator(zmq.Context.instance(), allow)
    role_key = z85.decode(load_role_public(data_dir, "r0p0"))

    def code(domain: bytes, mechanism: bytes, *creds: bytes) -> bytes:
        req = [b"1.0", b"7", domain, b"127.0.0.1", b"", mechanism, *creds]
        reply = auth.answer(req)
        assert reply[:2] == [b"1.0", b"7"]
        return reply[2]

    assert code(b"ordo-internal", b"CURVE", role_key) == b"200"
    assert code(b"ordo-clients", b"CURVE", role_key) == b"200"
    assert code(b"elsewhere", b"CURVE", role_key) == b"400"
    assert code(b"ordo-clients", b"NULL") == b"400"
    assert code(b"ordo-clients", b"PLAIN", b"admin", b"secret") == b"400"
    assert code(b"ordo-clients", b"CURVE", b"short") == b"400"
    assert auth.answer([b"0.9", b"8"])[2] == b"400"
    assert auth.answer([])[2] == b"400"


def test_an_added_client_is_admitted_after_the_allowlist_is_replaced(
    ctx: zmq.Context, data_dir: Path
) -> None:
    server = Server(ctx, data_dir)
    try:
        create_keys(data_dir, ROLES, ["bob"])
        server.auth.replace_allowlist(load_allowlist(data_dir, ROLES))
        c = dealer(ctx)
        secure_client(
            c, load_client_identity(data_dir, "bob"), load_role_public(data_dir, "sequencer-0")
        )
        c.connect(server.addr)
        assert echo_round_trip(server, c, b"hello") == b"hello"
    finally:
        server.auth.stop()


# Key files ---------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_secrets_are_0600_in_0700_directories_and_public_files_are_zmq_certificates(
    data_dir: Path,
) -> None:
    for role in ROLES:
        assert mode(role_secret_path(data_dir, role)) == 0o600
    assert mode(client_secret_path(data_dir, "alice")) == 0o600
    root = keys_dir(data_dir)
    for d in (root, root / "clients", root / "client-secrets"):
        assert mode(d) == 0o700
    public, secret = zmq.auth.load_certificate(role_secret_path(data_dir, "r0p1"))
    assert secret is not None and zmq.curve_public(secret) == public
    assert zmq.auth.load_certificate(role_public_path(data_dir, "r0p1")) == (public, None)


def test_secrets_are_created_0600_even_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        create_keys(tmp_path / "d", ["sequencer-0"], ["alice"])
    finally:
        os.umask(old)
    assert mode(role_secret_path(tmp_path / "d", "sequencer-0")) == 0o600
    assert mode(keys_dir(tmp_path / "d")) == 0o700


def test_a_secret_open_to_others_is_refused_with_a_clear_message(data_dir: Path) -> None:
    path = role_secret_path(data_dir, "r0p0")
    os.chmod(path, 0o644)
    with pytest.raises(SecurityError, match=r"mode 0644, open to group or others.*chmod 600"):
        load_identity(data_dir, "r0p0")
    os.chmod(path, 0o640)
    with pytest.raises(SecurityError, match="mode 0640"):
        load_identity(data_dir, "r0p0")
    os.chmod(path, 0o400)
    assert load_identity(data_dir, "r0p0").name == "r0p0"


def test_missing_malformed_and_mismatched_key_files_are_refused(data_dir: Path) -> None:
    with pytest.raises(SecurityError, match="no such key file.*ordo keys"):
        load_identity(data_dir, "r9p9")
    path = role_public_path(data_dir, "r0p0")
    path.write_bytes(b'curve\n    public-key = "tooshort"\n')
    with pytest.raises(SecurityError, match="not a 32-byte CURVE key.*8 characters"):
        load_role_public(data_dir, "r0p0")
    path.write_bytes(b"x" * (limits.curve_key_file_bytes_max + 1))
    with pytest.raises(SecurityError, match="not a key file"):
        load_role_public(data_dir, "r0p0")
    with pytest.raises(SecurityError, match="does not hold the public key"):
        path.write_bytes(role_public_path(data_dir, "r0p1").read_bytes())
        create_keys(data_dir, ["r0p0"], [])
    # A secret dropped into the allowlist is refused, not shared.
    client_public_path(data_dir, "eve").write_bytes(
        client_secret_path(data_dir, "alice").read_bytes()
    )
    with pytest.raises(SecurityError, match="public key file holding a secret"):
        load_allowlist(data_dir, ["sequencer-0"])


def test_an_allowlist_directory_others_can_write_is_refused(data_dir: Path) -> None:
    os.chmod(keys_dir(data_dir) / "clients", 0o777)
    with pytest.raises(SecurityError, match="writable by group or others"):
        load_allowlist(data_dir, ROLES)


def test_create_keys_is_idempotent_and_never_overwrites(data_dir: Path) -> None:
    before = {p: p.read_bytes() for p in keys_dir(data_dir).rglob("*") if p.is_file()}
    again = create_keys(data_dir, ROLES, [ADMIN_CLIENT, "alice"])
    assert again.created == []
    assert sorted(again.existing) == sorted(before)
    assert {p: p.read_bytes() for p in keys_dir(data_dir).rglob("*") if p.is_file()} == before
    # A lost public key is restored from its secret; nothing else changes.
    role_public_path(data_dir, "r0p1").unlink()
    assert create_keys(data_dir, ROLES, []).created == [role_public_path(data_dir, "r0p1")]
    assert (
        role_public_path(data_dir, "r0p1").read_bytes()
        == before[role_public_path(data_dir, "r0p1")]
    )


def test_a_public_key_alone_is_left_alone(tmp_path: Path, data_dir: Path) -> None:
    """A client made its own pair elsewhere and gave us its public key: allowlisted as is."""
    outsider = tmp_path / "outsider"
    create_keys(outsider, [], ["carol"])
    client_public_path(data_dir, "carol").write_bytes(
        client_public_path(outsider, "carol").read_bytes()
    )
    made = create_keys(data_dir, [], ["carol"])
    assert made.created == [] and made.existing == [client_public_path(data_dir, "carol")]
    assert not client_secret_path(data_dir, "carol").exists()
    assert "carol" in load_allowlist(data_dir, ROLES).clients.values()


def test_key_names_are_checked(tmp_path: Path) -> None:
    for bad in ["", "../etc", "a/b", ".hidden", "x" * (limits.curve_key_name_chars_max + 1)]:
        with pytest.raises(SecurityError, match="cannot name a key"):
            create_keys(tmp_path, [bad], [])


def test_identity_reprs_hide_secrets(data_dir: Path) -> None:
    ident = load_identity(data_dir, "r0p0")
    curve = client_curve(data_dir, "alice")
    assert ident.secret.decode() not in repr(ident)
    assert curve.client_secret.decode() not in repr(curve)


# Role set-up and the client's credentials ----------------------------------------------


def test_role_names_cover_every_sequencer_and_partition() -> None:
    assert role_names(ClusterConfig(replicas=2, partitions=2)) == [
        "sequencer-0", "r0p0", "r0p1", "r1p0", "r1p1",
    ]  # fmt: skip
    cfg = ClusterConfig(replicas=1, partitions=1, sequencers=3, zookeeper_servers=3)
    assert role_names(cfg) == ["sequencer-0", "sequencer-1", "sequencer-2", "r0p0"]


def test_socket_security_is_a_no_op_without_curve(ctx: zmq.Context, tmp_path: Path) -> None:
    sec = SocketSecurity.for_role(ClusterConfig(data_dir=str(tmp_path)), "r0p0")
    assert not sec.enabled
    s = dealer(ctx)
    sec.start(ctx).stop()
    sec.server(s, clients=False)
    sec.client(s, "sequencer-0")
    assert s.getsockopt(zmq.MECHANISM) == zmq.NULL


def test_socket_security_connects_roles_and_clients_with_curve(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    cfg = ClusterConfig(replicas=1, partitions=2, data_dir=str(tmp_path), curve=True)
    with pytest.raises(SecurityError, match="no such key"):
        SocketSecurity.for_role(cfg, "sequencer-0")  # on, but no keys: fails, never plain
    create_keys(tmp_path, role_names(cfg), [ADMIN_CLIENT])
    seq = SocketSecurity.for_role(cfg, "sequencer-0")
    part = SocketSecurity.for_role(cfg, "r0p1")
    auth = seq.start(ctx)
    try:
        srv = ctx.socket(zmq.ROUTER)
        srv.setsockopt(zmq.LINGER, 0)
        seq.server(srv, clients=True)
        addr = f"tcp://127.0.0.1:{srv.bind_to_random_port('tcp://127.0.0.1')}"
        p = dealer(ctx)
        part.client(p, "sequencer-0")
        p.connect(addr)
        (curve,) = client_curves(cfg, ADMIN_CLIENT)
        assert isinstance(curve, ClientCurve)
        c = dealer(ctx)
        c.setsockopt(zmq.CURVE_SERVERKEY, curve.server_public)
        c.setsockopt(zmq.CURVE_PUBLICKEY, curve.client_public)
        c.setsockopt(zmq.CURVE_SECRETKEY, curve.client_secret)
        c.connect(addr)
        users = set()
        for sock, body in ((p, b"from r0p1"), (c, b"from admin")):
            sock.send(body)
            assert srv.poll(ANSWER_WAIT_MS)
            frames = srv.recv_multipart(copy=False)
            assert frames[1].bytes == body
            users.add(frames[1].get("User-Id"))
        assert users == {"role:r0p1", "client:admin"}
        with pytest.raises(SecurityError, match="not a role"):
            part.client(dealer(ctx), "sequencer-7")
    finally:
        auth.stop()


def test_an_allowlist_of_bare_keys_admits_those_keys_only(ctx: zmq.Context, data_dir: Path) -> None:
    server_public = load_role_public(data_dir, "sequencer-0")
    with start_authenticator(ctx, AllowList.of_keys([load_role_public(data_dir, "r0p0")])) as auth:
        srv = ctx.socket(zmq.ROUTER)
        srv.setsockopt(zmq.LINGER, 0)
        secure_server(srv, load_identity(data_dir, "sequencer-0"))
        addr = f"tcp://127.0.0.1:{srv.bind_to_random_port('tcp://127.0.0.1')}"
        for name, ident in (
            ("alice", load_client_identity(data_dir, "alice")),
            ("r0p0", load_identity(data_dir, "r0p0")),
        ):
            s = dealer(ctx)
            secure_client(s, ident, server_public)
            s.connect(addr)
            s.send(name.encode())
        assert srv.poll(ANSWER_WAIT_MS)
        assert srv.recv_multipart()[1] == b"r0p0"
        # alice is never served (whether her handshake has reached ZAP yet or not)
        assert srv.poll(NOTHING_WAIT_MS) == 0
        assert auth.admitted == 1


# ordo keys -----------------------------------------------------------------------------


def test_ordo_keys_creates_role_and_client_keys_once(tmp_path: Path) -> None:
    cfg = ClusterConfig(replicas=2, partitions=1, data_dir=str(tmp_path))
    cfg.save()
    runner = CliRunner()
    first = runner.invoke(main, ["keys", "--data-dir", str(tmp_path), "--client", "alice"])
    assert first.exit_code == 0, first.output
    assert "10 file(s) created" in first.output  # 3 roles + admin + alice, 2 files each
    for role in ["sequencer-0", "r0p0", "r1p0"]:
        assert f"created {role_secret_path(tmp_path, role)}" in first.output
        assert mode(role_secret_path(tmp_path, role)) == 0o600
    assert "curve off" in first.output
    second = runner.invoke(main, ["keys", "--data-dir", str(tmp_path), "--client", "alice"])
    assert second.exit_code == 0, second.output
    assert "0 file(s) created, 10 already there" in second.output


def test_ordo_keys_reports_bad_names_and_missing_config(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["keys", "--data-dir", str(tmp_path / "none")])
    assert missing.exit_code != 0 and "no cluster config" in missing.output
    ClusterConfig(data_dir=str(tmp_path)).save()
    bad = runner.invoke(main, ["keys", "--data-dir", str(tmp_path), "--client", "../x"])
    assert bad.exit_code != 0 and "cannot name a key" in bad.output


def test_a_client_refused_by_the_server_still_closes_at_once(
    ctx: zmq.Context, data_dir: Path
) -> None:
    """A server that refuses the client's keys ends the connection, and a DEALER with no
    connection at all blocks a send: the client's I/O thread sent its resends that way,
    blocked for good, never saw ``close`` and held its sockets (the suite's leak
    check found it). Now its calls time out, and it closes within its poll period."""
    from cluster.launcher import free_base_port
    from txn_library.client import Client
    from txn_library.errors import CallTimeout

    server = Server(ctx, data_dir)
    try:
        public, secret = zmq.curve_keypair()
        stranger = ClientCurve(public, secret, load_role_public(data_dir, "sequencer-0"))
        # Two sequencer addresses (the other one silent), as an HA client has: moving
        # between them, the client meets the refusing server with no connection left.
        silent = f"tcp://127.0.0.1:{free_base_port(1)}"
        c = Client([server.addr, silent], timeout_s=2, retry_s=0.5, curve=[stranger, stranger])
        with pytest.raises(CallTimeout):
            c.call("kv.get", "k")
        thread = c._thread
        closing = time.monotonic()
        c.close()
        assert not thread.is_alive(), "the client's I/O thread is stuck"
        assert time.monotonic() - closing < 2.0  # not close()'s 5 s join timeout
        assert server.receives_nothing()
    finally:
        server.auth.stop()
