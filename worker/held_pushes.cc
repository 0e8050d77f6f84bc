#include "worker/held_pushes.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace onlineps::worker {

bool HeldPushes::MayPassOnRetry(const Status& st) {
  switch (st.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kResourceExhausted:
    case StatusCode::kNotPrimary:
    case StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

void HeldPushes::Started(const Push& p) {
  MutexLock lock(&mu_);
  untaken_.emplace(p.seq, p.table);
  newest_ = std::max(newest_, p.seq);
}

bool HeldPushes::Failed(const Push& p, const Status& st) {
  MutexLock lock(&mu_);
  auto it = held_.find(p.seq);
  if (!MayPassOnRetry(st)) {
    untaken_.erase(p.seq);
    if (it != held_.end()) {
      stats_.bytes -= it->second.push.values.size();
      held_.erase(it);
    }
    stats_.dropped_calls += p.calls;
    spdlog::error(
        "push of {} accumulated learns ({} examples) to table '{}' was refused ({}); no "
        "retry can pass, so they are lost although each was answered 'accumulated'",
        p.calls, p.examples, p.table, st.ToString());
    return false;
  }
  if (it == held_.end()) {
    it = held_.emplace(p.seq, Entry{p, false, 1, ""}).first;
    stats_.bytes += p.values.size();
    spdlog::warn(
        "push of {} accumulated learns ({} examples) to table '{}' failed ({}); held to be "
        "pushed again ({} pushes, {} bytes held)",
        p.calls, p.examples, p.table, st.ToString(), held_.size(), stats_.bytes);
  } else {
    it->second.attempts++;
  }
  it->second.in_flight = false;
  it->second.last_error = st.ToString();
  return true;
}

void HeldPushes::Succeeded(const Push& p) {
  MutexLock lock(&mu_);
  untaken_.erase(p.seq);
  auto it = held_.find(p.seq);
  if (it == held_.end()) return;  // a first attempt that passed: never held
  spdlog::info(
      "held push of {} accumulated learns to table '{}' was taken after {} failed attempts",
      p.calls, p.table, it->second.attempts);
  stats_.bytes -= it->second.push.values.size();
  stats_.resolved++;
  held_.erase(it);
}

std::vector<HeldPushes::Push> HeldPushes::TakeForRetry(bool oldest_only) {
  MutexLock lock(&mu_);
  std::vector<Push> out;
  for (auto& [seq, e] : held_) {
    if (e.in_flight) continue;
    e.in_flight = true;
    out.push_back(e.push);
    if (oldest_only) break;
  }
  stats_.retries += out.size();
  return out;
}

Status HeldPushes::CheckRoom() const {
  MutexLock lock(&mu_);
  if (!untaken_.empty() && newest_ - untaken_.begin()->first >= kMaxSeqSpan) {
    const auto& [seq, table] = *untaken_.begin();
    auto it = held_.find(seq);
    return ResourceExhausted(
        "learn refused: the oldest accumulated push this worker has not got the PS to take "
        "(table '" +
        table + "', " + std::to_string(newest_ - seq) +
        " pushes ago; last error: " + (it == held_.end() ? "none yet" : it->second.last_error) +
        ") would be past the shards' dedup window (" + std::to_string(ps::Dedup::kWindow) +
        " pushes) if more followed, and could no longer be told from a new push; it takes "
        "learns again once that push is taken");
  }
  if (stats_.bytes <= max_bytes_) return Status::Ok();
  uint64_t calls = 0;
  for (const auto& [seq, e] : held_) calls += e.push.calls;
  return ResourceExhausted(
      "learn refused: this worker holds " + std::to_string(held_.size()) + " accumulated pushes (" +
      std::to_string(calls) + " learns, " + std::to_string(stats_.bytes) +
      " bytes, over --max-held-bytes " + std::to_string(max_bytes_) +
      ") that the PS has not taken (last error: " + held_.begin()->second.last_error +
      "); it takes learns again once they are pushed");
}

HeldPushes::Stats HeldPushes::stats() const {
  MutexLock lock(&mu_);
  Stats s = stats_;
  s.pushes = held_.size();
  s.calls = 0;
  for (const auto& [seq, e] : held_) s.calls += e.push.calls;
  return s;
}

}  // namespace onlineps::worker
