// The torch-free replay models. Gradients are written out by hand; they are small
// enough that a mistake shows in the golden checks and in the loss curves.
#include "replay/models.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace onlineps::replay {
namespace {

using worker::ContextInput;
using worker::Example;
using worker::GradOutput;
using worker::InferOutput;
using worker::ParamInfo;
using worker::ParamKind;
using worker::ParamView;
using worker::SparseRows;

class QuadraticModel : public worker::Model {
 public:
  explicit QuadraticModel(const QuadraticOptions& o) : options_(o) {
    ParamInfo p;
    p.name = o.table;
    p.kind = ParamKind::kDense;
    p.shape = {o.dim};
    p.init = "constant";
    p.init_value = o.x0;
    params_.push_back(p);
  }
  const std::vector<ParamInfo>& params() const override { return params_; }
  const std::vector<std::string>& labels() const override { return labels_; }
  std::string device() const override { return "cpu"; }
  StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(const std::vector<Example>&,
                                                          const ContextInput&) const override {
    return std::vector<std::vector<uint64_t>>(1);
  }
  StatusOr<InferOutput> Infer(const std::vector<Example>& batch, const ContextInput&,
                              const ParamView&) override {
    InferOutput out;
    out.scores.assign(batch.size(), {1.0f});
    out.predicted.assign(batch.size(), 0);
    return out;
  }
  // The batch does not matter: the loss is deterministic in x.
  StatusOr<GradOutput> Gradients(const std::vector<Example>&, const ContextInput&,
                                 const ParamView& params) override {
    const float* x = params.dense[0];
    GradOutput g;
    g.dense.resize(1);
    g.sparse.resize(1);
    g.dense[0].resize(options_.dim);
    double loss = 0;
    for (uint32_t i = 0; i < options_.dim; ++i) {
      g.dense[0][i] = static_cast<float>(options_.h * x[i]);
      loss += 0.5 * options_.h * static_cast<double>(x[i]) * x[i];
    }
    g.loss = loss;
    return g;
  }

 private:
  QuadraticOptions options_;
  std::vector<ParamInfo> params_;
  std::vector<std::string> labels_ = {"x"};
};

constexpr uint64_t kBiasKey = 0xb1a5b1a5b1a5b1a5ULL;

class SparseLrModel : public worker::Model {
 public:
  explicit SparseLrModel(const SparseLrOptions& o) : options_(o) {
    ParamInfo p;
    p.name = o.table;
    p.kind = ParamKind::kSparse;
    p.shape = {1};
    p.init = "zeros";
    p.init_value = 0;
    params_.push_back(p);
  }
  const std::vector<ParamInfo>& params() const override { return params_; }
  const std::vector<std::string>& labels() const override { return options_.labels; }
  std::string device() const override { return "cpu"; }

  StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(const std::vector<Example>& batch,
                                                          const ContextInput&) const override {
    std::vector<uint64_t> keys = {BiasKey()};
    for (const Example& e : batch) {
      std::vector<uint64_t> k = Features(e);
      keys.insert(keys.end(), k.begin(), k.end());
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return std::vector<std::vector<uint64_t>>{std::move(keys)};
  }

  StatusOr<InferOutput> Infer(const std::vector<Example>& batch, const ContextInput&,
                              const ParamView& params) override {
    InferOutput out;
    for (const Example& e : batch) {
      const double p = Probability(e, *params.sparse[0]);
      out.scores.push_back({static_cast<float>(1 - p), static_cast<float>(p)});
      out.predicted.push_back(p >= 0.5 ? 1 : 0);
    }
    return out;
  }

  // Log loss of binary features: d/dw_k = (p - y) for every feature k present.
  StatusOr<GradOutput> Gradients(const std::vector<Example>& batch, const ContextInput&,
                                 const ParamView& params) override {
    const SparseRows& rows = *params.sparse[0];
    GradOutput g;
    g.dense.resize(1);
    g.sparse.resize(1);
    g.sparse[0].keys = rows.keys;
    g.sparse[0].values.assign(rows.keys.size(), 0.0f);
    double loss = 0;
    const double scale = 1.0 / static_cast<double>(std::max<size_t>(batch.size(), 1));
    for (const Example& e : batch) {
      if (e.label < 0 || e.label > 1) {
        return InvalidArgument("sparse-lr: label " + std::to_string(e.label) + " is not 0 or 1");
      }
      const double p = Probability(e, rows);
      const double y = static_cast<double>(e.label);
      loss -= y * std::log(std::max(p, 1e-12)) + (1 - y) * std::log(std::max(1 - p, 1e-12));
      const float d = static_cast<float>((p - y) * scale);
      g.sparse[0].values[Index(rows, BiasKey())] += d;
      // d/dw_k = (p - y) x_k
      ForEachFeature(e, [&](uint64_t k, float x) { g.sparse[0].values[Index(rows, k)] += d * x; });
    }
    g.loss = loss * scale;
    return g;
  }

 private:
  uint64_t BiasKey() const { return options_.buckets ? options_.buckets : kBiasKey; }
  uint64_t Key(uint64_t feature) const {
    return options_.buckets ? feature % options_.buckets : feature;
  }
  // Distinct keys of one example: its numeric sparse features (libsvm), or else its hashed
  // words (binary bag of words).
  std::vector<uint64_t> Features(const Example& e) const {
    std::vector<uint64_t> keys =
        e.sparse_keys.empty() ? worker::TextFeatureKeys(e.text, options_.bigrams) : e.sparse_keys;
    for (uint64_t& k : keys) k = Key(k);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
  }
  // Calls fn(key, x) for each feature of `e`: its numeric sparse features (libsvm) with
  // their values, or else each distinct hashed word with x = 1.
  template <typename Fn>
  void ForEachFeature(const Example& e, Fn fn) const {
    if (e.sparse_keys.empty()) {
      for (uint64_t k : Features(e)) fn(k, 1.0f);
      return;
    }
    for (size_t j = 0; j < e.sparse_keys.size(); ++j) fn(Key(e.sparse_keys[j]), e.sparse_values[j]);
  }
  // REQUIRES: k is among rows.keys (SparseKeys of the same batch); rows.keys sorted.
  static size_t Index(const SparseRows& rows, uint64_t k) {
    return static_cast<size_t>(std::lower_bound(rows.keys.begin(), rows.keys.end(), k) -
                               rows.keys.begin());
  }
  double Probability(const Example& e, const SparseRows& rows) const {
    auto weight = [&](uint64_t k) {
      const size_t i = Index(rows, k);
      return i < rows.keys.size() && rows.keys[i] == k ? rows.values[i] : 0.0f;
    };
    double z = 0;
    ForEachFeature(e, [&](uint64_t k, float x) { z += static_cast<double>(weight(k)) * x; });
    z += weight(BiasKey());  // last, as it always was: runs repeat bit for bit across versions
    return 1.0 / (1.0 + std::exp(-z));
  }

  SparseLrOptions options_;
  std::vector<ParamInfo> params_;
};

}  // namespace

std::unique_ptr<worker::Model> MakeQuadraticModel(const QuadraticOptions& options) {
  return std::make_unique<QuadraticModel>(options);
}

std::unique_ptr<worker::Model> MakeSparseLrModel(const SparseLrOptions& options) {
  return std::make_unique<SparseLrModel>(options);
}

StatusOr<std::unique_ptr<worker::Model>> CreateReplayModel(const std::string& kind,
                                                           const worker::ModelOptions& options,
                                                           const ModelFactory& fallback) {
  if (kind == "quadratic") {
    QuadraticOptions q;
    q.dim = std::max<uint32_t>(1, options.input_dim);
    q.table = options.table_prefix + q.table;
    return MakeQuadraticModel(q);
  }
  if (kind == "sparse-lr") {
    SparseLrOptions s;
    s.bigrams = options.bigrams;
    s.labels = options.labels;
    s.table = options.table_prefix + s.table;
    if (s.labels.size() != 2) {
      return InvalidArgument("sparse-lr needs exactly 2 labels, got " +
                             std::to_string(s.labels.size()));
    }
    return MakeSparseLrModel(s);
  }
  if (!fallback) return InvalidArgument("unknown model kind '" + kind + "'");
  worker::ModelOptions o = options;
  o.kind = kind;
  return fallback(o);
}

}  // namespace onlineps::replay
