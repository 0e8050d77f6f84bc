// Model: what a worker runs. Implementations (text, mlp, torchscript) live in .cc files
// that include libtorch; this header is torch-free so the rest of the worker, the tests
// and the bridge compile in seconds. A model is stateless: every call gets the
// parameters it may read in a ParamView, and returns gradients instead of applying them.
// Thread-safe: Infer and Gradients may run concurrently from several threads.
#ifndef ONLINEPS_WORKER_MODEL_H_
#define ONLINEPS_WORKER_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace onlineps::worker {

// One example as it arrives over the RPC. Which field a model reads: text model ->
// text; mlp -> features; torchscript -> features (dense input) or text (hashed ids).
struct Example {
  std::string text;
  std::vector<float> features;
  int64_t label = -1;  // learn: class index into Model::labels()
  // Sparse numeric features (replay's libsvm datasets; read by replay's sparse-lr model):
  // sparse_values[i] is the value of feature sparse_keys[i]. Not part of the worker RPC.
  std::vector<uint64_t> sparse_keys = {};
  std::vector<float> sparse_values = {};
};

// What a session's context contributes to that session's forward passes. It is input,
// never a parameter: no gradient is ever taken with respect to it.
struct ContextInput {
  std::string text;             // recent text of the session, joined by spaces
  std::vector<float> features;  // mlp: extra input columns (ModelOptions::context_dim)
  bool empty() const { return text.empty() && features.empty(); }
};

enum class ParamKind { kDense, kSparse };

struct ParamInfo {
  std::string name;  // PS table name: "<table_prefix><parameter name>"
  ParamKind kind = ParamKind::kDense;
  std::vector<uint64_t> shape;  // dense: tensor shape; sparse: {row dim}
  std::string init = "normal";  // initializer on the PS (see ps::TableSpec)
  double init_value = 0.01;     // stddev / half-width / constant
  // Dense: values to seed a new PS table with (a TorchScript file's weights); empty:
  // the table starts from `init` alone.
  std::vector<float> initial = {};
  uint64_t size() const;  // dense: product of shape; sparse: row dim
};

// A parameter that is not a PS table: loaded once by each worker from the model file,
// read-only, never differentiated and never pushed (a frozen backbone).
struct FrozenParam {
  std::string name;  // the module's parameter name
  std::vector<uint64_t> shape;
  uint64_t size() const;  // product of shape
};

// Rows of one sparse parameter: keys[i] owns values[i * dim, (i + 1) * dim).
struct SparseRows {
  std::vector<uint64_t> keys;
  std::vector<float> values;
};

// The parameters one call may read, indexed like Model::params(). Dense entries point
// at size() floats (owned by the caller, alive for the call); sparse entries hold
// exactly the rows of SparseKeys() for this batch, in that order.
struct ParamView {
  std::vector<const float*> dense;        // nullptr for sparse params
  std::vector<const SparseRows*> sparse;  // nullptr for dense params
};

struct InferOutput {
  std::vector<std::vector<float>> scores;  // per example: softmax over labels()
  std::vector<int64_t> predicted;          // per example: argmax
};

// Gradient of the mean loss over the batch, indexed like Model::params(): dense grads
// have size() floats; sparse grads hold only the rows the batch touched.
struct GradOutput {
  double loss = 0;                        // mean loss over the batch
  std::vector<std::vector<float>> dense;  // empty vector for sparse params
  std::vector<SparseRows> sparse;         // empty for dense params
};

struct ModelOptions {
  std::string kind = "text";  // text | mlp | torchscript
  std::vector<std::string> labels = {"negative", "positive"};
  std::string table_prefix;    // prepended to every PS table name
  std::string device = "cpu";  // cpu | cuda | cuda:N
  int torch_threads = 1;       // intra-op threads per call
  // text
  uint32_t embed_dim = 32;
  bool bigrams = true;
  double context_weight = 0.5;  // weight of each context token against 1 for a text token
  // text and mlp: hidden layer widths between input and output (empty: linear)
  std::vector<uint32_t> hidden;
  // mlp
  uint32_t input_dim = 64;
  uint32_t context_dim = 0;  // extra input columns fed from the session's context features
  // torchscript
  std::string model_file;
  std::vector<std::string> sparse_params;  // parameter names that become sparse tables
  // Which parameters learn (PS tables) and which are frozen, by glob over parameter names
  // (fnmatch; `*` also matches dots). At most one of the two; neither: a parameter the
  // file saved with requires_grad=False is frozen, every other one trainable.
  std::vector<std::string> trainable;  // only these learn; every other parameter is frozen
  std::vector<std::string> frozen;     // these are frozen; every other parameter learns
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const std::vector<ParamInfo>& params() const = 0;
  virtual const std::vector<std::string>& labels() const = 0;
  virtual std::string device() const = 0;
  // The frozen parameters, in the module's order (none for the built-in models).
  virtual const std::vector<FrozenParam>& frozen() const {
    static const std::vector<FrozenParam> kNone;
    return kNone;
  }
  // "sha256:<hex>" over the frozen part as loaded (frozen parameters, buffers, tensor
  // constants of the module's code), or "" when the model has none. Every PS table of the
  // model records it (ps::TableSpec::base), so workers never mix backbones.
  virtual std::string base() const { return ""; }
  // The same hash over the frozen values in memory now: equal to base() unless something
  // wrote to the frozen part. Costs a pass over it (model_info with verify).
  virtual StatusOr<std::string> BaseNow() const { return base(); }
  // The feature values a session context must have when it has any (ContextInput::
  // features), or 0 when the model reads none.
  virtual size_t context_features() const { return 0; }

  // Sparse keys the batch (and context) touches, deduplicated, per param index (empty
  // for dense params). Errors: kInvalidArgument naming the bad example.
  virtual StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(
      const std::vector<Example>& batch, const ContextInput& context) const = 0;
  virtual StatusOr<InferOutput> Infer(const std::vector<Example>& batch,
                                      const ContextInput& context, const ParamView& params) = 0;
  // REQUIRES: every example has a label in [0, labels().size()).
  virtual StatusOr<GradOutput> Gradients(const std::vector<Example>& batch,
                                         const ContextInput& context, const ParamView& params) = 0;
};

// Builds the model named by options.kind. Errors: kInvalidArgument (unknown kind, bad
// option, unreadable TorchScript file), kUnavailable (CUDA asked for but absent).
StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& options);

// Which of a model's parameters learn (true) and which are frozen, given their names,
// whether the file saved each with requires_grad, and ModelOptions::trainable / frozen
// (see there). Errors: kInvalidArgument when both lists are given, a glob matches no
// parameter (the message lists them), or nothing would learn.
StatusOr<std::vector<bool>> SelectTrainable(const std::vector<std::string>& names,
                                            const std::vector<bool>& requires_grad,
                                            const std::vector<std::string>& trainable,
                                            const std::vector<std::string>& frozen);

// Text features shared by the text model and hashed-id TorchScript input: lowercased
// alphanumeric words and, if `bigrams`, adjacent word pairs, hashed to uint64 keys.
std::vector<uint64_t> TextFeatureKeys(const std::string& text, bool bigrams);

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_MODEL_H_
