// WorkerService's push half: starting sparse, accumulated-dense and delta pushes, and
// finishing them according to the reply mode.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>

#include "common/clock.h"
#include "common/frame.h"
#include "worker/worker_client.h"
#include "worker/worker_service.h"

namespace onlineps::worker {

void WorkerService::ReservePushes(size_t n, uint64_t bytes) {
  // Bounded: a learn waits here rather than queue pushes without limit (a batch larger
  // than the bound goes once nothing else is in flight).
  MutexLock lock(&mu_);
  inflight_cv_.Wait(&mu_, [&]() REQUIRES(mu_) {
    return inflight_ == 0 || inflight_ + n <= options_.max_inflight_pushes;
  });
  inflight_ += n;
  stats_.push_bytes += bytes;
}

std::function<void(const ps::PushReply&)> WorkerService::OnceForget(
    std::function<void(const ps::PushReply&)> forget) const {
  if (!options_.read_own_writes) return [](const ps::PushReply&) {};
  // Run once: by the push's callback or by FinishPushes, whichever comes first; the other
  // waits for it to finish (the learn's reply must follow the install), then skips it.
  return [once = std::make_shared<std::once_flag>(),
          f = std::move(forget)](const ps::PushReply& r) { std::call_once(*once, f, r); };
}

void WorkerService::StartPush(
    const std::string& table, uint64_t bytes, Pushes* pushes,
    std::function<void(const ps::PushReply&)> forget,
    const std::function<ps::Ticket(ps::PushReply*, ps::PsClient::Callback)>& send,
    std::shared_ptr<const HeldPushes::Push> held) {
  ReservePushes(1, bytes);
  forget = OnceForget(std::move(forget));
  auto reply = std::make_shared<ps::PushReply>();
  // The callback owns the reply too: in queued mode nobody else waits for it.
  std::shared_ptr<LearnRun> run = pushes->run;
  if (run) run->AddPending();
  if (InstallsPushedValues()) cache_.BeginOwnPush(table);  // ended by OnPushDone
  if (held) held_.Started(*held);                          // taken or dropped by HeldDone
  ps::Ticket t = send(reply.get(), [this, table, reply, forget, run, held](const Status& st) {
    // Held before OnPushDone counts it done: Stop, waiting for that, then sees it held.
    const bool kept = held != nullptr && HeldDone(*held, st);
    OnPushDone(table, *reply, st, forget);
    if (!run) return;
    {
      MutexLock lock(&run->mu);
      if (kept) {
        run->held = true;
        run->reply.landed.insert(table);
      } else {
        FoldPush(table, *reply, st, /*batched=*/false, &run->reply, &run->first);
      }
    }
    LearnPartDone(run);
  });
  pushes->items.push_back(
      {table, std::move(t), std::move(reply), std::move(forget), false, std::move(held)});
}

bool WorkerService::HeldDone(const HeldPushes::Push& p, const Status& st) {
  if (!st.ok()) return held_.Failed(p, st);
  held_.Succeeded(p);
  return false;
}

bool WorkerService::MayHold() const {
  return !ps::HoldsReplies(options_.table_template) &&
         !ps::RecordsPullBackups(options_.table_template);
}

Status WorkerService::RetryHeld() {
  // The oldest alone first: while the shard that failed them is still down, a round
  // costs one push waiting out its timeout, not every held push (2,048 at most, 256 at
  // a time: 40 s of the flusher's thread, and of Stop's last try, with a 5 s timeout).
  bool still_held = false;
  ONLINEPS_RETURN_IF_ERROR(RetryHeld(held_.TakeForRetry(/*oldest_only=*/true), &still_held));
  if (still_held) return Status::Ok();
  return RetryHeld(held_.TakeForRetry(), &still_held);
}

Status WorkerService::RetryHeld(std::vector<HeldPushes::Push> due, bool* still_held) {
  if (due.empty()) return Status::Ok();
  Pushes pushes;
  for (HeldPushes::Push& p : due) {
    Pushes::Dense d;
    d.push.table = p.table;
    d.push.values = p.values;
    d.push.base = p.base;
    // The first attempt's (sender, seq): a shard that applied it answers a duplicate.
    d.push.opts.sender = held_sender_;
    d.push.opts.seq = p.seq;
    d.forget = ForgetDense(p.table);
    d.held = std::make_shared<const HeldPushes::Push>(std::move(p));
    pushes.dense.push_back(std::move(d));
  }
  LearnReply ignored;
  Status st = FinishPushes(pushes, ReplyWhen::kApplied, &ignored);
  *still_held = pushes.held;
  return st;
}

bool WorkerService::BatchesPushes() const {
  return options_.batch_pushes && !ps::HoldsReplies(options_.table_template);
}

void WorkerService::StartDense(Pushes::Dense* d, Pushes* pushes) {
  StartPush(
      d->push.table, d->push.values.size(), pushes, std::move(d->forget),
      [&](ps::PushReply* r, ps::PsClient::Callback done) {
        return client_->PushDense(d->push.table, std::move(d->push.values), d->push.base, r,
                                  d->push.opts, std::move(done));
      },
      std::move(d->held));
}

void WorkerService::SendQueued(Pushes* pushes) {
  // A push with a fixed (sender, seq) goes alone (PsClient::PushBatch).
  auto alone = std::stable_partition(pushes->dense.begin(), pushes->dense.end(),
                                     [](const Pushes::Dense& d) { return d.held == nullptr; });
  for (auto it = alone; it != pushes->dense.end(); ++it) StartDense(&*it, pushes);
  pushes->dense.erase(alone, pushes->dense.end());
  if (!BatchesPushes() || pushes->dense.size() + pushes->sparse.size() < 2) {
    for (Pushes::Dense& d : pushes->dense) StartDense(&d, pushes);
    for (Pushes::Sparse& sp : pushes->sparse) StartSparse(&sp, pushes);
    pushes->dense.clear();
    pushes->sparse.clear();
    return;
  }
  struct Part {
    std::string table;
    std::shared_ptr<ps::PushReply> reply;
    std::function<void(const ps::PushReply&)> forget;
  };
  auto parts = std::make_shared<std::vector<Part>>();
  std::vector<ps::DensePush> dense;
  std::vector<ps::SparsePush> sparse;
  uint64_t bytes = 0;
  for (Pushes::Dense& d : pushes->dense) {
    bytes += d.push.values.size();
    parts->push_back(
        {d.push.table, std::make_shared<ps::PushReply>(), OnceForget(std::move(d.forget))});
    d.push.reply = parts->back().reply.get();
    dense.push_back(std::move(d.push));
  }
  for (Pushes::Sparse& sp : pushes->sparse) {
    bytes += sp.push.keys.size() * sizeof(uint64_t) + sp.push.values.size() * sizeof(float);
    parts->push_back(
        {sp.push.table, std::make_shared<ps::PushReply>(), OnceForget(std::move(sp.forget))});
    sp.push.reply = parts->back().reply.get();
    sparse.push_back(std::move(sp.push));
  }
  pushes->dense.clear();
  pushes->sparse.clear();
  ReservePushes(parts->size(), bytes);
  std::shared_ptr<LearnRun> run = pushes->run;
  if (run) run->AddPending();  // one for the batch
  if (InstallsPushedValues()) {
    for (const Part& p : *parts) cache_.BeginOwnPush(p.table);  // ended by OnPushDone
  }
  // The callback owns the replies: in queued mode nobody else waits for them.
  ps::Ticket t =
      client_->PushBatch(std::move(dense), std::move(sparse), [this, parts, run](const Status& st) {
        // One warning for the batch: its error names the table it is about (the first
        // part's name would mislead).
        if (!st.ok()) spdlog::warn("push of {} tables failed: {}", parts->size(), st.ToString());
        for (const Part& p : *parts) OnPushDone(p.table, *p.reply, st, p.forget, /*warn=*/false);
        if (!run) return;
        {
          MutexLock lock(&run->mu);
          for (const Part& p : *parts) {
            FoldPush(p.table, *p.reply, st, /*batched=*/true, &run->reply, &run->first);
          }
        }
        LearnPartDone(run);
      });
  for (const Part& p : *parts)
    pushes->items.push_back({p.table, t, p.reply, p.forget, true, nullptr});
}

void WorkerService::StartSparse(Pushes::Sparse* sp, Pushes* pushes) {
  const ps::SparsePush& p = sp->push;
  const uint64_t bytes = p.keys.size() * sizeof(uint64_t) + p.values.size() * sizeof(float);
  StartPush(p.table, bytes, pushes, std::move(sp->forget),
            [&](ps::PushReply* r, ps::PsClient::Callback done) {
              return client_->PushSparse(p.table, p.keys.data(), p.keys.size(), p.values.data(),
                                         p.base, r, p.opts, std::move(done));
            });
}

void WorkerService::OnPushDone(const std::string& table, const ps::PushReply& reply,
                               const Status& st,
                               const std::function<void(const ps::PushReply&)>& forget, bool warn) {
  if (st.ok()) {
    // The push's own values first, then its versions: the other way round, a read in
    // between found the copy behind the versions it knew of and pulled it back.
    forget(reply);
    if (ObservesOwnPushes()) cache_.ObserveVersions(table, reply.versions);
  } else if (warn) {
    spdlog::warn("push to table '{}' failed: {}", table, st.ToString());
  }
  if (InstallsPushedValues()) cache_.EndOwnPush(table);
  {
    MutexLock lock(&mu_);
    --inflight_;
    stats_.pushes++;
    if (!st.ok()) stats_.push_errors++;
    if (st.ok()) stats_.max_tau = std::max(stats_.max_tau, reply.max_tau);
    // Under the lock: once inflight_ reads 0, Stop may return and the service be
    // destroyed, so nothing of it may be touched after the unlock.
    inflight_cv_.SignalAll();
  }
}

std::function<void(const ps::PushReply&)> WorkerService::ForgetDense(const std::string& table) {
  return [this, table](const ps::PushReply&) { cache_.Invalidate(table); };
}

bool WorkerService::ObservesOwnPushes() const {
  return options_.read_own_writes || !options_.cache.notices;
}

bool WorkerService::InstallsPushedValues() const {
  return options_.read_own_writes && !ps::RecordsPullBackups(options_.table_template);
}

void WorkerService::PushSparse(const std::vector<ps::VersionVector>& base, const GradOutput& grads,
                               Pushes* pushes, LearnReply* out) {
  const auto& params = model_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind != ParamKind::kSparse) continue;
    const SparseRows& g = grads.sparse[i];
    if (g.keys.empty()) continue;
    out->sparse_rows_pushed += g.keys.size();
    Pushes::Sparse sp;
    sp.push.table = params[i].name;
    sp.push.keys = g.keys;
    sp.push.values = g.values;
    sp.push.base = base[i];
    auto keys = std::make_shared<const std::vector<uint64_t>>(g.keys);
    if (InstallsPushedValues()) {
      auto updated = std::make_shared<std::vector<float>>(g.values.size());
      sp.push.opts.updated = updated->data();
      sp.forget = [this, table = params[i].name, keys, updated,
                   sent = static_cast<int64_t>(NowMs())](const ps::PushReply& r) {
        cache_.InstallRows(table, keys->data(), keys->size(), updated->data(), r.versions, sent);
      };
    } else {
      sp.forget = [this, table = params[i].name, keys](const ps::PushReply&) {
        cache_.InvalidateRows(table, keys->data(), keys->size());
      };
    }
    // Batched, it goes with the dense pushes (SendQueued); else at once.
    if (BatchesPushes()) {
      pushes->sparse.push_back(std::move(sp));
    } else {
      StartSparse(&sp, pushes);
    }
  }
}

