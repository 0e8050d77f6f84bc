// Entry points shared by the libFuzzer targets (fuzz/*_fuzz.cc) and the regression test
// (tests/system/fuzz_regression_test.cc): each runs one input through the real decoders or
// request handlers and checks what came back. Each returns "" when the input was handled
// cleanly (a result, or an error Status / JSON-RPC error), else what went wrong; a
// crash, a sanitizer report or an escaped exception is a failure too. Not thread-safe:
// one input at a time.
#ifndef ONLINEPS_FUZZ_FUZZ_ENTRIES_H_
#define ONLINEPS_FUZZ_FUZZ_ENTRIES_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace onlineps::fuzz {

// The input is a header frame (wire_entry.cc).
std::string WireOne(const uint8_t* data, size_t size);

// Byte 0 picks the transport (an HTTP POST body or stdio lines) and the request's
// session, protocol-version header and identity (see mcp_entry.cc); the rest is the body.
std::string McpOne(const uint8_t* data, size_t size);

// The whole input is a trace file: a header line, then records (see trace_entry.cc).
std::string TraceOne(const uint8_t* data, size_t size);

}  // namespace onlineps::fuzz

#endif  // ONLINEPS_FUZZ_FUZZ_ENTRIES_H_
