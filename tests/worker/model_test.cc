// Model math: gradients against finite differences, sparse keys, context, training
// sanity, the TorchScript model, and bad input. The test plays the PS: it owns every
// parameter, hands models a ParamView and applies SGD itself.
#include "worker/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/partition.h"
// Only torch::cuda::is_available(): the CUDA test must know the truth independently.
#include <torch/csrc/api/include/torch/cuda.h>

namespace onlineps::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Keys = std::vector<std::vector<uint64_t>>;

const char kTinyModel[] = ONLINEPS_TESTDATA_DIR "/tiny_model.pt";
const char kDigits[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

// Parameters of one call, owned by the test.
struct OwnedParams {
  std::vector<std::vector<float>> dense;
  std::vector<SparseRows> sparse;

  ParamView View() const {
    ParamView view;
    for (size_t i = 0; i < dense.size(); ++i) {
      const bool is_dense = sparse[i].keys.empty() && !dense[i].empty();
      view.dense.push_back(is_dense ? dense[i].data() : nullptr);
      view.sparse.push_back(is_dense ? nullptr : &sparse[i]);
    }
    return view;
  }
  std::vector<float>& Values(size_t i) { return dense[i].empty() ? sparse[i].values : dense[i]; }
};

// What the PS does for these tests: tables initialized by their ParamInfo (rows on first
// read), plain SGD. zeros_stddev > 0 draws "zeros" params at random instead, so gradient
// checks see no special values.
class FakePs {
 public:
  FakePs(const Model& model, uint32_t seed, double zeros_stddev = 0)
      : infos_(model.params()), rng_(seed), zeros_stddev_(zeros_stddev), rows_(infos_.size()) {
    for (const ParamInfo& info : infos_) {
      dense_.push_back(info.kind == ParamKind::kDense ? Draw(info, info.size())
                                                      : std::vector<float>());
    }
  }

  OwnedParams Fetch(const Keys& keys) {
    OwnedParams p{dense_, std::vector<SparseRows>(infos_.size())};
    for (size_t i = 0; i < infos_.size(); ++i) {
      if (infos_[i].kind == ParamKind::kDense) continue;
      for (uint64_t key : keys[i]) {
        auto [it, fresh] = rows_[i].try_emplace(key);
        if (fresh) it->second = Draw(infos_[i], infos_[i].size());
        p.sparse[i].keys.push_back(key);
        p.sparse[i].values.insert(p.sparse[i].values.end(), it->second.begin(), it->second.end());
      }
    }
    return p;
  }

  void ApplySgd(const GradOutput& g, float lr) {
    for (size_t i = 0; i < infos_.size(); ++i) {
      for (size_t j = 0; j < g.dense[i].size(); ++j) dense_[i][j] -= lr * g.dense[i][j];
      const size_t dim = infos_[i].size();
      for (size_t r = 0; r < g.sparse[i].keys.size(); ++r) {
        std::vector<float>& row = rows_[i].at(g.sparse[i].keys[r]);
        for (size_t j = 0; j < dim; ++j) row[j] -= lr * g.sparse[i].values[r * dim + j];
      }
    }
  }

 private:
  std::vector<float> Draw(const ParamInfo& info, size_t n) {
    const bool zeros = info.init == "zeros";
    std::normal_distribution<float> normal(0, zeros ? zeros_stddev_ : info.init_value);
    std::vector<float> v(n, info.init == "constant" ? info.init_value : 0.0f);
    if (info.init == "normal" || (zeros && zeros_stddev_ > 0)) {
      for (float& x : v) x = normal(rng_);
    }
    return v;
  }

  std::vector<ParamInfo> infos_;
  std::mt19937 rng_;
  double zeros_stddev_;
  std::vector<std::vector<float>> dense_;
  std::vector<std::unordered_map<uint64_t, std::vector<float>>> rows_;
};

std::unique_ptr<Model> MustCreate(const ModelOptions& options) {
  StatusOr<std::unique_ptr<Model>> model = CreateModel(options);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(model).value() : nullptr;
}

OwnedParams FetchFor(const Model& model, FakePs& ps, const std::vector<Example>& batch,
                     const ContextInput& context) {
  StatusOr<Keys> keys = model.SparseKeys(batch, context);
  EXPECT_TRUE(keys.ok()) << keys.status().ToString();
  return ps.Fetch(keys.ok() ? keys.value() : Keys(model.params().size()));
}

// Gradient of element j of param i, 0 for a sparse row the gradient leaves out.
float GradAt(const GradOutput& g, const OwnedParams& p, size_t i, size_t j, size_t dim) {
  if (!g.dense[i].empty()) return g.dense[i][j];
  const std::vector<uint64_t>& keys = g.sparse[i].keys;
  auto it = std::find(keys.begin(), keys.end(), p.sparse[i].keys[j / dim]);
  return it == keys.end() ? 0.0f : g.sparse[i].values[(it - keys.begin()) * dim + j % dim];
}

// Every coordinate of every param: Gradients() against a central difference of its loss.
void ExpectGradientsMatchFiniteDifferences(Model& model, const std::vector<Example>& batch,
                                           const ContextInput& context, OwnedParams p) {
  StatusOr<GradOutput> g = model.Gradients(batch, context, p.View());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto loss = [&]() {
    StatusOr<GradOutput> r = model.Gradients(batch, context, p.View());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->loss : 0.0;
  };
  float largest = 0;
  for (size_t i = 0; i < model.params().size(); ++i) {
    const size_t dim = model.params()[i].size();
    for (size_t j = 0; j < p.Values(i).size(); ++j) {
      const float saved = p.Values(i)[j], up = saved + 3e-3f, down = saved - 3e-3f;
      p.Values(i)[j] = up;
      const double loss_up = loss();
      p.Values(i)[j] = down;
      const double numeric = (loss_up - loss()) / (up - down);
      p.Values(i)[j] = saved;
      const float analytic = GradAt(*g, p, i, j, dim);
      largest = std::max(largest, std::abs(analytic));
      EXPECT_NEAR(analytic, numeric,
                  1e-2 * std::max<double>(std::abs(analytic), std::abs(numeric)) + 5e-4)
          << model.params()[i].name << "[" << j << "]";
    }
  }
  EXPECT_GT(largest, 1e-2) << "all gradients vanish: the check proves nothing";
}

ModelOptions TextOptions() {
  ModelOptions o;
  o.kind = "text";
  o.embed_dim = 4;
  o.hidden = {5};
  o.labels = {"a", "b", "c"};
  o.table_prefix = "t/";
  return o;
}

ModelOptions MlpOptions() {
  ModelOptions o;
  o.kind = "mlp";
  o.input_dim = 6;
  o.context_dim = 2;
  o.hidden = {4};
  o.labels = {"a", "b", "c"};
  return o;
}

ModelOptions TinyModelOptions() {
  ModelOptions o;
  o.kind = "torchscript";
  o.model_file = kTinyModel;
  o.sparse_params = {"embed.weight"};
  o.labels = {"x", "y", "z"};
  o.table_prefix = "ts/";
  return o;
}

std::vector<Example> TextBatch() {
  return {{"Good movie, great plot", {}, 0}, {"bad acting", {}, 1}, {"good? bad!", {}, 2}};
}

std::vector<Example> MlpBatch(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<Example> batch(4);
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int j = 0; j < 6; ++j) batch[i].features.push_back(normal(rng));
    batch[i].label = static_cast<int64_t>(i % 3);
  }
  return batch;
}

