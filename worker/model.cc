// Torch-free parts of the model interface, shared by every model and the service.
#include "worker/model.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>

#include "common/partition.h"
#include "worker/request_limits.h"

namespace onlineps::worker {

namespace {

uint64_t Elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

}  // namespace

uint64_t ParamInfo::size() const {
  if (kind == ParamKind::kSparse) return shape.empty() ? 0 : shape[0];
  return Elements(shape);
}

uint64_t FrozenParam::size() const { return Elements(shape); }

StatusOr<std::vector<bool>> SelectTrainable(const std::vector<std::string>& names,
                                            const std::vector<bool>& requires_grad,
                                            const std::vector<std::string>& trainable,
                                            const std::vector<std::string>& frozen) {
  if (!trainable.empty() && !frozen.empty()) {
    return InvalidArgument(
        "give --trainable or --frozen, not both (each is the other's "
        "complement)");
  }
  const std::vector<std::string>& globs = trainable.empty() ? frozen : trainable;
  const bool by_trainable = !trainable.empty();
  std::vector<bool> learns = requires_grad;
  if (!globs.empty()) {
    learns.assign(names.size(), !by_trainable);
    for (const std::string& glob : globs) {
      bool matched = false;
      for (size_t i = 0; i < names.size(); ++i) {
        if (fnmatch(glob.c_str(), names[i].c_str(), 0) != 0) continue;
        learns[i] = by_trainable;
        matched = true;
      }
      if (!matched) {
        std::string all;
        for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
        return InvalidArgument(std::string(by_trainable ? "--trainable" : "--frozen") + " '" +
                               glob + "' matches no parameter of the model (parameters: " +
                               (all.empty() ? "none" : all) + ")");
      }
    }
  }
  if (std::find(learns.begin(), learns.end(), true) == learns.end()) {
    return InvalidArgument(
        "every parameter of the model is frozen: nothing would learn (name the trainable ones "
        "with --trainable, or save them with requires_grad=True)");
  }
  return learns;
}

namespace {

// Lowercased runs of ASCII letters and digits (IsWordByte); every other byte (UTF-8
// included) separates words.
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (unsigned char c : text) {
    if (IsWordByte(c)) {
      word.push_back(static_cast<char>(std::tolower(c)));
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

}  // namespace

// Repeated words repeat their keys: a model that averages feature rows weighs them by count.
std::vector<uint64_t> TextFeatureKeys(const std::string& text, bool bigrams) {
  const std::vector<std::string> words = Words(text);
  std::vector<uint64_t> keys;
  keys.reserve(bigrams && !words.empty() ? 2 * words.size() - 1 : words.size());
  for (const std::string& w : words) keys.push_back(HashString("w:" + w));
  if (bigrams) {
    for (size_t i = 1; i < words.size(); ++i) {
      keys.push_back(HashString("b:" + words[i - 1] + " " + words[i]));
    }
  }
  return keys;
}

}  // namespace onlineps::worker
