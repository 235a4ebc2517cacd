#include "case.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>

#include "reference/gpu_reference.h"

namespace moekit::bench {

Case::Case(const Row& row, const Options& opt) : row_(row), opt_(opt) {
  dt_ = row.in_dtype() == "i32" ? DType::kI32 : parse_dtype(row.in_dtype());
  out_dt_ = row.out_dtype() == "i32" ? DType::kI32 : parse_dtype(row.out_dtype());
}

uint64_t Case::seed(const std::string& t) const {
  return seed_of(row_.w.name + "/" + t, opt_.seed);
}

DTensor& Case::tensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  for (auto& [n, t] : tensors_)
    if (n == name) throw std::logic_error("tensor '" + name + "' registered twice");
  tensors_.emplace_back(name, std::make_unique<DTensor>(dtype, std::move(shape)));
  return *tensors_.back().second;
}

DTensor& Case::find(const std::string& name) {
  for (auto& [n, t] : tensors_)
    if (n == name) return *t;
  throw std::logic_error("no tensor '" + name + "'");
}

bool Case::has(const std::string& name) const {
  for (auto& [n, t] : tensors_)
    if (n == name) return true;
  return false;
}

DBuffer& Case::scratch(const std::string& name, size_t bytes) {
  for (auto& [n, b] : scratch_)
    if (n == name) {
      if (b->bytes() < bytes) *b = DBuffer(bytes);
      return *b;
    }
  scratch_.emplace_back(name, std::make_unique<DBuffer>(bytes));
  return *scratch_.back().second;
}

size_t Case::working_set_bytes() const {
  size_t b = 0;
  for (auto& [n, t] : tensors_) b += t->bytes();
  return b;
}

void Case::set_copies(int n) {
  for (auto& [name, t] : tensors_) t->set_copies(n);
}

std::unique_ptr<Case> make_case(const Row& row, const Options& opt) {
  if (auto c = make_routing_case(row, opt)) return c;
  if (auto c = make_gemm_case(row, opt)) return c;
  if (auto c = make_mlp_case(row, opt)) return c;
  throw std::runtime_error("no benchmark case for op '" + row.w.op + "'");
}

// ---- helpers ----------------------------------------------------------------------------------

std::unique_ptr<DTensor> skew_bias(int64_t E, uint64_t seed, double alpha) {
  if (alpha <= 0) return nullptr;
  std::vector<int64_t> rank(E);
  std::iota(rank.begin(), rank.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(rank.begin(), rank.end(), rng);
  HostTensor h(DType::kF32, {E});
  for (int64_t e = 0; e < E; ++e)
    h.as<float>()[e] = static_cast<float>(-alpha * std::log1p(static_cast<double>(rank[e])));
  auto t = std::make_unique<DTensor>(DType::kF32, std::vector<int64_t>{E});
  t->upload(h);
  return t;
}

void route_tokens(DTensor& ids, DTensor& weights, int64_t E, uint64_t seed, const Options& opt,
                  cudaStream_t s) {
  const int64_t T = ids.shape()[0];
  const int K = static_cast<int>(ids.shape()[1]);
  DTensor logits(DType::kF32, {T, E});
  fill_normal(logits, seed, 1.f, 0.f, s);
  std::unique_ptr<DTensor> bias = skew_bias(E, seed_of("skew", opt.seed), opt.skew_alpha);
  if (bias) add_expert_bias(logits, bias->ptr<float>(), s);
  FusedTopKArgs a;
  a.gating_output = logits.view();
  a.params.top_k = K;
  a.params.renormalize = true;
  a.topk_ids = ids.view();
  a.topk_weights = weights.view();
  gpu_reference::fused_topk(a, s);
  BENCH_CUDA(cudaStreamSynchronize(s));
}

RoutingStats routing_stats(const HostTensor& ids, int64_t E) {
  RoutingStats st;
  std::vector<char> seen(std::max<int64_t>(E, 1), 0);
  int64_t routes = 0, active = 0;
  const int32_t* p = ids.as<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    int32_t e = p[i];
    if (e < 0 || e >= E) continue;
    ++routes;
    if (!seen[e]) {
      seen[e] = 1;
      ++active;
    }
  }
  st.routed_rows = routes;
  st.active_experts = active;
  return st;
}

