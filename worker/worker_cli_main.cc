// onlineps_worker_cli: one worker RPC from the command line, JSON in and out.
//   onlineps_worker_cli --worker tcp://127.0.0.1:7200 infer '{"text": "great film"}'
//   onlineps_worker_cli learn '{"examples": [{"text": "great", "label": "positive"}]}'
//   onlineps_worker_cli context_set '{"session": "s1", "items": ["likes sci-fi"]}'
//   onlineps_worker_cli worker_stats
//   onlineps_worker_cli model_info '{"verify": true}'
// Exit status: 0 ok, 1 the worker answered an error (printed), 2 bad usage.
#include <CLI/CLI.hpp>
#include <iostream>
#include <map>

#include "common/config.h"
#include "common/curve.h"
#include "common/flags.h"
#include "worker/worker_client.h"

int main(int argc, char** argv) {
  using onlineps::Op;
  const std::map<std::string, Op> ops = {
      {"infer", Op::kInfer},
      {"learn", Op::kLearn},
      {"context_set", Op::kContextSet},
      {"context_append", Op::kContextAppend},
      {"context_clear", Op::kContextClear},
      {"context_get", Op::kContextGet},
      {"worker_stats", Op::kWorkerStats},
      {"model_info", Op::kModelInfo},
  };
  std::string endpoint = "tcp://127.0.0.1:7200", op_name, body_text = "{}";
  int timeout_ms = 10000;
  CLI::App app("Send one request to an onlineps worker and print the reply as JSON");
  app.add_option("--worker", endpoint,
                 "Worker RPC endpoint (default: the first worker of scripts/run_local.sh; not the "
                 "MCP port)")
      ->envname("ONLINEPS_WORKER")
      ->capture_default_str();
  app.add_option("--timeout-ms", timeout_ms, "Deadline of the call")
      ->check(onlineps::TimeoutMs())
      ->capture_default_str();
  app.add_option("op", op_name,
                 "infer | learn | context_set | context_append | "
                 "context_clear | context_get | worker_stats | model_info")
      ->required();
  app.add_option("body", body_text, "Request body as JSON (docs/protocol.md, Worker RPC)");
  onlineps::CurveFlags curve;
  onlineps::AddCurveFlags(app, &curve, /*server=*/false, /*client=*/true);
  auto parsed = onlineps::ParseFlags(app, argc, argv);
  if (!parsed.ok()) {
    std::cerr << "onlineps_worker_cli: " << parsed.status().message() << "\n";
    return 2;
  }
  if (parsed->exit_now) return 0;
  const auto op = ops.find(op_name);
  if (op == ops.end()) {
    std::cerr << "onlineps_worker_cli: unknown op '" << op_name << "'\n";
    return 2;
  }
  nlohmann::json body = nlohmann::json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    std::cerr << "onlineps_worker_cli: body is not a JSON object: " << body_text << "\n";
    return 2;
  }
  onlineps::worker::WorkerClientOptions o;
  o.endpoint = endpoint;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  auto loaded = onlineps::LoadCurve(curve);
  if (!loaded.ok()) {
    std::cerr << "onlineps_worker_cli: " << loaded.status().message() << "\n";
    return 2;
  }
  o.transport.curve = *loaded;
  auto client = onlineps::worker::WorkerClient::Connect(o);
  if (!client.ok()) {
    std::cerr << "onlineps_worker_cli: " << client.status().ToString() << "\n";
    return 1;
  }
  auto reply = (*client)->Call(op->second, body);
  if (!reply.ok()) {
    std::cerr << "onlineps_worker_cli: " << reply.status().ToString() << "\n";
    return 1;
  }
  std::cout << reply->dump(2) << "\n";
  return 0;
}