std::set<uint64_t> AsSet(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

TEST(TextFeatureKeysTest, LowercasesSplitsAndHashesBigrams) {
  EXPECT_EQ(TextFeatureKeys("Hello, WORLD!", true),
            (std::vector<uint64_t>{HashString("w:hello"), HashString("w:world"),
                                   HashString("b:hello world")}));
  EXPECT_EQ(TextFeatureKeys("na\xc3\xafve 42", false),
            (std::vector<uint64_t>{HashString("w:na"), HashString("w:ve"), HashString("w:42")}));
  EXPECT_TRUE(TextFeatureKeys(" ,.! ", true).empty());
}

TEST(ParamInfoTest, SizeIsProductOfShapeOrRowDim) {
  EXPECT_EQ((ParamInfo{"w", ParamKind::kDense, {3, 4}}).size(), 12u);
  EXPECT_EQ((ParamInfo{"e", ParamKind::kSparse, {8}}).size(), 8u);
}

TEST(TextModelTest, ParamsAreNamedWithPrefix) {
  std::unique_ptr<Model> model = MustCreate(TextOptions());
  std::vector<std::string> names;
  for (const ParamInfo& p : model->params()) names.push_back(p.name);
  EXPECT_THAT(names, ::testing::ElementsAre("t/embed", "t/fc0.weight", "t/fc0.bias", "t/out.weight",
                                            "t/out.bias"));
  EXPECT_EQ(model->params()[0].kind, ParamKind::kSparse);
  EXPECT_EQ(model->params()[0].size(), 4u);
  EXPECT_EQ(model->params()[3].shape, (std::vector<uint64_t>{3, 5}));
  EXPECT_EQ(model->device(), "cpu");
}

TEST(TextModelTest, GradientsMatchFiniteDifferences) {
  std::unique_ptr<Model> model = MustCreate(TextOptions());
  FakePs ps(*model, 1, 0.3);
  const ContextInput context{"earlier words", {}};
  ExpectGradientsMatchFiniteDifferences(*model, TextBatch(), context,
                                        FetchFor(*model, ps, TextBatch(), context));
}

TEST(TextModelTest, SparseKeysAndGradsCoverExactlyTheTouchedKeys) {
  std::unique_ptr<Model> model = MustCreate(TextOptions());
  const ContextInput context{"earlier words", {}};
  std::set<uint64_t> touched = AsSet(TextFeatureKeys(context.text, true));
  for (const Example& ex : TextBatch()) {
    for (uint64_t k : TextFeatureKeys(ex.text, true)) touched.insert(k);
  }
  StatusOr<Keys> keys = model->SparseKeys(TextBatch(), context);
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(AsSet((*keys)[0]), touched);
  EXPECT_EQ((*keys)[0].size(), touched.size()) << "duplicates";
  // A row the batch does not touch, given anyway, never gets a gradient.
  FakePs ps(*model, 2);
  Keys with_extra = *keys;
  with_extra[0].push_back(HashString("w:untouched"));
  OwnedParams p = ps.Fetch(with_extra);
  StatusOr<GradOutput> g = model->Gradients(TextBatch(), context, p.View());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(AsSet(g->sparse[0].keys), touched);
  EXPECT_EQ(g->sparse[0].values.size(), touched.size() * 4);
  // A key only the context touches gets a real gradient.
  const uint64_t context_only = HashString("w:earlier");
  EXPECT_NE(GradAt(*g, p, 0,
                   (std::find(p.sparse[0].keys.begin(), p.sparse[0].keys.end(), context_only) -
                    p.sparse[0].keys.begin()) *
                       4,
                   4),
            0.0f);
}

TEST(TextModelTest, RepresentationIsWeightedMeanOfTextAndContextRows) {
  ModelOptions o = TextOptions();
  o.hidden = {};
  o.bigrams = false;
  o.context_weight = 0.5;
  std::unique_ptr<Model> model = MustCreate(o);
  const std::vector<Example> batch = {{"alpha beta", {}, 0}};
  const ContextInput context{"gamma", {}};
  FakePs ps(*model, 3, 0.3);
  OwnedParams p = FetchFor(*model, ps, batch, context);
  StatusOr<InferOutput> out = model->Infer(batch, context, p.View());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto row = [&](const char* word) {
    const std::vector<uint64_t>& keys = p.sparse[0].keys;
    size_t r = std::find(keys.begin(), keys.end(), HashString(word)) - keys.begin();
    return &p.sparse[0].values.at(r * 4);
  };
  std::vector<double> logits(3), rep(4);
  for (int j = 0; j < 4; ++j) {
    rep[j] = (row("w:alpha")[j] + row("w:beta")[j] + 0.5 * row("w:gamma")[j]) / 2.5;
  }
  double sum = 0;
  for (int c = 0; c < 3; ++c) {
    logits[c] = p.dense[2][c];
    for (int j = 0; j < 4; ++j) logits[c] += p.dense[1][c * 4 + j] * rep[j];
    sum += std::exp(logits[c]);
  }
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(out->scores[0][c], std::exp(logits[c]) / sum, 1e-5);
}

TEST(TextModelTest, ExampleWithoutFeaturesScoresTheBiasAlone) {
  ModelOptions o = TextOptions();
  o.hidden = {};
  std::unique_ptr<Model> model = MustCreate(o);
  FakePs ps(*model, 4, 0.5);
  const std::vector<Example> batch = {{"?!", {}, 0}};
  OwnedParams p = FetchFor(*model, ps, batch, {});
  EXPECT_TRUE(p.sparse[0].keys.empty());
  StatusOr<InferOutput> out = model->Infer(batch, {}, p.View());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const std::vector<float>& bias = p.dense[2];
  const double sum = std::exp(bias[0]) + std::exp(bias[1]) + std::exp(bias[2]);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(out->scores[0][c], std::exp(bias[c]) / sum, 1e-6);
  StatusOr<GradOutput> g = model->Gradients(batch, {}, p.View());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(g->sparse[0].keys.empty());
}

// Features sent to the text model are refused, not ignored (a learn of them moved the
// output layer on an empty input).
TEST(TextModelTest, FeaturesAreRefusedNotIgnored) {
  std::unique_ptr<Model> model = MustCreate(TextOptions());
  FakePs ps(*model, 6, 0.5);
  const std::vector<Example> text = {{"fine words", {}, 0}};
  OwnedParams p = FetchFor(*model, ps, text, {});
  const std::vector<Example> batch = {{"fine words", {}, 0}, {"", {1, 2, 3}, 1}};
  for (const Status& st :
       {model->SparseKeys(batch, {}).status(), model->Infer(batch, {}, p.View()).status(),
        model->Gradients(batch, {}, p.View()).status()}) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("example 1: the text model reads 'text'"));
  }
}