std::vector<int64_t> equal_counts(int64_t P, int64_t E) {
  std::vector<int64_t> c(E, E ? P / E : 0);
  for (int64_t e = 0; e < (E ? P % E : 0); ++e) ++c[e];
  return c;
}

std::vector<int64_t> random_counts(int64_t P, int64_t E, uint64_t seed) {
  std::vector<int64_t> c(E, 0);
  if (E == 0) return c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01;
  const int64_t K = std::min<int64_t>(8, E);
  std::vector<std::pair<double, int64_t>> l(E);
  int64_t left = P;
  while (left > 0) {
    for (int64_t e = 0; e < E; ++e) l[e] = {n01(rng), e};
    std::partial_sort(l.begin(), l.begin() + K, l.end(), std::greater<>());
    for (int64_t k = 0; k < K && left > 0; ++k, --left) ++c[l[k].second];
  }
  return c;
}

std::vector<uint8_t> sample_rows(int64_t n, int64_t max_rows) {
  std::vector<uint8_t> m(std::max<int64_t>(n, 0), 0);
  if (n <= max_rows) {
    std::fill(m.begin(), m.end(), 1);
    return m;
  }
  for (int64_t i = 0; i < max_rows; ++i) {
    int64_t r = max_rows > 1 ? (i * (n - 1) + (max_rows - 1) / 2) / (max_rows - 1) : 0;
    m[std::min(r, n - 1)] = 1;
  }
  return m;
}

CheckResult compare_tensors(const HostTensor& out, const HostTensor& ref, DType tol_dtype,
                            const std::vector<uint8_t>* row_mask, const std::string& reference) {
  CheckResult r;
  Tolerance tol = tolerance_for(tol_dtype);
  Accuracy a = compare(out.view(), ref.view(), tol, row_mask ? row_mask->data() : nullptr);
  r.checked = true;
  r.rel_l2 = a.rel_l2;
  r.err_ratio = a.err_ratio;
  r.pass = a.pass(tol);
  r.reference = reference;
  if (a.nonfinite) r.notes.push_back(std::to_string(a.nonfinite) + " NaN/Inf outputs");
  return r;
}

CheckResult compare_exact(const std::vector<int64_t>& out, const std::vector<int64_t>& ref,
                          const std::string& reference) {
  CheckResult r;
  r.checked = true;
  r.reference = reference;
  int64_t bad = 0;
  size_t n = std::max(out.size(), ref.size());
  for (size_t i = 0; i < n; ++i)
    if (i >= out.size() || i >= ref.size() || out[i] != ref[i]) ++bad;
  r.err_ratio = n ? static_cast<double>(bad) / n : 0;
  r.rel_l2 = r.err_ratio;
  r.pass = bad == 0;
  if (bad) r.notes.push_back(std::to_string(bad) + " of " + std::to_string(n) + " values differ");
  return r;
}

std::string describe_ref(bool cpu, int64_t rows_checked, int64_t rows_total) {
  std::string s = cpu ? "cpu-f64" : "gpu-f32";
  if (rows_checked < rows_total)
    s += " (" + std::to_string(rows_checked) + " of " + std::to_string(rows_total) + " rows)";
  return s;
}

// Row ranges of the experts of a permuted buffer, built on the host.
int64_t Layout::valid_rows() const {
  int64_t m = 0;
  for (int64_t c : count) m += c;
  return m;
}

int64_t Layout::active() const {
  int64_t a = 0;
  for (int64_t c : count) a += c > 0;
  return a;
}

