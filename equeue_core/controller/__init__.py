"""The controller: decides which broker of each group is master (docs/controller.md).

It runs inside `equeue nameserver --controller-peers ... --controller-port ...` as a Raft group of
the name servers (pysyncobj). Only the Raft leader decides; every decision (a member joined, a
master elected with a new epoch, the master's in-sync set) is a committed Raft log entry, so any
majority of name servers remembers it and a minority cannot decide at all.
"""

from equeue_core.controller.state import ControllerState, GroupState

__all__ = ["ControllerState", "GroupState"]
