#include "ps/shard_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "common/clock.h"
#include "common/partition.h"
#include "ps/checkpoint.h"
#include "ps/replica_sidecar.h"
#include "ps/shard_metrics.h"

namespace onlineps::ps {

namespace {

// Set while a request runs on the transport's I/O thread (Incoming::requeue): tables are
// asked not to wait for their locks, and a request that would have to sets
// t_would_block and goes to its peer's handler thread instead, unanswered and unchanged.
thread_local bool t_no_wait = false;
thread_local bool t_would_block = false;

Status WouldBlock() {
  t_would_block = true;
  return Unavailable("would wait for a table lock on the I/O thread (handed to a handler)");
}

// Ops that take locks held for long (the table map, every stripe for table_info, the
// replication log): never run on the I/O thread.
bool NeedsHandlerThread(Op op, bool replicated) {
  switch (op) {
    case Op::kCreateTable:
    case Op::kTableInfo:
    case Op::kReplicate:
    case Op::kReplSnapshot:
    case Op::kReplStatus:
      return true;
    case Op::kPullDense:
    case Op::kPullSparse:
    case Op::kPushDense:
    case Op::kPushSparse:
    case Op::kPushBatch:
      return replicated;  // logged in order under order_mu_
    default:
      return false;
  }
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Validates a float payload frame and returns its element count.
StatusOr<size_t> FloatCount(const Frames& frames, size_t index, const char* what) {
  if (frames.size() <= index) return Malformed(std::string("missing ") + what + " frame");
  int64_t n = frames[index].CountOf<float>();
  if (n < 0) {
    return Malformed(std::string(what) + " frame of " + std::to_string(frames[index].size()) +
                     " bytes is not a whole number of float32 values");
  }
  return static_cast<size_t>(n);
}

// A reply of `rows` sparse rows must fit in a message.
Status CheckRowsFit(size_t rows, uint32_t dim, size_t max_message_bytes) {
  if (rows * dim * sizeof(float) <= max_message_bytes) return Status::Ok();
  return TooLarge("pull of " + std::to_string(rows) + " rows x " + std::to_string(dim) +
                  " floats would exceed the message limit of " + std::to_string(max_message_bytes) +
                  " bytes; split it");
}

StatusOr<size_t> KeyCount(const Frames& frames) {
  if (frames.size() < 2) return Malformed("missing keys frame");
  int64_t n = frames[1].CountOf<uint64_t>();
  if (n < 0) {
    return Malformed("keys frame of " + std::to_string(frames[1].size()) +
                     " bytes is not a whole number of uint64 keys");
  }
  return static_cast<size_t>(n);
}

}  // namespace

ShardServer::ShardServer(ShardServerOptions options, std::shared_ptr<prometheus::Registry> registry)
    : options_(std::move(options)),
      registry_(std::move(registry)),
      metrics_(std::make_unique<Metrics>(*registry_)),
      dedup_(options_.max_senders),
      memory_(options_.max_memory_bytes),
      tables_(std::make_shared<const TableMap>()) {
  metrics_->SetMemory(memory_.limit(), 0);
  WatchersOptions wopts;
  wopts.max_watches = options_.max_watches;
  watchers_ = std::make_unique<Watchers>(
      wopts, [this] { return tables(); },
      [this](const std::string& peer, const Header& reply, Frames payload) {
        Header r = reply;
        if (replica_) r.epoch = replica_->epoch();  // clients fence answers by epoch
        SendReply(peer, r, std::move(payload));
      });
}

ShardServer::~ShardServer() { Stop(); }

std::string ShardServer::checkpoint_path() const {
  if (options_.checkpoint_dir.empty()) return "";
  return options_.checkpoint_dir + "/shard-" + std::to_string(options_.shard) + "-of-" +
         std::to_string(options_.num_shards) + ".ckpt";
}

void ShardServer::WarnOfOtherShardCounts() const {
  const std::string prefix = "shard-" + std::to_string(options_.shard) + "-of-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(options_.checkpoint_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || e.path().extension() != ".ckpt") continue;
    spdlog::warn(
        "starting empty: there is no {} in {}, but there is {}, written with another shard "
        "count. A restore cannot change the shard count (keys move between shards): start "
        "with the --num-shards it was written with to serve that state",
        std::filesystem::path(checkpoint_path()).filename().string(), options_.checkpoint_dir,
        name);
  }
}

std::shared_ptr<const ShardServer::TableMap> ShardServer::tables() const {
  return std::atomic_load(&tables_);
}

std::shared_ptr<Table> ShardServer::FindTable(const std::string& name) const {
  auto snapshot = tables();
  auto it = snapshot->find(name);
  return it == snapshot->end() ? nullptr : it->second;
}

StatusOr<std::string> ShardServer::Start() {
  if (options_.shard >= options_.num_shards) {
    return InvalidArgument("shard index " + std::to_string(options_.shard) +
                           " must be below the shard count " + std::to_string(options_.num_shards));
  }
  const std::string path = checkpoint_path();
  if (!path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.checkpoint_dir, ec);
    if (ec) return Unavailable("cannot create " + options_.checkpoint_dir + ": " + ec.message());
    // One process per checkpoint file: two shards on one file each overwrite the other's
    // checkpoints (an empty one replaced a full one). Creating the lock file also tells a
    // read-only directory now, not at the first checkpoint.
    auto lock =
        FileLock::Acquire(path + ".lock", "checkpoint directory " + options_.checkpoint_dir +
                                              " as shard " + std::to_string(options_.shard) +
                                              " of " + std::to_string(options_.num_shards));
    if (!lock.ok()) return lock.status();
    checkpoint_lock_.emplace(std::move(*lock));
    // A write that died with its process leaves its temporary file, which only a write of
    // the same file would replace: a delta's may never come again. Under the lock no
    // write of this shard's files is under way.
    for (const std::string& f : LeftoverTempFiles(path)) {
      if (std::filesystem::remove(f, ec); ec) {
        spdlog::warn("cannot remove {}, left by a checkpoint write that did not finish: {}", f,
                     ec.message());
      } else {
        spdlog::warn("removed {}, left by a checkpoint write that did not finish", f);
      }
    }
  }
  bool restored = false;
  std::string tip;  // the last file of the restored checkpoint chain
  bool have_checkpoint = false;
  if (!path.empty() && options_.restore) {
    std::error_code ec;
    have_checkpoint = std::filesystem::exists(path, ec);
    if (ec) return Unavailable("cannot look for the checkpoint " + path + ": " + ec.message());
    // A link to nothing (a volume not mounted): starting empty would serve none of the
    // shard's state and replace the link at the first checkpoint.
    if (!have_checkpoint && std::filesystem::is_symlink(path, ec)) {
      const std::filesystem::path target = std::filesystem::read_symlink(path, ec);
      return FailedPrecondition("the checkpoint " + path + " is a link to " + target.string() +
                                ", which does not exist (is its volume mounted?); fix or "
                                "remove the link to start this shard");
    }
    // Deltas hold only the changes since the full file: without it they cannot be
    // restored, and starting empty would delete them at the first checkpoint.
    if (!have_checkpoint) {
      if (const std::vector<DeltaFile> orphans = DeltaFiles(path); !orphans.empty()) {
        return DataLoss("the checkpoint " + path + " is missing but " +
                        std::to_string(orphans.size()) + " delta(s) after it remain (" +
                        orphans.front().path +
                        "): they hold only the changes since that file. Put the file back, or "
                        "move the deltas away to start this shard empty (--no-restore starts it "
                        "empty and removes them at its first checkpoint)");
      }
    }
  }
  if (!have_checkpoint && !path.empty() && options_.restore) WarnOfOtherShardCounts();
  if (have_checkpoint) {
    restored = true;
    auto restored = RestoreCheckpoint(path, {options_.shard, options_.num_shards}, &dedup_);
    if (!restored.ok()) return restored.status();
    spdlog::info("restored {} table(s) from {}{}", restored->tables.size(), path,
                 restored->deltas == 0 ? std::string()
                                       : fmt::format(" and {} delta(s) after it, up to {}",
                                                     restored->deltas, restored->tip));
    for (const std::string& f : restored->stale) {  // last first
      std::error_code ec;
      std::filesystem::remove(f, ec);
      spdlog::warn("removed {}: a delta that does not continue the checkpoint chain{}", f,
                   ec ? " (could not: " + ec.message() + "; the ones before it are left too)" : "");
      // The rest stay: removing them past one that stays would leave a gap, which the
      // next start refuses as damage, where the prefix left now is removed again.
      if (ec) break;
    }
    tip = restored->tip;
    {
      MutexLock lock(&ckpt_mu_);
      chain_ = {restored->tip_trailer, restored->tip, restored->deltas, restored->base_bytes,
                restored->delta_bytes};
    }
    metrics_->SetCheckpointDeltas(restored->deltas);
    std::atomic_store(&tables_, std::shared_ptr<const TableMap>(
                                    std::make_shared<TableMap>(std::move(restored->tables))));
  }
  if (memory_.enabled()) {
    memory_.Measure([this] { return TableBytes(); });
    metrics_->SetMemory(memory_.limit(), memory_.used());
    if (!memory_.Fits(0)) WarnOverBudget();
  }
  if (options_.replication.members.size() >= 2) {
    ONLINEPS_RETURN_IF_ERROR(MakeReplica(restored, tip));
  }
  TransportOptions topts;
  topts.handler_threads = options_.handler_threads;
  topts.mem_run_on_sender = options_.run_on_sender;
  // A sender that waits for its answer anyway may run requests of any size.
  if (options_.run_on_sender) topts.inline_max_bytes = topts.max_message_bytes;
  topts.max_message_bytes = options_.max_message_bytes * 2;
  topts.curve = options_.curve;
  transport_ = NewServerTransport(options_.listen, topts);
  ckpt_queue_ = std::make_unique<CheckpointQueue>(
      [this] {
        StatusOr<std::string> written = Checkpoint();
        // One run answers every request it coalesced: logged once here, not per reply.
        if (!written.ok()) {
          spdlog::error("requested checkpoint failed: {}", written.status().ToString());
        }
        return written;
      },
      [this](const std::string& peer, const Header& h, const StatusOr<std::string>& path) {
        Header reply = MakeReply(h, Status::Ok());
        if (path.ok()) {
          reply.message = *path;
        } else if (path.status().code() == StatusCode::kUnavailable && !stopping_) {
          // A volume problem is not transient the way "draining" is: answer it as such,
          // so the client reports it instead of retrying UNAVAILABLE until its deadline.
          reply = MakeReply(
              h, FailedPrecondition("checkpoint not written: " + path.status().message()));
        } else {
          reply = MakeReply(h, path.status());
        }
        if (replica_) reply.epoch = replica_->epoch();
        SendReply(peer, reply, {});
      });
  auto bound = transport_->Start(options_.listen, [this](Incoming&& in) { Handle(std::move(in)); });
  if (!bound.ok()) return bound.status();
  if (replica_) {
    ONLINEPS_RETURN_IF_ERROR(replica_->Start());
    if (!path.empty()) {
      // From now on a crash is not a clean stop: the next start takes a new incarnation.
      std::error_code ec;
      const uint64_t bytes = restored ? std::filesystem::file_size(tip, ec) : 0;
      WriteSidecar(/*clean=*/false, restored ? tip : path, ec ? 0 : bytes, replica_->position());
    }
  }
  {
    MutexLock lock(&maint_mu_);
    started_ = true;
  }
  maintenance_.Start(
      std::chrono::milliseconds(options_.maintenance_interval_ms),
      [this, last_ckpt = NowMs(), last_stats = uint64_t{0}]() mutable {
        MaintenanceTick(&last_ckpt, &last_stats);
      },
      /*tick_first=*/false);
  if (!options_.checkpoint_dir.empty()) {
    metrics_->SetCheckpointPolicy(static_cast<double>(options_.checkpoint_interval_s));
  }
  ready_ = true;
  metrics_->SetReady(true);
  spdlog::info("shard {}/{} serving on {}", options_.shard, options_.num_shards, *bound);
  return bound;
}

