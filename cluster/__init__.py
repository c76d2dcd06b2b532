"""Plumbing shared by every Ordo role: cluster configuration, limits, process launch, CLI.

Roles (sequencer, scheduler, executor) never import each other's internals through
this package; it only holds what all of them need to agree on (addresses, limits).
"""
