// onlineps_ps: one parameter-server shard. Flags, ONLINEPS_* env vars and --config are
// documented in docs/operations.md; `onlineps_ps --help` lists them.
#include <spdlog/spdlog.h>

#include <iostream>

#include "common/admin_server.h"
#include "common/config.h"
#include "common/curve.h"
#include "common/etcd_kv.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/signals.h"
#include "ps/shard_server.h"

namespace {

void AddFlags(CLI::App& app, onlineps::ps::ShardServerOptions* o, std::string* admin_host,
              int* admin_port, size_t* max_message_mb, int64_t* max_memory_mb,
              std::string* replication_mode) {
  app.add_option("--shard-index", o->shard, "Index of this shard, 0 <= index < num-shards")
      ->capture_default_str();
  app.add_option("--num-shards", o->num_shards, "Number of shards in the cluster")
      ->check(CLI::Range(1u, 65535u))
      ->capture_default_str();
  app.add_option("--listen", o->listen,
                 "ZeroMQ endpoint to bind (tcp://HOST:PORT, port 0 = any free port)")
      ->capture_default_str();
  app.add_option("--handler-threads", o->handler_threads, "Threads applying requests")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--max-message-mb", *max_message_mb,
                 "Largest request accepted, in MiB (larger ones get TOO_LARGE)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--max-memory-mb", *max_memory_mb,
                 "Table state this shard may hold, in MiB (the tables' memory_bytes, summed): "
                 "past it, creating a table or a sparse push creating rows is refused "
                 "(RESOURCE_EXHAUSTED); pushes to existing rows and pulls go on. -1: half the "
                 "cgroup memory limit when one is set, else none; 0: none")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--checkpoint-dir", o->checkpoint_dir,
                 "Directory for checkpoints (empty: none); restored at start")
      ->capture_default_str();
  app.add_option("--checkpoint-interval-s", o->checkpoint_interval_s,
                 "Seconds between periodic checkpoints (0: only on demand and at shutdown)")
      ->check(onlineps::LifetimeS(0))
      ->capture_default_str();
  app.add_option("--checkpoint-full-every", o->checkpoint_full_every,
                 "Incremental checkpoints: between full ones, write only the rows changed "
                 "since the last checkpoint (a delta file beside it), at most N-1 in a row "
                 "(1: every checkpoint is full)")
      ->check(CLI::Range(1u, 1000u))
      ->capture_default_str();
  app.add_flag("!--no-restore", o->restore, "Ignore an existing checkpoint at start");
  app.add_option("--max-senders", o->max_senders,
                 "Clients whose exactly-once window is kept (LRU beyond)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32))
      ->capture_default_str();
  auto& rep = o->replication;
  app.add_option("--replicas", rep.members,
                 "Endpoints of every replica of this shard, this one included, in the same "
                 "order on each (comma-separated); empty: not replicated")
      ->delimiter(',');
  app.add_option("--replica-index", rep.index, "Position of this replica in --replicas")
      ->capture_default_str();
  app.add_option("--replication", *replication_mode,
                 "sync: a push is acknowledged once every in-sync backup has it; async: at once")
      ->check(CLI::IsMember({"sync", "async"}))
      ->capture_default_str();
  app.add_option("--replica-heartbeat-ms", rep.heartbeat_ms, "Primary -> backup heartbeat period")
      ->check(CLI::Range(uint64_t{5}, uint64_t{60000}))
      ->capture_default_str();
  app.add_option("--replica-lease-ms", rep.lease_ms,
                 "etcd lease of each replica, rounded up to whole seconds: a killed primary is "
                 "replaced after about this long (a stopped one at once)")
      ->check(CLI::Range(uint64_t{1000}, uint64_t{600000}))
      ->capture_default_str();
  app.add_option("--replica-unclean-wait-ms", rep.unclean_wait_ms,
                 "When every in-sync replica lost its state (all restarted), wait this long for "
                 "every replica to register before electing the most up-to-date one present")
      ->check(CLI::Range(uint64_t{0}, uint64_t{86400000}))
      ->capture_default_str();
  app.add_flag("--replica-accept-unknown-position", rep.accept_unknown_position,
               "Start although the checkpoint's replica sidecar (.ckpt.replica) is missing or "
               "unreadable: its data then ranks below every replica whose position is known "
               "(first start with --replicas on an unreplicated shard's checkpoint; a damaged "
               "sidecar)");
  app.add_option("--min-insync-replicas", rep.min_insync,
                 "sync: pushes wait (are not acknowledged) while fewer replicas than this, the "
                 "primary included, are in the in-sync replica set")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  app.add_option("--etcd", rep.etcd,
                 "etcd endpoints (http://HOST:PORT, comma-separated) holding the replicas' "
                 "membership and election; required with --replicas")
      ->delimiter(',');
  app.add_option("--etcd-prefix", rep.etcd_prefix,
                 "Key prefix of this cluster in etcd (several clusters can share one etcd)")
      ->capture_default_str();
  app.add_option("--replica-timeout-ms", rep.follower_timeout_ms,
                 "Backup silence after which the primary stops waiting for it (sync mode)")
      ->check(CLI::Range(uint64_t{20}, uint64_t{600000}))
      ->capture_default_str();
  app.add_option("--admin-host", *admin_host, "Address of the admin HTTP port")
      ->capture_default_str();
  app.add_option("--admin-port", *admin_port,
                 "Admin HTTP port for /metrics, /healthz, /readyz (0: any free port, -1: off)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
}

// The port of a tcp:// endpoint ("" for any other kind, or none).
std::string TcpPort(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return "";
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < 6) return "";
  const std::string port = endpoint.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos) return "";
  const size_t digits = port.find_first_not_of('0');  // 07400 is 7400
  return digits == std::string::npos ? "0" : port.substr(digits);
}