void ShardServer::WarnOverBudget() const {
  // Started rather than refused: the state is intact and every pull and push to an
  // existing row can be served, where a refusal would leave the workers nothing (and,
  // with the budget from the cgroup limit, a pod whose limit was lowered would restart
  // for ever). What the operator must do is named here and alerted on (the gauges).
  std::string largest;
  uint64_t largest_bytes = 0;
  const std::shared_ptr<const TableMap> snapshot = tables();
  for (const auto& [name, t] : *snapshot) {
    const uint64_t bytes = t->Stats().memory_bytes;
    if (bytes <= largest_bytes) continue;
    largest = name;
    largest_bytes = bytes;
  }
  spdlog::warn(
      "the restored tables hold {} bytes ({} MiB), over the memory budget of {} bytes ({} MiB, "
      "--max-memory-mb) by {} bytes; the largest is '{}' with {} bytes. Serving: pulls and "
      "pushes to existing rows go on, but new tables and pushes creating sparse rows are "
      "refused until rows expire or are evicted, or the budget is raised "
      "(onlineps_ps_memory_used_bytes > onlineps_ps_memory_budget_bytes: alert "
      "OnlinepsShardOverMemoryBudget)",
      memory_.used(), memory_.used() >> 20, memory_.limit(), memory_.limit() >> 20,
      memory_.used() - memory_.limit(), largest, largest_bytes);
}

