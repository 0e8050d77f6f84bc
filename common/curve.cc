#include "common/curve.h"

#include <sys/stat.h>
#include <zmq.h>

#include <cstdio>
#include <fstream>
#include <regex>

#include "common/file_io.h"

namespace onlineps {
namespace {

constexpr size_t kZ85Key = 40;
constexpr size_t kMaxKeyLine = 1024;

bool IsZ85Key(const std::string& k) {
  if (k.size() != kZ85Key) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, k.c_str()) != nullptr;
}

struct KeyLine {
  std::string kind;  // "public", "secret" or "" (a bare key)
  std::string key;
  int line;
};

StatusOr<std::vector<KeyLine>> ReadKeyLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot be read");
  // Z85 uses '#' and '=' too: a comment is a whole line, or text after whitespace.
  static const std::regex named(
      R"re(^\s*(public|secret)-key\s*=\s*(?:"([^"]*)"|(\S+))\s*(?:#.*)?$)re");
  static const std::regex bare(R"re(^(\S+)\s*(?:#.*)?$)re");
  std::vector<KeyLine> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // std::regex recurses once per character: a long line would overflow the stack.
    if (line.size() > kMaxKeyLine) {
      return InvalidArgument(path + ":" + std::to_string(n) + ": line of " +
                             std::to_string(line.size()) + " bytes is not a CURVE key line");
    }
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    // A line starting with '#' is a comment, unless it is a bare key ('#' is Z85).
    if (line[first] == '#' &&
        !(first == 0 && IsZ85Key(line.substr(0, line.find_last_not_of(" \t") + 1)))) {
      continue;
    }
    std::smatch m;
    KeyLine k{"", "", n};
    if (std::regex_match(line, m, named)) {
      k.kind = m[1].str();
      k.key = m[2].matched ? m[2].str() : m[3].str();
    } else if (first > 0 || line == "curve" || line == "metadata") {
      continue;  // zcert section headers and indented metadata
    } else if (std::regex_match(line, m, bare)) {
      k.key = m[1].str();
    }
    if (!IsZ85Key(k.key)) {
      return InvalidArgument(path + ":" + std::to_string(n) +
                             ": not a CURVE key (40 Z85 characters)");
    }
    out.push_back(k);
  }
  return out;
}

}  // namespace

StatusOr<CurveKeyPair> NewCurveKeyPair() {
  if (!zmq_has("curve")) return FailedPrecondition("this libzmq was built without CURVE");
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Internal(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{pub, sec};
}

Status WriteCurveCert(const std::string& path, const CurveKeyPair& keys) {
  const std::string pub = path + ".pub";
  for (const std::string& p : {path, pub}) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0) return {StatusCode::kAlreadyExists, p + " exists"};
  }
  const mode_t old = ::umask(077);
  std::FILE* f = std::fopen(path.c_str(), "w");
  ::umask(old);
  if (!f) return Unavailable("cannot write " + path);
  std::fprintf(f,
               "# onlineps CURVE certificate: keep secret (mode 0600)\n"
               "curve\n    public-key = \"%s\"\n    secret-key = \"%s\"\n",
               keys.public_key.c_str(), keys.secret_key.c_str());
  if (std::fclose(f) != 0) return Unavailable("cannot write " + path);
  std::FILE* g = std::fopen(pub.c_str(), "w");
  if (!g) return Unavailable("cannot write " + pub);
  std::fprintf(g, "# onlineps CURVE public key\ncurve\n    public-key = \"%s\"\n",
               keys.public_key.c_str());
  if (std::fclose(g) != 0) return Unavailable("cannot write " + pub);
  return Status::Ok();
}

StatusOr<CurveKeyPair> ReadCurveCert(const std::string& path) {
  ONLINEPS_ASSIGN_OR_RETURN(auto lines, ReadKeyLines(path));
  WarnIfOpenToOthers(path, "--curve-cert");
  CurveKeyPair k;
  for (const auto& l : lines) {
    if (l.kind == "public") k.public_key = l.key;
    if (l.kind == "secret") k.secret_key = l.key;
  }
  if (k.secret_key.empty()) {
    return InvalidArgument(path +
                           ": no secret-key line (a certificate needs both keys; a .pub "
                           "file holds only the public one)");
  }
  char derived[41];
  if (zmq_curve_public(derived, k.secret_key.c_str()) != 0) {
    return InvalidArgument(path + ": the secret key is not valid");
  }
  if (k.public_key.empty()) k.public_key = derived;
  if (k.public_key != derived) {
    return InvalidArgument(path + ": the public key does not belong to the secret key");
  }
  return k;
}

StatusOr<std::vector<std::string>> ReadCurvePublicKeys(const std::string& path) {
  ONLINEPS_ASSIGN_OR_RETURN(auto lines, ReadKeyLines(path));
  std::vector<std::string> out;
  for (const auto& l : lines) {
    if (l.kind != "secret") out.push_back(l.key);
  }
  if (out.empty()) return InvalidArgument(path + ": holds no public key");
  return out;
}

}  // namespace onlineps
