// Tests of the exactly-once push windows (ps/dedup.h): verdicts through the
// Begin/Commit/Abort life of a push, the sliding window, per-sender independence, the
// LRU bound on senders, and the checkpoint round trip.
#include "ps/dedup.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace onlineps::ps {
namespace {

using Verdict = Dedup::Verdict;
constexpr uint64_t kW = Dedup::kWindow;

// Begin + Commit: the push was applied.
void Apply(Dedup& d, uint64_t sender, uint64_t seq) {
  ASSERT_EQ(d.Begin(sender, seq), Verdict::kNew) << "sender " << sender << " seq " << seq;
  d.Commit(sender, seq);
}

TEST(DedupTest, NewPushIsDuplicateAfterCommit) {
  Dedup d;
  EXPECT_EQ(d.Begin(1, 1), Verdict::kNew);
  d.Commit(1, 1);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kDuplicate);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kDuplicate);
  EXPECT_EQ(d.Begin(1, 2), Verdict::kNew);
}

TEST(DedupTest, SamePushBeforeCommitIsInProgress) {
  Dedup d;
  EXPECT_EQ(d.Begin(1, 1), Verdict::kNew);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kInProgress);
  EXPECT_EQ(d.Begin(1, 2), Verdict::kNew);  // another seq is not blocked
  d.Commit(1, 1);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kDuplicate);
  EXPECT_EQ(d.Begin(1, 2), Verdict::kInProgress);
}

TEST(DedupTest, AbortedPushIsNewAgain) {
  Dedup d;
  EXPECT_EQ(d.Begin(1, 5), Verdict::kNew);
  d.Abort(1, 5);
  EXPECT_EQ(d.Begin(1, 5), Verdict::kNew);
  d.Commit(1, 5);
  EXPECT_EQ(d.Begin(1, 5), Verdict::kDuplicate);
  d.Abort(1, 5);  // an abort after commit does not un-apply it
  EXPECT_EQ(d.Begin(1, 5), Verdict::kDuplicate);
}

TEST(DedupTest, OutOfOrderSeqsWithinWindowAreTrackedIndividually) {
  Dedup d;
  Apply(d, 1, 10);
  EXPECT_EQ(d.Begin(1, 3), Verdict::kNew);  // below the highest, never seen
  d.Commit(1, 3);
  EXPECT_EQ(d.Begin(1, 3), Verdict::kDuplicate);
  EXPECT_EQ(d.Begin(1, 10), Verdict::kDuplicate);
  EXPECT_EQ(d.Begin(1, 4), Verdict::kNew);
}

TEST(DedupTest, SeqBelowWindowIsTooOld) {
  Dedup d;
  Apply(d, 1, 1);
  Apply(d, 1, kW + 10);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kTooOld);
  EXPECT_EQ(d.Begin(1, 10), Verdict::kTooOld);  // exactly kWindow below the highest
  EXPECT_EQ(d.Begin(1, 11), Verdict::kNew);     // the oldest seq still in the window
  EXPECT_EQ(d.Begin(1, kW + 10), Verdict::kDuplicate);
}

TEST(DedupTest, SlidingWindowForgetsBitsOfSeqsThatLeftIt) {
  Dedup d;
  for (uint64_t s = 1; s <= 8; ++s) Apply(d, 1, s);
  // Slide by less than a window: seqs 5..8 stay in it (and stay applied); 1..4 leave,
  // and their bit positions now belong to kW+1..kW+4, which were never applied.
  Apply(d, 1, kW + 4);
  for (uint64_t s = 5; s <= 8; ++s) EXPECT_EQ(d.Begin(1, s), Verdict::kDuplicate) << s;
  for (uint64_t s = 1; s <= 4; ++s) EXPECT_EQ(d.Begin(1, s), Verdict::kTooOld) << s;
  for (uint64_t s = kW + 1; s <= kW + 3; ++s) EXPECT_EQ(d.Begin(1, s), Verdict::kNew) << s;
  EXPECT_EQ(d.Begin(1, kW + 4), Verdict::kDuplicate);
}

// The largest seqs are seqs like any other: a window sliding up to 2^64 - 1 ends there
// (its loop once wrapped past it and never ended, holding the lock every push takes).
TEST(DedupTest, TheWindowSlidesUpToTheLargestSeq) {
  auto* d = new Dedup;  // leaked: a Begin that never returns still holds it
  std::atomic<bool> done{false};
  std::thread([d, &done] {
    Apply(*d, 1, UINT64_MAX - 1);
    Apply(*d, 1, UINT64_MAX);
    done = true;
  }).detach();
  for (int i = 0; i < 500 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(done) << "Begin(1, 2^64 - 1) after Begin(1, 2^64 - 2) did not return";
  EXPECT_EQ(d->Begin(1, UINT64_MAX), Verdict::kDuplicate);
  EXPECT_EQ(d->Begin(1, UINT64_MAX - 1), Verdict::kDuplicate);
  EXPECT_EQ(d->Begin(1, UINT64_MAX - 2), Verdict::kNew);
  delete d;
}

TEST(DedupTest, SeqZeroIsNeverDeduplicated) {
  Dedup d;
  EXPECT_EQ(d.Begin(1, 0), Verdict::kNew);
  d.Commit(1, 0);
  EXPECT_EQ(d.Begin(1, 0), Verdict::kNew);
  EXPECT_EQ(d.senders(), 0u);
}

TEST(DedupTest, SendersAreIndependent) {
  Dedup d;
  Apply(d, 1, 1);
  EXPECT_EQ(d.Begin(2, 1), Verdict::kNew);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kDuplicate);
  d.Abort(2, 1);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kDuplicate);
  Apply(d, 2, kW + 100);  // sender 2's window moves; sender 1's does not
  EXPECT_EQ(d.Begin(1, 2), Verdict::kNew);
  EXPECT_EQ(d.senders(), 2u);
}

