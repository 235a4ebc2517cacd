// parse_plan: the inverse of to_string (include/moekit/plan.h), for plans named in text
// (tuning tables, tool flags). A small recursive-descent reader over to_string's grammar:
//   gemm  := KERNEL " " M "x" N [" split" S] [" dynamic"]
//   mlp   := ("two_gemms" | "chain") "{gate_up: " gemm ", down: " gemm "}" | "gemv"
//          | ("direct" | "streamk") "{split " A "/" B "}"
//   layer := ("direct" | "sorted " mlp) [" + shared " mlp]
// Errors say what was expected at which character, e.g.
//   "at character 7: expected a tile M x N (e.g. 32x128), found 'y128'".
#include <cctype>
#include <string>

#include "moekit/plan.h"

namespace moekit {
namespace {

class Reader {
 public:
  explicit Reader(const std::string& text) : text_(text) {}

  bool done() const { return pos_ == text_.size(); }
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }

  // Records the first failure only: later ones follow from it.
  bool fail(const std::string& expected) {
    if (error_.empty()) {
      const std::string rest = text_.substr(pos_, 24);
      error_ = "at character " + std::to_string(pos_ + 1) + ": expected " + expected + ", found " +
               (rest.empty() ? std::string("the end") : "'" + rest + "'");
    }
    return false;
  }

  // Consumes `literal` when the text continues with it.
  bool accept(const char* literal) {
    const std::string lit(literal);
    if (text_.compare(pos_, lit.size(), lit) != 0) return false;
    pos_ += lit.size();
    return true;
  }

  bool expect(const char* literal) {
    return accept(literal) || fail("'" + std::string(literal) + "'");
  }

  // [a-z0-9_]+ (empty when none).
  std::string word() {
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::islower(static_cast<unsigned char>(text_[pos_])) ||
            std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
      ++pos_;
    return text_.substr(start, pos_ - start);
  }

  // Peeks the next word without consuming it.
  std::string peek_word() {
    const size_t start = pos_;
    std::string w = word();
    pos_ = start;
    return w;
  }

  // A positive decimal integer of at most 9 digits.
  bool number(int* out, const std::string& what) {
    const size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])) &&
           pos_ - start < 9)
      ++pos_;
    if (pos_ == start || text_[start] == '0') {
      pos_ = start;
      return fail(what);
    }
    *out = std::stoi(text_.substr(start, pos_ - start));
    return true;
  }

 private:
  const std::string& text_;
  size_t pos_ = 0;
  std::string error_;
};

constexpr GemmKernel kKernels[] = {
    GemmKernel::kDecode,
    GemmKernel::kDecodeSplitK,
    GemmKernel::kDecodeStream,
    GemmKernel::kDecodeStreamDeep,
    GemmKernel::kDecodeStreamNarrow,
    GemmKernel::kDecodePersistent,
    GemmKernel::kSm90,
    GemmKernel::kSm90Pairs,
    GemmKernel::kFp8Sm90,
};

std::string kernel_names() {
  std::string names;
  for (GemmKernel k : kKernels) names += (names.empty() ? "" : " / ") + to_string(k);
  return names;
}

bool read_gemm(Reader& r, GemmPlan* out) {
  GemmPlan p;
  const std::string name = r.peek_word();
  bool known = false;
  for (GemmKernel k : kKernels) {
    if (to_string(k) == name) {
      p.kernel = k;
      known = true;
    }
  }
  if (!known) return r.fail("a GEMM kernel (" + kernel_names() + ")");
  r.word();
  const char* tile = "a tile M x N (e.g. 32x128)";
  if (!r.expect(" ") || !r.number(&p.tile_m, tile) || !r.accept("x") || !r.number(&p.tile_n, tile))
    return r.fail(tile);
  // to_string writes split only when > 1.
  if (r.accept(" split")) {
    if (!r.number(&p.split, "a split of 2 or more")) return false;
    if (p.split < 2) return r.fail("a split of 2 or more (to_string omits split 1)");
  }
  if (r.accept(" dynamic")) p.schedule = GemmSchedule::kDynamic;
  if (r.accept(" swap_tails")) p.swap_tails = true;
  *out = p;
  return true;
}

bool read_splits(Reader& r, MlpPlan* p) {
  return r.expect("{split ") && r.number(&p->split_gate_up, "gate_up's split (1 or more)") &&
         r.expect("/") && r.number(&p->split_down, "down's split (1 or more)") && r.expect("}");
}

bool read_mlp(Reader& r, MlpPlan* out) {
  MlpPlan p;
  const std::string name = r.peek_word();
  if (name == "two_gemms" || name == "chain") {
    r.word();
    p.path = name == "chain" ? MlpPath::kChain : MlpPath::kTwoGemms;
    if (!r.expect("{gate_up: ") || !read_gemm(r, &p.gate_up) || !r.expect(", down: ") ||
        !read_gemm(r, &p.down) || !r.expect("}"))
      return false;
  } else if (name == "gemv") {
    r.word();
    p.path = MlpPath::kGemv;
  } else if (name == "direct" || name == "streamk") {
    r.word();
    p.path = name == "direct" ? MlpPath::kDirect : MlpPath::kStreamK;
    if (!read_splits(r, &p)) return false;
  } else {
    return r.fail("an MLP plan (two_gemms{...} / chain{...} / gemv / direct{...} / streamk{...})");
  }
  *out = p;
  return true;
}

bool read_layer(Reader& r, LayerPlan* out) {
  LayerPlan p;
  if (r.accept("sorted ")) {
    p.routed = RoutedPath::kSorted;
    if (!read_mlp(r, &p.experts)) return false;
  } else if (r.peek_word() == "direct") {
    r.word();
    p.routed = RoutedPath::kDirect;
  } else {
    return r.fail("a routed path ('direct' or 'sorted <mlp plan>')");
  }
  if (r.accept(" + shared ")) {
    p.has_shared = true;
    if (!read_mlp(r, &p.shared)) return false;
  }
  *out = p;
  return true;
}

template <class Plan>
bool parse(const std::string& text, Plan* out, std::string* error, bool (*read)(Reader&, Plan*)) {
  Reader r(text);
  Plan plan;
  if (read(r, &plan) && !r.done()) r.fail("the end of the plan");
  if (r.failed()) {
    if (error) *error = r.error();
    return false;
  }
  *out = plan;
  return true;
}

}  // namespace

bool parse_plan(const std::string& text, GemmPlan* out, std::string* error) {
  return parse(text, out, error, &read_gemm);
}

bool parse_plan(const std::string& text, MlpPlan* out, std::string* error) {
  return parse(text, out, error, &read_mlp);
}

bool parse_plan(const std::string& text, LayerPlan* out, std::string* error) {
  return parse(text, out, error, &read_layer);
}

}  // namespace moekit
