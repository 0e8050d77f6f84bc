// libFuzzer target: TraceOne (fuzz/fuzz_entries.h) on every input; anything it reports
// aborts, so libFuzzer saves the input. Run by scripts/fuzz.sh.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // error logs for bad input are expected
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = onlineps::fuzz::TraceOne(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "trace_fuzz: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
