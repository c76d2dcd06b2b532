"""What a simulated node sees of its world: the narrow interface the simulator's nodes
(``sim_partition``, ``sim_sequencer``, ``sim_client``, and the readers' node,
``executor.reader.sim_reader``) are built on, instead of the ``Simulator`` itself.

A node reads the one clock and event loop, the simulated network, the seed's one
``random.Random``, the trace, the run's options and shape; it reaches its peers (the
partitions of every replica, the leading sequencer, a client by its connection) only
through the few inputs the live processes' sockets deliver; and it reports to the
simulator through a few callbacks: a failure, a batch logged, results sent, a sequencer
that crashed, fail-stopped or stepped down, a resend gap no peer can fill, and the
planted bugs' hooks on its inputs. ``simulator.Simulator`` implements ``World``; the
nodes import this module and never the simulator (a lint-imports contract in
pyproject.toml forbids it, type-only imports included). With ``SimOptions.ha_faults``
each sequencer member is handed a ``World`` whose ``loop`` is its own
``sim_network.NodeLoop`` (its timers wait while it is paused; its clock may jump) and
is otherwise the simulator's.

Readers sit above this package (executor/reader/), so the simulator cannot build
them: it is handed a ``ReaderNodeFactory`` and reaches the nodes it makes through
``ReaderPeer``. They are observers (``Node.observer``): whatever they or the clients
do about them draws from ``readers_rng``, never from ``rng``.

Invariants: a node changes the world only through these callbacks and the network;
every member here is read-only to a node.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from executor.deterministic.sim_network import EventLoop, Network, Node, Payload, Trace
from executor.deterministic.sim_options import SimOptions
from executor.deterministic.workloads import GenesisImage
from sequencer.replication import MemoryStore
from sequencer.sequencer import Sequencer
from txn_library.wire import sequencer as wire


class PartitionPeer(Protocol):
    """A partition process as its peers, its sequencer and the simulator reach it."""

    @property
    def node(self) -> Node: ...
    @property
    def replica(self) -> int: ...
    @property
    def partition(self) -> int: ...

    def on_pub(self, payload: Payload) -> None:
        """SUB: a batch or a heartbeat."""

    def on_inbox(self, payload: Payload) -> None:
        """PULL: a peer's reads, reads floor, resend (gap), a query, a status request."""

    def on_log_reply(self, payload: Payload) -> None:
        """DEALER: the log service's answer to a fetch."""

    def on_query_frame(self, identity: bytes, frame: Payload) -> None:
        """ROUTER (query socket): a client's snapshot queries."""


class LogFetcher(Protocol):
    """Whoever asks the log service (a partition, a reader): where the reply goes."""

    @property
    def node(self) -> Node: ...

    def on_log_reply(self, payload: Payload) -> None:
        """DEALER: the log service's answer to a fetch."""


class ReaderPeer(Protocol):
    """A reader process as the sequencer, the clients and the simulator reach it."""

    @property
    def node(self) -> Node: ...
    @property
    def index(self) -> int: ...

    def start(self) -> None:
        """Start (empty: genesis) and catch up from the log service."""

    def crash(self) -> None:
        """kill -9: everything in memory is gone."""

    def on_pub(self, payload: Payload) -> None:
        """SUB: a batch or a heartbeat."""

    def on_log_reply(self, payload: Payload) -> None:
        """DEALER: the log service's answer to a fetch."""

    def on_query_frame(self, identity: bytes, frame: Payload) -> None:
        """ROUTER: a client's queries."""

    def caught_up(self, last_epoch: int) -> bool:
        """Up, live, applied ``last_epoch``, no query waiting."""

    def describe(self) -> str: ...

    def applied_hashes(self) -> list[tuple[int, tuple[int, ...]]]:
        """(epoch, every partition's state hash at its end) for each epoch every
        incarnation applied (and the state each started from), in order."""

    def applied_epoch(self) -> int | None:
        """The epoch applied now (None: down)."""

    def counters(self) -> dict[str, int]:
        """What the node counted (summed over its incarnations)."""


class SequencerPeer(Protocol):
    """A sequencer process as partitions, clients and the simulator reach it."""

    @property
    def node(self) -> Node: ...
    @property
    def member(self) -> int: ...

    def on_results(self, payload: Payload) -> None:
        """PULL: a partition's results and status."""

    def on_log_fetch(self, partition: LogFetcher, payload: Payload) -> None:
        """ROUTER: a partition (or a reader) asks the log service for epochs."""

    def on_client_frame(self, identity: bytes, frame: bytes) -> None:
        """ROUTER: a client's frame of calls."""