HostTensor Layout::metadata() const {
  HostTensor h(DType::kI32, {E});
  for (int64_t e = 0; e < E; ++e)
    h.as<int32_t>()[e] = static_cast<int32_t>(masked ? count[e] : start[e] + count[e]);
  return h;
}

std::vector<uint8_t> Layout::valid_mask() const {
  std::vector<uint8_t> m(rows_total, 0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < count[e]; ++r) m[start[e] + r] = 1;
  return m;
}

// Equal (default) or random per-expert counts; contiguous rows start at aligned
// offsets, masked rows at e*max_m with counts capped at max_m.
Layout make_layout(const Row& row, const Options& opt, bool masked, int64_t E, int64_t rows,
                   int64_t max_m, int64_t total_valid, uint64_t seed, std::string* counts_label,
                   std::vector<std::string>* notes) {
  Layout l;
  l.masked = masked;
  l.E = E;
  l.max_m = max_m;
  l.alignment = masked ? 1 : layout_alignment(row.w);
  l.rows_total = masked ? E * max_m : rows;
  int64_t want = masked ? total_valid : rows - E * (l.alignment - 1);
  if (want < 0) want = 0;
  l.count = opt.random_counts ? random_counts(want, E, seed) : equal_counts(want, E);
  *counts_label = opt.random_counts ? "random" : "equal";
  l.start.resize(E);
  int64_t run = 0, dropped = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (masked) {
      l.start[e] = e * max_m;
      if (l.count[e] > max_m) {
        dropped += l.count[e] - max_m;
        l.count[e] = max_m;
      }
    } else {
      l.start[e] = run;
      run = (run + l.count[e] + l.alignment - 1) / l.alignment * l.alignment;
    }
  }
  if (dropped)
    notes->push_back(std::to_string(dropped) + " rows over max_m were dropped (T " +
                     std::to_string(total_valid) + " > capacity)");
  return l;
}

// Picks the rows the reference computes: every valid row when affordable, else a
// deterministic sample of `max_rows` of them. Returns the mask and the count.
std::vector<uint8_t> check_mask(const Layout& l, int64_t max_rows, int64_t* checked) {
  std::vector<uint8_t> valid = l.valid_mask();
  std::vector<int64_t> idx;
  for (int64_t r = 0; r < l.rows_total; ++r)
    if (valid[r]) idx.push_back(r);
  std::vector<uint8_t> pick = sample_rows(static_cast<int64_t>(idx.size()), max_rows);
  std::vector<uint8_t> m(l.rows_total, 0);
  *checked = 0;
  for (size_t i = 0; i < idx.size(); ++i)
    if (pick[i]) {
      m[idx[i]] = 1;
      ++*checked;
    }
  return m;
}

DTensor upload_mask(const std::vector<uint8_t>& m) {
  DTensor d(DType::kFP8E4M3, {static_cast<int64_t>(m.size())});  // bytes
  HostTensor h(DType::kFP8E4M3, {static_cast<int64_t>(m.size())});
  std::copy(m.begin(), m.end(), h.as<uint8_t>());
  d.upload(h);
  return d;
}

namespace {
int64_t layout_field(const std::string& layout, const std::string& key, int64_t fallback) {
  size_t p = layout.find(key + "=");
  if (p == std::string::npos) return fallback;
  p += key.size() + 1;
  size_t e = p;
  while (e < layout.size() && std::isdigit(static_cast<unsigned char>(layout[e]))) ++e;
  return e > p ? std::stoll(layout.substr(p, e - p)) : fallback;
}
}  // namespace

int layout_alignment(const Workload& w) {
  return static_cast<int>(std::max<int64_t>(layout_field(w.param("layout"), "alignment", 1), 1));
}

int64_t layout_max_m(const Workload& w, int64_t fallback) {
  return layout_field(w.param("layout"), "max_m", fallback);
}

bool cpu_reference_affordable(double flops, double input_bytes) {
  return flops <= 3e8 && input_bytes <= 256e6;
}

}  // namespace moekit::bench
