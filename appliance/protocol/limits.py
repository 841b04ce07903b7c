"""The one home of the appliance's limits: every bound on memory, time,
retries and message size, with its default value, defined here once.

Code reads a limit as ``limits.NAME`` (``from appliance.protocol import
limits``); no other product module assigns one (``tests/test_limits.py``
fails when a module does, or when a name is defined twice).  The config
(``appliance/config.py``) takes the default of every limit it exposes from
here, so a key's default and the value code uses without a config cannot
drift apart.

Names carry their unit.  A constant that backs a config key is named after
the key: ``[section] key`` -> ``SECTION_KEY`` (``client.add_batch_entries_max``
is ``CLIENT_ADD_BATCH_ENTRIES_MAX``); the others start with the room that
uses them.  Each says what it bounds and what a larger or smaller value
trades.  ``docs/CONFIG.md`` documents the keys; the defaults are the values
here.  Rules between limits (a client's batch fits in the wire's, ...) are
checked by ``tests/test_limits.py`` and, for a loaded config, by
``appliance.config``.

Layer 0: the standard library only, so ``ipc`` and ``storage`` read it too.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# -- identities (format bounds, not tunable) ------------------------------------
ID_MAX = 2**63 - 1  # a ledger or entry id: u64/i64 on the wire, kept < 2**63 so signed peers agree
LEDGER_ID_MAX = ID_MAX
ENTRY_ID_MAX = ID_MAX

# -- wire (ipc.frames.WireLimits: every bookie's and client's decoders) -----------
# Most entries in one batch message (ADD_BATCH / READ_BATCH / ADD_PACKED /
# READ_PACKED); the bookie's limit, which every client batch must fit in.
# More amortises per-message Python cost; fewer bounds one message's latency.
SERVER_BATCH_ENTRIES_MAX = 8_192
# Most entry bytes in one batch message (a packed data frame holds up to
# this): bounds the memory of one message on every hop.
SERVER_BATCH_BYTES_MAX = 64 * MiB
WIRE_TEXT_BYTES_MAX = 64 * KiB  # an error message or INFO JSON frame
IPC_PATH_BYTES_MAX = 107  # an ipc:// socket path: sun_path holds 108 bytes with the NUL

# -- client ([client]) ---------------------------------------------------------------
CLIENT_ADD_TIMEOUT_MS = 5_000  # an add's wait for its ack quorum; also the heartbeat timeout
CLIENT_READ_TIMEOUT_MS = 5_000  # one read request: a slow bookie vs trying the next replica
CLIENT_ADD_RETRIES_MAX = 1  # resends of unanswered adds to a bookie before it is replaced
# Delayed ensemble change (appliance.protocol.writer_heal): records a writer
# keeps of acknowledged entries some bookie of their write set has not
# acknowledged yet (a slow or lagging bookie), to re-send to it; past it
# entries are acknowledged at Qa copies and not kept.  Per ledger handle: a
# process writing many ledgers through a stall holds up to that many times it.
CLIENT_HEAL_BYTES_MAX = 64 * MiB
# How long close() waits for those entries to heal before closing anyway.
CLIENT_HEAL_CLOSE_WAIT_MS = 120_000
# Adds and payload bytes in flight per handle: more keeps the pipe full,
# fewer bounds memory and the work a failure must replay.
CLIENT_INFLIGHT_ADDS_MAX = 1_000
CLIENT_INFLIGHT_BYTES_MAX = 32 * MiB
# Requests outstanding per bookie for the bulk reader (``[client]`` key).
CLIENT_INFLIGHT_PER_BOOKIE_MAX = 1_024
# Requests outstanding per bookie on the driver's transport.  Not a config
# key: the driver's adds are bounded per handle (CLIENT_INFLIGHT_ADDS_MAX), so
# this only catches a runaway; kept at the value production has always run.
CLIENT_TRANSPORT_INFLIGHT_PER_BOOKIE_MAX = 100_000
# Entries per ADD_BATCH / ADD_PACKED message.  The one default of the config
# key and of a Driver built without a config (before, the driver's own 1024
# was used only by tests).  Must fit SERVER_BATCH_ENTRIES_MAX.  More:
# fewer messages at high rates; fewer: a smaller message that leaves sooner.
CLIENT_ADD_BATCH_ENTRIES_MAX = 512
CLIENT_ADD_BATCH_BYTES_MAX = 8 * MiB  # entry bytes per add message; fits SERVER_BATCH_BYTES_MAX
# Entries and entry bytes a read asks of a bookie in one READ_BATCH /
# READ_PACKED: the reply's cap.  More: fewer round trips; fewer: less memory
# per reply and a first entry sooner.  Fit the wire's batch limits.
CLIENT_READ_BATCH_ENTRIES_MAX = 8_192
CLIENT_READ_BATCH_BYTES_MAX = 16 * MiB
# A read not answered in this long is also sent to the next replica of its
# write set (a speculative read; the first valid answer wins).  BookKeeper
# waits 2,000 ms; on one NVMe host a healthy bookie answers a read in well
# under a millisecond and in tens of ms when the machine is loaded, so a
# reply still missing after 250 ms means a stalled bookie (GC, SIGSTOP, a
# hung disk), not a busy one.  Shorter: stalls cost less, at the price of
# duplicate reads when every bookie is slow; longer: fewer duplicates.
CLIENT_SPECULATIVE_READ_TIMEOUT_MS = 250
# A bookie with CLIENT_BOOKIE_QUARANTINE_STRIKES failed or outrun reads
# within CLIENT_BOOKIE_STRIKE_WINDOW_MS is quarantined for this long: asked
# last for reads and left out of new ensembles while enough others are up.
# BookKeeper keeps one 1,800 s; here a quarantine only demotes a bookie, and
# one host has few to choose from, so a minute: long enough that a bookie
# stalling again and again is not asked first after every stall, short
# enough that a bookie that recovered takes its share back soon.
CLIENT_BOOKIE_QUARANTINE_MS = 60_000
CLIENT_BOOKIE_QUARANTINE_STRIKES = 5
CLIENT_BOOKIE_STRIKE_WINDOW_MS = 10_000  # strikes older than this are forgotten
CLIENT_BOOKIE_HEALTH_BOOKIES_MAX = 4_096  # bookies whose strikes one client remembers
CLIENT_RECONNECT_IVL_MAX_MS = 2_000  # the longest reconnect back-off to a bookie
CLIENT_DRAIN_ITEMS_MAX = 4_096  # queue items the driver applies per wakeup before timers run
CLIENT_CALL_TIMEOUT_S_MAX = 600.0  # the longest a blocking call waits for the driver thread
CLIENT_KNOWN_KEYS_MAX = 64  # distinct passwords a connection remembers for delete_ledger

# -- bookie server ([server] and the handler) -------------------------------------------
SERVER_DRAIN_MESSAGES_MAX = 256  # messages decoded per wakeup: more batches, fewer timer checks
SERVER_QUEUE_MESSAGES_MAX = 10_000  # ZeroMQ high-water mark per peer: memory vs back pressure
SERVER_LONG_POLLS_MAX = 10_000  # pending WAIT_LAC requests (each holds a timer)
SERVER_WAIT_LAC_TIMEOUT_MS_MAX = 60_000  # the longest a long poll may park
BOOKIE_PENDING_REPLIES_MAX = 200_000  # replies parked until their add is durable
# ADD_PACKED requests of fewer entries, and every ADD_MULTI, are held until
# the loop's drain ends and stored together (bigger ADD_PACKED have a
# vectorised check of their own).
BOOKIE_COALESCE_ENTRIES_MAX = 64
BOOKIE_METRICS_PARKED_MAX = 100_000  # timed requests awaiting their reply (oldest dropped past it)
BOOKIE_REFUSAL_LEDGERS_MAX = 10_000  # ledgers whose refused reads are counted for the log line
# Repair of a limbo ledger from its peers: the back-off between tries grows
# from MIN to MAX; longer is gentler on peers, shorter heals sooner.
BOOKIE_REPAIR_RETRY_MS_MIN = 500
BOOKIE_REPAIR_RETRY_MS_MAX = 30_000
# The scrub of closed ledgers (appliance.bookie.scrub): every interval a
# bookie looks at up to LEDGERS_MAX ledgers (one metadata read each) for
# entries of its share a writer left short; the missing ones are repaired
# from peers.  The interval is the heal's delay once a writer is gone (the
# issue's bound: 2 minutes); shorter heals sooner for more metadata reads.
BOOKIE_SCRUB_INTERVAL_MS = 30_000
BOOKIE_SCRUB_LEDGERS_MAX = 1_000  # per pass: bounds the metadata reads of one pass

# -- storage (one bookie's disks; the other [storage] keys: storage.options) -----
# The largest payload of one entry (CONTRACT: 5 MiB); a record adds the
# header and digest (entry.ENTRY_OVERHEAD_MAX).  Bigger entries cost memory on
# every hop and delay everything queued behind them.
STORAGE_ENTRY_BYTES_MAX = 5 * MiB
# Entries per batched storage read; a READ_BATCH / READ_PACKED of up to the
# wire's batch is then one read into one buffer (the byte budget still bounds it).
STORAGE_READ_RUN_ENTRIES_MAX = 65_536
# Largest single pread of a run, plus at most one record: bigger is fewer
# syscalls, smaller bounds the memory one read holds.
STORAGE_READ_RUN_BYTES_MAX = 16 * MiB
# Records this close on disk are read in one pread with the bytes between
# them: fewer syscalls and numpy passes per run, at the cost of those bytes.
STORAGE_READ_GAP_BYTES_MAX = 4_096
STORAGE_CALLBACKS_MAX = 1_000_000  # pending durability callbacks (a bound on memory)
STORAGE_CRC_TABLES_MAX = 256  # cached CRC advance tables (one per length seen): 4 KiB each
STORAGE_READ_FDS_MAX = 256  # open entry-log read descriptors kept (LRU)
STORAGE_SPARE_BUFFERS_MAX = 2  # per-ledger logs' spare write buffers kept for reuse
STORAGE_MASTER_KEY_BYTES_MAX = 1_024  # a master key in the journal's state records
# Room kept in each of a bookie's directories (a RESERVE file) and given back when the disk
# is full, so the storage can still be reopened, journal a delete and write its index
# snapshot: more is safer for a large index, and is space the bookie never uses otherwise.
STORAGE_RESERVE_BYTES = 8 * MiB
# Compaction copies at most this many bytes per second (BookKeeper's
# compactionRateByBytes; [storage] compaction_rate_bytes_per_s, 0 = no limit).
# Lower: adds keep more of the entry-log device while a compaction runs;
# higher: the space comes back sooner (a run copies live / (1 - live) bytes
# per byte given back).  At 10,000 adds/s with a major compaction on every
# bookie (docs/PERFORMANCE.md): add p99 79 ms at 16 MiB/s, 539 ms at 64
# MiB/s (which the disk never reached: no wait), 436 ms unlimited.
STORAGE_COMPACTION_RATE_MAX = 16 * MiB
# The GC rotates the active entry log once this many of its bytes belong to
# deleted ledgers, or its live share is under the minor compaction threshold
# ([storage] entry_log_rotate_garbage_bytes, 0 = only by size):
# only a sealed log can be removed or compacted, and the active one is sealed
# by size only every entry_log_rotate_bytes (1 GiB).  Lower: less of a deleted
# ledger's data waits in the active log; higher: fewer, larger entry logs
# (a rotation costs one new file and a checkpoint, at most once a GC pass).
STORAGE_ENTRY_LOG_ROTATE_GARBAGE_BYTES = 16 * MiB

# -- metadata store ([metadata]; storage.metadata) -------------------------------------
# How long a silent process keeps its ephemeral registrations: shorter, a
# dead bookie disappears sooner; longer, a stalled one is not declared dead.
METADATA_SESSION_TIMEOUT_MS = 10_000
METADATA_CONNECT_TIMEOUT_MS = 5_000  # the first connection to the store
# SQLite: how long a writer waits for another process's write lock before
# giving up.  SQLite's busy handler is not fair: a process that commits in a
# tight loop can re-take the lock while the others sleep between retries, so
# under CPU contention one writer can wait seconds.  Longer: fewer spurious
# MetadataUnavailableError under bursts; shorter: a wedged lock holder is
# reported sooner.
METADATA_SQLITE_BUSY_TIMEOUT_MS = 20_000
# Node data: ZooKeeper refuses packets over ~1 MiB (jute.maxbuffer); both
# backends refuse more, so a store can move from SQLite to ZooKeeper.
METADATA_DATA_BYTES_MAX = 1_000_000
METADATA_PATH_CHARS_MAX = 1_024
METADATA_ZK_AUTH_FILE_BYTES_MAX = 4_096  # one line: anything longer is not a credentials file
# kazoo's reconnect back-off cap: longer is gentler on a struggling
# ensemble, shorter reconnects sooner after a restart.
METADATA_ZK_RECONNECT_DELAY_MAX_S = 1.0

# -- metadata updates (appliance.meta: the one update loop) ---------------------
# Back-off after a conflict: the cap grows from METADATA_BACKOFF_MS_BASE,
# doubling per conflict, up to METADATA_BACKOFF_MS_MAX; the sleep is uniform
# below the cap.  Longer spreads racing writers further apart at the cost of
# latency per conflict.
METADATA_BACKOFF_MS_BASE = 1
METADATA_BACKOFF_MS_MAX = 20
# Conflicts one ledger metadata update tolerates (each costs a round trip).
METADATA_LEDGER_UPDATE_RETRIES_MAX = 32
# Conflicts tolerated while allocating a ledger id: every creator races on
# the one counter node.
METADATA_LEDGER_ID_RETRIES_MAX = 200
# A ledger's id bucket node removed by a concurrent delete while a ledger is
# created in it: made again up to this many times.
METADATA_BUCKET_RETRIES_MAX = 8
# Conflicts one log metadata update tolerates (writers, truncation and
# deletion race on the log's node).
METADATA_LOG_UPDATE_RETRIES_MAX = 64
# Conflicts set_read_only tolerates (only the bookie itself and admins write).
METADATA_BOOKIE_UPDATE_RETRIES_MAX = 16
# Conflicts an under-replication mark tolerates (auditors and decommission).
METADATA_MARK_RETRIES_MAX = 9
# Create-if-absent (cookies, the published cluster key): a concurrent create
# is one conflict; the retry reads the winner's node and decides on it.
METADATA_CREATE_RACE_RETRIES_MAX = 1
# A bookie id's length in the registry (a node name).
METADATA_BOOKIE_ID_CHARS_MAX = 255
# Registering a bookie whose previous session's ephemeral node has not
# expired yet: tries (bounded by a deadline as well).
METADATA_PUBLISH_TRIES_MAX = 100

# -- CURVE (ipc.curve) -------------------------------------------------------------------
CURVE_KEYS_MAX = 10_000  # public key files read from one directory
CURVE_REFUSALS_TRACKED_MAX = 4_096  # (address, key) pairs remembered for the log rate limit
CURVE_ZAP_REQUESTS_PER_WAKEUP_MAX = 256  # ZAP requests answered per wakeup

# -- logs ([log]; appliance.logs) ----------------------------------------------------------
LOG_SEGMENT_BYTES_MAX = 256 * MiB  # a segment rolls over past this (0: never by size)
LOG_SEGMENT_RECORDS_MAX = 0  # ... or past this many records (0: never by count)
LOG_READ_ENTRIES_MAX = 64  # entries a log reader fetches per ledger read
LOG_ROLL_WORKERS = 4  # threads per process rolling log servers' segments over (at once)

# -- the log service ([log] servers; appliance.logservice, appliance.logs.producer) ----------
# A producer retries a write (same sequence number) through owner crashes,
# restarts and moves for this long, then fails it and every later write
# (LogServiceUnavailableError): longer rides out slower fail-overs (the
# metadata session timeout, then a restart), shorter reports trouble sooner.
LOG_PRODUCER_DEADLINE_MS = 60_000
# One request's reply awaited this long before the producer resends everything
# unacknowledged (the owner drops the duplicates).
LOG_PRODUCER_REQUEST_TIMEOUT_MS = 5_000
# A producer's window: records and bytes sent and not yet acknowledged;
# write_async blocks (up to the deadline) while it is full: back-pressure.
LOG_PRODUCER_INFLIGHT_RECORDS_MAX = 4_096
LOG_PRODUCER_INFLIGHT_BYTES_MAX = 8 * MiB
# Write requests a producer has awaiting their reply: the records written
# meanwhile leave together in the next request once one is answered
# (adaptive batching: an idle producer sends at once, a busy one sends fewer,
# fuller requests; the owner's cost is mostly per request).  More: less
# waiting per record under moderate load, more requests for the owner.
LOG_PRODUCER_REQUESTS_INFLIGHT_MAX = 1
LOG_PRODUCER_BATCH_RECORDS_MAX = 1_024  # records in one write request
LOG_PRODUCER_BATCH_BYTES_MAX = 1 * MiB  # payload bytes in one write request
# The owner's duplicate filter, per log: producers it tracks (a new one is
# refused with TooManyProducersError while this many wrote within the idle
# time), and each one's recent (sequence number -> DLSN) answers kept (at
# least a window of records, so any retried write is answered).
LOG_SERVICE_PRODUCERS_MAX = 1_024
LOG_SERVICE_PRODUCER_IDLE_MS = 600_000  # a producer silent this long is forgotten
LOG_SERVICE_RECENT_MAX = LOG_PRODUCER_INFLIGHT_RECORDS_MAX
# A new owner rebuilds the filter from the records of the segments that were
# being written during the last LOG_SERVICE_REBUILD_MS (twice a producer's
# deadline: a retried write was first sent within it).
LOG_SERVICE_REBUILD_MS = 2 * LOG_PRODUCER_DEADLINE_MS
LOG_SERVICE_REQUEST_FRAMES_MAX = LOG_PRODUCER_BATCH_RECORDS_MAX + 1  # header + records
# A multi-log request (the producers of one process that talk to one log
# server, in one message) and a multi-log reply: at most this many sections
# and bytes (a producer sends what is left in the next message).
LOG_SERVICE_MUX_SECTIONS_MAX = 4_096
LOG_SERVICE_MUX_BYTES_MAX = 16 * MiB
# A log server's owned logs re-checked (lease held, still ours, handed over to the
# server the hashing names now, closed ones forgotten): a log it closed answers
# "retry" until then, so a hand-over (to a restarted server) stalls its
# producers up to this long plus their back-off (bkctl bench log --kill-owner:
# 500 ms here left ~650 ms between the old owner's release and the new one's
# take-over).  Each check reads the live servers once (no read per log).
LOG_SERVICE_CHECK_INTERVAL_MS = 100
# The read cache reads the metadata of each log with waiting readers this often
# (a superseded writer's cache dropped): one metadata read per log per interval.
LOG_READ_CACHE_CHECK_INTERVAL_MS = 500
# A process's watch of the log servers' registrations (appliance.logs.server_watch)
# reads every record again at least this often, beside the store's change
# notices (a record deleted and created again between two looks): the longest
# a death is missed if a notice is.  Shorter: more metadata reads per process.
LOG_SERVER_WATCH_RESCAN_MS = 1_000
# ... and, on a store that has no change notices (SQLite: its own wait polls
# every 10 ms, 2% of a core per producer process measured here), reads the
# servers' names this often: a server's death is seen this much later at
# most.  Shorter: sooner, and more CPU in every process with a producer
# (measured: 100 ms ~0.5% of a core, 50 ms ~0.6%).
LOG_SERVER_WATCH_POLL_MS = 100
# Logs a log server takes over (or hands over) at once, on a pool of this
# many threads: a server asked for a thousand logs opens them this many at a
# time (each is metadata round trips and a segment recovery) and its loop
# keeps serving, pings included.  More: a burst of new logs opens sooner;
# costs a thread each and more contention for the loop.
LOG_SERVICE_OPENS_MAX = 8
# A log server that stops hands its logs over (what each holds is sent and
# acknowledged, its writer closed, its lease released) for this long at most;
# then it releases the leases of those left (their next owner recovers the
# segments).  Longer: a clean hand-over under slow bookies; shorter: a
# quicker stop.
LOG_SERVICE_HAND_OVER_MS = 10_000
# Requests for one log this server does not own wait (parked) for one lookup
# of its owner off the server's loop (appliance.logservice.routing); beyond
# this many they are answered "retry" at once.  More: fewer resends in a
# burst; costs memory per log looked up.
LOG_SERVICE_ROUTE_PARKED_MAX = 1_024
# The read cache ([log] read_cache_bytes, appliance.logservice.readcache): the
# owner keeps this many bytes of a log's most recent acknowledged records
# (per log with tailing readers) and serves them to the readers
# (appliance.logs.tail), so N tailing readers cost the bookies about one.
# More: a reader further behind is still served from memory; costs the
# server's memory per log read through it.
LOG_READ_CACHE_BYTES = 8 * MiB
LOG_READ_CACHE_IDLE_MS = 60_000  # a log's cache no reader asked for this long is dropped
LOG_READ_CACHE_WAITERS_MAX = 10_000  # long polls parked per server (beyond: read the bookies)
LOG_READ_CACHE_RECORDS_MAX = 4_096  # records in one read reply
LOG_READ_CACHE_REPLY_BYTES_MAX = 4 * MiB  # payload bytes in one read reply (one record beyond)
# A reader's long poll at the owner waits at most this long before it is
# answered (empty): the reader then asks again, so an owner that stopped
# answering (kill -9) is noticed within this plus the grace below.
LOG_READ_SERVICE_WAIT_MS_MAX = 1_000
LOG_READ_SERVICE_REPLY_GRACE_MS = 2_000  # beyond its wait: no answer means read the bookies
# A reader that read from the bookies (no owner, a cache miss, an owner that
# did not answer) asks the owner again after this long, and only at the tail.
LOG_READ_SERVICE_RECHECK_MS = 1_000
LOG_READ_SERVICE_REDIRECTS_MAX = 3  # "not owner" answers followed in one read
# Group commit of an owned log ([log] service_linger_us, service_entries_inflight):
# records that arrive while an entry awaits its ack wait for it, or for this
# long, whichever comes first, and then leave as one entry while fewer than
# LOG_SERVICE_ENTRIES_INFLIGHT entries await their ack.  Longer: fuller
# entries (less bookie CPU per record); shorter: less waiting per write.
LOG_SERVICE_LINGER_US = 2_000
LOG_SERVICE_ENTRIES_INFLIGHT = 2
# ... and records held while the log has no entry in flight wait this long at
# most for the producers just answered ([log] service_gather_us,
# appliance.protocol.gather): fuller entries from synchronous producers.
LOG_SERVICE_GATHER_US = 2_000
# An owned log's control entry ([log] service_control_interval_ms): once the
# log was idle this long after an entry was acknowledged, so readers of the
# bookies see its last records.  Readers through the service never wait for
# it (the owner's cache has every acknowledged record).  Shorter: readers of
# the bookies see the tail sooner; costs an entry per pause of every log (a
# thousand logs written now and then: one per entry at 2 ms).
LOG_SERVICE_CONTROL_INTERVAL_MS = 1_000

# -- cold storage ([cold_storage], appliance.cold) -----------------------------------
COLD_STORAGE_OFFLOAD_AFTER_MS = 3_600_000  # sealed segments older than this move by themselves
COLD_STORAGE_DELETE_AFTER_MS = 600_000  # a moved segment's ledger stays on the bookies this long
COLD_STORAGE_ORPHAN_GRACE_MS = 3_600_000  # an unrecorded cold file is removed once this old
COLD_CREDENTIALS_FILE_BYTES_MAX = 4 * KiB  # [cold_storage] credentials_file

# -- spark (appliance.spark) ------------------------------------------------------------
# Rows and payload bytes per Arrow record batch: bigger batches amortise the
# per-batch cost in the Python worker and the JVM; smaller ones bound memory.
# Bytes stay far below 2 GiB, the limit of binary's int32 offsets.
SPARK_BATCH_ROWS_MAX = 65_536
SPARK_BATCH_BYTES_MAX = 32 * MiB
SPARK_ENTRIES_PER_PARTITION_MAX = 250_000  # maxEntriesPerPartition: ~1-2 s of reading per task
SPARK_PARTITIONS_MAX = 100_000  # a bound on planning output (minPartitions cannot exceed it)
SPARK_RANGES_PER_PARTITION_MAX = 1_024  # small ledgers packed together, up to this many per task
# A streaming read keeps this many log entry headers (records per entry, txids)
# on the driver to plan its micro-batches without reading entries again.
SPARK_STREAM_HEADERS_CACHED = 65_536
# ... and the record positions (entry, slot, txid, size; no payloads) of this
# many cold segments, each loaded once from its file to cut batches inside it.
SPARK_STREAM_COLD_SEGMENTS_CACHED = 4
# ``read_log`` (Spark's own Parquet reader on cold files) remembers this many
# cold files it verified on the driver (by URI, size, modification time and
# the segment's checksums), so a file is read for its checksum once.
SPARK_COLD_FILES_VERIFIED_CACHED = 4_096

# -- re-replication (appliance.rereplication) -------------------------------------------
# One copy batch read from a surviving replica: entries and bytes bound the
# worker's memory per batch (not the client's reply cap, which is
# CLIENT_READ_BATCH_BYTES_MAX: a worker holds several batches in flight).
REREPLICATION_READ_BATCH_ENTRIES_MAX = 256
REREPLICATION_READ_BATCH_BYTES_MAX = 8 * MiB
REREPLICATION_WRITES_IN_FLIGHT_MAX = 4  # write batches sent to the replacement, not yet acked
REREPLICATION_REQUEST_TIMEOUT_MS = 10_000  # one read or write; a slower bookie counts as failed
REREPLICATION_REPLAN_TRIES_MAX = 3  # a ledger whose fragments keep changing under us is reported
REREPLICATION_REPLACEMENT_TRIES_MAX = 2  # replacements tried for one fragment before giving up
REREPLICATION_MARK_CREATE_TRIES_MAX = 5  # a copy mark's parent removed by a concurrent release
# The auditor's READ_LAC probe of one ledger at a bookie (no answer by then:
# unknown): longer spares a slow bookie, shorter finishes a check sooner.
AUTORECOVERY_PROBE_TIMEOUT_MS = 2_000

# -- supervisor ([supervisor]) ------------------------------------------------------------
SUPERVISOR_RESTART_BACKOFF_MAX_MS = 10_000  # longest wait before restarting a crashed bookie
SUPERVISOR_RESTARTS_MAX = 10  # restarts within restart_window_ms, then the bookie stays down
SUPERVISOR_PING_TIMEOUT_MS = 3_000  # a ping unanswered this long is a failure
SUPERVISOR_START_TIMEOUT_MS = 300_000  # a starting bookie's first INFO (journal replay included)
SUPERVISOR_STOP_TIMEOUT_MS = 10_000  # SIGTERM, then SIGKILL after this long
SUPERVISOR_REFUSAL_TAIL_BYTES_MAX = 8_192  # a bookie log tail read for its refusal line
SUPERVISOR_CONTROL_REQUESTS_PER_WAIT_MAX = 16  # operator requests taken per wake; more wait
SUPERVISOR_CONTROL_REQUEST_BYTES_MAX = 4_096  # an operator request is an op and an id