TEST(TextModelTest, ContextChangesPredictionsAndParamsStayUntouched) {
  std::unique_ptr<Model> model = MustCreate(TextOptions());
  FakePs ps(*model, 5, 0.3);
  const ContextInput context{"terrible awful film", {}};
  OwnedParams p = FetchFor(*model, ps, TextBatch(), context);
  const OwnedParams copy = p;
  StatusOr<InferOutput> with = model->Infer(TextBatch(), context, p.View());
  StatusOr<InferOutput> without = model->Infer(TextBatch(), {}, p.View());
  ASSERT_TRUE(with.ok() && without.ok());
  for (size_t i = 0; i < TextBatch().size(); ++i) EXPECT_NE(with->scores[i], without->scores[i]);
  ASSERT_TRUE(model->Gradients(TextBatch(), context, p.View()).ok());
  EXPECT_EQ(p.dense, copy.dense);
  EXPECT_EQ(p.sparse[0].values, copy.sparse[0].values);
}

TEST(TextModelTest, MissingRowIsAnErrorNotACrash) {
  std::unique_ptr<Model> model = MustCreate(TextOptions());
  FakePs ps(*model, 6);
  OwnedParams p = ps.Fetch(Keys(model->params().size()));
  StatusOr<InferOutput> out = model->Infer(TextBatch(), {}, p.View());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("example 0"));
  EXPECT_EQ(model->Infer(TextBatch(), {}, ParamView{}).status().code(),
            StatusCode::kInvalidArgument);
}

// Sentences with two sentiment words among filler; the label is the sentiment.
std::vector<Example> SentimentExamples(size_t n, uint32_t seed) {
  const std::vector<std::vector<std::string>> words = {
      {"bad", "awful", "terrible", "hate", "boring"},
      {"good", "great", "excellent", "love", "wonderful"}};
  const std::vector<std::string> filler = {"the", "movie", "was", "plot", "actors", "it", "a"};
  std::mt19937 rng(seed);
  std::vector<Example> out(n);
  for (Example& ex : out) {
    ex.label = rng() % 2;
    std::vector<std::string> sentence = {words[ex.label][rng() % 5], words[ex.label][rng() % 5]};
    for (size_t k = rng() % 4 + 2; k > 0; --k) sentence.push_back(filler[rng() % filler.size()]);
    std::shuffle(sentence.begin(), sentence.end(), rng);
    for (const std::string& w : sentence) ex.text += w + " ";
  }
  return out;
}

double Accuracy(Model& model, FakePs& ps, const std::vector<Example>& examples) {
  OwnedParams p = FetchFor(model, ps, examples, {});
  StatusOr<InferOutput> out = model.Infer(examples, {}, p.View());
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return 0;
  size_t right = 0;
  for (size_t i = 0; i < examples.size(); ++i) right += out->predicted[i] == examples[i].label;
  return static_cast<double>(right) / examples.size();
}

// Plain SGD over `train` in order, `steps` batches of `batch_size`, wrapping around.
void TrainSgd(Model& model, FakePs& ps, const std::vector<Example>& train, int steps,
              size_t batch_size, float lr) {
  for (int step = 0; step < steps; ++step) {
    std::vector<Example> batch;
    for (size_t k = 0; k < batch_size; ++k) {
      batch.push_back(train[(step * batch_size + k) % train.size()]);
    }
    OwnedParams p = FetchFor(model, ps, batch, {});
    StatusOr<GradOutput> g = model.Gradients(batch, {}, p.View());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ps.ApplySgd(*g, lr);
  }
}