void WorkerService::PushDense(size_t param, Accumulator::Batch batch, Pushes* pushes,
                              bool answered) {
  const std::string& table = model_->params()[param].name;
  Pushes::Dense d;
  d.push.table = table;
  d.push.base = std::move(batch.base);
  d.forget = ForgetDense(table);
  if (InstallsPushedValues()) {
    auto updated = std::make_shared<std::vector<float>>(batch.sum.size());
    d.push.opts.updated = updated->data();
    d.forget = [this, table, updated,
                sent = static_cast<int64_t>(NowMs())](const ps::PushReply& r) {
      cache_.InstallDense(table, std::move(*updated), r.versions, sent);  // runs once
    };
  }
  d.push.values = Frame::FromVector(std::move(batch.sum));
  if (answered && MayHold()) {
    auto held = std::make_shared<HeldPushes::Push>();
    held->table = table;
    held->values = d.push.values;
    held->base = d.push.base;
    held->seq = ++held_seq_;
    held->examples = batch.examples;
    held->calls = batch.calls;
    // Fixed from the first attempt on: a retry after an attempt some shard applied
    // without answering in time is answered as a duplicate there.
    d.push.opts.sender = held_sender_;
    d.push.opts.seq = held->seq;
    d.held = std::move(held);
  }
  pushes->dense.push_back(std::move(d));
}

