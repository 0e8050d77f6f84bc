// Torch-free parts of the model interface, shared by every model and the service.
#include "worker/model.h"

#include <cctype>

#include "common/partition.h"
#include "worker/request_limits.h"

namespace onlineps::worker {

uint64_t ParamInfo::size() const {
  if (kind == ParamKind::kSparse) return shape.empty() ? 0 : shape[0];
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
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