onlineps::Status CheckReplication(const onlineps::ps::ShardServerOptions& o) {
  const auto& rep = o.replication;
  if (rep.members.empty()) return onlineps::Status::Ok();
  if (rep.members.size() < 2) {
    return onlineps::InvalidArgument("--replicas needs two or more endpoints, got 1");
  }
  if (rep.index >= rep.members.size()) {
    return onlineps::InvalidArgument("--replica-index " + std::to_string(rep.index) +
                                     " is not below the " + std::to_string(rep.members.size()) +
                                     " endpoints of --replicas");
  }
  if (o.listen.size() > 2 && o.listen.compare(o.listen.size() - 2, 2, ":0") == 0) {
    return onlineps::InvalidArgument("--listen " + o.listen +
                                     ": a replica needs a fixed port, the one --replicas names");
  }
  for (size_t i = 0; i < rep.members.size(); ++i) {
    for (size_t j = i + 1; j < rep.members.size(); ++j) {
      if (rep.members[i] == rep.members[j]) {
        return onlineps::InvalidArgument(
            "--replicas names " + rep.members[i] + " twice (replicas " + std::to_string(i) +
            " and " + std::to_string(j) + "): each replica needs its own endpoint");
      }
    }
  }
  // The others reach this replica at the endpoint --replicas names for it: --listen must
  // bind that port (its host may differ: 0.0.0.0 or * for a DNS name, say).
  const std::string& mine = rep.members[rep.index];
  if (const std::string want = TcpPort(mine), have = TcpPort(o.listen);
      !want.empty() && !have.empty() && want != have) {
    return onlineps::InvalidArgument(
        "--listen " + o.listen + " binds port " + have + ", but --replicas names " + mine +
        " for --replica-index " + std::to_string(rep.index) +
        ": the other replicas would reach nothing there (is --replica-index right?)");
  }
  if (rep.lease_ms <= 2 * rep.heartbeat_ms) {
    return onlineps::InvalidArgument("--replica-lease-ms must exceed twice --replica-heartbeat-ms");
  }
  if (rep.etcd.empty()) {
    return onlineps::InvalidArgument(
        "--replicas needs --etcd: replicated shards keep their membership and election in etcd "
        "(docs/reliability.md)");
  }
  if (auto st = onlineps::ValidateEtcdEndpoints(rep.etcd); !st.ok()) {
    return onlineps::InvalidArgument("--etcd: " + st.message());
  }
  if (rep.min_insync > rep.members.size()) {
    return onlineps::InvalidArgument("--min-insync-replicas " + std::to_string(rep.min_insync) +
                                     " exceeds the " + std::to_string(rep.members.size()) +
                                     " replicas of --replicas");
  }
  if (rep.etcd_prefix.empty() || rep.etcd_prefix[0] != '/') {
    return onlineps::InvalidArgument("--etcd-prefix must start with '/'");
  }
  return onlineps::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  onlineps::BlockShutdownSignals();
  // A checkpoint past the file size limit (ulimit -f) then fails with EFBIG like a full
  // disk (logged, answered, retried) instead of SIGXFSZ killing the shard and its state.
  std::signal(SIGXFSZ, SIG_IGN);
  onlineps::ps::ShardServerOptions options;
  onlineps::LogOptions log;
  log.component = "ps";
  std::string admin_host = "127.0.0.1";
  int admin_port = 9100;
  size_t max_message_mb = options.max_message_bytes >> 20;
  int64_t max_memory_mb = -1;
  CLI::App app("onlineps parameter-server shard");
  std::string replication_mode = "sync";
  AddFlags(app, &options, &admin_host, &admin_port, &max_message_mb, &max_memory_mb,
           &replication_mode);
  onlineps::AddLoggingFlags(app, &log);
  onlineps::CurveFlags curve;
  onlineps::AddCurveFlags(app, &curve, /*server=*/true, /*client=*/false);
  std::string replica_keys;
  app.add_option("--curve-replica-keys", replica_keys,
                 "With CURVE: file of public keys, besides this shard's own, that may send "
                 "replication messages (replicas with their own certificates)");
  auto parsed = onlineps::ParseFlags(app, argc, argv);
  if (!parsed.ok()) {
    std::cerr << "onlineps_ps: " << parsed.status().message() << "\n";
    return 2;
  }
  if (parsed->exit_now) return 0;
  if (auto st = onlineps::InitLogging(log); !st.ok()) {
    std::cerr << "onlineps_ps: " << st.message() << "\n";
    return 2;
  }
  options.max_message_bytes = max_message_mb << 20;
  const onlineps::ps::MemoryBudgetChoice budget =
      onlineps::ps::ChooseMemoryBudget(max_memory_mb, onlineps::ps::DefaultCgroupMemoryFiles());
  options.max_memory_bytes = budget.bytes;
  options.replication.sync = replication_mode == "sync";
  if (auto st = CheckReplication(options); !st.ok()) {
    std::cerr << "onlineps_ps: " << st.message() << "\n";
    return 2;
  }
  auto loaded = onlineps::LoadCurve(curve);
  if (!loaded.ok()) {
    std::cerr << "onlineps_ps: " << loaded.status().message() << "\n";
    return 2;
  }
  options.curve = *loaded;
  if (!replica_keys.empty() && !options.curve.enabled()) {
    // Without CURVE no key is checked: every peer would pass as a replica.
    std::cerr << "onlineps_ps: --curve-replica-keys needs --curve-cert (CURVE on)\n";
    return 2;
  }
  if (!replica_keys.empty()) {
    auto keys = onlineps::ReadCurvePublicKeys(replica_keys);
    if (!keys.ok()) {
      std::cerr << "onlineps_ps: --curve-replica-keys: " << keys.status().message() << "\n";
      return 2;
    }
    options.replica_keys = *keys;
  }
  if (options.replication.members.size() >= 2 && !options.curve.enabled()) {
    spdlog::warn(
        "replication without CURVE: any peer that reaches this port can send replication "
        "messages (their epochs are still checked against etcd); use --curve-cert outside a "
        "trusted network (docs/security.md)");
  }
  if (options.curve.enabled()) {
    spdlog::info(
        "CURVE on: public key {}, {}", options.curve.public_key,
        options.curve.allowed_clients.empty()
            ? std::string("any client holding it")
            : std::to_string(options.curve.allowed_clients.size()) + " client key(s) allowed");
  }
  spdlog::info("effective config:\n{}", onlineps::EffectiveConfig(app));
  if (budget.bytes == 0) {
    spdlog::info("memory budget: none ({}): table state may grow until the process is killed",
                 budget.source);
  } else {
    spdlog::info("memory budget: {} MiB of table state ({})", budget.bytes >> 20, budget.source);
  }

  auto admin = std::make_unique<onlineps::AdminServer>();
  onlineps::ps::ShardServer server(options, admin->registry());
  admin->SetReadyCheck([&server]() -> onlineps::Status { return server.Readiness(); });
  if (admin_port >= 0) {
    auto port = admin->Start(admin_host, admin_port);
    if (!port.ok()) {
      spdlog::error("admin port: {}", port.status().ToString());
      return 1;
    }
    spdlog::info("admin endpoints on http://{}:{}/metrics", admin_host, *port);
  }
  auto endpoint = server.Start();
  if (!endpoint.ok()) {
    spdlog::error("cannot start shard: {}{}", endpoint.status().ToString(),
                  endpoint.status().code() == onlineps::StatusCode::kAlreadyExists
                      ? " (--listen: another process is on that port?)"
                      : "");
    return 1;
  }
  // Machine-readable line for launchers and tests that bind port 0.
  std::cout << "LISTENING " << *endpoint << std::endl;
  int sig = onlineps::WaitForShutdownSignal();
  spdlog::info("signal {}: draining", sig);
  server.Stop();
  admin->Stop();
  // Non-zero so a supervisor sees that the updates since the last checkpoint are not on disk.
  return server.final_checkpoint_failed() ? 1 : 0;
}
