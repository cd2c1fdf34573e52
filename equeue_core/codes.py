"""Request codes and the header fields each carries (docs/protocol.md, "Request codes").

Headers are msgpack maps; bodies are runs of records (record.py) where noted.
"""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    # Each comment: request header fields (? = optional) + body -> response header + body.
    # The handler named after `@` reads exactly these fields; docs/protocol.md has the full table.
    # producer
    SEND = 1             # {topic, queue_id, delay_level? | deliver_at? (epoch ms), epoch?} + body: records
                         #   -> {queue_id, first_offset, positions, id_prefix}  @ Broker.on_send
    ROUTE = 2            # {topic, create?} -> {topic, queues, broker, id_prefix}  @ Broker.on_route
    SEND_MULTI = 3       # {sections: [[topic, queue_id, length], ...], epoch?} + body: each section's records,
                         #   back to back -> {stored: [[first_offset, positions], ...], id_prefix,
                         #   failed?: {error, message, details}}  @ Broker.on_send_multi (broker/multi_send.py)
    # consumer
    PULL = 10            # {topic, queue_id, offset, max_count?, tags?, hold_ms?, strict?} (group: logged only)
                         #   -> {status, next_offset, min_offset, max_offset, count} + body: records
                         #   @ Broker.on_pull
    COMMIT_OFFSETS = 11  # {group, offsets: [[topic, queue_id, offset], ...]} -> {} (one-way allowed);
                         #   all or nothing (invalid_offset)  @ Broker.on_commit_offsets
    QUERY_OFFSET = 12    # {group, topic, queue_id} -> {offset: int | None, min_offset, max_offset}
    HEARTBEAT = 13       # {client_id, group, mode?, subscriptions?, queues?} -> {members}  @ GroupRegistry.on_heartbeat
    UNREGISTER = 14      # {client_id, group} -> {}
    GROUP_MEMBERS = 15   # {group} -> {members: [client ids]}
    SEND_BACK = 16       # {group, msg_id, max_reconsume?, delay_level?} -> {topic: retry or DLQ topic}
                         #   @ Scheduler.on_send_back (schedule.py)
    LOCK_QUEUES = 17     # {group, client_id, queues: [[topic, q]...]} -> {locked: [[topic, q]...]}
    UNLOCK_QUEUES = 18   # {group, client_id, queues} -> {}
    GROUP_CHANGED = 19   # push from the broker (request id 0): {group}
    # admin
    CREATE_TOPIC = 20    # {topic, queues?} -> {topic, queues}
    LIST_TOPICS = 21     # {system?} -> {topics: {name: {queues, ranges: [[min, max]...]}}}
    GET_MESSAGE = 22     # {msg_id} -> {} + body: one record
    QUEUE_RANGES = 23    # {topic} -> {ranges: [[min, max]...]}
    GROUP_INFO = 24      # {group?} -> {groups: {name: {members, queues, retry_topic, dlq_topic}}}
    RESET_OFFSETS = 25   # {group, topic, to: "earliest"|"latest"|ts_ms} -> {offsets: [[topic, queue_id, offset]]}
    DELETE_TOPIC = 26    # {topic} -> {}
    OFFSET_FOR_TIME = 27  # {topic, queue_id, ts_ms} -> {offset}
    BROKER_INFO = 28     # {} -> {address, store, transport, flush, version, data_dir, recovery, stats,
                         #   held_pulls, replication, scheduler}  @ Broker.on_broker_info
    QUERY_BY_KEY = 29    # {topic, key, max?, scan_limit?} -> {count, scanned} + body: records, newest first
    BROKER_STATS = 30    # {} -> {time, started, address, store, transport, flush, topics, groups, held_pulls,
                         #   connections, scheduled, retention_released_bytes, recovery, latency, disk}
                         #   @ BrokerMetrics.on_broker_stats (docs/operations.md)
    SKIP_RECORD = 31     # {group, topic, queue_id, offset} -> {skipped, next_offset, previous, corrupt}
    # consumer, many queues at once
    PULL_MULTI = 32      # {group, pulls: [[topic, queue_id, offset, max_count, tags | nil], ...], strict?}
                         #   -> {results: [[status, next_offset, min_offset, max_offset, count, length]
                         #   | {error, message, details}, ...]} + body: each result's records, back to back;
                         #   never held; fewer results than pulls: the rest were not read (the answer's
                         #   byte budget)  @ Broker.on_pull_multi (broker/multi_pull.py)
    # name server (equeue nameserver; docs/cluster.md); a broker answers these with unknown_request
    REGISTER_BROKER = 40    # {cluster, name, address, data_version, topics: {name: {queues, perm}}}
                            #   -> {cluster, name, expiry_s}; broker_name_conflict if the name is taken
    UNREGISTER_BROKER = 41  # {cluster, name, address} -> {removed: bool} (one-way allowed)
    GET_ROUTE = 42          # {topic} -> {topic, brokers: [{cluster, name, address, queues, perm}]}
    GET_CLUSTER_INFO = 43   # {} -> {clusters: {cluster: [names]}, brokers: [{cluster, name, address, topics,
                            #   data_version, heartbeat_age_s, registered_age_s}]}
    NAMESERVER_INFO = 44    # {} -> {address, transport, version, expiry_s, brokers, stats: {counter: int}}
    # replication (docs/replication.md); a replica asks its master, an admin asks any broker
    REPL_HELLO = 50         # {cluster, name, broker_id, epoch, address} -> {cluster, name, broker_id, epoch,
                            #   log_end, epochs}; replica_refused for another group  @ Master.on_hello
    REPL_FETCH = 51         # {broker_id, position, max_bytes?, wait_ms?} -> {end, epoch, epochs?} + body:
                            #   records from position (position = the replica's end: its ack)
    REPL_EPOCHS = 52        # {} -> {epochs: [[epoch, start]...], log_end}
    REPL_SYNC_META = 53     # {broker_id, offsets: [[group, topic, queue_id, offset]...]} -> {topics, offsets}
    REPL_STATUS = 54        # {} -> ReplicationStatus.to_dict()
    REPL_PROMOTE = 55       # {epoch?} -> status: become master (static failover by hand)
    REPL_DEMOTE = 56        # {master, epoch} -> status: become a replica of master
    # controller (equeue nameserver --controller-peers; docs/controller.md); codes 50-59 are replication's
    CONTROLLER_HEARTBEAT = 60  # {cluster, name, broker_id, address, role, epoch, log_end, master_address?,
                               #   in_sync?: [ids], replicas?: {id: {lag_bytes, ...}}}
                               #   -> {cluster, name, epoch, master_id, master_address, role, leader, controller_leader}
    CONTROLLER_INFO = 61       # {} -> {self, leader, state, term, has_quorum, peers, groups: [...]}
    ELECT_MASTER = 62          # {cluster, name, broker_id?} -> {cluster, name, epoch, master_id, master_address};
                               #   Raft leader only (not_leader names it); failover_refused, no_quorum


# Sections one SEND_MULTI may carry (the broker refuses more with `protocol`; a producer packs no
# more than this into one frame)
MAX_MULTI_SECTIONS = 4096

# Queues one PULL_MULTI may ask for (the broker refuses more with `protocol`)
MAX_PULL_SECTIONS = 64

# The most records one pull (or one PULL_MULTI section) asks for; a larger max_count is clamped
MAX_PULL_COUNT = 4096


class PullStatus:
    FOUND = "found"
    NO_NEW = "no_new"        # nothing at offset after the hold time
    OFFSET_RESET = "offset_reset"  # offset below min / above max: start again at next_offset