class ClientPeer(Protocol):
    """A client as the sequencer reaches it."""

    @property
    def node(self) -> Node: ...

    def on_reply(self, frame: Payload) -> None:
        """DEALER: a frame of answers."""

    def on_query_reply(self, frame: Payload) -> None:
        """DEALER (to a partition's query socket): answers to queries."""

    def on_reader_reply(self, frame: Payload, reader: int) -> None:
        """DEALER (to a reader's socket): answers to queries."""


class World(Protocol):
    """The run as a node sees it (see module docstring)."""

    # Time, the network, randomness, the record of what happened
    @property
    def loop(self) -> EventLoop: ...
    @property
    def net(self) -> Network: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def trace(self) -> Trace: ...
    @property
    def readers_rng(self) -> random.Random:
        """The readers' own generator (see module docstring)."""

    def mono_s(self) -> float:
        """The roles' clock (time.monotonic in a live process)."""

    # The run's options and shape, and where its files live
    @property
    def opts(self) -> SimOptions: ...
    @property
    def replicas(self) -> int: ...
    @property
    def partitions(self) -> int: ...
    @property
    def checkpoint_every_epochs(self) -> int: ...
    @property
    def checkpoint_write_max_us(self) -> int: ...
    @property
    def dataflow_recovery(self) -> str: ...
    @property
    def image(self) -> GenesisImage: ...
    @property
    def root(self) -> Path: ...
    @property
    def log_dir(self) -> Path: ...
    @property
    def store(self) -> MemoryStore | None:
        """The replicated ordering layer's store (None: one sequencer)."""

    # Peers
    @property
    def parts(self) -> Sequence[Sequence[PartitionPeer]]:
        """Every partition of every replica: ``parts[replica][partition]``."""

    @property
    def readers(self) -> Sequence[ReaderPeer]:
        """Every reader (none unless ``opts.readers``)."""

    @property
    def seq_node(self) -> SequencerPeer:
        """The leader, where clients send (the simulator knows it)."""

    def sequencer_of(self, member: int) -> SequencerPeer:
        """Sequencer ``member``: partitions send results to the one they believe leads
        (the newest term's publisher or heartbeat), as live, not to the true leader."""

    @property
    def client_by_identity(self) -> Mapping[bytes, ClientPeer]: ...

    def pid_of(self, node: PartitionPeer) -> int:
        """A simulated process id for a partition's status."""

    # Reports to the simulator
    def failure(self, text: str) -> None:
        """A finding: the run fails with ``text``."""

    def note_batch(self, data: bytes) -> None:
        """The sequencer logged a batch."""

    def note_results(self, node: PartitionPeer, data: bytes) -> None:
        """A partition sent results."""

    def sequencer_crashed(self, when: str) -> None:
        """The leader crashed (a planned fault came due inside the role)."""

    def sequencer_failed_stop(self, reason: str) -> None:
        """The sequencer's log failed under it and it fail-stopped."""

    def leader_stepped_down(self, node: SequencerPeer) -> None:
        """A leader's commit failed (cut off, or fenced by a newer term)."""

    def on_resend_gap(self, node: PartitionPeer, peer: int, retained_from: int) -> None:
        """A restarted partition's peer no longer retains the reads it needs."""

    def note_boundary(self, node: PartitionPeer, epoch: int, state_hash: int) -> None:
        """A partition drained at a checkpoint boundary: its state hash at ``epoch``'s
        end (what it reports as ``boundary_hash``; readers' hashes are checked on it)."""

    # Planted bugs (never engine code)
    def planted_batch(self, node: PartitionPeer, batch: wire.Batch) -> wire.Batch: ...
    def planted_reads(self, node: PartitionPeer, entries: list) -> list: ...
    def planted_sequencer(self, seq: Sequencer) -> None: ...
    def planted_reader_batch(self, reader: ReaderPeer, data: bytes) -> bytes: ...
    def planted_reader_replies(self, reader: ReaderPeer, replies: list) -> list: ...


ReaderNodeFactory = Callable[[World, int], ReaderPeer]
"""Builds reader ``index`` of a run (executor.reader.sim_reader.ReaderNode)."""
