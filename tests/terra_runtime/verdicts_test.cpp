// The one-thread verdict table and its cache file (verdicts.h).
#include "verdicts.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace terra::runtime {
namespace {

std::string fresh_dir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / (std::string("terra-verdicts-") + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(Verdicts, AVerdictStoredByOneTableIsReadByTheNext) {
  const std::string file = Verdicts::file_in(fresh_dir("roundtrip"));
  {
    Verdicts v(file);
    EXPECT_EQ(v.path(), file);
    EXPECT_EQ(v.loaded(), 0u);
    EXPECT_FALSE(v.find(42).has_value());
    v.store(42, true);
    v.store(43, false);
    v.store(42, false);  // a later verdict for the same signature wins
    EXPECT_EQ(v.find(43), std::optional<bool>(false));
  }
  Verdicts again(file);
  EXPECT_EQ(again.loaded(), 3u);
  EXPECT_EQ(again.find(42), std::optional<bool>(false));
  EXPECT_EQ(again.find(43), std::optional<bool>(false));
  EXPECT_FALSE(again.find(0).has_value()) << "key 0: a kernel without a signature";
}

TEST(Verdicts, ForeignAndTornRecordsAreSkipped) {
  const std::string file = Verdicts::file_in(fresh_dir("damaged"));
  { Verdicts(file).store(7, true); }
  {
    std::ofstream out(file, std::ios::binary | std::ios::app);
    const char junk[16 + 5] = {1, 2, 3};
    out.write(junk, sizeof junk);
  }
  Verdicts v(file);
  EXPECT_EQ(v.loaded(), 1u);
  EXPECT_EQ(v.find(7), std::optional<bool>(true));
}

TEST(Verdicts, AFileGrownPastItsLimitStartsAgain) {
  const std::string file = Verdicts::file_in(fresh_dir("limit"));
  {
    Verdicts v(file);
    for (uint64_t k = 1; k <= 5; ++k) v.store(k, true);  // 80 bytes
  }
  EXPECT_EQ(Verdicts(file, /*max_bytes=*/96).loaded(), 5u);
  Verdicts emptied(file, /*max_bytes=*/64);
  EXPECT_EQ(emptied.loaded(), 0u);
  EXPECT_FALSE(emptied.find(1).has_value());
  EXPECT_EQ(std::filesystem::file_size(file), 0u);
  emptied.store(9, false);
  EXPECT_EQ(Verdicts(file).find(9), std::optional<bool>(false));
}

TEST(Verdicts, AnEnvironmentVariableThatChoosesKernelsNamesAnotherFile) {
  const std::string plain = Verdicts::file_in("/x");
  ::setenv("MKL_CBWR", "COMPATIBLE", 1);
  const std::string reproducible = Verdicts::file_in("/x");
  ::unsetenv("MKL_CBWR");
  EXPECT_NE(plain, reproducible);
  EXPECT_EQ(plain, Verdicts::file_in("/x"));
}

TEST(Verdicts, NoDirectoryMeansNoFile) {
  EXPECT_EQ(Verdicts::file_in(""), "");
  Verdicts v("");
  v.store(5, true);
  EXPECT_EQ(v.find(5), std::optional<bool>(true));
  EXPECT_EQ(v.path(), "");
}

TEST(Verdicts, TheFileNameDependsOnTheMachineAndBuildNotTheDirectory) {
  const std::string a = Verdicts::file_in("/x"), b = Verdicts::file_in("/y");
  EXPECT_EQ(a.substr(2), b.substr(2));
  EXPECT_NE(a.find("one_thread_verdicts-"), std::string::npos);
}

}  // namespace
}  // namespace terra::runtime