TEST(TextModelTest, SgdFitsTinySentimentTask) {
  ModelOptions o = TextOptions();
  o.embed_dim = 16;
  o.hidden = {8};
  o.labels = {"negative", "positive"};
  std::unique_ptr<Model> model = MustCreate(o);
  FakePs ps(*model, 7);
  const std::vector<Example> train = SentimentExamples(200, 8), test = SentimentExamples(200, 9);
  TrainSgd(*model, ps, train, 300, 8, 0.5f);
  const double accuracy = Accuracy(*model, ps, test);
  std::cout << "text model held-out accuracy: " << accuracy << "\n";
  RecordProperty("heldout_accuracy", std::to_string(accuracy));
  EXPECT_GT(accuracy, 0.85);
}

TEST(MlpModelTest, GradientsMatchFiniteDifferences) {
  std::unique_ptr<Model> model = MustCreate(MlpOptions());
  FakePs ps(*model, 10, 0.3);
  const ContextInput context{"", {0.5f, -1.0f}};
  ExpectGradientsMatchFiniteDifferences(*model, MlpBatch(11), context, ps.Fetch(Keys(4)));
}

TEST(MlpModelTest, ScoresAreSoftmaxOfReluLayerOverFeaturesThenContext) {
  ModelOptions o = MlpOptions();  // 6 features + 2 context -> 4 (ReLU) -> 3
  std::unique_ptr<Model> model = MustCreate(o);
  FakePs ps(*model, 25, 0.3);
  OwnedParams p = ps.Fetch(Keys(4));
  const std::vector<Example> batch = MlpBatch(26);
  const ContextInput context{"", {0.25f, -2.0f}};
  StatusOr<InferOutput> out = model->Infer(batch, context, p.View());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  // y = b + W x for a row-major W of `in` columns.
  auto affine = [](const std::vector<float>& w, const std::vector<float>& b,
                   const std::vector<double>& x) {
    std::vector<double> y(b.begin(), b.end());
    for (size_t r = 0; r < y.size(); ++r) {
      for (size_t j = 0; j < x.size(); ++j) y[r] += w[r * x.size() + j] * x[j];
    }
    return y;
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    std::vector<double> x(batch[i].features.begin(), batch[i].features.end());
    x.insert(x.end(), context.features.begin(), context.features.end());
    std::vector<double> h = affine(p.dense[0], p.dense[1], x);
    for (double& v : h) v = std::max(v, 0.0);
    std::vector<double> e = affine(p.dense[2], p.dense[3], h);
    for (double& v : e) v = std::exp(v);
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(out->scores[i][c], e[c] / (e[0] + e[1] + e[2]), 1e-5);
  }
}

TEST(MlpModelTest, ContextFeaturesChangePredictions) {
  std::unique_ptr<Model> model = MustCreate(MlpOptions());
  FakePs ps(*model, 12, 0.3);
  OwnedParams p = ps.Fetch(Keys(4));
  const OwnedParams copy = p;
  StatusOr<InferOutput> with = model->Infer(MlpBatch(13), {"", {2.0f, -3.0f}}, p.View());
  StatusOr<InferOutput> without = model->Infer(MlpBatch(13), {}, p.View());
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_NE(with->scores[0], without->scores[0]);
  ASSERT_TRUE(model->Gradients(MlpBatch(13), {"", {2.0f, -3.0f}}, p.View()).ok());
  EXPECT_EQ(p.dense, copy.dense);
}

TEST(MlpModelTest, WrongFeatureLengthIsInvalidArgument) {
  std::unique_ptr<Model> model = MustCreate(MlpOptions());
  FakePs ps(*model, 14);
  OwnedParams p = ps.Fetch(Keys(4));
  std::vector<Example> batch = MlpBatch(15);
  batch[1].features.pop_back();
  for (const Status& s :
       {model->SparseKeys(batch, {}).status(), model->Infer(batch, {}, p.View()).status(),
        model->Gradients(batch, {}, p.View()).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("example 1: 5 features, model input_dim is 6"));
  }
  const ContextInput bad_context{"", {1.0f, 2.0f, 3.0f}};
  EXPECT_EQ(model->Infer(MlpBatch(15), bad_context, p.View()).status().code(),
            StatusCode::kInvalidArgument);
  batch = MlpBatch(15);
  batch[2].label = 3;
  EXPECT_EQ(model->Gradients(batch, {}, p.View()).status().code(), StatusCode::kInvalidArgument);
}

TEST(MlpModelTest, NanFeaturePropagates) {
  std::unique_ptr<Model> model = MustCreate(MlpOptions());
  FakePs ps(*model, 16);
  OwnedParams p = ps.Fetch(Keys(4));
  std::vector<Example> batch = MlpBatch(17);
  batch[0].features[0] = std::nanf("");
  StatusOr<InferOutput> out = model->Infer(batch, {}, p.View());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(std::isnan(out->scores[0][0]));
  EXPECT_FALSE(std::isnan(out->scores[1][0]));
  StatusOr<GradOutput> g = model->Gradients(batch, {}, p.View());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(std::isnan(g->loss));
}

// sklearn's digits: 64 pixel columns (0..16) then the label, one image a line.
std::vector<Example> ReadDigits() {
  std::vector<Example> out;
  FILE* f = popen((std::string("gzip -dc ") + kDigits + " 2>/dev/null").c_str(), "r");
  if (f == nullptr) return out;
  char line[4096];
  while (fgets(line, sizeof(line), f) != nullptr) {
    Example ex;
    char* p = line;
    for (int col = 0; col < 65; ++col, ++p) {
      char* end = nullptr;
      const float v = std::strtof(p, &end);
      if (end == p) break;
      if (col < 64) ex.features.push_back(v / 16.0f);
      if (col == 64) ex.label = static_cast<int64_t>(v);
      p = end;
    }
    if (ex.features.size() == 64 && ex.label >= 0) out.push_back(std::move(ex));
  }
  pclose(f);
  return out;
}