void WorkerService::PushDelta(size_t param, std::vector<float> delta, Pushes* pushes) {
  const std::string& table = model_->params()[param].name;
  Pushes::Dense d;
  d.push.table = table;
  d.push.values = Frame::FromVector(std::move(delta));
  d.push.base = local_->anchor_versions(param);
  d.forget = ForgetDense(table);
  d.push.opts.delta = true;
  pushes->dense.push_back(std::move(d));
}

Status WorkerService::FinishPushes(Pushes& pushes, ReplyWhen when, LearnReply* out) {
  SendQueued(&pushes);
  if (pushes.items.empty()) return Status::Ok();
  if (when == ReplyWhen::kQueued) {
    out->outcome = LearnOutcome::kQueued;
    return Status::Ok();
  }
  Status first;
  for (auto& p : pushes.items) {
    Status st = p.ticket.Wait();
    if (!st.ok() && p.held && HeldPushes::MayPassOnRetry(st)) {
      // Held by its callback (HeldDone): its learns stay taken, and a retry of a learn
      // that failed on another push must not send this one's part again.
      pushes.held = true;
      out->landed.insert(p.table);
      continue;
    }
    if (st.ok()) {
      // The callback may still be running: do its work here too, so the caller's next
      // read sees this push (read-your-writes).
      p.forget(*p.reply);
      if (ObservesOwnPushes()) cache_.ObserveVersions(p.table, p.reply->versions);
    }
    FoldPush(p.table, *p.reply, st, p.batched, out, &first);
  }
  return PartlyApplied(first, out->landed);
}

Status WorkerService::PartlyApplied(const Status& failed, const std::set<std::string>& landed) {
  if (failed.ok() || landed.empty()) return failed;
  std::string names;
  for (const std::string& t : landed) names += (names.empty() ? "'" : ", '") + t + "'";
  return Status(failed.code(), failed.message() + kPartlyApplied + names + ")");
}

void WorkerService::FoldPush(const std::string& table, const ps::PushReply& reply, const Status& st,
                             bool batched, LearnReply* out, Status* first) {
  // A shard that answered its part applied (or queued) it, whatever the others did.
  if (st.ok() || reply.shards_took > 0) out->landed.insert(table);
  if (!st.ok()) {
    if (first->ok()) {
      // A batch's error names its table already.
      *first =
          batched ? st : Status(st.code(), "push to table '" + table + "' failed: " + st.message());
    }
    return;
  }
  out->tau = std::max(out->tau, reply.max_tau);
  out->version = std::max(out->version, reply.max_version);
  if (!reply.queued) out->versions[table] = reply.versions;
  if (reply.queued) out->outcome = LearnOutcome::kQueued;
}

}  // namespace onlineps::worker
