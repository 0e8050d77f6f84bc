// Flags of onlineps_replay and their translation into the library's option structs.
// Every flag is documented in docs/replay.md and docs/configuration.md.
#ifndef ONLINEPS_REPLAY_REPLAY_FLAGS_H_
#define ONLINEPS_REPLAY_REPLAY_FLAGS_H_

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "replay/dataset.h"
#include "replay/replayer.h"
#include "replay/schedule.h"
#include "replay/trace_steps.h"
#include "worker/model.h"

namespace onlineps::replay {

struct Flags {
  // workload
  std::string dataset = "fashion-mnist";
  std::string trace;
  std::string data_dir;
  size_t max_train = 0, max_test = 0;
  uint64_t split_seed = 1;
  double test_fraction = 0.2;
  std::string label_column, csv_header = "auto", test_file, normalize = "standard";
  bool no_shuffle = false;
  uint32_t batch = 32;
  uint32_t epochs = 1;
  uint64_t updates = 0;
  uint32_t learn_chunk = 64;
  uint32_t loop = 1;
  uint64_t limit = 0;
  // model
  std::string model = "mlp";
  std::vector<uint32_t> hidden;  // empty: mlp 128, text none; {0}: none
  uint32_t embed_dim = 32;
  std::vector<std::string> labels = {"negative", "positive"};
  uint32_t buckets = 1u << 18;
  bool bigrams = false;
  std::string model_file;
  std::vector<std::string> trainable, frozen;  // torchscript: worker::ModelOptions's globs
  int torch_threads = 1;
  double quad_h = 1.0;
  double quad_x0 = 1.0;
  // schedule
  uint32_t workers = 1;
  std::string compute = "fixed:1";
  std::string message = "none";
  std::string staleness;
  std::vector<double> worker_speed;
  std::vector<std::string> stragglers, churn;
  bool sync = false;
  uint64_t seed = 1;
  // parameter server
  std::vector<std::string> ps;
  uint32_t shards = 1;
  int ps_timeout_ms = 30000;
  std::string optimizer = "sgd";
  double lr = 0.1;
  std::vector<std::string> opt_params;
  std::string staleness_policy = "none";
  std::vector<std::string> staleness_params;
  int64_t max_staleness = -1;
  uint32_t accumulate = 0;  // 0: 1, or the number of workers with --sync
  bool polyak = false;
  uint64_t polyak_start = 0;
  bool eval_averaged = false;
  // mode and output
  std::string mode = "logical";
  double speed = 1.0;
  double max_gap_ms = 0;
  double duration_s = 0;
  bool dry_run = false;
  std::string out = "replay-out";
  std::string run_name;
  bool events = false;
  bool no_plots = false;
  uint64_t eval_every = 0;
  size_t eval_rows = 0;
  bool progressive = false;
  bool quiet = false;
  // --bridge: send the trace's tool calls to a running MCP bridge
  std::string bridge;
  std::string bridge_token_file;
  uint32_t connections = 16;
  int call_timeout_ms = 30000;
};

void AddFlags(CLI::App& app, Flags* f);
// The bearer token for --bridge: the first non-blank, non-# line of --bridge-token-file,
// else $ONLINEPS_BRIDGE_TOKEN, else "". Errors name the file.
StatusOr<std::string> BridgeToken(const Flags& f);
// Cross-flag checks: kInvalidArgument naming the flags.
Status CheckFlags(const Flags& f);

DatasetOptions DatasetOptionsOf(const Flags& f);
StatusOr<ScheduleOptions> ScheduleOptionsOf(const Flags& f);
Status ReplayOptionsOf(const Flags& f, ReplayOptions* out);
ClusterOptions ClusterOptionsOf(const Flags& f);
// The model for the workload: input width and labels come from the dataset or trace.
StatusOr<std::unique_ptr<worker::Model>> MakeModel(const Flags& f, const Dataset& data,
                                                   const TraceSteps& steps);
// A trace whose header lists its tables must match the model's (name, kind, shape).
Status CheckTraceTables(const TraceHeader& header, const worker::Model& model);

nlohmann::json ResultJson(const ReplayResult& r);
// manifest.json, curve.csv, staleness.csv, tau_histogram.csv and (unless --no-plots)
// the plots under f.out.
Status WriteOutputs(const Flags& f, const nlohmann::json& manifest, const ReplayResult& r);
void PrintSummary(const Flags& f, const ReplayResult& r);

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_REPLAY_FLAGS_H_
