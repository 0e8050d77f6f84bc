#include "mcp_bridge/tool_call_adapter.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "common/sha256.h"
#include "mcp_bridge/session_table.h"

namespace onlineps::bridge {

namespace {
// The session as a trace names it: an MCP session's id is a bearer secret (whoever holds
// it is that session), so "m:<id>" is recorded as "m:" and the first 32 hex digits of the
// SHA-256 of the key, which keeps the trace's calls grouped by session without it. Other
// keys (a tool's own `session` name) are kept.
std::string TraceSessionKey(const std::string& key) {
  // The kind ("m:" or "s:") follows the identity's prefix.
  const std::string prefix = SessionTable::PrefixOf(SessionTable::IdentityOf(key));
  if (key.compare(prefix.size(), 2, "m:") != 0) return key;
  return prefix + "m:" + Sha256Hex(key).substr(0, 32);
}
}  // namespace

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// MCP's ProgressToken: a string or any number.
bool IsProgressToken(const json& token) { return token.is_string() || token.is_number(); }

int64_t Micros(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

}  // namespace

json CallToolResult(ToolResult&& result) {
  if (result.is_error) {
    return {{"content", {{{"type", "text"}, {"text", result.error}}}}, {"isError", true}};
  }
  return {{"content",
           {{{"type", "text"},
             {"text", result.structured.dump(-1, ' ', false, json::error_handler_t::replace)}}}},
          {"structuredContent", std::move(result.structured)},
          {"isError", false}};
}

// A successful result serialized once: the structured result's JSON is the text content
// (as a JSON string) and the structured content (spliced as it is), so the answer is not
// built as a document and serialized a second time. The same bytes as CallToolResult's
// document serialized. Errors, and stateless requests (whose result McpServer extends),
// keep the document.
Outcome ToolOutcome(ToolResult&& result, bool stateless) {
  if (result.is_error || stateless) return Outcome::Ok(CallToolResult(std::move(result)));
  const std::string structured =
      result.structured.dump(-1, ' ', false, json::error_handler_t::replace);
  Outcome o;
  o.result_text.reserve(2 * structured.size() + 80);
  o.result_text = R"({"content":[{"text":)";
  o.result_text += json(structured).dump(-1, ' ', false, json::error_handler_t::replace);
  o.result_text += R"(,"type":"text"}],"isError":false,"structuredContent":)";
  o.result_text += structured;
  o.result_text += '}';
  return o;
}

ToolCallAdapter::ToolCallAdapter(ToolCallAdapterOptions options, Tools* tools, Recorder* recorder)
    : options_(options), tools_(tools), recorder_(recorder) {}

std::vector<ToolDefinition> ToolCallAdapter::Definitions() {
  std::vector<ToolDefinition> out;
  for (const json& declaration : tools_->List()) {
    const std::string name = declaration["name"];
    ToolDefinition d;
    d.declaration = declaration;
    d.async_handler = [this, name](const json& arguments, const CallContext& ctx, Respond respond) {
      Call(name, arguments, ctx, std::move(respond));
    };
    d.blocks = tools_->Blocks(name);
    d.ordered = tools_->Ordered(name);
    d.streams = [this, name](const json& params) {
      const json meta = params.value("_meta", json::object());
      if (!meta.is_object() || !IsProgressToken(meta.value("progressToken", json()))) return false;
      const json args = params.value("arguments", json::object());
      return args.is_object() && tools_->SendsProgress(name, args);
    };
    out.push_back(std::move(d));
  }
  return out;
}

void ToolCallAdapter::Call(const std::string& name, const json& arguments, const CallContext& ctx,
                           Respond respond) {
  const auto start = Clock::now();
  const Request& req = *ctx.request;  // valid until `respond`
  auto call = std::make_shared<ToolCall>();
  call->name = name;
  call->arguments = arguments;
  ToolResult bad;
  if (auto s = arguments.find("session"); s != arguments.end()) {
    std::string problem = s->is_string() ? CheckSessionName(*s) : "session must be a string";
    if (!problem.empty()) {
      bad.is_error = true;
      bad.error = problem;
    } else {
      call->session = SessionTable::PrefixOf(req.principal) + "s:" + s->get<std::string>();
    }
  } else {
    call->session = ctx.session_key;  // "" when stateless: no session
  }
  // Stateless handles are chosen by the client: a new one per call must not dodge the
  // limit, so stateless calls are limited per identity.
  if (!Allow(req.stateless ? "identity|" + req.principal : "session|" + req.session_id)) {
    return respond(Outcome::Error(kServerError, RateLimitMessage(req.stateless), nullptr, 429));
  }
  const json token = ctx.progress_token;
  if (req.notify && IsProgressToken(token)) {
    call->progress = [&req, token](double p, double total, const std::string& msg) {
      req.notify(
          {{"jsonrpc", "2.0"},
           {"method", "notifications/progress"},
           {"params",
            {{"progressToken", token}, {"progress", p}, {"total", total}, {"message", msg}}}});
    };
  }
  call->cancelled = ctx.cancelled;
  if (bad.is_error) {
    Trace(*call, bad, start, start, start);
    return respond(Outcome::Ok(CallToolResult(std::move(bad))));
  }
  // Calls of one session that reach a worker run one at a time, in the order they
  // arrived. Calls without a session share nothing, and the tools the bridge answers
  // alone (get_context, model_info) never queue behind a worker call: no gate.
  const bool gated = !call->session.empty() && tools_->Ordered(call->name);
  auto run = [this, call, start, gated, stateless = req.stateless,
              respond = std::move(respond)]() mutable {
    const auto admitted = Clock::now();
    if (call->cancelled && call->cancelled->load()) {
      // Cancelled, or its session ended, while it waited its turn: it must not run (a
      // set_context would bring back the context the session's end dropped).
      if (gated) gate_.Leave(call->session);
      ToolResult cancelled;
      cancelled.is_error = true;
      cancelled.error = "cancelled before it ran";
      Trace(*call, cancelled, start, admitted, admitted);
      return respond(Outcome::Ok(CallToolResult(std::move(cancelled))));
    }
    Run(*call, [this, call, start, admitted, gated, stateless,
                respond = std::move(respond)](ToolResult result) {
      const auto released = Clock::now();
      if (gated) gate_.Leave(call->session);
      Trace(*call, result, start, admitted, released);
      respond(ToolOutcome(std::move(result), stateless));
    });
  };
  if (!gated) return run();
  if (tools_->Blocks(call->name)) {
    // Its turn is waited for here: this thread may block (the tool will anyway), and a
    // blocking call must never run on the thread that hands it the turn.
    gate_.EnterAndWait(call->session);
    return run();
  }
  gate_.Enter(call->session, std::move(run));
}

void ToolCallAdapter::AfterCalls(const std::string& key, const std::function<void()>& end) {
  gate_.EnterAndWait(key);
  try {
    end();
  } catch (...) {
    gate_.Leave(key);
    throw;
  }
  gate_.Leave(key);
}

void ToolCallAdapter::Run(const ToolCall& call, Tools::ToolDone done) {
  auto ran = std::make_shared<std::atomic<bool>>(false);
  Tools::ToolDone once = [ran, done = std::move(done)](ToolResult result) {
    if (!ran->exchange(true)) done(std::move(result));
  };
  ToolResult result;
  try {
    return tools_->CallAsync(call, once);
  } catch (const std::exception& e) {  // nothing may escape into the transport's threads
    result.error = std::string("internal error: ") + e.what();
  } catch (...) {
    result.error = "internal error";
  }
  result.is_error = true;
  once(std::move(result));
}

void ToolCallAdapter::Trace(const ToolCall& call, const ToolResult& result, Clock::time_point start,
                            Clock::time_point admitted, Clock::time_point released) {
  if (!recorder_ && !observer_) return;
  const auto end = Clock::now();
  TraceRecord rec;
  rec.session = TraceSessionKey(call.session);
  rec.tool = call.name;
  if (recorder_) rec.arguments = call.arguments;  // the metrics observer does not read them
  rec.is_error = result.is_error;
  rec.summary = result.is_error ? result.error : result.summary;
  rec.worker = result.worker;
  rec.version = result.version;
  rec.tau = result.tau;
  rec.latency_us = Micros(end - start);
  rec.end_steady_us = Micros(end.time_since_epoch());
  rec.wait_us = Micros(admitted - start);
  rec.run_us = Micros(released - admitted);
  if (recorder_) recorder_->Record(rec);
  if (observer_) observer_(rec);
}

std::string ToolCallAdapter::RateLimitMessage(bool stateless) const {
  // %g: the limit as the operator wrote it ("2", "0.5"), not std::to_string's "2.000000".
  char flags[96];
  std::snprintf(flags, sizeof(flags), "--rate-limit %g, --rate-burst %g", options_.rate_limit,
                options_.rate_burst);
  char rate[32];
  std::snprintf(rate, sizeof(rate), "%g", options_.rate_limit);
  const std::string whose =
      stateless ? " calls/s from this client, whose stateless calls share one bucket"
                : " calls/s on this session";
  return "rate limit: more than " + std::string(rate) + whose + " (" + flags +
         "); slow down and retry";
}

bool ToolCallAdapter::Allow(const std::string& key) {
  if (options_.rate_limit <= 0) return true;
  MutexLock lock(&rate_mu_);
  const auto now = Clock::now();
  if (buckets_.size() > 2 * options_.max_sessions) {
    // Bounded: drop the buckets that have refilled anyway (idle callers), not everyone's.
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      const double idle_s = std::chrono::duration<double>(now - it->second.at).count();
      if (it->second.tokens + idle_s * options_.rate_limit >= options_.rate_burst) {
        it = buckets_.erase(it);
      } else {
        ++it;
      }
    }
  }
  auto [it, fresh] = buckets_.try_emplace(key, Bucket{options_.rate_burst, now});
  Bucket& b = it->second;
  const double dt = std::chrono::duration<double>(now - b.at).count();
  b.tokens = std::min(options_.rate_burst, b.tokens + dt * options_.rate_limit);
  b.at = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

}  // namespace onlineps::bridge