TEST(MlpModelTest, SgdFitsDigits) {
  std::vector<Example> digits = ReadDigits();
  if (digits.size() < 1500) GTEST_SKIP() << "sklearn digits not readable at " << kDigits;
  ModelOptions o;
  o.kind = "mlp";
  o.input_dim = 64;
  o.labels = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  std::unique_ptr<Model> model = MustCreate(o);
  FakePs ps(*model, 18);
  const std::vector<Example> train(digits.begin(), digits.begin() + 1000);
  const std::vector<Example> test(digits.begin() + 1000, digits.end());
  TrainSgd(*model, ps, train, 400, 32, 0.5f);
  const double accuracy = Accuracy(*model, ps, test);
  std::cout << "mlp held-out accuracy on " << test.size() << " digits: " << accuracy << "\n";
  RecordProperty("heldout_accuracy", std::to_string(accuracy));
  EXPECT_GT(accuracy, 0.85);
}

TEST(TorchScriptModelTest, TinyModelParamsAndInfer) {
  std::unique_ptr<Model> model = MustCreate(TinyModelOptions());
  ASSERT_NE(model, nullptr);
  const std::vector<ParamInfo>& params = model->params();
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[0].name, "ts/embed.weight");
  EXPECT_EQ(params[0].kind, ParamKind::kSparse);
  EXPECT_EQ(params[0].shape, (std::vector<uint64_t>{8}));
  EXPECT_EQ(params[1].name, "ts/out.weight");
  EXPECT_EQ(params[1].kind, ParamKind::kDense);
  EXPECT_EQ(params[1].shape, (std::vector<uint64_t>{3, 8}));
  EXPECT_EQ(params[2].name, "ts/out.bias");
  EXPECT_EQ(params[2].kind, ParamKind::kDense);
  FakePs ps(*model, 19, 0.3);
  OwnedParams p = FetchFor(*model, ps, TextBatch(), {});
  StatusOr<InferOutput> out = model->Infer(TextBatch(), {}, p.View());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->scores.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(out->scores[i].size(), 3u);
    EXPECT_NEAR(out->scores[i][0] + out->scores[i][1] + out->scores[i][2], 1.0, 1e-5);
    EXPECT_EQ(out->predicted[i], std::max_element(out->scores[i].begin(), out->scores[i].end()) -
                                     out->scores[i].begin());
  }
}

TEST(TorchScriptModelTest, GradientsMatchFiniteDifferences) {
  std::unique_ptr<Model> model = MustCreate(TinyModelOptions());
  ASSERT_NE(model, nullptr);
  FakePs ps(*model, 20, 0.3);
  OwnedParams p = FetchFor(*model, ps, TextBatch(), {});
  StatusOr<GradOutput> g = model->Gradients(TextBatch(), {}, p.View());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::set<uint64_t> touched;
  for (const Example& ex : TextBatch()) {
    for (uint64_t k : TextFeatureKeys(ex.text, true)) touched.insert(k);
  }
  EXPECT_EQ(AsSet(g->sparse[0].keys), touched);
  ExpectGradientsMatchFiniteDifferences(*model, TextBatch(), {}, p);
}

// Regression: a replica whose first call was an Infer (under no-grad) must still give
// gradients afterwards (the JIT executor must not specialize on that first run).
TEST(TorchScriptModelTest, GradientsAfterAnInferOnTheSameReplica) {
  std::unique_ptr<Model> model = MustCreate(TinyModelOptions());
  ASSERT_NE(model, nullptr);
  FakePs ps(*model, 21, 0.3);
  OwnedParams p = FetchFor(*model, ps, TextBatch(), {});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(model->Infer(TextBatch(), {}, p.View()).ok());
  StatusOr<GradOutput> g = model->Gradients(TextBatch(), {}, p.View());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ExpectGradientsMatchFiniteDifferences(*model, TextBatch(), {}, p);
}

