// The payoff check's choices kept across processes (payoff_memory.h) and the cache file beneath
// them and the one-thread verdicts (cache_file.h).
#include "payoff_memory.h"
#include "verdicts.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>
#include <fstream>

namespace terra::runtime {
namespace {

PayoffMemory::Choice choice(bool eager, double coexec_s, double eager_s, int64_t hold) {
  PayoffMemory::Choice c;
  c.eager = eager;
  c.coexec_s = coexec_s;
  c.eager_s = eager_s;
  c.hold = hold;
  return c;
}

std::string fresh_dir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / (std::string("terra-payoff-memory-") + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(PayoffMemory, AChoiceStoredByOneProcessIsReadByTheNextWithWhatItLearnt) {
  const std::string file = PayoffMemory::file_in(fresh_dir("roundtrip"));
  PayoffMemory::Choice eager;
  eager.eager = true;
  eager.coexec_s = 0.0125;
  eager.eager_s = 0.01;
  eager.hold = 512;
  eager.workers_asleep = true;
  eager.retimed_coexec = true;
  PayoffMemory::Choice coexec;
  coexec.coexec_s = 0.004;
  coexec.eager_s = 0.006;
  coexec.hold = 8192;
  coexec.workers_settled = true;
  {
    PayoffMemory m(file);
    EXPECT_EQ(m.path(), file);
    EXPECT_FALSE(m.find(42).has_value());
    m.store(42, coexec);
    m.store(43, coexec);
    m.store(42, eager);  // a later check of the same loop wins
    EXPECT_TRUE(m.find(42)->eager);
  }
  PayoffMemory again(file);
  EXPECT_EQ(again.loaded(), 3u);
  const auto a = again.find(42), b = again.find(43);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->eager);
  EXPECT_EQ(a->coexec_s, 0.0125);
  EXPECT_EQ(a->eager_s, 0.01);
  EXPECT_EQ(a->hold, 512);
  EXPECT_TRUE(a->workers_asleep);
  EXPECT_TRUE(a->retimed_coexec);
  EXPECT_FALSE(a->workers_settled);
  EXPECT_FALSE(b->eager);
  EXPECT_EQ(b->hold, 8192);
  EXPECT_FALSE(b->workers_asleep);
  EXPECT_FALSE(b->retimed_coexec);
  EXPECT_TRUE(b->workers_settled);
  EXPECT_FALSE(again.find(0).has_value()) << "key 0: none";
}

TEST(PayoffMemory, APairingInProgressIsKeptWithItsPairsAndWithOrWithoutAChoice) {
  const std::string file = PayoffMemory::file_in(fresh_dir("pairing"));
  PayoffMemory::Choice first = choice(false, 0, 0, 0);
  first.chosen = false;
  first.pairing = true;
  first.pairs = {1.25, 0.75, 1.5, 2.0};  // a fourth is not kept: it decided
  PayoffMemory::Choice rechecked = choice(true, 0.012, 0.01, 128);
  rechecked.pairing = true;
  rechecked.pairs = {0.875};
  PayoffMemory::Choice nothing = choice(false, 0, 0, 0);
  nothing.chosen = false;
  {
    PayoffMemory m(file);
    m.store(1, first);
    m.store(2, rechecked);
    m.store(3, nothing);  // neither a choice nor a pairing: not read back
  }
  PayoffMemory again(file);
  EXPECT_EQ(again.loaded(), 2u);
  const auto a = again.find(1), b = again.find(2);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(a->chosen);
  EXPECT_TRUE(a->pairing);
  EXPECT_EQ(a->pairs, (std::vector<double>{1.25, 0.75, 1.5}));
  EXPECT_TRUE(b->chosen && b->eager && b->pairing);
  EXPECT_EQ(b->hold, 128);
  EXPECT_EQ(b->pairs, (std::vector<double>{0.875}));
  EXPECT_FALSE(again.find(3).has_value());
}

TEST(PayoffMemory, ForeignTornAndNonsenseRecordsAreSkipped) {
  const std::string file = PayoffMemory::file_in(fresh_dir("damaged"));
  { PayoffMemory(file).store(7, PayoffMemory::Choice{}); }
  {
    std::ofstream out(file, std::ios::binary | std::ios::app);
    const char junk[sizeof(PayoffChoiceCodec::Record)] = {1, 2, 3};
    out.write(junk, sizeof junk);  // no tag
    out.write(junk, 11);           // torn
  }
  { PayoffMemory(file).store(8, choice(true, -1.0, 0.5, 32)); }  // a negative time
  PayoffMemory m(file);
  EXPECT_EQ(m.loaded(), 1u);
  EXPECT_TRUE(m.find(7).has_value());
  EXPECT_FALSE(m.find(8).has_value());
}

TEST(PayoffMemory, VerdictsAndChoicesKeepTheirOwnFilesInOneDirectory) {
  const std::string dir = fresh_dir("files");
  EXPECT_NE(PayoffMemory::file_in(dir), Verdicts::file_in(dir));
  EXPECT_EQ(PayoffMemory::file_in(dir).rfind(dir + "/payoff_choices-", 0), 0u);
  EXPECT_EQ(PayoffMemory::file_in(""), "");
  PayoffMemory none("");
  none.store(5, choice(true, 1, 1, 32));
  EXPECT_TRUE(none.find(5).has_value()) << "without a file, kept for the process";
}

TEST(CacheFile, AFileGrownPastItsLimitIsEmptiedAndRecordsAreWhole) {
  const std::string file = fresh_dir("limit") + "/records.bin";
  const uint64_t one = 0x1111111111111111ull, two = 0x2222222222222222ull;
  {
    CacheFile f(file, sizeof(uint64_t), 1024);
    EXPECT_TRUE(f.records().empty());
    f.append(&one);
    f.append(&two);
  }
  {
    std::ofstream out(file, std::ios::binary | std::ios::app);
    out.write("abc", 3);  // a torn record: not read
  }
  {
    CacheFile f(file, sizeof(uint64_t), 1024);
    ASSERT_EQ(f.records().size(), 2 * sizeof(uint64_t));
    uint64_t second = 0;
    std::memcpy(&second, f.records().data() + sizeof(uint64_t), sizeof second);
    EXPECT_EQ(second, two);
  }
  CacheFile emptied(file, sizeof(uint64_t), 8);
  EXPECT_TRUE(emptied.records().empty());
  EXPECT_EQ(std::filesystem::file_size(file), 0u);
}

}  // namespace
}  // namespace terra::runtime