Status ShardServer::MakeReplica(bool restored, const std::string& tip) {
  RestoredReplica r;
  r.restored = restored;
  const std::string path = checkpoint_path();
  if (restored) {
    auto side = ReadReplicaSidecar(path + ".replica");
    std::error_code ec;
    const uint64_t bytes = std::filesystem::file_size(tip, ec);
    if (side.ok()) {
      r.incarnation = side->incarnation;
      r.log_epoch = side->log_epoch;
      r.lsn = side->lsn;
      r.epoch = side->epoch;  // an epoch it saw, whatever checkpoint the sidecar describes
      const bool describes_this_file = !ec && side->checkpoint_bytes == bytes &&
                                       side->checkpoint_checksum == CheckpointTrailer(tip);
      // Only a clean stop's checkpoint holds exactly what its replica acknowledged: the
      // sidecar must say so and describe this very file (the chain's last).
      r.exact = side->clean && side->checkpoint_checksum != 0 && describes_this_file;
      if (r.exact) {
        // From now on a crash is not a clean stop. If that cannot be recorded, a later
        // restart could keep this incarnation with a stale state: take a new one now.
        ReplicaSidecar unclean = *side;
        unclean.clean = false;
        Status st = WriteReplicaSidecar(path + ".replica", unclean);
        if (!st.ok()) {
          spdlog::warn(
              "cannot mark the replica sidecar unclean ({}); restarting as a new "
              "replica that reloads from the primary",
              st.ToString());
          r.exact = false;
        }
      }
      if (!describes_this_file) {
        // Written for another checkpoint (a copy restored from a backup, or a crash
        // between a checkpoint and its sidecar): its position may be newer or older than
        // this file's. Trusted, an old copy ranked as new won an unclean election and
        // overwrote a replica holding more; unknown, it ranks below every known position.
        spdlog::warn(
            "replica sidecar {}.replica describes another checkpoint than {} (epoch {}, lsn {}): "
            "this replica's place in the group's history is unknown; it ranks last in an "
            "unclean election and reloads from the primary",
            path, tip, r.log_epoch, r.lsn);
        r.log_epoch = 0;
        r.lsn = 0;
      }
      spdlog::info("replica state of the checkpoint: epoch {}, lsn {}, {}", r.log_epoch, r.lsn,
                   r.exact ? "clean stop (keeps its place in the ISR)"
                           : "not a clean stop (reloads from the primary)");
    } else if (!options_.replication.accept_unknown_position) {
      // Without it the checkpoint's data ranked as empty: a replica that alone held the
      // newest updates (stopped cleanly, the only in-sync one) lost them to an older one.
      return FailedPrecondition(
          "the checkpoint " + tip + " holds data but its replica sidecar " + path +
          ".replica, which records its place in the group's history, " +
          (side.status().code() == StatusCode::kNotFound
               ? std::string("is missing")
               : "cannot be used (" + side.status().message() + ")") +
          ". Restore the sidecar written with this checkpoint; or start with "
          "--replica-accept-unknown-position (this replica's data then ranks below every "
          "replica whose position is known: for a first start with --replicas on an "
          "unreplicated shard's checkpoint, or to let it re-sync from the group)");
    } else {
      spdlog::warn(
          "{}; starting as --replica-accept-unknown-position says: this replica's data "
          "ranks last and it reloads from the primary",
          side.status().ToString());
    }
  }
  Replica::Hooks hooks;
  hooks.snapshot = [this](uint64_t* lsn) { return Snapshot(lsn); };
  hooks.load = [this](const std::string& bytes) { return LoadSnapshot(bytes); };
  hooks.apply = [this](const Header& h, const Frames& f) { return ApplyReplicated(h, f); };
  ReplicationOptions ropts = options_.replication;
  ropts.shard = options_.shard;
  ropts.num_shards = options_.num_shards;
  ropts.transport.curve = options_.curve;  // replicas share the shard's key pair
  if (ropts.transport.curve.server_public_key.empty()) {
    ropts.transport.curve.server_public_key = options_.curve.public_key;
  }
  ropts.transport.max_message_bytes = options_.max_message_bytes * 2;
  replica_ = std::make_unique<Replica>(std::move(ropts), std::move(hooks), r);
  return Status::Ok();
}

void ShardServer::WriteSidecar(bool clean, const std::string& file, uint64_t checkpoint_bytes,
                               std::pair<uint64_t, uint64_t> position) {
  ReplicaSidecar side;
  side.incarnation = replica_->incarnation();
  side.log_epoch = position.first;
  side.lsn = position.second;
  side.clean = clean;
  side.checkpoint_bytes = checkpoint_bytes;
  side.checkpoint_checksum = CheckpointTrailer(file);
  side.epoch = replica_->highest_epoch();
  Status st = WriteReplicaSidecar(checkpoint_path() + ".replica", side);
  if (!st.ok()) spdlog::error("replica sidecar not written: {}", st.ToString());
}

Status ShardServer::Readiness() const {
  if (!ready_) return Unavailable("shard is starting, restoring or draining");
  if (replica_ && !replica_->InSync()) {
    return Unavailable(
        "replica is not in the in-sync replica set yet (catching up from the "
        "primary, or no primary: see onlineps_ps_replica metrics)");
  }
  return Status::Ok();
}

bool ShardServer::ReplicationAllowed(const std::string& client_key) const {
  if (!options_.curve.enabled()) return true;
  if (client_key == options_.curve.public_key) return true;
  return std::find(options_.replica_keys.begin(), options_.replica_keys.end(), client_key) !=
         options_.replica_keys.end();
}

void ShardServer::Stop() {
  {
    MutexLock lock(&maint_mu_);
    if (!started_ || stopping_.exchange(true)) return;
  }
  ready_ = false;
  metrics_->SetReady(false);
  maintenance_.Stop();
  if (replica_) replica_->Stop();  // backups take over; waiting replies say NOT_PRIMARY
  ReleaseHeld(/*all=*/true);
  watchers_->Stop();  // watchers get the current versions and watch the next primary
  if (ckpt_queue_)
    ckpt_queue_->Stop();  // the checkpoint under way ends; later requests are refused
  transport_->Stop();     // handles what is queued, then flushes replies
  if (!options_.checkpoint_dir.empty()) {
    auto st = Checkpoint();
    if (!st.ok()) {
      final_checkpoint_failed_ = true;
      spdlog::error("final checkpoint failed: {}", st.status().ToString());
    } else if (replica_) {
      // Replication stopped before this checkpoint: it holds exactly what this replica
      // acknowledged, so a restart may keep its incarnation.
      // Not when its state is one no history can continue (an update applied after it
      // stopped leading, or a re-sync cut short): then it restarts as a new replica.
      std::error_code ec;
      const uint64_t bytes = std::filesystem::file_size(*st, ec);
      if (!ec && replica_->ExactState()) {
        WriteSidecar(/*clean=*/true, *st, bytes, replica_->position());
      }
    }
  }
  checkpoint_lock_.reset();  // nothing more is written: another process may take over
  spdlog::info("shard {}/{} stopped", options_.shard, options_.num_shards);
}

StatusOr<std::string> ShardServer::Checkpoint(bool skip_if_unchanged) {
  const std::string path = checkpoint_path();
  if (path.empty()) return FailedPrecondition("no checkpoint directory configured");
  MutexLock lock(&ckpt_mu_);
  auto t0 = std::chrono::steady_clock::now();
  if (skip_if_unchanged && chain_.tip_trailer != 0 && !force_full_checkpoint_ &&
      updates_.load() == chain_.updates) {
    // No push or table creation since the last cut (a push counts itself before it
    // changes anything), and no row dropped since: the files are the state as of now.
    // An idle shard writes nothing, and its checkpoint age stays fresh.
    const ChangeStats c = ChangesOf(*tables());
    if (c.changed_rows == 0 && c.dropped_rows == 0 && !c.overflow) {
      metrics_->CheckpointCurrent();
      return chain_.tip;
    }
  }
  ShardSnapshot snap;
  double pause_s = 0;
  bool full = true;
  ChangeStats changes;
  uint64_t updates = 0;
  std::pair<uint64_t, uint64_t> position;  // the replica's, at the cut
  PrepareSnapshots();
  {
    // Pushes pause only while the snapshot is cut (O(stripes), not O(rows)): the file
    // then holds exactly the pushes its dedup windows say were applied, and is written
    // below while pushes go on.
    const auto gate_t0 = std::chrono::steady_clock::now();
    WriterLock gate(&apply_gate_);
    auto current = tables();
    changes = ChangesOf(*current);
    updates = updates_.load();
    // What the file holds: read after it was written, pushes logged meanwhile were named
    // in the sidecar, which then ranked this replica above one that held them.
    if (replica_) position = replica_->position();
    full = force_full_checkpoint_.exchange(false) || WantFullCheckpoint(changes);
    snap = SnapshotShard({options_.shard, options_.num_shards}, *current, dedup_,
                         full ? SnapshotKind::kFull : SnapshotKind::kDelta);
    pause_s = SecondsSince(gate_t0);
  }
  snap.seq = full ? 0 : chain_.deltas + 1;
  snap.prev_trailer = full ? 0 : chain_.tip_trailer;
  const std::string file = full ? path : DeltaPath(path, snap.seq);
  uint64_t trailer = 0;
  StatusOr<uint64_t> bytes = WriteSnapshot(file, &snap, &trailer);
  snap = ShardSnapshot{};  // ends the snapshot: updates stop preserving rows
  metrics_->CountCheckpoint(bytes.ok(), SecondsSince(t0), bytes.ok() ? *bytes : 0);
  if (!bytes.ok()) {
    // The cut started new change sets: what this file was to hold is in no file.
    force_full_checkpoint_ = true;
    return bytes.status();
  }
  if (full) {
    // The deltas of the chain before it end with it, removed last first: a crash in
    // between leaves PATH.d1 ... PATH.dK, whose first names the old file, so a restore
    // stops at it and removes them all (a gap would be refused as damage).
    const std::vector<DeltaFile> old = DeltaFiles(path);
    for (auto f = old.rbegin(); f != old.rend(); ++f) {
      std::error_code ec;
      std::filesystem::remove(f->path, ec);
      if (ec) {
        // The ones before it stay too: a gap would be refused at the next start, where
        // the prefix left now is removed with a warning.
        spdlog::warn("cannot remove the old delta {}: {}; the ones before it are left too", f->path,
                     ec.message());
        break;
      }
    }
    chain_ = {trailer, file, 0, *bytes, 0, updates};
  } else {
    chain_.updates = updates;
    chain_.tip_trailer = trailer;
    chain_.tip = file;
    ++chain_.deltas;
    chain_.delta_bytes += *bytes;
  }
  metrics_->SetCheckpointDeltas(chain_.deltas);
  if (replica_) WriteSidecar(/*clean=*/false, file, *bytes, position);
  if (full) {
    spdlog::info("checkpoint {} ({} bytes, {:.3f} s, pushes paused {:.1f} ms)", file, *bytes,
                 SecondsSince(t0), pause_s * 1e3);
  } else {
    spdlog::info(
        "checkpoint {} ({} bytes, {:.3f} s, pushes paused {:.1f} ms; delta {} of the chain: {} "
        "of {} rows changed, {} dropped)",
        file, *bytes, SecondsSince(t0), pause_s * 1e3, chain_.deltas, changes.changed_rows,
        changes.rows, changes.dropped_rows);
  }
  return file;
}