TEST(TorchScriptModelTest, BadFileOrParamNameIsInvalidArgument) {
  ModelOptions o = TinyModelOptions();
  o.model_file = "/nonexistent/model.pt";
  StatusOr<std::unique_ptr<Model>> model = CreateModel(o);
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("/nonexistent/model.pt"));
  EXPECT_THAT(model.status().message(), ::testing::Not(HasSubstr("\n")));
  o = TinyModelOptions();
  o.sparse_params = {"embed.nonexistent"};
  model = CreateModel(o);
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("embed.nonexistent"));
  o.sparse_params = {"out.bias"};
  EXPECT_EQ(CreateModel(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(SelectTrainableTest, RequiresGradDecidesUnlessGlobsAreGiven) {
  const std::vector<std::string> names = {"backbone.fc0.weight", "backbone.fc0.lora_A",
                                          "head.weight", "head.bias"};
  const std::vector<bool> grad = {false, true, true, false};
  auto by_default = SelectTrainable(names, grad, {}, {});
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_EQ(*by_default, grad);
  // `*` crosses dots: "*.lora_*" matches a nested name.
  auto trainable = SelectTrainable(names, grad, {"head.*", "*.lora_*"}, {});
  ASSERT_TRUE(trainable.ok()) << trainable.status().ToString();
  EXPECT_EQ(*trainable, (std::vector<bool>{false, true, true, true}));
  auto frozen = SelectTrainable(names, grad, {}, {"backbone.*"});
  ASSERT_TRUE(frozen.ok()) << frozen.status().ToString();
  EXPECT_EQ(*frozen, (std::vector<bool>{false, false, true, true}));
}

TEST(SelectTrainableTest, ConflictsUnmatchedGlobsAndNothingToLearnAreErrors) {
  const std::vector<std::string> names = {"a.weight", "b.weight"};
  const std::vector<bool> grad = {true, true};
  auto both = SelectTrainable(names, grad, {"a.*"}, {"b.*"});
  EXPECT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(both.status().message(), HasSubstr("not both"));
  auto unmatched = SelectTrainable(names, grad, {"head.*"}, {});
  EXPECT_EQ(unmatched.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unmatched.status().message(), HasSubstr("'head.*' matches no parameter"));
  EXPECT_THAT(unmatched.status().message(), HasSubstr("a.weight, b.weight"));
  auto none = SelectTrainable(names, {false, false}, {}, {});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("nothing would learn"));
  EXPECT_FALSE(SelectTrainable(names, grad, {}, {"*"}).ok());
}

const char kFrozenHead[] = ONLINEPS_TESTDATA_DIR "/frozen_head.pt";
const char kFrozenHeadOther[] = ONLINEPS_TESTDATA_DIR "/frozen_head_other.pt";
const char kLoraR2[] = ONLINEPS_TESTDATA_DIR "/lora_r2.pt";

ModelOptions FrozenOptions(const std::string& file) {
  ModelOptions o;
  o.kind = "torchscript";
  o.model_file = file;
  o.labels = {"a", "b", "c"};
  o.table_prefix = "fz/";
  return o;
}

std::vector<Example> FeatureBatch() {
  std::vector<Example> batch;
  for (int e = 0; e < 4; ++e) {
    Example ex;
    for (int j = 0; j < 6; ++j) ex.features.push_back(2.0f * std::sin(1.7f * e + 0.9f * j));
    ex.label = e % 3;
    batch.push_back(ex);
  }
  return batch;
}

// The values the model file holds for its trainable params (what workers seed tables with).
OwnedParams FileParams(const Model& model) {
  OwnedParams p;
  for (const ParamInfo& info : model.params()) {
    p.dense.push_back(info.initial);
    p.sparse.emplace_back();
  }
  return p;
}

std::vector<std::string> Names(const std::vector<ParamInfo>& params) {
  std::vector<std::string> names;
  for (const ParamInfo& p : params) names.push_back(p.name);
  return names;
}

TEST(TorchScriptModelTest, ParamsSavedWithoutGradAreFrozenAndHashed) {
  std::unique_ptr<Model> model = MustCreate(FrozenOptions(kFrozenHead));
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Names(model->params()), (std::vector<std::string>{"fz/head.weight", "fz/head.bias"}));
  ASSERT_EQ(model->frozen().size(), 4u);
  EXPECT_EQ(model->frozen()[0].name, "backbone.fc0.weight");
  EXPECT_EQ(model->frozen()[0].shape, (std::vector<uint64_t>{8, 6}));
  EXPECT_EQ(model->frozen()[3].name, "backbone.fc1.bias");
  EXPECT_THAT(model->base(), ::testing::StartsWith("sha256:"));
  EXPECT_EQ(model->base().size(), 7u + 64u);
  // Same file, same hash; other backbone weights, another hash; no frozen part, none.
  std::unique_ptr<Model> again = MustCreate(FrozenOptions(kFrozenHead));
  std::unique_ptr<Model> other = MustCreate(FrozenOptions(kFrozenHeadOther));
  ASSERT_NE(again, nullptr);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(again->base(), model->base());
  EXPECT_NE(other->base(), model->base());
  std::unique_ptr<Model> tiny = MustCreate(TinyModelOptions());
  ASSERT_NE(tiny, nullptr);
  EXPECT_EQ(tiny->base(), "");
  EXPECT_TRUE(tiny->frozen().empty());
}

// torch.jit.freeze folds the backbone's weights into constants of the code: they are not
// parameters, only the preserved head is, and the base hash covers the constants.
TEST(TorchScriptModelTest, JitFreezeConstantsAreFrozenAndHashed) {
  std::unique_ptr<Model> folded = MustCreate(FrozenOptions(ONLINEPS_TESTDATA_DIR "/frozen_jit.pt"));
  std::unique_ptr<Model> plain = MustCreate(FrozenOptions(kFrozenHead));
  ASSERT_NE(folded, nullptr);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(Names(folded->params()), (std::vector<std::string>{"fz/head.weight", "fz/head.bias"}));
  EXPECT_TRUE(folded->frozen().empty());
  EXPECT_EQ(folded->base().rfind("sha256:", 0), 0u) << "constants not hashed";
  const std::vector<Example> batch = FeatureBatch();
  OwnedParams fp = FileParams(*folded), pp = FileParams(*plain);
  StatusOr<InferOutput> a = folded->Infer(batch, {}, fp.View());
  StatusOr<InferOutput> b = plain->Infer(batch, {}, pp.View());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (size_t e = 0; e < batch.size(); ++e) {
    for (size_t c = 0; c < 3; ++c) EXPECT_NEAR(a->scores[e][c], b->scores[e][c], 1e-6);
  }
  ExpectGradientsMatchFiniteDifferences(*folded, batch, {}, fp);
}

TEST(TorchScriptModelTest, TrainableGlobsOverrideTheFile) {
  ModelOptions o = FrozenOptions(kFrozenHead);
  o.trainable = {"*"};  // full fine-tuning of the same file
  std::unique_ptr<Model> all = MustCreate(o);
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->params().size(), 6u);
  EXPECT_TRUE(all->frozen().empty());
  EXPECT_EQ(all->base(), "");
  o.trainable = {};
  o.frozen = {"backbone.fc0.*"};
  std::unique_ptr<Model> part = MustCreate(o);
  ASSERT_NE(part, nullptr);
  EXPECT_EQ(Names(part->params()),
            (std::vector<std::string>{"fz/backbone.fc1.weight", "fz/backbone.fc1.bias",
                                      "fz/head.weight", "fz/head.bias"}));
  ASSERT_EQ(part->frozen().size(), 2u);
  o.frozen = {"nothing.*"};
  EXPECT_THAT(CreateModel(o).status().message(), HasSubstr("backbone.fc0.weight, "));
  o = TinyModelOptions();
  o.frozen = {"embed.weight"};  // its rows live on the PS
  EXPECT_THAT(CreateModel(o).status().message(), HasSubstr("must be trainable"));
  o = ModelOptions();
  o.trainable = {"out.*"};
  EXPECT_THAT(CreateModel(o).status().message(), HasSubstr("need --model torchscript"));
}