TEST(DedupTest, LeastRecentlySeenSenderIsEvictedPastMaxSenders) {
  Dedup d(/*max_senders=*/2);
  Apply(d, 1, 1);
  Apply(d, 2, 1);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kDuplicate);  // sender 1 is now the most recent
  Apply(d, 3, 1);                                 // evicts sender 2
  EXPECT_EQ(d.senders(), 2u);
  EXPECT_EQ(d.evictions(), 1u);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kDuplicate);
  EXPECT_EQ(d.Begin(3, 1), Verdict::kDuplicate);
  // Its window is gone, but not its highest seq: a retry at or below it cannot be told
  // from a push applied before, so it is refused rather than applied a second time.
  EXPECT_EQ(d.Begin(2, 1), Verdict::kTooOld);
  EXPECT_EQ(d.senders(), 2u);
  EXPECT_EQ(d.evictions(), 2u);
  // A backup applying its primary's log does not refuse what the primary applied.
  EXPECT_EQ(d.Begin(2, 1, /*refuse_forgotten=*/false), Verdict::kNew);
  d.Abort(2, 1);
  EXPECT_EQ(d.Begin(2, 2), Verdict::kNew);  // its new pushes go on
  d.Commit(2, 2);
  EXPECT_EQ(d.Begin(2, 2), Verdict::kDuplicate);
}

// Evicted senders' highest seqs are kept for 4 x max_senders senders: past that, a
// sender's window starts over (its old retries would be applied again).
TEST(DedupTest, EvictedSendersAreRememberedForFourTimesMaxSenders) {
  Dedup d(/*max_senders=*/2);
  Apply(d, 1, 5);
  for (uint64_t s = 2; s <= 9; ++s) Apply(d, s, 1);  // evicts 1..7; 1 is the oldest of 8
  EXPECT_EQ(d.Begin(1, 5), Verdict::kTooOld);        // remembered (7 evicted <= 8)
  EXPECT_EQ(d.Begin(1, 3), Verdict::kTooOld);
  EXPECT_EQ(d.Begin(1, 6), Verdict::kNew);
  Dedup e(/*max_senders=*/2);
  Apply(e, 1, 5);
  for (uint64_t s = 2; s <= 11; ++s) Apply(e, s, 1);  // 10 evicted: 1 falls out of 8
  EXPECT_EQ(e.Begin(1, 5), Verdict::kNew);
}

TEST(DedupTest, SaveLoadRoundTripKeepsDuplicatesRecognised) {
  Dedup d;
  Apply(d, 1, 1);
  Apply(d, 1, 3);
  Apply(d, 7, kW + 50);
  EXPECT_EQ(d.Begin(7, kW + 60), Verdict::kNew);  // in progress: not applied, not saved
  ByteWriter w;
  d.Save(&w);

  Dedup loaded;
  ByteReader r(w.buffer().data(), w.buffer().size());
  ASSERT_TRUE(loaded.Load(&r).ok());
  EXPECT_EQ(r.Remaining(), 0u);
  EXPECT_EQ(loaded.senders(), 2u);
  EXPECT_EQ(loaded.Begin(1, 1), Verdict::kDuplicate);
  EXPECT_EQ(loaded.Begin(1, 3), Verdict::kDuplicate);
  EXPECT_EQ(loaded.Begin(1, 2), Verdict::kNew);
  EXPECT_EQ(loaded.Begin(7, kW + 50), Verdict::kDuplicate);
  EXPECT_EQ(loaded.Begin(7, 50), Verdict::kTooOld);  // the window position survives
  EXPECT_EQ(loaded.Begin(7, kW + 60), Verdict::kNew);
}

TEST(DedupTest, LoadKeepsRecencyOrderForEviction) {
  Dedup d(3);
  Apply(d, 1, 1);
  Apply(d, 2, 1);
  Apply(d, 3, 1);
  EXPECT_EQ(d.Begin(1, 1), Verdict::kDuplicate);  // recency now: 1, 3, 2 (2 oldest)
  ByteWriter w;
  d.Save(&w);
  Dedup loaded(3);
  ByteReader r(w.buffer().data(), w.buffer().size());
  ASSERT_TRUE(loaded.Load(&r).ok());
  Apply(loaded, 4, 1);  // evicts the least recently seen: 2
  EXPECT_EQ(loaded.Begin(1, 1), Verdict::kDuplicate);
  EXPECT_EQ(loaded.Begin(3, 1), Verdict::kDuplicate);
  EXPECT_EQ(loaded.Begin(2, 1), Verdict::kTooOld);  // evicted (its high remembered)
}

TEST(DedupTest, TruncatedLoadFailsAndLeavesStateUnchanged) {
  Dedup d;
  Apply(d, 1, 1);
  Apply(d, 2, 1);
  ByteWriter w;
  d.Save(&w);
  Dedup target;
  Apply(target, 9, 4);
  ByteReader r(w.buffer().data(), w.buffer().size() - 1);
  Status st = target.Load(&r);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(target.Begin(9, 4), Verdict::kDuplicate);
  EXPECT_EQ(target.Begin(1, 1), Verdict::kNew);
  EXPECT_EQ(target.senders(), 2u);  // 9 and the 1 just begun
}

}  // namespace
}  // namespace onlineps::ps