ChangeStats ShardServer::ChangesOf(const TableMap& tables) {
  ChangeStats c;
  for (const auto& [name, t] : tables) c += t->Changes();
  return c;
}

bool ShardServer::WantFullCheckpoint(const ChangeStats& changes) {
  return options_.checkpoint_full_every <= 1 || chain_.tip_trailer == 0 ||
         chain_.deltas + 2 > options_.checkpoint_full_every ||
         chain_.delta_bytes >= chain_.base_bytes || changes.overflow || changes.rows == 0 ||
         changes.changed_rows + changes.dropped_rows > changes.rows / 2;
}

void ShardServer::Handle(Incoming&& in) {
  auto t0 = std::chrono::steady_clock::now();
  Header reply;
  Frames payload;
  bool held = false;
  uint64_t commit_lsn = 0;
  size_t bytes = 0;
  for (const Frame& f : in.frames) bytes += f.size();
  Status st;
  Header req;
  if (in.frames.empty()) {
    st = Malformed("empty message");
  } else {
    // The header is decoded first so that every refusal below can echo the request id.
    auto decoded = DecodeHeader(in.frames[0].data(), in.frames[0].size());
    if (!decoded.ok()) {
      st = decoded.status();
    } else if (req = std::move(decoded).value(); bytes > options_.max_message_bytes) {
      st = TooLarge("message of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                    std::to_string(options_.max_message_bytes));
    } else if ((req.op == Op::kReplicate || req.op == Op::kReplSnapshot ||
                req.op == Op::kReplStatus) &&
               !ReplicationAllowed(in.client_key)) {
      // Only the replicas of this shard hold its key (or one of --replica-keys).
      st = FailedPrecondition(
          "replication messages are accepted only from this shard's replicas (CURVE key " +
          (in.client_key.empty() ? std::string("unknown") : in.client_key) +
          " is not one of theirs)");
    } else {
      t_no_wait = static_cast<bool>(in.requeue);
      st = Dispatch(req, in.frames, &reply, &payload, in.peer, &held, &commit_lsn);
      t_no_wait = false;
      if (t_would_block) {
        t_would_block = false;
        auto requeue = std::move(in.requeue);
        requeue(std::move(in));  // counted and timed when it runs there
        return;
      }
    }
  }
  metrics_->CountRequest(req.op, st.code());
  if (!st.ok()) {
    spdlog::debug("{} from peer failed: {}", OpName(req.op), st.ToString());
    const std::optional<uint32_t> primary = reply.primary;  // set with NOT_PRIMARY
    reply = MakeReply(req, st);
    reply.primary = primary;
    payload.clear();
  }
  if (replica_) reply.epoch = replica_->epoch();
  if (!held && st.ok() && commit_lsn != 0) {
    // Sync replication: the reply waits until the backups have the update.
    replica_->WhenCommitted(commit_lsn, [this, req, peer = in.peer, reply,
                                         payload = std::move(payload)](const Status& cst) {
      Header r = cst.ok() ? reply : MakeReply(req, cst);
      r.epoch = reply.epoch;
      SendReply(peer, r, cst.ok() ? payload : Frames{});
    });
  } else if (!held) {
    SendReply(in.peer, reply, std::move(payload));
  }
  metrics_->ObserveDuration(req.op, SecondsSince(t0));
}

Status ShardServer::Dispatch(const Header& h, const Frames& frames, Header* reply, Frames* out,
                             std::string_view peer, bool* held, uint64_t* commit_lsn) {
  *reply = MakeReply(h, Status::Ok());
  if (t_no_wait && NeedsHandlerThread(h.op, replica_ != nullptr)) return WouldBlock();
  switch (h.op) {
    case Op::kPing:
      reply->spec = {{"shard", std::to_string(options_.shard)},
                     {"num_shards", std::to_string(options_.num_shards)},
                     {"ready", ready_ ? "true" : "false"}};
      if (replica_) reply->spec["role"] = replica_->primary() ? "primary" : "backup";
      return Status::Ok();
    case Op::kReplicate:
    case Op::kReplSnapshot:
    case Op::kReplStatus:
      if (!replica_) return FailedPrecondition("this shard is not replicated (no --replicas)");
      replica_->Handle(h, frames, reply);  // the reply carries its own code, epoch and state
      return Status::Ok();
    default:
      break;
  }
  if (replica_ && h.op != Op::kCheckpoint) {
    ONLINEPS_RETURN_IF_ERROR(replica_->CheckPrimary(h.epoch, &reply->primary));
  }
  switch (h.op) {
    case Op::kCreateTable: {
      if (!replica_) return CreateTable(h, reply).status();
      MutexLock order(&order_mu_);
      ONLINEPS_ASSIGN_OR_RETURN(const Created created, CreateTable(h, reply, /*from_log=*/false));
      *commit_lsn = created == Created::kNew ? replica_->Append(frames) : replica_->last_lsn();
      return Status::Ok();
    }
    case Op::kTableInfo:
      return Info(h, reply);
    case Op::kWatch:
      // Answered by watchers_, now or when a named table changes.
      ONLINEPS_RETURN_IF_ERROR(watchers_->Watch(std::string(peer), h, NowMs()));
      *held = true;
      return Status::Ok();
    case Op::kCheckpoint:
      if (checkpoint_path().empty())
        return FailedPrecondition("no checkpoint directory configured");
      // Answered by ckpt_queue_ once written: queued at once, so this op never holds the
      // I/O thread or a handler lane, inline or not.
      ONLINEPS_RETURN_IF_ERROR(ckpt_queue_->Add(std::string(peer), h));
      *held = true;
      return Status::Ok();
    case Op::kPushBatch:
      return DispatchBatch(h, frames, reply, out, peer, commit_lsn);
    case Op::kReply:
      return UnknownOp("a shard does not accept replies");
    default:
      if (IsWorkerOp(h.op)) {
        return UnknownOp(std::string(OpName(h.op)) + " is a worker op; this is a PS shard");
      }
      if (h.op == Op::kGroupSumFloats || h.op == Op::kGroupMinU64) {
        return UnknownOp(std::string(OpName(h.op)) +
                         " is a local group op (sent to a group leader); this is a PS shard");
      }
      break;
  }
  std::shared_ptr<Table> t = FindTable(h.table);
  if (t == nullptr) return NotFound("unknown table '" + h.table + "'");
  switch (h.op) {
    case Op::kPullDense:
      if (t->spec().kind != TableKind::kDense) {
        return InvalidArgument("table '" + h.table + "' is sparse; use pull_sparse");
      }
      return PullMaybeLogged(h, frames, *t, reply, out);
    case Op::kPullSparse:
      if (t->spec().kind != TableKind::kSparse) {
        return InvalidArgument("table '" + h.table + "' is dense; use pull_dense");
      }
      return PullMaybeLogged(h, frames, *t, reply, out);
    case Op::kPushDense:
    case Op::kPushSparse: {
      const bool dense = h.op == Op::kPushDense;
      if ((t->spec().kind == TableKind::kDense) != dense) {
        return InvalidArgument("table '" + h.table + "' is " +
                               (dense ? "sparse; use push_sparse" : "dense; use push_dense"));
      }
      bool hold = false, applied = false, evicted = false;
      // RETURN_VALUES: read while the push holds its locks, so no other lock is waited for.
      std::vector<float> after;
      std::vector<float>* values_after = (h.flags & kFlagReturnValues) ? &after : nullptr;
      if (replica_) {
        ONLINEPS_RETURN_IF_ERROR(
            ApplyLogged(h, frames, t, reply, &hold, commit_lsn, &evicted, values_after));
      } else {
        ONLINEPS_RETURN_IF_ERROR(
            Push(h, frames, t, reply, &hold, &applied, &evicted, values_after));
      }
      // The pusher learns the new version from this reply; other watchers get a notice.
      // Rows the push evicted are news to the pusher too, and so are the rows of others'
      // pushes it applied with its own (accumulation): its watch is answered as well.
      const bool others = evicted || (t->spec().accumulate > 1 && !reply->queued);
      watchers_->Changed(h.table, others ? std::string_view() : peer);
      if (values_after != nullptr) {
        if (!after.empty()) {
          out->push_back(Frame::FromVector(std::move(after)));
        } else {
          ONLINEPS_RETURN_IF_ERROR(AppendValues(h, frames, *t, out));
        }
      }
      if (hold) {
        *held = true;
        if (replica_) reply->epoch = replica_->epoch();
        Frames reply_frames{Frame::FromString(EncodeHeader(*reply))};
        for (const Frame& f : *out) reply_frames.push_back(f);
        // Saturated: a timeout near 2^64 ("never") would wrap to a deadline already past.
        const uint64_t now = NowMs(), timeout = t->spec().block_timeout_ms;
        Held held_reply{t, h.sender, std::string(peer), std::move(reply_frames),
                        timeout > UINT64_MAX - now ? UINT64_MAX : now + timeout};
        if (*commit_lsn == 0) {
          HoldReply(std::move(held_reply));
        } else {
          replica_->WhenCommitted(*commit_lsn, [this, h, held_reply](const Status& st) {
            if (st.ok()) return HoldReply(held_reply);
            SendReply(held_reply.peer, MakeReply(h, st), {});
          });
        }
      }
      return Status::Ok();
    }
    default:
      return UnknownOp("op not served by a shard");
  }
}

Status ShardServer::DispatchBatch(const Header& h, const Frames& frames, Header* reply, Frames* out,
                                  std::string_view peer, uint64_t* commit_lsn) {
  if (h.shape.empty() || h.shape.size() > kMaxBatchPushes) {
    return Malformed("push_batch: shape must count the frames of 1 to " +
                     std::to_string(kMaxBatchPushes) + " sub-pushes, it has " +
                     std::to_string(h.shape.size()) + " entries");
  }
  for (uint64_t k : h.shape) {
    if (k == 0 || k > 3)
      return Malformed("push_batch: a sub-push has 1 to 3 frames, not " + std::to_string(k));
  }
  StatusOr<std::vector<Frames>> subs = SplitFrameGroups(h.shape, frames);
  if (!subs.ok()) return subs.status().WithContext("push_batch");
  // RETURN_VALUES of a duplicate reads the table whatever values it carries: what the
  // sub-pushes may read back together must fit in one reply, as a pull's rows must (the
  // sub-pushes of a batch that is not refused carry at least as many values).
  uint64_t reply_floats = 0;
  for (const Frames& sub : *subs) {
    auto decoded = DecodeHeader(sub[0].data(), sub[0].size());
    if (!decoded.ok() || !(decoded->flags & kFlagReturnValues)) continue;
    const std::shared_ptr<Table> t = FindTable(decoded->table);
    if (t == nullptr) continue;
    if (t->spec().kind == TableKind::kDense) {
      reply_floats += t->local_elements();
    } else if (sub.size() >= 2 && sub[1].CountOf<uint64_t>() > 0) {
      reply_floats += static_cast<uint64_t>(sub[1].CountOf<uint64_t>()) * t->spec().dim;
    }
  }
  if (reply_floats * sizeof(float) > options_.max_message_bytes) {
    return TooLarge("push_batch: the values its sub-pushes ask back (" +
                    std::to_string(reply_floats) + " floats) would exceed the message limit of " +
                    std::to_string(options_.max_message_bytes) + " bytes; split it");
  }
  if (t_no_wait && subs->size() > 1) {
    // On the I/O thread a later sub-push may find a lock taken and send the whole message
    // to a handler thread, where it runs again: the sub-pushes applied here are then
    // answered as duplicates, but one without a seq (dedup off) would apply twice. Such
    // a batch goes to the handler thread before anything is applied.
    for (const Frames& sub : *subs) {
      auto decoded = DecodeHeader(sub[0].data(), sub[0].size());
      if (decoded.ok() && decoded->seq == 0) return WouldBlock();
    }
  }
  // A sub-push without a seq was applied: a resend of the whole message would apply it
  // again, so a later retryable refusal is answered in that sub-push's own reply.
  bool applied_without_seq = false;
  for (const Frames& sub : *subs) {
    Header sub_reply;
    Frames sub_out;
    Status st;
    auto decoded = DecodeHeader(sub[0].data(), sub[0].size());
    if (!decoded.ok()) {
      st = decoded.status().WithContext("push_batch sub-push header");
    } else if (decoded->op != Op::kPushDense && decoded->op != Op::kPushSparse) {
      st = InvalidArgument("push_batch holds push_dense and push_sparse only, not " +
                           std::string(OpName(decoded->op)));
    } else if (auto t = FindTable(decoded->table); t != nullptr && HoldsReplies(t->spec())) {
      // A held reply answers one request; a batch's answer cannot wait for one part.
      st = InvalidArgument("table '" + decoded->table +
                           "' holds replies (block bound mode): push it on its own, not in "
                           "push_batch");
    } else {
      decoded->epoch = h.epoch;  // the client fences the whole message
      bool held = false;
      uint64_t lsn = 0;
      st = Dispatch(*decoded, sub, &sub_reply, &sub_out, peer, &held, &lsn);
      // Handed to a handler thread: the whole message goes; what was applied already
      // is answered there as a duplicate.
      if (t_would_block) return st;
      // Retryable: the client resends the whole message (applied parts are duplicates).
      const bool retryable =
          st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kNotPrimary;
      if (retryable && !applied_without_seq) {
        reply->primary = sub_reply.primary;
        return st;
      }
      if (st.ok() && decoded->seq == 0) applied_without_seq = true;
      *commit_lsn = std::max(*commit_lsn, lsn);
    }
    // Sub-pushes count under their own op (the message under push_batch), refused or not.
    if (decoded.ok() && (decoded->op == Op::kPushDense || decoded->op == Op::kPushSparse)) {
      metrics_->CountRequest(decoded->op, st.code());
    }
    if (!st.ok()) {
      sub_reply = MakeReply(decoded.ok() ? *decoded : Header{}, st);
      sub_out.clear();
    }
    reply->shape.push_back(1 + sub_out.size());
    out->push_back(Frame::FromString(EncodeHeader(sub_reply)));
    for (Frame& f : sub_out) out->push_back(std::move(f));
  }
  return Status::Ok();
}

StatusOr<ShardServer::Created> ShardServer::CreateTable(const Header& h, Header* reply,
                                                        bool from_log) {
  auto spec = DecodeSpec(h.spec);
  if (!spec.ok()) return spec.status();
  MutexLock lock(&tables_mu_);
  auto current = tables();
  auto it = current->find(spec->name);
  if (it != current->end()) {
    const TableSpec& have = it->second->spec();
    if (have.base != spec->base) {
      return FailedPrecondition("table '" + spec->name + "' belongs to frozen base " +
                                DescribeBase(have.base) + ", the caller's model has frozen base " +
                                DescribeBase(spec->base) +
                                ": every worker must load the same frozen weights (model file)");
    }
    if (have == *spec) {
      reply->version = it->second->version();
      reply->message = "exists";
      return Created::kExisted;
    }
    if (EqualExceptCaps(have, *spec)) {
      reply->version = it->second->version();
      reply->message = "exists with other caps, kept: " + DescribeCaps(have) + " (asked " +
                       DescribeCaps(*spec) + ")";
      spdlog::warn("create_table '{}': {}", spec->name, reply->message);
      return Created::kExisted;
    }
    return AlreadyExists("table '" + spec->name +
                         "' exists with a different spec: " + DescribeSpecDifference(have, *spec));
  }
  // A dense table is allocated whole (and filled) here: past the budget it is refused
  // before, not found out by the kernel's OOM killer later. A sparse table starts empty
  // (its rows are refused instead); a backup creates what its primary created.
  uint64_t initial = 0;
  if (memory_.enabled()) {
    ONLINEPS_ASSIGN_OR_RETURN(initial,
                              Table::InitialBytes(*spec, options_.shard, options_.num_shards));
  }
  // Reserved until the table is in the map, so that pushes creating rows meanwhile do
  // not count on the same bytes. A backup counts what its primary created.
  const uint64_t reserved = from_log ? 0 : initial;
  if (reserved != 0 && !ReserveMeasured(reserved)) {
    metrics_->CountMemoryRefusal(Op::kCreateTable);
    return ResourceExhausted(
        "table '" + spec->name + "' would hold " + std::to_string(initial) +
        " bytes on this shard from its creation, past the shard's memory budget of " +
        std::to_string(memory_.limit()) + " bytes (--max-memory-mb), of which " +
        std::to_string(memory_.used()) +
        " are in use; not created. Raise --max-memory-mb (or the memory limit it is derived "
        "from), or spread the table over more shards");
  }
  StatusOr<std::unique_ptr<Table>> table = Internal("not created");
  try {
    table = Table::Create(*spec, options_.shard, options_.num_shards);
  } catch (const std::bad_alloc&) {
    table = ResourceExhausted("not enough memory for table '" + spec->name + "'");
  }
  if (!table.ok()) {
    memory_.Settle(reserved, 0);
    return table.status();
  }
  auto next = std::make_shared<TableMap>(*current);
  (*next)[spec->name] = std::shared_ptr<Table>(std::move(table).value());
  updates_.fetch_add(1);  // before the table is seen: a checkpoint that misses it is not idle
  std::atomic_store(&tables_, std::shared_ptr<const TableMap>(next));
  memory_.Settle(reserved, initial);
  reply->message = "created";
  spdlog::info("created {} table '{}' (optimizer {}, staleness {})",
               spec->kind == TableKind::kDense ? "dense" : "sparse", spec->name, spec->optimizer,
               spec->staleness);
  return Created::kNew;
}

Status ShardServer::Pull(const Header& h, const Frames& frames, Table& t, Header* reply,
                         Frames* out) {
  PullRequest req;
  const bool sparse = t.spec().kind == TableKind::kSparse;
  if (sparse) {
    ONLINEPS_ASSIGN_OR_RETURN(req.num_keys, KeyCount(frames));
    ONLINEPS_RETURN_IF_ERROR(CheckRowsFit(req.num_keys, t.spec().dim, options_.max_message_bytes));
    req.keys = frames[1].As<uint64_t>();
    ONLINEPS_RETURN_IF_ERROR(CheckKeysOwned(h.table, req.keys, req.num_keys));
  } else if (h.shape.size() == 2) {  // a range of this shard's elements: {first, count}
    if (h.shape[1] == 0) return InvalidArgument("dense pull of an empty range (count 0)");
    if (RecordsBackup(h, t)) {
      return InvalidArgument("table '" + h.table +
                             "' is DC-ASGD: its pull records the copy read, so pull it whole "
                             "(or with NO_BACKUP)");
    }
    req.first = h.shape[0];
    req.count = h.shape[1];
  } else if (!h.shape.empty()) {
    return InvalidArgument("dense pull shape must be empty (all) or {first, count}, got " +
                           std::to_string(h.shape.size()) + " numbers");
  }
  req.sender = h.sender;
  req.averaged = h.flags & kFlagAveraged;
  req.record_backup = !(h.flags & kFlagNoBackup);
  req.now_ms = NowMs();
  req.no_wait = t_no_wait;
  auto res = t.Pull(req);
  if (!res.ok()) return res.status();
  if (res->would_block) return WouldBlock();
  reply->version = res->version;
  reply->shape = sparse ? std::vector<uint64_t>{req.num_keys, t.spec().dim}
                        : std::vector<uint64_t>{res->values.size()};
  out->push_back(Frame::FromVector(std::move(res->values)));
  return Status::Ok();
}

Status ShardServer::ApplyLogged(const Header& h, const Frames& frames, std::shared_ptr<Table> t,
                                Header* reply, bool* hold, uint64_t* commit_lsn, bool* evicted,
                                std::vector<float>* values_after) {
  MutexLock order(&order_mu_);
  bool applied = false;
  ONLINEPS_RETURN_IF_ERROR(
      Push(h, frames, std::move(t), reply, hold, &applied, evicted, values_after));
  // A duplicate waits for everything logged so far, which includes its original.
  *commit_lsn = applied ? replica_->Append(frames) : replica_->last_lsn();
  return Status::Ok();
}

bool ShardServer::RecordsBackup(const Header& h, const Table& t) const {
  // DC-ASGD: a pull records the copy a later push is compensated against.
  return RecordsPullBackups(t.spec()) && !(h.flags & kFlagNoBackup) && !(h.flags & kFlagAveraged);
}

Status ShardServer::PullMaybeLogged(const Header& h, const Frames& frames, Table& t, Header* reply,
                                    Frames* out) {
  if (!replica_ || !RecordsBackup(h, t)) return Pull(h, frames, t, reply, out);
  // Logged in apply order, so every backup records the same copy at the same point of
  // the history and compensates the pusher's next push exactly as the primary does.
  // The reply does not wait for the backups: at worst a failover loses the copy, and
  // that push goes uncompensated (counted in backup_misses).
  MutexLock order(&order_mu_);
  ONLINEPS_RETURN_IF_ERROR(Pull(h, frames, t, reply, out));
  replica_->Append(frames);
  return Status::Ok();
}

Status ShardServer::ApplyReplicated(const Header& h, const Frames& frames) {
  Header reply = MakeReply(h, Status::Ok());
  if (h.op == Op::kCreateTable) return CreateTable(h, &reply, /*from_log=*/true).status();
  if (h.op == Op::kPullDense || h.op == Op::kPullSparse) {
    std::shared_ptr<Table> t = FindTable(h.table);
    if (t == nullptr) return NotFound("unknown table '" + h.table + "'");
    Frames ignored;
    return Pull(h, frames, *t, &reply, &ignored);  // records the pusher's copy
  }
  if (h.op != Op::kPushDense && h.op != Op::kPushSparse) {
    return Malformed(std::string("op ") + std::string(OpName(h.op)) + " is not a logged update");
  }
  std::shared_ptr<Table> t = FindTable(h.table);
  if (t == nullptr) return NotFound("unknown table '" + h.table + "'");
  bool hold = false, applied = false;
  return Push(h, frames, std::move(t), &reply, &hold, &applied, nullptr, nullptr,
              /*from_log=*/true);
}

void ShardServer::PrepareSnapshots() {
  const std::shared_ptr<const TableMap> before = tables();  // owns the map while looped
  for (const auto& [name, t] : *before) t->PrepareSnapshot();
}

StatusOr<std::string> ShardServer::Snapshot(uint64_t* lsn) {
  // A table has one snapshot at a time: a checkpoint being written ends first (and a
  // checkpoint waits for this one; neither holds updates meanwhile).
  MutexLock ckpt(&ckpt_mu_);
  PrepareSnapshots();
  ShardSnapshot snap;
  {
    // Updates pause only while the state is cut (O(stripes)), not while it is
    // serialized: on a large shard that took seconds, every push of the primary waiting
    // while a backup re-synced. The cut is at `lsn`: the log is appended in order under
    // order_mu_.
    MutexLock order(&order_mu_);
    WriterLock gate(&apply_gate_);
    *lsn = replica_ ? replica_->last_lsn() : 0;
    snap = SnapshotShard({options_.shard, options_.num_shards}, *tables(), dedup_,
                         SnapshotKind::kCopy);
  }
  return SerializeSnapshot(&snap);
}

Status ShardServer::LoadSnapshot(const std::string& bytes) {
  WriterLock gate(&apply_gate_);
  MutexLock lock(&tables_mu_);
  auto loaded = ParseShard(bytes, "snapshot", {options_.shard, options_.num_shards}, &dedup_);
  if (!loaded.ok()) return loaded.status();
  force_full_checkpoint_ = true;  // the files on disk describe the tables it replaces
  std::atomic_store(&tables_, std::shared_ptr<const TableMap>(
                                  std::make_shared<TableMap>(std::move(loaded).value())));
  watchers_->Reset();
  return Status::Ok();
}

Status ShardServer::Push(const Header& h, const Frames& frames, std::shared_ptr<Table> t,
                         Header* reply, bool* hold, bool* applied, bool* evicted,
                         std::vector<float>* values_after, bool from_log) {
  PushRequest req;
  req.sender = h.sender;
  req.base_version = h.base_version;
  req.delta = h.flags & kFlagDelta;
  req.seed = req.delta && (h.flags & kFlagSeed);
  req.now_ms = NowMs();
  const bool dense = h.op == Op::kPushDense;
  ONLINEPS_ASSIGN_OR_RETURN(req.num_values, FloatCount(frames, dense ? 1 : 2, "values"));
  req.values = frames[dense ? 1 : 2].As<float>();
  if (!dense) {
    ONLINEPS_ASSIGN_OR_RETURN(req.num_keys, KeyCount(frames));
    req.keys = frames[1].As<uint64_t>();
  }
  if (!dense) ONLINEPS_RETURN_IF_ERROR(CheckKeysOwned(h.table, req.keys, req.num_keys));
  req.no_wait = t_no_wait;
  if (values_after != nullptr) {
    values_after->resize(req.num_values);  // the shape the table checks: as many as pushed
    req.values_after = values_after->data();
  }
  if (req.no_wait) {
    if (!apply_gate_.TryReaderLock()) return WouldBlock();  // a snapshot is being cut
  } else {
    apply_gate_.ReaderLock();
  }
  updates_.fetch_add(1, std::memory_order_relaxed);  // read by checkpoints under the gate
  bool values_read = false;
  const Status st =
      PushGated(h, std::move(t), req, reply, hold, applied, evicted, &values_read, from_log);
  apply_gate_.ReaderUnlock();
  if (values_after != nullptr && !values_read) values_after->clear();
  return st;
}

Status ShardServer::PushGated(const Header& h, std::shared_ptr<Table> t, const PushRequest& req,
                              Header* reply, bool* hold, bool* applied, bool* evicted,
                              bool* values_read, bool from_log) {
  const bool dense = h.op == Op::kPushDense;
  switch (dedup_.Begin(h.sender, h.seq, /*refuse_forgotten=*/!from_log)) {
    case Dedup::Verdict::kDuplicate:
      metrics_->CountDuplicate();
      reply->version = t->version();
      reply->message = "duplicate: push (sender, seq) was already applied";
      // A retry of a held push waits like the original, or retries would defeat SSP.
      *hold = !t->Releasable(h.sender, req.now_ms);
      return Status::Ok();
    case Dedup::Verdict::kInProgress:
      return Unavailable("push (sender, seq) is being applied; retry");
    case Dedup::Verdict::kTooOld:
      return FailedPrecondition(
          "push seq " + std::to_string(h.seq) + " of sender " + std::to_string(h.sender) +
          " is below the dedup window; cannot tell if it was applied (is the sender id "
          "used by two clients at once?)");
    case Dedup::Verdict::kNew:
      break;
  }
  // Checked at the primary only: a backup applies what its primary accepted (and counts
  // it, as if every key made a row, until the next measure).
  uint64_t growth = 0, reserved = 0;
  if (memory_.enabled() && from_log) {
    growth = req.num_keys * t->BytesPerNewRow();
  } else if (memory_.enabled() && !dense) {
    StatusOr<uint64_t> admitted = AdmitGrowth(h.table, *t, req);
    if (!admitted.ok()) {
      dedup_.Abort(h.sender, h.seq);  // nothing applied: a retry may be
      return admitted.status();
    }
    growth = reserved = *admitted;
  }
  auto apply = [&]() -> StatusOr<PushResult> {
    try {
      return t->Push(req);
    } catch (const std::bad_alloc&) {
      return ResourceExhausted("not enough memory to apply the push to table '" + h.table + "'");
    }
  };
  // Sparse: the watchers remember which keys changed, for the workers holding them.
  StatusOr<PushResult> res =
      dense ? apply() : watchers_->ApplySparse(h.table, req.keys, req.num_keys, apply);
  if (!res.ok() || res->would_block) {
    memory_.Settle(reserved, 0);
    dedup_.Abort(h.sender, h.seq);  // not applied: a retry (or the handler thread) may
    return res.ok() ? WouldBlock() : res.status();
  }
  dedup_.Commit(h.sender, h.seq);
  if (reserved != 0) {
    memory_.Settle(reserved, growth);
  } else if (growth != 0) {
    memory_.Add(growth);
  }
  *applied = true;
  *values_read = res->values_read;
  if (evicted != nullptr) *evicted = !res->evicted.empty();
  metrics_->ObserveStaleness(h.table, res->tau);
  reply->version = res->version;
  reply->tau = res->tau;
  reply->queued = res->queued;
  *hold = res->hold;
  ReleaseHeld(/*all=*/false);
  return Status::Ok();
}

bool ShardServer::ReserveMeasured(uint64_t bytes) {
  if (memory_.TryReserve(bytes)) return true;
  // The count may still hold pushes' upper bounds: measure before refusing.
  if (memory_.stale()) memory_.Measure([this] { return TableBytes(); });
  return memory_.TryReserve(bytes);
}

StatusOr<uint64_t> ShardServer::AdmitGrowth(const std::string& table, Table& t,
                                            const PushRequest& req) {
  const uint64_t row_bytes = t.BytesPerNewRow();
  if (row_bytes == 0 || req.num_keys == 0) return 0;  // dense: sized at creation
  // Far from the budget no key is looked up: the push reserves as if every key made a
  // row, and is counted so until the next measure (the maintenance thread's, every
  // tick). The reservation is taken before the rows are made: pushes applied at once
  // cannot each count on the same room.
  const uint64_t most = req.num_keys * row_bytes;
  if (memory_.TryReserve(most)) return most;
  if (req.no_wait) return WouldBlock();  // the count below waits for the stripes' locks
  const uint64_t rows = t.NewRows(req.keys, req.num_keys);
  if (rows == 0) return 0;  // existing rows only: always applied
  const uint64_t bytes = rows * row_bytes;
  if (ReserveMeasured(bytes)) return bytes;
  metrics_->CountMemoryRefusal(Op::kPushSparse);
  return ResourceExhausted(
      "table '" + table + "': this push would create " + std::to_string(rows) + " row(s) (about " +
      std::to_string(bytes) + " bytes), past the shard's memory budget of " +
      std::to_string(memory_.limit()) + " bytes (--max-memory-mb), of which " +
      std::to_string(memory_.used()) +
      " are in use; nothing of it was applied. Pushes to existing rows and pulls go on. Raise "
      "--max-memory-mb (or the memory limit it is derived from), or give the table max_rows "
      "or ttl_ms (the worker's --sparse-max-rows, --sparse-ttl-ms)");
}

uint64_t ShardServer::TableBytes() const {
  const std::shared_ptr<const TableMap> snapshot = tables();  // owns the map while looped
  uint64_t sum = 0;
  for (const auto& [name, t] : *snapshot) sum += t->Stats().memory_bytes;
  return sum;
}

Status ShardServer::AppendValues(const Header& h, const Frames& frames, Table& t, Frames* out) {
  PullRequest req;
  req.sender = h.sender;
  req.record_backup = false;  // a DC-ASGD pusher that computes on these values must pull
  req.now_ms = NowMs();
  // Reached only when the push did not read them itself (a duplicate, an accumulated
  // sparse push); on the I/O thread a taken lock sends the request to its handler thread,
  // where the duplicate is answered again (exactly once: nothing is applied twice).
  req.no_wait = t_no_wait;
  if (h.op == Op::kPushSparse) {
    req.keys = frames[1].As<uint64_t>();
    req.num_keys = static_cast<size_t>(frames[1].CountOf<uint64_t>());
    // A duplicate's values frame was never checked against its keys: the rows it names
    // are bounded here, as a pull's are.
    ONLINEPS_RETURN_IF_ERROR(CheckRowsFit(req.num_keys, t.spec().dim, options_.max_message_bytes));
  }
  ONLINEPS_ASSIGN_OR_RETURN(PullResult res, t.Pull(req));
  if (res.would_block) return WouldBlock();
  out->push_back(Frame::FromVector(std::move(res.values)));
  return Status::Ok();
}

Status ShardServer::CheckKeysOwned(const std::string& table, const uint64_t* keys, size_t n) const {
  if (options_.num_shards == 1) return Status::Ok();  // every key is this shard's
  for (size_t i = 0; i < n; ++i) {
    const uint32_t owner = ShardOfKey(keys[i], options_.num_shards);
    if (owner != options_.shard) {
      return InvalidArgument("table '" + table + "': key " + std::to_string(keys[i]) +
                             " belongs to shard " + std::to_string(owner) + ", not shard " +
                             std::to_string(options_.shard) + " (check the shard list order)");
    }
  }
  return Status::Ok();
}

Status ShardServer::Info(const Header& h, Header* reply) {
  auto snapshot = tables();
  if (!h.table.empty()) {
    auto it = snapshot->find(h.table);
    if (it == snapshot->end()) return NotFound("unknown table '" + h.table + "'");
    reply->spec = EncodeSpec(it->second->spec());
    TableStats s = it->second->Stats();
    reply->version = s.version;
    reply->spec["stat.version"] = std::to_string(s.version);
    reply->spec["stat.elements"] = std::to_string(s.elements);
    reply->spec["stat.rows"] = std::to_string(s.rows);
    reply->spec["stat.memory_bytes"] = std::to_string(s.memory_bytes);
    reply->spec["stat.backups"] = std::to_string(s.backups);
    reply->spec["stat.backup_misses"] = std::to_string(s.backup_misses);
    reply->spec["stat.clipped_pushes"] = std::to_string(s.clipped_pushes);
    reply->spec["stat.evicted_rows"] = std::to_string(s.evicted_rows);
    return Status::Ok();
  }
  for (const auto& [name, table] : *snapshot) {
    reply->spec["table." + name] = std::to_string(table->version());
  }
  return Status::Ok();
}

void ShardServer::SendReply(const std::string& peer, const Header& reply, Frames payload) {
  Frames frames;
  frames.reserve(1 + payload.size());
  frames.push_back(Frame::FromString(EncodeHeader(reply)));
  for (Frame& f : payload) frames.push_back(std::move(f));
  Status st = transport_->Send(peer, std::move(frames));
  if (!st.ok()) spdlog::debug("reply not sent: {}", st.ToString());
}

void ShardServer::HoldReply(Held held) {
  MutexLock lock(&held_mu_);
  if (held_.size() >= options_.max_held_replies || stopping_) {
    // Bounded: past the cap a reply goes out at once rather than growing the list.
    transport_->Send(held.peer, std::move(held.reply)).ok();
    return;
  }
  held_.push_back(std::move(held));
  metrics_->SetHeld(held_.size());
}

void ShardServer::ReleaseHeld(bool all) {
  std::vector<Held> ready;
  {
    MutexLock lock(&held_mu_);
    if (held_.empty()) return;
    const uint64_t now = NowMs();
    for (size_t i = 0; i < held_.size();) {
      Held& h = held_[i];
      if (all || now >= h.deadline_ms || h.table->Releasable(h.sender, now)) {
        ready.push_back(std::move(h));
        held_[i] = std::move(held_.back());
        held_.pop_back();
      } else {
        ++i;
      }
    }
    metrics_->SetHeld(held_.size());
  }
  for (Held& h : ready) transport_->Send(h.peer, std::move(h.reply)).ok();
}

void ShardServer::MaintenanceTick(uint64_t* last_ckpt, uint64_t* last_stats) {
  const uint64_t now = NowMs();
  ReleaseHeld(/*all=*/false);
  watchers_->Expire(now);  // heartbeats: a watcher knows its notices still flow
  if (memory_.enabled()) {
    // Every tick: pushes far from the budget count their upper bound until then.
    memory_.Measure([this] { return TableBytes(); });
    metrics_->SetMemory(memory_.limit(), memory_.used());
  }
  if (now - *last_stats >= 1000) {
    *last_stats = now;
    // Held for the loop: a range-for over *tables() would keep only the map, not the
    // snapshot owning it, and a concurrent create_table frees it mid-loop.
    const std::shared_ptr<const TableMap> snapshot = tables();
    for (const auto& [name, table] : *snapshot) {
      {
        // TTL expiry drops rows: like a push, never between a checkpoint's look at the
        // tables' changes and its cut (a delta would miss what it dropped).
        ReaderLock gate(&apply_gate_);
        table->Maintain(now);
      }
      metrics_->UpdateTable(name, table->Stats());
    }
    metrics_->SetDedupSenders(dedup_.senders());
    if (replica_) metrics_->UpdateReplica(replica_->Stats());
  }
  if (options_.checkpoint_interval_s > 0 &&
      now - *last_ckpt >= options_.checkpoint_interval_s * 1000) {
    *last_ckpt = now;
    auto st = Checkpoint(/*skip_if_unchanged=*/true);
    if (!st.ok()) spdlog::error("periodic checkpoint failed: {}", st.status().ToString());
  }
}

}  // namespace onlineps::ps