// Learning moves only the head: gradients exist for it alone, the frozen values are
// bit-identical after 100 steps (their hash), and predictions change.
TEST(TorchScriptModelTest, LearningMovesOnlyTheTrainableParams) {
  std::unique_ptr<Model> model = MustCreate(FrozenOptions(kFrozenHead));
  ASSERT_NE(model, nullptr);
  OwnedParams p = FileParams(*model);
  const std::vector<Example> batch = FeatureBatch();
  StatusOr<InferOutput> before = model->Infer(batch, {}, p.View());
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ExpectGradientsMatchFiniteDifferences(*model, batch, {}, p);
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 100; ++step) {
    StatusOr<GradOutput> g = model->Gradients(batch, {}, p.View());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    (step == 0 ? first_loss : last_loss) = g->loss;
    ASSERT_EQ(g->dense.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      for (size_t j = 0; j < g->dense[i].size(); ++j) p.dense[i][j] -= 0.5f * g->dense[i][j];
    }
  }
  StatusOr<InferOutput> after = model->Infer(batch, {}, p.View());
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_NE(after->scores, before->scores);
  EXPECT_LT(last_loss, 0.5 * first_loss);
  StatusOr<std::string> now = model->BaseNow();
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ(*now, model->base());
}

// LoRA adapters with B = 0 add exactly nothing: the same scores, bit for bit, as the
// model without them; only the adapters and the head are tables, the base linears frozen.
TEST(TorchScriptModelTest, LoraWithZeroBGivesTheFrozenModelsOutputExactly) {
  std::unique_ptr<Model> lora = MustCreate(FrozenOptions(kLoraR2));
  std::unique_ptr<Model> base = MustCreate(FrozenOptions(kFrozenHead));
  ASSERT_NE(lora, nullptr);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(Names(lora->params()),
            (std::vector<std::string>{"fz/backbone.fc0.lora_A", "fz/backbone.fc0.lora_B",
                                      "fz/backbone.fc1.lora_A", "fz/backbone.fc1.lora_B",
                                      "fz/head.weight", "fz/head.bias"}));
  EXPECT_EQ(lora->params()[1].shape, (std::vector<uint64_t>{8, 2}));
  EXPECT_EQ(lora->frozen().size(), 4u);
  const std::vector<Example> batch = FeatureBatch();
  OwnedParams lp = FileParams(*lora), bp = FileParams(*base);
  StatusOr<InferOutput> a = lora->Infer(batch, {}, lp.View());
  StatusOr<InferOutput> b = base->Infer(batch, {}, bp.View());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->scores, b->scores);
  FakePs ps(*lora, 23, 0.3);
  ExpectGradientsMatchFiniteDifferences(*lora, batch, {}, ps.Fetch(Keys(6)));
}

TEST(TorchScriptModelTest, ForwardThatRejectsTheInputIsInvalidArgument) {
  ModelOptions o = TinyModelOptions();
  o.sparse_params = {};  // the module then gets forward(x), which it does not take
  std::unique_ptr<Model> model = MustCreate(o);
  ASSERT_NE(model, nullptr);
  FakePs ps(*model, 21);
  OwnedParams p = ps.Fetch(Keys(3));
  const std::vector<Example> batch = {{"", {1, 2, 3}, 0}};
  EXPECT_EQ(model->Infer(batch, {}, p.View()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model->Gradients(batch, {}, p.View()).status().code(), StatusCode::kInvalidArgument);
}

// A TorchScript model reads one input: text (its sparse params' ids) or features. The
// other was ignored: features sent to tiny_model.pt ran it on empty bags, and a learn
// moved its output layer on nothing; text sent to a features model named only a shape.
TEST(TorchScriptModelTest, TheInputItDoesNotReadIsRefusedNotIgnored) {
  std::unique_ptr<Model> ids = MustCreate(TinyModelOptions());
  ASSERT_NE(ids, nullptr);
  FakePs ps(*ids, 24);
  const OwnedParams p = ps.Fetch(Keys(3));
  const std::vector<Example> features = {{"", {1, 2, 3}, 0}};
  const auto keys = ids->SparseKeys(features, {});
  EXPECT_EQ(keys.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(keys.status().message(), HasSubstr("reads 'text'"));
  EXPECT_EQ(ids->Infer(features, {}, p.View()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ids->Gradients(features, {}, p.View()).status().code(), StatusCode::kInvalidArgument);

  std::unique_ptr<Model> dense = MustCreate(FrozenOptions(kFrozenHead));
  ASSERT_NE(dense, nullptr);
  const OwnedParams fp = FileParams(*dense);
  const std::vector<Example> text = {{"some words", {}, 0}};
  EXPECT_EQ(dense->SparseKeys(text, {}).status().code(), StatusCode::kInvalidArgument);
  const auto infer = dense->Infer(text, {}, fp.View());
  EXPECT_EQ(infer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(infer.status().message(), HasSubstr("reads 'features'"));
  EXPECT_EQ(dense->Gradients(text, {}, fp.View()).status().code(), StatusCode::kInvalidArgument);
}

// One tensor under two names (tied weights) was two PS tables, each trained on its own
// gradient: the worker silently served and trained an untied model. A tie may stay only
// within the frozen part (one copy, read-only).
TEST(TorchScriptModelTest, ATrainableTensorUnderTwoNamesIsRefused) {
  ModelOptions o = FrozenOptions(ONLINEPS_TESTDATA_DIR "/tied_weights.pt");
  const auto tied = CreateModel(o);
  EXPECT_EQ(tied.status().code(), StatusCode::kInvalidArgument) << tied.status().ToString();
  EXPECT_THAT(tied.status().message(), HasSubstr("a.weight"));
  EXPECT_THAT(tied.status().message(), HasSubstr("b.weight"));
  o.frozen = {"*.weight"};
  std::unique_ptr<Model> frozen = MustCreate(o);
  ASSERT_NE(frozen, nullptr);
  EXPECT_EQ(Names(frozen->params()), (std::vector<std::string>{"fz/a.bias", "fz/b.bias"}));
}

// A NaN weight in the file: a frozen one was served, every infer's scores NaN (with a
// prediction) and every learn refused for its NaN loss; a trainable one failed the start
// only when its table was seeded, naming a push. Both are refused at load, named.
TEST(TorchScriptModelTest, ANanParameterInTheFileIsRefusedAtLoad) {
  for (const char* file : {"nan_frozen.pt", "nan_trainable.pt"}) {
    SCOPED_TRACE(file);
    const auto model = CreateModel(FrozenOptions(ONLINEPS_TESTDATA_DIR "/" + std::string(file)));
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument) << model.status().ToString();
    EXPECT_THAT(model.status().message(), HasSubstr("NaN"));
  }
  const auto frozen = CreateModel(FrozenOptions(ONLINEPS_TESTDATA_DIR "/nan_frozen.pt"));
  EXPECT_THAT(frozen.status().message(), HasSubstr("backbone.weight"));
}

// A forward of the right shape that returns no trainable float logits is the model file's
// fault: int64 logits were served as scores (a softmax of 0s and 1s), and a learn of either
// model failed as kInternal ("element 0 of tensors does not require grad").
TEST(TorchScriptModelTest, LogitsThatAreNotFloatOrNotDifferentiableAreTheFilesFault) {
  const std::vector<Example> batch = {{"", {1, 2, 3, 4}, 0}};
  for (const char* file : {"int_logits.pt", "detached_logits.pt"}) {
    SCOPED_TRACE(file);
    std::unique_ptr<Model> model =
        MustCreate(FrozenOptions(ONLINEPS_TESTDATA_DIR "/" + std::string(file)));
    ASSERT_NE(model, nullptr);
    const OwnedParams p = FileParams(*model);
    const auto g = model->Gradients(batch, {}, p.View());
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << g.status().ToString();
    EXPECT_THAT(g.status().message(), HasSubstr("torchscript forward"));
  }
  std::unique_ptr<Model> ints = MustCreate(FrozenOptions(ONLINEPS_TESTDATA_DIR "/int_logits.pt"));
  ASSERT_NE(ints, nullptr);
  const auto infer = ints->Infer(batch, {}, FileParams(*ints).View());
  EXPECT_EQ(infer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(infer.status().message(), HasSubstr("Long"));
}

// The TorchScript interpreter's error starts with a header line ("The following operation
// failed ..."); the client is told the cause from the end of it instead.
TEST(TorchScriptModelTest, AForwardErrorNamesItsCauseNotTheInterpretersHeader) {
  std::unique_ptr<Model> model = MustCreate(FrozenOptions(kFrozenHead));
  ASSERT_NE(model, nullptr);
  const OwnedParams p = FileParams(*model);
  Example five;  // the model takes 6 features
  five.features = {1, 2, 3, 4, 5};
  const auto r = model->Infer({five}, {}, p.View());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("shapes cannot be multiplied"));
  EXPECT_THAT(r.status().message(), Not(HasSubstr("The following operation failed")));
}

// Several threads share one model; each call must give the single-threaded answer.
void ExpectConcurrentCallsAgree(const ModelOptions& options) {
  std::unique_ptr<Model> model = MustCreate(options);
  ASSERT_NE(model, nullptr);
  FakePs ps(*model, 22, 0.3);
  const OwnedParams p = FetchFor(*model, ps, TextBatch(), {});
  StatusOr<GradOutput> want = model->Gradients(TextBatch(), {}, p.View());
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(6, 0);
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k) {
        StatusOr<GradOutput> g = model->Gradients(TextBatch(), {}, p.View());
        mismatches[t] += !g.ok() || g->loss != want->loss || g->dense != want->dense ||
                         g->sparse[0].values != want->sparse[0].values;
        mismatches[t] += !model->Infer(TextBatch(), {}, p.View()).ok();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(TextModelTest, ConcurrentCallsAgree) { ExpectConcurrentCallsAgree(TextOptions()); }
TEST(TorchScriptModelTest, ConcurrentCallsAgree) { ExpectConcurrentCallsAgree(TinyModelOptions()); }

TEST(CreateModelTest, BadOptionsAreInvalidArgument) {
  ModelOptions o = TextOptions();
  o.kind = "transformer";
  EXPECT_EQ(CreateModel(o).status().code(), StatusCode::kInvalidArgument);
  for (const char* device : {"tpu", "cuda:", "cuda:x", "cuda:-1", "CPU"}) {
    o = TextOptions();
    o.device = device;
    EXPECT_EQ(CreateModel(o).status().code(), StatusCode::kInvalidArgument) << device;
  }
}

// A label given twice: a learn naming it always taught the first of the two, and an infer
// could still predict the second, which only a numeric label ever trained.
TEST(CreateModelTest, ALabelGivenTwiceIsRefused) {
  for (ModelOptions o : {TextOptions(), MlpOptions(), TinyModelOptions()}) {
    SCOPED_TRACE(o.kind);
    o.labels = {"pos", "neg", "pos"};
    const auto model = CreateModel(o);
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(model.status().message(), HasSubstr("'pos'"));
  }
}

TEST(CreateModelTest, CudaNeedsAGpu) {
  ModelOptions o = MlpOptions();
  o.device = "cuda";
  StatusOr<std::unique_ptr<Model>> model = CreateModel(o);
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(model.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(model.status().message(), HasSubstr("use --device cpu"));
    return;
  }
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->device(), "cuda:0");
  FakePs ps(**model, 23, 0.3);
  ExpectGradientsMatchFiniteDifferences(**model, MlpBatch(24), {}, ps.Fetch(Keys(4)));
}

}  // namespace
}  // namespace onlineps::worker
